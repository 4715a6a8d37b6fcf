"""A compute model with each kernel kind's time multiplied by a factor (torch-free).

Used where a measured factor corrects a profile without re-measuring it: ``tpsim validate`` rescales the kernel
profile by the drift its probe measured on this machine (the same factor for every kind, or one per kind), and
applies the ``compute:`` section of a calibration file (``gemm_scale``, ``attention_scale``, ``memory_scale``,
fitted from validation runs by ``tpsim calibrate --from-validation``). A factor of 0 removes a kind, which is
how a prediction is split into its GEMM, attention and memory-bound parts.
"""

from __future__ import annotations

import math

import numpy as np

from .base import ArrayLike, ComputeModel


class ScaledCompute(ComputeModel):
    """``base`` with GEMM, attention and memory-bound kernel times multiplied by their factors."""

    def __init__(self, base: ComputeModel, *, gemm: float = 1.0, attention: float = 1.0, memory: float = 1.0,
                 label: str | None = "") -> None:
        """``label``: what the factors are, appended to the base's ``source``; None keeps the base's source and
        description (a calibration's factors on the estimator's compute model: :meth:`of_calibration`)."""
        for name, value in (("gemm", gemm), ("attention", attention), ("memory", memory)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} scale={value!r} must be a finite number >= 0")
        self.base = base
        self.scales = {"gemm": float(gemm), "attention": float(attention), "memory": float(memory)}
        self.profile = getattr(base, "profile", None)
        factors = ", ".join(f"{k} x{v:.3g}" for k, v in self.scales.items() if v != 1.0)
        self._keep = label is None
        self.source = base.source if label is None else f"{base.source} ({label or 'scaled'}: {factors or 'x1'})"

    @classmethod
    def of_calibration(cls, base: ComputeModel, fit) -> "ScaledCompute":  # noqa: ANN001 - ComputeCalibration
        """``base`` with a calibration's ``compute:`` factors (gemm, attention, memory scales), its source kept."""
        return cls(base, gemm=fit.gemm_scale, attention=fit.attention_scale, memory=fit.memory_scale, label=None)

    def describe(self) -> str:
        return self.base.describe() if self._keep else self.source

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.gemm(m, n, k, dtype, batch)
        return np.asarray(t) * self.scales["gemm"], measured

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool, dtype: str,
                  backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        return np.asarray(t) * self.scales["attention"], measured

    def memory(self, kernel: str, numel: ArrayLike, dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.memory(kernel, numel, dtype, backward)
        return np.asarray(t) * self.scales["memory"], measured
