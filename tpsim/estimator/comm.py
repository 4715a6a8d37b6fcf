"""Stage 3, communication: every collective a plan runs, timed on the topology.

Collectives name their plan axes (``("tp",)``, ``("dp",)``, ``("pp",)``; later ``("cp",)``, ``("ep",)``) and
are timed with the context's envelope of ``CollectiveModel.axis_curve(op, layout, axes)`` for the plan's
:class:`~tpsim.topology.placement.RankLayout`. Rows are distinct communication patterns; the collectives of
a layer, the edges and the pipeline transfer depend only on (layout, layer key) and are timed once per such
pair.

* per layer and micro-batch: the source's collectives (TP), totals per axis and the exposed part (what the
  compute each one overlaps with, ``hide``, does not cover), forward and backward;
* per micro-batch on the first / last pipeline rank: the edges' collectives (exposed);
* per micro-batch and model chunk: the pipeline send/receive of the boundary activation;
* per step: the data-parallel gradient reduction and, with ZeRO, the parameter all-gather (Megatron-Core
  distributed optimizer: reduce-scatter + all-gather); ZeRO-3 gathers each layer's weights in forward and
  backward and reduce-scatters its gradients, and treats the edge parameters as one more layer.

Each axis of size > 1 is named by the algorithm of the envelope line that times its main collective (a layer
axis such as TP: its first forward reduction, else its first forward, else backward collective; DP: the
gradient reduction; PP: the send/receive).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..plan import FULL_ORDERS
from .context import EstimationContext
from .keys import distinct, gather, take_rows
from .partition import Partition, on_positions
from .source import Collective, LayerCosts

GRAD_BYTES = 4.0
"""fp32 gradient accumulation and reduction (Megatron-Core ``main_grad``), bytes per parameter."""
_REDUCTIONS = ("reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class Comm:
    """Seconds, arrays over rows (communication patterns) unless noted."""

    layer_fwd: dict[str, np.ndarray]
    """axis -> collective time of one layer's forward per micro-batch."""
    layer_bwd: dict[str, np.ndarray]
    """axis -> the same in backward."""
    layer_fwd_exposed: np.ndarray
    """part of one layer's forward collectives (all axes) not hidden by compute."""
    layer_bwd_exposed: np.ndarray
    edge: dict[str, np.ndarray]
    """axis -> (3, n) edge collective time per micro-batch on the first / last / middle rank (exposed)."""
    p2p: np.ndarray
    """one pipeline send/receive of the boundary activation."""
    dp_all_reduce: np.ndarray
    """gradient all-reduce of the largest rank (ZeRO 0)."""
    dp_reduce_scatter: np.ndarray
    """gradient reduce-scatter (ZeRO 1-2: the largest rank's; ZeRO 3: its edge parameters')."""
    dp_all_gather: np.ndarray
    """parameter all-gather after the optimizer step (ZeRO 1-2), or of the edge parameters (ZeRO 3)."""
    z3_all_gather: np.ndarray
    """ZeRO-3: one layer's parameter all-gather."""
    z3_reduce_scatter: np.ndarray
    """ZeRO-3: one layer's gradient reduce-scatter."""
    names: dict[str, np.ndarray]
    """axis -> name code (the context's ``name_table``) of the algorithm the axis uses (-1: size 1)."""
    layer_exposed_axis: dict = dataclasses.field(default_factory=dict)
    """axis -> (2, n): the forward and backward exposed parts of one layer's collectives on that axis (they sum
    over axes to ``layer_fwd_exposed`` / ``layer_bwd_exposed``: the per-axis step-time terms)."""
    tp_grad_sync: np.ndarray | None = None
    """(ranks, n) once per step on each rank of :meth:`Partition.ranks` (first / last / middle, or every rank):
    the all-reduce over TP of the gradients of the replicated parameters its layers hold
    (:func:`tp_summed_grad_params`; None: there are none)."""
    by_kind: "KindComm | None" = None
    """one layer of each kind's own collectives (a source with ``LayerCosts.comm_by_kind``; None: every layer
    runs the mean layer's)."""

    def take(self, index: np.ndarray) -> "Comm":
        """Rows ``index`` (gather)."""
        pick = lambda a: gather(a, index)  # noqa: E731 - (3, n) and (n,) arrays alike
        return Comm(layer_fwd={k: pick(v) for k, v in self.layer_fwd.items()},
                    layer_bwd={k: pick(v) for k, v in self.layer_bwd.items()},
                    layer_fwd_exposed=pick(self.layer_fwd_exposed), layer_bwd_exposed=pick(self.layer_bwd_exposed),
                    edge={k: pick(v) for k, v in self.edge.items()}, p2p=pick(self.p2p),
                    dp_all_reduce=pick(self.dp_all_reduce), dp_reduce_scatter=pick(self.dp_reduce_scatter),
                    dp_all_gather=pick(self.dp_all_gather), z3_all_gather=pick(self.z3_all_gather),
                    z3_reduce_scatter=pick(self.z3_reduce_scatter), names={k: pick(v) for k, v in self.names.items()},
                    layer_exposed_axis={k: pick(v) for k, v in self.layer_exposed_axis.items()},
                    tp_grad_sync=None if self.tp_grad_sync is None else pick(self.tp_grad_sync),
                    by_kind=None if self.by_kind is None else take_rows(self.by_kind, index))


