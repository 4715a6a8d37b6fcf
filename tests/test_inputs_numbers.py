"""Issue 13, CLI numbers and sizes: every numeric flag is bounded by tpsim.limits, refused in one line with
exit status 2 (run in-process through tpsim.cli.main), and sizes are parsed exactly."""

import json

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.limits import FLOAT_LIMITS, LIMITS, MAX_CLI_INT, check_float, check_int, show
from tpsim.units import parse_bytes

HUGE = "9" * 400
QUICK = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]

# (verb and leading arguments, flag): every integer flag of every verb
INT_FLAGS = [
    (["estimate", *QUICK[:4]], "--gpus"), (["estimate", *QUICK], "--tp"), (["estimate", *QUICK], "--pp"),
    (["estimate", *QUICK], "--vpp"), (["estimate", *QUICK], "--micro-batch"), (["estimate", *QUICK], "--global-batch"),
    (["estimate", *QUICK], "--layers"), (["estimate", *QUICK], "--seq-len"),
    (["plan", *QUICK[:4]], "--gpus"), (["plan", *QUICK], "--tp"), (["plan", *QUICK], "--max-tp"),
    (["plan", *QUICK], "--micro-batch"), (["plan", *QUICK], "--global-batch"), (["plan", *QUICK], "--top"),
    (["report", *QUICK, "--out", "unused"], "--top"), (["topo", "show", "dgx-a100"], "--gpus"),
    (["collective"], "--gpus"), (["calibrate", "m.csv"], "--gpus"),
    (["bench-collectives"], "--nproc"), (["bench-collectives"], "--iters"), (["profile"], "--threads"),
    (["validate"], "--nproc"), (["validate"], "--threads"), (["validate"], "--tp"), (["validate"], "--reps"),
    (["validate"], "--micro-batch"),
]
BAD_INTS = [("0", "must be a positive integer"), ("2.5", "is not a positive integer"),
            ("1e3", "is not a positive integer"), ("nan", "is not a positive integer"),
            ("", "is not a positive integer"), ("0x10", "is not a positive integer"),
            (HUGE, "above the supported maximum")]


