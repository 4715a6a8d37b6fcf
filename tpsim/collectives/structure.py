"""The structural router: link loads of flows computed from a cluster's structure, not from its graph.

A regular :class:`~tpsim.topology.Cluster` is identical nodes (one template) on a fabric built from parameters
(fat tree / rail-optimized of 1-4 levels, 3D torus, or none). The loads that the full-graph router
(:mod:`tpsim.collectives.fabric`) finds edge by edge are found here level by level, with the same routes
(NVSwitch spreading, PXN, closest NIC, up/down ECMP, dimension-order torus routing). Flows come as the flows
of representative groups plus the whole-node shifts that copy them (:class:`~tpsim.collectives.groups.
ShiftedFlows`):

* **Inside a node** (template links, and the node's NIC links): a hop leaves *records* on the nodes it
  touches: a GPU pair's template route, or GPU to NVSwitches (split by the source's lanes) and NVSwitches to
  GPU, GPU to its NIC and up to the leaf, leaf down to a NIC and on to its GPU. A *token* is the records one
  representative leaves on one node; every copy lands the same token on the node moved by its shift. A node's
  loads depend only on the records landing on it, so nodes are told apart by sums of a fixed 64-bit hash of
  their tokens' records (key, weight), and one node per distinct sum is evaluated through the template
  routes. For the usual layouts every node is alike and one or a few are evaluated. (Two different record
  sets would have to collide in two independent 30-bit-part sums to be taken as one: odds of order 2**-60.)
* **Fat tree** (ECMP spreads evenly by lanes): every uplink of a leaf carries its share of the traffic
  leaving that leaf, every uplink of a pod / super-pod its share of the traffic leaving the block; so the
  switch loads are the traffic leaving / entering each block, one bincount per level over the inter-node hops
  of every copy (a symmetric flow set, such as a tree's, counts each pair once).
* **Torus**: every flow's hops along its dimension-order route (ties split both ways), one bincount.

The work is numpy passes over the representatives' flows, the copies' landings and inter-node hops, and the
template routes of the distinct local patterns; no per-GPU Python object and no graph. Equal to the full-graph
router within floating-point summation order (tests/test_collective_structural.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from ..limits import check_node_pairs
from ..topology.fabric import FatTree, Torus
from ..topology.node import EdgeAttrs, link_attrs
from .flows import Flows
from .groups import GroupSet, ShiftedFlows
from .links import FastLinks, LinkRules, RouteInfo, RouteQueries

FAST_TYPES = ("nvlink", "ici")
_UNKNOWN, _OWN_ROUTE = -1, -2
_MAX_SPLITS = 1 << 12
"""distinct ways a GPU's NVLink lanes split over NVSwitches (one per template in practice)."""
_KEY_SPAN = 1 << 40
"""record keys are below this (for (representative node, key) pairs packed in one int64)."""
_DEDUP_MIN_NODES = 16
"""below this many nodes every loaded node is evaluated (hashing would cost more than it saves)."""

