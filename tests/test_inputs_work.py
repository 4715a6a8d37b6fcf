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
