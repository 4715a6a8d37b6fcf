"""Memory per GPU: weights, gradients, optimizer states, activations, buffers (vectorized over plans).

Per parameter (mixed precision, Megatron): 2 B 16-bit weights, 4 B fp32 gradient accumulation, 4 B fp32
master weights, 8 B Adam moments = 18 B. ZeRO-1 shards the 12 B of optimizer state over dp, ZeRO-2 also the
gradients, ZeRO-3 also the weights. fp32/tf32 training keeps 4 B weights and no separate master copy.

Activations per layer and micro-batch: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4), bytes with 16-bit activations:
TP only ``s b h (10 + 24/t + 5 a s/(h t))``; TP+SP ``s b h (34/t + 5 a s / (h t))``; selective recomputation
drops the ``5 a s / (h t)`` score terms; full recomputation stores the ``2 s b h`` layer input (/t with SP).
Generalized here term by term to grouped-query attention, SwiGLU and any ffn size, and to models without
dropout (Llama: the two 1-byte dropout masks vanish): see :func:`activation_bytes_per_layer`.
The first pipeline stage holds ``min(pp, micro-batches)`` micro-batches in flight under 1F1B, times
``1 + (pp - 1) / (pp x vpp)`` with interleaving (Korthikanti et al. 2022, section 4.2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import pipeline
from ..comm_plan import local_shapes
from ..model import LayerKind, ModelSpec
from .keys import argmax_rows, broadcast_float, flat_index, pick_rows
from .partition import on_positions


def attention_params_local(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Attention weights and biases of one layer on one TP rank. Standard: column/row-split q, k, v, o (kv heads
    below tp replicated). MLA: the q and kv down-projections and their latent norms are duplicated on every TP
    rank (Megatron-Core MLASelfAttention), the up-projections and o are split."""
    t = tp.astype(float)
    h = float(model.hidden_size)
    if model.attention_kind == "mla":
        heads = model.num_attention_heads / t
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        ql, kvl, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        q = (h * ql + ql * heads * qk + ql) if ql else h * heads * qk
        kv = h * (kvl + rope) + kvl * heads * (model.qk_nope_head_dim + model.v_head_dim) + kvl
        return q + kv + heads * model.v_head_dim * h + (h if model.linear_bias else 0.0)
    shp = local_shapes(model, t)
    q_local, kv_local = shp.q_width, shp.kv_width
    weights = h * (q_local + 2 * kv_local) + q_local * h
    biases = (q_local + 2 * kv_local if model.qkv_bias else 0.0)
    if model.linear_bias:
        biases = biases + h
    return weights + biases


def layer_params_local(model: ModelSpec, tp: np.ndarray, kind: LayerKind | None = None,
                       ep: np.ndarray | None = None, etp: np.ndarray | None = None) -> np.ndarray:
    """Parameters of one layer held by one rank: column/row-split weights / t, norms and row biases whole; a
    mixture-of-experts layer (``kind.moe``) holds its E / ep routed experts split over etp
    (:func:`layer_expert_params_local`), the shared experts split over tp and the router."""
    if kind is not None and kind.moe:
        from .moe import shared_params_local
        norms = 2 * float(model.hidden_size) * (2 if model.norm == "layernorm" else 1)
        return (attention_params_local(model, tp) + shared_params_local(model, tp) + norms
                + layer_expert_params_local(model, tp, kind, ep, etp))
    if model.attention_kind == "mla":
        f = float(model.ffn_hidden_size) / tp.astype(float)
        n_in = 2.0 if model.gated else 1.0
        h = float(model.hidden_size)
        mlp = n_in * h * f + f * h + ((n_in * f + h) if model.linear_bias else 0.0)
        return attention_params_local(model, tp) + mlp + 2 * h * (2 if model.norm == "layernorm" else 1)
    t = tp.astype(float)
    h, f = float(model.hidden_size), float(model.ffn_hidden_size)
    shp = local_shapes(model, t)
    q_local, kv_local = shp.q_width, shp.kv_width
    n_in = 2.0 if model.gated else 1.0
    weights = h * (q_local + 2 * kv_local) + q_local * h + n_in * h * f / t + f / t * h
    biases = (q_local + 2 * kv_local if model.qkv_bias else 0.0)
    if model.linear_bias:
        biases = biases + n_in * f / t + 2 * h
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    return weights + biases + norms


