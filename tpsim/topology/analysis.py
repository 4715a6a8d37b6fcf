"""Summaries and whole-graph checks of a cluster: injection and bisection bandwidth, link tables, reachability.

These walk the graph (once, cached per cluster); the estimator never calls them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .fabric import Torus
from .node import link_attrs

if TYPE_CHECKING:
    from .cluster import Cluster

NETWORK_TYPES = ("ib", "ethernet", "ici")


def injection_bandwidth(cluster: "Cluster") -> dict[str, float]:
    """Per-GPU GB/s per direction (the best-connected GPU of a node): nvlink, pcie, network."""
    layout = cluster.layout
    best = {"nvlink": 0.0, "pcie": 0.0, "network": 0.0}
    for i in range(layout.num_gpus):
        gpu = layout.gpu(i)
        out = defaultdict(float)
        for (u, _), attrs in layout.edges.items():
            if u == gpu:
                out[attrs.type] += attrs.bw_GBps
        best["nvlink"] = max(best["nvlink"], out["nvlink"])
        best["pcie"] = max(best["pcie"], out["pcie"])
    if isinstance(cluster.fabric, Torus):
        per_chip = defaultdict(float)
        for u, _, attrs in cluster.fabric.edges():
            per_chip[u] += attrs.bw_GBps
        best["network"] = max(per_chip.values(), default=0.0)
    elif cluster.spec.fabric.nic_link is not None and layout.nics:
        # from the fabric's NIC link kind, so a one-node cluster (no fabric built) still reports it
        spec = cluster.spec
        nic = link_attrs(spec.fabric.nic_link, 1, spec.default_efficiency, spec.calibration)
        best["network"] = nic.bw_GBps * len(layout.nics) / cluster.gpus_per_node
    return best


@lru_cache(maxsize=64)
def bisection_bandwidth(cluster: "Cluster") -> float:
    """Max flow (GB/s, one direction) from the first half of the ranks to the second half.

    Multi-node: each node is contracted to one vertex (the links inside a node are not the bottleneck of a
    cut between nodes), so the cut is through the NIC links and the fabric. One node: the node's own graph.
    """
    import networkx as nx

    if cluster.num_gpus < 2:
        return 0.0
    flow = nx.DiGraph()
    if cluster.num_nodes == 1:
        half = cluster.num_gpus // 2
        members = {cluster.gpu_id(r): ("S" if r < half else "T") for r in range(cluster.num_gpus)}
        for (u, v), attrs in cluster.edge_table.items():
            _add_capacity(flow, u, v, attrs.bw_GBps)
        for gpu, side in members.items():
            _add_capacity(flow, "S", gpu, float("inf")) if side == "S" else _add_capacity(flow, gpu, "T",
                                                                                          float("inf"))
    else:
        half = cluster.num_nodes // 2
        vertex = lambda x: f"node{x.split('/', 1)[0][1:]}" if x.startswith("n") and "/" in x else x
        for (u, v), attrs in cluster.edge_table.items():
            cu, cv = vertex(u), vertex(v)
            if cu != cv:
                _add_capacity(flow, cu, cv, attrs.bw_GBps)
        for node in range(cluster.num_nodes):
            if node < half:
                _add_capacity(flow, "S", f"node{node}", float("inf"))
            else:
                _add_capacity(flow, f"node{node}", "T", float("inf"))
    return float(nx.maximum_flow_value(flow, "S", "T"))


def _add_capacity(graph: Any, u: str, v: str, capacity: float) -> None:
    if graph.has_edge(u, v):
        graph[u][v]["capacity"] += capacity
    else:
        graph.add_edge(u, v, capacity=capacity)


def device_counts(cluster: "Cluster") -> dict[str, int]:
    """Devices by kind."""
    return dict(Counter(attrs["kind"] for _, attrs in cluster.devices()))


def link_summary(cluster: "Cluster") -> list[dict[str, Any]]:
    """Physical links (pairs of directed edges) grouped by type and bandwidth: count, GB/s, latency."""
    groups: dict[tuple, int] = Counter()
    for (u, v), attrs in cluster.edge_table.items():
        if u < v:
            groups[(attrs.type, attrs.bw_GBps, attrs.lanes, attrs.latency_us, attrs.efficiency)] += 1
    return [{"type": t, "count": n, "bw_GBps": bw, "lanes": lanes, "latency_us": lat, "efficiency": eff,
             "total_GBps": bw * n}
            for (t, bw, lanes, lat, eff), n in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))]


def check_cluster(cluster: "Cluster") -> None:
    """Every GPU reaches every other GPU on the graph; every route's edges exist and fractions sum to 1."""
    import networkx as nx

    graph = cluster.graph
    gpus = [cluster.gpu_id(r) for r in range(cluster.num_gpus)]
    reach = nx.descendants(graph, gpus[0]) | {gpus[0]}
    back = nx.ancestors(graph, gpus[0]) | {gpus[0]}
    for gpu in gpus:
        if gpu not in reach or gpu not in back:
            raise InputError(f"{cluster.spec.path}: GPU {gpu} cannot reach {gpus[0]} on the graph")
    for src, dst in _sample_pairs(cluster):
        routes = cluster.paths(src, dst)
        total = sum(f for f, _ in routes)
        if abs(total - 1.0) > 1e-9:
            raise InputError(f"{cluster.spec.path}: routes {src}->{dst} sum to {total}, not 1")
        for _, path in routes:
            for u, v in path:
                if (u, v) not in cluster.edge_table:
                    raise InputError(f"{cluster.spec.path}: route {src}->{dst} uses missing link {u}->{v}")
            if path[0][0] != cluster.gpu_id(src) or path[-1][1] != cluster.gpu_id(dst):
                raise InputError(f"{cluster.spec.path}: route {src}->{dst} does not join the two GPUs")


def _sample_pairs(cluster: "Cluster") -> list[tuple[int, int]]:
    """All pairs inside node 0 (up to 16 GPUs) and ranks 0 and N-1 to one GPU of every node (rotating)."""
    gpn, n = cluster.gpus_per_node, cluster.num_gpus
    pairs = {(a, b) for a in range(min(gpn, 16)) for b in range(min(gpn, 16)) if a != b}
    for src in (0, n - 1):
        for node in range(cluster.num_nodes):
            dst = node * gpn + node % gpn
            if dst != src:
                pairs.add((src, dst))
    return sorted(pairs)
