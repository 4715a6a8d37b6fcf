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
from typing import Sequence

import numpy as np

PerNode = list[list[int]]


@dataclass(frozen=True)
class Flows:
    """Flows as equal-length arrays."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    """bytes per byte of the collective's buffer."""
    group: np.ndarray | None = None
    """the row of the groups array each flow belongs to (None when unknown)."""

    @staticmethod
    def empty() -> "Flows":
        return Flows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))

    @staticmethod
    def of(src, dst, weight, group=None) -> "Flows":
        """Flows from array-likes (``weight`` and ``group`` broadcast to the shape of ``src``)."""
        src = np.asarray(src, dtype=np.int64)
        s = src.ravel()
        d = np.asarray(dst, dtype=np.int64).ravel()
        w = np.broadcast_to(np.asarray(weight, dtype=float), src.shape).ravel()
        g = None if group is None else np.broadcast_to(np.asarray(group, dtype=np.int64), src.shape).ravel()
        return Flows(s, d, np.ascontiguousarray(w), None if g is None else np.ascontiguousarray(g))

    @staticmethod
    def concat(parts: Sequence["Flows"]) -> "Flows":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Flows.empty()
        if len(parts) == 1:
            return parts[0]
        group = (np.concatenate([p.group for p in parts]) if all(p.group is not None for p in parts) else None)
        return Flows(np.concatenate([p.src for p in parts]), np.concatenate([p.dst for p in parts]),
                     np.concatenate([p.weight for p in parts]), group)

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
class Ragged:
    """Groups whose nodes hold different numbers of ranks, flattened: every group's ranks node by node (each
    node's in local order), cut into segments (one per group and node)."""

    ranks: np.ndarray
    group_rows: np.ndarray
    """the row of the groups array of each ragged group."""
    seg_start: np.ndarray
    """index in ``ranks`` of each segment's first rank."""
    seg_size: np.ndarray
    seg_group: np.ndarray
    seg_ordinal: np.ndarray
    """position of the segment's node among its group's nodes (order of first appearance)."""
    group_first: np.ndarray
    """index of each group's first segment."""
    group_nodes: np.ndarray
    group_ppn: np.ndarray
    """fewest ranks on one node of the group (NCCL's rings and trees per local position)."""

    @staticmethod
    def of(per_node: Sequence[PerNode], rows: Sequence[int] | None = None) -> "Ragged":
        sizes = [len(m) for p in per_node for m in p]
        ranks = np.fromiter((r for p in per_node for m in p for r in m), dtype=np.int64, count=sum(sizes))
        seg_group = np.repeat(np.arange(len(per_node)), [len(p) for p in per_node])
        rows = np.arange(len(per_node)) if rows is None else np.asarray(rows, dtype=np.int64)
        return Ragged.from_cuts(ranks, np.asarray(sizes, dtype=np.int64), seg_group, rows)

    @staticmethod
    def from_cuts(ranks: np.ndarray, seg_size: np.ndarray, seg_group: np.ndarray,
                  group_rows: np.ndarray) -> "Ragged":
        seg_start = np.concatenate([[0], np.cumsum(seg_size)[:-1]]).astype(np.int64)
        group_nodes = np.bincount(seg_group)
        group_first = np.concatenate([[0], np.cumsum(group_nodes)[:-1]]).astype(np.int64)
        seg_ordinal = np.arange(len(seg_size)) - group_first[seg_group]
        ppn = np.full(len(group_nodes), np.iinfo(np.int64).max)
        np.minimum.at(ppn, seg_group, seg_size)
        return Ragged(ranks, np.asarray(group_rows, dtype=np.int64), seg_start, seg_size.astype(np.int64),
                      seg_group, seg_ordinal, group_first, group_nodes, ppn)

    def __len__(self) -> int:
        return len(self.group_nodes)

    def per_node(self) -> list[PerNode]:
        out: list[PerNode] = [[] for _ in range(len(self))]
        for g, a, n in zip(self.seg_group.tolist(), self.seg_start.tolist(), self.seg_size.tolist()):
            out[g].append(self.ranks[a:a + n].tolist())
        return out


