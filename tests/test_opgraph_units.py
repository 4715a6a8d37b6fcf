"""Traced graphs of different units (UnitSource) in the estimator's one step model: each pipeline rank pays its
own units' collectives and ZeRO-3 traffic, full recomputation re-runs only the checkpointed blocks (and their
collectives), and the slowest rank is found among every pipeline rank."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tpsim.opgraph.estimate import estimate_graph_batch, graph_context
from tpsim.opgraph.model import graph_violation, load_graph_model
from tpsim.plan import Plan, PlanBatch

DATA = Path(__file__).parent / "data" / "opgraph"


def _setup(name: str):
    from tpsim.compute.roofline import RooflineModel
    from tpsim.topology import load_cluster

    model = load_graph_model(DATA / f"{name}.ops.json").with_gpus(8)
    cluster = load_cluster("dgx-a100", gpus=8)
    return model, cluster, RooflineModel(cluster.device)


@pytest.fixture(scope="module")
def resnet():
    return _setup("tiny-resnet")


@pytest.fixture(scope="module")
def unet():
    """a U-Net: units without parameters (concatenations, interpolation) among its glue and blocks."""
    return _setup("tiny-unet")


def _batch(model, **grid) -> PlanBatch:
    plans = []
    for values in itertools.product(*grid.values()):
        f = dict(zip(grid, values))
        plan = Plan(dp=8 // (f["tp"] * f["pp"]), global_batch=32, **f)
        if graph_violation(model, plan, 8) is None:
            plans.append(plan)
    return PlanBatch.from_plans(plans)


def _stages(model, cluster, roof, plans: PlanBatch):
    """The context, per-plan layer costs, partition and communication of the estimator's stages."""
    from tpsim.estimator.core import _patterns, layer_costs

    ctx = graph_context(model, cluster, roof)
    costs_u, layer_keys = layer_costs(ctx, plans)
    pattern_of, part_u, comm_u = _patterns(ctx, plans, costs_u, layer_keys)
    return ctx, costs_u.for_plans(layer_keys.inverse), part_u.for_plans(pattern_of), comm_u.take(pattern_of)


def test_a_rank_pays_its_own_units_collectives(resnet):
    """pp = 2 at tp = 2: the slowest rank's TP time is its own units' (each unit's collectives times the rank's
    instances of it), not its layer count times the model's mean layer."""
    model, cluster, roof = resnet
    plans = _batch(model, tp=[2], pp=[2], micro_batch=[1, 4], sp=[False, True])
    e = estimate_graph_batch(model, cluster, plans, compute=roof)
    ctx, costs, part, comm = _stages(model, cluster, roof, plans)
    per_unit = comm.by_kind.fwd["tp"] + comm.by_kind.bwd["tp"]  # (units, plans)
    assert np.ptp(per_unit, axis=0).min() > 0  # the units' collectives differ
    m = plans.global_batch // (plans.micro_batch * plans.dp)
    ranks = part.ranks()
    own = np.einsum("krn,kn->rn", ranks.kind_counts, per_unit)
    mean = ranks.layers * (comm.layer_fwd["tp"] + comm.layer_bwd["tp"])
    sync = 0.0 if comm.tp_grad_sync is None else comm.tp_grad_sync  # once per step: each rank its own layers'
    expected = m * own + sync
    slow = np.where(np.isclose(e.tp_comm_s, expected[0], rtol=1e-12), 0, 1)
    n = np.arange(len(plans))
    np.testing.assert_allclose(e.tp_comm_s, expected[slow, n], rtol=1e-12)
    assert np.all(np.abs(own[slow, n] / mean[slow, n] - 1) > 1e-3)


