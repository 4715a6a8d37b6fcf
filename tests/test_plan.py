"""Plan validation: one line naming the constraint and the numbers."""

import numpy as np
import pytest

from tpsim.errors import InputError, PlanError
from tpsim.model import get_preset, with_overrides
from tpsim.plan import Plan, PlanBatch, make_plan, plan_violation, validate_plan


def test_preset_default_plan():
    m = get_preset("gpt3-175b")
    p = make_plan(m, 1024)
    assert (p.tp, p.pp, p.dp, p.num_microbatches) == (8, 16, 8, 192)


@pytest.mark.parametrize("fields,message", [
    (dict(tp=16), "tp=16 does not divide num_attention_heads=40"),
    (dict(tp=8, pp=1, micro_batch=4, global_batch=100), "global batch 100 is not a multiple of micro-batch 4 x dp 8"),
    (dict(tp=1, sp=True), "sequence parallelism needs tp > 1"),
    (dict(tp=2, pp=1, vpp=2), "vpp=2 needs pp > 1"),
])
def test_violations_name_the_numbers(fields, message):
    m = with_overrides(get_preset("llama3-8b"), heads=40, hidden=5120, kv_heads=8)
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        make_plan(m, 64, **fields)


def test_interleaving_needs_microbatches_divisible_by_pp():
    m = get_preset("gpt3-175b")
    plan = Plan(tp=8, pp=16, vpp=2, dp=8, global_batch=8 * 20, micro_batch=1)
    assert "divisible by pp=16" in plan_violation(m, plan, 1024)


def test_uneven_layers_allowed_and_cross_node_tp_valid():
    m = with_overrides(get_preset("gpt3-175b"), layers=95)
    assert plan_violation(m, Plan(tp=16, pp=5, dp=1, global_batch=64), 80) is None


def test_gpus_not_divisible():
    with pytest.raises(PlanError, match="tp=8 x pp=3 = 24 does not divide gpus=64"):
        make_plan(get_preset("gpt3-175b"), 64, tp=8, pp=3)


def test_bad_field_values():
    m = get_preset("llama3-8b")
    with pytest.raises(InputError, match="recompute='some'"):
        validate_plan(m, Plan(recompute="some"))
    with pytest.raises(InputError, match="order='tp-xx-pp'"):
        validate_plan(m, Plan(order="tp-xx-pp"))


def test_plan_batch_round_trip():
    m = get_preset("llama3-70b")
    plans = [make_plan(m, 64, tp=8, pp=4, recompute="full"), make_plan(m, 64, tp=4, pp=2, order="dp-tp-pp")]
    batch = PlanBatch.from_plans(plans)
    assert [batch.plan(i) for i in range(len(batch))] == plans


def test_kv_heads_divisible_or_replicated():
    m = with_overrides(get_preset("llama3-8b"), heads=24, hidden=3072, kv_heads=12)
    assert "does not divide num_kv_heads=12" in plan_violation(m, Plan(tp=8, dp=1, global_batch=1), 8)
    assert plan_violation(m, Plan(tp=4, dp=2, global_batch=2), 8) is None
    small = with_overrides(get_preset("llama3-8b"), kv_heads=2)
    assert plan_violation(small, Plan(tp=8, dp=1, global_batch=1), 8) is None  # 2 kv heads replicated over 8


def test_plan_batch_of_an_empty_column_is_empty():
    """A search space pruned to nothing builds an empty batch (scalars broadcast to it), not a numpy error
    (it was reached by `tpsim report` on 2 GPUs of a DGX node, whose spaces the stack rules empty)."""
    from tpsim.plan import PlanBatch

    batch = PlanBatch.from_arrays(tp=np.zeros(0, dtype=np.int64), pp=np.zeros(0, dtype=np.int64), zero=1)
    assert len(batch) == 0 and batch.zero.shape == (0,)
    assert len(PlanBatch.from_arrays(tp=np.array([2, 4]), zero=1)) == 2 and len(PlanBatch.from_arrays(zero=1)) == 1
