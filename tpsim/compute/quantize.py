"""Cast/scale bytes of the low-precision GEMM operands: one lookup, :func:`linear_cast_bytes`, that the linear
layers of the estimator read (tpsim/estimator/layer.py ``_linear``: the bytes are streamed at the compute model's
memory-bound rate, ``streamed``).

* ``fp8``: the stack's recipe, ``compute.fp8_cast_bytes_per_element`` of tpsim/data/stacks/*.yaml (Transformer
  Engine delayed scaling 2 / 4 B, torchao dynamic tensorwise scaling 6 / 6 B).
* ``mxfp8``, ``nvfp4``: block-scaled Blackwell formats, tpsim/data/kernels/quantize.yaml (row-wise and
  column-wise copies with their block scales; NVFP4's per-tensor amax pass), the same for every stack that runs
  them (Transformer Engine is their implementation).

Per micro-batch each linear quantizes its input (forward) and its output gradient (backward), and where the
recipe keeps only the 16-bit input for backward (torchao Float8Linear) quantizes the input again there for the
weight-gradient GEMM (the optional third figure, ``backward_input``); :func:`cast_traffic` is the one formula
the dense linears and the grouped expert GEMMs call. The weights' casts are kept between micro-batches and are
not costed per token: once per step (tpsim.estimator.schedule.weight_cast_seconds).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..hardware import DATA_DIR, is_low_precision

BLOCK_FORMATS = ("mxfp8", "nvfp4")


@lru_cache(maxsize=1)
def _table() -> dict[str, tuple[float, float, str]]:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "kernels" / "quantize.yaml")["formats"]
    out = {}
    for dtype in BLOCK_FORMATS:
        body = raw.get(dtype)
        if not isinstance(body, dict):
            raise InputError(f"tpsim/data/kernels/quantize.yaml: formats.{dtype} is missing")
        out[dtype] = (float(body["forward"]), float(body["backward"]), " ".join(str(body["source"]).split()))
    return out


def block_cast_bytes(dtype: str) -> tuple[float, float]:
    """(forward, backward) bytes per element of an MXFP8 / NVFP4 linear's input and output-gradient casts."""
    if dtype not in BLOCK_FORMATS:
        raise InputError(f"dtype={dtype} is not a block-scaled format ({', '.join(BLOCK_FORMATS)})")
    f, b, _ = _table()[dtype]
    return f, b


def cast_traffic(cast: tuple[float, ...], m, n, k) -> tuple:
    """(forward, backward) bytes of the low-precision casts of an (m x k) @ (k x n) linear: its input (m x k) at
    ``cast[0]`` forward, its output gradient (m x n) at ``cast[1]`` and its input again at ``cast[2]`` (0 where
    absent) backward."""
    again = cast[2] if len(cast) > 2 else 0.0
    inputs = np.asarray(m, dtype=float) * k
    return inputs * cast[0], np.asarray(m, dtype=float) * n * cast[1] + inputs * again


def linear_cast_bytes(dtype: str, fp8_cast: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """The (forward, backward) cast bytes per element a linear of ``dtype`` pays, or None (16/32-bit GEMMs):
    fp8 the stack's ``fp8_cast`` (StackTerms.fp8_cast_bytes), mxfp8/nvfp4 :func:`block_cast_bytes`."""
    if not is_low_precision(dtype):
        return None
    if dtype == "fp8":
        return fp8_cast
    return block_cast_bytes(dtype)
