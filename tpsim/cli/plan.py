"""``tpsim plan``: rank every valid sharding plan for a model on a cluster.

Examples::

    tpsim plan --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536 --top 5
    tpsim plan --model llama3-70b --cluster dgx-h100 --gpus 64 --max-tp 8 --json
    tpsim plan --model llama3-8b --cluster dgx-h100 --gpus 64 --objective cost --gpu-hour-price 2.5 --why
    tpsim plan --model llama3-70b --cluster dgx-h100 --gpus 64 --compare 1 3 "tp4 pp4 z1"

Plans equal up to the rank order or the DP-overlap flag that predict the same step time and memory are one row:
the ``ovl`` column then reads ``y,-``, ``order`` reads ``tp-dp-pp+2`` (two more orders), ``var`` counts
them, and ``--json`` lists them (``variants: [{order, overlap}, ...]``).

``--compare A B [C ...]`` prints plans side by side with the difference of every breakdown and memory term
from the first. Each is a rank of the ranking (``1`` or ``#1``) or a plan string, the best-ranked plan having
every field named: short forms as the table prints them (``"tp8 pp4 v2 dp2 sp sel z1 mb1 no-ovl dp-tp-pp"``)
or ``field=value`` (``"tp=8,pp=4,recompute=full"``); ``64g`` or ``gpus=64`` picks a GPU count of
``--objective cost``. A string naming tp, pp, dp and mb is read as a label of the table: the fields it leaves
out mean their defaults (no sp, no recomputation, ZeRO 0, overlap on, tp-dp-pp), so a copied label is that plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from ..errors import InputError
from ..pipeline import SCHEDULES
from .common import (EXPORT_FORMATS, add_cluster_args, add_dtype_arg, add_flops_arg, add_model_args,  # noqa: F401
                     add_stack_arg, build_model, build_space, build_stack, cluster_and_gpus, cluster_ref,
                     clusters_for, count_arg, flops_convention, format_pareto, format_table, format_ties,
                     format_why, gpu_counts_for, load_compute, model_ref, plan_header, print_ranking, real_arg,
                     sized_arg, write_plan_csv)

ORDER_CHOICES = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    """Model, cluster, GPU count and batch (shared groups of :mod:`tpsim.cli.common`); used by plan and report."""
    add_model_args(p)
    add_cluster_args(p)
    g = p.add_argument_group("batch and precision")
    g.add_argument("--global-batch", type=sized_arg("global_batch"), default=None,
                   help="sequences per step, suffixes allowed (1k = 1024) (default: the preset's)")
    add_dtype_arg(g, help="GEMM precision (default: the preset's, else bf16)")
    g.add_argument("--attention", default=None, choices=("flash", "unfused"), help="attention kernel (flash)")
    g.add_argument("--profile", default=None, metavar="CSV",
                   help="kernel profile CSV (tpsim profile) for compute times (default: the device's kernel model)")
    add_stack_arg(g)
    add_flops_arg(g)


def add_space_arguments(p: argparse.ArgumentParser) -> None:
    """Constraints that narrow the search space."""
    g = p.add_argument_group("search space (constraints)")
    g.add_argument("--tp", type=count_arg("tp"), nargs="+", default=None, help="only these tensor-parallel degrees")
    g.add_argument("--max-tp", type=count_arg("tp"), default=None, help="largest tensor-parallel degree")
    g.add_argument("--cp", type=count_arg("cp"), nargs="+", default=None,
                   help="only these context-parallel degrees (default: every divisor of the non-pipeline ranks)")
    g.add_argument("--max-cp", type=count_arg("cp"), default=None, help="largest context-parallel degree")
    g.add_argument("--cp-kind", nargs="+", default=None, choices=("ring", "a2a"),
                   help="only these context-parallel kinds (default both where cp > 1)")
    g.add_argument("--ep", type=count_arg("ep"), nargs="+", default=None,
                   help="only these expert-parallel degrees (MoE models; default: every divisor of the experts)")
    g.add_argument("--etp", type=count_arg("tp", minimum=0), nargs="+", default=None,
                   help="only these expert tensor-parallel degrees (0 = equal to tp; default: tp and 1)")
    g.add_argument("--pp", type=count_arg("pp"), nargs="+", default=None, help="only these pipeline degrees")
    g.add_argument("--no-pp", action="store_true", help="no pipeline parallelism (pp = 1)")
    g.add_argument("--vpp", type=count_arg("vpp"), nargs="+", default=None, help="only these virtual pipeline sizes")
    g.add_argument("--schedule", nargs="+", default=None, choices=SCHEDULES,
                   help="only these pipeline schedules (default: every schedule the stack offers, each with the "
                        "vpp values it runs; docs/MODEL.md \"Pipeline schedule\")")
    g.add_argument("--sp", choices=("on", "off"), default=None, help="sequence parallelism on/off (default both)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), nargs="+", default=None, help="only these ZeRO stages (0-3)")
    g.add_argument("--recompute", nargs="+", default=None, choices=("none", "selective", "full"),
                   help="only these recomputation modes")
    g.add_argument("--micro-batch", type=count_arg("micro_batch"), nargs="+", default=None, help="micro-batch sizes (default 1 2 4 8)")
    g.add_argument("--order", nargs="+", default=None, choices=ORDER_CHOICES, help="only these rank orders")
    g.add_argument("--no-overlap", action="store_true", help="only plans without DP overlap")
    g.add_argument("--mem-limit-gib", type=real_arg("mem_limit_gib"), default=None, help="reject plans above this peak memory per GPU")
    g.add_argument("--full-space", action="store_true",
                   help="enumerate the full product of the axes for a mixture-of-experts model too (by default "
                        "its space leaves out the plans the plan rules and the --stack reject: same ranking, "
                        "fewer plans; see docs/MODEL.md)")
    g.add_argument("--allow-large-space", action="store_true",
                   help="search a space that would take more than a minute at the measured search rate "
                        "(tpsim.limits.MAX_PLANS, 30 M plans; refused by default, saying how long it would take)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="rank every valid sharding plan (time, memory or cost)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p)
    add_space_arguments(p)
    o = p.add_argument_group("ranking and output")
    o.add_argument("--objective", default="time", choices=("time", "memory", "cost", "time-to-train", "energy"),
                   help="rank by step time, peak memory per GPU, $ per million tokens (with --tokens: $ of the "
                        "whole run), expected days of the whole run (--tokens) or its energy (--tokens); cost "
                        "and energy search GPU counts from one node up to --gpus")
    o.add_argument("--gpu-hour-price", type=real_arg("gpu_hour_price"), default=None,
                   help="dollars per GPU-hour for --objective cost (default 1.0: cost = GPU-hours per M tokens)")
    from .train_time import add_train_args

    add_train_args(p)
    o.add_argument("--top", type=count_arg("top"), default=10, help="plans to show (default 10)")
    o.add_argument("--distinct", action="store_true",
                   help="rank only the best plan of each distinct shape (tp, cp, pp, ep degrees and ZeRO stage)")
    o.add_argument("--include-unfit", action="store_true", help="also rank plans that do not fit (after fitting ones)")
    o.add_argument("--csv", default=None, metavar="FILE", help="write the ranked plans (--top of them) as CSV")
    o.add_argument("--force", action="store_true", help="replace an existing --csv file, or launch files in --out")
    o.add_argument("--json", action="store_true", help="print one JSON object (plans, evaluated, rejected)")
    o.add_argument("--why", action="store_true", help="show how many plans were rejected and why")
    o.add_argument("--pareto", action="store_true",
                   help="also print the Pareto fronts: step time vs. memory per GPU (and, with --objective cost, "
                        "throughput vs. GPUs); --json always holds them")
    o.add_argument("--compare", nargs="+", default=None, metavar="PLAN",
                   help="print these plans side by side with the difference of every breakdown and memory term "
                        "from the first: ranks (1, #3) or quoted plan strings (\"tp8 pp4 z1\", "
                        "\"tp=8,pp=4,recompute=full\"); see the description above")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--tp-plan", help="traced models (--model X.ops.json): YAML of TP plan overrides")
    o.add_argument("--conv-profile", help="traced models: measured convolution kernels "
                                          "(python -m tpsim.profiler.conv) for their convolutions")
    o.add_argument("--no-cache", action="store_true",
                   help="do not use the on-disk result cache ($TPSIM_CACHE_DIR or ~/.cache/tpsim; "
                        "keyed by a hash of every input and of tpsim's code)")
    v = p.add_argument_group("checking the ranking (tpsim validate, torch)")
    v.add_argument("--validate-top", type=count_arg("top"), default=None, metavar="K",
                   help="run scaled-down versions of the K best plans and a few lower-ranked ones on this "
                        "machine's ranks (--cluster local-cpu) and report whether the measured order agrees")
    v.add_argument("--validate-layers-per-chunk", type=count_arg("num_layers"), default=1,
                   help="layers per pipeline model chunk of those runs (default: %(default)s)")
    v.add_argument("--validate-name", default=None, help="report name (default: top-<model>-<cluster>-<gpus>)")
    v.add_argument("--validate-out-dir", default=None, help="report folder (default: reports/validation)")
    e = p.add_argument_group("export (docs/EXPORT.md)")
    e.add_argument("--export", dest="export_format", default=None, choices=EXPORT_FORMATS,
                   help="write the launch config of the best plan the framework can run (its stack's rules)")
    e.add_argument("--out", default=None, metavar="DIR",
                   help="folder for --export (rank<r>/ per plan with --export-top)")
    e.add_argument("--export-top", type=count_arg("top"), default=1, metavar="K",
                   help="export the K best plans the framework can run (default 1)")
    p.set_defaults(func=run, work=plan_space_work)


# ---------------------------------------------------------------------------------------------------------
def load_problem(args: argparse.Namespace) -> tuple[Any, str, int, int]:
    """(model, cluster name, GPU count, global batch) from the arguments, with the preset's defaults."""
    from ..topology import load_cluster

    model = build_model(args)
    name, gpus = cluster_and_gpus(args, model)
    gpus = int(load_cluster(name, gpus=gpus, calibration=args.calibration).num_gpus)
    batch = args.global_batch if args.global_batch is not None else model.global_batch
    if not batch:
        raise InputError(f"--global-batch is required (model {model.name} has no default global batch)")
    return model, name, gpus, int(batch)


