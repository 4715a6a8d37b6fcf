"""Context parallelism and mixtures of experts in the estimator: hand-computed collective volumes, invariants of
the new axes (hypothesis), and the physics they must show (cp divides the work, MoE FLOPs count active experts)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.comm_plan import bytes_by_axis, count_by_axis, cp_collectives, moe_collectives
from tpsim.estimator import estimate, estimate_batch
from tpsim.estimator.moe import load_imbalance, max_violation
from tpsim.model import get_preset, with_overrides
from tpsim.plan import Plan, PlanBatch, plan_violation
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster

GIB = 2 ** 30


@pytest.fixture(scope="module")
def h100():
    return {n: load_cluster("dgx-h100", gpus=n) for n in (8, 16, 32, 64, 128)}


def small_llama(seq: int = 8192):
    return with_overrides(get_preset("llama3-8b"), layers=4, seq_len=seq)


def small_mixtral(seq: int = 4096):
    return with_overrides(get_preset("mixtral-8x7b"), layers=4, seq_len=seq)


# ---- collective volumes, by hand ---------------------------------------------------------------------------
def test_ring_volumes_by_hand():
    m = small_llama(8192)  # 32 heads, 8 kv heads of 128
    plan = Plan(tp=2, cp=4, dp=1, sp=True, micro_batch=2, dtype="bf16")
    kv = 2 * 8192 / 4 * (8 / 2) * (128 + 128) * 2  # b s/cp tokens x local kv heads x (d_k + d_v) x 2 B
    ops = cp_collectives(m, plan)
    assert count_by_axis(ops) == {"cp": {"fwd": {"send_recv": 3}, "bwd": {"send_recv": 4}}}
    assert bytes_by_axis(ops) == {"cp": {"fwd": 3 * kv, "bwd": kv + 2 * (2 * kv) + kv}}
    assert all(o.overlap == "attention" for o in ops)


def test_ulysses_volumes_by_hand():
    m = small_llama(8192)
    plan = Plan(tp=2, cp=2, cp_kind="a2a", dp=1, sp=True, micro_batch=1)
    tokens = 8192 / 2
    q = tokens * 16 * 128 * 2  # 32 heads / tp 2
    kv = tokens * 4 * 128 * 2  # 8 kv heads / tp 2
    ops = cp_collectives(m, plan)
    assert count_by_axis(ops) == {"cp": {"fwd": {"all_to_all": 4}, "bwd": {"all_to_all": 4}}}
    assert sorted(o.nbytes for o in ops if o.phase == "fwd") == sorted([q, kv, kv, q])
    assert bytes_by_axis(ops)["cp"]["fwd"] == bytes_by_axis(ops)["cp"]["bwd"] == 2 * q + 2 * kv


def test_moe_volumes_by_hand():
    m = small_mixtral(4096)  # top-2, hidden 4096
    plan = Plan(tp=2, sp=True, cp=2, ep=4, etp=1, dp=4)
    routed = 4096 / 2 / 2  # b s / cp, split over tp by sequence parallelism
    a2a = routed * 2 * 4096 * 2
    ops = moe_collectives(m, plan)
    assert count_by_axis(ops) == {"ep": {"fwd": {"all_to_all": 2}, "bwd": {"all_to_all": 2}}}
    assert all(o.nbytes == a2a for o in ops)
    with_etp = moe_collectives(m, dataclasses.replace(plan, etp=2, ep=2))
    assert count_by_axis(with_etp)["etp"] == {"fwd": {"all_gather": 1, "reduce_scatter": 1},
                                              "bwd": {"all_gather": 1, "reduce_scatter": 1}}
    assert {o.nbytes for o in with_etp if o.axis == "etp"} == {2 * a2a}
    assert moe_collectives(get_preset("llama3-8b"), plan) == [] and cp_collectives(m, Plan()) == []


# ---- invariants --------------------------------------------------------------------------------------------
dense_plans = st.builds(
    dict, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), sp=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]), zero=st.sampled_from([0, 1, 2, 3]),
    micro_batch=st.sampled_from([1, 2]), order=st.sampled_from(["tp-dp-pp", "dp-tp-pp", "tp-pp-dp"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=dense_plans, kind=st.sampled_from(["ring", "a2a"]), etp_same=st.booleans())
def test_cp1_ep1_change_nothing(h100, fields, kind, etp_same):
    m = small_llama(4096)
    fields = dict(fields, sp=fields["sp"] and fields["tp"] > 1)
    dp = 64 // (fields["tp"] * fields["pp"])
    base = Plan(dp=dp, global_batch=dp * fields["micro_batch"] * 4, **fields)
    if plan_violation(m, base, 64) or load_stack().plan_violation(base, m):  # the default stack must run it
        return
    explicit = dataclasses.replace(base, cp=1, cp_kind=kind, ep=1, etp=base.tp if etp_same else 0)
    a, b = estimate(m, h100[64], base).to_dict(), estimate(m, h100[64], explicit).to_dict()
    a.pop("plan"), b.pop("plan")
    assert a == b


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), mb=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), kind=st.sampled_from(["ring", "a2a"]),
       moe=st.booleans(), zero=st.sampled_from([0, 1, 3]))
def test_more_cp_never_raises_activation_memory(h100, tp, pp, mb, recompute, kind, moe, zero):
    m = small_mixtral(8192) if moe else small_llama(8192)
    previous = math.inf
    for cp in (1, 2, 4):
        plan = Plan(tp=tp, cp=cp, cp_kind=kind, pp=pp, dp=8, sp=tp > 1, micro_batch=mb, recompute=recompute,
                    zero=zero, global_batch=16 * mb, ep=2 if moe else 1)
        if plan_violation(m, plan, plan.num_gpus) or load_stack().plan_violation(plan, m):
            continue
        e = estimate(m, h100[plan.num_gpus], plan)
        assert e.memory_gib["activations"] <= previous
        previous = e.memory_gib["activations"]


def test_cp_divides_the_work(h100):
    """cp ranks share one sequence: per-GPU compute halves (within kernel efficiency at half the tokens), the
    throughput per GPU stays close, the dense gradients are reduced over dp x cp."""
    m = small_llama(32768)
    one = estimate(m, h100[8], Plan(tp=8, sp=True, dp=1, global_batch=4))
    two = estimate(m, h100[16], Plan(tp=8, sp=True, cp=2, dp=1, global_batch=4, zero=1))
    assert 0.45 < two.breakdown["compute"] / one.breakdown["compute"] < 0.6
    assert two.breakdown["cp_comm"] > 0 and two.breakdown["dp_comm"] > 0 and one.breakdown["dp_comm"] == 0
    assert two.collectives["cp"].startswith("send_recv") and two.collectives["dp"].startswith("reduce_scatter")
    assert two.memory_gib["optimizer_states"] == pytest.approx(one.memory_gib["optimizer_states"] / 2)
    assert two.tokens_per_s / 16 > 0.8 * one.tokens_per_s / 8


def test_ring_exchange_hides_behind_attention_at_long_sequences(h100):
    """At 128k tokens a ring step's attention (half an n x n block) takes far longer than sending the n-token
    K/V block over NVLink: only the overlap penalty of the hidden exchange shows; Ulysses' all-to-alls are
    exposed."""
    m = small_llama(131072)
    ring = estimate(m, h100[8], Plan(tp=1, cp=8, dp=1, global_batch=1))
    assert ring.breakdown["cp_comm"] > 0 and ring.collectives["cp"].startswith("send_recv")
    assert ring.breakdown["exposed_comm"] < 0.2 * ring.breakdown["cp_comm"] + 0.2 * ring.breakdown["dp_comm"]
    a2a = estimate(m, h100[8], Plan(tp=1, cp=8, cp_kind="a2a", dp=1, global_batch=1))
    assert a2a.collectives["cp"].startswith("all_to_all")
    assert a2a.breakdown["exposed_comm"] > 0.9 * a2a.breakdown["cp_comm"]


def test_window_attention_is_cheaper_and_costed_per_layer(h100):
    m = with_overrides(get_preset("llama3-8b"), layers=4, seq_len=16384)
    windowed = dataclasses.replace(m, sliding_window=4096, architecture="mistral")
    plan = Plan(tp=8, sp=True, dp=1, global_batch=1)
    full, win = estimate(m, h100[8], plan), estimate(windowed, h100[8], plan)
    assert win.breakdown["compute"] < full.breakdown["compute"]
    half = dataclasses.replace(windowed, full_attention_layers=(1, 3))  # Gemma 2 style alternation
    mid = estimate(half, h100[8], plan)
    assert win.breakdown["compute"] < mid.breakdown["compute"] < full.breakdown["compute"]
    assert plan_violation(windowed, Plan(tp=8, sp=True, cp=2, dp=1, global_batch=1), 16).startswith("cp=2 with")


def test_moe_active_flops_and_expert_sharding(h100):
    m = small_mixtral(4096)
    assert m.active_params() <= m.total_params()
    plan = Plan(tp=1, ep=8, dp=8, pp=1, global_batch=8, zero=1)
    e = estimate(m, h100[8], plan)
    flops = 3 * m.forward_flops_per_token(causal=True) * e.tokens_per_s / 8  # the default convention: causal
    assert flops / 1e12 == pytest.approx(e.model_tflops_per_gpu, rel=1e-9)
    assert 6 * m.active_params() * m.seq_len <= 3 * m.seq_len * m.forward_flops_per_token() \
        < 6 * m.total_params() * m.seq_len
    ep1 = estimate(m, h100[8], dataclasses.replace(plan, ep=1))
    assert e.memory_gib["weights"] < ep1.memory_gib["weights"] / 3  # experts split 8 ways, attention whole
    assert e.breakdown["ep_comm"] > 0 and ep1.breakdown["ep_comm"] == 0


def test_load_imbalance_factor():
    mixtral, deepseek = get_preset("mixtral-8x7b"), get_preset("deepseek-v3")
    assert max_violation(deepseek) == 0.04 and max_violation(mixtral) == 0.52
    ep = np.array([1, 8, 64])
    f = load_imbalance(deepseek, ep=ep, routed=np.full(3, 32768.0))
    assert f[0] == 1.0 and 1.0 < f[1] < f[2] < 1.06
    dropped = dataclasses.replace(mixtral, capacity_factor=1.25)
    assert load_imbalance(dropped, ep=np.array([8]), routed=np.array([8192.0]))[0] == 1.25


def test_deepseek_v3_layers_and_parameters_per_rank(h100):
    """The first pipeline rank holds the three dense layers, so its parameters are the dense layers' exactly;
    the routed experts are sharded over ep and their states over the expert data-parallel group."""
    m = with_overrides(get_preset("deepseek-v3"), layers=8, seq_len=1024)
    m = dataclasses.replace(m, mtp_layers=0)
    plan = Plan(tp=1, pp=2, ep=4, dp=4, global_batch=8, zero=1, dtype="bf16", recompute="full")
    batch = estimate_batch(m, h100[8], PlanBatch.from_plans([plan]))
    assert batch.ep_comm_s[0] > 0
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import layer_costs, plan_patterns

    ctx = context_for(m, h100[8])
    b = PlanBatch.from_plans([plan])
    costs, keys = layer_costs(ctx, b)
    part, _ = plan_patterns(ctx, b, costs, keys)
    dense, moe = costs.params_by_kind[:, 0]
    emb = m.padded_vocab(1) * m.hidden_size
    assert part.params[0, 0] == pytest.approx(3 * dense + moe + emb)  # layers 0-3: 3 dense + 1 MoE
    assert part.expert[0, 0] == pytest.approx(costs.expert_by_kind[1, 0])
    assert part.expert[1, 0] == pytest.approx(4 * costs.expert_by_kind[1, 0])


@pytest.mark.parametrize("name", ["deepseek-v3", "gemma2"])
def test_identical_collectives_of_layer_kinds_merge_exactly(h100, monkeypatch, name):
    """Dense and MoE layers (DeepSeek-V3), windowed and global ones (Gemma 2) share their attention-block
    collectives: merged into one entry each, the estimate is the one of the kinds' collectives kept apart."""
    import tpsim.estimator.source as source
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import layer_costs
    from tpsim.model import load_model

    if name == "gemma2":
        m = with_overrides(load_model("tests/data/configs/gemma2.json"), layers=4, seq_len=4096)
        plans = [Plan(tp=2, cp=2, cp_kind="a2a", dp=4, sp=sp, micro_batch=1, global_batch=16) for sp in (False, True)]
    else:
        m = dataclasses.replace(with_overrides(get_preset("deepseek-v3"), layers=6, seq_len=2048), mtp_layers=0)
        plans = [Plan(tp=2, cp=2, ep=4, etp=etp, dp=4, sp=True, micro_batch=1, global_batch=16, dtype="bf16")
                 for etp in (1, 2)]
    batch = PlanBatch.from_plans(plans)
    merged = estimate_batch(m, h100[16], batch)
    n_merged = len(layer_costs(context_for(m, h100[16]), batch)[0].comm)
    monkeypatch.setattr(source, "_merged", lambda comm, tags: tuple(comm))
    apart = dataclasses.replace(m)  # another object: a new context, costed without the merge
    separate = estimate_batch(apart, h100[16], batch)
    assert len(layer_costs(context_for(apart, h100[16]), batch)[0].comm) > n_merged
    for field in ("step_time_s", "exposed_comm_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "peak_memory_gib"):
        np.testing.assert_allclose(getattr(merged, field), getattr(separate, field), rtol=1e-12, atol=0)
    assert merged.cp_comm_s.min() > 0 and merged.tp_comm_s.min() > 0
