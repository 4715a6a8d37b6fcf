"""``tpsim calibrate``: fit link efficiency and latency to measured collectives; write a calibration YAML."""

from __future__ import annotations

import argparse

from .common import count_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="fit link efficiency/latency to measured collectives (bench-collectives CSV, "
                          "nccl-tests output)",
        description="Read measurement files (CSV of `tpsim bench-collectives`, or nccl-tests *_perf output), "
                    "fit per-link-type efficiency and latency by least squares over the collective model "
                    "for the measured groups (ranks 0..n-1 of --cluster), report the fit error and write "
                    "a calibration YAML that a topology includes with `calibration: FILE`.")
    p.add_argument("files", nargs="*", help="measurement files")
    p.add_argument("--from-validation", nargs="+", metavar="REPORT",
                   help="instead: fit the compute factors (GEMM, attention, memory-bound) and the framework "
                        "overhead per layer from tpsim validate JSON reports, report the leave-one-out error and "
                        "write the compute section (with the runs' collective calibration) to --out")
    p.add_argument("--from-runs", nargs="+", metavar="RUNS.csv",
                   help="instead: fit bounded factors (GEMM, memory-bound, attention, host overhead per layer) "
                        "for one device and stack to measured runs, print each with its uncertainty and the "
                        "leave-one-out error of every run, and write the calibration to --out. " + RUNS_HELP)
    p.add_argument("--log", action="append", nargs=2, metavar=("LOG", "LAUNCH"), default=None,
                   help="with --from-runs (or alone): a Megatron-LM / NeMo or torchtitan training log and the "
                        "launch file it ran (a Megatron command line or script, torchtitan TOML, DeepSpeed JSON, "
                        "NeMo YAML); --cluster and --gpus say where (repeatable)")
    p.add_argument("--device", help="with --from-validation or --from-runs: the device to fit when the reports or "
                                    "runs hold several")
    p.add_argument("--stack", help="with --from-validation or --from-runs: the stack to fit when they hold several")
    p.add_argument("--cluster", default="local-cpu", help="cluster the measurements ran on (default: %(default)s)")
    p.add_argument("--gpus", type=count_arg("gpus"), help="GPUs of that cluster (default: the most ranks measured)")
    p.add_argument("--op", help="collective of nccl-tests text files that do not name it (e.g. all_reduce)")
    p.add_argument("--stat", default="p25", choices=("p25", "median", "min", "mean"),
                   help="time of a configuration from its repeated iterations (default p25: robust to the "
                        "scheduler preempting ranks on a shared machine)")
    p.add_argument("--out", help="calibration YAML to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError

    if args.from_runs or args.log:
        return from_runs(args)
    if args.from_validation:
        if args.files:
            raise InputError(f"--from-validation takes validation reports; measurement files "
                             f"{' '.join(args.files)} belong to a separate `tpsim calibrate` run")
        return from_validation(args)
    if not args.files:
        raise InputError("give measurement files (bench-collectives CSV, nccl-tests output) or --from-validation")
    from ..collectives.calibration import fit_calibration, provenance, read_measurements
    from ..topology import load_cluster

    from ..io import check_output_file

    if args.out is not None:  # before the fit: a bad destination costs nothing
        check_output_file(args.out, "--out", force=args.force)
    samples = read_measurements(args.files, op=args.op)
    gpus = args.gpus or _gpus_for(args.cluster, max(s.nranks for s in samples))
    # fit against the raw link figures: a calibration the cluster file already includes is replaced
    from ..hardware import DATA_DIR
    cluster = load_cluster(args.cluster, gpus=gpus, calibration=str(DATA_DIR / "calibration" / "none.yaml"))
    fit = fit_calibration(cluster, samples, stat=args.stat)
    fit = type(fit)(per_type=fit.per_type, error_before=fit.error_before, error_after=fit.error_after,
                    points=fit.points, provenance=provenance(fit, cluster.name, args.files))
    b, a = fit.error_before, fit.error_after
    print(f"fitted {', '.join(fit.per_type)} on {fit.points} points ({len(samples)} measurements) of "
          f"{cluster.name}: time error median {100 * b['median_rel']:.1f}% -> {100 * a['median_rel']:.1f}%, "
          f"max {100 * b['max_rel']:.1f}% -> {100 * a['max_rel']:.1f}%")
    for t, v in fit.per_type.items():
        print(f"  {t}: efficiency {v['efficiency']:.4f}, latency {v['latency_us']:.2f} us, "
              f"bw {v['bw_GBps']:.4g} GB/s")
    if args.out is not None:
        from ..io import atomic_write_text

        atomic_write_text(args.out, "# Calibration written by `tpsim calibrate` (include with `calibration:` in a "
                                    "cluster file)\n" + fit.to_yaml(), "--out")
        print(f"wrote {args.out}")
    else:
        print(fit.to_yaml(), end="")
    return 0


RUNS_HELP = ("Columns (docs/RUNS.md): run_id, model, cluster, gpus (required); layers hidden heads kv_heads ffn "
             "vocab seq_len experts top_k moe_balance; stack; plan fields tp cp cp_kind pp vpp schedule pp_first "
             "pp_last pp_embedding pp_loss pp_layout zero sp recompute micro_batch global_batch dtype ep etp tp_overlap "
             "overlap order attention dp; one measurement of step_time_s tokens_per_s tokens_per_s_per_gpu "
             "model_tflops_per_gpu (with flops_convention); peak_memory_gib, source, notes.")


def from_runs(args: argparse.Namespace) -> int:
    """``calibrate --from-runs RUNS.csv [--log LOG LAUNCH] --out CAL.yaml``."""
    from ..errors import InputError
    from ..io import atomic_write_text, check_output_file
    from ..runfit import fit_runs
    from ..runs import load_runs

    if args.files or args.from_validation:
        raise InputError("--from-runs takes runs files (and --log pairs), not measurement files or reports")
    if args.out is not None:
        check_output_file(args.out, "--out", force=args.force)
    runs = []
    for path in args.from_runs or ():
        runs.extend(load_runs(path))
    for i, (log, launch) in enumerate(args.log or (), start=1):
        runs.append(_log_run(args, log, launch, i))
    if args.device or args.stack:  # a file of several devices or stacks: fit the one asked for
        from ..runs import stack_name

        runs = [r for r in runs if (not args.device or r.device == args.device)
                and (not args.stack or stack_name(r.stack) == stack_name(args.stack))]
        if not runs:
            raise InputError(f"no runs of device {args.device or 'any'} and stack {args.stack or 'any'} in "
                             f"{', '.join(args.from_runs or [])}")
    seen: dict[str, str] = {}
    for r in runs:
        if r.run_id in seen:
            raise InputError(f"{r.where}: run_id={r.run_id!r} is also in {seen[r.run_id]}")
        seen[r.run_id] = r.path
    fit = fit_runs(runs, runs_file=", ".join(list(args.from_runs or ()) + [l for l, _ in args.log or ()]))
    print(format_fit(fit))
    import yaml

    text = ("# Calibration written by `tpsim calibrate --from-runs` (pass it as --calibration to estimate, plan, "
            "report, export)\n" + yaml.safe_dump(fit.to_yaml_dict(), sort_keys=False, width=120))
    if args.out is not None:
        atomic_write_text(args.out, text, "--out")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def format_fit(fit) -> str:
    """The fit as text: factors with uncertainties, each run's errors, warnings."""
    lines = [f"fitted {len(fit.factors)} factor(s) for device {fit.device}, stack {fit.stack} on {len(fit.runs)} "
             f"run(s) in {fit.seconds:.2f} s ({fit.method}; per-run error sigma {100 * fit.sigma:.1f}%)"]
    for f in fit.factors:
        lines.append(f"  {f.name:28s} {f.value:10.4f} +- {f.uncertainty:.4f}   (prior {f.prior:g} +- "
                     f"{f.prior_sigma:.3g}, bounds {f.bounds[0]:g}-{f.bounds[1]:g}"
                     + (", AT BOUND" if f.at_bound else "") + ")")
    lines.append(f"  {'run':40s} {'measured s':>11s} {'uncal. s':>10s} {'error':>7s} {'fit s':>10s} {'error':>7s}"
                 f" {'leave-one-out':>13s}")
    for r in fit.runs:
        lines.append(f"  {r.run_id[:40]:40s} {r.measured_s:11.4g} {r.uncalibrated_s:10.4g} "
                     f"{100 * (r.uncalibrated_s / r.measured_s - 1):+6.1f}% {r.calibrated_s:10.4g} "
                     f"{100 * (r.calibrated_s / r.measured_s - 1):+6.1f}% {100 * r.loo_error:+12.1f}%")
    import numpy as np

    before = np.median([abs(r.uncalibrated_s / r.measured_s - 1) for r in fit.runs])
    loo = np.median([abs(r.loo_error) for r in fit.runs])
    lines.append(f"  median |error|: uncalibrated {100 * before:.1f}%, leave-one-out calibrated {100 * loo:.1f}%")
    lines.extend(f"warning: {w}" for w in fit.warnings)
    return "\n".join(lines)


def _log_run(args: argparse.Namespace, log: str, launch: str, index: int):
    """A run of a training log and its launch file (the launch file's model, plan and GPU count; --cluster
    and --gpus where the file does not say)."""
    from pathlib import Path

    from ..launch import FORMAT_STACK, import_launch, resolve_model, resolve_plan
    from ..runs import run_from_log
    from ..topology import load_cluster

    imp = import_launch(launch, None)
    model = resolve_model(imp, None)
    name = imp.cluster_ref or (args.cluster if args.cluster != "local-cpu" else None) or "dgx-h100"
    gpus = args.gpus or imp.gpus
    cluster = load_cluster(name, gpus=gpus)
    plan = resolve_plan(imp, model, cluster.num_gpus, global_batch=None, overrides={})
    stack = args.stack or imp.stack or FORMAT_STACK[imp.format]
    if imp.stack_overrides:  # the launch file's recomputed modules, optimizer dtypes, overlap flags (--from)
        from ..stacks import derived_stack

        stack = derived_stack(stack, imp.stack_overrides, f"launch file {launch}")
    return run_from_log(log, run_id=f"{Path(log).stem}#{index}", model=model, model_ref=str(launch),
                        cluster=name, gpus=cluster.num_gpus, stack=stack, plan=plan)


def _gpus_for(cluster: str, ranks: int) -> int | None:
    """The file's GPU count if it holds the measured ranks, else the ranks (clusters sized by --gpus)."""
    from ..topology import load_cluster

    default = load_cluster(cluster)
    if ranks <= default.num_gpus:
        return None
    per_node = default.gpus_per_node
    return ranks if getattr(default.spec, "single_node", False) else -(-ranks // per_node) * per_node


def from_validation(args: argparse.Namespace) -> int:
    """``tpsim calibrate --from-validation``: :mod:`tpsim.validate.learn`, then one calibration file."""
    import datetime
    from pathlib import Path

    from ..validate.calfile import write_calibration
    from ..validate.learn import fit, read_samples

    samples = read_samples(args.from_validation)
    result = fit(samples, device=args.device, stack=args.stack)
    c = result.calibration
    b, f, loo = result.before_error, result.fit_error, c.leave_one_out
    print(f"fitted on {len(result.samples)} timed case(s) of {c.device} ({c.stack}): gemm x{c.gemm_scale:.3f}, "
          f"attention x{c.attention_scale:.3f}, memory-bound x{c.memory_scale:.3f}, host overhead "
          f"{c.host_overhead_per_layer_us / 1e3:.2f} ms per layer (forward {100 * c.host_overhead_fwd_share:.0f}%)")
    print(f"  |error| of fwd+bwd per layer: profile and tiny twins as run: median {b['median_pct']:.1f}%, max "
          f"{b['max_pct']:.1f}%; fitted: median {f['median_pct']:.1f}%, max {f['max_pct']:.1f}%" + (
              f"; leave-one-out: median {loo['median_pct']:.1f}%, p90 {loo['p90_pct']:.1f}%, max {loo['max_pct']:.1f}%"
              if loo.get("median_pct") is not None else "; leave-one-out: needs 3 cases"))
    links = _validation_links(result.samples)
    provenance = {"tool": "tpsim calibrate --from-validation",
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "inputs": sorted({s.source for s in result.samples}), "cases": [s.case for s in result.samples],
                  "fit_error": f, "error_before": b,
                  "method": "least squares on relative error, non-negative, weak priors (tpsim.validate.learn)"}
    if args.out:
        write_calibration(Path(args.out), c, links, provenance)
        print(f"wrote {args.out}" + (f" (with the collective calibration of {links['collective_calibration_from']})" if links else ""))
    else:
        import yaml
        print(yaml.safe_dump({"compute": c.to_section()}, sort_keys=False), end="")
    return 0


def _validation_links(samples) -> dict:  # noqa: ANN001
    """Link entries (and gloo_ops) of the newest collective calibration the validation runs measured
    (``<name>-calibration.yaml`` next to each report), as they are."""
    import json
    from pathlib import Path

    import yaml

    from ..calibration import LINK_TYPES

    found = []
    for source in {s.source for s in samples}:
        for case in json.loads(Path(source).read_text()).get("cases", []):
            cal = case.get("calibration")
            if cal and Path(cal).is_file():
                found.append(Path(cal))
    if not found:
        return {}
    newest = max(found, key=lambda p: p.stat().st_mtime)
    data = yaml.safe_load(newest.read_text()) or {}
    links = {k: v for k, v in data.items() if k in LINK_TYPES or k == "gloo_ops"}
    return {**links, "collective_calibration_from": str(newest)} if links else {}
