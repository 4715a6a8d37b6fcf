"""Summaries and checks of a cluster: injection and bisection bandwidth, link tables, reachability.

Everything here is computed from the structure (node template x nodes, fabric parameters), so that
``tpsim topo show`` answers in about a second for a 131,072-GPU cluster: device and link counts are the
template's times the nodes plus the fabric's own counts; the bisection of a fat tree is a max-flow over its
tree of blocks. The full-graph versions are kept for one-node clusters, tori, and as the reference the tests
compare with. The estimator never calls them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .fabric import FatTree, Torus
from .node import link_attrs

if TYPE_CHECKING:
    from .cluster import Cluster

NETWORK_TYPES = ("ib", "ethernet", "ici")


def injection_bandwidth(cluster: "Cluster") -> dict[str, float]:
    """Per-GPU GB/s per direction (the best-connected GPU of a node): nvlink, pcie, network."""
    layout = cluster.layout
    best = {"nvlink": 0.0, "pcie": 0.0, "network": 0.0}
    out: dict[str, defaultdict] = defaultdict(lambda: defaultdict(float))
    for (u, _), attrs in layout.edges.items():  # one pass over the edges (per GPU was quadratic)
        out[u][attrs.type] += attrs.bw_GBps
    for i in range(layout.num_gpus):
        per_type = out.get(layout.gpu(i), {})
        best["nvlink"] = max(best["nvlink"], per_type.get("nvlink", 0.0))
        best["pcie"] = max(best["pcie"], per_type.get("pcie", 0.0))
    if isinstance(cluster.fabric, Torus):
        torus = cluster.fabric
        most = max(torus.neighbour_links(r) for r in _torus_samples(torus, cluster.num_gpus))
        best["network"] = most * torus.attrs.bw_GBps
    elif cluster.spec.fabric.nic_link is not None and layout.nics:
        # from the fabric's NIC link kind, so a one-node cluster (no fabric built) still reports it
        spec = cluster.spec
        nic = link_attrs(spec.fabric.nic_link, 1, spec.default_efficiency, spec.calibration)
        used = {layout.nic_of(i) for i in range(cluster.gpus_per_node)} - {""}   # NICs of the GPUs in the job
        best["network"] = nic.bw_GBps * len(used) / cluster.gpus_per_node
    return best


def _torus_samples(torus: Torus, num: int) -> list[int]:
    """Chips with the most links: any chip away from the faces (or chip 0 of a small grid)."""
    inner = tuple(min(1, d - 1) for d in torus.dims)
    return [0] + [int(torus.rank_of(np.array([inner]))[0])] if num > 1 else [0]


@lru_cache(maxsize=64)
def bisection_bandwidth(cluster: "Cluster") -> float:
    """Max flow (GB/s, one direction) from the first half of the ranks to the second half.

    Multi-node: each node is contracted to one vertex (the links inside a node are not the bottleneck of a
    cut between nodes), so the cut is through the NIC links and the fabric. One node: the node's own graph.
    """
    if cluster.num_gpus < 2:
        return 0.0
    if isinstance(cluster.fabric, FatTree):
        return fat_tree_bisection(cluster)
    return bisection_on_graph(cluster)


def fat_tree_bisection(cluster: "Cluster") -> float:
    """Bisection of a multi-node fat tree from its structure. With every node contracted to one vertex, the
    first half's nodes feed each leaf through their NIC links and the second half's drain them; above the
    leaves the fabric is a tree of blocks (leaf, pod, super-pod), each joined to the level above by its
    uplinks. On a tree the maximum flow matches supply and demand as low as possible: each block passes up
    only its surplus, capped by its uplink capacity (equal to the max flow of the graph; the tests compare
    with networkx on the full graph)."""
    fat: FatTree = cluster.fabric
    half = cluster.num_nodes // 2
    nodes = np.arange(cluster.num_nodes)[:, None]
    leaf = fat.leaf_of(nodes, np.arange(fat.rails)[None, :])
    nic = fat.nic_attrs.bw_GBps
    supply = np.bincount(leaf[:half].ravel(), minlength=fat.num_leaves) * nic
    demand = np.bincount(leaf[half:].ravel(), minlength=fat.num_leaves) * nic
    kind, eff, cal = fat._switch_link
    matched = float(np.minimum(supply, demand).sum())
    excess = supply - demand
    size = 1
    for level in fat.block_levels():
        # the blocks of this level match what their parts pass up, then pass up their own surplus
        blocks = np.arange(len(excess)) * size // level.size
        up = np.bincount(blocks, weights=np.maximum(excess, 0.0))
        down = np.bincount(blocks, weights=np.maximum(-excess, 0.0))
        matched += float(np.minimum(up, down).sum())
        cap = sum(link_attrs(kind, lanes, eff, cal).bw_GBps for _, lanes in level.uplinks)
        excess = np.clip(up - down, -cap, cap)
        size = level.size
    return matched + float(min(np.maximum(excess, 0).sum(), np.maximum(-excess, 0).sum()))


def bisection_on_graph(cluster: "Cluster") -> float:
    """The bisection by networkx max flow on the graph (nodes contracted; one node: its own graph)."""
    import networkx as nx

    cluster.check_graph_size("compute a max flow on its graph")
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
    """Devices by kind: the template's times the nodes, then the fabric's switches."""
    counts: Counter = Counter()
    for attrs in cluster.layout.devices.values():
        counts[attrs["kind"]] += cluster.num_nodes
    if isinstance(cluster.fabric, FatTree):
        counts["switch"] += cluster.fabric.num_switches()
    return dict(counts)


def link_summary(cluster: "Cluster") -> list[dict[str, Any]]:
    """Physical links (pairs of directed edges) grouped by type and bandwidth: count, GB/s, latency."""
    groups: dict[tuple, int] = Counter()
    key = lambda a: (a.type, a.bw_GBps, a.lanes, a.latency_us, a.efficiency)
    for (u, v), attrs in cluster.layout.edges.items():
        if u < v:
            groups[key(attrs)] += cluster.num_nodes
    fabric = cluster.fabric
    if isinstance(fabric, FatTree):
        groups[key(fabric.nic_attrs)] += cluster.num_nodes * fabric.rails
        kind, eff, cal = fabric._switch_link
        for lanes, n in fabric.switch_link_counts().items():
            groups[key(link_attrs(kind, lanes, eff, cal))] += n
    elif isinstance(fabric, Torus):
        groups[key(fabric.attrs)] += fabric.num_links()
    return [{"type": t, "count": n, "bw_GBps": bw, "lanes": lanes, "latency_us": lat, "efficiency": eff,
             "total_GBps": bw * n}
            for (t, bw, lanes, lat, eff), n in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))]


def check_cluster(cluster: "Cluster") -> str:
    """Every GPU reaches every other GPU and every route's edges exist with fractions summing to 1.
    Returns how it was checked: on the full graph, or (above ``MAX_GRAPH_NODES`` devices) on the structure:
    the template's reachability (checked when the cluster loaded) and sampled routes whose every link is
    resolved from the structure."""
    from ..limits import MAX_GRAPH_NODES

    vertices, _ = cluster.graph_size()
    if vertices <= MAX_GRAPH_NODES:
        _check_graph(cluster)
        return "every GPU reaches every other GPU on the full graph"
    _check_segments(cluster)
    return (f"structure checked (node template, fabric, sampled routes); the full graph of {vertices} devices "
            f"is above MAX_GRAPH_NODES={MAX_GRAPH_NODES}")


def _check_graph(cluster: "Cluster") -> None:
    import networkx as nx

    graph = cluster.graph
    gpus = [cluster.gpu_id(r) for r in range(cluster.num_gpus)]
    reach = nx.descendants(graph, gpus[0]) | {gpus[0]}
    back = nx.ancestors(graph, gpus[0]) | {gpus[0]}
    for gpu in gpus:
        if gpu not in reach or gpu not in back:
            raise InputError(f"{cluster.spec.path}: GPU {gpu} cannot reach {gpus[0]} on the graph")
    _check_routes(cluster, lambda u, v: (u, v) in cluster.edge_table)


def _check_routes(cluster: "Cluster", exists) -> None:
    for src, dst in _sample_pairs(cluster):
        routes = cluster.paths(src, dst)
        total = sum(f for f, _ in routes)
        if abs(total - 1.0) > 1e-9:
            raise InputError(f"{cluster.spec.path}: routes {src}->{dst} sum to {total}, not 1")
        for _, path in routes:
            for u, v in path:
                try:
                    ok = exists(u, v)
                except InputError:
                    ok = False
                if not ok:
                    raise InputError(f"{cluster.spec.path}: route {src}->{dst} uses missing link {u}->{v}")
            if path[0][0] != cluster.gpu_id(src) or path[-1][1] != cluster.gpu_id(dst):
                raise InputError(f"{cluster.spec.path}: route {src}->{dst} does not join the two GPUs")


def _check_segments(cluster: "Cluster") -> None:
    """Sampled routes part by part (their product would be thousands of paths on a big fat tree): each
    part's fractions sum to 1, its links exist (resolved from the structure), the parts join end to end."""
    from .progress import progress

    seen: set[tuple[str, str]] = set()
    pairs = _sample_pairs(cluster, max_nodes=24)
    with progress(len(pairs), f"checking {cluster.name}", "route") as bar:
        for src, dst in pairs:
            _check_route_parts(cluster, src, dst, seen)
            bar.update()


