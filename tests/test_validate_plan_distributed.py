"""Whole plans on 2 gloo ranks on CPU: DDP, tpsim's ZeRO-1, FSDP2 ZeRO-2/3, 1F1B and interleaved pipelining --
numerics against the unsharded stack and every collective against the torch rules; the CLI end to end with a
calibration file. One launch, shared with the other distributed modules' rule checks (tests/shared_launches.py),
serves the rule checks (tiny shapes, no timing)."""

from __future__ import annotations

import os

import json
import subprocess
import sys

import pytest
import shared_launches

pytest.importorskip("torch")

from tpsim.model import PRESETS, with_overrides  # noqa: E402
from tpsim.validate.plan.case import PlanCase  # noqa: E402
from tpsim.validate.plan.comm import expected_comm, normalize  # noqa: E402
from tpsim.validate.plan.report import summarize_plan  # noqa: E402

pytestmark = pytest.mark.distributed

LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=64, heads=2, kv_heads=1, ffn=128, seq_len=16, layers=2)
GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=64, heads=2, seq_len=16, layers=2)


def _cases() -> list[PlanCase]:
    kw = dict(micro_batch=2, reps=1, warmup=0, timed=False)
    return [PlanCase(model=LLAMA, pp=2, microbatches=2, **kw),
            PlanCase(model=with_overrides(GPT, layers=4), pp=2, vpp=2, microbatches=2, **kw),
            PlanCase(model=GPT, dp=2, zero=0, microbatches=2, **kw),
            PlanCase(model=LLAMA, dp=2, zero=1, microbatches=2, **kw),
            PlanCase(model=GPT, dp=2, zero=2, microbatches=2, **kw),
            PlanCase(model=LLAMA, dp=2, zero=3, microbatches=2, **kw),
            # zero-bubble schedules (torch ScheduleZBVZeroBubble: stages 0 and 3 on rank 0, a V;
            # ScheduleInterleavedZeroBubble), issue 21
            PlanCase(model=with_overrides(GPT, layers=4), pp=2, vpp=2, microbatches=4, pp_schedule="zbv", **kw),
            PlanCase(model=with_overrides(LLAMA, layers=4), pp=2, vpp=2, microbatches=2, pp_schedule="interleaved-zb",
                     **kw),
            # timed (one step), for the terms, the per-rank steps and the profiled step (issue 22)
            PlanCase(model=GPT, pp=2, microbatches=2, micro_batch=2, reps=2, warmup=0, timed=True)]


PLANS = shared_launches.register(2, _cases())
"""launched once (with --trace-terms) with the other modules' 2-rank cases (tests/shared_launches.py)."""


def _four_rank_cases() -> list[PlanCase]:
    kw = dict(micro_batch=2, reps=1, warmup=0, timed=False)
    return [PlanCase(model=LLAMA, tp=2, sp=True, dp=2, zero=3, microbatches=2, **kw),
            PlanCase(model=GPT, tp=2, sp=True, dp=2, zero=0, microbatches=2, **kw),
            PlanCase(model=with_overrides(LLAMA, layers=4), tp=2, sp=True, pp=2, microbatches=2, **kw)]


FOUR = shared_launches.register(4, _four_rank_cases())
"""launched once with the context- and expert-parallel 4-rank cases of test_validate_cp_distributed."""