def check_problem(args: argparse.Namespace, model: Any, space: Any, cluster_name: str, gpus: int,
                  objective: str, global_batch: int | None = None) -> None:
    """Refuse before searching: a space that the constraints leave empty (naming the constraint) or one
    above tpsim.limits.MAX_PLANS without --allow-large-space (a mixture-of-experts model's default space
    counted as pruned for ``global_batch`` under the --stack, as the search will enumerate it)."""
    from ..search.explain import check_space

    check_space(model, gpu_counts_for(cluster_name, gpus, objective), space,
                allow_large=getattr(args, "allow_large_space", False), global_batch=global_batch,
                stack=build_stack(args, model))


def plan_space_work(args: argparse.Namespace, objective: str | None = None) -> list[Any]:
    """The plan space as a work amount (tpsim.work, before the verb): the candidate plans over the GPU counts
    the objective searches, counted without building one (a mixture-of-experts default space as pruned);
    ``--allow-large-space`` (or ``--allow-large-work``) lifts the bound (tpsim.limits.MAX_PLANS)."""
    from ..limits import PLAN_SEARCH_RATE
    from ..io import is_opgraph_path
    from ..search.explain import _duration
    from ..search.space import space_size
    from ..work import Amount

    if is_opgraph_path(args.model) or getattr(args, "runs", None):
        return []
    model, cluster_name, gpus, batch = load_problem(args)
    space = build_space(args, model)
    objective = objective or getattr(args, "objective", None) or "throughput"
    counts = gpu_counts_for(cluster_name, gpus, objective)
    stack = build_stack(args, model)
    total = sum(space_size(model, n, space, batch, stack) for n in counts)
    where = f"{gpus} GPUs" if len(counts) == 1 else f"{len(counts)} GPU counts up to {max(counts)}"
    return [Amount("plans", total, f"the plan space of {model.name} on {where} of {cluster_name} (about "
                                   f"{_duration(total / PLAN_SEARCH_RATE)} at {PLAN_SEARCH_RATE:,} plans/s)")]


