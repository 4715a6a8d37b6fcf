"""Scale a validation case down to what this machine can run (torch-free).

The model's own per-shard shapes are used where they fit; otherwise the sequence is shortened (halved, down
to ``MIN_SEQ``), then the micro-batch reduced to 1. The hidden, head and FFN widths (hence every GEMM's n and
k) are never changed, so the per-shard kernel shapes stay the model's. The case records what was reduced.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, TypeVar

import numpy as np

from ...errors import InputError
from ...model import with_overrides
from .case import FP32_BYTES, Case
from .predict import block_gemms

C = TypeVar("C")  # a validation case (Case, PlanCase, AxisCase): a frozen dataclass with model, micro_batch, scaled

MIN_SEQ = 128
"""shortest sequence a case is scaled down to."""
MEMORY_SHARE = 0.5
"""share of the machine's available memory the ranks may use together."""
ACT_PER_TOKEN_HIDDEN = 24
"""activation elements kept for backward per token and per hidden unit (norms, q/k/v, attention output,
residuals; Korthikanti et al. 2022's 34 sbh / 2 bytes is ~17 16-bit words, rounded up for the fp32
reference copy and autograd temporaries)."""
ACT_PER_TOKEN_FFN = 4
"""activation elements kept per token and per FFN unit (pre- and post-activation, gate and up)."""


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (:func:`tpsim.limits.available_memory`; the physical memory if
    unreadable)."""
    from ...limits import available_memory as meminfo

    return meminfo() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_limit(memory_bytes: int | None, nproc: int) -> float:
    """Bytes one of ``nproc`` ranks may use: :data:`MEMORY_SHARE` of ``memory_bytes`` (default: this machine's
    available memory) split evenly."""
    return MEMORY_SHARE * (memory_bytes or available_memory()) / nproc


def activation_elements(tokens: int, hidden: int, ffn: int) -> int:
    """Activation elements one layer keeps for backward on ``tokens`` tokens (:data:`ACT_PER_TOKEN_HIDDEN`,
    :data:`ACT_PER_TOKEN_FFN`)."""
    return tokens * (ACT_PER_TOKEN_HIDDEN * hidden + ACT_PER_TOKEN_FFN * ffn)


def shrink(case: C, step: int, too_big: Callable[[C], bool]) -> C:
    """``case`` with the sequence halved (down to :data:`MIN_SEQ`, a multiple of ``step``), then the micro-batch
    reduced to 1, while ``too_big(case)``; the smallest shape if it never fits (the caller says whether to run
    it)."""
    while too_big(case):
        m = case.model
        half = m.seq_len // 2
        if half >= MIN_SEQ and half % step == 0:
            case = dataclasses.replace(case, model=with_overrides(m, seq_len=half))
        elif case.micro_batch > 1:
            case = dataclasses.replace(case, micro_batch=1)
        else:
            break
    return case


def check_memory(need: float, limit: float, what: str, seq_len: int, hint: str) -> None:
    """Refuse a fitted case that needs more than ``limit`` bytes per rank (only one :func:`shrink` left at
    its smallest shape can)."""
    if need > limit:
        raise InputError(f"a {what} needs {need / 2**30:.1f} GiB per rank even at seq_len={seq_len}, "
                         f"micro_batch=1 ({limit / 2**30:.1f} GiB available per rank); give {hint}")


def mark_scaled(original: C, fitted: C, keep: bool = False) -> C:
    """``fitted`` with what :func:`shrink` reduced from ``original`` in ``scaled`` (after what ``scaled``
    already says if ``keep``); ``fitted`` as it is when nothing was reduced."""
    if fitted == original:
        return fitted
    changes = []
    if fitted.model.seq_len != original.model.seq_len:
        changes.append(f"seq_len {original.model.seq_len}->{fitted.model.seq_len}")
    if fitted.micro_batch != original.micro_batch:
        changes.append(f"micro_batch {original.micro_batch}->{fitted.micro_batch}")
    note = "; ".join(changes) + " (to fit this machine; widths unchanged)"
    return dataclasses.replace(fitted, scaled="; ".join(p for p in (fitted.scaled, note) if p) if keep else note)


def memory_per_rank(case: Case) -> float:
    """Bytes one rank needs: the unsharded reference (weights + gradients + activations, for the numerics
    check) and the sharded copy, fp32."""
    m = case.model
    params = m.layer_params()
    act = activation_elements(case.tokens, m.hidden_size, m.ffn_hidden_size)
    return FP32_BYTES * (2 * params * (1 + 1 / case.tp) + act * (1 + 1 / case.tp))


def gemm_seconds(case: Case, compute) -> tuple[float, float]:  # noqa: ANN001 - ComputeModel
    """Predicted GEMM seconds of one fwd+bwd of the unsharded reference block and of ``case``'s sharded block."""
    full = dataclasses.replace(case, tp=1, sp=False) if case.tp > 1 else case
    per_iter = []
    for c in (full, case):
        m, n, k = (np.asarray(v, dtype=float) for v in zip(*block_gemms(c)))
        t, _ = compute.gemm(m, n, k, "fp32")
        per_iter.append(float(np.sum(t)))
    return per_iter[0], per_iter[1]


