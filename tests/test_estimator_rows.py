"""A plan's estimate does not depend on the batch it was computed in; the planner shows rows of its own batch
(no estimate per displayed plan); the context owns the caches (nothing on the cluster or collective model)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.estimator import context_for, estimate, estimate_batch
from tpsim.model import load_model, with_overrides
from tpsim.plan import PlanBatch
from tpsim.search import SearchSpace, enumerate_plans, search, violations
from tpsim.topology import load_cluster


@pytest.fixture(scope="module")
def problem():
    model = with_overrides(load_model("llama3-8b"), layers=8)
    cluster = load_cluster("dgx-h100", gpus=32)
    enum = enumerate_plans(model, 32, 128, SearchSpace(vpp=(1, 2), micro_batch=(1, 2)))
    plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, 32) == 0))
    return model, cluster, plans


def test_rows_do_not_depend_on_the_batch(problem):
    model, cluster, plans = problem
    whole = estimate_batch(model, cluster, plans)
    rng = np.random.default_rng(1)
    for size in (1, 2, 65, 300):
        rows = rng.choice(len(plans), size=size, replace=False)
        part = estimate_batch(model, cluster, plans.take(rows))
        for j, i in enumerate(rows):
            assert part.to_estimate(j).to_dict() == whole.to_estimate(int(i)).to_dict()


def test_algorithm_names_are_always_there(problem):
    model, cluster, plans = problem
    batch = estimate_batch(model, cluster, plans)
    assert len(batch) > 64
    for i in range(0, len(batch), 37):
        names = batch.to_estimate(i).collectives
        plan = batch.plans.plan(i)
        # the gradient reduction ("dp") spans dp x cp
        axes = (("tp", plan.tp), ("cp", plan.cp), ("dp", plan.dp * plan.cp), ("pp", plan.pp))
        assert set(names) == {a for a, n in axes if n > 1}


def test_planner_shows_rows_of_its_batch_without_estimating_again(problem, monkeypatch):
    model, cluster, _ = problem
    result = search(model, cluster, 128, space=SearchSpace(vpp=(1, 2), micro_batch=(1, 2)))
    import tpsim.estimator as est
    import tpsim.estimator.core as core

    def refuse(*args, **kwargs):
        raise AssertionError("the planner re-ran the estimator for a displayed plan")

    monkeypatch.setattr(est, "estimate", refuse)
    monkeypatch.setattr(core, "estimate", refuse)
    monkeypatch.setattr(est, "estimate_batch", refuse)
    top = result.top(5)
    monkeypatch.undo()
    for ranked in top:
        plan = result.plan(int(result.ranking[ranked.rank - 1]))
        assert ranked.estimate == estimate(model, cluster, plan).to_dict()


def test_a_cached_result_without_batches_evaluates_its_rows_once(problem):
    model, cluster, _ = problem
    result = search(model, cluster, 128, space=SearchSpace(vpp=(1,), micro_batch=(1, 2)))
    bare = dataclasses.replace(result, parts=tuple(dataclasses.replace(p, chunks=(), offsets=()) for p in result.parts),
                               memo={})
    assert [r.to_dict() for r in bare.top(4)] == [r.to_dict() for r in result.top(4)]


def test_the_context_owns_the_caches(problem):
    model, cluster, plans = problem
    estimate_batch(model, cluster, plans.take(np.arange(10)))
    from tpsim.collectives.model import get_collective_model

    assert not [k for k in vars(cluster) if "estimator" in k]
    assert not [k for k in vars(get_collective_model(cluster)) if "estimator" in k]
    ctx = context_for(model, cluster)
    assert ctx is context_for(model, cluster)
    assert ctx.caches.curves.curves and ctx.caches.layers
    other = load_cluster("dgx-h100", gpus=64)
    elsewhere = context_for(model, other)
    assert elsewhere is not ctx and elsewhere.caches.curves is not ctx.caches.curves
    assert elsewhere.collectives is not ctx.collectives
    # another compute model on the same cluster: a new context, the same collective curves
    from tpsim.compute.roofline import RooflineModel

    roofline = RooflineModel(cluster.device)
    again = context_for(model, cluster, roofline)
    assert again is not ctx and again.caches.curves is ctx.caches.curves and again.caches.layers == {}
    assert len(ctx.fingerprint()) == 64 and ctx.fingerprint() != context_for(model, other).fingerprint()


def test_single_plan_batch_equals_estimate(problem):
    model, cluster, plans = problem
    plan = plans.plan(3)
    one = estimate_batch(model, cluster, PlanBatch.from_plans([plan])).to_estimate(0)
    assert one.to_dict() == estimate(model, cluster, plan).to_dict()


def test_a_collective_nothing_uses_builds_no_curve():
    """Issue 9: a ZeRO-1 plan reduce-scatters its gradients; its dp all-reduce moves nothing, so its curve (the
    costliest kind at 131k GPUs: groups of 1024 ranks) is not built, and the estimate is what a batch that
    also holds a ZeRO-0 plan (whose all-reduce curve is built) gives for it."""
    from tpsim.plan import make_plan

    model = with_overrides(load_model("llama3-8b"), layers=4)
    cluster = load_cluster("dgx-h100", gpus=64)
    z1 = make_plan(model, 64, tp=8, pp=1, zero=1, global_batch=64)
    alone = estimate(model, cluster, z1)
    built = {(axes, op) for axes, op in context_for(model, cluster).caches.curves.tables}
    assert (("dp", "cp"), "reduce_scatter") in built and (("dp", "cp"), "all_reduce") not in built
    assert alone.collectives["dp"].startswith("reduce_scatter")
    both = estimate_batch(model, cluster, PlanBatch.from_plans([make_plan(model, 64, tp=8, pp=1, zero=0,
                                                                          global_batch=64), z1]))
    assert (("dp", "cp"), "all_reduce") in context_for(model, cluster).caches.curves.tables
    assert both.to_estimate(1).to_dict() == alone.to_dict()
    assert both.to_estimate(0).collectives["dp"].startswith("all_reduce")


def test_pattern_store_keeps_rows_across_batches_and_restarts_when_they_differ(monkeypatch):
    """Rows asked again are not built again; new rows of another structure (or past the byte bound) start
    the store again from the batch's own rows; every returned row holds its key's result."""
    from tpsim.estimator import caches

    built = []

    def build_for(keys, extra=False):
        def build(which):
            built.append(keys[which, 0].tolist())
            out = {"v": keys[which, 0] * 10.0 + keys[which, 1]}
            if extra:
                out["w"] = keys[which, 0] * 1.0
            return out
        return build

    def check(store, keys, rows):
        assert store.value["v"][rows].tolist() == (keys[:, 0] * 10.0 + keys[:, 1]).tolist()

    store = caches.PatternStore()
    a = np.array([[1, 2], [3, 4], [5, 6]])
    check(store, a, store.rows(a, build_for(a)))
    b = np.array([[5, 6], [7, 8], [1, 2]])
    check(store, b, store.rows(b, build_for(b)))
    assert built == [[1, 3, 5], [7]] and len(store.keys) == 4
    c = np.array([[7, 8], [9, 9]])
    rows = store.rows(c, build_for(c, extra=True))  # another structure: only c's rows, built again
    check(store, c, rows)
    assert built[2:] == [[9], [7, 9]] and len(store.keys) == 2 and set(store.value) == {"v", "w"}
    monkeypatch.setattr(caches, "MEMO_BYTES", store.nbytes + 8)
    d = np.array([[2, 2], [9, 9], [4, 4]])
    rows = store.rows(d, build_for(d, extra=True))  # past the bound: only d's rows
    check(store, d, rows)
    assert built[4:] == [[2, 4], [2, 9, 4]] and len(store.keys) == 3


def test_pattern_store_lookup_matches_a_dict_of_the_kept_rows():
    """The packed lookup of kept rows (packed once, again when rows are added or a batch's values exceed the
    packing's radix) finds exactly the rows a dict of the kept key rows gives, -1 for the others."""
    from tpsim.estimator import caches

    rng = np.random.default_rng(5)
    store = caches.PatternStore()
    kept = rng.integers(0, 6, size=(40, 3))
    kept[:, 1] = 0  # a column of zeros
    store.keys = np.unique(kept, axis=0)  # kept rows are distinct
    at = {tuple(r): i for i, r in enumerate(store.keys.tolist())}
    for top in (6, 6, 9):  # the second batch reuses the packing, the third exceeds its radix
        asked = rng.integers(0, top, size=(30, 3))
        asked[:, 1] = rng.integers(0, 2, size=30)
        expected = [at.get(tuple(r), -1) for r in asked.tolist()]
        assert store._find(asked).tolist() == expected
    assert store.packed is not None and store.packed[0].tolist() == [9, 2, 9]
    assert (np.array(expected) >= 0).any() and (np.array(expected) < 0).any()


def test_chunks_in_any_order_give_the_rows_of_the_whole_batch(problem):
    """The kept communication patterns of earlier chunks give the same rows as the whole batch."""
    model, cluster, plans = problem
    ctx = context_for(model, cluster)
    ctx.clear_results()
    whole = estimate_batch(model, cluster, plans)
    ctx.clear_results()
    order = np.random.default_rng(2).permutation(len(plans))
    for chunk in np.array_split(order, 5):
        part = estimate_batch(model, cluster, plans.take(chunk))
        for j in range(0, len(chunk), 7):
            assert part.to_estimate(j).to_dict() == whole.to_estimate(int(chunk[j])).to_dict()
    assert len(ctx.pattern_store(plans.dtype, plans.attention).keys) > 0


def test_distinct_rows_whose_packed_key_would_overflow():
    """Columns of byte counts (about 1e9 each: their packed key passes 2**63) are grouped by sorting the rows,
    and give the distinct rows of np.unique; small columns keep the packed key (same result)."""
    from tpsim.estimator.keys import distinct

    rng = np.random.default_rng(3)
    big = [rng.choice([3e9, 5e9, 7e9], size=40) for _ in range(3)]
    small = [rng.integers(0, 4, size=40) for _ in range(3)]
    for cols in (big, small):
        keys = distinct(*cols)
        rows = np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1)
        assert keys.rows.tolist() == np.unique(rows, axis=0).tolist()
        assert (keys.rows[keys.inverse] == rows).all() and (rows[keys.first] == keys.rows).all()


def test_argmax_rows_is_numpys_argmax_with_ties_and_nans():
    """The first row of each column's maximum, as np.argmax(axis=0), ties (the first) and NaN included."""
    from tpsim.estimator.keys import argmax_rows

    rng = np.random.default_rng(3)
    for rows in (1, 2, 3, 4, 5):
        a = rng.integers(0, 3, size=(rows, 600)).astype(float)  # many ties
        a[:, :5] = -1.0
        assert argmax_rows(a).tolist() == np.argmax(a, axis=0).tolist()
        a[rows // 2, 7] = np.nan
        assert argmax_rows(a).tolist() == np.argmax(a, axis=0).tolist()
