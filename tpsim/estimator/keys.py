"""Distinct rows of plan columns, and row operations on stage results: the estimator computes per distinct
key and gathers back to the plans."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Keys:
    """The distinct rows of some integer columns: ``first[j]`` is the first plan with key j, ``inverse[i]``
    the key of plan i, ``rows`` the key columns (n_keys, n_columns)."""

    rows: np.ndarray
    first: np.ndarray
    inverse: np.ndarray

    def __len__(self) -> int:
        return int(self.first.size)


TAKE_MODE = "wrap"
"""``ndarray.take`` mode of the row gathers: the stages' indices come from :func:`distinct` and the stores,
in range by construction, where ``wrap`` takes the same rows as the default ``raise`` at about two thirds of
its instructions per element (no bounds test per element; callgrind, NumPy 2.4)."""


def distinct(*cols: np.ndarray) -> Keys:
    """Distinct rows of the columns (small non-negative integers, packed into one int64: one 1-D sort)."""
    ints = [np.asarray(c, dtype=np.int64) for c in cols]
    n = ints[0].size
    if n == 1:  # one plan: nothing to sort
        zero = np.zeros(1, dtype=np.int64)
        return Keys(rows=np.concatenate(ints).reshape(1, -1), first=zero, inverse=zero)  # np.stack(ints, 1)
    radix = [int(c.max()) + 1 for c in ints]
    if math.prod(radix) >= 1 << 63:  # the packed key would overflow (byte counts as columns): sort the rows
        rows = np.stack(ints, axis=1)
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return Keys(rows=rows[first], first=first, inverse=inverse.reshape(-1))
    key = ints[0].copy()
    for c, r in zip(ints[1:], radix[1:]):  # in place: no array per column
        if r == 1 or int(c.min()) == r - 1:  # a column of one value adds nothing to the key
            continue
        key *= r
        key += c
    first, inverse = _group(key)
    return Keys(rows=np.stack([c.take(first) for c in ints], axis=1), first=first, inverse=inverse)


def _group(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one plan of each distinct key, ascending; the key index of every plan). ``first`` is *a* plan of the
    key, not necessarily the earliest: the stages only read the key's columns from it. A small key range is
    grouped through a table (linear); a large one by one sort of the keys with each plan's index packed in
    their low bits (an argsort where that would overflow)."""
    n = key.size
    span = int(key.max()) + 1
    if span <= 4 * n:
        plan_of = np.full(span, -1, dtype=np.int64)
        plan_of[key] = np.arange(n, dtype=np.int64)
        present = plan_of >= 0
        return plan_of[present], (np.cumsum(present) - 1).take(key, mode=TAKE_MODE)
    bits = max(1, (n - 1).bit_length())
    if span.bit_length() + bits <= 62:
        # each key with its plan's index in the low bits: one plain sort (SIMD in NumPy 2, a third of an
        # argsort's time) gives the order and the sorted keys at once
        packed = np.sort((key << bits) | np.arange(n, dtype=np.int64))
        order = packed & ((1 << bits) - 1)
        ordered = packed >> bits
    else:
        order = key.argsort()
        ordered = key.take(order)
    step = np.empty(n, dtype=bool)
    step[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=step[1:])
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(step) - 1
    return order[step], inverse


def sorted_values(values: Any) -> np.ndarray:
    """``np.unique(values)``: the distinct values, ascending. Asked with ``return_index``, because NumPy 2's
    plain ``np.unique`` calls ``np.ma.is_masked`` and so imports numpy.ma (about 15 ms of a ``tpsim
    estimate`` process); the values returned are the same."""
    return np.unique(values, return_index=True)[0]


def argmax_rows(a: np.ndarray) -> np.ndarray:
    """``np.argmax(a, axis=0)`` of a (rows, n) array: the first row holding each column's maximum. For a few
    rows over many columns by comparisons with the column maxima (NumPy's argmax along the strided first axis
    is about twenty times slower there); NaN anywhere: NumPy's own (its first NaN)."""
    rows = a.shape[0] if a.ndim == 2 else 0
    if not 1 <= rows <= 4 or a.shape[1] < 256:
        return np.argmax(a, axis=0)
    top = a.max(axis=0)
    if np.isnan(top).any():
        return np.argmax(a, axis=0)
    below = a[0] != top  # still no maximum in the rows seen
    index = below.astype(np.intp)
    for k in range(1, rows - 1):
        below &= a[k] != top
        index += below
    return index


def flat_index(position: np.ndarray) -> np.ndarray:
    """The flat indices of ``values[position[i], i]`` in (k, n) arrays (:func:`pick_rows`; computed once per
    position array where it picks several)."""
    n = position.size
    return position * n + np.arange(n)


