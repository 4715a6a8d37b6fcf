"""The design table (one row per design: axes, best plan, step time, tokens/s, MFU, communication share,
memory headroom, time and cost for the budget), its frontier (cost vs time), written as CSV and Parquet."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .evaluate import PLAN_KEYS
from .objective import train_figures
from .sweep import AXES, Sweep, planning_tasks, task_id

COLUMNS = (("design", "model") + AXES + ("tokens", "fits", "plan") + PLAN_KEYS +
           ("step_time_s", "tokens_per_s", "mfu", "comm_share", "comm_total_share", "memory_gib", "memory_headroom",
            "ideal_days", "expected_days", "goodput", "gpu_hours", "cost_usd", "energy_mwh",
            "tokens_per_s_per_usd_hour",
            "network_gbps_per_gpu", "largest_scale", "largest_params_b", "largest_comm_share", "frontier", "why"))
OBJECTIVE_COLUMN = {"throughput": ("tokens_per_s", True), "time": ("expected_days", False),
                    "cost": ("cost_usd", False)}
"""objective -> (column, descending) the table is sorted by within each model."""


def design_rows(sweep: Sweep, results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per design whose task has a result, in the sweep's design order, then sorted by the objective
    within each model (ties: the design order)."""
    ids = {key: task_id(key, sweep) for key in planning_tasks(sweep)}
    rows = []
    for design in sweep.designs:
        res = results.get(ids[design.planning_key()])
        if res is None:
            continue
        v = design.values
        entry = sweep.models[design.model]
        row: dict[str, Any] = {"design": design.id, "model": entry.name, **{a: v[a] for a in AXES},
                               "tokens": entry.tokens, "fits": bool(res["fits"])}
        row["network_gbps_per_gpu"] = (None if row["fabric"] == "torus"
                                       else float(v["nics_per_gpu"]) * float(v["nic_gbps"]))
        if res["fits"]:
            row["plan"] = res["plan"]
            row.update({k: res.get(k) for k in PLAN_KEYS})
            for k in ("step_time_s", "tokens_per_s", "mfu", "comm_share", "comm_total_share", "memory_gib",
                      "memory_headroom"):
                row[k] = res[k]
            fig = train_figures(tokens=entry.tokens, tokens_per_step=res["global_batch"] * res["seq_len"],
                                step_s=res["step_time_s"], gpus=int(v["gpus"]), gpus_per_node=res["gpus_per_node"],
                                weights_gib=res["weights_gib"], optimizer_gib=res["optimizer_gib"], dp=res["dp"],
                                cp=res["cp"], zero=res["zero"], device=v["device"],
                                gpu_hour_price=float(v["gpu_hour_price"]), power_w=v["power_w"])
            row.update({k: fig[k] for k in ("ideal_days", "expected_days", "goodput", "gpu_hours", "cost_usd",
                                            "energy_mwh")})
            hourly = float(v["gpus"]) * float(v["gpu_hour_price"])
            row["tokens_per_s_per_usd_hour"] = res["tokens_per_s"] / hourly if hourly > 0 else None
        else:
            row["why"] = res.get("why", "")
        fam = res.get("family")
        if fam:
            row.update(largest_scale=fam["scale"], largest_params_b=fam["params"] / 1e9,
                       largest_comm_share=fam["comm_share"])
        rows.append({c: row.get(c) for c in COLUMNS})
    _mark_frontier(rows)
    col, desc = OBJECTIVE_COLUMN[sweep.objective]
    order = {d.id: i for i, d in enumerate(sweep.designs)}
    model_order = {m.name: i for i, m in enumerate(sweep.models)}

    def key(r):
        value = r[col]
        missing = value is None or (isinstance(value, float) and not math.isfinite(value))
        return (model_order[r["model"]], missing, (-value if desc else value) if not missing else 0.0,
                order[r["design"]])
    return sorted(rows, key=key)


def _mark_frontier(rows: list[dict[str, Any]]) -> None:
    """``frontier``: the design is on the cost vs expected-time Pareto front of its model (both minimized)."""
    from ..search.pareto import pareto_front

    by_model: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        r["frontier"] = False
        if r["fits"]:
            by_model.setdefault(r["model"], []).append(i)
    for idx in by_model.values():
        cost = np.array([np.nan if rows[i]["cost_usd"] is None else rows[i]["cost_usd"] for i in idx], dtype=float)
        days = np.array([np.nan if rows[i]["expected_days"] is None else rows[i]["expected_days"] for i in idx],
                        dtype=float)
        for j in pareto_front(cost, days):
            rows[idx[int(j)]]["frontier"] = True


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else _fmt(r[k])) for k in COLUMNS})
    return buf.getvalue()


SIGNIFICANT = 12
"""digits the table keeps: far more than any figure's accuracy, and few enough that the tables of two engines
are equal as text (worker processes may sum in another order: Ray sets OMP_NUM_THREADS=1 in its workers, so
BLAS reductions can differ in the last bits)."""


def rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else value


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return repr(rounded(value))
    return value


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Parquet through pyarrow (the ``tpsim[design]`` extra); False when pyarrow is not installed."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    columns = {}
    for c in COLUMNS:
        values = [r.get(c) for r in rows]
        kinds = {type(v) for v in values if v is not None}
        if kinds <= {int, bool} and bool in kinds and int not in kinds:
            columns[c] = pa.array(values, type=pa.bool_())
        elif kinds and kinds <= {int}:
            columns[c] = pa.array(values, type=pa.int64())
        elif kinds and kinds <= {int, float}:
            columns[c] = pa.array([None if v is None else rounded(float(v)) for v in values], type=pa.float64())
        else:
            columns[c] = pa.array([None if v is None else str(v) for v in values], type=pa.string())
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.table(columns), tmp)
    tmp.replace(path)
    return True


def frontier_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((r for r in rows if r["frontier"]), key=lambda r: (r["model"], r["cost_usd"], r["expected_days"]))
