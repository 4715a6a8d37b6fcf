"""A fixed estimator workload for instruction counts (deterministic, unlike wall time on a shared machine).

    valgrind --tool=callgrind python benchmarks/callgrind_estimate.py batch 0    # setup only
    valgrind --tool=callgrind python benchmarks/callgrind_estimate.py batch 4    # setup + 4 passes
    valgrind --tool=callgrind python benchmarks/callgrind_estimate.py single 0
    valgrind --tool=callgrind python benchmarks/callgrind_estimate.py single 200

Instructions per pass = (total at N - total at 0) / N. ``batch``: bench_estimate.py's workload, the 19,920 valid
plans of GPT-3 175B on 1024 A100s in the planner's chunks, stage results dropped before each pass; ``single``:
``tpsim.estimate`` of bench_estimate.py's first one-plan case after a warm-up call. About a minute per run.
"""

from __future__ import annotations

import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import tpsim  # noqa: E402


def main() -> int:
    mode, n = sys.argv[1], int(sys.argv[2])
    model, cluster = tpsim.load_model("gpt3-175b"), tpsim.load_cluster("dgx-a100", gpus=1024)
    if mode == "single":
        plan = tpsim.make_plan(model, 1024, tp=8, pp=16, sp=True, recompute="selective", zero=1)
        tpsim.estimate(model, cluster, plan)
        for _ in range(n):
            tpsim.estimate(model, cluster, plan)
        return 0
    from tpsim.estimator import context_for, estimate_batch
    from tpsim.search import SearchSpace, enumerate_plans, violations
    from tpsim.search.planner import CHUNK

    enum = enumerate_plans(model, 1024, 1536, SearchSpace())
    plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, 1024) == 0))
    chunks = [plans.take(slice(s, s + CHUNK)) for s in range(0, len(plans), CHUNK)]
    ctx = context_for(model, cluster)
    for c in chunks:
        estimate_batch(model, cluster, c)
    for _ in range(n):
        ctx.clear_results()
        for c in chunks:
            estimate_batch(model, cluster, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
