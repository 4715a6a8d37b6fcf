"""The structural router: link loads of flows computed from a cluster's structure, not from its graph.

A regular :class:`~tpsim.topology.Cluster` is identical nodes (one template) on a fabric built from parameters
(fat tree / rail-optimized of 1-4 levels, 3D torus, or none). The loads that the full-graph router
(:mod:`tpsim.collectives.fabric`) finds edge by edge are found here level by level, with the same routes
(NVSwitch spreading, PXN, closest NIC, up/down ECMP, dimension-order torus routing):

* **Inside a node** (template links, and the node's NIC links): a flow adds its template route to its source
  node (an intra-node flow, or the way out to the NIC the fabric route starts from) and to its destination
  node (NIC to GPU). A node's link loads are a function of the multiset of (local route, weight) it carries;
  nodes carrying the same multiset have the same loads, so only one node per distinct multiset is evaluated
  (the multisets are compared by two 64-bit sums of a fixed hash; nodes differing only by the order of their
  flows are the same node). For the usual layouts every node is alike and one is evaluated.
* **Fat tree** (ECMP spreads evenly by lanes): every uplink of a leaf carries its share of the traffic
  leaving that leaf, every uplink of a level-l block its share of the traffic leaving the block; so the
  switch loads are the traffic leaving / entering each leaf and each block, one bincount per level.
* **Torus**: every flow's hops along its dimension-order route (ties split both ways), one bincount.

The work is a few numpy passes over the flows (their number is what the group sizes require) and the template
routes of the distinct local patterns; no per-GPU Python object and no graph. Equal to the full-graph router
within floating-point summation order (tests/test_collective_structural.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from ..topology.fabric import FatTree, Torus
from ..topology.node import EdgeAttrs, link_attrs
from .flows import Flows
from .links import FastLinks, LinkRules, RouteInfo, RouteQueries

FAST_TYPES = ("nvlink", "ici")
_DEDUP_MIN_NODES = 16
"""below this many nodes every loaded node is evaluated (hashing would cost more than it saves)."""
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB),
        np.uint64(0xD6E8FEB86659FD93))


class StructuralRouter(RouteQueries):
    """Link loads on a regular cluster from its node template and fabric parameters."""

    def __init__(self, cluster: Any, rules: LinkRules | None = None) -> None:
        self.cluster = cluster
        self.rules = rules or LinkRules()
        self.layout = layout = cluster.layout
        self.gpn = int(cluster.gpus_per_node)
        self.num_nodes = int(cluster.num_nodes)
        self.fabric = cluster.fabric
        self.fat = self.fabric if isinstance(self.fabric, FatTree) else None
        self.torus = self.fabric if isinstance(self.fabric, Torus) else None
        # node-local edges: the template's, then (fat tree) each NIC's up and down link to its leaf
        self.edge_ids: dict[tuple[str, str], int] = {}
        attrs: list[EdgeAttrs] = []
        for (u, v), a in layout.edges.items():
            self.edge_ids[(u, v)] = len(attrs)
            attrs.append(a)
        self.rails = len(layout.nics)
        self._nic_edge0 = len(attrs)
        if self.fat is not None:
            attrs += [self.fat.nic_attrs] * (2 * self.rails)
        self.local_capacity = np.array([self.rules.of(a)[0] for a in attrs], dtype=float)
        self.local_latency = np.array([self.rules.of(a)[1] for a in attrs], dtype=float)
        self.local_bw = np.array([a.bw_GBps for a in attrs], dtype=float)
        self.local_types = tuple(a.type for a in attrs)
        if not len(self.local_capacity) and self.torus is None:
            raise InputError(f"cluster {cluster.name}: the node template has no links")
        if np.any(self.local_capacity <= 0):
            raise InputError(f"cluster {cluster.name}: every link needs bw_GBps > 0 and efficiency > 0 for the "
                             "collective model")
        self.num_local = len(attrs)
        if self.rails:
            self.gpu_rail = np.array([layout.devices[layout.nic_of(i)]["local_index"] if layout.nic_of(i) else -1
                                      for i in range(self.gpn)], dtype=np.int64)
        else:
            self.gpu_rail = np.full(self.gpn, -1, dtype=np.int64)
        g2 = self.gpn * self.gpn
        self._key_out0 = g2
        self._key_in0 = g2 + self.gpn * max(self.rails, 1)
        self.num_keys = self._key_in0 + self.gpn
        self._entries: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._out_rail: dict[int, int] = {}
        self._fast: dict[int, FastLinks] = {}
        self._route_cache: dict[tuple[int, int], RouteInfo] = {}
        self._proxy_table = np.full(self.gpn * max(self.rails, 1), -1, dtype=np.int64)
        self._salt = np.stack([_splitmix64(np.arange(self.num_keys, dtype=np.uint64) + np.uint64(seed))
                               for seed in (0x5EED, 0xC0FFEE)])
        if self.fat is not None:
            self._switch_ratios()
        if self.torus is not None:
            t = self.torus
            self._torus_cap, self._torus_lat = self.rules.of(t.attrs)

    # ------------------------------------------------------------------------------------------- ranks
    @property
    def num_gpus(self) -> int:
        return int(self.cluster.num_gpus)

    def node_local(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.divmod(np.asarray(ranks, dtype=np.int64), self.gpn)

    # ------------------------------------------------------------------------------------------ routes
    def route(self, src: int, dst: int) -> RouteInfo:
        """Every edge of the route from ``src`` to ``dst`` with the fraction of the flow it carries: the
        template segments at both ends and the fabric's switch segment (their fractions each sum to 1, as
        the full route's paths do), attributes resolved without the graph."""
        key = (int(src), int(dst))
        hit = self._route_cache.get(key)
        if hit is None:
            self.cluster._check_rank(key[0])
            self.cluster._check_rank(key[1])
            hit = self._route_cache[key] = self._route_uncached(*key)
        return hit

    def _route_uncached(self, src: int, dst: int) -> RouteInfo:
        (na, la), (nb, lb) = divmod(src, self.gpn), divmod(dst, self.gpn)
        if src == dst:
            return RouteInfo((), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))
        if self.torus is not None:
            return self._route_of_paths(src, dst)
        if na == nb:
            idx, frac = self._entries.get(la * self.gpn + lb) or self._entry(la * self.gpn + lb)
            return self._local_route(idx, frac)
        rail_b = int(self.gpu_rail[lb])
        out = self._entries.get(self._key_out0 + la * self.rails + rail_b) or self._entry(
            self._key_out0 + la * self.rails + rail_b)
        inn = self._entries.get(self._key_in0 + lb) or self._entry(self._key_in0 + lb)
        ends = self._local_route(np.concatenate([out[0], inn[0]]), np.concatenate([out[1], inn[1]]))
        rail_a = int(self.gpu_rail[self._proxy(la, rail_b)])
        edges: dict[tuple[str, str], float] = {}
        for f, path in self.fat.route(na, rail_a, nb, rail_b):
            for e in path[1:-1]:     # the NIC links are in the end segments
                edges[e] = edges.get(e, 0.0) + f
        attrs = [self.fat.switch_link(u, v) for u, v in edges]
        caps_lats = [self.rules.of(a) for a in attrs]
        return RouteInfo(ends.types + tuple(a.type for a in attrs),
                         np.concatenate([ends.fraction, list(edges.values())]),
                         np.concatenate([ends.latency_s, [lt for _, lt in caps_lats]]),
                         np.concatenate([ends.capacity, [c for c, _ in caps_lats]]),
                         np.concatenate([ends.bw_GBps, [a.bw_GBps for a in attrs]]))

    def _local_route(self, idx: np.ndarray, frac: np.ndarray) -> RouteInfo:
        return RouteInfo(tuple(self.local_types[i] for i in idx), frac, self.local_latency[idx],
                         self.local_capacity[idx], self.local_bw[idx])

    def _route_of_paths(self, src: int, dst: int) -> RouteInfo:
        """A route from ``Cluster.paths`` (torus: a few dimension-order paths)."""
        types, frac, lat, cap, bw = [], [], [], [], []
        for f, path in self.cluster.paths(src, dst):
            for u, v in path:
                a = self.cluster.link_attrs(u, v)
                c, latency = self.rules.of(a)
                types.append(a.type)
                frac.append(f)
                lat.append(latency)
                cap.append(c)
                bw.append(a.bw_GBps)
        return RouteInfo(tuple(types), np.array(frac), np.array(lat), np.array(cap), np.array(bw))

    def fast_links(self, rank: int) -> FastLinks:
        """NVLink / ICI links of the GPU holding ``rank`` (the template's, or the torus neighbours)."""
        key = int(rank) if self.torus is not None else int(rank) % self.gpn   # torus edges differ per chip
        hit = self._fast.get(key)
        if hit is None:
            hit = self._fast[key] = self._fast_uncached(int(rank))
        return hit

    def _fast_uncached(self, rank: int) -> FastLinks:
        layout, gpu = self.layout, self.layout.gpu(rank % self.gpn)
        outs = [(v, a) for (u, v), a in layout.edges.items() if u == gpu and a.type in FAST_TYPES]
        lanes = sum(int(a.lanes or 1) for _, a in outs)
        up = sum(self.rules.of(a)[0] for _, a in outs)
        down = sum(self.rules.of(layout.edges[(v, gpu)])[0] for v, _ in outs)
        sharp = bool(outs) and all(layout.devices[v]["kind"] == "nvswitch" and layout.devices[v]["sharp"]
                                   for v, _ in outs)
        if self.torus is not None:
            links = self.torus.neighbour_links(rank)
            lanes += links
            up += links * self._torus_cap
            down += links * self._torus_cap
            sharp = False
        return FastLinks(lanes=lanes, up_capacity=up, down_capacity=down, nvls_switches=sharp)

    # ------------------------------------------------------------------------------------------- loads
    def sec_per_byte(self, flows: Flows) -> float:
        """max over links of (bytes on the link per byte of buffer) / capacity, all flows together."""
        keep = (flows.src != flows.dst) & (flows.weight > 0)
        if not keep.all():
            flows = Flows(flows.src[keep], flows.dst[keep], flows.weight[keep])
        if not len(flows):
            return 0.0
        if self.torus is not None:
            return self._torus_sec_per_byte(flows)
        ns, ls = np.divmod(flows.src, self.gpn)
        nd, ld = np.divmod(flows.dst, self.gpn)
        w = flows.weight
        same = ns == nd
        if same.all():
            return self._node_max(ns, ls * self.gpn + ld, w)
        x = ~same
        rail_b = self.gpu_rail[ld[x]]
        if np.any(rail_b < 0):
            raise InputError(f"cluster {self.cluster.name}: a GPU without a NIC receives inter-node traffic")
        node = np.concatenate([ns[same], ns[x], nd[x]])
        key = np.concatenate([ls[same] * self.gpn + ld[same], self._key_out0 + ls[x] * self.rails + rail_b,
                              self._key_in0 + ld[x]])
        weight = np.concatenate([w[same], w[x], w[x]])
        ratio = self._node_max(node, key, weight)
        return max(ratio, self._fat_tree_max(ns[x], nd[x], ls[x], rail_b, w[x]))

    # ----------------------------------------------------------------------------------- inside nodes
    def _node_max(self, node: np.ndarray, key: np.ndarray, weight: np.ndarray) -> float:
        """Largest load / capacity over the node-local links of every node (one node per distinct pattern)."""
        reps = self._representatives(node, key, weight)
        rep_of = np.full(self.num_nodes, -1, dtype=np.int64)
        rep_of[reps] = np.arange(len(reps))
        ri = rep_of[node]
        sel = ri >= 0
        combo, inv = np.unique(ri[sel] * self.num_keys + key[sel], return_inverse=True)
        wsum = np.bincount(inv.ravel(), weights=weight[sel], minlength=len(combo))
        rep_idx, keys = np.divmod(combo, self.num_keys)
        edges, fracs, owner = self._expand(keys)
        loads = np.bincount(rep_idx[owner] * self.num_local + edges, weights=wsum[owner] * fracs,
                            minlength=len(reps) * self.num_local)
        return float(np.max(loads.reshape(len(reps), self.num_local) / self.local_capacity))

    def _representatives(self, node: np.ndarray, key: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """One node per distinct multiset of (key, weight) records (all loaded nodes when there are few)."""
        touched = np.bincount(node, minlength=self.num_nodes) > 0
        if self.num_nodes < _DEDUP_MIN_NODES:
            return np.flatnonzero(touched)
        bits = weight.view(np.uint64)
        sums = []
        for salt, (m1, m2) in zip(self._salt, ((_MIX[0], _MIX[1]), (_MIX[2], _MIX[3]))):
            h = salt[key] ^ (bits * m1)
            h ^= h >> np.uint64(31)
            h *= m2
            h ^= h >> np.uint64(29)
            # 30-bit parts summed in float64 stay exact (records < 2**23 per node)
            sums.append(np.bincount(node, weights=(h >> np.uint64(34)).astype(float), minlength=self.num_nodes))
        sig = (sums[0].astype(np.int64) << np.int64(31)) ^ sums[1].astype(np.int64)
        nodes = np.flatnonzero(touched)
        _, first = np.unique(sig[nodes], return_index=True)
        return nodes[np.sort(first)]

    def _expand(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(local edge, fraction, index into ``keys``) of every template-route entry of ``keys``."""
        edges, fracs, owner = [], [], []
        for i, k in enumerate(keys.tolist()):
            e, f = self._entries.get(k) or self._entry(k)
            edges.append(e)
            fracs.append(f)
            owner.append(np.full(len(e), i, dtype=np.int64))
        if not edges:
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        return np.concatenate(edges), np.concatenate(fracs), np.concatenate(owner)

    def _entry(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Template route of one key: intra-node GPU pair, GPU towards a rail's NIC (PXN), or NIC to GPU."""
        layout = self.layout
        if key < self._key_out0:
            a, b = divmod(key, self.gpn)
            parts = [layout.gpu_route(a, b)]
            extra: list[int] = []
        elif key < self._key_in0:
            a, rail = divmod(key - self._key_out0, self.rails)
            proxy = self._proxy(a, rail)
            parts = ([layout.gpu_route(a, proxy)] if proxy != a else []) + [layout.to_nic(proxy)]
            extra = [self._nic_edge0 + int(self.gpu_rail[proxy])]
        else:
            b = key - self._key_in0
            parts = [layout.from_nic(b)]
            extra = [self._nic_edge0 + self.rails + int(self.gpu_rail[b])]
        # independent segments: each edge carries its own segment's fraction (the others sum to 1)
        idx = [self.edge_ids[e] for part in parts for f, path in part for e in path] + extra
        frac = [f for part in parts for f, path in part for _ in path] + [1.0] * len(extra)
        out = self._entries[key] = (np.array(idx, dtype=np.int64), np.array(frac, dtype=float))
        return out

    def _proxy(self, local: int, rail: int) -> int:
        """The local GPU whose NIC a message from ``local`` to rail ``rail`` leaves by (PXN), cached."""
        k = local * self.rails + rail
        hit = self._out_rail.get(k)
        if hit is None:
            hit = self._out_rail[k] = self.cluster._proxy(local, f"{self.layout.nic_groups[0]}{rail}")
        return hit

    # -------------------------------------------------------------------------------------- fat trees
    def _switch_ratios(self) -> None:
        """Per level: (load / capacity) of the most loaded uplink per byte leaving one block of that level."""
        fat = self.fat
        kind, eff, cal = fat._switch_link
        cap = lambda lanes: self.rules.of(link_attrs(kind, lanes, eff, cal))[0]
        self._ratios: list[tuple[str, float]] = []
        for level in fat.block_levels():
            self._ratios.append((level.name, max(share / cap(lanes) for share, lanes in level.uplinks)))

    def _fat_tree_max(self, ns: np.ndarray, nd: np.ndarray, ls: np.ndarray, rail_b: np.ndarray,
                      w: np.ndarray) -> float:
        """Largest switch-link load / capacity: per level, the traffic leaving / entering each block."""
        fat = self.fat
        rail_a = self.gpu_rail[self._proxies(ls, rail_b)]
        la = fat.leaf_of(ns, rail_a)
        lb = fat.leaf_of(nd, rail_b)
        best = 0.0
        for level, (name, ratio) in zip(fat.block_levels(), self._ratios):
            ba, bb = level.block(la), level.block(lb)
            x = ba != bb
            if not x.any():
                break
            out = np.bincount(ba[x], weights=w[x])
            inn = np.bincount(bb[x], weights=w[x])
            best = max(best, float(max(out.max(), inn.max())) * ratio)
        return best

    def _proxies(self, ls: np.ndarray, rail_b: np.ndarray) -> np.ndarray:
        """Proxy GPU (PXN) of each (source local, destination rail), from a table filled as pairs appear."""
        keys = ls * self.rails + rail_b
        seen = np.zeros(len(self._proxy_table), dtype=bool)
        seen[keys] = True
        for k in np.flatnonzero(seen & (self._proxy_table < 0)).tolist():
            self._proxy_table[k] = self._proxy(*divmod(k, self.rails))
        return self._proxy_table[keys]

    # ------------------------------------------------------------------------------------------ torus
    def _torus_sec_per_byte(self, flows: Flows) -> float:
        """Every hop of every flow's dimension-order route (the shorter way round; a tie splits 50/50),
        loads per directed ICI link (chip, dimension, direction)."""
        t = self.torus
        a = t.coords(flows.src)
        b = t.coords(flows.dst)
        cur = a.copy()
        idx_parts, w_parts = [], []
        for d in range(3):
            n = t.dims[d]
            for step, count, frac in t.moves(cur[:, d], b[:, d], d):
                m = frac > 0
                if not m.any():
                    continue
                reps = count[m]
                start = np.repeat(cur[m], reps, axis=0)
                offs = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
                pos = start.copy()
                pos[:, d] = (start[:, d] + np.repeat(step[m], reps) * offs) % n
                direction = (np.repeat(step[m], reps) < 0).astype(np.int64)
                idx_parts.append(t.rank_of(pos) * 6 + 2 * d + direction)
                w_parts.append(np.repeat(flows.weight[m] * frac[m], reps))
            cur[:, d] = b[:, d]
        if not idx_parts:
            return 0.0
        loads = np.bincount(np.concatenate(idx_parts), weights=np.concatenate(w_parts))
        return float(loads.max() / self._torus_cap)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 (Steele, Lea & Flood 2014): well-mixed 64-bit values from consecutive integers."""
    z = x * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
