"""Training-stack profiles in the estimator and the planner (issue 10): every behaviour a stack's figures change,
each against another stack or the physics' own formula; the planner's ``stack`` rejection reason; --stack on the
verbs; the Llama 3 405B plan's memory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import context_for, estimate, run_stages
from tpsim.estimator.stackterms import stack_terms
from tpsim.model import load_model, with_overrides
from tpsim.plan import Plan, PlanBatch, make_plan
from tpsim.search import SearchSpace, search
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster

PERMISSIVE = Path(__file__).resolve().parent / "data" / "permissive-stack.yaml"


def _run(model, cluster, plan, stack):
    """Estimate under ``stack`` without its rule check (to compare one plan across stacks)."""
    return run_stages(context_for(model, cluster, stack=stack), PlanBatch.from_plans([plan])).to_estimate(0)


@pytest.fixture(scope="module")
def small():
    model = with_overrides(load_model("llama3-8b"), layers=8)
    return model, load_cluster("dgx-h100", gpus=16)


def test_estimate_refuses_what_the_stack_cannot_run_and_names_the_stack(small):
    model, cluster = small
    plan = make_plan(model, 16, tp=2, pp=2, sp=True, zero=3, global_batch=64)
    with pytest.raises(InputError, match=r"stack megatron \(zero-with-pp\)"):
        estimate(model, cluster, plan)
    e = estimate(model, cluster, plan, stack="torchtitan")
    assert e.stack == "torchtitan" and e.to_dict()["stack"] == "torchtitan"
    assert estimate(model, cluster, make_plan(model, 16, tp=2, sp=True, zero=1, global_batch=64)).stack == "megatron"


def test_zero2_reduces_per_micro_batch_only_where_the_stack_does(small):
    """ZeRO-2 with pp: the megatron semantics (permissive test stack) reduce-scatter every micro-batch; torchtitan
    (torch pipelining turns gradient sync on for the last backward only) reduces once per step."""
    model, cluster = small
    plan = make_plan(model, 16, tp=2, pp=2, sp=True, zero=2, global_batch=64)  # dp 4, m 16
    per_mb = _run(model, cluster, plan, load_stack(PERMISSIVE))
    per_step = _run(model, cluster, plan, "torchtitan")
    assert plan.num_microbatches == 16
    # the reduction runs 16 times vs once; gathers and bytes per reduction are the same (both fp32)
    assert per_mb.breakdown["dp_comm"] > 5 * per_step.breakdown["dp_comm"]
    terms = stack_terms(load_stack("torchtitan"))
    assert not terms.reduces_per_microbatch(np.array([2]), np.array([2]))[0]
    assert terms.reduces_per_microbatch(np.array([2]), np.array([1]))[0]  # without pp: every micro-batch


def test_per_step_reduction_holds_a_full_gradient_buffer_unless_chunks_reduce_alone(small):
    model, cluster = small
    tt = load_stack("torchtitan")
    one_round = make_plan(model, 16, tp=2, pp=2, vpp=2, sp=True, zero=2, global_batch=8)    # m = 2 = pp
    two_rounds = make_plan(model, 16, tp=2, pp=2, vpp=2, sp=True, zero=2, global_batch=16)  # m = 4 > pp
    assert (one_round.num_microbatches, two_rounds.num_microbatches) == (2, 4)
    a, b = _run(model, cluster, one_round, tt), _run(model, cluster, two_rounds, tt)
    # one round: each chunk's backwards are contiguous, one chunk (half the rank) of fp32 gradients unsharded
    assert a.memory_gib["grads"] == pytest.approx(b.memory_gib["grads"] * (0.5 + 0.5 / 4), rel=1e-3)


def test_deepspeed_zero3_per_parameter_gathers_cost_latency_at_large_dp():
    """DeepSpeed gathers each weight tensor (4 per layer) where FSDP2 gathers the block once: the extra latency
    grows with the data-parallel group (at small dp DeepSpeed's bf16 gradient reduction moves half of FSDP2's fp32
    bytes and is cheaper; at large dp the per-collective latency dominates)."""
    model = with_overrides(load_model("llama3-8b"), layers=4)
    excess = []
    for gpus in (16, 512):
        cluster = load_cluster("dgx-a100", gpus=gpus)
        plan = make_plan(model, gpus, tp=1, pp=1, sp=False, zero=3, global_batch=gpus)
        ds, tt = _run(model, cluster, plan, "deepspeed"), _run(model, cluster, plan, "torchtitan")
        assert stack_terms(load_stack("deepspeed")).zero3_collectives_per_layer(model, 1) == 4
        excess.append(ds.breakdown["dp_comm"] / tt.breakdown["dp_comm"])
    assert excess[1] > 1.0 and excess[1] > excess[0]


def test_tp_backward_overlap_only_in_megatron(small):
    model, cluster = small
    plan = make_plan(model, 16, tp=8, pp=1, sp=True, zero=3, global_batch=16)  # dp 2; both stacks run it
    mg, tt = estimate(model, cluster, plan), estimate(model, cluster, plan, stack="torchtitan")
    assert stack_terms(load_stack("megatron")).tp_backward_overlap
    assert not stack_terms(load_stack("torchtitan")).tp_backward_overlap
    assert tt.breakdown["exposed_comm"] > mg.breakdown["exposed_comm"]


def test_eager_stacks_pay_more_fixed_cost_per_layer(small):
    model, cluster = small
    plan = make_plan(model, 16, tp=1, pp=1, sp=False, zero=3, micro_batch=1, global_batch=16)
    mg, tt = estimate(model, cluster, plan), estimate(model, cluster, plan, stack="torchtitan")
    assert tt.breakdown["overhead"] > mg.breakdown["overhead"] > 0


def test_unfused_gradient_accumulation_and_bf16_gradient_buffers_of_deepspeed():
    model = with_overrides(load_model("gpt3-1.3b"), layers=4)
    cluster = load_cluster("dgx-a100", gpus=8)
    plan = make_plan(model, 8, tp=1, pp=1, zero=1, micro_batch=1, global_batch=64)  # 8 micro-batches
    mg, ds = estimate(model, cluster, plan), estimate(model, cluster, plan, stack="deepspeed")
    assert ds.breakdown["compute"] > mg.breakdown["compute"]  # an add per parameter and micro-batch
    assert ds.memory_gib["grads"] == pytest.approx(mg.memory_gib["grads"] / 2, rel=1e-9)  # bf16 vs fp32 buffers


def test_torchtitan_counts_the_embedding_and_output_as_layers():
    model = with_overrides(load_model("llama3-8b"), layers=32)
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=8, pp=4, sp=True, zero=3, global_batch=64)
    ctx = context_for(model, cluster, stack="torchtitan")
    from tpsim.estimator.partition import stage_layers
    split = stage_layers(32, np.array([4]), np.array([1]), edges_as_layers=True)
    # 34 slots over 4 stages: 9, 9, 8, 8 -> embedding + 8, 9, 8, 7 + output
    assert (int(split.first[0]), int(split.middle[0]), int(split.last[0])) == (8, 9, 7)
    e = run_stages(ctx, PlanBatch.from_plans([plan])).to_estimate(0)
    even = _run(model, cluster, plan, PERMISSIVE)
    assert e.step_time_s > 0 and even.step_time_s > 0


def test_planner_counts_plans_the_stack_cannot_run(small):
    model, cluster = small
    space = SearchSpace(tp=(1, 2), pp=(1, 2), zero=(0, 1, 2, 3), micro_batch=(1,))
    mg = search(model, cluster, 64, space=space, stack="megatron")
    tt = search(model, cluster, 64, space=space, stack="torchtitan")
    assert mg.rejected.get("stack", 0) > 0 and tt.rejected.get("stack", 0) > 0
    assert "zero-with-pp" in mg.stack_rejected and "zero" in tt.stack_rejected  # torchtitan has no ZeRO-1
    out = tt.to_json(2)
    assert out["stack"] == "torchtitan" and out["stack_rejected"] == dict(tt.stack_rejected)
    for p in out["plans"]:
        assert p["zero"] != 1 and p["stack"] == "torchtitan"


def test_stack_flag_on_the_verbs(capsys, tmp_path):
    base = ["--model", "llama3-8b", "--layers", "4", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16"]
    assert main(["estimate", *base, "--tp", "2", "--sp", "--zero", "3", "--stack", "torchtitan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == "torchtitan"
    assert main(["plan", *base, "--stack", "deepspeed", "--json", "--no-cache", "--tp", "1", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"] == "deepspeed" and all(p["stack"] == "deepspeed" for p in out["plans"])
    assert main(["estimate", *base, "--tp", "2", "--zero", "3", "--pp", "2", "--sp"]) == 2
    assert "zero-with-pp" in capsys.readouterr().err


def test_llama3_405b_published_plan_fits_with_the_memory_physics_the_paper_describes():
    """TP8 PP16 with the embedding and output as pipeline chunks (vpp 8), FSDP sharding gradients and optimizer
    states (ZeRO-2, each chunk's gradients reduced after its last backward), no recomputation, 16 micro-batches:
    fits an 80 GB H100 (dp 32 here for speed: the preset's dp 128 only shrinks the optimizer shards). A full fp32
    gradient buffer (Megatron's distributed optimizer, ZeRO-1, 1F1B) does not."""
    model = load_model("llama3-405b")
    cluster = load_cluster("dgx-h100", gpus=4096)
    plan = make_plan(model, 4096, global_batch=512)  # the preset's plan at dp 32: m = 16
    assert (plan.tp, plan.pp, plan.vpp, plan.zero, plan.recompute) == (8, 16, 8, 2, "none")
    assert model.default_plan["stack"] == "torchtitan"
    e = estimate(model, cluster, plan, stack="torchtitan")
    assert e.fits, e.memory_gib
    assert sum(e.memory_gib.values()) == pytest.approx(e.peak_memory_gib, rel=1e-12)
    megatron = Plan(**{**plan.to_dict(), "vpp": 1, "zero": 1})
    assert not estimate(model, cluster, megatron).fits


def test_torchtitan_fsdp2_copies_are_exposed_and_cast_to_the_fp32_reduce_dtype(small):
    """torchtitan runs FSDP2, whose copies around each block's all-gather and reduce-scatter sit on the compute
    stream (comm.fsdp_copy_in_out): the same ZeRO-3 plan pays them exposed under torchtitan and not under a
    profile without the flag; the copy into the reduce-scatter input casts the bf16 gradients to the fp32 reduce
    dtype (6 B per element instead of a bf16 copy's 4)."""
    import dataclasses

    from tpsim.compute.training import training_compute
    from tpsim.estimator.schedule import fsdp_copy_seconds
    from tpsim.stacks import Figure

    model, cluster = small
    plan = make_plan(model, 16, zero=3, micro_batch=1, global_batch=16, recompute="selective")
    titan = load_stack("torchtitan")
    assert stack_terms(titan).fsdp_copies
    comm = dict(titan.comm)
    comm["fsdp_copy_in_out"] = Figure(value=False, source="test: the copies off")
    without = dataclasses.replace(titan, comm=comm)
    assert not stack_terms(without).fsdp_copies
    on, off = _run(model, cluster, plan, titan), _run(model, cluster, plan, without)
    assert on.terms["dp_comm"] > off.terms["dp_comm"] and on.step_time_s > off.step_time_s
    compute = training_compute(cluster.device, "fa2")[0]
    unit = 2.0e8  # a block's parameters, on one rank of dp 1: no shard smaller than the unit
    ag, rs_same = fsdp_copy_seconds(compute, unit, 1.0, "bf16")
    ag_cast, rs_cast = fsdp_copy_seconds(compute, unit, 1.0, "bf16", "fp32")
    assert float(ag_cast) == pytest.approx(float(ag))
    shard_fp32 = float(fsdp_copy_seconds(compute, unit, 1.0, "fp32")[0]) / 2.0  # one fp32 copy of the unit
    assert float(rs_cast) == pytest.approx(float(rs_same) / 2.0 * 1.5 + shard_fp32, rel=0.02)


def test_fsdp_copies_of_fp8_plans_move_the_wire_bytes(small):
    """fp8 plans under torchtitan: the float8 all-gather hands FSDP2 fp8 shards (1 B per element), so the copy-in
    and copy-out of each gather move half a bf16 plan's bytes; the gradients stay bf16 and are cast to the fp32
    reduce dtype as in a bf16 plan, so the reduce-scatter copies are the same (fp8 is not a 1-byte activation)."""
    from tpsim.compute.training import training_compute
    from tpsim.estimator.schedule import fsdp_copy_seconds

    _, cluster = small
    compute = training_compute(cluster.device, "fa2")[0]
    unit, dp = 2.0e8, 8.0
    ag_bf16, rs_bf16 = fsdp_copy_seconds(compute, unit, dp, "bf16", "fp32", "bf16", gather_bytes=2.0)
    ag_fp8, rs_fp8 = fsdp_copy_seconds(compute, unit, dp, "fp8", "fp32", "bf16", gather_bytes=1.0)
    assert float(ag_fp8) == pytest.approx(float(ag_bf16) / 2.0, rel=0.02)
    assert float(rs_fp8) == pytest.approx(float(rs_bf16), rel=1e-9)
    # without a wire figure an fp8 plan's copies move its 16-bit elements, as a bf16 plan's
    assert float(fsdp_copy_seconds(compute, unit, dp, "fp8")[0]) == pytest.approx(
        float(fsdp_copy_seconds(compute, unit, dp, "bf16")[0]), rel=1e-9)
    terms = stack_terms(load_stack("torchtitan-compile"))
    assert terms.state_bytes("fp8").wire_params == 1.0 and terms.state_bytes("bf16").wire_params == 2.0
