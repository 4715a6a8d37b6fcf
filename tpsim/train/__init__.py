"""Time to train: the whole run of a plan (issue 23). torch-free; the planner and ``tpsim design`` call it.

:func:`train_time` turns a plan's estimate and a token budget into the ideal and expected days (with a band),
goodput, interruptions, checkpoint interval and cost, restart time, GPU-hours, cost and energy
(:class:`TrainTime`; ``to_dict()`` is the ``train_time`` object of ``--json``, docs/SCHEMAS.md T8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..limits import check_float
from .model import (DAY, checkpoint_bytes_per_rank, daly_optimum, expected_wall_time, watts_per_gpu, whole_run,
                    young_interval)
from .reliability import Component, Reliability, load_reliability

DEFAULT_GPU_HOUR_PRICE = 1.0
"""dollars per GPU-hour (the planner's default: cost then reads as GPU-hours)."""
from ..limits import FLOAT_LIMITS

MAX_TOKENS = FLOAT_LIMITS["tokens"]
"""largest token budget (tpsim/limits.py): beyond it a budget is a typo."""
LOST_KEYS = ("failures", "checkpoints", "restarts", "stragglers")


@dataclass(frozen=True, kw_only=True)
class TrainTime:
    """Whole-run figures of one plan (days unless named otherwise)."""

    tokens: float
    steps: int
    ideal_days: float
    expected_days: float
    expected_days_low: float
    expected_days_high: float
    goodput: float
    """ideal time / expected wall time (effective training time ratio)."""
    interruptions: float
    """expected interruptions of the whole run (planned + unexpected)."""
    interruptions_per_day: float
    unexpected_per_day: float
    mtbf_hours: float
    checkpoint_interval_s: float
    checkpoint_write_s: float
    """durable write of one checkpoint."""
    checkpoint_stall_s: float
    """training time lost per checkpoint (the write when sync, the host copy when async)."""
    checkpoint_mode: str
    checkpoint_gib_per_rank: float
    checkpoint_tb: float
    """bytes of one whole checkpoint (TB, 1e12)."""
    restart_s: float
    gpu_hours: float
    cost_usd: float
    gpu_hour_price: float
    energy_mwh: float | None
    lost: dict[str, float]
    """days lost to failures (redone work), checkpoints, restarts and stragglers."""
    reliability: str
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The ``train_time`` object of ``--json``: strict JSON (a figure that never finishes is null)."""
        out = {k: _finite(getattr(self, k)) for k in self.__dataclass_fields__}
        out["lost"] = {k: _finite(v) for k, v in self.lost.items()}
        out["warnings"] = list(self.warnings)
        return out


def check_tokens(tokens: Any, where: str = "--tokens") -> float:
    """A token budget: a finite number in [1, MAX_TOKENS], else one line."""
    return check_float("tokens", tokens, where, minimum=1.0, inclusive=True, maximum=MAX_TOKENS)


def train_time(model: Any, cluster: Any, plan: Any, estimate: Any, tokens: float,
               reliability: Reliability | str | None = None,
               gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE) -> TrainTime:
    """The whole run of ``plan`` (its ``estimate``, an :class:`tpsim.estimator.Estimate`) for ``tokens``
    tokens on ``cluster``, with the fleet ``reliability`` (a :class:`Reliability`, a shipped fleet's name or a
    YAML path; None: the default fleet)."""
    mem = estimate.memory_gib
    return train_time_of(model, cluster, plan, tokens, reliability, gpu_hour_price, step_s=estimate.step_time_s,
                         step_low=estimate.step_time_s_low, step_high=estimate.step_time_s_high,
                         weights_gib=mem["weights"], optimizer_gib=mem["optimizer_states"])


def train_time_of(model: Any, cluster: Any, plan: Any, tokens: float, reliability: Reliability | str | None,
                  gpu_hour_price: float, *, step_s: float, step_low: float, step_high: float, weights_gib: float,
                  optimizer_gib: float) -> TrainTime:
    """:func:`train_time` from the estimate's figures (the planner passes its columns)."""
    tokens = check_tokens(tokens)
    price = check_float("gpu_hour_price", gpu_hour_price, "--gpu-hour-price", maximum=1e6)
    rel = reliability if isinstance(reliability, Reliability) else load_reliability(reliability)
    ckpt = checkpoint_bytes_per_rank(weights_gib, optimizer_gib, plan.dp, plan.cp, plan.zero)
    watts = watts_per_gpu(rel, cluster.device)
    gpus = int(cluster.num_gpus)
    common = dict(tokens_per_step=plan.global_batch * model.seq_len, tokens=tokens, ckpt_bytes=ckpt, gpus=gpus,
                  gpus_per_node=cluster.gpus_per_node, watts_per_gpu=watts, gpu_hour_price=price)
    mid = whole_run(rel, step_s=step_s, **common)
    if not bool(mid["finite"]):
        raise InputError(f"the run cannot finish: an interruption every {mid['mtbf_s'] / 3600:.3g} h against "
                         f"a restart of {mid['restart_s'] / 3600:.3g} h and a checkpoint interval of "
                         f"{mid['interval_s'] / 3600:.3g} h (reliability {rel.name})")
    low = whole_run(rel, step_s=_or(step_low, step_s), rate_scale=rel.rate_low, **common)
    high = whole_run(rel, step_s=_or(step_high, step_s), rate_scale=rel.rate_high, **common)
    f = {k: float(np.asarray(v)) for k, v in mid.items()}
    warnings = [] if math.isfinite(watts) else [
        f"no power figure for device {cluster.device.name}: energy not computed (add energy.device_power_w "
        f"to a --reliability file)"]
    if not bool(high["finite"]):
        warnings.append("the high end of the band never finishes (rates x band.rate_high)")
    return TrainTime(
        tokens=tokens, steps=int(f["steps"]), ideal_days=f["ideal_s"] / DAY, expected_days=f["wall_s"] / DAY,
        expected_days_low=float(low["wall_s"]) / DAY,
        expected_days_high=float(high["wall_s"]) / DAY if bool(high["finite"]) else math.inf,
        goodput=f["goodput"], interruptions=f["interruptions"], interruptions_per_day=f["rate_per_s"] * DAY,
        unexpected_per_day=f["unexpected_rate_per_s"] * DAY,
        mtbf_hours=f["mtbf_s"] / 3600.0, checkpoint_interval_s=f["interval_s"], checkpoint_write_s=f["write_s"],
        checkpoint_stall_s=f["stall_s"], checkpoint_mode=rel.checkpoint_mode,
        checkpoint_gib_per_rank=f["ckpt_bytes"] / 2**30, checkpoint_tb=f["ckpt_bytes"] * gpus / 1e12,
        restart_s=f["restart_s"], gpu_hours=f["gpu_hours"], cost_usd=f["cost_usd"], gpu_hour_price=price,
        energy_mwh=f["energy_mwh"] if math.isfinite(f["energy_mwh"]) else None,
        lost={k: f[f"lost_{k}_s"] / DAY for k in LOST_KEYS}, reliability=rel.name, warnings=tuple(warnings))


def plan_columns(model: Any, cluster: Any, columns: Any, rows: Any, tokens: float, reliability: Reliability,
                 gpu_hour_price: float) -> dict[str, np.ndarray]:
    """The planner's whole-run columns (``expected_days``, ``goodput``, ``cost_usd``, ``energy_mwh``,
    ``interruptions``) of evaluated plans ``rows`` on ``cluster``: the same :func:`whole_run` as a single plan."""
    c = {k: np.asarray(columns[k])[rows] for k in ("step_time_s", "global_batch", "mem_weights_gib",
                                                     "mem_optimizer_states_gib", "dp", "cp", "zero")}
    ckpt = checkpoint_bytes_per_rank(c["mem_weights_gib"], c["mem_optimizer_states_gib"], c["dp"], c["cp"],
                                     c["zero"])
    f = whole_run(reliability, step_s=c["step_time_s"], tokens_per_step=c["global_batch"] * model.seq_len,
                  tokens=tokens, ckpt_bytes=ckpt, gpus=int(cluster.num_gpus),
                  gpus_per_node=cluster.gpus_per_node, watts_per_gpu=watts_per_gpu(reliability, cluster.device),
                  gpu_hour_price=gpu_hour_price)
    return {"expected_days": f["wall_s"] / DAY, "goodput": f["goodput"], "cost_usd": f["cost_usd"],
            "energy_mwh": f["energy_mwh"], "interruptions": f["interruptions"]}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _or(value: float, default: float) -> float:
    return value if value is not None and math.isfinite(value) else default


__all__ = ["LOST_KEYS", "train_time", "train_time_of", "plan_columns", "TrainTime", "Reliability", "Component", "load_reliability", "check_tokens",
           "checkpoint_bytes_per_rank", "young_interval", "daly_optimum", "expected_wall_time", "whole_run",
           "watts_per_gpu", "DEFAULT_GPU_HOUR_PRICE", "MAX_TOKENS"]
