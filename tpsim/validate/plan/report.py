"""Compare what the ranks of a whole-plan run measured with the prediction (torch-free).

Per case: numerics (loss of the step; every gradient and every parameter after one Adam step on every rank),
communication (every rank's calls per (axis, kind) against :func:`tpsim.validate.plan.comm.expected_comm`,
exactly; the estimator's Megatron rules and their differences beside), and phases with
``error_pct = 100 (predicted - measured) / measured``:

* ``fwd``, ``bwd``, ``fwd+bwd``: per layer and micro-batch (the chunks' time over the step / (m x layers on
  the rank)), the figure comparable with the block validation;
* ``step``, ``step:optimizer``, ``step:other`` (bubble, pipeline transfers, reductions outside the chunks):
  per step;
* ``<axis>:<kind>``: each collective kind per step, timed in separate steps (waited where issued; the fastest
  rank's total, as in the block validation).

Every measured figure is, per iteration, the slowest rank's (it sets the pace), then the median over
iterations. Runs with more ranks than CPU cores time nothing (``timing`` says why).
"""

from __future__ import annotations

import statistics
from typing import Any

from .case import PlanCase
from .comm import differences, estimator_comm, expected_comm, normalize
from .predict import PlanPrediction
from .terms import per_rank, plan_terms, terms_sum_error_pct, traced_terms

LOSS_RTOL = 1e-4
LOSS_FLOOR = 0.1
"""the loss sum(y x target) / numel is O(1 / sqrt(numel)); its fp32 rounding is judged against 0.1."""


def combined_loss(case: PlanCase, ranks: list[dict[str, Any]]) -> float | None:
    """The step's loss from the last stage's ranks (rank pp - 1, or rank 0 at the end of a V): the TP ranks'
    parts summed under SP (each holds a
    sequence shard), else TP rank 0's; the mean over replicas."""
    per_replica: dict[int, float] = {}
    for r in ranks:
        c, value = r["coords"], r.get("loss_local")
        if value is None or c["pp"] != case.rank_of_stage(case.chunks - 1):
            continue
        if case.sp:
            per_replica[c["dp"]] = per_replica.get(c["dp"], 0.0) + value
        elif c["tp"] == 0:
            per_replica[c["dp"]] = value
    return statistics.fmean(per_replica.values()) if len(per_replica) == case.dp else None


def _measured(ranks: list[dict[str, Any]], case: PlanCase) -> tuple[dict[str, float], dict[str, float]]:
    """Measured phases (without preemption) and the step's wall clock; per iteration the slowest rank's, then
    the median. The step is the slowest rank's wall time less the most run-queue time any rank had in it (a
    preempted rank holds up the others through the pipeline and the collectives: the block validation's rule,
    :func:`tpsim.validate.block.report.phase_times`); ``step:other`` is what is left of it after the busiest rank's
    forward, backward and optimizer."""
    n = len(ranks[0]["samples"])
    per_layer = case.microbatches * case.layers_per_rank

    def slowest(key: str, i: int) -> float:
        return max(r["samples"][i][key] for r in ranks)

    out: dict[str, list[float]] = {k: [] for k in ("fwd", "bwd", "fwd+bwd", "step", "step:optimizer", "step:other")}
    wall = []
    for i in range(n):
        busy = max(r["samples"][i]["fwd"] + r["samples"][i]["bwd"] + r["samples"][i]["opt"] for r in ranks)
        step = max(slowest("step_wall", i) - slowest("delay", i), 0.0)
        out["fwd"].append(slowest("fwd", i) / per_layer)
        out["bwd"].append(slowest("bwd", i) / per_layer)
        out["fwd+bwd"].append(max(r["samples"][i]["fwd"] + r["samples"][i]["bwd"] for r in ranks) / per_layer)
        out["step"].append(step)
        out["step:optimizer"].append(slowest("opt", i))
        out["step:other"].append(max(step - busy, 0.0))
        wall.append(slowest("step_wall", i))
    return {k: statistics.median(v) for k, v in out.items()}, {"step": statistics.median(wall)}