def run(args: argparse.Namespace) -> int:
    from ..io import check_output_dir, check_output_file
    from ..search import DEFAULT_GPU_HOUR_PRICE
    from ..search.cache import cached_search, compute_key_of, save_memo
    from ..search.explain import check_found

    from ..io import is_opgraph_path

    if args.csv is not None:
        check_output_file(args.csv, "--csv", force=args.force)
    if is_opgraph_path(args.model):  # a traced model (tpsim trace)
        from .graph import run_plan
        from .train_time import refuse_tokens

        refuse_tokens(args, "a traced model (--model *.ops.json)")
        return run_plan(args)
    if args.export_format and not args.out:
        raise InputError(f"--export {args.export_format} needs --out DIR")
    if args.export_format:
        check_output_dir(args.out, "--out", force=True, protected=())  # a usable folder, before the search
    model, cluster_name, gpus, batch = load_problem(args)
    space = build_space(args, model)
    check_problem(args, model, space, cluster_name, gpus, args.objective, batch)
    clusters = clusters_for(cluster_name, gpus, args.objective, args.calibration)
    search = cached_search if not args.no_cache else _uncached
    result = search(model, clusters, batch, space=space, objective=args.objective,
                    gpu_hour_price=args.gpu_hour_price if args.gpu_hour_price is not None else DEFAULT_GPU_HOUR_PRICE,
                    mem_limit_gib=args.mem_limit_gib, include_unfit=args.include_unfit,
                    compute=load_compute(args, clusters[-1], model), compute_key=compute_key_of(args.profile),
                    progress=not args.no_progress and not args.json, stack=build_stack(args, model),
                    **whole_run_options(args))
    check_found(result)
    result = result.in_convention(flops_convention(args))
    if getattr(args, "distinct", False):
        result = result.distinct_shapes()
    if args.csv is not None:
        write_plan_csv(result, args.csv, args.top, force=args.force)
    compared = _compare(result, args.compare)
    if args.json:
        data = result.to_json(args.top)
        from ..runfit import band_plan_dicts

        band_plan_dicts(data["plans"], model, clusters[-1], result.stack_name)  # bands from measured runs (T7)
        if compared is not None:
            from ..report.compare import comparison_json

            data["compare"] = comparison_json(compared)
        code = 0
        if args.validate_top:  # the validation goes in the JSON (issue 22), before anything is printed
            from ..validate.top import validate_top
            data["validate_top"] = validate_top(args, result, model, clusters[-1])
            code = 0 if data["validate_top"]["ok"] else 1
        json.dump(data, sys.stdout, indent=1, allow_nan=False)
        print()
        if args.export_format:
            _export(args, result, model, file=sys.stderr)
        save_memo(result)
        return code
    print(model.summary())
    print(plan_header(result, model, clusters[-1], batch))
    print_ranking(result, args, compared)
    line = _band_line(result, model, clusters[-1]) if compared is None and len(result) else None
    if line:
        print(line)
    if args.export_format:
        _export(args, result, model, file=sys.stdout)
    if args.validate_top:
        from ..validate.top import run_validate_top
        return run_validate_top(args, result, model, clusters[-1])
    return 0


