"""The torch kernels a profile measures: one zero-argument callable per profile point.

GEMM: ``torch.mm(a, w.t())`` with a (m x k) and w (n x k), the layout of ``nn.Linear``'s forward; fp8 through
``torch._scaled_mm`` (e4m3 operands, bf16 output, unit scales) where the torch build and the GPU support it.
Attention: ``scaled_dot_product_attention`` on (1, batch_heads, seq, head_dim) tensors, whichever backend torch
picks; backward times ``torch.autograd.grad`` of q, k, v on a retained graph. Memory kernels run on a
(numel / width, width) tensor (swiglu: numel is its output, the input is (numel / width, 2 width)); their
backward is the autograd gradient of every input (and weight).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
DROPOUT_P = 0.1
NORM_EPS = 1e-5


def build_kernel(kind: str, op: str, dtype: str, pass_: str, dims: tuple[int, ...], device: torch.device,
                 memory_width: int) -> Callable[[], object]:
    """The callable whose time is the point's time (inputs allocated once, outside the timing)."""
    if kind == "gemm":
        return _gemm(*dims, dtype, device)
    if kind == "attention":
        return _attention(*dims, op == "causal", TORCH_DTYPES[dtype], device, pass_ == "bwd")
    return _memory(op, dims[0], TORCH_DTYPES[dtype], device, pass_ == "bwd", memory_width)


def _gemm(m: int, n: int, k: int, dtype: str, device: torch.device) -> Callable[[], object]:
    if dtype == "fp8":
        a = torch.randn(m, k, device=device).to(FP8_DTYPE)
        w = torch.randn(n, k, device=device).to(FP8_DTYPE)
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    tdtype = TORCH_DTYPES[dtype]
    a = torch.randn(m, k, device=device, dtype=tdtype)
    w = torch.randn(n, k, device=device, dtype=tdtype)
    out = torch.empty(m, n, device=device, dtype=tdtype)
    wt = w.t()
    return lambda: torch.mm(a, wt, out=out)


def _attention(batch_heads: int, seq: int, head_dim: int, causal: bool, dtype: torch.dtype,
               device: torch.device, backward: bool) -> Callable[[], object]:
    shape = (1, batch_heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
    if not backward:
        def forward() -> object:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return forward
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if hasattr(F, "rms_norm"):  # torch >= 2.4
        return F.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight


def _memory_fn(kernel: str, width: int, dtype: torch.dtype, device: torch.device,
               grad: bool) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    """The kernel as a function of its input tensor(s), and its parameters."""
    if kernel in ("layernorm", "rmsnorm"):
        weight = torch.ones(width, device=device, dtype=dtype, requires_grad=grad)
        bias = torch.zeros(width, device=device, dtype=dtype, requires_grad=grad)
        if kernel == "layernorm":
            return (lambda x: F.layer_norm(x, (width,), weight, bias, NORM_EPS)), [weight, bias]
        return (lambda x: _rms_norm(x, weight)), [weight]
    functions = {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "swiglu": lambda x: (lambda g, u: F.silu(g) * u)(*x.chunk(2, dim=-1)),
        "residual_add": lambda x, y: x + y,
        "dropout": lambda x: F.dropout(x, p=DROPOUT_P, training=True),
    }
    return functions[kernel], []


def _memory(kernel: str, numel: int, dtype: torch.dtype, device: torch.device, backward: bool,
            memory_width: int) -> Callable[[], object]:
    """``numel`` is the element count of the kernel's main activation: its input, except swiglu (its output:
    the fused [gate, up] input holds 2 x numel, as tpsim/data/efficiency.yaml counts it); for residual_add
    each of the two summands."""
    width = min(memory_width, numel)
    rows = max(1, numel // width)
    shape = (rows, 2 * width) if kernel == "swiglu" else (rows, width)
    fn, params = _memory_fn(kernel, width, dtype, device, backward)
    inputs = [torch.randn(shape, device=device, dtype=dtype, requires_grad=backward)
              for _ in range(2 if kernel == "residual_add" else 1)]
    if not backward:
        def forward() -> object:
            with torch.no_grad():
                return fn(*inputs)
        return forward
    out = fn(*inputs)
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, inputs + params, grad, retain_graph=True)
