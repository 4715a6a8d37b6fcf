"""Placement: plan sizes + rank order -> groups of ranks per parallel axis (Megatron-Core RankGenerator),
and groups -> the nodes and devices they sit on.

Order is innermost first: with ``tp-dp-pp`` rank = tp_i + tp * (dp_i + dp * pp_i), so a TP group is a run
of consecutive ranks and stays inside a node when tp <= GPUs per node. Groups are listed as Megatron-Core's
``generate_masked_orthogonal_rank_groups`` lists them (the other axes' indices, innermost fastest). Ranks map
to GPUs in order: rank r sits on node r // gpus_per_node, local GPU r % gpus_per_node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from ..plan import parse_order

if TYPE_CHECKING:
    from .cluster import Cluster

AXES = ("tp", "dp", "pp")
Groups = tuple[tuple[int, ...], ...]


@lru_cache(maxsize=4096)
def rank_groups(tp: int, dp: int, pp: int, order: str = "tp-dp-pp") -> dict[str, tuple[tuple[int, ...], ...]]:
    """Groups of ranks for each axis ("tp", "dp", "pp"); each group lists ranks in axis-index order."""
    dims = parse_order(order)
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    for name, size in sizes.items():
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise InputError(f"{name}={size!r} must be a positive integer")
    # ranks laid out as an array whose axes are the dims, outermost first (C order = innermost last)
    shape = [sizes[d] for d in reversed(dims)]
    grid = np.arange(tp * dp * pp).reshape(shape)
    axes = list(reversed(dims))
    groups: dict[str, tuple[tuple[int, ...], ...]] = {}
    for d in dims:
        moved = np.moveaxis(grid, axes.index(d), -1).reshape(-1, sizes[d])
        groups[d] = tuple(tuple(int(r) for r in row) for row in moved)
    return groups


def nodes_spanned(group: tuple[int, ...], gpus_per_node: int) -> int:
    """Number of distinct nodes a group of ranks touches."""
    return len({r // gpus_per_node for r in group})


def group_nodes(group: tuple[int, ...], gpus_per_node: int) -> tuple[int, ...]:
    """Node of each rank of the group (same order as the group)."""
    return tuple(r // gpus_per_node for r in group)


def rank_coords(rank: int, tp: int, dp: int, pp: int, order: str = "tp-dp-pp") -> dict[str, int]:
    """Index of ``rank`` along each axis (inverse of the rank layout)."""
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    if not 0 <= rank < tp * dp * pp:
        raise InputError(f"rank={rank} is out of range for tp*dp*pp={tp * dp * pp}")
    coords = {}
    for d in parse_order(order):
        rank, coords[d] = divmod(rank, sizes[d])
    return coords


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Groups of every axis and where they sit (pure data; no graph)."""

    tp: int
    dp: int
    pp: int
    order: str
    gpus_per_node: int
    groups: dict[str, Groups]
    """axis -> every group of that axis (ranks)."""

    def nodes(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """axis -> for each group, the node of each of its ranks."""
        return tuple(group_nodes(g, self.gpus_per_node) for g in self._axis(axis))

    def span(self, axis: str) -> int:
        """Most nodes one group of ``axis`` touches."""
        return max(nodes_spanned(g, self.gpus_per_node) for g in self._axis(axis))

    def ranks_per_node(self, axis: str) -> int:
        """Most ranks of one group of ``axis`` on one node (1 for a DP group spread one per node)."""
        counts = [max(np.bincount(np.asarray(n)).max(), 1) for n in self.nodes(axis)]
        return int(max(counts))

    def intra_node(self, axis: str) -> bool:
        """Every group of ``axis`` stays inside one node."""
        return self.span(axis) == 1

    def groups_sharing_node(self, axis: str) -> int:
        """Most groups of ``axis`` with a rank on the same node (they load the node's NICs together)."""
        per_node: dict[int, set[int]] = {}
        for gi, nodes in enumerate(self.nodes(axis)):
            for n in nodes:
                per_node.setdefault(n, set()).add(gi)
        return max(len(s) for s in per_node.values())

    def devices(self, axis: str, cluster: "Cluster") -> tuple[tuple[str, ...], ...]:
        """axis -> for each group, the graph ids of its GPUs on ``cluster``."""
        return tuple(tuple(cluster.gpu_id(r) for r in g) for g in self._axis(axis))

    def _axis(self, axis: str) -> Groups:
        if axis not in self.groups:
            raise InputError(f"axis={axis!r} is not one of {', '.join(AXES)}")
        return self.groups[axis]


def place(tp: int, dp: int, pp: int, order: str = "tp-dp-pp", gpus_per_node: int = 8,
          num_gpus: int | None = None) -> Placement:
    """Placement of a tp x dp x pp plan on nodes of ``gpus_per_node`` GPUs (``num_gpus``: the cluster size,
    checked to hold the plan)."""
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise InputError(f"gpus_per_node={gpus_per_node!r} must be a positive integer")
    groups = rank_groups(tp, dp, pp, order)
    world = tp * dp * pp
    if num_gpus is not None and world != num_gpus:
        raise InputError(f"tp*dp*pp={tp}*{dp}*{pp}={world} does not match gpus={num_gpus}")
    return Placement(tp=tp, dp=dp, pp=pp, order="-".join(parse_order(order)), gpus_per_node=gpus_per_node,
                     groups=groups)


def place_on(cluster: "Cluster", tp: int, dp: int, pp: int, order: str = "tp-dp-pp") -> Placement:
    """Placement on a loaded cluster (its GPUs per node and size)."""
    return place(tp, dp, pp, order, cluster.gpus_per_node, cluster.num_gpus)
