"""Calibration: fit per-link-type efficiency and latency of the collective model to measurements.

Inputs: CSVs of ``tpsim bench-collectives`` (``backend, op, nranks, bytes, time_s``) and nccl-tests output text
(the ``*_perf`` table). The fit is least squares on log time over the model's own formula for the measured
group (ranks ``0..nranks-1`` of the cluster): for every link type on the group's routes two parameters,
bandwidth efficiency and latency, are moved (Levenberg-Marquardt, numerical Jacobian) until the model's times
match. Output: ``{link_type: {efficiency, latency_us, bw_GBps, ...}}`` plus provenance keys, the format that a
topology's ``calibration:`` key includes.
"""

from __future__ import annotations

import csv
import datetime
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from ..errors import InputError
from ..io import read_text
from ..limits import LIMITS, show
from ..units import parse_bytes
from .curve import OPS

COLUMNS = ("backend", "op", "nranks", "bytes", "time_s")
_PERF_OPS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
             "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all",
             "broadcast_perf": "broadcast", "sendrecv_perf": "send_recv"}


@dataclass(frozen=True)
class Sample:
    op: str
    nranks: int
    nbytes: int
    time_s: float
    backend: str = "nccl"
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    per_type: Mapping[str, Mapping[str, float]]
    """link type -> {efficiency, latency_us, bw_GBps} (bw_GBps: whole link, per direction)."""
    error_before: Mapping[str, float]
    error_after: Mapping[str, float]
    """median and max |model / measured - 1| of time over the fitted points."""
    points: int
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_yaml(self) -> str:
        body: dict[str, Any] = {t: dict(v) for t, v in self.per_type.items()}
        body.update(self.provenance)
        return yaml.safe_dump(body, sort_keys=False)


# ----------------------------------------------------------------------------------------------- reading
def read_measurements(paths: Sequence[str | os.PathLike], op: str | None = None) -> list[Sample]:
    """Samples of every file: a CSV with COLUMNS or nccl-tests text (``op`` names its collective when the
    file does not say it)."""
    samples: list[Sample] = []
    for path in paths:
        p = Path(path)
        if not _exists(p):
            raise InputError(f"{p}: measurement file not found")
        text = read_text(p, "measurement file")
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        got = _read_csv(p, text) if first.replace(" ", "").startswith("backend,") else _read_nccl_tests(p, text, op)
        if not got:
            raise InputError(f"{p}: no measurements found (expected CSV columns {', '.join(COLUMNS)} or "
                             "nccl-tests output)")
        samples += got
    return samples


def _read_csv(path: Path, text: str) -> list[Sample]:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(f"{path}: CSV lacks column(s) {', '.join(missing)} (need {', '.join(COLUMNS)})")
    out = []
    for i, row in enumerate(reader, start=2):
        where = f"{path}: line {i}"
        if row["op"] not in OPS:
            raise InputError(f"{where}: op={row['op']!r} is not a collective ({', '.join(OPS)})")
        try:
            nranks, t = int(row["nranks"] or ""), float(row["time_s"] or "")
            nbytes = parse_bytes(row["bytes"] or "", "bytes")
        except (TypeError, ValueError, InputError):
            raise InputError(f"{where}: nranks={show(row['nranks'])}, bytes={show(row['bytes'])}, "
                             f"time_s={show(row['time_s'])} must be numbers (bytes a whole number up to "
                             f"{LIMITS['bytes']})") from None
        if not 2 <= nranks <= LIMITS["measured_ranks"] or not (t > 0 and math.isfinite(t)):
            raise InputError(f"{where}: nranks={show(nranks)}, time_s={t} out of range "
                             f"(2 <= nranks <= {LIMITS['measured_ranks']}, time_s > 0)")
        out.append(Sample(row["op"], nranks, nbytes, t, row["backend"], str(path)))
    return out


def _read_nccl_tests(path: Path, text: str, op: str | None) -> list[Sample]:
    """nccl-tests table: ``size count type redop [root] time algbw busbw #wrong time ...`` (out-of-place time,
    us). Ranks = the ``#  Rank`` lines of the header; op from --op, the binary name in the text, or the
    file name."""
    name = op or next((v for k, v in _PERF_OPS.items() if k in text or k in path.name), None)
    if name is None:
        raise InputError(f"{path}: cannot tell which collective this nccl-tests output measured; pass --op")
    ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.M))
    if ranks > LIMITS["measured_ranks"]:
        raise InputError(f"{path}: nccl-tests header lists {ranks} ranks, above the supported "
                         f"{LIMITS['measured_ranks']}")
    if ranks < 2:
        raise InputError(f"{path}: nccl-tests header lists {ranks} rank(s) ('#  Rank N ...' lines); need >= 2")
    out = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 12 or line.lstrip().startswith("#") or not tok[0].isdigit():
            continue
        t_col = 5 if len(tok) >= 13 else 4
        try:
            nbytes, t_us = int(tok[0]), float(tok[t_col])
        except ValueError:
            continue
        if 0 < nbytes <= LIMITS["bytes"] and 0 < t_us < math.inf:
            out.append(Sample(name, ranks, nbytes, t_us * 1e-6, "nccl", str(path)))
    return out


