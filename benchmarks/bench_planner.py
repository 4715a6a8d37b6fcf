"""Planner speed benchmark (issue 5): plan evaluations per second and `tpsim plan` wall time.

    python benchmarks/bench_planner.py            # full run (about a minute on one core)
    python benchmarks/bench_planner.py --quick    # fewer repetitions

1. Evaluations per second through :func:`tpsim.estimator.estimate_batch` on one core (the process is pinned
   to one CPU, BLAS/OpenMP threads = 1): GPT-3 175B on 1024 A100s (dgx-a100), every valid plan of the full
   space, once as enumerated and once tiled to about a million plans. The collective curves are warmed first
   (built once per rank layout and kept by the estimation context), the context's stage results are dropped
   before each run (fresh plans), then the median of the runs is reported; the cold first call is printed too.
2. Wall time of ``tpsim plan --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536`` over
   the full space (roofline compute), process start included: three runs against a fresh on-disk cache
   (the first one fills it), median of three; and one run with ``--no-cache``. Then the cold figure of
   issue 21 (every pipeline schedule the stack offers searched, the default): three runs, each in a new
   process against its own empty ``TPSIM_CACHE_DIR`` (no parsed YAML, no plan cache, no run residuals
   but the shipped ones), median of three, wall and CPU time (target < 1.5 s).
3. The same evaluations per second for a mixture-of-experts model with the cp / ep / etp axes searched
   (``--moe``: Mixtral 8x7B on 256 H100s, global batch 256).
4. Cold ``tpsim plan`` of DeepSeek-V3 on 2048 H100s (global batch 15360) over its default space (cp, cp
   kind, ep, etp included; pruned to the plans the rule tables accept, see tpsim/search/space.py) and over
   the full product (``--full-space --allow-large-space``), ``--no-cache``, process start included, once each
   (``--deepseek``); the child's address space is capped (``--deepseek-mem-gib``, default 16) so an
   over-large search fails instead of exhausting a shared machine; wall time, CPU time, exit status, the
   child's peak RSS and the plans of its space are printed.
5. Cold ``tpsim plan`` of Mixtral 8x7B on 64 and 256 H100s with default flags (``--moe-plans``, and with
   ``--deepseek``): the default MoE spaces must pass the 1 M-plan guard and run in a few seconds.
Evaluations per second are also given per CPU second of the process (``time.process_time``): on a shared
machine the wall-clock rate drops with the load while the CPU-time rate measures the code.
Targets: >= 1,000,000 evaluations/s; median < 2 s; first run < 5 s; DeepSeek-V3 on 2048 GPUs < 10 s cold.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

MODEL, CLUSTER, GPUS, BATCH = "gpt3-175b", "dgx-a100", 1024, 1536
PLAN_CMD = ["tpsim", "plan", "--model", MODEL, "--cluster", CLUSTER, "--gpus", str(GPUS), "--global-batch",
            str(BATCH), "--top", "10", "--no-progress"]
TARGET_EVALS, TARGET_MEDIAN_S, TARGET_FIRST_S, TARGET_COLD_S = 1_000_000, 2.0, 5.0, 1.5
MOE_CASE = ("mixtral-8x7b", "dgx-h100", 256, 256)
DEEPSEEK_CMD = ["tpsim", "plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "2048",
                "--global-batch", "15360", "--top", "5", "--no-progress", "--no-cache"]
DEEPSEEK_FULL = ["--full-space", "--allow-large-space"]
DEEPSEEK_GENERAL = ["--stack", "megatron"]
MIXTRAL_CMDS = [["tpsim", "plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", str(g), "--top", "5",
                 "--no-progress", "--no-cache"] for g in (64, 256)]
TARGET_DEEPSEEK_S = 10.0


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity)"


def _timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def bench_evaluations(repeat: int, case: tuple[str, str, int, int] = (MODEL, CLUSTER, GPUS, BATCH),
                      search_too: bool = True) -> dict[str, float]:
    from tpsim.estimator import estimate_batch
    from tpsim.model import load_model
    from tpsim.search import SearchSpace, enumerate_plans, violations
    from tpsim.search.planner import CHUNK
    from tpsim.topology import load_cluster

    name, cluster_name, gpus, batch = case
    model, cluster = load_model(name), load_cluster(cluster_name, gpus=gpus)
    enum = enumerate_plans(model, gpus, batch, SearchSpace())
    plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, gpus) == 0))
    from tpsim.estimator import context_for

    ctx = context_for(model, cluster)
    t = time.perf_counter()
    estimate_batch(model, cluster, plans)  # cold: builds the collective curves of every layout
    cold = time.perf_counter() - t

    def fresh() -> None:  # the context keeps stage results: drop them so every run evaluates fresh plans
        ctx.clear_results()
        estimate_batch(model, cluster, plans)
    warm = _timed(fresh, repeat)
    spent = []

    def timed(*a, **kw):
        t0 = time.perf_counter()
        out = estimate_batch(*a, **kw)
        spent.append(time.perf_counter() - t0)
        return out

    from tpsim.search import search

    def one_search() -> float:  # returns the planner's own time (search minus estimator calls)
        spent.clear()
        ctx.clear_results()
        t0 = time.perf_counter()
        search(model, cluster, batch, estimator=timed)
        return time.perf_counter() - t0 - sum(spent)
    totals, owns = [], []
    for _ in range(repeat if search_too else 0):
        t0 = time.perf_counter()
        owns.append(one_search())
        totals.append(time.perf_counter() - t0)
    own = statistics.median(owns) if owns else float("nan")
    reps = max(1, round(1_000_000 / len(plans)))
    big = plans.take(np.tile(np.arange(len(plans)), reps))

    cpu = []

    def chunked() -> None:  # as the planner feeds the estimator: CHUNK plans per call (bounded memory)
        ctx.clear_results()
        c0 = time.process_time()
        for start in range(0, len(big), CHUNK):
            estimate_batch(model, cluster, big.take(slice(start, start + CHUNK)))
        cpu.append(time.process_time() - c0)
    large = _timed(chunked, max(1, repeat // 2))
    return {"plans": len(plans), "cold_s": cold, "enumerated": len(enum.plans), "search_s": statistics.median(totals) if totals else float("nan"),
            "planner_own_s": own, "warm_s": statistics.median(warm),
            "evals_per_s": len(plans) / statistics.median(warm), "big_plans": len(big),
            "big_s": statistics.median(large), "big_evals_per_s": len(big) / statistics.median(large),
            "big_cpu_s": statistics.median(cpu), "big_evals_per_cpu_s": len(big) / statistics.median(cpu)}


def bench_cli() -> dict[str, float]:
    def run(extra: list[str], env: dict[str, str]) -> float:
        t = time.perf_counter()
        subprocess.run(PLAN_CMD + extra, check=True, env=env, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TPSIM_CACHE_DIR=tmp)
        runs = [run([], env) for _ in range(3)]
        nocache = run(["--no-cache"], env)
    cold, cold_cpu = [], []
    for _ in range(3):  # each in a new process against its own empty cache folder
        with tempfile.TemporaryDirectory() as tmp:
            import resource

            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            cold.append(run([], dict(os.environ, TPSIM_CACHE_DIR=tmp)))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cold_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tpsim.cli"], check=True)
    return {"runs": runs, "first_s": runs[0], "median_s": statistics.median(runs), "no_cache_s": nocache,
            "cold": cold, "cold_median_s": statistics.median(cold), "cold_cpu_median_s": statistics.median(cold_cpu),
            "import_s": time.perf_counter() - start}


def bench_plan_cli(cmd: list[str], mem_gib: float) -> dict[str, float]:
    """One cold ``tpsim plan`` (``cmd``) in a child process (address space capped): wall and CPU time, exit
    status, peak RSS, the summary line."""
    import resource

    def cap() -> None:
        limit = int(mem_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TPSIM_CACHE_DIR=tmp)
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=cap)
        wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rss = after.ru_maxrss / 2**20  # KiB on Linux -> GiB (the largest child so far)
    summary = next((ln for ln in done.stdout.splitlines() if " plans enumerated, " in ln), "")
    return {"wall_s": wall, "cpu_s": cpu, "rc": done.returncode, "max_rss_gib": rss, "summary": summary,
            "tail": (done.stdout.strip().splitlines() or [""])[-12:] + done.stderr.strip().splitlines()[-3:]}


def bench_deepseek(mem_gib: float) -> dict[str, float]:
    """One cold ``tpsim plan`` of DeepSeek-V3 on 2048 GPUs (default space) in a child process."""
    return bench_plan_cli(DEEPSEEK_CMD, mem_gib)


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _report_evaluations(title: str, ev: dict[str, float]) -> None:
    print(f"{title}: estimate_batch, {ev['plans']:,} valid plans of the full space: cold {ev['cold_s']:.2f} s "
          f"(collective curves built), warm median {ev['warm_s'] * 1e3:.0f} ms = {ev['evals_per_s']:,.0f} plans/s")
    if ev["search_s"] == ev["search_s"]:
        print(f"search() of the full space: {ev['search_s']:.2f} s, of which the planner's own work (enumerate "
              f"{ev['enumerated']:,} plans, validity, ranking; estimator excluded) {ev['planner_own_s']:.3f} s = "
              f"{ev['enumerated'] / max(ev['planner_own_s'], 1e-9):,.0f} plans/s")
    print(f"estimate_batch, {ev['big_plans']:,} plans (tiled, in chunks as the planner does): median {ev['big_s']:.2f} s = "
          f"{ev['big_evals_per_s']:,.0f} plans/s (target >= {TARGET_EVALS:,}: "
          f"{'met' if ev['big_evals_per_s'] >= TARGET_EVALS else 'NOT met'}); per CPU second "
          f"{ev['big_cpu_s']:.2f} s = {ev['big_evals_per_cpu_s']:,.0f} plans/s ("
          f"{'met' if ev['big_evals_per_cpu_s'] >= TARGET_EVALS else 'NOT met'}); load average "
          f"{_load()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--skip-cli", action="store_true", help="only the evaluations per second")
    parser.add_argument("--moe", action="store_true", help="also the evaluations per second of " + MOE_CASE[0])
    parser.add_argument("--deepseek", action="store_true", help="also the cold DeepSeek-V3 2048-GPU plan")
    parser.add_argument("--deepseek-only", action="store_true", help="only the cold DeepSeek-V3 2048-GPU plan")
    parser.add_argument("--deepseek-mem-gib", type=float, default=16.0, help="address-space cap of that run")
    parser.add_argument("--moe-plans", action="store_true",
                        help="only the cold default-flag plans of Mixtral 8x7B (64, 256 GPUs) and DeepSeek-V3")
    args = parser.parse_args()
    if args.deepseek_only:
        return _deepseek(args.deepseek_mem_gib)
    if args.moe_plans:
        return _moe_plans(args.deepseek_mem_gib)
    if args.deepseek:  # first: a child forked from a process holding a million plans counts its pages as RSS
        _moe_plans(args.deepseek_mem_gib)
    print(f"tpsim planner benchmark: {MODEL} on {GPUS} x {CLUSTER}, global batch {BATCH}; {pin_one_core()}",
          flush=True)
    _report_evaluations(MODEL, bench_evaluations(3 if args.quick else 7))
    if args.moe:
        _report_evaluations(f"{MOE_CASE[0]} on {MOE_CASE[2]} x {MOE_CASE[1]}, global batch {MOE_CASE[3]}",
                            bench_evaluations(3 if args.quick else 5, MOE_CASE, search_too=False))
    if args.skip_cli:
        return 0
    cli = bench_cli()
    print(f"`{' '.join(PLAN_CMD)}` (process start included), fresh cache: "
          + ", ".join(f"{t:.2f} s" for t in cli["runs"]))
    print(f"  first run {cli['first_s']:.2f} s (target < {TARGET_FIRST_S:g} s: "
          f"{'met' if cli['first_s'] < TARGET_FIRST_S else 'NOT met'}); median of three {cli['median_s']:.2f} s "
          f"(target < {TARGET_MEDIAN_S:g} s: {'met' if cli['median_s'] < TARGET_MEDIAN_S else 'NOT met'})")
    print(f"  --no-cache (warm files, cold process): {cli['no_cache_s']:.2f} s; `import tpsim.cli`: "
          f"{cli['import_s']:.2f} s")
    print("  cold (new process, empty TPSIM_CACHE_DIR each): " + ", ".join(f"{t:.2f} s" for t in cli["cold"])
          + f"; median {cli['cold_median_s']:.2f} s wall, {cli['cold_cpu_median_s']:.2f} s CPU (target < "
          f"{TARGET_COLD_S:g} s: {'met' if cli['cold_median_s'] < TARGET_COLD_S else 'NOT met'}); load average "
          f"{_load()}")
    return 0


def _report_plan(cmd: list[str], mem_gib: float, target_s: float | None = None, tail: bool = False) -> None:
    r = bench_plan_cli(cmd, mem_gib)
    verdict = ""
    if target_s is not None:
        verdict = (f" (target < {target_s:g} s: "
                   f"{'met' if r['rc'] == 0 and r['wall_s'] < target_s else 'NOT met'})")
    print(f"`{' '.join(cmd)}` (cold, process start included, address space <= {mem_gib:g} GiB, load average "
          f"{_load()}): {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, exit {r['rc']}, peak RSS (largest child so far) "
          f"{r['max_rss_gib']:.2f} GiB{verdict}")
    if r["summary"]:
        print("  | " + r["summary"].strip())
    for line in r["tail"] if (tail or r["rc"]) else []:
        print("  | " + line)


def _deepseek(mem_gib: float) -> int:
    _report_plan(DEEPSEEK_CMD + DEEPSEEK_GENERAL, mem_gib, TARGET_DEEPSEEK_S, tail=True)
    return 0


def _moe_plans(mem_gib: float) -> int:
    """Default-flag plans of the MoE presets (the pruned default spaces), then DeepSeek-V3's full product."""
    for cmd in MIXTRAL_CMDS:
        _report_plan(cmd, mem_gib)
    _report_plan(DEEPSEEK_CMD, mem_gib, TARGET_DEEPSEEK_S)
    # the preset's own stack (hai-llm) offers only what the published run used; a general stack searches the
    # whole space of a DeepSeek-V3-sized model
    _report_plan(DEEPSEEK_CMD + DEEPSEEK_GENERAL, mem_gib, TARGET_DEEPSEEK_S)
    _report_plan(DEEPSEEK_CMD + DEEPSEEK_GENERAL + DEEPSEEK_FULL, mem_gib, TARGET_DEEPSEEK_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
