"""Stage 2, pipeline partition: which layers and parameters the first, last and busiest middle pipeline rank
hold. The pipeline position is the leading array axis (:data:`POSITIONS`), so every later stage treats the
three ranks with one expression.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from typing import TYPE_CHECKING

from .keys import argmax_rows, gather, per_distinct, pick_rows
from ..errors import InputError

if TYPE_CHECKING:  # annotations only: the partition does not import the layer sources at run time
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
    expert: np.ndarray | None = None
    """(3, n) of ``params``, the routed experts' (None: a dense model)."""
    largest_expert: np.ndarray | float = 0.0
    """(n,) the routed experts' parameters on the rank holding the most parameters."""
    kind_counts: np.ndarray | None = None
    """(kinds, 3, n) layers of each kind the rank holds (None: one kind, ``layers`` of it)."""
    cuts: np.ndarray | None = None
    """(kinds, n) bool: layers of that kind start a model chunk after the first (layers of different costs
    only: the pipeline sends what is live there; None: every boundary sends the same)."""
    rank_counts: np.ndarray | None = None
    """(kinds, R, n) layers of each kind on every pipeline rank 0 .. R - 1 (R the batch's largest pp, zeros
    past a plan's own; layers of different costs only: the schedule finds the slowest rank among all of them,
    :meth:`ranks`)."""
    pp: np.ndarray | None = None
    """(n,) pipeline ranks of each plan (with ``rank_counts`` or ``peak_counts``)."""
    peak_counts: np.ndarray | None = None
    """(kinds, R, n) as :attr:`rank_counts`, for the memory peak only (layers of several kinds; None: one kind,
    or :attr:`rank_counts` gives every rank)."""
    middle_exact: np.ndarray | None = None
    """(n,) bool with ``peak_counts``: the three positions bound every rank's memory peak (rank 1 holds at least
    every other middle rank's layers of each kind, :func:`middle_dominated`); the memory stage compares every
    rank only for a batch with a plan where they do not."""
    every_params: np.ndarray | None = None
    """(R, n) parameters held by every rank (with ``rank_counts`` or ``peak_counts``; :func:`_rank_params`)."""
    every_expert: np.ndarray | None = None
    """(R, n) of ``every_params``, the routed experts' (None: a dense model)."""

    def for_plans(self, index: np.ndarray) -> "Partition":
        """Plans ``index`` of what the per-plan stages read (``edge_params`` and ``largest_edge``, used by
        communication only, are None)."""
        expert = None if self.expert is None else gather(self.expert, index, 1)
        largest_expert = (self.largest_expert if np.isscalar(self.largest_expert)
                          else gather(self.largest_expert, index, 0))
        return Partition(layers=gather(self.layers, index, 1), valid=gather(self.valid, index, 1),
                         params=gather(self.params, index, 1), edge_params=None,
                         largest=gather(self.largest, index, 0), largest_edge=None, expert=expert,
                         largest_expert=largest_expert,
                         kind_counts=None if self.kind_counts is None else gather(self.kind_counts, index, 2),
                         rank_counts=None if self.rank_counts is None else gather(self.rank_counts, index, 2),
                         pp=None if self.pp is None else gather(self.pp, index, 0),
                         peak_counts=None if self.peak_counts is None else gather(self.peak_counts, index, 2),
                         middle_exact=None if self.middle_exact is None else gather(self.middle_exact, index, 0),
                         every_params=None if self.every_params is None else gather(self.every_params, index, 1),
                         every_expert=None if self.every_expert is None else gather(self.every_expert, index, 1))

    def layer_sum(self, per_layer: np.ndarray, by_kind: np.ndarray | None = None) -> np.ndarray:
        """(3, n) sum of a per-layer quantity over each rank's layers: ``layers x per_layer``, or with layer
        kinds (``by_kind`` (kinds, n) and :attr:`kind_counts`) each rank's own layers of each kind."""
        return _layer_sum(self.layers, self.kind_counts, per_layer, by_kind)

    def ranks(self, for_memory: bool = False) -> "Ranks":
        """The pipeline ranks the schedule compares: the three positions, or with :attr:`rank_counts` (layers of
        different costs, where the busiest middle rank by the split's weights need not be the slowest for a
        plan's micro-batch, TP degree, recomputation and collectives) every rank. ``for_memory``: the ranks
        whose peaks the memory stage compares (also every rank with :attr:`peak_counts` where a plan's three
        positions do not bound its peak, :attr:`middle_exact`)."""
        counts = self.rank_counts
        if counts is None and for_memory and self.peak_counts is not None and not np.all(self.middle_exact):
            counts = self.peak_counts
        if counts is None:  # the layer counts as floats once: the stages multiply them by seconds and bytes
            return Ranks(layers=self.layers.astype(float), valid=self.valid, kind_counts=self.kind_counts)
        return _every_rank(counts, self.pp)

    def rank_params(self, ranks: "Ranks") -> tuple[np.ndarray, np.ndarray | None]:
        """(ranks, n) parameters, and of them the routed experts' (None: a dense model), held by each of
        ``ranks`` (:meth:`ranks`): :attr:`params` / :attr:`expert` for the three positions, else
        :attr:`every_params` / :attr:`every_expert`."""
        if ranks.position is None:
            return self.params, self.expert
        return self.every_params, self.every_expert


