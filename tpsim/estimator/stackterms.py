"""What the estimator's stages read from a training-stack profile (:mod:`tpsim.stacks`), resolved once per
context: when gradients are reduced, in which dtype, whether the backward TP collectives overlap the GEMMs,
how ZeRO-3 gathers (per block or per parameter tensor), the host cost per op and per collective, which kernels a
layer launches, the optimizer's memory traffic and the memory the stack holds (gradient buffers, allocator
reserve). Every value comes from the profile's figures (each with its source); priors carry their range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import InputError
from ..hardware import DTYPE_BYTES, is_low_precision
from ..model import ModelSpec
from ..stacks import Figure, StackProfile

TIMINGS = ("per_step", "per_microbatch", "per_step_with_pp")
"""``comm.dp_reduction_timing`` values: once per step; after every micro-batch; per micro-batch without
pipeline parallelism and once per step with it (torch pipelining turns gradient sync off but for the last
backward)."""
ZERO3_UNITS = ("layer", "block", "parameter")
KERNEL_FLAVORS = {"fused": "megatron_te", "eager": "eager"}
"""``compute.kernels`` -> the kernel-count flavor of tpsim/data/kernels/fixed.yaml."""
ARCH_SM = {"ampere": "sm80", "ada": "sm80", "hopper": "sm90", "blackwell": "sm100"}
"""device architecture -> the key of ``compute.default_attention`` (Ada runs the sm80 kernels)."""
ATTENTION_KERNEL = {"flash2": "fa2", "flash3": "fa3", "cudnn": "cudnn", "unfused": "unfused"}
"""stack attention names -> :class:`~tpsim.compute.kernel_model.KernelModel` implementations."""
PERSISTENCE_DEFAULT = 0.0

if TYPE_CHECKING:
    from ..precision import StateBytes


@dataclass(frozen=True, kw_only=True)
class ActivationStorage:
    """How a stack stores the activations kept for backward (besides the plan's recompute field)."""

    recompute_modules: frozenset = frozenset({"core_attn"})
    """what ``recompute=selective`` recomputes (:data:`RECOMPUTE_MODULES`)."""
    per_op_sac: bool = False
    """``recompute=selective`` is torchtitan's per-op selective checkpointing (``memory.selective_recompute_policy
    = per_op``): the outputs of the matmuls, SDPA and reduce-scatters are saved except every second matmul of a
    layer, everything else is recomputed (:func:`tpsim.estimator.memory.per_op_sac_bytes`)."""
    logits_bytes: float = 4.0
    """bytes per logit element held at the loss (``memory.logits_bytes_per_element``: Megatron's fp32 logits of
    the vocabulary-parallel cross-entropy; an eager loss keeps the 16-bit logits, their fp32 copy and the saved
    log-softmax)."""
    fp8_linear_input_bytes: float | None = None
    """with fp8 GEMMs, bytes per cached element of a linear layer's input (and of the routed experts' SwiGLU
    input when their activation is recomputed); None: the 16-bit activation."""
    fp8_attention_output_bytes: float | None = None
    """with fp8 GEMMs, bytes per cached element of the attention output (the output projection's input)."""
    attention_output_shared: bool = False
    """the attention kernel's backward reads the projection's cached input (``memory.attention_output_shared``:
    DeepSeek-V3's E5M6 cache); False: flash attention keeps its own 16-bit output beside a low-precision cast."""

    def cache_bytes(self, dtype: str, act_bytes: float) -> tuple[float, float]:
        """(linear input, attention output) bytes per cached element for a plan of ``dtype``."""
        if not is_low_precision(dtype):
            return act_bytes, act_bytes
        lin = act_bytes if self.fp8_linear_input_bytes is None else self.fp8_linear_input_bytes
        att = lin if self.fp8_attention_output_bytes is None else self.fp8_attention_output_bytes
        return lin, att


RING_EXCHANGES = ("p2p", "allgather")
"""``comm.cp_ring_exchange`` values (docs/MODEL.md, CP)."""


@dataclass(frozen=True)
class RingExchange:
    """How a stack's ring context parallelism moves K/V and their gradients (docs/MODEL.md, CP).

    ``allgather`` False (TransformerEngine ``AttnFuncWithCPAndKVP2P``, torchtitan ``rotate_method =
    "alltoall"``): every step sends the K/V block to the ring neighbour while the step's attention runs.
    True (torch ``_cp_options.rotate_method = ALL_GATHER``, torchtitan's default ``allgather``): one all-gather
    of every rank's K/V per pass, started before the first (local) step and awaited by the second, forward and
    backward alike; the gradients of K/V still travel around the ring (torch's backward ``dkv_rotater`` is an
    ``_AllToAllRotater``), one send per step, the last one awaited after the loop. ``grad_bytes``: bytes per
    element of the dK/dV messages and their accumulators (torch ``_cp_options.convert_to_f32``: fp32)."""

    allgather: bool = False
    grad_bytes: float | None = None
    """None: the activation dtype's."""
    overlapped: bool = True
    """the exchanges run beside the attention steps (eager: torch's ``AsyncCollectiveTensor`` is awaited where
    the next step needs it, TE's ``req.wait()`` one step later). False (``comm.cp_exchange_overlap``): each is
    awaited where it is issued, so none hides (torch.compile traces the functional collectives with
    ``wait_tensor`` right after them, torch/distributed/_functional_collectives.py ``_maybe_wrap_tensor``, and
    Inductor keeps that order: ``reorder_for_compute_comm_overlap = False``)."""


@dataclass(frozen=True, kw_only=True)
class StackTerms:
    """A stack profile's figures as the stages use them."""

    name: str
    per_microbatch: np.ndarray
    """(2, 4) bool, [pp > 1, zero]: True where gradients are reduced after every micro-batch."""
    chunk_reduction: np.ndarray
    """(4,) bool per ZeRO stage: with pp the gradients of each model chunk are reduced after its last backward
    (``per_step_with_pp``)."""
    grad_reduce_bytes: float
    """bytes per gradient element on the wire (fp32 4, bf16 2)."""
    param_gather_bytes: float
    """bytes per parameter element the ZeRO all-gathers move."""
    tp_backward_overlap: bool
    """the backward TP collectives overlap the GEMMs (asynchronous TP communication)."""
    tp_overlap_phases: tuple[str, ...] = ("fwd", "bwd")
    """the phases whose TP collectives a plan's ``tp_overlap`` pipelines with the GEMMs
    (``comm.tp_overlap_phases``: Transformer Engine userbuffers both; torch async TP only the forward)."""
    pp_overlap_interleaved: bool = False
    """interleaved plans (vpp > 1) overlap the pipeline sends with the next chunk's compute
    (``comm.pp_overlap_interleaved``: Megatron-LM --overlap-p2p-communication, on by default)."""
    dp_bucket_elements: tuple[float, float] | None = None
    """(floor, per DP rank) of the gradient bucket size in parameters, ``max(floor, per_rank x dp)``
    (``comm.dp_bucket_elements``: a number, or Megatron-Core's ``max(4e7, 1e6 x dp)``); None: not bucketed."""
    dp_sync_per_chunk: bool = False
    """interleaved plans (vpp > 1) reducing once per step launch each model chunk's gradient reduction after that
    chunk's last backward and gather each chunk's parameters before its first forward, so a chunk's traffic
    overlaps the other chunks' passes (``comm.dp_sync_per_chunk``: Megatron-Core schedules.py
    forward_backward_pipelining_with_interleaving, grad_sync_func / param_sync_func per chunk;
    :func:`tpsim.estimator.schedule.chunked_exposure`)."""
    tp_overlap_exposed_share: Mapping[str, Mapping[str, float | None]] = dataclasses.field(default_factory=dict)
    """phase -> collective -> share of a pipelined TP collective left exposed (its chunk that nothing hides;
    None: 1 / tp) (``comm.tp_overlap_exposed_share``)."""
    tp_overlap_comm_sms: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    """phase -> collective -> SMs the communication kernels of a pipelined TP collective occupy while it runs
    beside the GEMMs (``comm.tp_overlap_comm_sms``; missing: none, a copy-engine transfer)."""
    zero3_per_parameter: bool
    """ZeRO-3 gathers each parameter tensor (DeepSpeed) instead of each layer / block (FSDP)."""
    zero3_persistence_elements: float
    """parameters smaller than this stay unpartitioned under per-parameter ZeRO-3."""
    host_s_per_collective: float
    """host time to issue one ZeRO-3 gather (module hooks), seconds."""
    host_s_per_collective_rank: float = 0.0
    """host time per rank of the group to issue one ZeRO-3 gather (``comm.host_us_per_collective_rank``: a
    gather into a list of one partition per rank), seconds."""
    fp8_param_gather: bool = False
    """with fp8 GEMMs the ZeRO-3 weight all-gathers move fp8 (1 B per parameter; torchao
    enable_fsdp_float8_all_gather) instead of ``comm.param_gather_dtype`` (``comm.fp8_param_gather``)."""
    fp8_cast_bytes: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """with fp8 GEMMs, bytes per element the stack's fp8 recipe moves to cast each linear's input (forward), its
    output gradient (backward) and its input again in backward (``compute.fp8_cast_bytes_per_element``)."""
    zero3_regather_in_recompute: bool = False
    """ZeRO-3 with full recomputation gathers each layer's parameters a third time, for the recomputed forward
    (``comm.zero3_regather_in_recompute``: DeepSpeed 2021 releases them after the forward and again after the
    recomputation)."""
    zero3_overlap_fraction: float | None = None
    """None: ZeRO-3 collectives prefetched one layer ahead, each hidden behind its neighbour layer's compute.
    A number: the fraction of the step's compute that the ZeRO-3 collectives overlap at best
    (``comm.zero3_overlap_fraction``; DeepSpeed 2021's prefetch did not keep them ahead of the compute)."""
    host_s_per_op: float
    """host time to issue one kernel-launching op (framework + driver), seconds."""
    kernel_flavor: str
    """fixed.yaml kernel-count flavor (``megatron_te`` fused layers, ``eager``)."""
    pipeline_edges_as_layers: bool
    """the pipeline split counts the embedding and the output layer as one layer each."""
    model_edges: bool = True
    """the runtime runs the model's embedding, output layer and loss (``compute.model_edges``; False: a stack
    of layers alone, as ``tpsim validate`` runs it: the edges cost nothing and hold no parameters)."""
    grad_accumulation_fusion: bool
    """weight-gradient GEMMs accumulate into the gradient buffer (no separate add per micro-batch)."""
    optimizer_bytes_per_param: float
    """HBM bytes one optimizer step moves per (sharded) parameter."""
    optimizer_bytes_per_param_fp32: float | None = None
    """bytes per parameter of the optimizer step when the model trains in fp32/tf32 (no master copy); None: the
    fused-Adam formula (tpsim/compute/fixed.py optimizer_bytes_per_param, 36 B)"""
    grad_buffer_passes: float = 0.0
    """passes over the rank's whole gradient buffer per step outside the optimizer's shard, each moving one
    buffer element per parameter (``compute.grad_buffer_passes_per_step``: Megatron-Core DDP zeroes it, checks
    its norm for NaN and scales it by 1/dp before the reduction)."""
    grad_buffer_bytes: float
    """bytes per element of the gradient accumulation buffer (full while gradients are reduced once per step;
    the rank's shard when ZeRO-2/3 reduces them after every micro-batch)."""
    main_params_bytes: float
    """bytes per parameter of the optimizer's master copy (16-bit training)."""
    optimizer_state_bytes: float
    """bytes per parameter of the two Adam moments together."""
    fp8_weights_kept: bool
    ep_fp8_dispatch: bool = False
    """fp8 plans send the dispatch all-to-all (and its backward twin, the gradients towards the experts) in fp8;
    the combine (and its twin) stay 16-bit (``comm.ep_dispatch_dtype``)."""
    ep_node_dedup: bool = False
    ep_a2a_overlap: bool = False
    optimizer_cpu_fraction: float = 0.0
    """the share of the rank's optimizer states (master weights and moments) that live in host memory and are
    updated there (``memory.optimizer_cpu_fraction``: Megatron-Core --optimizer-cpu-offload with
    --optimizer-offload-fraction, megatron/core/optimizer/cpu_offloading HybridDeviceOptimizer, torch's fused
    CPU AdamW): the device holds the rest, and the step runs the GPU part beside the CPU part, which streams
    :data:`tpsim.estimator.schedule.CPU_ADAM_BYTES` per parameter at the host memory bandwidth and moves each
    parameter's gradient down and its updated value up over the host link
    (:func:`tpsim.estimator.schedule.optimizer_seconds`)."""
    optimizer_cpu_overlap: bool = False
    """the host-link copies of the CPU part run beside its update, group by group
    (``memory.optimizer_cpu_overlap``: --overlap-cpu-optimizer-d2h-h2d); else after one another."""
    optimizer_state_offload: bool = False
    """the optimizer moments and master weights live in host memory between steps, reloaded for the step and
    offloaded after it (``memory.optimizer_state_offload``: Megatron-Core --offload-optimizer-states,
    megatron/core/optimizer/cpu_offloading OptimizerStateOffloader, full-reload mode: D2H and H2D overlapped on
    their CUDA streams): the peak holds the larger of the activations and the states, and each step moves the
    states across the GPU's host link once each way (:func:`tpsim.estimator.schedule.optimizer_seconds`)."""
    """the expert all-to-alls of one micro-batch run under another's computation in the steady 1F1B state, as
    DualPipe pairs chunks (``comm.ep_a2a_overlap``: Megatron-Core --overlap-moe-expert-parallel-comm)."""
    cp_ring: RingExchange = RingExchange()
    """how ring context parallelism exchanges K/V and dK/dV (``comm.cp_ring_exchange``,
    ``comm.cp_grad_exchange_dtype``; :class:`RingExchange`)."""
    gqa_kv_repeat: bool = False
    """grouped-query attention's K and V are repeated to the query heads in HBM before the attention kernel
    (``compute.gqa_kv_repeat``: torchtitan's repeat_kv), forward and (summed back) backward."""
    fsdp_copies: bool = False
    """FSDP2's copy-in / copy-out around each unit's all-gather and reduce-scatter are costed (exposed, on the
    compute stream; ``comm.fsdp_copy_in_out``, schedule.fsdp_copy_seconds)."""
    fsdp_reshard_after_backward: bool = False
    """ZeRO-2/3 are FSDP2 ``fully_shard`` units that free their unsharded parameters after every gradient
    reduction (``comm.fsdp_reshard_after_backward``): ZeRO-2 (reshard_after_forward=False) gathers again before
    the forward after each reduction and ZeRO-3's backward gathers once per reduction; under pipelining every
    unit's reduce-scatter runs after the stage's last backward (torch.distributed.pipelining stage.py calls FSDP's
    post_backward itself), with nothing left to hide it."""
    pp_send_split: bool = True
    """a pipeline stage sends its 1/tp slice of the boundary activation (Megatron's scatter/gather
    optimization); False: every TP rank sends the whole activation unless SP shards it
    (``comm.pp_send_split_over_tp``)."""
    zero1_in_optimizer: bool = False
    """ZeRO-1's gradient reduce-scatter and parameter all-gather run inside the optimizer step, after the
    backward, nothing overlapping them (``comm.zero1_in_optimizer_step``)."""
    zero1_copies: bool = False
    """ZeRO-1 copies the gradients into a flat buffer before its reduce-scatter and the gathered weights back
    into the parameters after its all-gather, in the optimizer step (``comm.zero1_flat_copies``,
    schedule.zero1_copy_seconds)."""
    """with group-limited routing a token crosses the network once per destination node and is forwarded to its
    experts there over NVLink (``comm.ep_node_dedup``; DeepEP / HAI-LLM)."""
    activation_storage: "ActivationStorage"
    """what selective recomputation recomputes and which cached activations are fp8 (fp8 training)."""
    """with fp8 GEMMs the stack keeps fp8 weights instead of 16-bit ones (else 16-bit weights plus fp8 casts)."""
    allocator_reserve_fraction: float
    allocator_reserve_range: tuple[float, float]
    host_range: tuple[float, float]
    """(low, high) of ``host_s_per_op`` (seconds) for the error band."""
    collective_host_range: tuple[float, float]
    default_attention: Mapping[str, str]

    # ---- queries -------------------------------------------------------------------------------------------
    def state_bytes(self, dtype: str) -> "StateBytes":
        """Bytes per parameter of weights, master copy, gradients, moments and the DP wire under this stack
        for GEMM precision ``dtype`` (:func:`tpsim.precision.state_bytes`), remembered per dtype (the stages ask
        for them several times a batch; the terms are frozen)."""
        known = self.__dict__.setdefault("_state_bytes", {})
        hit = known.get(dtype)
        if hit is None:
            from ..precision import state_bytes

            wire = 1.0 if dtype == "fp8" and self.fp8_param_gather else self.param_gather_bytes
            hit = known[dtype] = state_bytes(dtype, grad_buffer=self.grad_buffer_bytes,
                                             master=self.main_params_bytes, moment=self.optimizer_state_bytes / 2.0,
                                             wire_params=wire, wire_grads=self.grad_reduce_bytes,
                                             fp8_weights_kept=self.fp8_weights_kept)
        return hit

    def weight_cache_bytes(self, dtype: str) -> float:
        """Bytes per parameter of the quantized weight copies a low-precision step keeps between micro-batches
        (0 for 16/32-bit GEMMs): :data:`FP8_CAST_BYTES` copies at the dtype's bytes, block scales included
        (DTYPE_BYTES: 1 for fp8, 1 + 1/32 for mxfp8, 0.5 + 1/16 for nvfp4), one fewer where the weights
        themselves are kept in fp8 (``memory.fp8_weights_kept``)."""
        from ..hardware import DTYPE_BYTES, is_low_precision

        if not is_low_precision(dtype):
            return 0.0
        return DTYPE_BYTES[dtype] * (FP8_CAST_BYTES / 2 if self.fp8_weights_kept else FP8_CAST_BYTES)

    def dp_bucket(self, dp: np.ndarray) -> np.ndarray | None:
        """Parameters per gradient bucket for DP groups of ``dp`` ranks (None: the stack names no buckets)."""
        if self.dp_bucket_elements is None:
            return None
        floor, per_rank = self.dp_bucket_elements
        return np.maximum(floor, per_rank * np.asarray(dp, dtype=float))

    def reduces_per_microbatch(self, zero: np.ndarray, pp: np.ndarray) -> np.ndarray:
        """Per plan: gradients reduced after every micro-batch (else once per step)."""
        table = self.per_microbatch  # (2, 4): one flat gather (a 2-D fancy index is twice as slow)
        return table.take((np.asarray(pp) > 1) * table.shape[1] + np.asarray(zero, dtype=np.int64))

    def grads_sharded(self, zero: np.ndarray, pp: np.ndarray) -> np.ndarray:
        """Per plan: the gradient buffer holds only the rank's shard (ZeRO-2/3 reducing after every
        micro-batch); gradients reduced once per step accumulate in a full buffer whatever the ZeRO stage."""
        return (np.asarray(zero) >= 2) & self.reduces_per_microbatch(zero, pp)

    def unsharded_grad_fraction(self, zero: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
                                m: np.ndarray) -> np.ndarray:
        """Per plan, the fraction of the rank's parameters whose gradients are held unsharded: 1 for ZeRO-0/1
        and for gradients reduced once per step; 0 for ZeRO-2/3 reducing after every micro-batch; 1/vpp for
        ZeRO-2/3 that reduce each model chunk after its last backward (per_step_with_pp) when the interleaved
        schedule runs a single round (m <= pp): every chunk's backwards are then contiguous, its gradients are
        reduce-scattered right after them and only one chunk's accumulation buffer is alive at a time."""
        zero, pp, vpp, m = (np.asarray(x) for x in (zero, pp, vpp, m))
        sharded = self.grads_sharded(zero, pp)
        chunk_wise = (zero >= 2) & ~sharded & self.chunk_reduction[zero] & (pp > 1) & (vpp > 1) & (m <= pp)
        return np.where(sharded, 0.0, np.where(chunk_wise, 1.0 / np.maximum(vpp, 1), 1.0))

    def attention_kernel(self, architecture: str | None) -> str:
        """The kernel model's flash implementation this stack runs on ``architecture`` (``fa2`` without data)."""
        sm = ARCH_SM.get(architecture or "")
        name = self.default_attention.get(sm or "", "flash2")
        # a stack whose default is the unfused core attention runs FlashAttention-2 when the plan asks for flash
        # (Megatron-DeepSpeed --use-flash-attn-v2); the plan's attention field chooses unfused or flash
        return "fa2" if name == "unfused" else ATTENTION_KERNEL.get(name, "fa2")

    def zero3_collectives_per_layer(self, model: ModelSpec, tp: int) -> float:
        """Gathers (and reduce-scatters) one layer's ZeRO-3 parameters take: one per layer or block, or one per
        weight tensor above the persistence threshold (per-parameter ZeRO-3: q/k/v fused, output projection, MLP
        input (gate and up fused), MLP output)."""
        if not self.zero3_per_parameter:
            return 1.0
        h, f = float(model.hidden_size), float(model.ffn_hidden_size)
        q = model.num_attention_heads * model.head_dim
        kv = model.num_kv_heads * model.head_dim
        weights = (h * (q + 2 * kv), q * h, h * f * (2 if model.gated else 1), f * h)
        return float(max(1, int(self.zero3_fetched(np.array(weights), tp).sum())))

    def zero3_fetches(self, model: Any, source: Any, tp: int, by_kind: bool = False) -> Any:
        """Fetches per layer and pass under ZeRO-3 (:meth:`zero3_collectives_per_layer`); for a traced graph's
        units (a source with ``tensor_numels``), each unit's own parameter tensors (:meth:`zero3_fetched`):
        ``by_kind`` (kinds,) one layer of each kind (0 for a unit without one fetched), else the mean layer's
        (at least one). ``by_kind`` for a source without them: None."""
        numels = getattr(source, "tensor_numels", None)
        if numels is None:
            return None if by_kind else self.zero3_collectives_per_layer(model, tp)
        share = source.kind_share
        if not self.zero3_per_parameter:
            return np.ones(share.shape) if by_kind else 1.0
        per_kind = np.bincount(source.tensor_kinds, weights=self.zero3_fetched(numels, tp).astype(float),
                               minlength=share.size)
        return per_kind if by_kind else float(max(1.0, per_kind @ share))

    def zero3_fetched(self, numel: np.ndarray, tp: int) -> np.ndarray:
        """bool per weight tensor of ``numel`` elements: per-parameter ZeRO-3 partitions and gathers it (one
        fetch per pass), at or above the persistence threshold once split over ``tp``."""
        return np.asarray(numel, dtype=float) / tp >= self.zero3_persistence_elements


def _value(stack: StackProfile, section: str, key: str, default: Any = None) -> Any:
    fig = stack.figure(section, key)
    return default if fig is None or fig.value is None else fig.value


_BUCKET_RULE = re.compile(r"^\s*max\(\s*([0-9.eE+]+)\s*,\s*([0-9.eE+]+)\s*x\s*dp\s*\)\s*$")


def _bucket_rule(value: Any, where: str) -> tuple[float, float] | None:
    """``comm.dp_bucket_elements``: a positive number of parameters, or ``max(A, B x dp)`` -> (floor, per rank)."""
    if value is None:
        return None
    try:
        match = _BUCKET_RULE.match(value) if isinstance(value, str) else None
        pair = (float(match.group(1)), float(match.group(2))) if match else (float(value), 0.0)
    except (TypeError, ValueError):
        pair = None
    if pair is None or not all(math.isfinite(x) for x in pair) or pair[0] <= 0 or pair[1] < 0:
        raise InputError(f"{where}: {value!r} is not a positive number of parameters nor max(A, B x dp)")
    return pair


def _fig(stack: StackProfile, section: str, key: str) -> Figure | None:
    return stack.figure(section, key)


def _per_zero(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> list[Any]:
    """A per-ZeRO-stage figure (``{0: x, 2: y}`` or one value for all): values for stages 0-3, a stage the
    stack does not list takes the nearest lower listed one."""
    if not isinstance(value, Mapping):
        values = {z: value for z in range(4)}
    else:
        values = {int(k): v for k, v in value.items()}
    out = []
    last = next(iter(values.values()))
    for z in range(4):
        last = values.get(z, last)
        if allowed is not None and last not in allowed:
            raise InputError(f"{where}: {last!r} is not one of {', '.join(allowed)}")
        out.append(last)
    return out


def _dtype_bytes(value: Any, where: str) -> float:
    name = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
            "fp8": "fp8"}.get(str(value))
    if name is None:
        raise InputError(f"{where}: dtype {value!r} is not one of fp32, bf16, fp16, fp8")
    return float(DTYPE_BYTES[name])


def _master_bytes(value: Any, where: str) -> float:
    """Bytes per parameter of the optimizer's master copy: a dtype, or ``none`` when the optimizer updates the
    16-bit parameters in place (NeMo's DistributedFusedAdam with optim.dtype bf16: store_params false)."""
    return 0.0 if str(value) == "none" else _dtype_bytes(value, where)


def _seconds_range(fig: Figure | None, value_s: float) -> tuple[float, float]:
    if fig is None or fig.range is None:
        return value_s, value_s
    return fig.range[0] * 1e-6, fig.range[1] * 1e-6


def stack_terms(stack: StackProfile) -> StackTerms:
    """Resolve a profile's figures (errors name the field and the value)."""
    where = f"stack {stack.name}"
    timing = _per_zero(_value(stack, "comm", "dp_reduction_timing", "per_step"),
                       f"{where}: comm.dp_reduction_timing", TIMINGS)
    per_mb = np.array([[t == "per_microbatch" for t in timing],
                       [t == "per_microbatch" for t in timing]], dtype=bool)
    per_mb[0] |= np.array([t == "per_step_with_pp" for t in timing])
    chunk = np.array([t == "per_step_with_pp" for t in timing])
    unit = _choice(stack, "comm", "zero3_unit", "layer", ZERO3_UNITS, where)
    kernels = _choice(stack, "compute", "kernels", "fused", tuple(KERNEL_FLAVORS), where)
    host_op = float(_value(stack, "compute", "host_us_per_op", 0.0)) * 1e-6
    host_coll = float(_value(stack, "comm", "host_us_per_collective", 0.0)) * 1e-6
    reserve_fig = _fig(stack, "memory", "allocator_reserve_fraction")
    reserve = float(_value(stack, "memory", "allocator_reserve_fraction", 0.0))
    attention = _value(stack, "compute", "default_attention", {})
    return StackTerms(
        name=stack.name, per_microbatch=per_mb, chunk_reduction=chunk,
        grad_reduce_bytes=_dtype_bytes(_value(stack, "comm", "grad_reduce_dtype", "fp32"),
                                       f"{where}: comm.grad_reduce_dtype"),
        param_gather_bytes=_dtype_bytes(_value(stack, "comm", "param_gather_dtype", "bf16"),
                                        f"{where}: comm.param_gather_dtype"),
        tp_backward_overlap=bool(_value(stack, "comm", "tp_backward_overlap", True)),
        tp_overlap_phases=_phases(stack, where),
        tp_overlap_exposed_share=_exposed_share(stack, where),
        tp_overlap_comm_sms=_comm_sms(stack, where),
        pp_overlap_interleaved=bool(_value(stack, "comm", "pp_overlap_interleaved", False)),
        dp_sync_per_chunk=bool(_value(stack, "comm", "dp_sync_per_chunk", False)),
        dp_bucket_elements=_bucket_rule(_value(stack, "comm", "dp_bucket_elements"),
                                        f"{where}: comm.dp_bucket_elements"),
        zero3_per_parameter=unit == "parameter",
        zero3_persistence_elements=float(_value(stack, "comm", "zero3_persistence_threshold_elements",
                                                PERSISTENCE_DEFAULT)),
        host_s_per_collective=host_coll, host_s_per_op=host_op, kernel_flavor=KERNEL_FLAVORS[kernels],
        host_s_per_collective_rank=float(_value(stack, "comm", "host_us_per_collective_rank", 0.0)) * 1e-6,
        fp8_cast_bytes=_fp8_cast(stack, where),
        fp8_param_gather=bool(_value(stack, "comm", "fp8_param_gather", False)),
        zero3_regather_in_recompute=bool(_value(stack, "comm", "zero3_regather_in_recompute", False)),
        zero3_overlap_fraction=_fraction_or_none(stack, "comm", "zero3_overlap_fraction", where),
        grad_accumulation_fusion=bool(_value(stack, "compute", "grad_accumulation_fusion", True)),
        pipeline_edges_as_layers=bool(_value(stack, "compute", "pipeline_edges_as_layers", False)),
        optimizer_bytes_per_param=float(_value(stack, "compute", "optimizer_bytes_per_param", 42.0)),
        optimizer_bytes_per_param_fp32=_positive_or_none(stack, "compute", "optimizer_bytes_per_param_fp32", where),
        grad_buffer_passes=float(_value(stack, "compute", "grad_buffer_passes_per_step", 0.0)),
        grad_buffer_bytes=_dtype_bytes(_value(stack, "memory", "grad_buffer_dtype", "fp32"),
                                       f"{where}: memory.grad_buffer_dtype"),
        main_params_bytes=_master_bytes(_value(stack, "memory", "main_params_dtype", "fp32"),
                                        f"{where}: memory.main_params_dtype"),
        optimizer_state_bytes=2.0 * _dtype_bytes(_value(stack, "memory", "optimizer_state_dtype", "fp32"),
                                                 f"{where}: memory.optimizer_state_dtype"),
        fp8_weights_kept=bool(_value(stack, "memory", "fp8_weights_kept", False)),
        activation_storage=_activation_storage(stack, where),
        ep_fp8_dispatch=_choice(stack, "comm", "ep_dispatch_dtype", "bf16", ("bf16", "fp8"), where) == "fp8",
        ep_node_dedup=bool(_value(stack, "comm", "ep_node_dedup", False)),
        ep_a2a_overlap=bool(_value(stack, "comm", "ep_a2a_overlap", False)),
        optimizer_state_offload=bool(_value(stack, "memory", "optimizer_state_offload", False)),
        optimizer_cpu_fraction=_fraction_or_none(stack, "memory", "optimizer_cpu_fraction", where) or 0.0,
        optimizer_cpu_overlap=bool(_value(stack, "memory", "optimizer_cpu_overlap", False)),
        fsdp_copies=bool(_value(stack, "comm", "fsdp_copy_in_out", False)),
        fsdp_reshard_after_backward=bool(_value(stack, "comm", "fsdp_reshard_after_backward", False)),
        zero1_in_optimizer=bool(_value(stack, "comm", "zero1_in_optimizer_step", False)),
        zero1_copies=bool(_value(stack, "comm", "zero1_flat_copies", False)),
        pp_send_split=bool(_value(stack, "comm", "pp_send_split_over_tp", True)),
        model_edges=bool(_value(stack, "compute", "model_edges", True)),
        gqa_kv_repeat=bool(_value(stack, "compute", "gqa_kv_repeat", False)),
        cp_ring=RingExchange(
            allgather=_choice(stack, "comm", "cp_ring_exchange", "p2p", RING_EXCHANGES, where) == "allgather",
            grad_bytes=None if _value(stack, "comm", "cp_grad_exchange_dtype", None) is None else _dtype_bytes(
                _value(stack, "comm", "cp_grad_exchange_dtype", None), f"{where}: comm.cp_grad_exchange_dtype"),
            overlapped=_flag(stack, "comm", "cp_exchange_overlap", True, where)),
        allocator_reserve_fraction=reserve,
        allocator_reserve_range=(reserve_fig.range if reserve_fig is not None and reserve_fig.range
                                 else (reserve, reserve)),
        host_range=_seconds_range(_fig(stack, "compute", "host_us_per_op"), host_op),
        collective_host_range=_seconds_range(_fig(stack, "comm", "host_us_per_collective"), host_coll),
        default_attention=dict(attention) if isinstance(attention, Mapping) else {k: attention for k in
                                                                                  ("sm80", "sm90", "sm100")})


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe")
"""what selective recomputation may recompute, in Megatron-Core's ``--recompute-modules`` names
(megatron/training/arguments.py; megatron/core/transformer/transformer_config.py recompute_modules): the
attention core (scores), the norms' outputs, MLA's up-projections (q, k, v from the stored latents), the routed
experts' activation function (its output, the second GEMM's input), a dense layer's MLP and a MoE layer (each
checkpointed whole: the MoE layer's dispatch and combine run again in backward). Not modelled:
``shared_experts`` (the shared experts alone)."""


def _activation_storage(stack: StackProfile, where: str) -> ActivationStorage:
    modules = _value(stack, "memory", "selective_recompute_modules", ["core_attn"])
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or \
            any(m not in RECOMPUTE_MODULES for m in modules):
        raise InputError(f"{where}: memory.selective_recompute_modules={modules!r} must be a list of "
                         f"{', '.join(RECOMPUTE_MODULES)}")
    cache = _value(stack, "memory", "fp8_activation_cache_bytes", None)
    attn = _value(stack, "memory", "attention_output_cache_bytes", cache)
    for key, value in (("fp8_activation_cache_bytes", cache), ("attention_output_cache_bytes", attn)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value <= 2):
            raise InputError(f"{where}: memory.{key}={value!r} must be bytes per element in (0, 2]")
    policy = _value(stack, "memory", "selective_recompute_policy", "modules")
    if policy not in ("modules", "per_op"):
        raise InputError(f"{where}: memory.selective_recompute_policy={policy!r} is not one of modules, per_op")
    logits = _value(stack, "memory", "logits_bytes_per_element", 4.0)
    if isinstance(logits, bool) or not isinstance(logits, (int, float)) or not 0 < logits <= 64:
        raise InputError(f"{where}: memory.logits_bytes_per_element={logits!r} must be bytes in (0, 64]")
    return ActivationStorage(recompute_modules=frozenset(modules), per_op_sac=policy == "per_op",
                             logits_bytes=float(logits),
                             fp8_linear_input_bytes=None if cache is None else float(cache),
                             fp8_attention_output_bytes=None if attn is None else float(attn),
                             attention_output_shared=bool(_value(stack, "memory", "attention_output_shared", False)))


def _flag(stack: StackProfile, section: str, key: str, default: bool, where: str) -> bool:
    """A true/false figure (a YAML boolean)."""
    value = _value(stack, section, key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}: {section}.{key}={value!r} is not true or false")
    return value


def _choice(stack: StackProfile, section: str, key: str, default: str, allowed: tuple[str, ...],
            where: str) -> str:
    value = _value(stack, section, key, default)
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{where}: {section}.{key}={value!r} is not one of {', '.join(allowed)}")
    return str(value)


TP_PHASES = ("fwd", "bwd")
FP8_CAST_BYTES = 2.0
"""quantized copies per parameter (times the dtype's bytes): Transformer Engine keeps the fp8 cast of each weight
and its transpose (Hopper's fp8 GEMMs need both layouts) between micro-batches of a step
(transformer_engine/pytorch/module/linear.py, the ``is_first_microbatch`` weight caching that
megatron/core/extensions/transformer_engine.py TELinear.forward drives); with fp8 weights kept
(--fp8-param-gather) only the transpose."""


def _phases(stack: StackProfile, where: str) -> tuple[str, ...]:
    """``comm.tp_overlap_phases``: a list of ``fwd`` / ``bwd`` (default both)."""
    value = _value(stack, "comm", "tp_overlap_phases", list(TP_PHASES))
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v in TP_PHASES for v in value):
        raise InputError(f"{where}: comm.tp_overlap_phases={value!r} must be a list of fwd, bwd")
    return tuple(p for p in TP_PHASES if p in value)


