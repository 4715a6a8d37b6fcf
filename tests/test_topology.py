"""Topology files, graph schema, routing (NVSwitch spread, rails, PXN, fat-tree ECMP, torus) and speed."""

from __future__ import annotations


import pytest

from tpsim.topology import list_clusters, load_cluster
from tpsim.topology import clear_cache

KINDS = {"gpu", "nvswitch", "pcie_switch", "cpu", "nic", "switch"}
TYPES = {"nvlink", "pcie", "ib", "ethernet", "ici", "loopback", "cpu"}


def test_all_required_clusters_are_shipped():
    assert {"dgx-a100", "dgx-h100", "hgx-h200", "gb200-nvl72", "pcie-8gpu", "tpu-v4", "local-cpu",
            "selene"} <= set(list_clusters())


@pytest.mark.parametrize("name", list_clusters())
def test_every_cluster_loads_checks_and_follows_the_schema(name):
    cluster = load_cluster(name)
    cluster.check()
    graph = cluster.graph
    assert cluster.num_gpus == cluster.num_nodes * cluster.gpus_per_node
    gpus = [n for n, a in graph.nodes(data=True) if a["kind"] == "gpu" and a["rank"] >= 0]
    assert len(gpus) == cluster.num_gpus
    for node, attrs in graph.nodes(data=True):
        assert isinstance(node, str)
        assert attrs["kind"] in KINDS
        assert {"node_index", "local_index", "level", "sharp"} <= set(attrs)
        if attrs["kind"] == "gpu" and attrs["rank"] >= 0:
            assert cluster.gpu_id(attrs["rank"]) == node
        if attrs["kind"] == "switch":
            assert attrs["node_index"] == -1 and attrs["level"] in (1, 2, 3)
        else:
            assert attrs["level"] == 0 and attrs["node_index"] >= 0
    for u, v, attrs in graph.edges(data=True):
        assert attrs["type"] in TYPES
        assert attrs["bw_GBps"] > 0 and attrs["lanes"] >= 1 and attrs["latency_us"] >= 0
        assert 0 < attrs["efficiency"] <= 1
        assert graph.edges[v, u] == attrs   # every physical link is two directed edges
    last = cluster.num_gpus - 1
    routes = cluster.paths(0, last)
    assert abs(sum(f for f, _ in routes) - 1) < 1e-12
    for _, path in routes:
        assert all(graph.has_edge(u, v) for u, v in path)


def test_dgx_a100_intra_node_spreads_over_six_nvswitches():
    cluster = load_cluster("dgx-a100", gpus=16)
    routes = cluster.paths(0, 5)
    switches = {path[0][1] for _, path in routes}
    assert switches == {f"n0/nvswitch{i}" for i in range(6)}
    assert all(abs(f - 1 / 6) < 1e-12 for f, _ in routes)
    assert all(cluster.link(*path[0])["type"] == "nvlink" for _, path in routes)
    assert cluster.link("n0/gpu0", "n0/nvswitch0")["bw_GBps"] == 50   # 2 lanes x 25 GB/s
    assert cluster.injection_bandwidth()["nvlink"] == 300


def test_dgx_a100_inter_node_uses_the_local_nics_rail():
    cluster = load_cluster("dgx-a100", gpus=16)
    for k in range(8):
        assert cluster.nic_id(k) == f"n0/nic{k}"
        assert cluster.rail(k) == k
    # GPU 3 of node 0 to GPU 3 of node 1: its PCIe switch's NIC 3, rail 3's leaf, no spine
    (frac, path), = cluster.paths(3, 11)
    assert frac == 1.0
    assert path == (("n0/gpu3", "n0/pcie1"), ("n0/pcie1", "n0/nic3"), ("n0/nic3", "leaf3"),
                    ("leaf3", "n1/nic3"), ("n1/nic3", "n1/pcie1"), ("n1/pcie1", "n1/gpu3"))


def test_dgx_h100_cross_rail_goes_over_nvlink_first_pxn():
    cluster = load_cluster("dgx-h100", gpus=16)
    routes = cluster.paths(0, 11)          # GPU 0 of node 0 -> GPU 3 of node 1 (rail 3)
    shares = {path[0][1]: f for f, path in routes}
    assert shares == pytest.approx({"n0/nvswitch0": 5 / 18, "n0/nvswitch1": 4 / 18,
                                    "n0/nvswitch2": 4 / 18, "n0/nvswitch3": 5 / 18})
    for _, path in routes:
        assert path[1][1] == "n0/gpu3"                       # proxy GPU on the destination's rail
        assert ("n0/nic3", "leaf3") in path and ("leaf3", "n1/nic3") in path
        assert not any(u.startswith("spine") or v.startswith("spine") for u, v in path)
    # without PXN (Selene, SC21-era NCCL) the same pair leaves through NIC 0 and crosses the spines
    selene = load_cluster("dgx-a100", gpus=16)
    spines = {v for _, path in selene.paths(0, 11) for _, v in path if v.startswith("spine")}
    assert len(spines) == 20