def _check_route_parts(cluster: "Cluster", src: int, dst: int, seen: set[tuple[str, str]]) -> None:
    """One sampled route, part by part (links already resolved are in ``seen``)."""
    here = cluster.gpu_id(src)
    for part in cluster.route_segments(src, dst):
        total = sum(f for f, _ in part)
        if abs(total - 1.0) > 1e-9:
            raise InputError(f"{cluster.spec.path}: a part of route {src}->{dst} sums to {total}, not 1")
        ends = set()
        for _, path in part:
            if path[0][0] != here:
                raise InputError(f"{cluster.spec.path}: route {src}->{dst} breaks at {here}")
            for u, v in path:
                if (u, v) in seen:
                    continue
                try:
                    cluster.link_attrs(u, v)
                except InputError:
                    raise InputError(f"{cluster.spec.path}: route {src}->{dst} uses missing link "
                                     f"{u}->{v}") from None
                seen.add((u, v))
            ends.add(path[-1][1])
        if len(ends) != 1:
            raise InputError(f"{cluster.spec.path}: a part of route {src}->{dst} ends in {sorted(ends)}")
        here = ends.pop()
    if here != cluster.gpu_id(dst):
        raise InputError(f"{cluster.spec.path}: route {src}->{dst} does not reach {cluster.gpu_id(dst)}")


def _sample_pairs(cluster: "Cluster", max_nodes: int = 4096) -> list[tuple[int, int]]:
    """All pairs inside node 0 (up to 16 GPUs) and ranks 0 and N-1 to one GPU of every node (rotating; at
    most ``max_nodes`` nodes, evenly spaced, and the last, on big clusters)."""
    gpn, n = cluster.gpus_per_node, cluster.num_gpus
    pairs = {(a, b) for a in range(min(gpn, 16)) for b in range(min(gpn, 16)) if a != b}
    step = max(1, cluster.num_nodes // max_nodes)
    for src in (0, n - 1):
        for node in sorted(set(range(0, cluster.num_nodes, step)) | {cluster.num_nodes - 1}):
            dst = node * gpn + node % gpn
            if dst != src:
                pairs.add((src, dst))
    return sorted(pairs)
