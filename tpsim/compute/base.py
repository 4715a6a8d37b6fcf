"""One interface for compute time: ``time(op kind, shape, dtype) -> seconds``.

Served by the device roofline (:mod:`tpsim.compute.roofline`) or by a measured kernel profile
(:mod:`tpsim.compute.profile`); the estimator does not know which. Every method is vectorized: shape
arguments are numpy arrays (or scalars) that broadcast together, and each returns ``(seconds, measured)``
where ``measured`` is a boolean array: True where the time comes from a measured profile point (inside its
grid), False where it comes from a roofline (no profile, or outside the profile's grid).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

ArrayLike = np.ndarray | float | int

# Memory-bound kernels the cost model uses. ``numel`` is the element count of the kernel's main activation
# (its input); each kernel's bytes moved per element (reads + writes, forward and backward) are in
# tpsim/compute/roofline.py (MEMORY_KERNELS) and a profile measures the kernel directly.
MEMORY_KERNEL_NAMES = ("layernorm", "rmsnorm", "softmax", "gelu", "swiglu", "residual_add", "dropout")


class ComputeModel(ABC):
    """Times of the kernels one TP shard runs."""

    #: "roofline" or "profile:<file name>"; reported in every estimate.
    source: str = "roofline"

    @abstractmethod
    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` independent (m x k) @ (k x n) products; 2*batch*m*n*k FLOPs."""

    @abstractmethod
    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        """Fused (flash) attention, ``scaled_dot_product_attention``, forward or backward, on
        ``batch_heads`` query heads of ``seq`` tokens each."""

    @abstractmethod
    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        """Memory-bound kernel ``kernel`` (one of MEMORY_KERNEL_NAMES) on ``numel`` elements."""

    def describe(self) -> str:
        return self.source
