"""``tpsim validate``: run the plan's real sharded layers through torch.distributed and compare the
measurements with the estimator's prediction (docs/VALIDATION.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import add_model_args, positive_int


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="run the plan's sharded layers with torch.distributed; predicted vs measured",
        description="Build one transformer block of the model in PyTorch, shard it with DTensor "
                    "(parallelize_module, the styles of the plan), run it on --nproc ranks launched by "
                    "torch.distributed.run, check numerics against the unsharded block and the collectives "
                    "against the cost model, and compare measured forward/backward/collective times with "
                    "the estimator's prediction. Writes reports/validation/<name>.csv and <name>.png.")
    add_model_args(p, default="gpt3-1.3b")
    g = p.add_argument_group("block and plan")
    g.add_argument("--tp", type=positive_int, default=2, help="tensor-parallel degree (default: %(default)s)")
    g.add_argument("--sp", action="store_true", help="sequence parallelism")
    g.add_argument("--fused", action="store_true", help="fused q/k/v (and gate/up) Linear layers")
    g.add_argument("--micro-batch", type=positive_int, default=3,
                   help="sequences per micro-batch (default 3: token counts 3 x 2^k lie between the profile's "
                        "grid points)")
    g.add_argument("--shard-of", type=positive_int, default=1, metavar="T",
                   help="run one rank's shard of tp=T as a tp=1 block (query/KV heads and FFN divided by T; "
                        "the single-GPU validation of per-shard shapes)")
    g.add_argument("--matrix", action="store_true",
                   help="run the validation matrix: tp {1,2} x sp on/off x hidden {512,1024,2048} x seq "
                        "{128,512} of the model's family, and summarise the error")
    r = p.add_argument_group("ranks")
    r.add_argument("--nproc", type=positive_int, help="ranks on this node (default: --tp; must equal tp)")
    r.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default: %(default)s")
    r.add_argument("--timeout", type=_positive_float, default=60.0,
                   help="process-group timeout of every collective and rendezvous, seconds (default: "
                        "%(default)s)")
    r.add_argument("--run-timeout", type=_positive_float, help="wall-clock limit of each launch, seconds")
    r.add_argument("--threads", type=positive_int, default=1, help="threads per rank (default: %(default)s)")
    r.add_argument("--nnodes", type=positive_int, default=1, help="nodes (default: %(default)s)")
    r.add_argument("--rdzv-endpoint", default="",
                   help="HOST:PORT of the c10d rendezvous, the same on every node (several nodes)")
    r.add_argument("--rdzv-id", default="tpsim-validate", help="rendezvous id shared by the nodes")
    m = p.add_argument_group("measurement and prediction")
    m.add_argument("--reps", type=positive_int, default=5, help="timed iterations (default: %(default)s)")
    m.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default: %(default)s)")
    m.add_argument("--cluster", default=None,
                   help="topology the ranks run on (default: local-cpu for gloo, hgx-h200 for nccl)")
    m.add_argument("--profile", help="kernel profile CSV (default: the newest profiles/<cpu|cuda>-*.csv)")
    m.add_argument("--no-profile", action="store_true", help="predict compute with the roofline")
    m.add_argument("--calibration", help="collective calibration YAML (default: measure one first with "
                                         "tpsim bench-collectives + tpsim calibrate)")
    m.add_argument("--no-calibrate", action="store_true",
                   help="predict collectives with the topology's own figures")
    m.add_argument("--no-overhead", action="store_true",
                   help="do not add the framework overhead (measured on a tiny twin of the block first) to "
                        "the prediction")
    m.add_argument("--budget", type=_positive_float, default=300.0,
                   help="scale a case down (sequence, then micro-batch) until one rank's predicted run time "
                        "is under this many seconds (default: %(default)s)")
    t = p.add_argument_group("traced models (--model X.ops.json, docs/OPGRAPH.md)")
    t.add_argument("--module-spec", help="the model's factory (default: the one the op graph was traced from)")
    t.add_argument("--kwarg", action="append", default=[], metavar="NAME=VALUE",
                   help="factory keyword argument (default: the traced ones), repeatable")
    t.add_argument("--tp-plan", help="YAML of TP plan overrides")
    o = p.add_argument_group("output")
    o.add_argument("--name", help="report name (default: derived from the case, or matrix-<family>-<backend>)")
    o.add_argument("--out-dir", default=None, help="report folder (default: reports/validation)")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..validate.case import Case
    from ..validate.launch import LaunchConfig, RankFailure
    from ..validate.run import REPORTS_DIR, Options, matrix_cases, validate
    from .common import build_model

    from ..opgraph.schema import is_opgraph_path
    if is_opgraph_path(args.model):  # a traced model (tpsim trace)
        from .graph import run_validate
        return run_validate(args)
    model = build_model(args)
    if args.shard_of > 1:
        from ..validate.shard import shard_model
        if args.tp != 1 or args.matrix:
            raise InputError(f"--shard-of={args.shard_of} runs one shard at --tp=1 (got --tp={args.tp}"
                             f"{', --matrix' if args.matrix else ''})")
        model = shard_model(model, args.shard_of)
    if args.warmup < 0:
        raise InputError(f"--warmup={args.warmup} must be >= 0")
    nproc = args.nproc or args.tp // args.nnodes
    if args.matrix:
        cases = matrix_cases(model, fused=args.fused, micro_batch=args.micro_batch, reps=args.reps,
                             warmup=args.warmup)
        name = args.name or f"matrix-{model.family}-{args.backend}"
    else:
        if nproc * args.nnodes != args.tp:
            raise InputError(f"--nproc={nproc} x --nnodes={args.nnodes} must equal --tp={args.tp} "
                             "(one TP group per run)")
        cases = [Case(model=model, tp=args.tp, sp=args.sp, fused=args.fused, micro_batch=args.micro_batch,
                      reps=args.reps, warmup=args.warmup)]
        name = args.name or f"{cases[0].name}-{args.backend}"
    cfg = LaunchConfig(nproc=nproc if not args.matrix else 1, backend=args.backend, timeout_s=args.timeout,
                       threads=args.threads, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint,
                       rdzv_id=args.rdzv_id, run_timeout_s=args.run_timeout)
    opts = Options(cluster=args.cluster or ("hgx-h200" if args.backend == "nccl" else "local-cpu"),
                   profile=Path(args.profile) if args.profile else None, use_profile=not args.no_profile,
                   calibrate=not args.no_calibrate,
                   calibration=Path(args.calibration) if args.calibration else None,
                   out_dir=Path(args.out_dir) if args.out_dir else REPORTS_DIR, budget_s=args.budget,
                   overhead=not args.no_overhead)
    try:
        report = validate(cases, cfg, opts, name)
    except RankFailure as exc:
        print(f"tpsim validate: error: {exc}", file=__import__("sys").stderr)
        return 1
    if report.get("note"):
        print(report["note"])
        return 0
    if args.json:
        slim = {k: v for k, v in report.items() if k != "cases"}
        slim["cases"] = [{k: v for k, v in s.items() if k not in ("samples_s",)} for s in report["cases"]]
        print(json.dumps(slim, indent=1, default=str))
    else:
        print(format_report(report))
    return 0 if report["numerics_ok"] and report["collectives_match"] else 1


def format_report(report: dict) -> str:
    """Readable table: one block per case, a line per phase."""
    lines = []
    for s in report["cases"]:
        lines.append(f"{s['case']}  numerics {'ok' if s['numerics_ok'] else 'FAIL'} (max rel err "
                     f"{s['numerics_max_rel_err']:.1e})  collectives {'match' if s['collectives_match'] else 'MISMATCH'}"
                     f"  compute: {s['compute_model']}" + (f"  scaled: {s['scaled']}" if s["scaled"] else ""))
        if s.get("framework_overhead_s"):
            o = s["framework_overhead_s"]
            lines.append(f"  framework overhead (tiny twin, in the prediction): fwd {o['fwd'] * 1e3:.2f} ms, "
                         f"bwd {o['bwd'] * 1e3:.2f} ms")
        for p in s["phases"]:
            pred = "-" if p["predicted_s"] is None else f"{p['predicted_s'] * 1e3:10.3f} ms"
            err = "" if p["error_pct"] is None else f"{p['error_pct']:+7.1f}%"
            lines.append(f"  {p['name']:<22} predicted {pred:>13}  measured {p['measured_s'] * 1e3:10.3f} ms  {err}")
    e = report["layer_error"]
    if e["cases"]:
        lines.append(f"fwd+bwd per layer, {e['cases']} case(s): median |error| {e['median_abs_error_pct']:.1f}%, "
                     f"worst {e['worst_abs_error_pct']:.1f}%")
    lines.append(f"report: {report['csv']}" + (f", chart: {report['chart']}" if report.get("chart") else ""))
    return "\n".join(lines)