def broadcast_float(x: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``np.broadcast_to(np.asarray(x, dtype=float), shape)``: ``x`` itself where it already is a float array
    of that shape (no view)."""
    a = np.asarray(x, dtype=float)
    return a if a.shape == shape else np.broadcast_to(a, shape)


def pick_rows(values: np.ndarray, position: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray:
    """``values[position[i], i]`` for (k, n) ``values`` (one row per column): one flat gather, half the time of
    the 2-D fancy index; ``flat``: :func:`flat_index` of ``position`` if already known."""
    n = position.size
    if values.ndim == 2 and values.shape[1] == n:
        return values.take(flat_index(position) if flat is None else flat, mode=TAKE_MODE)
    return values[position, np.arange(n)]


def gather(a: np.ndarray, index: Any, axis: int = -1) -> np.ndarray:
    """``a`` indexed by ``index`` along ``axis`` (``a[..., index]``, ``a[index]``, ``a[:, index]``):
    ``ndarray.take`` where ``index`` is an integer array (the same values; fancy indexing is two to five times
    slower on (3, n) arrays), else plain indexing."""
    if type(index) is np.ndarray and index.dtype.kind in "iu" and type(a) is np.ndarray:
        return a.take(index, axis=axis, mode=TAKE_MODE)
    return a[..., index] if axis < 0 else a[(slice(None),) * axis + (index,)]


def take_rows(tree: Any, index: np.ndarray) -> Any:
    """Rows ``index`` of every array in a stage result (frozen dataclasses, dicts, tuples of them); arrays are
    indexed on their last axis (rows), anything else (None, numbers, names) is kept."""
    kind = type(tree)
    if kind is np.ndarray:
        return gather(tree, index)
    if kind in _LEAVES:  # the common leaves first (a layer-cost tree holds about a hundred names and numbers)
        return tree
    if kind is tuple:
        return tuple([take_rows(v, index) for v in tree])
    if isinstance(tree, np.ndarray):
        return tree[..., index]
    if isinstance(tree, dict):
        return {k: take_rows(v, index) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(take_rows(v, index) for v in tree)
    names = field_names(kind)
    if names:
        values = {}
        fast = type(index) is np.ndarray and index.dtype.kind in "iu"  # gather's test, once per node
        for f in names:  # the leaves here, without a call each
            v = getattr(tree, f)
            t = type(v)
            if t is np.ndarray:
                values[f] = v.take(index, axis=-1, mode=TAKE_MODE) if fast else v[..., index]
            elif t in _LEAVES:
                values[f] = v
            else:
                values[f] = take_rows(v, index)
        return _rebuilt(kind, values)
    return tree


def _rebuilt(cls: type, values: dict) -> Any:
    """``cls(**values)`` for a dataclass given every field: its instance dict filled directly where the class
    has no ``__post_init__`` and no slots (what its ``__init__`` would store, without the per-field frozen
    ``object.__setattr__`` calls)."""
    plain = _PLAIN.get(cls)
    if plain is None:
        params = getattr(cls, "__dataclass_params__", None)
        plain = _PLAIN[cls] = bool(params is not None and params.init) and not hasattr(cls, "__post_init__") \
            and "__slots__" not in cls.__dict__ and all(f.init for f in dataclasses.fields(cls))
    if not plain:
        return cls(**values)
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


_PLAIN: dict[type, bool] = {}
_LEAVES = frozenset({str, int, float, bool, type(None)})
"""types :func:`take_rows` keeps as they are without asking further."""
_FIELDS: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The dataclass fields of ``cls`` (() for any other type), remembered per type (the stages walk their
    results once per pattern and chunk)."""
    hit = _FIELDS.get(cls)
    if hit is None:
        hit = _FIELDS[cls] = (tuple(f.name for f in dataclasses.fields(cls))
                              if dataclasses.is_dataclass(cls) else ())
    return hit


def concat_rows(a: Any, b: Any) -> Any:
    """``a`` followed by the rows of ``b`` (same structure; non-array parts are taken from ``a``)."""
    if isinstance(a, np.ndarray):
        return np.concatenate([a, b], axis=-1)
    if isinstance(a, dict):
        return {k: concat_rows(v, b[k]) for k, v in a.items()}
    if isinstance(a, tuple):
        return tuple(concat_rows(x, y) for x, y in zip(a, b))
    names = field_names(type(a))
    if names:
        return type(a)(**{f: concat_rows(getattr(a, f), getattr(b, f)) for f in names})
    return a


def per_distinct(fn: Any, *cols: np.ndarray) -> Any:
    """``fn(*row)`` once per distinct row of the columns (Python ints), scattered back to every plan: the
    results (numbers or arrays of one shape) stacked along a last axis over plans. The one helper for the
    per-key Python loops of the stages (pipeline splits, layer-kind counts)."""
    keys = distinct(*cols)
    out = [fn(*(int(v) for v in row)) for row in keys.rows]
    return np.stack([np.asarray(o) for o in out], axis=-1)[..., keys.inverse]
