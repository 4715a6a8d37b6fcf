"""Step time, throughput and memory of plans for a traced op graph, all plans of a batch at once (numpy).

Two paths, one cost model (:mod:`tpsim.opgraph.cost` for compute, :mod:`tpsim.opgraph.layout` for the TP
collectives):

* **transformer-like graphs** (one repeated block, glue before and after it): the estimator's own stages
  (:mod:`tpsim.estimator`: partition, communication, schedule, memory) run on an
  :class:`~tpsim.opgraph.source.OpGraphSource` in an :class:`~tpsim.estimator.context.EstimationContext`, as
  for a preset; only the totals (FLOPs and tokens from the graph) are this module's.
* **any other graph** (ResNets, U-Nets: blocks of different shapes): the estimator's partition splits identical
  layers only, so this module builds per-unit and per-rank arrays and runs the schedule's rules on them
  (:mod:`tpsim.estimator.schedule`: ``layer_exposed``, ``slowest``, ``zero3_layer``, ``dp_exposure``,
  ``optimizer_step``, ``backward_fraction``; :mod:`tpsim.pipeline`: the bubble, sends and in-flight
  micro-batches of the plan's schedule): the pipeline paced by the slowest rank, point-to-point traffic per
  model chunk and micro-batch, data-parallel reduction and ZeRO 1-3, the TP all-reduce of replicated
  parameters' gradients once per step, exposed, the stack's optimizer step and precision table, memory per
  rank with the schedule's in-flight micro-batch counts. The layers (block instances and glue units) are cut into ``pp x vpp`` contiguous chunks
  minimising the largest chunk's forward + backward time at tp = 1 (chunk c on rank c mod pp); a stage
  boundary sends the activations live there (skip connections included), split over the TP ranks
  (Megatron's scatter/gather optimization). Collectives are timed with ``CollectiveModel.axis_curve`` on the
  plan's ``RankLayout``; a calibration's ``compute`` section scales kernel times and adds its host overhead
  per layer, as the estimator's context does. (When the estimator's partition stage takes layers of different
  costs, this path becomes a source like the other.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.base import ComputeModel
from ..compute.roofline import RooflineModel, activation_bytes
from ..errors import InputError
from ..hardware import overlap_penalty
from .. import pipeline
from ..estimator.keys import distinct
from ..estimator.partition import stage_layers
from ..estimator.schedule import (_pick, backward_fraction, dp_exposure, layer_exposed, optimizer_step, slowest,
                                  zero3_layer)
from ..estimator.result import Estimate, EstimateBatch
from ..plan import ORDERS, Plan, PlanBatch
from ..units import GiB
from .cost import GraphCosts
from .model import OpGraphModel, validate_graph_plan

TP_OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
DP_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _unique(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows, the plans' row index): the estimator's :func:`~tpsim.estimator.keys.distinct`."""
    keys = distinct(*cols)
    return keys.rows, keys.inverse


# ---- collective curves per plan -------------------------------------------------------------------------
_BYTES = np.logspace(0, 13, 131)


def _envelope(curve: Any) -> tuple[np.ndarray, np.ndarray]:
    """The lines of a cost curve that are its minimum somewhere in 1 B .. 10 TB."""
    lat = np.asarray(curve.latency_s, dtype=float)
    spb = np.asarray(curve.sec_per_byte, dtype=float)
    win = np.unique(np.argmin(lat[None, :] + _BYTES[:, None] * spb[None, :], axis=1))
    return lat[win], spb[win]


