"""Whole-run figures of a design's best plan: time to train the token budget, goodput, GPU-hours, cost and
energy. One function, :func:`train_figures`, that every row of the design table goes through; it is the model
of ``tpsim train-time`` (:func:`tpsim.train.model.whole_run`: interruptions, checkpoints, restarts,
stragglers of the fleet's reliability, tpsim/data/reliability.yaml) with the design's GPU-hour price and
board power (the ``power_w`` axis, else the device's ``power_limit_w``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

DAY = 86400.0


def train_figures(*, tokens: float, tokens_per_step: float, step_s: float, gpus: int, gpus_per_node: int,
                  weights_gib: float, optimizer_gib: float, dp: int, cp: int, zero: int, device: str,
                  gpu_hour_price: float, power_w: float | None, reliability: Any = None) -> dict[str, Any]:
    """``ideal_days`` (step time x steps), ``expected_days`` (with the fleet's interruptions), ``goodput``,
    ``gpu_hours``, ``cost_usd`` (GPU-hours of the expected wall time x price), ``energy_mwh`` (None without a
    power figure)."""
    from ..train.model import checkpoint_bytes_per_rank, watts_per_gpu, whole_run
    from ..train.reliability import Reliability, load_reliability

    rel = reliability if isinstance(reliability, Reliability) else load_reliability(reliability)
    watts = watts_per_gpu(rel, SimpleNamespace(name=device, power_limit_w=power_w))
    ckpt = checkpoint_bytes_per_rank(weights_gib, optimizer_gib, dp, cp, zero)
    f = whole_run(rel, step_s=step_s, tokens_per_step=tokens_per_step, tokens=tokens, ckpt_bytes=ckpt, gpus=gpus,
                  gpus_per_node=gpus_per_node, watts_per_gpu=watts, gpu_hour_price=gpu_hour_price)
    out = {k: float(f[k]) for k in ("goodput", "gpu_hours", "cost_usd", "energy_mwh")}
    out["ideal_days"] = float(f["ideal_s"]) / DAY
    out["expected_days"] = float(f["wall_s"]) / DAY
    for k, v in out.items():
        if not math.isfinite(v):
            out[k] = None
    return out
