"""Cast/scale cost of low-precision GEMM operands (fp8, mxfp8, nvfp4), figures in ``tpsim/data/kernels/quantize.yaml``.

A linear layer's forward, dgrad and wgrad GEMMs read three quantized tensors (X, W, dY), each quantized once from
its 16-bit original together with the transposed / column-wise copy the other GEMM needs. Per micro-batch the
activation X (forward) and the output gradient dY (backward) are quantized; the weight's cast is kept between
the micro-batches of a step (Transformer Engine's ``is_first_microbatch`` caching, the cache the memory terms
count, ``FP8_CAST_BYTES`` in tpsim/estimator/core.py) and is not costed per micro-batch. The quantization is a
memory-bound kernel at the recipe's bytes per element, costed at the rate the compute model streams a residual
add (``memory("residual_add")``, 3 x 2 bytes per element). One rule (:func:`cast_seconds`), called by the
estimator's linear layers (tpsim/estimator/layer.py ``_linear``, tpsim/estimator/moe.py ``_grouped``); the
stack's fp8 scaling recipe rides on the context's compute model (:class:`QuantizedCompute`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..hardware import DATA_DIR, LOW_PRECISION_DTYPES, is_low_precision
from .base import ArrayLike, ComputeModel

FP8_SCALINGS = ("delayed", "current", "block")
"""scaling recipes of the fp8 dtype (stack rule ``compute.fp8_scaling``); mxfp8 and nvfp4 are block-scaled."""
RESIDUAL_ADD_BYTES = 6.0
"""bytes a residual add moves per element in the compute models (bytes_per_element.residual_add forward 3 x a
16-bit element, tpsim/data/efficiency.yaml): the streaming rate the cast kernels are costed at."""


@dataclass(frozen=True)
class Recipe:
    dtype: str
    scaling: str
    bytes_per_element: float
    source: str


@lru_cache(maxsize=1)
def _table() -> tuple[dict[tuple[str, str], Recipe], dict[str, str]]:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "kernels" / "quantize.yaml")
    table = {}
    for dtype, recipes in raw["recipes"].items():
        for scaling, body in recipes.items():
            table[(dtype, scaling)] = Recipe(dtype, scaling, float(body["bytes_per_element"]),
                                             " ".join(str(body["source"]).split()))
    defaults = {str(k): str(v) for k, v in raw["defaults"].items()}
    missing = [d for d in LOW_PRECISION_DTYPES if d not in defaults]
    if missing:
        raise InputError(f"quantize.yaml: defaults has no recipe for {missing[0]}")
    return table, defaults


def recipe(dtype: str, fp8_scaling: str | None = None) -> Recipe:
    """The quantization recipe of a low-precision ``dtype``: fp8 with the stack's ``fp8_scaling`` (default
    delayed), mxfp8 and nvfp4 with their block scaling."""
    table, defaults = _table()
    if not is_low_precision(dtype):
        raise InputError(f"dtype={dtype} is not a low-precision GEMM dtype ({', '.join(LOW_PRECISION_DTYPES)})")
    scaling = (fp8_scaling or defaults[dtype]) if dtype == "fp8" else defaults[dtype]
    if (dtype, scaling) not in table:
        raise InputError(f"fp8_scaling={scaling!r} is not one of {', '.join(FP8_SCALINGS)}")
    return table[(dtype, scaling)]


def cast_seconds(compute: ComputeModel, numel: ArrayLike, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(seconds, measured)`` of quantizing ``numel`` elements of a GEMM operand of ``dtype`` (zeros for
    16/32-bit dtypes) with the recipe of ``compute`` (a :class:`QuantizedCompute` carries the stack's fp8
    scaling; any other model: the default recipe). Costed as a streaming kernel at the rate ``compute`` runs a
    residual add."""
    numel = np.asarray(numel, dtype=float)
    if not is_low_precision(dtype):
        return np.zeros(numel.shape), np.zeros(numel.shape, dtype=bool)
    r = recipe(dtype, getattr(compute, "fp8_scaling", None))
    t, measured = compute.memory("residual_add", numel * (r.bytes_per_element / RESIDUAL_ADD_BYTES), "bf16", False)
    return t, measured


class QuantizedCompute(ComputeModel):
    """``base`` carrying the stack's fp8 scaling recipe (read by :func:`cast_seconds`); times unchanged."""

    def __init__(self, base: ComputeModel, fp8_scaling: str | None = None):
        if fp8_scaling is not None:
            recipe("fp8", fp8_scaling)   # validates the name
        self.base = base
        self.fp8_scaling = fp8_scaling
        self.source = base.source

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        return self.base.gemm(m, n, k, dtype, batch)

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.base.attention(batch_heads, seq, head_dim, causal, dtype, backward)

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.base.memory(kernel, numel, dtype, backward)

    def provenance(self) -> dict[str, str]:
        out = dict(self.base.provenance()) if hasattr(self.base, "provenance") else {}
        for dtype in LOW_PRECISION_DTYPES:
            r = recipe(dtype, self.fp8_scaling)
            out[f"quantize.{dtype}"] = (f"{r.scaling} scaling, {r.bytes_per_element:g} B per quantized element "
                                        f"(tpsim/data/kernels/quantize.yaml)")
        return out

    def __getattr__(self, name):   # device, gemm_rate, hbm ... of the wrapped model
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def describe(self) -> str:
        return self.base.describe()
