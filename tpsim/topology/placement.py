"""Placement: plan sizes + rank order -> groups of ranks per parallel axis (Megatron-Core RankGenerator).

Order is innermost first: with ``tp-dp-pp`` rank = tp_i + tp * (dp_i + dp * pp_i), so a TP group is a run
of consecutive ranks and stays inside a node when tp <= GPUs per node. Ranks map to GPUs in order:
rank r sits on node r // gpus_per_node, local GPU r % gpus_per_node.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..plan import parse_order


@lru_cache(maxsize=4096)
def rank_groups(tp: int, dp: int, pp: int, order: str = "tp-dp-pp") -> dict[str, tuple[tuple[int, ...], ...]]:
    """Groups of ranks for each axis ("tp", "dp", "pp"); each group lists ranks in axis-index order."""
    dims = parse_order(order)
    sizes = {"tp": tp, "dp": dp, "pp": pp}
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
