"""``tpsim collective``: predicted time, algbw, busbw and algorithm of one collective on a cluster."""

from __future__ import annotations

import argparse
import json

from ..errors import InputError
from .common import positive_int

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collective", help="predict one collective (time, algbw, busbw, algorithm) on a cluster",
        description="Predict a collective with the topology's collective model: time, algorithm and bus bandwidth "
                    "(nccl-tests definitions, GB/s = 1e9 B/s) and the algorithm NCCL would pick. With --group, "
                    "every group of that plan axis runs at once and the slowest one is reported.")
    p.add_argument("--cluster", default="dgx-a100", help="cluster name or YAML path (default: %(default)s)")
    p.add_argument("--gpus", type=positive_int, help="GPUs in the cluster (default: the file's)")
    p.add_argument("--op", default="all_reduce", choices=OPS, help="collective (default: %(default)s)")
    p.add_argument("--bytes", default="1GiB",
                   help="buffer size, binary suffixes (4096, 64KiB, 256M, 1GiB; nccl-tests convention: "
                        "all_gather = gathered output); default %(default)s")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--ranks", help="one group of ranks: 0-7, 0,2,4,6 or 0-3,8-11 (default: all GPUs)")
    who.add_argument("--group", choices=("tp", "dp", "pp"), help="every group of this axis of --plan at once")
    p.add_argument("--plan", help='plan sizes for --group, e.g. "tp=8,pp=2" (dp = the rest; order=tp-dp-pp)')
    p.add_argument("--algo", help="keep only candidates starting with these names, comma-separated "
                                  "(like NCCL_ALGO: ring, tree, nvls, hierarchical, direct, p2p)")
    p.add_argument("--calibration", help="calibration YAML written by `tpsim calibrate`")
    p.add_argument("--sweep", action="store_true", help="table over sizes 1 KiB .. 8 GiB (like nccl-tests)")
    p.add_argument("--json", action="store_true", help="JSON: time_s, algbw_GBps, busbw_GBps, algorithm")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..collectives.model import CollectiveModel, get_collective_model
    from ..topology import load_cluster
    from ..units import parse_bytes

    nbytes = parse_bytes(args.bytes, "--bytes")
    cluster = load_cluster(args.cluster, gpus=args.gpus)
    groups = select_groups(args, cluster.num_gpus)
    model = CollectiveModel(cluster, args.calibration) if args.calibration else get_collective_model(cluster)
    algos = [a.strip() for a in args.algo.split(",") if a.strip()] if args.algo else None
    sizes = [1 << e for e in range(10, 34)] if args.sweep else [nbytes]
    results = [model.run(args.op, s, groups, algos) for s in sizes]
    if args.json:
        rows = [r.to_dict() for r in results]
        print(json.dumps(rows if args.sweep else rows[0], indent=2))
    elif args.sweep:
        print(_header(cluster, args.op, groups))
        print(format_sweep(results))
    else:
        print(_header(cluster, args.op, groups))
        print(format_result(results[0]))
    return 0


def select_groups(args: argparse.Namespace, num_gpus: int):
    """Every group of ``--group`` of ``--plan`` (an array groups x ranks: no Python object per GPU), or the
    one group of ``--ranks`` (default: all GPUs)."""
    if args.group:
        if not args.plan:
            raise InputError("--group needs --plan (for example --plan tp=8,pp=2)")
        import numpy as np

        from ..plan import parse_order
        from ..topology.placement import RankLayout

        tp, dp, pp, order = parse_plan_sizes(args.plan, num_gpus)
        layout = RankLayout.from_order(parse_order(order), tp=tp, dp=dp, pp=pp)
        return np.ascontiguousarray(layout.groups(args.group))
    if args.plan:
        raise InputError("--plan is only used with --group tp|dp|pp")
    if args.ranks:
        return (parse_ranks(args.ranks, num_gpus),)
    import numpy as np
    return np.arange(num_gpus, dtype=np.int64)[None, :]


def parse_plan_sizes(text: str, num_gpus: int) -> tuple[int, int, int, str]:
    """``tp=8,pp=2[,dp=4][,order=tp-dp-pp]`` -> (tp, dp, pp, order); dp defaults to the rest of the GPUs."""
    from ..plan import parse_order

    fields: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("tp", "dp", "pp", "order"):
            raise InputError(f"--plan item {item.strip()!r} is not tp=N, dp=N, pp=N or order=...")
        fields[key] = value.strip()
    sizes = {}
    for key in ("tp", "pp", "dp"):
        if key in fields:
            if not fields[key].isdigit() or int(fields[key]) < 1:
                raise InputError(f"--plan {key}={fields[key]!r} must be a positive integer")
            sizes[key] = int(fields[key])
    tp, pp = sizes.get("tp", 1), sizes.get("pp", 1)
    if num_gpus % (tp * pp):
        raise InputError(f"--plan tp={tp} x pp={pp} does not divide the cluster's {num_gpus} GPUs")
    dp = sizes.get("dp", num_gpus // (tp * pp))
    if tp * dp * pp != num_gpus:
        raise InputError(f"--plan tp={tp} x dp={dp} x pp={pp} = {tp * dp * pp} != the cluster's {num_gpus} GPUs")
    order = fields.get("order", "tp-dp-pp")
    parse_order(order)
    return tp, dp, pp, order


def parse_ranks(text: str, num_gpus: int) -> tuple[int, ...]:
    """``0-7``, ``0,2,4`` or ``0-3,8-11`` -> ranks (each in range, none twice)."""
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise InputError(f"--ranks {text!r}: {part!r} is not a rank or a range a-b")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise InputError(f"--ranks {text!r}: range {part} runs backwards")
        ranks += range(a, b + 1)
    bad = [r for r in ranks if r >= num_gpus]
    if bad:
        raise InputError(f"--ranks {text!r}: rank {bad[0]} is outside the cluster's {num_gpus} GPUs")
    if len(set(ranks)) != len(ranks):
        raise InputError(f"--ranks {text!r} lists a rank twice")
    return tuple(ranks)


def _header(cluster, op: str, groups) -> str:
    n = len(groups[0])
    what = f"{len(groups)} concurrent groups of {n} ranks" if len(groups) > 1 else f"1 group of {n} ranks"
    return (f"cluster    {cluster.name}: {cluster.num_gpus} x {cluster.device.name}\n"
            f"collective {op} on {what} (first: {_short(groups[0])})")


def _short(group) -> str:
    import numpy as np

    g = np.asarray(group, dtype=np.int64)
    if len(g) == 1:
        return f"rank {g[0]}"
    if np.all(np.diff(g) == 1):
        return f"ranks {g[0]}-{g[-1]}"
    return "ranks " + ",".join(map(str, g[:8].tolist())) + (",..." if len(g) > 8 else "")


def format_result(r) -> str:
    from ..units import format_bytes, format_seconds

    return (f"bytes      {format_bytes(r.nbytes)} ({r.nbytes})\n"
            f"time       {format_seconds(r.time_s)}\n"
            f"algbw      {r.algbw_GBps:.2f} GB/s\n"
            f"busbw      {r.busbw_GBps:.2f} GB/s\n"
            f"algorithm  {r.algorithm}")


def format_sweep(results) -> str:
    lines = [f"{'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  algorithm"]
    for r in results:
        lines.append(f"{r.nbytes:>12d} {r.time_s * 1e6:>12.2f} {r.algbw_GBps:>13.2f} {r.busbw_GBps:>13.2f}  "
                     f"{r.algorithm}")
    return "\n".join(lines)
