"""Memory-bound kernels as eager PyTorch runs them (stacks with ``compute.kernels: eager``: torchtitan without
torch.compile, llm-foundry): each norm and activation is a chain of separate elementwise kernels, each reading
and writing its operands in HBM (fp32 for the norms' upcast), instead of one fused kernel. :class:`EagerKernels`
times a memory kernel with the bytes of ``eager_bytes_per_element`` (tpsim/data/efficiency.yaml) instead of the
fused ``bytes_per_element``; GEMMs and attention pass through. Kernel launch counts are the fixed-cost terms'
(tpsim/compute/fixed.py, the ``eager`` flavor)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..hardware import DATA_DIR
from .base import ArrayLike, ComputeModel


@lru_cache(maxsize=1)
def eager_ratios() -> dict[str, tuple[float, float]]:
    """kernel -> (forward, backward) eager bytes over fused bytes (1 where eager moves the same)."""
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "efficiency.yaml")
    fused = raw["bytes_per_element"]
    eager = raw.get("eager_bytes_per_element", {})
    out = {}
    for kernel, fig in eager.items():
        if kernel == "source":
            continue
        ref = fused[ROTARY_KERNEL if kernel == "rotary" else kernel]
        out[kernel] = (float(fig["forward"]) / float(ref["forward"]),
                       float(fig["backward"]) / float(ref["backward"]))
    return out


ROTARY_KERNEL = "residual_add"
"""the memory-bound kernel that times the rotary embedding (tpsim/estimator/layer.py: read x and the table,
write y); ``eager_bytes_per_element.rotary`` is relative to it."""


def rotary_ratio(compute: ComputeModel, backward: bool) -> float:
    """How many times the fused rotary embedding's traffic ``compute`` moves for it: eager kernels'
    (:class:`EagerKernels` anywhere in the chain of wrapped models) or 1."""
    model = compute
    while model is not None:
        if isinstance(model, EagerKernels):
            return model.ratios.get("rotary", (1.0, 1.0))[1 if backward else 0]
        model = model.__dict__.get("base")
    return 1.0


def runs_eager(compute: ComputeModel) -> bool:
    """Whether ``compute`` (or a model it wraps) runs eager PyTorch's unfused elementwise kernels."""
    model = compute
    while model is not None:
        if isinstance(model, EagerKernels):
            return True
        model = model.__dict__.get("base")
    return False


class EagerKernels(ComputeModel):
    """``base`` with its memory-bound kernels costed as eager PyTorch's op chains (module docstring)."""

    def __init__(self, base: ComputeModel):
        self.base = base
        self.source = base.source
        self.ratios = eager_ratios()

    def __getattr__(self, name: str):  # device, hbm, in_situ, provenance, ... of the wrapped model
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        return self.base.gemm(m, n, k, dtype, batch)

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.base.attention(batch_heads, seq, head_dim, causal, dtype, backward)

    def memory(self, kernel: str, numel: ArrayLike, dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.memory(kernel, numel, dtype, backward)
        ratio = None if kernel == "rotary" else self.ratios.get(kernel)
        return (t if ratio is None else t * ratio[1 if backward else 0]), measured

    def describe(self) -> str:
        return self.base.describe() + " (eager elementwise kernels)"
