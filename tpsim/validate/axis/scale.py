"""Fit a context/expert-parallel case to this machine, and its tiny twin for the framework overhead
(torch-free; the rules of :mod:`tpsim.validate.block.scale` and :mod:`tpsim.validate.overhead` for
:class:`~tpsim.validate.axis.case.AxisCase`)."""

from __future__ import annotations

import dataclasses

from ...model import with_overrides
from .case import AxisCase
from ..overhead import TINY_HEAD_DIM, TINY_REPS, TINY_SEQ_PER_RANK, TINY_WARMUP
from ..block.scale import activation_elements, check_memory, mark_scaled, memory_limit, shrink

FP64_BYTES = 8
TINY_EXPERT_FFN = 64
"""expert FFN width of a tiny twin (the number of experts and top-k stay: the per-expert loop is overhead)."""
TINY_LATENT = 64
"""query and key/value latent ranks of an MLA twin."""
TINY_MLA_DIM = 16
"""nope, rope and value head dims of an MLA twin."""


def layer_params(case: AxisCase) -> int:
    """Parameters of the case's layer, every expert included."""
    m = case.model
    return m.layer_params(0) if m.is_moe else m.layer_params()


def memory_per_rank(case: AxisCase) -> float:
    """Bytes one rank needs: the fp64 reference and sharded blocks (weights and gradients, every expert), the
    fp32 block of the communication pass and of the timing, and the reference's activations on one replica's
    micro-batch in fp64."""
    m = case.model
    params = layer_params(case)
    ffn = m.experts_per_token * m.moe_ffn_hidden_size + m.num_shared_experts * m.shared_expert_ffn_hidden_size \
        if m.is_moe else m.ffn_hidden_size
    act = activation_elements(case.micro_batch * m.seq_len, m.hidden_size, ffn)
    return FP64_BYTES * (4 * params + act * (1 + 1 / case.cp)) + 4 * 4 * params


def time_of_case(case: AxisCase, cluster, compute) -> float:  # noqa: ANN001
    """Predicted seconds of a whole case on one rank: the fp64 reference on every replica's micro-batch and the
    fp64 sharded pass (fp64 taken as twice fp32), the recorded pass, warm-up and timed iterations (twice reps)."""
    from .predict import predict_axis
    pred = predict_axis(case, cluster, compute)
    t = pred.fwd_compute_s + pred.bwd_compute_s
    reference = 2.0 * t * case.world
    return reference + 2.0 * t + t * (1 + case.warmup + 2 * case.reps)


def fit_axis_case(case: AxisCase, nproc: int, cluster, compute, budget_s: float,  # noqa: ANN001
                  memory_bytes: int | None = None) -> AxisCase:
    """``case`` with the sequence halved (a multiple of 2 cp, down to MIN_SEQ), then the micro-batch reduced to
    1, until it fits in memory and ``budget_s``; widths, experts and axes unchanged."""
    limit = memory_limit(memory_bytes, nproc)
    fitted = shrink(case, 2 * case.cp,
                    lambda c: memory_per_rank(c) > limit or time_of_case(c, cluster, compute) > budget_s)
    check_memory(memory_per_rank(fitted), limit, f"{fitted.model.name} layer", fitted.model.seq_len,
                 "smaller --hidden/--ffn/--experts")
    return mark_scaled(case, fitted)


def overhead_case(case: AxisCase) -> AxisCase:
    """The tiny twin: the same axes, kind, family, GQA shape and experts (count, top-k, shared); 2 heads per cp
    rank of dim 32 (MLA: latents of 64, head dims of 16), 8 tokens per cp rank, one sequence, expert FFN of 64."""
    m = case.model
    heads = 2 * case.cp
    kv = case.cp if m.num_kv_heads < m.num_attention_heads else heads
    hidden = heads * TINY_HEAD_DIM
    ffn = 4 * hidden if m.family == "gpt" else 3 * hidden
    model = with_overrides(dataclasses.replace(m, name=f"{m.name}-overhead"), hidden=hidden, heads=heads,
                           kv_heads=kv, ffn=ffn, seq_len=TINY_SEQ_PER_RANK * case.cp)
    if m.attention_kind == "mla":
        model = dataclasses.replace(model, q_lora_rank=min(m.q_lora_rank, TINY_LATENT), kv_lora_rank=TINY_LATENT,
                                    qk_nope_head_dim=TINY_MLA_DIM, qk_rope_head_dim=TINY_MLA_DIM,
                                    v_head_dim=TINY_MLA_DIM, head_dim=2 * TINY_MLA_DIM)
    if m.is_moe:
        shared = TINY_EXPERT_FFN if m.num_shared_experts else 0
        model = dataclasses.replace(model, moe_ffn_hidden_size=TINY_EXPERT_FFN, shared_expert_ffn_hidden_size=shared)
    return dataclasses.replace(case, model=model, micro_batch=1, reps=TINY_REPS, warmup=TINY_WARMUP, scaled="")
