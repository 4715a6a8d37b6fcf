"""Plan validity: one rule table (tpsim.plan.RULES) evaluated on single plans (with the message) and on whole
batches (vectorized) gives the same first reason for every plan of a space."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tpsim.model import ModelSpec
from tpsim.plan import ORDERS, RULES, Plan, PlanBatch, Rule, first_broken, plan_violation, violation_codes
from tpsim.search import REASONS, SearchSpace, count_reasons, enumerate_plans, violations
from tpsim.search.validity import REASON_INDEX
from tpsim.stacks import load_stack

MEGATRON = load_stack("megatron")


def _odd_model() -> ModelSpec:
    # 12 heads, ffn 3004 (not divisible by 3), seq 1002 (not divisible by 4): every reason can occur
    return ModelSpec(name="odd", family="gpt", num_layers=6, hidden_size=768, num_attention_heads=12,
                     num_kv_heads=12, ffn_hidden_size=3004, vocab_size=1000, seq_len=1002, max_positions=1002)


def _gqa_model() -> ModelSpec:
    # 12 query heads, 6 KV heads: tp=4 divides the heads but not the KV heads (6 >= 4)
    return ModelSpec(name="gqa", family="llama", num_layers=6, hidden_size=768, num_attention_heads=12,
                     num_kv_heads=6, ffn_hidden_size=3004, vocab_size=1000, seq_len=1002, max_positions=1002,
                     norm="rmsnorm", activation="swiglu", position="rotary", qkv_bias=False, linear_bias=False)


def _moe_model() -> ModelSpec:
    # 6 experts (ep=4 does not divide them), expert FFN 1002 (etp=4 does not divide it), a 256-token window
    # shorter than the sequence, 12 heads and 4 KV heads (tp x cp = 8 does not divide the heads for a2a)
    return ModelSpec(name="moe", family="llama", num_layers=6, hidden_size=768, num_attention_heads=12,
                     num_kv_heads=4, ffn_hidden_size=3072, vocab_size=1000, seq_len=1024, max_positions=1024,
                     norm="rmsnorm", activation="swiglu", position="rotary", qkv_bias=False, linear_bias=False,
                     num_experts=6, experts_per_token=2, moe_ffn_hidden_size=1002, sliding_window=256)


def _agree(model: ModelSpec, batch: PlanBatch, gpus: int | None, every: int = 1) -> set[str]:
    """The vectorized codes equal the scalar evaluation of the same rules, plan by plan: on every plan when
    ``every`` is 1; otherwise on one plan of each distinct pattern of rule outcomes (every rule's vectorized
    verdict, the first broken rule and the default stack's code) and on every ``every``-th plan."""
    codes = violations(model, batch, gpus)
    stack_codes = MEGATRON.violation_codes(batch, model)  # the stack's scalar check is this on a batch of one
    if every == 1:
        rows = np.arange(len(batch))
    else:
        verdicts = np.stack([codes, stack_codes] + [
            np.broadcast_to(np.asarray(r.broken(model, batch, gpus), dtype=bool), (len(batch),))
            for r in RULES if gpus is not None or not r.needs_gpus], axis=1)
        _, first = np.unique(verdicts, axis=0, return_index=True)
        rows = np.union1d(first, np.arange(0, len(batch), every))
    seen = set()
    for i in rows:
        plan = batch.plan(int(i))
        rule = first_broken(model, plan, gpus)
        expected = "valid" if rule is None else rule.key
        if rule is None and stack_codes[i]:
            expected = "stack"  # a valid plan the default stack cannot run
        assert REASONS[codes[i]].key == expected, (plan, expected, REASONS[codes[i]].key)
        assert (plan_violation(model, plan, gpus) is None) == (rule is None)
        seen.add(expected)
    for i in np.flatnonzero(stack_codes)[:3]:  # the one-plan stack path gives the batch's verdict
        assert MEGATRON.plan_violation(batch.plan(int(i)), model)
    return seen


def test_single_and_batch_evaluation_agree_on_a_whole_space():
    model = _odd_model()
    space = SearchSpace(vpp=(1, 2, 3, 4), micro_batch=(1, 2, 3, 4), cp=(1,))
    seen = set()
    for m, gpus, gbs in ((model, 48, 96), (model, 32, 64), (model, 6, 36), (_gqa_model(), 16, 32)):
        enum = enumerate_plans(m, gpus, gbs, space)
        assert len(enum.plans) > 500
        seen |= _agree(m, enum.plans, gpus, every=97)
    # the space really exercises (almost) every reason
    assert seen >= {"valid", "tp-heads", "tp-kv-heads", "tp-ffn", "sp-needs-tp", "sp-seq", "vpp-needs-pp", "layers", "batch",
                    "interleave-microbatches", "zero-needs-dp"}


def test_the_context_and_expert_rules_agree_on_a_whole_space():
    """The issue-11 rows (cp, cp kind, ep, expert tp) on a windowed mixture of experts: vectorized = scalar."""
    space = SearchSpace(vpp=(1,), micro_batch=(1, 3), recompute=("none",), overlap=(True,), cp=(1, 2, 3, 4),
                        ep=(1, 2, 3, 4), etp=(0, 1, 4), zero=(0, 1))
    seen = set()
    for m, gpus, gbs in ((_moe_model(), 24, 48), (_moe_model(), 16, 32), (_odd_model(), 24, 48)):
        seen |= _agree(m, enumerate_plans(m, gpus, gbs, space).plans, gpus, every=31)
    assert seen >= {"valid", "cp-seq", "cp-a2a-heads", "cp-ring-window", "ep-experts", "etp-ffn", "ep-ranks",
                    "moe-tp-sp", "zero-needs-dp", "sp-seq"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.integers(1, 8), st.integers(1, 4),
                          st.integers(1, 8), st.booleans(), st.integers(0, 2), st.integers(0, 3),
                          st.integers(1, 6), st.integers(1, 200), st.integers(0, len(ORDERS) - 1),
                          st.sampled_from([1, 1, 2, 3, 4]), st.integers(0, 1), st.sampled_from([1, 1, 2, 3, 6]),
                          st.sampled_from([0, 0, 1, 2, 4])),
                min_size=1, max_size=30),
       st.sampled_from([None, 16, 24]), st.sampled_from(["odd", "gqa", "moe"]))
