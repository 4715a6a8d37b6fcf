"""GEMM time from tile and wave quantization on the device's SMs (vectorized, torch-free).

A GEMM ``C[m, n] = A[m, k] @ B[k, n]`` runs as output tiles of ``m_t x n_t`` (``tpsim/data/kernels/gemm.yaml``),
``ctas_per_sm`` tiles resident per SM, optionally split ``s`` ways along k (split-k / stream-K). For each
candidate (tile, split) the time is

    waves x (ceil(k / s) + k_fill) x 2 m_t n_t x concurrent / tile_rate  (+ split-k partial-sum traffic)
    waves = ceil(batch x ceil(m / m_t) x ceil(n / n_t) x s / concurrent),   concurrent = SMs x ctas_per_sm
    tile_rate = peak x large_fraction x min(1, (m_t n_t / (m_t + n_t)) / full_rate_intensity)

and the library is assumed to pick the fastest candidate (cuBLAS heuristics choose among these kernels).
Tile quantization (partial tiles do full work), wave quantization (the last wave leaves SMs idle), the
pipeline fill per tile (small k) and the lower rate of small tiles (less operand reuse) all follow from it
(NVIDIA "Matrix Multiplication Background User's Guide"). The memory side is
``bytes / (HBM x achieved fraction)`` and the GEMM takes the larger of the two.

``large_fraction`` is solved per device and dtype so that the model reproduces one published large-GEMM
measurement (the anchor) at the anchor's shape: :func:`anchored_fraction`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..hardware import DTYPE_BYTES, DeviceSpec
from .kernel_data import ArchGemm, GemmAnchor, gemm_data

PARTIAL_BYTES = 4
"""split-k partial sums are fp32: each of the s slices writes m x n x 4 bytes and the reduction reads them."""


@dataclass(frozen=True, kw_only=True)
class GemmRate:
    """The large-GEMM rate of one device and dtype, and where it comes from."""

    peak: float
    """datasheet dense peak, FLOP/s."""
    large_fraction: float
    """fraction of ``peak`` a large, well-shaped GEMM reaches (at the anchor's clock)."""
    provenance: str
    """"anchored: ..." (a measurement of this device and dtype) or "transferred: ..." (from another)."""


def output_bytes(dtype: str) -> int:
    """Bytes per output element: fp8 GEMMs write 16-bit outputs (Transformer Engine), others their dtype."""
    return max(DTYPE_BYTES[dtype], 2)


def gemm_time(arch: ArchGemm, units: int, rate, hbm: float, m, n, k, batch, dtype: str) -> np.ndarray:
    """Seconds of ``batch`` GEMMs (m x k) @ (k x n) at large-GEMM ``rate`` FLOP/s on ``units`` SMs, with
    ``hbm`` achieved bytes/s for the memory side and the split-k reductions. Arrays (``rate`` too) broadcast
    together."""
    m, n, k, batch, rate = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k, batch, rate)))
    best = np.full(m.shape, np.inf)
    for tile in arch.tiles:
        reuse = tile.m * tile.n / (tile.m + tile.n)
        concurrent = units * tile.ctas_per_sm
        per_tile_rate = rate * min(1.0, reuse / arch.full_rate_intensity) / concurrent
        tiles_mn = batch * np.ceil(m / tile.m) * np.ceil(n / tile.n)
        tile_flops = 2.0 * tile.m * tile.n
        for split in arch.split_k:
            waves = np.ceil(tiles_mn * split / concurrent)
            t = waves * (np.ceil(k / split) + arch.k_fill) * tile_flops / per_tile_rate
            if split > 1:
                t = t + batch * m * n * PARTIAL_BYTES * 2.0 * split / hbm
            np.minimum(best, t, out=best)
        if arch.stream_k_block:
            np.minimum(best, _stream_k_time(arch, tile, concurrent, per_tile_rate, tiles_mn, k), out=best)
    moved = batch * ((m * k + k * n) * DTYPE_BYTES[dtype] + m * n * output_bytes(dtype))
    return np.maximum(best, moved / hbm)


