"""Mixture-of-experts layer cost on one rank (vectorized over plans): router, token permutation, the grouped
GEMMs of the local experts, shared experts; parameters and stored activations.

Megatron-Core ``MoELayer`` with the ``alltoall`` token dispatcher: a rank routes its N tokens (its context-
parallel share, split over tp by sequence parallelism), permutes the top-k copies, all-to-alls them over the ep
group (and all-gathers over the expert-tp group), runs its E / ep local experts as one grouped GEMM on the
received copies with weights split over etp, and reverses the path. The collectives are
:func:`tpsim.comm_plan.moe_collectives`; this module holds the compute and memory.

**Load imbalance** (:func:`load_imbalance`): the combine all-to-all waits for the busiest rank of the ep group,
so its routed tokens set the expert time and the exchanged bytes. Its load over the balanced one is
``1 + MaxVio / (E / ep) + sqrt(2 ln(ep) / (N k etp))``: the most loaded expert (``max_violation`` of
``tpsim/data/moe.yaml``: the measured global maximum violation of the router's balancing method) shares the rank
with average ones, and the sampling spread of one micro-batch's routing adds the expected maximum of ep Poisson
counts of mean ``N k etp`` (Gaussian tail). With a capacity factor the excess is dropped, so the load is at most
the capacity. ep = 1 holds every expert: no imbalance between ranks. The model's ``moe_balance`` (docs/SCHEMAS.md
T2) chooses: ``aux`` this measured imbalance, ``forced`` none (1), a number F the busiest expert at F x the
mean: ``1 + (F - 1) / (E / ep)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..compute.base import ComputeModel
from ..hardware import is_low_precision
from ..model import ModelSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "moe.yaml"


@dataclass(frozen=True)
class MoeConstants:
    """``tpsim/data/moe.yaml``."""

    max_violation: dict
    """balancing method ("aux_loss", "loss_free") -> measured MaxVio_global."""
    loss_free_architectures: tuple[str, ...]


@lru_cache(maxsize=1)
def moe_constants() -> MoeConstants:
    from ..safeyaml import load_data

    raw = load_data(DATA)
    return MoeConstants(max_violation={k: float(v["value"]) for k, v in raw["max_violation"].items()},
                        loss_free_architectures=tuple(raw["loss_free_architectures"]["value"]))


def max_violation(model: ModelSpec) -> float:
    """Measured maximum expert-load violation of the model's router balancing (loss-free for DeepSeek-V3,
    auxiliary loss otherwise)."""
    k = moe_constants()
    method = "loss_free" if model.architecture in k.loss_free_architectures else "aux_loss"
    return k.max_violation[method]


def load_imbalance(model: ModelSpec, *, ep: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """Busiest rank's routed copies over the balanced count (>= 1); ``routed`` = copies one rank's experts
    receive when balanced (N k etp). See the module docstring."""
    e = np.asarray(ep, dtype=float)
    local = model.num_experts / e
    balance = model.moe_balance
    if balance == "forced":  # force-balanced routing (benchmarks): every rank gets the mean
        return np.ones(np.shape(e))
    if balance == "aux":  # the router's own balancing: measured MaxVio plus one micro-batch's sampling spread
        sampling = np.sqrt(2.0 * np.log(np.maximum(e, 1.0)) / np.maximum(routed, 1.0))
        factor = np.where(e > 1, 1.0 + max_violation(model) / local + sampling, 1.0)
    else:  # the busiest expert at `balance` x the mean, the rank's other experts at the mean
        factor = np.where(e > 1, 1.0 + (float(balance) - 1.0) / local, 1.0)
    if model.capacity_factor:
        factor = np.minimum(factor, model.capacity_factor)
    return factor


@dataclass(frozen=True)
class ExpertShape:
    """Per rank and micro-batch, arrays over plans."""

    tokens: np.ndarray
    """N: tokens the rank routes."""
    local_experts: np.ndarray
    """E / ep."""
    ffn_local: np.ndarray
    """expert FFN width on the rank: moe_ffn_hidden_size / etp."""
    copies: np.ndarray
    """token copies the rank's experts process (busiest rank: balanced N k etp times the imbalance)."""
    imbalance: np.ndarray


def expert_shape(model: ModelSpec, *, tokens_total: np.ndarray, tp: np.ndarray, sp: np.ndarray, ep: np.ndarray,
                 etp: np.ndarray) -> ExpertShape:
    """Shapes of the local expert work; ``tokens_total`` = b s / cp (the rank's context-parallel tokens)."""
    t = tp.astype(float)
    n = tokens_total / np.where(sp, t, 1.0)
    et = etp.astype(float)
    balanced = n * model.experts_per_token * et
    imb = load_imbalance(model, ep=ep, routed=balanced)
    return ExpertShape(tokens=n, local_experts=model.num_experts / ep.astype(float),
                       ffn_local=model.moe_ffn_hidden_size / et, copies=balanced * imb, imbalance=imb)


