"""``tpsim validate``: run the plan's real sharded layers (one block, or every axis of the plan) through
torch.distributed and compare the measurements with the estimator's prediction (docs/VALIDATION.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .common import add_model_args, count_arg, real_arg

MATRIX_KINDS = ("all", "blocks", "plans", "axes")
MAX_CPU_RANKS_PER_CORE = 4
"""a CPU run with more ranks per core is refused: beyond timing claims (one rank per core) a few more still
check numerics and collectives in reasonable time; hundreds of processes would not finish."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="run the plan's sharded layers with torch.distributed; predicted vs measured",
        description="Run the plan for real on --nproc ranks launched by torch.distributed.run and compare with "
                    "the prediction. With tp only: one transformer block sharded with DTensor "
                    "(parallelize_module, the plan's styles). With --pp / --dp: the whole plan scaled down "
                    "(fewer layers, the same per-rank shapes where they fit) on a DeviceMesh over its axes: "
                    "DDP (ZeRO-0), a sharded optimizer (ZeRO-1), FSDP2 (ZeRO-2/3), torch.distributed.pipelining "
                    "(1F1B, interleaved with --vpp). Checks numerics (loss, gradients, the optimizer step) "
                    "against the unsharded model, every collective per mesh axis against the cost model, and "
                    "time per phase. Writes reports/validation/<name>.csv, .json and .png.")
    add_model_args(p, default="gpt3-1.3b")
    g = p.add_argument_group("plan")
    g.add_argument("--tp", type=count_arg("tp"), default=None,
                   help="tensor-parallel degree (default: 2; 1 with --cp or --ep)")
    g.add_argument("--cp", type=count_arg("cp"), default=1,
                   help="context-parallel degree: the sequence split over cp ranks with causal load balancing, "
                        "the attention core a ring of K/V exchanges or all-to-alls (default: %(default)s)")
    g.add_argument("--cp-kind", choices=("ring", "a2a"), default="ring",
                   help="ring (send/recv of K/V blocks, TransformerEngine p2p) or a2a (Ulysses all-to-all of heads "
                        "and sequence) (default: %(default)s)")
    g.add_argument("--ep", type=count_arg("ep"), default=1,
                   help="expert-parallel degree of a mixture-of-experts model's layer: routed experts split over ep "
                        "ranks, tokens dispatched and combined by all-to-all; the dense part runs as cp x dp ranks "
                        "(dp defaults to ep / cp) (default: %(default)s)")
    g.add_argument("--moe-ffn", type=count_arg("moe_ffn_hidden_size"),
                   help="override the routed (and shared) experts' FFN size of a mixture-of-experts model "
                        "(--ffn sets the dense MLP's)")
    g.add_argument("--pp", type=count_arg("pp"), default=1, help="pipeline stages (default: %(default)s)")
    g.add_argument("--vpp", type=count_arg("vpp"), default=1,
                   help="model chunks per pipeline rank, > 1: interleaved 1F1B (default: %(default)s)")
    g.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved-zb", "zbv", "dualpipev"),
                   help="pipeline schedule of a whole-plan run (torch.distributed.pipelining; zbv and dualpipev "
                        "run two model chunks per rank, --vpp 2) (default: %(default)s)")
    g.add_argument("--dp", type=count_arg("dp"), default=1, help="data-parallel replicas (default: %(default)s)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage over dp: 0 DDP, 1 sharded optimizer, 2 FSDP2 without resharding after "
                        "forward, 3 FSDP2 (default: %(default)s)")
    g.add_argument("--sp", action="store_true", help="sequence parallelism")
    g.add_argument("--fused", action="store_true", help="fused q/k/v (and gate/up) Linear layers")
    g.add_argument("--micro-batch", type=count_arg("micro_batch"), default=3,
                   help="sequences per micro-batch (default 3: token counts 3 x 2^k lie between the profile's "
                        "grid points)")
    g.add_argument("--microbatches", type=count_arg("global_batch"),
                   help="micro-batches per replica and step of a whole-plan run (default: 2 x pp, 2 without pp)")
    g.add_argument("--layers-per-chunk", type=count_arg("num_layers"), default=2,
                   help="layers per pipeline model chunk of a whole-plan run: layers = pp x vpp x this, unless "
                        "--layers is given (default: %(default)s)")
    g.add_argument("--fill-layers", action="store_true",
                   help="GPUs (--backend nccl): a whole-plan run with as many of the model's layers per chunk as "
                        "fit in the GPUs' memory (its full widths), instead of --layers-per-chunk; the report says "
                        "what was scaled (on CPU the scaled-down runs are kept)")
    g.add_argument("--order", default="tp-dp-pp", help="rank order, innermost first (default: %(default)s)")
    g.add_argument("--whole", action="store_true", help="run a whole-plan case even with tp only")
    g.add_argument("--shard-of", type=count_arg("tp"), default=1, metavar="T",
                   help="run one rank's shard of tp=T as a tp=1 block (query/KV heads and FFN divided by T; "
                        "the single-GPU validation of per-shard shapes)")
    g.add_argument("--matrix", nargs="?", const="all", choices=MATRIX_KINDS,
                   help="run the validation matrix: blocks (tp {1,2} x sp x hidden {512,1024,2048} x seq "
                        "{128,512}), plans (pp 2, interleaved, dp 2 with ZeRO 0-3, tp x dp, pp x tp), axes (cp 2 "
                        "ring and a2a, ep 2, cp 2 x ep 2) or all")
    r = p.add_argument_group("ranks")
    r.add_argument("--nproc", type=count_arg("nproc"), help="ranks on this node (default: tp x pp x dp / nnodes)")
    r.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default: %(default)s")
    r.add_argument("--timeout", type=real_arg("timeout_s"), default=60.0,
                   help="process-group timeout of every collective and rendezvous, seconds (default: "
                        "%(default)s)")
    r.add_argument("--run-timeout", type=real_arg("timeout_s"), help="wall-clock limit of each launch, seconds")
    r.add_argument("--threads", type=count_arg("threads"), default=1, help="threads per rank (default: %(default)s)")
    r.add_argument("--nnodes", type=count_arg("nnodes"), default=1, help="nodes (default: %(default)s)")
    r.add_argument("--rdzv-endpoint", default="",
                   help="HOST:PORT of the c10d rendezvous, the same on every node (several nodes)")
    r.add_argument("--rdzv-id", default="tpsim-validate", help="rendezvous id shared by the nodes")
    r.add_argument("--print-launch", choices=("torchrun", "slurm"),
                   help="print the command that runs this validation under your launcher and exit: a torchrun line "
                        "for every node, or an sbatch script (srun, one task per rank); started that way, each "
                        "rank joins the launch (RANK/WORLD_SIZE/MASTER_ADDR of torchrun, SLURM_PROCID/SLURM_NTASKS/"
                        "SLURM_NODELIST of srun) and rank 0 writes the report")
    m = p.add_argument_group("measurement and prediction")
    m.add_argument("--reps", type=count_arg("reps"), default=5, help="timed iterations (default: %(default)s)")
    m.add_argument("--repeat", type=count_arg("repeat"), default=1,
                   help="launches of the measured cases, fresh ranks each (the run-to-run spread of their medians; "
                        "default: %(default)s)")
    m.add_argument("--warmup", type=count_arg("warmup", minimum=0), default=2, help="untimed iterations first (default: %(default)s)")
    m.add_argument("--cluster", default=None,
                   help="topology the ranks run on (default: local-cpu for gloo, hgx-h200 for nccl)")
    m.add_argument("--profile", help="kernel profile CSV (default: the newest profiles/<cpu|cuda>-*.csv)")
    m.add_argument("--no-profile", action="store_true", help="predict compute with the roofline")
    m.add_argument("--no-probe", action="store_true",
                   help="do not check the profile against this machine first (~20 kernels, under 30 s)")
    m.add_argument("--reprofile", action="store_true",
                   help="if the profile is off by more than 10%% here, measure a quick profile instead of "
                        "rescaling it by the measured drift")
    m.add_argument("--calibration", help="calibration YAML: its link entries replace the collective measurement, "
                                         "its compute section (tpsim calibrate --from-validation) scales the "
                                         "profile and gives the host overhead")
    m.add_argument("--no-calibrate", action="store_true",
                   help="predict collectives with the topology's own figures")
    m.add_argument("--no-overhead", action="store_true",
                   help="do not add the framework overhead (measured on a tiny twin of the block first) to "
                        "the prediction")
    m.add_argument("--budget", type=real_arg("budget_s"), default=300.0,
                   help="scale a case down (sequence, then micro-batch) until one rank's predicted run time "
                        "is under this many seconds (default: %(default)s)")
    t = p.add_argument_group("traced models (--model X.ops.json, docs/OPGRAPH.md)")
    t.add_argument("--module-spec", help="the model's factory, package.module:fn or file.py:fn (required for an op graph: "
                   "the module recorded inside the graph file is never run)")
    t.add_argument("--kwarg", action="append", default=[], metavar="NAME=VALUE",
                   help="factory keyword argument (default: the traced ones), repeatable")
    t.add_argument("--tp-plan", help="YAML of TP plan overrides")
    t.add_argument("--memory-limit-gib", type=real_arg("mem_limit_gib"), default=None,
                   help="resident memory of each rank running the --module-spec model (default: 8 GiB); above it "
                        "the run stops as failed. Its wall-clock limit is --run-timeout (default here: 600 s)")
    o = p.add_argument_group("output")
    o.add_argument("--name", help="report name (default: derived from the case, or matrix-<family>-<backend>)")
    o.add_argument("--out-dir", default=None, help="report folder (default: reports/validation)")
    m.add_argument("--trace-terms", action=argparse.BooleanOptionalAction, default="auto",
                   help="whole plans: 3 more steps under torch.profiler on rank 0 and one rank per pipeline stage, "
                        "split into the step's terms by interval arithmetic (the terms' source where the "
                        "profiler's overhead is under 5%%; else the timers'); chrome traces in "
                        "<out-dir>/<name>-traces/. Default (neither flag): the same, stopped after the first "
                        "profiled step when it is over 5%% slower than the timed steps")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def check_out_dir(path: Path) -> Path:
    """A folder the report can be written to (created if missing), or an input error before anything runs."""
    from ..errors import InputError

    if path.exists() and not path.is_dir():
        raise InputError(f"--out-dir={str(path)!r} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tpsim-write-test-"):
            pass
    except OSError as exc:
        raise InputError(f"--out-dir={str(path)!r} is not a writable directory ({exc.strerror or exc})") from None
    return path


