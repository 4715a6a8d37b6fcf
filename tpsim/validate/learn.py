"""Learn from validation runs: fit the compute factors and the framework overhead of one device and stack
(``tpsim calibrate --from-validation``; torch-free).

Every validated case (block or whole plan) that was timed carries ``calibration_inputs``: the measured forward +
backward time per layer and micro-batch, and the prediction's parts for that layer from the unscaled kernel
profile: GEMMs ``G``, attention ``A``, memory-bound kernels ``M``, and the rest ``C`` (exposed communication,
as predicted). The model fitted is

    measured = gemm_scale G + attention_scale A + memory_scale M + host_overhead + C

by least squares on the relative error (each case weighs the same whatever its size), with the factors kept
non-negative and pulled weakly towards 1 and the overhead towards the tiny twins' median measurement
(:data:`PRIOR_WEIGHT`): the three kinds' times grow together over a matrix, so the data alone may not separate
them. Reported: the fit's error and the leave-one-out error (each case predicted by the fit of all the others).
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .calfile import DEFAULT_FWD_SHARE, ComputeCalibration

PRIOR_WEIGHT = 0.05
"""weight of each prior row (factor = 1, overhead = the twins' median) against a case's relative-error row."""
PARAMS = ("gemm_scale", "attention_scale", "memory_scale", "host_overhead_s")
SCALE_BOUNDS = (0.25, 4.0)
"""allowed range of a kernel class's fitted factor: the profile has already been rescaled by the drift probe, so
a factor beyond 4x either way is not the kernels' speed but two terms trading off (memory-bound time and the
per-layer host overhead both grow with the layer count: unbounded, one fit put memory-bound kernels at x0.036
and 20 ms of host time per layer)."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed case's measured layer time and predicted parts (seconds per layer and micro-batch)."""

    case: str
    source: str
    measured_s: float
    gemm_s: float
    attention_s: float
    memory_s: float
    comm_s: float
    device: str
    stack: str
    twin_overhead_s: float | None = None
    """framework overhead (fwd + bwd per layer) the run measured on its tiny twin."""
    twin_fwd_s: float | None = None

    def features(self) -> np.ndarray:
        return np.array([self.gemm_s, self.attention_s, self.memory_s, 1.0])


def read_samples(paths: list[str | Path]) -> list[Sample]:
    """The timed cases of ``tpsim validate`` JSON reports (files written in ``--out-dir``)."""
    samples = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{p}: validation report not found")
        try:
            report = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{p}: not a JSON validation report ({exc})") from None
        if not isinstance(report, dict) or not isinstance(report.get("cases"), list):
            raise InputError(f"{p}: not a tpsim validate report (no 'cases' list)")
        for case in report["cases"]:
            inputs = case.get("calibration_inputs")
            if not inputs or not inputs.get("measured_s"):
                continue
            over = case.get("framework_overhead_s") or {}
            twin = over.get("fwd", 0.0) + over.get("bwd", 0.0) if over.get("source") != "calibration" else None
            samples.append(Sample(case=case["case"], source=str(p), measured_s=float(inputs["measured_s"]),
                                  gemm_s=float(inputs["gemm_s"]), attention_s=float(inputs["attention_s"]),
                                  memory_s=float(inputs["memory_s"]), comm_s=float(inputs.get("comm_s", 0.0)),
                                  device=str(inputs.get("device", "")), stack=str(inputs.get("stack", "")),
                                  twin_overhead_s=twin, twin_fwd_s=over.get("fwd") if twin is not None else None))
    if not samples:
        raise InputError("no timed case with calibration inputs in " + ", ".join(str(p) for p in paths)
                         + " (reports of tpsim validate with timing; runs with more ranks than cores are not timed)")
    return samples


