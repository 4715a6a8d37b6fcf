"""Whole-run figures of a design's best plan: time to train the token budget, GPU-hours, cost and energy.

One function, :func:`train_figures`, that every row of the design table goes through. Until ``tpsim
train-time`` (issue 23: goodput, failures, checkpoints; docs/SCHEMAS.md T8) is in main, the time is the ideal
one, step time x steps (no interruptions, restarts or checkpoints), and the cost GPU-hours x the GPU-hour price;
switching to the goodput model is a change of this function only.
"""

from __future__ import annotations

import math

SECONDS_PER_DAY = 86400.0


def train_figures(*, tokens: float, tokens_per_s: float, gpus: int, gpu_hour_price: float,
                  power_w: float | None) -> dict[str, float | None]:
    """``train_days``, ``gpu_hours``, ``cost_usd``, ``energy_mwh`` (GPU board power only, no PUE; None without
    a power figure) for ``tokens`` at ``tokens_per_s``."""
    seconds = tokens / tokens_per_s if tokens_per_s > 0 else math.inf
    gpu_hours = seconds * gpus / 3600.0
    return {"train_days": seconds / SECONDS_PER_DAY, "gpu_hours": gpu_hours,
            "cost_usd": gpu_hours * gpu_hour_price,
            "energy_mwh": None if power_w is None else gpu_hours * power_w / 1e6,
            "time_basis": "ideal: step time x steps (tpsim train-time not yet in main)"}
