"""The vectorized validity check agrees with tpsim.plan.plan_violation on every plan of a space."""

from __future__ import annotations

import re

import numpy as np
from hypothesis import given, settings, strategies as st

from tpsim.model import ModelSpec
from tpsim.plan import ORDERS, PlanBatch, plan_violation
from tpsim.search import REASONS, SearchSpace, count_reasons, enumerate_plans, violations
from tpsim.search.validity import REASON_INDEX

# plan_violation's message -> reason key of tpsim.search.validity
PATTERNS = (
    (r"!= gpus=", "gpus"),
    (r"does not divide num_attention_heads", "tp-heads"),
    (r"does not divide num_kv_heads", "tp-kv-heads"),
    (r"does not divide ffn_hidden_size", "tp-ffn"),
    (r"sequence parallelism needs tp > 1", "sp-needs-tp"),
    (r"does not divide seq_len", "sp-seq"),
    (r"vpp=\d+ needs pp > 1", "vpp-needs-pp"),
    (r"exceeds num_layers", "layers"),
    (r"is not a multiple of micro-batch", "batch"),
    (r"interleaved schedule needs", "interleave-microbatches"),
    (r"zero=\d needs dp > 1", "zero-needs-dp"),
)


def _key(message: str | None) -> str:
    if message is None:
        return "valid"
    keys = [key for pattern, key in PATTERNS if re.search(pattern, message)]
    assert len(keys) == 1, message
    return keys[0]


def _odd_model() -> ModelSpec:
    # 12 heads, ffn 3004 (not divisible by 3), seq 1002 (not divisible by 4): every reason can occur
    return ModelSpec(name="odd", family="gpt", num_layers=6, hidden_size=768, num_attention_heads=12,
                     num_kv_heads=12, ffn_hidden_size=3004, vocab_size=1000, seq_len=1002, max_positions=1002)


def _gqa_model() -> ModelSpec:
    # 12 query heads, 6 KV heads: tp=4 divides the heads but not the KV heads (6 >= 4)
    return ModelSpec(name="gqa", family="llama", num_layers=6, hidden_size=768, num_attention_heads=12,
                     num_kv_heads=6, ffn_hidden_size=3004, vocab_size=1000, seq_len=1002, max_positions=1002,
                     norm="rmsnorm", activation="swiglu", position="rotary", qkv_bias=False, linear_bias=False)


def _agree(model: ModelSpec, batch: PlanBatch, gpus: int | None) -> set[str]:
    codes = violations(model, batch, gpus)
    seen = set()
    for i in range(len(batch)):
        expected = _key(plan_violation(model, batch.plan(i), gpus))
        assert REASONS[codes[i]].key == expected, (batch.plan(i), expected, REASONS[codes[i]].key)
        seen.add(expected)
    return seen


def test_agrees_with_plan_violation_on_a_whole_space():
    model = _odd_model()
    space = SearchSpace(vpp=(1, 2, 3, 4), micro_batch=(1, 2, 3, 4))
    seen = set()
    for m, gpus, gbs in ((model, 48, 96), (model, 32, 64), (model, 6, 36), (_gqa_model(), 16, 32)):
        enum = enumerate_plans(m, gpus, gbs, space)
        assert len(enum.plans) > 500
        seen |= _agree(m, enum.plans, gpus)
    # the space really exercises (almost) every reason
    assert seen >= {"valid", "tp-heads", "tp-kv-heads", "tp-ffn", "sp-needs-tp", "sp-seq", "vpp-needs-pp", "layers", "batch",
                    "interleave-microbatches", "zero-needs-dp"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.integers(1, 8), st.integers(1, 4),
                          st.integers(1, 8), st.booleans(), st.integers(0, 2), st.integers(0, 3),
                          st.integers(1, 6), st.integers(1, 200), st.integers(0, len(ORDERS) - 1)),
                min_size=1, max_size=30),
       st.sampled_from([None, 16, 24]), st.booleans())
def test_agrees_on_random_plans_including_gpu_mismatch(rows, gpus, gqa):
    cols = list(zip(*rows))
    batch = PlanBatch.from_arrays(tp=cols[0], pp=cols[1], vpp=cols[2], dp=cols[3], sp=cols[4], recompute=cols[5],
                                  zero=cols[6], micro_batch=cols[7], global_batch=cols[8], order=cols[9])
    _agree(_gqa_model() if gqa else _odd_model(), batch, gpus)


def test_enumeration_holds_the_gpu_identity_and_has_no_duplicates():
    model = _odd_model()
    enum = enumerate_plans(model, 48, 96, SearchSpace())
    b = enum.plans
    assert np.all(b.tp * b.pp * b.dp == 48)
    rows = np.stack([b.tp, b.pp, b.vpp, b.dp, b.sp, b.recompute, b.zero, b.micro_batch, b.overlap, b.order], 1)
    assert len(np.unique(rows, axis=0)) == len(b)
    # no overlap=False duplicate when dp == 1
    assert not np.any(~b.overlap & (b.dp == 1))


def test_constraints_narrow_the_space():
    model = _odd_model()
    b = enumerate_plans(model, 48, 96, SearchSpace(tp=(4,), pp=(1,), zero=(1,), recompute=("full",))).plans
    assert set(b.tp) == {4} and set(b.pp) == {1} and set(b.zero) == {1} and set(b.recompute) == {2}
    b = enumerate_plans(model, 48, 96, SearchSpace(max_tp=4)).plans
    assert b.tp.max() == 4


def test_count_reasons_counts_only_rejections():
    codes = np.array([0, 2, 2, REASON_INDEX["batch"], 0], dtype=np.int8)
    assert count_reasons(codes) == {"tp-heads": 2, "batch": 1}
