"""The cluster graph as arrays for the collective model: link capacities, cached routes, link loads.

A *flow* is ``(src_rank, dst_rank, bytes_per_byte)``: a logical hop of an algorithm carrying that many bytes
per byte of the collective's buffer. Routing a flow with ``cluster.paths`` spreads it over the directed links
of its (weighted, multi-path) route. With the flows of every concurrent group loaded together, the time per
byte of the slowest group is ``max_link(load / capacity)``: a ring's bandwidth is the minimum over links of
capacity x efficiency / number of hops using the link (issue 3).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..units import GB, US

Flow = tuple[int, int, float]
NET_TYPES = frozenset({"ib", "ethernet"})
HOST_TYPES = frozenset({"loopback", "cpu"})


class Fabric:
    """Edge arrays of ``cluster.graph`` and routes between ranks, computed once per pair.

    ``calibration`` maps a link type to overrides ``{efficiency, latency_us, bw_GBps}``; ``bw_GBps`` there is
    the bandwidth of the whole link (all lanes) per direction.
    """

    def __init__(self, cluster: Any, calibration: Mapping[str, Mapping[str, float]] | None = None,
                 lane_limit_GBps: Mapping[str, float] | None = None,
                 efficiency_limit: Mapping[str, float] | None = None):
        """``lane_limit_GBps`` / ``efficiency_limit`` (by link type) cap a link at what NCCL reaches on it
        (``nccl_model.yaml``); link types named in ``calibration`` are taken as calibrated, uncapped."""
        self.cluster = cluster
        graph = cluster.graph
        self.edge_index: dict[tuple[str, str], int] = {}
        caps, lats, types = [], [], []
        calibration = calibration or {}
        for i, (u, v, attrs) in enumerate(graph.edges(data=True)):
            self.edge_index[(u, v)] = i
            kind = attrs["type"]
            over = calibration.get(kind, {})
            bw = float(over.get("bw_GBps", attrs["bw_GBps"]))
            eff = float(over.get("efficiency", attrs.get("efficiency", 1.0)))
            cap = bw * eff
            if kind not in calibration:
                if lane_limit_GBps and kind in lane_limit_GBps:
                    cap = min(cap, lane_limit_GBps[kind] * float(attrs.get("lanes", 1) or 1))
                if efficiency_limit and kind in efficiency_limit:
                    cap = min(cap, bw * efficiency_limit[kind])
            caps.append(cap * GB)
            lats.append(float(over.get("latency_us", attrs.get("latency_us", 0.0))) * US)
            types.append(attrs["type"])
        self.capacity = np.asarray(caps, dtype=float)
        """bytes/s per directed link (bandwidth x efficiency)."""
        self.latency = np.asarray(lats, dtype=float)
        """seconds per traversal of each directed link."""
        self.types = np.asarray(types, dtype=object)
        if not len(self.capacity) or not np.all(self.capacity > 0):
            raise InputError(f"cluster {getattr(cluster, 'name', '?')}: every link needs bw_GBps > 0 "
                             "and efficiency > 0 for the collective model")
        self._routes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._route_latency: dict[tuple[int, int], float] = {}
        self._segment_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
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

    # ------------------------------------------------------------------------------------------- ranks
    def gpu(self, rank: int) -> str:
        return self.cluster.gpu_id(rank)

    def node_of(self, rank: int) -> int:
        return int(self.cluster.graph.nodes[self.gpu(rank)]["node_index"])

    def local_of(self, rank: int) -> int:
        return int(self.cluster.graph.nodes[self.gpu(rank)]["local_index"])

    # ------------------------------------------------------------------------------------------ routes
    def route(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """(edge indices, fraction of the flow on each) for rank ``src`` -> ``dst``; cached."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._compute_route(src, dst)
        return hit

    def _compute_route(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        parts = self._segment_parts(src, dst)
        if parts is None:
            eidx = self.edge_index
            parts = [self._arrays(((float(f), [eidx[e] for e in edges]) for f, edges in self.cluster.paths(src, dst)))]
        idx = np.concatenate([p[0] for p in parts])
        frac = np.concatenate([p[1] for p in parts])
        # mean path latency = sum over links of (fraction of the flow on the link) x link latency
        self._route_latency[(src, dst)] = float(np.dot(self.latency[idx], frac)) if len(idx) else 0.0
        return idx, frac

    @staticmethod
    def _arrays(weighted_paths: Iterable[tuple[float, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
        """(edge indices, fractions) of weighted paths; an edge may repeat (loads are summed later)."""
        idx: list[int] = []
        frac: list[float] = []
        for f, ids in weighted_paths:
            idx += ids
            frac += [f] * len(ids)
        return np.asarray(idx, dtype=np.int64), np.asarray(frac, dtype=float)

    def _segment_parts(self, src: int, dst: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Link fractions of an inter-node route on a fat tree, from the route's independent segments
        (GPU -> NIC, NIC -> NIC through the switches, NIC -> GPU) instead of the product of their paths;
        each segment cached. Mirrors :meth:`tpsim.topology.Cluster.paths` (a test checks both agree);
        None where that structure is absent (then ``paths`` is used)."""
        c = self.cluster
        fabric = getattr(c, "fabric", None)
        if type(fabric).__name__ != "FatTree" or not hasattr(c, "_proxy"):
            return None
        (na, ia), (nb, ib) = divmod(src, c.gpus_per_node), divmod(dst, c.gpus_per_node)
        if na == nb:
            return None
        layout = c.layout
        nic_b = layout.nic_of(ib)
        proxy = c._proxy(ia, nic_b)
        rail_a = layout.devices[layout.nic_of(proxy)]["local_index"]
        rail_b = layout.devices[nic_b]["local_index"]
        parts = [self._intra("to_nic", na, proxy, -1), self._intra("from_nic", nb, ib, -1),
                 self._switch_part(na, rail_a, nb, rail_b)]
        if proxy != ia:
            parts.append(self._intra("gpu", na, ia, proxy))
        return parts

    def _intra(self, kind: str, node: int, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        key = (kind, node, i, j)
        hit = self._segment_cache.get(key)
        if hit is None:
            layout = self.cluster.layout
            route = (layout.gpu_route(i, j) if kind == "gpu" else layout.to_nic(i) if kind == "to_nic"
                     else layout.from_nic(i))
            p = f"n{node}/"
            hit = self._segment_cache[key] = self._arrays(
                (float(f), [self.edge_index[(p + u, p + v)] for u, v in path]) for f, path in route)
        return hit

    def _switch_part(self, na: int, ra: int, nb: int, rb: int) -> tuple[np.ndarray, np.ndarray]:
        fabric = self.cluster.fabric
        la, lb = fabric.leaf_of(na, ra), fabric.leaf_of(nb, rb)
        middle = self._segment_cache.get(("switch", la, lb))
        if middle is None:
            route = fabric.route(na, ra, nb, rb)
            middle = self._segment_cache[("switch", la, lb)] = self._arrays(
                (float(f), [self.edge_index[e] for e in path[1:-1]]) for f, path in route)
        ends = [self.edge_index[(fabric.nic_id(na, ra), f"leaf{la}")],
                self.edge_index[(f"leaf{lb}", fabric.nic_id(nb, rb))]]
        return np.concatenate([middle[0], ends]), np.concatenate([middle[1], [1.0, 1.0]])

    def route_types(self, src: int, dst: int) -> set[str]:
        return set(self.types[self.route(src, dst)[0]])

    def route_latency(self, src: int, dst: int) -> float:
        """Seconds along the route from ``src`` to ``dst`` (mean over its paths, by fraction)."""
        self.route(src, dst)
        return self._route_latency[(src, dst)]

    # ------------------------------------------------------------------------------------------- loads
    def sec_per_byte(self, flows: Iterable[Flow], scale: np.ndarray | None = None) -> float:
        """max over links of (bytes on the link per byte of buffer) / capacity, all flows together.

        ``scale`` multiplies each link's capacity (NVLS efficiency on switch links, for example)."""
        merged: dict[tuple[int, int], float] = {}
        for src, dst, nbytes in flows:
            if src != dst and nbytes > 0:
                merged[(src, dst)] = merged.get((src, dst), 0.0) + nbytes
        if not merged:
            return 0.0
        rid = self._route_id
        ids = np.fromiter((rid[k] if k in rid else self._register(*k) for k in merged), dtype=np.int64,
                          count=len(merged))
        load = self._loads(ids, np.fromiter(merged.values(), dtype=float, count=len(merged)))
        cap = self.capacity if scale is None else self.capacity * scale
        return float(np.max(load / cap))

    def _register(self, src: int, dst: int) -> int:
        idx, frac = self.route(src, dst)
        i = self._route_id[(src, dst)] = len(self._starts)
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

    def link_sec_per_byte(self, loads: Mapping[int, float], scale: float = 1.0) -> float:
        """Like :meth:`sec_per_byte` for loads given per edge index."""
        return max((w / (self.capacity[i] * scale) for i, w in loads.items()), default=0.0)

    def out_edges(self, node: str, types: Sequence[str]) -> list[tuple[int, str]]:
        """(edge index, neighbour) of the directed links leaving ``node`` with a type in ``types``."""
        graph = self.cluster.graph
        return [(self.edge_index[(node, v)], v) for v in graph.successors(node)
                if graph.edges[node, v]["type"] in types]