def _every_rank(counts: np.ndarray, pp: np.ndarray) -> "Ranks":
    """Every pipeline rank 0 .. R - 1 of ``counts`` (kinds, R, n) as :class:`Ranks` (valid below each plan's pp)."""
    r = np.arange(counts.shape[1])[:, None]
    position = np.where(r == 0, FIRST, np.where(r == pp - 1, LAST, MIDDLE))
    return Ranks(layers=counts.sum(axis=0), valid=r < pp, kind_counts=counts, position=position,
                 rank=np.broadcast_to(r, position.shape))


def _rank_params(ranks: "Ranks", costs: "LayerCosts", pp: np.ndarray, edges: np.ndarray,
                 mirrored: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(ranks, n) parameters held by every rank, and of them the routed experts' (None: a dense model): its own
    layers of each kind and its position's edges ``edges`` (:func:`edge_params`), with ``mirrored`` plans'
    stage pp - 1 - r on rank r too (what the last edge shares with the first once, :func:`_mirror`)."""
    by_kind = costs.params_by_kind is not None and ranks.kind_counts is not None
    params = ranks.layer_sum(costs.params, costs.params_by_kind if by_kind else None) + ranks.of_positions(edges)
    expert = None
    if (costs.expert_by_kind if by_kind else costs.expert_params) is not None:
        expert = ranks.layer_sum(0.0 if costs.expert_params is None else costs.expert_params,
                                 costs.expert_by_kind if by_kind else None)
        ex_first, ex_last = (np.broadcast_to(np.asarray(e.expert_params, dtype=float), pp.shape)
                             for e in (costs.first, costs.last))
        expert = expert + ranks.of_positions(on_positions(ex_first, ex_last, pp == 1))
    if mirrored is not None and np.any(mirrored):
        multi = (pp > 1) & mirrored
        shared = np.where(ranks.position == MIDDLE, 0.0, costs.last.shared_params)
        params = np.where(multi, params + ranks.partner(params) - shared, params)
        if expert is not None:
            expert = np.where(multi, expert + ranks.partner(expert), expert)
    return params, expert


def _holding_most(valid: np.ndarray, params: np.ndarray, expert: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray | float]:
    """(n,) parameters of the rank holding the most among ``valid`` rows of ``params`` (ranks, n), and of them
    the routed experts' (``expert`` (ranks, n); 0 for a dense model)."""
    held = np.where(valid, params, 0.0)
    if expert is None:
        return held.max(axis=0), 0.0
    at = argmax_rows(held)
    return pick_rows(held, at), pick_rows(expert, at)


def _layer_sum(layers: np.ndarray, counts: np.ndarray | None, per_layer: np.ndarray,
               by_kind: np.ndarray | None) -> np.ndarray:
    """(ranks, n): ``layers x per_layer``, or with kinds each rank's own layers of each kind (``counts``
    (kinds, ranks, n), ``by_kind`` (kinds, n))."""
    if by_kind is None or counts is None:
        return layers * per_layer
    out = counts[0] * by_kind[0]
    for k in range(1, counts.shape[0]):  # a handful of kinds: contiguous multiply-adds beat einsum
        out += counts[k] * by_kind[k]
    return out


@dataclass(frozen=True)
class Ranks:
    """Pipeline ranks the schedule compares, arrays (ranks, n): the three :data:`POSITIONS`, or every rank
    (:meth:`Partition.ranks`)."""

    layers: np.ndarray
    valid: np.ndarray
    kind_counts: np.ndarray | None = None
    """(kinds, ranks, n) layers of each kind (None: one kind)."""
    position: np.ndarray | None = None
    """(ranks, n) the :data:`POSITIONS` index of each rank (what its edges are); None: the ranks are the
    positions."""
    rank: np.ndarray | None = None
    """(ranks, n) the pipeline rank of each row (with ``position``; None: the positions' ranks 0, pp - 1, 1)."""

    def rank_of(self, pp: np.ndarray) -> np.ndarray:
        """(ranks, n) the pipeline rank of each row: the positions' ranks 0, pp - 1 and 1 (the busiest middle
        rank holds rank 1's micro-batches in flight), or every rank's own."""
        if self.rank is None:  # np.stack([zeros_like(pp), pp - 1, ones_like(pp)]), filled row by row
            out = np.empty((3,) + pp.shape, dtype=pp.dtype)
            out[0], out[1], out[2] = 0, pp - 1, 1
            return out
        return self.rank

    def partner(self, values: np.ndarray) -> np.ndarray:
        """(ranks, n) of a per-row quantity, the row of rank pp - 1 - r (a bidirectional schedule's second stage
        on rank r): the positions first <-> last, middle itself, or every rank's mirror."""
        if self.position is None:
            return values[[LAST, FIRST, MIDDLE]]
        pp = self.valid.sum(axis=0)  # every rank below the plan's pp is valid
        other = np.clip(pp - 1 - self.rank, 0, self.rank.shape[0] - 1)
        return np.take_along_axis(values, other, axis=0)

    def layer_sum(self, per_layer: np.ndarray, by_kind: np.ndarray | None = None) -> np.ndarray:
        """(ranks, n) sum of a per-layer quantity over each rank's layers (:meth:`Partition.layer_sum`)."""
        return _layer_sum(self.layers, self.kind_counts, per_layer, by_kind)

    def of_positions(self, values: np.ndarray) -> np.ndarray:
        """(ranks, n) of a (3, n) position quantity (edges): each rank its position's."""
        if self.position is None:
            return values
        return np.take_along_axis(np.broadcast_to(values, (3,) + self.position.shape[1:]), self.position, axis=0)

    def position_of(self, rank: np.ndarray) -> np.ndarray:
        """(n,) the position of rank ``rank[i]`` of plan i."""
        return rank if self.position is None else self.position[rank, np.arange(rank.size)]

    def rank_sum(self, rank: np.ndarray) -> "RankSum":
        """The sums over the layers of rank ``rank[i]`` of plan i."""
        layers = pick_rows(self.layers, rank)
        counts = None if self.kind_counts is None else self.kind_counts[:, rank, np.arange(rank.size)]
        return RankSum(layers=layers, counts=counts)


@dataclass(frozen=True)
class RankSum:
    """Sums over the layers of one rank per plan: ``layers`` (n,), ``counts`` (kinds, n) of each kind."""

    layers: np.ndarray
    counts: np.ndarray | None = None

    def __call__(self, per_layer: np.ndarray | float, by_kind: np.ndarray | None = None) -> np.ndarray:
        """(n,) ``layers x per_layer``, or with ``by_kind`` (kinds, n) the rank's own layers of each kind."""
        if by_kind is None or self.counts is None:
            return self.layers * per_layer
        return (self.counts * by_kind).sum(axis=0)


def _mirror(params: np.ndarray, expert: np.ndarray | None, last_shared: np.ndarray,
            pp: np.ndarray, mirrored: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """A bidirectional schedule (DualPipe; ``mirrored`` per plan) puts stage pp - 1 - r on rank r too: the first
    and the last rank both hold the first and the last stage (what the last edge shares with the first, the
    embedding the MTP modules and a tied output layer use, once), a middle rank two middle stages (pp > 1)."""
    multi = (pp > 1) & mirrored

    def both(x: np.ndarray, shared: np.ndarray | float) -> np.ndarray:
        edges = x[0] + x[1] - shared
        return np.stack([np.where(multi, edges, x[0]), np.where(multi, edges, x[1]),
                         np.where(mirrored, 2.0, 1.0) * x[2]])

    return both(params, last_shared), (None if expert is None else both(expert, 0.0))


def positions(pp: np.ndarray) -> np.ndarray:
    """(3, n) bool: which positions exist for these pipeline sizes."""
    pp = np.asarray(pp)
    out = np.empty((3,) + pp.shape, dtype=bool)  # np.stack([all true, pp > 1, pp > 2]), row by row
    out[0] = True
    np.greater(pp, 1, out=out[1])
    np.greater(pp, 2, out=out[2])
    return out


def on_positions(first: np.ndarray, last: np.ndarray, single: np.ndarray, middle: np.ndarray | float = 0.0,
                 last_alone: np.ndarray | None = None) -> np.ndarray:
    """(3, n) of an edge quantity: the first rank has the first edge (and, without pipelining, the last one
    too: ``last_alone`` if given, else ``last``), the last rank the last edge, middle ranks ``middle``."""
    with_last = last if last_alone is None else last_alone
    first_rank = first + np.where(single, with_last, 0.0)
    return stack_rows((first_rank, last, middle), first_rank.shape)


def stack_rows(rows: tuple, shape: tuple[int, ...]) -> np.ndarray:
    """``np.stack([np.broadcast_to(r, shape) for r in rows])``: one array filled row by row (the same values
    and dtype, without a broadcast view per row; the stages call it a few times per batch)."""
    arrays = [np.asarray(r) for r in rows]
    out = np.empty((len(arrays),) + tuple(shape), dtype=np.result_type(*arrays))
    for k, a in enumerate(arrays):
        out[k] = a
    return out


def edge_params(costs: "LayerCosts", pp: np.ndarray) -> np.ndarray:
    """(3, n) parameters of each position's edges: the first rank the embedding (without pipelining the last
    edge too, less what it shares with the first), the last rank the output layer and final norm."""
    last_unshared = costs.last.params - costs.last.shared_params
    return on_positions(costs.first.params, costs.last.params, pp == 1, last_alone=last_unshared)


def partition(num_layers: int, pp: np.ndarray, vpp: np.ndarray, costs: "LayerCosts",
              edges_as_layers: bool = False, kind_of_layer: np.ndarray | None = None,
              mirrored: np.ndarray | None = None, split: "SplitFields | None" = None,
              weights: tuple[float, ...] | None = None) -> Partition:
    """Layers split over pp x vpp chunks (:func:`layer_split`: the stack's rule, the plan's uneven split
    ``split``, or with ``weights`` (one per layer: layers of different costs, a traced graph's units) the
    contiguous chunks that balance them, :func:`balanced_split`); ``mirrored`` (n,) bool, the plans whose
    schedule puts stage pp - 1 - r on rank r too, :func:`_mirror`; parameters per rank (``costs`` are gathered
    to the same rows as ``pp``). With layers of several kinds (``costs.params_by_kind`` and the kind of every
    layer), each rank holds exactly its own layers' parameters (:func:`position_kind_counts`)."""
    if weights is not None and split is not None and np.any(split.layout):
        raise InputError("pp_layout: a traced model's pipeline split balances its units by cost (the layout "
                         "counts decoder layers of a model spec)")
    valid = positions(pp)
    single = pp == 1
    edges = edge_params(costs, pp)
    counts = None
    if weights is not None:  # the middle position is the busiest middle rank by weight: its layers' count
        counts = position_kind_counts(kind_of_layer, pp, vpp, edges_as_layers, split, weights)
        layers = counts.sum(axis=1)
    else:
        s = stage_layers(num_layers, pp, vpp, edges_as_layers, split)
        layers = np.stack([s.first, s.last, s.middle])
    if costs.params_by_kind is not None and kind_of_layer is not None:
        if counts is None:
            counts = position_kind_counts(kind_of_layer, pp, vpp, edges_as_layers, split)
        params = np.einsum("pkn,kn->pn", counts, costs.params_by_kind) + edges
        expert = np.einsum("pkn,kn->pn", counts, costs.expert_by_kind)
    else:
        params = layers * costs.params + edges
        expert = None if costs.expert_params is None else layers * costs.expert_params
    if expert is not None:  # routed experts of the edges (multi-token prediction on the last rank)
        ex_first, ex_last = (np.broadcast_to(np.asarray(e.expert_params, dtype=float), pp.shape)
                             for e in (costs.first, costs.last))
        expert = expert + on_positions(ex_first, ex_last, single)
    if mirrored is not None and np.any(mirrored):
        params, expert = _mirror(params, expert, costs.last.shared_params, pp, mirrored)
    largest, largest_expert = _holding_most(valid, params, expert)
    every = None if weights is None else every_rank_kind_counts(kind_of_layer, pp, vpp, weights)
    peak = exact = None
    if weights is None and counts is not None:  # layers of several kinds: rank 1 may not hold the most of each
        exact = middle_dominated(kind_of_layer, pp, vpp, edges_as_layers, split)
        peak = every_rank_kind_counts(kind_of_layer, pp, vpp, None, edges_as_layers, split)
    every_params = every_expert = None
    if every is not None or peak is not None:
        pp_ = np.asarray(pp, dtype=np.int64)
        ranks = _every_rank(every if every is not None else peak, pp_)
        every_params, every_expert = _rank_params(ranks, costs, pp_, edges, mirrored)
        # the three positions need not hold the most (traced units; a middle rank past rank 1, middle_exact)
        every_rank = np.ones(pp_.shape, dtype=bool) if every is not None else ~exact
        most, most_expert = _holding_most(ranks.valid, every_params, every_expert)
        largest = np.where(every_rank, most, largest)
        if every_expert is not None:
            largest_expert = np.where(every_rank, most_expert, largest_expert)
    return Partition(layers=layers, valid=valid, params=params, edge_params=edges, largest=largest,
                     largest_edge=np.where(valid, edges, 0.0).max(axis=0), expert=expert,
                     largest_expert=largest_expert,
                     kind_counts=None if counts is None else np.ascontiguousarray(counts.transpose(1, 0, 2)),
                     cuts=None if weights is None else chunk_starts(kind_of_layer, pp, vpp, weights),
                     rank_counts=every, peak_counts=peak, middle_exact=exact, every_params=every_params,
                     every_expert=every_expert,
                     pp=None if every is None and peak is None else np.asarray(pp, dtype=np.int64))


@dataclass(frozen=True)
class SplitFields:
    """A plan batch's uneven-split columns (docs/SCHEMAS.md T1): decoder layers of the first and the last
    pipeline stage (0: even), the embedding and the output layer + loss counted as a layer each."""

    first: np.ndarray
    last: np.ndarray
    embedding: np.ndarray
    loss: np.ndarray
    layout: np.ndarray | int = 0
    """:func:`tpsim.plan.layout_code` of each plan's explicit layout (0: none)."""

    @classmethod
    def of(cls, plans) -> "SplitFields | None":
        """The plans' split columns, or None where every plan splits evenly (the stack's rule)."""
        layout = getattr(plans, "pp_layout", None)
        layout = 0 if layout is None else layout
        if not (np.any(plans.pp_first) or np.any(plans.pp_last) or np.any(plans.pp_embedding)
                or np.any(plans.pp_loss) or np.any(layout)):
            return None
        return cls(first=plans.pp_first, last=plans.pp_last, embedding=plans.pp_embedding, loss=plans.pp_loss,
                   layout=layout)

    def columns(self, n: int) -> list[np.ndarray]:
        return [np.broadcast_to(np.asarray(c, dtype=np.int64), (n,)) for c in
                (self.first, self.last, self.embedding, self.loss, self.layout)]


def _split_columns(pp: np.ndarray, split: SplitFields | None) -> list[np.ndarray]:
    n = np.size(pp)
    return split.columns(n) if split is not None else [np.zeros(n, dtype=np.int64)] * 5


@dataclass(frozen=True)
class StageLayers:
    """Layers held by the first, last and the busiest middle pipeline rank (arrays over plans)."""

    first: np.ndarray
    last: np.ndarray
    middle: np.ndarray


def stage_layers(num_layers: int, pp: np.ndarray, vpp: np.ndarray, edges_as_layers: bool = False,
                 split: SplitFields | None = None) -> StageLayers:
    """Layers of the first, the last and the busiest middle rank of each plan (:func:`rank_layers`, once
    per distinct (pp, vpp, split))."""
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)

    def three(p_: int, v_: int, *fields: int) -> np.ndarray:
        ranks = rank_layers(num_layers, p_, v_, edges_as_layers, *fields)
        return np.array([ranks[0], ranks[-1], max(ranks[1:-1]) if p_ > 2 else 0], dtype=np.int64)

    out = per_distinct(three, pp, vpp, *_split_columns(pp, split))
    return StageLayers(first=out[0], last=out[1], middle=out[2])


@lru_cache(maxsize=4096)
def layer_split(num_layers: int, pp: int, vpp: int, edges_as_layers: bool = False, first: int = 0,
                last: int = 0, embedding: bool = False, loss: bool = False,
                weights: tuple[float, ...] | None = None, layout: int | tuple[int, ...] = 0) -> tuple[int, ...]:
    """Decoder layers of each model chunk in model order (chunk k on rank k mod pp): the one pipeline split
    every path uses (estimator, traced graphs, exporters).

    * The plan's explicit ``layout`` (``Plan.pp_layout``, or its :func:`tpsim.plan.layout_code`): those
      chunks as given (the plan rules check that they are pp x vpp and hold the model's layers).

    * Layers of different costs (``weights``, one per layer: a traced graph's block instances and glue units):
      the contiguous chunks that minimise the largest chunk's weight (:func:`balanced_split`).

    * The plan's uneven split (Megatron-Core ``get_num_layers_to_build``): ``first`` / ``last`` decoder layers
      on the first / last rank (``--decoder-first/last-pipeline-num-layers``), the other layers over the other
      ranks; ``embedding`` / ``loss`` count the embedding / the output layer and loss as one layer each
      (``--account-for-embedding/loss-in-pipeline-split``: ``layers + 2`` slots for 94 layers on 32 x 3
      chunks, the first chunk holding only the embedding). Slots per chunk: ``slots // chunks``, one more for
      the first ``slots % chunks`` chunks; a rank's layers over its chunks likewise.
    * Else the stack's rule: with ``edges_as_layers`` (torchtitan ``generate_llm_fqn_per_model_part``) the
      embedding and the output layer as layers where that fills the chunks (1F1B, or interleaved with
      ``layers + 2`` a multiple of the chunks); otherwise tpsim's even split, chunks that differ by at most
      one layer, the extra layers to the middle ranks first (the busiest being rank 1), the rest shared by the
      first and the last rank."""
    chunks = pp * vpp
    if pp == 1:
        return (num_layers,)
    if layout:
        from ..plan import layout_of

        return tuple(layout) if isinstance(layout, tuple) else layout_of(layout)
    if weights is not None:
        return balanced_split(weights, chunks)
    if first or last:
        fixed = {0: first} if first else {}
        if last:
            fixed[pp - 1] = last
        free = [r for r in range(pp) if r not in fixed]
        slots = num_layers - first - last + (1 if embedding and not first else 0) + (1 if loss and not last else 0)
        ranks = [0] * pp
        for r, n in fixed.items():
            ranks[r] = n
        for i, r in enumerate(free):
            ranks[r] = slots // len(free) + (1 if i < slots % len(free) else 0)
        # a rank's slots over its chunks, the larger first; the last rank's larger last (its last chunk may
        # hold the loss slot)
        per_rank = [_even(ranks[r], vpp) for r in range(pp - 1)] + [_even(ranks[-1], vpp)[::-1]]
        sizes = [per_rank[k % pp][k // pp] for k in range(chunks)]
        if embedding and not first:
            sizes[0] -= 1
        if loss and not last:
            sizes[-1] -= 1
        return tuple(sizes)
    use_edges = edges_as_layers and (vpp == 1 or (num_layers + 2) % chunks == 0)
    if embedding or loss or use_edges:
        e, o = (True, True) if use_edges and not (embedding or loss) else (embedding, loss)
        slots = num_layers + e + o
        sizes = [slots // chunks + (1 if c < slots % chunks else 0) for c in range(chunks)]
        sizes[0] -= e
        sizes[-1] -= o
        return tuple(sizes)
    per_rank = _default_rank_layers(num_layers, pp, vpp)
    split = [_even(c, vpp) for c in per_rank]
    return tuple(split[k % pp][k // pp] for k in range(chunks))


def balanced_split(weights: tuple[float, ...], chunks: int) -> tuple[int, ...]:
    """Layers of each of ``chunks`` contiguous chunks minimising the largest chunk's summed weight (binary
    search on the capacity with greedy packing, then the largest chunks split until there are ``chunks``)."""
    w = np.asarray(weights, dtype=float)
    lo, hi = float(w.max()), float(w.sum())
    for _ in range(60):
        cap = (lo + hi) / 2
        if len(_greedy(w, cap)) <= chunks:
            hi = cap
        else:
            lo = cap
    starts = _greedy(w, hi)
    while len(starts) < chunks:  # split the largest splittable chunk
        bounds = starts + [len(w)]
        sizes = [(w[a:b].sum(), i) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b - a > 1]
        _, i = max(sizes)
        a, b = bounds[i], bounds[i + 1]
        c = np.cumsum(w[a:b])
        cut = a + int(np.argmin(np.abs(c[:-1] - c[-1] / 2))) + 1
        starts = sorted(starts + [cut])
    bounds = starts + [len(w)]
    return tuple(int(b - a) for a, b in zip(bounds, bounds[1:]))


def _greedy(weights: np.ndarray, cap: float) -> list[int]:
    """Chunk starts of the greedy packing of ``weights`` under ``cap``."""
    starts, total = [0], 0.0
    for i, w in enumerate(weights):
        if total + w > cap * (1 + 1e-12) and total > 0:
            starts.append(i)
            total = 0.0
        total += w
    return starts


def _even(n: int, parts: int) -> list[int]:
    """n split into ``parts`` near-equal counts, the larger first."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def rank_layers(num_layers: int, pp: int, vpp: int, edges_as_layers: bool = False, first: int = 0,
                last: int = 0, embedding: bool = False, loss: bool = False, layout: int = 0) -> tuple[int, ...]:
    """Decoder layers of every pipeline rank (its chunks of :func:`layer_split`)."""
    sizes = layer_split(num_layers, pp, vpp, edges_as_layers, first, last, bool(embedding), bool(loss),
                        layout=layout)
    return tuple(sum(sizes[r::pp]) for r in range(pp))


def _default_rank_layers(num_layers: int, pp: int, vpp: int) -> list[int]:
    """tpsim's even split per rank: ``layers // (pp x vpp)`` per chunk, the extra layers to the middle ranks
    first (rank 1 the busiest), the rest shared by the first and the last rank."""
    base = num_layers // (pp * vpp)
    extra = num_layers - base * pp * vpp
    middle = pp - 2
    to_middle = min(extra, middle * vpp)
    counts = [base * vpp] * pp
    for i in range(middle):
        counts[1 + i] += to_middle // middle + (1 if i < to_middle % middle else 0)
    left = extra - to_middle
    counts[0] += left // 2
    counts[-1] += left - left // 2
    return counts


def position_kind_counts(kind_of_layer: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
                         edges_as_layers: bool = False, split: SplitFields | None = None,
                         weights: tuple[float, ...] | None = None) -> np.ndarray:
    """(3, kinds, n): layers of each kind on the first, last and busiest middle rank, with the layers in
    order over the model chunks of :func:`layer_split`. The busiest middle rank is the one whose layers
    store the most (its MoE layers outweigh dense ones: the last kind index is never lighter), or with
    per-layer ``weights`` the one whose layers weigh the most."""
    kinds = int(kind_of_layer.max()) + 1
    key = tuple(int(k) for k in kind_of_layer)
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)
    return per_distinct(lambda p_, v_, *f: _kind_counts(key, kinds, p_, v_, edges_as_layers, *f, weights=weights),
                        pp, vpp, *_split_columns(pp, split))


def chunk_starts(kind_of_layer: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
                 weights: tuple[float, ...]) -> np.ndarray:
    """(kinds, n) bool: the kinds of the layers that start a model chunk after the first (the pipeline
    boundaries of the balanced split)."""
    kinds = int(kind_of_layer.max()) + 1
    key = tuple(int(k) for k in kind_of_layer)
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)
    return per_distinct(lambda p_, v_: _chunk_starts(key, kinds, p_, v_, weights), pp, vpp)


@lru_cache(maxsize=256)
def _chunk_starts(kind_of_layer: tuple[int, ...], kinds: int, pp: int, vpp: int,
                  weights: tuple[float, ...]) -> np.ndarray:
    out = np.zeros(kinds, dtype=bool)
    if pp > 1:
        sizes = layer_split(len(kind_of_layer), pp, vpp, weights=weights)
        out[[kind_of_layer[s] for s in np.cumsum(sizes)[:-1]]] = True
    return out


def every_rank_kind_counts(kind_of_layer: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
                           weights: tuple[float, ...] | None, edges_as_layers: bool = False,
                           split: SplitFields | None = None) -> np.ndarray:
    """(kinds, R, n): layers of each kind on every pipeline rank of :func:`layer_split` (the balanced split
    with ``weights``; R the largest pp; zeros past a plan's own ranks)."""
    kinds = int(kind_of_layer.max()) + 1
    key = tuple(int(k) for k in kind_of_layer)
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)
    ranks = int(pp.max())

    def padded(p_: int, v_: int, *fields: int) -> np.ndarray:
        out = np.zeros((kinds, ranks))
        out[:, :p_] = _rank_kind_counts(key, kinds, p_, v_, edges_as_layers, *fields, weights=weights)[0].T
        return out

    if weights is not None:
        return per_distinct(padded, pp, vpp)
    return per_distinct(padded, pp, vpp, *_split_columns(pp, split))


def middle_dominated(kind_of_layer: np.ndarray, pp: np.ndarray, vpp: np.ndarray, edges_as_layers: bool = False,
                     split: SplitFields | None = None) -> np.ndarray:
    """(n,) bool: rank 1 holds at least as many layers of each kind as every other middle rank (or pp <= 3).
    Then the three positions bound every rank's memory peak exactly: a middle rank's states and stored
    activations grow with its layers of each kind, its edges' buffers are alike, and the micro-batches it
    holds in flight never grow with the rank (:func:`tpsim.pipeline.in_flight`), so rank 1 (the middle
    position, :func:`position_kind_counts`) peaks highest among them. With one kind of layer this always holds
    (every split of :func:`layer_split` gives rank 1 the most middle layers)."""
    kinds = int(kind_of_layer.max()) + 1
    key = tuple(int(k) for k in kind_of_layer)
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)

    def one(p_: int, v_: int, *fields: int) -> bool:
        if p_ <= 3:
            return True
        per_rank = _rank_kind_counts(key, kinds, p_, v_, edges_as_layers, *fields)[0]
        return bool(np.all(per_rank[1] >= per_rank[2:-1]))

    return per_distinct(one, pp, vpp, *_split_columns(pp, split)).astype(bool)


@lru_cache(maxsize=256)
def _rank_kind_counts(kind_of_layer: tuple[int, ...], kinds: int, pp: int, vpp: int, edges_as_layers: bool = False,
                      first: int = 0, last: int = 0, embedding: int = 0, loss: int = 0, layout: int = 0,
                      weights: tuple[float, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """((pp, kinds) layers of each kind on every rank of :func:`layer_split`, (layers,) the rank owning each
    layer); read-only."""
    n = len(kind_of_layer)
    owner = np.zeros(n, dtype=np.int64)
    start = 0
    for k, size in enumerate(layer_split(n, pp, vpp, edges_as_layers, first, last, bool(embedding), bool(loss),
                                         weights, layout=layout)):
        owner[start:start + size] = k % pp
        start += size
    kinds_arr = np.asarray(kind_of_layer)
    per_rank = np.stack([np.bincount(kinds_arr[owner == r], minlength=kinds) for r in range(pp)])
    per_rank.setflags(write=False)
    owner.setflags(write=False)
    return per_rank, owner


@lru_cache(maxsize=256)
def _kind_counts(kind_of_layer: tuple[int, ...], kinds: int, pp: int, vpp: int, edges_as_layers: bool = False,
                 first: int = 0, last: int = 0, embedding: int = 0, loss: int = 0, layout: int = 0,
                 weights: tuple[float, ...] | None = None) -> np.ndarray:
    per_rank, owner = _rank_kind_counts(kind_of_layer, kinds, pp, vpp, edges_as_layers, first, last, embedding,
                                        loss, layout, weights)
    n = len(kind_of_layer)
    out = np.zeros((3, kinds))
    out[0] = per_rank[0]
    if pp > 1:
        out[1] = per_rank[-1]
    if pp > 2:
        middle = per_rank[1:-1]
        if weights is not None:  # the middle rank whose layers weigh the most
            weight = np.array([np.asarray(weights)[owner == r].sum() for r in range(1, pp - 1)])
        else:  # the middle rank with the most layers, the later kinds (MoE after dense) breaking ties
            weight = middle.sum(axis=1) * (n + 1) ** 2 + middle @ np.arange(kinds)
        out[2] = middle[int(np.argmax(weight))]
    return out
