"""The estimator: step time, throughput and memory of a batch of plans, as a pipeline of typed stages over one
:class:`~tpsim.estimator.context.EstimationContext`.

1. **layers** (:mod:`.source`): per-layer and edge costs from the context's layer source, per distinct
   (tp, sp, micro-batch, recompute);
2. **partition** (:mod:`.partition`): layers and parameters of the first / last / busiest middle pipeline rank,
   a leading (position) array axis;
3. **communication** (:mod:`.comm`): every collective timed on the topology, per distinct communication
   pattern (tp, pp, dp, order, vpp, sp, micro-batch, ZeRO), with the algorithm each axis uses;
4. **schedule** (:mod:`.schedule`): the slowest rank's step time and its breakdown, pipeline bubble, data-
   parallel overlap;
5. **memory** (:mod:`.memory`): memory per GPU on the rank with the highest peak;
6. **totals** (here): throughput, FLOP rates, the :class:`EstimateBatch`.

Every stage is a function of arrays returning a frozen dataclass of arrays. ``estimate`` is ``estimate_batch``
on a batch of one; no result depends on the batch it was computed in.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import pipeline
from ..compute.base import ComputeModel
from ..errors import InputError
from ..model import ModelSpec
from ..plan import Plan, PlanBatch, validate_plan
from ..units import GiB
from .band import step_band
from .comm import LAYOUT_AXES, Comm, communication, layouts_of
from .context import EstimationContext, context_for
from .flops import layer_forward_flops, model_flops_per_sequence
from .keys import TAKE_MODE, Keys, distinct, sorted_values
from .memory import Memory, memory
from .partition import Partition, SplitFields, partition
from .result import Estimate, EstimateBatch
from .schedule import Schedule, schedule
from .source import LayerCosts

__all__ = ["estimate", "estimate_batch", "run_stages", "layer_forward_flops", "model_flops_per_sequence",
           "model_states_bytes"]


# ---- stage 1: layer costs --------------------------------------------------------------------------------
def layer_costs(ctx: EstimationContext, plans: PlanBatch) -> tuple[LayerCosts, Keys]:
    """Costs per distinct layer key of the batch (remembered by the context) and the plans' key index."""
    keys = distinct(*(getattr(plans, f) for f in ctx.source.key_fields))
    memo_key = ("layers", keys.rows.tobytes(), keys.rows.shape, plans.dtype, plans.attention)
    return ctx.memo(memo_key, lambda: ctx.layer_rows(keys.rows, plans.dtype, plans.attention)), keys


def kept_layer_costs(ctx: EstimationContext, plans: PlanBatch) -> tuple[LayerCosts, np.ndarray]:
    """(the costs of every layer key the context keeps for the batch's dtype and attention, each plan's row in
    them): :func:`layer_costs` without gathering the batch's keys first (the stages gather per plan, pattern or
    group from them)."""
    keys = distinct(*(getattr(plans, f) for f in ctx.source.key_fields))
    kept, rows = ctx.kept_layer_rows(keys.rows, plans.dtype, plans.attention)
    return kept, rows.take(keys.inverse, mode=TAKE_MODE)