def layer_expert_params_local(model: ModelSpec, tp: np.ndarray, kind: LayerKind | None = None,
                              ep: np.ndarray | None = None, etp: np.ndarray | None = None) -> np.ndarray:
    """Of :func:`layer_params_local`, the routed experts' parameters (their gradients are reduced over the
    expert data-parallel group); 0 for a dense layer."""
    if kind is None or not kind.moe:
        return np.zeros(tp.shape)
    from .moe import expert_params_local
    ones = np.ones(tp.shape, dtype=np.int64)
    ep = ones if ep is None else ep
    etp_eff = tp if etp is None else np.where(etp == 0, tp, etp)
    return expert_params_local(model, ep, etp_eff)


DEFAULT_RECOMPUTE_MODULES = frozenset({"core_attn"})
"""Megatron-Core's default ``--recompute-modules``: selective recomputation of the attention core only."""


def activation_bytes_per_layer(model: ModelSpec, *, tp: np.ndarray, sp: np.ndarray, micro_batch: np.ndarray,
                               recompute: np.ndarray, attention: str, act_bytes: int,
                               cp: np.ndarray | None = None, kind: LayerKind | None = None,
                               ep: np.ndarray | None = None, etp: np.ndarray | None = None,
                               modules: frozenset = DEFAULT_RECOMPUTE_MODULES, linear_bytes: float | None = None,
                               attn_out_bytes: float | None = None, per_op: bool = False,
                               attn_out_shared: bool = False) -> np.ndarray:
    """Stored activations of one layer for one micro-batch on one rank (bytes): the rank's b s / cp tokens
    (context parallelism divides every term by cp). MLA stores its q/kv latents (duplicated over TP) and the
    up-projected q, k (qk_nope + qk_rope) and v (v_head_dim) per head; a mixture-of-experts layer stores the
    routed copies' expert activations on the busiest rank (:func:`tpsim.estimator.moe.expert_activation_bytes`)
    and the shared experts' like a dense MLP.

    ``modules``: what selective recomputation (recompute = 1) recomputes instead of storing (Megatron-Core
    ``--recompute-modules``): ``core_attn`` the unfused scores; ``layernorm`` the norms' outputs (the inputs of
    the QKV / MLA down-projection and of the MLP, rebuilt from the stored norm inputs); ``mla_up_proj`` MLA's
    up-projected q, k, v (rebuilt from the stored latents); ``moe_act`` the routed experts' activation output
    (the second GEMM's input); ``mlp`` a dense layer's MLP (checkpointed whole: its input kept, the first GEMM's
    output and the activation output rebuilt); ``moe`` a MoE layer (checkpointed whole: its experts' and shared
    experts' activations rebuilt). ``linear_bytes`` / ``attn_out_bytes``: bytes per element of the cached linear
    inputs / of the attention output (fp8 activation caching, DeepSeek-V3 report section 3.3.3); default the
    activation's own bytes. ``per_op``: selective recomputation is torchtitan's per-op policy
    (:func:`per_op_sac_bytes`; dense layers with standard attention). ``attn_out_shared``: flash attention's
    backward reads the projection's cached input (a single copy of the attention output, DeepSeek-V3's E5M6)."""
    t = tp.astype(float)
    s = float(model.seq_len)
    cpf = 1.0 if cp is None else cp.astype(float)
    T = micro_batch.astype(float) * s / cpf
    h = float(model.hidden_size)
    heads = model.num_attention_heads / t
    e = act_bytes / 2.0  # formulas below are for 16-bit activations
    lb = 2.0 * e if linear_bytes is None else float(linear_bytes)
    ob = lb if attn_out_bytes is None else float(attn_out_bytes)
    rc = np.asarray(recompute)
    selective = rc == 1
    dropout = model.has_hidden_dropout
    # the attention output: the projection's cached input (``ob`` bytes) and, with flash attention, the 16-bit
    # output the kernel keeps for its own backward (FlashAttention / cuDNN fused attention save out with q, k,
    # v: its backward needs rowsum(dO * O); Transformer Engine FusedAttnFunc / FlashAttention ctx). Stored once
    # when the projection caches that same 16-bit tensor (ob = 2e), twice with an fp8 / E5M6 cast (ob < 2e);
    # selective recomputation of the attention core (core_attn) rebuilds O, so only the cast stays.
    o_kept = (attention == "flash") & ~(selective & ("core_attn" in modules)) & (ob < 2.0 * e) & (not attn_out_shared)
    out_b = ob + np.where(o_kept, 2.0 * e, 0.0)
    # norm inputs (2 x 2 B), norm outputs = QKV and MLP inputs (2 x lb), dropout masks (2 x 1 B)
    norm_out = np.where(selective & ("layernorm" in modules), 0.0, 2.0 * lb)
    replicated = T * h * (4.0 * e + norm_out + (2.0 * e if dropout else 0.0))
    replicated = np.where(sp, replicated / t, replicated)
    if model.attention_kind == "mla":
        qk = heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        v = heads * model.v_head_dim
        latents = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
        up = 2 * e * T * (qk + qk) + 2 * e * T * v                        # q, k, v after the up-projections
        up = np.where(selective & ("mla_up_proj" in modules), 0.0, up)
        sharded = up + out_b * T * v + lb * T * latents                    # attention output, latents
    else:
        shp = local_shapes(model, t)
        q_local, kv_local = shp.q_width, shp.kv_width
        sharded = 2 * e * T * (q_local + kv_local) + 2 * e * T * kv_local + out_b * T * q_local
    moe = kind is not None and kind.moe
    f_local = (model.ffn_hidden_size if not moe
               else model.num_shared_experts * model.shared_expert_ffn_hidden_size) / t
    # the first GEMM's output (2f gated, f) in 16 bits, the activation output (the second GEMM's input); a dense
    # MLP checkpointed whole (``mlp``) keeps only its input, the norm output counted above
    mlp_b = ((4.0 if model.gated else 2.0) * e + lb) * T * f_local
    if not moe and "mlp" in modules:
        mlp_b = np.where(selective, 0.0, mlp_b)
    sharded = sharded + mlp_b
    if moe:
        moe_act = selective & ("moe_act" in modules)
        experts = _expert_activations(model, T, tp, sp, ep, etp, e, lb, moe_act)
        if "moe" in modules:  # the MoE layer checkpointed whole keeps only its input (the norm output above)
            experts = np.where(selective, 0.0, experts)
            sharded = sharded - np.where(selective, mlp_b, 0.0)  # its shared experts too
        sharded = sharded + experts
    if attention == "unfused":
        scores = micro_batch * heads * s * s * ((5.0 if model.has_attention_dropout else 2.0) * e)
    else:
        scores = micro_batch * heads * s * 4.0 / cpf  # fp32 log-sum-exp kept by flash attention
    drop_scores = selective & (attention == "unfused") & ("core_attn" in modules)
    per_layer = replicated + sharded + np.where(drop_scores, 0.0, scores)
    layer_input = np.where(sp, 2 * e * T * h / t, 2 * e * T * h)
    if per_op and not moe and model.attention_kind != "mla":
        sac = layer_input + per_op_sac_bytes(model, T=T, tp=tp, e=e) + scores
        per_layer = np.where(selective, sac, per_layer)
    return np.where(rc == 2, layer_input, per_layer)


