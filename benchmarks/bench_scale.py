"""Frontier-scale benchmark (issue 9): `tpsim estimate` and the collective model on 1k-131k GPU clusters.

    python benchmarks/bench_scale.py            # full run (a few minutes)
    python benchmarks/bench_scale.py --quick    # one warm run per row, no planner

1. ``tpsim estimate --model llama3-405b`` in a subprocess, process start included, on three clusters:
   dgx-h100 (rail-optimized NDR), gb200-nvl72 (72-GPU NVLink racks on NDR rails), and an A100 fat tree
   (benchmarks/clusters/a100-hdr-4level.yaml: DGX A100 on the Selene HDR tree with a 4th tier), at 1,024 /
   16,384 / 131,072 GPUs (whole racks of 72 for NVL72: 1,008 / 16,344 / 131,040). Plan: tp 8, pp 16, order
   tp-dp-pp (NVL72: pp 9, order tp-pp-dp, so that tp x pp fill a rack; one more row with tp-dp-pp, whose DP
   groups straddle racks unevenly), no interleaving, 16 micro-batches per replica, the preset's other fields.
   Wall time: the first run (cold: a fresh process with an empty parse cache, so every YAML file is parsed;
   OS file cache warm) and the median of three more (warm: the YAML documents come from the parse cache,
   tpsim.parsecache); peak RSS of that process and its CPU time, user + system (``os.wait4``; on a shared
   machine the CPU time is the steadier figure). The header says whether Python keeps bytecode files
   (``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__``: every tpsim module is compiled on every start). Targets: 16k within 1.5x the wall time of 1k, 131k
   within 2x, 131k under 1 s and 300 MB.
2. ``CollectiveModel.axis_curve`` in-process: the seven curves an estimate needs (tp / dp all_reduce,
   all_gather, reduce_scatter; pp send_recv) for that layout, from a new model (cold) and again (cached);
   and ``cluster.fingerprint()`` of a freshly loaded cluster.
3. ``tpsim plan --model llama3-405b --cluster dgx-h100 --gpus 16384 --global-batch 2048`` (full space):
   first run against an empty on-disk cache (cold), then a second run (cached), and one ``--no-cache``.
   Target: cold under 10 s, cached under 2 s.
Times on a shared machine are noisy; the script prints the load average next to them.
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
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
A100 = str(HERE / "clusters" / "a100-hdr-4level.yaml")
CLUSTERS = (("dgx-h100", "dgx-h100", 8, 16, "tp-dp-pp"), ("gb200-nvl72", "gb200-nvl72", 72, 9, "tp-pp-dp"),
            ("a100-hdr-4level", A100, 8, 16, "tp-dp-pp"))
"""(label, cluster, GPUs per node, pp, rank order). NVL72: tp 8 x pp 9 fill a rack (the pipeline on NVLink)."""
MISALIGNED = ("gb200-nvl72 tp-dp-pp", "gb200-nvl72", 72, 9, "tp-dp-pp")
"""the same racks with the pipeline across racks: DP groups straddle racks unevenly (no two groups are copies
of each other moved by whole racks), the case the symmetry does not help."""
SIZES = (1024, 16384, 131072)
MICRO_BATCHES = 16
PLAN_CMD = ["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "16384", "--global-batch",
            "2048", "--top", "5", "--no-progress"]


def gpus_for(size: int, gpn: int) -> int:
    """Whole nodes: the largest multiple of the node size not above ``size``."""
    return size // gpn * gpn


def estimate_args(path: str, gpus: int, pp: int, order: str) -> list[str]:
    dp = gpus // (8 * pp)
    return ["estimate", "--model", "llama3-405b", "--cluster", path, "--gpus", str(gpus), "--tp", "8", "--pp",
            str(pp), "--vpp", "1", "--order", order, "--global-batch", str(MICRO_BATCHES * dp),
            "--stack", "megatron", "--zero", "1"]  # the preset's own plan runs under torchtitan (tp-dp-pp only)


def run_tpsim(args: list[str], env: dict | None = None) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MB, exit status, CPU seconds) of ``python -m tpsim.cli ARGS`` (process start
    included)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tpsim.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code:
        print(f"  tpsim {' '.join(args)} failed ({code}): {err.strip()}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024.0, code, usage.ru_utime + usage.ru_stime


def bench_estimate(repeat: int) -> list[dict]:
    rows = []
    for name, path, gpn, pp, order in CLUSTERS + (MISALIGNED,):
        for size in SIZES if (name, path, gpn, pp, order) != MISALIGNED else SIZES[-1:]:
            gpus = gpus_for(size, gpn)
            args = estimate_args(path, gpus, pp, order)
            with tempfile.TemporaryDirectory() as cache:   # cold: an empty parse cache
                env = dict(os.environ, TPSIM_CACHE_DIR=cache)
                cold, cold_rss, code, cold_cpu = run_tpsim(args, env)
                warm = [run_tpsim(args, env) for _ in range(repeat)]
            rows.append({"cluster": name, "gpus": gpus, "cold_s": cold, "warm_s": statistics.median(w[0] for w in warm),
                         "cold_cpu_s": cold_cpu, "warm_cpu_s": statistics.median(w[3] for w in warm),
                         "rss_MB": max([cold_rss] + [w[1] for w in warm]),
                         "ok": code == 0 and not any(w[2] for w in warm)})
            r = rows[-1]
            print(f"  {name:<16} {gpus:>7}  cold {r['cold_s']:6.2f} s  warm {r['warm_s']:6.2f} s  "
                  f"(CPU {r['cold_cpu_s']:.2f} / {r['warm_cpu_s']:.2f} s)  peak {r['rss_MB']:6.0f} MB", flush=True)
    return rows


def bench_curves() -> list[dict]:
    from tpsim.collectives.model import CollectiveModel
    from tpsim.topology import clear_cache, load_cluster
    from tpsim.topology.placement import RankLayout

    rows = []
    for name, path, gpn, pp, order in CLUSTERS + (MISALIGNED,):
        for size in SIZES if (name, path, gpn, pp, order) != MISALIGNED else SIZES[-1:]:
            gpus = gpus_for(size, gpn)
            clear_cache()
            t = time.perf_counter()
            cluster = load_cluster(path, gpus=gpus)
            load_s = time.perf_counter() - t
            t = time.perf_counter()
            cluster.fingerprint()
            fingerprint_s = time.perf_counter() - t
            layout = RankLayout.from_order(order, tp=8, dp=gpus // (8 * pp), pp=pp)
            requests = [(op, axis) for axis in ("tp", "dp") for op in ("all_reduce", "all_gather", "reduce_scatter")]
            requests.append(("send_recv", "pp"))
            t = time.perf_counter()
            model = CollectiveModel(cluster)
            for op, axis in requests:
                model.axis_curve(op, layout, axis)
            cold = time.perf_counter() - t
            t = time.perf_counter()
            for op, axis in requests:
                model.axis_curve(op, layout, axis)
            cached = (time.perf_counter() - t) / len(requests)
            rows.append({"cluster": name, "gpus": gpus, "load_ms": 1e3 * load_s, "fingerprint_ms": 1e3 * fingerprint_s,
                         "curves_cold_ms": 1e3 * cold, "curve_cached_us": 1e6 * cached})
            r = rows[-1]
            print(f"  {name:<16} {gpus:>7}  load {r['load_ms']:6.1f} ms  fingerprint {r['fingerprint_ms']:5.2f} ms  "
                  f"7 curves cold {r['curves_cold_ms']:7.1f} ms  cached {r['curve_cached_us']:5.1f} us/curve",
                  flush=True)
    return rows


def bench_plan() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TPSIM_CACHE_DIR=cache)
        cold = run_tpsim(PLAN_CMD, env)
        cached = run_tpsim(PLAN_CMD, env)
        nocache = run_tpsim(PLAN_CMD + ["--no-cache"], env)
    out = {"cold_s": cold[0], "cached_s": cached[0], "no_cache_s": nocache[0], "rss_MB": max(cold[1], nocache[1])}
    print(f"  cold {out['cold_s']:.2f} s  cached {out['cached_s']:.2f} s  --no-cache {out['no_cache_s']:.2f} s  "
          f"peak {out['rss_MB']:.0f} MB", flush=True)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| cluster | GPUs | wall cold (s) | wall warm, median (s) | CPU cold / warm (s) | peak RSS (MB) | "
             "warm / warm at 1k |", "|---|---|---|---|---|---|---|"]
    base = {r["cluster"]: r["warm_s"] for r in rows if r["gpus"] <= 1024}
    for r in rows:
        ref = base.get(r["cluster"]) or base.get(r["cluster"].split()[0])
        ratio = r["warm_s"] / ref if ref else float("nan")
        lines.append(f"| {r['cluster']} | {r['gpus']:,} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
                     f"{r['cold_cpu_s']:.2f} / {r['warm_cpu_s']:.2f} | {r['rss_MB']:.0f} | {ratio:.2f}x |")
    return "\n".join(lines)


def _bytecode() -> str:
    """Whether the tpsim processes start from bytecode files or compile every module."""
    import tpsim

    cached = any(Path(tpsim.__file__).parent.rglob("__pycache__/*.pyc")) \
        or bool(os.environ.get("PYTHONPYCACHEPREFIX"))
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not cached:
        return "bytecode files: none (PYTHONDONTWRITEBYTECODE, no __pycache__: modules compiled on every start)"
    return "bytecode files: kept" if not os.environ.get("PYTHONDONTWRITEBYTECODE") else "bytecode files: read, not written"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one warm run per row, no planner")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; python {sys.version.split()[0]}; "
          f"{_bytecode()}")
    print("1. tpsim estimate (subprocess, process start included)")
    rows = bench_estimate(1 if args.quick else 3)
    print("\n" + table(rows) + "\n")
    print("2. collective curves in-process (CollectiveModel.axis_curve)")
    bench_curves()
    if not args.quick:
        print("\n3. tpsim plan --model llama3-405b --cluster dgx-h100 --gpus 16384 --global-batch 2048")
        bench_plan()
    print(f"\nload average {os.getloadavg()[0]:.1f}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
