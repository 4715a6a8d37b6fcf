"""Does the kernel profile describe this machine? Time ~20 of its points here and compare (``tpsim validate``).

The points are taken from the profile itself (measured points of one dtype, spread over each kind's range of
times; GEMM, attention forward and backward, memory-bound kernels), timed with the profiler's own kernels and
clock (:mod:`tpsim.profiler.kernels`, :func:`tpsim.profiler.timing.time_kernel`) and a short budget: under 30 s
in all on a CPU. The drift of a point is ``measured / profile``; per kind and overall, the median drift says by
how much the profile is off on this machine. ``python -m tpsim.profiler.probe PROFILE`` prints it as JSON
(``tpsim validate`` runs it in a subprocess, with the ranks' thread count).

Selection is torch-free (:func:`probe_points`); measuring imports torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..compute.profile import Profile, ProfilePoint, load_profile

PROBE_SIZES = {"gemm": 10, "attention": 4, "memory": 6}
"""points per kind (20 in all)."""
MIN_POINT_S = 2e-4
MAX_POINT_S = 0.03
"""points are picked between these times (seconds per call in the profile): long enough to time in a few
repetitions, short enough that the probe stays under 30 s."""
POINT_BUDGET_S = 0.25
"""measurement time per point (time_kernel's budget)."""
DRIFT_THRESHOLD = 0.10
"""a median |drift - 1| above this means the profile is not of this machine (or the machine is loaded)."""
KINDS = ("gemm", "attention", "memory")


@dataclass(frozen=True, kw_only=True)
class ProbePoint:
    kind: str
    op: str
    dtype: str
    pass_: str
    dims: tuple[int, ...]
    profile_s: float
    measured_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.profile_s


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """The probe's points and the median drift (measured / profile) per kind and overall."""

    profile: str
    points: tuple[ProbePoint, ...]
    seconds: float
    """wall time of the probe."""

    def drift(self, kind: str | None = None) -> float | None:
        ratios = [p.ratio for p in self.points if kind is None or p.kind == kind]
        return statistics.median(ratios) if ratios else None

    def scales(self, min_points: int = 2) -> dict[str, float]:
        """Factor per kind to rescale the profile by: the kind's median drift, or the overall one when the kind
        has fewer than ``min_points`` points."""
        overall = self.drift() or 1.0
        out = {}
        for kind in KINDS:
            n = sum(p.kind == kind for p in self.points)
            out[kind] = (self.drift(kind) or overall) if n >= min_points else overall
        return out

    @property
    def exceeded(self) -> bool:
        d = self.drift()
        return d is not None and abs(d - 1.0) > DRIFT_THRESHOLD

    def to_dict(self) -> dict[str, object]:
        return {"profile": self.profile, "seconds": self.seconds, "median_drift": self.drift(),
                "drift": {k: self.drift(k) for k in KINDS}, "scales": self.scales(), "exceeded": self.exceeded,
                "threshold": DRIFT_THRESHOLD,
                "points": [dict(asdict(p), dims=list(p.dims), ratio=p.ratio) for p in self.points]}

    @staticmethod
    def from_dict(data: dict) -> "ProbeResult":
        points = tuple(ProbePoint(kind=p["kind"], op=p["op"], dtype=p["dtype"], pass_=p["pass_"],
                                  dims=tuple(p["dims"]), profile_s=p["profile_s"], measured_s=p["measured_s"])
                       for p in data["points"])
        return ProbeResult(profile=data["profile"], points=points, seconds=float(data["seconds"]))


def probe_points(profile: Profile, dtype: str = "fp32", sizes: dict[str, int] | None = None) -> list[ProfilePoint]:
    """Measured points of ``dtype`` spread evenly (by log time) over each kind's usable range."""
    sizes = sizes or PROBE_SIZES
    chosen: list[ProfilePoint] = []
    for kind, n in sizes.items():
        pool = sorted((p for p in profile.points if p.kind == kind and p.dtype == dtype
                       and MIN_POINT_S <= p.time_s <= MAX_POINT_S), key=lambda p: (p.time_s, p.key, p.dims))
        if not pool:
            continue
        idx = np.unique(np.round(np.linspace(0, len(pool) - 1, min(n, len(pool)))).astype(int))
        chosen += [pool[i] for i in idx]
    return chosen


def run_probe(profile_path: str | Path, dtype: str = "fp32", threads: int | None = None) -> ProbeResult:
    """Time the probe points here (CPU, or the current CUDA device for a GPU profile)."""
    import torch

    from .kernels import build_kernel
    from .timing import time_kernel

    start = time.perf_counter()
    profile = load_profile(profile_path)
    threads = threads or profile.meta.threads
    torch.set_num_threads(threads)
    device = torch.device("cuda" if profile.meta.device_type == "cuda" else "cpu")
    width = int(profile.meta.extra.get("memory_width", 1024))
    points = []
    for p in probe_points(profile, dtype):
        fn = build_kernel(p.kind, p.op, p.dtype, p.pass_, p.dims, device, width)
        measured = time_kernel(fn, device, POINT_BUDGET_S).median_s
        points.append(ProbePoint(kind=p.kind, op=p.op, dtype=p.dtype, pass_=p.pass_, dims=p.dims,
                                 profile_s=p.time_s, measured_s=measured))
    return ProbeResult(profile=str(profile_path), points=tuple(points), seconds=time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpsim.profiler.probe",
                                     description="time ~20 points of a kernel profile here; print the drift as JSON")
    parser.add_argument("profile")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="default: the profile's")
    args = parser.parse_args(argv)
    result = run_probe(args.profile, args.dtype, args.threads)
    json.dump(result.to_dict(), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