def _stream_k_time(arch: ArchGemm, tile, concurrent: float, per_tile_rate: float,
                   tiles_mn: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Stream-K (Osama et al., PPoPP 2023; CUTLASS sm90_tile_scheduler_stream_k.hpp): the k-iterations of all
    tiles are dealt evenly to the persistent CTAs, so the quantization is one k-block, not one wave. Each CTA
    pays the pipeline fill once per tile segment it touches, plus one more for the fix-up of the tile it
    shares with a neighbour (partials exchanged through L2, overlapped with the next segment's main loop)."""
    kb = arch.stream_k_block
    iters_per_tile = np.ceil(k / kb)
    per_cta = np.ceil(tiles_mn * iters_per_tile / concurrent)
    segments = np.ceil(per_cta / iters_per_tile) + 1.0
    tile_flops = 2.0 * tile.m * tile.n
    return (per_cta * kb + segments * arch.k_fill) * tile_flops / per_tile_rate


def anchored_fraction(arch: ArchGemm, device: DeviceSpec, hbm: float, dtype: str, anchor: GemmAnchor) -> float:
    """The ``large_fraction`` at which :func:`gemm_time` reproduces ``anchor``. The model's time falls
    monotonically with the fraction: it is evaluated on a geometric grid of fractions at once, then on a
    finer grid inside the bracketing cell (relative resolution ~1e-6)."""
    return _anchored_fraction(arch, device.name, device.compute_units, device.peak(dtype), hbm, dtype,
                              anchor.m, anchor.n, anchor.k, anchor.tflops)


@lru_cache(maxsize=256)
def _anchored_fraction(arch: ArchGemm, name: str, units: int, peak: float, hbm: float, dtype: str,
                       m: int, n: int, k: int, tflops: float) -> float:
    target = 2.0 * m * n * k / (tflops * 1e12)
    lo, hi = 0.01, 2.0
    for _ in range(3):
        grid = np.geomspace(lo, hi, 200)
        times = gemm_time(arch, units, peak * grid, hbm, np.full(200, float(m)), np.full(200, float(n)),
                          np.full(200, float(k)), np.ones(200), dtype)
        above = np.nonzero(times > target)[0]
        if len(above) == len(grid):
            raise InputError(f"gemm anchor {tflops} TFLOP/s on {name} ({dtype}) is above what the tile model allows "
                             f"at twice the peak: check the anchor")
        i = above[-1] if len(above) else 0
        lo, hi = grid[i], grid[min(i + 1, len(grid) - 1)]
    return float(0.5 * (lo + hi))


def architecture_of(device: DeviceSpec) -> ArchGemm:
    data = gemm_data()
    if device.architecture is None or device.architecture not in data.architectures:
        raise InputError(f"device {device.name}: architecture={device.architecture!r} has no GEMM kernel data "
                         f"(known: {', '.join(sorted(data.architectures))}); use the roofline or a measured "
                         f"profile (--profile)")
    return data.architectures[device.architecture]


def _anchor_dtype(dtype: str) -> tuple[str, str]:
    """The anchor dtype a GEMM dtype reads its large fraction from, and why."""
    if dtype == "fp16":
        return "bf16", "fp16 runs at the bf16 tensor-core rate"
    return dtype, ""


ANCHOR_FALLBACK = {"mxfp8": "fp8", "nvfp4": "fp8"}
"""a block-scaled dtype without its own anchor on a device reads the fraction of this dtype on the same device
(the same tensor-core pipeline; the scales are applied inside the MMA), before the bf16 fraction."""


def achieved_hbm(device: DeviceSpec) -> tuple[float, str]:
    """Streaming bytes/s the device reaches and where the figure comes from: its measured
    ``hbm_achieved_fraction``, else the roofline's prior ``memory_bandwidth_fraction`` (efficiency.yaml)."""
    if device.hbm_achieved_fraction is not None:
        return (device.hbm_bandwidth * device.hbm_achieved_fraction,
                f"measured: {device.sources.get('hbm_achieved_fraction', 'devices.yaml')}")
    from .roofline import default_efficiency

    prior = default_efficiency().memory_fraction
    return device.hbm_bandwidth * prior, f"prior: memory_bandwidth_fraction {prior} (efficiency.yaml), no measurement"


def resolve_rate(device: DeviceSpec, dtype: str, hbm: float) -> GemmRate:
    """The large-GEMM rate of ``device`` for ``dtype``: from its own anchor, else transferred (another dtype
    of the same device, then devices of the same architecture), else an InputError naming what is missing."""
    from ..hardware import get_device

    data = gemm_data()
    arch = architecture_of(device)
    peak = device.peak(dtype)
    own = data.anchors.get(device.name, {})
    want, why = _anchor_dtype(dtype)
    if want in own:
        f = anchored_fraction(arch, device, hbm, want, own[want])
        note = f" ({why})" if why else ""
        return GemmRate(peak=peak, large_fraction=f, provenance=f"anchored{note}: {own[want].source}")
    near = ANCHOR_FALLBACK.get(dtype)
    if near in own and near in device.peak_flops:
        f = anchored_fraction(arch, device, hbm, near, own[near])
        return GemmRate(peak=peak, large_fraction=f,
                        provenance=f"transferred: no {dtype} measurement on {device.name}; its {near} fraction")
    if "bf16" in own:
        f = anchored_fraction(arch, device, hbm, "bf16", own["bf16"])
        return GemmRate(peak=peak, large_fraction=f,
                        provenance=f"transferred: no {dtype} measurement on {device.name}; its bf16 fraction")
    for peer_dtype in dict.fromkeys((want, near, "bf16")):
        if peer_dtype is None:
            continue
        peers = []
        for name, anchors in data.anchors.items():
            peer = get_device(name)
            if peer.architecture == device.architecture and peer_dtype in anchors:
                peers.append((name, anchored_fraction(arch, peer, achieved_hbm(peer)[0], peer_dtype,
                                                      anchors[peer_dtype])))
        if peers:
            f = float(np.mean([p[1] for p in peers]))
            return GemmRate(peak=peak, large_fraction=f,
                            provenance=f"transferred: {peer_dtype} fraction of {', '.join(p[0] for p in peers)} "
                                       f"(same architecture)")
    raise InputError(f"device {device.name}: no published GEMM measurement for it or for another "
                     f"{device.architecture} device in tpsim/data/kernels/gemm.yaml; use the roofline or a "
                     f"measured profile (--profile)")
