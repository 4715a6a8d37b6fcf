"""The search space: every combination of (tp, pp, vpp, dp, sp, recompute, zero, micro-batch, overlap, order).

:class:`SearchSpace` holds the candidate values of each plan field (the user's constraints narrow them);
:func:`enumerate_plans` turns it into one :class:`~tpsim.plan.PlanBatch` (struct of numpy arrays) for a GPU
count, without a Python loop per plan. The product is taken over (tp, pp) pairs whose product divides the GPU
count (dp = gpus / (tp x pp)), so the identity tp x pp x dp = gpus always holds.

Two kinds of rows are never produced because they are the same plan as another row (not rejected plans):
* rank orders that place the ranks identically: with an axis of size 1 the orders differ only in where that
  axis sits (the canonical one, first in :data:`~tpsim.plan.ORDERS`, is kept);
* ``overlap=False`` when dp = 1 (there is no DP reduction to overlap).
Everything else, including rows that break a constraint (``sp`` with tp = 1, ZeRO with dp = 1, ...), is
enumerated and then rejected with a reason by :mod:`tpsim.search.validity`, so ``--why`` can count them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..model import ModelSpec
from ..plan import FULL_ORDERS, MEGATRON_ORDERS, ORDERS, RECOMPUTE, PlanBatch


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n``, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Candidate values per plan field; ``None`` for tp/pp means every divisor of the GPU count."""

    tp: tuple[int, ...] | None = None
    """tensor-parallel degrees; None: every divisor of the GPU count up to ``max_tp``."""
    max_tp: int | None = None
    """upper bound on tp (None: no bound)."""
    pp: tuple[int, ...] | None = None
    """pipeline degrees; None: every divisor of gpus / tp up to the number of layers."""
    vpp: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    """virtual pipeline sizes (model chunks per pipeline rank)."""
    sp: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE
    zero: tuple[int, ...] = (0, 1, 2, 3)
    micro_batch: tuple[int, ...] = (1, 2, 4, 8)
    """sequences per micro-batch."""
    overlap: tuple[bool, ...] = (True, False)
    order: tuple[str, ...] = MEGATRON_ORDERS
    """rank orders; by default the six that place cp right after tp, as Megatron-Core's RankGenerator does
    (any of :data:`~tpsim.plan.ORDERS` may be asked for)."""
    dtype: str = "bf16"
    attention: str = "flash"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "micro_batch"):
            values = getattr(self, name)
            if values is None:
                continue
            if not values:
                raise InputError(f"{name}: the search space has no candidate value")
            for v in values:
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                    raise InputError(f"{name}={v!r} must be a positive integer")
        if self.max_tp is not None and self.max_tp <= 0:
            raise InputError(f"max_tp={self.max_tp} must be a positive integer")
        for r in self.recompute:
            if r not in RECOMPUTE:
                raise InputError(f"recompute={r!r} is not one of {', '.join(RECOMPUTE)}")
        for z in self.zero:
            if z not in (0, 1, 2, 3):
                raise InputError(f"zero={z!r} is not one of 0, 1, 2, 3")
        for o in self.order:
            if o not in ORDERS:
                raise InputError(f"order={o!r} is not one of {', '.join(ORDERS)}")
        for name in ("sp", "recompute", "zero", "overlap", "order"):
            if not getattr(self, name):
                raise InputError(f"{name}: the search space has no candidate value")

    def tp_candidates(self, num_gpus: int) -> tuple[int, ...]:
        """tp values that divide the GPU count (and respect ``max_tp``)."""
        values = divisors(num_gpus) if self.tp is None else tuple(sorted(set(self.tp)))
        values = tuple(t for t in values if num_gpus % t == 0)
        if self.max_tp is not None:
            values = tuple(t for t in values if t <= self.max_tp)
        return values

    def pp_candidates(self, model: ModelSpec, num_gpus: int, tp: int) -> tuple[int, ...]:
        """pp values that divide gpus / tp; unconstrained pp stops at the number of layers."""
        rest = num_gpus // tp
        if self.pp is None:
            return tuple(p for p in divisors(rest) if p <= model.num_layers)
        return tuple(p for p in sorted(set(self.pp)) if rest % p == 0)


