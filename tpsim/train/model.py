"""The whole-run model: ideal time, interruptions, checkpoints, restarts, stragglers, goodput, cost, energy.

Vectorized over plans (:func:`whole_run`, the planner's path); :func:`tpsim.train.train_time` is a batch of
one. Formulas and sources: docs/MODEL.md, "Time to train".

* Interruptions are a Poisson process of rate ``lambda = gpus x r_gpu + nodes x r_node`` (per second; the
  fleet's components, tpsim/data/reliability.yaml); ``M = 1 / lambda``.
* Checkpoint of one rank: the weights and optimizer states of the estimator's memory terms, divided by the
  replication ZeRO leaves (:func:`checkpoint_bytes_per_rank`). Durable write ``w = max(node bytes / node write
  bandwidth, all bytes / aggregate write bandwidth)``; training stalls for ``delta = w`` (sync) or for the host
  copy ``bytes / host copy bandwidth`` (async).
* Interval: Daly 2006 (FGCS 22, eq. 37) higher-order optimum of ``delta`` and ``M``, at least one step and the
  background write ``w - delta``, rounded to whole steps (:func:`daly_interval`).
* Restart ``R``: the fleet's fixed part + the checkpoint read + (async) the write lag ``w - delta``.
* Expected wall time: Daly 2006 eq. 20, ``T_w = M e^(R/M) (e^((tau+delta)/M) - 1) T_s / tau`` (failures may
  strike during work, checkpoints and restarts alike), ``T_s`` the solve time with stragglers.
* Stragglers: every step pays the slowest rank; with each rank slow with probability ``p`` by ``s`` of a step,
  the expected step is ``1 + s (1 - (1 - p)^gpus)`` times the estimate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .reliability import Reliability

DAY = 86400.0
GIB = float(1 << 30)
MAX_EXPONENT = 50.0
"""largest (restart + interval + checkpoint) / MTBF the model accepts: beyond, e^x makes the expected wall time
10^21 times the work (the run never ends); a plan there is infeasible, a single run an input error."""


def checkpoint_bytes_per_rank(weights_gib: Any, optimizer_gib: Any, dp: Any, cp: Any, zero: Any) -> np.ndarray:
    """Bytes one rank writes per checkpoint: its weights and optimizer states (the estimator's memory terms,
    GiB) over the replicas that hold the same bytes (a distributed checkpoint, Megatron-Core
    ``fully_parallel_save`` / torch DCP, spreads a replicated shard over its replicas). ZeRO shards over the
    ``dp x cp`` group: weights are replicated there below ZeRO-3, optimizer states at ZeRO-0. Gradients are
    not saved (rebuilt by the next step)."""
    group = np.asarray(dp, dtype=float) * np.asarray(cp, dtype=float)
    zero = np.asarray(zero)
    w_rep = np.where(zero >= 3, 1.0, group)
    o_rep = np.where(zero >= 1, 1.0, group)
    return (np.asarray(weights_gib, dtype=float) / w_rep + np.asarray(optimizer_gib, dtype=float) / o_rep) * GIB


def young_interval(delta: Any, mtbf: Any) -> np.ndarray:
    """Young 1974 (CACM 17(9)): first-order optimum ``sqrt(2 delta M)`` (seconds)."""
    return np.sqrt(2.0 * np.asarray(delta, dtype=float) * np.asarray(mtbf, dtype=float))


def daly_optimum(delta: Any, mtbf: Any) -> np.ndarray:
    """Daly 2006 (FGCS 22(3), eq. 37): ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + delta / 18M] - delta``
    for ``delta < 2M``, else ``M`` (seconds of work between checkpoints)."""
    d, m = np.asarray(delta, dtype=float), np.asarray(mtbf, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = d / (2.0 * m)
        tau = np.sqrt(2.0 * d * m) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - d
    return np.where(d < 2.0 * m, tau, m)


def daly_interval(delta: Any, mtbf: Any, step_s: Any, lag_s: Any, solve_s: Any) -> np.ndarray:
    """The interval used: Daly's optimum, at least one step and the background write ``lag_s``, at most the
    whole run, in whole steps (checkpoints happen between steps)."""
    step = np.asarray(step_s, dtype=float)
    tau = np.maximum(daly_optimum(delta, mtbf), np.asarray(lag_s, dtype=float))
    steps = np.maximum(1.0, np.round(np.minimum(tau, solve_s) / step))
    return np.where(np.isfinite(tau), steps * step, np.asarray(solve_s, dtype=float))


def expected_wall_time(solve_s: Any, tau: Any, delta: Any, restart_s: Any, rate: Any) -> dict[str, np.ndarray]:
    """Daly 2006 eq. 20 and the lost time split into its parts (seconds; ``rate`` in interruptions/s).

    Per segment of ``tau`` work + ``delta`` checkpoint, the attempts are geometric: ``e^((tau+delta)/M) - 1``
    failures before success, each followed by a restart that itself completes after ``M (e^(R/M) - 1)``
    expected seconds. ``checkpoints`` = the successful checkpoints, ``restarts`` = the restart phases,
    ``failures`` = the work and checkpoint time redone (the rest); interruptions = ``T_w / M`` (Wald)."""
    ts, tau, d, r, lam = (np.asarray(v, dtype=float) for v in (solve_s, tau, delta, restart_s, rate))
    segments = ts / tau
    a = (tau + d) * lam
    b = r * lam
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ok = (a + b) <= MAX_EXPONENT
        mtbf = np.where(lam > 0, 1.0 / np.where(lam > 0, lam, 1.0), np.inf)
        em1_a = np.expm1(np.where(ok, a, 0.0))
        em1_b = np.expm1(np.where(ok, b, 0.0))
        failed = np.where(lam > 0, segments * em1_a * mtbf * np.exp(np.where(ok, b, 0.0)), segments * d)
        wall = np.where(lam > 0, failed, segments * (tau + d))
        restarts = np.where(lam > 0, segments * em1_a * mtbf * em1_b, 0.0)
    checkpoints = segments * d
    wall = np.where(ok, wall, np.inf)
    rework = np.where(ok, np.maximum(wall - ts - checkpoints - restarts, 0.0), np.inf)
    return {"wall_s": wall, "checkpoints_s": checkpoints, "restarts_s": np.where(ok, restarts, np.inf),
            "failures_s": rework, "interruptions": np.where(ok, wall * lam, np.inf), "finite": ok}


def straggler_factor(rel: Reliability, gpus: Any) -> np.ndarray:
    """Expected step time over the estimate's: ``1 + s (1 - (1 - p)^gpus)`` (the slowest of all ranks)."""
    g = np.asarray(gpus, dtype=float)
    return 1.0 + rel.slowdown * -np.expm1(g * math.log1p(-min(rel.slow_rank_fraction, 1.0 - 1e-16)))


