"""``tpsim bench-collectives``: measure collectives with torch.distributed on this machine (CSV)."""

from __future__ import annotations

import argparse

from .common import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench-collectives", help="measure collectives with torch.distributed ranks on this machine",
        description="Spawn --nproc ranks (one thread each, file-store rendezvous, process-group timeout) and "
                    "time collectives; write CSV columns backend, op, nranks, bytes, time_s (one row per "
                    "timed iteration). Feed the CSV to `tpsim calibrate`.")
    p.add_argument("--nproc", type=positive_int, default=2, help="ranks to spawn (default: %(default)s)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default: %(default)s")
    p.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "4M"],
                   help="buffer sizes, binary suffixes (nccl-tests convention; default: %(default)s)")
    p.add_argument("--ops", nargs="+", default=["all_reduce", "all_gather", "reduce_scatter"],
                   help="collectives: all_reduce all_gather reduce_scatter all_to_all broadcast")
    p.add_argument("--iters", type=positive_int, default=5, help="timed iterations per size (default: 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default: 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="process-group timeout, seconds (default: 60)")
    p.add_argument("--out", help="CSV file (default: print the CSV)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.collectives import run_bench, write_csv
    from ..units import parse_bytes

    sizes = [parse_bytes(s, "--sizes") for s in args.sizes]
    rows = run_bench(args.nproc, args.backend, sizes, args.ops, iters=args.iters, warmup=args.warmup,
                     timeout_s=args.timeout)
    text = write_csv(rows, args.out)
    if args.out:
        print(f"wrote {len(rows)} measurements to {args.out}")
    else:
        print(text, end="")
    return 0