@dataclass(frozen=True)
class Segments:
    """Groups split by node. ``blocks``: arrays ``(groups, nodes, k)`` of ranks (one array per distinct
    (nodes, k)); ``ragged``: groups whose nodes hold different numbers of ranks (None if there are none)."""

    blocks: tuple[np.ndarray, ...]
    rows: tuple[np.ndarray, ...]
    """the row of the groups array of each group of each block."""
    ragged: Ragged | None = None

    @property
    def nodes(self) -> int:
        """Most nodes one group spans."""
        extra = [int(self.ragged.group_nodes.max())] if self.ragged is not None else []
        return max([b.shape[1] for b in self.blocks] + extra)

    @property
    def uniform(self) -> int:
        """Ranks per node when every node of every group holds the same number, else 0."""
        if self.ragged is not None:
            return 0
        ks = {b.shape[2] for b in self.blocks}
        return ks.pop() if len(ks) == 1 else 0

    def per_node(self) -> list[PerNode]:
        """Every group as a list of per-node rank lists (for the few callers that walk groups one by one)."""
        out = [[list(map(int, m)) for m in g] for b in self.blocks for g in b]
        return out + (self.ragged.per_node() if self.ragged is not None else [])

    @staticmethod
    def one_node(groups: np.ndarray) -> "Segments":
        """Groups taken as one node each (a ring in the given order)."""
        return Segments((groups[:, None, :],), (np.arange(len(groups)),))


def split_by_node(groups: np.ndarray, node: np.ndarray, local: np.ndarray) -> Segments:
    """:class:`Segments` of ``groups`` (array ``(G, n)``), given each rank's ``node`` and ``local`` index
    (same shape). Rows whose ranks already run node by node in local order (every layout's groups) are cut
    without a Python loop; others are put in that order first."""
    g, n = groups.shape
    if n == 1:
        return Segments((groups.reshape(g, 1, 1),), (np.arange(g),))
    same = node[:, 1:] == node[:, :-1]
    ordered = np.all((node[:, 1:] > node[:, :-1]) | (same & (local[:, 1:] > local[:, :-1])), axis=1)
    changes = (~same).sum(axis=1)
    blocks: list[np.ndarray] = []
    block_rows: list[np.ndarray] = []
    irregular: list[np.ndarray] = []
    for j in np.unique(changes[ordered] + 1, return_index=True)[0]:   # (indices: numpy skips np.ma)
        rows = np.flatnonzero(ordered & (changes + 1 == j))
        j = int(j)
        if n % j == 0:
            k = n // j
            nodes = node[rows].reshape(len(rows), j, k)
            regular = np.all(nodes == nodes[:, :, :1], axis=(1, 2))
            if regular.any():
                blocks.append(groups[rows[regular]].reshape(-1, j, k))
                block_rows.append(rows[regular])
            irregular.append(rows[~regular])
        else:
            irregular.append(rows)
    rows = np.concatenate(irregular) if irregular else np.zeros(0, np.int64)
    ragged = [_ragged_ordered(groups[rows], node[rows], rows)] if len(rows) else []
    extra: dict[tuple[int, int], list[tuple[int, PerNode]]] = {}
    unordered: list[tuple[int, PerNode]] = []
    for i in np.flatnonzero(~ordered).tolist():
        p = _per_node_python(groups[i], node[i], local[i])
        sizes = {len(m) for m in p}
        if len(sizes) == 1:
            extra.setdefault((len(p), sizes.pop()), []).append((i, p))
        else:
            unordered.append((i, p))
    for v in extra.values():
        blocks.append(np.asarray([p for _, p in v], dtype=np.int64))
        block_rows.append(np.asarray([i for i, _ in v], dtype=np.int64))
    if unordered:
        ragged.append(Ragged.of([p for _, p in unordered], [i for i, _ in unordered]))
    return Segments(tuple(blocks), tuple(block_rows), _join(ragged))


