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

from ..comm_plan import local_shapes
from ..compute.base import ComputeModel
from ..compute.quantize import cast_traffic, linear_cast_bytes
from ..hardware import is_low_precision
from ..model import LayerKind, ModelSpec
from .keys import sorted_values


def _activation_bytes(dtype: str) -> float:
    from ..compute.roofline import activation_bytes
    return float(activation_bytes(dtype))


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
    ring_fwd: np.ndarray | float = 0.0
    """ring context parallelism: forward attention time of the cp - 1 steps after the first (as long as the
    steps the K/V exchanges overlap: every step is half an n x n block)."""
    ring_bwd: np.ndarray | float = 0.0
    """the same in backward."""
    ring_first_fwd: np.ndarray | float = 0.0
    """ring context parallelism: forward time of the first (local, causal) step, before any other rank's K/V
    is needed (what an all-gather of the K/V hides behind)."""
    ring_first_bwd: np.ndarray | float = 0.0
    """the same in backward."""


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


def _linear(acc_f: _Acc, acc_b: _Acc, compute: ComputeModel, m, n, k, dtype: str, cast=None):
    """Forward and the two backward GEMMs of a linear; returns (dgrad, wgrad) times. ``cast`` (fp8 GEMMs):
    bytes per element of the fp8 casts of the input (m x k) forward, of the output gradient (m x n) backward and
    (optionally) of the input again backward (the stack's ``compute.fp8_cast_bytes_per_element``;
    :func:`tpsim.compute.quantize.cast_traffic`)."""
    acc_f.add(compute.gemm(m, n, k, dtype))
    dgrad = acc_b.add(compute.gemm(m, k, n, dtype))
    wgrad = acc_b.add(compute.gemm(k, n, m, dtype))
    if cast is not None and is_low_precision(dtype):
        fwd_bytes, bwd_bytes = cast_traffic(cast, m, n, k)
        acc_f.add(streamed(compute, fwd_bytes, dtype))
        acc_b.add(streamed(compute, bwd_bytes, dtype))
    return dgrad, wgrad


