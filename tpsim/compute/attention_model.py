"""Fused (flash) attention time per implementation and device (vectorized, torch-free).

A flash-attention kernel runs query tiles of ``block`` rows, one tile per SM at a time; each tile streams the
key/value rows it attends to (``s``, or on average ``s/2 + block/2`` when causal) plus ``seq_fill`` rows'
worth of fixed work (load Q, the softmax epilogue, write O; dQ/dK/dV and the pre/post-processing kernels in
backward):

* non-causal: ``t = ceil(tiles / SMs) x (s + seq_fill) x tau + overhead``
* causal: ``t = max(tiles x ((s/2 + block/2) / causal_factor + seq_fill) / SMs, s + seq_fill) x tau + overhead``
  (the longest tile bounds the time; unequal tiles are scheduled longest first; ``causal_factor`` is the
  throughput of the masked main loop relative to a full one)
* ``tau = 4 block d (x2.5 backward) x SMs / (peak x fraction x h(d))``: one key row of one tile at the
  device's sustained attention rate, ``h(d) = [d / (d + d_half)] / [128 / (128 + d_half)]`` (the softmax and
  bookkeeping per score do not shrink with the head dim).

Data: ``tpsim/data/kernels/attention.yaml`` (implementations, published measurements) and
``attention_fitted.yaml`` (the parameters fitted to them by :mod:`tpsim.compute.attention_fit`); ``d_half``
is per implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from ..errors import InputError
from ..hardware import DeviceSpec, get_device, is_low_precision
from .kernel_data import KERNELS_DIR, load_kernel_yaml, require_keys

PASSES = ("fwd", "bwd")
BWD_FLOP_RATIO = 2.5
"""backward FLOPs / forward FLOPs: 5 matmuls of the forward's size for its 2 (Dao 2023, section 3.1)."""
REFERENCE_HEAD_DIM = 128.0
"""head dim at which ``fraction`` is stated."""
FITTED_FILE = "attention_fitted.yaml"


@dataclass(frozen=True, kw_only=True)
class AttentionPoint:
    """One published attention measurement."""

    impl: str
    device: str
    dtype: str
    pass_: str
    causal: bool
    batch: int
    heads: int
    head_dim: int
    seq: int
    tflops: float
    """in the benchmark convention (4 b h s^2 d, halved when causal, x2.5 backward)."""
    kind: str
    """"point" or "upper" (a "reaches up to" figure)."""
    source: str

    def flops(self) -> float:
        return attention_flops(self.batch * self.heads, self.seq, self.head_dim, self.causal, self.pass_ == "bwd")


@dataclass(frozen=True, kw_only=True)
class Implementation:
    name: str
    block: int
    architectures: tuple[str, ...]
    relative_to: str | None
    """cuDNN: modelled as another implementation times a measured throughput ratio."""
    ratios: Mapping[str, tuple[float, ...]]
    """pass -> measured throughput ratios to ``relative_to``."""
    source: str


@dataclass(frozen=True, kw_only=True)
class PassParams:
    """Fitted kernel-shape parameters of one implementation and pass."""

    seq_fill: float
    """fixed work per query tile, in key rows."""
    overhead_s: float
    """per call (launch ramp, backward pre/post-processing kernels), seconds."""
    causal_factor: float
    """throughput of causal tiles relative to full ones (masking of the diagonal tiles, scheduling)."""
    fractions: Mapping[tuple[str, str], float]
    """(device, dtype) -> fraction of the dense peak at head dim 128 and long sequences."""
    d_half: float
    """head-dim half-efficiency constant of the implementation."""


@dataclass(frozen=True, kw_only=True)
class AttentionData:
    implementations: Mapping[str, Implementation]
    published: tuple[AttentionPoint, ...]
    params: Mapping[tuple[str, str], PassParams]
    """(impl, pass) -> fitted parameters (impls with their own kernels)."""
    ratio: Mapping[tuple[str, str], float]
    """(impl, pass) -> throughput ratio to ``relative_to`` (cuDNN)."""


def attention_flops(batch_heads, seq, head_dim, causal: bool, backward: bool):
    """FLOPs in the benchmarks' convention: 4 bh s^2 d, halved when causal, x2.5 backward."""
    bh, s, d = (np.asarray(x, dtype=float) for x in (batch_heads, seq, head_dim))
    return 4.0 * bh * s * s * d * (0.5 if causal else 1.0) * (BWD_FLOP_RATIO if backward else 1.0)


