"""``tpsim report``: search, draw the five trade-off charts and write a Markdown report.

Example::

    tpsim report --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536 --out reports/gpt3-175b-1024xa100/

Writes ``README.md`` (the report), the charts as PNG and SVG, ``plans.csv`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from typing import Any

from ..errors import InputError
from .common import build_space, build_stack, count_arg, load_compute, real_arg
from .plan import add_problem_arguments, add_space_arguments, check_problem, load_problem, plan_space_work


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="write a Markdown report with the trade-off charts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p)
    add_space_arguments(p)
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--top", type=count_arg("top"), default=10, help="plans in the tables and the breakdown chart (10)")
    p.add_argument("--gpu-hour-price", type=real_arg("gpu_hour_price"), default=None,
                   help="dollars per GPU-hour for the cost column (default 1.0: GPU-hours per M tokens)")
    from .train_time import add_train_args

    add_train_args(p)
    p.add_argument("--scaling-span", type=int, default=None, metavar="K",
                   help="the scaling chart covers --gpus / K to --gpus x K in powers of two (default 8; counts "
                        "the cluster cannot hold are left out)")
    p.add_argument("--runs", metavar="RUNS.csv",
                   help="instead of a plan search: predicted vs measured step time of the measured runs in "
                        "RUNS.csv (docs/RUNS.md), with bands, before and after calibration (with --calibration "
                        "a `calibrate --from-runs` file, else each run calibrated leave-one-out on the others)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.add_argument("--force", action="store_true",
                   help="write into a folder that already holds a report (its files are replaced)")
    p.set_defaults(func=run, work=functools.partial(plan_space_work, objective="cost"))


def _reliability(args: argparse.Namespace) -> Any:
    if args.tokens is None:
        from .train_time import require_tokens

        require_tokens(args)
        return None
    from ..train import load_reliability

    return load_reliability(args.reliability)


def run(args: argparse.Namespace) -> int:
    from ..limits import LIMITS
    from ..report import ReportInputs, check_report_dir, write_report
    from ..report.analysis import SCALING_SPAN
    from ..search import DEFAULT_GPU_HOUR_PRICE
    from ..topology import load_cluster

    if args.runs:
        return runs_report(args)
    check_report_dir(args.out, force=args.force)
    price = args.gpu_hour_price if args.gpu_hour_price is not None else DEFAULT_GPU_HOUR_PRICE
    span = args.scaling_span if args.scaling_span is not None else SCALING_SPAN
    if not 1 <= span <= LIMITS["gpus"]:
        raise InputError(f"--scaling-span={span} must be between 1 and {LIMITS['gpus']}")
    if args.mem_limit_gib is not None:
        raise InputError("--mem-limit-gib is a `tpsim plan` option; a report shows every fitting plan")
    model, cluster_name, gpus, batch = load_problem(args)
    space = build_space(args, model)
    check_problem(args, model, space, cluster_name, gpus, "cost", batch)
    loader = functools.partial(load_cluster, calibration=args.calibration)
    compute = load_compute(args, loader(cluster_name, gpus=gpus), model)
    command = "tpsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["report"] else ""
    inputs = ReportInputs(model=model, cluster=cluster_name, gpus=gpus, global_batch=batch, space=space,
                          gpu_hour_price=price, top=args.top, compute=compute, command=command,
                          stack=build_stack(args, model), scaling_span=span, tokens=args.tokens,
                          reliability=_reliability(args), flops_convention=getattr(args, "flops_convention", None))
    log = (lambda s: None) if args.quiet else (lambda s: print(f"tpsim report: {s}", file=sys.stderr))  # noqa: ARG005 (a fixed signature)
    path = write_report(inputs, args.out, loader=loader, progress=not args.quiet, log=log, force=args.force)
    print(path)
    return 0


def runs_report(args: argparse.Namespace) -> int:
    """``report --runs RUNS.csv --out DIR [--calibration CAL.yaml]``."""
    from ..calibration import load_calibration
    from ..io import check_output_dir
    from ..report.runs import RUNS_REPORT_FILES, write_runs_report
    from ..runs import load_runs

    check_output_dir(args.out, "--out", force=args.force, protected=RUNS_REPORT_FILES)
    runs = load_runs(args.runs)
    cal = load_calibration(args.calibration) if args.calibration else None
    if cal is not None and "runs_fit" not in cal.provenance:
        raise InputError(f"--calibration {args.calibration}: not a `calibrate --from-runs` file (no runs_fit "
                         "section); report --runs compares against a calibration from runs")
    print(write_runs_report(runs, args.out, calibration=cal, source=args.runs))
    return 0
