"""Scale a validation case down to what this machine can run (torch-free).

The model's own per-shard shapes are used where they fit; otherwise the sequence is shortened (halved, down
to ``MIN_SEQ``), then the micro-batch reduced to 1. The hidden, head and FFN widths (hence every GEMM's n and
k) are never changed, so the per-shard kernel shapes stay the model's. The case records what was reduced.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..errors import InputError
from ..model import with_overrides
from .case import FP32_BYTES, Case
from .predict import block_gemms

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
    """MemAvailable of /proc/meminfo in bytes (the physical memory if unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_per_rank(case: Case) -> float:
    """Bytes one rank needs: the unsharded reference (weights + gradients + activations, for the numerics
    check) and the sharded copy, fp32."""
    m = case.model
    params = m.layer_params()
    act = case.tokens * (ACT_PER_TOKEN_HIDDEN * m.hidden_size + ACT_PER_TOKEN_FFN * m.ffn_hidden_size)
    return FP32_BYTES * (2 * params * (1 + 1 / case.tp) + act * (1 + 1 / case.tp))


def time_of_case(case: Case, compute) -> float:  # noqa: ANN001 - ComputeModel
    """Predicted seconds of a whole case on one rank: GEMMs of the reference fwd+bwd once and of the
    sharded block (1 check + warmup + 2 x reps timed iterations)."""
    full = dataclasses.replace(case, tp=1, sp=False) if case.tp > 1 else case
    per_iter = []
    for c in (full, case):
        m, n, k = (np.asarray(v, dtype=float) for v in zip(*block_gemms(c)))
        t, _ = compute.gemm(m, n, k, "fp32")
        per_iter.append(float(np.sum(t)))
    return per_iter[0] + per_iter[1] * (1 + case.warmup + 2 * case.reps)


def fit_case(case: Case, nproc: int, compute, budget_s: float,  # noqa: ANN001
             memory_bytes: int | None = None) -> Case:
    """``case`` with seq_len and micro_batch reduced until it fits in memory and in ``budget_s``.

    ``memory_bytes``: what the ``nproc`` ranks share (GPU: their devices' usable memory; default: this
    machine's available memory)."""
    limit = MEMORY_SHARE * (memory_bytes or available_memory()) / nproc
    original = case
    while memory_per_rank(case) > limit or time_of_case(case, compute) > budget_s:
        m = case.model
        if m.seq_len // 2 >= MIN_SEQ and (m.seq_len // 2) % case.tp == 0:
            case = dataclasses.replace(case, model=with_overrides(m, seq_len=m.seq_len // 2))
        elif case.micro_batch > 1:
            case = dataclasses.replace(case, micro_batch=1)
        else:
            need = memory_per_rank(case)
            if need > limit:
                raise InputError(f"a {m.name} layer needs {need / 2**30:.1f} GiB per rank even at seq_len="
                                 f"{m.seq_len}, micro_batch=1 ({limit / 2**30:.1f} GiB available per rank); "
                                 "give smaller --hidden/--ffn")
            break  # over the time budget at the smallest shape: run it anyway
    if case == original:
        return case
    changes = []
    if case.model.seq_len != original.model.seq_len:
        changes.append(f"seq_len {original.model.seq_len}->{case.model.seq_len}")
    if case.micro_batch != original.micro_batch:
        changes.append(f"micro_batch {original.micro_batch}->{case.micro_batch}")
    return dataclasses.replace(case, scaled="; ".join(changes) + " (to fit this machine; widths unchanged)")


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
    act = block.tokens * (ACT_PER_TOKEN_HIDDEN * m.hidden_size + ACT_PER_TOKEN_FFN * m.ffn_hidden_size)
    params = m.layer_params()
    ref = m.num_layers * (4 * params + act)
    own = case.layers_per_rank * (4 * params / case.tp + case.microbatches * act / case.tp)
    batch = 2 * case.dp * case.microbatches * block.tokens * m.hidden_size  # global input and target
    return FP32_BYTES * (ref + own + batch)


def plan_time_of_case(case, compute) -> float:  # noqa: ANN001
    """Predicted seconds of a whole-plan case on one rank: the reference on the global batch, then the
    checked, warm-up and timed steps (twice ``reps``: time, then the collectives)."""
    block = case.block_case()
    full = dataclasses.replace(block, tp=1, sp=False) if block.tp > 1 else block
    per_layer = []
    for c in (full, block):
        m, n, k = (np.asarray(v, dtype=float) for v in zip(*block_gemms(c)))
        t, _ = compute.gemm(m, n, k, "fp32")
        per_layer.append(float(np.sum(t)))
    reference = per_layer[0] * case.model.num_layers * case.dp * case.microbatches
    steps = STEPS_CHECKED + (case.warmup + 2 * case.reps if case.timed else 0)
    return reference + per_layer[1] * case.layers_per_rank * case.microbatches * steps


def fit_plan_case(case, nproc: int, compute, budget_s: float,  # noqa: ANN001
                  memory_bytes: int | None = None):  # noqa: ANN201 - PlanCase
    """``case`` with seq_len, then micro_batch, reduced until it fits in memory and ``budget_s`` (widths,
    layers, axes and micro-batch count unchanged)."""
    limit = MEMORY_SHARE * (memory_bytes or available_memory()) / nproc
    original = case
    while plan_memory_per_rank(case) > limit or plan_time_of_case(case, compute) > budget_s:
        m = case.model
        if m.seq_len // 2 >= MIN_SEQ and (m.seq_len // 2) % case.tp == 0:
            case = dataclasses.replace(case, model=with_overrides(m, seq_len=m.seq_len // 2))
        elif case.micro_batch > 1:
            case = dataclasses.replace(case, micro_batch=1)
        else:
            need = plan_memory_per_rank(case)
            if need > limit:
                raise InputError(f"a {m.num_layers}-layer {m.name} stack needs {need / 2**30:.1f} GiB per rank even "
                                 f"at seq_len={m.seq_len}, micro_batch=1 ({limit / 2**30:.1f} GiB available per "
                                 "rank); give smaller --hidden/--ffn or fewer --layers-per-chunk")
            predicted = plan_time_of_case(case, compute)
            if predicted > MAX_OVER_BUDGET * budget_s:
                raise InputError(f"a {m.num_layers}-layer {m.name} stack with microbatches={case.microbatches} "
                                 f"would run ~{predicted:.0f} s per rank even at seq_len={m.seq_len}, micro_batch=1 "
                                 f"(--budget={budget_s:g}); give fewer --microbatches or --layers-per-chunk")
            break
    if case == original:
        return case
    changes = []
    if case.model.seq_len != original.model.seq_len:
        changes.append(f"seq_len {original.model.seq_len}->{case.model.seq_len}")
    if case.micro_batch != original.micro_batch:
        changes.append(f"micro_batch {original.micro_batch}->{case.micro_batch}")
    note = "; ".join(changes) + " (to fit this machine; widths unchanged)"
    return dataclasses.replace(case, scaled="; ".join(p for p in (case.scaled, note) if p))
