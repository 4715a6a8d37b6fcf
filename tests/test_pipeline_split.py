"""Uneven pipeline stages (docs/SCHEMAS.md T1 fields pp_first, pp_last, pp_embedding, pp_loss): the one layer
split (tpsim.estimator.partition.layer_split), the plan and stack rules, and plans published runs trained with."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.partition import layer_split, position_kind_counts, rank_layers, stage_layers
from tpsim.model import get_preset, with_overrides
from tpsim.plan import Plan, make_plan, plan_violation
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 130), pp=st.integers(1, 32), vpp=st.integers(1, 8), edges=st.booleans(),
       first=st.integers(0, 20), last=st.integers(0, 20), emb=st.booleans(), loss=st.booleans())
def test_every_split_holds_every_layer_once(n, pp, vpp, edges, first, last, emb, loss):
    if pp == 1:
        first = last = 0
        emb = loss = False
    first, last = (first, 0) if emb and first else (first, last)
    last = 0 if loss and last else last
    free = pp - (first > 0) - (last > 0)
    slots = n - first - last + (emb and not first) + (loss and not last)
    if first + last > n or (pp == 2 and first and last and first + last != n) or pp * vpp > n + 2 or (
            (first or last) and free and slots < free):
        return
    if (emb or loss) and not (first or last) and pp * vpp > n + emb + loss:
        return
    sizes = layer_split(n, pp, vpp, edges, first, last, emb, loss)
    assert len(sizes) == (pp * vpp if pp > 1 else 1) and sum(sizes) == n and min(sizes) >= 0
    ranks = rank_layers(n, pp, vpp, edges, first, last, emb, loss)
    if first:
        assert ranks[0] == first
    if last:
        assert ranks[-1] == last


def test_the_default_split_is_unchanged():
    """tpsim's even split (extra layers to the middle ranks, then the first and last): 23 layers on 3 ranks
    give 7 / 8 / 8 as before (the golden case gpt13-pp3-extra)."""
    assert rank_layers(23, 3, 1) == (7, 8, 8)
    s = stage_layers(23, np.array([3]), np.array([1]))
    assert (int(s.first[0]), int(s.last[0]), int(s.middle[0])) == (rank_layers(23, 3, 1)[0],
                                                                   rank_layers(23, 3, 1)[-1],
                                                                   rank_layers(23, 3, 1)[1])


def test_megatron_split_with_the_embedding_and_loss_as_layers():
    """94 decoder layers + embedding + loss = 96 slots on pp 32 x vpp 3: one slot per chunk, the first chunk
    holds only the embedding and the last only the output layer and loss."""
    sizes = layer_split(94, 32, 3, embedding=True, loss=True)
    assert sizes[0] == 0 and sizes[-1] == 0 and set(sizes[1:-1]) == {1}
    ranks = rank_layers(94, 32, 3, embedding=True, loss=True)
    assert ranks[0] == 2 and ranks[-1] == 2 and set(ranks[1:-1]) == {3}


def test_megatron_first_and_last_stage_layers():
    ranks = rank_layers(61, 4, 8, first=13, last=16)
    assert ranks == (13, 16, 16, 16)
    assert rank_layers(30, 4, 1, last=3) == (9, 9, 9, 3)


def test_dense_first_layers_follow_the_split():
    m = get_preset("deepseek-v3")
    kinds = np.array([0 if i < m.first_dense_layers else 1 for i in range(m.num_layers)])
    from tpsim.estimator.partition import SplitFields

    split = SplitFields(first=np.array([5]), last=np.array([16]), embedding=np.array([False]),
                        loss=np.array([False]))
    counts = position_kind_counts(kinds, np.array([4]), np.array([1]), split=split)[:, :, 0]
    assert counts[0].tolist() == [3, 2] and counts[1].sum() == 16 and counts[2].sum() == 20


@pytest.fixture(scope="module")
def h100_1024():
    return load_cluster("dgx-h100", gpus=1024)


def test_a_94_layer_model_on_pp32_vpp3_is_accepted_and_its_split_stated(h100_1024, capsys):
    m = with_overrides(get_preset("llama3-70b"), layers=94)
    plan = make_plan(m, 1024, tp=8, pp=32, vpp=3, sp=True, global_batch=1024, pp_embedding=True, pp_loss=True)
    e = estimate(m, h100_1024, plan, stack=load_stack("megatron"))
    assert e.pipeline_split["layers_per_rank"][:2] == [2, 3] and len(e.pipeline_split["layers_per_chunk"]) == 96
    assert e.to_dict()["plan"]["pp_embedding"] is True
    without = make_plan(m, 1024, tp=8, pp=32, vpp=3, sp=True, global_batch=1024)
    with pytest.raises(InputError, match="a chunk would hold no layer"):
        estimate(m, h100_1024, without, stack=load_stack("megatron"))
    flat = make_plan(m, 1024, tp=8, pp=32, sp=True, global_batch=1024, pp_embedding=True, pp_loss=True)
    with pytest.raises(InputError, match="an uneven split of the plan is not offered"):
        estimate(m, h100_1024, flat, stack=load_stack("deepspeed"))
    from tpsim.cli import main

    assert main(["estimate", "--model", "llama3-70b", "--layers", "94", "--cluster", "dgx-h100", "--gpus", "1024",
                 "--tp", "8", "--pp", "32", "--vpp", "3", "--global-batch", "1024", "--pp-embedding-as-layer",
                 "--pp-loss-as-layer"]) == 0
    assert "pipeline layers per rank 2+3x30+2 (chunks in model order 0+1x94+0)" in capsys.readouterr().out


def test_61_layers_on_pp4_vpp8_and_the_slowest_stage_sets_the_pace():
    m = get_preset("deepseek-v3")
    c = load_cluster("dgx-h100", gpus=2048)
    fields = dict(tp=1, pp=4, vpp=8, ep=64, zero=1, dtype="fp8", recompute="selective", global_batch=16384,
                  schedule="1f1b")
    even = estimate(m, c, make_plan(m, 2048, **fields), stack=load_stack("megatron"))
    assert sum(even.pipeline_split["layers_per_rank"]) == 61
    heavy = estimate(m, c, make_plan(m, 2048, pp_first=7, pp_last=22, **fields), stack=load_stack("megatron"))
    assert heavy.pipeline_split["layers_per_rank"] == [7, 16, 16, 22]
    # the 22-layer last rank sets the pace: slower than the even split
    assert heavy.step_time_s > even.step_time_s and heavy.breakdown["compute"] > even.breakdown["compute"]


def test_plan_rules_of_the_split():
    m = with_overrides(get_preset("llama3-8b"), layers=16)
    assert "needs pp > 1" in plan_violation(m, Plan(tp=1, pp=1, dp=8, global_batch=64, pp_first=3), 8)
    assert "not both" in plan_violation(m, Plan(tp=1, pp=4, dp=2, global_batch=64, pp_first=3,
                                                pp_embedding=True), 8)
    assert "exactly" in plan_violation(m, Plan(tp=1, pp=2, dp=4, global_batch=64, pp_first=3, pp_last=3), 8)
    assert plan_violation(m, Plan(tp=1, pp=2, dp=4, global_batch=64, pp_first=6, pp_last=10), 8) is None


def test_json_states_the_split(capsys):
    from tpsim.cli import main

    assert main(["estimate", "--model", "gpt3-1.3b", "--gpus", "8", "--pp", "4", "--pp-last-layers", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline_split"]["layers_per_rank"] == [7, 7, 7, 3] and out["plan"]["pp_last"] == 3


# ---- layers of different costs (a traced graph's units): the balanced split -----------------------------------
def _max_chunk(weights, sizes):
    out, start = 0.0, 0
    for s in sizes:
        out = max(out, sum(weights[start:start + s]))
        start += s
    return out


def _best_max_chunk(weights, chunks):
    """Brute force: the smallest largest-chunk sum over every contiguous split into ``chunks`` parts."""
    from itertools import combinations

    n = len(weights)
    best = float("inf")
    for cuts in combinations(range(1, n), chunks - 1):
        bounds = (0,) + cuts + (n,)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=2, max_size=9), st.integers(1, 4))
def test_balanced_split_is_contiguous_complete_and_minimises_the_largest_chunk(raw, chunks):
    from tpsim.estimator.partition import balanced_split

    chunks = min(chunks, len(raw))
    weights = tuple(float(w) for w in raw)
    sizes = balanced_split(weights, chunks)
    assert len(sizes) == chunks and sum(sizes) == len(weights) and min(sizes) >= 1
    assert _max_chunk(weights, sizes) <= _best_max_chunk(weights, chunks) * (1 + 1e-9)


def test_weighted_partition_counts_each_ranks_own_layer_kinds():
    """With per-layer weights the partition holds each position's own layers of each kind: the heavy layer
    alone on one rank, the middle position the heaviest middle rank."""
    import numpy as np

    from tpsim.estimator.partition import layer_split, position_kind_counts

    weights = (1.0, 1.0, 1.0, 1.0, 8.0, 1.0, 1.0)
    kinds = np.array([0, 0, 0, 0, 1, 0, 0])
    assert layer_split(7, 3, 1, weights=weights) == (4, 1, 2)
    counts = position_kind_counts(kinds, np.array([3]), np.array([1]), weights=weights)
    assert counts[:, :, 0].tolist() == [[4.0, 0.0], [2.0, 0.0], [0.0, 1.0]]
