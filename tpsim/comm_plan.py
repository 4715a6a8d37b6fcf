"""Context-parallel and expert-parallel collectives of one layer (torch-free), beside the tensor-parallel ones of
:mod:`tpsim.tp_plan`.

One formula per message serves the estimator (vectorized over plans: the ``*_bytes`` functions take numpy
arrays) and ``tpsim validate`` (:func:`cp_collectives`, :func:`moe_collectives` for one plan: kind, count and
bytes per axis, in the nccl-tests byte convention of :mod:`tpsim.collectives.curve`).

**Ring context parallelism** (TransformerEngine ``AttnFuncWithCPAndKVP2P``, Megatron-Core ``--cp-comm-type
p2p``): the sequence is cut into 2 x cp chunks and rank r holds chunks r and 2 cp - 1 - r (DualChunkSwap, causal
load balancing), so every rank does the same attention work. Forward: cp steps of attention, and cp - 1
point-to-point exchanges of the rank's key/value block with its ring neighbours, each overlapping one step's
attention. Backward: cp steps; step 0 sends K/V, steps 1 .. cp - 2 send K/V together with the dK/dV accumulated
so far (one message of twice the size), the last step sends dK/dV home.

**All-to-all context parallelism** (Ulysses; TransformerEngine ``AttnFuncWithCPAndQKVOA2A``): before attention
q, k and v are each all-to-all'ed from (sequence / cp, all local heads) to (whole sequence, heads / cp); after it
the output goes back. Backward: dO out, then dQ, dK, dV back: 4 all-to-alls per layer each way.

**Expert parallelism** (Megatron-Core ``MoEAlltoAllTokenDispatcher``): each rank routes its tokens (the
sequence-parallel share: b s / (cp tp)), the top-k copies are all-to-all'ed to the ep ranks holding their
experts (dispatch) and back (combine); with expert tensor parallelism (etp > 1) the received tokens are
all-gathered over the etp group before the expert GEMMs and reduce-scattered after them. Backward runs the
transposes: 2 all-to-alls (and the etp reduce-scatter / all-gather). Bytes assume balanced routing; the
estimator scales the busiest rank's share by the load-imbalance factor (:mod:`tpsim.estimator.moe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .precision import activation_bytes
from .model import ModelSpec

ArrayLike = Any


@dataclass(frozen=True)
class AxisOp:
    """One kind of collective of one layer and one micro-batch on one plan axis."""

    axis: str
    """"cp" (the context-parallel group), "ep" (the expert-parallel group) or "etp" (expert tensor parallel)."""
    phase: str
    """"fwd" or "bwd"."""
    op: str
    """send_recv | all_to_all | all_gather | reduce_scatter."""
    count: int
    """times it runs per layer and micro-batch."""
    nbytes: float
    """bytes of one run in the nccl-tests convention (send_recv: the message; all_to_all: one rank's send
    buffer; all_gather: the gathered output; reduce_scatter: the input)."""
    tensor: str
    """what moves ("K/V", "q", "dispatch", ...)."""
    overlap: str = ""
    """"attention": hidden behind one ring step's attention compute; "": exposed."""


# ---- sizes (vectorized: plan fields may be numpy arrays) ---------------------------------------------------
def head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key head dim, value head dim): both head_dim for standard attention; MLA has qk_nope + qk_rope
    for queries and keys and v_head_dim for values (DeepSeek-V2 paper eq. 9-14)."""
    if model.attention_kind == "mla":
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


@dataclass(frozen=True)
class LocalShapes:
    """One TP rank's share of the attention heads (arrays over tp)."""

    q_heads: ArrayLike
    kv_heads: ArrayLike
    """key/value heads: ``kv_heads / tp``, at least one (kv heads below tp are replicated, Megatron)."""
    q_width: ArrayLike
    """query (and attention output) features: ``q_heads x head_dim``."""
    kv_width: ArrayLike
    """key or value features: ``kv_heads x head_dim`` (standard attention; MLA up-projects its own per head)."""


def local_shapes(model: ModelSpec, tp: ArrayLike) -> LocalShapes:
    """The GQA rule, one place: heads and widths on one TP rank of ``tp``."""
    t = np.asarray(tp, dtype=float)
    q, kv = model.num_attention_heads / t, np.maximum(model.num_kv_heads / t, 1.0)
    d = float(model.head_dim)
    return LocalShapes(q_heads=q, kv_heads=kv, q_width=q * d, kv_width=kv * d)


def cp_tokens(model: ModelSpec, cp: ArrayLike, micro_batch: ArrayLike) -> ArrayLike:
    """Tokens of one micro-batch on one context-parallel rank: b x s / cp."""
    return np.asarray(micro_batch, dtype=float) * model.seq_len / np.asarray(cp, dtype=float)


def kv_block_bytes(model: ModelSpec, *, tp: ArrayLike, cp: ArrayLike, micro_batch: ArrayLike,
                   act_bytes: float) -> ArrayLike:
    """Bytes of one rank's key and value block (its b s / cp tokens, local kv heads): the ring message."""
    dqk, dv = head_dims(model)
    kv = local_shapes(model, tp).kv_heads
    return cp_tokens(model, cp, micro_batch) * kv * (dqk + dv) * act_bytes


def a2a_bytes(model: ModelSpec, *, tp: ArrayLike, cp: ArrayLike, micro_batch: ArrayLike,
              act_bytes: float) -> dict[str, ArrayLike]:
    """Send buffer of one rank for each all-to-all of Ulysses context parallelism: q, k, v and the output o
    (the local tokens of the local heads)."""
    dqk, dv = head_dims(model)
    s = local_shapes(model, tp)
    q, kv = s.q_heads, s.kv_heads
    tokens = cp_tokens(model, cp, micro_batch) * act_bytes
    return {"q": tokens * q * dqk, "k": tokens * kv * dqk, "v": tokens * kv * dv, "o": tokens * q * dv}


