"""The caches an :class:`~tpsim.estimator.context.EstimationContext` owns (their keys: see that module)."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .keys import concat_rows, field_names, sorted_values

RECENT_BATCHES = 32
"""batches whose key rows a :class:`PatternStore` remembers whole."""
RECENT_CELLS = 4096
"""key cells (rows x columns) up to which a batch's pattern keys are remembered by their bytes."""
MEMO_BYTES = 64 << 20
"""array bytes of stage results a context keeps (a repeated plan or search chunk reuses them)."""
ENVELOPE_BYTES = np.logspace(0, 13, 131)
"""1 B .. 10 TB: the message sizes any collective of a plan can have (the envelope's domain)."""


@dataclass(frozen=True)
class Envelope:
    """A cost curve and the lines of it that are the minimum somewhere in 1 B .. 10 TB (the others never
    matter), with each line's ``"op: algorithm"`` code in the context's name table (-1: a one-rank group)."""

    curve: Any
    """the :class:`~tpsim.collectives.curve.CostCurve`."""
    latency_s: np.ndarray
    """latency of the envelope's lines, seconds."""
    sec_per_byte: np.ndarray
    codes: np.ndarray
    """name code of each envelope line."""

    @staticmethod
    def of(curve: Any, op: str, code: Callable[[str], int]) -> "Envelope":
        lat = np.asarray(curve.latency_s, dtype=float)
        spb = np.asarray(curve.sec_per_byte, dtype=float)
        winners = sorted_values(np.argmin(lat[None, :] + ENVELOPE_BYTES[:, None] * spb[None, :], axis=1))
        codes = np.array([-1 if curve.algorithms[i] == "none" else code(f"{op}: {curve.algorithms[i]}")
                          for i in winners], dtype=np.int32)
        return Envelope(curve=curve, latency_s=lat[winners], sec_per_byte=spb[winners], codes=codes)


@dataclass(eq=False)
class CurveCache:
    """What depends only on the collective model: envelopes per (layout, axes, op), their padded tables per
    (axes, op), the ``"op: algorithm"`` name codes and the rank layouts. Contexts on one collective model share
    it (:func:`context_for`): its keys do not involve the model, compute model or stack."""

    collectives: Any
    """the collective model every entry was computed with."""
    curves: dict = field(default_factory=dict)
    """(layout, axes, op) -> Envelope."""
    by_groups: dict = field(default_factory=dict)
    """(digest of the rank groups, op) -> Envelope: layouts whose axis has the same groups (an ep group is the
    same ranks whatever the split of the other ranks into tp, cp and dp) share one curve."""
    tables: dict = field(default_factory=dict)
    """(axes, op) -> EnvelopeTable."""
    names: dict = field(default_factory=dict)
    """"op: algorithm" -> code (the order of first use)."""
    layouts: dict = field(default_factory=dict)
    """(order, axis sizes) -> RankLayout."""
    layout_ids: dict = field(default_factory=dict)
    """RankLayout -> its number in this cache (the envelope tables index their rows by it)."""
    plan_layouts: dict = field(default_factory=dict)
    """(tp, cp, dp, pp, ep, expert tp, order code) -> (dense layout, expert layout, their numbers)."""


@dataclass
class ContextCaches:
    curves: CurveCache
    memo: OrderedDict = field(default_factory=OrderedDict)
    """key -> (value, bytes)."""
    memo_bytes: int = 0
    layers: dict = field(default_factory=dict)
    """(dtype, attention) -> RowStore of layer costs."""
    stack_checks: OrderedDict = field(default_factory=OrderedDict)
    """plan -> the stack rule it breaks (None: runnable); the last few thousand plans checked."""
    patterns: dict = field(default_factory=dict)
    """(dtype, attention) -> PatternStore of the partition and communication stages."""
    constants: dict = field(default_factory=dict)
    """key -> what depends on the context (and a dtype) alone, not on any plan: the FLOPs per sequence, the
    term sources (kept by :meth:`EstimationContext.clear_results`)."""