def test_fat_tree_ecmp_two_and_three_levels():
    # 3 levels, radix 40: leaves hold rail k of 20 nodes; pods of 20 leaves; 128 nodes -> 56 leaves, 3 pods
    cluster = load_cluster("dgx-a100", gpus=1024)
    same_pod = cluster.paths(0, 20 * 8)      # node 0 -> node 20, rail 0: leaf0 -> leaf8, same pod
    assert len(same_pod) == 20 and all(abs(f - 1 / 20) < 1e-12 for f, _ in same_pod)
    assert {p[3][1] for _, p in same_pod} == {f"spine0.{j}" for j in range(20)}
    cross_pod = cluster.paths(0, 60 * 8)     # node 60 -> leaf 24, pod 1
    assert len(cross_pod) == 20 * 2          # 20 pod spines x ceil(3 pods / 2) cores per group
    assert abs(sum(f for f, _ in cross_pod) - 1) < 1e-12
    cores = {v for _, p in cross_pod for _, v in p if v.startswith("core")}
    assert len(cores) == 40
    # 2 levels (pcie-8gpu, hdr-fat-tree, node placement): 40 nodes x 2 NICs -> 4 leaves, 2 spines of 10 lanes
    pcie = load_cluster("pcie-8gpu", gpus=320)
    routes = pcie.paths(0, 319)
    assert sorted(f for f, _ in routes) == [0.5, 0.5]
    assert pcie.link("leaf0", "spine0")["lanes"] == 10
    assert pcie.link("leaf0", "spine0")["bw_GBps"] == 250
    assert pcie.bisection_bandwidth() == pytest.approx(20 * 2 * 25)   # 20 nodes x 2 NICs x 25 GB/s


def test_pcie_server_routes_through_switches_and_sockets():
    cluster = load_cluster("pcie-8gpu")
    (f, same_switch), = cluster.paths(0, 1)
    assert same_switch == (("n0/gpu0", "n0/pcie0"), ("n0/pcie0", "n0/gpu1"))
    (f, cross), = cluster.paths(0, 7)
    assert [v for _, v in cross] == ["n0/pcie0", "n0/cpu0", "n0/cpu1", "n0/pcie3", "n0/gpu7"]
    assert cluster.injection_bandwidth()["network"] == pytest.approx(2 * 25 / 8)


def test_torus_dimension_order_and_ties():
    cluster = load_cluster("tpu-v4")           # 4x4x4, hosts of 2x2x1
    assert cluster.fabric.dims == (4, 4, 4)
    (f, one), = cluster.paths(0, 1)            # x neighbours in one host
    assert one == (("n0/gpu0", "n0/gpu1"),) and cluster.link("n0/gpu0", "n0/gpu1")["type"] == "ici"
    tie = cluster.paths(0, 4)                  # rank 4 = host 1 chip 0 = x 2: two ways round, 2 hops each
    assert sorted(f for f, _ in tie) == [0.5, 0.5] and all(len(p) == 2 for _, p in tie)
    assert cluster.injection_bandwidth()["network"] == 6 * 45
    assert cluster.bisection_bandwidth() == pytest.approx(16 * 2 * 45)   # a 4x4 plane, wraparound doubles it


def test_single_node_clusters():
    gb = load_cluster("gb200-nvl72")
    assert gb.num_nodes == 1 and gb.gpus_per_node == 72
    routes = gb.paths(0, 71)
    assert len(routes) == 18 and all(abs(f - 1 / 18) < 1e-12 for f, _ in routes)
    assert gb.graph.nodes["n0/nvswitch0"]["sharp"] is True
    local = load_cluster("local-cpu", gpus=4)
    assert local.num_gpus == 4 and local.num_nodes == 1
    (f, path), = local.paths(0, 3)
    assert [local.link(u, v)["type"] for u, v in path] == ["loopback", "loopback"]


def test_loading_and_routing_are_fast():
    clear_cache()  # the times: benchmarks/bench_lookups.py
    cluster = load_cluster("dgx-a100", gpus=1024)
    for ring in range(128):
        ranks = [ring + 128 * i for i in range(8)]
        for i in range(8):
            assert cluster.paths(ranks[i], ranks[(i + 1) % 8])
    big = load_cluster("dgx-a100", gpus=3072)
    assert big.num_nodes == 384


def test_same_inputs_same_object_and_fingerprint():
    a = load_cluster("dgx-h100", gpus=64)
    assert load_cluster("dgx-h100", gpus=64) is a
    assert load_cluster("dgx-h100") is load_cluster("dgx-h100", gpus=256)
    assert a.fingerprint() == load_cluster("dgx-h100", gpus=64).fingerprint()
    assert a.fingerprint() != load_cluster("dgx-h100", gpus=128).fingerprint()
    assert a.fingerprint() != load_cluster("hgx-h200", gpus=64).fingerprint()


def test_bisection_of_non_blocking_fat_tree_is_half_the_nics():
    cluster = load_cluster("dgx-a100", gpus=64)
    assert cluster.bisection_bandwidth() == pytest.approx(32 * 25)


from hypothesis import given, settings
from hypothesis import strategies as st

ROUTED = {"dgx-a100": 1024, "dgx-h100": 256, "pcie-8gpu": 64, "tpu-v4": 64, "gb200-nvl72": 144,
          "local-cpu": 3}


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(sorted(ROUTED)), data=st.data())
def test_every_route_joins_the_two_gpus_over_existing_links(name, data):
    cluster = load_cluster(name, gpus=ROUTED[name])
    src = data.draw(st.integers(0, cluster.num_gpus - 1))
    dst = data.draw(st.integers(0, cluster.num_gpus - 1))
    routes = cluster.paths(src, dst)
    if src == dst:
        assert routes == []
        return
    assert abs(sum(f for f, _ in routes) - 1) < 1e-9 and all(f > 0 for f, _ in routes)
    for _, path in routes:
        assert path[0][0] == cluster.gpu_id(src) and path[-1][1] == cluster.gpu_id(dst)
        assert all(a[1] == b[0] for a, b in zip(path, path[1:]))       # contiguous
        assert all((u, v) in cluster.edge_table for u, v in path)
        inner = [u for u, _ in path[1:]]
        kinds = [cluster.graph.nodes[u]["kind"] for u in inner]
        # only switches, CPUs and NICs forward, except a PXN proxy GPU or a torus chip
        assert kinds.count("gpu") <= (len(path) if name == "tpu-v4" else 1)
