"""Issue 13, empty results and resource guards: a search left with no plan exits 2 naming the constraint that
removed them; spaces, rank lists and graphs beyond the documented bounds are refused before allocating."""

import json

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.limits import MAX_PLANS
from tpsim.model import load_model
from tpsim.search import SearchSpace
from tpsim.search.explain import check_space, space_conflict

QUICK = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--no-progress", "--no-cache"]


@pytest.mark.parametrize("extra, needles", [
    (["--tp", "7"], ["--tp 7: none divides the 8 GPUs", "divisors: 1, 2, 4, 8"]),
    (["--tp", "16"], ["--tp 16"]),
    (["--tp", "3", "7"], ["--tp 3, 7: none divide the 8 GPUs"]),
    (["--pp", "3"], ["--pp 3 does not divide the GPUs left"]),
    (["--max-tp", "3", "--tp", "4"], ["--max-tp 3 excludes every tp of 4"]),
    (["--objective", "cost", "--tp", "7"], ["--tp 7"]),
    (["--vpp", "5", "--no-pp"], ["all 1,056 candidate plans were rejected", "needs pp > 1 (vpp-needs-pp)"]),
    (["--micro-batch", "1024", "--global-batch", "8"], ["rejected", "(batch)"]),
    (["--mem-limit-gib", "0.01"], ["The smallest plan needs", "--mem-limit-gib 0.01"]),
    (["--json", "--tp", "7"], ["--tp 7"]),
])
def test_empty_plan_search_is_an_error_with_the_reason(capsys, extra, needles):
    code = main(["plan", *QUICK, *extra])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not out, (out, err)
    assert all(n in lines[0] for n in needles), lines[0]


def test_memory_rejection_names_the_smallest_need(capsys):
    code = main(["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8", "--recompute", "none",
                 "--zero", "0", "--no-progress", "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2 and "over the device memory" in err and "GiB per GPU" in err


def test_report_refuses_an_empty_space_before_writing(capsys, tmp_path):
    assert main(["report", *QUICK[:6], "--tp", "7", "--out", str(tmp_path / "r")]) == 2
    assert "--tp 7" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_space_conflicts_and_size_guard():
    model = load_model("llama3-8b")
    assert space_conflict(model, 8, SearchSpace()) is None
    assert "--tp 7" in space_conflict(model, 8, SearchSpace(tp=(7,)))
    big = SearchSpace(micro_batch=tuple(range(1, 8001)), tp=tuple(range(1, 65)))
    with pytest.raises(InputError, match="--allow-large-space"):
        check_space(model, [8], big)
    assert check_space(model, [8], big, allow_large=True) > MAX_PLANS
    assert check_space(model, [8], SearchSpace()) == 20736  # cp > 1 only from cp_min_seq (16k tokens); llama3-8b has 8k


def test_large_space_needs_the_flag(capsys):
    argv = ["plan", *QUICK, "--micro-batch", *map(str, range(1, 1001)), "--tp", *map(str, range(1, 65))]
    assert main(argv + ["--json"]) == 0  # 5.2 M plans: a second at the measured rate, no flag needed
    assert json.loads(capsys.readouterr().out)["enumerated"] == 5_184_000
    assert main(["plan", *QUICK, "--micro-batch", *map(str, range(1, 8001)), "--tp", *map(str, range(1, 65))]) == 2
    err = capsys.readouterr().err
    assert "41,472,000" in err and "about 83 s" in err and "--allow-large-space" in err


@pytest.mark.parametrize("argv, needle", [
    (["collective", "--gpus", "8", "--ranks", "0-99999999999"], "outside the cluster's 8 GPUs"),
    (["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", str(1 << 21)],
     "above the supported maximum 1048576"),
    (["bench-collectives", "--nproc", "1000"], "local ranks need about"),
    (["profile", "--threads", "100000"], "above the supported maximum 1024"),
])
def test_resource_guards_refuse_before_allocating(capsys, argv, needle):
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_full_graph_refused_above_the_limit_before_allocating():
    """`topo check` uses the structure at any size; the per-link table (and max flow) refuse one line first."""
    from tpsim.errors import InputError
    from tpsim.topology import load_cluster

    cluster = load_cluster("dgx-h100", 65536)
    with pytest.raises(InputError, match="MAX_GRAPH_NODES") as info:
        cluster.edge_table
    assert "\n" not in str(info.value)
    assert main(["topo", "check", "dgx-h100", "--gpus", "65536"]) == 0
