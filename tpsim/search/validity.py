"""Reasons a plan is rejected in a search: the plan rules of :data:`tpsim.plan.RULES` (one table, checked
vectorized by :func:`tpsim.plan.violation_codes`), ``stack`` (a valid plan the training stack cannot run: the
first broken rule of :data:`tpsim.stacks.RULES`, counted per rule by :func:`stack_rule_counts`) and two
reasons of the planner's own after estimation: ``memory`` (does not fit the device) and ``mem-limit`` (over
``--mem-limit-gib``).

:func:`violations` returns, per plan, the index into :data:`REASONS` of the first broken rule (0 = valid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import ModelSpec
from ..plan import RULES, PlanBatch, violation_codes
from ..stacks import StackProfile, count_violations


@dataclass(frozen=True)
class Reason:
    key: str
    """short identifier used in JSON (``rejected``) and tests."""
    kind: str
    """"divisibility", "structure" or "memory"."""
    text: str
    """what the constraint says, for ``--why``."""


REASONS: tuple[Reason, ...] = (
    (Reason("valid", "", "valid"),)
    + tuple(Reason(rule.key, rule.kind, rule.text) for rule in RULES)
    + (Reason("stack", "stack", "the training stack cannot run it (--stack; rules in tpsim/data/stacks)"),
       Reason("memory", "memory", "does not fit in the device memory"),
       Reason("mem-limit", "memory", "peak memory above --mem-limit-gib"),
       Reason("headroom", "memory", "fits, but leaves less free device memory than the planner's headroom "
              "(tpsim/data/memory.yaml planner_headroom_fraction)"))
)
REASON_INDEX = {r.key: i for i, r in enumerate(REASONS)}
STACK = REASON_INDEX["stack"]
MEMORY = REASON_INDEX["memory"]
MEM_LIMIT = REASON_INDEX["mem-limit"]
HEADROOM = REASON_INDEX["headroom"]


def violations(model: ModelSpec, batch: PlanBatch, num_gpus: int | None = None,
               stack: StackProfile | None = None) -> np.ndarray:
    """Per plan, the index into :data:`REASONS` of the first broken constraint (0 = valid); int8 array. Plans
    valid by the plan rules that ``stack`` (default megatron) cannot run get :data:`STACK`."""
    codes = violation_codes(model, batch, num_gpus, RULES)
    ok = np.flatnonzero(codes == 0)
    if ok.size:
        refused = stack_codes(model, batch.take(ok), stack) > 0
        codes[ok[refused]] = STACK
    return codes


def stack_codes(model: ModelSpec, batch: PlanBatch, stack: StackProfile | None = None) -> np.ndarray:
    """Per plan, 1 + the index of the first stack rule broken (0: the stack runs it)."""
    from ..stacks import load_stack

    return (stack or load_stack()).violation_codes(batch, model)


def stack_rule_counts(model: ModelSpec, batch: PlanBatch, codes: np.ndarray,
                      stack: StackProfile | None = None) -> dict[str, int]:
    """{stack rule key: count} of the plans of ``batch`` rejected with reason ``stack``."""
    refused = np.flatnonzero(codes == STACK)
    if not refused.size:
        return {}
    return count_violations(stack_codes(model, batch.take(refused), stack))


def count_reasons(codes: np.ndarray) -> dict[str, int]:
    """{reason key: count} for the non-zero codes, in :data:`REASONS` order."""
    counts = np.bincount(codes.astype(np.int64), minlength=len(REASONS))
    return {REASONS[i].key: int(c) for i, c in enumerate(counts) if i and c}


def reasons_from_counts(counts: np.ndarray) -> dict[str, int]:
    """{reason key: count} from counts per code (index 0 = valid), in :data:`REASONS` order."""
    return {REASONS[i].key: int(c) for i, c in enumerate(counts) if i and c}


def describe(key: str) -> Reason:
    return REASONS[REASON_INDEX[key]]
