"""Per-layer cost of one transformer block on one TP shard for one micro-batch (vectorized over plans).

Operations (forward GEMM shapes m x k @ k x n as one TP shard sees them, T = micro_batch x seq tokens,
t = tp): QKV projection (T, h, (q + 2 kv_local) / ...), attention core (flash SDPA, or unfused scores /
softmax / dropout / attention x V as batched GEMMs + memory-bound kernels), output projection (T, q/t, h),
MLP (T, h, f/t) [x2 fused gate+up for SwiGLU] and (T, f/t, h), norms, residual adds, dropout and rotary
embedding as memory-bound kernels on T (or T/t with sequence parallelism) tokens. Backward runs two GEMMs per
linear: data gradient (m, k, n) and weight gradient (k, n, m).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compute.base import ComputeModel
from ..model import ModelSpec


@dataclass(frozen=True)
class LayerCost:
    """Seconds per layer and micro-batch, arrays over plans."""

    fwd: np.ndarray
    """forward compute."""
    bwd: np.ndarray
    """backward compute (without recomputation)."""
    recompute: np.ndarray
    """extra forward compute in backward (selective: attention core; full: the whole forward)."""
    dgrad: dict
    """block ("attention", "feed_forward") -> data-gradient GEMM time of its column-parallel input linear."""
    wgrad: dict
    """block -> weight-gradient GEMM time of its column-parallel input linear."""
    measured: np.ndarray
    """fraction of the forward+backward compute time that came from a measured profile."""
    attention: np.ndarray | float = 0.0
    """flash-attention kernel time, forward + backward (the error band weighs its kernel data by it)."""


class _Acc:
    """Accumulates (time, measured) pairs into a total and a measured total."""

    def __init__(self, n: int):
        self.t = np.zeros(n)
        self.m = np.zeros(n)

    def add(self, res: tuple[np.ndarray, np.ndarray], times: float | np.ndarray = 1.0) -> np.ndarray:
        t, measured = res
        t = np.broadcast_to(t, self.t.shape) * times
        self.t = self.t + t
        self.m = self.m + np.where(measured, t, 0.0)
        return t

    def absorb(self, other: "_Acc") -> None:
        """Add another accumulator's totals (time and measured time)."""
        self.t = self.t + other.t
        self.m = self.m + other.m


def _linear(acc_f: _Acc, acc_b: _Acc, compute: ComputeModel, m, n, k, dtype: str):
    """Forward and the two backward GEMMs of a linear; returns (dgrad, wgrad) times."""
    acc_f.add(compute.gemm(m, n, k, dtype))
    dgrad = acc_b.add(compute.gemm(m, k, n, dtype))
    wgrad = acc_b.add(compute.gemm(k, n, m, dtype))
    return dgrad, wgrad


def _linears(acc_f: _Acc, acc_b: _Acc, compute: ComputeModel, m, widths, k, dtype: str):
    """Column-parallel linears sharing one input (fused: one GEMM of the summed width); (dgrad, wgrad)."""
    dgrad = wgrad = 0.0
    for n in widths:
        d, w = _linear(acc_f, acc_b, compute, m, n, k, dtype)
        dgrad, wgrad = dgrad + d, wgrad + w
    return dgrad, wgrad