@dataclass
class _Curves:
    """Per plan, the lines of each (axis, op) curve: name -> (K x N latency, K x N sec/byte)."""

    lines: dict[str, tuple[np.ndarray, np.ndarray]]
    entries: list[dict[str, Any]]
    inverse: np.ndarray

    def time(self, name: str, nbytes: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        lat, spb = self.lines[name]
        b = np.asarray(nbytes, dtype=float)
        t = (lat[:, rows] + b[None, :] * spb[:, rows]).min(axis=0)
        return np.where(b > 0, t, 0.0)


def _curves(cluster: Any, plans: PlanBatch) -> _Curves:
    from ..collectives.curve import CostCurve
    from ..collectives.model import get_collective_model
    from ..topology.placement import RankLayout

    cm = get_collective_model(cluster)
    uniq, inv = _unique(plans.tp, plans.pp, plans.dp, plans.order)
    entries = []
    for tp, pp, dp, order in uniq:
        layout = RankLayout.from_order(ORDERS[int(order)], tp=int(tp), dp=int(dp), pp=int(pp))
        entry = {}
        for axis, ops in (("tp", TP_OPS), ("dp", DP_OPS), ("pp", ("send_recv",))):
            for op in ops:
                entry[f"{axis}.{op}"] = cm.axis_curve(op, layout, axis) if layout.size(axis) > 1 else CostCurve.zero()
        entries.append(entry)
    lines = {}
    for name in entries[0]:
        env = [_envelope(e[name]) for e in entries]
        k = max(len(la) for la, _ in env)
        lat = np.array([np.pad(la, (0, k - len(la)), mode="edge") for la, _ in env]).T
        spb = np.array([np.pad(sp, (0, k - len(sp)), mode="edge") for _, sp in env]).T
        lines[name] = (lat[:, inv], spb[:, inv])
    return _Curves(lines=lines, entries=entries, inverse=inv)


# ---- pipeline split --------------------------------------------------------------------------------------
def _min_max_chunks(weights: np.ndarray, k: int) -> list[int]:
    """Start index of each of ``k`` contiguous chunks minimising the largest chunk sum (binary search on the
    capacity with greedy packing, then the largest chunks split until there are ``k``)."""
    lo, hi = float(weights.max()), float(weights.sum())
    for _ in range(60):
        cap = (lo + hi) / 2
        if len(_greedy(weights, cap)) <= k:
            hi = cap
        else:
            lo = cap
    starts = _greedy(weights, hi)
    while len(starts) < k:  # split the largest splittable chunk
        bounds = starts + [len(weights)]
        sizes = [(weights[a:b].sum(), i) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b - a > 1]
        _, i = max(sizes)
        a, b = bounds[i], bounds[i + 1]
        c = np.cumsum(weights[a:b])
        cut = a + int(np.argmin(np.abs(c[:-1] - c[-1] / 2))) + 1
        starts = sorted(starts + [cut])
    return starts


def _greedy(weights: np.ndarray, cap: float) -> list[int]:
    starts, total = [0], 0.0
    for i, w in enumerate(weights):
        if total + w > cap * (1 + 1e-12) and total > 0:
            starts.append(i)
            total = 0.0
        total += w
    return starts


class _Partitions:
    """Layers of each unit on each pipeline rank, per (pp, vpp)."""

    def __init__(self, model: OpGraphModel, costs: GraphCosts, dtype: str) -> None:
        self.graph = model.graph
        repeats = [u.repeat for u in self.graph.units]
        blocks = [i for i, r in enumerate(repeats) if r > 1]
        self.block = blocks[0] if len(blocks) == 1 and len(repeats) <= 3 else None
        self.layer_unit = np.repeat(np.arange(len(repeats)), repeats)
        one = np.ones(1)
        unit_w = np.array([float((c.fwd + c.bwd)[0]) for c in
                           (costs.unit_cost(u, 1, False, one, dtype) for u in range(len(repeats)))])
        self.weights = unit_w[self.layer_unit]
        self._cache: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}

    def get(self, pp: int, vpp: int) -> tuple[np.ndarray, list[int]]:
        """(W: pp x units counts of layers, cut units: the unit at each stage boundary)."""
        key = (pp, vpp)
        if key not in self._cache:
            self._cache[key] = self._megatron(pp, vpp) if self.block is not None else self._balanced(pp, vpp)
        return self._cache[key]

    def _megatron(self, pp: int, vpp: int) -> tuple[np.ndarray, list[int]]:
        n_units, b = len(self.graph.units), self.block
        w = np.zeros((pp, n_units))
        if pp == 1:
            w[0] = [u.repeat for u in self.graph.units]
            return w, []
        layers = stage_layers(self.graph.units[b].repeat, np.array([pp]), np.array([vpp]))
        w[0, :b] = 1.0
        w[pp - 1, b + 1:] = 1.0
        w[0, b] = layers.first[0]
        w[pp - 1, b] = layers.last[0]
        w[1:pp - 1, b] = layers.middle[0]
        return w, [b] + ([b + 1] if b + 1 < n_units else [])

    def _balanced(self, pp: int, vpp: int) -> tuple[np.ndarray, list[int]]:
        n_units = len(self.graph.units)
        starts = _min_max_chunks(self.weights, pp * vpp)
        bounds = starts + [len(self.weights)]
        w = np.zeros((pp, n_units))
        for c, (a, z) in enumerate(zip(bounds, bounds[1:])):
            np.add.at(w[c % pp], self.layer_unit[a:z], 1.0)
        return w, [int(self.layer_unit[s]) for s in starts[1:]]


