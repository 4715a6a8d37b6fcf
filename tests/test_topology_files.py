"""Strict loading of topology files and the `tpsim topo` verb (bad files: one line, exit status 2)."""

from __future__ import annotations
from tpsim.hardware import DATA_DIR

RAW = str(DATA_DIR / "calibration" / "none.yaml")  # the empty calibration: raw link figures

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.topology import list_clusters, load_cluster, topologies_dir

NODE = """\
name: tiny
source: test
devices:
  gpu: {kind: gpu, count: 4}
  sw: {kind: nvswitch, count: 2}
  pcie: {kind: pcie_switch, count: 1}
  nic: {kind: nic, count: 2}
links:
  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 1}
  - {a: gpu, b: pcie, link: pcie-gen4-x16}
  - {a: nic, b: pcie, link: pcie-gen4-x16}
"""
CLUSTER = """\
name: tiny
node: node.yaml
fabric: hdr-fat-tree
device: A100-SXM4-80GB
gpus: 8
source: test
"""


def write(tmp_path: Path, node: str = NODE, cluster: str = CLUSTER, extra: dict | None = None) -> Path:
    (tmp_path / "node.yaml").write_text(textwrap.dedent(node))
    (tmp_path / "cluster.yaml").write_text(textwrap.dedent(cluster))
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path / "cluster.yaml"


def test_a_good_custom_file_loads(tmp_path):
    cluster = load_cluster(write(tmp_path))
    assert cluster.num_nodes == 2
    cluster.check()
    routes = cluster.paths(0, 3)
    assert len(routes) == 2 and all(f == 0.5 for f, _ in routes)


@pytest.mark.parametrize("node, cluster, element, problem", [
    (NODE.replace("count: 2}\n  pcie", "count: 2, colour: red}\n  pcie"), CLUSTER, "devices.sw",
     "unknown key 'colour'"),
    (NODE, CLUSTER + "colour: red\n", "cluster.yaml", "unknown key 'colour'"),
    (NODE.replace("lanes: 1}", "lanes: 1, bw_GBps: 0}"), CLUSTER, "links[0] (gpu - sw)", "bw_GBps=0"),
    (NODE.replace("lanes: 1}", "lanes: 1, bw_GBps: -5}"), CLUSTER, "links[0] (gpu - sw)", "bw_GBps=-5"),
    (NODE.replace("lanes: 1}", "lanes: 0}"), CLUSTER, "links[0] (gpu - sw)", "lanes=0"),
    (NODE.replace("link: nvlink3", "link: warp-drive"), CLUSTER, "links[0]", "'warp-drive' is not a link kind"),
    (NODE.replace("  sw: {kind: nvswitch, count: 2}\n", "  sw: {kind: nvswitch, count: 2}\n  gpu: {kind: gpu, "
                  "count: 2}\n"), CLUSTER, "node.yaml", "duplicate name 'gpu'"),
    (NODE.replace("  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 1}\n",
                  "  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 1}\n"
                  "  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 2}\n"), CLUSTER, "links[1]",
     "duplicate link"),
    (NODE.replace("{a: gpu, b: sw, pattern: all", "{a: \"gpu[0-2]\", b: sw, pattern: all")
         .replace("{a: gpu, b: pcie, link: pcie-gen4-x16}", "{a: \"gpu[0-1]\", b: pcie, pattern: all, "
                  "link: pcie-gen4-x16}"), CLUSTER, "devices.gpu", "gpu0 cannot reach gpu3"),
    (NODE, CLUSTER.replace("gpus: 8", "gpus: 10"), "cluster.yaml", "gpus=10 is not a whole number of nodes"),
    (NODE, CLUSTER.replace("gpus: 8", "gpus: 10\npartial_nodes: 4"), "cluster.yaml",
     "gpus=10 cannot fill its nodes evenly in units of partial_nodes=4"),
    (NODE, CLUSTER.replace("gpus: 8", "gpus: 16\npartial_nodes: 0"), "cluster.yaml", "partial_nodes=0"),
    (NODE, CLUSTER.replace("A100-SXM4-80GB", "Z9000"), "cluster.yaml", "device='Z9000' is unknown"),
    (NODE, CLUSTER.replace("hdr-fat-tree", "{use: hdr-fat-tree, radix: 0}"), "fabric hdr-fat-tree", "radix=0"),
    (NODE, CLUSTER.replace("hdr-fat-tree", "{use: hdr-fat-tree, wings: 2}"), "fabric", "unknown key 'wings'"),
    (NODE.replace("  nic: {kind: nic, count: 2}\n", "").replace("  - {a: nic, b: pcie, link: pcie-gen4-x16}\n", ""),
     CLUSTER, "node.yaml", "needs exactly one group of kind nic"),
    (NODE, CLUSTER.replace("hdr-fat-tree", "none"), "cluster.yaml: fabric none", "connects one node, not 2"),
    (NODE + "  - {a: nic, b: nic, link: hdr-nic}\n", CLUSTER, "links[3]", "to itself"),
    ("devices: [1, 2\n", CLUSTER, "node.yaml", "not valid YAML"),
], ids=["unknown-device-key", "unknown-cluster-key", "zero-bandwidth", "negative-bandwidth", "zero-lanes",
        "unknown-link-kind", "duplicate-device-name", "duplicate-link", "unreachable-gpu", "partial-node", "partial-node-units", "partial-nodes-zero",
        "unknown-device", "bad-radix", "unknown-fabric-key", "no-nic", "fabric-none-two-nodes", "self-link",
        "bad-yaml"])
