"""Memory of mixture-of-experts plans: the routed experts' weights, gradients and optimizer states are ZeRO-sharded
over the expert data-parallel group edp = tp cp dp / (ep etp) (Megatron-Core's expert_data_parallel_group),
the dense parameters' over dp x cp; checked term by term against a hand count."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.estimator import estimate
from tpsim.estimator.memory import layer_expert_params_local
from tpsim.model import get_preset, with_overrides
from tpsim.plan import Plan
from tpsim.topology import load_cluster

GIB = 2 ** 30


@pytest.fixture(scope="module")
def mixtral():
    return with_overrides(get_preset("mixtral-8x7b"), layers=2, seq_len=1024)


@pytest.fixture(scope="module")
def h100_16():
    return load_cluster("dgx-h100", gpus=16)


def _expert_params(model, plan: Plan) -> float:
    """Routed-expert parameters one rank holds (pp = 1: every layer), by hand: E / ep experts of 3 h f / etp."""
    h, f = model.hidden_size, model.moe_ffn_hidden_size
    etp = plan.etp or plan.tp
    return model.num_layers * model.num_experts / plan.ep * 3 * h * f / etp


# tp 2 x cp 2 x dp 4 = 16 ranks; ep 4 x etp 1 leaves edp = 4, while dp x cp = 8
PLAN = Plan(tp=2, sp=True, cp=2, ep=4, etp=1, dp=4, pp=1, global_batch=8, micro_batch=1, zero=0)


def test_hand_count_of_local_expert_parameters(mixtral):
    x = layer_expert_params_local(mixtral, np.array([2]), mixtral.layer_kinds()[0], np.array([4]), np.array([1]))
    assert x[0] * mixtral.num_layers == pytest.approx(_expert_params(mixtral, PLAN))


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_expert_states_are_sharded_over_the_expert_data_parallel_group(mixtral, h100_16, zero):
    """Megatron bf16 (2 B weights, 4 B fp32 gradient buffer, 4 B master + 8 B Adam moments): dense parameters
    sharded over dp x cp = 8, routed experts over edp = 4 (the stage each ZeRO level shards)."""
    plan = dataclasses.replace(PLAN, zero=zero)
    assert plan.edp == 4 and plan.dp * plan.cp == 8
    e = estimate(mixtral, h100_16, plan)
    x = _expert_params(mixtral, plan)
    weights = e.memory_gib["weights"] * GIB
    total = weights * (8 if zero == 3 else 1) / 2.0 if zero < 3 else None
    if zero == 3:  # weights are sharded too: solve dense d from weights = 2 (d / 8 + x / 4)
        dense = (weights / 2.0 - x / 4) * 8
    else:
        dense = total - x
    assert dense > 0 and x > dense  # Mixtral: experts dominate
    dense_div, expert_div = 8, 4
    w_div = (dense_div, expert_div) if zero == 3 else (1, 1)
    g_div = (dense_div, expert_div) if zero >= 2 else (1, 1)
    o_div = (dense_div, expert_div) if zero >= 1 else (1, 1)
    for term, per, (dd, ed) in (("weights", 2.0, w_div), ("grads", 4.0, g_div),
                                ("optimizer_states", 12.0, o_div)):
        assert e.memory_gib[term] * GIB == pytest.approx(per * (dense / dd + x / ed), rel=1e-9), term


def test_expert_shard_is_not_the_dense_one(mixtral, h100_16):
    """Same dp x cp, different edp: only the experts' optimizer states change (edp 4 vs 8 by moving ep)."""
    a = estimate(mixtral, h100_16, dataclasses.replace(PLAN, zero=1))          # ep 4: edp 4
    b = estimate(mixtral, h100_16, dataclasses.replace(PLAN, zero=1, ep=2))    # ep 2: edp 8, twice the experts
    xa, xb = _expert_params(mixtral, PLAN), _expert_params(mixtral, dataclasses.replace(PLAN, ep=2))
    # experts held: 2x with ep 2, each rank's share of their states: 1/8 instead of 1/4, so equal bytes
    delta = (b.memory_gib["optimizer_states"] - a.memory_gib["optimizer_states"]) * GIB
    assert xb == 2 * xa and delta == pytest.approx(12.0 * (xb / 8 - xa / 4), abs=1.0)
    assert (b.memory_gib["weights"] - a.memory_gib["weights"]) * GIB == pytest.approx(2.0 * (xb - xa), rel=1e-9)


