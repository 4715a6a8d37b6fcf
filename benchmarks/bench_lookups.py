"""Speed of the cached look-ups that tests used to time (the tests now check only the behaviour):

    python benchmarks/bench_lookups.py

* collective-curve cache hit on an 8-GPU switch node (tests/test_collective_model.py), per look-up;
* DP all-reduce curve on 256 H100s (dgx-h100, tp 8): first build and cached look-up
  (tests/test_collective_topologies.py);
* kernel-profile GEMM look-up of 200,000 shapes in one vectorized call (tests/test_profile.py);
* loading dgx-a100 at 1024 GPUs and routing 128 rings of 8, and loading 3072 GPUs (tests/test_topology.py).

Each figure is the best of a few runs (wall time; the load average is printed, the machine may be shared).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def curve_cache_hit() -> float:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_collective_graphs import switch_node

    from tpsim.collectives.model import get_collective_model

    m = get_collective_model(switch_node(8, lanes=2, switches=6))
    g = (tuple(range(8)),)
    m.curve("all_gather", g)
    return best_of(lambda: [m.curve("all_gather", g) for _ in range(1000)]) / 1000


def dp_curve_on_256_gpus() -> tuple[float, float]:
    from tpsim.collectives.model import CollectiveModel
    from tpsim.topology import load_cluster
    from tpsim.topology.placement import rank_groups

    cluster = load_cluster("dgx-h100")
    groups = rank_groups(8, cluster.num_gpus // 8, 1)["dp"]
    t = time.perf_counter()
    model = CollectiveModel(cluster)
    model.curve("all_reduce", groups)
    build = time.perf_counter() - t
    return build, best_of(lambda: [model.curve("all_reduce", groups) for _ in range(200)]) / 200


def profile_lookup() -> float:
    from tpsim.compute.profile import ProfileModel

    model = ProfileModel(ROOT / "profiles" / "cpu-reference-1t.csv")
    m = np.random.default_rng(2).uniform(64, 4096, 200_000)
    return best_of(lambda: model.gemm(m, m[::-1], 1000, "fp32"))


def load_and_route() -> tuple[float, float]:
    from tpsim.topology import clear_cache, load_cluster

    def routed() -> None:
        clear_cache()
        cluster = load_cluster("dgx-a100", gpus=1024)
        for ring in range(128):
            ranks = [ring + 128 * i for i in range(8)]
            for i in range(8):
                cluster.paths(ranks[i], ranks[(i + 1) % 8])

    def big() -> None:
        clear_cache()
        load_cluster("dgx-a100", gpus=3072)
    return best_of(routed, 3), best_of(big, 3)


def main() -> int:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"tpsim look-up benchmark (best of a few runs; load average {load})")
    print(f"collective-curve cache hit (8-GPU switch node): {curve_cache_hit() * 1e6:.2f} us per look-up")
    build, hit = dp_curve_on_256_gpus()
    print(f"DP all-reduce curve, 256 x dgx-h100: first build {build:.3f} s, cached look-up {hit * 1e6:.1f} us")
    print(f"profile GEMM look-up, 200,000 shapes in one call: {profile_lookup():.3f} s")
    routed, big = load_and_route()
    print(f"load dgx-a100 at 1024 GPUs + route 128 rings of 8: {routed:.3f} s; load 3072 GPUs: {big:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