def moe_tokens(model: ModelSpec, *, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike,
               micro_batch: ArrayLike) -> ArrayLike:
    """Tokens one rank routes per micro-batch: its context-parallel share, split over tp with sequence
    parallelism (Megatron-Core's MoE layer needs it when tp > 1)."""
    t = np.asarray(tp, dtype=float)
    return cp_tokens(model, cp, micro_batch) / np.where(np.asarray(sp, dtype=bool), t, 1.0)


def dispatch_bytes(model: ModelSpec, *, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike, micro_batch: ArrayLike,
                   act_bytes: float) -> ArrayLike:
    """One rank's all-to-all send buffer of the dispatch (and of the combine): its top-k token copies,
    hidden_size elements each, balanced routing."""
    tokens = moe_tokens(model, tp=tp, cp=cp, sp=sp, micro_batch=micro_batch)
    return tokens * model.experts_per_token * model.hidden_size * act_bytes


# ---- lists for one plan -----------------------------------------------------------------------------------
_act_bytes = activation_bytes
"""bytes per activation element (tpsim/precision.py)."""


def cp_collectives(model: ModelSpec, plan: Any) -> list[AxisOp]:
    """Context-parallel collectives of one transformer layer per micro-batch (forward then backward); [] when
    cp == 1. ``plan`` is a :class:`tpsim.plan.Plan`."""
    cp = int(plan.cp)
    if cp == 1:
        return []
    kw = dict(tp=plan.tp, cp=cp, micro_batch=plan.micro_batch, act_bytes=_act_bytes(plan.dtype))
    if plan.cp_kind == "a2a":
        sizes = {k: float(v) for k, v in a2a_bytes(model, **kw).items()}
        fwd = [AxisOp("cp", "fwd", "all_to_all", 1, sizes[t], t) for t in ("q", "k", "v", "o")]
        bwd = [AxisOp("cp", "bwd", "all_to_all", 1, sizes[t], "d" + t) for t in ("o", "q", "k", "v")]
        return fwd + bwd
    kv = float(kv_block_bytes(model, **kw))
    ops = [AxisOp("cp", "fwd", "send_recv", cp - 1, kv, "K/V", "attention"),
           AxisOp("cp", "bwd", "send_recv", 1, kv, "K/V", "attention")]
    if cp > 2:
        ops.append(AxisOp("cp", "bwd", "send_recv", cp - 2, 2 * kv, "K/V + dK/dV", "attention"))
    ops.append(AxisOp("cp", "bwd", "send_recv", 1, kv, "dK/dV", "attention"))
    return ops


def moe_collectives(model: ModelSpec, plan: Any) -> list[AxisOp]:
    """Expert-parallel collectives of one mixture-of-experts layer per micro-batch (balanced routing); [] for
    a dense model or ep = etp = 1. The shared experts' tensor-parallel collectives are the dense MLP's
    (:func:`tpsim.tp_plan.layer_collectives`). Multiply by ``model.num_moe_layers`` for the whole model."""
    if not model.is_moe:
        return []
    etp = int(plan.etp or plan.tp)
    nbytes = float(dispatch_bytes(model, tp=plan.tp, cp=plan.cp, sp=plan.sp, micro_batch=plan.micro_batch,
                                  act_bytes=_act_bytes(plan.dtype)))
    ops: list[AxisOp] = []
    gathered = nbytes * etp  # the etp group's received copies, gathered
    if plan.ep > 1:
        ops.append(AxisOp("ep", "fwd", "all_to_all", 1, nbytes, "dispatch"))
    if etp > 1:
        ops.append(AxisOp("etp", "fwd", "all_gather", 1, gathered, "dispatched tokens"))
        ops.append(AxisOp("etp", "fwd", "reduce_scatter", 1, gathered, "expert output"))
    if plan.ep > 1:
        ops.append(AxisOp("ep", "fwd", "all_to_all", 1, nbytes, "combine"))
        ops.append(AxisOp("ep", "bwd", "all_to_all", 1, nbytes, "combine gradient"))
    if etp > 1:
        ops.append(AxisOp("etp", "bwd", "all_gather", 1, gathered, "expert output gradient"))
        ops.append(AxisOp("etp", "bwd", "reduce_scatter", 1, gathered, "dispatched tokens gradient"))
    if plan.ep > 1:
        ops.append(AxisOp("ep", "bwd", "all_to_all", 1, nbytes, "dispatch gradient"))
    return ops


def count_by_axis(ops: list[AxisOp]) -> dict[str, dict[str, dict[str, int]]]:
    """{axis: {"fwd": {op: n}, "bwd": {op: n}}} (the form collective counts are compared in)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for c in ops:
        phase = out.setdefault(c.axis, {"fwd": {}, "bwd": {}})[c.phase]
        phase[c.op] = phase.get(c.op, 0) + c.count
    return out


def bytes_by_axis(ops: list[AxisOp]) -> dict[str, dict[str, float]]:
    """{axis: {"fwd": bytes, "bwd": bytes}}: total bytes per layer and micro-batch (count x bytes)."""
    out: dict[str, dict[str, float]] = {}
    for c in ops:
        phases = out.setdefault(c.axis, {"fwd": 0.0, "bwd": 0.0})
        phases[c.phase] += c.count * c.nbytes
    return out


__all__ = ["AxisOp", "cp_collectives", "moe_collectives", "count_by_axis", "bytes_by_axis", "kv_block_bytes",
           "a2a_bytes", "dispatch_bytes", "moe_tokens", "cp_tokens", "head_dims", "local_shapes", "LocalShapes"]
