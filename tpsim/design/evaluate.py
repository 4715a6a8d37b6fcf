"""One planning task of a sweep: a design's cluster x one model, planned over the whole plan space; the best
plan's figures (and, for the family, the largest model that fits). Runs in a worker process (local pool or
Ray); the result is a JSON-able mapping, identical whichever engine ran it."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .build import load_design_cluster

BREAKDOWN_TERMS = ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead",
                   "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
PLAN_KEYS = ("tp", "cp", "pp", "vpp", "dp", "ep", "sp", "zero", "recompute", "micro_batch", "order")


def _model(ref: str, seq_len: int | None):
    from ..model import load_model, require_modelled, with_overrides

    spec = with_overrides(load_model(ref), seq_len=seq_len)
    require_modelled(spec)
    return spec


def scaled_model(base, scale: float):
    """The family member at ``scale``: mixture of experts scales the number of experts; a dense model its
    hidden and FFN widths by sqrt(scale) (multiples of 128 and of the head dimension; parameters grow about
    linearly with the scale)."""
    from ..model import with_overrides

    if base.is_moe:
        return with_overrides(base, experts=max(base.experts_per_token, int(round(base.num_experts * scale))))
    unit = max(128, base.head_dim)
    hidden = max(unit, int(round(base.hidden_size * math.sqrt(scale) / unit)) * unit)
    heads = max(1, hidden // base.head_dim)
    kv = base.num_kv_heads if heads % base.num_kv_heads == 0 else heads
    ffn = max(unit, int(round(base.ffn_hidden_size * math.sqrt(scale) / unit)) * unit)
    return with_overrides(base, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn)


def _best(model, cluster, global_batch: int, dtype: str, stack: str) -> tuple[dict[str, Any] | None, int, str]:
    """(the best plan's estimate dict or None, plans evaluated, why none fits)."""
    from ..search.explain import rejection_reason
    from ..search.planner import search
    from ..search.space import SearchSpace

    result = search(model, cluster, global_batch, space=SearchSpace(dtype=dtype), stack=stack)
    if not len(result):
        return None, int(result.evaluated), rejection_reason(result)
    return result.estimate(int(result.ranking[0])).to_dict(), int(result.evaluated), ""


def summarize(est: Mapping[str, Any], device_memory_gib: float) -> dict[str, Any]:
    """The table's figures of one best plan."""
    step = float(est["step_time_s"])
    br = est["breakdown"]
    comm_total = sum(float(br.get(k, 0.0)) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"))
    plan = est["plan"]
    out = {k: plan.get(k) for k in PLAN_KEYS}
    mem = est["memory_gib"]
    out.update(weights_gib=float(mem["weights"]), optimizer_gib=float(mem["optimizer_states"]),
               global_batch=int(plan["global_batch"]))
    out.update(step_time_s=step, tokens_per_s=float(est["tokens_per_s"]), mfu=float(est["mfu"]),
               comm_share=float(br["exposed_comm"]) / step, comm_total_share=comm_total / step,
               memory_gib=float(est["peak_memory_gib"]),
               memory_headroom=1.0 - float(est["peak_memory_gib"]) / device_memory_gib,
               breakdown={k: float(br.get(k, 0.0)) for k in BREAKDOWN_TERMS})
    return out


def plan_string(est: Mapping[str, Any]) -> str:
    from ..plan import Plan

    fields = {k: v for k, v in est["plan"].items() if k in Plan.__dataclass_fields__}
    return Plan(**fields).short()


def run_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """Plan one task: ``{"id", "values" (the planning axes), "model": {ref, seq_len, global_batch},
    "family": {ref, scales, global_batch} or None, "stack", "dtype", "folder"}``."""
    started = time.perf_counter()
    values, folder = task["values"], Path(task["folder"])
    cluster = load_design_cluster(values, folder)
    mem_gib = cluster.device.usable_memory_bytes / 2 ** 30
    entry = task["model"]
    model = _model(entry["ref"], entry.get("seq_len"))
    gb = int(entry.get("global_batch") or model.global_batch or 1024)
    est, evaluated, why = _best(model, cluster, gb, task["dtype"], task["stack"])
    out: dict[str, Any] = {"task": task["id"], "evaluated": evaluated, "fits": est is not None, "why": why,
                           "params": float(model.total_params()), "global_batch": gb,
                           "seq_len": int(model.seq_len), "gpus_per_node": int(cluster.gpus_per_node)}
    if est is not None:
        out.update(summarize(est, mem_gib))
        out["plan"] = plan_string(est)
        out["estimate"] = {k: est[k] for k in ("step_time_s", "tokens_per_s", "mfu", "breakdown", "memory_gib",
                                               "peak_memory_gib", "plan", "collectives") if k in est}
    fam = task.get("family")
    if fam:
        base = _model(fam["ref"], None)
        fgb = int(fam.get("global_batch") or base.global_batch or 1024)
        largest = None
        for scale in sorted(fam["scales"], reverse=True):
            try:
                member = scaled_model(base, scale)
            except InputError:
                continue
            fest, n, _ = _best(member, cluster, fgb, task["dtype"], task["stack"])
            out["evaluated"] += n
            if fest is not None:
                s = summarize(fest, mem_gib)
                largest = {"scale": scale, "params": float(member.total_params()), "plan": plan_string(fest),
                           "comm_share": s["comm_share"], "comm_total_share": s["comm_total_share"],
                           "tokens_per_s": s["tokens_per_s"]}
                break
        out["family"] = largest
    out["elapsed_s"] = time.perf_counter() - started
    return out
