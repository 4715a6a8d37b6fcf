"""The cached result of the collective model: a cost curve per (collective, group layout).

``time(bytes) = min_k (latency_s[k] + bytes * sec_per_byte[k])``: lines of the candidates (algorithm,
protocol) that NCCL could pick, already including contention of all concurrent groups of the plan dimension.
A candidate whose cost has a pipelining term ``c sqrt(bytes)`` (concave) is given as its tangent lines at
every power of two (:func:`tangent_lines`): the minimum over them equals the candidate's cost at those sizes
and overestimates it by < 1% in between, so the curve stays a minimum of lines.
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

    def time(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Seconds for ``nbytes`` (vectorized); 0 where nbytes <= 0."""
        b = np.asarray(nbytes, dtype=float)
        lat = np.asarray(self.latency_s)
        spb = np.asarray(self.sec_per_byte)
        t = (lat + b[..., None] * spb).min(axis=-1)
        return np.where(b > 0, t, 0.0)

    def best(self, nbytes: float) -> tuple[float, str]:
        """(seconds, algorithm name) of the fastest candidate for one size."""
        lat = np.asarray(self.latency_s)
        t = lat + float(nbytes) * np.asarray(self.sec_per_byte)
        i = int(np.argmin(t))
        return float(t[i]), self.algorithms[i]

    def __post_init__(self) -> None:
        assert len(self.latency_s) == len(self.sec_per_byte) == len(self.algorithms)

    @staticmethod
    def zero() -> "CostCurve":
        """A collective on a group of one rank: free."""
        return CostCurve((0.0,), (0.0,), ("none",))


TANGENT_EXPONENTS = range(6, 41)
"""Tangent points 2**6 = 64 B ... 2**40 = 1 TiB."""
_TANGENT_ROOTS = tuple(2.0 ** (k / 2) for k in TANGENT_EXPONENTS)
"""sqrt(s_k) of each tangent point (computed once: a search builds a few hundred curves of ~300 lines)."""


def tangent_columns(latency_s: float, sec_per_byte: float, sqrt_coef: float) -> tuple[list[float], list[float]]:
    """(latencies, sec_per_byte values) of the tangents of ``L + b s + c sqrt(s)`` at s = 2**k: at s_k the
    tangent is ``(L + c sqrt(s_k) / 2) + (b + c / (2 sqrt(s_k))) s``; the line itself when c <= 0."""
    if sqrt_coef <= 0:
        return [latency_s], [sec_per_byte]
    return ([latency_s + sqrt_coef * root / 2 for root in _TANGENT_ROOTS],
            [sec_per_byte + sqrt_coef / (2 * root) for root in _TANGENT_ROOTS])


def tangent_lines(latency_s: float, sec_per_byte: float, sqrt_coef: float) -> list[tuple[float, float]]:
    """(latency, sec_per_byte) pairs of :func:`tangent_columns`."""
    return list(zip(*tangent_columns(latency_s, sec_per_byte, sqrt_coef)))