def test_bad_files_name_the_file_the_element_and_the_problem(tmp_path, node, cluster, element, problem, capsys):
    path = write(tmp_path, node, cluster)
    with pytest.raises(InputError) as info:
        load_cluster(path)
    message = str(info.value)
    assert "\n" not in message
    assert element in message and problem in message
    assert str(tmp_path) in message or "fabric" in element
    # the CLI says it in one line and exits with status 2
    assert main(["topo", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and problem in err


def test_calibration_overrides_link_types_and_changes_the_fingerprint(tmp_path):
    (tmp_path / "cal.yaml").write_text("loopback: {efficiency: 0.5, latency_us: 12.5, bw_GBps: 3.0}\n"
                                       "source: test fit\nfit_error: {median: 0.03}\n")
    base = (topologies_dir() / "clusters" / "local-cpu.yaml").read_text()
    base = "\n".join(line for line in base.splitlines() if not line.startswith("calibration:"))
    (tmp_path / "local.yaml").write_text(base + "\ncalibration: cal.yaml\n")
    plain = load_cluster("local-cpu", gpus=2, calibration=RAW)
    tuned = load_cluster(tmp_path / "local.yaml", gpus=2)
    assert tuned.link("n0/gpu0", "n0/cpu0") == {"type": "loopback", "bw_GBps": 3.0, "lanes": 1,
                                                "latency_us": 12.5, "efficiency": 0.5}
    assert plain.link("n0/gpu0", "n0/cpu0")["latency_us"] == 30
    assert tuned.fingerprint() != plain.fingerprint()
    (tmp_path / "cal.yaml").write_text("loopback: {efficiency: 1.5}\n")
    with pytest.raises(InputError, match=r"cal.yaml: loopback.efficiency=1.5 is above the supported maximum 1"):
        load_cluster(tmp_path / "local.yaml", gpus=2)


def test_gpus_argument_is_checked():
    with pytest.raises(InputError, match="gpus=12 is not a whole number of nodes of 8 GPUs"):
        load_cluster("dgx-a100", gpus=12)
    with pytest.raises(InputError, match="gpus=78 cannot fill its nodes evenly in units of partial_nodes=4"):
        load_cluster("gb200-nvl72", gpus=78)
    with pytest.raises(InputError, match="gpus=0"):
        load_cluster("dgx-a100", gpus=0)
    with pytest.raises(InputError, match="cluster='nope' is unknown"):
        load_cluster("nope")
    with pytest.raises(InputError, match="rank=64 is out of range"):
        load_cluster("dgx-a100").paths(0, 64)


def test_fabric_too_small_is_an_input_error():
    with pytest.raises(InputError, match="exceed what 2 levels of radix 40"):
        load_cluster("pcie-8gpu", gpus=8 * 401)


def test_topologies_folder_can_be_moved(tmp_path, monkeypatch):
    shutil.copytree(topologies_dir(), tmp_path / "topo")
    (tmp_path / "topo" / "clusters" / "mine.yaml").write_text(
        (tmp_path / "topo" / "clusters" / "dgx-a100.yaml").read_text().replace("gpus: 64", "gpus: 16"))
    monkeypatch.setenv("TPSIM_TOPOLOGIES", str(tmp_path / "topo"))
    assert "mine" in list_clusters()
    assert load_cluster("mine").num_gpus == 16


def test_topo_show_check_draw(tmp_path, capsys):
    assert main(["topo", "show", "dgx-a100", "--gpus", "16"]) == 0
    out = capsys.readouterr().out
    assert "nvlink" in out and "bisection" in out and "NVLink 300" in out
    assert main(["topo", "show", "dgx-h100", "--gpus", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"]["nvswitch"] == 8 and data["injection_GBps_per_gpu"]["network"] == 50
    assert data["bisection_GBps"] == pytest.approx(8 * 50)
    nvlinks = [row for row in data["links"] if row["type"] == "nvlink"]
    assert sum(r["count"] for r in nvlinks) == 2 * 8 * 4
    assert main(["topo", "check", "tpu-v4"]) == 0
    assert capsys.readouterr().out.startswith("OK tpu-v4")
    out_png = tmp_path / "selene.png"
    assert main(["topo", "draw", "selene", "--out", str(out_png)]) == 0
    assert out_png.read_bytes()[:4] == b"\x89PNG"
    assert "showing 4 of 384 nodes" in capsys.readouterr().out


def test_missing_bandwidth_in_a_link_kind(tmp_path, monkeypatch):
    shutil.copytree(topologies_dir(), tmp_path / "topo")
    links = tmp_path / "topo" / "links.yaml"
    links.write_text(links.read_text().replace("    bw_GBps: 25\n", "", 1))
    monkeypatch.setenv("TPSIM_TOPOLOGIES", str(tmp_path / "topo"))
    with pytest.raises(InputError, match=r"links.yaml: link_kinds.nvlink3: missing key 'bw_GBps'"):
        load_cluster("dgx-a100")
    assert main(["topo", "check", "dgx-a100"]) == 2


def test_every_node_template_and_fabric_is_used_by_a_cluster():
    import yaml

    used_nodes, used_fabrics = set(), set()
    for path in (topologies_dir() / "clusters").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        used_nodes.add(data["node"])
        fabric = data["fabric"]
        used_fabrics.add(fabric["use"] if isinstance(fabric, dict) else fabric)
    assert used_nodes == {p.stem for p in (topologies_dir() / "nodes").glob("*.yaml")}
    assert used_fabrics == {p.stem for p in (topologies_dir() / "fabrics").glob("*.yaml")}


def test_multi_rack_gb200_uses_a_three_level_rail_fabric():
    cluster = load_cluster("gb200-nvl72", gpus=144)
    assert cluster.num_nodes == 2
    cluster.check()
    routes = cluster.paths(0, 72 + 5)        # cross-rail: PXN over NVLink to GPU 5, then rail 5
    assert all(path[1][1] == "n0/gpu5" for _, path in routes)
    assert cluster.injection_bandwidth()["network"] == 50


def test_oversubscription_thins_the_leaf_uplinks(tmp_path):
    base = (topologies_dir() / "clusters" / "pcie-8gpu.yaml").read_text()
    (tmp_path / "o3.yaml").write_text(base.replace("fabric: hdr-fat-tree",
                                                   "fabric: {use: hdr-fat-tree, oversubscription: 3}"))
    full = load_cluster("pcie-8gpu", gpus=8 * 64)
    thin = load_cluster(tmp_path / "o3.yaml", gpus=8 * 64)
    lanes = lambda c: sum(a.lanes for (u, v), a in c.edge_table.items() if u == "leaf0" and v.startswith("spine"))
    downs = lambda c: sum(1 for (u, v) in c.edge_table if u == "leaf0" and "/nic" in v)
    assert (downs(full), lanes(full)) == (20, 20)          # radix 40 at 1:1
    assert (downs(thin), lanes(thin)) == (30, 10)          # 3:1
    assert thin.bisection_bandwidth() < full.bisection_bandwidth()


def test_cluster_default_efficiency_applies_to_links_without_one(tmp_path):
    path = write(tmp_path, cluster=CLUSTER + "defaults: {efficiency: 0.9}\n")
    cluster = load_cluster(path)
    assert {a.efficiency for a in cluster.edge_table.values()} == {0.9}
    with pytest.raises(InputError, match=r"defaults: efficiency=0 must be a positive number"):
        load_cluster(write(tmp_path, cluster=CLUSTER + "defaults: {efficiency: 0}\n"))


def test_draw_a_torus_and_a_big_node(tmp_path, capsys):
    assert main(["topo", "draw", "tpu-v4", "--out", str(tmp_path / "t.png")]) == 0
    assert main(["topo", "draw", "gb200-nvl72", "--out", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert "4x4x4 torus" in out and "16 of 72 GPUs per node" in out
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_calibration_argument_of_load_cluster(tmp_path):
    (tmp_path / "cal.yaml").write_text("loopback: {latency_us: 7.0}\nsource: bench\n")
    tuned = load_cluster("local-cpu", gpus=3, calibration=tmp_path / "cal.yaml")
    assert tuned.link("n0/gpu2", "n0/cpu0")["latency_us"] == 7.0
    assert tuned.spec.calibration.provenance == {"source": "bench"}
    assert load_cluster("local-cpu", gpus=3, calibration=RAW).link("n0/gpu2", "n0/cpu0")["latency_us"] == 30
    shipped = load_cluster("local-cpu", gpus=3)  # the file includes the calibration fitted on this machine
    assert shipped.spec.calibration is not None and shipped.link("n0/gpu2", "n0/cpu0")["latency_us"] != 30
    with pytest.raises(InputError, match="calibration='/nope.yaml': file not found"):
        load_cluster("local-cpu", calibration="/nope.yaml")


def test_reads_what_tpsim_calibrate_writes(tmp_path):
    from tpsim.collectives.calibration import CalibrationFit, provenance

    fit = CalibrationFit(per_type={"loopback": {"efficiency": 0.7, "latency_us": 21.5, "bw_GBps": 2.0,
                                                "samples": 12}},
                         error_before={"median": 0.4, "max": 0.9}, error_after={"median": 0.05, "max": 0.2},
                         points=12, provenance={"gloo_ops": {"all_reduce": {"efficiency": 0.6, "latency_us": 30.0,
                                                                            "bw_GBps": 2.0}}})
    path = tmp_path / "cal.yaml"
    path.write_text(CalibrationFit(**{**fit.__dict__, "provenance": provenance(fit, "local-cpu", ["b.csv"])})
                    .to_yaml())
    cluster = load_cluster("local-cpu", gpus=2, calibration=path)
    assert cluster.link("n0/gpu0", "n0/cpu0")["efficiency"] == 0.7
    assert cluster.link("n0/gpu0", "n0/cpu0")["latency_us"] == 21.5
    assert cluster.spec.calibration.provenance["gloo_ops"]["all_reduce"]["latency_us"] == 30.0


@pytest.mark.parametrize("name,gpus,per_node,nodes", [
    ("dgx-h100", 4, 4, 1),          # a job on part of one node: its first GPUs
    ("dgx-h100", 16, 8, 2),
    ("gb200-nvl72", 64, 64, 1),     # partial racks in whole compute trays (partial_nodes: 4)
    ("gb200-nvl72", 128, 64, 2),
    ("gb200-nvl72", 144, 72, 2),
    ("gb300-nvl72", 256, 64, 4),
    ("gb300-nvl72", 96, 48, 2),
])
def test_a_job_that_is_not_whole_nodes_fills_them_evenly(name, gpus, per_node, nodes):
    """A job smaller than one node uses part of it; an NVL72 job that is not whole racks uses the same number
    of whole trays on every rack (the largest that divides it)."""
    cluster = load_cluster(name, gpus=gpus)
    assert cluster.num_gpus == gpus and cluster.gpus_per_node == per_node and cluster.num_nodes == nodes