@pytest.fixture(scope="module")
def plan_runs(shared_ranks):
    shared = shared_ranks(2)
    return PLANS, {c.name: shared["per_case"][c.name] for c in PLANS}


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_every_axis_matches_the_unsharded_stack(plan_runs):
    cases, per_case = plan_runs
    for case in cases:
        s = summarize_plan(case, per_case[case.name], None)
        assert s["numerics_ok"] and s["loss"]["ok"], (case.name, s["numerics_max_rel_err"], s["loss"])
        # every gradient and every parameter after the step was compared
        for r in per_case[case.name]:
            assert sum(k.startswith("step:") for k in r["numerics"]) == r["n_params"] > 0


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_every_collective_matches_the_torch_rules(plan_runs):
    cases, per_case = plan_runs
    for case in cases:
        for r in per_case[case.name]:
            assert normalize(r["comm"]) == expected_comm(case, r["coords"]), (case.name, r["rank"], r["comm"])
    z3 = per_case[cases[5].name][0]["comm_phases"]
    assert z3["dp:all_gather"] == {"fwd": 4, "bwd": 4} and z3["dp:reduce_scatter"] == {"bwd": 4}
    z1 = per_case[cases[3].name][0]["comm_phases"]
    assert z1 == {"dp:reduce_scatter": {"step": 1}, "dp:all_gather": {"step": 1}}  # inside the optimizer step


