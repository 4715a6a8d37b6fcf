"""Issue 13, YAML and input files: one bounded, strict reader (tpsim.safeyaml over tpsim.io) for every YAML
input; files of the wrong kind, bombs, deep nesting, unhashable keys, huge counts, special files and binary
data are refused in one line before anything is built."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.io import read_text
from tpsim.limits import LIMITS, MAX_JSON_DEPTH, MAX_YAML_NODES
from tpsim.safeyaml import check_size, kind_of, load_yaml, read_yaml
from tpsim.topology import clear_cache

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ("name: probe\nnode: dgx-a100\nfabric: selene-hdr-fat-tree\ndevice: A100-SXM4-80GB\ngpus: 16\n"
           "source: test\n")
NODE = ("name: n\nsource: test\ndevices:\n  gpu: {kind: gpu, count: 8}\n  sw: {kind: nvswitch, count: 1}\n"
        "links:\n  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 12}\n")
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


@pytest.fixture(autouse=True)
def _fresh():
    clear_cache()
    yield
    clear_cache()


def _topo(capsys, tmp_path, text, name="c.yaml", extra=None):
    (tmp_path / name).write_text(text) if isinstance(text, str) else (tmp_path / name).write_bytes(text)
    for rel, body in (extra or {}).items():
        (tmp_path / rel).write_text(body)
    code = main(["topo", "show", str(tmp_path / name)])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


# ------------------------------------------------------------------------------------------------- reader
def test_bomb_is_refused_from_its_events_without_expansion():
    with pytest.raises(InputError, match="is it a YAML bomb"):
        check_size(BOMB)
    check_size("a: &a [1, 2]\nb: *a\nc: *a\n")  # ordinary aliases are fine


def test_node_count_counts_aliases_at_their_expanded_size():
    text = "a: &a [" + ", ".join(["x"] * 100) + "]\nb: [" + ", ".join(["*a"] * 100) + "]\n"
    check_size(text, max_nodes=20_000)
    with pytest.raises(InputError, match="expands to more than 5,000"):
        check_size(text, max_nodes=5_000)


@pytest.mark.parametrize("text, needle", [
    ("a: " + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested more than"),
    ("a: " + "[" * 50_000 + "]" * 50_000, "nest"),
    ("".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n", "nested more than"),
    ("a: &a [1, *a]\n", "recursive aliases are not allowed"),
    ("a: *nowhere\n", "undefined"),
    ("? [a, b]\n: 1\n", "a list cannot be a key"),
    ("? {x: 1}\n: 1\n", "a dict cannot be a key"),
    ("a: 1\na: 2\n", "duplicate name 'a'"),
    ("a: !!python/object/apply:os.system [echo]\n", "could not determine a constructor"),
    ("a: 1\n---\nb: 2\n", "expected a single document"),
    ("a: x\n\tb: 1\n", "tab"),
    ("base: &b [1, 2]\nother:\n  <<: *b\n", "expected a mapping for merging"),
])
def test_hostile_yaml_is_one_line(text, needle):
    with pytest.raises(InputError, match=re.escape(needle)) as exc:
        load_yaml(text, "x.yaml")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("x.yaml: ")


def test_special_and_binary_files_are_refused(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it would block forever
    (tmp_path / "bin.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (tmp_path / "nul.yaml").write_bytes(b"a: 1\n\x00\n")
    (tmp_path / "big.yaml").write_text("a: '" + "x" * (5 << 20) + "'\n")
    cases = {fifo: "not a regular file", Path("/dev/zero"): "not a regular file", tmp_path: "is a folder",
             tmp_path / "missing.yaml": "does not exist", tmp_path / "bin.yaml": "not UTF-8",
             tmp_path / "latin.yaml": "not UTF-8 text (byte 0xe9 on line 1)", tmp_path / "nul.yaml": "binary data",
             tmp_path / "big.yaml": "above the"}
    for path, needle in cases.items():
        with pytest.raises(InputError, match=re.escape(needle)):
            read_yaml(path)
    with pytest.raises(InputError, match="empty"):
        read_text("", "config")


@pytest.mark.parametrize("data, text, kind", [
    ({"node": "x", "fabric": "y"}, "", "cluster"), ({"devices": {}, "links": []}, "", "node template"),
    ({"type": "fat_tree", "radix": 40}, "", "fabric"), ({"link_kinds": {}}, "", "link kinds"),
    ({"loopback": {"efficiency": 0.5}}, "", "calibration"), ({"model_type": "llama"}, "", "model config"),
    (None, "# tpsim kernel profile: ...", "kernel profile"), (None, "backend,op,nranks,bytes,time_s", "collective measurements"),
    ({"source": "none"}, "", None),
])
def test_kind_of(data, text, kind):
    assert kind_of(data, text) == kind


# ------------------------------------------------------------------------------------------------- clusters
@pytest.mark.parametrize("text, needle", [
    (BOMB, "YAML bomb"),
    ("? [a, b]\n: 1\n" + CLUSTER, "a list cannot be a key"),
    (CLUSTER.replace("gpus: 16", "gpus: " + "8" * 400), "gpus=888888888888...(400 digits) (line 5)"),
    (CLUSTER.replace("gpus: 16", "gpus: 1000000000000"), f"above the supported maximum {LIMITS['gpus']}"),
    (CLUSTER.replace("gpus: 16", "gpus: .nan"), "gpus=nan must be a positive integer"),
    (CLUSTER.replace("gpus: 16", "gpus: .inf"), "must be a positive integer"),
    (CLUSTER.replace("gpus: 16", "gpus: true"), "must be a positive integer"),
    (CLUSTER.replace("gpus: 16", "gpus: [16]"), "must be a positive integer"),
    (CLUSTER.replace("node: dgx-a100", "node: 42"), "node=42 must be a name"),
    (CLUSTER.replace("node: dgx-a100", "node: {a: 1}"), "must be a name"),
    (CLUSTER.replace("fabric: selene-hdr-fat-tree", "fabric: [1]"), "fabric=[1] must be a name or {use: name"),
    (CLUSTER + "defaults: {efficiency: .nan}\n", "efficiency=nan"),
    (NODE, "is a node template file, not a cluster"),
    ("loopback: {efficiency: 0.5}\n", "is a calibration file, not a cluster"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("", "got an empty file"),
])
def test_bad_cluster_files(capsys, tmp_path, text, needle):
    code, err = _topo(capsys, tmp_path, text)
    assert code == 2 and len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace("count: 8", "count: 1000000000"), f"above the supported maximum {LIMITS['node_devices']}"),
    (lambda t: t.replace("count: 1}", "count: 10000000}"), "above the supported maximum"),
    (lambda t: t.replace("lanes: 12", "lanes: 1000000000000"), "above the supported maximum"),
    (lambda t: t.replace("a: gpu,", "a: 'gpu[" + "9" * 400 + "]',"), "out of range"),
    (lambda t: t.replace("nvlink3", "warp-drive"), "is not a link kind"),
])
def test_bad_node_templates_refused_before_building(capsys, tmp_path, edit, needle):
    cluster = CLUSTER.replace("node: dgx-a100", "node: n.yaml")
    code, err = _topo(capsys, tmp_path, cluster, extra={"n.yaml": edit(NODE)})
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_fabric_and_torus_sizes_are_bounded(capsys, tmp_path):
    fabric = "name: f\ntype: fat_tree\nlevels: 2\nradix: 1000000000\nnic_link: hdr-ib\nswitch_link: hdr-ib\nsource: t\n"
    code, err = _topo(capsys, tmp_path, CLUSTER.replace("fabric: selene-hdr-fat-tree", "fabric: f.yaml"),
                      extra={"f.yaml": fabric})
    assert code == 2 and "radix=1000000000 is above the supported maximum" in err[0]
    torus = "name: t\ntype: torus\ndims: [100000, 100000, 100000]\nlink: ici-v4\nsource: t\n"
    cl = ("name: t\nnode: tpu-v4-host\nfabric: t.yaml\ndevice: TPU-v4\ngpus: 64\nsource: t\n")
    code, err = _topo(capsys, tmp_path, cl, extra={"t.yaml": torus})
    assert code == 2 and "dims=100000 is above the supported maximum" in err[0]


def test_calibration_files(capsys, tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "eff.yaml").write_text("loopback: {efficiency: 7}\n")
    (tmp_path / "ops.yaml").write_text("gloo_ops: 7\n")
    cases = {str(tmp_path / "bomb.yaml"): "YAML bomb", str(tmp_path / "eff.yaml"): "efficiency=7 is above the supported maximum 1",
             str(tmp_path / "ops.yaml"): "gloo_ops=7 must be a mapping",
             str(ROOT / "topologies/clusters/dgx-a100.yaml"): "is a cluster file",
             "": "not a file name or a shipped calibration"}
    for path, needle in cases.items():
        assert main(["collective", "--cluster", "local-cpu", "--calibration", path]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_huge_yaml_bomb_in_a_subprocess_is_quick_and_small(tmp_path):
    """End to end, with a memory cap: the bomb would need gigabytes once expanded."""
    (tmp_path / "c.yaml").write_text(CLUSTER + "note: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"n{i}: &n{i} [{', '.join(['*' + ('a' if i == 0 else f'n{i - 1}')] * 10)}]\n" for i in range(8)))
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
            "from tpsim.cli import main; sys.exit(main(['topo', 'show', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.yaml")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "YAML bomb" in proc.stderr and "Traceback" not in proc.stderr
    assert MAX_YAML_NODES == 1_000_000