def head_dim_factor(head_dim, d_half: float):
    d = np.asarray(head_dim, dtype=float)
    return (d / (d + d_half)) / (REFERENCE_HEAD_DIM / (REFERENCE_HEAD_DIM + d_half))


def flash_time(*, units, rate, block: int, seq_fill: float, overhead_s: float, causal_factor: float,
               d_half: float, batch_heads, seq, head_dim, causal, backward: bool) -> np.ndarray:
    """Seconds of one flash-attention call (module docstring); ``rate`` = peak x fraction, FLOP/s; ``units``
    (SMs), ``rate`` and ``causal`` may be arrays broadcasting with the shapes."""
    bh, s, d = (np.asarray(x, dtype=float) for x in (batch_heads, seq, head_dim))
    units = np.asarray(units, dtype=float)
    row_flops = 4.0 * block * d * (BWD_FLOP_RATIO if backward else 1.0)
    tau = row_flops * units / (rate * head_dim_factor(d, d_half))
    tiles = bh * np.ceil(s / block)
    full = np.ceil(tiles / units) * (s + seq_fill)
    if np.all(np.logical_not(causal)):
        rows = full
    else:
        tri = np.maximum(tiles * ((0.5 * s + 0.5 * block) / causal_factor + seq_fill) / units, s + seq_fill)
        rows = np.where(causal, tri, full)
    return rows * tau + overhead_s


