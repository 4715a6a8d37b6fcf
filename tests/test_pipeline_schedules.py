"""The pipeline-schedule registry (tpsim/pipeline.py): one entry per name of tpsim.plan.SCHEDULES, its formulas,
the plan and stack rules that refuse what a schedule or a stack cannot run, and every verb honouring the plan's
schedule (estimate, plan)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim import pipeline
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.model import get_preset, with_overrides
from tpsim.pipeline import REGISTRY, WEIGHT_GRAD_SHARE_OF_BACKWARD
from tpsim.plan import SCHEDULES, Plan, make_plan, plan_violation
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster


def _codes(name, n):
    return np.full(n, SCHEDULES.index(name))


def test_one_entry_per_schedule_name_in_order():
    assert tuple(REGISTRY) == SCHEDULES
    assert all(s.source and s.title for s in REGISTRY.values())


def test_bubbles_of_the_papers():
    """Table 2 of the DeepSeek-V3 report and Qi et al. 2024, with F = 1, B = 2 (t = 3), W = B / 2 = 1."""
    pp, vpp, t = np.array([8]), np.array([1]), np.array([3.0])
    b = 2.0 / 3.0
    w = WEIGHT_GRAD_SHARE_OF_BACKWARD * 2.0
    got = {name: float(pipeline.bubble(_codes(name, 1), pp, vpp if REGISTRY[name].chunks != 2 else 2 * vpp, t, b)[0])
           for name in SCHEDULES}
    assert got["1f1b"] == pytest.approx(7 * 3.0) and got["gpipe"] == got["1f1b"]
    assert got["zb-h1"] == pytest.approx(7 * (3.0 - 2 * w))  # ZB1P: (PP - 1)(F + B - 2W)
    assert got["zbv"] == pytest.approx(7 * (3.0 - 3 * w) / 2)  # ZB-V in chunk times
    assert got["dualpipe"] == pytest.approx(3 * (3.0 + 2.0 - 3 * w))  # (PP/2 - 1)(F&B + B - 3W)
    assert got["dualpipev"] == pytest.approx(7 * (3.0 + 2.0 - 3 * w) / 2)
    # interleaving divides the zero-bubble bubble like 1F1B's
    four = np.array([4])
    assert pipeline.bubble(_codes("interleaved-zb", 1), pp, four, t, b)[0] == pytest.approx(got["zb-h1"] / 4)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 64), vpp=st.integers(1, 8), m=st.integers(1, 512), t=st.floats(1e-4, 10.0),
       frac=st.floats(0.0, 1.0), name=st.sampled_from(SCHEDULES))
def test_bubble_and_in_flight_invariants(pp, vpp, m, t, frac, name):
    c, ppa, va, ma = _codes(name, 1), np.array([pp]), np.array([vpp]), np.array([m])
    bub = pipeline.bubble(c, ppa, va, np.array([t]), frac)[0]
    one = pipeline.bubble(_codes("1f1b", 1), ppa, va, np.array([t]), frac)[0]
    assert 0.0 <= bub and np.isfinite(bub)
    assert bub <= one * max(1.0, vpp) + 1e-12  # no schedule is worse than non-interleaved 1F1B
    if pp == 1:
        assert bub == 0.0
    for r in (0, pp - 1):
        f = pipeline.in_flight(c, np.array([r]), ppa, va, ma)[0]
        assert 0.0 < f <= m
    total, exposed = pipeline.pipeline_sends(c, ppa, va, ma, np.array([1.0]))
    assert 0.0 <= exposed[0] <= total[0]


def test_mixed_batch_equals_each_schedule_alone():
    pp, vpp, t = np.array([4, 4, 8, 8]), np.array([1, 2, 1, 2]), np.array([1.0, 2.0, 3.0, 4.0])
    codes = np.array([SCHEDULES.index(s) for s in ("zb-h1", "zbv", "dualpipe", "1f1b")])
    mixed = pipeline.bubble(codes, pp, vpp, t, 0.6)
    alone = [pipeline.bubble(codes[i:i + 1], pp[i:i + 1], vpp[i:i + 1], t[i:i + 1], 0.6)[0] for i in range(4)]
    assert np.allclose(mixed, alone)


@pytest.fixture(scope="module")
def llama():
    m = get_preset("llama3-70b")
    return m, load_cluster("dgx-h100", gpus=64)


def _est(llama, **fields):
    m, c = llama
    plan = make_plan(m, c.num_gpus, **{**dict(tp=8, pp=4, zero=2, sp=True, global_batch=256), **fields})
    return estimate(m, c, plan, stack=load_stack("torchtitan"))


def test_estimates_honour_the_schedule(llama):
    one = _est(llama)
    gpipe = _est(llama, schedule="gpipe")
    izb = _est(llama, schedule="interleaved-zb")
    zbv = _est(llama, schedule="zbv", vpp=2)
    inter = _est(llama, vpp=2)
    assert gpipe.breakdown["bubble"] == pytest.approx(one.breakdown["bubble"])
    assert gpipe.peak_memory_gib > 2 * one.peak_memory_gib  # all micro-batches in flight
    assert izb.breakdown["bubble"] < 0.5 * one.breakdown["bubble"] and izb.peak_memory_gib == one.peak_memory_gib
    assert zbv.breakdown["bubble"] < 0.25 * inter.breakdown["bubble"]
    assert zbv.to_dict()["plan"]["schedule"] == "zbv"


def test_plan_rules_of_the_schedules():
    m = with_overrides(get_preset("llama3-8b"), layers=16)
    base = Plan(tp=1, pp=4, dp=2, global_batch=64)
    assert "needs vpp=2" in plan_violation(m, dataclasses.replace(base, schedule="zbv"), 8)
    assert plan_violation(m, dataclasses.replace(base, schedule="zbv", vpp=2), 8) is None
    assert "needs vpp=1" in plan_violation(m, dataclasses.replace(base, schedule="gpipe", vpp=2), 8)
    assert "even pp" in plan_violation(m, Plan(tp=1, pp=3, dp=2, global_batch=96, schedule="dualpipe"), 6)
    assert "micro-batches >= 2 x pp = 8" in plan_violation(
        m, dataclasses.replace(base, schedule="dualpipe", global_batch=8), 8)
    # without a pipeline the schedule does not matter
    assert plan_violation(m, Plan(tp=1, pp=1, dp=8, global_batch=64, schedule="dualpipe"), 8) is None


def test_stacks_refuse_the_schedules_they_do_not_offer(llama):
    m, c = llama
    plan = make_plan(m, c.num_gpus, tp=8, pp=4, sp=True, global_batch=256, schedule="interleaved-zb")
    with pytest.raises(InputError, match=r"schedule=interleaved-zb is not offered \(offers 1f1b"):
        estimate(m, c, plan, stack=load_stack("megatron"))
    assert load_stack("torchtitan").rules.schedules.keys() == {"1f1b", "gpipe", "interleaved-zb", "zbv",
                                                               "dualpipev"}


def test_cli_estimate_and_plan_honour_schedule(capsys):
    from tpsim.cli import main

    assert main(["estimate", "--model", "llama3-70b", "--stack", "torchtitan", "--zero", "2", "--global-batch",
                 "256", "--schedule", "zbv", "--vpp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["schedule"] == "zbv"
    assert main(["estimate", "--model", "llama3-70b", "--schedule", "zbv", "--vpp", "2"]) == 2
    assert "schedule=zbv is not offered" in capsys.readouterr().err


def test_planner_searches_the_stacks_schedules():
    from tpsim.search import SearchSpace, search

    m = with_overrides(get_preset("llama3-8b"), layers=8)
    c = load_cluster("dgx-h100", gpus=16)
    space = SearchSpace(tp=(2,), pp=(2, 4), vpp=(1, 2), micro_batch=(1,), recompute=("none",), zero=(2,),
                        sp=(True,), order=("tp-dp-pp",), overlap=(True,), cp=(1,))
    titan = search(m, c, 64, space=space, stack=load_stack("torchtitan"), include_unfit=True)
    got = {SCHEDULES[int(k)] for k in titan.columns["schedule"]}
    assert {"1f1b", "gpipe", "interleaved-zb", "zbv", "dualpipev"} <= got
    only = search(m, c, 64, space=dataclasses.replace(space, schedule=("zbv",)), stack=load_stack("torchtitan"),
                  include_unfit=True)
    assert {SCHEDULES[int(k)] for k in only.columns["schedule"]} == {"zbv"}
    assert set(only.columns["vpp"].tolist()) == {2}
    mega = search(m, c, 64, space=dataclasses.replace(space, zero=(1,)), stack=load_stack("megatron"),
                  include_unfit=True)
    assert set(mega.columns["schedule"].tolist()) == {0}


def test_torchtitan_export_writes_the_schedule(llama):
    import tomllib

    from tpsim.launch import export_context, export_plan

    m, c = llama
    for schedule, vpp, name in (("zbv", 2, "ZBVZeroBubble"), ("1f1b", 2, "Interleaved1F1B"), ("1f1b", 1, "1F1B"),
                                ("interleaved-zb", 2, "InterleavedZeroBubble"), ("gpipe", 1, "GPipe")):
        plan = make_plan(m, c.num_gpus, tp=8, pp=4, vpp=vpp, zero=2, sp=True, global_batch=256, schedule=schedule)
        ctx = export_context(m, c, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
        data = tomllib.loads(export_plan("torchtitan", ctx)["torchtitan.toml"])
        assert data["parallelism"]["pipeline_parallel_schedule"] == name
