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
        weights: dict[int, float] = {}
        latency, total = 0.0, 0.0
        for fraction, edges in self.cluster.paths(src, dst):
            path = [self.edge_index[tuple(edge)] for edge in edges]
            for i in path:
                weights[i] = weights.get(i, 0.0) + float(fraction)
            latency += float(fraction) * float(sum(self.latency[i] for i in path))
            total += float(fraction)
        self._route_latency[(src, dst)] = latency / total if total > 0 else 0.0
        idx = np.fromiter(weights.keys(), dtype=np.int64, count=len(weights))
        frac = np.fromiter(weights.values(), dtype=float, count=len(weights))
        return idx, frac

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
        idx_parts, w_parts = [], []
        for src, dst, nbytes in flows:
            if src == dst or nbytes <= 0:
                continue
            idx, frac = self.route(src, dst)
            idx_parts.append(idx)
            w_parts.append(frac * nbytes)
        if not idx_parts:
            return 0.0
        load = np.bincount(np.concatenate(idx_parts), weights=np.concatenate(w_parts),
                           minlength=len(self.capacity))
        cap = self.capacity if scale is None else self.capacity * scale
        return float(np.max(load / cap))

    def link_sec_per_byte(self, loads: Mapping[int, float], scale: float = 1.0) -> float:
        """Like :meth:`sec_per_byte` for loads given per edge index."""
        return max((w / (self.capacity[i] * scale) for i, w in loads.items()), default=0.0)

    def out_edges(self, node: str, types: Sequence[str]) -> list[tuple[int, str]]:
        """(edge index, neighbour) of the directed links leaving ``node`` with a type in ``types``."""
        graph = self.cluster.graph
        return [(self.edge_index[(node, v)], v) for v in graph.successors(node)
                if graph.edges[node, v]["type"] in types]
