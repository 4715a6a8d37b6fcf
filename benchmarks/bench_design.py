"""Speed of ``tpsim design`` (issue 24 targets, measured here, not in timed tests):

* 1,000 designs x Llama-3-70B over the whole plan space (benchmarks/design/llama70b-1000.yaml: 128 planning
  tasks, 8 prices each) with ``--jobs`` workers, cold (an empty plan cache): target < 60 s on the 2-core
  reference machine;
* the same sweep's first ``--ray-tasks`` planning tasks on Ray with 1 and with 2 workers: target >= 1.7x;
* identical tables for ``--jobs 1``, ``--jobs N`` and ``--engine ray`` (on the Ray subset).

    python benchmarks/bench_design.py [--jobs 2] [--ray] [--ray-tasks 16]

Prints the figures; writes nothing outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SWEEP = ROOT / "benchmarks" / "design" / "llama70b-1000.yaml"


def _run(sweep, out: Path, **kw) -> tuple[float, object]:
    from tpsim.design import run_sweep

    cache = tempfile.mkdtemp(prefix="tpsim-bench-cache-")
    os.environ["TPSIM_CACHE_DIR"] = cache      # cold: no plan cached on disk
    try:
        import resource

        before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        t0 = time.perf_counter()
        result = run_sweep(sweep, out, charts=False, **kw)
        wall = time.perf_counter() - t0
        after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
        result.cpu_s = cpu   # this process and its reaped workers (Ray's workers are not its children)
        return wall, result
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--ray", action="store_true", help="also time Ray with 1 and 2 workers and compare tables")
    p.add_argument("--ray-tasks", type=int, default=16, help="planning tasks of the Ray comparison")
    p.add_argument("--skip-full", action="store_true", help="only the Ray comparison")
    args = p.parse_args()

    from tpsim.design import load_sweep

    sweep = load_sweep(SWEEP)
    tmp = Path(tempfile.mkdtemp(prefix="tpsim-bench-design-"))
    try:
        if not args.skip_full:
            wall, res = _run(sweep, tmp / "full", jobs=args.jobs)
            print(f"full sweep: {len(sweep.designs):,} designs, {res.tasks} planning tasks, {res.plans:,} plans, "
                  f"--jobs {args.jobs}: {wall:.1f} s ({res.plans / wall:,.0f} plans/s, "
                  f"{len(sweep.designs) / wall:.1f} designs/s); CPU {res.cpu_s:.1f} s = {res.cpu_s / args.jobs:.1f} s "
                  f"per worker; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; target < 60 s "
                  f"on 2 cores")
        if args.ray:
            import yaml

            data = yaml.safe_load(SWEEP.read_text())
            data["axes"]["gpu_hour_price"] = data["axes"]["gpu_hour_price"][:1]
            data["axes"]["device"] = ["B200", "GB200"]
            small = load_sweep(data=data)
            keep = {d.planning_key() for d in small.designs}
            keep = set(sorted(keep, key=str)[:args.ray_tasks])
            from dataclasses import replace
            small = replace(small, designs=tuple(d for d in small.designs if d.planning_key() in keep))
            times = {}
            for label, kw in (("jobs 1", dict(jobs=1)), (f"jobs {args.jobs}", dict(jobs=args.jobs)),
                              ("ray 1 worker", dict(jobs=1, engine="ray")),
                              ("ray 2 workers", dict(jobs=2, engine="ray"))):
                wall, _ = _run(small, tmp / label.replace(" ", "-"), **kw)
                times[label] = wall
                print(f"{label}: {len(small.designs)} designs / {len(keep)} tasks in {wall:.1f} s")
            tables = {label: (tmp / label.replace(" ", "-") / "table.csv").read_text() for label in times}
            same = len(set(tables.values())) == 1
            print(f"tables identical across {', '.join(tables)}: {same}")
            print(f"ray 2 workers vs 1: {times['ray 1 worker'] / times['ray 2 workers']:.2f}x (target >= 1.7x; "
                  f"includes Ray's start, about the same for both)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
