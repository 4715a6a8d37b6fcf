"""Placement: plan sizes + rank order -> groups of ranks per parallel axis (Megatron-Core RankGenerator),
and groups -> the nodes and devices they sit on.

Order is innermost first: with ``tp-dp-pp`` rank = tp_i + tp * (dp_i + dp * pp_i), so a TP group is a run
of consecutive ranks and stays inside a node when tp <= GPUs per node. Groups are listed as Megatron-Core's
``generate_masked_orthogonal_rank_groups`` lists them (the other axes' indices, innermost fastest). Ranks map
to GPUs in order: rank r sits on node r // gpus_per_node, local GPU r % gpus_per_node.
"""

from __future__ import annotations

import math
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
    layout = RankLayout.from_order(dims, tp=tp, dp=dp, pp=pp)
    return {d: tuple(tuple(int(r) for r in row) for row in layout.groups(d)) for d in dims}


@dataclass(frozen=True)
class RankLayout:
    """Sizes of a plan's mesh axes, innermost first (Megatron-Core ``RankGenerator`` order); hashable, so it
    serves as a cache key. ``rank = i_0 + n_0 * (i_1 + n_1 * (i_2 + ...))`` for axis indices ``i_k``."""

    dims: tuple[tuple[str, int], ...]
    """(axis name, size) pairs, innermost first."""

    def __post_init__(self) -> None:
        names = [d for d, _ in self.dims]
        if len(set(names)) != len(names):
            raise InputError(f"rank layout lists an axis twice: {'-'.join(names)}")
        for name, size in self.dims:
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
                raise InputError(f"{name}={size!r} must be a positive integer")
        object.__setattr__(self, "dims", tuple((str(d), int(n)) for d, n in self.dims))
        # not fields (equality, hash and repr stay the dims'): the sizes as a dict and the rank count, asked for
        # hundreds of times per search (np.prod per call was a tenth of a cold `tpsim plan`)
        object.__setattr__(self, "_sizes", dict(self.dims))
        object.__setattr__(self, "_world", math.prod(n for _, n in self.dims))

    @classmethod
    def from_order(cls, order: str | tuple[str, ...], **sizes: int) -> "RankLayout":
        """``RankLayout.from_order("tp-dp-pp", tp=8, dp=4, pp=2)``; axes in ``sizes`` missing from ``order``
        must have size 1 and are left out."""
        names = tuple(order.lower().split("-")) if isinstance(order, str) else tuple(order)
        missing = [k for k, v in sizes.items() if k not in names and v != 1]
        if missing:
            raise InputError(f"order={'-'.join(names)!r} does not name axis {missing[0]} "
                             f"({missing[0]}={sizes[missing[0]]})")
        unknown = [d for d in names if d not in sizes]
        if unknown:
            raise InputError(f"order={'-'.join(names)!r} names axis {unknown[0]!r} without a size")
        return cls(tuple((d, int(sizes[d])) for d in names))

    @property
    def world(self) -> int:
        return self._world

    def size(self, *axes: str) -> int:
        """Product of the sizes of ``axes`` (1 for axes the layout does not have)."""
        sizes = self._sizes
        return math.prod(sizes.get(a, 1) for a in axes)

    def groups(self, axes: str | tuple[str, ...]) -> np.ndarray:
        """Ranks that differ only along ``axes``: array (number of groups, group size), each group's ranks in
        layout order (innermost axis fastest), groups listed with the other axes' indices innermost fastest
        (Megatron-Core ``generate_masked_orthogonal_rank_groups``). Read-only: the last few are kept (the
        estimator and the collective model ask for the same groups one after the other)."""
        if isinstance(axes, str):
            axes = (axes,)
        key = (self, tuple(axes))
        hit = _RECENT_GROUPS.get(key)
        if hit is None:
            hit = self._groups(key[1])
            hit.setflags(write=False)
            if len(_RECENT_GROUPS) >= _RECENT:
                _RECENT_GROUPS.pop(next(iter(_RECENT_GROUPS)))
            _RECENT_GROUPS[key] = hit
        return hit

    def _groups(self, axes: tuple[str, ...]) -> np.ndarray:
        names = [d for d, _ in self.dims]
        bad = [a for a in axes if a not in names]
        if bad:
            raise InputError(f"axis={bad[0]!r} is not in the rank layout {'-'.join(names)}")
        grid = np.arange(self.world, dtype=np.int64).reshape([n for _, n in reversed(self.dims)])
        rev = list(reversed(names))  # numpy axis k holds rev[k]
        masked = [a for a in names if a in axes]  # innermost first
        other = [a for a in names if a not in axes]
        # target order of numpy axes: other axes (outermost first), then masked axes (outermost first), so that
        # C-order reshape makes the innermost masked axis the fastest inside a group
        perm = [rev.index(a) for a in reversed(other)] + [rev.index(a) for a in reversed(masked)]
        return np.ascontiguousarray(np.transpose(grid, perm)).reshape(-1, self.size(*masked))

    def key(self) -> str:
        return "-".join(f"{d}{n}" for d, n in self.dims)


_RECENT = 8
_RECENT_GROUPS: dict[tuple[RankLayout, tuple[str, ...]], np.ndarray] = {}
"""the last :data:`_RECENT` groups arrays (an array holds every rank: at 131k GPUs 1 MB each, so only a few)."""


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