def streamed(compute: ComputeModel, nbytes, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``nbytes`` of plain streaming traffic at the compute model's memory-bound rate (carried by the
    ``residual_add`` kernel: efficiency.yaml bytes_per_element, 3 elements of the activation dtype)."""
    from ..compute.roofline import activation_bytes

    return compute.memory("residual_add", np.asarray(nbytes, dtype=float) / (3.0 * activation_bytes(dtype)),
                          dtype, False)


def _linears(acc_f: _Acc, acc_b: _Acc, compute: ComputeModel, m, widths, k, dtype: str, cast=None):
    """Column-parallel linears sharing one input (fused: one GEMM of the summed width); (dgrad, wgrad). With
    several, the shared input is cast once."""
    dgrad = wgrad = 0.0
    for i, n in enumerate(widths):
        c = cast if cast is None or i == 0 else (0.0, cast[1], 0.0)
        d, w = _linear(acc_f, acc_b, compute, m, n, k, dtype, c)
        dgrad, wgrad = dgrad + d, wgrad + w
    return dgrad, wgrad


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.int64)


def _attention_core(acc_f: _Acc, acc_b: _Acc, compute: ComputeModel, model: ModelSpec, *, b: np.ndarray,
                    heads: np.ndarray, cp: np.ndarray, a2a: np.ndarray, window: int, d: float, dtype: str,
                    attention: str, kv_share: np.ndarray | float = 1.0,
                    grad_bytes: float = 2.0) -> tuple[np.ndarray, ...]:
    """Attention core of one layer on one rank (forward into ``acc_f``, backward into ``acc_b``); returns the
    forward and backward time of the ring steps after the first (what the ring's K/V exchange hides behind),
    the flash-attention kernels' time, forward + backward (the error band weighs its kernel data by it), and
    the forward and backward time of the first (local, causal) ring step (what an all-gather of the K/V hides
    behind).

    Flash attention over the rank's queries: without context parallelism ``b x heads`` heads of ``s`` causal
    tokens. Ring (TransformerEngine p2p with DualChunkSwap; torch ``_templated_ring_attention`` with its
    round-robin load balancing, the same split): the first step is causal attention of the rank's ``n = s /
    cp`` tokens on their own keys, each of the ``cp - 1`` further steps one SDPA call on half an ``n x n``
    block: all ``n`` queries on the first ``n / 2`` keys of a lower rank (``i <= rank``), or the second ``n /
    2`` queries on all ``n`` keys of a higher rank (``i > rank``), non-causal. Either shape is two non-causal
    ``n/2 x n/2`` blocks per head, timed at the ``n / 2`` block length the kernel runs (flash efficiency falls
    with short blocks). Each later step merges its partial output into the running one (log-sum-exp
    correction, :data:`RING_MERGE_BYTES`); in backward each step's query gradient and its K/V gradients are
    added to their accumulators (read the ``grad_bytes`` accumulator and the step's 16-bit gradient, write
    the accumulator; ``kv_share``: the K/V heads SDPA sees over the query heads; TE ``AttnFuncWithCPAndKVP2P``
    backward ``dkv.add_(dkv_)`` into the received 16-bit buffer, torch ``grad_key += grad_key_`` in fp32).
    All-to-all (Ulysses): causal attention of ``heads / cp`` heads over the whole sequence.
    A sliding window ``w`` shorter than the attended sequence: ``(L - w) / w`` non-causal ``w x w`` blocks plus
    one causal block of ``w`` (each query sees ``w`` keys). Unfused attention materializes the ``s x s`` scores
    whatever the window (no context parallelism: a plan rule)."""
    s = float(model.seq_len)
    n_plans = b.size
    cpf = cp.astype(float)
    ring = (cp > 1) & ~a2a
    bh = np.where(a2a, b * heads / cpf, b * heads)
    seq = np.where(a2a, s, s / cpf)
    zeros = np.zeros(n_plans)
    if attention != "flash":
        bh_u = b * heads
        scores = bh_u * s * s
        acc_f.add(compute.gemm(s, s, d, dtype, batch=bh_u))          # Q K^T
        acc_f.add(compute.memory("softmax", scores, dtype, False))  # fused scale-mask-softmax
        if model.has_attention_dropout:
            acc_f.add(compute.memory("dropout", scores, dtype, False))
            acc_b.add(compute.memory("dropout", scores, dtype, True))
        acc_f.add(compute.gemm(s, d, s, dtype, batch=bh_u))          # P V
        acc_b.add(compute.gemm(s, s, d, dtype, batch=bh_u), 1.0)     # dP = dO V^T
        acc_b.add(compute.gemm(s, d, s, dtype, batch=bh_u), 3.0)     # dV = P^T dO, dQ = dS K, dK = dS^T Q
        acc_b.add(compute.memory("softmax", scores, dtype, True))
        return zeros, zeros, zeros, zeros, zeros
    if window and window < s:
        w = float(window)
        windowed = seq > w
        blocks = np.where(windowed, (seq - w) / w, 1.0)  # (1.0 where unused: no empty kernel)
        flash = np.zeros(n_plans)
        for backward, acc in ((False, acc_f), (True, acc_b)):
            full = compute.attention(bh, seq, d, True, dtype, backward)
            band = compute.attention(bh * blocks, w, d, False, dtype, backward)
            diag = compute.attention(bh, w, d, True, dtype, backward)
            flash = flash + acc.add((np.where(windowed, band[0] + diag[0], full[0]),
                                     np.where(windowed, band[1] & diag[1], full[1])))
        return zeros, zeros, flash, zeros, zeros
    first_f = acc_f.add(compute.attention(bh, seq, d, True, dtype, False))
    first_b = acc_b.add(compute.attention(bh, seq, d, True, dtype, True))
    flash = first_f + first_b
    if not np.any(ring):
        return zeros, zeros, flash, zeros, zeros
    blocks = np.where(ring, 2.0 * (cpf - 1.0), 1.0)  # two n/2 x n/2 blocks per step (1.0 unused: no empty kernel)
    n = s / cpf
    hidden_f = acc_f.add(_where(ring, compute.attention(bh * blocks, n / 2.0, d, False, dtype, False)))
    hidden_b = acc_b.add(_where(ring, compute.attention(bh * blocks, n / 2.0, d, False, dtype, True)))
    # each ring step after the first merges its partial output into the running one (log-sum-exp correction)
    from ..compute.eager import runs_eager
    eager = runs_eager(compute)
    merged = np.where(ring, (cpf - 1.0) * bh * n * d, 0.0)
    acc_f.add(streamed(compute, merged * (RING_MERGE_BYTES_EAGER if eager else RING_MERGE_BYTES), dtype))
    acc_b.add(streamed(compute, merged * RING_MERGE_BYTES, dtype))
    # and in backward adds its dK and dV (the K/V heads SDPA sees) into their accumulators
    kv_add = 2.0 * grad_bytes + 2.0 + (RING_KV_GRAD_EAGER_COPIES * 2.0 * grad_bytes if eager else 0.0)
    acc_b.add(streamed(compute, merged * 2.0 * kv_share * kv_add, dtype))
    return (hidden_f, hidden_b, flash + hidden_f + hidden_b, np.where(ring, first_f, 0.0),
            np.where(ring, first_b, 0.0))


RING_MERGE_BYTES = 10.0
"""bytes per output element and ring step of the partial-softmax merge: read the fp32 running output (4 B) and
the step's 16-bit partial output (2 B), write the corrected fp32 output (4 B) (TransformerEngine
AttnFuncWithCPAndKVP2P flash_attn_fwd_out_correction; torch's ring _SDPAMerger does the same in more passes); in
backward the same traffic accumulates the query gradient of every step."""


RING_MERGE_BYTES_EAGER = 38.0
"""the same merge as eager PyTorch runs it (torch ``_SDPAMerger._merge_one`` with ``convert_to_f32``, unfused
outside torch.compile): ``block_out.to(float32)`` (read 2, write 4), ``out - block_out`` (8, 4),
``sigmoid(lse diff) * (...)`` (4, 4), ``out - ...`` (8, 4): 38 B per output element of the step, on the rank that
sets the pace (rank cp - 1 runs every later step on all its queries, no partial update)."""
RING_KV_GRAD_EAGER_COPIES = 2.0
"""eager backward, per K/V element and step, copies of the accumulator beyond the accumulation itself (each a
read and a write of its ``grad_bytes``): the ``_partial_update`` (``torch.cat`` of the accumulator's chunks)
and the ``torch.cat([grad_key.flatten(), grad_value.flatten()])`` that builds the next dK/dV message (torch
``_templated_ring_attention_backward``; under torch.compile Inductor writes both in place)."""


def _where(mask: np.ndarray, res: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A compute result kept where ``mask`` holds, zero seconds elsewhere."""
    t, measured = res
    return np.where(mask, t, 0.0), np.broadcast_to(measured, np.shape(mask))


def _attention_linears(fwd: _Acc, bwd: _Acc, compute: ComputeModel, model: ModelSpec, T, t, dtype: str,
                       fused: bool, cast=None):
    """Input projections of the attention block; returns (dgrad, wgrad) of its column-parallel input linear(s).
    Standard: fused QKV ``(T, h, q/t + 2 kv_local)`` (or q, k, v apart). MLA (DeepSeek-V2 eq. 9-14, Megatron-Core
    ``MLASelfAttention``): the down-projections of queries (q_lora) and of the key/value latent plus the shared
    rotary key (kv_lora + rope) are duplicated on every TP rank; the up-projections are column-parallel."""
    h = float(model.hidden_size)
    if model.attention_kind != "mla":
        shp = local_shapes(model, t)  # kv heads < tp are replicated (Megatron)
        q_local, kv_local = shp.q_width, shp.kv_width
        qkv = [q_local + 2 * kv_local] if fused else [q_local, kv_local, kv_local]
        return _linears(fwd, bwd, compute, T, qkv, h, dtype, cast)
    heads = model.num_attention_heads / t
    qk, rope, v = model.qk_nope_head_dim + model.qk_rope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    ql, kvl = float(model.q_lora_rank), float(model.kv_lora_rank)
    down = [ql + kvl + rope] if ql else [kvl + rope]
    dgrad, wgrad = _linears(fwd, bwd, compute, T, down, h, dtype, cast)
    if ql:
        _linear(fwd, bwd, compute, T, heads * qk, ql, dtype, cast)
    else:
        d2, w2 = _linear(fwd, bwd, compute, T, heads * qk, h, dtype, cast)
        dgrad, wgrad = dgrad + d2, wgrad + w2
    _linear(fwd, bwd, compute, T, heads * (model.qk_nope_head_dim + v), kvl, dtype, cast)
    fwd.add(compute.memory("rmsnorm", T * (ql + kvl), dtype, False))  # q_a / kv_a latent norms
    bwd.add(compute.memory("rmsnorm", T * (ql + kvl), dtype, True))
    return dgrad, wgrad


def kv_heads_seen(model: ModelSpec, t: np.ndarray, kv_repeat: bool) -> np.ndarray:
    """K/V heads per rank as the attention kernel receives them (and as context parallelism exchanges them):
    the query heads where grouped-query K/V are repeated before it (``kv_repeat``, torchtitan's repeat_kv),
    else the local kv heads (at least one: kv heads < tp are replicated, Megatron). MLA: its query heads."""
    heads = model.num_attention_heads / np.asarray(t, dtype=float)
    if model.attention_kind == "mla" or kv_repeat:
        return heads
    return np.asarray(local_shapes(model, t).kv_heads, dtype=float) * np.ones_like(heads)


def _kv_repeat_elements(model: ModelSpec, T: np.ndarray, t: np.ndarray) -> np.ndarray | None:
    """Element count that times grouped-query attention's K/V repeat on the ``residual_add`` kernel (3 elements
    moved per element): torchtitan's repeat_kv (torchtitan/models/llama3/model.py: ``x[:, :, :, None, :]
    .expand(...).reshape(...)`` materializes K and V with the query heads' count before SDPA) reads the
    rank's kv heads and writes n_rep times as many, for K and for V; its backward sums the n_rep copies back
    (reads the repeated gradient, writes the kv heads'): the same traffic. None when there is nothing to repeat
    (as many kv heads as query heads, MLA)."""
    if model.attention_kind == "mla" or model.num_kv_heads >= model.num_attention_heads:
        return None
    d = float(model.head_dim)
    q = model.num_attention_heads / t * d
    kv = np.maximum(model.num_kv_heads / t, 1.0) * d
    return 2.0 * T * (q + kv) / 3.0


def rotary_seconds(compute: ComputeModel, numel: np.ndarray, dtype: str,
                   backward: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rotary embedding of ``numel`` q and k elements on the ``residual_add`` kernel (fused: read x and the
    cos/sin table, write y), times the eager chain's traffic where the compute model runs eager kernels
    (tpsim/compute/eager.py ``rotary_ratio``, efficiency.yaml ``eager_bytes_per_element.rotary``)."""
    from ..compute.eager import rotary_ratio

    ratio = rotary_ratio(compute, backward)
    return compute.memory("residual_add", numel * ratio if ratio != 1.0 else numel, dtype, backward)


def layer_cost(model: ModelSpec, compute: ComputeModel, *, tp: np.ndarray, sp: np.ndarray,
               micro_batch: np.ndarray, recompute: np.ndarray, dtype: str, attention: str,
               fused: bool = True, cp: np.ndarray | None = None, cp_kind: np.ndarray | None = None,
               ep: np.ndarray | None = None, etp: np.ndarray | None = None, kind: LayerKind | None = None,
               recompute_modules: frozenset = frozenset({"core_attn"}), per_op: bool = False,
               fp8_cast: tuple[float, ...] | None = None, kv_repeat: bool = False,
               cp_grad_bytes: float | None = None) -> LayerCost:
    """Cost of one layer for each plan (arrays of equal length; recompute coded 0/1/2, cp_kind 0 ring / 1
    a2a, etp 0 = tp). ``fused``: one QKV GEMM and one gate+up GEMM (Megatron); otherwise q, k, v (and w1, w3)
    are separate GEMMs (as ``tpsim validate`` runs DTensor's separate Linear layers). ``kind``: the layer's
    MLP (dense or mixture of experts) and sliding window (default: dense, full attention). Context parallelism
    divides the rank's tokens by cp (all GEMMs and memory-bound kernels on ``b s / cp`` tokens).
    ``recompute_modules``: what selective recomputation runs again in backward (Megatron-Core
    ``--recompute-modules``: the attention core, the norms, MLA's up-projections, the routed experts'
    activation, :func:`_selective_seconds`; ``mlp``, a dense layer's whole MLP forward: its GEMMs, casts and
    activation, not its sequence-parallel all-gather, which the recomputed forward repeats uncosted; ``moe``, a
    MoE layer's whole forward: shared and routed experts, its all-to-alls in the source's collectives);
    ``per_op``: selective is torchtitan's per-op policy instead (:func:`_per_op_seconds`, dense layers with
    standard attention). ``fp8_cast``: with fp8 GEMMs, the stack's (forward, backward) bytes per element of each linear's input and output-gradient casts
    (``compute.fp8_cast_bytes_per_element``); mxfp8 and nvfp4 GEMMs pay their formats' casts instead
    (:func:`tpsim.compute.quantize.linear_cast_bytes`). ``kv_repeat``: grouped-query K and V are copied to the
    query heads before the attention kernel and summed back in backward (:func:`_kv_repeat_elements`).
    ``cp_grad_bytes``: bytes per element of the ring's dK/dV accumulators (``comm.cp_grad_exchange_dtype``;
    None: the activation dtype's)."""
    n_plans = len(tp)
    kind = kind or LayerKind(moe=False, window=0)
    cp = _ones(n_plans) if cp is None else cp
    a2a = np.zeros(n_plans, dtype=bool) if cp_kind is None else (cp_kind == 1) & (cp > 1)
    t = tp.astype(float)
    b = micro_batch.astype(float)
    s = float(model.seq_len)
    T = b * s / cp.astype(float)
    h = float(model.hidden_size)
    heads = model.num_attention_heads / t
    dqk = model.head_dim if model.attention_kind != "mla" else model.qk_nope_head_dim + model.qk_rope_head_dim
    dv = model.head_dim if model.attention_kind != "mla" else model.v_head_dim
    T_norm = np.where(sp, T / t, T)
    fwd, bwd = _Acc(n_plans), _Acc(n_plans)
    fp8_cast = linear_cast_bytes(dtype, fp8_cast)   # fp8: the stack's recipe; mxfp8/nvfp4: their block scales

    # attention block
    dg_a, wg_a = _attention_linears(fwd, bwd, compute, model, T, t, dtype, fused, fp8_cast)
    attn_f = _Acc(n_plans)
    ring_f, ring_b, flash_t, first_f, first_b = _attention_core(
        attn_f, bwd, compute, model, b=b, heads=heads, cp=cp, a2a=a2a, window=kind.window, d=(dqk + dv) / 2.0,
        dtype=dtype, attention=attention, kv_share=kv_heads_seen(model, t, kv_repeat) / heads,
        grad_bytes=_activation_bytes(dtype) if cp_grad_bytes is None else cp_grad_bytes)
    fwd.absorb(attn_f)  # the attention core, kept apart too for selective recomputation
    if model.position == "rotary":
        shp = local_shapes(model, t)
        rotated = (shp.q_width + shp.kv_width if model.attention_kind != "mla"
                   else heads * model.qk_rope_head_dim + model.qk_rope_head_dim)
        fwd.add(rotary_seconds(compute, T * rotated, dtype, False))
        bwd.add(rotary_seconds(compute, T * rotated, dtype, True))
    repeat = _kv_repeat_elements(model, T, t) if kv_repeat else None
    if repeat is not None:
        fwd.add(compute.memory("residual_add", repeat, dtype, False))
        bwd.add(compute.memory("residual_add", repeat, dtype, True))
    _linear(fwd, bwd, compute, T, h, heads * dv, dtype, fp8_cast)

    # MLP block: dense, or shared experts (tensor-parallel like it) beside the routed experts
    gated = model.gated
    act = "swiglu" if gated else "gelu"
    f_local = (model.ffn_hidden_size if not kind.moe
               else model.num_shared_experts * model.shared_expert_ffn_hidden_size) / t
    dg_m = wg_m = np.zeros(n_plans)
    before_mlp = fwd.t.copy()
    if not kind.moe or model.num_shared_experts:
        mlp_in = [f_local * (2 if gated else 1)] if (fused or not gated) else [f_local, f_local]
        dg_m, wg_m = _linears(fwd, bwd, compute, T, mlp_in, h, dtype, fp8_cast)
        fwd.add(compute.memory(act, T * f_local, dtype, False))
        bwd.add(compute.memory(act, T * f_local, dtype, True))
        _linear(fwd, bwd, compute, T, h, f_local, dtype, fp8_cast)
    dense_mlp_f = (fwd.t - before_mlp) if not kind.moe else np.zeros(n_plans)  # the ``mlp`` module's forward
    shape = None
    if kind.moe:
        from .moe import add_expert_compute, expert_shape
        etp_eff = np.where(etp == 0, tp, etp) if etp is not None else tp
        shape = expert_shape(model, tokens_total=T, tp=tp, sp=sp, ep=_ones(n_plans) if ep is None else ep,
                             etp=etp_eff)
        add_expert_compute(fwd, bwd, compute, model, shape, dtype, fp8_cast)
    moe_f = (fwd.t - before_mlp) if kind.moe else np.zeros(n_plans)  # the ``moe`` module's forward (experts)

    # norms, residuals, hidden dropout (on T/t tokens with sequence parallelism)
    norm = model.norm
    for kernel, count in ((norm, 2), ("residual_add", 2)) + ((("dropout", 2),) if model.has_hidden_dropout else ()):
        fwd.add(compute.memory(kernel, T_norm * h, dtype, False), count)
        bwd.add(compute.memory(kernel, T_norm * h, dtype, True), count)

    rc = np.asarray(recompute)
    if per_op and not kind.moe and model.attention_kind != "mla":
        selective = _per_op_seconds(compute, model, T=T, T_norm=T_norm, t=t, f_local=f_local, dtype=dtype)
        if repeat is not None:  # the repeated K/V are not in the save list: rebuilt from the recomputed k and v
            selective = selective + compute.memory("residual_add", repeat, dtype, False)[0]
    else:
        selective = _selective_seconds(compute, model, recompute_modules, attn_f.t, T=T, T_norm=T_norm,
                                       heads=heads, shape=shape, dtype=dtype)
        if "mlp" in recompute_modules:
            selective = selective + dense_mlp_f
        if "moe" in recompute_modules:  # the MoE layer checkpointed whole: router, experts, shared experts
            selective = selective + moe_f
    re_t = np.where(rc == 2, fwd.t, np.where(rc == 1, selective, 0.0))
    total = fwd.t + bwd.t
    measured = np.where(total > 0, (fwd.m + bwd.m) / np.where(total > 0, total, 1.0), 0.0)
    return LayerCost(fwd=fwd.t, bwd=bwd.t, recompute=re_t,
                     dgrad={"attention": dg_a, "feed_forward": dg_m},
                     wgrad={"attention": wg_a, "feed_forward": wg_m}, measured=measured, attention=flash_t,
                     ring_fwd=ring_f, ring_bwd=ring_b, ring_first_fwd=first_f, ring_first_bwd=first_b)


def _per_op_seconds(compute: ComputeModel, model: ModelSpec, *, T: np.ndarray, T_norm: np.ndarray, t: np.ndarray,
                    f_local, dtype: str) -> np.ndarray:
    """Forward work torchtitan's per-op selective checkpointing repeats in backward: the matmuls it does not save
    (every second one of the layer, :func:`tpsim.estimator.memory.per_op_saved`) and every memory-bound op
    (the two norms, the residual adds, the activation, rotary); the SDPA output is saved, not recomputed."""
    from .memory import _per_op_width, per_op_matmuls, per_op_saved

    h = float(model.hidden_size)
    inputs = {"wq": h, "wk": h, "wv": h, "wo": model.num_attention_heads / t * float(model.head_dim),
              "w1": h, "w3": h, "fc1": h, "w2": f_local, "fc2": f_local}
    saved = set(per_op_saved(model))
    out = np.zeros(np.shape(T))
    for name in per_op_matmuls(model):
        if name not in saved:
            out = out + compute.gemm(T, _per_op_width(model, name, t), inputs[name], dtype)[0]
    out = out + 2.0 * compute.memory(model.norm, T_norm * h, dtype, False)[0]
    out = out + 2.0 * compute.memory("residual_add", T_norm * h, dtype, False)[0]
    out = out + compute.memory("swiglu" if model.gated else "gelu", T * f_local, dtype, False)[0]
    if model.position == "rotary":
        kv = np.maximum(model.num_kv_heads / t, 1.0) * model.head_dim
        out = out + rotary_seconds(compute, T * (model.num_attention_heads / t * model.head_dim + kv),
                                   dtype, False)[0]
    return out


def _selective_seconds(compute: ComputeModel, model: ModelSpec, modules: frozenset, core_attention: np.ndarray, *,
                       T: np.ndarray, T_norm: np.ndarray, heads: np.ndarray, shape, dtype: str) -> np.ndarray:
    """Forward work selective recomputation repeats in backward: the attention core (``core_attn``), the two
    norms and MLA's latent norms (``layernorm``), MLA's q and kv up-projection GEMMs (``mla_up_proj``), the
    routed experts' activation function (``moe_act``, on the busiest rank's copies)."""
    out = core_attention if "core_attn" in modules else np.zeros(np.shape(T))
    h = float(model.hidden_size)
    mla = model.attention_kind == "mla"
    if "layernorm" in modules:
        out = out + 2.0 * compute.memory(model.norm, T_norm * h, dtype, False)[0]
        if mla:
            out = out + compute.memory("rmsnorm", T * (model.q_lora_rank + model.kv_lora_rank), dtype, False)[0]
    if "mla_up_proj" in modules and mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            out = out + compute.gemm(T, heads * qk, float(model.q_lora_rank), dtype)[0]
        out = out + compute.gemm(T, heads * (model.qk_nope_head_dim + model.v_head_dim),
                                 float(model.kv_lora_rank), dtype)[0]
    if "moe_act" in modules and "moe" not in modules and shape is not None:  # (``moe`` reruns the whole layer)
        act = "swiglu" if model.gated else "gelu"
        out = out + compute.memory(act, shape.copies * shape.ffn_local, dtype, False)[0]
    return out


@dataclass(frozen=True)
class EdgeCost:
    """Embedding (first stage) and logits + loss (last stage) per micro-batch, arrays over plans."""

    first_fwd: np.ndarray
    first_bwd: np.ndarray
    last_fwd: np.ndarray
    last_bwd: np.ndarray


def edge_cost(model: ModelSpec, compute: ComputeModel, *, tp: np.ndarray, sp: np.ndarray,
              micro_batch: np.ndarray, dtype: str, cp: np.ndarray | None = None) -> EdgeCost:
    """Embedding lookup (memory-bound) and output layer: final norm, logits GEMM, vocab-parallel softmax, on
    the rank's b s / cp tokens."""
    n_plans = len(tp)
    t = tp.astype(float)
    T = micro_batch.astype(float) * model.seq_len
    if cp is not None:
        T = T / cp.astype(float)
    h = float(model.hidden_size)
    tp_vals = sorted_values(tp)
    vocab_local = np.array([model.padded_vocab(int(x)) for x in tp_vals])
    v_local = vocab_local[np.searchsorted(tp_vals, tp)] / t
    T_norm = np.where(sp, T / t, T)
    ff, fb, lf, lb = (_Acc(n_plans) for _ in range(4))
    ff.add(compute.memory("residual_add", T * h, dtype, False))   # gather rows (+ positions)
    fb.add(compute.memory("residual_add", T * h, dtype, True))    # scatter-add into the table
    lf.add(compute.memory(model.norm, T_norm * h, dtype, False))
    lb.add(compute.memory(model.norm, T_norm * h, dtype, True))
    # the output layer stays 16-bit in fp8 training (Megatron's output_layer is not a Transformer Engine
    # layer; torchtitan's float8 converter skips `output`; DeepSeek-V3 report section 3.3.1 keeps the head)
    _linear(lf, lb, compute, T, v_local, h, HEAD_DTYPE.get(dtype, dtype))
    fwd_el, bwd_el = cross_entropy_elements(T * v_local)
    lf.add(compute.memory("softmax", fwd_el, "fp32", False))
    lb.add(compute.memory("softmax", bwd_el, "fp32", True))
    return EdgeCost(first_fwd=ff.t, first_bwd=fb.t, last_fwd=lf.t, last_bwd=lb.t)


HEAD_DTYPE = {"fp8": "bf16"}
"""GEMM dtype of the output layer (logits) for a plan dtype: fp8 training keeps the head in bf16
(megatron/core/models/gpt/gpt_model.py output_layer = tensor_parallel.ColumnParallelLinear, outside Transformer
Engine's fp8 autocast modules; torchtitan components/quantization float8 filter_fqns ["output"]; DeepSeek-V3
technical report 3.3.1: "the embedding module, the output head, ... retain their original precision")."""


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
