"""The search space: every combination of (tp, cp, cp kind, ep, expert tp, pp, vpp, dp, sp, recompute, zero,
micro-batch, overlap, order).

:class:`SearchSpace` holds the candidate values of each plan field (the user's constraints narrow them);
:func:`enumerate_plans` turns it into one :class:`~tpsim.plan.PlanBatch` (struct of numpy arrays) for a GPU
count, without a Python loop per plan. The product is taken over (tp, pp) pairs whose product divides the GPU
count (dp = gpus / (tp x pp)), so the identity tp x pp x dp = gpus always holds.

Rows that are the same plan as another row are never produced (they are not rejected plans):
* rank orders that place the ranks identically: with an axis of size 1 the orders differ only in where that
  axis sits (the canonical one, first in :data:`~tpsim.plan.ORDERS`, is kept);
* ``overlap=False`` when no data-parallel reduction exists (dp x cp = 1 and, for experts, edp = 1);
* a context-parallel kind other than ring when cp = 1; an expert tp other than tp (0) when tp = 1 or the
  model is dense; ep > 1 or an expert tp for a dense model.
Everything else, including rows that break a constraint (``sp`` with tp = 1, ZeRO with dp = 1, ...), is
enumerated and then rejected with a reason by :mod:`tpsim.search.validity`, so ``--why`` can count them.

**The default space of a mixture-of-experts model is pruned** (:meth:`SearchSpace.prunes`; ``full=True`` /
``tpsim plan --full-space`` restores the product). Its ep and expert-tp axes multiply the rank layouts (DeepSeek-V3
on 2048 GPUs: 5.05 M plans, 97 % of them rejected by a plan rule or the stack), so :func:`enumerate_valid` leaves out, instead of
enumerating and counting them, every plan that a plan rule (:data:`tpsim.plan.RULES`) or the training stack's
rules (:data:`tpsim.stacks.RULES`; Megatron-Core: ZeRO-2/3 with pp > 1) reject. The verdicts come from the rule
tables themselves, evaluated per (layout, vpp, sp, micro-batch) row with ZeRO off and on (plan rules) and per
(layout, vpp, sp) row with each ZeRO, recomputation and overlap choice (stack rules, which never read the
micro-batch), so no plan is built to be rejected and none that could be ranked is left out: the ranking is
the full space's (tests/test_search_moe_space.py compares them). Memory is still counted; ``--why`` says how
many plans were left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..model import ModelSpec
from ..pipeline import REQUIRED_CHUNKS
from ..plan import CP_KINDS, FULL_ORDERS, MEGATRON_ORDERS, ORDERS, RECOMPUTE, SCHEDULES, PlanBatch


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
    cp: tuple[int, ...] | None = None
    """context-parallel degrees; None: every divisor of gpus / (tp x pp) up to ``max_cp`` for sequences of at
    least ``cp_min_seq`` tokens, else cp = 1 only."""
    cp_min_seq: int = 16384
    """shortest sequence (tokens) for which the default space (``cp=None``) searches cp > 1. Context
    parallelism is a long-context technique (Llama 3 trained with it in the long-context stage, up to 128k
    tokens); below 16k the activations it divides are small, and searching it multiplies the rank layouts
    (GPT-3 175B on 1024 GPUs: 2.3 M plans and over three minutes of cold collective curves, measured, instead
    of 271 k plans and seconds). Pass ``cp`` (or ``--cp``) to search it anyway; the report's context sweep
    does."""
    max_cp: int | None = None
    """upper bound on cp (None: no bound)."""
    cp_kind: tuple[str, ...] = CP_KINDS
    """context-parallel kinds (ring, a2a), searched where cp > 1."""
    ep: tuple[int, ...] | None = None
    """expert-parallel degrees; None: every divisor of the number of experts (1 for a dense model)."""
    etp: tuple[int, ...] | None = None
    """expert tensor-parallel degrees (0: equal to tp); None: tp and 1 (Megatron-Core's default and the
    DeepSeek-V3 / Mixtral recipes' choice)."""
    pp: tuple[int, ...] | None = None
    """pipeline degrees; None: every divisor of gpus / tp up to the number of layers."""
    vpp: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    """virtual pipeline sizes (model chunks per pipeline rank)."""
    schedule: tuple[str, ...] | None = None
    """pipeline schedules (tpsim/pipeline.py), each with the vpp values it runs (:meth:`pipes`); None: the
    training stack's offered schedules where the planner knows the stack, else 1F1B alone."""
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
    full: bool = False
    """True: enumerate the full product for every model. False (default): the space of a mixture-of-experts
    model leaves out the plans the rule tables reject (module docstring); a dense model's is the product."""

    def prunes(self, model: ModelSpec) -> bool:
        """Whether this space leaves rejected plans of ``model`` out (mixture of experts, ``full`` off)."""
        return bool(model.is_moe) and not self.full

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "micro_batch", "cp", "ep"):
            values = getattr(self, name)
            if values is None:
                continue
            if not values:
                raise InputError(f"{name}: the search space has no candidate value")
            for v in values:
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                    raise InputError(f"{name}={v!r} must be a positive integer")
        for name in ("max_tp", "max_cp"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise InputError(f"{name}={getattr(self, name)} must be a positive integer")
        for k in self.cp_kind:
            if k not in CP_KINDS:
                raise InputError(f"cp_kind={k!r} is not one of {', '.join(CP_KINDS)}")
        for v in self.etp or ():
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise InputError(f"etp={v!r} must be a positive integer (or 0: equal to tp)")
        for r in self.recompute:
            if r not in RECOMPUTE:
                raise InputError(f"recompute={r!r} is not one of {', '.join(RECOMPUTE)}")
        for z in self.zero:
            if z not in (0, 1, 2, 3):
                raise InputError(f"zero={z!r} is not one of 0, 1, 2, 3")
        for o in self.order:
            if o not in ORDERS:
                raise InputError(f"order={o!r} is not one of {', '.join(ORDERS)}")
        for s in self.schedule or ():
            if s not in SCHEDULES:
                raise InputError(f"schedule={s!r} is not one of {', '.join(SCHEDULES)}")
        if self.schedule is not None and not self.schedule:
            raise InputError("schedule: the search space has no candidate value")
        for name in ("sp", "recompute", "zero", "overlap", "order", "cp_kind"):
            if not getattr(self, name):
                raise InputError(f"{name}: the search space has no candidate value")

    def pipes(self) -> tuple[np.ndarray, np.ndarray]:
        """(vpp, schedule code) pairs searched: each schedule with the vpp values of the space it runs (ZB-V
        and DualPipeV two chunks per rank, GPipe, ZB-H1 and DualPipe one, 1F1B and interleaved zero-bubble
        any), in (schedule, vpp) order; 1F1B alone gives the vpp values themselves."""
        pairs = [(v, c) for c in (SCHEDULES.index(s) for s in (self.schedule or ("1f1b",)))
                 for v in self.vpp if REQUIRED_CHUNKS[c] in (0, v)]
        if not pairs:
            raise InputError(f"schedule: none of {', '.join(self.schedule or ())} runs with vpp "
                             f"{', '.join(map(str, self.vpp))}")
        vpp, sched = zip(*pairs)
        return np.asarray(vpp, dtype=np.int64), np.asarray(sched, dtype=np.int64)

    def tp_candidates(self, num_gpus: int) -> tuple[int, ...]:
        """tp values that divide the GPU count (and respect ``max_tp``)."""
        values = divisors(num_gpus) if self.tp is None else tuple(sorted(set(self.tp)))
        values = tuple(t for t in values if num_gpus % t == 0)
        if self.max_tp is not None:
            values = tuple(t for t in values if t <= self.max_tp)
        return values

    def cp_candidates(self, rest: int, seq_len: int | None = None) -> tuple[int, ...]:
        """cp values that divide ``rest`` = gpus / (tp x pp) (and respect ``max_cp``); by default only 1 for a
        sequence shorter than ``cp_min_seq``."""
        if self.cp is None and seq_len is not None and seq_len < self.cp_min_seq:
            return (1,)
        values = divisors(rest) if self.cp is None else tuple(c for c in sorted(set(self.cp)) if rest % c == 0)
        if self.max_cp is not None:
            values = tuple(c for c in values if c <= self.max_cp)
        return values

    def expert_candidates(self, model: ModelSpec, tp: int) -> list[tuple[int, int]]:
        """(ep, etp) pairs for a model: (1, 0) for a dense one; else the requested or default values, with an
        expert tp equal to tp written 0 (one plan, not two)."""
        if not model.is_moe:
            return [(1, 0)]
        eps = divisors(model.num_experts) if self.ep is None else tuple(sorted(set(self.ep)))
        etps = (0, 1) if self.etp is None else tuple(sorted(set(self.etp)))
        pairs = {(e, 0 if t in (0, tp) else t) for e in eps for t in etps}
        return sorted(pairs)

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


LAYOUT_COLUMNS = ("tp", "cp", "pp", "dp", "order", "cp_kind", "ep", "etp")
"""columns of a layout row: what places ranks and sets the parallel collectives."""


def _layouts(model: ModelSpec, num_gpus: int, space: SearchSpace) -> list[tuple[int, ...]]:
    """One row per distinct rank placement and parallel-axis choice (:data:`LAYOUT_COLUMNS`; cp_kind coded)."""
    rows = []
    kinds = [CP_KINDS.index(k) for k in space.cp_kind]
    for tp in space.tp_candidates(num_gpus):
        experts = space.expert_candidates(model, tp)
        for pp in space.pp_candidates(model, num_gpus, tp):
            for cp in space.cp_candidates(num_gpus // (tp * pp), model.seq_len):
                dp = num_gpus // (tp * cp * pp)
                for order in _canonical_orders(tp, pp, dp, space.order, cp):
                    for kind in (kinds if cp > 1 else [0]):
                        rows += [(tp, cp, pp, dp, order, kind, ep, etp) for ep, etp in experts]
    return rows


def _reduces(lay: np.ndarray) -> np.ndarray:
    """Layout rows with a data-parallel reduction: dp x cp > 1, or an expert data-parallel group."""
    tp, cp, dp, ep, etp = (lay[:, LAYOUT_COLUMNS.index(c)] for c in ("tp", "cp", "dp", "ep", "etp"))
    etp = np.where(etp == 0, tp, etp)
    return (dp * cp > 1) | (tp * cp * dp > etp * ep)


PER_LAYOUT = ("vpp", "sp", "recompute", "zero", "micro_batch", "overlap")


def _checked_layouts(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace) -> np.ndarray:
    """(layouts, LAYOUT_COLUMNS) int64: the space's layouts for ``num_gpus`` GPUs, after checking the counts."""
    if num_gpus <= 0:
        raise InputError(f"gpus={num_gpus} must be a positive integer")
    if global_batch <= 0:
        raise InputError(f"global_batch={global_batch} must be a positive integer")
    return np.array(_layouts(model, num_gpus, space), dtype=np.int64).reshape(-1, len(LAYOUT_COLUMNS))


def enumerate_plans(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace) -> Enumeration:
    """The cartesian product of the space for ``num_gpus`` GPUs, as one PlanBatch (vectorized)."""
    layouts = _checked_layouts(model, num_gpus, global_batch, space)
    pipe_vpp, pipe_schedule = space.pipes()
    per_layout = [np.arange(pipe_vpp.size), np.asarray(space.sp, dtype=bool),
                  np.asarray([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64),
                  np.asarray(space.zero, dtype=np.int64), np.asarray(space.micro_batch, dtype=np.int64),
                  np.asarray(space.overlap, dtype=bool)]
    # index grid over (layout, vpp, sp, recompute, zero, micro_batch, overlap)
    sizes = [len(layouts)] + [len(a) for a in per_layout]
    grid = np.indices(sizes, dtype=np.int32).reshape(len(sizes), -1)
    lay_index = grid[0]
    cols = {name: values[grid[i + 1]] for i, (name, values) in enumerate(zip(PER_LAYOUT, per_layout))}
    cols["vpp"], cols["schedule"] = pipe_vpp[cols["vpp"]], pipe_schedule[cols["vpp"]]
    keep = cols["overlap"] | _reduces(layouts)[lay_index] | (True not in space.overlap)
    if not keep.all():
        lay_index = lay_index[keep]
        cols = {k: v[keep] for k, v in cols.items()}
    lay = layouts[lay_index]
    axes = {name: lay[:, i] for i, name in enumerate(LAYOUT_COLUMNS)}
    batch = PlanBatch.from_arrays(dtype=space.dtype, attention=space.attention, **axes,
                                  global_batch=np.full(len(lay), global_batch, dtype=np.int64), **cols)
    return Enumeration(plans=batch, num_gpus=num_gpus, layouts=len(layouts))


@dataclass(frozen=True)
class ValidPlans:
    """The valid plans of a space for one GPU count, and how many plans were enumerated and rejected."""

    plans: PlanBatch
    num_gpus: int
    enumerated: int
    """rows of the space: the full product (as :func:`enumerate_plans` would build them), or for a pruned
    space the plans it holds."""
    codes: np.ndarray
    """per code of :func:`tpsim.plan.violation_codes` (0 = valid), the number of enumerated plans with it."""
    left_out: int = 0
    """plans of the full product a pruned space left out (all rejected by a plan rule or the stack)."""


@dataclass(frozen=True)
class _Partial:
    """(layout, vpp, sp, micro-batch) rows of a space and the plan rules' verdict with ZeRO off and on."""

    lay: np.ndarray
    axes: dict
    part: dict
    reduces: np.ndarray
    code_of: dict
    """0 / 1 (ZeRO off / on) -> violation code per row."""


def _partial(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace) -> _Partial:
    from ..plan import violation_codes

    layouts = _checked_layouts(model, num_gpus, global_batch, space)
    pipe_vpp, pipe_schedule = space.pipes()
    first = [np.arange(pipe_vpp.size), np.asarray(space.sp, dtype=bool),
             np.asarray(space.micro_batch, dtype=np.int64)]
    sizes = [len(layouts)] + [len(a) for a in first]
    grid = np.indices(sizes, dtype=np.int32).reshape(len(sizes), -1)
    lay = layouts[grid[0]]
    part = {name: values[grid[i + 1]] for i, (name, values) in enumerate(zip(("vpp", "sp", "micro_batch"), first))}
    part["vpp"], part["schedule"] = pipe_vpp[part["vpp"]], pipe_schedule[part["vpp"]]
    axes = {name: lay[:, i] for i, name in enumerate(LAYOUT_COLUMNS)}
    gb = np.full(len(lay), global_batch, dtype=np.int64)
    code_of = {}
    for z in sorted({min(int(z), 1) for z in space.zero}):
        batch = PlanBatch.from_arrays(dtype=space.dtype, attention=space.attention, **axes, global_batch=gb,
                                      zero=np.full(len(lay), z, dtype=np.int64), **part)
        code_of[z] = violation_codes(model, batch, num_gpus)
    return _Partial(lay=lay, axes=axes, part=part, reduces=_reduces(lay), code_of=code_of)


def _stack_admits(model: ModelSpec, space: SearchSpace, stack: Any, p: _Partial, z: int,
                  rows: np.ndarray) -> dict[tuple[int, bool], np.ndarray]:
    """Of the partial ``rows`` (valid under the plan rules), per (recomputation code, overlap) of the space,
    those the stack runs with ZeRO ``z`` (its rules never read the micro-batch, so each (layout, vpp, sp) is
    checked once)."""
    n_mb = len(space.micro_batch)
    head, first = np.unique(rows // n_mb, return_index=True)
    pick = rows[first]
    cols = {name: a[pick] for name, a in p.axes.items()}
    cols.update({name: a[pick] for name, a in p.part.items()})
    out = {}
    for rc in space.recompute:
        for ov in space.overlap:
            batch = PlanBatch.from_arrays(dtype=space.dtype, attention=space.attention, **cols, zero=z,
                                          recompute=RECOMPUTE.index(rc), overlap=ov, global_batch=1)
            ok = stack.violation_codes(batch, model) == 0 if pick.size else np.zeros(0, dtype=bool)
            out[(RECOMPUTE.index(rc), bool(ov))] = rows[np.isin(rows // n_mb, head[ok])]
    return out


_PRUNED: dict = {}
"""the last pruned space: (id of model, gpus, batch, space, id of stack) -> ((model, stack), (partial rows, kept
pieces, count)); the entry holds the model and stack, so their ids cannot be reused while it is kept."""


def _pruned(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace,
            stack: Any) -> tuple[_Partial, list, int]:
    """The partial rows, the (ZeRO, {(recompute code, overlap): kept rows}) pieces of a pruned space and the
    plans it holds. The last one is remembered: ``tpsim plan`` counts it for the size guard, then searches it."""
    key = (id(model), num_gpus, global_batch, space, id(stack))
    hit = _PRUNED.get(key)
    if hit is not None:
        return hit[1]
    p = _partial(model, num_gpus, global_batch, space)
    pieces = []
    for z in space.zero:
        valid = np.flatnonzero(p.code_of[min(int(z), 1)] == 0)
        pieces.append((int(z), _stack_admits(model, space, stack, p, int(z), valid)))
    count = _piece_count(pieces, p.reduces, space)
    _PRUNED.clear()
    _PRUNED[key] = ((model, stack), (p, pieces, count))
    return p, pieces, count


def _stack_of(stack: Any) -> Any:
    from ..estimator.context import resolve_stack
    return resolve_stack(stack)


def enumerate_valid(model: ModelSpec, num_gpus: int, global_batch: int, space: SearchSpace,
                    stack: Any = None) -> ValidPlans:
    """The valid rows of :func:`enumerate_plans` (same rows, same order of fields; the rejected ones only
    counted), built without materializing the product: the plan rules read only the layout, vpp, sp and
    micro-batch, and of ZeRO only whether it is on (``zero-needs-dp``), never recomputation or overlap. So the
    rules run once per (layout, vpp, sp, micro-batch) row with ZeRO off and once with it on, each result
    counts for every recomputation and overlap choice, and only the valid rows are expanded. The first broken
    rule of every row is the one :func:`enumerate_plans` + :func:`tpsim.plan.violation_codes` name.

    A pruned space (:meth:`SearchSpace.prunes`: mixture-of-experts models by default) leaves the rejected
    rows out instead of counting them, and the plans the training ``stack`` (a profile, name or path; None:
    megatron) rejects (module docstring)."""
    from ..plan import RULES

    if space.prunes(model):
        p, pieces, count = _pruned(model, num_gpus, global_batch, space, _stack_of(stack))
        counts = np.zeros(len(RULES) + 1, dtype=np.int64)
        counts[0] = count
        plans = _expand(pieces, p.axes, p.part, p.reduces, space, global_batch)
        left = space_size(model, num_gpus, dataclasses.replace(space, full=True)) - count
        return ValidPlans(plans=plans, num_gpus=num_gpus, enumerated=count, codes=counts, left_out=left)
    p = _partial(model, num_gpus, global_batch, space)
    overlaps = np.where(p.reduces | (True not in space.overlap), len(space.overlap), 1)
    per_zero = len(space.recompute) * overlaps  # plans of one (partial row, zero) pair
    counts = np.zeros(len(RULES) + 1, dtype=np.int64)
    pieces = []
    for z in space.zero:
        code = p.code_of[min(int(z), 1)]
        counts += np.bincount(code, weights=per_zero, minlength=len(RULES) + 1).astype(np.int64)
        pieces.append((int(z), np.flatnonzero(code == 0)))
    plans = _expand(pieces, p.axes, p.part, p.reduces, space, global_batch)
    return ValidPlans(plans=plans, num_gpus=num_gpus, enumerated=int(counts.sum()), codes=counts)


def _piece_rows(pieces: list, reduces: np.ndarray, space: SearchSpace) -> tuple[np.ndarray, ...]:
    """(partial row, zero, recompute code, overlap) of every plan of ``pieces``: (zero, rows) pairs, the rows
    taken with every recomputation and overlap choice, or (zero, {(recompute code, overlap): rows}); overlap
    off only where a data-parallel reduction exists (unless the space has only overlap off)."""
    rc_values = [RECOMPUTE.index(r) for r in space.recompute]
    only = True not in space.overlap
    rows, zeros, rcs, ovs = [], [], [], []
    for z, ok in pieces:
        for rc in rc_values:
            for ov in space.overlap:
                got = ok[(rc, bool(ov))] if isinstance(ok, dict) else ok
                sel = got if (ov or only) else got[reduces[got]]
                rows.append(sel)
                zeros.append(np.full(sel.size, z, dtype=np.int64))
                rcs.append(np.full(sel.size, rc, dtype=np.int64))
                ovs.append(np.full(sel.size, ov, dtype=bool))
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, bool)
    return tuple(np.concatenate(x) for x in (rows, zeros, rcs, ovs))


def _piece_count(pieces: list, reduces: np.ndarray, space: SearchSpace) -> int:
    """Plans of ``pieces`` (as :func:`_piece_rows` lists them), counted without building them."""
    only = True not in space.overlap
    count = 0
    for _, ok in pieces:
        for rc in (RECOMPUTE.index(r) for r in space.recompute):
            for ov in space.overlap:
                got = ok[(rc, bool(ov))] if isinstance(ok, dict) else ok
                count += got.size if (ov or only) else int(np.count_nonzero(reduces[got]))
    return count


def _expand(pieces: list, axes: dict, part: dict, reduces: np.ndarray, space: SearchSpace,
            global_batch: int) -> PlanBatch:
    """The plans of ``pieces`` (:func:`_piece_rows`), in the column order of :func:`enumerate_plans` (rows
    sorted like it: layout, vpp, sp, recompute, zero, micro-batch, overlap)."""
    rc_values = np.asarray([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64)
    row, zero, rc, ov = _piece_rows(pieces, reduces, space)
    # enumerate_plans' order: layout, vpp, sp, recompute, zero, micro_batch, overlap (the partial rows are in
    # (layout, vpp, sp, micro_batch) order)
    n_mb = len(space.micro_batch)
    lay_vpp_sp, mb_i = np.divmod(row, n_mb)
    z_i = _positions(space.zero, zero.astype(np.int64))
    rc_i = _positions(rc_values, rc.astype(np.int64))
    ov_i = _positions([int(v) for v in space.overlap], ov.astype(np.int64))
    key = (((lay_vpp_sp * len(rc_values) + rc_i) * len(space.zero) + z_i) * n_mb + mb_i) * len(space.overlap) + ov_i
    order = np.argsort(key, kind="stable")
    row, zero, rc, ov = row[order], zero[order], rc[order], ov[order]
    cols = {name: a[row] for name, a in axes.items()}
    cols.update({name: a[row] for name, a in part.items()})
    return PlanBatch(**cols, recompute=rc.astype(np.int64), zero=zero.astype(np.int64), overlap=ov.astype(bool),
                     global_batch=np.full(row.size, global_batch, dtype=np.int64), dtype=space.dtype,
                     attention=space.attention)


def _positions(values, column: np.ndarray) -> np.ndarray:
    """Index of each entry of ``column`` in ``values`` (small non-negative integers)."""
    lookup = np.zeros(max(int(v) for v in values) + 1, dtype=np.int64)
    lookup[np.asarray(values, dtype=np.int64)] = np.arange(len(values))
    return lookup[column]


def space_size(model: ModelSpec, num_gpus: int, space: SearchSpace, global_batch: int | None = None,
               stack: Any = None) -> int:
    """Number of plans the space holds: the rows :func:`enumerate_plans` would produce (without building
    them); for a pruned space (:meth:`SearchSpace.prunes`) with ``global_batch`` given, the plans
    :func:`enumerate_valid` keeps (the plan rules' verdict per (layout, vpp, sp, micro-batch) row and the
    ``stack``'s per (layout, vpp, sp) row and ZeRO, recomputation and overlap choice: no plan is built)."""
    if space.prunes(model) and global_batch is not None:
        return _pruned(model, num_gpus, global_batch, space, _stack_of(stack))[2]
    per = space.pipes()[0].size * len(space.sp) * len(space.recompute) * len(space.zero) * len(space.micro_batch)
    layouts = np.array(_layouts(model, num_gpus, space), dtype=np.int64).reshape(-1, len(LAYOUT_COLUMNS))
    if not len(layouts):
        return 0
    overlaps = np.where(_reduces(layouts) | (True not in space.overlap), len(space.overlap), 1)
    return int(per * overlaps.sum())


__all__ = ["SearchSpace", "Enumeration", "ValidPlans", "enumerate_plans", "enumerate_valid", "space_size",
           "divisors"]
