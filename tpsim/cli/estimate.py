"""``tpsim estimate``: step time, throughput, MFU and memory of one plan."""

from __future__ import annotations

import argparse
import json
import sys

from .common import (add_cluster_args, add_model_args, add_plan_args, add_stack_arg, build_cluster, build_model,
                     build_plan, build_stack)
from .export import FORMATS as EXPORT_FORMATS


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


def compute_model(args: argparse.Namespace, cluster, model=None):
    """None (the estimator's default compute model) or ``--profile``'s measured kernels, falling back to the
    default model (the stack's attention implementation) where the profile has no points."""
    if not getattr(args, "profile", None):
        return None
    from ..compute.profile import ProfileModel
    from ..estimator.context import default_compute

    return ProfileModel(args.profile, fallback=default_compute(cluster.device, build_stack(args, model))[0])


def run(args: argparse.Namespace) -> int:
    from ..estimator import estimate
    from ..opgraph.schema import is_opgraph_path

    if args.model and is_opgraph_path(args.model):  # a traced model (tpsim trace)
        from .graph import run_estimate
        from .train_time import refuse_tokens

        refuse_tokens(args, "a traced model (--model *.ops.json)")
        return run_estimate(args)
    note = ""
    if args.from_file:
        from .export import from_launch_file

        model, cluster, plan, note = from_launch_file(args)
    else:
        args.model = "gpt3-175b" if args.model is None else args.model  # an empty --model is an error, not the default
        model = build_model(args)
        cluster = build_cluster(args, model)
        plan = build_plan(args, model, cluster)
    result = estimate(model, cluster, plan, compute=compute_model(args, cluster, model),
                      stack=build_stack(args, model))
    from ..runfit import banded

    result = banded(result, model, cluster)  # the band from measured runs' residuals (T7 band_basis)
    from .train_time import format_train_time, whole_run

    run_figures = whole_run(args, model, cluster, result)
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


def _pm(value: float, low: float, high: float) -> str:
    """"+x%/-y%" of a band around a value (one "±x%" when symmetric to 0.1%)."""
    up, down = 100 * (high / value - 1), 100 * (1 - low / value)
    return f"±{up:.1f}%" if abs(up - down) < 0.05 else f"+{up:.1f}%/-{down:.1f}%"


def _basis(e) -> str:
    """What set the band, for the text output."""
    b = e.band_basis
    if not b or b.get("kind") == "prior":
        return ""
    return f" from {b['n']} {'calibration ' if b['kind'] == 'calibrated' else ''}runs' residuals: {b['group']}"


def _runs(values: list[int]) -> str:
    """``2+3x30+2``: equal neighbours folded."""
    runs: list[list[int]] = []
    for n in values:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(f"{n}x{k}" if k > 1 else f"{n}" for n, k in runs)


def _split_text(split: dict) -> str:
    """``layers per rank 13+16x3 (chunks 2x20+1+...)``: the pipeline split the estimate costs."""
    ranks, chunks = split["layers_per_rank"], split["layers_per_chunk"]
    out = f"layers per rank {_runs(ranks)}"
    if len(chunks) > len(ranks):
        out += f" (chunks in model order {_runs(chunks)})"
    return out


def format_estimate(e, model=None) -> str:
    """The estimate as text; with ``model`` (a ModelSpec) its summary comes first."""
    p = e.plan
    b, m = e.breakdown, e.memory_gib
    lines = [
        *(model.summary().splitlines() if model is not None else [f"model    {e.model}"]),
        f"cluster  {e.cluster['name']}: {e.cluster['gpus']} x {e.cluster['device']}",
        f"stack    {e.stack}",
        f"plan     {p.short()}  (global batch {p.global_batch}, {p.num_microbatches} micro-batches per replica,"
        f" {p.dtype}, {p.attention} attention, order {p.order})",
        *([f"pipeline {_split_text(e.pipeline_split)}"] if e.pipeline_split else []),
        f"compute  {e.compute_model}" + (f" ({100 * e.measured_compute_fraction:.0f}% of compute time measured)"
                                         if e.compute_model.startswith("profile") else ""),
        "",
        f"step time            {e.step_time_s:10.3f} s  {_pm(e.step_time_s, e.step_time_s_low, e.step_time_s_high)}"
        f"  ({e.step_time_s_low:.3f}-{e.step_time_s_high:.3f} s, 90% band{_basis(e)})",
        f"throughput           {e.tokens_per_s:10.0f} tokens/s  ({e.tokens_per_s_low:.0f}-{e.tokens_per_s_high:.0f})",
        f"model TFLOP/s/GPU    {e.model_tflops_per_gpu:10.1f}   MFU {100 * e.mfu:5.1f}%"
        f" ({100 * e.mfu_low:.1f}-{100 * e.mfu_high:.1f}%)",
        f"hardware TFLOP/s/GPU {e.hardware_tflops_per_gpu:10.1f}   HFU {100 * e.hfu:5.1f}%",
        "",
        "time breakdown (s)   " + "  ".join(f"{k} {b[k]:.3f}" for k in
                                            ("compute", "recompute", "bubble", "optimizer", "exposed_comm",
                                             "overhead")),
        "communication (s)    " + "  ".join(f"{k} {b[k]:.3f}" for k in ("tp_comm", "pp_comm", "dp_comm")
                                            + tuple(k for k in ("cp_comm", "ep_comm") if b.get(k)))
        + "  (totals, partly hidden)",
        "",
        f"memory per GPU       {e.peak_memory_gib:10.2f} GiB  "
        f"({'fits' if e.fits else 'DOES NOT FIT'})",
        "  " + "  ".join(f"{k} {v:.2f}" for k, v in m.items()),
    ]
    if e.collectives:
        lines.append("collectives          " + "; ".join(f"{k} {v}" for k, v in e.collectives.items()))
    for w in e.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