def interruption_rate(rel: Reliability, gpus: Any, gpus_per_node: Any, planned: bool = True) -> np.ndarray:
    """Interruptions per second of a job on ``gpus`` (all, or only the unexpected ones)."""
    pick = 0 if planned else 1
    g = np.asarray(gpus, dtype=float)
    nodes = np.ceil(g / np.asarray(gpus_per_node, dtype=float))
    return (g * rel.rates("gpu")[pick] + nodes * rel.rates("node")[pick]) / 3600.0


def whole_run(rel: Reliability, *, step_s: Any, tokens_per_step: Any, tokens: float, ckpt_bytes: Any,
              gpus: Any, gpus_per_node: Any, watts_per_gpu: Any, gpu_hour_price: float,
              rate_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Every whole-run figure per plan (arrays; seconds unless named otherwise). ``watts_per_gpu``: device
    power x power fraction + node overhead per GPU (NaN: no power figure, energy NaN)."""
    step = np.asarray(step_s, dtype=float)
    g = np.asarray(gpus, dtype=float)
    gpn = np.asarray(gpus_per_node, dtype=float)
    steps = np.ceil(float(tokens) / np.asarray(tokens_per_step, dtype=float))
    ideal = steps * step
    solve = ideal * straggler_factor(rel, g)
    b = np.asarray(ckpt_bytes, dtype=float)
    write = np.maximum(b * np.minimum(gpn, g) / rel.node_write_Bps, b * g / rel.aggregate_write_Bps)
    load = np.maximum(b * np.minimum(gpn, g) / rel.node_read_Bps, b * g / rel.aggregate_read_Bps)
    stall = write if rel.checkpoint_mode == "sync" else np.minimum(b / rel.host_copy_Bps, write)
    lag = write - stall
    rate = interruption_rate(rel, g, gpn) * rate_scale
    with np.errstate(divide="ignore"):
        mtbf = np.where(rate > 0, 1.0 / np.where(rate > 0, rate, 1.0), np.inf)
    tau = daly_interval(stall, mtbf, step, lag, solve)
    restart = rel.restart_fixed_s + load + lag
    t = expected_wall_time(solve, tau, stall, restart, rate)
    wall = t["wall_s"]
    hours = wall / 3600.0
    return {
        "steps": steps, "ideal_s": ideal, "wall_s": wall, "goodput": ideal / wall,
        "interruptions": t["interruptions"], "rate_per_s": rate, "mtbf_s": mtbf,
        "unexpected_rate_per_s": interruption_rate(rel, g, gpn, planned=False) * rate_scale,
        "interval_s": tau, "write_s": write, "stall_s": stall, "load_s": load, "restart_s": restart,
        "ckpt_bytes": b, "lost_failures_s": t["failures_s"], "lost_checkpoints_s": t["checkpoints_s"],
        "lost_restarts_s": t["restarts_s"], "lost_stragglers_s": solve - ideal,
        "gpu_hours": g * hours, "cost_usd": g * hours * gpu_hour_price,
        "energy_mwh": g * hours * np.asarray(watts_per_gpu, dtype=float) * rel.pue / 1e6,
        "finite": t["finite"],
    }


def watts_per_gpu(rel: Reliability, device: Any) -> float:
    """Average wall power per GPU (W): device power x power fraction + node overhead per GPU; NaN when
    neither the device (``power_limit_w``, from tpsim/data/devices.yaml) nor the fleet's table has a figure."""
    power = getattr(device, "power_limit_w", None) or rel.device_power_w.get(device.name)
    if not power:
        return math.nan
    overhead = rel.node_overhead_w_per_gpu.get(device.name, rel.node_overhead_ratio * power)
    return float(power) * rel.power_fraction + float(overhead)