def _comm_measured(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per step of each "<axis>:<kind>": per iteration each rank's total, the fastest rank's."""
    keys = {k for r in ranks for it in r.get("comm_calls", []) for k, _ in it}
    out = {}
    for key in sorted(keys):
        per_iter = []
        for i in range(len(ranks[0].get("comm_calls", []))):
            totals = [sum(s for k, s in r["comm_calls"][i] if k == key) for r in ranks
                      if any(k == key for k, _ in r["comm_calls"][i])]
            if totals:
                per_iter.append(min(totals))
        if per_iter:
            out[key] = statistics.median(per_iter)
    return out


def _predicted(pred: PlanPrediction, case: PlanCase) -> dict[str, float]:
    s = pred.slowest()
    per_layer = case.microbatches * case.layers_per_rank
    out = {"fwd": s["fwd"] / per_layer, "bwd": s["bwd"] / per_layer, "fwd+bwd": s["layer"], "step": s["step"],
           "step:optimizer": s["optimizer"], "step:other": s["other"]}
    out.update({k.removeprefix("comm:"): v for k, v in s.items() if k.startswith("comm:")})
    return out


def summarize_plan(case: PlanCase, ranks: list[dict[str, Any]], pred: PlanPrediction | None,
                   timing_note: str = "") -> dict[str, Any]:
    """One whole-plan case: checks, communication per axis and phases (see module docstring)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    loss, loss_ref = combined_loss(case, ranks), ranks[0]["loss_ref"]
    loss_ok = loss is not None and abs(loss - loss_ref) <= LOSS_RTOL * max(abs(loss_ref), LOSS_FLOOR)
    worst = max(max(r["numerics"].values()) for r in ranks)
    comm_ok, mismatches = True, []
    for r in ranks:
        want, got = expected_comm(case, r["coords"]), normalize(r["comm"])
        if got != want:
            comm_ok = False
            mismatches.append({"rank": r["rank"], "measured": got, "expected": want})
    coords0 = ranks[0]["coords"]
    phases, terms = [], {}
    if ranks[0].get("samples"):
        measured, wall = _measured(ranks, case)
        measured.update(_comm_measured(ranks))
        predicted = _predicted(pred, case) if pred is not None else {}
        terms = plan_terms(case, predicted, measured)
        for name, meas in measured.items():
            p = predicted.get(name)
            phases.append({"name": name, "predicted_s": p, "measured_s": meas,
                           "error_pct": 100.0 * (p - meas) / meas if p is not None and meas > 0 else None,
                           "measured_wall_s": wall.get(name)})
    return {
        "case": case.name, "kind": "plan", "config": plan_config(case), "scaled": case.scaled,
        "numerics_ok": all(r["numerics_ok"] for r in ranks) and loss_ok, "numerics_max_rel_err": worst,
        "loss": {"measured": loss, "reference": loss_ref, "ok": loss_ok},
        "collectives_match": comm_ok, "comm_mismatches": mismatches,
        "comm": {"measured": normalize(ranks[0]["comm"]), "expected": expected_comm(case, coords0),
                 "estimator": estimator_comm(case, coords0), "rank": ranks[0]["rank"],
                 "where": ranks[0].get("comm_phases", {})},
        "stack_differences": differences(expected_comm(case, coords0), estimator_comm(case, coords0)),
        "compute_model": pred.compute_model if pred else None,
        "measured_compute_fraction": pred.measured_compute_fraction if pred else None,
        "timing": timing_note or "measured", "phases": phases,
        **_terms_fields(terms, [r["profile"] for r in ranks if r.get("profile")],
                        next((p["measured_s"] for p in phases if p["name"] == "step"), None)),
        "per_rank": per_rank(ranks),
    }


def _terms_fields(terms: dict[str, Any], profiled: list[dict[str, Any]],
                  step_s: float | None) -> dict[str, Any]:
    """``terms`` from the profiled steps (:func:`tpsim.validate.plan.terms.traced_terms`) where the profiler's
    overhead is small, else the timers'; ``terms_source`` says which, ``terms_timers`` keeps the timers'."""
    traced, why = traced_terms(terms, profiled)
    chosen = traced if traced is not None else terms
    return {"terms": chosen, "terms_source": "trace" if traced is not None else "timers",
            "terms_source_note": why, "terms_timers": terms,
            "terms_sum_error_pct": terms_sum_error_pct(chosen, step_s), "profiled": profiled}


def plan_config(case: PlanCase) -> dict[str, Any]:
    m = case.model
    return {"model": m.name, "family": m.family, "tp": case.tp, "pp": case.pp, "vpp": case.vpp, "dp": case.dp,
            "zero": case.zero, "runtime": case.runtime, "schedule": case.schedule, "sp": case.sp,
            "fused": case.fused, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads,
            "kv_heads": m.num_kv_heads, "ffn": m.ffn_hidden_size, "seq_len": m.seq_len,
            "micro_batch": case.micro_batch, "microbatches": case.microbatches, "order": case.order,
            "reps": case.reps, "warmup": case.warmup}