def _band_line(result: Any, model: Any, cluster: Any) -> str | None:
    """The residual band of the best plan (as ``--json`` gives every plan's, docs/RUNS.md), with its basis."""
    from ..runfit import band_plan_dicts

    plans = result.to_json(1)["plans"][:1]
    if not plans:
        return None
    band_plan_dicts(plans, model, cluster, result.stack_name)
    d = plans[0]
    b = d.get("band_basis")
    if not b or "step_time_s_low" not in d:
        return None
    kind = "calibration runs" if b["kind"] == "calibrated" else "measured runs"
    return (f"band of #1: step time {d['step_time_s_low']:.3f}-{d['step_time_s_high']:.3f} s (90%, from the "
            f"residuals of {b['n']} {kind}: {b['group']})")


def whole_run_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tokens`` and ``reliability`` for the search (nothing without ``--tokens``)."""
    if getattr(args, "tokens", None) is None:
        from .train_time import require_tokens

        require_tokens(args)
        if args.objective in ("time-to-train", "energy"):
            raise InputError(f"--objective {args.objective} ranks whole runs: give the token budget, --tokens N")
        return {}
    from ..train import load_reliability

    return {"tokens": args.tokens, "reliability": load_reliability(args.reliability)}


def _compare(result: Any, refs: list[str] | None) -> Any:
    """The resolved plans of ``--compare`` (None without it)."""
    if refs is None:
        return None
    from ..report.compare import compare

    return compare(result, refs)


def _export(args: argparse.Namespace, result: Any, model: Any, file: Any) -> None:
    """Write the launch configs of the ``--export-top`` best ranked plans the format's stack can run."""
    from ..launch import export_context, export_plan, export_violation, format_stack, write_files

    picked, skipped = runnable_ranks(result, model, format_stack(args.export_format), args.export_top)
    if not picked:
        common = max(skipped, key=skipped.get) if skipped else "no ranked plan"
        raise InputError(f"--export {args.export_format}: none of the {len(result)} ranked plans can be run "
                         f"(most common reason: {common})")
    ref, overrides = model_ref(args, model)
    stack = format_stack(args.export_format)
    for rank, i in picked:
        cluster = result.parts[int(result.columns["part"][i])].cluster
        ctx = export_context(model, cluster, result.plan(i), model_ref=ref, cluster_ref=cluster_ref(args, model),
                             prediction=_format_prediction(result, i, model, cluster, stack),
                             model_overrides=overrides)
        problem = export_violation(args.export_format, ctx)
        if problem:
            print(f"export: rank {rank} skipped: {problem}", file=file)
            continue
        out = args.out if args.export_top == 1 else f"{args.out}/rank{rank}"
        paths = write_files(export_plan(args.export_format, ctx), out, force=args.force)
        print(f"export: rank {rank} ({result.label(i)}) -> " + ", ".join(str(p) for p in paths), file=file)
    if skipped:
        print(f"export: {sum(skipped.values())} better-ranked plans skipped ("
              + ", ".join(f"{k} {v}" for k, v in skipped.items()) + ")", file=file)


