"""``tpsim estimate`` and ``tpsim plan`` for a traced model (``--model path.ops.json``): loading, the plan,
the search and the output. The verbs call in here when their ``--model`` names an op graph."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from ..errors import InputError

MODEL_OVERRIDES = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")


def load(args: argparse.Namespace) -> Any:
    """The OpGraphModel of ``--model`` with the ``--tp-plan`` overrides; preset overrides are refused."""
    from ..opgraph.model import load_graph_model

    given = [f"--{k.replace('_', '-')}" for k in MODEL_OVERRIDES if getattr(args, k, None) is not None]
    if given:
        raise InputError(f"{', '.join(given)} change a preset's shape; a traced model's shapes are its op graph's "
                         f"(trace it again with other --kwarg values)")
    return load_graph_model(args.model, getattr(args, "tp_plan", None))


def _cluster(args: argparse.Namespace) -> Any:
    from ..topology import load_cluster

    return load_cluster(args.cluster or "dgx-a100", gpus=args.gpus, calibration=getattr(args, "calibration", None))


def traced_flops_convention(args: argparse.Namespace) -> str:
    """A traced graph's model FLOPs are torch's FlopCounterMode count (``full``); other conventions need the
    transformer shape of a preset or config.json."""
    asked = getattr(args, "flops_convention", None)
    if asked not in (None, "full"):
        raise InputError(f"--flops-convention {asked}: a traced model's FLOPs are counted as torch's FlopCounterMode "
                         "counts them (full attention); use --flops-convention full or a preset / config.json")
    return "full"


def run_estimate(args: argparse.Namespace) -> int:
    from ..opgraph.estimate import estimate_graph, plan_notes
    from ..opgraph.model import make_graph_plan
    from .common import plan_fields
    from .common import compute_model, format_estimate

    traced_flops_convention(args)
    model = load(args)
    cluster = _cluster(args)
    model = model.with_gpus(cluster.num_gpus)
    plan = make_graph_plan(model, cluster.num_gpus, global_batch=args.global_batch, **plan_fields(args))
    result = estimate_graph(model, cluster, plan, compute=compute_model(args, cluster),
                            conv_times=conv_profile(args))
    styles = _plan_at(model, plan.tp)
    if args.json:
        d = result.to_dict()
        d["opgraph"] = {"path": model.path, "tokens_per_sample": model.graph.tokens_per_sample,
                        "conv_profile": getattr(args, "conv_profile", None),
                        "tp_plan": styles, "notes": plan_notes(model, plan.tp)}
        print(json.dumps(d, indent=2, default=str))
        return 0
    text = format_estimate(result)
    if model.graph.tokens_per_sample == 1:
        text = text.replace(" tokens/s", " samples/s")
    print(text)
    counts: dict[str, int] = {}
    for style in styles.values():
        counts[style] = counts.get(style, 0) + 1
    print("tp plan              " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "all replicated")
          + f" (of {sum(len(u.ops) for u in model.graph.units)} ops; `tpsim trace {model.path} --show`)")
    return 0


def conv_profile(args: argparse.Namespace) -> Any:
    """The ``--conv-profile`` file's tables, or None."""
    path = getattr(args, "conv_profile", None)
    if not path:
        return None
    from ..opgraph.convprofile import load_conv_profile
    return load_conv_profile(path)


def _plan_at(model: Any, tp: int) -> dict[str, str]:
    from ..opgraph.tp import styles_at

    styles, _ = styles_at(model.graph, model.tp_plan, tp)
    return {op.name: styles[u][j] for u, unit in enumerate(model.graph.units) for j, op in enumerate(unit.ops)
            if styles[u][j] != "replicate"}


