"""Clusters without their graph: structural summaries equal the graph's, the graph is refused above
MAX_GRAPH_NODES with one line, 4-level fat trees, link attributes and route parts from the structure."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import tpsim.limits
from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.topology import clear_cache, load_cluster
from tpsim.topology.analysis import bisection_on_graph, device_counts, fat_tree_bisection, link_summary

SMALL = [("dgx-a100", 320), ("dgx-h100", 256), ("gb200-nvl72", 144), ("pcie-8gpu", 64), ("tpu-v4", 64),
         ("hgx-h200", 64), ("local-cpu", 4)]


@pytest.fixture(scope="module")
def four_level(tmp_path_factory):
    """DGX H100 on the rail-optimized fabric with radix 8: 4 levels from 17 pods (136 nodes) on."""
    path = tmp_path_factory.mktemp("c") / "h100-r8.yaml"
    path.write_text("name: h100-r8\ndescription: t\nnode: dgx-h100\nfabric: {use: ndr-rail-optimized, radix: 8}\n"
                    "device: H100-SXM\ngpus: 160\nsource: t\n")
    return path


@pytest.mark.parametrize("name, gpus", SMALL)
def test_counts_from_the_structure_equal_the_graph(name, gpus):
    cluster = load_cluster(name, gpus=gpus)
    graph = cluster.graph
    assert device_counts(cluster) == dict(Counter(a["kind"] for _, a in graph.nodes(data=True)))
    assert cluster.graph_size() == (graph.number_of_nodes(), graph.number_of_edges())
    pairs = Counter()
    for u, v, a in graph.edges(data=True):
        if u < v:
            pairs[(a["type"], a["bw_GBps"], a["lanes"], a["latency_us"], a["efficiency"])] += 1
    assert {(r["type"], r["bw_GBps"], r["lanes"], r["latency_us"], r["efficiency"]): r["count"]
            for r in link_summary(cluster)} == dict(pairs)
    for (u, v), attrs in cluster.edge_table.items():   # every edge's attributes found from its names
        assert cluster.link_attrs(u, v) == attrs


@pytest.mark.parametrize("name, gpus", [("dgx-a100", 320), ("dgx-h100", 1024), ("pcie-8gpu", 160),
                                        ("selene", 640), ("gb200-nvl72", 216)])
def test_fat_tree_bisection_equals_max_flow_on_the_graph(name, gpus):
    cluster = load_cluster(name, gpus=gpus)
    assert fat_tree_bisection(cluster) == pytest.approx(bisection_on_graph(cluster), rel=1e-12)


def test_four_level_tree_and_its_bisection(four_level):
    cluster = load_cluster(four_level, gpus=160)
    fabric = cluster.fabric
    assert fabric.levels == 4 and fabric.superpods == 3 and fabric.pods == 10
    assert fat_tree_bisection(cluster) == pytest.approx(bisection_on_graph(cluster), rel=1e-12)
    cluster.check()
    # node 0 to the last node climbs to a core switch; every part of the route sums to 1
    top = {v for f, path in cluster.paths(0, 159) for _, v in path if v.startswith("core")}
    assert top and all(v.count(".") == 2 for v in top)
    for part in cluster.route_segments(0, 159):
        assert sum(f for f, _ in part) == pytest.approx(1.0)
    smaller = load_cluster(four_level, gpus=64)   # fits in 3 levels: built as 3
    assert smaller.fabric.levels == 3


def test_shipped_rail_fabric_reaches_131k_gpus():
    h100 = load_cluster("dgx-h100", gpus=131072)
    assert h100.fabric.levels == 4 and h100.num_nodes == 16384
    assert load_cluster("dgx-h100", gpus=65536).fabric.levels == 3
    vertices, edges = h100.graph_size()
    assert vertices > tpsim.limits.MAX_GRAPH_NODES
    with pytest.raises(InputError, match="MAX_GRAPH_NODES"):
        h100.graph
    with pytest.raises(InputError, match="MAX_GRAPH_NODES"):
        h100.edge_table
    # a link and a route part far away in the cluster, from names only
    assert h100.link_attrs("n16383/nic7", f"leaf{h100.fabric.leaf_of(16383, 7)}").type == "ib"
    with pytest.raises(InputError, match="no link"):
        h100.link_attrs("n16383/nic7", "leaf0")
    assert h100.fingerprint() is h100.fingerprint()


def test_topo_verbs_above_the_graph_limit(monkeypatch, capsys, tmp_path):
    clear_cache()   # a cluster loaded by another test may hold its graph already
    monkeypatch.setattr(tpsim.limits, "MAX_GRAPH_NODES", 500)
    assert main(["topo", "show", "dgx-h100", "--gpus", "1024", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"]["gpu"] == 1024 and data["bisection_GBps"] == pytest.approx(512 * 50)
    assert main(["topo", "check", "dgx-h100", "--gpus", "1024"]) == 0
    assert "structure checked" in capsys.readouterr().out
    assert main(["topo", "draw", "dgx-h100", "--gpus", "1024", "--out", str(tmp_path / "d.png")]) == 0
    capsys.readouterr()
    with pytest.raises(InputError, match="too large to build its full graph"):
        load_cluster("dgx-h100", gpus=1024).graph
