"""Framework overhead: the per-layer host time of the eager runtime that kernel and collective times miss.

DTensor dispatches every operation on a DTensor through Python (sharding propagation, redistribution,
autograd wrappers): on this CPU about 4-6 ms per layer forward and 6-8 ms backward at tp=2, whatever the
shapes, against ~0.5 ms for the plain block. On a GPU it hides behind queued kernels; on a CPU it adds to
the time. It is measured like the collective constants, by a short run before the validated shapes: the same
block (family, tp, sp, fused) at a tiny shape where kernels and transfers take almost nothing; the overhead
is what the run took beyond the estimator's prediction for that tiny shape, never negative. It is then added,
as one constant per configuration, to the prediction of every validated shape, and reported separately.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..model import with_overrides
from .block.case import Case
from .block.predict import Prediction
from .block.report import phase_times

TINY_HEAD_DIM = 32
TINY_SEQ_PER_RANK = 8
TINY_REPS = 15
TINY_WARMUP = 3


def overhead_case(case: Case) -> Case:
    """The tiny twin of ``case``: same family, tp, sp, fused and GQA shape; 2 heads per rank of dim 32,
    8 tokens per rank, one sequence."""
    m, tp = case.model, case.tp
    heads = 2 * tp
    gqa = m.num_kv_heads < m.num_attention_heads
    kv = tp if gqa else heads
    hidden = heads * TINY_HEAD_DIM
    ffn = 4 * hidden if m.family == "gpt" else 3 * hidden
    model = with_overrides(dataclasses.replace(m, name=f"{m.name}-overhead"), hidden=hidden, heads=heads,
                           kv_heads=kv, ffn=ffn, seq_len=TINY_SEQ_PER_RANK * tp)
    return dataclasses.replace(case, model=model, micro_batch=1, reps=TINY_REPS, warmup=TINY_WARMUP, scaled="")


def measured_overhead(ranks: list[dict[str, Any]], tiny_pred: Prediction) -> dict[str, float]:
    """{"fwd": s, "bwd": s}: the tiny run's time beyond its prediction (>= 0)."""
    measured, _wall = phase_times(ranks)
    return {"fwd": max(measured["fwd"] - tiny_pred.fwd_s, 0.0),
            "bwd": max(measured["bwd"] - tiny_pred.bwd_s, 0.0)}


def with_overhead(pred: Prediction, overhead: dict[str, float]) -> Prediction:
    return dataclasses.replace(pred, fwd_s=pred.fwd_s + overhead["fwd"], bwd_s=pred.bwd_s + overhead["bwd"])


def plan_overhead_case(case):  # noqa: ANN001, ANN201 - PlanCase (import cycle)
    """The tiny twin of a whole-plan case: the same axes, ZeRO stage, schedule, layers and micro-batches, the
    tiny widths of :func:`overhead_case` (2 heads per TP rank of dim 32, 8 tokens per TP rank, one sequence)."""
    tiny_block = overhead_case(case.block_case())
    return dataclasses.replace(case, model=with_overrides(tiny_block.model, layers=case.model.num_layers),
                               micro_batch=1, reps=max(case.reps, TINY_REPS // 3), warmup=max(case.warmup, 1),
                               scaled="")


def plan_overhead(measured: dict[str, float], predicted: dict[str, float]) -> dict[str, float]:
    """Framework overhead from a tiny twin's phases (measured and predicted without overhead, as
    :func:`tpsim.validate.plan.report.summarize_plan` names them): per layer and micro-batch for ``fwd`` and
    ``bwd``, per step for ``opt`` and ``other``; never negative."""
    return {"fwd": max(measured["fwd"] - predicted["fwd"], 0.0), "bwd": max(measured["bwd"] - predicted["bwd"], 0.0),
            "opt": max(measured["step:optimizer"] - predicted["step:optimizer"], 0.0),
            "other": max(measured["step:other"] - predicted["step:other"], 0.0)}