def test_agrees_on_random_plans_including_gpu_mismatch(rows, gpus, model):
    cols = list(zip(*rows))
    batch = PlanBatch.from_arrays(tp=cols[0], pp=cols[1], vpp=cols[2], dp=cols[3], sp=cols[4], recompute=cols[5],
                                  zero=cols[6], micro_batch=cols[7], global_batch=cols[8], order=cols[9],
                                  cp=cols[10], cp_kind=cols[11], ep=cols[12], etp=cols[13])
    _agree({"odd": _odd_model, "gqa": _gqa_model, "moe": _moe_model}[model](), batch, gpus)


def test_enumeration_holds_the_gpu_identity_and_has_no_duplicates():
    model = _odd_model()
    enum = enumerate_plans(model, 48, 96, SearchSpace(micro_batch=(1, 2), vpp=(1, 2)))
    b = enum.plans
    assert np.all(b.tp * b.cp * b.pp * b.dp == 48)
    rows = np.stack([b.tp, b.pp, b.vpp, b.dp, b.sp, b.recompute, b.zero, b.micro_batch, b.overlap, b.order, b.cp,
                     b.cp_kind, b.ep, b.etp], 1)
    assert len(np.unique(rows, axis=0)) == len(b)
    # no overlap=False duplicate without a data-parallel reduction (dense model: dp x cp == 1); cp_kind only
    # varies where cp > 1; a dense model has no expert axes
    assert not np.any(~b.overlap & (b.dp * b.cp == 1))
    assert not np.any((b.cp == 1) & (b.cp_kind != 0)) and np.all(b.ep == 1) and np.all(b.etp == 0)


def test_constraints_narrow_the_space():
    model = _odd_model()
    b = enumerate_plans(model, 48, 96, SearchSpace(tp=(4,), pp=(1,), zero=(1,), recompute=("full",))).plans
    assert set(b.tp) == {4} and set(b.pp) == {1} and set(b.zero) == {1} and set(b.recompute) == {2}
    b = enumerate_plans(model, 48, 96, SearchSpace(max_tp=4)).plans
    assert b.tp.max() == 4


def test_count_reasons_counts_only_rejections():
    codes = np.array([0, 2, 2, REASON_INDEX["batch"], 0], dtype=np.int8)
    assert count_reasons(codes) == {"tp-heads": 2, "batch": 1}


