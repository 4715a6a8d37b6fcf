"""Fabrics that connect nodes: a folded-Clos fat tree (also rail-optimized) and a 3D torus.

Both are built from their parameters (no graph search): routes are computed from the structure and cached per
pair of leaf switches / chips, so a route costs a dictionary lookup after the first time.

Fat tree (folded Clos, Leiserson 1985; the DGX SuperPOD reference architecture is a rail-optimized instance):
a switch of radix k at the leaf level has d = round(k * o / (1 + o)) ports down to NICs and u = k - d up
(o = oversubscription, down:up). Leaves are filled with NIC k of consecutive nodes (``placement: rail``) or
with consecutive NICs (``placement: node``). Two levels: ceil(L * u / k) spines, each leaf spreading its u
uplinks evenly over them. Three levels: pods of k/2 leaves with u spines each (one uplink per leaf to each),
spine j of every pod connects to core group j (ceil(pods / 2) cores of radix k, k/2 uplinks spread evenly).
Routing is up/down (shortest), traffic split over the uplinks in proportion to their lanes (ECMP).

Torus (TPU v4, Jouppi et al. 2023): chips on an X x Y x Z grid, each linked to its neighbours in every
dimension (with wraparound: 6 links per chip); a host ("node") holds a ``host_shape`` block of chips.
Routing is dimension-order (X, then Y, then Z) along the shorter direction; a tie splits the traffic 50/50.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from ..errors import InputError
from .node import EdgeAttrs, NodeLayout, Route, link_attrs
from .spec import CalibrationSpec, FabricSpec

SwitchRoute = tuple[tuple[float, tuple[str, ...]], ...]


@dataclass(frozen=True)
class BlockLevel:
    """One switch level of a fat tree seen from below: traffic leaving a block of ``size`` consecutive leaves
    climbs to this level, spread over the block's uplinks (ECMP by lanes)."""

    name: str
    size: int
    """leaves per block (1: the leaf itself)."""
    uplinks: tuple[tuple[float, int], ...]
    """per uplink of one block: (share of the traffic leaving the block, lanes of the link)."""

    def block(self, leaf: np.ndarray) -> np.ndarray:
        return leaf // self.size


def spread(ports: int, switches: int) -> list[int]:
    """``ports`` uplinks spread evenly over ``switches`` (the first ones take the remainder)."""
    base, extra = divmod(ports, switches)
    return [base + (1 if s < extra else 0) for s in range(switches)]


