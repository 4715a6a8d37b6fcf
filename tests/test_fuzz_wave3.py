"""Hostile input to the third wave's verbs and flags (issue w14-fuzz): ``calibrate --from-runs`` / ``--log``,
``--calibration``, ``--schedule``, the uneven pipeline flags, ``--moe-balance``, ``estimate --from``,
``train-time``, Blackwell devices and block-scaled dtypes, ``--json``.

Each failure an exploratory fuzzer found (a traceback, a refusal of several lines, a NaN, a flag silently
dropped) is a derandomized example here, plus a small hypothesis property over the new flags in the style of
tests/test_fuzz_inputs.py: status 0 or 2, 2 with exactly one line on stderr, JSON without NaN or infinity."""

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.cli import main

from test_fuzz_inputs import run_cli as fuzz_run_cli

FUZZ = settings(derandomize=True, deadline=None, max_examples=12, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _finite_json(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} in JSON output")
    return json.loads(text, parse_constant=refuse)


def run_cli(argv, capsys):
    """(status, stdout, stderr) of one CLI call (test_fuzz_inputs.run_cli's checks), and JSON output finite."""
    argv = [str(a) for a in argv]
    code, out, err = fuzz_run_cli(argv, capsys)
    if code == 0 and "--json" in argv:
        _finite_json(out)
    return code, out, err


# ---- regressions: refusals that came after a note, or after other lines, were several lines -----------------
def test_reliability_without_tokens_is_one_line_before_the_plan_notes(capsys):
    # the mixtral preset's pp=4 is dropped with a note; the refusal used to follow it
    code, _, err = run_cli(["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-b200", "--gpus", "16",
                            "--layers", "8", "--reliability", "llama3-h100"], capsys)
    assert code == 2 and "--reliability llama3-h100 needs --tokens" in err and "note:" not in err


def test_export_refusal_after_a_dropped_preset_default_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(["export", "--model", "llama3-8b", "--cluster", "dgx-b300", "--gpus", "16", "--layers",
                            "16", "--pp", "2", "--vpp", "2", "--tp", "1", "--stack", "torchtitan", "--zero", "3",
                            "--pp-last-layers", "7", "--format", "nemo", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "pp_last=7" in err and "note:" not in err


def test_the_note_still_shows_when_the_command_succeeds(tmp_path, capsys):
    code, out, err = run_cli(["export", "--model", "llama3-8b", "--cluster", "dgx-b300", "--gpus", "16", "--layers",
                              "4", "--tp", "1", "--format", "megatron", "--out", tmp_path / "m", "--no-predict"],
                             capsys)
    assert code == 0 and "preset's plan default sp=True conflicts" in err and "megatron_args.sh" in out


def test_export_all_with_no_format_left_names_every_reason_on_one_line(tmp_path, capsys):
    code, _, err = run_cli(["export", "--model", "deepseek-v3", "--cluster", "dgx-b200", "--gpus", "64", "--layers",
                            "16", "--pp", "4", "--tp", "1", "--stack", "hai-llm", "--ep", "8", "--format", "all",
                            "--out", tmp_path / "all", "--no-predict"], capsys)
    assert code == 2 and "no format can run plan" in err
    for fmt in ("megatron:", "torchtitan:", "bridge exporter"):  # one_line shortens a long message's middle
        assert fmt in err, err


# ---- regressions: calibrate --from-runs / --log -----------------------------------------------------------
HEADER = "run_id,model,cluster,gpus,tp,pp,zero,micro_batch,global_batch,stack,step_time_s\n"
ROWS = ("a,llama3-8b,dgx-h100,8,1,1,3,2,16,torchtitan,2.6\n", "b,llama3-8b,dgx-h100,16,1,1,3,2,32,torchtitan,{}\n",
        "c,llama3-8b,dgx-h100,32,1,1,3,2,64,torchtitan,2.75\n")


@pytest.mark.parametrize("step, expected", [
    ("1e-300", "step_time_s='1e-300' is below the supported minimum 1e-15"),  # was: gemm_scale=nan
    ("1e-9", "more than 10x faster than the model's"),  # was: numpy LinAlgError (a traceback)
    ("0.001", "more than 10x faster than the model's"),  # was: dp_exposed_scale=0.0 must be > 0, then (with
    # the exposed factor's bound 0 allowed) a file whose runs_fit.sigma=367 estimate refused
])
def test_a_run_far_from_the_model_is_refused_with_one_line(tmp_path, capsys, step, expected):
    runs = tmp_path / "runs.csv"
    runs.write_text(HEADER + "".join(ROWS).format(step))
    code, _, err = run_cli(["calibrate", "--from-runs", runs], capsys)
    assert code == 2 and expected in err and ("row 3 (b)" in err or "run b (row 3)" in err), err


def test_an_exposed_factor_at_its_bound_zero_is_a_calibration():
    from tpsim.runfit import compute_calibration

    assert compute_calibration({"dp_exposed_scale": 0.0, "compute_scale": 1.1}).dp_exposed_scale == 0.0
    with pytest.raises(ValueError, match="gemm_scale=0"):
        compute_calibration({"gemm_scale": 0.0})


def test_an_infinite_memory_figure_in_a_torchtitan_log_is_ignored(tmp_path):
    from tpsim.runs import read_log

    log = tmp_path / "tt.log"
    log.write_text("".join(f"[rank0]:[titan] step: {i:2d}  loss:  7.1  memory: {m}GiB(85.12%)  tps: {t:,}  mfu: 35%\n"
                           for i, (t, m) in enumerate([(1200, "9" * 400), (6250, "1e999"), (6258, "81.9")], 1)))
    got = read_log(log)
    assert got.peak_memory_gib == 81.9 and got.value == 6254.0


def test_a_log_far_from_the_model_is_refused_with_one_line(tmp_path, capsys):
    launch = tmp_path / "mg"
    assert main(["export", "--format", "megatron", "--out", str(launch), "--model", "llama3-8b", "--cluster",
                 "dgx-h100", "--gpus", "16", "--tp", "2", "--sp", "--global-batch", "64", "--no-predict"]) == 0
    capsys.readouterr()
    log = tmp_path / "train.log"
    log.write_text("".join(f" iteration {i:8d}/ 1000 | elapsed time per iteration (ms): 0.000000001 |\n"
                           for i in range(1, 6)))
    code, _, err = run_cli(["calibrate", "--log", log, launch / "megatron_args.sh"], capsys)
    assert code == 2 and "run train#1: step_time_s=1e-12 is more than 10x faster" in err, err


# ---- regression: estimate --from dropped --calibration silently ---------------------------------------------
def test_estimate_from_a_launch_file_applies_the_calibration(tmp_path, capsys):
    out = tmp_path / "tt"
    assert main(["export", "--format", "torchtitan", "--out", str(out), "--model", "llama3-8b", "--cluster",
                 "dgx-h100", "--gpus", "8", "--zero", "3", "--micro-batch", "2", "--global-batch", "16",
                 "--no-predict"]) == 0
    capsys.readouterr()
    toml = next(out.glob("*.toml"))
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"compute": {"device": "H100-SXM", "stack": "torchtitan", "gemm_scale": 1.4}}))
    base = ["estimate", "--from", toml, "--cluster", "dgx-h100", "--json"]
    _, plain, _ = run_cli(base, capsys)
    code, calibrated, err = run_cli(base + ["--calibration", cal], capsys)
    assert code == 0, err
    assert _finite_json(calibrated)["step_time_s"] > _finite_json(plain)["step_time_s"]
    # the compute section of another stack is not applied, as with plan flags (the file's stack: torchtitan)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"compute": {"device": "H100-SXM", "stack": "megatron", "gemm_scale": 1.4}}))
    code, out, err = run_cli(base + ["--calibration", other], capsys)
    assert code == 0 and _finite_json(out)["step_time_s"] == _finite_json(plain)["step_time_s"]
    assert "compute section not applied (fitted for stack megatron" in out