@dataclass(frozen=True)
class Enumeration:
    """The enumerated plans of one GPU count."""

    plans: PlanBatch
    num_gpus: int
    layouts: int = field(default=0)
    """distinct (tp, pp, dp) layouts in the batch."""


def _canonical_orders(tp: int, pp: int, dp: int, orders: tuple[str, ...], cp: int = 1) -> list[int]:
    """Indices (into ORDERS) of the requested orders that place ranks differently for these sizes."""
    sizes = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    seen: dict[tuple[str, ...], int] = {}
    for i, dims in enumerate(FULL_ORDERS):  # canonical = first in ORDERS among equivalent ones
        key = tuple(d for d in dims if sizes[d] > 1)
        seen.setdefault(key, i)
    keep = []
    for name in orders:
        key = tuple(d for d in FULL_ORDERS[ORDERS.index(name)] if sizes[d] > 1)
        idx = seen[key]
        if idx not in keep:
            keep.append(idx)
    return sorted(keep)


def _layouts(model: ModelSpec, num_gpus: int, space: SearchSpace) -> list[tuple[int, int, int, int]]:
    """(tp, pp, dp, order index) rows, one per distinct rank placement."""
    rows = []
    for tp in space.tp_candidates(num_gpus):
        for pp in space.pp_candidates(model, num_gpus, tp):
            dp = num_gpus // (tp * pp)
            for order in _canonical_orders(tp, pp, dp, space.order):
                rows.append((tp, pp, dp, order))
    return rows


def enumerate_plans(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace) -> Enumeration:
    """The cartesian product of the space for ``num_gpus`` GPUs, as one PlanBatch (vectorized)."""
    if num_gpus <= 0:
        raise InputError(f"gpus={num_gpus} must be a positive integer")
    if global_batch <= 0:
        raise InputError(f"global_batch={global_batch} must be a positive integer")
    layouts = np.array(_layouts(model, num_gpus, space), dtype=np.int64).reshape(-1, 4)
    per_layout = [np.asarray(space.vpp, dtype=np.int64), np.asarray(space.sp, dtype=bool),
                  np.asarray([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64),
                  np.asarray(space.zero, dtype=np.int64), np.asarray(space.micro_batch, dtype=np.int64),
                  np.asarray(space.overlap, dtype=bool)]
    # index grid over (layout, vpp, sp, recompute, zero, micro_batch, overlap)
    sizes = [len(layouts)] + [len(a) for a in per_layout]
    grid = np.indices(sizes, dtype=np.int32).reshape(len(sizes), -1)
    lay = layouts[grid[0]]
    cols = {name: values[grid[i + 1]] for i, (name, values) in
            enumerate(zip(("vpp", "sp", "recompute", "zero", "micro_batch", "overlap"), per_layout))}
    keep = cols["overlap"] | (lay[:, 2] > 1) | (True not in space.overlap)
    if not keep.all():
        lay = lay[keep]
        cols = {k: v[keep] for k, v in cols.items()}
    batch = PlanBatch.from_arrays(dtype=space.dtype, attention=space.attention, tp=lay[:, 0], pp=lay[:, 1],
                                  dp=lay[:, 2], order=lay[:, 3],
                                  global_batch=np.full(len(lay), global_batch, dtype=np.int64), **cols)
    return Enumeration(plans=batch, num_gpus=num_gpus, layouts=len(layouts))


def space_size(model: ModelSpec, num_gpus: int, space: SearchSpace) -> int:
    """Number of rows :func:`enumerate_plans` would produce (without building them)."""
    n = 0
    per = len(space.vpp) * len(space.sp) * len(space.recompute) * len(space.zero) * len(space.micro_batch)
    for tp, pp, dp, _ in _layouts(model, num_gpus, space):
        overlaps = len(space.overlap) if dp > 1 or True not in space.overlap else 1
        n += per * overlaps
    return n


__all__ = ["SearchSpace", "Enumeration", "enumerate_plans", "space_size", "divisors"]
