"""The collective cost model on the topology graph.

``get_collective_model(cluster).curve(op, groups)`` returns the :class:`CostCurve` of the slowest of the
concurrent ``groups`` (every group of one plan axis), with the links loaded by all of them. Each candidate
(ring with channels, double binary tree, NVLS, hierarchical, direct all-to-all, point-to-point; NCCL protocols
LL / LL128 / Simple; gloo's own set on CPU ranks) is one term of the curve; the fastest is NCCL's choice.
The graph is walked once per (op, layout): later calls are a dict lookup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..units import GB
from .algorithms import (NVLS_TRAFFIC, GroupShape, Line, combine, direct_lines, gloo_lines,
                         nvls_line, p2p_lines, ring_lines, tree_lines)
from .constants import NcclConstants, nccl_constants
from .curve import OPS, CostCurve, tangent_lines
from .fabric import Fabric, Flow

Groups = tuple[tuple[int, ...], ...]
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
"""nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor."""


@dataclass(frozen=True, kw_only=True)
class CollectiveResult:
    op: str
    nbytes: int
    nranks: int
    time_s: float
    algbw_GBps: float
    """bytes / time in 1e9 B/s (nccl-tests algbw)."""
    busbw_GBps: float
    """algbw x the op's bus factor (nccl-tests busbw)."""
    algorithm: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "bytes": self.nbytes, "nranks": self.nranks, "time_s": self.time_s,
                "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps, "algorithm": self.algorithm}