# one plan breaking each rule (first), on the odd model, and the numbers its message must name
BREAKERS = (
    ("gpus", 48, Plan(tp=2, pp=2, dp=2, global_batch=8), ("tp=2 x pp=2 x dp=2 = 8 != gpus=48",)),
    ("tp-heads", 48, Plan(tp=8, dp=6, global_batch=48), ("tp=8 does not divide num_attention_heads=12",)),
    ("tp-ffn", 48, Plan(tp=3, dp=16, global_batch=48), ("tp=3 does not divide ffn_hidden_size=3004",)),
    ("sp-needs-tp", 48, Plan(tp=1, dp=48, sp=True, global_batch=48), ("needs tp > 1",)),
    ("sp-seq", 48, Plan(tp=4, dp=12, sp=True, global_batch=48), ("tp=4 does not divide seq_len=1002",)),
    ("vpp-needs-pp", 48, Plan(tp=1, dp=48, vpp=2, global_batch=48), ("vpp=2 needs pp > 1",)),
    ("layers", 48, Plan(tp=1, pp=4, vpp=3, dp=12, global_batch=48), ("pp=4 x vpp=3 = 12 exceeds num_layers=6 + 2",)),
    ("batch", 48, Plan(tp=2, dp=24, global_batch=36), ("global batch 36", "micro-batch 1 x dp 24")),
    ("interleave-microbatches", 48, Plan(tp=2, pp=2, vpp=3, dp=12, global_batch=36),
     ("micro-batches 3 divisible by pp=2",)),
    ("zero-needs-dp", 24, Plan(tp=4, pp=6, dp=1, zero=1, global_batch=2), ("zero=1 needs dp > 1",)),
    ("cp-seq", 48, Plan(tp=2, cp=2, dp=12, global_batch=48), ("seq_len=1002 is not a multiple of 2 x cp = 4",)),
)
MOE_BREAKERS = (
    ("cp-a2a-heads", 16, Plan(tp=2, cp=4, cp_kind="a2a", dp=2, sp=True, global_batch=4),
     ("tp x cp = 8", "num_attention_heads=12")),
    ("cp-ring-window", 16, Plan(tp=2, cp=2, dp=4, sp=True, global_batch=4), ("sliding_window=256",)),
    ("ep-experts", 16, Plan(tp=1, ep=4, dp=16, global_batch=16), ("ep=4 does not divide num_experts=6",)),
    ("etp-ffn", 16, Plan(tp=4, etp=4, dp=4, sp=True, global_batch=4),
     ("etp=4 does not divide moe_ffn_hidden_size=1002",)),
    ("ep-ranks", 16, Plan(tp=2, ep=3, etp=1, dp=8, sp=True, global_batch=8),
     ("ep=3 x etp=1 = 3 does not divide tp x cp x dp = 16",)),
    ("moe-tp-sp", 16, Plan(tp=2, dp=8, global_batch=8), ("tp=2 without sequence parallelism",)),
)


@pytest.mark.parametrize("key, gpus, plan, parts", MOE_BREAKERS, ids=[b[0] for b in MOE_BREAKERS])
def test_each_issue_11_rule_names_its_numbers(key, gpus, plan, parts):
    model = _moe_model()
    rule = first_broken(model, plan, gpus)
    assert rule is not None and rule.key == key
    message = plan_violation(model, plan, gpus)
    for part in parts:
        assert part in message, message
    assert violation_codes(model, PlanBatch.from_plans([plan]), gpus)[0] == RULES.index(rule) + 1
    dense = first_broken(_odd_model(), Plan(tp=1, ep=2, dp=16, global_batch=16), 16)
    assert dense.key == "ep-needs-moe"


@pytest.mark.parametrize("key, gpus, plan, parts", BREAKERS, ids=[b[0] for b in BREAKERS])
def test_each_rule_names_its_numbers(key, gpus, plan, parts):
    model = _odd_model()
    rule = first_broken(model, plan, gpus)
    assert rule is not None and rule.key == key
    message = plan_violation(model, plan, gpus)
    for part in parts:
        assert part in message, message
    assert violation_codes(model, PlanBatch.from_plans([plan]), gpus)[0] == RULES.index(rule) + 1


def test_every_rule_is_a_reason_and_a_new_rule_is_one_row():
    assert [r.key for r in REASONS[1:1 + len(RULES)]] == [r.key for r in RULES]
    extra = Rule("toy-max-tp", "structure", "tp above 2", lambda m, p, g: p.tp > 2,
                 lambda m, p, g: f"tp={p.tp} is above 2")
    model = _odd_model()
    batch = PlanBatch.from_arrays(tp=[1, 2, 4, 12], dp=[48, 24, 12, 4], global_batch=48)
    codes = violation_codes(model, batch, 48, RULES + (extra,))
    assert list(codes[:2]) == [0, 0]
    assert codes[2] == len(RULES) + 1  # tp=4 divides heads and ffn: only the new rule is broken
    assert plan_violation(model, batch.plan(2), 48, RULES + (extra,)) == "tp=4 is above 2"
