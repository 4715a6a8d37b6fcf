"""Stage 4, schedule: the step time of the slowest pipeline rank and its parts, with data-parallel overlap; the
pipeline schedule of each plan (1F1B, interleaved 1F1B, GPipe, zero-bubble, DualPipe) is a registry entry of
:mod:`tpsim.pipeline` (its bubble, exposed sends, micro-batches in flight, parameter copies).

``step = m t_stage + bubble(t_stage) + exposed PP + exposed DP + optimizer``: ``t_stage`` is one
micro-batch's forward + backward (+ recomputation + exposed collectives + fixed costs) on the rank, m the
micro-batches per replica. Each position's stage time is computed at once over the (position, plan) axes and
the slowest existing position is taken. The breakdown ``compute + recompute + bubble + optimizer +
exposed_comm + overhead`` sums to the step time; the ``*_comm`` totals include hidden parts.

Fixed costs (tpsim/compute/fixed.py, the context's :class:`~tpsim.estimator.context.FixedCosts`): ``overhead``
is the GPU gap of every kernel a layer launches plus the host time the GPU waits for (host issue time per op of
the stack beyond the layer's device time; per-parameter ZeRO-3 adds its module hooks), per layer and
micro-batch, plus a calibration's host overhead; ``optimizer`` is the fused optimizer step over the rank's
(ZeRO-sharded) parameters at the achieved streaming bandwidth with the stack's bytes per parameter (fp16 adds
the loss-scale unscale pass); stacks without gradient-accumulation fusion add the accumulation of each
micro-batch's weight gradients into the gradient buffer to ``compute``.

Communication hidden behind compute still slows it (NCCL kernels hold SMs and memory bandwidth): a fraction
``overlap_compute_penalty`` (tpsim/data/efficiency.yaml) of every hidden collective counts as exposed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .. import pipeline
from ..errors import InputError
from ..hardware import DTYPE_BYTES, overlap_penalty
from ..plan import PlanBatch
from ..precision import activation_bytes, wide
from .comm import Comm
from .context import EstimationContext
from .keys import argmax_rows, broadcast_float, flat_index, pick_rows
from .partition import Partition, RankSum, on_positions
from .source import LayerCosts


@dataclass(frozen=True)
class Schedule:
    """Seconds per step of the slowest pipeline rank, arrays over plans."""

    compute: np.ndarray
    recompute: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    exposed_comm: np.ndarray
    overhead: np.ndarray
    """fixed costs per step: launch gaps and host time the kernels do not hide (and a calibration's host time)."""
    overhead_low: np.ndarray
    overhead_high: np.ndarray
    """``overhead`` at the low and high ends of the stack's host-time prior (the error band)."""
    comm_total: dict[str, np.ndarray]
    """axis -> collective time per step, hidden parts included."""
    step: np.ndarray
    slowest: np.ndarray
    """position (index into POSITIONS) of the slowest rank."""
    micro_batches: np.ndarray
    """m: micro-batches per replica and step."""
    exposed_axis: dict = field(default_factory=dict)
    """axis -> exposed communication per step on that axis (``tp``, ``cp``, ``ep``, ``pp``, ``dp``; the
    hidden collectives' overlap penalty counted on their axis): they sum to ``exposed_comm``."""
    forward: np.ndarray | float = 0.0
    """of ``step``, the slowest rank's forward passes: their compute, exposed collectives and the forward
    kernels' share of the fixed costs, and the data-parallel gathers exposed before them."""
    pp_exposed: np.ndarray | float = 0.0
    """of ``exposed_comm``, the pipeline sends'."""
    dp_after_backward: np.ndarray | float = 0.0
    """of ``exposed_comm``, the data-parallel reductions after the last backward (outside the passes)."""
    dp_in_optimizer: np.ndarray | float = 0.0
    """of ``exposed_comm``, the data-parallel collectives inside the optimizer step."""
    tp_grad_sync: np.ndarray | float = 0.0
    """of ``exposed_comm``, the TP all-reduce of the replicated parameters' gradients before the optimizer step
    (norm weights under sequence parallelism: ``Comm.tp_grad_sync``)."""

    def phases(self) -> dict[str, np.ndarray]:
        """The step split by where its time passes on the slowest rank (what ``tpsim validate`` measures):
        ``fwd`` and ``bwd`` (the passes with the communication inside them; ``bwd`` also holds the recomputation,
        the hidden collectives' overlap penalty and the edges' collectives), ``optimizer`` (with the collectives
        inside the step), ``other`` (bubble, exposed pipeline sends, reductions after the last backward); they
        sum to ``step``."""
        optimizer = self.optimizer + self.dp_in_optimizer + self.tp_grad_sync
        other = self.bubble + self.pp_exposed + self.dp_after_backward
        return {"fwd": broadcast_float(self.forward, self.step.shape), "bwd": self.step - self.forward - optimizer - other,
                "optimizer": optimizer, "other": other}


_flat = flat_index


def _pick(position: np.ndarray, values: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray:
    """values[position[i], i] for (3, n) values (:func:`~tpsim.estimator.keys.pick_rows`)."""
    return pick_rows(values, position, flat)


FP16_UNSCALE_BYTES = 8.0
"""fp16 loss scaling: the optimizer first unscales the fp32 gradients and checks them for inf/NaN (read 4 B,
write 4 B per parameter: Megatron-LM optimizer.py _unscale_main_grads_and_check_for_nan,
torch._amp_foreach_non_finite_check_and_unscale_)."""
TENSORS_PER_LAYER = 12.0
"""parameter tensors per layer for the optimizer's multi-tensor launch count (weights, biases, norms)."""
EDGE_TENSORS = 4.0
"""parameter tensors of the edges (embedding, final norm weight and bias, output layer)."""


def optimizer_seconds(ctx: EstimationContext, params: np.ndarray, layers: np.ndarray, dtype: str) -> np.ndarray:
    """One optimizer step over ``params`` (the rank's share) at the achieved streaming bandwidth, in the
    parameter tensors of the rank's layers (the layer source's count where it has one) and the edges'."""
    per_layer = getattr(ctx.source, "tensors_per_layer", TENSORS_PER_LAYER)
    edges = getattr(ctx.source, "edge_tensors", EDGE_TENSORS)
    cpu = ctx.terms.optimizer_cpu_fraction
    step = optimizer_step(ctx.terms, ctx.fixed.hbm, params * (1.0 - cpu), per_layer * layers + edges, dtype)
    if cpu > 0.0:  # the CPU part beside the GPU part (HybridDeviceOptimizer.step: the GPU step is launched first)
        step = np.maximum(step, cpu_optimizer_seconds(ctx, params * cpu))
    if ctx.terms.optimizer_state_offload:  # the states in, and out again, over the host link (both directions
        # at once: full duplex), before and after the step (StackTerms.optimizer_state_offload)
        sb = ctx.terms.state_bytes(dtype)
        host = ctx.cluster.layout.host_GBps * 1e9
        if host <= 0:
            raise InputError(f"{ctx.cluster.name}: memory.optimizer_state_offload needs a GPU-to-host link, "
                             f"the node has none")
        step = step + params * (sb.master + sb.moments) / host
    return step


CPU_ADAM_BYTES = 28.0
"""host-memory bytes per parameter of one CPU AdamW step on fp32 values (torch.optim.AdamW fused=True, as
Megatron-Core's HybridDeviceOptimizer builds it): read the parameter, its gradient and the two moments (16 B),
write the parameter and the moments (12 B)."""
CPU_COPY_BYTES = 8.0
"""host-link bytes per parameter of the CPU part: its fp32 gradient down (4 B) and its fp32 updated value up
(4 B, HybridDeviceOptimizer param_update_in_fp32)."""


def cpu_optimizer_seconds(ctx: EstimationContext, params: np.ndarray) -> np.ndarray:
    """The CPU part of a hybrid optimizer step over ``params`` parameters (StackTerms.optimizer_cpu_fraction):
    the update at the node's host memory bandwidth per GPU (its CPUs' datasheet peak shared by its GPUs: a
    lower bound on the time) and the copies over the GPU's host link, beside each other with
    ``optimizer_cpu_overlap``, else one after the other."""
    layout = ctx.cluster.layout
    memory_bw, link = layout.host_memory_GBps * 1e9, layout.host_GBps * 1e9
    if memory_bw <= 0 or link <= 0:
        raise InputError(f"{ctx.cluster.name}: memory.optimizer_cpu_fraction needs the node's CPU memory "
                         f"bandwidth (devices.cpu memory_GBps) and a GPU-to-host link; the node template has "
                         f"{'no memory_GBps' if memory_bw <= 0 else 'no host link'}")
    update = params * CPU_ADAM_BYTES / memory_bw
    copies = params * CPU_COPY_BYTES / link
    return np.maximum(update, copies) if ctx.terms.optimizer_cpu_overlap else update + copies


def optimizer_step(terms, hbm: float, params: np.ndarray, tensors: np.ndarray, dtype: str) -> np.ndarray:
    """The rule every path uses: one fused optimizer step over ``params`` in ``tensors`` parameter tensors at
    ``hbm`` streaming bytes/s with the stack's (``terms``) bytes per parameter (fp16 adds the unscale pass)."""
    from ..compute.fixed import optimizer_bytes_per_param, optimizer_step_time

    if wide(dtype):  # no master copy, no 16-bit model copy; the stack's figure where its step is not fused
        per = terms.optimizer_bytes_per_param_fp32 or optimizer_bytes_per_param(grad_bytes=4, param_bytes=4,
                                                                                   master_bytes=0)
    else:
        per = terms.optimizer_bytes_per_param + (FP16_UNSCALE_BYTES if dtype == "fp16" else 0.0)
    return optimizer_step_time(params, tensors, hbm, per)


def grad_buffer_seconds(ctx: EstimationContext, params: np.ndarray, dtype: str) -> np.ndarray:
    """Once per step: the stack's passes over the rank's gradient buffer outside the optimizer step
    (``StackTerms.grad_buffer_passes``), one buffer element per parameter each, at the achieved streaming
    bandwidth. ``params``: the buffer's parameters (the rank's, or its shard where ZeRO-2/3 keep only that)."""
    passes = ctx.terms.grad_buffer_passes
    if not passes:
        return np.zeros(np.shape(params))
    return params * passes * ctx.terms.state_bytes(dtype).grads / ctx.fixed.hbm


def weight_cast_seconds(ctx: EstimationContext, params: np.ndarray, dtype: str) -> np.ndarray:
    """Once per step with low-precision GEMMs: the rank's weights quantized into the copies kept for the step's
    micro-batches (:meth:`StackTerms.weight_cache_bytes`: the fp8 copy and its transpose), reading each weight
    (its 16-bit copy, or the fp8 one where the stack keeps fp8 weights) at the achieved streaming bandwidth.
    Transformer Engine casts on the first micro-batch only (``is_first_microbatch``, megatron/core/extensions/
    transformer_engine.py TELinear.forward); a recipe that casts every call (torchao) pays at least this."""
    cache = ctx.terms.weight_cache_bytes(dtype)
    if not cache:
        return np.zeros(np.shape(params))
    read = DTYPE_BYTES[dtype] if ctx.terms.fp8_weights_kept else ctx.terms.state_bytes(dtype).weights
    return params * (read + cache) / ctx.fixed.hbm


def grad_accumulation_seconds(ctx: EstimationContext, params: np.ndarray, sharded: np.ndarray,
                              dp: np.ndarray, dtype: str) -> np.ndarray:
    """Per micro-batch: adding the layer weight gradients (16-bit GEMM output) into the gradient buffer where
    the stack does not fuse it into the GEMM (read the gradient, read and write the buffer); on a ZeRO-2/3
    shard only 1/dp of it."""
    if ctx.terms.grad_accumulation_fusion:
        return np.zeros(np.shape(params))
    return params * grad_add_bytes(ctx, dtype) / np.where(sharded, dp, 1.0) / ctx.fixed.hbm


def grad_add_bytes(ctx: EstimationContext, dtype: str) -> float:
    """HBM bytes per parameter of adding one micro-batch's 16-bit gradient into the gradient buffer: read the
    gradient, read and write the buffer element (Megatron-Core DDP ``param.main_grad.add_(param.grad)``)."""
    return activation_bytes(dtype) + 2.0 * ctx.terms.state_bytes(dtype).grads


def embedding_grad_seconds(ctx: EstimationContext, params: np.ndarray, sharded: np.ndarray, dp: np.ndarray,
                           dtype: str) -> np.ndarray:
    """Per micro-batch on the first rank: the embedding table's dense weight gradient. torch's
    ``embedding_dense_backward`` (aten/src/ATen/native/cuda/Embedding.cu: ``at::zeros({num_weights, ...})``,
    then the rows' scatter-add, which the edge's compute already counts) writes a zeroed table-sized gradient
    in the parameter dtype, and no GEMM fuses its accumulation: it is added into the gradient buffer
    (:func:`grad_add_bytes`; Megatron-Core DDP's backward hook, fused wgrad accumulation or not), on the
    rank's shard where ZeRO-2/3 reduce-scatter every micro-batch. ``params``: the rank's embedding elements."""
    zero_fill = activation_bytes(dtype)
    return params * (zero_fill + grad_add_bytes(ctx, dtype) / np.where(sharded, dp, 1.0)) / ctx.fixed.hbm


def _backward_fraction(costs: LayerCosts) -> np.ndarray:
    """B / (F + B) of the mean layer per plan (recomputation counts as forward work)."""
    return backward_fraction(costs.bwd, costs.fwd + costs.bwd + costs.recompute)


# ---- the rules of the schedule, on per-layer or per-rank arrays --------------------------------------------
def backward_fraction(bwd: np.ndarray, total: np.ndarray) -> np.ndarray:
    """B / (F + B): the share of the stage's work the schedule's backward slots hold (0 where there is none)."""
    return np.where(total > 0, bwd / np.where(total > 0, total, 1.0), 0.0)


def layer_exposed(fwd: np.ndarray, bwd: np.ndarray, fwd_exposed: np.ndarray, bwd_exposed: np.ndarray,
                  full: np.ndarray, penalty: float) -> np.ndarray:
    """Exposed collective seconds of one layer (or op-graph unit) per micro-batch: the exposed forward and
    backward parts, the forward ones again under full recomputation (``full``: the forward and its collectives
    run twice), and the overlap penalty of the hidden parts (NCCL kernels hold SMs and memory bandwidth)."""
    hidden = (fwd - fwd_exposed) + (bwd - bwd_exposed)
    return fwd_exposed + bwd_exposed + np.where(full, fwd_exposed, 0.0) + penalty * hidden


def slowest(valid: np.ndarray | bool, compute: np.ndarray, recompute: np.ndarray, exposed: np.ndarray,
            overhead: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """(index of the slowest pipeline rank per plan, its (compute, recompute, exposed, overhead) seconds per
    micro-batch): the rank whose stage time paces the pipeline; arrays (ranks, plans), ``valid`` the ranks that
    exist (the transformer path follows three positions, the op-graph path every rank)."""
    totals = np.where(valid, compute + recompute + exposed + overhead, -1.0)  # -1: no such rank
    slow = argmax_rows(totals)
    flat = _flat(slow)
    return slow, tuple(_pick(slow, v, flat) for v in (compute, recompute, exposed, overhead))


def zero3_layer(ag: np.ndarray, rs: np.ndarray, f_window: np.ndarray, b_window: np.ndarray, fwd_g: np.ndarray,
                bwd_g: np.ndarray, reductions: np.ndarray, at_end: np.ndarray | bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(total, exposed, exposed before the forward passes) ZeRO-3 seconds of one layer or unit per step: its
    weights gathered ``fwd_g`` times before a forward (prefetched one layer ahead: hidden behind the layer's
    forward ``f_window``) and ``bwd_g`` times in backward, its gradients reduce-scattered ``reductions`` times,
    each behind the layer's backward ``b_window`` together with that backward's gather; with ``at_end`` (FSDP2
    under pipelining) the reduce-scatters run after the last backward, exposed."""
    rs_end = np.where(at_end, rs, 0.0)
    total = (fwd_g + bwd_g) * ag + reductions * rs
    fwd = fwd_g * np.maximum(ag - f_window, 0.0)
    exposed = fwd + ((bwd_g - reductions) * np.maximum(ag - b_window, 0.0)
                     + reductions * np.maximum(ag + (rs - rs_end) - b_window, 0.0) + reductions * rs_end)
    return total, exposed, fwd


def schedule(ctx: EstimationContext, plans: PlanBatch, costs: LayerCosts, comm: Comm, part: Partition, *,
             edp: np.ndarray | None = None, host_s_per_op: float | None = None) -> Schedule:
    """Step time and breakdown of the plan batch (costs, comm and part gathered to its plans); ``edp`` the
    expert data-parallel degrees (routed experts); ``host_s_per_op`` replaces the stack's host time per op.
    The pipeline schedule's rules (bubble, exposed sends) are :mod:`tpsim.pipeline`'s, per plan. The
    optimizer step runs over the rank's share of the parameters: ZeRO shards the dense ones over dp x cp, the
    routed experts' over edp."""
    pp, vpp, dp, zero, recompute, overlap = (plans.pp, plans.vpp, plans.dp, plans.zero, plans.recompute,
                                             plans.overlap)
    cp, dtype = plans.cp, plans.dtype
    penalty = overlap_penalty(ctx.cluster.device, ctx.roofline.eff.overlap_compute_penalty)
    full = recompute == 2
    if ctx.exposed_scale.get("tp", 1.0) != 1.0:  # a calibration's achieved TP overlap
        comm = scale_tp_exposure(comm, ctx.exposed_scale["tp"])
    fwd_total = _sum(comm.layer_fwd.values(), pp.shape)
    bwd_total = _sum(comm.layer_bwd.values(), pp.shape)
    f_exp, b_exp = comm.layer_fwd_exposed, comm.layer_bwd_exposed
    x_layer = layer_exposed(fwd_total, bwd_total, f_exp, b_exp, full, penalty)
    # a source whose layers differ (traced units): each kind's own collectives, re-run under full recomputation
    # only where the kind is checkpointed
    kinds = _KindTimes.of(costs, comm, full, penalty)
    single = pp == 1
    ranks = part.ranks()  # the three positions, or every rank (layers of different costs)
    per_mb = ctx.terms.reduces_per_microbatch(zero, pp)
    sharded = (zero >= 2) & per_mb
    # ZeRO's gradient shards span the dp x cp group (Megatron's distributed optimizer); the routed experts'
    # span the expert data-parallel group edp
    group = dp * cp
    emb_grad = (0.0 if costs.first.params is None
                else embedding_grad_seconds(ctx, costs.first.params, sharded, group, dtype))
    edge_c = ranks.of_positions(on_positions(costs.first.fwd + costs.first.bwd + emb_grad,
                                             costs.last.fwd + costs.last.bwd, single))
    edge_x = ranks.of_positions(_sum(comm.edge.values(), (3, pp.size)))
    L = ranks.layers
    experts = 0.0 if costs.expert_params is None or edp is None else costs.expert_params
    accum = grad_accumulation_seconds(ctx, costs.params - experts, sharded, group, dtype)
    if costs.expert_params is not None and edp is not None:
        accum = accum + grad_accumulation_seconds(ctx, experts, sharded, edp, dtype)
    # each rank's own layers of each kind (dense first layers and MoE layers take different times)
    rank_c = ranks.layer_sum(costs.fwd + costs.bwd, getattr(costs, "compute_by_kind", None)) + L * accum + edge_c
    rank_r = ranks.layer_sum(costs.recompute, getattr(costs, "recompute_by_kind", None))
    rank_x = ranks.layer_sum(x_layer, kinds.exposed if kinds else None) + edge_x
    lo, hi = ctx.terms.host_range
    # the main figure and the host-time band's ends share the kernel counts and device times
    (fixed, fixed_kinds), band_lo, band_hi = _fixed_per_layer(ctx, costs, zero, full,
                                                               (host_s_per_op, lo, hi), dp, kinds)
    rank_o = L * ctx.host_overhead_s + ranks.layer_sum(fixed, fixed_kinds)
    slow_rank, (c_stage, r_stage, x_stage, o_stage) = slowest(ranks.valid, rank_c, rank_r, rank_x, rank_o)
    slow = ranks.position_of(slow_rank)  # the slowest rank's position (its edges)
    slow_flat = _flat(slow)
    on_slow = ranks.rank_sum(slow_rank)
    layers = on_slow.layers
    t_stage = c_stage + r_stage + x_stage + o_stage

    micro_batches = plans.global_batch // (plans.micro_batch * dp)
    m = micro_batches.astype(float)  # cast once: every use below is float arithmetic on these exact counts
    bucket = ctx.terms.dp_bucket(group)
    share = None if bucket is None else np.minimum(bucket / np.maximum(part.largest, 1.0), 1.0)
    dpt = _data_parallel(costs, comm, layers, m, zero, overlap, penalty, per_mb, full=full, terms=ctx.terms, pp=pp,
                         vpp=vpp, bucket_share=share, on_rank=on_slow, kinds=kinds)
    if ctx.exposed_scale.get("dp", 1.0) != 1.0:  # a calibration's achieved DP overlap
        dpt = scale_dp_exposure(dpt, ctx.exposed_scale["dp"])
    # the fill and drain run whole stages: ZeRO-3's gathers exposed inside each micro-batch's passes count
    bubble = pipeline.bubble(plans.schedule, pp, vpp, t_stage + dpt.in_passes / np.maximum(m, 1),
                             backward_fraction=_backward_fraction(costs))
    # pipeline point-to-point: activations forward, gradients backward, per chunk and micro-batch, plus the
    # pipeline fill and drain
    pp_total, pp_exposed = pipeline.pipeline_sends(plans.schedule, pp, vpp, m, comm.p2p,
                                                   getattr(ctx.terms, "pp_overlap_interleaved", False))
    dp_total, dp_exposed, dp_forward, dp_after = dpt.total, dpt.exposed, dpt.forward, dpt.after_backward
    if ctx.terms.fsdp_copies:  # FSDP2's copies around its collectives, exposed (the runtime's stack profile)
        copy_ag, copy_rs = fsdp_copy_seconds(ctx.compute, costs.params, group, dtype,
                                             _REDUCE_DTYPE.get(ctx.terms.grad_reduce_bytes),
                                             _GRAD_DTYPE.get(dtype, dtype),
                                             gather_bytes=ctx.terms.state_bytes(dtype).wire_params)
        if kinds is not None and costs.params_by_kind is not None:  # each unit its own parameters' copies
            by_ag, by_rs = fsdp_copy_seconds(ctx.compute, costs.params_by_kind, group, dtype,
                                             _REDUCE_DTYPE.get(ctx.terms.grad_reduce_bytes),
                                             _GRAD_DTYPE.get(dtype, dtype),
                                             gather_bytes=ctx.terms.state_bytes(dtype).wire_params)
            unit = costs.params_by_kind > 0  # a unit without parameters has no FSDP collectives
            copy_ag = on_slow(copy_ag, np.where(unit, by_ag, 0.0))
            copy_rs = on_slow(copy_rs, np.where(unit, by_rs, 0.0))
        else:
            copy_ag, copy_rs = layers * copy_ag, layers * copy_rs
        fwd_gathers, bwd_gathers = _gathers(ctx.terms, zero, m, np.where(per_mb, m, 1))
        copies_rs = np.where(zero >= 2, np.where(per_mb, m, 1), 0) * copy_rs
        dp_exposed = dp_exposed + (fwd_gathers + bwd_gathers) * copy_ag + copies_rs
        dp_forward = dp_forward + fwd_gathers * copy_ag
        dp_after = dp_after + np.where(dpt.at_end, copies_rs, 0.0)
    dp_in_opt = dpt.in_optimizer
    if ctx.terms.zero1_copies:  # ZeRO-1's flat-buffer copies in the optimizer step (the runtime's stack profile)
        z1 = np.where(zero == 1, zero1_copy_seconds(ctx.compute, part.largest, group, dtype), 0.0)
        dp_exposed, dp_in_opt = dp_exposed + z1, dp_in_opt + z1
    params = np.where(zero >= 1, _sharded(part, dp * cp, edp), part.largest)
    optimizer = optimizer_seconds(ctx, params, layers, dtype)
    # the gradient buffer's own passes: the full buffer where it holds the unreduced gradient (zero <= 1)
    optimizer = optimizer + grad_buffer_seconds(ctx, np.where(zero >= 2, params, part.largest), dtype)
    optimizer = optimizer + weight_cast_seconds(ctx, part.largest, dtype)  # each rank casts its whole weights
    compute, recompute_s, overhead = m * c_stage, m * r_stage, m * o_stage
    overhead_low, overhead_high = (m * (layers * ctx.host_overhead_s + on_slow(*band)) for band in (band_lo, band_hi))
    # once per step, synchronous, after the gradient reductions (Megatron-Core finalize_model_grads)
    tp_sync = 0.0 if comm.tp_grad_sync is None else _pick(slow_rank, comm.tp_grad_sync)
    exposed = m * x_stage + pp_exposed + dp_exposed + tp_sync
    exposed_axis = _exposed_by_axis(comm, layers, slow, m, full, penalty, pp_exposed, dp_exposed, on_slow, kinds,
                                    slow_flat=slow_flat)
    if comm.tp_grad_sync is not None:
        exposed_axis["tp"] = exposed_axis.get("tp", 0.0) + tp_sync
    step = compute + recompute_s + bubble + optimizer + exposed + overhead
    comm_total = {axis: m * (on_slow(comm.layer_fwd.get(axis, 0.0) + comm.layer_bwd.get(axis, 0.0)
                                     + np.where(full, comm.layer_fwd.get(axis, 0.0), 0.0),
                                     kinds.total(axis) if kinds else None)
                             + _pick(slow, comm.edge.get(axis, np.zeros((3, pp.size))), slow_flat))
                  for axis in sorted(set(comm.layer_fwd) | set(comm.layer_bwd) | set(comm.edge))}
    comm_total["pp"] = pp_total
    if comm.tp_grad_sync is not None:
        comm_total["tp"] = comm_total.get("tp", 0.0) + tp_sync
    comm_total["dp"] = dp_total
    # the forward passes: the layers' forward compute and exposed collectives, the forward kernels' share of the
    # fixed costs, the edges' forward compute, the gathers exposed before them
    fixed_fwd = on_slow(fixed * _forward_share(ctx.fixed, full),
                        None if fixed_kinds is None else fixed_kinds * _forward_share(ctx.fixed, kinds.full, True))
    edge_f = _pick(slow, on_positions(costs.first.fwd, costs.last.fwd, single), slow_flat)
    forward = m * (on_slow(costs.fwd + f_exp, kinds.forward if kinds else None) + fixed_fwd
                   + edge_f) + dp_forward
    return Schedule(compute=compute, recompute=recompute_s, bubble=bubble, optimizer=optimizer,
                    exposed_comm=exposed, overhead=overhead, overhead_low=np.minimum(overhead_low, overhead),
                    overhead_high=np.maximum(overhead_high, overhead), comm_total=comm_total, step=step,
                    slowest=slow, micro_batches=micro_batches, exposed_axis=exposed_axis, forward=forward,
                    pp_exposed=pp_exposed, dp_after_backward=dp_after, dp_in_optimizer=dp_in_opt,
                    tp_grad_sync=tp_sync)


def scale_tp_exposure(comm: Comm, scale: float) -> Comm:
    """The layer collectives with the exposed part of the TP ones times ``scale`` (a calibration's
    ``tp_exposed_scale``: the achieved overlap of the stack), never beyond their whole time nor below 0; what
    leaves the exposed part joins the hidden part (and its overlap penalty)."""
    exp = comm.layer_exposed_axis.get("tp")
    if exp is None:
        return comm
    new = _scaled(exp, comm.layer_fwd.get("tp", 0.0), comm.layer_bwd.get("tp", 0.0), scale)
    delta = new - exp
    by = comm.by_kind
    if by is not None and "tp" in by.exposed_axis:  # each kind's alike
        k_exp = by.exposed_axis["tp"]
        k_new = _scaled(k_exp, by.fwd.get("tp", 0.0), by.bwd.get("tp", 0.0), scale)
        k_delta = k_new - k_exp
        by = dataclasses.replace(by, fwd_exposed=by.fwd_exposed + k_delta[0], bwd_exposed=by.bwd_exposed + k_delta[1],
                                 exposed_axis={**by.exposed_axis, "tp": k_new})
    return dataclasses.replace(comm, layer_fwd_exposed=comm.layer_fwd_exposed + delta[0],
                               layer_bwd_exposed=comm.layer_bwd_exposed + delta[1],
                               layer_exposed_axis={**comm.layer_exposed_axis, "tp": new}, by_kind=by)


def _scaled(exp: np.ndarray, fwd: np.ndarray | float, bwd: np.ndarray | float, scale: float) -> np.ndarray:
    """(2, ...) exposed forward and backward parts times ``scale``, within [0, their whole time]."""
    whole = np.stack([np.broadcast_to(fwd, exp[0].shape), np.broadcast_to(bwd, exp[1].shape)])
    return np.clip(exp * scale, 0.0, np.maximum(whole, exp))


def scale_dp_exposure(dpt: "DataParallel", scale: float) -> "DataParallel":
    """The data-parallel time with its exposed part times ``scale`` (a calibration's ``dp_exposed_scale``),
    never beyond the whole time; where the exposed part lands (before the forward, after the backward, in the
    optimizer step) keeps its shares."""
    exposed = np.asarray(dpt.exposed, dtype=float)
    new = np.clip(exposed * scale, 0.0, np.maximum(dpt.total, exposed))
    ratio = np.where(exposed > 0, new / np.where(exposed > 0, exposed, 1.0), 1.0)
    return dataclasses.replace(dpt, exposed=new, forward=dpt.forward * ratio,
                               after_backward=dpt.after_backward * ratio, in_optimizer=dpt.in_optimizer * ratio)


def _exposed_by_axis(comm: Comm, layers: np.ndarray, slow: np.ndarray, m: np.ndarray, full: np.ndarray,
                     penalty: float, pp_exposed: np.ndarray, dp_exposed: np.ndarray,
                     on_rank: "RankSum | None" = None, kinds: "_KindTimes | None" = None,
                     slow_flat: np.ndarray | None = None) -> dict:
    """The exposed communication per step split by plan axis (the ``terms`` of docs/SCHEMAS.md T6): each axis's
    exposed layer collectives (the forward ones again under full recomputation) and the overlap penalty of its
    hidden ones, times the slowest rank's layers, plus its edge collectives, per micro-batch; the pipeline's
    and the data-parallel exposure as computed above. Expert axes (``ep``, ``etp``, ``edp``) count as ``ep``."""
    out: dict[str, np.ndarray] = {}
    for axis in sorted(set(comm.layer_fwd) | set(comm.layer_bwd) | set(comm.edge)):
        exp = comm.layer_exposed_axis.get(axis)
        total = comm.layer_fwd.get(axis, 0.0) + comm.layer_bwd.get(axis, 0.0)
        per_layer = _axis_exposed(exp, total, full, penalty)
        if on_rank is None:
            value = layers * per_layer
        else:
            value = on_rank(per_layer, kinds.axis_exposed(axis) if kinds else None)
        edge = comm.edge.get(axis)
        if edge is not None:
            value = value + _pick(slow, edge, slow_flat)
        name = _TERM_AXIS.get(axis.split("-")[0], "ep")
        out[name] = out.get(name, 0.0) + m * value
    out["pp"] = out.get("pp", 0.0) + pp_exposed
    out["dp"] = out.get("dp", 0.0) + dp_exposed
    return out


def _axis_exposed(exp: np.ndarray | None, total: np.ndarray, full: np.ndarray, penalty: float) -> np.ndarray:
    """Exposed seconds of one layer's collectives on one axis: the exposed (forward, backward) parts ``exp`` (the
    forward ones again under ``full`` recomputation) and the overlap penalty of the hidden rest of ``total``."""
    if exp is None:  # nothing of this axis in the layers (edge collectives only)
        return penalty * total
    return exp[0] + exp[1] + np.where(full, exp[0], 0.0) + penalty * (total - exp[0] - exp[1])


@dataclass(frozen=True)
class _KindTimes:
    """Per layer kind (kinds, n), for a source whose kinds run their own collectives (``Comm.by_kind``): the
    schedule's per-layer rules on each kind's collectives; ``full`` (kinds, n) where the kind re-runs its
    forward (full recomputation of a checkpointed kind)."""

    comm: "object"
    full: np.ndarray
    penalty: float
    exposed: np.ndarray
    """exposed collective seconds of one layer per micro-batch (:func:`layer_exposed`)."""
    forward: np.ndarray
    """forward compute and exposed forward collectives of one layer."""
    f_window: np.ndarray
    b_window: np.ndarray
    """what one layer's data-parallel traffic hides behind in forward / backward (compute and exposed
    collectives; backward with recomputation)."""

    @classmethod
    def of(cls, costs: LayerCosts, comm: Comm, full: np.ndarray, penalty: float) -> "_KindTimes | None":
        by = comm.by_kind
        if by is None:
            return None
        shape = by.fwd_exposed.shape
        rerun = costs.rerun_by_kind if costs.rerun_by_kind is not None else np.ones(shape, dtype=bool)
        k_full = full & rerun
        exposed = layer_exposed(_sum(by.fwd.values(), shape), _sum(by.bwd.values(), shape), by.fwd_exposed,
                                by.bwd_exposed, k_full, penalty)
        forward = costs.fwd_by_kind + by.fwd_exposed
        backward = costs.compute_by_kind - costs.fwd_by_kind + costs.recompute_by_kind + by.bwd_exposed
        return cls(comm=by, full=k_full, penalty=penalty, exposed=exposed, forward=forward, f_window=forward,
                   b_window=backward)

    def total(self, axis: str) -> np.ndarray:
        """All collective seconds of one layer on ``axis`` per micro-batch (the forward ones twice where re-run)."""
        f, b = self.comm.fwd.get(axis, 0.0), self.comm.bwd.get(axis, 0.0)
        return np.broadcast_to(f + b + np.where(self.full, f, 0.0), self.full.shape)

    def axis_exposed(self, axis: str) -> np.ndarray:
        total = np.broadcast_to(self.comm.fwd.get(axis, 0.0) + self.comm.bwd.get(axis, 0.0), self.full.shape)
        return _axis_exposed(self.comm.exposed_axis.get(axis), total, self.full, self.penalty)


_TERM_AXIS = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp"}
"""layer-collective axis (its first name) -> term axis; expert axes are ``ep``."""


def _sharded(part: Partition, group: np.ndarray, expert_group: np.ndarray | None) -> np.ndarray:
    """Parameters of the largest rank left to it by ZeRO: dense ones / group, routed experts' / expert group."""
    if part.expert is None or expert_group is None:
        return part.largest / group
    return (part.largest - part.largest_expert) / group + part.largest_expert / expert_group


def _sum(arrays, shape: tuple[int, ...]) -> np.ndarray:
    """Sum of per-axis arrays (zeros when there are none)."""
    arrays = list(arrays)
    if not arrays:
        return np.zeros(shape)
    total = arrays[0]
    for a in arrays[1:]:
        total = total + a
    return total


def _fixed_per_layer(ctx: EstimationContext, costs: LayerCosts, zero: np.ndarray, full: np.ndarray,
                     hosts: tuple, dp: np.ndarray, kinds: "_KindTimes | None"
                     ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """For each host time per op of ``hosts`` (None: the stack's): fixed seconds per micro-batch of the mean
    layer (its kernels' gaps and exposed host time, :meth:`FixedCosts.layer`, and ZeRO-3's hooks), and where
    the layers differ (traced units: ``kinds`` and the source's kernels per kind) the same for one layer of
    each kind, (kinds, n), each with its own kernels and device time (the rank sums them over its own layers:
    :meth:`Ranks.layer_sum`, :class:`RankSum`). The kernel counts and device times are computed once."""
    f = ctx.fixed
    device_s = costs.fwd + costs.bwd + costs.recompute
    kernels = f.kernels(full)
    by_kind = not (kinds is None or f.kernels_by_kind is None or costs.compute_by_kind is None)
    if by_kind:
        device = costs.compute_by_kind + costs.recompute_by_kind
        k_kernels = f.kernels(kinds.full, True)
        own_hooks = ctx.terms.zero3_fetches(ctx.model, ctx.source, 1, by_kind=True) is not None
    out = []
    for host_s_per_op in hosts:
        hooks = _zero3_hooks(ctx, costs, zero, full, host_s_per_op, dp)
        mean = f.layer(device_s, full, host_s_per_op, kernels=kernels) + hooks
        if not by_kind:
            out.append((mean, None))
            continue
        own = (_zero3_hooks(ctx, costs, zero, full, host_s_per_op, dp, kinds)  # each kind its own tensors' hooks
               if own_hooks else hooks)
        out.append((mean, f.layer(device, kinds.full, host_s_per_op, by_kind=True, kernels=k_kernels) + own))
    return out


def _forward_share(fixed, forward_again: np.ndarray, by_kind: bool = False) -> np.ndarray:
    """Of a layer's fixed costs, the forward kernels' share (per kind with ``by_kind``; 0 without kernels)."""
    total = fixed.kernels(forward_again, by_kind)
    fwd = fixed.kernels(forward_again, by_kind, forward_only=True)
    return np.where(total > 0, fwd / np.where(total > 0, total, 1.0), 0.0)


def _zero3_hooks(ctx: EstimationContext, costs: LayerCosts, zero: np.ndarray, full: np.ndarray,
                 host_s_per_op: float | None, ranks: np.ndarray | None = None,
                 kinds: "_KindTimes | None" = None) -> np.ndarray:
    """Per layer and micro-batch: the host time of per-parameter ZeRO-3's module hooks the GPU waits for (one
    fetch per gathered weight tensor in forward, in backward and in a recomputed forward), beyond what the
    layer's own ops already leave exposed. With ``kinds`` (a traced graph's units, the source's
    ``tensor_numels``): (kinds, n) one layer of each kind, its own tensors, kernels and device time."""
    terms = ctx.terms
    if not terms.zero3_per_parameter or terms.host_s_per_collective <= 0:
        return np.zeros(np.shape(zero) if kinds is None else np.shape(kinds.full))
    f = ctx.fixed
    n = terms.zero3_fetches(ctx.model, ctx.source, 1, by_kind=kinds is not None)
    if kinds is None:
        again, device_s = full, costs.fwd + costs.bwd + costs.recompute
    else:
        n, again, device_s = n[:, None], kinds.full, costs.compute_by_kind + costs.recompute_by_kind
    per_fetch = terms.host_s_per_collective + (0.0 if ranks is None else terms.host_s_per_collective_rank * ranks)
    hooks = n * per_fetch * (2.0 + np.where(again, 1.0, 0.0))
    per_op = f.host_s_per_op if host_s_per_op is None else host_s_per_op
    kernels = f.kernels(again, by_kind=kinds is not None)
    device = device_s + kernels * f.gap_s
    before = np.maximum(kernels * per_op - device, 0.0)
    after = np.maximum(kernels * per_op + hooks - device, 0.0)
    if terms.zero3_overlap_fraction is not None:  # serialized fetches (deepspeed-2021): every hook waits
        after = before + hooks
    return np.where(zero == 3, after - before, 0.0)


def _zero3_serialized(terms, total: np.ndarray, exposed: np.ndarray, regather: np.ndarray,
                      regather_exposed: np.ndarray, compute: np.ndarray, full: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """ZeRO-3 as DeepSpeed ran it in 2021 (SC21 Table 2; stack ``deepspeed-2021``): with full recomputation each
    layer's parameters are gathered a third time for the recomputed forward (``regather``: the step's gathers of
    one forward pass, ``regather_exposed`` their exposed part under per-layer prefetch), and with
    ``zero3_overlap_fraction`` the collectives overlap at most that fraction of the step's compute (each
    submodule's fetch is a separate small collective issued from a Python hook; the prefetch did not keep it
    ahead of the compute): exposed = total - fraction x min(total, compute)."""
    if terms.zero3_regather_in_recompute and full is not None:
        total = total + np.where(full, regather, 0.0)
        exposed = exposed + np.where(full, regather_exposed, 0.0)
    if terms.zero3_overlap_fraction is None:
        return total, exposed
    return total, total - terms.zero3_overlap_fraction * np.minimum(total, compute)


@dataclass(frozen=True)
class DataParallel:
    """Data-parallel time per step and where its exposed part lands (arrays over plans)."""

    total: np.ndarray
    exposed: np.ndarray
    """exposed, the hidden part's overlap penalty included."""
    forward: np.ndarray | float = 0.0
    """of ``exposed``, the gathers exposed before the forward passes."""
    after_backward: np.ndarray | float = 0.0
    """of ``exposed``, the reductions after the last backward (FSDP2 under pipelining)."""
    in_optimizer: np.ndarray | float = 0.0
    """of ``exposed``, inside the optimizer step (ZeRO-1 reducing and gathering there)."""
    at_end: np.ndarray | bool = False
    """per plan: the reduce-scatters run after the last backward."""
    in_passes: np.ndarray | float = 0.0
    """of ``exposed``, ZeRO-3's per-layer gathers and reductions exposed inside the forward and backward passes
    (per step; they lengthen every micro-batch's stage time, so the pipeline bubble too)."""


def _gathers(terms, zero: np.ndarray, m: np.ndarray, reductions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(before forward passes, in backward passes) parameter gathers per step of each ZeRO-2/3 unit: ZeRO-3
    gathers for every forward and every backward (``2 m``); ZeRO-2 once per step. FSDP2 units free their
    parameters after every reduction (``fsdp_reshard_after_backward``): ZeRO-2 gathers again before the next
    forward (once per reduction) and ZeRO-3's backward gathers once per reduction (``m + reductions``)."""
    reshard = terms is not None and terms.fsdp_reshard_after_backward
    z3 = zero == 3
    fwd = np.where(z3, m, np.where(zero == 2, reductions if reshard else 1, 0))
    bwd = np.where(z3, reductions if reshard else m, 0)
    return fwd, bwd


def _data_parallel(costs: LayerCosts, comm: Comm, layers: np.ndarray, m: np.ndarray, zero: np.ndarray,
                   overlap: np.ndarray, penalty: float, per_microbatch: np.ndarray | None = None,
                   full: np.ndarray | None = None, terms=None, pp: np.ndarray | None = None,
                   vpp: np.ndarray | None = None, bucket_share: np.ndarray | None = None,
                   on_rank: "RankSum | None" = None, kinds: "_KindTimes | None" = None) -> DataParallel:
    """Data-parallel time per step. Gradients hide behind the backward of the last micro-batch (bucketed), the
    ZeRO parameter all-gather behind the forward of the first micro-batch of the next step. Where the stack
    reduces after every micro-batch (``per_microbatch``: ZeRO-2 keeping only a gradient shard, or a stack
    without gradient-sync control) each micro-batch's reduction hides behind its own backward; otherwise one
    reduction per step. ZeRO-3 gathers every layer's weights in forward and backward (:func:`_gathers`) and
    reduce-scatters its gradients, each hidden behind that layer's compute; its edge shards are gathered in
    forward and backward and reduced every micro-batch. Stack rules: FSDP2 under pipelining reduce-scatters
    after the last backward, exposed (``fsdp_reshard_after_backward``); ZeRO-1 reducing and gathering inside the
    optimizer step, exposed (``zero1_in_optimizer``); interleaved plans of a stack that syncs each model chunk on
    its own (``dp_sync_per_chunk``, Megatron-Core) reduce and gather chunk by chunk (:func:`chunked_exposure`);
    ``bucket_share``: one DDP bucket over the rank's parameters (``comm.dp_bucket_elements``), exposed.
    ``on_rank`` sums per-layer values over the rank's layers (default ``layers x``); with ``kinds`` each kind's
    own ZeRO-3 traffic hides behind its own compute."""
    f_layer = costs.fwd + comm.layer_fwd_exposed
    b_layer = costs.bwd + costs.recompute + comm.layer_bwd_exposed
    if on_rank is None:
        on_rank = RankSum(layers=layers)
    by = None if kinds is None else kinds.comm
    k_f, k_b = (None, None) if kinds is None else (kinds.f_window, kinds.b_window)
    per_mb = (zero >= 2) if per_microbatch is None else per_microbatch
    reductions = np.where(per_mb, m, 1)
    fwd_g, bwd_g = _gathers(terms, zero, m, reductions)
    at_end = np.zeros(np.shape(zero), dtype=bool)
    if terms is not None and terms.fsdp_reshard_after_backward and pp is not None:
        at_end = (zero >= 2) & (pp > 1)
    in_opt = np.zeros(np.shape(zero), dtype=bool)
    if terms is not None and terms.zero1_in_optimizer:
        in_opt = zero == 1
    z3_ag, z3_rs = comm.z3_all_gather, comm.z3_reduce_scatter
    k_ag, k_rs = (None, None) if by is None else (by.z3_all_gather, by.z3_reduce_scatter)
    z3_rs_end = np.where(at_end, z3_rs, 0.0)
    per_layer = zero3_layer(z3_ag, z3_rs, f_layer, b_layer, fwd_g, bwd_g, reductions, at_end)
    per_kind = (None,) * 3 if by is None else zero3_layer(k_ag, k_rs, k_f, k_b, fwd_g, bwd_g, reductions, at_end)
    z3_total, z3_exposed, z3_fwd = (on_rank(v, k) for v, k in zip(per_layer, per_kind))
    if terms is not None and (terms.zero3_regather_in_recompute or terms.zero3_overlap_fraction is not None):
        kind = by is not None  # the same figures on each kind's gathers and windows
        z3_total, z3_exposed = _zero3_serialized(
            terms, z3_total, z3_exposed, m * on_rank(z3_ag, k_ag if kind else None),
            m * on_rank(np.maximum(z3_ag - f_layer, 0.0), np.maximum(k_ag - k_f, 0.0) if kind else None),
            m * on_rank(f_layer + b_layer, k_f + k_b if kind else None), full)
        z3_fwd = 0.0
    grad_t = comm.dp_all_reduce + comm.dp_reduce_scatter
    grad_end = np.where(at_end, comm.dp_reduce_scatter, 0.0)  # ZeRO-2's (ZeRO-3's are its edges' shards)
    gathers = np.where(zero == 3, 2 * m, np.where(zero == 2, fwd_g, 1))  # ZeRO-3: its edges' shards
    overlap = overlap & ~in_opt
    chunks, slots = 1.0, 1.0
    if terms is not None and getattr(terms, "dp_sync_per_chunk", False) and vpp is not None and pp is not None:
        # once-per-step reductions (and the ZeRO-1 gather) chunk by chunk; ZeRO-2/3 traffic stays per unit
        chunks = np.where((reductions == 1) & (zero <= 1), np.maximum(vpp, 1), 1).astype(float)
        slots = np.minimum(m, pp).astype(float)
    # bucketed once-per-step reductions (ZeRO-0/1): the last bucket of the last chunk is exposed in any case
    last = 0.0 if bucket_share is None else np.where((reductions == 1) & (zero <= 1),
                                                     np.minimum(bucket_share, 1.0 / np.asarray(chunks)), 0.0)
    b_window, f_window = on_rank(b_layer, k_b), on_rank(f_layer, k_f)
    total, exposed = dp_exposure(grad_t - grad_end, comm.dp_all_gather, reductions, gathers, b_window,
                                 f_window, overlap, penalty, z3_total, z3_exposed, chunks=chunks,
                                 slots=slots, last_share=last)
    z3_ends = reductions * on_rank(z3_rs_end, None if by is None else np.where(at_end, k_rs, 0.0))
    ends = reductions * grad_end + np.where(zero == 3, z3_ends, 0.0)
    forward = np.where(overlap, gathers * chunked_exposure(comm.dp_all_gather, f_window, chunks, slots,
                                                           last, own_window=True),
                       gathers * comm.dp_all_gather) + z3_fwd
    return DataParallel(total=total + reductions * grad_end, exposed=exposed + reductions * grad_end,
                        forward=np.where(in_opt, 0.0, forward), after_backward=ends,
                        in_optimizer=np.where(in_opt, exposed, 0.0), at_end=at_end,
                        in_passes=z3_exposed - z3_ends)


_GRAD_DTYPE = {"fp8": "bf16", "mxfp8": "bf16", "nvfp4": "bf16"}
"""dtype of the unsharded parameters and gradients FSDP2 copies for a plan dtype (low-precision GEMMs keep
16-bit parameters; their casts are the GEMMs')."""
_REDUCE_DTYPE = {4.0: "fp32", 2.0: "bf16"}
"""the stack's gradient reduce dtype by its bytes (``comm.grad_reduce_dtype``)."""

COPY_OF_RESIDUAL_ADD = 2.0 / 3.0
"""a copy moves 2 elements per element (read, write), a residual add 3 (two reads, a write): FSDP2's copies are
timed as that share of the compute model's residual-add kernel (measured where a profile has it)."""


def fsdp_copy_seconds(compute, unit_numel: np.ndarray | float, dp: np.ndarray | float,
                      dtype: str = "fp32", reduce_dtype: str | None = None,
                      grad_dtype: str | None = None, gather_bytes: float | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(per all-gather, per reduce-scatter) seconds of FSDP2's copies around one unit's collectives, on the
    compute stream (not hidden): before an all-gather each rank copies its shard into the send buffer and after
    it the gathered buffer into the unsharded parameters (``foreach_all_gather`` copy-in,
    ``foreach_all_gather_copy_out``); before a reduce-scatter the unsharded gradients are copied into its
    input buffer and after it the reduced shard into the sharded gradient (``foreach_reduce``,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). The copies move ``dtype`` elements unless
    ``reduce_dtype`` (MixedPrecisionPolicy reduce_dtype) is given: the copy into the reduce-scatter input then
    reads the unsharded gradients (``grad_dtype``, default ``dtype``) and writes ``reduce_dtype``
    (``torch._chunk_cat(..., out=reduce_scatter_input)`` casts), and the reduced shard is in ``reduce_dtype``.
    ``gather_bytes``: bytes per element the all-gather moves when it is not ``dtype``'s (the stack's DP wire,
    ``StateBytes.wire_params``): with float8 all-gather (torchao ``enable_fsdp_float8_all_gather``) the
    ``fsdp_pre_all_gather`` extension hands FSDP2 the fp8 shard, the all-gather runs on bytes
    (``_get_all_gather_input_metadatas``: uint8) and the copy-in and copy-out move 1 B per element.
    Bytes are timed at the compute model's rate for ``dtype``'s kernels, whose elements carry
    ``activation_bytes(dtype)`` (2 B for the low-precision GEMM dtypes, whose tensors are 16-bit)."""
    elem = float(activation_bytes(dtype))   # bytes per element of the kernel timed (compute.memory)

    def copy(numel: np.ndarray | float, read: float, write: float) -> np.ndarray:
        moved = (read + write) / (2.0 * elem)  # 1 for a copy of dtype's elements
        return np.asarray(compute.memory("residual_add", np.asarray(numel, dtype=float) * COPY_OF_RESIDUAL_ADD
                                         * moved, dtype, False)[0], dtype=float)

    own = elem if gather_bytes is None else float(gather_bytes)
    shard = np.asarray(unit_numel, dtype=float) / np.asarray(dp, dtype=float)
    gather = copy(shard, own, own) + copy(unit_numel, own, own)
    if reduce_dtype is None:
        return gather, copy(shard, elem, elem) + copy(unit_numel, elem, elem)
    red = float(DTYPE_BYTES[reduce_dtype])
    grad = float(DTYPE_BYTES[grad_dtype]) if grad_dtype else elem
    return gather, copy(shard, red, red) + copy(unit_numel, grad, red)


def zero1_copy_seconds(compute, numel: np.ndarray | float, dp: np.ndarray | float,
                       dtype: str = "fp32") -> np.ndarray:
    """Seconds per step of a ZeRO-1 optimizer that reduces and gathers through flat buffers, on the compute
    stream (tpsim's ShardedAdam, tpsim/validate/modules/zero1.py ``step``): the flat gradient buffer zero-filled
    (``torch.zeros``: a write, half a copy) and every gradient copied into it, the reduced shard divided by dp in
    place (``div_``: a copy's read and write), the gathered weights copied back into the parameters: 2.5 copies of
    the rank's ``numel`` parameters and one of its shard, timed as :func:`fsdp_copy_seconds` times a copy."""
    n = np.asarray(numel, dtype=float)
    moved = 2.5 * n + n / np.asarray(dp, dtype=float)
    return np.asarray(compute.memory("residual_add", moved * COPY_OF_RESIDUAL_ADD, dtype, False)[0], dtype=float)


def chunked_exposure(comm_t: np.ndarray, window: np.ndarray, chunks: np.ndarray | float = 1.0,
                     slots: np.ndarray | float = 1.0, last_share: np.ndarray | float = 0.0,
                     own_window: bool = False) -> np.ndarray:
    """Exposed seconds of ``comm_t`` of data-parallel traffic (one NCCL stream, so serialized) that hides behind
    one micro-batch's backward (or forward) ``window`` of the rank's layers, released in ``chunks`` equal model
    chunks: ``max(0, comm_t - window)`` for one chunk (its buckets go as the backward makes them ready:
    param_and_grad_buffer.py register_grad_ready on the last micro-batch; with pp > 1 the first stage's, whose
    end is the step's). Megatron-Core's interleaved schedule
    (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving) runs the
    chunks' passes in rounds of ``slots`` = min(m, pp) micro-batches; with grad_sync_func set (Megatron-LM
    --overlap-grad-reduce with align_grad_reduce, r0.8's --delay-grad-reduce, both on by default; NeMo's
    distributed Adam) a chunk's whole reduction is launched once its last micro-batch has run its backward
    (backward_step_helper_postprocess; no bucket launches inside it), so model chunk k from the end
    (k = 0 .. v-1) is released k x slots chunk passes (each ``w = window / v``) before the step's last backward
    ends and the queue drains at ``max_k ((k + 1) c - k x slots x w)`` past the end (c = comm_t / v; linear in
    k, so the larger of k = 0 and k = v - 1). ``own_window``: each chunk's buckets also overlap its own pass
    (``- w``): the forward's gathers, where param_sync_func launches a chunk's all-gathers (chunks 0 and 1 at
    the start, chunk k + 1 with chunk k's first forward) and the forward pre-hooks wait bucket by bucket.
    ``last_share``: the share of ``comm_t`` in the bucket that nothing hides, whatever the window (the last
    gradient bucket is ready only when the backward ends; the first parameter bucket is needed before the
    forward's first layer: Megatron-Core distributed_data_parallel.py, buckets of max(4e7, 1e6 x dp)
    parameters in backward order)."""
    v = np.maximum(np.asarray(chunks, dtype=float), 1.0)
    c, w = comm_t / v, window / v
    own = np.where(v > 1.0, w if own_window else 0.0, w)
    return np.maximum(np.maximum(c - own, comm_t - (v - 1.0) * slots * w - own), last_share * comm_t)


def dp_exposure(grad_t: np.ndarray, t_ag: np.ndarray, reductions: np.ndarray, gathers: np.ndarray,
                bwd_window: np.ndarray, fwd_window: np.ndarray, overlap: np.ndarray, penalty: float,
                z3_total: np.ndarray | float = 0.0, z3_exposed: np.ndarray | float = 0.0, *,
                chunks: np.ndarray | float = 1.0, slots: np.ndarray | float = 1.0,
                last_share: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) data-parallel time per step, the rule every path uses (transformer stages, traced
    graphs): ``reductions`` gradient reductions of ``grad_t`` each hide behind the backward window,
    ``gathers`` ZeRO parameter all-gathers of ``t_ag`` behind the forward window (when ``overlap``; else all
    exposed), released in ``chunks`` model chunks spaced ``slots`` chunk passes apart (:func:`chunked_exposure`;
    one chunk: ``max(0, comm - window)``), the bucket share ``last_share`` of each exposed in any case; per-layer
    ZeRO-3 traffic comes in as (``z3_total``, ``z3_exposed``); a fraction ``penalty`` of whatever hides still
    counts (NCCL kernels hold SMs and memory bandwidth)."""
    exposed = np.where(overlap, reductions * chunked_exposure(grad_t, bwd_window, chunks, slots, last_share)
                       + gathers * chunked_exposure(t_ag, fwd_window, chunks, slots, last_share, own_window=True),
                       reductions * grad_t + gathers * t_ag) + z3_exposed
    total = reductions * grad_t + gathers * t_ag + z3_total
    return total, exposed + penalty * (total - exposed)