def _grouped(acc_f, acc_b, compute: ComputeModel, m, n, k, groups, dtype: str, cast=None) -> None:
    """A grouped GEMM of ``groups`` experts, each (m x k) @ (k x n), forward and the two backward GEMMs. With
    low-precision GEMMs and ``cast`` (bytes per element, as the dense linears'), every
    expert's input (m x k) is cast (with its amax / scale) before the forward GEMM and its output gradient
    (m x n) before the backward ones: Transformer Engine's GroupedLinear casts each expert's slice of the
    permuted tokens with its own scaling factor (transformer_engine/pytorch/module/grouped_linear.py, one
    quantizer per GEMM), the traffic the dense linears pay per token (:func:`tpsim.estimator.layer._linear`)."""
    acc_f.add(compute.gemm(m, n, k, dtype, batch=groups))
    acc_b.add(compute.gemm(m, k, n, dtype, batch=groups))
    acc_b.add(compute.gemm(k, n, m, dtype, batch=groups))
    if cast is not None and is_low_precision(dtype):
        from .layer import streamed

        from ..compute.quantize import cast_traffic

        fwd_bytes, bwd_bytes = cast_traffic(cast, np.asarray(m, dtype=float) * groups, n, k)
        acc_f.add(streamed(compute, fwd_bytes, dtype))
        acc_b.add(streamed(compute, bwd_bytes, dtype))


def add_expert_compute(acc_f, acc_b, compute: ComputeModel, model: ModelSpec, shape: ExpertShape,
                       dtype: str, cast=None) -> None:
    """Router GEMM and softmax/top-k, token permutation and un-permutation, the local experts' grouped GEMMs
    and activation (accumulated into the forward / backward accumulators of :mod:`tpsim.estimator.layer`);
    ``cast``: the low-precision casts of each expert GEMM's input and output gradient (:func:`_grouped`)."""
    h = float(model.hidden_size)
    n, groups, f = shape.tokens, shape.local_experts, shape.ffn_local
    m = shape.copies / groups  # tokens per local expert
    acc_f.add(compute.gemm(n, float(model.num_experts), h, dtype))   # router logits
    acc_b.add(compute.gemm(n, h, float(model.num_experts), dtype))
    acc_b.add(compute.gemm(h, float(model.num_experts), n, dtype))
    acc_f.add(compute.memory("softmax", n * model.num_experts, "fp32", False))  # fp32 router scores, top-k
    acc_b.add(compute.memory("softmax", n * model.num_experts, "fp32", True))
    # permute before and un-permute after the experts: a gather of every copy's hidden vector (read + write),
    # on the kernel that moves 3 elements per element (residual_add), hence 2/3 of the element count
    moved = 2.0 * shape.copies * h * 2.0 / 3.0
    acc_f.add(compute.memory("residual_add", moved, dtype, False))
    acc_b.add(compute.memory("residual_add", moved, dtype, True))
    gated = model.gated
    _grouped(acc_f, acc_b, compute, m, f * (2 if gated else 1), h, groups, dtype, cast)
    act = "swiglu" if gated else "gelu"
    acc_f.add(compute.memory(act, shape.copies * f, dtype, False))
    acc_b.add(compute.memory(act, shape.copies * f, dtype, True))
    _grouped(acc_f, acc_b, compute, m, h, f, groups, dtype, cast)


def expert_params_local(model: ModelSpec, ep: np.ndarray, etp: np.ndarray) -> np.ndarray:
    """Routed-expert parameters of one MoE layer on one rank: E / ep experts, each split over etp."""
    n_in = 2.0 if model.gated else 1.0
    h, f = float(model.hidden_size), float(model.moe_ffn_hidden_size)
    per_expert = (n_in * h * f + f * h) / etp.astype(float)
    if model.linear_bias:
        per_expert = per_expert + n_in * f / etp.astype(float) + h
    return model.num_experts / ep.astype(float) * per_expert


def shared_params_local(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Shared experts (tensor-parallel like the dense MLP), their gate and the router (replicated)."""
    n_in = 2.0 if model.gated else 1.0
    h = float(model.hidden_size)
    fs = float(model.num_shared_experts * model.shared_expert_ffn_hidden_size) / tp.astype(float)
    shared = n_in * h * fs + fs * h
    if model.linear_bias and model.num_shared_experts:
        shared = shared + n_in * fs + h
    return shared + h * model.num_experts + (h if model.shared_expert_gate else 0.0)


def expert_activation_bytes(model: ModelSpec, shape: ExpertShape, e: float, *, linear_bytes: float | None = None,
                            act_recomputed: np.ndarray | bool = False) -> np.ndarray:
    """Stored activations of the routed experts on the busiest rank (bytes; ``e`` = bytes per 16-bit element
    / 2): the permuted input of each copy (h, the first GEMM's input), the first GEMM's output (2f gated, else
    f: the activation's input) and the activation output (f, the second GEMM's input), as the dense MLP's terms;
    the fp32 router scores and the routing map (N x E). ``linear_bytes``: bytes per cached GEMM input (fp8
    caching; default 16-bit). ``act_recomputed`` (Megatron-Core ``moe_act`` recomputation): the activation
    output is rebuilt in backward, and its input is then cached like a GEMM input (DeepSeek-V3 report section
    3.3.3: the SwiGLU inputs are cached in FP8 and its output recomputed)."""
    h = float(model.hidden_size)
    lb = 2.0 * e if linear_bytes is None else float(linear_bytes)
    f = shape.ffn_local
    width = (2.0 if model.gated else 1.0) * f
    per_copy = np.where(act_recomputed, lb * h + lb * width, lb * h + 2.0 * e * width + lb * f)
    return shape.copies * per_copy + shape.tokens * model.num_experts * (4.0 + 1.0)


def dispatch_buffer_bytes(model: ModelSpec, shape: ExpertShape, e: float) -> np.ndarray:
    """All-to-all send and receive buffers of one layer's dispatch (transient: one layer at a time)."""
    return 2.0 * shape.copies * model.hidden_size * 2 * e