@dataclass(frozen=True)
class KindComm:
    """The per-layer fields of :class:`Comm` for one layer of each kind: arrays (kinds, n), axis dicts of them,
    ``exposed_axis`` values (2, kinds, n)."""

    fwd: dict[str, np.ndarray]
    bwd: dict[str, np.ndarray]
    fwd_exposed: np.ndarray
    bwd_exposed: np.ndarray
    exposed_axis: dict
    z3_all_gather: np.ndarray
    z3_reduce_scatter: np.ndarray


class AxisCurves:
    """Collective times of rows that sit on a few distinct rank layouts: per (axes, op) the layouts'
    envelopes are stacked once (rows x lines), padded to one width by repeating the last line (the minimum
    and its line are unchanged). Axes of the expert layout (:data:`EXPERT_AXES`) are timed on
    ``expert_layouts``, the others on ``layouts``."""

    def __init__(self, ctx: EstimationContext, layouts: "Layouts", inverse: np.ndarray):
        self.ctx = ctx
        self.layouts = layouts
        self.inverse = inverse
        self._stacked: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._done: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        """(axes, op, bytes) -> (seconds, name codes): collectives of one size are timed once."""

    def _table(self, axes: tuple[str, ...], op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(latency, sec_per_byte, name code) of ``op`` over ``axes``: one row per layout (not per row)."""
        key = (axes, op)
        hit = self._stacked.get(key)
        if hit is None:
            lay = self.layouts
            expert = set(axes) <= set(EXPERT_AXES)
            hit = self._stacked[key] = self.ctx.envelopes(op, axes, lay.expert if expert else lay.dense,
                                                          lay.expert_numbers if expert else lay.dense_numbers)
        return hit

    def time(self, axes: tuple[str, ...], op: str, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of ``op`` on ``nbytes`` per row (0 where nbytes <= 0)."""
        return self.timed_and_named(axes, op, nbytes)[0]

    def timed_and_named(self, axes: tuple[str, ...], op: str, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, name code of the line that gives them; -1 where nothing runs or the group is one rank).
        Only the rows that move bytes are timed (a DP reduction runs for one ZeRO stage, a TP collective only
        with tp > 1): the others are 0 and -1 without evaluating their envelopes."""
        b = np.asarray(nbytes, dtype=float)
        key = (axes, op, b.tobytes())
        hit = self._done.get(key)
        if hit is None:
            runs = np.flatnonzero(b > 0)
            seconds = np.zeros(b.size)
            names = np.full(b.size, -1, dtype=np.int32)
            if runs.size:  # nothing runs (a ZeRO plan's all-reduce, ...): zeros, and no envelope table built
                lat, spb, codes = self._table(axes, op)
                at = self.inverse.take(runs)
                lines = lat.take(at, axis=0) + b.take(runs)[:, None] * spb.take(at, axis=0)
                best = np.argmin(lines, axis=1)
                seconds[runs] = lines.take(np.arange(runs.size) * lines.shape[1] + best)  # the line argmin picks
                names[runs] = codes.take(at * codes.shape[1] + best)
            hit = self._done[key] = (seconds, names)
        return hit


LAYOUT_AXES = ("tp", "cp", "dp", "pp")
"""plan axes that place ranks (PlanBatch columns, RankLayout axis names)."""
GRADIENT_AXES = ("dp", "cp")
"""axes the dense gradients are reduced (and ZeRO-sharded) over: Megatron-Core's dp x cp group."""
EXPERT_AXES = ("etp", "ep", "edp")
"""axes of the expert layout: Megatron-Core's expert RankGenerator re-factors tp x cp x dp as etp x ep x edp
(with pp alike), ep taking cp's place in the rank order."""
EXPERT_GRADIENT_AXES = ("edp",)
"""axes the routed experts' gradients are reduced over."""
_EXPERT_NAMES = {"tp": "etp", "cp": "ep", "dp": "edp", "pp": "pp"}


@dataclass(frozen=True)
class Layouts:
    """The distinct rank layouts of a batch's rows: the dense one and the expert one of each."""

    dense: list
    expert: list
    dense_numbers: np.ndarray | None = None
    """each dense layout's number in the context's curve cache (:meth:`EstimationContext.layout_number`)."""
    expert_numbers: np.ndarray | None = None


def layouts_of(ctx: EstimationContext, plans: Any) -> tuple[Layouts, np.ndarray]:
    """The distinct rank layouts of a batch's rows (sizes of LAYOUT_AXES, the expert axes and the rank order)
    and each row's index into them."""
    etp = np.where(plans.etp == 0, plans.tp, plans.etp)
    keys = distinct(*(getattr(plans, a) for a in LAYOUT_AXES), plans.ep, etp, plans.order)
    found = [ctx.plan_layouts(tuple(row), lambda row=row: _layouts_of_row(ctx, *row)) for row in keys.rows.tolist()]
    numbers = np.array([(f[2], f[3]) for f in found], dtype=np.int64).reshape(-1, 2)
    return Layouts(dense=[f[0] for f in found], expert=[f[1] for f in found], dense_numbers=numbers[:, 0],
                   expert_numbers=numbers[:, 1]), keys.inverse


def _layouts_of_row(ctx: EstimationContext, tp: int, cp: int, dp: int, pp: int, ep: int, et: int,
                    order: int) -> tuple[Any, Any]:
    """The dense and the expert rank layout of one (tp, cp, dp, pp, ep, expert tp, order) row."""
    dims = FULL_ORDERS[order]
    dense = ctx.layout("-".join(dims), tp=tp, cp=cp, dp=dp, pp=pp)
    sizes = {"etp": et, "ep": ep, "edp": tp * cp * dp // (et * ep), "pp": pp}
    return dense, ctx.layout("-".join(_EXPERT_NAMES[d] for d in dims), **sizes)


def communication(ctx: EstimationContext, layouts: Layouts, layout_index: np.ndarray,
                  layer_index: np.ndarray, layer_costs: LayerCosts, part: Partition, *, traffic_key: list,
                  params_key: list, pp: np.ndarray, zero: np.ndarray, dp: np.ndarray, w_bytes: float,
                  grad_bytes: float = GRAD_BYTES, z3_collectives: np.ndarray | float = 1.0,
                  cp: np.ndarray | None = None, edp: np.ndarray | None = None,
                  tp_overlap: np.ndarray | None = None, tp: np.ndarray | None = None,
                  sp: np.ndarray | None = None) -> Comm:
    """Every collective time of the rows (see the module docstring). ``layout_index`` and ``layer_index``
    give each row's layout and layer key (a row of ``layer_costs``); ``part`` is over the rows. A layer's,
    the edges' and the pipeline's traffic is timed once per (layout, ``traffic_key`` columns), the data-parallel
    traffic once per (layout, ``params_key`` columns: what sets the largest rank's parameters, and ZeRO).
    ``w_bytes`` / ``grad_bytes``: bytes per element the ZeRO gathers / gradient reductions move (the stack's
    dtypes); ``z3_collectives``: gathers per layer and pass under ZeRO-3 (per row; 1 per layer or block,
    one per weight tensor for per-parameter ZeRO-3). The backward TP collectives hide behind the GEMMs only
    where the context's stack overlaps them (``terms.tp_backward_overlap``); ``tp_overlap`` (per row, the plan
    field) pipelines every TP collective with the GEMMs (:func:`tp_overlap_exposed`)."""
    overlapped = np.zeros(layout_index.shape, dtype=bool) if tp_overlap is None else np.asarray(tp_overlap, bool)
    pairs = distinct(layout_index, overlapped, *traffic_key)
    # the plan's own boundaries (layers of different costs): the send depends on the cuts, timed per row below
    own_cuts = part.cuts is not None and layer_costs.boundary_by_kind is not None
    per_pair = _layer_traffic(AxisCurves(ctx, layouts, layout_index[pairs.first]),
                              layer_costs.take(layer_index[pairs.first]), ctx.terms.tp_backward_overlap,
                              overlapped[pairs.first], None if tp is None else np.asarray(tp)[pairs.first],
                              getattr(ctx.terms, "tp_overlap_phases", ("fwd", "bwd")),
                              getattr(ctx.terms, "tp_overlap_exposed_share", {}), sends=not own_cuts,
                              sm_shares=_sm_shares(ctx))
    fwd, bwd, f_exp, b_exp, edges, p2p, names, by_axis, by_kind = take_rows(per_pair, pairs.inverse)
    if own_cuts:
        sent = np.where(part.cuts, layer_costs.boundary_by_kind[:, layer_index], 0.0).max(axis=0)
        p2p, names["pp"] = AxisCurves(ctx, layouts, layout_index).timed_and_named(("pp",), "send_recv", sent)
    single = pp == 1
    edge = {axis: on_positions(first, last, single) for axis, (first, last) in edges.items()}
    groups = distinct(layout_index, *params_key)
    g = groups.first
    z3 = np.broadcast_to(np.asarray(z3_collectives, dtype=float), zero.shape)
    expert_params = None if layer_costs.expert_params is None else layer_costs.expert_params[layer_index[g]]
    ranks = dp[g] if cp is None else dp[g] * cp[g]
    expert_ranks = ranks if edp is None else edp[g]
    dp_curves = AxisCurves(ctx, layouts, layout_index[g])
    dp_times, dp_name = _data_parallel(dp_curves, take_rows(part, g), zero[g],
                                       ranks, expert_ranks, layer_costs.params[layer_index[g]], w_bytes,
                                       expert_params, grad_bytes, z3[g])
    names["dp"] = dp_name[groups.inverse]
    if by_kind is not None and layer_costs.params_by_kind is not None:  # each kind's ZeRO-3 gathers and reductions of its own parameters
        per_kind = [_reductions(dp_curves, GRADIENT_AXES, part.largest[g], part.largest_edge[g], zero[g],
                                ranks > 1, kind_params[layer_index[g]], w_bytes, grad_bytes, z3[g])[0]
                    for kind_params in layer_costs.params_by_kind]
        by_kind = dataclasses.replace(by_kind, **{f: np.stack([t[f] for t in per_kind])[:, groups.inverse]
                                                  for f in ("z3_all_gather", "z3_reduce_scatter")})
    return Comm(layer_fwd=fwd, layer_bwd=bwd, layer_fwd_exposed=f_exp, layer_bwd_exposed=b_exp, edge=edge,
                p2p=p2p, names=names, layer_exposed_axis=by_axis, by_kind=by_kind,
                **take_rows(dp_times, groups.inverse),
                tp_grad_sync=_tp_grad_sync(ctx, layouts, layout_index, part, tp, sp, grad_bytes,
                                           None if layer_costs.grad_sync_params is None
                                           else layer_costs.grad_sync_params[layer_index],
                                           None if layer_costs.grad_sync_by_kind is None
                                           else layer_costs.grad_sync_by_kind[:, layer_index]))


def tp_summed_grad_params(model: Any, sp: np.ndarray) -> np.ndarray:
    """Parameters per layer that every TP rank holds whole while its gradient is a partial sum over the TP
    group, so the gradients are all-reduced over TP once per step: under sequence parallelism the norms'
    weights and biases and the row-parallel linears' biases (their inputs are sequence shards), and q/k norms
    with or without it. Megatron-Core ``finalize_model_grads`` -> ``_allreduce_non_tensor_model_parallel_grads``
    (formerly ``_allreduce_layernorm_grads``; params with ``sequence_parallel`` set: fused_layer_norm.py,
    tensor_parallel/layers.py RowParallelLinear bias, TE's duplicated params; ``q_layernorm`` / ``k_layernorm``)
    after ``finish_grad_sync``: one coalesced, synchronous all-reduce. (MoE routers' weights too: not counted.)
    0 for models that do not say (traced graphs: their layer source's ``grad_sync_params``)."""
    from ..model.counting import norm_params

    if not hasattr(model, "norms_per_layer"):
        return np.zeros(np.shape(sp))
    seq = float(norm_params(model)) + (2.0 * model.hidden_size if model.linear_bias else 0.0)
    qk = 2.0 * model.head_dim if getattr(model, "qk_norm", False) and model.attention_kind != "mla" else 0.0
    return np.where(np.asarray(sp, dtype=bool), seq, 0.0) + qk


def _tp_grad_sync(ctx: EstimationContext, layouts: Layouts, layout_index: np.ndarray, part: Partition,
                  tp: np.ndarray | None, sp: np.ndarray | None, grad_bytes: float,
                  per_layer: np.ndarray | None = None, by_kind: np.ndarray | None = None) -> np.ndarray | None:
    """(ranks, n) seconds of the per-step TP all-reduce of each rank's (:meth:`Partition.ranks`) layers'
    ``per_layer`` parameters (the layer source's, default :func:`tp_summed_grad_params` of the model; with
    ``by_kind`` (kinds, n) each rank's own layers'), None where no row has any."""
    if tp is None or sp is None:
        return None
    if per_layer is None:
        per_layer = tp_summed_grad_params(ctx.model, sp)
    per_layer = np.where(np.asarray(tp) > 1, per_layer, 0.0)
    if by_kind is not None:
        by_kind = np.where(np.asarray(tp) > 1, by_kind, 0.0)
    if not (np.any(per_layer > 0) or (by_kind is not None and np.any(by_kind > 0))):
        return None
    if part.rank_counts is not None:  # every rank of layers of different costs: each row timed
        curves = AxisCurves(ctx, layouts, layout_index)
        return np.stack([curves.time(("tp",), "all_reduce", b)
                         for b in part.ranks().layer_sum(per_layer, by_kind) * grad_bytes])
    nbytes = part.layers * per_layer * grad_bytes
    layers = np.asarray(part.layers)
    if layers.dtype.kind in "iu" and layers.size and int(layers.min()) >= 0:
        # timed once per (layout, layers of each position, parameters per layer): the same rows as per
        # (layout, bytes of each position) up to a split of equal byte counts, without sorting float rows
        codes = np.unique(per_layer, return_index=True, return_inverse=True)[2].reshape(-1)
        rows = distinct(layout_index, *np.where(per_layer > 0, layers, 0), codes)
    else:
        rows = distinct(layout_index, *nbytes)  # timed once per (layout, bytes of each position)
    curves = AxisCurves(ctx, layouts, layout_index[rows.first])
    return np.stack([curves.time(("tp",), "all_reduce", b[rows.first]) for b in nbytes])[:, rows.inverse]


def _sm_shares(ctx: EstimationContext) -> dict:
    """phase -> collective -> share of the device's SMs the stack's pipelined TP collectives occupy
    (``comm.tp_overlap_comm_sms`` over the device's ``compute_units``), and under ``"penalty"`` the generic
    overlap penalty the schedule charges every hidden second (``overlap_compute_penalty``); empty without the
    figure."""
    from ..hardware import overlap_penalty

    sms = getattr(ctx.terms, "tp_overlap_comm_sms", {}) or {}
    units = float(getattr(ctx.cluster.device, "compute_units", 0) or 0)
    if not sms or units <= 0:
        return {}
    out: dict = {phase: {op: min(n / units, 1.0) for op, n in row.items()} for phase, row in sms.items()}
    out["penalty"] = float(overlap_penalty(ctx.cluster.device, ctx.roofline.eff.overlap_compute_penalty))
    return out


def tp_overlap_exposed(total: np.ndarray, compute: np.ndarray, tp: np.ndarray,
                       first: np.ndarray | None = None, sm_share: np.ndarray | float | None = None,
                       penalty: float = 0.0) -> np.ndarray:
    """Exposed seconds of a layer phase's TP collectives (``total``) when they are pipelined with the GEMMs
    (plan field ``tp_overlap``: Megatron ``--tp-comm-overlap``, Transformer Engine userbuffers; torchtitan async
    TP with torch.compile's micro-pipelining): each all-gather / reduce-scatter is split into ``tp`` chunks
    exchanged in a ring while the GEMM of the chunk already received runs (Wang et al., ASPLOS 2023,
    "Overlap communication with dependent computation via decomposition"; TE
    ``transformer_engine/pytorch/module/base.py`` ``initialize_ub`` ring-exchange / pipelined modes), so the
    first chunk is exposed and the rest hides behind the phase's computation ``compute`` as far as it lasts.
    ``first``: the exposed chunks as the stack's decomposition has them (``comm.tp_overlap_exposed_share``)
    instead of one ``total / tp``.

    The hidden part costs compute: the schedule charges every hidden second ``penalty`` (efficiency.yaml
    ``overlap_compute_penalty``: NCCL kernels on their channels' SMs, :func:`tpsim.estimator.schedule.
    layer_exposed`). ``sm_share`` (a stack's ``comm.tp_overlap_comm_sms`` over the device's SMs, time-weighted
    over the phase's collectives) replaces that generic figure by the SMs the stack's own overlap kernels hold
    (Transformer Engine userbuffers: 16 for pipelined and bulk overlaps, 1 for copy-engine ring exchanges):
    the exposed time carries ``(sm_share - penalty) / (1 - penalty)`` of the hidden part, so that after the
    schedule's penalty on the rest the hidden part costs exactly ``sm_share`` of itself."""
    if first is None:
        first = total / np.maximum(np.asarray(tp, dtype=float), 1.0)
    rest = np.maximum(total - first, 0.0)
    out = first + np.maximum(rest - compute, 0.0)
    if sm_share is None:
        return out
    return out + (sm_share - penalty) / (1.0 - penalty) * np.minimum(rest, compute)


def _layer_traffic(curves: AxisCurves, costs: LayerCosts, overlap: bool = True,
                   tp_overlap: np.ndarray | None = None, tp: np.ndarray | None = None,
                   phases: tuple[str, ...] = ("fwd", "bwd"), shares: Any = None, sends: bool = True,
                   sm_shares: Any = None):
    """Per (layout, layer key): layer totals per axis (fwd, bwd), exposed (fwd, bwd), edge totals per axis
    (first, last), pipeline transfer (None without ``sends``: the caller times the plan's own boundaries), the
    TP / PP names, the exposed parts per axis and, for a source with ``comm_by_kind``, the same per layer kind
    (:class:`KindComm`, each kind's collectives behind its own compute; ZeRO-3 fields filled by the caller).
    ``overlap`` False: no TP collective hides (they run on the compute stream; the cp and ep ones still hide
    where their ``hide`` says); ``tp_overlap`` (per pair): the TP collectives of the stack's ``phases``
    (``comm.tp_overlap_phases``) pipelined with the GEMMs over ``tp`` chunks; the other phase's stay as
    without it. ``shares``: phase -> op -> the share of each pipelined collective left exposed (its first or
    last chunk; None or missing: 1 / tp); ``sm_shares``: phase -> op -> share of the SMs a pipelined collective's
    communication kernels occupy (:func:`tp_overlap_exposed`)."""
    n = costs.fwd.size
    pipelined = np.zeros(n, dtype=bool) if tp_overlap is None else np.asarray(tp_overlap, dtype=bool)
    by_phase = {p: (pipelined if p in phases else np.zeros(n, dtype=bool)) for p in ("fwd", "bwd")}
    tp_size = np.ones(n) if tp is None else np.maximum(np.asarray(tp, dtype=float), 1.0)
    rule = dict(overlap=overlap, by_phase=by_phase, tp_size=tp_size, shares=shares or {},
                sm_shares=sm_shares or {})
    fwd, bwd, f_exp, b_exp, by_axis, named = _collective_traffic(curves, costs.comm, costs.fwd, costs.bwd, **rule)
    by_kind = None
    if costs.comm_by_kind is not None:
        kinds = [_collective_traffic(curves, comm, f, c - f, **rule)
                 for comm, f, c in zip(costs.comm_by_kind, costs.fwd_by_kind, costs.compute_by_kind)]
        axes = sorted({a for k in kinds for d in (k[0], k[1], k[4]) for a in d})

        def stacked(i: int, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
            return {a: np.stack([np.broadcast_to(k[i].get(a, 0.0), shape) for k in kinds], axis=-2)
                    for a in axes if any(a in k[i] for k in kinds)}

        zeros = np.zeros((len(kinds), n))
        by_kind = KindComm(fwd=stacked(0, (n,)), bwd=stacked(1, (n,)), fwd_exposed=np.stack([k[2] for k in kinds]),
                           bwd_exposed=np.stack([k[3] for k in kinds]), exposed_axis=stacked(4, (2, n)),
                           z3_all_gather=zeros, z3_reduce_scatter=zeros)
    edges: dict[str, tuple] = {}
    for which, edge in ((0, costs.first), (1, costs.last)):
        for c in edge.comm:
            sums = list(edges.get("-".join(c.axes), (np.zeros(n), np.zeros(n))))
            sums[which] = sums[which] + _timed(curves, c)
            edges["-".join(c.axes)] = tuple(sums)
    p2p, pp_name = (curves.timed_and_named(("pp",), "send_recv", costs.boundary_bytes) if sends
                    else (None, np.full(n, -1, dtype=np.int32)))
    names = {axis: code for axis, (_, code) in named.items()}
    names["pp"] = pp_name
    return fwd, bwd, f_exp, b_exp, edges, p2p, names, by_axis, by_kind


def _collective_traffic(curves: AxisCurves, comm: tuple[Collective, ...], work_fwd: np.ndarray,
                        work_bwd: np.ndarray, *, overlap: bool, by_phase: dict, tp_size: np.ndarray,
                        shares: dict, sm_shares: dict | None = None):
    """(totals per axis fwd, bwd; exposed fwd, bwd; exposed per axis (2, n); axis -> (preference, name code))
    of one layer's collectives ``comm`` behind its forward / backward compute ``work_*`` (the rules of
    :func:`_layer_traffic`)."""
    n = tp_size.size
    tp_sum = {"fwd": np.zeros(n), "bwd": np.zeros(n)}
    tp_first = {"fwd": np.zeros(n), "bwd": np.zeros(n)}
    tp_sm = {"fwd": np.zeros(n), "bwd": np.zeros(n)}  # sum of each collective's time x its SM share
    sm_shares = sm_shares or {}
    by_axis: dict[str, np.ndarray] = {}
    fwd: dict[str, np.ndarray] = {}
    bwd: dict[str, np.ndarray] = {}
    exposed = {"fwd": np.zeros(n), "bwd": np.zeros(n)}
    named: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # axis -> (preference, name code)
    for c in comm:
        t, code = curves.timed_and_named(c.axes, c.op, c.nbytes)
        t = _times_count(t, c.count)
        axis = "-".join(c.axes)
        totals = fwd if c.phase == "fwd" else bwd
        totals[axis] = totals.get(axis, 0.0) + t
        # ``overlap`` (the stack's tp_backward_overlap) says whether TP collectives run beside the GEMMs; the
        # cp ring exchanges and paired ep all-to-alls are asynchronous in every stack (their hide applies)
        alone = np.maximum(t - c.hide, 0.0) if overlap or c.axes != ("tp",) else t
        if c.axes == ("tp",):
            tp_sum[c.phase] = tp_sum[c.phase] + t
            share = shares.get(c.phase, {}).get(c.op)
            tp_first[c.phase] = tp_first[c.phase] + t * (1.0 / tp_size if share is None else share)
            if c.phase in sm_shares:  # the stack's SM share; a collective it does not name: the penalty's
                tp_sm[c.phase] = tp_sm[c.phase] + t * sm_shares[c.phase].get(c.op, sm_shares["penalty"])
            alone = np.where(by_phase[c.phase], 0.0, alone)
        exposed[c.phase] = exposed[c.phase] + alone
        axis_exp = by_axis.setdefault(axis, np.zeros((2, n)))
        axis_exp[0 if c.phase == "fwd" else 1] += alone
        # an axis is named by its first forward reduction, else its first forward collective, else backward
        rank = (0 if c.phase == "fwd" else 2) + (0 if c.op in _REDUCTIONS else 1)
        best, name = named.get(axis, (np.full(n, 9), np.full(n, -1, dtype=np.int32)))
        better = (code >= 0) & (rank < best)
        named[axis] = (np.where(better, rank, best), np.where(better, code, name))
    if any(v.any() for v in by_phase.values()):
        for i, (phase, work) in enumerate((("fwd", work_fwd), ("bwd", work_bwd))):
            total = tp_sum[phase]
            sm_share = None
            if phase in sm_shares:  # time-weighted over the phase's collectives
                sm_share = np.divide(tp_sm[phase], total, out=np.full(n, sm_shares["penalty"]), where=total > 0)
            part = np.where(by_phase[phase], tp_overlap_exposed(total, work, tp_size, tp_first[phase], sm_share,
                                                                sm_shares.get("penalty", 0.0)), 0.0)
            exposed[phase] = exposed[phase] + part
            by_axis.setdefault("tp", np.zeros((2, n)))[i] += part
    return fwd, bwd, exposed["fwd"], exposed["bwd"], by_axis, named


def _timed(curves: AxisCurves, c: Collective) -> np.ndarray:
    return _times_count(curves.time(c.axes, c.op, c.nbytes), c.count)


def _times_count(t: np.ndarray, count: np.ndarray | float) -> np.ndarray:
    """``t`` for ``count`` runs (a number, or an array over the rows)."""
    if isinstance(count, np.ndarray) or count != 1.0:
        return t * count
    return t


def _data_parallel(curves: AxisCurves, part: Partition, zero: np.ndarray, ranks: np.ndarray,
                   expert_ranks: np.ndarray, layer_params: np.ndarray, w_bytes: float,
                   expert_params: np.ndarray | None = None, grad_bytes: float = GRAD_BYTES,
                   z3_collectives: np.ndarray | float = 1.0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Data-parallel times per step and the DP name (the gradient reduction: reduce-scatter with ZeRO, else
    all-reduce, at the largest rank's gradient bytes). Dense parameters reduce over dp x cp; the routed
    experts' over the expert data-parallel group (edp), with the same ZeRO stage, and their times add up.
    ZeRO-3 per layer: ``z3_collectives`` gathers of 1/``z3_collectives`` of the layer each (every one pays its
    latency)."""
    dense, dense_edge = part.largest - part.largest_expert, part.largest_edge
    times, name = _reductions(curves, GRADIENT_AXES, dense, dense_edge, zero, ranks > 1,
                              layer_params if expert_params is None else layer_params - expert_params, w_bytes,
                              grad_bytes, z3_collectives)
    if expert_params is not None:
        extra, _ = _reductions(curves, EXPERT_GRADIENT_AXES, part.largest_expert, np.zeros_like(dense_edge), zero,
                               expert_ranks > 1, expert_params, w_bytes, grad_bytes, z3_collectives)
        times = {k: v + extra[k] for k, v in times.items()}
    return times, name


def _reductions(curves: AxisCurves, axes: tuple[str, ...], largest: np.ndarray, largest_edge: np.ndarray,
                zero: np.ndarray, has_dp: np.ndarray, layer_params: np.ndarray, w_bytes: float,
                grad_bytes: float = GRAD_BYTES,
                z3_collectives: np.ndarray | float = 1.0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Gradient reduction and parameter gathers of ``largest`` parameters over the groups of ``axes``
    (``has_dp``: the group has more than one rank; a group of one rank costs nothing anyway)."""
    grad_b, weight_b = largest * grad_bytes, largest * w_bytes
    z12 = has_dp & (zero >= 1) & (zero <= 2)
    z3 = has_dp & (zero == 3)
    all_reduce, ar_name = curves.timed_and_named(axes, "all_reduce", np.where(has_dp & (zero == 0), grad_b, 0.0))
    reduce_scatter, rs_name = curves.timed_and_named(axes, "reduce_scatter", np.where(
        z12, grad_b, np.where(z3, largest_edge * grad_bytes, 0.0)))
    if np.any(z3):  # ZeRO-3 reduces per layer; the name is still that of the whole gradient's reduction
        _, z3_name = curves.timed_and_named(axes, "reduce_scatter", np.where(z3, grad_b, 0.0))
        rs_name = np.where(z3, z3_name, rs_name)
    n = np.broadcast_to(np.asarray(z3_collectives, dtype=float), zero.shape)
    times = {
        "dp_all_reduce": all_reduce, "dp_reduce_scatter": reduce_scatter,
        "dp_all_gather": curves.time(axes, "all_gather", np.where(
            z12, weight_b, np.where(z3, largest_edge * w_bytes, 0.0))),
        "z3_all_gather": n * curves.time(axes, "all_gather", np.where(z3, layer_params * w_bytes / n, 0.0)),
        "z3_reduce_scatter": curves.time(axes, "reduce_scatter", np.where(z3, layer_params * grad_bytes, 0.0)),
    }
    return times, np.where(zero > 0, rs_name, ar_name)