# ---- the estimator ---------------------------------------------------------------------------------------
@dataclass
class _UnitArrays:
    """Per unit (rows) and plan (columns): seconds, bytes and parameters of one instance."""

    fwd: np.ndarray
    bwd: np.ndarray
    rsel: np.ndarray
    measured: np.ndarray
    act: dict[int, np.ndarray]
    inb: np.ndarray
    params: np.ndarray
    gred: np.ndarray
    comm: dict[str, np.ndarray]
    shared: dict[str, np.ndarray]
    """tied parameter -> elements one rank holds, per plan."""


def _unit_arrays(costs: GraphCosts, plans: PlanBatch, curves: _Curves, act_b: int) -> _UnitArrays:
    graph = costs.graph
    n_units, n = len(graph.units), len(plans)
    z = lambda: np.zeros((n_units, n))  # noqa: E731
    out = _UnitArrays(fwd=z(), bwd=z(), rsel=z(), measured=z(), act={0: z(), 1: z(), 2: z()}, inb=z(),
                      params=z(), gred=z(), comm={k: z() for k in ("fwd", "bwd", "fwd_exposed", "bwd_exposed")},
                      shared={name: np.zeros(n) for name, _ in _shared_params(graph)})
    pairs, pair_inv = _unique(plans.tp, plans.sp)
    for p, (tp, sp) in enumerate(pairs):
        rows = np.flatnonzero(pair_inv == p)
        mbs, mb_inv = np.unique(plans.micro_batch[rows], return_inverse=True)
        statics, _ = costs.static(int(tp), bool(sp))
        for u in range(n_units):
            c = costs.unit_cost(u, int(tp), bool(sp), mbs, plans.dtype)
            take = lambda a: np.asarray(a)[mb_inv]  # noqa: E731
            out.fwd[u, rows], out.bwd[u, rows] = take(c.fwd), take(c.bwd)
            out.rsel[u, rows], out.measured[u, rows] = take(c.recompute_selective), take(c.measured)
            for rc in (0, 1, 2):
                out.act[rc][u, rows] = take(c.activation_bytes[rc])
            out.inb[u, rows] = take(c.input_bytes) * (tp if sp else 1)  # full boundary tensors
            out.params[u, rows] = statics[u].params
            out.gred[u, rows] = statics[u].grad_reduce_params
            for name in out.shared:
                if name in statics[u].param_local:
                    prev = out.shared[name][rows]
                    local = statics[u].param_local[name]
                    out.shared[name][rows] = np.where(prev > 0, np.minimum(prev, local), local)
            if tp > 1:
                _tp_comm(out, u, statics[u].layout.comms, c, rows, mb_inv, plans.micro_batch[rows] / graph.batch,
                         curves, act_b, costs.flavor)
    return out


def _tp_comm(out: _UnitArrays, u: int, comms: tuple, cost: Any, rows: np.ndarray, mb_inv: np.ndarray,
             scale: np.ndarray, curves: _Curves, act_b: int, flavor: str) -> None:
    for c in comms:
        nbytes = c.numel * (scale if c.batched else 1.0) * (act_b if c.dtype == "act" else 4.0)
        t = curves.time(f"tp.{c.op}", np.broadcast_to(nbytes, rows.shape), rows)
        hide = np.zeros(len(rows))
        if c.overlap and flavor == "megatron":
            source = cost.wgrad if c.overlap == "wgrad" else cost.dgrad
            for j in c.hide:
                if j in source:
                    hide = hide + np.asarray(source[j])[mb_inv]
        out.comm[c.phase][u, rows] += t
        out.comm[f"{c.phase}_exposed"][u, rows] += np.maximum(t - hide, 0.0)


def _terms(stack: Any) -> Any:
    """The stack profile's terms (its precision table and optimizer bytes; None: the default stack)."""
    from ..estimator.context import resolve_stack
    from ..estimator.stackterms import stack_terms

    return stack_terms(resolve_stack(stack))