# ---- the pipeline ----------------------------------------------------------------------------------------
def _patterns(ctx: EstimationContext, plans: PlanBatch, costs: LayerCosts,
              layer_keys: Keys | np.ndarray) -> tuple[np.ndarray, Partition, Comm]:
    """Stages 2 and 3 on the distinct communication patterns of the batch (the rank layout, the pipeline split,
    ZeRO and what the layer's traffic depends on), each pattern computed once per context and kept across
    batches (:class:`~tpsim.estimator.caches.PatternStore`): each plan's row in the kept results and them.
    ``layer_keys``: each plan's row in ``costs`` (:func:`kept_layer_costs`), or the Keys of :func:`layer_costs`."""
    layer_index = layer_keys.inverse if isinstance(layer_keys, Keys) else layer_keys
    fields = dict.fromkeys(LAYOUT_AXES + ("order", "vpp", "zero", "schedule", "tp_overlap") + SPLIT_FIELDS + _EXPERT_FIELDS
                           + ctx.source.comm_fields)
    keys = distinct(*(getattr(plans, f) for f in fields))

    def build(which: np.ndarray) -> tuple[Partition, Comm]:
        first = keys.first[which]
        sub = plans.take(first)
        # the layer-cost fields these stages use do not depend on recomputation: any plan of a pattern will do
        index = layer_index.take(first)
        part = partition_of(ctx, sub, costs.take(index, with_comm=False))
        layouts, layout_index = layouts_of(ctx, sub)
        src = ctx.source
        wire = ctx.terms.state_bytes(plans.dtype)
        comm = communication(ctx, layouts, layout_index, index, costs, part,
                             traffic_key=[getattr(sub, f) for f in src.comm_fields],
                             params_key=[sub.vpp, sub.zero, sub.cp] + [getattr(sub, f) for f in src.param_fields],
                             pp=sub.pp, zero=sub.zero, dp=sub.dp, w_bytes=wire.wire_params, grad_bytes=wire.wire_grads,
                             z3_collectives=_z3_collectives(ctx, sub), cp=sub.cp, edp=expert_dp(sub),
                             tp_overlap=sub.tp_overlap, tp=sub.tp, sp=sub.sp)
        return part, comm

    store = ctx.pattern_store(plans.dtype, plans.attention)
    rows = store.rows(keys.rows, build)
    part, comm = store.value
    return rows.take(keys.inverse, mode=TAKE_MODE), part, comm


def plan_patterns(ctx: EstimationContext, plans: PlanBatch, costs: LayerCosts,
                  layer_keys: Keys | np.ndarray) -> tuple[Partition, Comm]:
    """Stages 2 and 3 for each plan of the batch: :func:`_patterns`' kept results gathered to the plans."""
    pattern_of, part, comm = _patterns(ctx, plans, costs, layer_keys)
    return part.for_plans(pattern_of), comm.take(pattern_of)


def partition_of(ctx: EstimationContext, plans: PlanBatch, costs: LayerCosts) -> Partition:
    """Stage 2 for the plans (``costs`` gathered to them): the source's layers (of one kind, of several kinds,
    or of different costs: ``layer_weights``) split under the stack's rule, the plan's uneven split or the
    schedule's mirrored stages."""
    src = ctx.source
    weights = src.layer_weights(ctx.compute, plans.dtype) if hasattr(src, "layer_weights") else None
    return partition(src.num_layers, plans.pp, plans.vpp, costs, ctx.terms.pipeline_edges_as_layers,
                     getattr(src, "kind_of_layer", None), mirrored=pipeline.mirrored(plans.schedule),
                     split=SplitFields.of(plans), weights=weights)


def _z3_collectives(ctx: EstimationContext, plans: PlanBatch) -> np.ndarray | float:
    """ZeRO-3 gathers per layer and pass of each row (per-parameter ZeRO-3: one per weight tensor)."""
    if not ctx.terms.zero3_per_parameter:
        return 1.0
    per_tp = {int(t): ctx.terms.zero3_fetches(ctx.model, ctx.source, int(t)) for t in sorted_values(plans.tp)}
    return np.array([per_tp[int(t)] for t in plans.tp])


