"""Pareto fronts of two objectives, vectorized (sort + running extremum, O(n log n)).

Used for step time vs. memory per GPU (both minimized) and throughput vs. number of GPUs (throughput
maximized, GPUs minimized: the cost front).
"""

from __future__ import annotations

import numpy as np


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points not dominated when both ``x`` and ``y`` are minimized, ordered by ascending x.

    A point is dominated when another is <= in both and < in one. Of exact duplicates the first index is kept.
    NaN points are never on the front.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("pareto_front needs two 1-D arrays of one length")
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if ok.size == 0:
        return ok
    order = ok[np.lexsort((ok, y[ok], x[ok]))]  # by x, then y, then index
    ys = y[order]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(ys)[:-1]))
    return order[ys < best_before]


def pareto_front_max_y(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Front with ``x`` minimized and ``y`` maximized (e.g. GPUs vs. throughput), by ascending x."""
    return pareto_front(np.asarray(x, dtype=float), -np.asarray(y, dtype=float))


def dominated_by_front(x: np.ndarray, y: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Boolean mask: True where a point is weakly dominated by some front point (helper for tests/charts)."""
    x = np.asarray(x, dtype=float)[:, None]
    y = np.asarray(y, dtype=float)[:, None]
    fx = np.asarray(x[front, 0])[None, :]
    fy = np.asarray(y[front, 0])[None, :]
    return ((fx <= x) & (fy <= y)).any(axis=1)