def _generic_batch(model: OpGraphModel, cluster: Any, plans: PlanBatch, compute: ComputeModel | None,
                   flavor: str, conv_times: Any, calibration: Any = None, stack: Any = None) -> EstimateBatch:
    """The formulas of the transformer estimator over units of any shape (module docstring)."""
    n = len(plans)
    device = cluster.device
    roofline = compute if isinstance(compute, RooflineModel) else RooflineModel(device)
    compute, host_s, warnings = _calibrated(cluster, compute or roofline, calibration)
    act_b = activation_bytes(plans.dtype)
    terms = _terms(stack)
    sb = terms.state_bytes(plans.dtype)  # the stack's precision table (tpsim/precision.py), as the estimator's
    w_bytes, wire_w, wire_g = sb.weights, sb.wire_params, sb.wire_grads
    costs = _costs(model, compute, flavor, conv_times)
    curves = _curves(cluster, plans)
    ua = _unit_arrays(costs, plans, curves, act_b)
    penalty = overlap_penalty(device, roofline.eff.overlap_compute_penalty)

    rc = plans.recompute
    # full recomputation checkpoints the blocks (Megatron / torchtitan per-layer checkpointing); the glue
    # (embedding, output layer, loss) keeps its activations and is not run twice
    blocks = np.array([u.kind == "block" for u in model.graph.units])[:, None]
    full = (rc == 2)[None, :] & blocks
    c_u = ua.fwd + ua.bwd
    r_u = np.where(full, ua.fwd, np.where(rc == 1, ua.rsel, 0.0))
    cm = ua.comm
    x_u = layer_exposed(cm["fwd"], cm["bwd"], cm["fwd_exposed"], cm["bwd_exposed"], full, penalty)
    tp_u = cm["fwd"] + cm["bwd"] + np.where(full, cm["fwd"], 0.0)
    act_u = np.where(full, ua.act[2], np.where(rc == 1, ua.act[1], ua.act[0]))
    f_u = ua.fwd + cm["fwd_exposed"]
    b_u = ua.bwd + r_u + cm["bwd_exposed"]

    m = plans.global_batch // (plans.micro_batch * plans.dp)
    v = plans.vpp
    res = {k: np.zeros(n) for k in ("c", "r", "x", "o", "tp", "f", "b", "layers", "params_max", "tensors", "gred",
                                    "p2p_bytes",
                                    "peak", "weights_p", "act", "other", "measured", "z3_total",
                                    "z3_exposed")}
    parts = _Partitions(model, costs, plans.dtype)
    tensors_u = np.array([len({p for op in u.ops for p in op.params}) for u in model.graph.units], dtype=float)
    shared = _shared_params(model.graph)
    pv, pv_inv = _unique(plans.pp, plans.vpp)
    zero = plans.zero
    dp = plans.dp.astype(float)
    w_div = np.where(zero == 3, dp, 1.0)
    g_div = np.where(zero >= 2, dp, 1.0)
    o_div = np.where(zero >= 1, dp, 1.0)
    per_param = w_bytes / w_div + sb.grads / g_div + (sb.master + sb.moments) / o_div
    # ZeRO-3: each block instance's weights gathered before its forward and its backward (prefetched one block
    # ahead: hidden behind that block's compute), its gradients reduce-scattered after its backward; the glue
    # (embedding, output layer) is gathered twice and reduced once per micro-batch behind the whole stage's
    # forward / backward, as the transformer estimator does for the embedding and output layer
    z3 = (zero == 3) & (plans.dp > 1)
    glue = ~blocks[:, 0]
    z3_ag_u = np.stack([curves.time("dp.all_gather", np.where(z3, ua.params[u] * wire_w, 0.0))
                        for u in range(len(model.graph.units))])
    z3_rs_u = np.stack([curves.time("dp.reduce_scatter", np.where(z3, ua.params[u] * wire_g, 0.0))
                        for u in range(len(model.graph.units))])
    once = np.ones(n)  # per micro-batch: one gather for the forward, one for the backward, one reduction
    z3_tot_u, z3_exp_u, _ = (np.where(blocks, v, 0.0)
                             for v in zero3_layer(z3_ag_u, z3_rs_u, f_u, b_u, once, once, once))
    for g, (pp, vpp) in enumerate(pv):
        rows = np.flatnonzero(pv_inv == g)
        w, cuts = parts.get(int(pp), int(vpp))
        rank = {k: w @ a[:, rows] for k, a in (("c", c_u), ("r", r_u), ("x", x_u), ("tp", tp_u), ("f", f_u),
                                                ("b", b_u), ("act", act_u), ("gred", ua.gred),
                                                ("measured", ua.measured), ("z3_total", z3_tot_u),
                                                ("z3_exposed", z3_exp_u))}
        params = w @ ua.params[:, rows] - _shared_correction(w, shared, ua.shared, rows)
        # the glue's parameters on each rank (tied ones once): gathered and reduced as one more layer
        glue_p = np.maximum(params - w[:, ~glue] @ ua.params[~glue][:, rows], 0.0)
        z3_rows = z3[rows]
        g_ag = np.stack([curves.time("dp.all_gather", np.where(z3_rows, gp * wire_w, 0.0), rows) for gp in glue_p])
        g_rs = np.stack([curves.time("dp.reduce_scatter", np.where(z3_rows, gp * wire_g, 0.0), rows)
                         for gp in glue_p])
        rank["z3_total"] = rank["z3_total"] + 2 * g_ag + g_rs
        rank["z3_exposed"] = rank["z3_exposed"] + 2 * np.maximum(g_ag - rank["f"], 0.0) + np.maximum(
            g_rs - rank["b"], 0.0)
        rank["o"] = np.repeat(w.sum(axis=1)[:, None] * host_s, len(rows), axis=1)
        slow, _ = slowest(True, rank["c"], rank["r"], rank["x"], rank["o"])
        for k in ("c", "r", "x", "o", "tp", "f", "b", "measured", "z3_total", "z3_exposed"):
            res[k][rows] = _pick(slow, rank[k])
        res["layers"][rows] = w.sum(axis=1)[slow]
        res["params_max"][rows] = params.max(axis=0)
        res["tensors"][rows] = float((w @ tensors_u).max())
        res["gred"][rows] = rank["gred"].max(axis=0)
        present = (w > 0)[:, :, None]
        tpv = plans.tp[rows].astype(float)
        res["p2p_bytes"][rows] = (ua.inb[cuts][:, rows].max(axis=0) / tpv) if cuts and pp > 1 else 0.0
        # memory of every rank: its parameters, its layers' activations times the micro-batches in flight
        r_idx = np.arange(int(pp))[:, None]
        mm = m[rows][None, :]
        in_flight = pipeline.in_flight(plans.schedule[rows][None, :], r_idx, pp, vpp, mm)
        working = np.where(full[:, rows][None], present * ua.act[0][None, :, rows], 0.0).max(axis=1)
        z3_buf = np.where(zero[rows] == 3, 2.0 * np.where(present, ua.params[None, :, rows], 0.0).max(axis=1)
                          * w_bytes, 0.0)
        act_r = rank["act"] * in_flight + working
        tot = params * per_param[rows][None, :] + act_r + z3_buf
        peak_rank = np.argmax(tot, axis=0)
        res["peak"][rows] = _pick(peak_rank, tot)
        res["weights_p"][rows] = _pick(peak_rank, params)
        res["act"][rows] = _pick(peak_rank, act_r)
        res["other"][rows] = _pick(peak_rank, z3_buf)
    return _totals(model, cluster, plans, compute, curves, res, m, v, terms, w_div, g_div, o_div, penalty, costs,
                   warnings)


