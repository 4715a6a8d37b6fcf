"""Estimator: JSON schema, breakdown identity, known formulas, invariants (hypothesis), batch == single."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.estimator import estimate, estimate_batch, model_flops_per_sequence
from tpsim.model import ModelSpec, get_preset, with_overrides
from tpsim.plan import Plan, PlanBatch, make_plan, plan_violation
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster

MEGATRON = load_stack("megatron")


@pytest.fixture(scope="module")
def a100_64():
    return load_cluster("dgx-a100", gpus=64)


def test_json_fields_and_breakdown_sums(a100_64):
    m = get_preset("llama3-70b")
    e = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=4, sp=True, recompute="selective", zero=1))
    d = e.to_dict()
    json.dumps(d)
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                "peak_memory_gib", "fits", "breakdown", "memory_gib"):
        assert key in d
    b = d["breakdown"]
    assert set(b) >= {"compute", "recompute", "bubble", "optimizer", "exposed_comm", "tp_comm", "pp_comm",
                      "dp_comm"}
    parts = b["compute"] + b["recompute"] + b["bubble"] + b["optimizer"] + b["exposed_comm"] + b["overhead"]
    assert parts == pytest.approx(d["step_time_s"], rel=1e-9)
    assert b["overhead"] > 0  # launch gaps of every kernel at least
    assert set(d["memory_gib"]) == {"weights", "grads", "optimizer_states", "activations", "cuda_context",
                                    "nccl_buffers", "allocator_reserve", "other"}
    assert sum(d["memory_gib"].values()) == pytest.approx(d["peak_memory_gib"], rel=1e-12)
    assert d["memory_gib"]["cuda_context"] > 0 and d["memory_gib"]["nccl_buffers"] > 0
    assert 0 < d["mfu"] <= d["hfu"] < 1


def test_model_flops_formula_gpt():
    m = get_preset("gpt3-175b")
    L, h, s, V = m.num_layers, m.hidden_size, m.seq_len, m.vocab_size
    expected = 72 * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_sequence(m) == pytest.approx(expected, rel=1e-12)


def test_memory_states_18_bytes_and_zero_sharding(a100_64):
    m = with_overrides(get_preset("gpt3-1.3b"), seq_len=512)
    base = estimate(m, a100_64, make_plan(m, 64, tp=1, pp=1, micro_batch=1, global_batch=64))
    n = m.total_params(1)
    gib = 2 ** 30
    assert base.memory_gib["weights"] * gib == pytest.approx(2 * n, rel=1e-6)
    assert base.memory_gib["grads"] * gib == pytest.approx(4 * n, rel=1e-6)
    assert base.memory_gib["optimizer_states"] * gib == pytest.approx(12 * n, rel=1e-6)
    z1 = estimate(m, a100_64, make_plan(m, 64, tp=1, micro_batch=1, global_batch=64, zero=1))
    z3 = estimate(m, a100_64, make_plan(m, 64, tp=1, micro_batch=1, global_batch=64, zero=3))
    assert z1.memory_gib["optimizer_states"] == pytest.approx(base.memory_gib["optimizer_states"] / 64)
    assert z3.memory_gib["weights"] == pytest.approx(base.memory_gib["weights"] / 64)


def test_activation_memory_matches_korthikanti(a100_64):
    """TP only: s b h (10 + 24/t + 5 a s/(h t)) per layer; TP+SP: s b h (34/t + 5 a s/(h t))."""
    from tpsim.estimator.memory import activation_bytes_per_layer
    m = get_preset("gpt3-175b")
    s, h, a, t, b = m.seq_len, m.hidden_size, m.num_attention_heads, 8, 1
    kw = dict(tp=np.array([t]), micro_batch=np.array([b]), recompute=np.array([0]), attention="unfused",
              act_bytes=2)
    tp_only = activation_bytes_per_layer(m, sp=np.array([False]), **kw)[0]
    tp_sp = activation_bytes_per_layer(m, sp=np.array([True]), **kw)[0]
    assert tp_only == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-9)
    assert tp_sp == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)), rel=1e-9)
    sel = activation_bytes_per_layer(m, sp=np.array([True]), **{**kw, "recompute": np.array([1])})[0]
    assert sel == pytest.approx(34 * s * b * h / t, rel=1e-9)


def test_batch_equals_single(a100_64):
    m = get_preset("llama3-8b")
    plans = [make_plan(m, 64, tp=tp, pp=pp, sp=tp > 1, recompute=rc, micro_batch=mb)
             for tp in (1, 2, 8) for pp in (1, 2) for rc in ("none", "full") for mb in (1, 2)]
    batch = estimate_batch(m, a100_64, PlanBatch.from_plans(plans))
    for i, p in enumerate(plans):
        single = estimate(m, a100_64, p)
        assert batch.step_time_s[i] == single.step_time_s
        assert batch.peak_memory_gib[i] == single.peak_memory_gib


def test_cross_node_tp_is_costed_and_slower(a100_64):
    m = get_preset("gpt3-175b")
    m = with_overrides(m, layers=16)
    inside = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=2, global_batch=64))
    across = estimate(m, a100_64, make_plan(m, 64, tp=16, pp=1, global_batch=64))
    assert across.breakdown["tp_comm"] > 2 * inside.breakdown["tp_comm"]
    assert any("spans 2 nodes" in w for w in across.warnings)


def test_sp_reduces_activation_memory(a100_64):
    m = get_preset("llama3-70b")
    no_sp = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=4, sp=False))
    sp = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=4, sp=True))
    assert sp.memory_gib["activations"] < no_sp.memory_gib["activations"]


# ---- invariants over random valid models and plans -------------------------------------------------------
@st.composite
def model_and_plan(draw):
    family = draw(st.sampled_from(["gpt", "llama"]))
    heads = draw(st.sampled_from([8, 16, 32]))
    head_dim = draw(st.sampled_from([64, 128]))
    kv = heads if family == "gpt" else draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    hidden = heads * head_dim
    m = ModelSpec(name="rand", family=family, num_layers=draw(st.integers(2, 24)), hidden_size=hidden,
                  num_attention_heads=heads, num_kv_heads=kv, ffn_hidden_size=draw(st.sampled_from([2, 3, 4])) *
                  hidden, vocab_size=draw(st.integers(1000, 60000)), seq_len=draw(st.sampled_from([256, 1024, 2048])),
                  max_positions=2048, norm="layernorm" if family == "gpt" else "rmsnorm",
                  activation="gelu" if family == "gpt" else "swiglu",
                  position="learned" if family == "gpt" else "rotary")
    gpus = 16
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([p for p in (1, 2) if p <= m.num_layers]))
    dp = gpus // (tp * pp)
    mb = draw(st.sampled_from([1, 2]))
    micro = draw(st.integers(1, 8)) * pp
    plan = Plan(tp=tp, pp=pp, dp=dp, sp=draw(st.booleans()) and tp > 1,
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                zero=draw(st.sampled_from([0, 1, 2, 3])) if dp > 1 else 0, micro_batch=mb,
                global_batch=mb * dp * micro, dtype=draw(st.sampled_from(["bf16", "fp16", "fp8"])),
                overlap=draw(st.booleans()), attention=draw(st.sampled_from(["flash", "unfused"])))
    if plan_violation(m, plan, gpus) or MEGATRON.plan_violation(plan, m):
        plan = Plan(tp=1, pp=1, dp=gpus, global_batch=gpus)
    return m, plan


@pytest.fixture(scope="module")
def h100_16():
    return load_cluster("dgx-h100", gpus=16)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_and_plan())
def test_times_finite_and_positive(h100_16, mp):
    m, plan = mp
    e = estimate(m, h100_16, plan)
    assert math.isfinite(e.step_time_s) and e.step_time_s > 0
    for k, v in e.breakdown.items():
        assert math.isfinite(v) and v >= 0, k
    assert math.isfinite(e.peak_memory_gib) and e.peak_memory_gib > 0
    if plan.tp == 1:
        assert e.breakdown["tp_comm"] == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_and_plan())
def test_higher_tp_never_raises_weight_memory(h100_16, mp):
    m, plan = mp
    if plan.pp != 1:
        return
    weights = []
    for tp in (1, 2, 4, 8):
        p = Plan(tp=tp, pp=1, dp=16 // tp, global_batch=16, zero=0)
        if plan_violation(m, p, 16) is None:
            weights.append(estimate(m, h100_16, p).memory_gib["weights"])
    assert all(b <= a + 1e-12 for a, b in zip(weights, weights[1:]))


@pytest.fixture(scope="module")
def bandwidth_pair(tmp_path_factory):
    """The same 32-GPU dgx-a100 cluster with HDR (25 GB/s) and with twice the InfiniBand bandwidth."""
    d = tmp_path_factory.mktemp("cal")
    slow, fast = d / "slow.yaml", d / "fast.yaml"
    slow.write_text("ib: {bw_GBps: 25.0}\nsource: test\n")
    fast.write_text("ib: {bw_GBps: 50.0}\nsource: test\n")
    return (load_cluster("dgx-a100", gpus=32, calibration=str(slow)),
            load_cluster("dgx-a100", gpus=32, calibration=str(fast)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_and_plan())
def test_more_link_bandwidth_never_slower(bandwidth_pair, mp):
    m, plan = mp
    dtype = "bf16" if plan.dtype == "fp8" else plan.dtype  # no fp8 on A100
    plan = Plan(**{**plan.to_dict(), "dp": plan.dp * 2, "global_batch": plan.global_batch * 2, "dtype": dtype})
    if plan_violation(m, plan, 32) or MEGATRON.plan_violation(plan, m):
        return
    slow, fast = bandwidth_pair
    t_slow = estimate(m, slow, plan).step_time_s
    t_fast = estimate(m, fast, plan).step_time_s
    assert t_fast <= t_slow * (1 + 1e-12)


def test_unsupported_dtype_is_an_input_error(a100_64):
    from tpsim.errors import InputError
    m = get_preset("llama3-8b")
    with pytest.raises(InputError, match="dtype=fp8 is not supported by A100-SXM4-80GB"):
        estimate(m, a100_64, make_plan(m, 64, dtype="fp8"))


def test_peak_memory_takes_the_busiest_pipeline_rank(a100_64):
    """10 layers on pp=4: ranks hold 2, 3, 3, 2 layers; rank 1 keeps pp - 1 = 3 micro-batches in flight, so its
    3 x 3 = 9 layer-micro-batches beat rank 0's 2 x 4 = 8 (1F1B; Megatron's warm-up counts)."""
    from tpsim.estimator.memory import activation_bytes_per_layer
    m = with_overrides(get_preset("gpt3-1.3b"), layers=10, vocab=128)  # embedding negligible
    plan = make_plan(m, 64, tp=2, pp=4, sp=True, recompute="none", micro_batch=1, global_batch=64)
    e = estimate(m, a100_64, plan)
    act = activation_bytes_per_layer(m, tp=np.array([2]), sp=np.array([True]), micro_batch=np.array([1]),
                                     recompute=np.array([0]), attention="flash", act_bytes=2)[0]
    assert e.memory_gib["activations"] * 2 ** 30 == pytest.approx(9 * act, rel=1e-9)


def test_interleaved_in_flight_is_capped_by_the_micro_batches(a100_64):
    m = get_preset("gpt3-175b")
    few = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=8, vpp=2, global_batch=8, micro_batch=1, zero=0))
    many = estimate(m, a100_64, make_plan(m, 64, tp=8, pp=8, vpp=2, global_batch=64, micro_batch=1, zero=0))
    # first rank: min(pp + (pp-1)/vpp, m) micro-batches of its 12 layers -> 8 (m=8) vs 11.5 (m=64)
    assert many.memory_gib["activations"] / few.memory_gib["activations"] == pytest.approx(11.5 / 8, rel=1e-6)
