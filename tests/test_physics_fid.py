"""Issue 19 physics (the `fid` part): TP communication pipelined with the GEMMs (plan field ``tp_overlap``),
each behaviour against its own formula or the plan without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.estimator import estimate
from tpsim.estimator.comm import tp_overlap_exposed
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster


@pytest.fixture(scope="module")
def gpt():
    model = with_overrides(load_model("gpt3-175b"), layers=8, hidden=7168, heads=56)
    return model, load_cluster("dgx-h100", gpus=16)


@settings(max_examples=60, deadline=None)
@given(total=st.floats(0, 10), work=st.floats(0, 10), tp=st.integers(1, 64))
def test_tp_overlap_exposes_one_chunk_and_what_the_gemms_cannot_cover(total, work, tp):
    x = float(tp_overlap_exposed(np.array([total]), np.array([work]), np.array([tp]))[0])
    assert total / tp - 1e-12 <= x <= total + 1e-12  # never more than serial, never less than one chunk
    if work >= total:
        assert x == pytest.approx(total / tp)
    assert x == pytest.approx(total / tp + max(total * (1 - 1 / tp) - work, 0.0))


def test_tp_overlap_hides_tp_communication_and_changes_nothing_else(gpt):
    model, cluster = gpt
    plan = make_plan(model, 16, tp=8, pp=1, sp=True, zero=1, global_batch=32)
    off = estimate(model, cluster, plan)
    on = estimate(model, cluster, dataclasses.replace(plan, tp_overlap=True))
    assert on.breakdown["tp_comm"] == pytest.approx(off.breakdown["tp_comm"])  # same traffic
    assert on.breakdown["compute"] == pytest.approx(off.breakdown["compute"])
    assert on.breakdown["exposed_comm"] < off.breakdown["exposed_comm"]
    assert on.step_time_s < off.step_time_s
    assert on.peak_memory_gib == pytest.approx(off.peak_memory_gib)
    # tp = 1: nothing to overlap, the plan field changes nothing
    one = make_plan(model, 16, tp=1, pp=1, sp=False, zero=1, global_batch=32)
    assert estimate(model, cluster, dataclasses.replace(one, tp_overlap=True)).step_time_s == pytest.approx(
        estimate(model, cluster, one).step_time_s)


def test_deepspeed_2021_gathers_three_times_serially_and_pays_each_fetch():
    """SC21 Table 2's ZeRO-3: the 2021 profile re-gathers for the recomputed forward, does not hide the
    collectives and pays its per-fetch time on the critical path; today's deepspeed profile prefetches."""
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    model = with_overrides(load_model("gpt3-175b"), layers=4, vocab=51200)
    cluster = load_cluster("selene", gpus=64)
    plan = make_plan(model, 64, tp=1, pp=1, sp=False, zero=3, recompute="full", micro_batch=1, global_batch=64,
                     dtype="fp16")
    old = estimate(model, cluster, plan, stack="deepspeed-2021")
    new = estimate(model, cluster, plan, stack="deepspeed")
    terms = stack_terms(load_stack("deepspeed-2021"))
    assert terms.zero3_regather_in_recompute and terms.zero3_overlap_fraction == 0.0
    assert old.breakdown["dp_comm"] > new.breakdown["dp_comm"]  # the third gather
    assert old.breakdown["compute"] == pytest.approx(new.breakdown["compute"])
    # serialized: every second of ZeRO-3 traffic is exposed, plus 3 fetches per weight tensor and layer
    fetches = 3 * 4 * terms.zero3_collectives_per_layer(model, 1)
    per_fetch = terms.host_s_per_collective + terms.host_s_per_collective_rank * 64
    assert old.breakdown["exposed_comm"] >= 0.9 * old.breakdown["dp_comm"]  # (edge shards still prefetched)
    assert old.breakdown["overhead"] - new.breakdown["overhead"] >= 0.99 * fetches * per_fetch - 1e-3
    assert old.step_time_s > new.step_time_s


@pytest.mark.parametrize("fields", [
    dict(tp=8, pp=2, sp=True, zero=1, global_batch=64, tp_overlap=True),
    dict(tp=2, pp=4, vpp=2, sp=True, zero=1, recompute="full", global_batch=64),
    dict(tp=1, pp=1, sp=False, zero=3, global_batch=64),
])
def test_terms_sum_to_the_step_time_and_name_their_source(fields):
    model = with_overrides(load_model("llama3-8b"), layers=8)
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, **fields)
    e = estimate(model, cluster, plan, stack="torchtitan" if fields["zero"] == 3 else None)
    assert list(e.terms) == ["compute", "recompute", "bubble", "optimizer", "overhead", "tp_comm", "cp_comm",
                             "ep_comm", "pp_comm", "dp_comm"]
    assert sum(e.terms.values()) == pytest.approx(e.step_time_s, rel=1e-9)
    assert sum(e.terms[k] for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")) == pytest.approx(
        e.breakdown["exposed_comm"], rel=1e-9, abs=1e-12)
    assert all(v >= 0 for v in e.terms.values())
    d = e.to_dict()["terms"]
    assert set(d) == set(e.terms) and all(d[k]["source"] for k in d)
    assert "efficiency.yaml" in d["compute"]["source"] and "hopper" in d["compute"]["source"]
    if plan.tp > 1:
        assert e.terms["tp_comm"] > 0 and "tp:" in d["tp_comm"]["source"]


