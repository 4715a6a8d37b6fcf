"""Issue 19, small models on H100 (w10-smallgemm): the per-micro-batch and per-step costs that scale with the
parameters or the vocabulary rather than with the layers' GEMMs, each against its own formula."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.estimator import estimate
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster


@pytest.fixture(scope="module")
def small():
    model = with_overrides(load_model("gpt3-175b"), layers=4, hidden=2048, heads=16)
    return model, load_cluster("dgx-h100", gpus=16)


def _spy(monkeypatch, name):
    from tpsim.estimator import schedule as sched_mod

    calls = []
    real = getattr(sched_mod, name)

    def spy(*args):
        out = real(*args)
        calls.append((args, np.asarray(out, dtype=float).copy()))
        return out

    monkeypatch.setattr(sched_mod, name, spy)
    return calls


@pytest.mark.parametrize("zero, stack", [(1, "megatron"), (3, "torchtitan")])
def test_embedding_dense_gradient_moves_the_table_every_micro_batch(small, monkeypatch, zero, stack):
    """torch's dense embedding backward writes a zeroed table-sized 16-bit gradient (2 B per element) and the
    stack adds it into its fp32 gradient buffer (read 2, read and write 4 + 4): 12 B per table element; with
    ZeRO-3's per-micro-batch reduce-scatter the add lands on the 1/dp shard."""
    model, cluster = small
    calls = _spy(monkeypatch, "embedding_grad_seconds")
    plan = make_plan(model, 16, tp=2, pp=1, micro_batch=1, global_batch=32, zero=zero)
    e = estimate(model, cluster, plan, stack=stack)
    (ctx, params, sharded, group, dtype), seconds = calls[-1]
    # the word table's shard plus the learned position table (GPT-3: both nn.Embedding, both dense)
    table = (model.padded_vocab(2) / 2 + model.max_positions) * model.hidden_size
    assert float(np.ravel(params)[0]) == pytest.approx(table)
    add = 2.0 + 2.0 * 4.0
    per = 2.0 + (add / 8 if bool(np.ravel(sharded)[0]) else add)
    assert float(seconds[0]) == pytest.approx(table * per / ctx.fixed.hbm)
    assert e.step_time_s > 0


def test_embedding_gradient_adds_to_the_first_stage_only(small):
    """With pipelining the table's gradient is the first stage's work: a plan whose first stage is not the
    slowest is unchanged by it, and without pipelining it is in the step (the step grows with the vocabulary
    beyond the output layer's and the loss's share)."""
    model, cluster = small
    plan = make_plan(model, 16, tp=1, pp=1, micro_batch=1, global_batch=64)
    base = estimate(model, cluster, plan, stack="megatron")
    from tpsim.estimator import schedule as sched_mod

    real = sched_mod.embedding_grad_seconds
    try:
        sched_mod.embedding_grad_seconds = lambda *a: 0.0 * real(*a)
        without = estimate(model, cluster, plan, stack="megatron")
    finally:
        sched_mod.embedding_grad_seconds = real
    m = plan.global_batch // (plan.micro_batch * plan.dp)
    table = (model.padded_vocab(1) + model.max_positions) * model.hidden_size
    from tpsim.estimator.context import context_for

    hbm = context_for(model, cluster, stack="megatron").fixed.hbm
    assert base.terms["compute"] - without.terms["compute"] == pytest.approx(m * table * 12.0 / hbm, rel=1e-6)


@pytest.mark.parametrize("zero", [0, 1])
def test_megatron_passes_over_the_whole_gradient_buffer_once_per_step(small, monkeypatch, zero):
    """Megatron-Core DDP zeroes, NaN-checks and scales the rank's full fp32 gradient buffer every step (4 passes
    of 4 B per parameter), the distributed optimizer's shard notwithstanding: the optimizer term holds
    params x 16 B / HBM beyond the shard's fused-Adam step."""
    model, cluster = small
    calls = _spy(monkeypatch, "grad_buffer_seconds")
    plan = make_plan(model, 16, tp=2, pp=1, micro_batch=1, global_batch=32, zero=zero)
    e = estimate(model, cluster, plan, stack="megatron")
    (ctx, params, dtype), seconds = calls[-1]
    assert ctx.terms.grad_buffer_passes == 4.0
    full = float(np.ravel(params)[0])
    assert float(seconds[0]) == pytest.approx(full * 16.0 / ctx.fixed.hbm)
    from tpsim.estimator.schedule import optimizer_step

    shard = full / (plan.dp if zero else 1)  # (the launch count is the rank's tensors either way)
    step = float(np.ravel(optimizer_step(ctx.terms, ctx.fixed.hbm, np.array([shard]), np.array([4 * 12 + 4.0]),
                                         "bf16"))[0])
    assert e.terms["optimizer"] == pytest.approx(step + float(seconds[0]), rel=1e-6)


def test_stacks_without_the_rule_pay_no_gradient_buffer_pass(small, monkeypatch):
    model, cluster = small
    calls = _spy(monkeypatch, "grad_buffer_seconds")
    plan = make_plan(model, 16, tp=2, pp=1, micro_batch=1, global_batch=32, zero=1)
    estimate(model, cluster, plan, stack="nemo")
    (ctx, _, _), seconds = calls[-1]
    assert ctx.terms.grad_buffer_passes == 0.0 and float(seconds[0]) == 0.0
