"""The runs CSV (docs/RUNS.md): the loader, the measurement conversion, the shipped development set and SC21."""

from __future__ import annotations

import csv
import math

import pytest

from tpsim.errors import InputError
from tpsim.estimator.flops import model_flops_per_sequence_as
from tpsim.runs import (DEVELOPMENT_CSV, MEASUREMENTS, SC21_CSV, check_run_stack, load_runs, parse_runs,
                        step_time_from)

# rows the estimator refuses today, with the rule (for fid / step to fix): none at present
REFUSED: dict[str, str] = {}


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@pytest.mark.parametrize("path", [DEVELOPMENT_CSV, SC21_CSV], ids=["development", "sc21"])
def test_shipped_files_load(path):
    runs = load_runs(path, check_stack=False)
    raw = _rows(path)
    assert [r.run_id for r in runs] == [r["run_id"] for r in raw]
    for run, row in zip(runs, raw):
        assert run.source and run.notes, run.run_id  # every row says where it comes from and what was chosen
        assert math.isfinite(run.measured) and run.measured > 0
        assert run.measured_as == next(m for m in MEASUREMENTS if row.get(m))


def _all_runs():
    return load_runs(DEVELOPMENT_CSV, check_stack=False) + load_runs(SC21_CSV, check_stack=False)


@pytest.mark.parametrize("run", _all_runs(), ids=lambda r: r.run_id)
def test_every_shipped_plan_is_valid(run):
    if run.run_id in REFUSED:
        pytest.xfail(REFUSED[run.run_id])
    check_run_stack(run)


def test_development_set_covers_the_shared_files():
    ids = {r.run_id for r in load_runs(DEVELOPMENT_CSV, check_stack=False)}
    # 11 Megatron-Core + 12 NeMo + 15 MPT + 26 torchtitan + 3 DeepSpeed ZeRO-3 rows of ../shared/data/runs
    assert len(ids) == 67
    assert {"meg_h100_strong_177B_96gpu", "nemo2407_LLAMA3-70B_64gpu", "tt_paper_t5_8b_8gpu_fsdp1_cp8",
            "mpt_a100_40gb_1b_s2048_128gpu", "sc21_t2_zero3_174.6B_1536gpu"} <= ids


def test_sc21_step_times_match_the_reference_derivation():
    runs = {r.run_id: r for r in load_runs(SC21_CSV)}
    for row in _rows(DEVELOPMENT_CSV.parent.parent / "reference" / "megatron_weak_scaling.csv"):
        assert runs[row["case_id"]].measured == pytest.approx(float(row["derived_iter_time_s"]), rel=2e-3)


def test_conversions_agree_with_each_other():
    run = next(r for r in load_runs(DEVELOPMENT_CSV) if r.run_id == "nemo2407_LLAMA3-70B_64gpu")
    step = run.measured
    tokens = run.plan.global_batch * run.model.seq_len
    assert step_time_from("tokens_per_s", tokens / step, model=run.model, plan=run.plan, gpus=run.gpus) \
        == pytest.approx(step)
    flops = run.plan.global_batch * model_flops_per_sequence_as(run.model, "megatron")
    tflops = flops / (step * run.gpus * 1e12)
    assert step_time_from("model_tflops_per_gpu", tflops, model=run.model, plan=run.plan, gpus=run.gpus,
                          flops_convention="megatron") == pytest.approx(step)


@pytest.mark.parametrize("run", [r for r in load_runs(DEVELOPMENT_CSV) if "model_tflops_per_gpu" in r.extra],
                         ids=lambda r: r.run_id)
def test_nemo_tflops_column_agrees_with_its_tokens(run):
    """NeMo's model TFLOP/s equals its tokens/s under Megatron's count to the table's rounding: the shapes
    chosen for the models are NeMo's."""
    flops = run.plan.global_batch * model_flops_per_sequence_as(run.model, run.flops_convention)
    assert flops / (run.measured * run.gpus * 1e12) == pytest.approx(run.extra["model_tflops_per_gpu"], rel=3e-3)


def test_megatron_convention_matches_the_derived_iteration_time():
    run = next(r for r in load_runs(DEVELOPMENT_CSV) if r.run_id == "meg_h100_weak_177B")
    assert run.measured == pytest.approx(5.259, rel=2e-3)  # the source's derived_iter_time_s


HEADER = "run_id,model,cluster,gpus,tp,pp,micro_batch,global_batch,step_time_s\n"


def _one(tmp_path, text, name="runs.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_a_minimal_file(tmp_path):
    p = _one(tmp_path, "# a comment\n" + HEADER + "a,gpt3-1.3b,dgx-a100,8,1,1,4,64,1.5\n")
    (run,) = load_runs(p)
    assert run.plan.dp == 8 and run.measured == 1.5 and run.row == 3 and run.stack == "megatron"