def test_zero3_gathers_each_units_own_parameters(unet):
    """ZeRO-3 without pipelining: the data-parallel time is the sum over the units of their own gathers (forward
    and backward of every micro-batch) and reduce-scatters; a unit without parameters gathers nothing."""
    model, cluster, roof = unet
    plans = _batch(model, tp=[1, 2], pp=[1], zero=[3], micro_batch=[1, 4])
    e = estimate_graph_batch(model, cluster, plans, compute=roof)
    ctx, costs, part, comm = _stages(model, cluster, roof, plans)
    by = comm.by_kind
    bare = np.array([not any(op.params for op in u.ops) for u in model.graph.units])
    assert bare.any() and np.all(by.z3_all_gather[bare] == 0) and np.all(by.z3_all_gather[~bare] > 0)
    m = plans.global_batch // (plans.micro_batch * plans.dp)
    counts = part.ranks().kind_counts[:, 0]  # the one rank's instances of each unit
    expected = (counts * (2 * m * by.z3_all_gather + m * by.z3_reduce_scatter)).sum(axis=0)
    np.testing.assert_allclose(e.dp_comm_s, expected, rtol=1e-12)
    assert np.all(np.abs(expected / (model.num_layers * (2 * m * comm.z3_all_gather + m * comm.z3_reduce_scatter))
                         - 1) > 1e-3)


