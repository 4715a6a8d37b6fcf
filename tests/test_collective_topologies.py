"""Every shipped topology costs an all-reduce over 8 GPUs and over all its GPUs; a seen layout is a lookup;
the torus formula. (Structural vs full-graph equality: tests/test_collective_structural.py.)"""

import numpy as np
import pytest

from tpsim.collectives.model import CollectiveModel, get_collective_model
from tpsim.topology import list_clusters, load_cluster, topologies_dir
from tpsim.topology.placement import rank_groups


def shipped(name):
    """Load a shipped cluster; skip files another test created and removed meanwhile."""
    if not (topologies_dir() / "clusters" / f"{name}.yaml").is_file():
        pytest.skip(f"{name} vanished (a temporary file of another test)")
    return load_cluster(name)


def injection_GBps(cluster, rank):
    g = cluster.graph
    gpu = cluster.gpu_id(rank)
    return sum(g.edges[gpu, v]["bw_GBps"] for v in g.successors(gpu))


@pytest.mark.parametrize("name", list_clusters())
def test_every_topology_costs_an_all_reduce(name):
    cluster = shipped(name)
    model = get_collective_model(cluster)
    n = cluster.num_gpus
    for group in (tuple(range(min(8, n))), tuple(range(n))):
        r = model.run("all_reduce", 1 << 28, (group,))
        assert np.isfinite(r.time_s) and r.time_s > 0, (name, len(group))
        # a ring's bus bandwidth cannot beat the GPU's own links
        assert 0 < r.busbw_GBps <= 1.6 * injection_GBps(cluster, 0), (name, r)
        assert r.algorithm


def test_dp_layout_cost_and_cache_on_256_gpus():
    cluster = load_cluster("dgx-h100")
    model = CollectiveModel(cluster)
    groups = rank_groups(8, cluster.num_gpus // 8, 1)
    curve = model.curve("all_reduce", groups["dp"])
    assert model.curve("all_reduce", groups["dp"]) is curve   # cached per layout (speed: benchmarks/)
    # 8 DP groups (one per rail) each through their own NDR NIC: ~48 GB/s bus bandwidth each
    r = model.run("all_reduce", 1 << 30, groups["dp"])
    assert 40 < r.busbw_GBps < 50


def test_torus_multidimensional_ring_formula():
    """4x4x4 TPU v4 torus: three streams (one per starting dimension), bidirectional rings, data shrinking by
    4 per phase: every directed ICI link carries (1 + 1/4 + 1/16) / 4 bytes per byte of all-reduce buffer."""
    cluster = shipped("tpu-v4")
    model = CollectiveModel(cluster)
    g = (tuple(range(64)),)
    ln = next(x for x in model.candidates("all_reduce", g) if x.name == "torus-ring/3d")
    ici = float(model.router.route(0, 1).capacity.max())
    assert ln.sec_per_byte == pytest.approx((1 + 1 / 4 + 1 / 16) / 4 / ici)
    assert ln.latency_s == pytest.approx(2 * 9 * model.router.route_latency(0, 1))
    r = model.run("all_reduce", 1 << 30, g)
    assert r.algorithm == "torus-ring/3d"  # uses all six links of a chip, beats NCCL-style rings
    plane = next(x for x in model.candidates("all_reduce", (tuple(range(16)),)) if x.name.startswith("torus"))
    assert plane.name == "torus-ring/2d"
    # a group that is not a full sub-grid gets no torus candidate
    assert not any(x.name.startswith("torus") for x in model.candidates("all_reduce", ((0, 1, 2, 5),)))
