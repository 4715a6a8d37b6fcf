"""DualPipe (DeepSeek-V3's schedule, tpsim/data/stacks/hai-llm.yaml): the bubble of the report's Table 2, the
expert-parallel all-to-alls hidden behind the paired chunk's computation, FP8 dispatch and node-limited
deduplication of the all-to-all bytes; every other stack unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.pipeline import WEIGHT_GRAD_SHARE_OF_BACKWARD, bubble
from tpsim.estimator.source import moe_layer_collectives
from tpsim.estimator.stackterms import stack_terms
from tpsim.model import get_preset
from tpsim.plan import SCHEDULES, make_plan
from tpsim.stacks import STACKS_DIR, load_stack, profile_from_mapping
from tpsim.topology import load_cluster


def pipeline_bubble(name, pp, vpp, t, fraction):
    return bubble(np.full(pp.size, SCHEDULES.index(name)), pp, vpp, t, fraction)


def test_bubble_formulas():
    pp, vpp, t = np.array([1, 2, 4, 16]), np.ones(4), np.full(4, 3.0)
    assert np.allclose(pipeline_bubble("1f1b", pp, vpp, t, 2 / 3), (pp - 1) * 3.0)
    # DualPipe: (PP/2 - 1)(F&B + B - 3W), F&B = F + B = t, B = 2, W = B / 2
    b, w = 2.0, WEIGHT_GRAD_SHARE_OF_BACKWARD * 2.0
    assert np.allclose(pipeline_bubble("dualpipe", pp, vpp, t, 2 / 3), np.maximum(pp / 2 - 1, 0) * (3.0 + b - 3 * w))
    assert pipeline_bubble("dualpipe", pp, vpp, t, 2 / 3)[3] < 0.5 * pipeline_bubble("1f1b", pp, vpp, t, 2 / 3)[3]


def _axes(n=1, act_bytes=2.0):
    one = np.ones(n, dtype=np.int64)
    return dict(tp=one, sp=np.zeros(n, dtype=bool), cp=one, ep=64 * one, etp=one, micro_batch=one,
                act_bytes=act_bytes)


def test_dispatch_bytes_fp8_and_node_dedup():
    m = get_preset("deepseek-v3")
    base = moe_layer_collectives(m, _axes())
    a2a = [c for c in base if c.op == "all_to_all"]
    assert len(a2a) == 2 and all(np.all(c.hide == 0.0) for c in a2a) and all(c.count == 2.0 for c in a2a)
    fp8 = [c for c in moe_layer_collectives(m, _axes(), fp8_dispatch=True) if c.op == "all_to_all"]
    assert np.allclose(fp8[0].nbytes, base[0].nbytes * 0.75)  # one of the two in 1 byte, the other in 2
    dedup = [c for c in moe_layer_collectives(m, _axes(), node_dedup=True) if c.op == "all_to_all"]
    assert m.router_group_topk == 4 and m.experts_per_token == 8
    assert np.allclose(dedup[0].nbytes, base[0].nbytes * 4 / 8)  # 8 copies reach at most 4 nodes
    mixtral = get_preset("mixtral-8x7b")  # no group-limited routing: nothing to deduplicate
    assert np.allclose([c.nbytes for c in moe_layer_collectives(mixtral, _axes(), node_dedup=True)],
                       [c.nbytes for c in moe_layer_collectives(mixtral, _axes())])
    fwd, bwd = np.array([0.01]), np.array([0.02])
    paired = {c.phase: c for c in moe_layer_collectives(m, _axes(), paired=(fwd, bwd)) if c.op == "all_to_all"}
    assert paired["fwd"].hide == bwd and paired["bwd"].hide == fwd


@pytest.fixture(scope="module")
def deepseek():
    m = get_preset("deepseek-v3")
    fields = dict(m.default_plan)
    cluster = load_cluster(fields.pop("cluster"), gpus=fields.pop("gpus"))
    fields.pop("stack")
    return m, cluster, make_plan(m, cluster.num_gpus, global_batch=m.global_batch, schedule="dualpipe", **fields)


def _hai_llm(changes):
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    for (section, key), value in changes.items():
        raw[section][key]["value"] = value
    return profile_from_mapping(raw, "hai-llm-variant.yaml")


def _hai_llm_1f1b():
    """hai-llm offering 1F1B too (the report's Table 2 baseline)."""
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    raw["rules"]["schedules"]["names"]["1f1b"] = "1F1B"
    return profile_from_mapping(raw, "hai-llm-1f1b.yaml")


def test_dualpipe_hides_the_all_to_alls_and_shrinks_the_bubble(deepseek):
    m, cluster, plan = deepseek
    dual = estimate(m, cluster, plan, stack=load_stack("hai-llm"))
    one = estimate(m, cluster, dataclasses.replace(plan, schedule="1f1b"), stack=_hai_llm_1f1b())
    assert dual.breakdown["ep_comm"] == pytest.approx(one.breakdown["ep_comm"])  # the same traffic ...
    assert dual.breakdown["exposed_comm"] < 0.5 * one.breakdown["exposed_comm"]  # ... mostly hidden
    assert dual.breakdown["bubble"] < 0.5 * one.breakdown["bubble"]
    assert dual.breakdown["compute"] == pytest.approx(one.breakdown["compute"])
    plain = estimate(m, cluster, plan, stack=_hai_llm({("comm", "ep_dispatch_dtype"): "bf16",
                                                       ("comm", "ep_node_dedup"): False}))
    assert dual.breakdown["ep_comm"] < 0.5 * plain.breakdown["ep_comm"]


def test_other_stacks_keep_1f1b_and_plain_dispatch():
    for name in ("megatron", "torchtitan", "deepspeed"):
        t = stack_terms(load_stack(name))
        assert (load_stack(name).rules.default_schedule, t.ep_fp8_dispatch, t.ep_node_dedup) == ("1f1b", False,
                                                                                                  False)


def test_stack_schedules_are_checked():
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    raw["rules"]["schedules"]["names"]["zigzag"] = "x"
    with pytest.raises(InputError, match=r"schedules: names\.zigzag: not one of 1f1b"):
        profile_from_mapping(raw, "bad.yaml")
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    raw["rules"]["schedules"]["default"] = "zbv"
    with pytest.raises(InputError, match=r"default='zbv' is not one of the offered schedules dualpipe"):
        profile_from_mapping(raw, "bad.yaml")


@pytest.mark.parametrize("section,key,value,match", [
    ("comm", "ep_dispatch_dtype", "int4", r"comm\.ep_dispatch_dtype='int4' is not one of bf16, fp8"),
])
def test_bad_schedule_figures_are_one_line_errors(section, key, value, match):
    with pytest.raises(InputError, match=match):
        stack_terms(_hai_llm({(section, key): value}))
