"""Bytes per element of each training state by GEMM precision: the one table every path reads (estimator,
traced graphs, validation, the per-layer collectives).

16-bit and fp8 training (mixed precision, Micikevicius et al. 2018; Megatron-LM): 16-bit weights (fp8 GEMMs
cast them, or keep fp8 weights where the stack says so), 16-bit activations, an fp32 master copy, gradients and
Adam moments in the stack's dtypes (tpsim/data/stacks/*.yaml, ``memory.*_dtype``), the ZeRO all-gathers and
gradient reductions on the wire in the stack's dtypes (``comm.param_gather_dtype``, ``comm.grad_reduce_dtype``).
fp32 / tf32 training holds everything in 4 bytes and no master copy (the weights are the master).
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import DTYPE_BYTES, is_low_precision

WIDE_DTYPES = ("fp32", "tf32")
"""GEMM precisions that train in 32 bits throughout."""
FP32 = 4.0
ADAM_MOMENTS = 2
"""first and second moment per parameter."""


def wide(dtype: str) -> bool:
    """fp32 / tf32 training: 4-byte weights, gradients, activations; no master copy."""
    return dtype in WIDE_DTYPES


def activation_bytes(dtype: str) -> int:
    """Bytes per activation element: 16-bit for bf16/fp16/fp8 training (and every dtype narrower than 4 bytes),
    4 for fp32/tf32."""
    return 4 if DTYPE_BYTES.get(dtype, 2) == 4 else 2


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of what training holds and sends."""

    weights: float
    master: float
    grads: float
    moments: float
    """the Adam moments together."""
    wire_params: float
    """the ZeRO all-gathers' bytes per parameter."""
    wire_grads: float
    """the data-parallel reductions' bytes per gradient."""


def state_bytes(dtype: str, *, grad_buffer: float = FP32, master: float = FP32, moment: float = FP32,
                wire_params: float = 2.0, wire_grads: float = FP32, fp8_weights_kept: bool = False) -> StateBytes:
    """The bytes of :class:`StateBytes` for ``dtype`` under a stack's dtypes (the keywords: bytes per element
    of its gradient buffer, master copy, each Adam moment, and of its ZeRO gathers and reductions on the
    wire; the defaults are Megatron-LM's). fp32/tf32 training ignores them: 4 bytes each, no master copy."""
    if wide(dtype):
        return StateBytes(weights=FP32, master=0.0, grads=FP32, moments=ADAM_MOMENTS * FP32, wire_params=FP32,
                          wire_grads=FP32)
    # low-precision weights kept (--fp8-param-gather and its MXFP8/NVFP4 twins): the dtype's bytes with its block
    # scales (tpsim.hardware.DTYPE_BYTES)
    weights = float(DTYPE_BYTES[dtype]) if is_low_precision(dtype) and fp8_weights_kept else 2.0
    return StateBytes(weights=weights, master=master, grads=grad_buffer, moments=ADAM_MOMENTS * moment,
                      wire_params=wire_params, wire_grads=wire_grads)