@dataclass
class EnvelopeTable:
    """Envelopes of one (axes, op) for every layout seen, one row each, padded to one width by repeating the
    last line (which leaves the minimum and its line unchanged): rows x lines arrays. ``row_of`` maps a
    layout's number (:attr:`CurveCache.layout_ids`) to its row (-1: not yet in the table)."""

    index: dict = field(default_factory=dict)
    latency_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 1)))
    sec_per_byte: np.ndarray = field(default_factory=lambda: np.zeros((0, 1)))
    codes: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.int32))
    row_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def add(self, layout: Any, env: Envelope, number: int | None = None) -> None:
        self.add_many([layout], [env], [number])

    def add_many(self, layouts: list, envs: list, numbers: list) -> None:
        """Append rows (one concatenation for all of them)."""
        if not envs:
            return
        width = max([self.latency_s.shape[1]] + [e.latency_s.size for e in envs])
        rows = [_pad(a, width) for a in (self.latency_s, self.sec_per_byte, self.codes)]
        new = [np.concatenate([_pad(getattr(e, f)[None, :], width) for e in envs])
               for f in ("latency_s", "sec_per_byte", "codes")]
        self.latency_s, self.sec_per_byte, self.codes = (np.concatenate([r, x]) for r, x in zip(rows, new))
        for layout, number in zip(layouts, numbers):
            row = len(self.index)
            self.index[layout] = row
            if number is not None:
                if number >= self.row_of.size:
                    grown = np.full(max(2 * self.row_of.size, number + 1, 64), -1, dtype=np.int64)
                    grown[:self.row_of.size] = self.row_of
                    self.row_of = grown
                self.row_of[number] = row

    def rows(self, numbers: np.ndarray, layouts: list, envelope: Callable[[Any], Envelope]) -> np.ndarray:
        """Row of each layout (``numbers[i]`` is ``layouts[i]``'s number); the missing ones are added, their
        envelopes from ``envelope(layout)``."""
        if numbers.size and int(numbers.max()) >= self.row_of.size:
            grown = np.full(int(numbers.max()) + 1, -1, dtype=np.int64)
            grown[:self.row_of.size] = self.row_of
            self.row_of = grown
        found = self.row_of[numbers]
        missing = np.flatnonzero(found < 0)
        if missing.size:
            _, first = np.unique(numbers[missing], return_index=True)
            new = missing[np.sort(first)]
            self.add_many([layouts[i] for i in new], [envelope(layouts[i]) for i in new],
                          [int(numbers[i]) for i in new])
            found = self.row_of[numbers]
        return found


def _pad(a: np.ndarray, width: int) -> np.ndarray:
    if a.shape[1] >= width or a.shape[0] == 0:
        return a if a.shape[0] else np.zeros((0, width), dtype=a.dtype)
    return np.concatenate([a, np.repeat(a[:, -1:], width - a.shape[1], axis=1)], axis=1)


@dataclass
class RowStore:
    """Stage results per key row: ``index`` maps a key row to its row in ``value`` (arrays over rows)."""

    index: dict = field(default_factory=dict)
    value: Any = None

    def rows(self, keys: np.ndarray, build: Callable[[np.ndarray], Any]) -> np.ndarray:
        """Row of each key in ``value``; rows not seen before are built in one call and appended."""
        wanted = [tuple(r) for r in keys.tolist()]
        missing = [i for i, k in enumerate(wanted) if k not in self.index]
        if missing:
            new = build(keys[missing])
            self.value = new if self.value is None else concat_rows(self.value, new)
            for i in missing:
                self.index[wanted[i]] = len(self.index)
        return np.fromiter((self.index[k] for k in wanted), dtype=np.int64, count=len(wanted))


