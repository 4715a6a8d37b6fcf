"""The cached result of the collective model: a cost curve per (collective, group layout).

``time(bytes) = min_k (latency_s[k] + bytes * sec_per_byte[k] + sqrt_coef[k] * sqrt(bytes))``: one term per
candidate (algorithm, protocol) that NCCL could pick, already including contention of all concurrent groups of
the plan dimension. The optional ``sqrt_coef`` is the pipelining cost of a chunked transfer through ``D``
sequential steps with per-chunk overhead ``o`` (``2 sqrt(D o / B)``, see :mod:`tpsim.collectives.algorithms`);
empty means zero for every candidate.
The estimator only does this arithmetic; the graph is walked once per layout (see
:mod:`tpsim.collectives.model`).

Byte convention (nccl-tests): ``bytes`` is the size of the full buffer: for all_reduce the tensor, for
all_gather the gathered output, for reduce_scatter the input before scattering, for broadcast the tensor,
for send_recv the message, for all_to_all the send buffer of one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


@dataclass(frozen=True)
class CostCurve:
    latency_s: tuple[float, ...]
    sec_per_byte: tuple[float, ...]
    algorithms: tuple[str, ...]
    """names such as "ring/Simple x8ch", "nvls/Simple", "tree/LL128", "hierarchical/Simple"."""
    sqrt_coef: tuple[float, ...] = ()
    """seconds per sqrt(byte) per candidate (chunk pipelining); () = all zero."""

    def _terms(self, b: np.ndarray) -> np.ndarray:
        t = np.asarray(self.latency_s) + b[..., None] * np.asarray(self.sec_per_byte)
        if self.sqrt_coef:
            t = t + np.sqrt(np.maximum(b, 0.0))[..., None] * np.asarray(self.sqrt_coef)
        return t

    def time(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Seconds for ``nbytes`` (vectorized); 0 where nbytes <= 0."""
        b = np.asarray(nbytes, dtype=float)
        t = self._terms(b).min(axis=-1)
        return np.where(b > 0, t, 0.0)

    def best(self, nbytes: float) -> tuple[float, str]:
        """(seconds, algorithm name) of the fastest candidate for one size."""
        t = self._terms(np.asarray(float(nbytes)))
        i = int(np.argmin(t))
        return float(t[i]), self.algorithms[i]

    @staticmethod
    def zero() -> "CostCurve":
        """A collective on a group of one rank: free."""
        return CostCurve((0.0,), (0.0,), ("none",))
