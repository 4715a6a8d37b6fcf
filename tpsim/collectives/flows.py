"""Logical hops of each collective algorithm, for every concurrent group at once, as numpy arrays.

A *flow* is ``(src rank, dst rank, weight)``: a hop carrying ``weight`` bytes per byte of the collective's
buffer. The routers (:mod:`tpsim.collectives.fabric` on the full graph, :mod:`tpsim.collectives.structure` on
the cluster's structure) turn flows into link loads; the algorithms here only say who sends what to whom.

Groups are first split by node (:class:`Segments`): each group's ranks by node, nodes in order of first
appearance, ranks in a node by local index (NCCL's view of a communicator). Groups whose every node holds the
same number of ranks k (almost all plan layouts) are stacked into arrays ``(groups, nodes, k)`` and their flows
built without a Python loop over ranks; other groups go through the same formulas one by one.

Identical flows are merged where that keeps the arrays small (a ring's k rotations share their hops inside a
node); loads are linear in the flows, so this changes no link load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

PerNode = list[list[int]]


@dataclass(frozen=True)
class Flows:
    """Flows as three equal-length arrays."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    """bytes per byte of the collective's buffer."""

    @staticmethod
    def empty() -> "Flows":
        return Flows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))

    @staticmethod
    def of(src, dst, weight) -> "Flows":
        """Flows from array-likes (``weight`` may be a scalar)."""
        s = np.asarray(src, dtype=np.int64).ravel()
        d = np.asarray(dst, dtype=np.int64).ravel()
        w = np.broadcast_to(np.asarray(weight, dtype=float), s.shape).ravel()
        return Flows(s, d, np.ascontiguousarray(w))

    @staticmethod
    def concat(parts: Sequence["Flows"]) -> "Flows":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Flows.empty()
        if len(parts) == 1:
            return parts[0]
        return Flows(np.concatenate([p.src for p in parts]), np.concatenate([p.dst for p in parts]),
                     np.concatenate([p.weight for p in parts]))

    @staticmethod
    def from_list(flows: Sequence[tuple[int, int, float]]) -> "Flows":
        if not flows:
            return Flows.empty()
        s, d, w = zip(*flows)
        return Flows.of(s, d, w)

    def __len__(self) -> int:
        return int(self.src.size)


# ------------------------------------------------------------------------------------------------ segments
@dataclass(frozen=True)
class Segments:
    """Groups split by node. ``blocks``: arrays ``(groups, nodes, k)`` of ranks (one array per distinct
    (nodes, k)); ``ragged``: per-node rank lists of groups whose nodes hold different numbers of ranks."""

    blocks: tuple[np.ndarray, ...]
    ragged: tuple[PerNode, ...]

    @property
    def nodes(self) -> int:
        """Most nodes one group spans."""
        return max([b.shape[1] for b in self.blocks] + [len(p) for p in self.ragged])

    @property
    def uniform(self) -> int:
        """Ranks per node when every node of every group holds the same number, else 0."""
        if self.ragged:
            return 0
        ks = {b.shape[2] for b in self.blocks}
        return ks.pop() if len(ks) == 1 else 0

    def per_node(self) -> list[PerNode]:
        """Every group as a list of per-node rank lists (for the few callers that walk groups one by one)."""
        out = [[list(map(int, m)) for m in g] for b in self.blocks for g in b]
        return out + [list(p) for p in self.ragged]