def per_op_matmuls(model: ModelSpec) -> tuple[str, ...]:
    """A dense layer's matmuls in forward order as torchtitan runs them (separate wq, wk, wv; w1, w3, w2 gated or
    fc1, fc2): the order torchtitan's per-op checkpoint policy counts."""
    return ("wq", "wk", "wv", "wo") + (("w1", "w3", "w2") if model.gated else ("fc1", "fc2"))


def per_op_saved(model: ModelSpec) -> tuple[str, ...]:
    """The matmuls whose outputs torchtitan's per-op selective checkpointing saves: all but every second one of
    the layer (torchtitan/distributed/activation_checkpoint.py ``_custom_policy``: ``mm_count % 2 == 0`` is
    recomputed)."""
    return tuple(name for i, name in enumerate(per_op_matmuls(model), start=1) if i % 2 == 1)


def _per_op_width(model: ModelSpec, name: str, tp: np.ndarray) -> np.ndarray:
    """Output width of a per-op matmul on one TP rank (row-parallel outputs are the full hidden size: the
    partial sums before their reduce-scatter)."""
    t = tp.astype(float)
    d = float(model.head_dim)
    q = model.num_attention_heads / t * d
    kv = np.maximum(model.num_kv_heads / t, 1.0) * d
    f = float(model.ffn_hidden_size) / t
    h = np.full(np.shape(t), float(model.hidden_size))
    return {"wq": q, "wk": kv, "wv": kv, "wo": h, "w1": f, "w3": f, "w2": h, "fc1": f, "fc2": h}[name]


