"""Stage 2, pipeline partition: which layers and parameters the first, last and busiest middle pipeline rank
hold. The pipeline position is the leading array axis (:data:`POSITIONS`), so every later stage treats the
three ranks with one expression.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .memory import stage_layers
from .source import LayerCosts

POSITIONS = ("first", "last", "middle")
"""pipeline ranks the estimator follows: rank 0, rank pp - 1, and the middle rank with the most layers
(Megatron's in-flight count of rank 1); index 0, 1, 2 of the leading axis."""
FIRST, LAST, MIDDLE = range(3)


@dataclass(frozen=True)
class Partition:
    """Arrays (3, n) over (position, plan) unless noted."""

    layers: np.ndarray
    """repeated layers the rank holds (all its model chunks)."""
    valid: np.ndarray
    """the position exists: last needs pp > 1, middle pp > 2 (bool)."""
    params: np.ndarray
    """parameters held by the rank."""
    edge_params: np.ndarray
    """of ``params``, those of the edges (embedding, output layer, final norm)."""
    largest: np.ndarray
    """(n,) parameters of the rank holding the most (sets the data-parallel traffic)."""
    largest_edge: np.ndarray
    """(n,) the larger edge's parameters (ZeRO-3 gathers and reduces them like one more layer)."""

    def for_plans(self, index: np.ndarray) -> "Partition":
        """Plans ``index`` of what the per-plan stages read (``edge_params`` and ``largest_edge``, used by
        communication only, are None)."""
        return Partition(layers=self.layers[:, index], valid=self.valid[:, index], params=self.params[:, index],
                         edge_params=None, largest=self.largest[index], largest_edge=None)


def positions(pp: np.ndarray) -> np.ndarray:
    """(3, n) bool: which positions exist for these pipeline sizes."""
    return np.stack([np.ones(pp.shape, dtype=bool), pp > 1, pp > 2])


def on_positions(first: np.ndarray, last: np.ndarray, single: np.ndarray, middle: np.ndarray | float = 0.0,
                 last_alone: np.ndarray | None = None) -> np.ndarray:
    """(3, n) of an edge quantity: the first rank has the first edge (and, without pipelining, the last one
    too: ``last_alone`` if given, else ``last``), the last rank the last edge, middle ranks ``middle``."""
    with_last = last if last_alone is None else last_alone
    first_rank = first + np.where(single, with_last, 0.0)
    return np.stack([first_rank, np.broadcast_to(last, first_rank.shape),
                     np.broadcast_to(middle, first_rank.shape)])


def partition(num_layers: int, pp: np.ndarray, vpp: np.ndarray, costs: LayerCosts) -> Partition:
    """Layers split over pp x vpp chunks (:func:`stage_layers`); parameters per rank (``costs`` are gathered
    to the same rows as ``pp``)."""
    split = stage_layers(num_layers, pp, vpp)
    layers = np.stack([split.first, split.last, split.middle])
    valid = positions(pp)
    single = pp == 1
    last_unshared = costs.last.params - costs.last.shared_params
    edges = on_positions(costs.first.params, costs.last.params, single, last_alone=last_unshared)
    params = layers * costs.params + edges
    held = np.where(valid, params, 0.0)
    return Partition(layers=layers, valid=valid, params=params, edge_params=edges, largest=held.max(axis=0),
                     largest_edge=np.where(valid, edges, 0.0).max(axis=0))