def _memory_figures(ctx: EstimationContext, plans: PlanBatch) -> dict:
    """Bytes per parameter of weights, their fp8 casts, gradients, master copy and optimizer moments under the
    context's stack; the CUDA context and NCCL buffers of each plan; the allocator reserve fraction."""
    from .memory import communicators, process_memory

    def per_dtype() -> dict:  # what depends on the context and the dtype alone: once per context
        terms, dtype = ctx.terms, plans.dtype
        sb = terms.state_bytes(dtype)
        cache = terms.weight_cache_bytes(dtype)  # the quantized weight copies kept between micro-batches
        on_device = 1.0 - terms.optimizer_cpu_fraction  # the CPU part's states live in host memory
        return dict(w_bytes=sb.weights, weight_cache_bytes=cache, grad_bytes=sb.grads,
                    master_bytes=sb.master * on_device, state_bytes=sb.moments * on_device,
                    process=process_memory().cuda_context,
                    reserve_fraction=terms.allocator_reserve_fraction,
                    states_offloaded=terms.optimizer_state_offload)

    fixed = ctx.constant(("memory_figures", plans.dtype), per_dtype)
    nccl = communicators(plans.tp, plans.dp, plans.pp, plans.cp, plans.ep) * process_memory().nccl_per_communicator
    return dict(fixed, nccl=nccl)


SPLIT_FIELDS = ("pp_first", "pp_last", "pp_embedding", "pp_loss", "pp_layout")
"""plan fields of an uneven pipeline split (docs/SCHEMAS.md T1)."""
_EXPERT_FIELDS = ("ep", "etp")
"""plan fields that set the expert rank layout (with the layout axes)."""


def expert_dp(plans: PlanBatch) -> np.ndarray:
    """Expert data-parallel degree of each plan: tp x cp x dp / (etp x ep)."""
    etp = np.where(plans.etp == 0, plans.tp, plans.etp)
    return plans.tp * plans.cp * plans.dp // (etp * plans.ep)


def run_stages(ctx: EstimationContext, plans: PlanBatch) -> EstimateBatch:
    """Every stage on a batch of valid plans for ``ctx``."""
    kept, layer_index = kept_layer_costs(ctx, plans)
    part, comm = plan_patterns(ctx, plans, kept, layer_index)
    costs = kept.for_plans(layer_index)
    p = plans
    edp = expert_dp(p)
    sched = schedule(ctx, p, costs, comm, part, edp=edp)
    m = sched.micro_batches
    mem = memory(costs, part, pp=p.pp, vpp=p.vpp, dp=p.dp, zero=p.zero, m=m,
                 grad_unsharded=ctx.terms.unsharded_grad_fraction(p.zero, p.pp, p.vpp, m), cp=p.cp, edp=edp,
                 schedule=p.schedule,
                 **_memory_figures(ctx, p))
    return totals(ctx, plans, costs, sched, mem, comm)


def model_states_bytes(ctx: EstimationContext, plans: PlanBatch) -> np.ndarray:
    """Per plan, the weights, gradients and optimizer states (bytes) of the pipeline rank holding the most (of
    every rank where the three positions are not exact, :meth:`Partition.ranks`):
    a lower bound of its peak memory that needs neither collective curves nor activations (the planner drops
    plans whose states alone exceed the device). Computed per distinct (parameter, pipeline and ZeRO) pattern
    with the partition and memory stages' own rules."""
    from .memory import _state_bytes

    costs_u, layer_keys = layer_costs(ctx, plans)
    edp_all = expert_dp(plans)
    fields = [plans.pp, plans.vpp, plans.zero, plans.dp, plans.cp, edp_all, layer_keys.inverse, plans.schedule] + [
        getattr(plans, f) for f in SPLIT_FIELDS]
    keys = distinct(*fields)
    sub = plans.take(keys.first)
    costs = costs_u.take(layer_keys.inverse[keys.first], with_comm=False)
    part = partition_of(ctx, sub, costs)
    fig = _memory_figures(ctx, sub)
    # the stack's bytes per parameter; gradients as sharded as ZeRO allows (the stack may keep more of them
    # whole, which only raises the peak: this stays a lower bound)
    full = np.where(sub.zero >= 2, 0.0, 1.0)
    per = dict(w_bytes=fig["w_bytes"] + fig["weight_cache_bytes"],
               state_bytes=fig["master_bytes"] + fig["state_bytes"], grad_bytes=fig["grad_bytes"])
    dense = _state_bytes(sub.zero, sub.dp * sub.cp, full, **per)["total"]
    expert = _state_bytes(sub.zero, edp_all[keys.first], full, **per)["total"]
    ranks = part.ranks(for_memory=True)  # every rank where the three positions do not hold the most
    params, held_expert = part.rank_params(ranks)
    held_expert = 0.0 if held_expert is None else held_expert
    states = np.where(ranks.valid, (params - held_expert) * dense + held_expert * expert, 0.0).max(axis=0)
    return states[keys.inverse]