def split_by_node(groups: np.ndarray, node: np.ndarray, local: np.ndarray) -> Segments:
    """:class:`Segments` of ``groups`` (array ``(G, n)``), given each rank's ``node`` and ``local`` index
    (same shape). Rows whose ranks already run node by node in local order (every layout's groups) are cut
    without a Python loop."""
    g, n = groups.shape
    if n == 1:
        return Segments((groups.reshape(g, 1, 1),), ())
    same = node[:, 1:] == node[:, :-1]
    ordered = np.all((node[:, 1:] > node[:, :-1]) | (same & (local[:, 1:] > local[:, :-1])), axis=1)
    changes = (~same).sum(axis=1)
    blocks: list[np.ndarray] = []
    rest = np.flatnonzero(~ordered).tolist()
    for j in np.unique(changes[ordered] + 1, return_index=True)[0]:   # (indices: numpy skips np.ma)
        rows = np.flatnonzero(ordered & (changes + 1 == j))
        j = int(j)
        if n % j == 0:
            k = n // j
            nodes = node[rows].reshape(len(rows), j, k)
            regular = np.all(nodes == nodes[:, :, :1], axis=(1, 2))
            if regular.any():
                blocks.append(groups[rows[regular]].reshape(-1, j, k))
            rest += rows[~regular].tolist()
        else:
            rest += rows.tolist()
    ragged: list[PerNode] = []
    extra: dict[tuple[int, int], list[PerNode]] = {}
    for i in sorted(rest):
        p = _per_node_python(groups[i], node[i], local[i])
        sizes = {len(m) for m in p}
        if len(sizes) == 1:
            extra.setdefault((len(p), sizes.pop()), []).append(p)
        else:
            ragged.append(p)
    blocks += [np.asarray(v, dtype=np.int64) for v in extra.values()]
    return Segments(tuple(blocks), tuple(ragged))


def _per_node_python(group: np.ndarray, node: np.ndarray, local: np.ndarray) -> PerNode:
    """The group's ranks by node (nodes in order of first appearance), each sorted by local index."""
    by_node: dict[int, list[tuple[int, int]]] = {}
    for r, nd, lc in zip(group.tolist(), node.tolist(), local.tolist()):
        by_node.setdefault(nd, []).append((lc, r))
    return [[r for _, r in sorted(m)] for m in by_node.values()]


# ------------------------------------------------------------------------------------------------- rings
def ring_flows(seg: Segments, chain: bool = False) -> Flows:
    """NCCL-like rings: one ring inside a node; across nodes one ring per local position c (k rings, each
    carrying 1/k of the data), entering node j at its c-th GPU and leaving on the same rail (odd nodes walk
    backwards) so every node-to-node hop stays on one rail. ``chain``: without the closing hop (broadcast's
    pipelined chain). Hop traffic is 1 per ring (the algorithm's factor is applied by the caller)."""
    parts = [_ring_block(b, chain) for b in seg.blocks]
    parts += [Flows.from_list(_ring_python(p, chain)) for p in seg.ragged]
    return Flows.concat(parts)


def _ring_block(s: np.ndarray, chain: bool) -> Flows:
    g, j, k = s.shape
    if j == 1:
        m = s[:, 0, :]
        hops = k - 1 if chain else k
        return Flows.of(m[:, :hops], np.roll(m, -1, axis=1)[:, :hops], 1.0)
    parts = []
    nxt = np.roll(s, -1, axis=2)
    if k > 1:
        # the k rotations share every in-node hop but the one they enter by: (k - 1) / k of the data each
        even = np.arange(j) % 2 == 0
        src = np.where(even[None, :, None], s, nxt)
        dst = np.where(even[None, :, None], nxt, s)
        parts.append(Flows.of(src, dst, (k - 1) / k))
    # ring c leaves node j at position c - 1 (even j) or c (odd j) and enters node j + 1 at position c (even
    # j + 1) or c - 1 (odd j + 1)
    c = np.arange(k)
    exit_pos = np.where(np.arange(j)[:, None] % 2 == 0, (c - 1) % k, c)   # (j, k)
    entry_pos = np.where(np.arange(j)[:, None] % 2 == 0, c, (c - 1) % k)
    jj = np.arange(j)[:, None]
    exits = s[:, jj, exit_pos]          # (g, j, k)
    entries = s[:, jj, entry_pos]
    hops = j - 1 if chain else j
    parts.append(Flows.of(exits[:, :hops], np.roll(entries, -1, axis=1)[:, :hops], 1.0 / k))
    return Flows.concat(parts)


