"""Why a search found no plan (issue 13: an empty result is an error with a reason, not "no plan fits").

Two ways a search ends empty:

* the constraints leave nothing to enumerate (:func:`space_conflict`): a requested tp that does not divide
  the GPU count, ``--max-tp`` below every requested tp, pipeline sizes that do not divide what is left;
* every enumerated plan is rejected (:func:`rejection_reason`): the planner's rejection counts name the
  constraints, most frequent first, and for memory the smallest peak any plan needed.

:func:`check_space` refuses a space that would take over a minute at the measured rate (:data:`tpsim.limits.MAX_PLANS`)
before anything is built.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import InputError
from ..limits import MAX_PLANS, MAX_SEARCH_S, PLAN_SEARCH_RATE
from ..model import ModelSpec
from .space import SearchSpace, divisors, space_size
from .validity import REASONS


def _values(values: Sequence[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return shown + (f" (and {len(values) - 8} more)" if len(values) > 8 else "")


def space_conflict(model: ModelSpec, num_gpus: int, space: SearchSpace) -> str | None:
    """The constraint that leaves no (tp, pp) layout for ``num_gpus`` GPUs, or None if some layout remains."""
    tps = space.tp_candidates(num_gpus)
    if not tps:
        if space.tp is not None:
            bad = sorted(t for t in set(space.tp) if num_gpus % t)
            if bad and len(bad) == len(set(space.tp)):
                verb = "divides" if len(bad) == 1 else "divide"
                return (f"--tp {_values(bad)}: none {verb} the {num_gpus} GPUs (tp must divide the GPU count; "
                        f"divisors: {_values(divisors(num_gpus))})")
        return f"--max-tp {space.max_tp} excludes every tp of {_values(sorted(set(space.tp or divisors(num_gpus))))}"
    if any(space.pp_candidates(model, num_gpus, tp) for tp in tps):
        return None
    if space.pp is None:
        return f"no pipeline size fits: {model.num_layers} layers"
    rest = sorted({num_gpus // tp for tp in tps})
    return (f"--pp {_values(sorted(set(space.pp)))} does not divide the GPUs left after tensor parallelism "
            f"({' or '.join(map(str, rest))} = {num_gpus} GPUs / tp {_values(list(tps))})")


def check_space(model: ModelSpec, gpu_counts: Sequence[int], space: SearchSpace, allow_large: bool = False,
                global_batch: int | None = None, stack: Any = None) -> int:
    """Plans the space holds over ``gpu_counts``; refuses (before any plan is built) an empty space with the
    constraint that emptied it, and one above :data:`MAX_PLANS` unless ``allow_large``. A pruned space
    (mixture-of-experts default, :meth:`SearchSpace.prunes`) is counted as pruned when ``global_batch`` is
    given (``stack``: the training stack, None: megatron)."""
    conflicts = [space_conflict(model, n, space) for n in gpu_counts]
    if all(conflicts):
        raise InputError(conflicts[-1])
    total = sum(space_size(model, n, space, global_batch, stack) for n in gpu_counts)
    if total > MAX_PLANS and not allow_large:
        seconds = total / PLAN_SEARCH_RATE
        raise InputError(f"the search space holds {total:,} plans: about {_duration(seconds)} at the measured "
                         f"{PLAN_SEARCH_RATE:,} plans/s, above the {MAX_SEARCH_S:.0f} s searched without "
                         "--allow-large-space; narrow it (--tp, --pp, --micro-batch, --zero, ...) or pass that flag")
    return total


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rejection_reason(result: Any) -> str:
    """One line: why every enumerated plan of an empty search result was rejected."""
    total = int(result.enumerated)
    rows = result.why()
    if not rows:
        return f"no plan among the {total:,} enumerated"
    parts = []
    for key, text, count in rows[:3]:
        parts.append(f"{count:,} {text} ({key})")
    line = f"all {total:,} candidate plans were rejected: " + "; ".join(parts)
    keys = {key for key, _, _ in rows}
    if keys & {"memory", "mem-limit", "headroom"}:
        line += _memory_hint(result)
    return line


def _memory_hint(result: Any) -> str:
    cols = result.columns
    peak = np.asarray(cols.get("peak_memory_gib", []), dtype=float)
    if not peak.size or not np.isfinite(peak).any():
        return ""
    smallest = float(np.nanmin(peak))
    limit = (f"--mem-limit-gib {result.mem_limit_gib:g}" if result.mem_limit_gib
             else "the device memory less the planner's headroom")
    return (f". The smallest plan needs {smallest:.1f} GiB per GPU, over {limit}: try more GPUs, "
            "recomputation, ZeRO, or --include-unfit to rank them anyway")


def check_found(result: Any) -> None:
    """Raise InputError with the reason when a search ranked no plan."""
    if len(result) == 0:
        raise InputError(rejection_reason(result))


__all__ = ["space_conflict", "check_space", "rejection_reason", "check_found", "REASONS"]
