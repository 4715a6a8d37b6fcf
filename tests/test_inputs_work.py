"""Issue 26, work bounded before it starts: a verb estimates its work from the inputs (devices and links of a
node, GPU pairs of a node) and refuses with one line what exceeds tpsim/limits.py, instead of running for
minutes or out of memory; below the bounds, checks that were quadratic are linear."""

import time

import pytest

from tpsim.cli import main


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("tpsim"), err
    return err[0]


@pytest.mark.parametrize("argv, needle", [
    (["topo", "show", "local-cpu", "--gpus", str(1 << 20)], "devices in one node"),
    (["topo", "show", "local-cpu", "--gpus", "65536"], "devices in one node"),
    (["collective", "--cluster", "local-cpu", "--gpus", "16000", "--op", "all_reduce", "--bytes", "1MiB"],
     "GPUs in one node"),
    (["estimate", "--cluster", "local-cpu", "--gpus", "4096", "--model", "gpt3-1.3b", "--global-batch", "4096",
      "--micro-batch", "1"], "GPUs in one node"),
])
def test_oversized_single_node_is_refused_at_once(argv, needle, capsys):
    start = time.monotonic()
    assert main(argv) == 2
    assert needle in _one_line(capsys)
    assert time.monotonic() - start < 10


def test_node_whose_links_multiply_out_is_refused_before_building(tmp_path, capsys):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "wide.yaml").write_text(
        "name: wide\ndescription: d\nsource: s\ndevices:\n  gpu: {kind: gpu, count: 4096}\n"
        "  nvswitch: {kind: nvswitch, count: 4096}\nlinks:\n  - {a: gpu, b: nvswitch, pattern: all, link: nvlink4}\n")
    cluster = tmp_path / "wide.yaml"
    cluster.write_text("name: wide\ndescription: d\nsource: s\nnode: nodes/wide.yaml\nfabric: none\n"
                       "device: H100-SXM\ngpus: 4096\n")
    start = time.monotonic()
    assert main(["topo", "check", str(cluster)]) == 2
    line = _one_line(capsys)
    assert "16,777,216 links" in line or "devices in one node" in line, line
    assert time.monotonic() - start < 10


def test_node_checks_are_linear_in_the_ranks(capsys):
    """4,000 ranks on one host: the reachability check and the injection figures were quadratic (12 s at
    2,048); now the summary is printed within seconds."""
    start = time.monotonic()
    assert main(["topo", "show", "local-cpu", "--gpus", "4000"]) == 0
    assert "bisection" in capsys.readouterr().out
    assert time.monotonic() - start < 20


# ------------------------------------------------------------------------ one work estimator per verb (issue 26)
VERBS = ("estimate", "plan", "report", "design", "topo", "collective", "calibrate", "validate", "trace",
         "train-time", "export", "profile")
BIG_NODE = ["--cluster", "local-cpu", "--gpus", "4096", "--model", "gpt3-1.3b", "--global-batch", "4096"]


def test_every_verb_has_a_work_estimator_and_the_flag():
    from tpsim.cli import build_parser
    from tpsim.work import ESTIMATORS

    assert set(VERBS) <= set(ESTIMATORS)
    parser = build_parser()
    verbs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    missing = [v for v, p in verbs.items() if "--allow-large-work" not in p._option_string_actions]
    assert not missing, missing