def test_estimate_explain_prints_each_term_with_its_source(capsys):
    from tpsim.cli import main

    assert main(["estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "step time terms" in out
    for name in ("compute", "bubble", "optimizer", "overhead", "tp_comm", "dp_comm"):
        assert f"  {name} " in out
    assert "gemm_in_situ_fraction" in out and "optimizer_bytes_per_param" in out


def test_torchtitan_per_op_sac_saves_every_other_matmul_and_recomputes_the_rest():
    """torchtitan's selective (per-op) AC against Megatron's selective on the same plan: less stored (the
    layer's unsaved matmul outputs, norms and activations are rebuilt), more recomputed (every second matmul)."""
    from tpsim.estimator.memory import activation_bytes_per_layer, per_op_matmuls, per_op_saved

    model = load_model("llama3-8b")
    assert per_op_matmuls(model) == ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
    assert per_op_saved(model) == ("wq", "wv", "w1", "w2")
    one = np.array([1])
    kw = dict(tp=one, sp=np.array([False]), micro_batch=np.array([2]), recompute=np.array([1]), attention="flash",
              act_bytes=2)
    sac = activation_bytes_per_layer(model, per_op=True, **kw)[0]
    T, h = 2 * 8192, 4096
    # layer input, wq, wv, SDPA output, w1, w2 outputs (16-bit) and the fp32 log-sum-exp
    expected = 2 * T * (h + h + 1024 + h + 14336 + h) + 2 * 32 * 8192 * 4
    assert sac == pytest.approx(expected)
    assert sac < activation_bytes_per_layer(model, **kw)[0]
    small = with_overrides(model, layers=4)
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(small, 8, tp=1, pp=1, sp=False, zero=3, recompute="selective", micro_batch=2, global_batch=16)
    from tpsim.estimator import context_for, run_stages
    from tpsim.plan import PlanBatch
    from tpsim.stacks import load_stack
    titan = estimate(small, cluster, plan, stack="torchtitan")
    megatron_like = run_stages(context_for(small, cluster, stack=load_stack("deepspeed")),
                               PlanBatch.from_plans([plan])).to_estimate(0)
    assert titan.breakdown["recompute"] > megatron_like.breakdown["recompute"]
    assert titan.memory_gib["activations"] < megatron_like.memory_gib["activations"]


def test_logits_bytes_follow_the_stack_loss():
    """torchtitan's eager fp32 loss holds 10 B per logit, llm-foundry's fused in-place loss 2 B (the last
    stage's buffer term, 'other')."""
    model = with_overrides(load_model("llama3-8b"), layers=2)
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(model, 8, tp=1, pp=1, sp=False, zero=3, recompute="full", micro_batch=1, global_batch=8)
    titan = estimate(model, cluster, plan, stack="torchtitan").memory_gib["other"]
    foundry = estimate(model, cluster, plan, stack="llm-foundry").memory_gib["other"]
    logits = 8192 * model.padded_vocab(1) / 2 ** 30
    assert titan - foundry == pytest.approx(8 * logits, rel=1e-6)


def test_ring_attention_pays_a_merge_per_step_after_the_first():
    """The ring's partial-softmax merge: (cp - 1) x heads x tokens x head_dim elements at RING_MERGE_BYTES,
    forward and backward, on top of the blocks' flash time."""
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import RING_MERGE_BYTES, layer_cost

    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    compute, _ = default_compute(cluster.device, resolve_stack("torchtitan"))
    one = np.array([1])
    common = dict(tp=one, sp=np.array([False]), micro_batch=one, recompute=np.array([0]), dtype="bf16",
                  attention="flash", cp_kind=np.array([0]))
    cost = {cp: layer_cost(model, compute, cp=np.array([cp]), **common) for cp in (1, 4)}
    n = model.seq_len / 4
    merge = float(np.ravel(compute.memory("residual_add", 3 * 32 * n * 128 * RING_MERGE_BYTES / 6.0, "bf16", False)[0])[0])
    assert merge > 0
    # the cp=4 layer: a quarter of the GEMMs, the ring's blocks, plus the merge in each direction
    assert cost[4].fwd[0] > cost[4].ring_fwd[0] + merge


def test_moe_balance_is_an_input():
    """--moe-balance (T2): forced = no imbalance, a factor F puts the busiest expert at F x the mean, aux the
    measured router imbalance; bad values and dense models are one line, exit 2."""
    from tpsim.cli import main
    from tpsim.errors import InputError
    from tpsim.estimator.moe import load_imbalance
    from tpsim.model.overrides import with_moe_balance

    model = load_model("mixtral-8x7b")
    assert model.moe_balance == "aux"
    ep, routed = np.array([1, 4, 8]), np.array([4096.0] * 3)
    assert np.all(load_imbalance(with_moe_balance(model, "forced"), ep=ep, routed=routed) == 1.0)
    two = load_imbalance(with_moe_balance(model, "2"), ep=ep, routed=routed)
    assert two == pytest.approx([1.0, 1.0 + 1.0 / 2, 2.0])
    aux = load_imbalance(model, ep=ep, routed=routed)
    assert aux[0] == 1.0 and np.all(aux[1:] > 1.0)
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=1, pp=4, ep=8, sp=False, zero=1, global_batch=64)
    steps = {b: estimate(with_moe_balance(model, b), cluster, plan).step_time_s for b in ("forced", "1.2", "aux")}
    assert steps["forced"] < steps["1.2"] < steps["aux"]
    for bad in ("0.5", "nan", "abc", "-1"):
        with pytest.raises(InputError, match="--moe-balance"):
            with_moe_balance(model, bad)
    with pytest.raises(InputError, match="dense"):
        with_moe_balance(load_model("llama3-8b"), "forced")
    assert main(["estimate", "--model", "mixtral-8x7b", "--moe-balance", "x"]) == 2


def test_eager_stacks_cost_unfused_elementwise_traffic():
    """compute.kernels: eager (torchtitan without compile): norms and the SwiGLU run as chains of elementwise
    kernels (efficiency.yaml eager_bytes_per_element); GEMMs and attention unchanged."""
    from tpsim.compute.eager import EagerKernels, eager_ratios
    from tpsim.estimator.context import default_compute, resolve_stack

    cluster = load_cluster("dgx-h100", gpus=8)
    base, _ = default_compute(cluster.device, resolve_stack("torchtitan"))
    eager = EagerKernels(base)
    ratios = eager_ratios()
    assert ratios["rmsnorm"][0] > 1 and ratios["swiglu"][1] > 1 and "residual_add" not in ratios
    n = np.array([1e8])
    for backward in (False, True):
        assert eager.memory("rmsnorm", n, "bf16", backward)[0][0] == pytest.approx(
            base.memory("rmsnorm", n, "bf16", backward)[0][0] * ratios["rmsnorm"][int(backward)])
        assert eager.memory("residual_add", n, "bf16", backward)[0][0] == pytest.approx(
            base.memory("residual_add", n, "bf16", backward)[0][0])
    assert eager.gemm(4096, 4096, 4096, "bf16")[0] == pytest.approx(base.gemm(4096, 4096, 4096, "bf16")[0])
    model = with_overrides(load_model("llama3-8b"), layers=4)
    plan = make_plan(model, 8, tp=1, pp=1, sp=False, zero=3, recompute="full", global_batch=8)
    e = estimate(model, cluster, plan, stack="torchtitan")
    assert "eager" not in e.compute_model  # the source name stays kernel:<attention>
    assert e.breakdown["compute"] > estimate(model, cluster, plan, compute=base, stack="torchtitan").breakdown["compute"]


def test_fp8_casts_cost_their_traffic_per_the_stack_recipe():
    """fp8 GEMMs pay the casts of each linear's input and output gradient (compute.fp8_cast_bytes_per_element:
    Transformer Engine's delayed scaling 2/4 B; torchao's dynamic scaling also recasts the saved 16-bit input in
    backward, eager 5/10/5 B, compiled 3/4/3 B); bf16 plans pay nothing."""
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    assert stack_terms(load_stack("megatron")).fp8_cast_bytes == (2.0, 4.0, 0.0)
    assert stack_terms(load_stack("torchtitan")).fp8_cast_bytes == (5.0, 10.0, 5.0)
    assert stack_terms(load_stack("torchtitan-compile")).fp8_cast_bytes == (3.0, 4.0, 3.0)
    assert stack_terms(load_stack("deepspeed")).fp8_cast_bytes == (0.0, 0.0, 0.0)
    model = with_overrides(load_model("llama3-8b"), layers=4)
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(model, 8, tp=1, pp=1, sp=False, zero=1, global_batch=8, dtype="fp8")
    from tpsim.estimator import context_for, run_stages
    from tpsim.plan import PlanBatch
    from tpsim.stacks import profile_from_mapping
    from tpsim.topology.files import read_yaml
    from pathlib import Path
    raw = read_yaml(Path(load_stack("megatron").path) if hasattr(load_stack("megatron"), "path") else
                    Path(__file__).resolve().parents[1] / "tpsim" / "data" / "stacks" / "megatron.yaml")
    raw = dict(raw)
    raw["compute"] = dict(raw["compute"])
    raw["compute"]["fp8_cast_bytes_per_element"] = {"value": {"forward": 0, "backward": 0}, "source": "test"}
    free = profile_from_mapping(raw, "no-cast")
    with_cast = estimate(model, cluster, plan)
    without = run_stages(context_for(model, cluster, stack=free), PlanBatch.from_plans([plan])).to_estimate(0)
    assert with_cast.breakdown["compute"] > without.breakdown["compute"]
    bf16 = dataclasses.replace(plan, dtype="bf16")
    assert estimate(model, cluster, bf16).breakdown["compute"] == pytest.approx(
        run_stages(context_for(model, cluster, stack=free), PlanBatch.from_plans([bf16])).to_estimate(0)
        .breakdown["compute"])


def test_the_output_head_stays_bf16_in_fp8_training():
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import HEAD_DTYPE, edge_cost

    assert HEAD_DTYPE == {"fp8": "bf16"}
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    compute, _ = default_compute(cluster.device, resolve_stack("megatron"))
    one = np.array([1])
    kw = dict(tp=one, sp=np.array([False]), micro_batch=one)
    fp8, bf16 = edge_cost(model, compute, dtype="fp8", **kw), edge_cost(model, compute, dtype="bf16", **kw)
    assert fp8.last_fwd[0] == pytest.approx(bf16.last_fwd[0]) and fp8.last_bwd[0] == pytest.approx(bf16.last_bwd[0])


def test_eager_rotary_embedding_moves_the_float_upcast_chain():
    """torchtitan's eager apply_rotary_emb (float upcast, complex multiply, cast back) moves 10/3 of the fused
    rotary's traffic (efficiency.yaml eager_bytes_per_element.rotary over the residual_add kernel that times the
    fused one), found through a calibration's wrapper too; fused compute and models without rotary pay 1x."""
    from tpsim.compute.eager import EagerKernels, eager_ratios, rotary_ratio
    from tpsim.compute.scaled import ScaledCompute
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import rotary_seconds

    cluster = load_cluster("dgx-h100", gpus=8)
    base, _ = default_compute(cluster.device, resolve_stack("torchtitan"))
    eager = EagerKernels(base)
    assert eager_ratios()["rotary"] == pytest.approx((10 / 3, 10 / 3))
    assert rotary_ratio(base, False) == 1.0
    assert rotary_ratio(ScaledCompute(eager, memory=2.0), True) == pytest.approx(10 / 3)
    n = np.array([3e7])
    for backward in (False, True):
        assert rotary_seconds(eager, n, "bf16", backward)[0][0] == pytest.approx(
            base.memory("residual_add", n * 10 / 3, "bf16", backward)[0][0])
        assert rotary_seconds(base, n, "bf16", backward)[0][0] == pytest.approx(
            base.memory("residual_add", n, "bf16", backward)[0][0])
    rope = with_overrides(load_model("llama3-8b"), layers=4)
    plan = make_plan(rope, 8, tp=1, pp=1, sp=False, zero=3, recompute="none", global_batch=8)
    with_eager = estimate(rope, cluster, plan, stack="torchtitan").breakdown["compute"]
    fused_rotary = EagerKernels(base)  # the other eager kernels, the rotary at the fused traffic
    fused_rotary.ratios = {k: v for k, v in eager.ratios.items() if k != "rotary"}
    without = estimate(rope, cluster, plan, compute=fused_rotary, stack="torchtitan").breakdown["compute"]
    assert with_eager > without


def test_torchtitan_repeats_gqa_kv_heads_in_hbm():
    """compute.gqa_kv_repeat (torchtitan's repeat_kv before SDPA, eager and compiled): the layer pays a copy of
    K and V to the query heads' count forward and its sum back backward, 2 T (q + kv) elements moved each way
    on the residual_add kernel; nothing where kv heads = query heads; Megatron (TE's GQA kernels) pays none."""
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import layer_cost
    from tpsim.estimator.stackterms import stack_terms

    assert stack_terms(resolve_stack("torchtitan")).gqa_kv_repeat
    assert stack_terms(resolve_stack("torchtitan-compile")).gqa_kv_repeat
    assert not stack_terms(resolve_stack("megatron")).gqa_kv_repeat
    cluster = load_cluster("dgx-h100", gpus=8)
    compute, _ = default_compute(cluster.device, resolve_stack("torchtitan-compile"))
    one = np.ones(1)
    gqa = with_overrides(load_model("llama3-8b"), layers=2)
    mha = with_overrides(gqa, kv_heads=gqa.num_attention_heads)
    for model, repeats in ((gqa, True), (mha, False)):
        kw = dict(tp=one * 2, sp=np.array([True]), micro_batch=one, recompute=one * 0, dtype="bf16",
                  attention="flash", fused=False)
        on, off = layer_cost(model, compute, kv_repeat=True, **kw), layer_cost(model, compute, **kw)
        T = float(model.seq_len)
        q = model.num_attention_heads / 2 * model.head_dim
        kv = model.num_kv_heads / 2 * model.head_dim
        for phase, backward in (("fwd", False), ("bwd", True)):
            extra = compute.memory("residual_add", np.array([2 * T * (q + kv) / 3]), "bf16", backward)[0][0]
            assert getattr(on, phase)[0] - getattr(off, phase)[0] == pytest.approx(extra if repeats else 0.0)


def _stack_text(name: str) -> str:
    import pathlib

    import tpsim
    return (pathlib.Path(tpsim.__file__).parent / "data" / "stacks" / f"{name}.yaml").read_text()


def test_async_tp_pipelines_only_the_forward_tp_collectives(gpt, tmp_path):
    """torch async TP (torchtitan, comm.tp_overlap_phases [fwd]): the backward TP collectives stay as without it,
    so the same stack pipelining both phases (as Transformer Engine userbuffers do) hides more."""
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    assert stack_terms(load_stack("torchtitan-compile")).tp_overlap_phases == ("fwd",)
    assert stack_terms(load_stack("megatron")).tp_overlap_phases == ("fwd", "bwd")
    both = tmp_path / "both.yaml"
    both.write_text(_stack_text("torchtitan-compile").replace("value: [fwd]", "value: [fwd, bwd]"))
    model, _ = gpt
    cluster = load_cluster("dgx-h100", gpus=8)  # dp 1: no data-parallel traffic to take over the windows
    plan = make_plan(model, 8, tp=8, pp=1, sp=True, zero=0, global_batch=4)
    on = dataclasses.replace(plan, tp_overlap=True)
    off_b = estimate(model, cluster, plan, stack="torchtitan-compile").breakdown
    fwd_b = estimate(model, cluster, on, stack="torchtitan-compile").breakdown
    both_b = estimate(model, cluster, on, stack=str(both)).breakdown
    assert off_b["tp_comm"] == pytest.approx(fwd_b["tp_comm"]) == pytest.approx(both_b["tp_comm"])
    assert off_b["compute"] == pytest.approx(fwd_b["compute"])
    saved_fwd = off_b["exposed_comm"] - fwd_b["exposed_comm"]
    saved_both = off_b["exposed_comm"] - both_b["exposed_comm"]
    assert 0 < saved_fwd < saved_both
    assert saved_fwd < 0.6 * off_b["tp_comm"]  # the forward's share of the traffic at most


def test_tp_overlap_phases_must_name_phases(tmp_path):
    from tpsim.errors import InputError
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    bad = tmp_path / "bad.yaml"
    bad.write_text(_stack_text("torchtitan-compile").replace("value: [fwd]", "value: [forward]"))
    with pytest.raises(InputError, match="tp_overlap_phases"):
        stack_terms(load_stack(str(bad)))


def test_userbuffers_expose_only_the_last_split_of_the_forward_reduce_scatter(gpt, tmp_path):
    """megatron comm.tp_overlap_exposed_share: ring-exchange all-gathers and the backward's bulk overlaps expose
    no chunk, the pipelined forward reduce-scatter 1/4; without the figure every collective exposes 1/tp."""
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    shares = stack_terms(load_stack("megatron")).tp_overlap_exposed_share
    assert shares == {"fwd": {"all_gather": 0.0, "reduce_scatter": 0.25},
                      "bwd": {"all_gather": 0.0, "reduce_scatter": 0.0}}
    text = _stack_text("megatron")
    start = text.index("  tp_overlap_exposed_share:")
    end = text.index("  tp_backward_overlap:")
    plain = tmp_path / "plain.yaml"
    plain.write_text(text[:start] + text[end:])
    model, _ = gpt
    cluster = load_cluster("dgx-h100", gpus=8)
    for tp in (2, 8):  # 1/4 of the forward reduce-scatters is more than 1/8 of everything only at small tp
        plan = make_plan(model, 8, tp=tp, pp=1, sp=True, zero=0, global_batch=8, tp_overlap=True)
        te = estimate(model, cluster, plan, stack="megatron").to_dict()["terms"]["tp_comm"]["seconds"]
        one = estimate(model, cluster, plan, stack=str(plain)).to_dict()["terms"]["tp_comm"]["seconds"]
        assert te < one


def test_megatron_interleaved_sends_hide_behind_the_next_chunk(gpt, tmp_path):
    """comm.pp_overlap_interleaved (Megatron --overlap-p2p-communication): with vpp > 1 only the fill and the
    drain of the pipeline sends stay exposed; with vpp = 1 (no overlap in the plain 1F1B) all of them."""
    model, _ = gpt
    cluster = load_cluster("dgx-h100", gpus=16)
    off = tmp_path / "off.yaml"
    off.write_text(_stack_text("megatron").replace("  pp_overlap_interleaved:\n    value: true",
                                                   "  pp_overlap_interleaved:\n    value: false"))
    inter = make_plan(model, 16, tp=4, pp=4, vpp=2, sp=True, zero=0, global_batch=16)
    on_b = estimate(model, cluster, inter, stack="megatron").to_dict()["terms"]["pp_comm"]["seconds"]
    off_b = estimate(model, cluster, inter, stack=str(off)).to_dict()["terms"]["pp_comm"]["seconds"]
    m = 16 // 1
    assert on_b == pytest.approx(off_b * (4 - 1) / (m * 2 + 4 - 1))
    plain = make_plan(model, 16, tp=4, pp=4, sp=True, zero=0, global_batch=16)
    assert estimate(model, cluster, plain, stack="megatron").step_time_s == pytest.approx(
        estimate(model, cluster, plain, stack=str(off)).step_time_s)


def test_ring_steps_run_as_half_blocks_at_the_half_block_length():
    """Each ring step after the first is one SDPA call on half an n x n block (n queries on n/2 keys, or n/2
    queries on n keys), two non-causal n/2 x n/2 blocks per head, timed at the n/2 length the kernel runs."""
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import layer_cost

    model = with_overrides(load_model("llama3-8b"), seq_len=8192)
    compute, _ = default_compute(load_cluster("dgx-h100", gpus=8).device, resolve_stack("megatron"))
    one = np.array([1])
    for cp in (2, 4, 8):
        lc = layer_cost(model, compute, tp=one, sp=np.array([False]), micro_batch=one, recompute=np.array([0]),
                        dtype="bf16", attention="flash", cp=np.array([cp]), cp_kind=np.array([0]))
        n = model.seq_len / cp
        for backward, got in ((False, lc.ring_fwd), (True, lc.ring_bwd)):
            want = compute.attention(32 * 2 * (cp - 1), n / 2, 128, False, "bf16", backward)[0]
            assert float(np.ravel(got)[0]) == pytest.approx(float(np.ravel(want)[0]))
        first = compute.attention(32, n, 128, True, "bf16", False)[0]
        assert float(np.ravel(lc.ring_first_fwd)[0]) == pytest.approx(float(np.ravel(first)[0]))


def test_torch_ring_all_gathers_kv_once_and_rotates_fp32_gradients():
    """torchtitan (torch ALL_GATHER rotation, convert_to_f32): one all-gather of the cp repeated-head K/V
    blocks per pass, hidden behind the first step only; the fp32 dK/dV (twice the 16-bit bytes) go round the
    ring, all but the last hidden behind the next step. TE p2p keeps the per-step sends."""
    from tpsim.comm_plan import kv_block_bytes
    from tpsim.estimator.context import resolve_stack
    from tpsim.estimator.source import cp_layer_collectives
    from tpsim.estimator.stackterms import stack_terms

    tt, meg = stack_terms(resolve_stack("torchtitan")), stack_terms(resolve_stack("megatron"))
    assert tt.cp_ring.allgather and tt.cp_ring.grad_bytes == 4.0 and tt.cp_ring.overlapped
    assert not meg.cp_ring.allgather and meg.cp_ring.grad_bytes is None
    model, one, cp, lc, axes = _llama8b_ring_cp4_layer()
    kv = float(kv_block_bytes(model, tp=one, cp=cp, micro_batch=one, act_bytes=2.0)[0])
    rep = model.num_attention_heads / model.num_kv_heads
    ops = [c for c in cp_layer_collectives(model, lc, axes, np.array([0]), ring=tt.cp_ring, kv_repeat=True)
           if np.any(np.asarray(c.nbytes) > 0)]
    gathers = [c for c in ops if c.op == "all_gather"]
    assert [c.phase for c in gathers] == ["fwd", "bwd"]
    for c, first in zip(gathers, (lc.ring_first_fwd, lc.ring_first_bwd)):
        assert float(np.ravel(c.nbytes)[0]) == pytest.approx(4 * kv * rep)
        assert float(np.ravel(c.hide)[0]) == pytest.approx(float(np.ravel(first)[0]))
    sends = [c for c in ops if c.op == "send_recv"]
    assert all(c.phase == "bwd" and float(np.ravel(c.nbytes)[0]) == pytest.approx(2 * kv * rep) for c in sends)
    assert sorted(float(np.ravel(c.count)[0]) for c in sends) == [1.0, 3.0]
    assert min(float(np.ravel(c.hide)[0]) for c in sends) == 0.0  # the last one is awaited after the loop
    p2p = [c for c in cp_layer_collectives(model, lc, axes, np.array([0]), ring=meg.cp_ring) if np.any(np.asarray(c.nbytes) > 0)]
    assert {c.op for c in p2p} == {"send_recv"}
    moved = sum(float(np.ravel(c.nbytes)[0]) * float(np.ravel(c.count)[0]) for c in p2p)
    assert moved == pytest.approx(3 * kv + (2 * 3) * kv)  # forward cp-1 K/V, backward cp-1 K/V + cp-1 dK/dV


def test_cp_exchanges_hide_where_the_stacks_tp_collectives_do_not():
    """Eager torchtitan's TP collectives block (comm.tp_backward_overlap false) but its ring exchange is async:
    the exposed cp time is below the cp traffic. Under torch.compile (comm.cp_exchange_overlap false) each
    exchange is awaited where it is issued: all of it is exposed, the forward's twice under full
    recomputation."""
    model = with_overrides(load_model("llama3-8b"), layers=2, seq_len=32768)
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(model, 8, tp=1, pp=1, sp=False, zero=3, recompute="full", micro_batch=1, global_batch=2,
                     cp=4)
    est = estimate(model, cluster, plan, stack="torchtitan")
    assert est.breakdown["cp_comm"] > 0
    assert est.terms["cp_comm"] < 0.5 * est.breakdown["cp_comm"]
    compiled = estimate(model, cluster, plan, stack="torchtitan-compile")
    assert compiled.terms["cp_comm"] >= compiled.breakdown["cp_comm"] * (1.0 - 1e-9)


def test_compiled_ring_exchanges_hide_nothing():
    """comm.cp_exchange_overlap false (torchtitan-compile): every K/V all-gather and dK/dV send has hide 0, with
    the same bytes and counts as the eager stack's."""
    from tpsim.estimator.context import resolve_stack
    from tpsim.estimator.source import cp_layer_collectives
    from tpsim.estimator.stackterms import stack_terms

    eager, compiled = (stack_terms(resolve_stack(n)).cp_ring for n in ("torchtitan", "torchtitan-compile"))
    assert eager.overlapped and not compiled.overlapped
    model, one, cp, lc, axes = _llama8b_ring_cp4_layer()
    ops = {r: [c for c in cp_layer_collectives(model, lc, axes, np.array([0]), ring=ring, kv_repeat=True)
               if np.any(np.asarray(c.nbytes) > 0)] for r, ring in (("eager", eager), ("compiled", compiled))}
    assert sum(float(np.ravel(c.hide)[0]) for c in ops["eager"]) > 0
    assert all(float(np.ravel(c.hide)[0]) == 0.0 for c in ops["compiled"])
    assert [(c.op, c.phase, float(np.ravel(c.nbytes)[0]), float(np.ravel(c.count)[0])) for c in ops["eager"]] == \
        [(c.op, c.phase, float(np.ravel(c.nbytes)[0]), float(np.ravel(c.count)[0])) for c in ops["compiled"]]


def test_cp_exchange_overlap_must_be_a_boolean(tmp_path):
    """comm.cp_exchange_overlap takes true or false; anything else is a bad input naming the field."""
    from tpsim.errors import InputError
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import STACKS_DIR, load_stack

    text = (STACKS_DIR / "torchtitan-compile.yaml").read_text()
    bad = text.replace("  cp_exchange_overlap:\n    value: false", "  cp_exchange_overlap:\n    value: 'no'")
    assert bad != text
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(InputError, match="cp_exchange_overlap"):
        stack_terms(load_stack(str(path)))


def test_ring_working_set_holds_the_gathered_kv_and_the_gradients_in_flight():
    """The ring backward's transient bytes (source.ring_working_bytes): torch's all-gather holds cp K/V blocks
    (repeated heads with repeat_kv), the fp32 dQ accumulator, three fp32 dK/dV (accumulator, next message,
    received) and the step's 16-bit dQ, dK, dV; TE p2p two K/V blocks and two dK/dV; nothing without a ring
    (cp 1, or all-to-all)."""
    from tpsim.comm_plan import kv_block_bytes
    from tpsim.estimator.source import ring_working_bytes
    from tpsim.estimator.stackterms import RingExchange

    model = load_model("llama3-8b")
    one = np.array([1])
    for cp in (2, 8):
        cpa = np.array([cp])
        axes = dict(tp=one, cp=cpa, micro_batch=one, act_bytes=2.0)
        tokens = model.seq_len / cp
        q = tokens * model.num_attention_heads * model.head_dim  # query elements
        kv = float(kv_block_bytes(model, tp=one, cp=cpa, micro_batch=one, act_bytes=2.0)[0])
        rep = model.num_attention_heads / model.num_kv_heads
        torch_ring = RingExchange(allgather=True, grad_bytes=4.0)
        got = float(ring_working_bytes(model, axes, np.array([0]), torch_ring, kv_repeat=True)[0])
        krep = kv * rep
        assert got == pytest.approx(cp * krep + 4.0 * q + 3.0 * 2.0 * krep + (2.0 * q + krep))
        te = float(ring_working_bytes(model, axes, np.array([0]), RingExchange())[0])
        assert te == pytest.approx(2.0 * kv + 2.0 * q + 2.0 * kv + (2.0 * q + kv))
        assert float(ring_working_bytes(model, axes, np.array([1]), torch_ring)[0]) == 0.0
    assert float(ring_working_bytes(model, dict(tp=one, cp=one, micro_batch=one, act_bytes=2.0), np.array([0]),
                                    RingExchange())[0]) == 0.0


def test_ring_buffers_enter_the_activation_memory_of_ring_plans():
    """The ring's transient buffers enter the peak (the working set): a Megatron cp 8 ring plan holds exactly
    ring_working_bytes more activation memory than the same plan with all-to-all context parallelism (same
    stored activations per rank token, no ring buffers)."""
    from tpsim.estimator.source import ring_working_bytes
    from tpsim.estimator.stackterms import RingExchange
    from tpsim.units import GiB

    model = with_overrides(load_model("llama3-8b"), layers=2, seq_len=65536)
    cluster = load_cluster("dgx-h100", gpus=8)
    acts = {}
    for kind in ("ring", "a2a"):
        plan = make_plan(model, 8, tp=1, pp=1, sp=False, zero=1, recompute="full", micro_batch=1, global_batch=1,
                         cp=8, cp_kind=kind)
        acts[kind] = estimate(model, cluster, plan, stack="megatron").memory_gib["activations"]
    axes = dict(tp=np.array([1]), cp=np.array([8]), micro_batch=np.array([1]), act_bytes=2.0)
    ring = float(ring_working_bytes(model, axes, np.array([0]), RingExchange())[0]) / GiB
    assert ring > 0
    assert acts["ring"] - acts["a2a"] == pytest.approx(ring, rel=1e-6)


def test_per_op_sac_runs_the_tp_all_gathers_again_in_backward():
    """torchtitan's per-op selective checkpointing saves the reduce-scatters but not the all-gathers: with
    recompute=selective each block's forward all-gather runs once more in backward (bytes of one activation),
    with recompute=none it does not; Megatron's selective recomputation (the attention core) re-runs none."""
    from tpsim.estimator.context import context_for

    model = with_overrides(load_model("llama3-8b"), layers=2)
    cluster = load_cluster("dgx-h100", gpus=8)

    def backward_gathers(stack: str, rc: int) -> list[float]:
        ctx = context_for(model, cluster, None, stack=stack)
        keys = {k: np.array([v]) for k, v in dict(tp=8, sp=1, micro_batch=1, recompute=rc, cp=1, cp_kind=0,
                                                   schedule=0).items()}
        keys["sp"] = keys["sp"].astype(bool)
        costs = ctx.source.costs(ctx.compute, keys, "bf16", "flash")
        return [float(np.ravel(c.nbytes)[0]) for c in costs.comm
                if c.axes == ("tp",) and c.phase == "bwd" and c.op == "all_gather" and np.ravel(c.nbytes)[0] > 0]

    act = model.seq_len * model.hidden_size * 2.0
    tt_none, tt_sel = backward_gathers("torchtitan-compile", 0), backward_gathers("torchtitan-compile", 1)
    assert len(tt_sel) == len(tt_none) + 2 and sum(tt_sel) - sum(tt_none) == pytest.approx(2 * act)
    assert backward_gathers("megatron", 1) == backward_gathers("megatron", 0)


def test_fp8_weight_casts_skip_the_embedding_and_the_output_head():
    """The fp8 weight cast and transpose (2 x 1 B per parameter) are kept for the linears that run in fp8, not
    for the embedding, the output head and the final norm (they stay 16-bit: DeepSeek-V3 report 3.3.1,
    Megatron-Core's non-TE embedding and output layer)."""
    model = with_overrides(load_model("llama3-8b"), layers=4)
    cluster = load_cluster("dgx-h100", gpus=8)
    kw = dict(tp=1, pp=1, sp=False, zero=0, global_batch=8, micro_batch=1)
    bf16 = estimate(model, cluster, make_plan(model, 8, dtype="bf16", **kw), stack="megatron")
    fp8 = estimate(model, cluster, make_plan(model, 8, dtype="fp8", **kw), stack="megatron")
    params = bf16.memory_gib["weights"] * 2 ** 30 / 2.0
    edges = 2 * model.padded_vocab(1) * model.hidden_size + model.hidden_size
    cached = (fp8.memory_gib["weights"] - bf16.memory_gib["weights"]) * 2 ** 30
    assert cached == pytest.approx(2.0 * (params - edges), rel=1e-9)


def test_eager_ring_merge_moves_the_unfused_fp32_passes():
    """torchtitan without compile runs torch's _SDPAMerger as separate fp32 kernels: the forward merge moves
    RING_MERGE_BYTES_EAGER instead of RING_MERGE_BYTES per output element and step, the rest is the same."""
    from tpsim.compute.eager import EagerKernels
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import RING_MERGE_BYTES, RING_MERGE_BYTES_EAGER, layer_cost, streamed

    model = with_overrides(load_model("llama3-8b"), seq_len=16384)
    fused, _ = default_compute(load_cluster("dgx-h100", gpus=8).device, resolve_stack("torchtitan-compile"))
    eager = EagerKernels(fused)
    one, cp = np.array([1]), 4
    kw = dict(tp=one, sp=np.array([False]), micro_batch=one, recompute=np.array([0]), dtype="bf16",
              attention="flash", cp=np.array([cp]), cp_kind=np.array([0]))
    f, e = layer_cost(model, fused, **kw), layer_cost(model, eager, **kw)
    merged = (cp - 1) * 32 * (model.seq_len / cp) * 128
    extra = float(np.ravel(streamed(fused, merged * (RING_MERGE_BYTES_EAGER - RING_MERGE_BYTES), "bf16")[0])[0])
    eager_kernels = e.fwd[0] - f.fwd[0] - extra  # what EagerKernels adds to the norms and activations
    f1 = layer_cost(model, fused, **dict(kw, cp=np.array([1])))
    e1 = layer_cost(model, eager, **dict(kw, cp=np.array([1])))
    assert extra > 0
    assert eager_kernels == pytest.approx((e1.fwd[0] - f1.fwd[0]) / cp, rel=1e-6)  # tokens / cp


def test_cast_traffic_recasts_the_input_in_backward_where_the_recipe_says():
    """cast_traffic, the one formula of the linears' and experts' casts: input x forward figure; output
    gradient x backward figure plus input x backward_input figure (torchao recasts its saved 16-bit input)."""
    from tpsim.compute.quantize import cast_traffic

    f, b = cast_traffic((3.0, 4.0, 3.0), 10.0, 7.0, 5.0)
    assert (f, b) == (150.0, 10 * 7 * 4.0 + 150.0)
    assert cast_traffic((2.0, 4.0), 10.0, 7.0, 5.0) == (100.0, 280.0)


def _llama8b_ring_cp4_layer():
    """Llama-3 8B's layer at cp 4 (ring, repeated K/V heads, fp32 dK/dV) under torchtitan's compute model:
    (model, one, cp, layer cost, collective axes)."""
    from tpsim.estimator.context import default_compute, resolve_stack
    from tpsim.estimator.layer import layer_cost

    model = load_model("llama3-8b")
    compute, _ = default_compute(load_cluster("dgx-h100", gpus=8).device, resolve_stack("torchtitan"))
    one, cp = np.array([1]), np.array([4])
    lc = layer_cost(model, compute, tp=one, sp=np.array([False]), micro_batch=one, recompute=np.array([0]),
                    dtype="bf16", attention="flash", cp=cp, cp_kind=np.array([0]), kv_repeat=True, cp_grad_bytes=4.0)
    return model, one, cp, lc, dict(tp=one, cp=cp, micro_batch=one, act_bytes=2.0)


@settings(max_examples=60, deadline=None)
@given(total=st.floats(0, 10), work=st.floats(0, 10), tp=st.integers(1, 64), share=st.floats(0, 0.5),
       penalty=st.floats(0, 0.5))
def test_comm_kernels_sms_replace_the_generic_overlap_penalty(total, work, tp, share, penalty):
    """comm.tp_overlap_comm_sms: the hidden part of the pipelined transfers costs its kernels' SM share of
    itself instead of the generic overlap penalty the schedule charges every hidden second (layer_exposed)."""
    from tpsim.estimator.schedule import layer_exposed

    args = (np.array([total]), np.array([work]), np.array([tp]))
    plain = float(tp_overlap_exposed(*args)[0])
    hidden = min(total * (1 - 1 / tp), work)
    x = tp_overlap_exposed(*args, sm_share=share, penalty=penalty)
    after = float(layer_exposed(np.array([total]), np.zeros(1), x, np.zeros(1), np.zeros(1, bool), penalty)[0])
    assert after == pytest.approx(plain + share * hidden, abs=1e-9)
    # the generic penalty alone (no stack figure): the same as before
    before = float(layer_exposed(np.array([total]), np.zeros(1), tp_overlap_exposed(*args), np.zeros(1),
                                 np.zeros(1, bool), penalty)[0])
    assert before == pytest.approx(plain + penalty * (total - plain), abs=1e-9)
    assert float(tp_overlap_exposed(*args, sm_share=penalty, penalty=penalty)[0]) == pytest.approx(plain)


def _without_comm_sms(tmp_path):
    text = _stack_text("megatron")
    start = text.index("  tp_overlap_comm_sms:")
    end = text.index("  pp_overlap_interleaved:")
    path = tmp_path / "no_sms.yaml"
    path.write_text(text[:start] + text[end:])
    return path


def test_userbuffers_sms_slow_only_overlapped_plans(gpt, tmp_path):
    """megatron's Transformer Engine userbuffers defaults (16 SMs for pipelined and bulk overlaps, 1 for
    copy-engine ring exchanges) instead of the generic overlap penalty (0.15 s per hidden second, ~20 of 132
    SMs): with tp_overlap the exposed TP time falls, by less than the penalty's share of the traffic; compute
    and the rest are unchanged; without tp_overlap nothing changes."""
    from tpsim.estimator.comm import _sm_shares
    from tpsim.estimator.context import context_for
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    sms = stack_terms(load_stack("megatron")).tp_overlap_comm_sms
    assert sms == {"fwd": {"all_gather": 1.0, "reduce_scatter": 16.0},
                   "bwd": {"all_gather": 8.5, "reduce_scatter": 16.0}}
    assert stack_terms(load_stack("nemo")).tp_overlap_comm_sms == {}  # per-model ub configs: not a stack figure
    model, _ = gpt
    cluster = load_cluster("dgx-h100", gpus=8)
    ctx = context_for(model, cluster, stack="megatron")
    assert _sm_shares(ctx)["fwd"]["reduce_scatter"] == pytest.approx(16 / 132)
    plain = _without_comm_sms(tmp_path)
    plan = make_plan(model, 8, tp=8, pp=1, sp=True, zero=0, global_batch=8, tp_overlap=True)
    te = estimate(model, cluster, plan, stack="megatron").to_dict()["terms"]
    no = estimate(model, cluster, plan, stack=str(plain)).to_dict()["terms"]
    saved = no["tp_comm"]["seconds"] - te["tp_comm"]["seconds"]
    assert saved > 0
    serial = estimate(model, cluster, dataclasses.replace(plan, tp_overlap=False), stack="megatron")
    assert saved < 0.15 * serial.breakdown["tp_comm"]  # at most the generic penalty of the whole traffic
    for k in ("compute", "recompute", "optimizer", "dp_comm"):
        assert te[k]["seconds"] == pytest.approx(no[k]["seconds"])
    assert serial.step_time_s == pytest.approx(
        estimate(model, cluster, dataclasses.replace(plan, tp_overlap=False), stack=str(plain)).step_time_s)


def test_comm_sms_must_be_counts_per_phase_and_collective(tmp_path):
    from tpsim.errors import InputError
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.stacks import load_stack

    bad = tmp_path / "bad.yaml"
    bad.write_text(_stack_text("megatron").replace("reduce_scatter: 16}, bwd", "reduce_scatter: -16}, bwd"))
    with pytest.raises(InputError, match="tp_overlap_comm_sms"):
        stack_terms(load_stack(str(bad)))