def layer_cost(model: ModelSpec, compute: ComputeModel, *, tp: np.ndarray, sp: np.ndarray,
               micro_batch: np.ndarray, recompute: np.ndarray, dtype: str, attention: str,
               fused: bool = True) -> LayerCost:
    """Cost of one layer for each plan (arrays of equal length; recompute coded 0/1/2). ``fused``: one QKV
    GEMM and one gate+up GEMM (Megatron); otherwise q, k, v (and w1, w3) are separate GEMMs (as
    ``tpsim validate`` runs DTensor's separate Linear layers)."""
    n_plans = len(tp)
    t = tp.astype(float)
    b = micro_batch.astype(float)
    s = float(model.seq_len)
    T = b * s
    h, d = float(model.hidden_size), float(model.head_dim)
    heads = model.num_attention_heads / t
    kv_heads = np.maximum(model.num_kv_heads / t, 1.0)  # kv heads < tp are replicated (Megatron)
    q_local = heads * d
    kv_local = kv_heads * d
    f_local = model.ffn_hidden_size / t
    T_norm = np.where(sp, T / t, T)
    fwd, bwd = _Acc(n_plans), _Acc(n_plans)

    # attention block
    qkv = [q_local + 2 * kv_local] if fused else [q_local, kv_local, kv_local]
    dg_a, wg_a = _linears(fwd, bwd, compute, T, qkv, h, dtype)
    attn_f = _Acc(n_plans)
    flash_t = np.zeros(n_plans)
    if attention == "flash":
        flash_t = attn_f.add(compute.attention(b * heads, s, d, True, dtype, False))
        flash_t = flash_t + bwd.add(compute.attention(b * heads, s, d, True, dtype, True))
    else:
        bh = b * heads
        scores = bh * s * s
        attn_f.add(compute.gemm(s, s, d, dtype, batch=bh))          # Q K^T
        attn_f.add(compute.memory("softmax", scores, dtype, False))  # fused scale-mask-softmax
        if model.family == "gpt":
            attn_f.add(compute.memory("dropout", scores, dtype, False))
            bwd.add(compute.memory("dropout", scores, dtype, True))
        attn_f.add(compute.gemm(s, d, s, dtype, batch=bh))          # P V
        bwd.add(compute.gemm(s, s, d, dtype, batch=bh), 1.0)         # dP = dO V^T
        bwd.add(compute.gemm(s, d, s, dtype, batch=bh), 3.0)         # dV = P^T dO, dQ = dS K, dK = dS^T Q
        bwd.add(compute.memory("softmax", scores, dtype, True))
    fwd.absorb(attn_f)  # the attention core, kept apart too for selective recomputation
    if model.position == "rotary":
        fwd.add(compute.memory("residual_add", T * (q_local + kv_local), dtype, False))
        bwd.add(compute.memory("residual_add", T * (q_local + kv_local), dtype, True))
    _linear(fwd, bwd, compute, T, h, q_local, dtype)

    # MLP block
    gated = model.gated
    mlp_in = [f_local * (2 if gated else 1)] if (fused or not gated) else [f_local, f_local]
    dg_m, wg_m = _linears(fwd, bwd, compute, T, mlp_in, h, dtype)
    act = "swiglu" if gated else "gelu"
    fwd.add(compute.memory(act, T * f_local, dtype, False))
    bwd.add(compute.memory(act, T * f_local, dtype, True))
    _linear(fwd, bwd, compute, T, h, f_local, dtype)

    # norms, residuals, hidden dropout (on T/t tokens with sequence parallelism)
    norm = model.norm
    for kernel, count in ((norm, 2), ("residual_add", 2)) + ((("dropout", 2),) if model.family == "gpt" else ()):
        fwd.add(compute.memory(kernel, T_norm * h, dtype, False), count)
        bwd.add(compute.memory(kernel, T_norm * h, dtype, True), count)

    rc = np.asarray(recompute)
    re_t = np.where(rc == 2, fwd.t, np.where(rc == 1, attn_f.t, 0.0))
    total = fwd.t + bwd.t
    measured = np.where(total > 0, (fwd.m + bwd.m) / np.where(total > 0, total, 1.0), 0.0)
    return LayerCost(fwd=fwd.t, bwd=bwd.t, recompute=re_t,
                     dgrad={"attention": dg_a, "feed_forward": dg_m},
                     wgrad={"attention": wg_a, "feed_forward": wg_m}, measured=measured, attention=flash_t)


@dataclass(frozen=True)
class EdgeCost:
    """Embedding (first stage) and logits + loss (last stage) per micro-batch, arrays over plans."""

    first_fwd: np.ndarray
    first_bwd: np.ndarray
    last_fwd: np.ndarray
    last_bwd: np.ndarray


def edge_cost(model: ModelSpec, compute: ComputeModel, *, tp: np.ndarray, sp: np.ndarray,
              micro_batch: np.ndarray, dtype: str) -> EdgeCost:
    """Embedding lookup (memory-bound) and output layer: final norm, logits GEMM, vocab-parallel softmax."""
    n_plans = len(tp)
    t = tp.astype(float)
    T = micro_batch.astype(float) * model.seq_len
    h = float(model.hidden_size)
    vocab_local = np.array([model.padded_vocab(int(x)) for x in np.unique(tp)])
    v_local = vocab_local[np.searchsorted(np.unique(tp), tp)] / t
    T_norm = np.where(sp, T / t, T)
    ff, fb, lf, lb = (_Acc(n_plans) for _ in range(4))
    ff.add(compute.memory("residual_add", T * h, dtype, False))   # gather rows (+ positions)
    fb.add(compute.memory("residual_add", T * h, dtype, True))    # scatter-add into the table
    lf.add(compute.memory(model.norm, T_norm * h, dtype, False))
    lb.add(compute.memory(model.norm, T_norm * h, dtype, True))
    _linear(lf, lb, compute, T, v_local, h, dtype)
    fwd_el, bwd_el = cross_entropy_elements(T * v_local)
    lf.add(compute.memory("softmax", fwd_el, "fp32", False))
    lb.add(compute.memory("softmax", bwd_el, "fp32", True))
    return EdgeCost(first_fwd=ff.t, first_bwd=fb.t, last_fwd=lf.t, last_bwd=lb.t)


def cross_entropy_elements(logits: np.ndarray, impl: str = "megatron") -> tuple[np.ndarray, np.ndarray]:
    """The vocab-parallel cross-entropy as fp32 softmax-kernel work with its real memory traffic: forward and
    backward bytes per logit element of tpsim/data/kernels/fixed.yaml (``cross_entropy.<impl>``: the fp32 cast,
    max, subtract, exp, sum, divide forward; the gradient scale and cast backward) expressed as the element
    counts that move those bytes through the softmax kernel (efficiency.yaml bytes_per_element x 4 B)."""
    from ..compute.fixed import fixed_data
    from ..compute.roofline import default_efficiency

    ce = fixed_data().cross_entropy[impl]
    fwd_per, bwd_per = default_efficiency().bytes_per_element["softmax"]
    return logits * ce.forward_bytes / (4.0 * fwd_per), logits * ce.backward_bytes / (4.0 * bwd_per)