def time_of_case(case: Case, compute) -> float:  # noqa: ANN001 - ComputeModel
    """Predicted seconds of a whole case on one rank: GEMMs of the reference fwd+bwd once and of the
    sharded block (1 check + warmup + 2 x reps timed iterations)."""
    reference, sharded = gemm_seconds(case, compute)
    return reference + sharded * (1 + case.warmup + 2 * case.reps)


def fit_case(case: Case, nproc: int, compute, budget_s: float,  # noqa: ANN001
             memory_bytes: int | None = None) -> Case:
    """``case`` with seq_len and micro_batch reduced until it fits in memory and in ``budget_s``.

    ``memory_bytes``: what the ``nproc`` ranks share (GPU: their devices' usable memory; default: this
    machine's available memory)."""
    limit = memory_limit(memory_bytes, nproc)
    fitted = shrink(case, case.tp, lambda c: memory_per_rank(c) > limit or time_of_case(c, compute) > budget_s)
    # at the smallest shape memory refuses a case; over the time budget it runs anyway
    check_memory(memory_per_rank(fitted), limit, f"{fitted.model.name} layer", fitted.model.seq_len,
                 "smaller --hidden/--ffn")
    return mark_scaled(case, fitted)


MAX_OVER_BUDGET = 10.0
"""a whole-plan case still predicted over this many times --budget at its smallest shape is refused (layers and
micro-batches are the user's to reduce)."""
STEPS_CHECKED = 3
"""training steps of a plan case's check (numerics, bucket settling, communication)."""


def plan_memory_per_rank(case) -> float:  # noqa: ANN001 - PlanCase (import cycle)
    """Bytes one rank needs for a whole-plan case: the unsharded reference stack (weights, gradients, Adam's
    two moments; one micro-batch's activations per layer) and the rank's own layers (the same, sharded)."""
    block = case.block_case()
    m = case.model
    act = activation_elements(block.tokens, m.hidden_size, m.ffn_hidden_size)
    params = m.layer_params()
    ref = m.num_layers * (4 * params + act)
    own = case.layers_per_rank * (4 * params / case.tp + case.microbatches * act / case.tp)
    batch = 2 * case.dp * case.microbatches * block.tokens * m.hidden_size  # global input and target
    return FP32_BYTES * (ref + own + batch)


def layers_that_fit(make: Callable[[int], C], max_per_chunk: int, limit: float) -> int:
    """The most layers per model chunk, at most ``max_per_chunk``, whose whole-plan case ``make(n)`` needs no
    more than ``limit`` bytes per rank (:func:`plan_memory_per_rank`); at least 1 (the fit then shortens the
    sequence). The full-size validation on GPUs: the plan's own widths, as many of its layers as fit."""
    for n in range(max(1, max_per_chunk), 0, -1):
        if plan_memory_per_rank(make(n)) <= limit:
            return n
    return 1


def plan_time_of_case(case, compute) -> float:  # noqa: ANN001
    """Predicted seconds of a whole-plan case on one rank: the reference on the global batch, then the
    checked, warm-up and timed steps (twice ``reps``: time, then the collectives)."""
    full_layer, own_layer = gemm_seconds(case.block_case(), compute)
    reference = full_layer * case.model.num_layers * case.dp * case.microbatches
    steps = STEPS_CHECKED + (case.warmup + 2 * case.reps if case.timed else 0)
    return reference + own_layer * case.layers_per_rank * case.microbatches * steps


def fit_plan_case(case, nproc: int, compute, budget_s: float,  # noqa: ANN001
                  memory_bytes: int | None = None):  # noqa: ANN201 - PlanCase
    """``case`` with seq_len, then micro_batch, reduced until it fits in memory and ``budget_s`` (widths,
    layers, axes and micro-batch count unchanged)."""
    limit = memory_limit(memory_bytes, nproc)
    fitted = shrink(case, case.tp,
                    lambda c: plan_memory_per_rank(c) > limit or plan_time_of_case(c, compute) > budget_s)
    m = fitted.model
    check_memory(plan_memory_per_rank(fitted), limit, f"{m.num_layers}-layer {m.name} stack", m.seq_len,
                 "smaller --hidden/--ffn or fewer --layers-per-chunk")
    predicted = plan_time_of_case(fitted, compute)
    if predicted > MAX_OVER_BUDGET * budget_s:
        raise InputError(f"a {m.num_layers}-layer {m.name} stack with microbatches={fitted.microbatches} "
                         f"would run ~{predicted:.0f} s per rank even at seq_len={m.seq_len}, micro_batch=1 "
                         f"(--budget={budget_s:g}); give fewer --microbatches or --layers-per-chunk")
    return mark_scaled(case, fitted, keep=True)