def _solve(samples: list[Sample], prior_overhead: float) -> np.ndarray:
    """Weighted least squares with priors; every subset of active parameters is tried (4 of them: 16 small
    solves) and the best solution kept whose kernel factors lie in :data:`SCALE_BOUNDS` (an inactive factor
    stays at its prior, 1) and whose overhead is not negative."""
    X = np.array([s.features() for s in samples])
    y = np.array([s.measured_s - s.comm_s for s in samples])
    w = 1.0 / np.array([s.measured_s for s in samples])
    prior = np.array([1.0, 1.0, 1.0, prior_overhead])
    scale = np.array([1.0, 1.0, 1.0, max(prior_overhead, statistics.median(s.measured_s for s in samples) * 0.1)])
    A = np.vstack([X * w[:, None], PRIOR_WEIGHT * np.diag(1.0 / scale)])
    b = np.concatenate([y * w, PRIOR_WEIGHT * prior / scale])
    lo, hi = SCALE_BOUNDS
    best, best_cost = prior.copy(), np.inf
    for active in itertools.product((False, True), repeat=4):
        idx = [i for i in range(4) if active[i]]
        theta = np.where(active, 0.0, np.array([1.0, 1.0, 1.0, 0.0]))  # inactive: factor 1, no overhead
        if idx:
            rest = b - A @ theta
            sol, *_ = np.linalg.lstsq(A[:, idx], rest, rcond=None)
            theta[idx] = sol
        if np.any(theta[:3] < lo) or np.any(theta[:3] > hi) or theta[3] < 0:
            continue
        cost = float(np.sum((A @ theta - b) ** 2))
        if cost < best_cost:
            best, best_cost = theta, cost
    return best


def _predict(theta: np.ndarray, s: Sample) -> float:
    return float(s.features() @ theta + s.comm_s)


def _errors(pred: list[float], samples: list[Sample]) -> dict[str, Any]:
    errs = [100.0 * abs(p - s.measured_s) / s.measured_s for p, s in zip(pred, samples)]
    return {"cases": len(errs), "median_pct": round(statistics.median(errs), 2),
            "p90_pct": round(float(np.percentile(errs, 90)), 2), "max_pct": round(max(errs), 2)}


@dataclass(frozen=True)
class Fit:
    calibration: ComputeCalibration
    fit_error: dict[str, Any]
    before_error: dict[str, Any]
    """the same cases predicted with the profile as is (factors 1) and the twins' overhead."""
    samples: list[Sample]


def fit(samples: list[Sample], device: str | None = None, stack: str | None = None) -> Fit:
    """Fit the factors and the overhead for one device and stack; leave-one-out error when >= 3 cases."""
    samples = _select(samples, "device", device)
    samples = _select(samples, "stack", stack)
    twins = [s.twin_overhead_s for s in samples if s.twin_overhead_s is not None]
    prior_overhead = statistics.median(twins) if twins else 0.0
    theta = _solve(samples, prior_overhead)
    fitted = [_predict(theta, s) for s in samples]
    before = [_predict(np.array([1.0, 1.0, 1.0, 0.0]), s) + (s.twin_overhead_s or 0.0) for s in samples]
    loo: dict[str, Any] = {"cases": len(samples), "median_pct": None, "p90_pct": None, "max_pct": None}
    if len(samples) >= 3:
        preds = []
        for i, s in enumerate(samples):
            rest = samples[:i] + samples[i + 1:]
            rest_twins = [r.twin_overhead_s for r in rest if r.twin_overhead_s is not None]
            preds.append(_predict(_solve(rest, statistics.median(rest_twins) if rest_twins else 0.0), s))
        loo = _errors(preds, samples)
    share = _fwd_share(samples)
    cal = ComputeCalibration(gemm_scale=float(theta[0]), attention_scale=float(theta[1]),
                             memory_scale=float(theta[2]), host_overhead_per_layer_us=float(theta[3]) * 1e6,
                             host_overhead_fwd_share=share, device=samples[0].device, stack=samples[0].stack,
                             leave_one_out=loo)
    return Fit(calibration=cal, fit_error=_errors(fitted, samples), before_error=_errors(before, samples),
               samples=samples)


def _select(samples: list[Sample], field: str, wanted: str | None) -> list[Sample]:
    values = sorted({getattr(s, field) for s in samples})
    if wanted is not None:
        chosen = [s for s in samples if getattr(s, field) == wanted]
        if not chosen:
            raise InputError(f"--{field}={wanted!r}: the reports hold {', '.join(values)}")
        return chosen
    if len(values) > 1:
        raise InputError(f"the reports mix {field}s ({', '.join(values)}): choose one with --{field}")
    return samples


def _fwd_share(samples: list[Sample]) -> float:
    """The forward's part of the host overhead: the tiny twins' (median of fwd / (fwd + bwd)), else a third."""
    shares = [s.twin_fwd_s / s.twin_overhead_s for s in samples if s.twin_overhead_s and s.twin_fwd_s is not None]
    return float(min(max(statistics.median(shares), 0.0), 1.0)) if shares else DEFAULT_FWD_SHARE