# ---- property: the third wave's plan flags -----------------------------------------------------------------
SCHEDULES = st.sampled_from(["1f1b", "gpipe", "zb-h1", "zbv", "interleaved-zb", "dualpipe", "dualpipev", "zb", ""])
SMALL = st.one_of(st.integers(-1, 9).map(str), st.sampled_from(["", "nan", "inf", "1e3", "2.5", "9" * 50]))
BALANCE = st.sampled_from(["forced", "aux", "1", "1.5", "0.99", "1024", "1025", "nan", "inf", "-1", "", "AUX"])


@st.composite
def wave3_argv(draw):
    verb = draw(st.sampled_from(["estimate", "estimate", "train-time"]))
    model = draw(st.sampled_from(["llama3-8b", "mixtral-8x7b", "deepseek-v3"]))
    argv = [verb, "--model", model, "--cluster", draw(st.sampled_from(["dgx-b300", "gb300-nvl72-64", "dgx-h100"])),
            "--gpus", draw(st.sampled_from(["16", "64"])), "--layers", draw(st.sampled_from(["4", "8", "9"])),
            "--pp", draw(st.sampled_from(["1", "2", "4"])), "--vpp", draw(st.sampled_from(["1", "2"])),
            "--stack", draw(st.sampled_from(["megatron", "llm-foundry", "hai-llm"]))]
    if draw(st.booleans()):
        argv += ["--schedule", draw(SCHEDULES)]
    for flag in draw(st.lists(st.sampled_from(["--pp-first-layers", "--pp-last-layers", "--moe-balance", "--dtype",
                                               "--tokens", "--seq-len"]), max_size=3, unique=True)):
        value = {"--moe-balance": BALANCE, "--dtype": st.sampled_from(["mxfp8", "nvfp4", "fp8", "fp4"]),
                 "--tokens": st.sampled_from(["1e12", "1", "1e17", "nan", "-1"])}.get(flag, SMALL)
        argv += [flag, draw(value)]
    for flag in draw(st.lists(st.sampled_from(["--pp-embedding-as-layer", "--pp-loss-as-layer", "--explain"]),
                              max_size=2, unique=True)):
        argv.append(flag)
    if verb == "train-time" and "--tokens" not in argv:
        argv += ["--tokens", "1e12"]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