STATS = {"p25": lambda t: float(np.percentile(t, 25)), "median": lambda t: float(np.median(t)),
         "min": lambda t: float(np.min(t)), "mean": lambda t: float(np.mean(t))}
"""How repeated iterations of one configuration become one point. Default p25: on a shared CPU machine the
scheduler preempts ranks for whole time slices (~4 ms spikes on top of 0.3 ms operations); the lower
quartile keeps the operation's own cost as long as most iterations ran undisturbed."""


def aggregate(samples: Sequence[Sample], stat: str = "p25") -> list[Sample]:
    """One point per (op, nranks, bytes): the ``stat`` of its times (see STATS)."""
    if stat not in STATS:
        raise InputError(f"--stat={stat!r} must be one of {', '.join(STATS)}")
    groups: dict[tuple[str, int, int], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.op, s.nranks, s.nbytes), []).append(s)
    return [Sample(op, n, b, STATS[stat]([s.time_s for s in g]), g[0].backend, g[0].source)
            for (op, n, b), g in sorted(groups.items())]


# ------------------------------------------------------------------------------------------------- fitting
def fit_calibration(cluster: Any, samples: Sequence[Sample], iterations: int = 60,
                    stat: str = "p25") -> CalibrationFit:
    """Fit efficiency and latency of every link type on the measured groups' routes (see module doc).
    On CPU ranks (gloo over loopback) each measured op also gets its own pair (``gloo_ops``): torch's gloo
    wrappers add different local copies per op (ProcessGroupGloo: reduce_scatter = clone + all-reduce +
    copy; all_gather = flat buffer + copy), which one link pair cannot express."""
    points = aggregate(samples, stat)
    too_big = [p for p in points if p.nranks > cluster.num_gpus]
    if too_big:
        raise InputError(f"measurements with nranks={too_big[0].nranks} do not fit cluster {cluster.name} "
                         f"({cluster.num_gpus} GPUs); pass --gpus")
    per_type, before, after, _ = _fit(cluster, points, iterations)
    gloo_ops: dict[str, dict[str, Any]] = {}
    if set(per_type) & {"loopback"}:
        for op in sorted({p.op for p in points}):
            mine = [p for p in points if p.op == op]
            if len({p.nbytes for p in mine}) < 2:
                continue
            op_types, _b, op_after, _ = _fit(cluster, mine, iterations)
            entry = op_types["loopback"]
            gloo_ops[op] = {k: entry[k] for k in ("efficiency", "latency_us", "bw_GBps") if k in entry}
            gloo_ops[op].update(samples=len(mine), fit_error=op_after)
        if gloo_ops:
            cal = dict(per_type)
            cal["gloo_ops"] = gloo_ops
            after = _errors(_predict(cluster, points, cal), np.array([p.time_s for p in points]))
    prov = {"gloo_ops": gloo_ops} if gloo_ops else {}
    return CalibrationFit(per_type=per_type, error_before=before, error_after=after, points=len(points),
                          provenance=prov)


def _fit(cluster: Any, points: Sequence[Sample], iterations: int):
    """(per_type entries, error before, error after, theta) of one least-squares fit over ``points``."""
    from .model import CollectiveModel

    base = CollectiveModel(cluster)
    types = sorted({t for p in points for t in _group_types(base, p.nranks)})
    nominal = _nominal(cluster, types)
    measured = np.array([p.time_s for p in points])

    def calib(theta: np.ndarray) -> dict:
        return {t: {"efficiency": math.exp(theta[2 * i]), "latency_us": math.exp(theta[2 * i + 1])}
                for i, t in enumerate(types)}

    theta0 = np.array([v for t in types for v in (math.log(nominal[t]["efficiency"]),
                                                   math.log(max(nominal[t]["latency_us"], 1e-3)))])
    before = _predict(cluster, points, calib(theta0))
    theta = _levenberg_marquardt(lambda th: np.log(_predict(cluster, points, calib(th))) - np.log(measured),
                                 theta0, iterations)
    after = _predict(cluster, points, calib(theta))
    per_type = {t: _entry(nominal[t], math.exp(theta[2 * i]), math.exp(theta[2 * i + 1]), len(points))
                for i, t in enumerate(types)}
    return per_type, _errors(before, measured), _errors(after, measured), theta