class StructuralRouter(RouteQueries):
    """Link loads on a regular cluster from its node template and fabric parameters."""

    def __init__(self, cluster: Any, rules: LinkRules | None = None) -> None:
        self.cluster = cluster
        self.rules = rules or LinkRules()
        self.layout = layout = cluster.layout
        self.gpn = int(cluster.gpus_per_node)
        check_node_pairs(self.gpn, getattr(cluster, "name", "cluster"))  # before the per-pair tables (issue 26)
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
        resolved: dict[EdgeAttrs, tuple[float, float]] = {}
        for a in attrs:   # a template repeats a few kinds of link many times
            if a not in resolved:
                resolved[a] = self.rules.of(a)
        self.local_capacity = np.array([resolved[a][0] for a in attrs], dtype=float)
        self.local_latency = np.array([resolved[a][1] for a in attrs], dtype=float)
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
        # record keys: an intra-node hop not through NVSwitches (its template route), a hop through them split
        # in its source half (GPU to switches) and destination half (switches to GPU), a GPU to its NIC and
        # up to the leaf, leaf down to a NIC and on to its GPU
        g = self.gpn
        self._key_tonic0 = g * g
        self._key_in0 = self._key_tonic0 + g
        self._key_up0 = self._key_in0 + g
        self._key_down0 = self._key_up0 + _MAX_SPLITS * g
        self._entries: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._splits: dict[tuple, int] = {}
        self._split_list: list[tuple[tuple[str, float], ...]] = []
        self._pair_code = np.full(g * g, _UNKNOWN, dtype=np.int64)
        """per (a, b) local pair: -2 its own template route, >= 0 the NVSwitch split it uses."""
        self._out_rail: dict[int, int] = {}
        self._fast: dict[int, FastLinks] = {}
        self._route_cache: dict[tuple[int, int], RouteInfo] = {}
        self._proxy_table = np.full(g * max(self.rails, 1), -1, dtype=np.int64)
        self._key_salt = np.zeros(0, dtype=np.uint64)
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
            return self._local_route(*self._keys_route(self._hop_keys(la, lb)))
        rail_b = int(self.gpu_rail[lb])
        proxy = self._proxy(la, rail_b)
        keys = (self._hop_keys(la, proxy) if proxy != la else []) + [self._key_tonic0 + proxy, self._key_in0 + lb]
        ends = self._local_route(*self._keys_route(keys))
        rail_a = int(self.gpu_rail[proxy])
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

    def _hop_keys(self, a: int, b: int) -> list[int]:
        code = int(self._pair_codes(np.array([a * self.gpn + b]))[0])
        if code < 0:
            return [a * self.gpn + b]
        return [self._key_up0 + code * self.gpn + a, self._key_down0 + code * self.gpn + b]

    def _keys_route(self, keys: list[int]) -> tuple[np.ndarray, np.ndarray]:
        parts = [self._entries.get(k) or self._entry(k) for k in keys]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

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
        outs = [(v, layout.edges[(gpu, v)]) for v in layout.adjacency[gpu]
                if layout.edges[(gpu, v)].type in FAST_TYPES]
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

    def route_types(self, src: int, dst: int) -> set[str]:
        """Link types on the route (from its parts, without listing the fabric's paths)."""
        self.cluster._check_rank(int(src))
        self.cluster._check_rank(int(dst))
        (na, la), (nb, lb) = divmod(int(src), self.gpn), divmod(int(dst), self.gpn)
        if src == dst:
            return set()
        if self.torus is not None or na == nb:
            return self.route(src, dst).type_set()
        rail_b = int(self.gpu_rail[lb])
        proxy = self._proxy(la, rail_b)
        keys = (self._hop_keys(la, proxy) if proxy != la else []) + [self._key_tonic0 + proxy, self._key_in0 + lb]
        types = {self.local_types[i] for i in self._keys_route(keys)[0]}
        if self.fat.leaf_of(na, int(self.gpu_rail[proxy])) != self.fat.leaf_of(nb, rail_b):
            types.add(self.fat._switch_link[0].type)
        return types

    # ------------------------------------------------------------------------------------------- loads
    def sec_per_byte(self, flows: Flows | ShiftedFlows) -> float:
        """max over links of (bytes on the link per byte of buffer) / capacity, all flows together; shifted
        flows load the links of every copy (a copy is its representative moved by whole nodes)."""
        sf = flows if isinstance(flows, ShiftedFlows) else ShiftedFlows.plain(flows, self.gpn)
        f = sf.flows
        keep = (f.src != f.dst) & (f.weight > 0)
        if not keep.any():
            return 0.0
        if not keep.all():
            f = Flows(f.src[keep], f.dst[keep], f.weight[keep], f.group[keep])
            sf = ShiftedFlows(f, sf.groups, sf.symmetric)
        if self.torus is not None:
            return self._torus_sec_per_byte(sf.expand())
        ns, ls = np.divmod(f.src, self.gpn)
        nd, ld = np.divmod(f.dst, self.gpn)
        w, cls = f.weight, f.group
        same = ns == nd
        x = ~same
        rail_b = self.gpu_rail[ld[x]]
        if np.any(rail_b < 0):
            raise InputError(f"cluster {self.cluster.name}: a GPU without a NIC receives inter-node traffic")
        proxy = self._proxies(ls[x], rail_b) if x.any() else ls[x]
        hop = proxy != ls[x]     # PXN: first across NVLink to the GPU on the destination's rail
        node, key, weight, rcls = self._hop_records(
            np.concatenate([ns[same], ns[x][hop]]), np.concatenate([ls[same], ls[x][hop]]),
            np.concatenate([ld[same], proxy[hop]]), np.concatenate([w[same], w[x][hop]]),
            np.concatenate([cls[same], cls[x][hop]]))
        node = np.concatenate([node, ns[x], nd[x]])
        key = np.concatenate([key, self._key_tonic0 + proxy, self._key_in0 + ld[x]])
        weight = np.concatenate([weight, w[x], w[x]])
        rcls = np.concatenate([rcls, cls[x], cls[x]])
        ratio = self._node_max(node, key, weight, rcls, sf.groups)
        if not x.any():
            return ratio
        if sf.symmetric:   # each pair once: it leaves one end's blocks and enters the other's
            half = ls[x] + self.gpn * ns[x] < ld[x] + self.gpn * nd[x]
            inter = ShiftedFlows(Flows(ns[x][half], nd[x][half], w[x][half], cls[x][half]), sf.groups, True)
            return max(ratio, self._fat_tree_max(inter, proxy[half], rail_b[half]))
        inter = ShiftedFlows(Flows(ns[x], nd[x], w[x], cls[x]), sf.groups)
        return max(ratio, self._fat_tree_max(inter, proxy, rail_b))

    def _hop_records(self, node: np.ndarray, a: np.ndarray, b: np.ndarray, w: np.ndarray, cls: np.ndarray):
        """Records of intra-node hops a -> b: through NVSwitches one record at each end (the source's lanes
        split the flow over the switches), otherwise the pair's template route."""
        code = self._pair_codes(a * self.gpn + b)
        via = code >= 0
        cv = code[via]
        return (np.concatenate([node[~via], node[via], node[via]]),
                np.concatenate([a[~via] * self.gpn + b[~via], self._key_up0 + cv * self.gpn + a[via],
                                self._key_down0 + cv * self.gpn + b[via]]),
                np.concatenate([w[~via], w[via], w[via]]),
                np.concatenate([cls[~via], cls[via], cls[via]]))

    def _pair_codes(self, pairs: np.ndarray) -> np.ndarray:
        """Code of each local pair (filled as pairs appear, see ``_pair_code``)."""
        seen = np.zeros(len(self._pair_code), dtype=bool)
        seen[pairs] = True
        for p in np.flatnonzero(seen & (self._pair_code == _UNKNOWN)).tolist():
            self._pair_code[p] = self._classify(*divmod(p, self.gpn))
        return self._pair_code[pairs]

    def _classify(self, a: int, b: int) -> int:
        """-2 when GPU a reaches b by a direct NVLink or not over NVLink; else the id of the split of a's
        NVLink lanes over the NVSwitches that also reach b (``tpsim.topology.node._gpu_route``)."""
        layout = self.layout
        ga, gb = layout.gpu(a), layout.gpu(b)
        direct = layout.edges.get((ga, gb))
        if a == b or (direct is not None and direct.type == "nvlink"):
            return _OWN_ROUTE
        switches = [s for s in layout.adjacency[ga] if layout.devices[s]["kind"] == "nvswitch"
                    and layout.edges[(ga, s)].type == "nvlink" and (s, gb) in layout.edges]
        if not switches:
            return _OWN_ROUTE
        lanes = [layout.edges[(ga, s)].lanes for s in switches]
        total = float(sum(lanes))
        split = tuple((s, n / total) for s, n in zip(switches, lanes))
        if split not in self._splits:
            if len(self._split_list) >= _MAX_SPLITS:
                return _OWN_ROUTE
            self._splits[split] = len(self._split_list)
            self._split_list.append(split)
        return self._splits[split]

    # ----------------------------------------------------------------------------------- inside nodes
    def _node_max(self, node: np.ndarray, key: np.ndarray, weight: np.ndarray, cls: np.ndarray,
                  groups: GroupSet) -> float:
        """Largest load / capacity over the node-local links of every node, copies included.

        A *token* is (class, node of its representative): the records a representative leaves on one node.
        Every copy of the class leaves the same records on that node moved by its shift. A node's loads are
        a function of the tokens landing on it, so nodes are told apart by a hash of their tokens and one node
        per distinct set is evaluated."""
        tok_key, tok = _dense_ids(cls * self.num_nodes + node, len(groups.reps) * self.num_nodes)
        tok_cls, tok_node = np.divmod(tok_key, self.num_nodes)
        land_node, land_tok = self._landings(tok_cls, tok_node, groups)
        reps = self._representatives(land_node, self._token_content(tok, key, weight, len(tok_key))[:, land_tok])
        rep_of = np.full(self.num_nodes, -1, dtype=np.int64)
        rep_of[reps] = np.arange(len(reps))
        ri = rep_of[land_node]
        sel = ri >= 0
        pair_rep, pair_tok = ri[sel], land_tok[sel]
        # every record of each (representative node, token) pair: sort only the records of those tokens
        wanted = np.zeros(len(tok_key), dtype=bool)
        wanted[pair_tok] = True
        mine = np.flatnonzero(wanted[tok])
        order = mine[np.argsort(tok[mine], kind="stable")]
        counts = np.bincount(tok[mine], minlength=len(tok_key))
        first = np.cumsum(counts) - counts
        owner, offset = _spread_counts(counts[pair_tok])
        rec = order[first[pair_tok][owner] + offset]
        combo, inv = np.unique(pair_rep[owner] * _KEY_SPAN + key[rec], return_inverse=True)
        wsum = np.bincount(inv.ravel(), weights=weight[rec], minlength=len(combo))
        rep_idx, keys = np.divmod(combo, _KEY_SPAN)
        edges, fracs, own = self._expand(keys)
        loads = np.bincount(rep_idx[own] * self.num_local + edges, weights=wsum[own] * fracs,
                            minlength=len(reps) * self.num_local)
        return float(np.max(loads.reshape(len(reps), self.num_local) / self.local_capacity))

    def _landings(self, tok_cls: np.ndarray, tok_node: np.ndarray, groups: GroupSet):
        """(node, token) of every copy of every token."""
        which = groups.class_shift[tok_cls]
        nodes, toks = [], []
        for k, shifts in enumerate(groups.shift_sets):
            t = np.flatnonzero(which == k)
            if len(t):
                nodes.append((tok_node[t][:, None] + (shifts // self.gpn)[None, :]).ravel())
                toks.append(np.repeat(t, len(shifts)))
        return np.concatenate(nodes), np.concatenate(toks)

    def _token_content(self, tok: np.ndarray, key: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
        """Two 30-bit-part sums per token of a hash of its records (key, weight): tokens that leave the same
        records get the same values (a ring's inner nodes are all alike), so their nodes are told apart
        only by what lands on them."""
        h = self._key_hash(int(key.max()) + 1)[key] ^ (weight.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
        out = np.empty((2, n))
        out[0] = np.bincount(tok, weights=(h >> np.uint64(34)).astype(float), minlength=n)
        out[1] = np.bincount(tok, weights=(h & np.uint64((1 << 30) - 1)).astype(float), minlength=n)
        return out

    def _key_hash(self, size: int) -> np.ndarray:
        """A fixed random 64-bit value per record key (grown as keys appear)."""
        if len(self._key_salt) < size:
            self._key_salt = _splitmix64(np.arange(max(size, 2 * len(self._key_salt)), dtype=np.uint64)
                                         + np.uint64(0x5EED))
        return self._key_salt

    def _representatives(self, node: np.ndarray, content: np.ndarray) -> np.ndarray:
        """One node per distinct multiset of landing token contents (every loaded node when there are few).
        Sums of the tokens' 30-bit-part sums stay exact in float64 (fewer than 2**23 records per node)."""
        touched = np.bincount(node, minlength=self.num_nodes) > 0
        if self.num_nodes < _DEDUP_MIN_NODES:
            return np.flatnonzero(touched)
        sums = [np.bincount(node, weights=c, minlength=self.num_nodes) for c in content]
        mixed = [_splitmix64(x.astype(np.uint64)) for x in sums]
        sig = (mixed[0] ^ (mixed[1] * np.uint64(0xD6E8FEB86659FD93))).view(np.int64)
        nodes = np.flatnonzero(touched)
        _, first = np.unique(sig[nodes], return_index=True)
        return nodes[np.sort(first)]

    def _expand(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(local edge, fraction, index into ``keys``) of every template-route entry of ``keys`` (each
        distinct key's entries looked up once)."""
        uk, inv = np.unique(keys, return_inverse=True)
        inv = inv.ravel()
        parts = [self._entries.get(k) or self._entry(k) for k in uk.tolist()]
        lens = np.array([len(e) for e, _ in parts], dtype=np.int64)
        if not lens.sum():
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        flat_e = np.concatenate([e for e, _ in parts])
        flat_f = np.concatenate([f for _, f in parts])
        starts = np.cumsum(lens) - lens
        own, off = _spread_counts(lens[inv])
        pos = starts[inv][own] + off
        return flat_e[pos], flat_f[pos], own

    def _entry(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Local edges and fractions of one record key (see the key layout in ``__init__``)."""
        layout, g = self.layout, self.gpn
        ids = self.edge_ids
        if key < self._key_tonic0:      # a pair's own template route
            a, b = divmod(key, g)
            route = layout.gpu_route(a, b)
            idx = [ids[e] for f, path in route for e in path]
            frac = [f for f, path in route for _ in path]
        elif key < self._key_in0:       # GPU to its NIC, NIC up to the leaf
            a = key - self._key_tonic0
            route = layout.to_nic(a)
            idx = [ids[e] for f, path in route for e in path] + [self._nic_edge0 + int(self.gpu_rail[a])]
            frac = [f for f, path in route for _ in path] + [1.0]
        elif key < self._key_up0:       # leaf down to a NIC, NIC to its GPU
            b = key - self._key_in0
            route = layout.from_nic(b)
            idx = [self._nic_edge0 + self.rails + int(self.gpu_rail[b])] + [ids[e] for f, path in route for e in path]
            frac = [1.0] + [f for f, path in route for _ in path]
        elif key < self._key_down0:     # GPU up to the NVSwitches
            split, a = divmod(key - self._key_up0, g)
            idx = [ids[(layout.gpu(a), sw)] for sw, _ in self._split_list[split]]
            frac = [f for _, f in self._split_list[split]]
        else:                           # NVSwitches down to a GPU
            split, b = divmod(key - self._key_down0, g)
            idx = [ids[(sw, layout.gpu(b))] for sw, _ in self._split_list[split]]
            frac = [f for _, f in self._split_list[split]]
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
        caps: dict[int, float] = {}
        cap = lambda lanes: caps.get(lanes) or caps.setdefault(lanes, self.rules.of(link_attrs(kind, lanes, eff,
                                                                                               cal))[0])
        self._ratios: list[tuple[str, float]] = []
        for level in fat.block_levels():
            self._ratios.append((level.name, max(share / cap(lanes) for share, lanes in set(level.uplinks))))

    def _fat_tree_max(self, inter: ShiftedFlows, proxy: np.ndarray, rail_b: np.ndarray) -> float:
        """Largest switch-link load / capacity: per level, the traffic leaving / entering each block, every
        copy of the inter-node flows (``src``/``dst`` are nodes here) at its own place in the fabric."""
        fat = self.fat
        f = inter.flows
        rail_a = self.gpu_rail[proxy]
        which = inter.groups.class_shift[f.group]
        la, lb, w = [], [], []
        small = self.num_nodes * max(self.rails, 1) < 2 ** 31 // 4   # leaf arithmetic fits in int32
        dtype = np.int32 if small else np.int64
        for k, shifts in enumerate(inter.groups.shift_sets):
            sel = np.flatnonzero(which == k)
            if not len(sel):
                continue
            q = (shifts // self.gpn).astype(dtype)[None, :]
            la.append(fat.leaf_of(f.src[sel].astype(dtype)[:, None] + q, rail_a[sel].astype(dtype)[:, None]).ravel())
            lb.append(fat.leaf_of(f.dst[sel].astype(dtype)[:, None] + q, rail_b[sel].astype(dtype)[:, None]).ravel())
            w.append(np.repeat(f.weight[sel], len(shifts)))
        la, lb, w = np.concatenate(la), np.concatenate(lb), np.concatenate(w)
        best = 0.0
        for level, (name, ratio) in zip(fat.block_levels(), self._ratios):
            ba, bb = level.block(la), level.block(lb)
            x = ba != bb
            if not x.any():
                break
            wx = w[x]
            if inter.symmetric:   # out of a block = into it: both ends of each pair in one histogram
                most = np.bincount(np.concatenate([ba[x], bb[x]]), weights=np.concatenate([wx, wx])).max()
            else:
                most = max(np.bincount(ba[x], weights=wx).max(), np.bincount(bb[x], weights=wx).max())
            best = max(best, float(most) * ratio)
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


def _spread_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, offset): each i repeated ``counts[i]`` times with offsets 0..counts[i] - 1."""
    owner = np.repeat(np.arange(len(counts)), counts)
    offset = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, offset


def _dense_ids(values: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, index of each value among them), like ``np.unique(return_inverse=True)``
    but by counting when the values lie in ``[0, span)`` with a small span (no sort)."""
    if span > max(1 << 16, 8 * len(values)):
        uniq, inv = np.unique(values, return_inverse=True)
        return uniq, inv.ravel()
    present = np.zeros(span, dtype=bool)
    present[values] = True
    index = np.cumsum(present) - 1
    return np.flatnonzero(present), index[values]