# ---- stage 6: totals -------------------------------------------------------------------------------------
def totals(ctx: EstimationContext, plans: PlanBatch, costs: LayerCosts, sched: Schedule, mem: Memory,
           comm: Comm) -> EstimateBatch:
    """Throughput, model and hardware FLOP rates (SC21 / Korthikanti et al. counting), the batch result."""
    model, cluster, source = ctx.model, ctx.cluster, ctx.source
    device = cluster.device
    step = sched.step
    tokens = plans.global_batch * float(source.tokens_per_sequence)
    # per sample, once per context: the model FLOPs and what each recompute code (0 / 1 / 2) adds
    per_sequence, per_recompute = ctx.constant(("flops_per_sequence",), lambda: (
        source.model_flops_per_sequence(), np.asarray(source.recompute_flops_per_sequence(np.arange(3)))))
    mflops = plans.global_batch * per_sequence
    hflops = mflops + per_recompute[plans.recompute] * plans.global_batch
    gpus = float(cluster.num_gpus)
    peak_flops = device.peak(plans.dtype)
    zeros = np.zeros(step.size)
    layer_t = costs.fwd + costs.bwd
    attention = np.zeros_like(layer_t) if costs.attention is None else costs.attention
    step_low, step_high = step_band(
        ctx.band, plans.dtype, step=step, compute_like=sched.compute + sched.recompute + sched.bubble,
        attention_share=np.where(layer_t > 0, attention / np.where(layer_t > 0, layer_t, 1.0), 0.0),
        measured=costs.measured, exposed_comm=sched.exposed_comm, optimizer=sched.optimizer,
        overhead_low=sched.overhead_low, overhead_high=sched.overhead_high)
    return EstimateBatch(
        plans=plans, step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=mflops / (step * gpus) / 1e12, hardware_tflops_per_gpu=hflops / (step * gpus) / 1e12,
        mfu=mflops / (step * gpus * peak_flops), hfu=hflops / (step * gpus * peak_flops),
        peak_memory_gib=mem.peak / GiB, fits=mem.peak <= device.usable_memory_bytes, compute_s=sched.compute,
        recompute_s=sched.recompute, bubble_s=sched.bubble, optimizer_s=sched.optimizer,
        exposed_comm_s=sched.exposed_comm, tp_comm_s=sched.comm_total.get("tp", zeros),
        pp_comm_s=sched.comm_total["pp"], dp_comm_s=sched.comm_total["dp"],
        cp_comm_s=sched.comm_total.get("cp", zeros),
        ep_comm_s=sched.comm_total.get("ep", zeros) + sched.comm_total.get("etp", zeros),
        mem_weights_gib=mem.terms["weights"] / GiB, mem_grads_gib=mem.terms["grads"] / GiB,
        mem_optimizer_states_gib=mem.terms["optimizer_states"] / GiB,
        mem_activations_gib=mem.terms["activations"] / GiB, mem_other_gib=mem.terms["other"] / GiB,
        mem_cuda_context_gib=mem.terms["cuda_context"] / GiB, mem_nccl_buffers_gib=mem.terms["nccl_buffers"] / GiB,
        mem_allocator_reserve_gib=mem.terms["allocator_reserve"] / GiB,
        measured_compute_fraction=costs.measured, overhead_s=sched.overhead, model_name=model.name,
        cluster_info={"name": cluster.name, "gpus": cluster.num_gpus, "device": device.name,
                      "gpus_per_node": cluster.gpus_per_node},
        compute_model=ctx.compute_source, collective_codes=comm.names, collective_names=ctx.name_table,
        context_warnings=ctx.warnings, usable_memory_gib=device.usable_memory_bytes / GiB, stack=ctx.stack.name,
        exposed_axis=sched.exposed_axis, phases=sched.phases(), term_sources=_term_sources(ctx, plans.dtype),
        step_time_s_low=step_low, step_time_s_high=step_high, tokens_per_s_low=tokens / step_high,
        tokens_per_s_high=tokens / step_low, mfu_low=mflops / (step_high * gpus * peak_flops),
        mfu_high=mflops / (step_low * gpus * peak_flops), num_layers=int(source.num_layers),
        edges_as_layers=bool(ctx.terms.pipeline_edges_as_layers), flops_convention=source.flops_convention,
        layer_weights=(source.layer_weights(ctx.compute, plans.dtype) if hasattr(source, "layer_weights")
                       else None))


