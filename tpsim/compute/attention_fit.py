"""Fit the attention model's kernel parameters to the published kernel measurements (torch-free).

``python -m tpsim.compute.attention_fit`` prints the fit and its per-point errors; ``--write`` stores it in
``tpsim/data/kernels/attention_fitted.yaml`` (tests/test_kernel_attention.py checks the shipped file is this
fit). Only kernel-level measurements enter (``attention.yaml``: FlashAttention-2/3 benchmarks with sources), no
training run.

Parameters (:mod:`tpsim.compute.attention_model`): per implementation ``d_half``; per implementation and
pass ``seq_fill``, ``overhead_us`` and ``causal_factor``; per (implementation, pass, device, dtype) the
``fraction`` of the dense peak. Least squares on the log of the times, by coordinate descent with a golden
section search per parameter inside stated bounds (deterministic, no SciPy). Relative implementations (cuDNN)
get the mean of their measured throughput ratios.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

import numpy as np

from ..hardware import get_device
from .attention_model import FITTED_FILE, PASSES, AttentionPoint, Implementation, flash_time, load_published
from .kernel_data import KERNELS_DIR

BOUNDS = {"d_half": (1.0, 1000.0), "seq_fill": (0.0, 4096.0), "overhead_us": (0.0, 300.0),
          "causal_factor": (0.3, 1.5), "fraction": (0.02, 1.2)}
"""Search intervals of the fitted parameters (physically plausible ranges, wide)."""
SWEEPS = 5
GOLDEN_STEPS = 30
D_HALF_STEPS = 12


def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = GOLDEN_STEPS) -> float:
    """Minimum of a unimodal ``f`` on [lo, hi] by golden-section search."""
    r = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return 0.5 * (a + b)


def _warp(name: str) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """(to search space, from search space): log(1 + x) for additive terms, log x for scales."""
    if name in ("seq_fill", "overhead_us"):
        return (lambda x: math.log1p(x)), (lambda y: math.expm1(y))
    return math.log, math.exp


def coordinate_descent(loss: Callable[[dict], float], start: dict[str, float], kinds: dict[str, str]) -> dict:
    """Minimize ``loss(params)`` one parameter at a time (golden section in warped space), SWEEPS times."""
    params = dict(start)
    for _ in range(SWEEPS):
        for name in params:
            to, back = _warp(kinds[name])
            lo, hi = BOUNDS[kinds[name]]

            def along(y: float, name=name, back=back) -> float:
                return loss({**params, name: back(y)})

            params[name] = back(_golden(along, to(lo), to(hi)))
    return params


class Group:
    """The points of one implementation and pass as arrays (the fit evaluates them thousands of times)."""

    def __init__(self, points: Sequence[AttentionPoint], block: int):
        self.points = list(points)
        self.block = block
        self.keys = sorted({(q.device, q.dtype) for q in points})
        self.key_index = np.array([self.keys.index((q.device, q.dtype)) for q in points])
        devices = [get_device(q.device) for q in points]
        self.units = np.array([d.compute_units for d in devices], dtype=float)
        self.peak = np.array([d.peak(q.dtype) for d, q in zip(devices, points)])
        self.bh = np.array([q.batch * q.heads for q in points], dtype=float)
        self.seq = np.array([q.seq for q in points], dtype=float)
        self.head_dim = np.array([q.head_dim for q in points], dtype=float)
        self.causal = np.array([q.causal for q in points])
        self.backward = points[0].pass_ == "bwd"
        self.flops = np.array([q.flops() for q in points])
        self.measured = np.array([q.tflops for q in points])

    def tflops(self, d_half: float, seq_fill: float, overhead_us: float, causal_factor: float,
               fractions: dict[tuple[str, str], float]) -> np.ndarray:
        """Model TFLOP/s (benchmark convention) of the points."""
        f = np.array([fractions[k] for k in self.keys])[self.key_index]
        t = flash_time(units=self.units, rate=self.peak * f, block=self.block, seq_fill=seq_fill,
                       overhead_s=overhead_us * 1e-6, causal_factor=causal_factor, d_half=d_half,
                       batch_heads=self.bh, seq=self.seq, head_dim=self.head_dim, causal=self.causal,
                       backward=self.backward)
        return self.flops / t / 1e12


def fit_group(group: Group, d_half: float) -> dict:
    """Fitted (seq_fill, overhead_us, causal_factor, fractions) of one implementation and pass."""
    keys = group.keys
    start = {"seq_fill": 64.0, "overhead_us": 5.0, "causal_factor": 0.9}
    kinds = {"seq_fill": "seq_fill", "overhead_us": "overhead_us", "causal_factor": "causal_factor"}
    if not group.causal.any():
        start.pop("causal_factor")
        kinds.pop("causal_factor")
    for key in keys:
        start[f"f:{key[0]}:{key[1]}"] = 0.5
        kinds[f"f:{key[0]}:{key[1]}"] = "fraction"

    def unpack(p: dict) -> dict:
        fractions = {k: p[f"f:{k[0]}:{k[1]}"] for k in keys}
        return dict(seq_fill=p["seq_fill"], overhead_us=p["overhead_us"], causal_factor=p.get("causal_factor", 1.0),
                    fractions=fractions)

    def loss(p: dict) -> float:
        return float(np.sum(np.log(group.tflops(d_half, **unpack(p)) / group.measured) ** 2))

    best = unpack(coordinate_descent(loss, start, kinds))
    best["loss"] = loss({**{k: best[k] for k in ("seq_fill", "overhead_us")},
                         **({"causal_factor": best["causal_factor"]} if "causal_factor" in start else {}),
                         **{f"f:{k[0]}:{k[1]}": v for k, v in best["fractions"].items()}})
    return best


def _groups(impls: dict[str, Implementation], points: Sequence[AttentionPoint]) -> dict[str, dict[str, Group]]:
    """impl -> pass -> its points (implementations with their own kernels)."""
    out: dict[str, dict[str, Group]] = {}
    for impl, body in impls.items():
        if body.relative_to:
            continue
        for p in PASSES:
            pts = [q for q in points if q.impl == impl and q.pass_ == p]
            if pts:
                out.setdefault(impl, {})[p] = Group(pts, body.block)
    return out


def fit_all(points: Sequence[AttentionPoint] | None = None, only: str | None = None) -> dict:
    """The full fit: per implementation, ``d_half`` by golden section on the loss of both passes, each pass
    refitted at every trial value. ``points`` defaults to every published point; ``only`` fits one
    implementation."""
    impls, published = load_published()
    points = published if points is None else points
    result: dict = {}
    for impl, by_pass in _groups(impls, points).items():
        if only is not None and impl != only:
            continue
        def total(d_half: float, by_pass=by_pass) -> float:
            return sum(fit_group(g, d_half)["loss"] for g in by_pass.values())

        lo, hi = (math.log(b) for b in BOUNDS["d_half"])
        d_half = math.exp(_golden(lambda y: total(math.exp(y)), lo, hi, steps=D_HALF_STEPS))
        result[impl] = {"head_dim_half": d_half, **{p: fit_group(g, d_half) for p, g in by_pass.items()}}
    for impl, body in impls.items():
        if body.relative_to:
            result[impl] = {p: {"ratio": float(np.mean(body.ratios[p])) if body.ratios[p] else 1.0,
                                "points": len(body.ratios[p])} for p in PASSES}
    return result


def residuals(fit: dict) -> list[tuple[AttentionPoint, float]]:
    """(point, model / measured - 1) for every published point of an implementation with its own kernels."""
    impls, points = load_published()
    out = []
    for impl, by_pass in _groups(impls, points).items():
        for p, group in by_pass.items():
            g = fit[impl][p]
            pred = group.tflops(fit[impl]["head_dim_half"], g["seq_fill"], g["overhead_us"],
                                g.get("causal_factor", 1.0), g["fractions"])
            out.extend((q, float(pr / q.tflops - 1.0)) for q, pr in zip(group.points, pred))
    return out


def leave_one_out() -> list[tuple[AttentionPoint, float]]:
    """(point, error of the fit on every other point of its implementation) for each point whose device,
    dtype and pass keep other points (a device's only point cannot be predicted without it)."""
    impls, points = load_published()
    out = []
    for i, q in enumerate(points):
        rest = points[:i] + points[i + 1:]
        same = [r for r in rest if (r.impl, r.device, r.dtype, r.pass_) == (q.impl, q.device, q.dtype, q.pass_)]
        if impls[q.impl].relative_to or not same:
            continue
        fit = fit_all(rest, only=q.impl)
        g = fit[q.impl][q.pass_]
        group = Group([q], impls[q.impl].block)
        pred = group.tflops(fit[q.impl]["head_dim_half"], g["seq_fill"], g["overhead_us"],
                            g.get("causal_factor", 1.0), g["fractions"])[0]
        out.append((q, float(pred / q.tflops - 1.0)))
    return out


def to_yaml(fit: dict) -> str:
    """The fitted-parameter file (rounded to 4 significant digits)."""
    def r(x: float) -> float:
        return float(f"{x:.4g}")

    lines = ["# Generated by `python -m tpsim.compute.attention_fit --write` from the published points in",
             "# attention.yaml (kernel measurements only). Do not edit; refit instead. Model: attention_model.py."]
    for impl, body in fit.items():
        lines.append(f"{impl}:")
        if "head_dim_half" in body:
            lines.append(f"  head_dim_half: {r(body['head_dim_half'])}")
        for p in PASSES:
            if p not in body:
                continue
            g = body[p]
            if "ratio" in g:
                lines.append(f"  {p}: {{ratio: {r(g['ratio'])}, points: {g['points']}}}")
                continue
            lines.append(f"  {p}:")
            lines.append(f"    seq_fill: {r(g['seq_fill'])}")
            lines.append(f"    overhead_us: {r(g['overhead_us'])}")
            lines.append(f"    causal_factor: {r(g.get('causal_factor', 1.0))}")
            lines.append("    fractions:")
            by_device: dict[str, dict[str, float]] = {}
            for (dev, dt), f in sorted(g["fractions"].items()):
                by_device.setdefault(dev, {})[dt] = f
            for dev, by_dtype in by_device.items():
                inner = ", ".join(f"{dt}: {r(v)}" for dt, v in by_dtype.items())
                lines.append(f"      {dev}: {{{inner}}}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write tpsim/data/kernels/{FITTED_FILE}")
    parser.add_argument("--loo", action="store_true", help="also the leave-one-point-out errors (a few minutes)")
    args = parser.parse_args(argv)
    fit = fit_all()
    text = to_yaml(fit)
    print(text)
    for q, e in residuals(fit):
        print(f"{q.impl:4s} {q.pass_} {q.device:15s} {q.dtype} causal={q.causal!s:5s} b={q.batch:3d} h={q.heads:3d} "
              f"d={q.head_dim:3d} s={q.seq:6d}  measured {q.tflops:7.1f}  error {100 * e:+6.1f}%  ({q.kind})")
    if args.loo:
        loo = leave_one_out()
        print("\nleave-one-point-out (fit without the point, predict it):")
        for impl in sorted({q.impl for q, _ in loo}):
            for dev in sorted({q.device for q, _ in loo if q.impl == impl}):
                e = np.abs([x for q, x in loo if q.impl == impl and q.device == dev])
                print(f"  {impl} {dev:15s} {len(e):3d} points  median |error| {100 * np.median(e):5.1f}%  "
                      f"worst {100 * e.max():5.1f}%")
    if args.write:
        (KERNELS_DIR / FITTED_FILE).write_text(text)
        print(f"wrote {KERNELS_DIR / FITTED_FILE}")


if __name__ == "__main__":
    main()