def _totals(model: OpGraphModel, cluster: Any, plans: PlanBatch, compute: ComputeModel,
            curves: _Curves, res: dict[str, np.ndarray], m: np.ndarray, v: np.ndarray,
            terms: Any, w_div: np.ndarray, g_div: np.ndarray, o_div: np.ndarray, penalty: float, costs: GraphCosts,
            warnings: tuple[str, ...]) -> EstimateBatch:
    device = cluster.device
    t_stage = res["c"] + res["r"] + res["x"] + res["o"]
    # the fill and drain run whole stages: ZeRO-3's gathers exposed inside each micro-batch's passes count
    # (res["z3_exposed"] is per micro-batch), as in the estimator's schedule
    bubble = pipeline.bubble(plans.schedule, plans.pp, v, t_stage + res["z3_exposed"],
                             backward_fraction(res["b"], res["f"] + res["b"]))
    t_p2p = curves.time("pp.send_recv", res["p2p_bytes"])
    pp_total, pp_exposed = pipeline.pipeline_sends(plans.schedule, plans.pp, v, m, t_p2p)
    # data parallel (and ZeRO), as the transformer estimator; ZeRO-3 gathers / reduces each layer's weights
    zero, has_dp = plans.zero, plans.dp > 1
    sb = terms.state_bytes(plans.dtype)
    grad_b, weight_b = res["params_max"] * sb.wire_grads, res["params_max"] * sb.wire_params
    t_ar = curves.time("dp.all_reduce", np.where(has_dp & (zero == 0), grad_b, 0.0))
    z12 = has_dp & (zero >= 1) & (zero <= 2)
    t_rs = curves.time("dp.reduce_scatter", np.where(z12, grad_b, 0.0))
    t_ag = curves.time("dp.all_gather", np.where(z12, weight_b, 0.0))
    z3_total = m * res["z3_total"]
    z3_exposed = m * res["z3_exposed"]
    ovl = plans.overlap
    bwd_window = res["b"]
    dp_total, dp_exposed = dp_exposure(t_ar + t_rs, t_ag, np.where(zero >= 2, m, 1), np.where(zero == 3, 2 * m, 1),
                                       bwd_window, res["f"], ovl, penalty, z3_total, z3_exposed)
    # gradients of parameters used on a token / position split: all-reduced over TP once per step after the
    # backward, synchronous (the estimator's Comm.tp_grad_sync: Megatron-Core finalize_model_grads)
    t_gred = curves.time("tp.all_reduce", res["gred"] * sb.wire_grads)
    gred_exposed = t_gred
    opt_params = np.where(zero >= 1, res["params_max"] / plans.dp, res["params_max"])
    # the estimator's optimizer rule under the stack (fused Adam's bytes per parameter, its launches)
    from ..compute.training import achieved_hbm

    t_opt = optimizer_step(terms, achieved_hbm(compute, device), opt_params, res["tensors"], plans.dtype)

    compute_s, recompute_s, overhead = m * res["c"], m * res["r"], m * res["o"]
    exposed = m * res["x"] + pp_exposed + dp_exposed + gred_exposed
    step = compute_s + recompute_s + bubble + t_opt + exposed + overhead
    tp_total = m * res["tp"] + t_gred
    rates = _rates(model, costs, cluster, plans, step)
    held = res["weights_p"]
    c_total = res["c"]
    measured = np.where(c_total > 0, res["measured"] / np.where(c_total > 0, c_total, 1.0), 0.0)
    codes, names = _algorithm_codes(curves, plans, res, grad_b)
    return EstimateBatch(
        plans=plans, step_time_s=step, **rates,
        peak_memory_gib=res["peak"] / GiB, fits=res["peak"] <= device.usable_memory_bytes, compute_s=compute_s,
        recompute_s=recompute_s, bubble_s=bubble, optimizer_s=t_opt, exposed_comm_s=exposed, tp_comm_s=tp_total,
        pp_comm_s=pp_total, dp_comm_s=dp_total, mem_weights_gib=held * sb.weights / w_div / GiB,
        mem_grads_gib=held * sb.grads / g_div / GiB, mem_optimizer_states_gib=held * (sb.master + sb.moments) / o_div / GiB,
        mem_activations_gib=res["act"] / GiB, mem_other_gib=res["other"] / GiB, measured_compute_fraction=measured,
        overhead_s=overhead, model_name=model.name, cluster_info=_cluster_info(cluster),
        compute_model=compute.source, collective_codes=codes, collective_names=names, context_warnings=warnings,
        usable_memory_gib=device.usable_memory_bytes / GiB, flops_convention="full")