def run_plan(args: argparse.Namespace) -> int:
    """``tpsim plan`` on an op graph: the same search and output, with the op-graph estimator."""
    from functools import partial

    from ..opgraph.estimate import estimate_graph, estimate_graph_batch
    from ..search import DEFAULT_GPU_HOUR_PRICE, search
    from .common import build_space, clusters_for, load_compute, plan_header, print_ranking, write_plan_csv

    if args.top <= 0:
        raise InputError(f"--top={args.top} must be a positive integer")
    model = load(args)
    if args.global_batch is None:
        raise InputError(f"--global-batch is required (samples per step; {model.name} is a traced model)")
    cluster = _cluster(args)
    clusters = clusters_for(args.cluster or "dgx-a100", int(cluster.num_gpus), args.objective,
                            getattr(args, "calibration", None))
    model = model.with_gpus(math.lcm(*(int(c.num_gpus) for c in clusters)))
    # the graph estimator models tp, pp, dp and ZeRO only: no context or expert parallelism
    for flag in ("cp", "ep"):
        if any(v != 1 for v in getattr(args, flag, None) or ()):
            raise InputError(f"--{flag} {' '.join(map(str, getattr(args, flag)))}: a traced model is planned "
                             f"without {'context' if flag == 'cp' else 'expert'} parallelism")
    space = dataclasses.replace(build_space(args, model), cp=(1,), ep=(1,))
    compute = load_compute(args, clusters[-1])
    conv = conv_profile(args)
    result = search(model, clusters, int(args.global_batch), space=space, objective=args.objective,
                    gpu_hour_price=args.gpu_hour_price if args.gpu_hour_price is not None else DEFAULT_GPU_HOUR_PRICE,
                    mem_limit_gib=args.mem_limit_gib, include_unfit=args.include_unfit, compute=compute,
                    progress=not args.no_progress and not args.json,
                    estimator=partial(estimate_graph_batch, conv_times=conv))
    result = dataclasses.replace(result, convention=traced_flops_convention(args))
    for i in result.ranking[:args.top]:  # the displayed plans' full estimates, by the op-graph estimator
        part = result.parts[int(result.columns["part"][i])]
        result.memo[str(int(i))] = estimate_graph(model, part.cluster, result.plan(int(i)), compute=compute,
                                                  conv_times=conv).to_dict()
    if args.csv:
        write_plan_csv(result, args.csv, args.top, force=args.force)
    if args.json:
        json.dump(result.to_json(args.top), sys.stdout, indent=1, allow_nan=False)
        print()
        return 0
    print(plan_header(result, model, clusters[-1], int(args.global_batch)))
    print_ranking(result, args)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """``tpsim validate`` on an op graph: the traced model sharded in its plan on --tp ranks."""
    from pathlib import Path

    from ..opgraph.spec import parse_kwargs
    from ..validate.launch import LaunchConfig, RankFailure
    from ..validate.run import REPORTS_DIR
    from ..validate.traced.run import TracedCase, format_traced, validate_traced

    model = load(args)
    if args.sp or args.fused or args.matrix or args.shard_of > 1:
        raise InputError("--sp, --fused, --matrix and --shard-of apply to transformer blocks; a traced model "
                         "runs its derived plan (tp, no sequence parallelism)")
    if args.nnodes != 1 or (args.nproc or args.tp) != args.tp:
        raise InputError(f"a traced model runs on one node with --nproc equal to --tp={args.tp}")
    if args.warmup < 0:
        raise InputError(f"--warmup={args.warmup} must be >= 0")
    case = TracedCase(model=model, tp=args.tp, module_spec=args.module_spec or "",
                      kwargs=parse_kwargs(args.kwarg) if args.module_spec else {}, reps=args.reps,
                      warmup=args.warmup)
    case.spec()  # no --module-spec: refused now, before the collectives are calibrated (minutes of ranks)
    from ..trace.child import DEFAULT_MEMORY_GIB, DEFAULT_TIMEOUT_S

    # the user's module runs in the ranks: bounded in time and memory like `tpsim trace`'s child (issue 26)
    memory_gib = args.memory_limit_gib if args.memory_limit_gib is not None else DEFAULT_MEMORY_GIB
    cfg = LaunchConfig(nproc=args.tp, backend=args.backend, timeout_s=args.timeout, threads=args.threads,
                       run_timeout_s=args.run_timeout if args.run_timeout is not None else DEFAULT_TIMEOUT_S,
                       memory_limit_bytes=int(memory_gib * 2**30))
    try:
        report = validate_traced(case, cfg, Path(args.out_dir) if args.out_dir else REPORTS_DIR,
                                 cluster=args.cluster or ("hgx-h200" if args.backend == "nccl" else "local-cpu"),
                                 profile=Path(args.profile) if args.profile else None,
                                 use_profile=not args.no_profile, calibrate=not args.no_calibrate,
                                 calibration=Path(args.calibration) if args.calibration else None)
    except RankFailure as exc:
        print(f"tpsim validate: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1, default=str) if args.json else format_traced(report))
    return 0 if report["numerics_ok"] and report["collectives_match"] else 1
