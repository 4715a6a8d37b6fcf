"""The full-graph router: link loads of flows on ``cluster.graph`` (networkx), route by route.

This is the reference model and the one used for clusters that are not a regular :class:`~tpsim.topology.
Cluster` (hand-built graphs in tests, irregular user topologies). Every distinct (src, dst) pair of ranks is
routed with ``cluster.paths`` (weighted multi-path) once; the loads of all flows together are one bincount
over the stored routes. Time per byte of the slowest group = ``max over links (load / capacity)``: a ring's
bandwidth is the minimum over links of capacity / hops using it, and two groups sharing a NIC get half of it
each (issue 3). Its cost grows with the number of distinct pairs; :mod:`tpsim.collectives.structure` computes
the same loads from the cluster's structure for regular clusters of any size.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import InputError
from ..topology.progress import progress
from .flows import Flows
from .groups import ShiftedFlows
from .links import FastLinks, LinkRules, RouteInfo, RouteQueries

FAST_TYPES = ("nvlink", "ici")


class GraphRouter(RouteQueries):
    """Edge arrays of ``cluster.graph`` and routes between ranks, computed once per pair."""

    def __init__(self, cluster: Any, rules: LinkRules | None = None):
        self.cluster = cluster
        self.rules = rules or LinkRules()
        graph = cluster.graph
        self.edge_index: dict[tuple[str, str], int] = {}
        caps, lats, types, bws = [], [], [], []
        for i, (u, v, attrs) in enumerate(graph.edges(data=True)):
            self.edge_index[(u, v)] = i
            cap, lat = self.rules.of(attrs)
            caps.append(cap)
            lats.append(lat)
            types.append(attrs["type"])
            bws.append(float(attrs["bw_GBps"]))
        self.capacity = np.asarray(caps, dtype=float)
        """bytes/s per directed link (bandwidth x efficiency, NCCL caps)."""
        self.latency = np.asarray(lats, dtype=float)
        """seconds per traversal of each directed link."""
        self.types = np.asarray(types, dtype=object)
        self.bw_GBps = np.asarray(bws, dtype=float)
        if not len(self.capacity) or not np.all(self.capacity > 0):
            raise InputError(f"cluster {getattr(cluster, 'name', '?')}: every link needs bw_GBps > 0 "
                             "and efficiency > 0 for the collective model")
        self._routes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # every route's arrays laid end to end (route id -> start, length), for vectorized loads
        self._route_id: dict[tuple[int, int], int] = {}
        self._starts: list[int] = []
        self._lens: list[int] = []
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._flat_idx = np.zeros(0, dtype=np.int64)
        self._flat_frac = np.zeros(0)
        self._starts_arr = np.zeros(0, dtype=np.int64)
        self._lens_arr = np.zeros(0, dtype=np.int64)
        self._stored = 0
        self._node_local: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------------------------------- ranks
    @property
    def num_gpus(self) -> int:
        return int(self.cluster.num_gpus)

    def gpu(self, rank: int) -> str:
        return self.cluster.gpu_id(rank)

    def node_local(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(node index, local index) of each rank, from the graph's node attributes."""
        if self._node_local is None:
            nodes = self.cluster.graph.nodes
            attrs = [nodes[self.gpu(r)] for r in range(self.num_gpus)]
            self._node_local = (np.array([a["node_index"] for a in attrs], dtype=np.int64),
                                np.array([a["local_index"] for a in attrs], dtype=np.int64))
        node, local = self._node_local
        return node[ranks], local[ranks]

    # ------------------------------------------------------------------------------------------ routes
    def route_arrays(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """(edge indices, fraction of the flow on each) for rank ``src`` -> ``dst``; cached."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._route_arrays(src, dst)
        return hit

    def _route_arrays(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """A route's links with their fractions: from its independent parts where the cluster gives them
        (each link carries its part's fraction: the product of the parts, ``paths``, would list the same
        loads thousands of times over on a fat tree), else from ``paths``."""
        eidx = self.edge_index
        parts = getattr(self.cluster, "route_segments", None)
        weighted = ([(float(f), [eidx[e] for e in edges]) for part in parts(src, dst) for f, edges in part]
                    if parts is not None else
                    [(float(f), [eidx[e] for e in edges]) for f, edges in self.cluster.paths(src, dst)])
        return _arrays(weighted)

    def route(self, src: int, dst: int) -> RouteInfo:
        idx, frac = self.route_arrays(src, dst)
        return RouteInfo(tuple(self.types[idx]), frac, self.latency[idx], self.capacity[idx], self.bw_GBps[idx])

    def fast_links(self, rank: int) -> FastLinks:
        graph = self.cluster.graph
        gpu = self.gpu(rank)
        out = [(gpu, v) for v in graph.successors(gpu) if graph.edges[gpu, v]["type"] in FAST_TYPES]
        lanes = sum(int(graph.edges[e].get("lanes") or 1) for e in out)
        up = float(sum(self.capacity[self.edge_index[e]] for e in out))
        down = float(sum(self.capacity[self.edge_index[(v, u)]] for u, v in out))
        sharp = bool(out) and all(graph.nodes[v].get("sharp") and graph.nodes[v]["kind"] == "nvswitch"
                                  for _u, v in out)
        return FastLinks(lanes=lanes, up_capacity=up, down_capacity=down, nvls_switches=sharp)

    # ------------------------------------------------------------------------------------------- loads
    def sec_per_byte(self, flows: Flows | ShiftedFlows) -> float:
        """max over links of (bytes on the link per byte of buffer) / capacity, all flows together (every copy
        of shifted flows listed)."""
        if isinstance(flows, ShiftedFlows):
            flows = flows.expand()
        keep = (flows.src != flows.dst) & (flows.weight > 0)
        if not keep.any():
            return 0.0
        n = self.num_gpus
        pair, inv = np.unique(flows.src[keep] * n + flows.dst[keep], return_inverse=True)
        weight = np.bincount(inv.ravel(), weights=flows.weight[keep], minlength=len(pair))
        rid = self._route_id
        keys = pair.tolist()
        new = [k for k in keys if k not in rid]
        with progress(len(new), f"routing on the graph of {getattr(self.cluster, 'name', 'the cluster')}",
                      "route", quick=len(new) < 2000) as bar:
            for i, k in enumerate(new):
                self._register(*divmod(k, n))
                if i % 256 == 255:
                    bar.update(256)
        ids = np.fromiter((rid[k] for k in keys), dtype=np.int64, count=len(keys))
        load = self._loads(ids, weight)
        return float(np.max(load / self.capacity))

    def _register(self, src: int, dst: int) -> int:
        idx, frac = self.route_arrays(src, dst)
        i = self._route_id[(src * self.num_gpus + dst)] = len(self._starts)
        self._starts.append(self._stored)
        self._lens.append(len(idx))
        self._stored += len(idx)
        self._pending.append((idx, frac))
        return i

    def _loads(self, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Bytes per link of routes ``ids`` weighted by ``weights`` (one bincount over the flat store)."""
        if self._pending:
            self._flat_idx = np.concatenate([self._flat_idx] + [p[0] for p in self._pending])
            self._flat_frac = np.concatenate([self._flat_frac] + [p[1] for p in self._pending])
            self._starts_arr = np.asarray(self._starts, dtype=np.int64)
            self._lens_arr = np.asarray(self._lens, dtype=np.int64)
            self._pending = []
        starts, lens = self._starts_arr[ids], self._lens_arr[ids]
        ends = np.cumsum(lens)
        pos = np.repeat(starts - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)
        return np.bincount(self._flat_idx[pos], weights=self._flat_frac[pos] * np.repeat(weights, lens),
                           minlength=len(self.capacity))

    def link_types(self) -> set[str]:
        return set(self.types.tolist())

    def out_edges(self, node: str, types: Sequence[str]) -> list[tuple[int, str]]:
        """(edge index, neighbour) of the directed links leaving ``node`` with a type in ``types``."""
        graph = self.cluster.graph
        return [(self.edge_index[(node, v)], v) for v in graph.successors(node)
                if graph.edges[node, v]["type"] in types]


def _arrays(weighted_paths: Iterable[tuple[float, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """(edge indices, fractions) of weighted paths; an edge may repeat (loads are summed later)."""
    idx: list[int] = []
    frac: list[float] = []
    for f, ids in weighted_paths:
        idx += ids
        frac += [f] * len(ids)
    return np.asarray(idx, dtype=np.int64), np.asarray(frac, dtype=float)
