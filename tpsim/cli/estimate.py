"""``tpsim estimate``: step time, throughput, MFU and memory of one plan."""

from __future__ import annotations

import argparse
import json
import sys

from .common import (EXPORT_FORMATS, add_cluster_args, add_flops_arg, add_model_args, add_plan_args, add_stack_arg,
                     build_cluster, build_model, build_plan, build_stack, compute_model, format_estimate,
                     in_convention)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate", help="predict step time, throughput and memory of one plan",
        description="Predict the step time, throughput, MFU and memory per GPU of one training plan. With no "
                    "arguments: GPT-3 175B on 1024 A100s (dgx-a100) with the Megatron plan tp=8 pp=16 sp "
                    "selective recomputation.")
    add_estimate_args(p)
    from .train_time import add_train_args

    add_train_args(p)
    p.set_defaults(func=run)


def add_estimate_args(p: argparse.ArgumentParser) -> None:
    """Model, cluster, plan, profile, stack, traced-model and ``--from`` flags (estimate, train-time)."""
    add_model_args(p, default=None)
    add_cluster_args(p)
    add_plan_args(p)
    p.add_argument("--profile", help="kernel profile CSV (tpsim profile) for compute times instead of the kernel "
                                     "model (measured kernels override the model where the profile has points)")
    add_stack_arg(p)
    add_flops_arg(p)
    p.add_argument("--tp-plan", help="traced models (--model X.ops.json): YAML of TP plan overrides "
                                     "(docs/OPGRAPH.md)")
    p.add_argument("--conv-profile", help="traced models: measured convolution kernels "
                                          "(python -m tpsim.profiler.conv) for their convolutions")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--explain", action="store_true",
                   help="also print each term of the step time with the kernel data, device figure or stack rule it "
                        "came from (the --json field terms)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="read the plan (and model shape, GPU count) from a launch config: a Megatron command line "
                        "or script, a torchtitan TOML, a DeepSpeed JSON or launch script, a NeMo YAML, or a "
                        "`tpsim export` folder; plan flags given here override the file's (docs/EXPORT.md)")
    p.add_argument("--from-format", choices=EXPORT_FORMATS,
                   help="format of --from when its name does not tell (default: from the file suffix)")


def run(args: argparse.Namespace) -> int:
    from ..estimator import estimate
    from ..io import is_opgraph_path

    if args.model and is_opgraph_path(args.model):  # a traced model (tpsim trace)
        from .graph import run_estimate
        from .train_time import refuse_tokens

        refuse_tokens(args, "a traced model (--model *.ops.json)")
        return run_estimate(args)
    from .train_time import require_tokens

    require_tokens(args)  # before the plan's notes reach stderr: a refusal is one line
    note = ""
    if args.from_file:
        from .export import from_launch_file

        model, cluster, plan, note = from_launch_file(args)
    else:
        args.model = "gpt3-175b" if args.model is None else args.model  # an empty --model is an error, not the default
        model = build_model(args)
        cluster = build_cluster(args, model)
        plan = build_plan(args, model, cluster, stack=build_stack(args, model))
    result = estimate(model, cluster, plan, compute=compute_model(args, cluster, model),
                      stack=build_stack(args, model))
    from ..runfit import banded

    result = banded(result, model, cluster)  # the band from measured runs' residuals (T7 band_basis)
    result = in_convention(result, model, args)

    from .train_time import format_train_time, whole_run

    run_figures = whole_run(args, model, cluster, result)
    from .common import print_plan_notes

    print_plan_notes(args)
    if args.json:
        if note:
            print(note, file=sys.stderr)
        data = result.to_dict()
        if run_figures is not None:
            data["train_time"] = run_figures.to_dict()
        print(json.dumps(data, indent=2, default=str))
    else:
        print((note + "\n\n" if note else "") + format_estimate(result, model)
              + ("\n\n" + format_train_time(run_figures) if run_figures is not None else ""))
        if args.explain:
            print("\n" + format_terms(result))
    return 0


def format_terms(e) -> str:
    """The step-time terms (docs/SCHEMAS.md T6) with their share and where each comes from."""
    import textwrap

    lines = [f"step time terms (slowest rank; they sum to {e.step_time_s:.3f} s)"]
    for name, seconds in e.terms.items():
        share = 100.0 * seconds / e.step_time_s if e.step_time_s > 0 else 0.0
        lines.append(f"  {name:10s} {seconds:10.4f} s {share:5.1f}%")
        source = e.term_sources.get(name, "")
        if source:
            lines += textwrap.wrap(source, width=108, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)
