"""`tpsim collective`: text, JSON, sweep, groups of a plan axis, and bad input (one line, exit 2)."""

import json

import pytest

from tpsim.cli import main
from tpsim.collectives.model import get_collective_model
from tpsim.topology import load_cluster


def run(capsys, *argv):
    code = main(["collective", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_keys_and_values_come_from_the_model(capsys):
    code, out, _ = run(capsys, "--cluster", "dgx-h100", "--gpus", "8", "--bytes", "1GiB", "--json")
    assert code == 0
    d = json.loads(out)
    assert {"time_s", "algbw_GBps", "busbw_GBps", "algorithm"} <= set(d)
    expect = get_collective_model(load_cluster("dgx-h100", gpus=8)).run("all_reduce", 1 << 30, (tuple(range(8)),))
    assert d["time_s"] == pytest.approx(expect.time_s)
    assert d["algbw_GBps"] == pytest.approx((1 << 30) / d["time_s"] / 1e9)
    assert d["busbw_GBps"] == pytest.approx(d["algbw_GBps"] * 14 / 8)
    assert d["algorithm"] == expect.algorithm


def test_text_output(capsys):
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "16", "--ranks", "0-7", "--op", "all_gather",
                       "--bytes", "256M")
    assert code == 0
    for word in ("time", "algbw", "busbw", "algorithm", "all_gather", "256.0 MiB"):
        assert word in out


def test_group_of_plan_axis_loads_all_groups(capsys):
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "32", "--group", "dp", "--plan", "tp=8",
                       "--json")
    assert code == 0
    dp_all = json.loads(out)
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "32", "--ranks", "0,8,16,24", "--json")
    one = json.loads(out)
    # 8 DP groups (one per rail) use 8 different NICs: no worse than one group alone, same algorithm family
    assert dp_all["time_s"] == pytest.approx(one["time_s"], rel=0.05)
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "32", "--group", "tp", "--plan",
                       "tp=8,pp=2", "--op", "reduce_scatter")
    assert code == 0 and "4 concurrent groups of 8 ranks" in out


def test_sweep_table(capsys):
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "8", "--sweep")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert len(rows) == 24 and rows[0][0] == "1024" and rows[-1][0] == str(8 << 30)
    bus = [float(r[3]) for r in rows]
    assert bus == sorted(bus)  # bus bandwidth grows with size
    code, out, _ = run(capsys, "--cluster", "dgx-a100", "--gpus", "8", "--sweep", "--json")
    assert len(json.loads(out)) == 24


@pytest.mark.parametrize("argv, needle", [
    (["--bytes", "1XB"], "--bytes"),
    (["--bytes", "-4"], "--bytes"),
    (["--cluster", "no-such-cluster"], "no-such-cluster"),
    (["--gpus", "8", "--ranks", "0-9"], "rank 8"),
    (["--gpus", "8", "--ranks", "3-1"], "backwards"),
    (["--gpus", "8", "--ranks", "0,0"], "twice"),
    (["--gpus", "8", "--ranks", "a"], "--ranks"),
    (["--gpus", "8", "--group", "tp"], "--plan"),
    (["--gpus", "8", "--group", "tp", "--plan", "tp=3"], "tp=3"),
    (["--gpus", "8", "--group", "tp", "--plan", "tp=x"], "tp='x'"),
    (["--gpus", "8", "--group", "tp", "--plan", "tp=2,order=tp-pp"], "order"),
    (["--gpus", "8", "--group", "tp", "--plan", "cp=2"], "cp=2"),
    (["--gpus", "8", "--plan", "tp=2"], "--group"),
    (["--gpus", "8", "--algo", "nope"], "nope"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, "--cluster", "dgx-a100", *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_calibration_flag_and_gloo_on_local_cpu(capsys):
    code, out, _ = run(capsys, "--cluster", "local-cpu", "--calibration", "local-cpu", "--op", "reduce_scatter",
                       "--bytes", "1M", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["algorithm"].startswith("gloo") and 1e-5 < d["time_s"] < 0.1
    code, _, err = run(capsys, "--cluster", "local-cpu", "--calibration", "missing.yaml")
    assert code == 2 and "missing.yaml" in err