def ring_orders(per_node: PerNode) -> list[list[int]]:
    """The rings of one group (see :func:`ring_flows`)."""
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


def _ring_python(per_node: PerNode, chain: bool) -> list[tuple[int, int, float]]:
    flows = []
    rings = ring_orders(per_node)
    for ring in rings:
        hops = len(ring) - 1 if chain else len(ring)
        flows += [(ring[i], ring[(i + 1) % len(ring)], 1.0 / len(rings)) for i in range(hops)]
    return flows


# ------------------------------------------------------------------------------------------------- trees
def tree_flows(seg: Segments) -> Flows:
    """Double binary tree (NCCL): a chain inside each node, binary trees over the nodes, the second tree
    mirrored; each tree carries half the buffer up (reduce) and down (broadcast). Across nodes there is one
    tree pair per local position c (chains rotated to start at the c-th GPU, so the trees use every NIC, as
    NCCL's channels do), each with 1/ppn of the data."""
    parts = [_tree_block(b) for b in seg.blocks]
    parts += [Flows.from_list(_tree_python(p)) for p in seg.ragged]
    return Flows.concat(parts)


def _tree_block(s: np.ndarray) -> Flows:
    g, j, k = s.shape
    if j == 1:
        m = s[:, 0, :]
        second = np.concatenate([m[:, :1], m[:, 1:][:, ::-1]], axis=1)
        pairs = [(m[:, :-1], m[:, 1:]), (second[:, :-1], second[:, 1:])]
        return Flows.concat([Flows.of(a, b, 0.5) for a, b in pairs] + [Flows.of(b, a, 0.5) for a, b in pairs])
    parts = []
    if k > 1:
        # summed over the 2k rotated chains, every cyclically adjacent pair of a node carries (k - 1) / k
        nxt = np.roll(s, -1, axis=2)
        parts += [Flows.of(s, nxt, (k - 1) / k), Flows.of(nxt, s, (k - 1) / k)]
    share = 0.5 / k
    child = np.arange(1, j)
    parent = (child - 1) // 2
    for order_child, order_parent in ((child, parent), (j - 1 - child, j - 1 - parent)):
        heads_c = s[:, order_child, :]   # head of rotation c in node x is its c-th rank
        heads_p = s[:, order_parent, :]
        parts += [Flows.of(heads_c, heads_p, share), Flows.of(heads_p, heads_c, share)]
    return Flows.concat(parts)


def _tree_python(p: PerNode) -> list[tuple[int, int, float]]:
    flows: list[tuple[int, int, float]] = []
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


# ------------------------------------------------------------------------------------------ point to point
def all_to_all_flows(groups: np.ndarray) -> Flows:
    """Direct all-to-all: every rank sends 1/n of its buffer to each of the n - 1 others."""
    g, n = groups.shape
    a, b = np.nonzero(~np.eye(n, dtype=bool))
    return Flows.of(groups[:, a], groups[:, b], 1.0 / n)


def chain_flows(groups: np.ndarray) -> Flows:
    """Point-to-point along each group (rank i to rank i + 1, as a pipeline's stages): one message each."""
    return Flows.of(groups[:, :-1], groups[:, 1:], 1.0)


def hierarchical_groups(seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """(intra-node groups, inter-node groups) of a layout whose every node holds k ranks of a group: the
    node segments, and per group and local position the ranks at that position in each node."""
    blocks = seg.blocks
    intra = np.concatenate([b.reshape(-1, b.shape[2]) for b in blocks])
    inter = np.concatenate([b.transpose(0, 2, 1).reshape(-1, b.shape[1]) for b in blocks])
    return intra, inter


def stacked(seg: Segments, fn: Callable[[np.ndarray], Flows]) -> Flows:
    """``fn`` over every block of ``seg`` (helper for algorithms defined on blocks)."""
    return Flows.concat([fn(b) for b in seg.blocks])