def _term_sources(ctx: EstimationContext, dtype: str) -> dict[str, str]:
    """Where each step-time term comes from, once per context and dtype (tpsim.estimator.explain)."""
    from .explain import term_sources

    return ctx.constant(("term_sources", dtype), lambda: term_sources(ctx, dtype))


# ---- entry points ----------------------------------------------------------------------------------------
def estimate_batch(model: ModelSpec, cluster, plans: PlanBatch, compute: ComputeModel | None = None,
                   flavor: str = "megatron", *, calibration=None, stack=None,
                   context: EstimationContext | None = None) -> EstimateBatch:
    """Estimate every plan of the batch (plans must be valid for ``model`` on ``cluster``); ``context``
    defaults to :func:`context_for` of the inputs."""
    n = len(plans)
    if n == 0:
        raise InputError("no plans to estimate")
    used = plans.tp * plans.cp * plans.pp * plans.dp
    wrong = used != cluster.num_gpus
    if np.any(wrong):
        bad = int(np.argmax(wrong))
        raise InputError(f"plan {plans.plan(bad).short()} uses {int(used[bad])} GPUs but the cluster has "
                         f"gpus={cluster.num_gpus}")
    ctx = context or context_for(model, cluster, compute, calibration, stack, flavor)
    return run_stages(ctx, plans)


def estimate(model: ModelSpec, cluster, plan: Plan, compute: ComputeModel | None = None,
             flavor: str = "megatron", *, calibration=None, stack=None,
             context: EstimationContext | None = None) -> Estimate:
    """Estimate one plan (a batch of one); ``calibration`` defaults to the cluster's own; ``stack`` is a
    training-stack profile, name or path (default megatron: a plan the stack cannot run is an
    :class:`~tpsim.errors.InputError` naming the rule); ``context`` (for another layer source) replaces the one
    :func:`context_for` would give."""
    _validated(model, plan, cluster.num_gpus)
    ctx = context or context_for(model, cluster, compute, calibration, stack, flavor)
    ctx.check_stack(plan)
    return run_stages(ctx, PlanBatch.from_plans([plan])).to_estimate(0)


_VALID: "OrderedDict[tuple, ModelSpec]" = OrderedDict()
"""(id of the model, plan, GPUs) -> the model, for the last few thousand plans :func:`estimate` validated (the
model kept, so its id names it while the entry lives; models and plans are frozen)."""
_VALID_KEEP = 4096


def _validated(model: ModelSpec, plan: Plan, num_gpus: int) -> None:
    """:func:`~tpsim.plan.validate_plan`, once per (model, plan, GPU count) of the recent ones."""
    key = (id(model), plan, num_gpus)
    try:
        if _VALID.get(key) is model:
            return
    except TypeError:  # a field of a type no plan has (a list): validate_plan names it
        validate_plan(model, plan, num_gpus)
        return
    validate_plan(model, plan, num_gpus)
    _VALID[key] = model
    if len(_VALID) > _VALID_KEEP:
        _VALID.popitem(last=False)
