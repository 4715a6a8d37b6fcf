"""Compare what the ranks measured with what the estimator predicted; write the CSV and the chart.

Per case: numerics (worst relative error over the output, the input gradient and every parameter gradient
of every rank), collectives (``CommDebugMode`` counts and hooked bytes per type in forward and backward, on
every rank, against the torch-free ``layer_collectives(..., flavor="dtensor")`` and the estimator's counts),
and phases: ``fwd``, ``bwd``, ``fwd+bwd`` and each ``<phase>:<collective>``, with the % error
``100 * (predicted - measured) / measured``.

Measured times (``measured_s``) exclude the time a rank sat preempted on a CPU run queue (other processes
of a shared machine; :class:`tpsim.validate.block.measure.Clock`), ``measured_wall_s`` is the plain wall clock.
Forward and backward: see :func:`phase_times`; each collective call's time is the fastest rank's (the ranks that arrive first also wait for the last one,
who alone sees the transfer itself), summed per type in each iteration, median over iterations.
"""

from __future__ import annotations

import csv
import io
import os
import statistics
from pathlib import Path
from typing import Any

from .case import Case
from .predict import Prediction

CSV_COLUMNS = ("case", "kind", "model", "family", "tp", "sp", "pp", "vpp", "dp", "zero", "fused", "layers", "hidden",
               "heads", "ffn", "seq_len", "micro_batch", "microbatches", "phase", "predicted_s", "measured_s", "error_pct", "measured_wall_s", "numerics_ok",
               "numerics_max_rel_err", "collectives_match", "compute_model", "backend", "scaled", "cp", "cp_kind", "ep")


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def summarize_case(case: Case, ranks: list[dict[str, Any]], pred: Prediction | None) -> dict[str, Any]:
    """One case's checks and phases from every rank's result (``ranks``: one dict per rank)."""
    expected_counts, expected_bytes = case.expected_counts(), case.expected_bytes()
    counts_ok = all(_norm(r["counts"]) == _norm(expected_counts) for r in ranks)
    bytes_ok = all(_norm(r["bytes"]) == _norm(expected_bytes) for r in ranks)
    pred_ok = pred is None or _norm(pred.counts) == _norm(expected_counts)
    worst = max(max(r["numerics"].values()) for r in ranks)
    measured, wall = phase_times(ranks)
    measured.update(sorted(comm_by_type([r.get("comm_calls", []) for r in ranks]).items()))
    phases = []
    if pred is not None:
        predicted = {"fwd": pred.fwd_s, "bwd": pred.bwd_s, "fwd+bwd": pred.fwd_s + pred.bwd_s, **pred.comm_s}
        for name, meas in measured.items():
            p = predicted.get(name)
            phases.append({"name": name, "predicted_s": p, "measured_s": meas,
                           "error_pct": error_pct(p, meas) if p is not None and meas > 0 else None,
                           "measured_wall_s": wall.get(name)})
    else:
        phases = [{"name": n, "predicted_s": None, "measured_s": m, "error_pct": None,
                   "measured_wall_s": wall.get(n)} for n, m in measured.items()]
    return {
        "case": case.name, "config": _config(case), "scaled": case.scaled,
        "numerics_ok": all(r["numerics_ok"] for r in ranks), "numerics_max_rel_err": worst,
        "collectives_match": counts_ok and bytes_ok and pred_ok,
        "counts": {"measured": ranks[0]["counts"], "expected": expected_counts,
                   "predicted": pred.counts if pred else None},
        "bytes": {"measured": ranks[0]["bytes"], "expected": expected_bytes},
        "compute_model": pred.compute_model if pred else None,
        "measured_compute_fraction": pred.measured_compute_fraction if pred else None,
        "phases": phases,
        "samples_s": {"fwd": [r["fwd_all_s"] for r in ranks], "bwd": [r["bwd_all_s"] for r in ranks]},
    }


