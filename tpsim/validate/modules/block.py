"""The transformer block of a :class:`~tpsim.model.ModelSpec` in plain PyTorch, with the module names of
:mod:`tpsim.tp_plan` (torchtitan's Llama block), so that ``layer_plan`` shards it with ``parallelize_module``.

GPT family: LayerNorm, GeLU MLP (``w1``, ``w2``), biases as the spec says. Llama family: RMSNorm (the Python
implementation that ``SequenceParallel`` supports), SwiGLU MLP (``w1`` gate, ``w3`` up, ``w2`` down), rotary
positions, grouped-query attention. q/k/v are separate Linear layers or one fused ``wqkv`` (and ``w13`` for
SwiGLU) whose rows are laid out per TP rank, ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``, as Megatron-Core does, so a
contiguous ``Shard(0)`` of the fused weight gives each rank its own heads.

KV heads fewer than the TP degree are replicated (Megatron-Core's rule): the block is built with ``tp`` KV heads,
KV head ``j`` copied ``tp / kv`` times, which computes the same function as the original block.
GPT blocks apply hidden dropout after the attention and MLP outputs (Megatron's bias-dropout-add, p = 0.1 by
default, as the estimator costs it); the numerics check runs with p = 0 (the sharded and unsharded runs would
draw different masks), the timing with the model's p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class BlockDims:
    """Sizes of the block as built (after KV-head replication); element counts."""

    hidden: int
    heads: int
    kv_heads: int
    """KV heads as built: max(model kv heads, tp) when kv heads < tp (replicated), else the model's."""
    head_dim: int
    ffn: int
    groups: int
    """rank groups of the fused weights' row layout (the TP degree the block is built for)."""
    family: str
    qkv_bias: bool
    linear_bias: bool
    rotary: bool

    @staticmethod
    def of(model: ModelSpec, tp: int) -> "BlockDims":
        kv = model.num_kv_heads if model.num_kv_heads >= tp else tp
        return BlockDims(hidden=model.hidden_size, heads=model.num_attention_heads, kv_heads=kv,
                         head_dim=model.head_dim, ffn=model.ffn_hidden_size, groups=tp, family=model.family,
                         qkv_bias=model.qkv_bias, linear_bias=model.linear_bias,
                         rotary=model.position == "rotary")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019), Python form supported by SequenceParallel."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotary_tables(seq: int, head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoFormer positions (Su et al. 2021), shape (seq, head_dim/2)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (batch, seq, heads, head_dim) by the position angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    """Causal self-attention with q/k/v/o as Linear layers (separate or fused q/k/v)."""

    def __init__(self, d: BlockDims, fused: bool, seq: int) -> None:
        super().__init__()
        self.d, self.fused = d, fused
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        if fused:
            self.wqkv = nn.Linear(d.hidden, q + 2 * kv, bias=d.qkv_bias)
        else:
            self.wq = nn.Linear(d.hidden, q, bias=d.qkv_bias)
            self.wk = nn.Linear(d.hidden, kv, bias=d.qkv_bias)
            self.wv = nn.Linear(d.hidden, kv, bias=d.qkv_bias)
        self.wo = nn.Linear(q, d.hidden, bias=d.linear_bias)
        if d.rotary:
            cos, sin = _rotary_tables(seq, d.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.fused:
            return self.wq(x), self.wk(x), self.wv(x)
        d = self.d
        qg, kg = d.heads * d.head_dim // d.groups, d.kv_heads * d.head_dim // d.groups
        y = self.wqkv(x)
        y = y.view(*y.shape[:-1], -1, qg + 2 * kg)  # (b, s, local groups, per-rank q|k|v)
        q, k, v = y.split([qg, kg, kg], dim=-1)
        return q.flatten(-2), k.flatten(-2), v.flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(x)
        b, s, hd = q.shape[0], q.shape[1], self.d.head_dim
        q, k, v = (t.reshape(b, s, -1, hd) for t in (q, k, v))
        if self.d.rotary:
            q, k = apply_rotary(q, self.cos[:s], self.sin[:s]), apply_rotary(k, self.cos[:s], self.sin[:s])
        rep = q.shape[2] // k.shape[2]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """GeLU MLP (w2(gelu(w1 x))) or SwiGLU (w2(silu(w1 x) * w3 x), Shazeer 2020); fused w13 optional."""

    def __init__(self, d: BlockDims, fused: bool) -> None:
        super().__init__()
        self.d = d
        self.gated = d.family == "llama"
        self.fused = fused and self.gated
        bias = d.linear_bias
        if self.fused:
            self.w13 = nn.Linear(d.hidden, 2 * d.ffn, bias=bias)
        else:
            self.w1 = nn.Linear(d.hidden, d.ffn, bias=bias)
            if self.gated:
                self.w3 = nn.Linear(d.hidden, d.ffn, bias=bias)
        self.w2 = nn.Linear(d.ffn, d.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.w2(F.gelu(self.w1(x)))
        if self.fused:
            y = self.w13(x)
            y = y.view(*y.shape[:-1], -1, 2 * self.d.ffn // self.d.groups)
            gate, up = y.chunk(2, dim=-1)
            gate, up = gate.flatten(-2), up.flatten(-2)
        else:
            gate, up = self.w1(x), self.w3(x)
        return self.w2(F.silu(gate) * up)


GPT_HIDDEN_DROPOUT = 0.1
"""hidden dropout of GPT blocks (Megatron-LM's --hidden-dropout default); Llama blocks have none."""


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + drop(attention(attention_norm(x))); out = h + drop(feed_forward(ffn_norm(h)))."""

    def __init__(self, d: BlockDims, fused: bool, seq: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        norm = (lambda: nn.LayerNorm(d.hidden)) if d.family == "gpt" else (lambda: RMSNorm(d.hidden))
        self.attention_norm = norm()
        self.attention = Attention(d, fused, seq)
        self.ffn_norm = norm()
        self.feed_forward = FeedForward(d, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self._drop(self.attention(self.attention_norm(x)))
        return h + self._drop(self.feed_forward(self.ffn_norm(h)))

    def _drop(self, y: torch.Tensor) -> torch.Tensor:
        return F.dropout(y, self.dropout) if self.dropout and self.training else y


def build_block(model: ModelSpec, tp: int, fused: bool, seq: int, seed: int = 0,
                dropout: bool = False) -> TransformerBlock:
    """The unsharded block, fp32, with seeded weights (identical on every rank) and non-trivial norm weights.

    Linear weights ~ N(0, 1/fan_in) keep activations O(1); KV heads fewer than ``tp`` are replicated;
    ``dropout``: GPT blocks get their hidden dropout (timing), else none (numerics).
    """
    d = BlockDims.of(model, tp)
    gen = torch.Generator().manual_seed(seed)
    p = GPT_HIDDEN_DROPOUT if dropout and model.family == "gpt" else 0.0
    block = TransformerBlock(d, fused, seq, p)
    init_weights(block, gen)
    if d.kv_heads != model.num_kv_heads:
        with torch.no_grad():
            _replicate_kv(block.attention, d, model.num_kv_heads)
    return block


def init_weights(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded weights in parameter order: matrices ~ N(0, 1/fan_in) (activations stay O(1)), norm weights
    1 + N(0, 0.01), other vectors N(0, 0.01) (non-trivial norms and biases)."""
    with torch.no_grad():
        for name, prm in module.named_parameters():
            if prm.dim() == 2:
                prm.copy_(torch.randn(prm.shape, generator=gen) / math.sqrt(prm.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=gen))
            else:
                prm.copy_(0.1 * torch.randn(prm.shape, generator=gen))


def _replicate_kv(attn: Attention, d: BlockDims, kv_model: int) -> None:
    """Make KV heads copies of the model's ``kv_model`` heads (head j of the built block = head j * kv / tp)."""
    hd, copies = d.head_dim, d.kv_heads // kv_model
    src = torch.arange(d.kv_heads) // copies
    rows = (src[:, None] * hd + torch.arange(hd)[None, :]).reshape(-1)
    if attn.fused:
        w = attn.wqkv.weight.view(d.groups, -1, d.hidden)
        qg, kg = d.heads * hd // d.groups, d.kv_heads * hd // d.groups
        k = w[:, qg:qg + kg].reshape(-1, d.hidden)
        v = w[:, qg + kg:].reshape(-1, d.hidden)
        w[:, qg:qg + kg] = k[rows].view(d.groups, kg, d.hidden)
        w[:, qg + kg:] = v[rows].view(d.groups, kg, d.hidden)
        if attn.wqkv.bias is not None:
            b = attn.wqkv.bias.view(d.groups, -1)
            bk, bv = b[:, qg:qg + kg].reshape(-1), b[:, qg + kg:].reshape(-1)
            b[:, qg:qg + kg] = bk[rows].view(d.groups, kg)
            b[:, qg + kg:] = bv[rows].view(d.groups, kg)
        return
    for lin in (attn.wk, attn.wv):
        lin.weight.copy_(lin.weight[rows])
        if lin.bias is not None:
            lin.bias.copy_(lin.bias[rows])