def _one_line(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    return code, lines


@pytest.mark.parametrize("value, needle", BAD_INTS)
@pytest.mark.parametrize("prefix, flag", INT_FLAGS)
def test_integer_flags_refused_in_one_line(capsys, prefix, flag, value, needle):
    code, lines = _one_line(capsys, [*prefix, flag, value])
    assert code == 2 and len(lines) == 1, lines
    assert f"argument {flag}:" in lines[0] and needle in lines[0], lines[0]
    assert len(lines[0]) < 700  # a 400-digit value is abbreviated, not echoed


@pytest.mark.parametrize("prefix, flag, field", [
    (["estimate", *QUICK[:4]], "--gpus", "gpus"), (["plan", *QUICK], "--global-batch", "global_batch"),
    (["bench-collectives"], "--iters", "iters"), (["profile"], "--threads", "threads"),
])
def test_integer_flags_bounded_by_the_limits_table(capsys, prefix, flag, field):
    code, lines = _one_line(capsys, [*prefix, flag, str(LIMITS[field] + 1)])
    assert code == 2 and f"above the supported maximum {LIMITS[field]}" in lines[0]


@pytest.mark.parametrize("prefix, flag", [
    (["plan", *QUICK], "--mem-limit-gib"), (["plan", *QUICK, "--objective", "cost"], "--gpu-hour-price"),
    (["bench-collectives"], "--timeout"), (["profile"], "--max-kernel-s"), (["validate"], "--timeout"),
    (["validate"], "--run-timeout"), (["validate"], "--budget"),
])
@pytest.mark.parametrize("value, needle", [("nan", "finite"), ("inf", "finite"), ("-1", "must be >"),
                                           ("0", "must be >"), ("1e30", "above the supported maximum"),
                                           ("abc", "is not a number")])
def test_real_flags_refused_in_one_line(capsys, prefix, flag, value, needle):
    code, lines = _one_line(capsys, [*prefix, flag, value])
    assert code == 2 and len(lines) == 1 and flag in lines[0] and needle in lines[0], lines


def test_warmup_zero_is_allowed_and_negative_is_not(capsys):
    code, lines = _one_line(capsys, ["bench-collectives", "--warmup", "-1", "--nproc", "1"])
    assert code == 2 and "--warmup" in lines[0]


def test_limits_tables_are_consistent():
    assert all(isinstance(v, int) and v > 0 for v in LIMITS.values())
    assert all(v > 0 for v in FLOAT_LIMITS.values())
    assert MAX_CLI_INT == 2**31 - 1
    assert check_int("gpus", 8.0) == 8
    for bad in (True, "8", 8.5, float("nan"), float("inf"), 0, LIMITS["gpus"] + 1, int(HUGE)):
        with pytest.raises(InputError):
            check_int("gpus", bad)
    for bad in (True, "1", float("nan"), float("inf"), 0, -1, 1e30, int(HUGE)):
        with pytest.raises(InputError):
            check_float("timeout_s", bad)
    assert show(int(HUGE)).endswith("(400 digits)")


# ------------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("text, expected", [
    ("9007199254740993", 9007199254740993),  # 2^53 + 1: a float would round it to an even number
    ("1.5GiB", 1610612736), ("1.5k", 1536), ("64KiB", 65536), ("2e6", 2_000_000), (" 4 K ", 4096),
    ("4096.0", 4096), (str(LIMITS["bytes"]), LIMITS["bytes"]), (1024, 1024),
])
def test_sizes_parse_exactly(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, needle", [
    ("1e30", "above the supported maximum"), (HUGE, "above the supported maximum"),
    (str(LIMITS["bytes"] + 1), "above the supported maximum"), ("1e99999", "not a size"),
    ("nan", "not a size"), ("inf", "not a size"), ("0", "positive"), ("-4K", "not a size"),
    ("4097.5", "whole number of bytes"), ("0.4", "whole number of bytes"), ("", "not a size"),
    ("12XB", "not a size"), ("1.5.5", "not a size"), (True, "not a size"), (float("nan"), "finite"),
])
def test_bad_sizes_are_refused(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_bytes(text, "--bytes")


def test_collective_keeps_large_byte_counts_exact(capsys):
    assert main(["collective", "--cluster", "dgx-a100", "--gpus", "8", "--bytes", "9007199254740993", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == 9007199254740993


@pytest.mark.parametrize("argv, needle", [
    (["collective", "--gpus", "8", "--bytes", "1e30"], "--bytes='1e30' is above the supported maximum"),
    (["collective", "--gpus", "8", "--ranks", "0-99999999999"], "rank 8 is outside"),  # not expanded first
    (["collective", "--gpus", "8", "--ranks", ""], "is not a rank"),
    (["collective", "--gpus", "8", "--ranks", "3"], "at least 2 ranks"),
    (["collective", "--gpus", "8", "--algo", ","], "names no algorithm"),
    (["collective", "--group", "tp", "--plan", "tp=" + HUGE], "--plan tp="),
    (["bench-collectives", "--sizes", "1e30"], "--sizes"),
    (["bench-collectives", "--sizes", "1024T"], "needs about"),  # more memory than the machine has
    (["bench-collectives", "--nproc", "1000"], "1000 local ranks need about"),
])
def test_collective_and_bench_inputs(capsys, argv, needle):
    code, lines = _one_line(capsys, argv)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_messages_stay_on_one_line(capsys):
    code, lines = _one_line(capsys, ["estimate", "--cluster", "a\nb\x1b[31m" + "x" * 5000])
    assert code == 2 and len(lines) == 1 and len(lines[0]) <= 700 and "\x1b" not in lines[0]