def test_expert_gradient_accumulation_runs_on_the_expert_shard(mixtral, h100_16, monkeypatch):
    """A stack without fused gradient accumulation (torchtitan) adds each micro-batch's gradients into the
    ZeRO-2 shard: the dense parameters' shard is 1 / (dp x cp), the routed experts' 1 / edp."""
    from tpsim.estimator import schedule as sched_mod

    calls = []
    real = sched_mod.grad_accumulation_seconds

    def spy(ctx, params, sharded, group, dtype):
        calls.append((np.asarray(params, dtype=float).copy(), np.asarray(group).copy()))
        return real(ctx, params, sharded, group, dtype)

    monkeypatch.setattr(sched_mod, "grad_accumulation_seconds", spy)
    plan = dataclasses.replace(PLAN, zero=2, etp=0)  # torchtitan: expert tp = tp, so edp = 16 / (4 x 2) = 2
    assert plan.edp == 2
    estimate(mixtral, h100_16, plan, stack="torchtitan")
    (dense, dense_group), (experts, expert_group) = calls
    assert int(dense_group[0]) == 8 and int(expert_group[0]) == 2
    per_layer = _expert_params(mixtral, dataclasses.replace(plan, etp=2)) / mixtral.num_layers
    assert experts[0] == pytest.approx(per_layer) and dense[0] > 0


# ---- layer kinds per pipeline rank (dense first layers + MoE layers) --------------------------------------------
def _deepseek(layers: int = 8):
    return dataclasses.replace(with_overrides(get_preset("deepseek-v3"), layers=layers, seq_len=1024),
                               mtp_layers=0)


def _parts(model, cluster, plan, stack=None):
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import layer_costs, plan_patterns
    from tpsim.plan import PlanBatch

    ctx = context_for(model, cluster, stack=stack)
    b = PlanBatch.from_plans([plan])
    costs, keys = layer_costs(ctx, b)
    part, _ = plan_patterns(ctx, b, costs, keys)
    return ctx, costs, part