def _cluster_info(cluster: Any) -> dict[str, Any]:
    return {"name": cluster.name, "gpus": cluster.num_gpus, "device": cluster.device.name,
            "gpus_per_node": cluster.gpus_per_node}


def _rates(model: OpGraphModel, costs: GraphCosts, cluster: Any, plans: PlanBatch,
           step: np.ndarray) -> dict[str, np.ndarray]:
    """Throughput and FLOP rates: model FLOPs = 3 x the forward matmul FLOPs (linear, convolution, batched
    matmul, attention at torch's FlopCounterMode count: full, non-causal attention, as Korthikanti et al.);
    hardware FLOPs add the recomputed forward (full: the blocks'; selective: the attention core's)."""
    samples = plans.global_batch.astype(float)
    fwd_flops, core_flops = costs.forward_flops()
    block_flops = costs.forward_flops(blocks_only=True)[0]
    mflops = samples * 3.0 * fwd_flops
    extra = np.where(plans.recompute == 2, block_flops, np.where(plans.recompute == 1, core_flops, 0.0)) * samples
    hflops = mflops + extra
    gpus = float(cluster.num_gpus)
    peak = cluster.device.peak(plans.dtype)
    return {"tokens_per_s": samples * model.graph.tokens_per_sample / step,
            "model_tflops_per_gpu": mflops / (step * gpus) / 1e12,
            "hardware_tflops_per_gpu": hflops / (step * gpus) / 1e12, "mfu": mflops / (step * gpus * peak),
            "hfu": hflops / (step * gpus * peak)}


