"""The estimator: step time, throughput and memory of a batch of plans, all as numpy arrays.

``estimate`` is ``estimate_batch`` on a batch of one; there is one implementation. The expensive parts are
computed once per distinct key and gathered: layer costs per (tp, sp, micro_batch, recompute), collective cost
curves per (tp, pp, dp, order) layout from the topology model's cache.

Step time of the slowest pipeline rank (Narayanan et al. 2021, sections 2.2 and 3.3):
``m x t_stage + (pp - 1) / vpp x t_stage + exposed PP + exposed DP + optimizer``, with ``t_stage`` the forward +
backward (+ recomputation + exposed TP communication) time of one micro-batch on that rank and m the
micro-batches per replica. The breakdown ``compute + recompute + bubble + optimizer + exposed_comm`` sums to the
step time; ``tp_comm``, ``pp_comm``, ``dp_comm`` are totals, partly hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.base import ComputeModel
from ..compute.roofline import RooflineModel, activation_bytes
from ..errors import InputError
from ..model import ModelSpec
from ..plan import ORDERS, Plan, PlanBatch, validate_plan
from ..tp_plan import CommOp, layer_collectives
from ..units import GiB
from .layer import EdgeCost, LayerCost, edge_cost, layer_cost
from .memory import (StageLayers, activation_bytes_per_layer, full_layer_activations, layer_params_local,
                     stage_layers)
from .result import Estimate, EstimateBatch

GRAD_BYTES = 4.0  # fp32 gradient accumulation and reduction (Megatron main_grad)


def _unique_rows(*cols: np.ndarray, with_first: bool = False):
    """Unique rows of the stacked columns and the inverse index (row i of the batch -> unique row).

    The columns are small non-negative integers: they are packed into one int64 key (one 1-D sort)."""
    ints = [np.asarray(c, dtype=np.int64) for c in cols]
    key = np.zeros_like(ints[0])
    for c in ints:
        key = key * (int(c.max()) + 1) + c
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    uniq = np.stack([c[first] for c in ints], axis=1)
    if with_first:
        return uniq, inverse.reshape(-1), first
    return uniq, inverse.reshape(-1)


def _layer_costs(model: ModelSpec, compute: ComputeModel, plans: PlanBatch, act_bytes: int):
    """Layer and edge costs and activation memory per distinct (tp, sp, micro_batch, recompute), with the
    inverse index that gathers them back to the plans."""
    uniq, inv = _unique_rows(plans.tp, plans.sp, plans.micro_batch, plans.recompute)
    kw = dict(tp=uniq[:, 0], sp=uniq[:, 1].astype(bool), micro_batch=uniq[:, 2])
    lc = layer_cost(model, compute, recompute=uniq[:, 3], dtype=plans.dtype, attention=plans.attention, **kw)
    ec = edge_cost(model, compute, dtype=plans.dtype, **kw)
    mem_kw = dict(kw, recompute=uniq[:, 3], attention=plans.attention, act_bytes=act_bytes)
    act = activation_bytes_per_layer(model, **mem_kw)
    working = np.where(uniq[:, 3] == 2, full_layer_activations(model, **mem_kw), 0.0)
    return lc, ec, act, working, inv


def _take_layer(lc: LayerCost, index: np.ndarray, grads: bool) -> LayerCost:
    empty: dict = {}
    return LayerCost(fwd=lc.fwd[index], bwd=lc.bwd[index], recompute=lc.recompute[index],
                     dgrad={k: v[index] for k, v in lc.dgrad.items()} if grads else empty,
                     wgrad={k: v[index] for k, v in lc.wgrad.items()} if grads else empty,
                     measured=lc.measured[index])


# ---- collectives -------------------------------------------------------------------------------------------
GROUP_OPS = ("all_reduce", "all_gather", "reduce_scatter")  # what TP and DP groups run


@dataclass
class _Curves:
    """Collective cost curves per plan: op -> (K latency arrays, K sec_per_byte arrays), each of length N."""

    tp: dict[str, tuple[list, list]]
    dp: dict[str, tuple[list, list]]
    pp: dict[str, tuple[list, list]]
    objects: list[dict[str, Any]]
    inverse: np.ndarray

    @staticmethod
    def time(curve: tuple[np.ndarray, np.ndarray], nbytes: np.ndarray) -> np.ndarray:
        lat, spb = curve
        b = np.asarray(nbytes, dtype=float)
        t = lat[0] + b * spb[0]
        for la, sp in zip(lat[1:], spb[1:]):
            np.minimum(t, la + b * sp, out=t)
        return np.where(b > 0, t, 0.0)


_ENVELOPE_BYTES = np.logspace(0, 13, 131)  # 1 B .. 10 TB: the sizes any collective of a plan can have


def _envelope(curve) -> tuple[np.ndarray, np.ndarray]:
    """The lines of a cost curve that are the minimum somewhere in 1 B .. 10 TB (the others never matter)."""
    lat = np.asarray(curve.latency_s, dtype=float)
    spb = np.asarray(curve.sec_per_byte, dtype=float)
    winners = np.unique(np.argmin(lat[None, :] + _ENVELOPE_BYTES[:, None] * spb[None, :], axis=1))
    return lat[winners], spb[winners]


def _stack(envelopes: list, inverse: np.ndarray) -> tuple[list, list]:
    """Per-plan (latency, sec_per_byte): K arrays of length N each, K = the longest lower envelope; shorter
    envelopes are padded by repeating their last line (which leaves the minimum unchanged)."""
    k = max(len(lat) for lat, _ in envelopes)
    lat = np.empty((len(envelopes), k))
    spb = np.empty((len(envelopes), k))
    for i, (la, sp) in enumerate(envelopes):
        lat[i, : len(la)], lat[i, len(la):] = la, la[-1]
        spb[i, : len(sp)], spb[i, len(sp):] = sp, sp[-1]
    return [lat[:, j][inverse] for j in range(k)], [spb[:, j][inverse] for j in range(k)]


def _layout_entry(cm, tp: int, pp: int, dp: int, order: int) -> dict[str, Any]:
    """Cost curves and their lower envelopes of one rank layout, cached on the collective model."""
    from ..collectives.curve import CostCurve
    from ..topology.placement import rank_groups

    cache = cm.__dict__.setdefault("_estimator_layouts", {})
    key = (tp, pp, dp, order)
    entry = cache.get(key)
    if entry is None:
        groups = rank_groups(tp, dp, pp, ORDERS[order])
        entry = {}
        for axis, size, ops in (("tp", tp, GROUP_OPS), ("dp", dp, GROUP_OPS), ("pp", pp, ("send_recv",))):
            for op in ops:
                curve = cm.curve(op, groups[axis]) if size > 1 else CostCurve.zero()
                entry[f"{axis}.{op}"] = curve
                entry[f"{axis}.{op}.envelope"] = _envelope(curve)
        cache[key] = entry
    return entry


def _collective_curves(cluster, plans: PlanBatch) -> _Curves:
    from ..collectives.model import get_collective_model

    cm = cluster.__dict__.get("_estimator_collectives")
    if cm is None:  # get_collective_model hashes the cluster's inputs; remember its answer on the object
        cm = cluster.__dict__["_estimator_collectives"] = get_collective_model(cluster)
    uniq, inv = _unique_rows(plans.tp, plans.pp, plans.dp, plans.order)
    objects = [_layout_entry(cm, int(tp), int(pp), int(dp), int(order)) for tp, pp, dp, order in uniq]

    def axis(name: str, ops: tuple[str, ...]) -> dict[str, tuple[list, list]]:
        return {op: _stack([o[f"{name}.{op}.envelope"] for o in objects], inv) for op in ops}

    return _Curves(tp=axis("tp", GROUP_OPS), dp=axis("dp", GROUP_OPS), pp=axis("pp", ("send_recv",)),
                   objects=objects, inverse=inv)


def _tp_ops(model: ModelSpec, flavor: str) -> dict[bool, list[CommOp]]:
    return {sp: layer_collectives(model, 2, sp, flavor) for sp in (False, True)}


def _params(model: ModelSpec, plans: PlanBatch, layers) -> dict[str, np.ndarray]:
    """Parameters per rank: per layer, embedding shard, first / last / middle rank and the largest."""
    single = plans.pp == 1
    p_layer = layer_params_local(model, plans.tp)
    tp_vals = np.unique(plans.tp)
    emb_local = np.array([model.padded_vocab(int(t)) * model.hidden_size / t for t in tp_vals])[
        np.searchsorted(tp_vals, plans.tp)]
    pos = model.max_positions * model.hidden_size if model.position == "learned" else 0.0
    final_norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
    head_local = np.where(model.tie_embeddings & single, 0.0, emb_local)
    first = layers.first * p_layer + emb_local + pos + np.where(single, head_local + final_norm, 0.0)
    last = layers.last * p_layer + head_local + final_norm
    mid = layers.middle * p_layer
    largest = np.maximum(np.maximum(first, np.where(single, 0.0, last)), mid)
    # embedding / output-layer parameters outside the transformer layers (the larger of the two edge ranks)
    non_layer = np.maximum(first - layers.first * p_layer, np.where(single, 0.0, last - layers.last * p_layer))
    return {"layer": p_layer, "emb_local": emb_local, "first": first, "last": last, "middle": mid, "max": largest,
            "non_layer": non_layer}


def _comm_times(model: ModelSpec, cluster, sub: PlanBatch, params: dict[str, np.ndarray], act_bytes: int,
                w_bytes: float, tp_ops: dict[bool, list[CommOp]]) -> tuple[dict[str, np.ndarray], _Curves]:
    """Every collective time a plan needs, computed on a batch of distinct communication patterns."""
    curves = _collective_curves(cluster, sub)
    tm = _Curves.time
    out: dict[str, np.ndarray] = {}
    # TP, embedding/output and pipeline traffic depends on the layout, micro-batch and SP only: time it once per
    # distinct (layout, micro_batch, sp) and gather
    _, inv2, first2 = _unique_rows(curves.inverse, sub.micro_batch, sub.sp, with_first=True)
    small_sub = sub.take(first2)

    def restrict(curve: tuple[list, list]) -> tuple[list, list]:
        return [a[first2] for a in curve[0]], [a[first2] for a in curve[1]]

    tp_curves = {op: restrict(c) for op, c in curves.tp.items()}
    n = len(small_sub)
    T = small_sub.micro_batch * float(model.seq_len)
    has_tp = small_sub.tp > 1
    act = np.where(has_tp, T * model.hidden_size * act_bytes, 0.0)
    for sp_value, ops in tp_ops.items():
        mask = (small_sub.sp == sp_value) & has_tp
        for i, c in enumerate(ops):
            nbytes = act if c.activation else np.full(n, float(c.numel * 4))
            out[f"tp{int(sp_value)}.{i}"] = tm(tp_curves[c.op], np.where(mask, nbytes, 0.0))
    # vocab-parallel embedding (first stage), output layer and cross-entropy (last stage)
    ar, ag, rs = (tp_curves[o] for o in ("all_reduce", "all_gather", "reduce_scatter"))
    small = np.where(has_tp, T * 4.0, 0.0)  # max, sum-exp, target logit: fp32 per token
    sp = small_sub.sp
    out["first_fwd"] = np.where(sp, tm(rs, act), tm(ar, act))
    out["last_fwd"] = np.where(sp, tm(ag, act), 0.0) + 3 * tm(ar, small)
    out["last_bwd"] = np.where(sp, tm(rs, act), tm(ar, act))
    # pipeline point-to-point: Megatron's scatter/gather optimization (or SP) sends 1/tp of the tensor
    p2p_bytes = np.where(small_sub.pp > 1, T * model.hidden_size * act_bytes / small_sub.tp, 0.0)
    out["p2p"] = tm(restrict(curves.pp["send_recv"]), p2p_bytes)
    out["_p2p_bytes"], out["_act_bytes"] = p2p_bytes, act
    out = {k: v[inv2] for k, v in out.items()}
    # data parallel: fp32 gradients of the largest stage; ZeRO-1/2 reduce-scatter + weight all-gather;
    # ZeRO-3 per layer
    zero, has_dp = sub.zero, sub.dp > 1
    grad_b, weight_b = params["max"] * GRAD_BYTES, params["max"] * w_bytes
    out["dp_ar"] = tm(curves.dp["all_reduce"], np.where(has_dp & (zero == 0), grad_b, 0.0))
    # ZeRO-3 shards the embedding and output layer too: they are gathered and reduced like one more layer
    z12 = has_dp & (zero >= 1) & (zero <= 2)
    z3 = has_dp & (zero == 3)
    out["dp_rs"] = tm(curves.dp["reduce_scatter"], np.where(z12, grad_b, np.where(
        z3, params["non_layer"] * GRAD_BYTES, 0.0)))
    out["dp_ag"] = tm(curves.dp["all_gather"], np.where(z12, weight_b, np.where(
        z3, params["non_layer"] * w_bytes, 0.0)))
    out["z3_ag"] = tm(curves.dp["all_gather"], np.where(z3, params["layer"] * w_bytes, 0.0))
    out["z3_rs"] = tm(curves.dp["reduce_scatter"], np.where(z3, params["layer"] * GRAD_BYTES, 0.0))
    out["_grad_bytes"] = grad_b
    return out, curves


def _tp_layer_comm(plans: PlanBatch, raw: dict[str, np.ndarray], lc: LayerCost,
                   tp_ops: dict[bool, list[CommOp]]) -> dict[str, np.ndarray]:
    """TP communication per layer and micro-batch: totals and exposed parts, forward and backward."""
    n = len(plans)
    out = {k: np.zeros(n) for k in ("fwd", "bwd", "fwd_exposed", "bwd_exposed")}
    for sp_value, ops in tp_ops.items():
        for i, c in enumerate(ops):
            t = raw[f"tp{int(sp_value)}.{i}"]
            block = c.module.split(".")[0]
            hide = {"wgrad": lc.wgrad, "dgrad": lc.dgrad}.get(c.overlap, {}).get(block, 0.0)
            out[c.phase] += t
            out[f"{c.phase}_exposed"] += np.maximum(t - hide, 0.0)
    return out


# ---- FLOPs ---------------------------------------------------------------------------------------------
def layer_forward_flops(model: ModelSpec) -> tuple[float, float]:
    """(matmul FLOPs of one layer's forward per sequence, of which the attention-score matmuls)."""
    s, h, q, kv, f = (float(x) for x in (model.seq_len, model.hidden_size, model.q_size, model.kv_size,
                                         model.ffn_hidden_size))
    linears = 2 * s * (h * (q + 2 * kv) + q * h + (3 if model.gated else 2) * h * f)
    scores = 4 * s * s * q  # QK^T and attention x V, full (non-causal), as Korthikanti et al. count
    return linears + scores, scores


def model_flops_per_sequence(model: ModelSpec) -> float:
    """3 x forward matmul FLOPs; GPT: 72 L s h^2 (1 + s/6h + V/12hL) per sequence (Korthikanti et al. 2022)."""
    layer, _ = layer_forward_flops(model)
    logits = 2.0 * model.seq_len * model.hidden_size * model.vocab_size
    return 3.0 * (model.num_layers * layer + logits)


# ---- the estimator -------------------------------------------------------------------------------------
def _pick(sel: np.ndarray, first: np.ndarray, last: np.ndarray, middle: np.ndarray) -> np.ndarray:
    return np.where(sel == 0, first, np.where(sel == 1, last, middle))


def estimate_batch(model: ModelSpec, cluster, plans: PlanBatch, compute: ComputeModel | None = None,
                   flavor: str = "megatron") -> EstimateBatch:
    """Estimate every plan of the batch (plans must be valid for ``model`` on ``cluster``)."""
    n = len(plans)
    if n == 0:
        raise InputError("no plans to estimate")
    if np.any(plans.tp * plans.pp * plans.dp != cluster.num_gpus):
        bad = int(np.argmax(plans.tp * plans.pp * plans.dp != cluster.num_gpus))
        raise InputError(f"plan {plans.plan(bad).short()} uses {int(plans.tp[bad] * plans.pp[bad] * plans.dp[bad])}"
                         f" GPUs but the cluster has gpus={cluster.num_gpus}")
    device = cluster.device
    compute = compute or RooflineModel(device)
    roofline = compute if isinstance(compute, RooflineModel) else RooflineModel(device)
    act_bytes = activation_bytes(plans.dtype)
    w_bytes = 4.0 if plans.dtype in ("fp32", "tf32") else 2.0
    master_bytes = 0.0 if plans.dtype in ("fp32", "tf32") else 4.0

    lc_u, ec_u, act_u, work_u, linv = _layer_costs(model, compute, plans, act_bytes)
    lc = _take_layer(lc_u, linv, grads=False)
    ec = EdgeCost(*(getattr(ec_u, f)[linv] for f in ("first_fwd", "first_bwd", "last_fwd", "last_bwd")))
    # collectives: timed once per distinct communication pattern, then gathered
    tp_ops = _tp_ops(model, flavor)
    _, comm_inv, comm_first = _unique_rows(plans.tp, plans.pp, plans.dp, plans.order, plans.vpp, plans.sp,
                                           plans.micro_batch, plans.zero, with_first=True)
    sub = plans.take(comm_first)
    layers_sub = stage_layers(model.num_layers, sub.pp, sub.vpp)
    params_sub = _params(model, sub, layers_sub)
    raw_sub, curves = _comm_times(model, cluster, sub, params_sub, act_bytes, w_bytes, tp_ops)
    # TP exposure depends on (tp, sp, micro_batch) only, all part of the communication key: reduce there
    lc_sub = _take_layer(lc_u, linv[comm_first], grads=True)
    tpc_sub = _tp_layer_comm(sub, raw_sub, lc_sub, tp_ops)
    wanted = ("first_fwd", "last_fwd", "last_bwd", "p2p", "dp_ar", "dp_rs", "dp_ag", "z3_ag", "z3_rs")
    if len(plans) <= 64:
        wanted += ("_grad_bytes", "_p2p_bytes", "_act_bytes")
    raw = {k: raw_sub[k][comm_inv] for k in wanted}
    tpc = {k: a[comm_inv] for k, a in tpc_sub.items()}

    rc = plans.recompute
    full = rc == 2
    # per layer and micro-batch
    c_layer = lc.fwd + lc.bwd
    r_layer = lc.recompute
    # communication hidden behind compute still slows that compute (NCCL kernels hold SMs and HBM bandwidth)
    penalty = roofline.eff.overlap_compute_penalty
    tp_hidden = (tpc["fwd"] - tpc["fwd_exposed"]) + (tpc["bwd"] - tpc["bwd_exposed"])
    x_layer = (tpc["fwd_exposed"] + tpc["bwd_exposed"] + np.where(full, tpc["fwd_exposed"], 0.0)
               + penalty * tp_hidden)
    tp_layer_total = tpc["fwd"] + tpc["bwd"] + np.where(full, tpc["fwd"], 0.0)

    layers = StageLayers(first=layers_sub.first[comm_inv], last=layers_sub.last[comm_inv],
                         middle=layers_sub.middle[comm_inv])
    single = plans.pp == 1
    first_extra_c = ec.first_fwd + ec.first_bwd + np.where(single, ec.last_fwd + ec.last_bwd, 0.0)
    first_extra_x = raw["first_fwd"] + np.where(single, raw["last_fwd"] + raw["last_bwd"], 0.0)
    last_extra_c = ec.last_fwd + ec.last_bwd
    last_extra_x = raw["last_fwd"] + raw["last_bwd"]
    rank_c = [layers.first * c_layer + first_extra_c, layers.last * c_layer + last_extra_c, layers.middle * c_layer]
    rank_r = [layers.first * r_layer, layers.last * r_layer, layers.middle * r_layer]
    rank_x = [layers.first * x_layer + first_extra_x, layers.last * x_layer + last_extra_x,
              layers.middle * x_layer]
    totals = np.stack([c + r + x for c, r, x in zip(rank_c, rank_r, rank_x)])
    totals[1] = np.where(single, -1.0, totals[1])
    slow = np.argmax(totals, axis=0)
    c_stage, r_stage, x_stage = (_pick(slow, *v) for v in (rank_c, rank_r, rank_x))
    t_stage = c_stage + r_stage + x_stage
    layers_slow = _pick(slow, layers.first, layers.last, layers.middle)

    m = plans.global_batch // (plans.micro_batch * plans.dp)
    v = plans.vpp
    bubble = (plans.pp - 1) / v * t_stage

    # pipeline point-to-point: activations forward, gradients backward, per model chunk and micro-batch
    t_p2p = raw["p2p"]
    pp_total = 2.0 * (m * v + plans.pp - 1) * t_p2p  # per chunk and micro-batch, plus fill and drain (exposed)

    # parameters per rank (the largest stage sets DP traffic and memory)
    params = {k: a[comm_inv] for k, a in params_sub.items()}
    p_layer, emb_local = params["layer"], params["emb_local"]
    params_first, params_last, params_max = params["first"], params["last"], params["max"]

    # data-parallel gradient reduction (and parameter all-gather with ZeRO)
    dp = plans.dp.astype(float)
    zero = plans.zero
    t_ar, t_rs, t_ag, z3_ag, z3_rs = (raw[k] for k in ("dp_ar", "dp_rs", "dp_ag", "z3_ag", "z3_rs"))
    f_layer = lc.fwd + tpc["fwd_exposed"]
    b_layer = lc.bwd + r_layer + tpc["bwd_exposed"]
    z3_total = m * layers_slow * (2 * z3_ag + z3_rs)
    z3_exposed = m * layers_slow * (np.maximum(z3_ag - f_layer, 0.0) + np.maximum(z3_ag + z3_rs - b_layer, 0.0))
    # overlap: grads hide behind the backward of the last micro-batch (bucketed), the ZeRO parameter
    # all-gather behind the forward of the first micro-batch of the next step
    bwd_window = layers_slow * b_layer
    fwd_window = layers_slow * f_layer
    # ZeRO-2 keeps only a gradient shard, so it reduce-scatters after every micro-batch's backward (each
    # hidden behind that backward when overlapped); ZeRO-0/1 reduce once, behind the last backward.
    # ZeRO-3's embedding/output shards: gathered in forward and backward, reduced, every micro-batch.
    reductions = np.where(zero >= 2, m, 1)
    gathers = np.where(zero == 3, 2 * m, 1)
    grad_t = t_ar + t_rs
    ovl = plans.overlap
    dp_exposed = np.where(ovl, reductions * np.maximum(grad_t - bwd_window, 0.0)
                          + gathers * np.maximum(t_ag - fwd_window, 0.0),
                          reductions * grad_t + gathers * t_ag) + z3_exposed
    dp_total = reductions * grad_t + gathers * t_ag + z3_total
    dp_exposed = dp_exposed + penalty * (dp_total - dp_exposed)

    # optimizer step over the rank's (sharded) parameters
    opt_params = np.where(zero >= 1, params_max / dp, params_max)
    t_opt = roofline.optimizer_time(opt_params)

    compute_s = m * c_stage
    recompute_s = m * r_stage
    exposed = m * x_stage + pp_total + dp_exposed
    step = compute_s + recompute_s + bubble + t_opt + exposed
    tp_total = m * (layers_slow * tp_layer_total + _pick(slow, first_extra_x, last_extra_x, 0.0 * x_layer))

    # memory per GPU: first, busiest middle and last pipeline ranks
    act_layer = act_u[linv]
    working = work_u[linv]
    pp_ = plans.pp

    def in_flight(r: np.ndarray | int) -> np.ndarray:
        """Micro-batches (in whole-stage units) whose activations rank r holds at the 1F1B peak: pp - r, or
        (2 (pp - r - 1) + (vpp - 1) pp + 1) / vpp model chunks' worth with interleaving (Megatron's warm-up
        count; Korthikanti et al. 2022 section 4.2.3 for r = 0)."""
        chunks = np.where(v > 1, (2 * (pp_ - r - 1) + (v - 1) * pp_ + 1) / v, pp_ - r)
        return np.minimum(chunks, m).astype(float)
    T = plans.micro_batch * float(model.seq_len)
    emb_buf = np.where(plans.sp, T * model.hidden_size * act_bytes / plans.tp, T * model.hidden_size * act_bytes)
    logits_buf = 4.0 * T * emb_local / model.hidden_size
    z3_buf = np.where(zero == 3, 2.0 * p_layer * w_bytes, 0.0)

    # bytes per parameter held by a rank (weights, fp32 gradients, master + Adam), ZeRO-sharded over dp
    w_div = np.where(zero == 3, dp, 1.0)
    g_div = np.where(zero >= 2, dp, 1.0)
    o_div = np.where(zero >= 1, dp, 1.0)
    per_param = w_bytes / w_div + GRAD_BYTES / g_div + (master_bytes + 8.0) / o_div
    params_mid = params["middle"]
    act_f = layers.first * act_layer * in_flight(0) + working
    other_f = emb_buf + z3_buf + np.where(single, logits_buf, 0.0)
    act_l = layers.last * act_layer * in_flight(pp_ - 1) + working
    other_l = logits_buf + z3_buf
    # the busiest middle rank: the most layers (extra layers go to the middle) with rank 1's in-flight count
    act_m = layers.middle * act_layer * in_flight(1) + working
    tot_f = params_first * per_param + act_f + other_f
    tot_l = np.where(single, -1.0, params_last * per_param + act_l + other_l)
    tot_m = np.where(pp_ > 2, params_mid * per_param + act_m + z3_buf, -1.0)
    peak_rank = np.argmax(np.stack([tot_f, tot_l, tot_m]), axis=0)
    held = _pick(peak_rank, params_first, params_last, params_mid)
    mem = {"weights": held * w_bytes / w_div, "grads": held * GRAD_BYTES / g_div,
           "optimizer_states": held * (master_bytes + 8.0) / o_div,
           "activations": _pick(peak_rank, act_f, act_l, act_m), "other": _pick(peak_rank, other_f, other_l, z3_buf)}
    peak = np.maximum(np.maximum(tot_f, tot_l), tot_m)
    fits = peak <= device.usable_memory_bytes

    # throughput and FLOP rates
    tokens = plans.global_batch * float(model.seq_len)
    mflops = plans.global_batch * model_flops_per_sequence(model)
    layer_f, score_f = layer_forward_flops(model)
    extra = np.where(full, layer_f, np.where(rc == 1, score_f, 0.0)) * model.num_layers * plans.global_batch
    hflops = mflops + extra
    gpus = float(cluster.num_gpus)
    peak_flops = device.peak(plans.dtype)
    collectives: tuple = ()
    if n <= 64:
        collectives = tuple(_algorithms(curves, int(comm_inv[i]), act=float(raw["_act_bytes"][i]),
                                        grad=float(raw["_grad_bytes"][i]), p2p=float(raw["_p2p_bytes"][i]),
                                        sp=bool(plans.sp[i]), zero=int(zero[i])) for i in range(n))
    return EstimateBatch(
        plans=plans, step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=mflops / (step * gpus) / 1e12, hardware_tflops_per_gpu=hflops / (step * gpus) / 1e12,
        mfu=mflops / (step * gpus * peak_flops), hfu=hflops / (step * gpus * peak_flops),
        peak_memory_gib=peak / GiB, fits=fits, compute_s=compute_s, recompute_s=recompute_s, bubble_s=bubble,
        optimizer_s=t_opt, exposed_comm_s=exposed, tp_comm_s=tp_total, pp_comm_s=pp_total, dp_comm_s=dp_total,
        mem_weights_gib=mem["weights"] / GiB, mem_grads_gib=mem["grads"] / GiB,
        mem_optimizer_states_gib=mem["optimizer_states"] / GiB, mem_activations_gib=mem["activations"] / GiB,
        mem_other_gib=mem["other"] / GiB, measured_compute_fraction=lc.measured, model_name=model.name,
        cluster_info={"name": cluster.name, "gpus": cluster.num_gpus, "device": device.name,
                      "gpus_per_node": cluster.gpus_per_node},
        compute_model=compute.source, collectives=collectives)


def _algorithms(curves: _Curves, i: int, *, act: float, grad: float, p2p: float, sp: bool,
                zero: int) -> dict[str, str]:
    entry = curves.objects[curves.inverse[i]]
    tp_op = "reduce_scatter" if sp else "all_reduce"
    dp_op = "reduce_scatter" if zero else "all_reduce"
    out = {"tp": f"{tp_op}: {entry[f'tp.{tp_op}'].best(act)[1]}",
           "dp": f"{dp_op}: {entry[f'dp.{dp_op}'].best(grad)[1]}",
           "pp": f"send_recv: {entry['pp.send_recv'].best(p2p)[1]}"}
    return {axis: text for axis, text in out.items() if not text.endswith(": none")}  # axes of size 1


def estimate(model: ModelSpec, cluster, plan: Plan, compute: ComputeModel | None = None,
             flavor: str = "megatron") -> Estimate:
    """Estimate one plan (a batch of one)."""
    validate_plan(model, plan, cluster.num_gpus)
    batch = estimate_batch(model, cluster, PlanBatch.from_plans([plan]), compute, flavor)
    warnings = []
    from ..topology.placement import nodes_spanned, rank_groups
    tp_group = rank_groups(plan.tp, plan.dp, plan.pp, plan.order)["tp"][0]
    if nodes_spanned(tp_group, cluster.gpus_per_node) > 1:
        warnings.append(f"TP group of {plan.tp} spans {nodes_spanned(tp_group, cluster.gpus_per_node)} nodes: "
                        f"tensor-parallel traffic crosses the inter-node network")
    profile = getattr(compute, "profile", None)
    if profile is not None:
        from ..compute.profile import profile_device_name, profile_matches_device
        if not profile_matches_device(profile, cluster.device.name):
            warnings.append(f"the kernel profile was measured on {profile_device_name(profile)}, not on the "
                            f"cluster's {cluster.device.name}: compute times are that device's")
    if not batch.fits[0]:
        warnings.append(f"does not fit: {batch.peak_memory_gib[0]:.1f} GiB needed, "
                        f"{cluster.device.usable_memory_bytes / GiB:.1f} GiB usable on {cluster.device.name}")
    return batch.to_estimate(0, tuple(warnings))
