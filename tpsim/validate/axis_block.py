"""The block of a context- or expert-parallel validation case (rank side, torch): the transformer block of
:mod:`tpsim.validate.block` with its attention core run over the cp group (:mod:`tpsim.validate.cp_attention`)
and, for a mixture-of-experts model, its MLP replaced by the routed and shared experts of
:mod:`tpsim.validate.moe_block` with the experts split over the ep group.

The unsharded reference is the same block with plain causal attention and every expert on the rank; the
sharded block is a copy of it (same weights; the rank's slice of the experts).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from torch import nn

from ..model import ModelSpec
from .block import GPT_HIDDEN_DROPOUT, Attention, BlockDims, TransformerBlock, apply_rotary
from .cp_attention import positions, ring_attention, ulysses_attention
from .moe_block import MoEFeedForward, init_moe, shard_experts


class CPAttention(Attention):
    """:class:`~tpsim.validate.block.Attention` on the rank's load-balanced tokens: rotary angles of their
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


def build_reference(model: ModelSpec, fused: bool, seq: int, seed: int = 0, dropout: bool = False) -> TransformerBlock:
    """The unsharded block (fp32), seeded: attention and a dense MLP as :func:`tpsim.validate.block.build_block`,
    or the mixture-of-experts MLP with every expert (and the shared experts) for an MoE model."""
    d = BlockDims.of(model, 1)
    if model.is_moe:
        d = dataclasses.replace(d, ffn=1)  # the dense MLP is replaced below
    p = GPT_HIDDEN_DROPOUT if dropout and model.family == "gpt" else 0.0
    block = TransformerBlock(d, fused, seq, p)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in block.named_parameters():
            if prm.dim() == 2:
                prm.copy_(torch.randn(prm.shape, generator=gen) / math.sqrt(prm.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=gen))
            else:
                prm.copy_(0.1 * torch.randn(prm.shape, generator=gen))
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
        attn = CPAttention(ref.attention.d, fused, seq, cp_group, cp_kind).to(_dtype(ref))
        attn.load_state_dict(ref.attention.state_dict())
        block.attention = attn
    if model.is_moe and ep_group is not None and ep_group.size() > 1:
        block.feed_forward = shard_experts(ref.feed_forward, model, ep_group)
    return block


def _dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def expert_slice(name: str, ff: Any) -> slice | None:
    """For a routed expert's parameter of a sharded block, the rows of the reference's stack it holds."""
    if not name.startswith("feed_forward.experts.") or not isinstance(ff, MoEFeedForward):
        return None
    return slice(ff.first, ff.first + ff.local)