def per_op_sac_bytes(model: ModelSpec, *, T: np.ndarray, tp: np.ndarray, e: float) -> np.ndarray:
    """What torchtitan's per-op selective checkpointing stores per layer beyond the layer input and the flash
    log-sum-exp (16-bit tensors): the saved matmul outputs (:func:`per_op_saved`), the SDPA output, and with
    tp > 1 the two reduce-scatter outputs (sequence-sharded); torchtitan/distributed/activation_checkpoint.py
    ``_op_sac_save_list`` (mm, the SDPA variants, reduce_scatter_tensor, max)."""
    t = tp.astype(float)
    h = float(model.hidden_size)
    q = model.num_attention_heads / t * float(model.head_dim)
    out = 2 * e * T * q  # SDPA output
    for name in per_op_saved(model):
        out = out + 2 * e * T * _per_op_width(model, name, tp)
    return out + np.where(t > 1, 2 * 2 * e * T * h / t, 0.0)


def _expert_activations(model: ModelSpec, T: np.ndarray, tp: np.ndarray, sp: np.ndarray, ep, etp,
                        e: float, linear_bytes: float, moe_act: np.ndarray) -> np.ndarray:
    from .moe import expert_activation_bytes, expert_shape
    ones = np.ones(tp.shape, dtype=np.int64)
    shape = expert_shape(model, tokens_total=T, tp=tp, sp=sp, ep=ones if ep is None else ep,
                         etp=tp if etp is None else np.where(etp == 0, tp, etp))
    return expert_activation_bytes(model, shape, e, linear_bytes=linear_bytes, act_recomputed=moe_act)


def full_layer_activations(model: ModelSpec, **kw) -> np.ndarray:
    """One layer's activations without recomputation: the working set recomputed during backward."""
    kw = dict(kw)
    kw["recompute"] = np.zeros_like(kw["recompute"])
    return activation_bytes_per_layer(model, **kw)


# ---- stage 5: memory per GPU ------------------------------------------------------------------------------
MEMORY_TERMS = ("weights", "grads", "optimizer_states", "activations", "cuda_context", "nccl_buffers",
                "allocator_reserve", "other")
"""named terms of ``memory_gib`` (their sum is the peak; docs/SCHEMAS.md, section 6)."""


@dataclass(frozen=True, kw_only=True)
class ProcessMemory:
    """Memory a training process holds beyond its tensors (tpsim/data/memory.yaml), bytes."""

    cuda_context: float
    cuda_context_range: tuple[float, float]
    nccl_per_communicator: float
    nccl_range: tuple[float, float]
    planner_headroom_fraction: float = 0.0
    """share of the device memory the planner's plans leave free beyond the named terms (a policy)."""


@lru_cache(maxsize=1)
def process_memory() -> ProcessMemory:
    from ..hardware import DATA_DIR
    from ..safeyaml import load_data
    from ..units import GiB

    raw = load_data(DATA_DIR / "memory.yaml")
    ctx, nccl = raw["cuda_context_gib"], raw["nccl_buffers_gib_per_communicator"]
    return ProcessMemory(cuda_context=float(ctx["value"]) * GiB,
                         cuda_context_range=tuple(float(x) * GiB for x in ctx["range"]),
                         nccl_per_communicator=float(nccl["value"]) * GiB,
                         nccl_range=tuple(float(x) * GiB for x in nccl["range"]),
                         planner_headroom_fraction=float(raw["planner_headroom_fraction"]["value"]))