@FUZZ
@given(argv=wave3_argv())
def test_fuzz_wave3_plan_flags(capsys, argv):
    run_cli(argv, capsys)


def test_deepspeed_export_of_a_block_scaled_dtype_is_refused_not_a_traceback(tmp_path, capsys):
    # --stack megatron offers mxfp8; Megatron-DeepSpeed's precision flags had no entry for it (KeyError)
    code, _, err = run_cli(["export", "--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "16", "--layers", "4",
                            "--tp", "2", "--stack", "megatron", "--dtype", "mxfp8", "--format", "deepspeed",
                            "--out", tmp_path / "ds", "--no-predict"], capsys)
    assert code == 2 and "dtype=mxfp8: Megatron-DeepSpeed" in err


def test_a_fleet_without_failures_prints_no_infinite_mtbf(tmp_path, capsys):
    rel = tmp_path / "rel.yaml"
    rel.write_text("components:\n  gpu: {per: gpu, events: 0, units: 16384, hours: 1296, source: none}\n")
    argv = ["train-time", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--layers", "4",
            "--tokens", "1e12", "--reliability", rel]
    code, out, _ = run_cli(argv, capsys)
    line = next(x for x in out.splitlines() if x.startswith("interruptions"))
    assert code == 0 and "inf" not in line and "none expected" in line, line
    code, out, _ = run_cli(argv + ["--json"], capsys)
    assert code == 0 and _finite_json(out)["train_time"]["mtbf_hours"] is None
