"""Pareto fronts: every point off the front is dominated by a front point; front points are not dominated."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tpsim.search import pareto_front, pareto_front_max_y

points = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=60)


def _dominates(a, b) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


@settings(max_examples=200, deadline=None)
@given(points)
def test_front_is_exactly_the_non_dominated_set(pts):
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    front = pareto_front(x, y)
    on = set(front.tolist())
    for i, p in enumerate(pts):
        dominated = any(_dominates(q, p) for q in pts)
        duplicate_earlier = any(pts[j] == p for j in range(i))
        assert (i in on) == (not dominated and not duplicate_earlier)
    assert np.all(np.diff(x[front]) > 0) and np.all(np.diff(y[front]) < 0)


def test_front_max_y_and_nan():
    gpus = np.array([8, 16, 16, 32, 64, np.nan])
    tput = np.array([1.0, 1.5, 1.8, 1.7, 3.0, 9.0])
    assert pareto_front_max_y(gpus, tput).tolist() == [0, 2, 4]
    assert pareto_front(np.array([]), np.array([])).size == 0
