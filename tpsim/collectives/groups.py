"""Concurrent groups by symmetry: classes of groups that are the same up to a shift by whole nodes.

On a cluster of identical nodes, a group whose ranks are another group's shifted by ``q x gpus_per_node`` sits
on the same local GPUs of nodes ``q`` further on: its flows, node by node, are the other group's shifted. Plan
layouts are full of such copies (every pipeline stage's DP groups are the first stage's, every TP group is the
first one's), so a :class:`GroupSet` keeps one representative per class and the node shifts of its copies; the
algorithms build flows for the representatives only and the structural router adds the copies where it
needs them (:mod:`tpsim.collectives.structure`). Groups with no copy are classes of one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .flows import Flows

_SALT = np.array([0x2545F4914F6CDD1D, 0x5851F42D4C957F2D], dtype=np.uint64)


@dataclass(frozen=True)
class GroupSet:
    """Groups as classes of node-translates. ``reps[c]`` is class c's first group; its copies are
    ``reps[c] + s`` for ``s`` in ``shift_sets[class_shift[c]]`` (rank shifts, multiples of ``gpn``, sorted,
    0 among them: the representative itself). Distinct shift sets are stored once (the classes of one layout
    usually share them)."""

    reps: np.ndarray
    shift_sets: tuple[np.ndarray, ...]
    class_shift: np.ndarray
    gpn: int

    @property
    def size(self) -> int:
        """Ranks per group."""
        return int(self.reps.shape[1])

    @property
    def num_groups(self) -> int:
        return int(sum(len(self.shift_sets[s]) for s in self.class_shift.tolist()))

    def shifts(self, c: int) -> np.ndarray:
        return self.shift_sets[int(self.class_shift[c])]

    def expand(self) -> np.ndarray:
        """Every group (for the full-graph router and the few per-group algorithms), shift set by shift set."""
        parts = []
        for k, shifts in enumerate(self.shift_sets):
            reps = self.reps[self.class_shift == k]
            if len(reps):
                parts.append((reps[:, None, :] + shifts[None, :, None]).reshape(-1, self.size))
        return np.concatenate(parts)

    @staticmethod
    def single(groups: np.ndarray, gpn: int) -> "GroupSet":
        """Every group its own class (no symmetry used)."""
        g = len(groups)
        return GroupSet(groups, (np.zeros(1, dtype=np.int64),), np.zeros(g, dtype=np.int64), gpn)

    @staticmethod
    def of(groups: np.ndarray, gpn: int) -> "GroupSet":
        """Classes of ``groups`` (array ``(G, n)``): groups with the same local GPUs, position by position,
        and the same node offsets from their first rank's node (found by hashing rows, then checked exactly).
        """
        g, n = groups.shape
        if g == 1:
            return GroupSet.single(groups, gpn)
        node, local = np.divmod(groups, gpn)
        rel = node - node[:, :1]
        key = _row_hash(local, rel)
        _, rep_row, cls = np.unique(key, return_index=True, return_inverse=True)
        cls = cls.ravel()
        reps = groups[rep_row]
        if not (np.array_equal(local, local[rep_row][cls]) and np.array_equal(rel, rel[rep_row][cls])):
            return GroupSet.single(groups, gpn)   # a hash collision: no symmetry rather than a wrong one
        shift = (node[:, 0] - node[rep_row, 0][cls]) * gpn
        order = np.argsort(cls, kind="stable")
        bounds = np.searchsorted(cls[order], np.arange(len(rep_row) + 1))
        sets: dict[bytes, int] = {}
        shift_sets: list[np.ndarray] = []
        class_shift = np.empty(len(rep_row), dtype=np.int64)
        for c in range(len(rep_row)):
            s = np.sort(shift[order[bounds[c]:bounds[c + 1]]])
            digest = hashlib.blake2b(s.tobytes(), digest_size=16).digest()
            if digest not in sets:
                sets[digest] = len(shift_sets)
                shift_sets.append(s)
            class_shift[c] = sets[digest]
        return GroupSet(reps, tuple(shift_sets), class_shift, gpn)

    def derived(self, reps: np.ndarray, parent: np.ndarray) -> "GroupSet":
        """Groups built from each representative (``reps`` row i built from class ``parent[i]``): they are
        copied with their parent's shifts."""
        return GroupSet(np.ascontiguousarray(reps), self.shift_sets, self.class_shift[parent], self.gpn)


@dataclass(frozen=True)
class ShiftedFlows:
    """Flows of representative groups (``flows.group`` = class) and the shifts that copy each class."""

    flows: Flows
    groups: GroupSet
    symmetric: bool = False
    """every flow comes with its reverse at the same weight (trees, all-to-all): the traffic leaving a
    block equals the traffic entering it, so half the flows tell both."""

    @staticmethod
    def plain(flows: Flows, gpn: int = 1) -> "ShiftedFlows":
        """Flows given in full (one class, no copy)."""
        f = Flows(flows.src, flows.dst, flows.weight, np.zeros(len(flows), dtype=np.int64))
        return ShiftedFlows(f, GroupSet(np.zeros((1, 1), np.int64), (np.zeros(1, np.int64),),
                                        np.zeros(1, np.int64), gpn))

    def by_shift_set(self):
        """(flows, shift set) per distinct shift set: the flows of every class copied by that set."""
        cls = self.flows.group
        which = self.groups.class_shift[cls]
        for k, shifts in enumerate(self.groups.shift_sets):
            sel = which == k
            if sel.any():
                yield Flows(self.flows.src[sel], self.flows.dst[sel], self.flows.weight[sel], cls[sel]), shifts

    def expand(self) -> Flows:
        """Every flow of every copy."""
        parts = []
        for f, shifts in self.by_shift_set():
            parts.append(Flows((f.src[:, None] + shifts[None, :]).ravel(), (f.dst[:, None] + shifts[None, :]).ravel(),
                               np.repeat(f.weight, len(shifts))))
        return Flows.concat(parts)


def _row_hash(*arrays: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of the arrays (same shape)."""
    h = np.zeros(arrays[0].shape[0], dtype=np.uint64)
    n = arrays[0].shape[1]
    col = np.arange(1, n + 1, dtype=np.uint64)
    for salt, a in zip(_SALT, arrays):
        mix = (a.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) * (col * salt | np.uint64(1))
        mix ^= mix >> np.uint64(29)
        h = h * np.uint64(0xBF58476D1CE4E5B9) + mix.sum(axis=1, dtype=np.uint64)
    return h.view(np.int64)
