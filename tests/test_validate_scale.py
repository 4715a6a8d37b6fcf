"""Fitting block, whole-plan and context/expert-parallel cases to a machine (one shrink rule for all three), and
the JSON form the three case kinds share (torch-free)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tpsim.errors import InputError
from tpsim.model import PRESETS, with_overrides
from tpsim.validate.axis.case import AxisCase
from tpsim.validate.axis.scale import fit_axis_case
from tpsim.validate.axis.scale import memory_per_rank as axis_memory
from tpsim.validate.block.case import Case
from tpsim.validate.plan.case import PlanCase
from tpsim.validate.block.scale import MEMORY_SHARE, MIN_SEQ, fit_plan_case, mark_scaled, plan_memory_per_rank, shrink

LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=512, heads=8, kv_heads=2, ffn=1536, seq_len=4096, layers=1)
GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=256, heads=8, ffn=1024, seq_len=2048, layers=4)


@pytest.fixture(scope="module")
def machine():
    from tpsim.compute.roofline import RooflineModel
    from tpsim.topology import load_cluster
    cluster = load_cluster("local-cpu", gpus=4)
    return cluster, RooflineModel(cluster.device)


def test_shrink_halves_the_sequence_in_steps_then_the_batch():
    case = Case(model=LLAMA, tp=2, micro_batch=3)
    seen = []
    fitted = shrink(case, 3 * 2**7, lambda c: seen.append((c.model.seq_len, c.micro_batch)) or c.model.seq_len > 1024)
    # 4096 / 2 = 2048 is not a multiple of 384: the sequence stays and the batch goes to 1
    assert seen == [(4096, 3), (4096, 1)] and (fitted.model.seq_len, fitted.micro_batch) == (4096, 1)
    fitted = shrink(case, 2, lambda c: True)
    assert (fitted.model.seq_len, fitted.micro_batch) == (MIN_SEQ, 1)
    assert shrink(case, 2, lambda c: False) is case


def test_mark_scaled_says_what_was_reduced():
    case = PlanCase(model=GPT, tp=2, scaled="recompute full not run")
    smaller = dataclasses.replace(case, model=with_overrides(GPT, seq_len=256), micro_batch=1)
    assert mark_scaled(case, case, keep=True) is case
    assert mark_scaled(case, smaller).scaled == "seq_len 2048->256 (to fit this machine; widths unchanged)"
    assert mark_scaled(case, smaller, keep=True).scaled == ("recompute full not run; seq_len 2048->256 "
                                                            "(to fit this machine; widths unchanged)")


def test_plan_case_fits_memory_and_keeps_its_earlier_note(machine):
    _, compute = machine
    case = PlanCase(model=GPT, tp=2, pp=2, microbatches=2, scaled="x")
    memory = 4 * plan_memory_per_rank(dataclasses.replace(case, model=with_overrides(GPT, seq_len=512))) / MEMORY_SHARE
    fitted = fit_plan_case(case, 4, compute, budget_s=1e9, memory_bytes=memory)
    assert fitted.model.seq_len == 512
    assert fitted.scaled == "x; seq_len 2048->512 (to fit this machine; widths unchanged)"
    with pytest.raises(InputError, match=r"^a 4-layer gpt3-1.3b stack needs .* give smaller --hidden/--ffn or fewer"):
        fit_plan_case(case, 4, compute, budget_s=1e9, memory_bytes=2**20)
    with pytest.raises(InputError, match=r"stack with microbatches=2 would run ~\d+ s per rank even at seq_len=128"):
        fit_plan_case(case, 4, compute, budget_s=1e-9, memory_bytes=2**40)


def test_axis_case_halves_to_multiples_of_two_cp(machine):
    cluster, compute = machine
    case = AxisCase(model=with_overrides(LLAMA, seq_len=3 * 2**10), cp=4, micro_batch=2)
    fitted = fit_axis_case(case, 4, cluster, compute, budget_s=1e-9, memory_bytes=2**40)
    # 3072 -> 1536 -> 768 -> 384 -> 192 (each a multiple of 8); 96 < MIN_SEQ: then the batch
    assert (fitted.model.seq_len, fitted.micro_batch) == (192, 1)
    assert fitted.scaled == "seq_len 3072->192; micro_batch 2->1 (to fit this machine; widths unchanged)"
    assert axis_memory(fitted) < MEMORY_SHARE * 2**40 / 4
    with pytest.raises(InputError, match=r"^a llama3-8b layer needs .*give smaller --hidden/--ffn/--experts$"):
        fit_axis_case(case, 4, cluster, compute, budget_s=1e9, memory_bytes=2**20)


def test_json_kind_of_each_case():
    block = Case(model=LLAMA, tp=2)
    plan = PlanCase(model=GPT, tp=2)
    axis = AxisCase(model=LLAMA, cp=2)
    assert "kind" not in block.to_dict()
    assert (plan.to_dict()["kind"], axis.to_dict()["kind"]) == ("plan", "axis")
    assert list(axis.to_dict())[-2:] == ["model", "kind"]
    for c in (plan, axis):
        assert type(c).from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert Case.from_dict(json.loads(json.dumps(block.to_dict()))) == block
    with pytest.raises(InputError, match=r"^microbatches=0 must be a positive integer$"):
        PlanCase(model=GPT, microbatches=0)
    with pytest.raises(InputError, match=r"^warmup=-1 must be >= 0$"):
        AxisCase(model=LLAMA, cp=2, warmup=-1)
