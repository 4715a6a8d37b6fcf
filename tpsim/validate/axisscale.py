"""Fit a context/expert-parallel case to this machine, and its tiny twin for the framework overhead
(torch-free; the rules of :mod:`tpsim.validate.scale` and :mod:`tpsim.validate.overhead` for
:class:`~tpsim.validate.axiscase.AxisCase`)."""

from __future__ import annotations

import dataclasses

from ..errors import InputError
from ..model import with_overrides
from .axiscase import AxisCase
from .overhead import TINY_HEAD_DIM, TINY_REPS, TINY_SEQ_PER_RANK, TINY_WARMUP
from .scale import ACT_PER_TOKEN_FFN, ACT_PER_TOKEN_HIDDEN, MEMORY_SHARE, MIN_SEQ, available_memory

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
    act = case.micro_batch * m.seq_len * (ACT_PER_TOKEN_HIDDEN * m.hidden_size + ACT_PER_TOKEN_FFN * ffn)
    return FP64_BYTES * (4 * params + act * (1 + 1 / case.cp)) + 4 * 4 * params


def time_of_case(case: AxisCase, cluster, compute) -> float:  # noqa: ANN001
    """Predicted seconds of a whole case on one rank: the fp64 reference on every replica's micro-batch and the
    fp64 sharded pass (fp64 taken as twice fp32), the recorded pass, warm-up and timed iterations (twice reps)."""
    from .axispredict import predict_axis
    pred = predict_axis(case, cluster, compute)
    t = pred.fwd_compute_s + pred.bwd_compute_s
    reference = 2.0 * t * case.world
    return reference + 2.0 * t + t * (1 + case.warmup + 2 * case.reps)


def fit_axis_case(case: AxisCase, nproc: int, cluster, compute, budget_s: float,  # noqa: ANN001
                  memory_bytes: int | None = None) -> AxisCase:
    """``case`` with the sequence halved (a multiple of 2 cp, down to MIN_SEQ), then the micro-batch reduced to
    1, until it fits in memory and ``budget_s``; widths, experts and axes unchanged."""
    limit = MEMORY_SHARE * (memory_bytes or available_memory()) / nproc
    original = case
    step = 2 * case.cp
    while memory_per_rank(case) > limit or time_of_case(case, cluster, compute) > budget_s:
        m = case.model
        half = m.seq_len // 2
        if half >= MIN_SEQ and half % step == 0:
            case = dataclasses.replace(case, model=with_overrides(m, seq_len=half))
        elif case.micro_batch > 1:
            case = dataclasses.replace(case, micro_batch=1)
        else:
            need = memory_per_rank(case)
            if need > limit:
                raise InputError(f"a {m.name} layer needs {need / 2**30:.1f} GiB per rank even at seq_len="
                                 f"{m.seq_len}, micro_batch=1 ({limit / 2**30:.1f} GiB available per rank); "
                                 "give smaller --hidden/--ffn/--experts")
            break
    if case == original:
        return case
    changes = []
    if case.model.seq_len != original.model.seq_len:
        changes.append(f"seq_len {original.model.seq_len}->{case.model.seq_len}")
    if case.micro_batch != original.micro_batch:
        changes.append(f"micro_batch {original.micro_batch}->{case.micro_batch}")
    return dataclasses.replace(case, scaled="; ".join(changes) + " (to fit this machine; widths unchanged)")


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