def test_each_rank_stores_the_activations_of_its_own_layer_kinds(h100_16):
    """DeepSeek-V3 shape (3 dense layers first): with pp 2 the first rank holds 3 dense + 1 MoE layer, the last
    4 MoE layers; each stores its own layers' activations (not the model's mean layer x its layer count)."""
    from tpsim.pipeline import in_flight

    m = _deepseek(8)
    plan = Plan(tp=1, pp=2, ep=8, dp=8, global_batch=16, zero=1, dtype="bf16")
    ctx, costs, part = _parts(m, h100_16, plan)
    dense_act, moe_act = costs.activations_by_kind[:, 0]
    assert moe_act > dense_act
    e = estimate(m, h100_16, plan)
    mb = np.array([plan.global_batch // plan.dp])
    first = in_flight(np.array([0]), np.array([0]), np.array([2]), np.array([1]), mb)[0] * (3 * dense_act + moe_act)
    last = in_flight(np.array([0]), np.array([1]), np.array([2]), np.array([1]), mb)[0] * 4 * moe_act
    got = e.memory_gib["activations"] * GIB - costs.working[0]
    assert any(got == pytest.approx(x, rel=1e-9) for x in (first, last))
    mean = (3 * dense_act + 5 * moe_act) / 8  # the model's mean layer, which a rank's layer count would take
    assert not any(got == pytest.approx(4 * mean * k, rel=1e-6) for k in (1, 2))


@pytest.mark.parametrize("pp,vpp", [(2, 1), (4, 1), (3, 3), (16, 1)])
def test_torchtitan_split_counts_the_layers_each_rank_holds(pp, vpp):
    """torchtitan splits layers + 2 (embedding and output as one layer each) over pp x vpp chunks: the layers of
    each kind per rank must add up to the rank's layers of that split (dense first layers on the first rank)."""
    from tpsim.estimator.partition import layer_split, position_kind_counts, stage_layers

    m = get_preset("deepseek-v3")
    kinds = np.array([0 if i < m.first_dense_layers else 1 for i in range(m.num_layers)])
    if (m.num_layers + 2) % (pp * vpp) and vpp > 1:
        pytest.skip("torchtitan splits the layers alone here")
    counts = position_kind_counts(kinds, np.array([pp]), np.array([vpp]), edges_as_layers=True)[:, :, 0]
    split = stage_layers(m.num_layers, np.array([pp]), np.array([vpp]), edges_as_layers=True)
    assert sum(layer_split(m.num_layers, pp, vpp, True)) == m.num_layers
    assert counts[0].sum() == split.first[0]
    if pp > 1:
        assert counts[1].sum() == split.last[0]
    if pp > 2:
        assert counts[2].sum() == split.middle[0]
    if pp == 16:  # 63 slots: 4 per chunk, 3 for the last; the first chunk is the embedding + the 3 dense layers
        assert counts[0].tolist() == [3, 0] and counts[2].tolist() == [0, 4] and counts[1].tolist() == [0, 2]


def test_torchtitan_stage_parameters_follow_its_own_split(h100_16):
    """Under torchtitan the first rank of a pp-4 DeepSeek-V3-shaped model holds the embedding and layers 0-1
    (10 slots over 4 chunks: 3, 3, 2, 2), the last rank 1 layer and the output layer; the parameters of each
    rank are exactly its layers' of each kind."""
    m = _deepseek(8)
    plan = Plan(tp=1, pp=4, ep=4, dp=4, global_batch=16, zero=2, dtype="bf16")
    ctx, costs, part = _parts(m, h100_16, plan, stack="torchtitan")
    dense, moe = costs.params_by_kind[:, 0]
    emb = m.padded_vocab(1) * m.hidden_size
    assert part.layers[:, 0].tolist() == [2, 1, 3]
    assert part.params[0, 0] == pytest.approx(2 * dense + emb)
    assert part.params[2, 0] == pytest.approx(dense + 2 * moe)  # rank 1: layers 2 (dense), 3, 4


def test_slowest_pipeline_rank_is_timed_with_its_own_layer_kinds(h100_16):
    """Compute of the slowest rank: its dense and MoE layers each at their own time (megatron: no separate
    gradient accumulation), plus its edge (embedding on the first rank, output layer and loss on the last)."""
    m = _deepseek(8)
    plan = Plan(tp=1, pp=2, ep=8, dp=8, global_batch=16, zero=1, dtype="bf16")
    ctx, costs, part = _parts(m, h100_16, plan)
    dense_t, moe_t = costs.compute_by_kind[:, 0]
    first = 3 * dense_t + moe_t + costs.first.fwd[0] + costs.first.bwd[0]
    last = 4 * moe_t + costs.last.fwd[0] + costs.last.bwd[0]
    e = estimate(m, h100_16, plan)
    assert e.breakdown["compute"] == pytest.approx(plan.global_batch // plan.dp * max(first, last), rel=1e-6)


def test_multi_token_prediction_on_the_last_rank(h100_16):
    """DeepSeek-V3's MTP module sits on the last rank: one MoE layer (its routed experts sharded like the other
    experts: over edp), the 2h -> h projection and two norms, and a copy of the input embedding (Megatron-Core
    builds the embedding on the MTP stage); with pp = 1 that copy is the first edge's embedding itself."""
    m = dataclasses.replace(_deepseek(8), mtp_layers=1)
    h = m.hidden_size
    emb = m.padded_vocab(1) * h
    plan = Plan(tp=1, pp=2, ep=8, dp=8, global_batch=16, zero=1, dtype="bf16")
    _, costs, part = _parts(m, h100_16, plan)
    dense, moe = costs.params_by_kind[:, 0]
    moe_experts = costs.expert_by_kind[1, 0]
    output = emb + h  # output layer + final RMSNorm
    mtp = moe + 2 * h * h + 2 * h
    assert part.params[1, 0] == pytest.approx(4 * moe + output + mtp + emb)
    assert part.expert[1, 0] == pytest.approx(5 * moe_experts)
    single = Plan(tp=1, pp=1, ep=8, dp=16, global_batch=16, zero=1, dtype="bf16")
    _, costs1, part1 = _parts(m, h100_16, single)
    dense1, moe1 = costs1.params_by_kind[:, 0]
    assert part1.params[0, 0] == pytest.approx(3 * dense1 + 5 * moe1 + emb + output + moe1 + 2 * h * h + 2 * h)


def test_expert_gemms_pay_their_fp8_casts(mixtral, h100_16):
    """Issue 19: each routed expert GEMM casts its input (forward) and its output gradient (backward) to fp8 as
    the dense linears do; the extra time is exactly the streamed cast bytes of the routed copies, and nothing
    is added in bf16."""
    from tpsim.compute.training import training_compute
    from tpsim.estimator.layer import _Acc, streamed
    from tpsim.estimator.moe import add_expert_compute, expert_shape

    compute = training_compute(h100_16.device)[0]
    one = np.ones(1, dtype=np.int64)
    shape = expert_shape(mixtral, tokens_total=np.array([4096.0]), tp=one, sp=np.zeros(1, dtype=bool),
                         ep=8 * one, etp=one)
    cast = (2.0, 4.0)

    def run(dtype, c):
        f, b = _Acc(1), _Acc(1)
        add_expert_compute(f, b, compute, mixtral, shape, dtype, c)
        return f.t[0], b.t[0]

    (f0, b0), (f1, b1) = run("fp8", None), run("fp8", cast)
    h, ff = float(mixtral.hidden_size), float(shape.ffn_local[0])
    copies = float(shape.copies[0])
    t = lambda nbytes: float(np.asarray(streamed(compute, nbytes, "fp8")[0]).ravel()[0])  # noqa: E731
    gate_up = (2 if mixtral.gated else 1) * ff
    want_f = t(copies * h * cast[0]) + t(copies * ff * cast[0])        # the two GEMMs' inputs
    want_b = t(copies * gate_up * cast[1]) + t(copies * h * cast[1])   # their output gradients
    assert f1 - f0 == pytest.approx(want_f, rel=1e-9) and want_f > 0
    assert b1 - b0 == pytest.approx(want_b, rel=1e-9)
    assert run("bf16", cast) == run("bf16", None)
