"""Distinct rows of plan columns: the estimator computes per distinct key and gathers back to the plans."""

from __future__ import annotations

from dataclasses import dataclass

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

    def column(self, j: int) -> np.ndarray:
        return self.rows[:, j]


def distinct(*cols: np.ndarray) -> Keys:
    """Distinct rows of the columns (small non-negative integers, packed into one int64: one 1-D sort)."""
    ints = [np.asarray(c, dtype=np.int64) for c in cols]
    n = ints[0].size
    if n == 1:  # one plan: nothing to sort
        zero = np.zeros(1, dtype=np.int64)
        return Keys(rows=np.stack(ints, axis=1), first=zero, inverse=zero)
    key = np.zeros(n, dtype=np.int64)
    for c in ints:
        key = key * (int(c.max()) + 1) + c
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return Keys(rows=np.stack([c[first] for c in ints], axis=1), first=first, inverse=inverse.reshape(-1))