def _expand(where: str, raw: Mapping) -> list[AttentionPoint]:
    """One YAML entry (lists for the varying fields) -> its points."""
    fields = ("pass", "causal", "batch", "heads", "head_dim", "seq", "tflops", "time_us")
    lengths = {len(raw[f]) for f in fields if isinstance(raw.get(f), list)}
    if len(lengths) > 1:
        raise InputError(f"{where}: list fields have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 1

    def at(field: str, i: int):
        value = raw.get(field)
        return value[i] if isinstance(value, list) else value

    points = []
    for i in range(n):
        point = dict(impl=raw["impl"], device=raw["device"], dtype=raw["dtype"], pass_=at("pass", i),
                     causal=bool(at("causal", i)), batch=int(at("batch", i)), heads=int(at("heads", i)),
                     head_dim=int(at("head_dim", i)), seq=int(at("seq", i)), kind=raw.get("kind", "point"),
                     source=str(raw["source"]).strip(), tflops=0.0)
        if point["pass_"] not in PASSES:
            raise InputError(f"{where}: pass={point['pass_']!r} (known: fwd, bwd)")
        p = AttentionPoint(**point)
        tflops = at("tflops", i)
        if tflops is None:
            tflops = p.flops() / (float(at("time_us", i)) * 1e-6) / 1e12
        points.append(AttentionPoint(**{**point, "tflops": float(tflops)}))
    return points


def _implementations(raw: Mapping, name: str) -> dict[str, Implementation]:
    impls = {}
    for impl, body in require_keys(name, raw.get("implementations"), ()).items():
        require_keys(f"{name}: implementations.{impl}", body, ("architectures", "source"))
        ratios = {p: tuple(float(x) for x in body.get("ratios", {}).get({"fwd": "forward", "bwd": "backward"}[p], ()))
                  for p in PASSES}
        impls[impl] = Implementation(name=impl, block=int(body.get("block", 128)),
                                     architectures=tuple(body["architectures"]),
                                     relative_to=body.get("relative_to"), ratios=ratios, source=str(body["source"]))
    return impls


def load_published() -> tuple[dict[str, Implementation], tuple[AttentionPoint, ...]]:
    raw, name = load_kernel_yaml("attention.yaml")
    impls = _implementations(raw, name)
    points: list[AttentionPoint] = []
    for i, entry in enumerate(raw.get("published", ())):
        where = f"{name}: published[{i}]"
        require_keys(where, entry, ("impl", "device", "dtype", "pass", "batch", "heads", "head_dim", "seq",
                                    "source"))
        if entry["impl"] not in impls:
            raise InputError(f"{where}: impl={entry['impl']!r} is not an implementation of the file")
        points.extend(_expand(where, entry))
    return impls, tuple(points)


@lru_cache(maxsize=1)
def attention_data() -> AttentionData:
    from ..safeyaml import load_data

    impls, points = load_published()
    path = KERNELS_DIR / FITTED_FILE
    if not path.exists():
        raise InputError(f"{path.name} is missing: run `python -m tpsim.compute.attention_fit --write`")
    fitted = load_data(path)
    params, ratio = {}, {}
    for impl, body in impls.items():
        for p in PASSES:
            if body.relative_to:
                ratio[(impl, p)] = float(fitted[impl][p]["ratio"])
                continue
            g = fitted[impl][p]
            fractions = {(dev, dt): float(v) for dev, by_dtype in g["fractions"].items() for dt, v in by_dtype.items()}
            params[(impl, p)] = PassParams(seq_fill=float(g["seq_fill"]), overhead_s=float(g["overhead_us"]) * 1e-6,
                                           causal_factor=float(g["causal_factor"]), fractions=fractions,
                                           d_half=float(fitted[impl]["head_dim_half"]))
    return AttentionData(implementations=impls, published=points, params=params, ratio=ratio)


@dataclass(frozen=True, kw_only=True)
class ResolvedAttention:
    """Everything :func:`flash_time` needs for one (implementation, device, dtype, pass)."""

    block: int
    params: PassParams
    fraction: float
    kernel_dtype: str
    provenance: str


def _fraction(data: AttentionData, impl: str, p: str, device: DeviceSpec, dtype: str) -> tuple[float, str, str]:
    """(fraction, kernel dtype, provenance) for one device; transferred within the architecture if needed."""
    fractions = data.params[(impl, p)].fractions
    kernel_dtype = "bf16" if dtype == "fp16" else dtype
    note = ""
    if is_low_precision(kernel_dtype) and (device.name, kernel_dtype) not in fractions:
        kernel_dtype = "bf16"  # Transformer Engine keeps attention in bf16 unless fp8 attention is enabled
        note = f"{dtype} training runs attention in bf16 (Transformer Engine default); "
    n = sum(1 for q in data.published if (q.impl, q.device, q.dtype, q.pass_) == (impl, device.name, kernel_dtype, p))
    if (device.name, kernel_dtype) in fractions:
        return (fractions[(device.name, kernel_dtype)], kernel_dtype,
                f"{note}fitted on {n} published {impl} {p} {kernel_dtype} points")
    peers = [(dev, f) for (dev, dt), f in fractions.items()
             if dt == kernel_dtype and get_device(dev).architecture == device.architecture]
    if not peers:
        raise InputError(f"attention {impl} {p} on {device.name} ({dtype}): no published measurement for this device "
                         f"or another {device.architecture} device in tpsim/data/kernels/attention.yaml; use another "
                         f"attention implementation, the roofline or a measured profile (--profile)")
    f = float(np.mean([x[1] for x in peers]))
    return f, kernel_dtype, f"{note}transferred from {', '.join(x[0] for x in peers)} (same architecture)"


def resolve(impl: str, device: DeviceSpec, dtype: str, backward: bool) -> ResolvedAttention:
    """The parameters of ``impl`` on ``device`` for one pass, or an InputError naming what is missing."""
    data = attention_data()
    if impl not in data.implementations:
        raise InputError(f"attention_impl={impl!r} is unknown (known: {', '.join(data.implementations)}, unfused)")
    body = data.implementations[impl]
    if device.architecture not in body.architectures:
        raise InputError(f"attention_impl={impl} does not run on {device.name} (architecture "
                         f"{device.architecture}; {impl} runs on {', '.join(body.architectures)})")
    p = "bwd" if backward else "fwd"
    base = body.relative_to or impl
    fraction, kernel_dtype, why = _fraction(data, base, p, device, dtype)
    if body.relative_to:
        ratio = data.ratio[(impl, p)]
        n = len(body.ratios[p])
        why = (f"{base} x {ratio:.3f} (mean of {n} measured {impl}/{base} ratios); {base}: {why}" if n
               else f"{base}'s (no published {impl}/{base} {p} ratio); {base}: {why}")
        fraction *= ratio
    return ResolvedAttention(block=data.implementations[base].block, params=data.params[(base, p)],
                             fraction=fraction, kernel_dtype=kernel_dtype, provenance=why)
