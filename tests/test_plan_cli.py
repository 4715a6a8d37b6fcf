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


# ---- readable rankings: twins collapsed, --compare --------------------------------------------------------
def test_twins_are_one_row_with_variants(capsys):
    code, out, _ = _run(capsys, "--json", "--top", "100")
    assert code == 0
    data = json.loads(out)
    keys = [(p["tp"], p["pp"], p["vpp"], p["dp"], p["sp"], p["recompute"], p["zero"], p["micro_batch"],
             p["step_time_s"], p["peak_memory_gib"]) for p in data["plans"]]
    assert len(keys) == len(set(keys))  # no row repeats another up to order/overlap with the same prediction
    multi = [p for p in data["plans"] if len(p["variants"]) > 1]
    assert multi and data["duplicates"] > 0
    code, text, _ = _run(capsys, "--top", "100")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "tie"])
    assert lines[at - 1].startswith("stack megatron; MFU counts causal attention FLOPs")  # stack in the header
    header = lines[at].split()
    for column in ("pp", "vpp", "zero", "mb", "ovl", "order", "var", "tok/s/gpu", "mfu"):
        assert column in header
    row = next(line.split() for line in lines[at + 1:] if line.split()[0] == str(multi[0]["rank"]))
    assert row[header.index("var")] == str(len(multi[0]["variants"]))


def _compare(capsys, *refs: str, json_out: bool = False) -> tuple[int, str, str]:
    return _run(capsys, "--compare", *refs, *(["--json"] if json_out else []))


def test_compare_ranks_and_plan_strings(capsys):
    _, out, _ = _run(capsys, "--json", "--top", "3")
    plans = json.loads(out)["plans"]
    code, out, _ = _compare(capsys, "1", "#3", "tp=2,pp=1,recompute=full", json_out=True)
    assert code == 0
    cmp = json.loads(out)["compare"]
    a, b, c = cmp["plans"]
    assert (a["rank"], b["rank"]) == (1, 3) and not a["twin"]
    assert a["estimate"]["step_time_s"] == plans[0]["step_time_s"]
    assert b["estimate"]["step_time_s"] == plans[2]["step_time_s"]
    plan_c = c["estimate"]["plan"]
    assert (plan_c["tp"], plan_c["pp"], plan_c["recompute"]) == (2, 1, "full")
    diff_b, diff_c = cmp["differences"]
    assert diff_b["against"] == "A" and diff_c["name"] == "C"
    assert diff_b["step_time_s"] == pytest.approx(b["estimate"]["step_time_s"] - a["estimate"]["step_time_s"])
    for term, value in a["estimate"]["breakdown"].items():
        assert diff_c["breakdown"][term] == pytest.approx(c["estimate"]["breakdown"][term] - value)
    for term, value in a["estimate"]["memory_gib"].items():
        assert diff_c["memory_gib"][term] == pytest.approx(c["estimate"]["memory_gib"][term] - value)
    # the text: a legend and one row per breakdown and memory term, a delta column per later plan
    code, text, _ = _compare(capsys, "1", "tp2 pp1 full")
    assert code == 0
    lines = text.splitlines()
    assert any(line.startswith("A  '1': ") and "[#1]" in line for line in lines)
    head = next(line for line in lines if line.split()[:3] == ["A", "B", "B-A"])
    assert head
    for term in list(a["estimate"]["breakdown"]) + list(a["estimate"]["memory_gib"]):
        row = next(line for line in lines if line.split() and line.split()[0] == term)
        assert len(row.split()) == 4, row  # name, A, B, B-A
    step = next(line for line in lines if line.startswith("step time (s)")).split()
    assert float(step[3]) == pytest.approx(a["estimate"]["step_time_s"], abs=5e-4)


def test_compare_best_matching_plan_and_twins(capsys):
    code, out, _ = _run(capsys, "--json", "--top", "200")
    plans = json.loads(out)["plans"]
    multi = next(p for p in plans if len(p["variants"]) > 1)
    twin = multi["variants"][1]
    ref = (f"tp{multi['tp']} pp{multi['pp']} dp{multi['dp']} z{multi['zero']} mb{multi['micro_batch']} "
           f"recompute={multi['recompute']} sp={'on' if multi['sp'] else 'off'} {twin['order']} "
           f"overlap={'on' if twin['overlap'] else 'off'}")
    code, out, _ = _compare(capsys, str(multi["rank"]), ref, json_out=True)
    assert code == 0
    a, b = json.loads(out)["compare"]["plans"]
    assert b["twin"] and b["rank"] == multi["rank"] and b["estimate"]["plan"]["order"] == twin["order"]
    assert b["estimate"]["step_time_s"] == a["estimate"]["step_time_s"]
    # a partial plan string is the best-ranked plan with those fields
    best_tp2 = next(p for p in plans if p["tp"] == 2)
    _, out, _ = _compare(capsys, "1", "tp2", json_out=True)
    assert json.loads(out)["compare"]["plans"][1]["rank"] == best_tp2["rank"]


@pytest.mark.parametrize("refs, needle", [
    (["1"], "at least two plans"),
    (["1", "100000"], "rank 100000 is beyond"),
    (["1", "tp3"], "no evaluated plan has tp=3"),
    (["1", "tp2 bogus"], "unknown token 'bogus'"),
    (["1", "zero=7"], "no evaluated plan has zero=7"),
    (["1", "tp=x"], "tp='x' must be a positive integer"),
    (["1", "order=tp-tp-pp"], "order='tp-tp-pp' is not one of"),
    (["1", "tp2 tp4"], "tp is given twice"),
    (["1", "#0"], "a rank is a positive integer"),
])
def test_compare_bad_references_are_one_line(capsys, refs, needle):
    code, out, err = _compare(capsys, *refs)
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_compare_a_label_copied_from_the_table_is_that_plan(capsys):
    """A label names tp, pp, dp and mb; the fields it leaves out mean their defaults (sp off, no recompute, ZeRO
    0, overlap on, tp-dp-pp), so it is not read as 'the best plan with tp2 pp1 dp4 mb1' (which has sp)."""
    code, out, _ = _compare(capsys, "1", "tp2 pp1 dp4 mb1", "tp2 pp1 dp4", json_out=True)
    assert code == 0
    _, exact, loose = json.loads(out)["compare"]["plans"]
    plan = exact["estimate"]["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"], plan["sp"], plan["recompute"], plan["zero"],
            plan["overlap"], plan["order"], plan["vpp"]) == (2, 1, 4, 1, False, "none", 0, True, "tp-dp-pp", 1)
    assert exact["label"] == "tp2 pp1 dp4 mb1"
    assert loose["estimate"]["plan"]["sp"]  # the filter finds the better plan with sequence parallelism