def check_backend(backend: str, nproc: int) -> None:
    """``--backend nccl`` needs as many CUDA devices as ranks on this node; asked of torch in a subprocess
    (this process stays torch-free), before any rank starts."""
    if backend != "nccl":
        return
    import subprocess
    from ..errors import InputError

    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        found = int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        found = 0
    if found < nproc:
        raise InputError(f"--backend=nccl needs {nproc} CUDA GPU(s) on this node; torch sees {found} "
                         "(use --backend gloo on CPU)")


def _plan_case(args: argparse.Namespace, model):  # noqa: ANN001, ANN202 - PlanCase
    from ..errors import InputError
    from ..model import with_overrides
    from ..validate.plan.case import PlanCase

    if args.schedule in ("zbv", "dualpipev") and args.vpp == 1:
        args.vpp = 2  # the V: two model chunks per rank
    chunks = args.pp * args.vpp
    layers = args.layers or chunks * args.layers_per_chunk
    if layers % chunks and not args.fill_layers:
        raise InputError(f"--layers={layers} is not a multiple of pp x vpp = {chunks}")
    m = args.microbatches or (2 * args.pp if args.pp > 1 else 2)
    from ..limits import check_int
    check_int("global_batch", args.dp * m * args.micro_batch, where="dp x microbatches x micro-batch")

    def make(n: int) -> PlanCase:
        return PlanCase(model=with_overrides(model, layers=n * chunks), tp=args.tp, pp=args.pp, vpp=args.vpp,
                        dp=args.dp, zero=args.zero, sp=args.sp, fused=args.fused, micro_batch=args.micro_batch,
                        microbatches=m, order=args.order, reps=args.reps, warmup=args.warmup,
                        pp_schedule=args.schedule)
    if not args.fill_layers:
        return make(layers // chunks)
    if args.backend != "nccl":
        raise InputError("--fill-layers runs the plan's full-size layers on GPUs (--backend nccl); on CPU the "
                         "scaled-down runs are kept (--layers-per-chunk)")
    import dataclasses

    from ..topology import load_cluster
    from ..validate.block.scale import layers_that_fit, memory_limit

    device = load_cluster(args.cluster or "hgx-h200").device  # the device only: any GPU count of the file
    limit = memory_limit(int(device.usable_memory_bytes), 1)
    n = layers_that_fit(make, model.num_layers // chunks, limit)
    case = make(n)
    if n * chunks == model.num_layers:
        return case
    return dataclasses.replace(case, scaled=f"layers {model.num_layers}->{n * chunks} (as many as fit in "
                                            f"{device.name} memory; widths unchanged)")


def _cases(args: argparse.Namespace, model) -> tuple[list, str]:  # noqa: ANN001
    from ..errors import InputError
    from ..limits import check_int
    from ..validate.block.case import Case
    from ..validate.run import matrix_cases, plan_matrix_cases

    if args.matrix:
        cases = matrix_cases(model, fused=args.fused, micro_batch=args.micro_batch, reps=args.reps,
                             warmup=args.warmup) if args.matrix in ("all", "blocks") else []
        if args.matrix in ("all", "plans"):
            cases += plan_matrix_cases(model, fused=args.fused, micro_batch=args.micro_batch)
        if args.matrix in ("all", "axes"):
            from ..validate.matrix import axis_matrix_cases
            cases += axis_matrix_cases(model, fused=args.fused, micro_batch=args.micro_batch, reps=args.reps,
                                       warmup=args.warmup)
        suffix = "" if args.matrix == "blocks" else f"-{args.matrix}"
        return cases, args.name or f"matrix-{model.family}-{args.backend}{suffix}"
    if args.cp > 1 or args.ep > 1:
        return _axis_case(args, model)
    whole = args.pp > 1 or args.dp > 1 or args.whole or args.fill_layers
    world = check_int("nproc", args.tp * args.pp * args.dp, where="tp x pp x dp")
    if args.backend == "gloo" and args.nnodes == 1 and world > MAX_CPU_RANKS_PER_CORE * (os.cpu_count() or 1):
        raise InputError(f"tp x pp x dp = {world} ranks on {os.cpu_count()} CPU cores: at most "
                         f"{MAX_CPU_RANKS_PER_CORE} ranks per core are run on CPU")
    nproc = args.nproc or world // args.nnodes
    if nproc * args.nnodes != world:
        raise InputError(f"--nproc={nproc} x --nnodes={args.nnodes} must equal tp x pp x dp = {world}")
    if whole:
        case = _plan_case(args, model)
    else:
        case = Case(model=model, tp=args.tp, sp=args.sp, fused=args.fused, micro_batch=args.micro_batch,
                    reps=args.reps, warmup=args.warmup)
    return [case], args.name or f"{case.name}-{args.backend}"


def check_names(args: argparse.Namespace) -> None:
    """Refuse before anything runs (issue 13): a report name that is not a plain file name (it would write
    outside --out-dir) and a rendezvous endpoint that is not HOST:PORT."""
    from ..errors import InputError
    from ..limits import show

    if args.name is not None and (not args.name.strip() or "/" in args.name or "\\" in args.name
                                  or args.name.startswith(".") or len(args.name) > 200):
        raise InputError(f"--name {show(args.name)}: a report name is a plain file name (no folders, not hidden)")
    if (args.nnodes > 1 and not args.print_launch) or args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"--rdzv-endpoint {show(args.rdzv_endpoint)} must be HOST:PORT (port 1-65535)")


def _axis_case(args: argparse.Namespace, model) -> tuple[list, str]:  # noqa: ANN001
    """A context- and/or expert-parallel layer on cp x dp ranks (tp 1): ``--cp``, ``--cp-kind``, ``--ep``."""
    from ..errors import InputError
    from ..validate.axis.case import AxisCase, moe_layer_model

    if args.tp != 1 or args.pp > 1 or args.zero or args.vpp > 1 or args.whole or args.sp:
        raise InputError(f"--cp/--ep run one context/expert-parallel layer with tp=1 and no --pp/--vpp/--zero/"
                         f"--sp/--whole (got --tp={args.tp}, --pp={args.pp}, --zero={args.zero})")
    dp = args.dp if args.dp > 1 else max(1, args.ep // args.cp)
    if (args.cp * dp) % args.ep:
        raise InputError(f"--ep={args.ep} does not divide cp x dp = {args.cp * dp} (the expert layer re-factors the "
                         "same ranks)")
    world = args.cp * dp
    if args.backend == "gloo" and args.nnodes == 1 and world > MAX_CPU_RANKS_PER_CORE * (os.cpu_count() or 1):
        raise InputError(f"cp x dp = {world} ranks on {os.cpu_count()} CPU cores: at most "
                         f"{MAX_CPU_RANKS_PER_CORE} ranks per core are run on CPU")
    if (args.nproc or world) != world or args.nnodes != 1:
        raise InputError(f"--cp/--ep cases run on one node with --nproc equal to cp x dp = {world}")
    case = AxisCase(model=moe_layer_model(model), cp=args.cp, cp_kind=args.cp_kind, ep=args.ep, dp=dp,
                    fused=args.fused, micro_batch=args.micro_batch, reps=args.reps, warmup=args.warmup)
    return [case], args.name or f"{case.name}-{args.backend}"


def _with_expert_ffn(args: argparse.Namespace, model):  # noqa: ANN001, ANN202
    from ..errors import InputError
    from ..validate.axis.case import with_expert_ffn
    if args.moe_ffn is None:
        return model
    if not model.is_moe:
        raise InputError(f"--moe-ffn needs a mixture-of-experts model; model {model.name} is dense")
    return with_expert_ffn(model, args.moe_ffn)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..validate.launch import LaunchConfig
    from ..validate.run import REPORTS_DIR
    from .common import build_model

    if args.tp is None:
        args.tp = 1 if args.cp > 1 or args.ep > 1 else 2

    from ..io import is_opgraph_path
    if is_opgraph_path(args.model):  # a traced model (tpsim trace)
        from ..validate.launchers import detect
        if args.print_launch or detect() is not None:
            raise InputError(f"--model {args.model}: a traced model runs on tpsim validate's own launch only (not "
                             "yet under torchrun or srun, nor with --print-launch)")
        from .graph import run_validate
        return run_validate(args)
    check_names(args)
    from ..validate.launchers import detect
    joined = None if args.print_launch else detect()
    if joined is not None:  # started by torchrun / srun: this process is one rank of that launch
        from ..procs import die_with_parent
        from ..validate.joined import guard_signals
        guard_signals(joined)  # first: the threads started after it leave SIGTERM to its thread
        die_with_parent()
        args.nnodes = joined.nnodes if joined.world % joined.local_world == 0 else 1
        args.nproc = joined.world // args.nnodes
    model = _with_expert_ffn(args, build_model(args))
    if args.shard_of > 1:
        from ..validate.shard import shard_model
        if args.tp != 1 or args.matrix or args.pp > 1 or args.dp > 1:
            raise InputError(f"--shard-of={args.shard_of} runs one shard at --tp=1 (got --tp={args.tp}"
                             f"{', --matrix' if args.matrix else ''}{', --pp/--dp' if args.pp * args.dp > 1 else ''})")
        model = shard_model(model, args.shard_of)
    if args.warmup < 0:
        raise InputError(f"--warmup={args.warmup} must be >= 0")
    cases, name = _cases(args, model)
    if args.print_launch:
        return print_launch(args, cases, name)
    if joined is not None:
        return _run_joined(args, joined, cases, name)
    out_dir = check_out_dir(Path(args.out_dir) if args.out_dir else REPORTS_DIR)
    world = max(getattr(c, "world", c.tp) for c in cases)
    nproc = 1 if args.matrix else (args.nproc or world // args.nnodes)
    check_backend(args.backend, world // args.nnodes)
    cfg = LaunchConfig(nproc=nproc, backend=args.backend, timeout_s=args.timeout, threads=args.threads,
                       nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                       run_timeout_s=args.run_timeout, trace_terms=args.trace_terms)
    return _validate_and_print(args, cases, name, cfg, out_dir)


def _options(args: argparse.Namespace, out_dir: Path, calibrate: bool = True):  # noqa: ANN202 - Options
    from ..validate.run import Options

    return Options(cluster=args.cluster or ("hgx-h200" if args.backend == "nccl" else "local-cpu"),
                   profile=Path(args.profile) if args.profile else None, use_profile=not args.no_profile,
                   calibrate=calibrate and not args.no_calibrate,
                   calibration=Path(args.calibration) if args.calibration else None,
                   out_dir=out_dir, budget_s=args.budget, overhead=not args.no_overhead,
                   probe=not args.no_probe, reprofile=args.reprofile, repeat=args.repeat)


def _validate_and_print(args: argparse.Namespace, cases: list, name: str, cfg, out_dir: Path) -> int:  # noqa: ANN001
    from ..validate.launch import RankFailure
    from ..validate.run import validate

    opts = _options(args, out_dir, calibrate=not cfg.joined)
    try:
        report = validate(cases, cfg, opts, name)
    except RankFailure as exc:
        print(f"tpsim validate: error: {exc}", file=sys.stderr)
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


def print_launch(args: argparse.Namespace, cases: list, name: str) -> int:
    """``--print-launch torchrun|slurm``: the command that runs this validation under the user's launcher."""
    from ..validate.launchers import sbatch_script, torchrun_line

    world = _one_world(cases, "--print-launch")
    nnodes = args.nnodes
    nproc = args.nproc or world // nnodes
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    rdzv_id = args.rdzv_id if args.rdzv_id != "tpsim-validate" else f"tpsim-{name}"[:64]
    if args.print_launch == "torchrun":
        print(f"# on each of the {nnodes} node(s), {nproc} rank(s) per node; MASTER_ADDR:MASTER_PORT: a host and a "
              "free port of the first node (the c10d rendezvous)")
        print(torchrun_line(argv, nnodes, nproc, rdzv_id))
    else:
        print(sbatch_script(argv, nnodes, nproc, args.backend, job_name=f"tpsim-validate-{name}"[:64]), end="")
    return 0


def _one_world(cases: list, where: str) -> int:
    """The rank count of the cases, which one launch of the user's launcher runs: one count only."""
    from ..errors import InputError

    worlds = sorted({getattr(c, "world", c.tp) for c in cases})
    if len(worlds) > 1:
        raise InputError(f"{where}: these cases need {', '.join(map(str, worlds))} ranks; one launch has one rank "
                         "count (run one case, or one launch per rank count)")
    return worlds[0]


def _run_joined(args: argparse.Namespace, joined, cases: list, name: str) -> int:  # noqa: ANN001
    """One rank of a launch the user started (:mod:`tpsim.validate.joined`): rank 0 validates and reports, the
    others run their part of every launch. Leaves with ``os._exit`` (no teardown of a broken process group)."""
    from ..errors import InputError, TpsimError
    from ..validate import joined as rank_side
    from ..validate.launch import LaunchConfig

    world = _one_world(cases, f"under {joined.launcher}")
    if world != joined.world:
        raise InputError(f"the plan needs {world} ranks; this {joined.launcher} launch has {joined.world} "
                         "(WORLD_SIZE / SLURM_NTASKS)")
    out_dir = check_out_dir(Path(args.out_dir) if args.out_dir else _reports_dir()) if joined.rank == 0 else None
    code = 1
    if args.trace_terms:  # every rank of the joined launch parsed the same flag
        os.environ["TPSIM_VALIDATE_TRACE"] = "auto" if args.trace_terms == "auto" else "1"
        os.environ["TPSIM_VALIDATE_TRACE_DIR"] = str(Path(args.out_dir or _reports_dir()) / f"{name}-traces")
    try:
        hosts = rank_side.start(joined, args.backend, args.timeout, args.threads, args.run_timeout)
        if joined.rank != 0:
            rank_side.follow(Path(tempfile.mkdtemp(prefix=f"tpsim-validate-rank{joined.rank}-")))
            code = 0
        else:
            cfg = LaunchConfig(nproc=args.nproc, backend=args.backend, timeout_s=args.timeout, threads=args.threads,
                               nnodes=args.nnodes, joined=True, host_ranks=rank_side.ranks_per_host(hosts),
                               run_timeout_s=args.run_timeout)
            try:
                code = _validate_and_print(args, cases, name, cfg, out_dir)
            except TpsimError as exc:  # refused before the ranks ran it (the fit, a case): one line, status 2
                print(f"tpsim validate: error: {exc}", file=sys.stderr, flush=True)
                code = 2
            if not rank_side.broken():
                rank_side.stop_followers()
    except Exception as exc:  # noqa: BLE001 - every rank: one line naming the rank that failed first, then leave
        rank_side.record_failure(exc, joined)
        print(f"tpsim validate: error: {rank_side.failure_message(exc, joined)}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reports_dir() -> Path:
    from ..validate.run import REPORTS_DIR
    return REPORTS_DIR


def format_report(report: dict) -> str:
    """Readable table: one block per case, a line per phase."""
    lines = []
    checks = {s["profile_check"]["action"]: s for s in report["cases"] if s.get("profile_check")}
    for s in checks.values():
        lines.append(_drift_line(s["profile_check"]))
    for s in report["cases"]:
        lines.append(f"{s['case']}  numerics {'ok' if s['numerics_ok'] else 'FAIL'} (max rel err "
                     f"{s['numerics_max_rel_err']:.1e})  collectives {'match' if s['collectives_match'] else 'MISMATCH'}"
                     f"  compute: {s['compute_model']}" + (f"  scaled: {s['scaled']}" if s["scaled"] else ""))
        if s.get("kind") == "plan":
            lines += _plan_lines(s)
        if s.get("kind") == "axis":
            lines += _axis_lines(s)
        o = s.get("framework_overhead_s")
        if o:
            where = "calibration" if o.get("source") == "calibration" else "tiny twin"
            lines.append(f"  framework overhead ({where}, in the prediction): fwd {o['fwd'] * 1e3:.2f} ms, "
                         f"bwd {o['bwd'] * 1e3:.2f} ms per layer" + (
                             f"; optimizer {o['opt'] * 1e3:.2f} ms, rest {o['other'] * 1e3:.2f} ms per step"
                             if "opt" in o else ""))
        for p in s["phases"]:
            pred = "-" if p["predicted_s"] is None else f"{p['predicted_s'] * 1e3:10.3f} ms"
            err = "" if p["error_pct"] is None else f"{p['error_pct']:+7.1f}%"
            lines.append(f"  {p['name']:<22} predicted {pred:>13}  measured {p['measured_s'] * 1e3:10.3f} ms  {err}")
        lines += _terms_lines(s)
    e = report["layer_error"]
    if e["cases"]:
        lines.append(f"fwd+bwd per layer, {e['cases']} case(s): median |error| {e['median_abs_error_pct']:.1f}%, "
                     f"worst {e['worst_abs_error_pct']:.1f}%")
    te = report.get("term_error") or {}
    if te.get("values"):
        lines.append(f"step terms, {te['values']} term(s) over the plan cases: median |error| "
                     f"{te['median_abs_error_pct']:.1f}% (" + ", ".join(
                         f"{n} {v['median_abs_error_pct']:.0f}%" for n, v in te["terms"].items()) + ")")
    st = report.get("step_error") or {}
    if st.get("cases"):
        lines.append(f"whole step, {st['cases']} plan case(s): median |error| {st['median_abs_error_pct']:.1f}%, "
                     f"worst {st['worst_abs_error_pct']:.1f}%")
    lines.append(f"report: {report['csv']}" + (f", chart: {report['chart']}" if report.get("chart") else ""))
    return "\n".join(lines)


def _terms_lines(s: dict) -> list[str]:
    """The step's terms side by side (predicted, measured, error), then the stragglers and the spread."""
    lines = []
    terms = s.get("terms") or {}
    if terms:
        lines.append(f"  {'term (per step)':<22} {'predicted':>13}  {'measured':>13}")
        for n, v in terms.items():
            p, m = v["predicted_s"], v["measured_s"]
            err = f"{100 * (p - m) / m:+7.1f}%" if p is not None and m else ""
            lines.append(f"  {n:<22} {'-' if p is None else f'{p * 1e3:10.3f} ms':>13}  {m * 1e3:10.3f} ms  {err}")
        gap = s.get("terms_sum_error_pct")
        if gap is not None:
            lines.append(f"  measured terms sum to the measured step {gap:+.1f}%")
    if s.get("terms_source"):
        lines.append(f"  terms source: {s['terms_source']} ({s.get('terms_source_note') or ''})")
    for prof in s.get("profiled") or []:
        if not prof.get("terms"):  # --trace-terms auto stopped after one step (the note above says why)
            continue
        d = prof.get("detail") or {}
        over = prof.get("overhead_pct")
        lines.append(f"  torch.profiler, rank {prof['rank']} (stage {prof['stage']}), median of {prof['steps']} steps "
                     f"{prof['wall_s'] * 1e3:.1f} ms (overhead {'n/a' if over is None else f'{over:+.1f}%'}): "
                     + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in prof["terms"].items())
                     + "; DP exposed in chunks {:.1f}, hidden {:.1f}, exposed outside {:.1f}; in the optimizer {:.1f}; "
                       "pipeline waits {:.1f}; host gaps {:.1f} ms".format(
                         *(1e3 * d.get(k, 0.0) for k in ("dp_exposed_in_chunks", "dp_hidden", "dp_exposed_in_rest",
                                                         "comm_in_optimizer", "pp_wait", "host_gaps")))
                     + (f"; trace {prof['trace']}" if prof.get("trace") else ""))
    pr = s.get("per_rank")
    if pr:
        ranks = ", ".join(f"{r['rank']}: {r['step_s'] * 1e3:.1f}" for r in pr["ranks"])
        sl = pr["slowest"]
        lines.append(f"  per-rank median step (ms) {ranks}; slowest rank {sl['rank']} on {sl['host']}, "
                     f"rank spread {pr['rank_spread_pct']:.1f}%")
        lines.append(f"  step over {pr['steps']} timed steps after warm-up: median {pr['step_median_s'] * 1e3:.1f} ms "
                     f"(min {pr['step_min_s'] * 1e3:.1f}, max {pr['step_max_s'] * 1e3:.1f}, spread "
                     f"{pr['step_spread_pct']:.1f}%)")
    rp = s.get("repeats")
    if rp:
        meds = ", ".join(f"{v * 1e3:.1f}" for v in rp["medians_s"])
        spread = "n/a" if rp["spread_pct"] is None else f"{rp['spread_pct']:.1f}%"
        lines.append(f"  run-to-run, {rp['launches']} launches: median {rp['phase']} per launch (ms) {meds}; "
                     f"median {rp['median_s'] * 1e3:.1f}, spread {spread}")
    return lines


def _drift_line(check: dict) -> str:
    if check.get("median_drift") is None:
        return f"kernel profile check: {check['action']}"
    what = {"none": "within 10%: profile used as is",
            "rescaled": "over 10%: profile rescaled by the measured drift ("
                        + ", ".join(f"{k} x{v:.2f}" for k, v in (check.get("scales") or {}).items()) + ")",
            "reprofiled": f"over 10%: predicted with a quick profile measured here ({check['profile']})",
            "calibration": "the calibration's compute factors are applied instead"}.get(check["action"],
                                                                                          check["action"])
    return (f"kernel profile check: {check['points']} kernels in {check['probe_seconds']:.0f} s, median "
            f"measured/profile {check['median_drift']:.2f} -> {what}")


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"


def _plan_lines(s: dict) -> list[str]:
    c = s["config"]
    lines = [f"  plan: tp {c['tp']} pp {c['pp']} vpp {c['vpp']} dp {c['dp']} ZeRO-{c['zero']} ({c['runtime']}), "
             f"schedule {c['schedule']}, {c['layers']} layers, {c['microbatches']} micro-batches of {c['micro_batch']}"
             f"; loss {_g(s['loss']['measured'])} vs unsharded {_g(s['loss']['reference'])}"]
    comm = s["comm"]["measured"]
    lines.append("  communication per step (rank {}): ".format(s["comm"]["rank"]) + ("; ".join(
        f"{axis} {op} x{d['n']} ({d['bytes'] / 2**20:.2f} MiB)" for axis, ops in sorted(comm.items())
        for op, d in sorted(ops.items())) or "none"))
    for diff in s.get("stack_differences", []):
        lines.append(f"  stack difference: {diff}")
    if s.get("timing") != "measured":
        lines.append(f"  {s['timing']}")
    return lines



def _axis_lines(s: dict) -> list[str]:
    """Configuration, communication per layer and micro-batch against the cost model, routing load."""
    c = s["config"]
    kind = f"cp {c['cp']}" + (f" ({c['cp_kind']})" if c["cp"] > 1 else "")
    moe = f", {c['experts']} experts top-{c['top_k']}" + (f" + {c['shared_experts']} shared" if c["shared_experts"] else "") \
        if c["experts"] else ""
    lines = [f"  layer: {kind}, ep {c['ep']}, dp {c['dp']}{moe}; numerics in {s['numerics_dtype']}"]
    comm = s["comm"]
    parts = []
    for axis, phases in sorted(comm["measured"].items()):
        for phase, ops in sorted(phases.items()):
            for op, d in sorted(ops.items()):
                parts.append(f"{phase} {axis} {op} x{d['n']} ({d['bytes'] / 2**20:.3f} MiB)")
    lines.append(f"  communication per layer (rank {comm['rank']}): " + ("; ".join(parts) or "none"))
    g = comm.get("ep_group")
    if g:
        lines.append(f"  routing: copies processed per rank {g['loads']} (balanced {g['balanced_load']}); returned "
                     f"all-to-all bytes over the ep group {g['returned_bytes']:.0f} vs balanced {g['balanced_bytes']:.0f}")
    imb = s.get("imbalance")
    if imb and imb.get("run") is not None:
        lines.append(f"  predicted at this run's load (busiest rank x{imb['run']:.3f} balanced); the estimator's "
                     f"trained-router factor would be x{imb['estimator']:.3f}")
    for diff in s.get("stack_differences", []):
        lines.append(f"  stack difference: {diff}")
    if s.get("timing") != "measured":
        lines.append(f"  {s['timing']}")
    return lines