@pytest.mark.timeout(240)
def test_cli_whole_plan_with_a_calibration_file_and_repeat(tmp_path):
    """``tpsim validate --dp 2 --zero 3`` end to end with a compute calibration: no tiny twin, the factors in the
    compute model, the calibrated overhead in the prediction; the JSON, CSV and the fit inputs written. The same
    run checks ``--repeat 2`` (issue 22): the measured case launched twice (fresh ranks), each launch's median
    step, their median and spread in the JSON and the text (one CLI run for both: each launch costs ~10 s of
    torch imports on 2 cores). The default ``--trace-terms`` auto: the profiling stops after one step where that
    step is more than 5% off the timed steps (as it is at these tiny shapes), else all of them run."""
    cal = tmp_path / "cal.yaml"
    cal.write_text("compute:\n  device: CPU-x86-1thread\n  stack: torchtitan\n  gemm_scale: 1.5\n"
                   "  attention_scale: 1.0\n  memory_scale: 2.0\n  host_overhead_per_layer_us: 3000\n")
    cmd = [sys.executable, "-m", "tpsim.cli", "validate", "--model", "llama3-8b", "--hidden", "64", "--heads", "2",
           "--kv-heads", "1", "--ffn", "128", "--seq-len", "16", "--tp", "1", "--dp", "2", "--zero", "3",
           "--micro-batch", "2", "--reps", "2", "--warmup", "1", "--no-calibrate", "--no-probe",
           "--calibration", str(cal), "--timeout", "30", "--repeat", "2", "--json", "--out-dir", str(tmp_path),
           "--name", "p"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["numerics_ok"] and report["collectives_match"]
    s = report["cases"][0]
    assert s["kind"] == "plan" and s["config"]["runtime"] == "fsdp2" and s["config"]["layers"] == 2
    assert "gemm x1.5" in s["compute_model"] and "memory x2" in s["compute_model"]
    assert s["framework_overhead_s"]["source"] == "calibration"
    assert s["framework_overhead_s"]["fwd"] + s["framework_overhead_s"]["bwd"] == pytest.approx(3e-3)
    names = {p["name"] for p in s["phases"]}
    assert {"fwd+bwd", "step", "step:optimizer", "dp:all_gather", "dp:reduce_scatter"} <= names
    assert all(p["predicted_s"] is not None and p["measured_s"] >= 0 for p in s["phases"])
    phase = {p["name"]: p for p in s["phases"]}
    assert min(phase[n]["measured_s"] for n in ("fwd+bwd", "step", "dp:all_gather")) > 0
    assert phase["step"]["predicted_s"] > phase["fwd+bwd"]["predicted_s"] > 0
    assert s["calibration_inputs"]["gemm_s"] > 0 and s["calibration_inputs"]["stack"] == "torchtitan"
    assert (tmp_path / "p.csv").read_text().startswith("case,kind,model")
    for prof in s["profiled"]:  # auto: one profiled step, stopped, where it was over 5% off; else both (reps 2)
        over = prof["overhead_pct"]
        if over is not None and abs(over) > 5.0:
            assert prof["steps"] == 1 and prof["stopped"] and prof["events"] == 0 and prof["trace"] is None
            assert s["terms_source"] == "timers" and s["terms_source_note"] == prof["stopped"]
        else:
            assert prof["steps"] == 2 and prof["terms"] and not prof.get("stopped")
    rp = s["repeats"]
    assert rp["launches"] == 2 and rp["phase"] == "step" and len(rp["medians_s"]) == 2
    assert rp["medians_s"][0] == pytest.approx(phase["step"]["measured_s"])  # the first launch is the report's
    assert min(rp["medians_s"]) == rp["min_s"] > 0 and rp["spread_pct"] >= 0
    assert rp["median_s"] == pytest.approx(sum(rp["medians_s"]) / 2)
    from tpsim.cli.validate import _terms_lines
    assert any(line.startswith("  run-to-run, 2 launches: median step per launch")
               for line in _terms_lines({"repeats": rp}))


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_four_rank_meshes_tp_x_dp_and_pp_x_tp(shared_ranks):
    """The 4-rank meshes of the matrix (on 2 cores: numerics and communication only): tp x dp with FSDP2 and with
    DDP under SP (DDP's TP composition), pp x tp with SP."""
    cases = FOUR
    per_case = {c.name: shared_ranks(4)["per_case"][c.name] for c in cases}
    for case in cases:
        s = summarize_plan(case, per_case[case.name], None)
        assert s["numerics_ok"] and s["collectives_match"], (case.name, s["numerics_max_rel_err"], s["comm_mismatches"])
        assert set(s["comm"]["measured"]) == ({"tp", "dp"} if case.dp > 1 else {"tp", "pp"})


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_timed_plan_has_terms_per_rank_steps_and_a_profiled_step_per_stage(plan_runs):
    """issue 22: the measured terms (T6 names) add up to the step (within the rank skew); every rank's step and
    the slowest rank with its host; --trace-terms: one torch.profiler step on each stage's first rank."""
    cases, per_case = plan_runs
    case = cases[-1]
    s = summarize_plan(case, per_case[case.name], None)
    assert set(s["terms"]) == {"compute", "bubble", "optimizer"}
    assert all(t["measured_s"] >= 0 for t in s["terms"].values()) and s["terms"]["compute"]["measured_s"] > 0
    assert s["terms_sum_error_pct"] is not None
    pr = s["per_rank"]
    assert [r["rank"] for r in pr["ranks"]] == [0, 1] and pr["steps"] == 2
    assert pr["slowest"]["host"] == os.uname().nodename and pr["slowest"]["rank"] in (0, 1)
    stages = sorted(p["stage"] for p in s["profiled"])
    assert stages == [0, 1]
    for p in s["profiled"]:
        # the median profiled step split without overlap into the terms (interval arithmetic)
        assert p["events"] > 0 and p["steps"] == 2 and set(p["terms"]) == {"compute", "bubble", "optimizer"}
        assert p["terms"]["compute"] > 0 and min(p["terms"].values()) >= 0
        assert sum(p["terms"].values()) == pytest.approx(p["wall_s"], rel=1e-9)
        assert p["detail"]["pp_wait"] + p["detail"]["host_gaps"] <= p["terms"]["bubble"] + 1e-9
        assert p["overhead_pct"] is not None and json.loads(open(p["trace"]).read())["traceEvents"]
    assert s["terms_source"] in ("trace", "timers") and s["terms_timers"]
    if s["terms_source"] == "trace":
        # the profiled step is within TRACE_MAX_OVERHEAD_PCT of its own rank's timed step; the step it is
        # compared with is the slowest rank's median, off by up to the rank skew and the step-to-step spread
        from tpsim.validate.plan.terms import TRACE_MAX_OVERHEAD_PCT

        slack = TRACE_MAX_OVERHEAD_PCT + (pr["rank_spread_pct"] or 0.0) + (pr["step_spread_pct"] or 0.0)
        assert abs(s["terms_sum_error_pct"]) <= slack + 1e-6, (s["terms_sum_error_pct"], pr)