def _over(tmp_path, verb):
    """A command line of ``verb`` whose inputs ask for more than a WORK_LIMITS bound, and that bound."""
    if verb in ("estimate", "train-time"):
        return [verb, *BIG_NODE, "--micro-batch", "1", *(["--tokens", "1e12"] if verb == "train-time" else [])], \
            "node_gpu_pairs"
    if verb == "export":
        return [verb, *BIG_NODE, "--micro-batch", "1", "--format", "megatron", "--out", str(tmp_path / "x")], \
            "node_gpu_pairs"
    if verb == "plan":
        return [verb, *BIG_NODE], "node_gpu_pairs"
    if verb == "collective":
        return [verb, "--cluster", "local-cpu", "--gpus", "16000"], "node_gpu_pairs"
    if verb == "report":
        return [verb, "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--scaling-span",
                str(1 << 20), "--out", str(tmp_path / "r")], "searches"
    if verb == "design":
        sweep = tmp_path / "big.yaml"
        sweep.write_text("axes:\n  device: [H100-SXM]\n  gpus: {from: 8, to: 80000, step: 8}\n"
                         "  gpu_hour_price: [1, 2, 3]\nmodels: [llama3-8b]\n")
        return [verb, str(sweep), "--out", str(tmp_path / "d")], "designs"
    if verb == "topo":
        return [verb, "show", "local-cpu", "--gpus", str(1 << 20)], "node_devices"
    if verb == "calibrate":
        big = tmp_path / "m.csv"
        with open(big, "wb") as f:
            f.truncate(300 << 20)  # sparse: the size is what counts, before anything is read
        return [verb, str(big), "--out", str(tmp_path / "c.yaml")], "input_bytes"
    if verb == "validate":
        return [verb, "--hidden", "128", "--heads", "4", "--tp", "2048"], "local_ranks"
    if verb == "trace":
        return [verb, "tpsim.trace.zoo:vit_l16", "--input-shape", "65536,65536,65536,4",
                "--out", str(tmp_path / "t.ops.json")], "input_elements"
    if verb == "profile":
        return [verb, *(["--dtype", "fp32"] * 8), "--out", str(tmp_path / "p.csv")], "kernel_points"
    raise AssertionError(verb)


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_refuses_work_above_the_bounds_before_starting(verb, tmp_path, capsys):
    from tpsim.limits import WORK_LIMITS

    argv, quantity = _over(tmp_path, verb)
    start = time.monotonic()
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"WORK_LIMITS[{quantity!r}]" in line, line
    assert ("no flag lifts it" in line) == WORK_LIMITS[quantity][1]
    assert time.monotonic() - start < 10
    assert not [p for p in tmp_path.iterdir() if p.suffix not in (".yaml", ".csv") or p.stat().st_size == 0]


def test_a_soft_bound_is_lifted_by_the_flag_a_hard_one_is_not():
    from argparse import Namespace

    from tpsim.errors import InputError
    from tpsim.work import check_work

    soft = Namespace(device="cpu", grid="full", quick=False, dtype=["fp32"] * 8, kinds="gemm,attention,memory",
                     check=None, allow_large_work=False)
    with pytest.raises(InputError, match="--allow-large-work"):
        check_work("profile", soft)
    soft.allow_large_work = True
    assert check_work("profile", soft)[0].amount > 20_000
    hard = Namespace(cluster="local-cpu", gpus=4096, allow_large_work=True)
    with pytest.raises(InputError, match="no flag lifts it"):
        check_work("estimate", hard)


@pytest.mark.parametrize("verb", ["plan", "report"])
def test_a_huge_plan_space_is_refused_up_front_naming_its_flag(verb, tmp_path, capsys):
    """The plan space (tp x ... x micro-batch) is part of the verb's work estimate: refused before the search,
    one line naming --allow-large-space; the flag lifts it (checked on the estimate, not by searching)."""
    from tpsim.cli import build_parser
    from tpsim.work import check_work

    argv = [verb, "--model", "mixtral-8x7b", "--gpus", "65536", "--full-space", "--micro-batch",
            *map(str, range(1, 41))] + (["--out", str(tmp_path / "r")] if verb == "report" else [])
    start = time.monotonic()
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "candidate plans" in line and "--allow-large-space" in line and "WORK_LIMITS['plans']" in line
    assert time.monotonic() - start < 10
    lifted = build_parser().parse_args(argv + ["--allow-large-space"])
    assert "plans" in [a.quantity for a in check_work(verb, lifted)]
