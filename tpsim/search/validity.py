"""Vectorized plan validity: the constraints of :func:`tpsim.plan.plan_violation`, over a whole PlanBatch.

:func:`violations` returns, per plan, the code of the *first* constraint it breaks (0 = valid), checking the
constraints in the same order as ``plan_violation`` so both name the same reason for every plan (a test
checks this on a whole space). The codes index :data:`REASONS`. After estimation the planner adds two more
reasons of its own: ``memory`` (does not fit the device) and ``mem-limit`` (over ``--mem-limit-gib``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import ModelSpec
from ..plan import PlanBatch


@dataclass(frozen=True)
class Reason:
    key: str
    """short identifier used in JSON (``rejected``) and tests."""
    kind: str
    """"divisibility", "structure" or "memory"."""
    text: str
    """what the constraint says, for ``--why``."""


REASONS: tuple[Reason, ...] = (
    Reason("valid", "", "valid"),
    Reason("gpus", "divisibility", "tp x pp x dp differs from the GPU count"),
    Reason("tp-heads", "divisibility", "tp does not divide the attention heads"),
    Reason("tp-kv-heads", "divisibility", "tp does not divide the key/value heads (kv heads >= tp)"),
    Reason("tp-ffn", "divisibility", "tp does not divide the FFN hidden size"),
    Reason("sp-needs-tp", "structure", "sequence parallelism needs tp > 1"),
    Reason("sp-seq", "divisibility", "tp does not divide the sequence length (sequence parallelism)"),
    Reason("vpp-needs-pp", "structure", "interleaving (vpp > 1) needs pp > 1"),
    Reason("layers", "divisibility", "pp x vpp exceeds the number of layers"),
    Reason("batch", "divisibility", "global batch is not a multiple of micro-batch x dp"),
    Reason("interleave-microbatches", "divisibility",
           "interleaved schedule needs the micro-batch count divisible by pp"),
    Reason("zero-needs-dp", "structure", "ZeRO needs dp > 1"),
    Reason("memory", "memory", "does not fit in the device memory"),
    Reason("mem-limit", "memory", "peak memory above --mem-limit-gib"),
)
REASON_INDEX = {r.key: i for i, r in enumerate(REASONS)}
MEMORY = REASON_INDEX["memory"]
MEM_LIMIT = REASON_INDEX["mem-limit"]


def violations(model: ModelSpec, batch: PlanBatch, num_gpus: int | None = None) -> np.ndarray:
    """Per plan, the index into :data:`REASONS` of the first broken constraint (0 = valid); int8 array."""
    tp, pp, vpp, dp = batch.tp, batch.pp, batch.vpp, batch.dp
    per_step = batch.micro_batch * dp
    micro = batch.global_batch // per_step
    gpus_bad = (tp * pp * dp != num_gpus) if num_gpus is not None else np.zeros(len(batch), dtype=bool)
    checks = (  # same order as tpsim.plan.plan_violation
        gpus_bad,
        model.num_attention_heads % tp != 0,
        (model.num_kv_heads >= tp) & (model.num_kv_heads % tp != 0),
        model.ffn_hidden_size % tp != 0,
        batch.sp & (tp == 1),
        batch.sp & (model.seq_len % tp != 0),
        (vpp > 1) & (pp == 1),
        pp * vpp > model.num_layers,
        batch.global_batch % per_step != 0,
        (vpp > 1) & (micro % pp != 0),
        (batch.zero > 0) & (dp == 1),
    )
    code = np.zeros(len(batch), dtype=np.int8)
    for i in range(len(checks), 0, -1):  # the first failing check wins: assign in reverse
        code[checks[i - 1]] = i
    return code


def count_reasons(codes: np.ndarray) -> dict[str, int]:
    """{reason key: count} for the non-zero codes, in :data:`REASONS` order."""
    counts = np.bincount(codes.astype(np.int64), minlength=len(REASONS))
    return {REASONS[i].key: int(c) for i, c in enumerate(counts) if i and c}


def describe(key: str) -> Reason:
    return REASONS[REASON_INDEX[key]]