def phase_times(ranks: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Forward, backward and fwd+bwd seconds: (without preemption, wall clock).

    Iteration i of a phase took ``max_r wall[r][i]`` (the slowest rank sets the pace); the time any rank sat
    preempted on a run queue delays every rank through the collectives, so ``max_r delay[r][i]`` is taken off
    (a lower bound of the preempted time: preemptions of two ranks may not overlap). Median over iterations.
    """
    measured, wall = {}, {}
    n = len(ranks[0]["fwd_wall_all_s"])
    totals = [0.0] * n, [0.0] * n
    for phase in ("fwd", "bwd"):
        walls = [max(r[f"{phase}_wall_all_s"][i] for r in ranks) for i in range(n)]
        clean = [max(w - max(r[f"{phase}_delay_all_s"][i] for r in ranks), 0.0) for i, w in enumerate(walls)]
        measured[phase], wall[phase] = statistics.median(clean), statistics.median(walls)
        for i in range(n):
            totals[0][i] += clean[i]
            totals[1][i] += walls[i]
    measured["fwd+bwd"], wall["fwd+bwd"] = statistics.median(totals[0]), statistics.median(totals[1])
    return measured, wall


def comm_by_type(ranks_calls: list[list[list[Any]]]) -> dict[str, float]:
    """Seconds per "<phase>:<op>": each call's time is the fastest rank's (the last rank to arrive sees the
    transfer itself, the others also wait for it); summed per type in each iteration; median over
    iterations. ``ranks_calls[rank][iteration]`` lists (type, seconds) in issue order, the same on every rank."""
    if not ranks_calls or not ranks_calls[0]:
        return {}
    per_iter: dict[str, list[float]] = {}
    for it in range(len(ranks_calls[0])):
        totals: dict[str, float] = {}
        for j, (key, _sec) in enumerate(ranks_calls[0][it]):
            totals[key] = totals.get(key, 0.0) + min(rc[it][j][1] for rc in ranks_calls)
        for key, t in totals.items():
            per_iter.setdefault(key, []).append(t)
    return {k: statistics.median(v) for k, v in per_iter.items()}


def _norm(counts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Drop zero entries and missing phases so that {} and {"fwd": {}} compare equal."""
    return {ph: {op: n for op, n in d.items() if n} for ph, d in counts.items() if any(d.values())}


def _config(case: Case) -> dict[str, Any]:
    m = case.model
    return {"model": m.name, "family": m.family, "tp": case.tp, "sp": case.sp, "fused": case.fused,
            "hidden": m.hidden_size, "heads": m.num_attention_heads, "kv_heads": m.num_kv_heads,
            "ffn": m.ffn_hidden_size, "seq_len": m.seq_len, "micro_batch": case.micro_batch,
            "reps": case.reps, "warmup": case.warmup}


def layer_errors(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| of the fwd+bwd time per layer over cases (the accuracy figure)."""
    errs = [abs(p["error_pct"]) for s in summaries for p in s["phases"]
            if p["name"] == "fwd+bwd" and p["error_pct"] is not None]
    if not errs:
        return {"cases": 0, "median_abs_error_pct": None, "worst_abs_error_pct": None}
    return {"cases": len(errs), "median_abs_error_pct": statistics.median(errs),
            "worst_abs_error_pct": max(errs)}


def step_errors(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| of the whole step over the whole-plan cases that were timed."""
    errs = [abs(p["error_pct"]) for s in summaries if s.get("kind") == "plan" for p in s["phases"]
            if p["name"] == "step" and p["error_pct"] is not None]
    if not errs:
        return {"cases": 0, "median_abs_error_pct": None, "worst_abs_error_pct": None}
    return {"cases": len(errs), "median_abs_error_pct": statistics.median(errs), "worst_abs_error_pct": max(errs)}


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder and a rename: a killed run leaves the old file or
    the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_csv(path: Path, summaries: list[dict[str, Any]], backend: str) -> None:
    """One row per (case, phase)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        c = s["config"]
        for p in s["phases"]:
            writer.writerow({
                "case": s["case"], "kind": s.get("kind", "block"), "model": c["model"], "family": c["family"],
                "tp": c["tp"], "sp": c["sp"], "cp": c.get("cp", 1), "cp_kind": c.get("cp_kind", ""),
                "ep": c.get("ep", 1), "pp": c.get("pp", 1), "vpp": c.get("vpp", 1), "dp": c.get("dp", 1),
                "zero": c.get("zero", 0), "fused": c["fused"], "layers": c.get("layers", 1), "hidden": c["hidden"],
                "heads": c["heads"], "ffn": c["ffn"], "seq_len": c["seq_len"], "micro_batch": c["micro_batch"],
                "microbatches": c.get("microbatches", 1), "phase": p["name"],
                "predicted_s": _fmt(p["predicted_s"]), "measured_s": _fmt(p["measured_s"]),
                "error_pct": "" if p["error_pct"] is None else f"{p['error_pct']:.2f}",
                "measured_wall_s": _fmt(p.get("measured_wall_s")),
                "numerics_ok": s["numerics_ok"], "numerics_max_rel_err": f"{s['numerics_max_rel_err']:.2e}",
                "collectives_match": s["collectives_match"], "compute_model": s["compute_model"] or "",
                "backend": backend, "scaled": s["scaled"]})
    write_atomic(path, buf.getvalue().encode())


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def write_scatter(path: Path, summaries: list[dict[str, Any]], title: str) -> None:
    """Predicted vs measured seconds per phase, log-log, with y = x and the +-15 % / +-35 % bands."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    groups: dict[str, list[tuple[float, float]]] = {}
    for s in summaries:
        for p in s["phases"]:
            if p["predicted_s"] is None or not p["measured_s"]:
                continue
            name = p["name"]
            kind = name if name.startswith("step") or ":" not in name else "collective " + name.split(":", 1)[1]
            groups.setdefault(kind, []).append((p["measured_s"], p["predicted_s"]))
    values = [v for pts in groups.values() for pt in pts for v in pt]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
        for band, style in ((0.15, "--"), (0.35, ":")):
            for f in (1 - band, 1 + band):
                ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.8, ls=style)
        for kind, pts in sorted(groups.items()):
            ax.scatter([m for m, _ in pts], [p for _, p in pts], s=18, label=kind)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured seconds (per layer and micro-batch)")
    ax.set_ylabel("predicted seconds")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def write_terms_chart(path: Path, summaries: list[dict[str, Any]], title: str) -> None:
    """A stacked bar per case, predicted beside measured, one segment per step term (docs/SCHEMAS.md T6)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [s for s in summaries if s.get("terms")]
    names = list(dict.fromkeys(n for s in cases for n in s["terms"]))
    fig, ax = plt.subplots(figsize=(max(6.4, 1.3 * len(cases) + 2), 4.8))
    colors = plt.get_cmap("tab10")
    ticks, labels = [], []
    for i, s in enumerate(cases):
        for j, side in enumerate(("predicted_s", "measured_s")):
            x, bottom = 2.6 * i + j, 0.0
            for k, n in enumerate(names):
                v = (s["terms"].get(n) or {}).get(side) or 0.0
                ax.bar(x, v * 1e3, bottom=bottom, color=colors(k % 10), width=0.9,
                       label=n if i == 0 and j == 0 else None, hatch="//" if j == 0 else None, edgecolor="white")
                bottom += v * 1e3
            ticks.append(x)
            labels.append(("pred " if j == 0 else "meas ") + s["case"][:28])
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("ms per step (slowest rank)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buf.getvalue())