def _format_prediction(result: Any, i: int, model: Any, cluster: Any, stack: Any) -> dict[str, Any]:
    """The estimate of ranked row ``i`` under the stack the export format runs (the search's own row when it is
    that stack), in the result's FLOP convention: each file heads with its own stack's prediction."""
    if str(stack.name) == result.stack_name:
        return result.estimate_dict(i)
    from ..estimator import estimate
    from ..estimator.flops import convention_ratio

    e = estimate(model, cluster, result.plan(i), compute=result.compute, stack=stack)
    if result.flops_convention != e.flops_convention:
        e = e.in_convention(result.flops_convention, convention_ratio(model, result.flops_convention,
                                                                      e.flops_convention))
    return e.to_dict()


def runnable_ranks(result: Any, model: Any, stack: Any, k: int) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """(rank, row) of the first ``k`` ranked plans the stack runs, and {rule: count} of the ones skipped
    before them (one vectorized pass of the stack's rule table over the ranking)."""
    from ..plan import PlanBatch
    from ..stacks import count_violations

    c, idx = result.columns, result.ranking
    if not len(idx):
        return [], {}
    batch = PlanBatch.from_arrays(dtype=result.space.dtype, attention=result.space.attention,
                                  **{f: c[f][idx] for f in ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero",
                                                            "micro_batch", "global_batch", "overlap", "order",
                                                            "cp", "cp_kind", "ep", "etp")})
    codes = stack.violation_codes(batch, model)
    ok = np.flatnonzero(codes == 0)[:k]
    last = int(ok[-1]) + 1 if ok.size else len(idx)
    return [(int(r) + 1, int(idx[r])) for r in ok], count_violations(codes[:last])


def _uncached(*args: Any, compute_key: str = "", **kw: Any) -> Any:  # noqa: ARG001 (unused: kept for the callers)
    from ..search import search

    return search(*args, **kw)
