"""``tpsim export``: write the launch config of one plan for Megatron-LM, torchtitan, DeepSpeed or NeMo.

Examples::

    tpsim export --format megatron --out run/ --model llama3-70b --cluster dgx-h100 --gpus 64 --tp 8 --pp 4 --sp
    tpsim export --format all --out run/ --model llama3-8b --cluster h100-pcie --gpus 16 --tp 2 --zero 3

The files start with a header naming the model, the cluster and the prediction; a plan the framework's stack
cannot run (for example ZeRO-2 with pipeline stages on Megatron-LM or DeepSpeed) is refused with the rule.
Formats and keys: docs/EXPORT.md. ``tpsim estimate --from FILE`` reads them back.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from .common import (EXPORT_FORMATS, SHAPE_FLAGS, add_cluster_args, add_flops_arg, add_model_args, add_plan_args,
                     build_cluster, build_model, build_plan, cluster_ref, compute_model, in_convention, model_ref)

FORMATS = EXPORT_FORMATS
"""the export formats (tpsim.launch.FORMATS, repeated in tpsim/cli/common.py so that building the parser does not
import the exporters)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a plan's launch config (Megatron, torchtitan, DeepSpeed, NeMo)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_format_args(p, FORMATS + ("all",), required=True)
    add_model_args(p)
    add_cluster_args(p)
    add_plan_args(p)
    p.add_argument("--profile", help="kernel profile CSV for the prediction in the header (default: roofline)")
    p.add_argument("--no-predict", action="store_true", help="do not run the estimator (no prediction in the header)")
    add_flops_arg(p)
    p.set_defaults(func=run)


def add_format_args(p: argparse.ArgumentParser, choices: tuple[str, ...], required: bool) -> None:
    g = p.add_argument_group("export")
    g.add_argument("--format", dest="export_format", choices=choices, required=required,
                   help="launch format (all: every format that can run the plan)")
    g.add_argument("--out", required=required, metavar="DIR", help="folder for the files (created)")
    g.add_argument("--force", action="store_true", help="replace launch files already in --out")
    g.add_argument("--stack", default=None,
                   help="training-stack profile whose rules decide what can be exported (default: the format's: "
                        "megatron for megatron and nemo, torchtitan, deepspeed; or a profile YAML path)")


def run(args: argparse.Namespace) -> int:
    from ..estimator import estimate
    from ..launch import export_context, export_plan, export_violation, write_files

    from ..io import check_output_dir

    out_dir = check_output_dir(args.out, "--out", force=True, protected=())  # a usable folder, before any work
    held = sorted(os.listdir(out_dir)) if args.export_format == "all" and out_dir.is_dir() else []
    if held and not args.force:  # `--format all` writes one folder per format: it owns the whole --out
        names = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise InputError(f"--out {args.out} already holds {names}; --format all needs a new or empty folder "
                         f"(pass --force to write into it)")
    model = build_model(args)
    cluster = build_cluster(args, model)
    formats = FORMATS if args.export_format == "all" else (args.export_format,)
    from ..launch import format_stack

    plan = build_plan(args, model, cluster, stack=format_stack(formats[0], args.stack) if len(formats) == 1 else None)
    ref, overrides = model_ref(args, model)
    skipped = []
    jobs = []  # every format's files built and every destination checked before the first is written (all or
    for fmt in formats:  # nothing, issue 26: `--format all` exited 2 after writing two of four)
        out = args.out if len(formats) == 1 else f"{args.out}/{fmt}"
        stack = format_stack(fmt, args.stack)
        prediction = None
        if not args.no_predict and stack.plan_violation(plan, model) is None:
            # the prediction of the stack this format runs (each file heads with its own)
            prediction = in_convention(estimate(model, cluster, plan, compute=compute_model(args, cluster),
                                                stack=stack), model, args).to_dict()
        ctx = export_context(model, cluster, plan, model_ref=ref, cluster_ref=cluster_ref(args, model),
                             prediction=prediction, model_overrides=overrides)
        if len(formats) > 1:
            problem = export_violation(fmt, ctx, args.stack)
            if problem:
                skipped.append((fmt, problem))
                continue
        files = export_plan(fmt, ctx, args.stack)
        check_output_dir(out, "--out", force=args.force, protected=tuple(files))
        jobs.append((fmt, out, files))
    if not jobs:  # one line: every format's reason in it
        raise InputError(f"no format can run plan {plan.short()}: "
                         + "; ".join(f"{fmt}: {problem}" for fmt, problem in skipped))
    from .common import print_plan_notes

    print_plan_notes(args)
    for fmt, problem in skipped:
        print(f"skipped {fmt}: {problem}", file=sys.stderr)
    if len(formats) > 1 and not held:  # all or nothing: staged beside --out, renamed into place at the end
        _write_staged(jobs, out_dir)
        return 0
    for fmt, out, files in jobs:
        paths = write_files(files, out, force=args.force)
        print(f"{fmt}: " + ", ".join(str(p) for p in paths))
    return 0