def test_full_recompute_reruns_only_the_checkpointed_blocks(resnet):
    """Full recomputation checkpoints the blocks: their forward collectives run again in backward, the glue's
    (stem, pooling, classifier: not checkpointed, torchtitan apply_ac) do not."""
    model, cluster, roof = resnet
    none, full = (_batch(model, tp=[2], pp=[1], micro_batch=[2], recompute=[rc]) for rc in ("none", "full"))
    e_none, e_full = (estimate_graph_batch(model, cluster, p, compute=roof) for p in (none, full))
    ctx, costs, part, comm = _stages(model, cluster, roof, full)
    fwd = comm.by_kind.fwd["tp"][:, 0]
    blocks = np.array([u.kind == "block" for u in model.graph.units])
    repeats = np.array([u.repeat for u in model.graph.units], dtype=float)
    assert fwd[~blocks].sum() > 0  # the glue runs TP collectives too
    m = int(full.global_batch[0] // (full.micro_batch[0] * full.dp[0]))
    rerun = m * (repeats * fwd)[blocks].sum()
    assert e_full.tp_comm_s[0] - e_none.tp_comm_s[0] == pytest.approx(rerun, rel=1e-9)


def test_the_slowest_of_every_rank_paces_the_pipeline(resnet, monkeypatch):
    """pp = 4: every rank's stage time is compared. Against the three positions alone (first, last and the middle
    rank the split weighs heaviest at tp = 1, micro-batch 1) the step is never shorter, and longer where a plan's
    TP collectives, micro-batch or recomputation make another middle rank the slowest."""
    from tpsim.estimator.partition import Partition, Ranks

    model, cluster, roof = resnet
    plans = _batch(model, tp=[1, 2], pp=[4], micro_batch=[1, 4], recompute=["none", "full"], sp=[False, True])
    every = estimate_graph_batch(model, cluster, plans, compute=roof).step_time_s
    monkeypatch.setattr(Partition, "ranks", lambda self, for_memory=False: Ranks(
        layers=self.layers, valid=self.valid, kind_counts=self.kind_counts))
    three = estimate_graph_batch(model, cluster, plans, compute=roof).step_time_s
    assert np.all(every >= three * (1 - 1e-12))
    assert np.any(every > three * (1 + 1e-6))


def test_memory_peaks_on_a_rank_of_its_own_units(unet):
    """pp = 4 (two chunks each): every rank's peak is compared, each with its own units' activations times its
    own micro-batches in flight; the peak is the highest of them (not the split's heaviest middle rank with
    rank 1's in-flight count)."""
    from tpsim.estimator.memory import memory
    from tpsim.pipeline import in_flight

    model, cluster, roof = unet
    plans = _batch(model, tp=[1], pp=[4], vpp=[2], micro_batch=[1, 4], recompute=["none", "full"])
    _, costs, part, _ = _stages(model, cluster, roof, plans)
    ranks = part.ranks(for_memory=True)
    assert ranks.layers.shape[0] == 4
    m = plans.global_batch // (plans.micro_batch * plans.dp)
    stored = ranks.layer_sum(costs.activations, costs.activations_by_kind)
    own = stored * in_flight(plans.schedule, ranks.rank_of(plans.pp), plans.pp, plans.vpp, m) + costs.working
    mem = memory(costs, part, pp=plans.pp, vpp=plans.vpp, dp=plans.dp, zero=plans.zero, m=m, w_bytes=2.0,
                 master_bytes=4.0, grad_bytes=4.0)
    got = mem.terms["activations"]
    assert got == pytest.approx(own[mem.peak_position, np.arange(m.size)], rel=1e-12)
    # the split's heaviest middle rank is not rank 1 here: its units with rank 1's micro-batches is no rank's
    heaviest = part.layer_sum(costs.activations, costs.activations_by_kind)[2]
    assert np.any(np.abs(heaviest - stored[1]) > 1e-6 * heaviest)


def test_fixed_costs_are_each_units_own(resnet):
    """Per micro-batch, a rank's fixed costs are the sum over its own units of each unit's kernel gaps and the
    host time its own kernels leave exposed beyond its own device time (not its unit count times the mean
    unit's: host time exposed is convex in the kernels, so a host-bound unit is not averaged away)."""
    model, cluster, roof = resnet
    plans = _batch(model, tp=[1], pp=[1, 4], micro_batch=[1], recompute=["none", "full"])
    ctx, costs, part, _ = _stages(model, cluster, roof, plans)
    est = estimate_graph_batch(model, cluster, plans, compute=roof)
    k = ctx.fixed.kernels_by_kind
    assert k is not None and k.shape == (3, len(model.graph.units))
    share = np.array([u.repeat for u in model.graph.units]) / model.num_layers
    assert ctx.fixed.kernels_fwd == pytest.approx(k[0] @ share, rel=1e-12)  # the mean unit's: the same counts
    full = (plans.recompute == 2)[None, :] & costs.rerun_by_kind
    device = costs.compute_by_kind + costs.recompute_by_kind
    kernels = k[0][:, None] + k[1][:, None] + np.where(full, k[2][:, None], 0.0)
    gaps = kernels * ctx.fixed.gap_s
    own = gaps + np.maximum(kernels * ctx.fixed.host_s_per_op - device - gaps, 0.0)
    ranks = part.ranks()
    per_rank = ranks.layer_sum(0.0, own) + ranks.layers * ctx.host_overhead_s
    m = plans.global_batch // (plans.micro_batch * plans.dp)
    for i in range(len(plans.pp)):
        got = est.overhead_s[i] / m[i]
        assert any(got == pytest.approx(v, rel=1e-9) for v in per_rank[: plans.pp[i], i])
    # pp 4: the slowest rank's own units are not its unit count times the mean unit
    mean = ranks.layers * (ctx.fixed.layer(costs.fwd + costs.bwd + costs.recompute, plans.recompute == 2)
                           + ctx.host_overhead_s)
    four = np.flatnonzero(plans.pp == 4)
    assert not np.any(np.isclose(est.overhead_s[four] / m[four], mean[:4, four], rtol=1e-3))


def test_fsdp2_copies_move_the_slowest_ranks_own_units_parameters(unet):
    """FSDP2's copy-in/copy-out around each unit's collectives (torchtitan's stack): on the slowest rank, the sum
    over its own units of the copies of each unit's own parameters, none for a unit without parameters."""
    import dataclasses

    from tpsim.estimator.context import load_stack
    from tpsim.estimator.core import _patterns, layer_costs
    from tpsim.estimator.schedule import _GRAD_DTYPE, _REDUCE_DTYPE, _gathers, fsdp_copy_seconds, schedule

    model, cluster, roof = unet
    plans = _batch(model, tp=[1], pp=[2, 4], zero=[2, 3], micro_batch=[1, 4])
    ctx = graph_context(model, cluster, roof, stack=load_stack("torchtitan"))
    assert ctx.terms.fsdp_copies
    costs_u, layer_keys = layer_costs(ctx, plans)
    pattern_of, part_u, comm_u = _patterns(ctx, plans, costs_u, layer_keys)
    costs, part, comm = costs_u.for_plans(layer_keys.inverse), part_u.for_plans(pattern_of), comm_u.take(pattern_of)
    with_copies = schedule(ctx, plans, costs, comm, part).exposed_comm
    off = dataclasses.replace(ctx, terms=dataclasses.replace(ctx.terms, fsdp_copies=False))
    copies = with_copies - schedule(off, plans, costs, comm, part).exposed_comm
    assert np.all(copies > 0)
    dtype = str(plans.dtype)

    def copy(numel):
        return fsdp_copy_seconds(ctx.compute, numel, plans.dp * plans.cp, dtype,
                                 _REDUCE_DTYPE.get(ctx.terms.grad_reduce_bytes), _GRAD_DTYPE.get(dtype, dtype),
                                 gather_bytes=ctx.terms.state_bytes(dtype).wire_params)

    m = plans.global_batch // (plans.micro_batch * plans.dp)
    reductions = np.where(ctx.terms.reduces_per_microbatch(plans.zero, plans.pp), m, 1)
    fwd_g, bwd_g = _gathers(ctx.terms, plans.zero, m, reductions)
    ranks = part.ranks()
    unit = costs.params_by_kind > 0
    ag, rs = (np.where(unit, c, 0.0) for c in copy(costs.params_by_kind))
    own = (fwd_g + bwd_g) * ranks.layer_sum(0.0, ag) + reductions * ranks.layer_sum(0.0, rs)
    mean_ag, mean_rs = copy(costs.params)
    mean = ranks.layers * ((fwd_g + bwd_g) * mean_ag + reductions * mean_rs)  # the unit count x the mean unit
    for i in range(len(plans.pp)):
        assert any(copies[i] == pytest.approx(v, rel=1e-9) for v in own[: plans.pp[i], i])
    assert any(not np.any(np.isclose(copies[i], mean[: plans.pp[i], i], rtol=1e-6)) for i in range(len(plans.pp)))


def test_full_recompute_relaunches_only_the_blocks_kernels(unet):
    """The fixed costs of full recomputation: the re-run forward launches the blocks' kernels, not the glue's
    (one kernel per op forward)."""
    model, cluster, roof = unet
    ctx = graph_context(model, cluster, roof)
    units = model.graph.units
    share = np.array([u.repeat for u in units], dtype=float) / model.num_layers
    ops = np.array([len(u.ops) for u in units], dtype=float)
    blocks = np.array([u.kind == "block" for u in units])
    assert ops[~blocks].sum() > 0
    assert ctx.fixed.kernels_fwd == pytest.approx((share * ops).sum(), rel=1e-12)
    assert ctx.fixed.kernels_rerun == pytest.approx((share * ops)[blocks].sum(), rel=1e-12)


def test_a_pipeline_stage_sends_what_is_live_at_its_own_cut(unet):
    """The pipeline send of a plan is the largest activation live at its own chunk boundaries (skip connections
    of the U-Net included), timed once per plan on its layout."""
    from tpsim.estimator.comm import AxisCurves, layouts_of
    from tpsim.estimator.core import layer_costs
    from tpsim.estimator.partition import layer_split

    model, cluster, roof = unet
    plans = _batch(model, tp=[1, 2], pp=[2, 4], vpp=[1, 2], micro_batch=[1])
    ctx, costs, part, comm = _stages(model, cluster, roof, plans)
    src = ctx.source
    costs_u, keys = layer_costs(ctx, plans)
    weights = src.layer_weights(ctx.compute, plans.dtype)
    layouts, at = layouts_of(ctx, plans)
    curves = AxisCurves(ctx, layouts, at)
    sent = np.zeros(len(plans))
    for i in range(len(plans)):
        sizes = layer_split(src.num_layers, int(plans.pp[i]), int(plans.vpp[i]), weights=weights)
        kinds = {int(src.kind_of_layer[s]) for s in np.cumsum(sizes)[:-1]}
        sent[i] = max(costs_u.boundary_by_kind[k, keys.inverse[i]] for k in kinds)
    assert len(set(sent.tolist())) > 1  # the cuts differ between plans
    np.testing.assert_allclose(comm.p2p, curves.time(("pp",), "send_recv", sent), rtol=1e-12)


def test_zero3_hooks_are_each_units_own_tensors(resnet):
    """Per-parameter ZeRO-3 (DeepSpeed's stack): a rank's module-hook host time is the sum over its own units of
    each unit's fetches (one per parameter tensor at or above the persistence threshold, none for a unit
    without one), beyond what that unit's own kernels leave exposed; not its unit count times the mean
    layer's (before: the mean layer's count, of a transformer's tensors, which a traced graph has not)."""
    import dataclasses

    from tpsim.estimator.context import load_stack
    from tpsim.estimator.core import _patterns, layer_costs, run_stages

    model, cluster, roof = resnet
    plans = _batch(model, tp=[1], pp=[1, 4], zero=[3], micro_batch=[1], recompute=["none", "full"])
    ctx = graph_context(model, cluster, roof, stack=load_stack("deepspeed"))
    assert ctx.terms.zero3_per_parameter and ctx.terms.host_s_per_collective > 0
    # the tiny graph's tensors are all below DeepSpeed's threshold (1e5 elements): a lower one fetches some
    terms = dataclasses.replace(ctx.terms, zero3_persistence_elements=1000.0)
    shared = ctx
    ctx = dataclasses.replace(ctx, terms=terms)  # shares the remembered context's caches: cleared around its use
    shared.clear_results()
    try:
        costs_u, layer_keys = layer_costs(ctx, plans)
        pattern_of, part_u, _ = _patterns(ctx, plans, costs_u, layer_keys)
        costs, part = costs_u.for_plans(layer_keys.inverse), part_u.for_plans(pattern_of)
        est = run_stages(ctx, plans)
    finally:
        shared.clear_results()
    graph = model.graph
    fetches = np.zeros(len(graph.units))
    seen: set = set()
    for u, unit in enumerate(graph.units):
        for name in dict.fromkeys(p for op in unit.ops for p in op.params):
            if name not in seen:
                seen.add(name)
                fetches[u] += float(np.prod(graph.params[name])) >= terms.zero3_persistence_elements
    assert fetches.min() == 0 and fetches.max() > fetches.min()  # units differ
    f = ctx.fixed
    full = (plans.recompute == 2)[None, :] & costs.rerun_by_kind
    kernels = f.kernels(full, by_kind=True)
    device = costs.compute_by_kind + costs.recompute_by_kind + kernels * f.gap_s
    per_fetch = terms.host_s_per_collective + terms.host_s_per_collective_rank * plans.dp
    hooks = fetches[:, None] * per_fetch * (2.0 + full)
    host = kernels * f.host_s_per_op
    own = kernels * f.gap_s + np.maximum(host - device, 0.0) + np.maximum(host + hooks - device, 0.0) \
        - np.maximum(host - device, 0.0)
    ranks = part.ranks()
    per_rank = ranks.layer_sum(0.0, own) + ranks.layers * ctx.host_overhead_s
    m = plans.global_batch // (plans.micro_batch * plans.dp)
    got = est.overhead_s / m
    for i in range(len(plans.pp)):
        assert any(got[i] == pytest.approx(v, rel=1e-9) for v in per_rank[: plans.pp[i], i])
    # pp 4: not the slowest rank's unit count times the mean layer's fetches
    mean_hooks = ranks.layers * terms.zero3_fetches(ctx.model, ctx.source, 1) * per_fetch * (2.0 + (plans.recompute == 2))
    four = np.flatnonzero(plans.pp == 4)
    base = ranks.layer_sum(0.0, kernels * f.gap_s + np.maximum(host - device, 0.0)) + ranks.layers * ctx.host_overhead_s
    assert not np.any(np.isclose(got[four], (base + mean_hooks)[:4, four], rtol=1e-3))
