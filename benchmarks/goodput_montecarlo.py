"""Monte Carlo check of the whole-run model (issue 23): an event-driven simulation of the same assumptions as
tpsim.train.model.expected_wall_time, seeded numpy, against the analytical expected wall time.

    python benchmarks/goodput_montecarlo.py            # 4000 replicas per case
    python benchmarks/goodput_montecarlo.py --replicas 20000 --seed 7

Assumptions simulated (docs/MODEL.md, "Time to train"): interruptions arrive as a Poisson process of rate
1/M over all wall time (work, checkpoints and restarts alike); the run is S segments of tau seconds of work
followed by a delta-second checkpoint; an interruption loses the segment in progress (work and checkpoint)
and starts a restart of R seconds, which an interruption during it starts over. Each replica is simulated event
by event (next failure time drawn from the exponential, compared with the end of the current phase), not
through the closed form's geometric attempts.

Cases: the Llama 3 405B plan on 16,384 H100 (the preset, default fleet, async checkpoints), the same run with
synchronous checkpoints, with the RSC-1 fleet, and a harsh case (MTBF 20 min, 10-minute restarts), whose
parameters come from tpsim.train.whole_run itself.

Stated tolerance: the analytical expected wall time lies within 4 standard errors of the simulated mean
(and within 1%); so do the expected interruptions. The script prints each case and exits 1 if one misses.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

TOLERANCE_SE = 4.0
TOLERANCE_REL = 0.01


def simulate(segments: int, tau: float, delta: float, restart: float, mtbf: float, replicas: int,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Wall time and interruptions of ``replicas`` independent runs (event by event, vectorized over runs)."""
    seg = tau + delta
    t = np.zeros(replicas)
    done = np.zeros(replicas, dtype=np.int64)
    failures = np.zeros(replicas, dtype=np.int64)
    in_restart = np.zeros(replicas, dtype=bool)
    next_fail = rng.exponential(mtbf, replicas)
    active = done < segments
    while active.any():
        phase = np.where(in_restart, restart, seg)
        end = t + phase
        ok = active & (next_fail >= end)
        hit = active & ~ok
        # phase completed: a segment is checkpointed, or the restart is over
        t[ok] = end[ok]
        done[ok & ~in_restart] += 1
        in_restart[ok] = False
        # an interruption: the phase in progress is lost, a restart starts at the failure time
        t[hit] = next_fail[hit]
        failures[hit] += 1
        in_restart[hit] = True
        next_fail[hit] = t[hit] + rng.exponential(mtbf, int(hit.sum()))
        active = done < segments
    return t, failures


def cases() -> list[tuple[str, dict[str, float]]]:
    """(name, {segments, tau, delta, restart, mtbf, analytic_wall, analytic_interruptions})."""
    from tpsim.estimator import estimate
    from tpsim.model import load_model
    from tpsim.plan import make_plan
    from tpsim.topology import load_cluster
    from tpsim.train import checkpoint_bytes_per_rank, expected_wall_time, load_reliability, whole_run
    from tpsim.train.model import watts_per_gpu
    import dataclasses

    model = load_model("llama3-405b")
    fields = dict(model.default_plan)
    stack = fields.pop("stack")
    fields.pop("cluster"), fields.pop("gpus")
    cluster = load_cluster("dgx-h100", gpus=16384)
    plan = make_plan(model, 16384, **fields)
    e = estimate(model, cluster, plan, stack=stack)
    ckpt = checkpoint_bytes_per_rank(e.memory_gib["weights"], e.memory_gib["optimizer_states"], plan.dp, plan.cp,
                                     plan.zero)
    out = []
    default = load_reliability()
    fleets = [("llama3-405b 16k H100, async, llama3-h100 fleet", default),
              ("llama3-405b 16k H100, sync checkpoints", dataclasses.replace(default, checkpoint_mode="sync")),
              ("llama3-405b 16k H100, async, rsc1-a100 fleet", load_reliability("rsc1-a100"))]
    for name, rel in fleets:
        f = whole_run(rel, step_s=e.step_time_s, tokens_per_step=plan.global_batch * model.seq_len, tokens=2e12,
                      ckpt_bytes=ckpt, gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                      watts_per_gpu=watts_per_gpu(rel, cluster.device), gpu_hour_price=1.0)
        tau = float(f["interval_s"])
        segments = int(round(float(f["ideal_s"]) / tau))
        solve = segments * tau  # whole segments, so the simulation and the formula run the same work
        t = expected_wall_time(solve, tau, float(f["stall_s"]), float(f["restart_s"]), float(f["rate_per_s"]))
        out.append((name, dict(segments=segments, tau=tau, delta=float(f["stall_s"]), restart=float(f["restart_s"]),
                               mtbf=float(f["mtbf_s"]), wall=float(t["wall_s"]),
                               interruptions=float(t["interruptions"]))))
    tau, delta, restart, mtbf, segments = 300.0, 30.0, 600.0, 1200.0, 200
    t = expected_wall_time(segments * tau, tau, delta, restart, 1 / mtbf)
    out.append(("harsh: MTBF 20 min, restart 10 min, tau 5 min", dict(
        segments=segments, tau=tau, delta=delta, restart=restart, mtbf=mtbf, wall=float(t["wall_s"]),
        interruptions=float(t["interruptions"]))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    failed = 0
    print(f"replicas {args.replicas}, seed {args.seed}; tolerance {TOLERANCE_SE:g} SE and {100 * TOLERANCE_REL:g}%")
    print(f"{'case':50s} {'segments':>8s} {'analytic d':>11s} {'MC d':>11s} {'diff':>8s} {'SE':>7s} "
          f"{'intr a':>8s} {'intr MC':>8s} {'goodput':>8s} {'s':>5s}")
    for name, c in cases():
        started = time.perf_counter()
        wall, fails = simulate(c["segments"], c["tau"], c["delta"], c["restart"], c["mtbf"], args.replicas, rng)
        mean, se = wall.mean(), wall.std(ddof=1) / math.sqrt(wall.size)
        fmean, fse = fails.mean(), fails.std(ddof=1) / math.sqrt(fails.size)
        diff = c["wall"] / mean - 1.0
        ok = (abs(c["wall"] - mean) <= TOLERANCE_SE * se and abs(diff) <= TOLERANCE_REL
              and abs(c["interruptions"] - fmean) <= TOLERANCE_SE * max(fse, 1e-12) + 1e-9)
        failed += not ok
        print(f"{name:50s} {c['segments']:8d} {c['wall'] / 86400:11.4f} {mean / 86400:11.4f} {100 * diff:+7.3f}% "
              f"{100 * se / mean:6.3f}% {c['interruptions']:8.1f} {fmean:8.1f} "
              f"{c['segments'] * c['tau'] / c['wall']:8.4f} {time.perf_counter() - started:5.1f}"
              + ("" if ok else "  MISS"))
    print("all cases within tolerance" if not failed else f"{failed} case(s) outside tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
