"""The memory stage's pipeline ranks: the first, last and busiest middle rank where they bound every rank's peak
(:func:`tpsim.estimator.partition.middle_dominated`), every rank where they do not (dense-first layers whose
rank 1 holds fewer MoE layers than another middle rank; traced graphs' units of different costs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.estimator import estimate
from tpsim.estimator import partition as partition_module
from tpsim.model import get_preset, with_overrides
from tpsim.pipeline import in_flight
from tpsim.plan import Plan, PlanBatch
from tpsim.topology import load_cluster

GIB = 2 ** 30


@pytest.fixture(scope="module")
def h100_64():
    return load_cluster("dgx-h100", gpus=64)


def _deepseek(layers: int):
    """DeepSeek-V3's shape (3 dense layers first) with a small vocabulary: the edges do not set the peak."""
    return dataclasses.replace(with_overrides(get_preset("deepseek-v3"), layers=layers, seq_len=1024),
                               mtp_layers=0, vocab_size=1024)


def _pattern(model, cluster, plan):
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import _patterns, layer_costs

    ctx = context_for(model, cluster)
    b = PlanBatch.from_plans([plan])
    costs, keys = layer_costs(ctx, b)
    _, part, _ = _patterns(ctx, b, costs, keys)
    return costs, part


PLAN = Plan(tp=1, pp=8, ep=8, dp=8, global_batch=256, micro_batch=4, zero=1, recompute="none", dtype="bf16")


def test_a_middle_rank_with_more_moe_layers_than_rank_1_is_a_rank_of_its_own(h100_64):
    """16 layers on 8 ranks: rank 1 holds a dense and a MoE layer, ranks 2-6 two MoE layers each. The peak is
    one real rank's (its own layers' activations times its own micro-batches in flight), not rank 2's layers
    with rank 1's in-flight count (a rank that does not exist)."""
    m = _deepseek(16)
    costs, part = _pattern(m, h100_64, PLAN)
    assert not part.middle_exact[0] and part.rank_counts is None  # memory only: the timing keeps its ranks
    assert part.ranks(for_memory=True).layers.shape[0] == 8 and part.ranks().layers.shape[0] == 3
    assert part.peak_counts[:, 1:3, 0].tolist() == [[1, 0], [1, 2]]
    dense, moe = costs.activations_by_kind[:, 0]
    m_count = np.array([PLAN.global_batch // (PLAN.dp * PLAN.micro_batch)])
    flight = [in_flight(np.array([0]), np.array([r]), np.array([8]), np.array([1]), m_count)[0] for r in range(8)]
    per_rank = [flight[r] * (part.peak_counts[0, r, 0] * dense + part.peak_counts[1, r, 0] * moe) for r in range(8)]
    got = estimate(m, h100_64, PLAN).memory_gib["activations"] * GIB - costs.working[0]
    assert got == pytest.approx(per_rank[2], rel=1e-9)  # rank 2: the most MoE layers with the most in flight
    assert got != pytest.approx(flight[1] * 2 * moe, rel=1e-6)


@pytest.mark.parametrize("fields", [dict(pp_first=3, pp_last=2), dict(pp_embedding=True, pp_loss=True), dict()])
def test_where_rank_1_dominates_the_three_positions_are_every_ranks_peak(h100_64, monkeypatch, fields):
    """Uneven stages whose middle ranks are rank 1's or lighter (the dense layers on the first rank; Megatron's
    first/last stage layers, the embedding and loss as layers): every rank compared gives the same peak and
    terms as the three positions."""
    m = _deepseek(24)
    plan = dataclasses.replace(PLAN, **fields)
    positions = estimate(m, h100_64, plan)
    _, part = _pattern(m, h100_64, plan)
    assert part.middle_exact[0] and part.ranks(for_memory=True).position is None
    monkeypatch.setattr(partition_module, "middle_dominated", lambda *_, **__: np.zeros(1, dtype=bool))
    m2 = dataclasses.replace(m)  # a context of its own (no kept partition)
    assert _pattern(m2, h100_64, plan)[1].ranks(for_memory=True).layers.shape[0] == 8
    every = estimate(m2, h100_64, plan)
    assert every.peak_memory_gib == pytest.approx(positions.peak_memory_gib, rel=1e-12)
    assert every.memory_gib == pytest.approx(positions.memory_gib, rel=1e-12)


def test_middle_dominated_by_rank_1():
    kinds = np.array([0] * 3 + [1] * 13)
    pp, vpp = np.array([8, 4, 3]), np.array([1, 1, 1])
    # pp 8: rank 1 holds layers 2 (dense) and 3; pp 4: rank 1 four MoE layers; pp 3: one middle rank
    assert partition_module.middle_dominated(kinds, pp, vpp).tolist() == [False, True, True]


def test_batches_of_different_pipeline_sizes_keep_every_ranks_layers(h100_64):
    """The kept partitions of one context: a batch of pp 4 plans, then one of pp 8 (more ranks): the rows of both
    give the same figures as each estimated alone."""
    from tpsim.estimator import estimate_batch

    m = _deepseek(16)
    small = dataclasses.replace(PLAN, pp=4, dp=16, global_batch=512)
    alone = [estimate(dataclasses.replace(m), h100_64, p).peak_memory_gib for p in (small, PLAN)]
    estimate_batch(m, h100_64, PlanBatch.from_plans([small]))
    both = estimate_batch(m, h100_64, PlanBatch.from_plans([PLAN, small])).peak_memory_gib
    assert both == pytest.approx([alone[1], alone[0]], rel=1e-12)


def test_the_largest_rank_is_every_ranks_where_the_positions_miss_it(h100_64):
    """15 layers, one on each edge rank: rank 1 (the middle position, the most layers) holds two dense and one
    MoE layer, rank 2 two MoE layers and more parameters. The data-parallel traffic and the planner's bound
    on model states take rank 2's parameters (and its experts'), not the three positions' largest."""
    plan = dataclasses.replace(PLAN, pp_first=1, pp_last=1)
    _, part = _pattern(_deepseek(15), h100_64, plan)
    assert not part.middle_exact[0]
    positions = np.where(part.valid, part.params, 0.0).max(axis=0)
    assert part.largest[0] == part.every_params[2, 0] > positions[0] * 1.1
    assert part.largest_expert[0] == part.every_expert[2, 0]


def test_the_planners_states_bound_is_the_rank_holding_the_most(h100_64, monkeypatch):
    """The planner's bound on model states (the 15-layer split above): rank 2's states, above the three
    positions' largest, and still at most the estimated peak."""
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import model_states_bytes

    m = _deepseek(15)
    plan = dataclasses.replace(PLAN, pp_first=1, pp_last=1)
    b = PlanBatch.from_plans([plan])
    every = model_states_bytes(context_for(m, h100_64), b)[0]
    peak = estimate(m, h100_64, plan).peak_memory_gib * GIB
    monkeypatch.setattr(partition_module, "middle_dominated", lambda *_, **__: np.ones(1, dtype=bool))
    positions = model_states_bytes(context_for(dataclasses.replace(m), h100_64), b)[0]
    assert positions * 1.1 < every < peak
