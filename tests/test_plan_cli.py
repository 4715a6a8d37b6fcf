"""`tpsim plan`: JSON keys, table, --why, --csv, and bad input as one line with exit status 2."""

from __future__ import annotations

import json

import pytest

from tpsim.cli import main

BASE = ["plan", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "64",
        "--vpp", "1", "--micro-batch", "1", "2", "--no-progress"]


def _run(capsys, *extra: str) -> tuple[int, str, str]:
    code = main(BASE + list(extra))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(capsys):
    code, out, _ = _run(capsys, "--json", "--top", "3")
    assert code == 0
    data = json.loads(out)
    assert {"plans", "evaluated", "rejected"} <= set(data)
    assert len(data["plans"]) == 3 and data["evaluated"] > 0
    first = data["plans"][0]
    for key in ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch", "overlap", "order",
                "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                "peak_memory_gib", "fits", "breakdown", "memory_gib", "plan"):
        assert key in first, key
    assert [p["rank"] for p in data["plans"]] == [1, 2, 3]
    assert data["plans"][0]["step_time_s"] <= data["plans"][1]["step_time_s"]
    assert all(isinstance(v, int) for v in data["rejected"].values())
    front = data["pareto_time_memory"]
    assert front and all(a["peak_memory_gib"] < b["peak_memory_gib"] and a["step_time_s"] > b["step_time_s"]
                         for a, b in zip(front, front[1:]))
    assert front[-1]["step_time_s"] == data["plans"][0]["step_time_s"]  # the fastest plan ends the front


def test_table_why_and_csv(capsys, tmp_path):
    csv = tmp_path / "plans.csv"
    code, out, _ = _run(capsys, "--why", "--top", "4", "--csv", str(csv))
    assert code == 0
    assert "step_s" in out and "exp_comm" in out and "rejected" in out
    assert "sequence parallelism needs tp > 1" in out
    lines = csv.read_text().strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("rank,")


def test_constraints_are_applied(capsys):
    code, out, _ = _run(capsys, "--json", "--tp", "2", "--no-pp", "--zero", "1", "--recompute", "full")
    assert code == 0
    plans = json.loads(out)["plans"]
    assert plans and all((p["tp"], p["pp"], p["zero"], p["recompute"]) == (2, 1, 1, "full") for p in plans)


def test_cost_objective_searches_gpu_counts(capsys):
    argv = ["plan", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "32", "--global-batch", "64",
            "--vpp", "1", "--micro-batch", "1", "--objective", "cost", "--gpu-hour-price", "3", "--json",
            "--top", "50", "--no-progress"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == [8, 16, 32]
    costs = [p["cost_per_mtok"] for p in data["plans"]]
    assert costs == sorted(costs)
    assert [row["gpus"] for row in data["pareto_gpus_throughput"]] == [8, 16, 32]


def test_pareto_text(capsys):
    code, out, _ = _run(capsys, "--pareto", "--top", "1")
    assert code == 0 and "Pareto front, step time vs. memory per GPU" in out


@pytest.mark.parametrize("extra, needle", [
    (["--tp", "3"], "--tp 3: none divides"),  # no valid plan is an error that names the constraint (issue 13)
    (["--mem-limit-gib", "-1"], "--mem-limit-gib: -1 must be > 0"),
    (["--objective", "cost", "--gpu-hour-price", "0"], "--gpu-hour-price: 0 must be > 0"),
    (["--no-pp", "--pp", "2"], "--no-pp conflicts"),
])
def test_bad_or_empty_input(capsys, extra, needle):
    code, out, err = _run(capsys, *extra, "--json")
    assert code == 2 and needle in err and not out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--model", "no-such-model", "--gpus", "8"], "no-such-model"),
    (["plan", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "12"], "12"),
    (["plan", "--model", "gpt3-1.3b", "--cluster", "nowhere", "--gpus", "8"], "nowhere"),
])
def test_bad_model_cluster_gpus(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_argparse_rejects_non_positive(capsys):
    assert main(BASE + ["--top", "0"]) == 2  # usage errors return 2 from main() (no SystemExit)
    assert "--top: 0 must be a positive integer" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(tmp_path / "cache"))


def test_on_disk_cache_gives_the_same_answer(capsys, tmp_path):
    code, first, _ = _run(capsys, "--json", "--top", "3")
    code2, second, _ = _run(capsys, "--json", "--top", "3")
    assert code == code2 == 0
    a, b = json.loads(first), json.loads(second)
    a.pop("elapsed_s"), b.pop("elapsed_s")
    assert a == b
    assert list((tmp_path / "cache" / "plans").glob("*.npz"))
    _, table, _ = _run(capsys)
    assert "(cached result)" in table
