"""Compare what the ranks of an :class:`~tpsim.validate.axis.case.AxisCase` measured with the cost model
(torch-free): numerics, every collective per axis against :mod:`tpsim.comm_plan`, and time per phase.

**Collectives** are compared on every rank, count and bytes per (axis, phase, kind), with
:meth:`AxisCase.expected_comm` at the rank's own routing load (the combine and the dispatch's gradient send what
the rank's experts processed); and over the ep group, the bytes of those all-to-alls summed over the ranks must
equal the cost model's balanced figure times ep (every routed copy goes out once and comes back once).

**Phases**: ``fwd``, ``bwd``, ``fwd+bwd`` per layer and micro-batch (the slowest rank, preemption taken off:
:func:`tpsim.validate.block.report.phase_times`) and each communication kind ``<phase>:<axis>:<op>`` (waited for where
it is issued, the fastest rank's time per call: :func:`tpsim.validate.block.report.comm_by_type`), predicted by
:func:`tpsim.validate.axis.predict.predict_axis`. A ring exchange predicted and measured this way is the whole
transfer; in the fwd / bwd phases it is hidden behind the step's attention as far as that lasts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .case import RETURNED, AxisCase, metadata_comm
from .predict import AxisPrediction
from ..block.report import comm_by_type, error_pct, phase_times

NUMERICS_DTYPE = "fp64"

STACK_DIFFERENCES = {
    "metadata": ("ep: the alltoall dispatcher all-gathers every rank's per-expert token counts over the ep group in "
                 "each forward (Megatron-Core MoEAlltoAllTokenDispatcher.preprocess) to size the all-to-alls: {n} "
                 "B per layer and micro-batch, run and checked here, not in the cost model (no activations)"),
    "probs": ("ep: run as the cost model counts it (the routing probabilities applied after the combine, "
              "Megatron-Core <= 0.11); current Megatron-Core main also all-to-alls the probabilities with the "
              "tokens (dispatch_all_to_all: one more all-to-all of tokens x top-k x 4 B each way), which "
              "tpsim.comm_plan.moe_collectives does not list"),
}


def _norm(comm: dict) -> dict:
    """{axis: {phase: {op: (n, bytes)}}} without empty entries, bytes as integers."""
    out: dict = {}
    for axis, phases in comm.items():
        for phase, ops in phases.items():
            for op, d in ops.items():
                if d["n"]:
                    out.setdefault(axis, {}).setdefault(phase, {})[op] = (int(d["n"]), int(round(d["bytes"])))
    return out


def comm_checks(case: AxisCase, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank: measured against expected at the rank's load; over the ep group: the returned all-to-alls'
    bytes summed against the balanced figure x ep."""
    per_rank, ok = [], True
    for r in ranks:
        load = r.get("expert_load") if case.model.is_moe and case.ep > 1 else None
        expected = case.expected_comm(load)
        match = _norm(r["comm"]) == _norm(expected)
        ok &= match
        per_rank.append({"rank": r["rank"], "match": match, "expert_load": r.get("expert_load"),
                         "measured": r["comm"], "expected": expected})
    group = None
    if case.model.is_moe and case.ep > 1:
        balanced = sum(op.count * op.nbytes for op in case.cost_model_ops() if op.axis == "ep" and op.tensor in RETURNED)
        per_copy = balanced / (2 * case.routed_copies)  # each of the two returned all-to-alls
        for j in range(case.world // case.ep):
            members = [r for r in ranks if r["coords"]["edp"] == j]
            sent = sum(2 * r["expert_load"] * per_copy for r in members)
            want = balanced * len(members)
            ok &= abs(sent - want) < 0.5
            group = {"returned_bytes": sent, "balanced_bytes": want,
                     "loads": [r["expert_load"] for r in members], "balanced_load": case.routed_copies}
    return {"match": ok, "ranks": per_rank, "ep_group": group}


def summarize_axis(case: AxisCase, ranks: list[dict[str, Any]], pred: AxisPrediction | None,
                   note: str = "") -> dict[str, Any]:
    """One case's checks and phases from every rank's result (``ranks``: one dict per rank)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    worst = max(max(r["numerics"].values()) for r in ranks)
    comm = comm_checks(case, ranks)
    phases = []
    if case.timed and "fwd_wall_all_s" in ranks[0]:
        measured, wall = phase_times(ranks)
        measured.update(sorted(comm_by_type([r.get("comm_calls", []) for r in ranks]).items()))
        predicted = {} if pred is None else {"fwd": pred.fwd_s, "bwd": pred.bwd_s, "fwd+bwd": pred.fwd_s + pred.bwd_s,
                                              **pred.comm_s}
        for name, meas in measured.items():
            p = predicted.get(name)
            phases.append({"name": name, "predicted_s": p, "measured_s": meas,
                           "error_pct": error_pct(p, meas) if p is not None and meas > 0 else None,
                           "measured_wall_s": wall.get(name)})
    return {
        "case": case.name, "kind": "axis", "config": config(case), "scaled": case.scaled,
        "numerics_ok": all(r["numerics_ok"] for r in ranks), "numerics_max_rel_err": worst,
        "numerics_dtype": NUMERICS_DTYPE, "collectives_match": comm["match"],
        "comm": {"rank": ranks[0]["rank"], "measured": ranks[0]["comm"], "expected": comm["ranks"][0]["expected"],
                 "per_rank": comm["ranks"], "ep_group": comm["ep_group"],
                 "cost_model": [dataclasses.asdict(op) for op in case.cost_model_ops()],
                 "metadata": [dataclasses.asdict(op) for op in metadata_comm(case)]},
        "stack_differences": stack_differences(case),
        "imbalance": pred.imbalance if pred is not None else None,
        "predicted_exposed_comm_s": pred.exposed_s if pred is not None else None,
        "compute_model": pred.compute_model if pred else None,
        "measured_compute_fraction": pred.measured_compute_fraction if pred else None,
        "timing": "measured" if phases else (note or "not timed"),
        "phases": phases,
        "samples_s": {"fwd": [r.get("fwd_all_s") for r in ranks], "bwd": [r.get("bwd_all_s") for r in ranks]},
    }


def stack_differences(case: AxisCase) -> list[str]:
    """Where the runtime (and current Megatron-Core) communicates differently from the cost model's list."""
    meta = metadata_comm(case)
    if not meta:
        return []
    return [STACK_DIFFERENCES["metadata"].format(n=int(meta[0].nbytes)), STACK_DIFFERENCES["probs"]]


def config(case: AxisCase) -> dict[str, Any]:
    m = case.model
    return {"model": m.name, "family": m.family, "tp": 1, "sp": False, "fused": case.fused, "cp": case.cp,
            "cp_kind": case.cp_kind if case.cp > 1 else "", "ep": case.ep, "dp": case.dp,
            "hidden": m.hidden_size, "heads": m.num_attention_heads, "kv_heads": m.num_kv_heads,
            "ffn": m.moe_ffn_hidden_size if m.is_moe else m.ffn_hidden_size, "experts": m.num_experts,
            "top_k": m.experts_per_token, "shared_experts": m.num_shared_experts, "seq_len": m.seq_len,
            "micro_batch": case.micro_batch, "reps": case.reps, "warmup": case.warmup}