@dataclass
class PatternStore:
    """Stage results per key row, kept across batches (a search's chunks share most communication patterns):
    ``keys[r]`` is the key row of row r of ``value``. Rows are appended while the new ones have the structure
    of the kept ones (the same dict keys, the same optional parts present) and the arrays stay under
    :data:`MEMO_BYTES`; otherwise the store starts again from the batch's own rows."""

    keys: np.ndarray | None = None
    value: Any = None
    signature: Any = None
    nbytes: int = 0
    recent: dict = field(default_factory=dict)
    """the key rows' bytes of the last few batches -> their rows (a repeated plan or chunk: one lookup)."""
    packed: Any = None
    """(radix per column, the kept rows packed into int64 keys and sorted, their rows in ``keys``): the kept
    rows grouped once (reset when rows are added), each batch's rows looked up in them by binary search."""

    def rows(self, keys: np.ndarray, build: Callable[[np.ndarray], Any]) -> np.ndarray:
        """Row of each key (distinct rows of small non-negative integers) in ``value``; ``build(positions)``
        computes the rows of the keys at those positions of ``keys`` (the missing ones, in one call)."""
        # a small batch (one plan, a few) is looked up by its bytes; a large one's bytes cost more to copy and
        # hash than the binary search of :meth:`_find`
        asked = (keys.shape, keys.tobytes()) if keys.size <= RECENT_CELLS else None
        hit = None if asked is None else self.recent.get(asked)
        if hit is not None:
            return hit
        found = self._find(keys)
        missing = np.flatnonzero(found < 0)
        if missing.size:
            new = build(missing)
            signature, size = structure(new), array_bytes(new)
            if self.value is not None and (signature != self.signature or self.nbytes + size > MEMO_BYTES):
                self.keys = self.value = self.packed = None  # start again: this batch's rows only
                self.nbytes = 0
                self.recent.clear()
                if missing.size < len(keys):
                    missing = np.arange(len(keys))
                    new = build(missing)
                    signature, size = structure(new), array_bytes(new)
                found = np.full(len(keys), -1, dtype=np.int64)
            start = 0 if self.keys is None else len(self.keys)
            self.packed = None
            self.value = new if self.value is None else concat_rows(self.value, new)
            self.keys = keys[missing] if self.keys is None else np.concatenate([self.keys, keys[missing]])
            self.signature, self.nbytes = signature, self.nbytes + size
            found[missing] = start + np.arange(missing.size)
        if asked is None:
            return found
        if len(self.recent) >= RECENT_BATCHES:
            self.recent.pop(next(iter(self.recent)))
        self.recent[asked] = found
        return found

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the store (-1: not kept): the batch's rows packed as the kept ones were
        (:attr:`packed`) and looked up in them; kept rows are packed again only when rows were added or the
        batch's values exceed their radix."""
        kept = self.keys
        if kept is None or not len(kept):
            return np.full(len(keys), -1, dtype=np.int64)
        if keys.min(initial=0) < 0:
            return self._find_in_dict(keys)
        top = keys.max(axis=0) if len(keys) else np.zeros(kept.shape[1], dtype=np.int64)
        packed = self.packed
        if packed is None or np.any(top >= packed[0]):
            radix = np.maximum(kept.max(axis=0), top) + 1
            if kept.min(initial=0) < 0 or math.prod(int(r) for r in radix) >= 1 << 62:
                return self._find_in_dict(keys)  # not packable into one int64 key: a dict of the rows
            code = _pack(kept, radix)
            order = np.argsort(code, kind="stable")
            packed = self.packed = (radix, code.take(order), order)
        radix, ordered, order = packed
        code = _pack(keys, radix)
        at = np.minimum(np.searchsorted(ordered, code), len(ordered) - 1)
        return np.where(ordered.take(at) == code, order.take(at), -1)

    def _find_in_dict(self, keys: np.ndarray) -> np.ndarray:
        at = {tuple(r): i for i, r in enumerate(self.keys.tolist())}
        return np.array([at.get(tuple(r), -1) for r in keys.tolist()], dtype=np.int64)


def _pack(rows: np.ndarray, radix: np.ndarray) -> np.ndarray:
    """Rows of small non-negative integers as one int64 each (mixed radix; the product of ``radix`` < 2**62)."""
    code = rows[:, 0].astype(np.int64)
    for j in range(1, rows.shape[1]):
        r = int(radix[j])
        if r == 1:  # a column of zeros adds nothing
            continue
        code *= r
        code += rows[:, j]
    return code


def structure(value: Any) -> Any:
    """What must match for two stage results' rows to be concatenated: the dict keys, which optional parts
    are arrays, the arrays' leading shapes and dtypes."""
    kind = type(value)
    if kind is np.ndarray:
        return ("array", value.shape[:-1], value.dtype.str)
    if kind in _LEAVES:  # the common leaves first (a layer-cost tree holds about a hundred names and numbers)
        return ("value", value)
    if isinstance(value, np.ndarray):
        return ("array", value.shape[:-1], value.dtype.str)
    if isinstance(value, dict):
        return tuple((k, structure(v)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return tuple([structure(v) for v in value])
    names = field_names(kind)
    if names:
        return (kind.__name__,) + tuple([structure(getattr(value, f)) for f in names])
    return ("value", value if isinstance(value, (int, float, str, type(None))) else kind.__name__)


def array_bytes(value: Any) -> int:
    """Bytes of the numpy arrays inside a stage result (dataclasses, dicts, tuples)."""
    kind = type(value)
    if kind is np.ndarray:
        return int(value.nbytes)
    if kind in _LEAVES:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum([array_bytes(v) for v in value.values()])
    if isinstance(value, (tuple, list)):
        return sum([array_bytes(v) for v in value])
    total = 0
    for f in field_names(kind):  # the leaves here, without a call each
        v = getattr(value, f)
        t = type(v)
        if t is np.ndarray:
            total += int(v.nbytes)
        elif t not in _LEAVES:
            total += array_bytes(v)
    return total


_LEAVES = frozenset({str, int, float, bool, type(None)})
"""types :func:`structure` and :func:`array_bytes` answer for without asking further."""