def _ragged_ordered(groups: np.ndarray, node: np.ndarray, rows: np.ndarray) -> Ragged:
    """Ragged segments of rows already in node-by-node, local order: a cut wherever the node changes."""
    g, n = groups.shape
    cut = np.ones((g, n), dtype=bool)
    cut[:, 1:] = node[:, 1:] != node[:, :-1]
    starts = np.flatnonzero(cut.ravel())
    sizes = np.diff(np.append(starts, g * n))
    return Ragged.from_cuts(groups.ravel().copy(), sizes, starts // n, rows)


def _join(parts: list[Ragged]) -> Ragged | None:
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    offset = np.cumsum([0] + [len(p) for p in parts[:-1]])
    return Ragged.from_cuts(np.concatenate([p.ranks for p in parts]), np.concatenate([p.seg_size for p in parts]),
                            np.concatenate([p.seg_group + o for p, o in zip(parts, offset)]),
                            np.concatenate([p.group_rows for p in parts]))


def _per_node_python(group: np.ndarray, node: np.ndarray, local: np.ndarray) -> PerNode:
    """The group's ranks by node (nodes in order of first appearance), each sorted by local index."""
    by_node: dict[int, list[tuple[int, int]]] = {}
    for r, nd, lc in zip(group.tolist(), node.tolist(), local.tolist()):
        by_node.setdefault(nd, []).append((lc, r))
    return [[r for _, r in sorted(m)] for m in by_node.values()]


def _spread(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, index) pairs: ``owner`` repeated ``counts[owner]`` times with index 0..counts - 1."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    index = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, index


# ------------------------------------------------------------------------------------------------- rings
def ring_flows(seg: Segments, chain: bool = False) -> Flows:
    """NCCL-like rings: one ring inside a node; across nodes one ring per local position c (k rings, each
    carrying 1/k of the data), entering node j at its c-th GPU and leaving on the same rail (odd nodes walk
    backwards) so every node-to-node hop stays on one rail. ``chain``: without the closing hop (broadcast's
    pipelined chain). Hop traffic is 1 per ring (the algorithm's factor is applied by the caller)."""
    parts = [_ring_block(b, rows, chain) for b, rows in zip(seg.blocks, seg.rows)]
    if seg.ragged is not None:
        parts.append(_ring_ragged(seg.ragged, chain))
    return Flows.concat(parts)


def _ring_block(s: np.ndarray, rows: np.ndarray, chain: bool) -> Flows:
    g, j, k = s.shape
    if j == 1:
        m = s[:, 0, :]
        hops = k - 1 if chain else k
        return Flows.of(m[:, :hops], np.roll(m, -1, axis=1)[:, :hops], 1.0, rows[:, None])
    parts = []
    nxt = np.roll(s, -1, axis=2)
    if k > 1:
        # the k rotations share every in-node hop but the one they enter by: (k - 1) / k of the data each
        even = np.arange(j) % 2 == 0
        src = np.where(even[None, :, None], s, nxt)
        dst = np.where(even[None, :, None], nxt, s)
        parts.append(Flows.of(src, dst, (k - 1) / k, rows[:, None, None]))
    # ring c leaves node j at position c - 1 (even j) or c (odd j) and enters node j + 1 at position c (even
    # j + 1) or c - 1 (odd j + 1)
    c = np.arange(k)
    exit_pos = np.where(np.arange(j)[:, None] % 2 == 0, (c - 1) % k, c)   # (j, k)
    entry_pos = np.where(np.arange(j)[:, None] % 2 == 0, c, (c - 1) % k)
    jj = np.arange(j)[:, None]
    exits = s[:, jj, exit_pos]          # (g, j, k)
    entries = s[:, jj, entry_pos]
    hops = j - 1 if chain else j
    parts.append(Flows.of(exits[:, :hops], np.roll(entries, -1, axis=1)[:, :hops], 1.0 / k, rows[:, None, None]))
    return Flows.concat(parts)


def _ring_ragged(rg: Ragged, chain: bool) -> Flows:
    """:func:`_ring_block` for groups with different numbers of ranks per node (same rings: ring c enters
    every node at its c-th rank, c < the group's fewest ranks on a node)."""
    nodes = rg.group_nodes[rg.seg_group]
    ppn = rg.group_ppn[rg.seg_group]
    parts = []
    # in-node hops: a one-node group is one ring; across nodes, hop i -> i + 1 of a node with s ranks is
    # taken by every ring c < ppn but the one entering at i + 1
    seg, i = _spread(rg.seg_size)
    s = rg.seg_size[seg]
    single = nodes[seg] == 1
    keep = ~single | (i < s - 1) | (not chain)
    seg, i, s, single = seg[keep], i[keep], s[keep], single[keep]
    a = rg.ranks[rg.seg_start[seg] + i]
    b = rg.ranks[rg.seg_start[seg] + (i + 1) % s]
    p = ppn[seg]
    w = np.where(single, 1.0, (p - ((i + 1) % s < p)) / p)
    odd = (rg.seg_ordinal[seg] % 2 == 1) & ~single
    parts.append(Flows.of(np.where(odd, b, a), np.where(odd, a, b), w, rg.group_rows[rg.seg_group[seg]]))
    # node-to-node hops of ring c: leave node j at c - 1 (even j) or c (odd j), enter j + 1 at c or c - 1
    seg, c = _spread(np.where(nodes > 1, ppn, 0))
    j = rg.seg_ordinal[seg]
    g = rg.seg_group[seg]
    last = j == rg.group_nodes[g] - 1
    if chain:
        seg, c, j, g, last = seg[~last], c[~last], j[~last], g[~last], last[~last]
    nxt = rg.group_first[g] + (j + 1) % rg.group_nodes[g]
    s, s2 = rg.seg_size[seg], rg.seg_size[nxt]
    exit_pos = np.where(j % 2 == 0, (c - 1) % s, c)
    entry_pos = np.where(((j + 1) % rg.group_nodes[g]) % 2 == 0, c, (c - 1) % s2)
    parts.append(Flows.of(rg.ranks[rg.seg_start[seg] + exit_pos], rg.ranks[rg.seg_start[nxt] + entry_pos],
                          1.0 / rg.group_ppn[g], rg.group_rows[g]))
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
    parts = [_tree_block(b, rows) for b, rows in zip(seg.blocks, seg.rows)]
    if seg.ragged is not None:
        parts.append(_tree_ragged(seg.ragged))
    return Flows.concat(parts)


def _tree_block(s: np.ndarray, rows: np.ndarray) -> Flows:
    g, j, k = s.shape
    if j == 1:
        m = s[:, 0, :]
        second = np.concatenate([m[:, :1], m[:, 1:][:, ::-1]], axis=1)
        pairs = [(m[:, :-1], m[:, 1:]), (second[:, :-1], second[:, 1:])]
        r = rows[:, None]
        return Flows.concat([Flows.of(a, b, 0.5, r) for a, b in pairs] + [Flows.of(b, a, 0.5, r) for a, b in pairs])
    parts = []
    r = rows[:, None, None]
    if k > 1:
        # summed over the 2k rotated chains, every cyclically adjacent pair of a node carries (k - 1) / k
        nxt = np.roll(s, -1, axis=2)
        parts += [Flows.of(s, nxt, (k - 1) / k, r), Flows.of(nxt, s, (k - 1) / k, r)]
    share = 0.5 / k
    child = np.arange(1, j)
    parent = (child - 1) // 2
    for order_child, order_parent in ((child, parent), (j - 1 - child, j - 1 - parent)):
        heads_c = s[:, order_child, :]   # head of rotation c in node x is its c-th rank
        heads_p = s[:, order_parent, :]
        parts += [Flows.of(heads_c, heads_p, share, r), Flows.of(heads_p, heads_c, share, r)]
    return Flows.concat(parts)


def _tree_ragged(rg: Ragged) -> Flows:
    """:func:`_tree_block` for groups with different numbers of ranks per node."""
    nodes = rg.group_nodes[rg.seg_group]
    ppn = rg.group_ppn[rg.seg_group]
    parts = []
    # one-node groups: the chain and its mirror, half the buffer each
    seg, i = _spread(np.where(nodes == 1, rg.seg_size - 1, 0))
    start, s = rg.seg_start[seg], rg.seg_size[seg]
    row = rg.group_rows[rg.seg_group[seg]]
    first = rg.ranks[start + i], rg.ranks[start + i + 1]
    second = (rg.ranks[start + np.where(i == 0, 0, s - i)], rg.ranks[start + s - 1 - i])
    for a, b in (first, second):
        parts += [Flows.of(a, b, 0.5, row), Flows.of(b, a, 0.5, row)]
    # across nodes: cyclic neighbours i, i + 1 of a node with s ranks are adjacent in the rotated chains of
    # 2 ppn - [i + 1 < ppn] - [i < ppn] of the 2 ppn (rotation, mirror) pairs, each with 0.5 / ppn
    seg, i = _spread(np.where((nodes > 1) & (rg.seg_size > 1), rg.seg_size, 0))
    start, s, p = rg.seg_start[seg], rg.seg_size[seg], ppn[seg]
    w = (2 * p - ((i + 1) % s < p) - (i < p)) * 0.5 / p
    a, b = rg.ranks[start + i], rg.ranks[start + (i + 1) % s]
    row = rg.group_rows[rg.seg_group[seg]]
    parts += [Flows.of(a, b, w, row), Flows.of(b, a, w, row)]
    # the trees over the nodes, one pair per rank position c < ppn: heads are each node's c-th rank
    multi = rg.group_nodes > 1
    g, x = _spread(np.where(multi, rg.group_nodes - 1, 0))
    x = x + 1
    jn = rg.group_nodes[g]
    g2, c = _spread(rg.group_ppn[g])      # every (group, child) pair times every rotation c
    g, x, jn = g[g2], x[g2], jn[g2]
    share = 0.5 / rg.group_ppn[g]
    head = lambda ordinal: rg.ranks[rg.seg_start[rg.group_first[g] + ordinal] + c]
    row = rg.group_rows[g]
    for child, parent in ((x, (x - 1) // 2), (jn - 1 - x, jn - 1 - (x - 1) // 2)):
        hc, hp = head(child), head(parent)
        parts += [Flows.of(hc, hp, share, row), Flows.of(hp, hc, share, row)]
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
    return Flows.of(groups[:, a], groups[:, b], 1.0 / n, np.arange(g)[:, None])


def chain_flows(groups: np.ndarray) -> Flows:
    """Point-to-point along each group (rank i to rank i + 1, as a pipeline's stages): one message each."""
    return Flows.of(groups[:, :-1], groups[:, 1:], 1.0, np.arange(len(groups))[:, None])


def hierarchical_groups(seg: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(intra-node groups, their rows, inter-node groups, their rows) of a layout whose every node holds k
    ranks of a group: the node segments, and per group and local position the ranks at that position in each
    node; ``rows`` are the groups they come from."""
    blocks = seg.blocks
    intra = np.concatenate([b.reshape(-1, b.shape[2]) for b in blocks])
    intra_rows = np.concatenate([np.repeat(r, b.shape[1]) for b, r in zip(blocks, seg.rows)])
    inter = np.concatenate([b.transpose(0, 2, 1).reshape(-1, b.shape[1]) for b in blocks])
    inter_rows = np.concatenate([np.repeat(r, b.shape[2]) for b, r in zip(blocks, seg.rows)])
    return intra, intra_rows, inter, inter_rows
