"""Hand-built clusters in the topology graph schema, for the collective model's unit tests.

Same schema as :mod:`tpsim.topology.cluster` (node attributes kind/node_index/local_index/level/sharp/rank,
directed edges with type/bw_GBps/lanes/latency_us/efficiency) and the same duck-typed interface
(graph, device, gpus_per_node, num_nodes, num_gpus, gpu_id, paths, fingerprint). Routes split equally over
all shortest paths.
"""

from __future__ import annotations

import networkx as nx

from tpsim.hardware import get_device


class HandCluster:
    def __init__(self, name: str, device: str, gpus_per_node: int, num_nodes: int):
        self.name = name
        self.device = get_device(device)
        self.gpus_per_node = gpus_per_node
        self.num_nodes = num_nodes
        self.num_gpus = gpus_per_node * num_nodes
        self.graph = nx.DiGraph()
        self._paths: dict = {}

    def add(self, node: str, kind: str, node_index: int = -1, local_index: int = -1, level: int = 0,
            sharp: bool = False, rank: int | None = None) -> None:
        attrs = dict(kind=kind, node_index=node_index, local_index=local_index, level=level, sharp=sharp)
        if rank is not None:
            attrs["rank"] = rank
        self.graph.add_node(node, **attrs)

    def link(self, a: str, b: str, type: str, bw_GBps: float, lanes: int = 1, latency_us: float = 0.5,
             efficiency: float = 1.0) -> None:
        for u, v in ((a, b), (b, a)):
            self.graph.add_edge(u, v, type=type, bw_GBps=bw_GBps, lanes=lanes, latency_us=latency_us,
                                efficiency=efficiency)

    def gpu_id(self, rank: int) -> str:
        return f"n{rank // self.gpus_per_node}/gpu{rank % self.gpus_per_node}"

    def paths(self, src: int, dst: int):
        key = (src, dst)
        if key not in self._paths:
            # GPUs never forward traffic: route on the graph without other GPUs
            a, b = self.gpu_id(src), self.gpu_id(dst)
            keep = [n for n, d in self.graph.nodes(data=True) if d["kind"] != "gpu" or n in (a, b)]
            sub = self.graph.subgraph(keep)
            ps = list(nx.all_shortest_paths(sub, a, b))
            self._paths[key] = [(1.0 / len(ps), tuple(zip(p[:-1], p[1:]))) for p in ps]
        return list(self._paths[key])

    def fingerprint(self) -> str:
        return f"{self.name}-{id(self)}"


def switch_node(gpus: int, device: str = "A100-SXM4-80GB", lanes: int = 5, lane_GBps: float = 20.0,
                sharp: bool = False, switches: int = 1, nodes: int = 1, nic_GBps: float = 25.0,
                nics_per_node: int = 1) -> HandCluster:
    """``nodes`` nodes of ``gpus`` GPUs, each GPU with ``lanes`` NVLink lanes to each of ``switches``
    NVSwitches; per node ``nics_per_node`` NICs (GPU i uses NIC i mod nics) on PCIe, all NICs on one IB
    switch."""
    c = HandCluster(f"hand-{gpus}x{nodes}", device, gpus, nodes)
    for n in range(nodes):
        for s in range(switches):
            c.add(f"n{n}/nvswitch{s}", "nvswitch", n, s, sharp=sharp)
        for k in range(nics_per_node):
            c.add(f"n{n}/nic{k}", "nic", n, k)
        for i in range(gpus):
            g = f"n{n}/gpu{i}"
            c.add(g, "gpu", n, i, rank=n * gpus + i)
            for s in range(switches):
                c.link(g, f"n{n}/nvswitch{s}", "nvlink", lanes * lane_GBps, lanes=lanes, latency_us=0.3)
            if nodes > 1:
                c.link(g, f"n{n}/nic{i % nics_per_node}", "pcie", 1000.0, latency_us=0.25)
    if nodes > 1:
        c.add("leaf0", "switch", level=1)
        for n in range(nodes):
            for k in range(nics_per_node):
                c.link(f"n{n}/nic{k}", "leaf0", "ib", nic_GBps, latency_us=0.85)
    return c


def loopback(ranks: int = 2, bw_GBps: float = 2.0, latency_us: float = 30.0) -> HandCluster:
    """CPU ranks of one machine talking through the host (gloo over loopback), as local-cpu."""
    c = HandCluster("hand-loopback", "CPU-x86-1thread", ranks, 1)
    c.add("n0/cpu0", "cpu", 0)
    for i in range(ranks):
        c.add(f"n0/gpu{i}", "gpu", 0, i, rank=i)
        c.link(f"n0/gpu{i}", "n0/cpu0", "loopback", bw_GBps, latency_us=latency_us)
    return c