def _predict(cluster: Any, points: Sequence[Sample], calibration: Mapping) -> np.ndarray:
    from .model import CollectiveModel

    model = CollectiveModel(cluster, calibration=calibration)
    return np.array([model.run(p.op, p.nbytes, (tuple(range(p.nranks)),)).time_s for p in points])


def _group_types(model, nranks: int) -> set[str]:
    types: set[str] = set()
    for r in range(1, nranks):
        types |= model.fabric.route_types(0, r)
    return types


def _nominal(cluster: Any, types: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Bandwidth (whole link), efficiency and latency of the first link of each type in the graph, and whether
    every link of that type has that bandwidth (only then may a calibration set ``bw_GBps``: it applies to
    every link of the type, whatever its lanes)."""
    out = {}
    for t in types:
        links = [a for _u, _v, a in cluster.graph.edges(data=True) if a["type"] == t]
        attrs = links[0]
        out[t] = {"bw_GBps": float(attrs["bw_GBps"]), "efficiency": float(attrs.get("efficiency", 1.0)),
                  "latency_us": float(attrs.get("latency_us", 1.0)),
                  "uniform": len({float(a["bw_GBps"]) for a in links}) == 1}
    return out


def _entry(nominal: Mapping[str, Any], eff: float, lat: float, points: int) -> dict[str, Any]:
    """Efficiency must stay in (0, 1] for topology files: a fit above 1 raises the bandwidth instead (where
    all links of the type share one bandwidth; else the efficiency is capped at 1 and a note says so)."""
    entry: dict[str, Any] = {"efficiency": round(min(eff, 1.0), 6), "latency_us": round(lat, 4)}
    if nominal["uniform"]:
        entry["bw_GBps"] = round(nominal["bw_GBps"] * max(eff, 1.0), 6)
    elif eff > 1.0:
        entry["note"] = f"fit wanted efficiency {eff:.3f} > 1; capped (links of this type differ in bandwidth)"
    entry["samples"] = points
    return entry


def _levenberg_marquardt(residual, theta: np.ndarray, iterations: int) -> np.ndarray:
    """Minimise sum(residual(theta)**2); numerical Jacobian (forward differences in log-parameters)."""
    lam = 1e-2
    r = residual(theta)
    cost = float(r @ r)
    for _ in range(iterations):
        jac = np.empty((len(r), len(theta)))
        for j in range(len(theta)):
            step = np.zeros_like(theta)
            step[j] = 1e-4
            jac[:, j] = (residual(theta + step) - r) / 1e-4
        g = jac.T @ r
        h = jac.T @ jac
        improved = False
        for _ in range(10):
            delta = np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-12), -g)
            trial = theta + np.clip(delta, -2.0, 2.0)
            rt = residual(trial)
            ct = float(rt @ rt)
            if ct < cost:
                theta, r, cost, lam, improved = trial, rt, ct, lam / 3, True
                break
            lam *= 4
        if not improved or float(np.max(np.abs(g))) < 1e-9:
            break
    return theta


def _errors(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred / measured - 1)
    return {"median_rel": round(float(np.median(rel)), 4), "max_rel": round(float(np.max(rel)), 4)}


def provenance(fit: CalibrationFit, cluster_name: str, inputs: Sequence[str]) -> dict[str, Any]:
    return {**fit.provenance, "tool": "tpsim calibrate", "cluster": cluster_name,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "inputs": [str(p) for p in inputs], "points": fit.points,
            "fit_error_before": dict(fit.error_before), "fit_error_after": dict(fit.error_after),
            "method": "least squares on log time over the collective model (tpsim.collectives.calibration)"}


# ------------------------------------------------------------------------------------------------ loading
def load_link_values(path: str | os.PathLike) -> dict[str, Any]:
    """``{link_type: {efficiency, latency_us, bw_GBps}}`` of a calibration YAML, plus ``gloo_ops`` (per-op
    values for CPU ranks) when present: ``link_overrides()`` of :func:`tpsim.calibration.load_calibration`, the
    mapping :class:`~tpsim.collectives.model.CollectiveModel` takes (it reads a path the same way)."""
    from ..calibration import load_calibration as load

    return load(path).link_overrides()


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # a name too long for the file system
        return False
