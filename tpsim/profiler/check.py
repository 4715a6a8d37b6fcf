"""Leave-one-out interpolation error of a profile (torch-free), ``tpsim profile --check``.

On a rectilinear grid, leaving a point out means interpolating it from its neighbours: for each table, each
axis with at least 3 values and each interior value ``v`` of that axis, the plane ``axis == v`` is removed and
every measured point of the plane is predicted by the same log-space multilinear interpolation
(:func:`tpsim.compute.profile.interpolate_log`) from the planes on either side. A point's error is the mean
over its axes of ``|predicted / measured - 1|``. The removed plane doubles the local grid spacing, so the
figure bounds the error of shapes that fall between grid points. Points on the grid's boundary along every
axis (extrapolation, not interpolation) and points whose neighbour cell was not measured are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.base import ComputeModel
from ..compute.profile import GridTable, Profile, interpolate_log


@dataclass(frozen=True)
class CheckResult:
    points: int
    median_error_pct: float | None
    """None when no point could be evaluated (every axis shorter than 3 values)."""
    p90_error_pct: float | None
    max_error_pct: float | None
    per_kind: dict[str, dict[str, float | None]]
    per_table: list[dict[str, object]]

    def to_dict(self) -> dict[str, object]:
        return {"points": self.points, "median_error_pct": self.median_error_pct,
                "p90_error_pct": self.p90_error_pct, "max_error_pct": self.max_error_pct,
                "per_kind": self.per_kind, "per_table": self.per_table}


def table_errors(table: GridTable) -> np.ndarray:
    """Leave-one-out |relative error| of each evaluable point of the table (fraction, not %)."""
    axes_log = tuple(np.log(a) for a in table.axes)
    sums = np.zeros(table.log_time.shape)
    counts = np.zeros(table.log_time.shape)
    for axis, values in enumerate(axes_log):
        for i in range(1, len(values) - 1):
            reduced_axes = axes_log[:axis] + (np.delete(values, i),) + axes_log[axis + 1:]
            reduced = np.delete(table.log_time, i, axis=axis)
            plane = np.take(table.log_time, i, axis=axis)
            others = np.meshgrid(*(a for d, a in enumerate(axes_log) if d != axis), indexing="ij")
            query = list(others)
            query.insert(axis, np.full(plane.shape, values[i]))
            predicted, ok = interpolate_log(reduced_axes, reduced, tuple(query))
            valid = ok & ~np.isnan(plane)
            error = np.where(valid, np.abs(np.exp(predicted - np.where(valid, plane, 0.0)) - 1.0), 0.0)
            index = [slice(None)] * len(axes_log)
            index[axis] = i
            sums[tuple(index)] += error
            counts[tuple(index)] += valid
    return sums[counts > 0] / counts[counts > 0]


def _summary(errors: np.ndarray) -> dict[str, float | None]:
    """Counts and percentiles in %; None where no point could be evaluated."""
    if errors.size == 0:
        return {"points": 0, "median_error_pct": None, "p90_error_pct": None, "max_error_pct": None}
    pct = 100.0 * errors
    return {"points": int(pct.size), "median_error_pct": round(float(np.median(pct)), 2),
            "p90_error_pct": round(float(np.percentile(pct, 90)), 2), "max_error_pct": round(float(pct.max()), 2)}


def check_profile(profile: Profile) -> CheckResult:
    """Leave-one-out errors over every table of the profile, overall, per kind and per table."""
    return check_tables(profile.tables)


def check_conv_profile(profile: Any) -> CheckResult:
    """The same for a convolution profile (:class:`tpsim.opgraph.convprofile.ConvProfile`, tables keyed by
    (op, dtype, pass) over the implicit-GEMM dims m, n, k): kind ``conv``."""
    return check_tables({("conv", *key): table for key, table in profile.tables.items()})


def check_tables(tables: dict[tuple[str, str, str, str], GridTable]) -> CheckResult:
    """Leave-one-out errors of tables keyed by (kind, op, dtype, pass): overall, per kind and per table."""
    per_table, by_kind = [], {}
    for key, table in tables.items():
        errors = table_errors(table)
        per_table.append({"kind": key[0], "op": key[1], "dtype": key[2], "pass": key[3], **_summary(errors)})
        by_kind.setdefault(key[0], []).append(errors)
    every = np.concatenate([e for group in by_kind.values() for e in group]) if by_kind else np.zeros(0)
    total = _summary(every)
    per_kind = {kind: _summary(np.concatenate(group)) for kind, group in by_kind.items()}
    return CheckResult(points=total["points"], median_error_pct=total["median_error_pct"],
                       p90_error_pct=total["p90_error_pct"], max_error_pct=total["max_error_pct"],
                       per_kind=per_kind, per_table=per_table)


def compare_with_model(profile: Profile, model: ComputeModel) -> list[dict[str, object]]:
    """Predicted / measured time of every profile point under another compute model (e.g. the device
    roofline): per (kind, dtype, pass) the number of points and the 10th, 50th and 90th percentile of the
    ratio, and the median |error| in %."""
    rows = []
    for key, table in profile.tables.items():
        kind, op, dtype, pass_ = key
        grids = np.meshgrid(*table.axes, indexing="ij")
        measured = ~np.isnan(table.log_time)
        dims = [g[measured] for g in grids]
        predicted = _predict(model, kind, op, dtype, pass_, dims)
        ratio = predicted / np.exp(table.log_time[measured])
        rows.append({"kind": kind, "op": op, "dtype": dtype, "pass": pass_, "points": int(ratio.size),
                     "ratio_p10": _round(np.percentile(ratio, 10)), "ratio_median": _round(np.median(ratio)),
                     "ratio_p90": _round(np.percentile(ratio, 90)),
                     "median_error_pct": _round(100 * np.median(np.abs(ratio - 1)))})
    return rows


def _round(value: float) -> float:
    return float(f"{float(value):.4g}")


def _predict(model: ComputeModel, kind: str, op: str, dtype: str, pass_: str,
             dims: list[np.ndarray]) -> np.ndarray:
    if kind == "gemm":
        return model.gemm(*dims, dtype)[0]
    if kind == "attention":
        return model.attention(*dims, op == "causal", dtype, pass_ == "bwd")[0]
    return model.memory(op, dims[0], dtype, pass_ == "bwd")[0]