class FatTree:
    """Fat tree / rail-optimized fabric over the NICs of ``num_nodes`` nodes (``rails`` NICs each).

    ``levels`` of the file is the most the tree may have: a 4-level file builds 3 levels while the pods fit
    (at most radix pods), as a real fabric grows a tier only when it needs one. ``self.levels`` is what was
    built. Four levels: super-pods of radix/2 pods; in each, aggregation switches ``agg<q>.<j>.<c>``
    (c < radix/2) take one link from spine j of every pod; aggregation switch (j, c) of every super-pod joins
    core group (j, c) (ceil(super-pods / 2) cores, radix/2 uplinks spread evenly), at most radix super-pods.
    """

    def __init__(self, spec: FabricSpec, num_nodes: int, rails: int, nic_group: str, default_eff: float,
                 calibration: CalibrationSpec | None) -> None:
        self.spec, self.num_nodes, self.rails, self.nic_group = spec, num_nodes, rails, nic_group
        k = spec.radix
        where = f"{spec.path}" if spec.path else f"fabric {spec.name}"
        self.down = k if spec.levels == 1 else max(1, min(k - 1, round(k * spec.oversubscription
                                                                       / (1 + spec.oversubscription))))
        self.up = k - self.down if spec.levels > 1 else 0
        if spec.placement == "rail":
            self.num_leaves = math.ceil(num_nodes / self.down) * rails
        else:
            self.num_leaves = math.ceil(num_nodes * rails / self.down)
        self.nic_attrs = link_attrs(spec.nic_link, 1, default_eff, calibration)
        self._switch_link = (spec.switch_link, default_eff, calibration)
        half = k // 2
        pods = math.ceil(self.num_leaves / half)
        self.levels = 3 if spec.levels == 4 and pods <= k else spec.levels
        """levels built (the file's, or 3 when a 4-level file's cluster fits in 3)."""
        levels = self.levels
        if levels == 1 and self.num_leaves > 1:
            raise InputError(f"{where}: one switch of radix {k} cannot hold {num_nodes * rails} NICs "
                             f"({num_nodes} nodes x {rails}); use more levels")
        self.pod_size = half if levels >= 3 else self.num_leaves
        self.pods = pods if levels >= 3 else 1
        if levels == 2:
            self.spines = max(1, math.ceil(self.num_leaves * self.up / k))
            if self.spines > self.up:
                raise InputError(f"{where}: {self.num_leaves} leaf switches exceed what 2 levels of radix {k} "
                                 f"connect (at most {k}); use levels: 3 or a larger radix")
            self.leaf_lanes = spread(self.up, self.spines)
        if levels == 3:
            self.cores_per_group = math.ceil(self.pods / 2)
            if self.pods > k:
                raise InputError(f"{where}: {self.pods} pods exceed what 3 levels of radix {k} connect "
                                 f"(at most {k} pods of {half} leaves); use levels: 4")
            self.core_lanes = spread(half, self.cores_per_group)
        if levels == 4:
            self.superpod_size = half
            self.superpods = math.ceil(self.pods / half)
            if self.superpods > k:
                raise InputError(f"{where}: {self.superpods} super-pods exceed what 4 levels of radix {k} "
                                 f"connect (at most {k} super-pods of {half} pods of {half} leaves)")
            self.cores_per_group = math.ceil(self.superpods / 2)
            self.core_lanes = spread(half, self.cores_per_group)
        self._routes: dict[tuple[int, int], SwitchRoute] = {}
        self._block_levels: tuple[BlockLevel, ...] | None = None

    # ------------------------------------------------------------------------------------------ structure
    def leaf_of(self, node: int, rail: int) -> int:
        """Leaf switch of NIC ``rail`` of ``node`` (works elementwise on numpy arrays)."""
        if self.spec.placement == "rail":
            return (node // self.down) * self.rails + rail
        return (node * self.rails + rail) // self.down

    def nic_id(self, node: int, rail: int) -> str:
        return f"n{node}/{self.nic_group}{rail}"

    def block_levels(self) -> tuple[BlockLevel, ...]:
        """The levels traffic between leaves climbs to, lowest first (see :class:`BlockLevel`); the routes of
        :meth:`route` split traffic exactly in these shares. Computed once."""
        if self._block_levels is None:
            self._block_levels = self._make_block_levels()
        return self._block_levels

    def _make_block_levels(self) -> tuple[BlockLevel, ...]:
        if self.levels == 1:
            return ()
        if self.levels == 2:
            return (BlockLevel("leaf", 1, tuple((lanes / self.up, lanes) for lanes in self.leaf_lanes if lanes)),)
        half = self.spec.radix // 2
        levels = [BlockLevel("leaf", 1, tuple((1.0 / self.up, 1) for _ in range(self.up)))]
        if self.levels == 3 and self._has_core():
            levels.append(BlockLevel("pod", self.pod_size, tuple(
                (lanes / (self.up * half), lanes) for _ in range(self.up) for lanes in self.core_lanes if lanes)))
        if self.levels == 4:
            levels.append(BlockLevel("pod", self.pod_size, tuple(
                (1.0 / (self.up * half), 1) for _ in range(self.up) for _ in range(half))))
            levels.append(BlockLevel("superpod", self.pod_size * self.superpod_size, tuple(
                (lanes / (self.up * half * half), lanes) for _ in range(self.up) for _ in range(half)
                for lanes in self.core_lanes if lanes)))
        return tuple(levels)

    def _has_core(self) -> bool:
        return self.levels == 3 and self.pods > 1

    def switches(self) -> dict[str, dict]:
        """Switch id -> node attributes (kind switch, level 1 leaf / 2 spine / 3 core or aggregation /
        4 core)."""
        out = {}
        attrs = lambda level: {"kind": "switch", "node_index": -1, "local_index": -1, "level": level,
                               "sharp": self.spec.sharp}
        for leaf in range(self.num_leaves):
            out[f"leaf{leaf}"] = attrs(1)
        if self.levels == 2:
            for s in range(self.spines):
                out[f"spine{s}"] = attrs(2)
        if self.levels >= 3:
            for p in range(self.pods):
                for j in range(self.up):
                    out[f"spine{p}.{j}"] = attrs(2)
            if self._has_core():
                for j in range(self.up):
                    for c in range(self.cores_per_group):
                        out[f"core{j}.{c}"] = attrs(3)
        if self.levels == 4:
            half = self.spec.radix // 2
            for q in range(self.superpods):
                for j in range(self.up):
                    for c in range(half):
                        out[f"agg{q}.{j}.{c}"] = attrs(3)
            for j in range(self.up):
                for c in range(half):
                    for x in range(self.cores_per_group):
                        out[f"core{j}.{c}.{x}"] = attrs(4)
        return out

    def switches_near(self, leaves: set[int]) -> dict[str, dict]:
        """Switch id -> attributes of ``leaves`` and the switches above them (for a partial drawing)."""
        names = {f"leaf{leaf}" for leaf in leaves}
        for u, v, _ in self.switch_links_above(leaves):
            names |= {u, v}
        level = {"leaf": 1, "spine": 2, "agg": 3, "core": 3 if self.levels == 3 else 4}
        return {n: {"kind": "switch", "node_index": -1, "local_index": -1, "sharp": self.spec.sharp,
                    "level": next(lv for p, lv in level.items() if n.startswith(p))} for n in sorted(names)}

    def num_switches(self) -> int:
        """Number of switches (without listing them)."""
        n = self.num_leaves
        half = self.spec.radix // 2
        if self.levels == 2:
            n += self.spines
        if self.levels >= 3:
            n += self.pods * self.up
        if self._has_core():
            n += self.up * self.cores_per_group
        if self.levels == 4:
            n += self.superpods * self.up * half + self.up * half * self.cores_per_group
        return n

    def num_switch_links(self) -> int:
        """Physical switch-to-switch links (without listing them)."""
        if self.levels == 2:
            return self.num_leaves * sum(1 for lanes in self.leaf_lanes if lanes)
        n = self.num_leaves * self.up if self.levels >= 3 else 0
        cores = sum(1 for lanes in getattr(self, "core_lanes", ()) if lanes)
        if self._has_core():
            n += self.pods * self.up * cores
        if self.levels == 4:
            half = self.spec.radix // 2
            n += self.pods * self.up * half + self.superpods * self.up * half * cores
        return n

    def switch_link_counts(self) -> dict[int, int]:
        """Physical switch-to-switch links by lane count (for summaries)."""
        out: dict[int, int] = {}
        half = self.spec.radix // 2
        add = lambda lanes, n: out.__setitem__(lanes, out.get(lanes, 0) + n) if lanes and n else None
        if self.levels == 2:
            for lanes in self.leaf_lanes:
                add(lanes, self.num_leaves)
        if self.levels >= 3:
            add(1, self.num_leaves * self.up)
        if self._has_core():
            for lanes in self.core_lanes:
                add(lanes, self.pods * self.up)
        if self.levels == 4:
            add(1, self.pods * self.up * half)
            for lanes in self.core_lanes:
                add(lanes, self.superpods * self.up * half)
        return out

    def edges(self) -> Iterator[tuple[str, str, EdgeAttrs]]:
        """Every directed fabric edge (both directions of each physical link)."""
        for node in range(self.num_nodes):
            for rail in range(self.rails):
                nic, leaf = self.nic_id(node, rail), f"leaf{self.leaf_of(node, rail)}"
                yield nic, leaf, self.nic_attrs
                yield leaf, nic, self.nic_attrs
        yield from self.switch_edges()

    def switch_edges(self) -> Iterator[tuple[str, str, EdgeAttrs]]:
        """Every directed switch-to-switch edge."""
        for u, v, lanes in self._switch_links():
            attrs = link_attrs(*self._switch_link[:1], lanes, *self._switch_link[1:])
            yield u, v, attrs
            yield v, u, attrs

    def switch_links_above(self, leaves: set[int]) -> Iterator[tuple[str, str, int]]:
        """(lower switch, upper switch, lanes) of the switch links on the way up from ``leaves`` (for a
        drawing of a few nodes: only the pods and super-pods they are in)."""
        pods = sorted({leaf // self.pod_size for leaf in leaves})
        for u, v, lanes in self._switch_links(leaves=sorted(leaves), pods=pods):
            yield u, v, lanes

    def _switch_links(self, leaves=None, pods=None) -> Iterator[tuple[str, str, int]]:
        leaves = range(self.num_leaves) if leaves is None else leaves
        if self.levels == 4:
            superpods = range(self.superpods) if pods is None else sorted({p // self.superpod_size for p in pods})
        pods = range(self.pods) if pods is None else pods
        if self.levels == 2:
            for leaf in leaves:
                for s, lanes in enumerate(self.leaf_lanes):
                    if lanes:
                        yield f"leaf{leaf}", f"spine{s}", lanes
        if self.levels >= 3:
            for leaf in leaves:
                for j in range(self.up):
                    yield f"leaf{leaf}", f"spine{leaf // self.pod_size}.{j}", 1
            if self._has_core():
                for p in pods:
                    for j in range(self.up):
                        for c, lanes in enumerate(self.core_lanes):
                            if lanes:
                                yield f"spine{p}.{j}", f"core{j}.{c}", lanes
        if self.levels == 4:
            half = self.spec.radix // 2
            for p in pods:
                for j in range(self.up):
                    for c in range(half):
                        yield f"spine{p}.{j}", f"agg{p // self.superpod_size}.{j}.{c}", 1
            for q in superpods:
                for j in range(self.up):
                    for c in range(half):
                        for x, lanes in enumerate(self.core_lanes):
                            if lanes:
                                yield f"agg{q}.{j}.{c}", f"core{j}.{c}.{x}", lanes

    def switch_link(self, u: str, v: str) -> EdgeAttrs | None:
        """Attributes of the directed link u -> v when it is a NIC-leaf or switch-switch link of this fabric,
        computed from the names (no edge table); None when there is no such link."""
        lo, hi = (u, v) if _level(u) <= _level(v) else (v, u)
        if "/" in lo:   # NIC - leaf
            node, _, nic = lo[1:].partition("/")
            if not (nic.startswith(self.nic_group) and hi.startswith("leaf")):
                return None
            try:
                rail, node_i = int(nic[len(self.nic_group):]), int(node)
            except ValueError:
                return None
            ok = 0 <= node_i < self.num_nodes and 0 <= rail < self.rails and hi == f"leaf{self.leaf_of(node_i, rail)}"
            return self.nic_attrs if ok else None
        lanes = self._switch_lanes(lo, hi)
        if not lanes:
            return None
        return link_attrs(self._switch_link[0], lanes, *self._switch_link[1:])

    def _switch_lanes(self, lo: str, hi: str) -> int:
        """Lanes of the switch link lo (lower level) - hi, 0 when absent."""
        half = self.spec.radix // 2
        try:
            if self.levels == 2 and lo.startswith("leaf") and hi.startswith("spine"):
                leaf, s = int(lo[4:]), int(hi[5:])
                return self.leaf_lanes[s] if leaf < self.num_leaves and 0 <= s < self.spines else 0
            if self.levels >= 3 and lo.startswith("leaf") and hi.startswith("spine"):
                leaf = int(lo[4:])
                p, j = map(int, hi[5:].split("."))
                return 1 if leaf < self.num_leaves and p == leaf // self.pod_size and 0 <= j < self.up else 0
            if self._has_core() and lo.startswith("spine") and hi.startswith("core"):
                p, j = map(int, lo[5:].split("."))
                j2, c = map(int, hi[4:].split("."))
                ok = 0 <= p < self.pods and j == j2 and 0 <= j < self.up and 0 <= c < self.cores_per_group
                return self.core_lanes[c] if ok else 0
            if self.levels == 4 and lo.startswith("spine") and hi.startswith("agg"):
                p, j = map(int, lo[5:].split("."))
                q, j2, c = map(int, hi[3:].split("."))
                ok = 0 <= p < self.pods and q == p // self.superpod_size and j == j2 and 0 <= j < self.up
                return 1 if ok and 0 <= c < half else 0
            if self.levels == 4 and lo.startswith("agg") and hi.startswith("core"):
                q, j, c = map(int, lo[3:].split("."))
                j2, c2, x = map(int, hi[4:].split("."))
                ok = (0 <= q < self.superpods and (j, c) == (j2, c2) and 0 <= j < self.up and 0 <= c < half
                      and 0 <= x < self.cores_per_group)
                return self.core_lanes[x] if ok else 0
        except ValueError:
            return 0
        return 0

    # ------------------------------------------------------------------------------------------ routing
    def route(self, node_a: int, rail_a: int, node_b: int, rail_b: int) -> Route:
        """Weighted paths NIC (node_a, rail_a) -> NIC (node_b, rail_b), up/down with ECMP."""
        la, lb = self.leaf_of(node_a, rail_a), self.leaf_of(node_b, rail_b)
        key = (la, lb)
        if key not in self._routes:
            self._routes[key] = self._switch_route(la, lb)
        nic_a, nic_b = self.nic_id(node_a, rail_a), self.nic_id(node_b, rail_b)
        out = []
        for frac, hops in self._routes[key]:
            chain = (nic_a,) + hops + (nic_b,)
            out.append((frac, tuple(zip(chain[:-1], chain[1:]))))
        return tuple(out)

    def _switch_route(self, la: int, lb: int) -> SwitchRoute:
        a, b = f"leaf{la}", f"leaf{lb}"
        if la == lb:
            return ((1.0, (a,)),)
        if self.levels == 2:
            return tuple((lanes / self.up, (a, f"spine{s}", b)) for s, lanes in enumerate(self.leaf_lanes) if lanes)
        pa, pb = la // self.pod_size, lb // self.pod_size
        if pa == pb:
            return tuple((1.0 / self.up, (a, f"spine{pa}.{j}", b)) for j in range(self.up))
        half = self.spec.radix // 2
        if self.levels == 3:
            return tuple((lanes / (self.up * half), (a, f"spine{pa}.{j}", f"core{j}.{c}", f"spine{pb}.{j}", b))
                         for j in range(self.up) for c, lanes in enumerate(self.core_lanes) if lanes)
        qa, qb = pa // self.superpod_size, pb // self.superpod_size
        if qa == qb:
            return tuple((1.0 / (self.up * half), (a, f"spine{pa}.{j}", f"agg{qa}.{j}.{c}", f"spine{pb}.{j}", b))
                         for j in range(self.up) for c in range(half))
        return tuple((lanes / (self.up * half * half),
                      (a, f"spine{pa}.{j}", f"agg{qa}.{j}.{c}", f"core{j}.{c}.{x}", f"agg{qb}.{j}.{c}",
                       f"spine{pb}.{j}", b))
                     for j in range(self.up) for c in range(half) for x, lanes in enumerate(self.core_lanes) if lanes)


class Torus:
    """3D torus of chips; ranks fill hosts of ``host_shape`` chips, hosts fill the grid X first."""

    def __init__(self, spec: FabricSpec, num_gpus: int, gpus_per_node: int, gpu_group: str, default_eff: float,
                 calibration: CalibrationSpec | None) -> None:
        where = f"{spec.path}" if spec.path else f"fabric {spec.name}"
        self.spec, self.gpu_group, self.gpus_per_node = spec, gpu_group, gpus_per_node
        self.shape = spec.host_shape
        if math.prod(self.shape) != gpus_per_node:
            raise InputError(f"{where}: host_shape={list(self.shape)} holds {math.prod(self.shape)} chips but "
                             f"the node has {gpus_per_node}")
        self.dims = spec.dims or auto_dims(num_gpus, self.shape)
        if self.dims is None or math.prod(self.dims) != num_gpus or any(
                d % s for d, s in zip(self.dims, self.shape)):
            raise InputError(f"{where}: dims={list(spec.dims) if spec.dims else 'auto'} cannot hold {num_gpus} "
                             f"chips in hosts of {list(self.shape)}")
        self.hosts = tuple(d // s for d, s in zip(self.dims, self.shape))
        self.attrs = link_attrs(spec.link, 1, default_eff, calibration)

    def coords(self, ranks: np.ndarray) -> np.ndarray:
        """Array ``(len(ranks), 3)`` of chip coordinates (vectorized :meth:`coord`)."""
        host, local = np.divmod(np.asarray(ranks, dtype=np.int64), self.gpus_per_node)
        h0, h1 = self.hosts[0], self.hosts[1]
        s = self.shape
        hosts = np.stack([host % h0, host // h0 % h1, host // (h0 * h1)], axis=1)
        locs = np.stack([local % s[0], local // s[0] % s[1], local // (s[0] * s[1])], axis=1)
        return hosts * np.asarray(s) + locs

    def rank_of(self, coords: np.ndarray) -> np.ndarray:
        """Ranks of chip coordinates (inverse of :meth:`coords`)."""
        s = np.asarray(self.shape)
        h, loc = np.divmod(coords, s)
        host = h[:, 0] + self.hosts[0] * (h[:, 1] + self.hosts[1] * h[:, 2])
        local = loc[:, 0] + s[0] * (loc[:, 1] + s[1] * loc[:, 2])
        return host * self.gpus_per_node + local

    def moves(self, a: np.ndarray, b: np.ndarray, dim: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Vectorized :meth:`_moves`: (step, count, fraction) arrays of the two ways along ``dim``."""
        n = self.dims[dim]
        if not self.spec.wraparound or n <= 2:
            return [(np.sign(b - a), np.abs(b - a), np.ones(len(a)))]
        fwd, back = (b - a) % n, (a - b) % n
        tie = np.where(fwd == back, 0.5, 0.0)
        ones = np.ones(len(a), dtype=np.int64)
        return [(ones, fwd, np.where(fwd < back, 1.0, tie)), (-ones, back, np.where(back < fwd, 1.0, tie))]

    def num_links(self) -> int:
        """Physical ICI links (each joins two neighbouring chips)."""
        total = 0
        for d, n in enumerate(self.dims):
            lines = math.prod(self.dims) // n
            per_line = n if (self.spec.wraparound and n > 2) else max(n - 1, 0)
            total += lines * per_line
        return total

    def neighbour_links(self, rank: int) -> int:
        """Number of ICI links of the chip holding ``rank``."""
        c = self.coord(rank)
        seen = {self._neighbour(c, d, s) for d in range(3) for s in (1, -1)}
        return len(seen - {None, c})

    def link(self, u: str, v: str) -> EdgeAttrs | None:
        """Attributes of the ICI link between chips ``u`` and ``v`` (graph ids), None if they are not
        neighbours."""
        ranks = []
        for x in (u, v):
            node, _, chip = x[1:].partition("/")
            if not chip.startswith(self.gpu_group):
                return None
            ranks.append(int(node) * self.gpus_per_node + int(chip[len(self.gpu_group):]))
        a, b = self.coord(ranks[0]), self.coord(ranks[1])
        near = any(self._neighbour(a, d, s) == b for d in range(3) for s in (1, -1))
        return self.attrs if near and a != b else None

    def coord(self, rank: int) -> tuple[int, int, int]:
        host, local = divmod(rank, self.gpus_per_node)
        h = (host % self.hosts[0], host // self.hosts[0] % self.hosts[1], host // (self.hosts[0] * self.hosts[1]))
        s = self.shape
        loc = (local % s[0], local // s[0] % s[1], local // (s[0] * s[1]))
        return tuple(h[i] * s[i] + loc[i] for i in range(3))  # type: ignore[return-value]

    @property
    def _rank_of(self) -> dict[tuple[int, int, int], int]:
        if not hasattr(self, "_rank_table"):
            self._rank_table = {self.coord(r): r for r in range(math.prod(self.dims))}
        return self._rank_table

    def chip_id(self, rank: int) -> str:
        return f"n{rank // self.gpus_per_node}/{self.gpu_group}{rank % self.gpus_per_node}"

    def _neighbour(self, c: tuple[int, int, int], dim: int, step: int) -> tuple[int, int, int] | None:
        n = self.dims[dim]
        value = c[dim] + step
        if not 0 <= value < n:
            if not self.spec.wraparound or n <= 2:
                return None
            value %= n
        return c[:dim] + (value,) + c[dim + 1:]

    def edges(self) -> Iterator[tuple[str, str, EdgeAttrs]]:
        for rank in range(math.prod(self.dims)):
            c = self.coord(rank)
            for dim in range(3):
                nb = self._neighbour(c, dim, +1)
                if nb is None or nb == c:
                    continue
                u, v = self.chip_id(rank), self.chip_id(self._rank_of[nb])
                yield u, v, self.attrs
                yield v, u, self.attrs

    def route(self, src: int, dst: int) -> Route:
        return _torus_route(self, src, dst)

    def _moves(self, a: int, b: int, dim: int) -> list[tuple[float, int, int]]:
        """(fraction, step, count) choices to go from a to b along one dimension."""
        n = self.dims[dim]
        if a == b:
            return [(1.0, 0, 0)]
        if not self.spec.wraparound or n <= 2:
            return [(1.0, 1 if b > a else -1, abs(b - a))]
        fwd, back = (b - a) % n, (a - b) % n
        if fwd < back:
            return [(1.0, 1, fwd)]
        if back < fwd:
            return [(1.0, -1, back)]
        return [(0.5, 1, fwd), (0.5, -1, back)]


def _level(device: str) -> int:
    """0 for devices inside a node, then leaf 1, spine 2, aggregation 3, core 4 (an order, not the
    switch's ``level`` attribute)."""
    for level, prefix in ((1, "leaf"), (2, "spine"), (3, "agg"), (4, "core")):
        if device.startswith(prefix):
            return level
    return 0


@lru_cache(maxsize=1 << 16)
def _torus_route(torus: Torus, src: int, dst: int) -> Route:
    if src == dst:
        return ()
    a, b = torus.coord(src), torus.coord(dst)
    choices = [torus._moves(a[d], b[d], d) for d in range(3)]
    out = []
    for combo in itertools.product(*choices):
        frac, cur, chain = 1.0, a, [src]
        for dim, (f, step, count) in enumerate(combo):
            frac *= f
            for _ in range(count):
                cur = torus._neighbour(cur, dim, step)
                chain.append(torus._rank_of[cur])
        ids = [torus.chip_id(r) for r in chain]
        out.append((frac, tuple(zip(ids[:-1], ids[1:]))))
    return tuple(out)


def auto_dims(num: int, shape: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The most cubic X x Y x Z = num whose sizes are multiples of the host shape (X >= Y >= Z)."""
    best = None
    for x in range(1, num + 1):
        if num % x:
            continue
        for y in range(1, num // x + 1):
            if (num // x) % y:
                continue
            dims = (x, y, num // (x * y))
            if any(d % s for d, s in zip(dims, shape)):
                continue
            key = (max(dims) - min(dims), tuple(-d for d in dims))
            if best is None or key < best[0]:
                best = (key, dims)
    return best[1] if best else None


def check_fabric_fits(spec: FabricSpec, layout: NodeLayout, num_nodes: int, cluster_path: object) -> None:
    """Fabric/template combinations that cannot work, as InputError."""
    if spec.type == "none" and num_nodes > 1:
        raise InputError(f"{cluster_path}: fabric {spec.name} (type none) connects one node, not {num_nodes}")
    if spec.type in ("fat_tree", "rail_optimized") and num_nodes > 1 and len(layout.nic_groups) != 1:
        raise InputError(f"{layout.template.path}: devices: a node on a {spec.type} fabric needs exactly one "
                         f"group of kind nic, found {len(layout.nic_groups)}")
