"""The planner with the real estimator: known answers, ranking rules, batched == single estimate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tpsim.estimator import estimate, estimate_batch
from tpsim.plan import ORDERS
from tpsim.model import load_model
from tpsim.search import SearchSpace, cost_gpu_counts, enumerate_plans, search, violations
from tpsim.topology import load_cluster

SMALL_SPACE = SearchSpace(vpp=(1, 2), micro_batch=(1, 2, 4))


@pytest.fixture(scope="module")
def small():
    """GPT-3 1.3B: fits one 80 GB A100 (18 B/parameter = 23 GiB of model state)."""
    return load_model("gpt3-1.3b"), load_cluster("dgx-a100", gpus=8)


@pytest.fixture(scope="module")
def small_result(small):
    model, cluster = small
    return search(model, cluster, 64, space=SMALL_SPACE, include_unfit=True)


def test_small_model_pure_data_parallelism_ranks_first(small):
    model, cluster = small
    result = search(model, cluster, 64, space=SMALL_SPACE)
    best = result.top(1)[0].to_dict()
    assert (best["tp"], best["pp"], best["dp"]) == (1, 1, 8)
    assert best["fits"]


def test_unfit_plans_never_rank_above_fitting_ones():
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100", gpus=64)
    result = search(model, cluster, 64, space=SearchSpace(vpp=(1,), micro_batch=(1,), order=("tp-dp-pp",)),
                    include_unfit=True)
    fits = result.columns["fits_effective"][result.ranking]
    assert fits.any() and (~fits).any()  # the case is really exercised
    assert np.all(np.diff(fits.astype(int)) <= 0)
    strict = search(model, cluster, 64, space=SearchSpace(vpp=(1,), micro_batch=(1,), order=("tp-dp-pp",)))
    assert strict.columns["fits_effective"][strict.ranking].all()
    # every plan that does not fit is counted under memory: estimated ones, and those whose model states alone
    # exceed the device (not estimated)
    assert strict.rejected["memory"] == int((~result.columns["fits"]).sum()) > int((~strict.columns["fits"]).sum())
    assert result.evaluated - strict.evaluated == strict.rejected["memory"] - int((~strict.columns["fits"]).sum())


def test_every_enumerated_plan_is_accounted_for(small):
    model, cluster = small
    result = search(model, cluster, 64, space=SMALL_SPACE)
    assert result.enumerated == sum(result.rejected.values()) + len(result) + result.duplicates
    assert result.evaluated == result.columns["tp"].size


def test_ranking_is_deterministic_and_sorted(small, small_result):
    model, cluster = small
    again = search(model, cluster, 64, space=SMALL_SPACE, include_unfit=True)
    assert np.array_equal(again.ranking, small_result.ranking)
    fit = small_result.ranking[small_result.columns["fits_effective"][small_result.ranking]]
    assert np.all(np.diff(small_result.columns["step_time_s"][fit]) >= 0)
    assert [p.to_dict() for p in again.top(5)] == [p.to_dict() for p in small_result.top(5)]


AGREE_SPACE = SearchSpace(vpp=(1, 2), micro_batch=(1, 4), order=("tp-dp-pp", "dp-tp-pp", "pp-dp-tp"), cp=(1, 2),
                          recompute=("none", "full"))


def test_batched_search_agrees_with_single_estimate_on_every_plan(small):
    """Every plan of the search equals the same plan estimated in other batches (reversed, in chunks of 7)
    and, on every 4th plan, its single ``estimate`` (a batch of one), algorithms and warnings too."""
    model, cluster = small
    small_result = search(model, cluster, 64, space=AGREE_SPACE, include_unfit=True)
    enum = enumerate_plans(model, 8, 64, AGREE_SPACE)
    valid = np.flatnonzero(violations(model, enum.plans, 8) == 0)  # plan rules and the megatron stack's
    assert small_result.evaluated == valid.size > 500
    cols = small_result.columns
    keys = np.stack([cols[k] for k in ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch",
                                       "overlap", "order", "cp", "cp_kind", "ep", "etp")], 1)
    row_of = {tuple(r): i for i, r in enumerate(keys.tolist())}
    plans = enum.plans.take(valid[::-1])
    other = [estimate_batch(model, cluster, plans.take(slice(s, s + 7))) for s in range(0, len(plans), 7)]
    for k, j in enumerate(valid[::-1]):
        b = enum.plans
        i = row_of[(int(b.tp[j]), int(b.pp[j]), int(b.vpp[j]), int(b.dp[j]), int(b.sp[j]), int(b.recompute[j]),
                    int(b.zero[j]), int(b.micro_batch[j]), int(b.overlap[j]), int(b.order[j]), int(b.cp[j]),
                    int(b.cp_kind[j]), int(b.ep[j]), int(b.etp[j]))]
        again = other[k // 7].to_estimate(k % 7)
        assert again.step_time_s == cols["step_time_s"][i] and again.peak_memory_gib == cols["peak_memory_gib"][i]
        assert again.fits == bool(cols["fits"][i])
        if k % 4:
            continue
        single = estimate(model, cluster, enum.plans.plan(int(j)))
        assert np.isclose(single.step_time_s, cols["step_time_s"][i], rtol=1e-12)
        assert np.isclose(single.peak_memory_gib, cols["peak_memory_gib"][i], rtol=1e-12)
        assert single.fits == bool(cols["fits"][i])
        assert small_result.batch_estimate(i).to_dict() == single.to_dict() == again.to_dict()
    assert small_result.estimate(int(small_result.ranking[0])).collectives


def test_objectives_memory_and_cost(small):
    model, cluster = small
    mem = search(model, cluster, 64, space=SMALL_SPACE, objective="memory")
    assert np.all(np.diff(mem.columns["peak_memory_gib"][mem.ranking]) >= 0)
    clusters = [load_cluster("dgx-a100", gpus=n) for n in cost_gpu_counts(8, 32)]
    assert [c.num_gpus for c in clusters] == [8, 16, 32]
    cost = search(model, clusters, 64, space=SMALL_SPACE, objective="cost", gpu_hour_price=2.0)
    c = cost.columns
    assert set(np.unique(c["gpus"])) == {8, 16, 32}
    assert np.all(np.diff(c["cost_per_mtok"][cost.ranking]) >= 0)
    i = cost.ranking[0]
    assert np.isclose(c["cost_per_mtok"][i], c["gpus"][i] * 2.0 / 3600 / c["tokens_per_s"][i] * 1e6)
    front = cost.pareto_gpus_throughput()
    assert np.all(np.diff(c["gpus"][front]) > 0) and np.all(np.diff(c["tokens_per_s"][front]) > 0)


def test_mem_limit_rejects_and_pareto(small):
    model, cluster = small
    full = search(model, cluster, 64, space=SMALL_SPACE)
    limit = float(np.median(full.columns["peak_memory_gib"][full.ranking]))
    limited = search(model, cluster, 64, space=SMALL_SPACE, mem_limit_gib=limit)
    assert limited.rejected["mem-limit"] > 0
    assert np.all(limited.columns["peak_memory_gib"][limited.ranking] <= limit)
    front = full.pareto_time_memory()
    mem, t = full.columns["peak_memory_gib"], full.columns["step_time_s"]
    assert np.all(np.diff(mem[front]) > 0) and np.all(np.diff(t[front]) < 0)
    best = full.ranking[0]  # the fastest plan is on the front (or ties exactly with a plan on it)
    assert any(t[i] == t[best] and mem[i] == mem[best] for i in front)


def test_json_plans_carry_plan_fields_and_estimate_fields(small_result):
    out = small_result.to_json(3)
    assert {"plans", "evaluated", "rejected", "enumerated"} <= set(out)
    plan = out["plans"][0]
    for key in ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch", "overlap", "order",
                "step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_gib", "fits", "breakdown", "memory_gib"):
        assert key in plan, key
    b = plan["breakdown"]
    assert np.isclose(sum(b[k] for k in ("compute", "recompute", "bubble", "optimizer", "exposed_comm",
                                         "overhead")), plan["step_time_s"], rtol=1e-9)


def test_bad_arguments_raise_input_errors(small):
    from tpsim.errors import InputError

    model, cluster = small
    with pytest.raises(InputError, match="objective='speed'"):
        search(model, cluster, 64, objective="speed")
    with pytest.raises(InputError, match="gpu_hour_price"):
        search(model, cluster, 64, gpu_hour_price=-1)
    with pytest.raises(InputError, match="max_tp=0"):
        SearchSpace(max_tp=0)
    with pytest.raises(InputError, match="recompute='some'"):
        SearchSpace(recompute=("some",))


@settings(max_examples=12, deadline=None)
@given(layers=st.integers(2, 8), heads=st.sampled_from([4, 8, 12, 16]), kv=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([512, 1024, 2048]), gpus=st.sampled_from([8, 16]), batch=st.sampled_from([16, 24, 64]),
       objective=st.sampled_from(["time", "memory"]))
def test_search_invariants_on_random_models(layers, heads, kv, seq, gpus, batch, objective):
    from tpsim.model import ModelSpec
    from tpsim.plan import plan_violation

    model = ModelSpec(name="random", family="llama", num_layers=layers, hidden_size=heads * 64,
                      num_attention_heads=heads, num_kv_heads=kv, ffn_hidden_size=heads * 64 * 3,
                      vocab_size=32000, seq_len=seq, max_positions=seq, norm="rmsnorm", activation="swiglu",
                      position="rotary", qkv_bias=False, linear_bias=False)
    cluster = load_cluster("dgx-h100", gpus=gpus)
    space = SearchSpace(vpp=(1, 2), micro_batch=(1, 2), order=("tp-dp-pp", "dp-tp-pp"))
    result = search(model, cluster, batch, space=space, objective=objective, include_unfit=True)
    c = result.columns
    assert result.enumerated == sum(result.rejected.values()) + len(result) + result.duplicates
    assert np.all(np.isfinite(c["step_time_s"])) and np.all(c["step_time_s"] > 0)
    fits = c["fits_effective"][result.ranking]
    assert np.all(np.diff(fits.astype(int)) <= 0)
    key = c["step_time_s"] if objective == "time" else c["peak_memory_gib"]
    for group in (result.ranking[fits], result.ranking[~fits]):
        assert np.all(np.diff(key[group]) >= 0)
    for i in result.ranking[:20]:
        assert plan_violation(model, result.plan(int(i)), gpus) is None


# ---- twins: plans equal up to rank order and overlap with the same prediction are one row -----------------
def _brute_twin_sets(cols) -> dict:
    """(plan fields but order/overlap, step time, memory) -> rows: the twin sets by definition (exact
    equality, which is what the estimator gives for these twins)."""
    from tpsim.search.planner import PLAN_FIELDS

    keys = [k for k in ("gpus",) + PLAN_FIELDS if k not in ("order", "overlap")]
    sets: dict = {}
    for i in range(cols["tp"].size):
        key = tuple(int(cols[k][i]) for k in keys) + (float(cols["step_time_s"][i]),
                                                      float(cols["peak_memory_gib"][i]))
        sets.setdefault(key, []).append(i)
    return sets


def test_twins_are_collapsed_into_one_ranked_row(small_result):
    cols, ranking = small_result.columns, small_result.ranking
    twin_of = cols["twin_of"]
    position = {int(i): k for k, i in enumerate(ranking)}
    sets = _brute_twin_sets(cols)
    assert any(len(rows) > 1 for rows in sets.values())  # the case is really exercised
    for rows in sets.values():
        ranked = [i for i in rows if i in position]
        assert len(ranked) == 1  # include_unfit: every set has exactly one ranked row ...
        assert all(twin_of[i] == ranked[0] for i in rows)  # ... that stands for all of them
    assert len(ranking) == len(sets)
    assert small_result.duplicates == cols["tp"].size - len(ranking)


def test_variants_list_the_twins_in_json_and_table(small_result):
    cols = small_result.columns
    plans = small_result.to_json(top=None)["plans"]
    assert sum(len(p["variants"]) for p in plans) == cols["tp"].size  # every evaluated plan is listed once
    for p in plans:
        first = p["variants"][0]
        assert (first["order"], first["overlap"]) == (p["order"], p["overlap"])
        assert len({(v["order"], v["overlap"]) for v in p["variants"]}) == len(p["variants"])
    multi = next(p for p in plans if len(p["variants"]) > 1)
    i = int(small_result.ranking[multi["rank"] - 1])
    for v, j in zip(multi["variants"], small_result.variants(i)):
        assert (cols["step_time_s"][j], cols["peak_memory_gib"][j]) == (cols["step_time_s"][i],
                                                                        cols["peak_memory_gib"][i])
        assert v["order"] == ORDERS[int(cols["order"][j])] and v["overlap"] == bool(cols["overlap"][j])
    table = small_result.table(top=None)
    assert table["variants"].tolist() == [len(p["variants"]) for p in plans]
    row = table.iloc[multi["rank"] - 1]
    others = len({v["order"] for v in multi["variants"]}) - 1
    assert row["order"] == multi["order"] + (f"+{others}" if others else "")


def _synthetic(times, groups, overlap, order, memory=None):
    n = len(times)
    cols = {k: np.zeros(n, dtype=np.int64) for k in ("gpus", "tp", "pp", "vpp", "dp", "recompute", "zero",
                                                      "micro_batch")}
    cols["tp"] = np.asarray(groups, dtype=np.int64)
    cols.update(sp=np.zeros(n, dtype=bool), overlap=np.asarray(overlap, dtype=bool),
                order=np.asarray(order, dtype=np.int64), step_time_s=np.asarray(times, dtype=float),
                peak_memory_gib=np.asarray(memory if memory is not None else np.ones(n), dtype=float))
    return cols


def test_overlap_twins_collapse_to_the_better_ranked_row():
    from tpsim.search.planner import _twin_of

    # rows 0/1: same plan, overlap on/off, same time: twins; rows 2/3: overlap changes the time: not twins;
    # row 4: another plan (tp) with row 0's time: not a twin; row 5: order differs by float noise only
    cols = _synthetic(times=[1.0, 1.0, 2.0, 2.5, 1.0, 1.0 * (1 + 1e-13)], groups=[1, 1, 2, 2, 3, 1],
                      overlap=[True, False, True, False, True, True], order=[0, 0, 0, 0, 0, 2])
    order = np.array([1, 0, 5, 4, 2, 3])  # ranked by time; the overlap-off row first among equals
    assert _twin_of(cols, order).tolist() == [1, 1, 2, 3, 4, 1]
    cols["peak_memory_gib"][5] = 2.0  # same time, more memory: not a twin
    assert _twin_of(cols, order).tolist() == [1, 1, 2, 3, 4, 5]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 60))
def test_twin_sets_property(data, n):
    from tpsim.search.planner import TWIN_RTOL, _twin_of

    groups = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    base = data.draw(st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=n, max_size=n))
    noise = data.draw(st.lists(st.sampled_from([0.0, 1e-14, 1e-3]), min_size=n, max_size=n))
    cols = _synthetic(times=np.array(base) * (1 + np.array(noise)), groups=groups,
                      overlap=data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                      order=data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
    # a ranking as _rank makes one: by step time, ties broken in any order (here: a random permutation)
    ties = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    order = np.lexsort((ties, cols["step_time_s"]))
    twin_of = _twin_of(cols, order)
    position = np.argsort(order)
    t, g = cols["step_time_s"], cols["tp"]
    assert np.array_equal(twin_of[twin_of], twin_of)  # a representative stands for itself
    assert np.all(g[twin_of] == g)
    assert np.all(np.abs(t[twin_of] - t) <= 2 * TWIN_RTOL * t)
    assert np.all(position[twin_of] <= position)  # the best-ranked of each set stands for it
    reps = np.unique(twin_of)
    for a in reps:  # two representatives are never twins of each other
        for b in reps[reps > a]:
            assert g[a] != g[b] or abs(t[a] - t[b]) > TWIN_RTOL * max(t[a], t[b])


def test_planner_keeps_the_memory_headroom_estimate_does_not():
    """Issue 19: the planner's plans leave planner_headroom_fraction of the device memory free (the plans that
    fit with less are rejected as "headroom"), while estimate's fits still accepts them; the headroom is in the
    table (free_GiB) and the JSON (memory_headroom_gib, planner_headroom_fraction)."""
    from tpsim.search.planner import planner_headroom_fraction

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", gpus=64)
    space = SearchSpace(tp=(4, 8), pp=(2, 4, 8), vpp=(1,), micro_batch=(1, 2), zero=(1,), order=("tp-dp-pp",),
                        overlap=(True,))
    frac = planner_headroom_fraction()
    assert 0.03 <= frac <= 0.15
    device_gib = cluster.device.usable_memory_bytes / 2**30
    kept = search(model, cluster, 512, space=space)
    every = search(model, cluster, 512, space=space, include_unfit=True)
    c = every.columns
    tight = c["fits"] & (c["headroom_gib"] < frac * device_gib)
    assert tight.any() and kept.rejected["headroom"] == int(tight.sum())
    assert not c["fits_effective"][tight].any()
    peaks = kept.columns["peak_memory_gib"][kept.ranking]
    assert peaks.size and np.all(peaks <= (1 - frac) * device_gib + 1e-9)
    out = kept.to_json(3)
    assert out["planner_headroom_fraction"] == frac
    for p in out["plans"]:
        assert p["memory_headroom_gib"] == pytest.approx(device_gib - p["peak_memory_gib"], rel=1e-9)
        assert p["memory_headroom_gib"] >= frac * device_gib - 1e-9
    assert "free_GiB" in kept.table_columns(3)
    i = int(np.flatnonzero(tight)[0])  # a plan the planner rejects for its headroom still fits for estimate
    assert every.estimate(i).fits