def _exposed_share(stack: StackProfile, where: str) -> dict[str, dict[str, float | None]]:
    """``comm.tp_overlap_exposed_share``: {phase: {collective: share in [0, 1] or "1/tp"}}."""
    value = _value(stack, "comm", "tp_overlap_exposed_share", {})
    ops = ("all_gather", "reduce_scatter", "all_reduce")
    out: dict[str, dict[str, float | None]] = {}
    ok = isinstance(value, Mapping) and set(value) <= set(TP_PHASES)
    for phase, row in (value.items() if ok else ()):
        if not isinstance(row, Mapping) or not set(row) <= set(ops):
            ok = False
            break
        out[phase] = {}
        for op, share in row.items():
            if share == "1/tp":
                out[phase][op] = None
            elif not isinstance(share, bool) and isinstance(share, (int, float)) and 0.0 <= share <= 1.0:
                out[phase][op] = float(share)
            else:
                ok = False
    if not ok:
        raise InputError(f"{where}: comm.tp_overlap_exposed_share={value!r} must map fwd / bwd to "
                         "{all_gather|reduce_scatter|all_reduce: a share in [0, 1] or 1/tp}")
    return out


def _comm_sms(stack: StackProfile, where: str) -> dict[str, dict[str, float]]:
    """``comm.tp_overlap_comm_sms``: {phase: {collective: SMs >= 0}}."""
    value = _value(stack, "comm", "tp_overlap_comm_sms", {})
    ops = ("all_gather", "reduce_scatter", "all_reduce")
    ok = isinstance(value, Mapping) and set(value) <= set(TP_PHASES)
    out: dict[str, dict[str, float]] = {}
    for phase, row in (value.items() if ok else ()):
        if not isinstance(row, Mapping) or not set(row) <= set(ops) or not all(
                not isinstance(v, bool) and isinstance(v, (int, float)) and 0.0 <= v <= 1024 for v in row.values()):
            ok = False
            break
        out[phase] = {op: float(v) for op, v in row.items()}
    if not ok:
        raise InputError(f"{where}: comm.tp_overlap_comm_sms={value!r} must map fwd / bwd to "
                         "{all_gather|reduce_scatter|all_reduce: SMs, a number in [0, 1024]}")
    return out


def _fp8_cast(stack: StackProfile, where: str) -> tuple[float, float, float]:
    value = _value(stack, "compute", "fp8_cast_bytes_per_element", {"forward": 0.0, "backward": 0.0})
    ok = isinstance(value, Mapping) and {"forward", "backward"} <= set(value) <= {
        "forward", "backward", "backward_input"} and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v <= 64 for v in value.values())
    if not ok:
        raise InputError(f"{where}: compute.fp8_cast_bytes_per_element={value!r} must be {{forward: B, backward: B"
                         "[, backward_input: B]}} with bytes in [0, 64]")
    return float(value["forward"]), float(value["backward"]), float(value.get("backward_input", 0.0))


def _positive_or_none(stack: StackProfile, section: str, key: str, where: str) -> float | None:
    value = _value(stack, section, key, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0.0:
        raise InputError(f"{where}: {section}.{key}={value!r} must be a positive number")
    return float(value)


def _fraction_or_none(stack: StackProfile, section: str, key: str, where: str) -> float | None:
    value = _value(stack, section, key, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise InputError(f"{where}: {section}.{key}={value!r} must be a fraction in [0, 1]")
    return float(value)

