"""``tpsim bench-collectives``: measure collectives with torch.distributed on this machine (CSV)."""

from __future__ import annotations

import argparse

from ..errors import InputError
from .common import count_arg, real_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench-collectives", help="measure collectives with torch.distributed ranks on this machine",
        description="Spawn --nproc ranks (one thread each, file-store rendezvous, process-group timeout) and "
                    "time collectives; write CSV columns backend, op, nranks, bytes, time_s (one row per "
                    "timed iteration). Feed the CSV to `tpsim calibrate`.")
    p.add_argument("--nproc", type=count_arg("nproc"), default=2, help="ranks to spawn (default: %(default)s)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default: %(default)s")
    p.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "4M"],
                   help="buffer sizes, binary suffixes (nccl-tests convention; default: %(default)s)")
    p.add_argument("--ops", nargs="+", default=["all_reduce", "all_gather", "reduce_scatter"],
                   help="collectives: all_reduce all_gather reduce_scatter all_to_all broadcast")
    p.add_argument("--iters", type=count_arg("iters"), default=5, help="timed iterations per size (default: 5)")
    p.add_argument("--warmup", type=count_arg("warmup", minimum=0), default=2, help="untimed iterations first (default: 2)")
    p.add_argument("--timeout", type=real_arg("timeout_s"), default=60.0, help="process-group timeout, seconds (default: 60)")
    p.add_argument("--out", help="CSV file (default: print the CSV); checked before measuring")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.collectives import run_bench, write_csv
    from ..io import check_output_file
    from ..units import parse_bytes

    if args.out is not None:  # before measuring: a bad destination must not cost the measurements
        check_output_file(args.out, "--out", force=args.force)
    sizes = [parse_bytes(s, "--sizes") for s in args.sizes]
    check_memory(args.nproc, sizes)
    rows = run_bench(args.nproc, args.backend, sizes, args.ops, iters=args.iters, warmup=args.warmup,
                     timeout_s=args.timeout)
    if args.out is None:
        print(write_csv(rows, None), end="")
        return 0
    try:
        write_csv(rows, args.out)
    except InputError as exc:  # the destination broke during the run: keep the measurements elsewhere
        from ..io import fallback_path

        spare = fallback_path("tpsim-bench-collectives", ".csv")
        write_csv(rows, spare)
        raise InputError(f"{exc}; the {len(rows)} measurements were saved to {spare}") from None
    print(f"wrote {len(rows)} measurements to {args.out}")
    return 0


def check_memory(nproc: int, sizes: list[int]) -> None:
    """Refuse, before any rank starts, more ranks or larger buffers than this machine's memory holds: each
    rank imports torch and holds about two buffers of the largest size (nccl-tests convention)."""
    from ..limits import RANK_PROCESS_BYTES, available_memory, check_local_ranks

    free = available_memory()
    check_local_ranks(nproc, "--nproc", free)
    need = nproc * (RANK_PROCESS_BYTES + 2 * max(sizes))
    if free and need > free:
        raise InputError(f"--sizes {max(sizes):,} bytes on --nproc={nproc} ranks needs about {need / 2**30:.1f} GiB "
                         f"(two buffers per rank); this machine has {free / 2**30:.1f} GiB available")
