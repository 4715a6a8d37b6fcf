"""The collective cost model of a cluster.

``get_collective_model(cluster).axis_curve(op, layout, axes)`` returns the :class:`CostCurve` of ``op`` run
by every group of one plan axis at once (the slowest group's, with the links loaded by all of them);
``curve(op, groups)`` does the same for explicit groups. Each candidate (ring with channels, double binary
tree, NVLS, hierarchical, direct all-to-all, point-to-point, torus rings; NCCL protocols LL / LL128 / Simple;
gloo's own set on CPU ranks) is one term of the curve; the fastest is NCCL's choice.

The algorithms say who sends what to whom (:mod:`tpsim.collectives.flows`); a *router* turns those flows into
link loads: the structural one (:mod:`tpsim.collectives.structure`) for regular clusters of any size, the
full-graph one (:mod:`tpsim.collectives.fabric`) for hand-built or irregular topologies and as the reference
(``CollectiveModel(cluster, reference=True)``). Both give the same loads. A curve is built once per (op,
groups) and remembered; a layout seen before is a dict lookup.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..units import GB
from .algorithms import (NVLS_TRAFFIC, GroupShape, Line, combine, direct_lines, gloo_lines, nvls_line,
                         p2p_lines, ring_lines, tree_lines)
from .constants import NcclConstants, nccl_constants
from .curve import OPS, CostCurve, tangent_columns
from .flows import (Flows, Segments, all_to_all_flows, chain_flows, hierarchical_groups, ring_flows,
                    ring_orders, split_by_node, tree_flows)
from .groups import GroupSet, ShiftedFlows
from .links import LinkRules
from .structure import StructuralRouter

if TYPE_CHECKING:  # the full-graph router is imported where a model uses it (irregular clusters, reference)
    from .fabric import GraphRouter

__all__ = ["CollectiveModel", "CollectiveResult", "get_collective_model", "nccl_tests_time", "ring_orders"]

Groups = tuple[tuple[int, ...], ...]
_LAYOUT_CACHE = 16
TORUS_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
"""ring passes per dimension: reduce-scatter then all-gather for all_reduce."""


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


def is_structural(cluster: Any) -> bool:
    """A regular cluster (node template + fabric from parameters) that the structural router understands."""
    from ..topology.cluster import Cluster
    return isinstance(cluster, Cluster)


class CollectiveModel:
    """Cost of collectives on one cluster. ``calibration``: ``{link_type: {efficiency, latency_us, bw_GBps}}``
    or the path of a calibration YAML written by ``tpsim calibrate``. ``reference=True`` routes on the full
    networkx graph (the reference the structural model is tested against; slow on big clusters)."""

    def __init__(self, cluster: Any, calibration: Mapping[str, Mapping[str, float]] | str | os.PathLike | None = None,
                 nccl: NcclConstants | None = None, reference: bool = False):
        if calibration is not None and not isinstance(calibration, Mapping):
            from ..calibration import load_calibration
            calibration = load_calibration(calibration).link_overrides()
        self.cluster = cluster
        self.k = nccl or nccl_constants()
        self.device = cluster.device.name
        arch = self.k.arch_of(self.device)
        included = getattr(getattr(cluster, "spec", None), "calibration", None)  # the topology's calibration: key
        calibration = dict(calibration or {})
        # link types calibrated in the topology file are already in the link attributes: mark them calibrated
        links = {**{t: {} for t in getattr(included, "per_type", {}) or {}},
                 **{t: v for t, v in calibration.items() if t != "gloo_ops"}}
        self.gloo_ops: Mapping[str, Mapping[str, float]] = dict(
            calibration.get("gloo_ops") or (getattr(included, "provenance", {}) or {}).get("gloo_ops") or {})
        """per-op link values for CPU ranks (``tpsim calibrate``)."""
        rules = LinkRules(calibrated=links, lane_limit_GBps={"nvlink": self.k.nvlink_lane_GBps[arch]},
                          efficiency_limit=self.k.link_efficiency)
        self.structural = not reference and is_structural(cluster)
        if self.structural:
            self.router: StructuralRouter | GraphRouter = StructuralRouter(cluster, rules)
        else:
            from .fabric import GraphRouter

            self.router = GraphRouter(cluster, rules)
        self._curves: dict[tuple, CostCurve] = {}
        self._layouts: dict[tuple, tuple[np.ndarray, tuple]] = {}
        self._memo: dict[tuple, Any] = {}
        """per groups digest: segments, ring bandwidths (all_gather and reduce_scatter reuse all_reduce's)."""

    @property
    def fabric(self) -> StructuralRouter | GraphRouter:
        """The router (name kept from the first wave)."""
        return self.router

    # --------------------------------------------------------------------------------------- public
    def curve(self, op: str, groups: Sequence[Sequence[int]] | np.ndarray,
              algorithms: Sequence[str] | None = None) -> CostCurve:
        """Cost curve of ``op`` on every group of ``groups`` at once (the slowest group's).
        ``algorithms`` keeps only candidates whose name starts with one of them (like ``NCCL_ALGO``)."""
        algos = tuple(algorithms) if algorithms else None
        fast = ("tuple", op, groups, algos) if isinstance(groups, tuple) else None
        if fast is not None:   # a tuple of tuples is its own key: a seen one skips the checks
            try:
                hit = self._curves.get(fast)
            except TypeError:
                fast, hit = None, None
            if hit is not None:
                return hit
        hit = self._curve(op, self._check(op, groups), algos)
        if fast is not None:
            self._curves[fast] = hit
        return hit

    def axis_curve(self, op: str, layout: Any, axes: str | tuple[str, ...]) -> CostCurve:
        """Cost curve of ``op`` run by every group of ``layout.groups(axes)`` at once (the slowest group's,
        all of them loading the links): the estimator's one entry point (docs/SCHEMAS.md, section 3). A
        layout seen before is a dict lookup; layouts whose groups are the same share one curve."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        key = ("axis", op, layout, axes)
        hit = self._curves.get(key)
        if hit is None:
            if layout.size(*axes) == 1:
                hit = CostCurve.zero()
            else:
                if layout.world > self.cluster.num_gpus:
                    raise InputError(f"rank layout {layout.key()} needs {layout.world} ranks; the cluster has "
                                     f"{self.cluster.num_gpus}")
                if op not in OPS:
                    raise InputError(f"op={op!r} is not a collective (known: {', '.join(OPS)})")
                groups, digest = self._layout_groups(layout, axes)
                hit = self._curve(op, groups, None, digest)
            self._curves[key] = hit
        return hit

    def _layout_groups(self, layout: Any, axes: tuple[str, ...]) -> tuple[np.ndarray, tuple]:
        """``layout.groups(axes)`` and its digest, shared by the ops of one axis; the last
        ``_LAYOUT_CACHE`` layouts are kept (a groups array holds every rank: a search visits hundreds)."""
        key = (layout, axes)
        hit = self._layouts.pop(key, None)
        if hit is None:
            groups = np.ascontiguousarray(layout.groups(axes), dtype=np.int64)
            hit = (groups, _digest(groups))
            if len(self._layouts) >= _LAYOUT_CACHE:
                self._layouts.pop(next(iter(self._layouts)))
        self._layouts[key] = hit   # most recent last
        return hit

    def run(self, op: str, nbytes: float, groups: Sequence[Sequence[int]] | np.ndarray,
            algorithms: Sequence[str] | None = None) -> CollectiveResult:
        """Time, algbw, busbw and chosen algorithm of one collective of ``nbytes`` (nccl-tests convention)."""
        if not nbytes > 0:
            raise InputError(f"bytes={nbytes!r} must be a positive size")
        arr = self._check(op, groups)
        n = arr.shape[1]
        t, name = self._curve(op, arr, tuple(algorithms) if algorithms else None).best(nbytes)
        algbw = nbytes / t / GB if t > 0 else float("inf")
        return CollectiveResult(op=op, nbytes=int(nbytes), nranks=n, time_s=t, algbw_GBps=algbw,
                                busbw_GBps=algbw * self.k.bus(op, n), algorithm=name)

    def candidates(self, op: str, groups: Sequence[Sequence[int]] | np.ndarray) -> list[Line]:
        """Every candidate line (uncached; for tests and ``--sweep`` explanations)."""
        return self._lines(op, self._check(op, groups))

    # ------------------------------------------------------------------------------------- checking
    def _check(self, op: str, groups: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """``groups`` as an int64 array (groups, ranks per group), after checking op, sizes and ranks."""
        if op not in OPS:
            raise InputError(f"op={op!r} is not a collective (known: {', '.join(OPS)})")
        if isinstance(groups, np.ndarray):
            arr = groups
        else:
            groups = [list(g) for g in groups]
            if not groups or not groups[0]:
                raise InputError("groups must hold at least one group of ranks")
            sizes = {len(g) for g in groups}
            if len(sizes) > 1:
                raise InputError(f"groups have different sizes {sorted(sizes)}; "
                                 "every group of one axis must have the same size")
            arr = np.asarray(groups)
        if arr.ndim != 2 or not arr.size:
            raise InputError("groups must hold at least one group of ranks")
        if not np.issubdtype(arr.dtype, np.integer):
            if not np.all(np.mod(arr, 1) == 0):
                raise InputError("ranks must be integers")
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        total = self.cluster.num_gpus
        bad = (arr < 0) | (arr >= total)
        if bad.any():
            r = int(arr[bad][0])
            raise InputError(f"rank {r} is outside the cluster's {total} GPUs (ranks 0-{total - 1})")
        if arr.shape[1] > 1:
            srt = np.sort(arr, axis=1)
            dup = np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))
            if len(dup):
                raise InputError(f"group {arr[dup[0]].tolist()} lists a rank twice")
        return arr

    # -------------------------------------------------------------------------------------- building
    def _curve(self, op: str, groups: np.ndarray, algorithms: tuple[str, ...] | None,
               digest: tuple | None = None) -> CostCurve:
        key = ("groups", op, digest or _digest(groups), algorithms)
        hit = self._curves.get(key)
        if hit is None:
            hit = self._curves[key] = self._build(op, groups, algorithms, key[2])
        return hit

    def _build(self, op: str, groups: np.ndarray, algorithms: tuple[str, ...] | None,
               digest: tuple | None = None) -> CostCurve:
        if groups.shape[1] == 1:
            return CostCurve.zero()
        lines = self._lines(op, groups, digest)
        if algorithms:
            lines = [ln for ln in lines if ln.name.startswith(tuple(algorithms))]
            if not lines:
                raise InputError(f"algorithms={list(algorithms)} match no candidate of {op} here")
        lat: list[float] = []
        spb: list[float] = []
        names: list[str] = []
        for ln in lines:
            a, b = tangent_columns(ln.latency_s, ln.sec_per_byte, ln.sqrt_coef)
            lat += a
            spb += b
            names += [ln.name] * len(a)
        return CostCurve(tuple(lat), tuple(spb), tuple(names))

    def _lines(self, op: str, groups: np.ndarray, digest: tuple | None = None) -> list[Line]:
        n = groups.shape[1]
        if n == 1:
            return [Line("none", 0.0, 0.0)]
        if "loopback" in self.router.route_types(int(groups[0, 0]), int(groups[0, 1])):
            return self._gloo_lines(op, groups)
        gs = self._groupset(groups, digest)
        seg = self._segments(gs)
        shape = self._shape(gs, seg)
        load = lambda flows, symmetric=False: self.router.sec_per_byte(ShiftedFlows(flows, gs, symmetric))
        if op == "all_to_all":
            return direct_lines(shape, load(all_to_all_flows(gs.reps), True), self.k, self._hw(shape))
        if op == "send_recv":
            return p2p_lines(load(chain_flows(gs.reps)), self.k, self._hw(shape))
        lines = ring_lines(op, shape, self._ring_bw(gs, seg, chain=op == "broadcast"), self.k)
        if op == "all_reduce":
            lines += tree_lines(shape, load(tree_flows(seg), True), self.k)
        if op in NVLS_TRAFFIC and self._nvls_capable(gs, seg):
            lines.append(nvls_line(op, shape, self._nvls_sec_per_byte(op, groups), self.k))
        if op == "all_reduce" and shape.nodes > 1 and seg.uniform > 1:
            lines += self._hierarchical(gs, seg, shape)
        if op in TORUS_FACTOR:
            lines += self._torus_lines(op, groups)
        return lines

    def _hw(self, shape: GroupShape) -> str:
        return "NET" if shape.nodes > 1 else shape.hw

    def _groupset(self, groups: np.ndarray, digest: tuple | None = None) -> GroupSet:
        """The groups by symmetry (structural router); every group its own class on the graph."""
        key = ("groupset", digest or _digest(groups))
        hit = self._memo.get(key)
        if hit is None:
            gpn = int(self.cluster.gpus_per_node)
            hit = self._memo[key] = GroupSet.of(groups, gpn) if self.structural else GroupSet.single(groups, gpn)
        return hit

    def _segments(self, gs: GroupSet) -> Segments:
        """The representatives split by node."""
        key = ("segments", _gs_digest(gs))
        hit = self._memo.get(key)
        if hit is None:
            node, local = self.router.node_local(gs.reps)
            hit = self._memo[key] = split_by_node(gs.reps, node, local)
        return hit

    def _shape(self, gs: GroupSet, seg: Segments) -> GroupShape:
        """NCCL's view of a group: intra-node hardware class (NVLINK when the GPU has NVLink/ICI links, else
        PCI) and channels (one per NVLink lane up to ``max_channels``; ``pcie_channels`` on PCIe)."""
        fast = self.router.fast_links(int(gs.reps[0, 0]))
        if fast.lanes:
            hw, channels = "NVLINK", max(1, min(self.k.max_channels, fast.lanes))
        else:
            hw, channels = "PCI", self.k.pcie_channels
        return GroupShape(n=gs.size, nodes=seg.nodes, hw=hw, channels=channels, caps=self.k.caps(self.device))

    # ------------------------------------------------------------------------------------ rings/trees
    def _ring_bw(self, gs: GroupSet, seg: Segments, chain: bool = False) -> float:
        """Bytes/s of one ring hop with every group's rings loading the links (hop traffic = 1 per ring)."""
        key = ("ring", _gs_digest(gs), chain)
        if key not in self._memo:
            spb = self.router.sec_per_byte(ShiftedFlows(ring_flows(seg, chain), gs))
            self._memo[key] = 1.0 / spb if spb > 0 else float("inf")
        return self._memo[key]

    def _hierarchical(self, gs: GroupSet, seg: Segments, shape: GroupShape) -> list[Line]:
        """Intra-node reduce-scatter, inter-node all-reduce of 1/ppn of the buffer per rail, intra-node
        all-gather (Thakur et al. 2005 hierarchical form; NCCL's NVLS-tree when the intra part is NVLS)."""
        ppn = seg.uniform
        intra, intra_rows, inter, inter_rows = hierarchical_groups(seg)
        intra_gs, inter_gs = gs.derived(intra, intra_rows), gs.derived(inter, inter_rows)
        intra_seg = Segments.one_node(intra)
        k = self.k
        s_intra = GroupShape(n=ppn, nodes=1, hw=shape.hw, channels=shape.channels, caps=shape.caps)
        s_inter = GroupShape(n=inter.shape[1], nodes=inter.shape[1], hw=shape.hw, channels=shape.channels,
                             caps=shape.caps)
        intra_bw = self._ring_bw(intra_gs, intra_seg)
        rs = ring_lines("reduce_scatter", s_intra, intra_bw, k)
        ag = ring_lines("all_gather", s_intra, intra_bw, k)
        ar = ring_lines("all_reduce", s_inter, self._ring_bw(inter_gs, self._segments(inter_gs)), k)
        lines = [combine(f"hierarchical/{a.name.split('/')[1].split()[0]}", [(a, 1.0), (b, 1.0 / ppn), (c, 1.0)])
                 for a, b, c in zip(rs, ar, ag) if a.name.split()[0] == b.name.split()[0] == c.name.split()[0]]
        if self._nvls_capable(intra_gs, intra_seg):
            every = intra_gs.expand()
            nrs = nvls_line("reduce_scatter", s_intra, self._nvls_sec_per_byte("reduce_scatter", every), k)
            nag = nvls_line("all_gather", s_intra, self._nvls_sec_per_byte("all_gather", every), k)
            lines.append(combine("hierarchical-nvls/Simple", [(nrs, 1.0), (ar[-1], 1.0 / ppn), (nag, 1.0)]))
        return lines

    # ------------------------------------------------------------------------------------------- NVLS
    def _nvls_capable(self, gs: GroupSet, seg: Segments) -> bool:
        """NVLS needs an architecture with NVLS, every GPU wired only to in-switch-reduction NVSwitches and
        each group inside one NVLink domain (routes of NVLink only)."""
        if self.k.caps(self.device).nvls_efficiency <= 0:
            return False
        groups = gs.reps    # copies sit on the same local GPUs
        ranks = _distinct_ranks(groups, self.router.num_gpus)
        if not all(self.router.fast_links(int(r)).nvls_switches for r in self._by_local(ranks)):
            return False
        if self.structural and seg.nodes > 1:
            return False   # a node is the NVLink domain of a regular cluster: other nodes are behind NICs
        pairs = {(int(a), int(b)) for a, b in self._pair_classes(groups)}
        return not any(self.router.route(a, b).type_set() - {"nvlink"} for a, b in pairs)

    def _by_local(self, ranks: np.ndarray) -> np.ndarray:
        """One rank per local GPU index on a regular cluster (their links are the template's); every rank
        on a graph."""
        if not self.structural:
            return ranks
        _, first = np.unique(ranks % self.cluster.gpus_per_node, return_index=True)
        return ranks[first]

    def _pair_classes(self, groups: np.ndarray) -> np.ndarray:
        """(first rank, other rank) pairs whose routes decide NVLS: every pair on a graph; one per pair of
        local indices on a regular cluster (single-node groups: the route depends only on the locals)."""
        a = np.repeat(groups[:, :1], groups.shape[1] - 1, axis=1).ravel()
        b = groups[:, 1:].ravel()
        if not self.structural:
            return np.stack([a, b], axis=1)
        gpn = self.cluster.gpus_per_node
        _, first = np.unique((a % gpn) * gpn + b % gpn, return_index=True)
        return np.stack([a[first], b[first]], axis=1)

    def _nvls_sec_per_byte(self, op: str, groups: np.ndarray) -> float:
        """Load of the GPU<->switch links: per GPU ``NVLS_TRAFFIC`` bytes in/out, spread over its NVLinks
        by bandwidth; capacity scaled by the architecture's NVLS efficiency (NCCL nvls.cc)."""
        into, out_of = NVLS_TRAFFIC[op](groups.shape[1])
        counts = np.bincount(groups.ravel(), minlength=self.router.num_gpus)   # a rank in several groups
        if self.structural:   # the links of a GPU are its template's: the busiest rank per local index
            gpn = self.cluster.gpus_per_node
            most = counts.reshape(-1, gpn).max(axis=0)
            ranks = np.flatnonzero(most)
            counts = most[ranks]
        else:
            ranks = np.flatnonzero(counts)
            counts = counts[ranks]
        links = [self.router.fast_links(int(r)) for r in ranks]
        up = np.array([x.up_capacity for x in links])
        down = np.array([x.down_capacity for x in links])
        load = counts * np.maximum(into / up, out_of / down)
        return float(np.max(load) / self.k.caps(self.device).nvls_efficiency)

    # ------------------------------------------------------------------------------------------ torus
    def _torus_lines(self, op: str, groups: np.ndarray) -> list[Line]:
        """Multi-dimensional bidirectional ring on a torus (XLA on TPU ICI; JAX scaling book): for a group
        that is a full sub-grid (every dimension it spans taken whole, so rings close over the wrap-around),
        the buffer is split in one stream per dimension, each reducing dimension by dimension in a rotated
        order (data shrinks by the dimension's size after each phase), every ring run both ways with half the
        data. Link loads of all streams and phases together give the bandwidth term; latency = sum over the
        dimensions of steps x neighbour latency."""
        torus = getattr(self.cluster, "fabric", None)
        if not (hasattr(torus, "coord") and hasattr(torus, "dims")):
            return []
        lines_per_group = [self._torus_lines_of(g) for g in groups]
        if not lines_per_group or any(x is None for x in lines_per_group):
            return []
        sizes = lines_per_group[0][0]
        if any(x[0] != sizes for x in lines_per_group):
            return []
        factor = TORUS_FACTOR[op]
        src, dst, weight = [], [], []
        for order in _rotations(len(sizes)):
            shrink = 1.0
            for d in order:
                n = sizes[d]
                w = factor * (n - 1) / n * shrink / len(sizes) / 2
                lines = np.asarray([line for _, per_dim in lines_per_group for line in per_dim[d]], dtype=np.int64)
                nxt = np.roll(lines, -1, axis=1)
                src += [lines.ravel(), nxt.ravel()]
                dst += [nxt.ravel(), lines.ravel()]
                weight += [np.full(lines.size * 2, w)]
                shrink /= n
        flows = Flows.of(np.concatenate(src), np.concatenate(dst), np.concatenate(weight))
        first = lines_per_group[0][1][0][0]
        alpha = self.router.route(first[0], first[1]).mean_latency_s
        steps = factor * sum(n - 1 for n in sizes)
        return [Line(f"torus-ring/{len(sizes)}d", steps * alpha, self.router.sec_per_byte(flows))]

    def _torus_lines_of(self, group: np.ndarray):
        """(sizes of the spanned dimensions, per dimension the lines of ranks along it) or None."""
        torus = getattr(self.cluster, "fabric", None)
        if not (hasattr(torus, "coord") and hasattr(torus, "dims")):
            return None
        coords = {torus.coord(int(r)): int(r) for r in group}
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
    def _gloo_lines(self, op: str, groups: np.ndarray) -> list[Line]:
        """Gloo on CPU ranks: alpha = latency of the slowest neighbour route, beta from the ring's link loads.
        A calibration's ``gloo_ops`` entry for ``op`` replaces the host link's efficiency and latency."""
        n = groups.shape[1]
        node, local = self.router.node_local(groups)
        per_node = split_by_node(groups, node, local).per_node()
        rings = [ring for p in per_node for ring in ring_orders(p)[:1]]
        hops = {(r[i], r[(i + 1) % n]) for r in rings for i in range(n)}
        over = self.gloo_ops.get(op)
        if over:
            alpha, spb = self._gloo_override(sorted(hops), over)
            return gloo_lines(op, n, alpha, spb)
        alpha = max(self.router.route(a, b).mean_latency_s for a, b in hops)
        if op == "all_to_all":
            spb = self.router.sec_per_byte(Flows.of(*_all_pairs(groups), 1.0 / (n - 1)))
        elif op == "send_recv":
            spb = self.router.sec_per_byte(chain_flows(groups))
        else:
            flat = np.asarray([sum(p, []) for p in per_node], dtype=np.int64)
            spb = 1.0 / self._ring_bw(GroupSet.single(flat, int(self.cluster.gpus_per_node)),
                                      Segments.one_node(flat))
        return gloo_lines(op, n, alpha, spb)

    def _gloo_override(self, hops: list[tuple[int, int]], over: Mapping[str, float]) -> tuple[float, float]:
        """alpha and beta of the ring's hops with one op's calibrated values on the loopback links."""
        alpha, spb = 0.0, 0.0
        for a, b in hops:
            r = self.router.route(a, b)
            host = np.array([t == "loopback" for t in r.types], dtype=bool)
            lat = r.latency_s.copy()
            cap = r.capacity.copy()
            if "latency_us" in over:
                lat[host] = over["latency_us"] * 1e-6
            if "efficiency" in over or "bw_GBps" in over:
                base = np.full(len(cap), over["bw_GBps"]) if "bw_GBps" in over else r.bw_GBps
                cap[host] = base[host] * over.get("efficiency", 1.0) * GB
            alpha = max(alpha, float(np.dot(lat, r.fraction)))
            spb = max(spb, float(np.max(r.fraction / cap)))
        return alpha, spb


def _digest(groups: np.ndarray) -> tuple:
    """Cache key of a groups array (shape and content)."""
    return groups.shape, hashlib.blake2b(groups.tobytes(), digest_size=16).digest()


def _gs_digest(gs: GroupSet) -> tuple:
    """Cache key of a group set (representatives, their shifts)."""
    h = hashlib.blake2b(gs.reps.tobytes(), digest_size=16)
    h.update(gs.class_shift.tobytes())
    for s in gs.shift_sets:
        h.update(len(s).to_bytes(8, "little"))
        h.update(s.tobytes())
    return gs.reps.shape, h.digest()


def _distinct_ranks(groups: np.ndarray, num_gpus: int) -> np.ndarray:
    return np.flatnonzero(np.bincount(groups.ravel(), minlength=num_gpus))


def _all_pairs(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = groups.shape[1]
    a, b = np.nonzero(~np.eye(n, dtype=bool))
    return groups[:, a], groups[:, b]


def _rotations(k: int) -> list[list[int]]:
    return [[(i + j) % k for j in range(k)] for i in range(k)]


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
