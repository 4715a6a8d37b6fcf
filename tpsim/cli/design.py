"""``tpsim design SWEEP.yaml --out DIR``: sweep cluster designs x models x the whole plan space (docs/DESIGN.md).

Writes DIR/table.csv and table.parquet (one row per design: axes, best plan, step time, tokens/s, MFU,
communication share, memory headroom, ideal and expected days, goodput, cost and energy for the token budget), DIR/frontier.csv (cost vs time),
the charts (tradeoff, value, cost_time, multiples: .png with their .csv) and DIR/results.jsonl (the finished
planning tasks: an interrupted sweep resumes from it). ``--explain A B`` compares two designs of DIR.
"""

from __future__ import annotations

import argparse
import os
import sys

MAX_JOBS = 4096


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer") from None
    if not 1 <= value <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{value} must be between 1 and {MAX_JOBS}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser("design", help="sweep cluster designs (hardware, network) x models x plans",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", nargs="?", help="sweep file (YAML; schema in docs/DESIGN.md)")
    p.add_argument("--out", required=True, help="output folder (created; an interrupted sweep resumes from it)")
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="worker processes (default: every core; 1 = in this process)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local process pool (default) or a Ray cluster (pip install 'tpsim[ray]')")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--allow-large-sweep", action="store_true",
                   help="run a sweep of more than 20,000 designs (its size and estimated time are printed first)")
    p.add_argument("--force", action="store_true", help="replace the results of another sweep in --out")
    p.add_argument("--no-charts", dest="charts", action="store_false", help="write the tables only")
    p.add_argument("--explain", nargs=2, metavar=("A", "B"), default=None,
                   help="compare two designs (ids of the table's design column) of --out; runs nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError

    if args.explain:
        from ..design.explain import explain

        print(explain(args.out, *args.explain))
        return 0
    if not args.sweep:
        raise InputError("design: SWEEP.yaml is required (or --explain A B with --out)")
    if args.address and args.engine != "ray":
        raise InputError("--address needs --engine ray")
    from ..design import run_sweep, tasks_of
    from ..design.sweep import SECONDS_PER_TASK, _duration, load_sweep

    sweep = load_sweep(args.sweep, allow_large=args.allow_large_sweep or args.allow_large_work)
    jobs = args.jobs or os.cpu_count() or 1
    tasks, _ = tasks_of(sweep, __import__("pathlib").Path(args.out))
    dropped = f", {sweep.dropped} impossible left out" if sweep.dropped else ""
    print(f"sweep {sweep.name}: {len(sweep.designs):,} designs ({len(tasks):,} planning tasks{dropped}), about "
          f"{_duration(len(tasks) * SECONDS_PER_TASK / max(1, min(jobs, len(tasks))))} on {jobs} "
          f"{'Ray ' if args.engine == 'ray' else ''}worker{'s' if jobs > 1 else ''}", file=sys.stderr)
    result = run_sweep(sweep, args.out, jobs=jobs, engine=args.engine, address=args.address,
                       progress=not args.quiet and sys.stderr.isatty(), force=args.force, charts=args.charts)
    fits = sum(1 for r in result.rows if r["fits"])
    rate = result.plans / result.elapsed_s if result.elapsed_s > 0 else 0.0
    print(f"{len(result.rows):,} designs ({fits:,} with a plan that fits); {result.ran:,} of {result.tasks:,} "
          f"tasks run now, {result.plans:,} plans in {result.elapsed_s:.1f} s ({rate:,.0f} plans/s)")
    if not result.parquet:
        print("table.parquet not written: pyarrow is not installed (pip install 'tpsim[design]')")
    best = [r for r in result.rows if r["fits"]][:5]
    if best:
        print(f"best by {sweep.objective}:")
        for r in best:
            print(f"  {r['design']}  {r['model']}: {r['device']} NVL{r['nvlink_domain']} {r['fabric']} "
                  f"{r['nic_gbps']}G x{r['nics_per_gpu']} {r['gpus']} GPUs  {r['plan']}  "
                  f"{r['tokens_per_s']:,.0f} tok/s  {_num(r['expected_days'], '.1f')} days  "
                  f"${_num(r['cost_usd'], ',.0f')}")
    print(f"wrote {args.out}/table.csv, frontier.csv" + (", table.parquet" if result.parquet else "")
          + (", charts" if args.charts else ""))
    return 0


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
