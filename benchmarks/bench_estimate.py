"""Estimator speed (issue 9): one plan in process after warm-up, and plan evaluations per second per core.

    python benchmarks/bench_estimate.py            # about a minute on one core
    python benchmarks/bench_estimate.py --quick

1. ``tpsim.estimate`` of one plan, in process, after a warm-up call (the context, its collective curves and
   layer costs exist): median and best of many calls, wall and CPU time, for a few presets.
2. ``estimate_batch`` over every valid plan of the full space of GPT-3 175B on 1024 A100s (dgx-a100, global
   batch 1536), fed in the planner's chunks: the collective curves are warm, the stage results are dropped
   before each repetition (``EstimationContext.clear_results``) so every repetition evaluates fresh plans.
   Median and best of the repetitions.
The process is pinned to one CPU, BLAS/OpenMP threads = 1. The load average is printed: on a shared machine
wall times are noisy, CPU times less so. Targets: one plan < 1 ms; >= 1,000,000 plan evaluations/s.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

TARGET_SINGLE_MS, TARGET_EVALS = 1.0, 1_000_000
SINGLE_CASES = (
    ("gpt3-175b", "dgx-a100", 1024, dict(tp=8, pp=16, sp=True, recompute="selective", zero=1)),
    ("llama3-70b", "dgx-h100", 64, dict(tp=8, pp=4, sp=True, recompute="selective", zero=1)),
    ("megatron-1t", "selene", 3072, {}),
)


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity)"


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else ""


def bench_single(calls: int) -> list[dict]:
    import tpsim

    rows = []
    for name, cluster_name, gpus, fields in SINGLE_CASES:
        model = tpsim.load_model(name)
        cluster = tpsim.load_cluster(cluster_name, gpus=gpus)
        plan = tpsim.make_plan(model, gpus, **fields)
        t0 = time.perf_counter()
        tpsim.estimate(model, cluster, plan)
        cold = time.perf_counter() - t0
        wall, cpu = [], []
        for _ in range(calls):
            w, c = time.perf_counter(), time.process_time()
            tpsim.estimate(model, cluster, plan)
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
        rows.append({"case": f"{name} on {gpus} x {cluster_name} ({plan.short()})", "cold_s": cold,
                     "median_ms": 1e3 * statistics.median(wall), "best_ms": 1e3 * min(wall),
                     "cpu_median_ms": 1e3 * statistics.median(cpu)})
    return rows


def bench_batch(repeat: int) -> dict:
    from tpsim.estimator import context_for, estimate_batch
    from tpsim.model import load_model
    from tpsim.search import SearchSpace, enumerate_plans, violations
    from tpsim.search.planner import CHUNK
    from tpsim.topology import load_cluster

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100", gpus=1024)
    enum = enumerate_plans(model, 1024, 1536, SearchSpace())
    plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, 1024) == 0))
    chunks = [plans.take(slice(s, s + CHUNK)) for s in range(0, len(plans), CHUNK)]
    ctx = context_for(model, cluster)
    t0 = time.perf_counter()
    for chunk in chunks:
        estimate_batch(model, cluster, chunk)
    cold = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(repeat):
        ctx.clear_results()  # fresh plans: only the collective curves and layer costs stay warm
        w, c = time.perf_counter(), time.process_time()
        for chunk in chunks:
            estimate_batch(model, cluster, chunk)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    n = len(plans)
    return {"plans": n, "cold_s": cold, "median_per_s": n / statistics.median(wall), "best_per_s": n / min(wall),
            "cpu_median_per_s": n / statistics.median(cpu), "cpu_best_per_s": n / min(cpu)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    print(f"tpsim estimator benchmark; {pin_one_core()}; {_load()}", flush=True)
    for row in bench_single(200 if args.quick else 1000):
        ok = "met" if row["median_ms"] < TARGET_SINGLE_MS else "NOT met"
        print(f"estimate, one plan: {row['case']}: first call {row['cold_s']:.2f} s; after warm-up median "
              f"{row['median_ms']:.3f} ms, best {row['best_ms']:.3f} ms (CPU median {row['cpu_median_ms']:.3f} ms)"
              f" (target < {TARGET_SINGLE_MS:g} ms: {ok})", flush=True)
    ev = bench_batch(3 if args.quick else 7)
    ok = "met" if ev["median_per_s"] >= TARGET_EVALS else "NOT met"
    print(f"estimate_batch, {ev['plans']:,} valid plans of GPT-3 175B on 1024 x dgx-a100 (planner chunks, fresh "
          f"stage results): first pass {ev['cold_s']:.2f} s (collective curves built); then median "
          f"{ev['median_per_s']:,.0f} plans/s, best {ev['best_per_s']:,.0f} plans/s (CPU time: median "
          f"{ev['cpu_median_per_s']:,.0f}, best {ev['cpu_best_per_s']:,.0f}) (target >= {TARGET_EVALS:,}: {ok})")
    print(_load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