def communicators(tp: np.ndarray, dp: np.ndarray, pp: np.ndarray, cp: np.ndarray | None = None,
                  ep: np.ndarray | None = None) -> np.ndarray:
    """NCCL communicators a rank uses: one per parallel axis of size > 1 (tp, dp, cp, ep), and the embedding
    group (first and last pipeline stage) when pp > 1."""
    extra = 0.0 if cp is None else (cp > 1).astype(float)
    if ep is not None:
        extra = extra + (ep > 1)
    return ((tp > 1).astype(float) + (dp > 1) + 2.0 * (pp > 1)) + extra


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU on the rank with the highest peak, arrays over plans."""

    terms: dict
    """term (MEMORY_TERMS) -> bytes."""
    peak: np.ndarray
    peak_position: np.ndarray
    """row of the rank with the highest peak: its POSITIONS index, or its pipeline rank where the memory stage
    compares every rank (:meth:`~tpsim.estimator.partition.Partition.ranks`)."""


def memory(costs, part, *, pp: np.ndarray, vpp: np.ndarray, dp: np.ndarray, zero: np.ndarray, m: np.ndarray,
           w_bytes: float, master_bytes: float, grad_bytes: float, grad_unsharded: np.ndarray | None = None,
           state_bytes: float = 8.0, weight_cache_bytes: float = 0.0, process: np.ndarray | float = 0.0,
           nccl: np.ndarray | float = 0.0, reserve_fraction: float = 0.0, cp: np.ndarray | None = None,
           edp: np.ndarray | None = None, schedule: np.ndarray | None = None,
           states_offloaded: bool = False) -> Memory:
    """Model states (ZeRO-sharded), stored activations of the micro-batches in flight, and buffers, for the
    first, last and busiest middle pipeline rank at once ((position, plan) arrays), or for every pipeline rank
    where those three do not bound the peak (layers of different costs, or of several kinds whose rank 1 does not
    hold the most of each: :func:`~tpsim.estimator.partition.middle_dominated`); the peak rank's terms.
    ``costs`` (:class:`~tpsim.estimator.source.LayerCosts`) and ``part`` (a Partition) are gathered to plans.
    ``grad_unsharded``: the fraction of the rank's gradients held unsharded (default: all but ZeRO-2/3's);
    ``state_bytes``: optimizer moments per parameter (Adam: 2 x 4 B fp32); ``weight_cache_bytes``: per
    parameter copies the stack keeps beside the weights (FP8 casts); ``process`` and ``nccl``: the CUDA context
    and the NCCL buffers (bytes, per plan); ``reserve_fraction``: the caching allocator's reserve on top of the
    allocated peak. ZeRO shards the dense parameters' states over dp x cp (Megatron's distributed optimizer
    uses the dp x cp group) and the routed experts' over the expert data-parallel group (``edp``).
    ``schedule`` (codes, default 1f1b): the micro-batches in flight are the schedule's
    (:func:`tpsim.pipeline.in_flight`); under a bidirectional schedule (DualPipe, DeepSeek-V3 report Table 2)
    rank r also holds stage pp - 1 - r (the partition's parameters already count both stages; the activations
    in flight are those of both, half each). ``states_offloaded``: the optimizer moments and master copy are in
    host memory during the forward and backward passes and on the device for the step only, when the
    activations are freed (StackTerms.optimizer_state_offload): the rank holds the larger of the two, and the
    ``optimizer_states`` term is what the states add above the activations."""
    schedule = pipeline.codes_of(schedule, pp.size)
    mirrored = pipeline.mirrored(schedule)
    any_mirror = bool(mirrored.any())

    ranks = part.ranks(for_memory=True)  # the three positions, or every rank where they do not bound the peak
    held, held_expert = part.rank_params(ranks)
    stored = ranks.layer_sum(costs.activations, getattr(costs, "activations_by_kind", None))
    if any_mirror:  # stages r and pp - 1 - r share rank r: half the micro-batches in flight of each
        stored = np.where((pp > 1) & mirrored, (stored + ranks.partner(stored)) / 2.0, stored)
    flight = pipeline.in_flight(schedule, ranks.rank_of(pp), pp, vpp, m)
    activations = stored * flight + costs.working
    gathered = costs.params if getattr(costs, "gathered_params", None) is None else costs.gathered_params
    zero3_buffers = np.where(zero == 3, 2.0 * gathered * w_bytes, 0.0)  # this and the next layer gathered
    other = on_positions(costs.first.buffer_bytes + zero3_buffers, costs.last.buffer_bytes + zero3_buffers,
                         pp == 1, middle=zero3_buffers, last_alone=costs.last.buffer_bytes)
    if any_mirror:  # the first and the last stage on one rank: both edges' buffers
        both = costs.first.buffer_bytes + costs.last.buffer_bytes + zero3_buffers
        other = np.stack([np.where(mirrored, both, other[0]), np.where((pp > 1) & mirrored, both, other[1]),
                          other[2]])
    other = ranks.of_positions(other)
    full = np.where(zero >= 2, 0.0, 1.0) if grad_unsharded is None else grad_unsharded
    group = dp if cp is None else dp * cp
    shard = _state_bytes(zero, group, full, w_bytes + weight_cache_bytes, master_bytes + state_bytes, grad_bytes)
    # the routed experts' states (none held: the dense shard stands in, times zero parameters)
    expert_shard = shard if edp is None or held_expert is None else _state_bytes(
        zero, edp, full, w_bytes + weight_cache_bytes, master_bytes + state_bytes, grad_bytes)
    expert = 0.0 if held_expert is None else held_expert
    # the edges' embedding, output head and final norm keep no low-precision weight cast
    if weight_cache_bytes:
        uncached = ranks.of_positions(_high_precision_on_positions(costs, pp, mirrored if any_mirror else None))
        uncached_bytes = uncached * (weight_cache_bytes / np.where(zero == 3, group, 1.0))
    else:  # no low-precision weight copies: none to take off
        uncached_bytes = 0.0
    per_rank_states = (held - expert) * shard["total"] + expert * expert_shard["total"] - uncached_bytes
    if states_offloaded:  # on the device for the step only, when the activations are freed
        optim = (held - expert) * shard["optimizer_states"] + expert * expert_shard["optimizer_states"]
        per_rank_states = per_rank_states - optim
        activations_or_states = np.maximum(activations, optim)
    else:
        activations_or_states = activations
    allocated = np.where(ranks.valid, per_rank_states + activations_or_states + other, -1.0)
    peak_position = argmax_rows(allocated)
    flat = flat_index(peak_position)

    def pick(v: np.ndarray) -> np.ndarray:  # v[peak_position, columns]
        return pick_rows(v, peak_position, flat)
    held_expert = 0.0 if held_expert is None else pick(held_expert)
    held = pick(held)
    dense = held - held_expert
    peak_allocated = allocated.max(axis=0)
    fixed = broadcast_float(process, pp.shape)
    buffers = broadcast_float(nccl, pp.shape)
    terms = {k: dense * shard[k] + held_expert * expert_shard[k] for k in ("weights", "grads", "optimizer_states")}
    if states_offloaded:  # what the reloaded states add above the freed activations
        terms["optimizer_states"] = np.maximum(terms["optimizer_states"] - pick(activations), 0.0)
    if weight_cache_bytes:
        terms["weights"] = terms["weights"] - pick(uncached_bytes)
    terms.update(activations=pick(activations), cuda_context=fixed, nccl_buffers=buffers,
                 allocator_reserve=reserve_fraction * peak_allocated, other=pick(other))
    peak = peak_allocated * (1.0 + reserve_fraction) + fixed + buffers
    return Memory(terms={k: terms[k] for k in MEMORY_TERMS}, peak=peak, peak_position=peak_position)


def _high_precision_on_positions(costs, pp: np.ndarray, mirrored: np.ndarray | None) -> np.ndarray:
    """(3, n) parameters of each position's edges that no low-precision GEMM reads (``Edge.
    high_precision_params``, less a tied head, per plan): the first rank's embedding, the last rank's head and
    final norm, both on one rank without pipelining or under a bidirectional schedule; middle ranks none. (A
    tied head alone on the last rank is left cached: the small overcount of a rare layout.)"""
    from .partition import on_positions

    first = np.asarray(getattr(costs.first, "high_precision_params", 0.0), dtype=float)
    alone = np.asarray(getattr(costs.last, "high_precision_params", 0.0), dtype=float)  # less the tied head
    out = on_positions(first, alone, pp == 1, last_alone=alone)
    if mirrored is not None:
        both = first + alone
        out = np.stack([np.where(mirrored, both, out[0]), np.where((pp > 1) & mirrored, both, out[1]), out[2]])
    return np.broadcast_to(out, (3, pp.size))


def _state_bytes(zero: np.ndarray, group: np.ndarray, grad_unsharded: np.ndarray, w_bytes: float,
                 state_bytes: float, grad_bytes: float) -> dict:
    """Bytes per parameter of weights (with the stack's weight caches), gradients and optimizer states
    (master copy + moments) on one rank, ZeRO-sharded over a group of ``group`` ranks (ZeRO-1: optimizer states,
    2: + gradients, 3: + weights; ``grad_unsharded`` of the gradients stays whole), and their sum."""
    w_div = np.where(zero == 3, group, 1.0)
    o_div = np.where(zero >= 1, group, 1.0)
    out = {"weights": w_bytes / w_div, "grads": grad_bytes * (grad_unsharded + (1.0 - grad_unsharded) / group),
           "optimizer_states": state_bytes / o_div}
    out["total"] = out["weights"] + out["grads"] + out["optimizer_states"]
    return out