def _algorithm_codes(curves: _Curves, plans: PlanBatch, res: dict[str, np.ndarray],
                     grad_b: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Per axis of size > 1 and plan, the algorithm of the line that times its main collective: TP an
    all-reduce of 16 MiB, DP the gradient reduction, PP the boundary send/receive (code into the names)."""
    names: dict[str, int] = {}
    codes: dict[str, np.ndarray] = {}
    zero = plans.zero
    for axis, op_of, size in (("tp", lambda i: "all_reduce", lambda i: float(1 << 24)),  # noqa: ARG005 (a fixed signature)
                              ("dp", lambda i: "reduce_scatter" if zero[i] else "all_reduce",
                               lambda i: float(grad_b[i])),
                              ("pp", lambda i: "send_recv", lambda i: float(res["p2p_bytes"][i]))):  # noqa: ARG005 (a fixed signature)
        out = np.full(len(plans), -1, dtype=np.int32)
        memo: dict[tuple, int] = {}
        for i in range(len(plans)):
            key = (int(curves.inverse[i]), op_of(i), size(i))
            if key not in memo:
                curve = curves.entries[key[0]][f"{axis}.{key[1]}"]
                name = curve.best(max(key[2], 1.0))[1]
                memo[key] = -1 if name == "none" else names.setdefault(f"{key[1]}: {name}", len(names))
            out[i] = memo[key]
        codes[axis] = out
    return codes, tuple(names)


def _calibrated(cluster: Any, compute: ComputeModel, calibration: Any = None
                ) -> tuple[ComputeModel, float, tuple[str, ...]]:
    """The cluster's calibration ``compute`` section, as the estimator's context applies it: kernel-time
    factors and host overhead per layer (seconds) when fitted for this device; else a warning."""
    from ..compute.scaled import ScaledCompute
    from ..estimator.context import _profile_warnings

    warnings = list(_profile_warnings(compute, cluster.device.name))
    cal = calibration if calibration is not None else getattr(getattr(cluster, "spec", None), "calibration", None)
    fit = getattr(cal, "compute", None)
    if fit is None:
        return compute, 0.0, tuple(warnings)
    if fit.device is not None and fit.device != cluster.device.name:
        warnings.append(f"calibration: compute section not applied (fitted on device {fit.device}, the cluster "
                        f"has {cluster.device.name})")
        return compute, 0.0, tuple(warnings)
    scaled = ScaledCompute.of_calibration(compute, fit) if fit.scales_time else compute
    return scaled, fit.host_overhead_per_layer_us * 1e-6, tuple(warnings)


def _shared_params(graph: Any) -> list[tuple[str, list[int]]]:
    """Parameters used by more than one unit (tied weights): (name, units)."""
    users: dict[str, list[int]] = {}
    for u, unit in enumerate(graph.units):
        for name in dict.fromkeys(p for op in unit.ops for p in op.params):
            users.setdefault(name, []).append(u)
    return [(name, units) for name, units in users.items() if len(units) > 1]


def _shared_correction(w: np.ndarray, shared: list, local: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Parameters counted twice on a rank that holds two units sharing them (tied embedding and output layer:
    one copy per rank; a pipeline puts a copy on the first and on the last rank, as Megatron does)."""
    out = np.zeros((w.shape[0], len(rows)))
    for name, units in shared:
        holders = (w[:, units] > 0).sum(axis=1)
        out += np.maximum(holders - 1, 0)[:, None] * local[name][rows][None, :]
    return out


def _costs(model: OpGraphModel, compute: ComputeModel, flavor: str, conv_times: Any) -> GraphCosts:
    """The graph's cost source, remembered per (model, compute model, flavor) identity."""
    key = (id(model), id(compute), flavor, id(conv_times))
    hit = _COSTS.get(key)
    if hit is None or hit[1] is not model or hit[2] is not compute:
        hit = _COSTS[key] = (GraphCosts(model.graph, model.tp_plan, compute, flavor, conv_times), model, compute)
        while len(_COSTS) > 16:
            _COSTS.pop(next(iter(_COSTS)))
    return hit[0]


_COSTS: dict[tuple, tuple] = {}
_CONTEXTS: dict[tuple, tuple] = {}


def graph_context(model: OpGraphModel, cluster: Any, compute: ComputeModel | None = None, flavor: str = "megatron",
                  conv_times: Any = None, stack: Any = None, calibration: Any = None) -> Any:
    """An :class:`EstimationContext` whose layer source is the graph (transformer-like graphs), remembered
    by the inputs' identity like :func:`tpsim.estimator.context_for`."""
    from ..estimator.context import EstimationContext
    from .source import OpGraphSource

    key = (id(model), id(cluster), id(compute), flavor, id(conv_times), id(stack), id(calibration))
    hit = _CONTEXTS.get(key)
    if hit is None or hit[1] is not model or hit[2] is not cluster:
        source = OpGraphSource(model.graph, model.tp_plan, flavor, conv_times)
        ctx = EstimationContext.build(model, cluster, compute, flavor=flavor, source=source, stack=stack,  # type: ignore[arg-type]
                                      calibration=calibration)
        hit = _CONTEXTS[key] = (ctx, model, cluster, compute, calibration)
        while len(_CONTEXTS) > 16:
            _CONTEXTS.pop(next(iter(_CONTEXTS)))
    return hit[0]


def _stages_batch(model: OpGraphModel, cluster: Any, plans: PlanBatch, compute: ComputeModel | None, flavor: str,
                  conv_times: Any, stack: Any = None, calibration: Any = None) -> EstimateBatch:
    """The estimator's own stages (and totals: FLOPs and tokens from the source) on the graph's layer source."""
    from ..estimator.core import run_stages

    return run_stages(graph_context(model, cluster, compute, flavor, conv_times, stack, calibration), plans)


def estimate_graph_batch(model: OpGraphModel, cluster: Any, plans: PlanBatch, compute: ComputeModel | None = None,
                         flavor: str = "megatron", conv_times: Any = None, stack: Any = None,
                         calibration: Any = None) -> EstimateBatch:
    """Estimate every plan of the batch for the traced model (plans valid for it on ``cluster``); ``stack``
    (a training-stack profile or name): transformer-like graphs run the estimator's stages under it; other graphs
    take its precision table and optimizer bytes."""
    from .source import transformer_like

    if len(plans) == 0:
        raise InputError("no plans to estimate")
    wrong = plans.tp * plans.pp * plans.dp != cluster.num_gpus
    if np.any(wrong):
        bad = int(np.argmax(wrong))
        raise InputError(f"plan {plans.plan(bad).short()} does not use the cluster's gpus={cluster.num_gpus}")
    if transformer_like(model.graph) is not None:
        return _stages_batch(model, cluster, plans, compute, flavor, conv_times, stack, calibration)
    return _generic_batch(model, cluster, plans, compute, flavor, conv_times, calibration, stack)


def estimate_graph(model: OpGraphModel, cluster: Any, plan: Plan, compute: ComputeModel | None = None,
                   flavor: str = "megatron", conv_times: Any = None, stack: Any = None,
                   calibration: Any = None) -> Estimate:
    """Estimate one plan for the traced model (a batch of one); its warnings add the regions of the derived
    plan that run replicated at this TP degree."""
    validate_graph_plan(model, plan, cluster.num_gpus)
    batch = estimate_graph_batch(model, cluster, PlanBatch.from_plans([plan]), compute, flavor, conv_times, stack,
                                 calibration)
    return batch.to_estimate(0, tuple(plan_notes(model, plan.tp)) + batch.warnings(0))


def plan_notes(model: OpGraphModel, tp: int) -> list[str]:
    """Regions of the derived plan that run replicated at this TP degree (their dims do not divide)."""
    from .tp import styles_at
    return styles_at(model.graph, model.tp_plan, tp)[1]
