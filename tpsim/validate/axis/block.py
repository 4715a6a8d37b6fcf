"""The block of a context- or expert-parallel validation case (rank side, torch): the transformer block of
:mod:`tpsim.validate.modules.block` with its attention core run over the cp group (:mod:`tpsim.validate.modules.cp_attention`)
and, for a mixture-of-experts model, its MLP replaced by the routed and shared experts of
:mod:`tpsim.validate.modules.moe` with the experts split over the ep group.

The unsharded reference is the same block with plain causal attention and every expert on the rank; the
sharded block is a copy of it (same weights; the rank's slice of the experts).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...model import ModelSpec

from ..modules.block import (GPT_HIDDEN_DROPOUT, Attention, BlockDims, RMSNorm, TransformerBlock, _rotary_tables, apply_rotary,
                    init_weights)
from ..modules.cp_attention import positions, ring_attention, ulysses_attention
from ..modules.moe import MoEFeedForward, init_moe, shard_experts


class CPAttention(Attention):
    """:class:`~tpsim.validate.modules.block.Attention` on the rank's load-balanced tokens: rotary angles of their
    global positions, the attention core over the cp group (``kind`` ring or a2a)."""

    def __init__(self, d: BlockDims, fused: bool, seq: int, group: Any, kind: str) -> None:
        super().__init__(d, fused, seq)
        self.group, self.kind = group, kind
        self.register_buffer("pos", positions(seq, group.size(), group.rank()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(x)
        b, n, hd = q.shape[0], q.shape[1], self.d.head_dim
        q, k, v = (t.reshape(b, n, -1, hd) for t in (q, k, v))
        if self.d.rotary:
            cos, sin = self.cos[self.pos], self.sin[self.pos]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        core = ring_attention if self.kind == "ring" else ulysses_attention
        return self.wo(core(q, k, v, self.group).reshape(b, n, -1))


class MLAAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2 report eq. 9-14, Megatron-Core ``MLASelfAttention``), the shapes
    the estimator costs: one down-projection of the input to [query latent | key/value latent | shared rotary
    key] (no query latent when ``q_lora_rank`` is 0: the queries come from the input), RMSNorms on the latents,
    up-projections to per-head queries (nope + rope dims) and keys/values (nope + value dims), rotary angles on
    the rope part (the key's shared by all heads), causal attention with the query/key dim's scale, output
    projection. With ``group`` the attention core is the ring over it (the a2a kind is not run with MLA:
    TransformerEngine runs MLA with p2p only)."""

    def __init__(self, model: ModelSpec, seq: int, group: Any = None) -> None:
        super().__init__()
        h, heads = model.hidden_size, model.num_attention_heads
        self.heads, self.nope, self.rope, self.vd = heads, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        self.ql, self.kvl = model.q_lora_rank, model.kv_lora_rank
        self.group = group
        self.wkv_a = nn.Linear(h, self.ql + self.kvl + self.rope, bias=False)
        if self.ql:
            self.q_norm = RMSNorm(self.ql)
            self.wq_b = nn.Linear(self.ql, heads * (self.nope + self.rope), bias=False)
        else:
            self.wq = nn.Linear(h, heads * (self.nope + self.rope), bias=False)
        self.kv_norm = RMSNorm(self.kvl)
        self.wkv_b = nn.Linear(self.kvl, heads * (self.nope + self.vd), bias=False)
        self.wo = nn.Linear(heads * self.vd, h, bias=model.linear_bias)
        cos, sin = _rotary_tables(seq, self.rope)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        pos = torch.arange(seq) if group is None else positions(seq, group.size(), group.rank())
        self.register_buffer("pos", pos, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        lat = self.wkv_a(x)
        q_lat, kv_lat, k_pe = lat.split([self.ql, self.kvl, self.rope], dim=-1)
        q = self.wq_b(self.q_norm(q_lat)) if self.ql else self.wq(x)
        q = q.view(b, n, self.heads, self.nope + self.rope)
        kv = self.wkv_b(self.kv_norm(kv_lat)).view(b, n, self.heads, self.nope + self.vd)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        cos, sin = self.cos[self.pos[:n]], self.sin[self.pos[:n]]
        q_pe = apply_rotary(q[..., self.nope:], cos, sin)
        k_pe = apply_rotary(k_pe.view(b, n, 1, self.rope), cos, sin).expand(b, n, self.heads, self.rope)
        q = torch.cat((q[..., :self.nope], q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe), dim=-1)
        if self.group is not None and self.group.size() > 1:
            o = ring_attention(q, k, v, self.group)
        else:
            t = lambda z: z.transpose(1, 2)  # noqa: E731
            o = t(F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True))
        return self.wo(o.reshape(b, n, -1))


def build_reference(model: ModelSpec, fused: bool, seq: int, seed: int = 0, dropout: bool = False) -> TransformerBlock:
    """The unsharded block (fp32), seeded: attention and a dense MLP as :func:`tpsim.validate.modules.block.build_block`,
    or the mixture-of-experts MLP with every expert (and the shared experts) for an MoE model."""
    d = BlockDims.of(model, 1)
    if model.is_moe:
        d = dataclasses.replace(d, ffn=1)  # the dense MLP is replaced below
    p = GPT_HIDDEN_DROPOUT if dropout and model.family == "gpt" else 0.0
    block = TransformerBlock(d, fused, seq, p)
    if model.attention_kind == "mla":
        block.attention = MLAAttention(model, seq)
    gen = torch.Generator().manual_seed(seed)
    init_weights(block, gen)
    if model.is_moe:
        block.feed_forward = MoEFeedForward(model)
        init_moe(block.feed_forward, gen)
    return block


def shard_block(ref: TransformerBlock, model: ModelSpec, fused: bool, seq: int, *, cp_group: Any = None,
                cp_kind: str = "ring", ep_group: Any = None) -> TransformerBlock:
    """A copy of ``ref`` whose attention core runs over ``cp_group`` (None: plain) and whose routed experts are
    split over ``ep_group`` (None: all local)."""
    block = copy.deepcopy(ref)
    if cp_group is not None and cp_group.size() > 1:
        if isinstance(ref.attention, MLAAttention):
            attn = MLAAttention(model, seq, cp_group)
        else:
            attn = CPAttention(ref.attention.d, fused, seq, cp_group, cp_kind)
        attn = attn.to(device=_device(ref), dtype=_dtype(ref))
        attn.load_state_dict(ref.attention.state_dict())
        block.attention = attn
    if model.is_moe and ep_group is not None and ep_group.size() > 1:
        block.feed_forward = shard_experts(ref.feed_forward, model, ep_group)
    return block


def _dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def expert_slice(name: str, ff: Any) -> slice | None:
    """For a routed expert's parameter of a sharded block, the rows of the reference's stack it holds."""
    if not name.startswith("feed_forward.experts.") or not isinstance(ff, MoEFeedForward):
        return None
    return slice(ff.first, ff.first + ff.local)