def _write_staged(jobs: list, out_dir: Path) -> None:
    """Write every format's folder into a temporary folder beside ``out_dir`` (new or empty), then rename it
    into place: an interruption or a full disk leaves no half of an export (the stage is removed)."""
    import shutil
    import tempfile

    from ..io import make_output_dir
    from ..launch import write_files

    parent = make_output_dir(out_dir.parent if str(out_dir.parent) else Path("."), "--out")
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    try:
        lines = []
        for fmt, out, files in jobs:
            paths = write_files(files, stage / Path(out).name, force=False)
            lines.append(f"{fmt}: " + ", ".join(str(out_dir / Path(out).name / p.name) for p in paths))
        if out_dir.is_dir():
            out_dir.rmdir()  # empty (checked above); a file created there since is refused by rmdir
        os.replace(stage, out_dir)
    except OSError as exc:
        raise InputError(f"--out {out_dir}: cannot write the export ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print("\n".join(lines))


def from_launch_file(args: argparse.Namespace) -> tuple[Any, Any, Any, str]:
    """``tpsim estimate --from FILE``: the model, cluster and plan of a launch config, with the command line's
    model, cluster, GPU and plan flags on top; and the notes to show (flags ignored, approximations, the stack
    rule the plan breaks)."""
    from ..launch import FORMAT_STACK, describe_import, import_launch, resolve_model, resolve_plan
    from ..model import load_model, with_overrides
    from ..stacks import load_stack
    from ..topology import load_cluster
    from .common import plan_fields

    imp = import_launch(args.from_file, args.from_format)
    base = load_model(args.model) if args.model else None
    model = resolve_model(imp, base)
    model = with_overrides(model, **{k: getattr(args, k, None) for k in SHAPE_FLAGS})
    from ..model.overrides import with_moe_balance

    model = with_moe_balance(model, getattr(args, "moe_balance", None))  # --moe-balance was dropped with --from
    name = args.cluster or imp.cluster_ref or model.default_plan.get("cluster") or "dgx-a100"
    gpus = args.gpus or imp.gpus or (model.default_plan.get("gpus") if not args.cluster else None)
    cluster = load_cluster(name, gpus=gpus, calibration=getattr(args, "calibration", None))  # was dropped
    plan = resolve_plan(imp, model, cluster.num_gpus, global_batch=args.global_batch, overrides=plan_fields(args))
    note = describe_import(imp)
    runs_on = imp.stack or FORMAT_STACK[imp.format]
    problem = load_stack(runs_on).plan_violation(plan, model)
    if problem:
        note += f"\n  warning: the {imp.format} stack would refuse this plan: {problem}"
    elif not getattr(args, "stack", None):
        args.stack = runs_on  # estimate what the file's framework runs
    if imp.stack_overrides and getattr(args, "stack", None):
        from ..stacks import derived_stack

        args.stack = derived_stack(args.stack, imp.stack_overrides, f"launch file {imp.path}")
    return model, cluster, plan, note