class CollectiveModel:
    """Cost of collectives on one cluster. ``calibration``: ``{link_type: {efficiency, latency_us, bw_GBps}}``
    or the path of a calibration YAML written by ``tpsim calibrate``."""

    def __init__(self, cluster: Any, calibration: Mapping[str, Mapping[str, float]] | str | os.PathLike | None = None,
                 nccl: NcclConstants | None = None):
        if calibration is not None and not isinstance(calibration, Mapping):
            from .calibration import load_calibration
            calibration = load_calibration(calibration)
        self.cluster = cluster
        self.k = nccl or nccl_constants()
        self.device = cluster.device.name
        arch = self.k.arch_of(self.device)
        included = getattr(getattr(cluster, "spec", None), "calibration", None)  # the topology's calibration: key
        calibration = dict(calibration or {})
        # link types calibrated in the topology file are already in the graph: mark them calibrated (no NCCL cap)
        links = {**{t: {} for t in getattr(included, "per_type", {}) or {}},
                 **{t: v for t, v in calibration.items() if t != "gloo_ops"}}
        self.gloo_ops: Mapping[str, Mapping[str, float]] = dict(
            calibration.get("gloo_ops") or (getattr(included, "provenance", {}) or {}).get("gloo_ops") or {})
        """per-op link values for CPU ranks (``tpsim calibrate``)."""
        self.fabric = Fabric(cluster, links, lane_limit_GBps={"nvlink": self.k.nvlink_lane_GBps[arch]},
                             efficiency_limit=self.k.link_efficiency)
        self._curves: dict[tuple, CostCurve] = {}
        self._memo: dict[tuple, Any] = {}
        """link-load results per (kind, layout): all_gather and reduce_scatter reuse the ring of all_reduce."""

    # --------------------------------------------------------------------------------------- public
    def curve(self, op: str, groups: Sequence[Sequence[int]], algorithms: Sequence[str] | None = None) -> CostCurve:
        """Cost curve of ``op`` on every group of ``groups`` at once (the slowest group's).
        ``algorithms`` keeps only candidates whose name starts with one of them (like ``NCCL_ALGO``)."""
        if not isinstance(groups, tuple):  # lists are not hashable: normalise first
            groups = self._check(op, groups)
        key = (op, groups, tuple(algorithms) if algorithms else None)
        try:
            hit = self._curves.get(key)
        except TypeError:
            groups = self._check(op, groups)
            key = (op, groups, key[2])
            hit = self._curves.get(key)
        if hit is None:
            groups = self._check(op, groups)
            hit = self._curves[key] = self._build(op, groups, algorithms)
        return hit

    def axis_curve(self, op: str, layout: Any, axes: str | tuple[str, ...]) -> CostCurve:
        """Cost curve of ``op`` run by every group of ``layout.groups(axes)`` at once (the slowest group's,
        all of them loading the links): the estimator's one entry point (docs/SCHEMAS.md, section 3)."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        if layout.size(*axes) == 1:
            return CostCurve.zero()
        groups = tuple(tuple(int(r) for r in g) for g in layout.groups(axes))
        return self.curve(op, groups)

    def run(self, op: str, nbytes: float, groups: Sequence[Sequence[int]],
            algorithms: Sequence[str] | None = None) -> CollectiveResult:
        """Time, algbw, busbw and chosen algorithm of one collective of ``nbytes`` (nccl-tests convention)."""
        if not nbytes > 0:
            raise InputError(f"bytes={nbytes!r} must be a positive size")
        groups = self._check(op, groups)
        n = len(groups[0])
        t, name = self.curve(op, groups, algorithms).best(nbytes)
        algbw = nbytes / t / GB if t > 0 else float("inf")
        return CollectiveResult(op=op, nbytes=int(nbytes), nranks=n, time_s=t, algbw_GBps=algbw,
                                busbw_GBps=algbw * BUSBW_FACTOR[op](n), algorithm=name)

    def candidates(self, op: str, groups: Sequence[Sequence[int]]) -> list[Line]:
        """Every candidate line (uncached; for tests and ``--sweep`` explanations)."""
        return self._lines(op, self._check(op, groups))

    # ------------------------------------------------------------------------------------- checking
    def _check(self, op: str, groups: Sequence[Sequence[int]]) -> Groups:
        if op not in OPS:
            raise InputError(f"op={op!r} is not a collective (known: {', '.join(OPS)})")
        groups = tuple(tuple(int(r) for r in g) for g in groups)
        if not groups or not groups[0]:
            raise InputError("groups must hold at least one group of ranks")
        n = len(groups[0])
        if any(len(g) != n for g in groups):
            raise InputError(f"groups have different sizes {sorted({len(g) for g in groups})}; "
                             "every group of one axis must have the same size")
        total = self.cluster.num_gpus
        for g in groups:
            bad = [r for r in g if not 0 <= r < total]
            if bad:
                raise InputError(f"rank {bad[0]} is outside the cluster's {total} GPUs (ranks 0-{total - 1})")
            if len(set(g)) != n:
                raise InputError(f"group {list(g)} lists a rank twice")
        return groups

    # -------------------------------------------------------------------------------------- building
    def _build(self, op: str, groups: Groups, algorithms: Sequence[str] | None) -> CostCurve:
        if len(groups[0]) == 1:
            return CostCurve.zero()
        lines = self._lines(op, groups)
        if algorithms:
            lines = [ln for ln in lines if ln.name.startswith(tuple(algorithms))]
            if not lines:
                raise InputError(f"algorithms={list(algorithms)} match no candidate of {op} here")
        lat, spb, names = [], [], []
        for ln in lines:
            for a, b in tangent_lines(ln.latency_s, ln.sec_per_byte, ln.sqrt_coef):
                lat.append(a)
                spb.append(b)
                names.append(ln.name)
        return CostCurve(tuple(lat), tuple(spb), tuple(names))

    def _lines(self, op: str, groups: Groups) -> list[Line]:
        n = len(groups[0])
        if n == 1:
            return [Line("none", 0.0, 0.0)]
        per_node = [self._per_node(g) for g in groups]
        types = self.fabric.route_types(groups[0][0], groups[0][1])
        if "loopback" in types:
            return self._gloo_lines(op, groups, per_node)
        shape = self._shape(groups, per_node, types)
        if op == "all_to_all":
            flows = [(a, b, 1.0 / n) for g in groups for a in g for b in g if a != b]
            return direct_lines(shape, self.fabric.sec_per_byte(flows), self.k, self._hw(shape))
        if op == "send_recv":
            flows = [(g[i], g[i + 1], 1.0) for g in groups for i in range(n - 1)]
            return p2p_lines(self.fabric.sec_per_byte(flows), self.k, self._hw(shape))
        lines = ring_lines(op, shape, self._ring_bw(groups, per_node, chain=op == "broadcast"), self.k)
        if op == "all_reduce":
            lines += tree_lines(shape, self.fabric.sec_per_byte(self._tree_flows(per_node)), self.k)
            # the tree's flows are only needed once per layout; all_reduce curves are cached already
        if op in NVLS_TRAFFIC and self._nvls_capable(groups):
            lines.append(nvls_line(op, shape, self._nvls_sec_per_byte(op, groups), self.k))
        if op == "all_reduce" and shape.nodes > 1 and self._uniform(per_node) > 1:
            lines += self._hierarchical(groups, per_node, shape)
        if op in TORUS_FACTOR:
            lines += self._torus_lines(op, groups)
        return lines

    def _hw(self, shape: GroupShape) -> str:
        return "NET" if shape.nodes > 1 else shape.hw

    def _shape(self, groups: Groups, per_node: list[list[list[int]]], types: set[str]) -> GroupShape:
        """NCCL's view of a group: intra-node hardware class (NVLINK when the GPU has NVLink/ICI links, else
        PCI) and channels (one per NVLink lane up to ``max_channels``; ``pcie_channels`` on PCIe)."""
        nodes = max(len(p) for p in per_node)
        fast = self._fast_out(groups[0][0])
        if fast:
            lanes = sum(int(self.cluster.graph.edges[e].get("lanes") or 1) for e in fast)
            hw, channels = "NVLINK", max(1, min(self.k.max_channels, lanes))
        else:
            hw, channels = "PCI", self.k.pcie_channels
        return GroupShape(n=len(groups[0]), nodes=nodes, hw=hw, channels=channels,
                          caps=self.k.caps(self.device))

    def _fast_out(self, rank: int) -> list[tuple[str, str]]:
        gpu = self.fabric.gpu(rank)
        graph = self.cluster.graph
        return [(gpu, v) for v in graph.successors(gpu) if graph.edges[gpu, v]["type"] in ("nvlink", "ici")]

    def _per_node(self, group: Sequence[int]) -> list[list[int]]:
        """The group's ranks by node (nodes in order of first appearance), each sorted by local index."""
        key = ("per_node", tuple(group))
        if key not in self._memo:
            self._memo[key] = self._per_node_uncached(group)
        return self._memo[key]

    def _per_node_uncached(self, group: Sequence[int]) -> list[list[int]]:
        by_node: dict[int, list[int]] = {}
        for r in group:
            by_node.setdefault(self.fabric.node_of(r), []).append(r)
        return [sorted(m, key=self.fabric.local_of) for m in by_node.values()]

    @staticmethod
    def _uniform(per_node: list[list[list[int]]]) -> int:
        """Ranks per node if every node of every group holds the same number, else 0."""
        sizes = {len(m) for p in per_node for m in p}
        return sizes.pop() if len(sizes) == 1 else 0

    # ------------------------------------------------------------------------------------ rings/trees
    def _ring_bw(self, groups: Groups, per_node: list[list[list[int]]], chain: bool = False) -> float:
        """Bytes/s of one ring hop with every group's rings loading the links (hop traffic = 1 per ring)."""
        key = ("ring", groups, chain)
        if key not in self._memo:
            self._memo[key] = self._ring_bw_uncached(per_node, chain)
        return self._memo[key]

    def _ring_bw_uncached(self, per_node: list[list[list[int]]], chain: bool) -> float:
        flows: list[Flow] = []
        for p in per_node:
            rings = ring_orders(p)
            for ring in rings:
                hops = len(ring) - 1 if chain else len(ring)
                flows += [(ring[i], ring[(i + 1) % len(ring)], 1.0 / len(rings)) for i in range(hops)]
        spb = self.fabric.sec_per_byte(flows)
        return 1.0 / spb if spb > 0 else float("inf")

    def _tree_flows(self, per_node: list[list[list[int]]]) -> list[Flow]:
        """Double binary tree (NCCL): a chain inside each node, binary trees over the nodes, the second tree
        mirrored; each tree carries half the buffer up (reduce) and down (broadcast). Across nodes there is
        one tree pair per local position c (chains rotated to start at the c-th GPU, so the trees use every
        NIC, as NCCL's channels do), each with 1/ppn of the data."""
        flows: list[Flow] = []
        for p in per_node:
            ppn = min(len(m) for m in p) if len(p) > 1 else 1
            share = 0.5 / ppn
            for c in range(ppn):
                for t in (0, 1):
                    chains = [m[c:] + m[:c] for m in p]
                    chains = chains if t == 0 else [ch[:1] + ch[1:][::-1] for ch in chains]
                    order = list(range(len(chains)))
                    order = order if t == 0 else order[::-1]
                    for chain in chains:
                        for a, b in zip(chain, chain[1:]):
                            flows += [(a, b, share), (b, a, share)]
                    for i in range(1, len(order)):
                        child, parent = chains[order[i]][0], chains[order[(i - 1) // 2]][0]
                        flows += [(child, parent, share), (parent, child, share)]
        return flows

    def _hierarchical(self, groups: Groups, per_node: list[list[list[int]]], shape: GroupShape) -> list[Line]:
        """Intra-node reduce-scatter, inter-node all-reduce of 1/ppn of the buffer per rail, intra-node
        all-gather (Thakur et al. 2005 hierarchical form; NCCL's NVLS-tree when the intra part is NVLS)."""
        ppn = len(per_node[0][0])
        intra = tuple(tuple(m) for p in per_node for m in p)
        inter = tuple(tuple(m[k] for m in p) for p in per_node for k in range(ppn))
        intra_pn = [[list(m)] for m in intra]
        inter_pn = [self._per_node(g) for g in inter]
        k = self.k
        s_intra = GroupShape(n=ppn, nodes=1, hw=shape.hw, channels=shape.channels, caps=shape.caps)
        s_inter = GroupShape(n=len(inter[0]), nodes=len(inter[0]), hw=shape.hw, channels=shape.channels,
                             caps=shape.caps)
        rs = ring_lines("reduce_scatter", s_intra, self._ring_bw(intra, intra_pn), k)
        ag = ring_lines("all_gather", s_intra, self._ring_bw(intra, intra_pn), k)
        ar = ring_lines("all_reduce", s_inter, self._ring_bw(inter, inter_pn), k)
        lines = [combine(f"hierarchical/{a.name.split('/')[1].split()[0]}", [(a, 1.0), (b, 1.0 / ppn), (c, 1.0)])
                 for a, b, c in zip(rs, ar, ag) if a.name.split()[0] == b.name.split()[0] == c.name.split()[0]]
        if self._nvls_capable(intra):
            nrs = nvls_line("reduce_scatter", s_intra, self._nvls_sec_per_byte("reduce_scatter", intra), k)
            nag = nvls_line("all_gather", s_intra, self._nvls_sec_per_byte("all_gather", intra), k)
            lines.append(combine("hierarchical-nvls/Simple", [(nrs, 1.0), (ar[-1], 1.0 / ppn), (nag, 1.0)]))
        return lines

    # ------------------------------------------------------------------------------------------- NVLS
    def _nvls_capable(self, groups: Groups) -> bool:
        """NVLS needs an architecture with NVLS, every GPU wired only to in-switch-reduction NVSwitches and
        the group inside one NVLink domain (routes of NVLink only)."""
        if self.k.caps(self.device).nvls_efficiency <= 0:
            return False
        graph = self.cluster.graph
        for g in groups:
            for r in g:
                outs = self._fast_out(r)
                if not outs or not all(graph.nodes[v].get("sharp") and graph.nodes[v]["kind"] == "nvswitch"
                                       for _u, v in outs):
                    return False
            if any(self.fabric.route_types(g[0], r) - {"nvlink"} for r in g[1:]):
                return False
        return True

    def _nvls_sec_per_byte(self, op: str, groups: Groups) -> float:
        """Load of the GPU<->switch links: per GPU ``NVLS_TRAFFIC`` bytes in/out, spread over its NVLinks
        by bandwidth; capacity scaled by the architecture's NVLS efficiency (NCCL nvls.cc)."""
        into, out_of = NVLS_TRAFFIC[op](len(groups[0]))
        fab = self.fabric
        load = np.zeros(len(fab.capacity))
        for g in groups:
            for r in g:
                ups = [fab.edge_index[e] for e in self._fast_out(r)]
                downs = [fab.edge_index[(v, u)] for u, v in self._fast_out(r)]
                for idx, nbytes in ((ups, into), (downs, out_of)):
                    share = fab.capacity[idx] / fab.capacity[idx].sum()
                    np.add.at(load, idx, share * nbytes)
        eff = self.k.caps(self.device).nvls_efficiency
        used = load > 0
        return float(np.max(load[used] / (fab.capacity[used] * eff)))

    # ------------------------------------------------------------------------------------------ torus
    def _torus_lines(self, op: str, groups: Groups) -> list[Line]:
        """Multi-dimensional bidirectional ring on a torus (XLA on TPU ICI; JAX scaling book): for a group
        that is a full sub-grid (every dimension it spans taken whole, so rings close over the wrap-around),
        the buffer is split in one stream per dimension, each reducing dimension by dimension in a rotated
        order (data shrinks by the dimension's size after each phase), every ring run both ways with half the
        data. Link loads of all streams and phases together give the bandwidth term; latency = sum over the
        dimensions of steps x neighbour latency."""
        lines_per_group = [self._torus_lines_of(g) for g in groups]
        if not lines_per_group or any(x is None for x in lines_per_group):
            return []
        sizes = lines_per_group[0][0]
        if any(x[0] != sizes for x in lines_per_group):
            return []
        factor = TORUS_FACTOR[op]
        flows: list[Flow] = []
        for order in _rotations(len(sizes)):
            shrink = 1.0
            for d in order:
                n = sizes[d]
                w = factor * (n - 1) / n * shrink / len(sizes) / 2
                for _, lines in lines_per_group:
                    for line in lines[d]:
                        for i in range(n):
                            a, b = line[i], line[(i + 1) % n]
                            flows += [(a, b, w), (b, a, w)]
                shrink /= n
        first = lines_per_group[0][1][0][0]
        alpha = self.fabric.route_latency(first[0], first[1])
        steps = factor * sum(n - 1 for n in sizes)
        return [Line(f"torus-ring/{len(sizes)}d", steps * alpha, self.fabric.sec_per_byte(flows))]

    def _torus_lines_of(self, group: tuple[int, ...]):
        """(sizes of the spanned dimensions, per dimension the lines of ranks along it) or None."""
        torus = getattr(self.cluster, "fabric", None)
        if not (hasattr(torus, "coord") and hasattr(torus, "dims")):
            return None
        coords = {torus.coord(r): r for r in group}
        spans = [sorted({c[d] for c in coords}) for d in range(len(torus.dims))]
        dims = [d for d, v in enumerate(spans) if len(v) > 1]
        if not dims or any(spans[d] != list(range(torus.dims[d])) for d in dims):
            return None
        if len(coords) != int(np.prod([len(v) for v in spans])) or torus.dims[dims[0]] < 3:
            return None
        lines = []
        for d in dims:
            along: dict[tuple, list[int]] = {}
            for c in sorted(coords, key=lambda c: c[d]):
                along.setdefault(c[:d] + c[d + 1:], []).append(coords[c])
            lines.append(list(along.values()))
        return tuple(torus.dims[d] for d in dims), lines

    # ------------------------------------------------------------------------------------------- gloo
    def _gloo_lines(self, op: str, groups: Groups, per_node: list[list[list[int]]]) -> list[Line]:
        """Gloo on CPU ranks: alpha = latency of the slowest neighbour route, beta from the ring's link loads.
        A calibration's ``gloo_ops`` entry for ``op`` replaces the host link's efficiency and latency."""
        n = len(groups[0])
        rings = [ring for p in per_node for ring in ring_orders(p)[:1]]
        alpha = max(self.fabric.route_latency(r[i], r[(i + 1) % n]) for r in rings for i in range(n))
        if op == "all_to_all":
            flows = [(a, b, 1.0 / (n - 1)) for g in groups for a in g for b in g if a != b]
            spb = self.fabric.sec_per_byte(flows)
        elif op == "send_recv":
            spb = self.fabric.sec_per_byte([(g[i], g[i + 1], 1.0) for g in groups for i in range(n - 1)])
        else:
            spb = 1.0 / self._ring_bw(groups, [[sum(p, [])] for p in per_node])
        over = self.gloo_ops.get(op)
        if over:
            alpha, spb = self._gloo_override(groups, rings, over)
        return gloo_lines(op, n, alpha, spb)

    def _gloo_override(self, groups: Groups, rings, over: Mapping[str, float]) -> tuple[float, float]:
        """alpha and beta of the loopback links with one op's calibrated values."""
        fab = self.fabric
        host = fab.types == "loopback"
        lat = fab.latency.copy()
        cap = fab.capacity.copy()
        if "latency_us" in over:
            lat[host] = over["latency_us"] * 1e-6
        if "efficiency" in over or "bw_GBps" in over:
            bw = over.get("bw_GBps")
            for i in np.flatnonzero(host):
                u, v = list(fab.edge_index)[i]
                base = bw if bw is not None else self.cluster.graph.edges[u, v]["bw_GBps"]
                cap[i] = base * over.get("efficiency", 1.0) * GB
        hops = [(r[i], r[(i + 1) % len(r)]) for r in rings for i in range(len(r))]
        alpha = max(float(np.dot(lat[fab.route(a, b)[0]], fab.route(a, b)[1])) for a, b in hops)
        spb = max(float(np.max(fab.route(a, b)[1] / cap[fab.route(a, b)[0]])) for a, b in hops)
        return alpha, spb


TORUS_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
"""ring passes per dimension: reduce-scatter then all-gather for all_reduce."""


def _rotations(k: int) -> list[list[int]]:
    return [[(i + j) % k for j in range(k)] for i in range(k)]


def ring_orders(per_node: list[list[int]]) -> list[list[int]]:
    """NCCL-like rings of one group: one ring inside a node; across nodes one ring per local position c,
    entering node j at its c-th GPU and leaving on the same rail (odd nodes walk backwards) so every
    node-to-node hop stays on one rail."""
    if len(per_node) == 1:
        return [list(per_node[0])]
    ppn = min(len(m) for m in per_node)
    rings = []
    for c in range(ppn):
        ring: list[int] = []
        for j, m in enumerate(per_node):
            rot = m[c:] + m[:c]
            ring += rot if j % 2 == 0 else rot[::-1]
        rings.append(ring)
    return rings


def nccl_tests_time(curve: CostCurve, nbytes: np.ndarray | float, gpus_per_process: int,
                    launch_us: float | None = None) -> np.ndarray:
    """Time nccl-tests reports when one process drives ``gpus_per_process`` GPUs (``-g N``): the host
    launches one kernel per GPU each iteration, so an operation takes at least N launches
    (``nccl_tests_launch_us`` of nccl_model.yaml)."""
    launch = (nccl_constants().launch_us if launch_us is None else launch_us) * 1e-6
    return np.maximum(curve.time(nbytes), gpus_per_process * launch)


_MODELS: dict[str, CollectiveModel] = {}


def get_collective_model(cluster: Any) -> CollectiveModel:
    """The model of ``cluster``, cached per ``cluster.fingerprint()`` (and NCCL constants version)."""
    key = f"{cluster.fingerprint()}|{nccl_constants().version}"
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = CollectiveModel(cluster)
    return model
