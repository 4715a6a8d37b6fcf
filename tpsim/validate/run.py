"""``tpsim validate`` end to end: calibrate the collectives, probe the kernel profile, launch the ranks, predict,
compare, report. Block cases (one sharded layer, :class:`Case`) and whole-plan cases (every axis of a plan,
:class:`PlanCase`) run alike; cases with the same number of ranks share one launch."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..compute.scaled import ScaledCompute
from .axis.case import AxisCase
from .axis.predict import predict_axis
from .axis.report import summarize_axis
from .axis.scale import fit_axis_case
from .axis.scale import overhead_case as axis_overhead_case
from .calfile import ComputeCalibration, read_compute_calibration
from .block.case import Case
from .drift import DriftCheck, check_profile
from .launch import LaunchConfig, RankFailure, launch
from .overhead import (measured_overhead, overhead_case, plan_overhead, plan_overhead_case, with_overhead)
from .plan.case import PlanCase
from .plan.predict import predict_plan
from .plan.report import summarize_plan
from .plan.terms import term_errors
from .block.predict import compute_model, find_profile, grid_hits, load_local_cluster, predict_case
from ..procs import child_preexec
from .block.report import (layer_errors, step_errors, summarize_case, write_atomic, write_csv, write_scatter,
                           write_terms_chart)
from .matrix import matrix_cases, plan_matrix_cases  # noqa: F401 - part of this module's API
from .block.scale import fit_case, fit_plan_case

REPORTS_DIR = Path("reports") / "validation"
"""default report folder, relative to the current directory (never inside the installed package)."""
BENCH_SIZES = ("64K", "256K", "1M", "4M", "16M")
"""collective sizes of the calibration run: the validation's activations (tokens x hidden x 4 B) span them."""
VALIDATION_STACK = "torchtitan"
"""the training stack whose runtime validate runs (DTensor TP, FSDP2, torch.distributed.pipelining: issue 10's
torchtitan profile); a calibration fitted from validation runs applies to it."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """Where the prediction's inputs come from and where the report goes."""

    cluster: str = "local-cpu"
    """topology of the machine the ranks run on (``local-cpu``, or a GPU node such as ``hgx-h200``)."""
    profile: Path | None = None
    """kernel profile; None: the newest ``profiles/<cpu|cuda>-*.csv``."""
    use_profile: bool = True
    calibrate: bool = True
    """measure the collectives first (``tpsim bench-collectives`` + ``tpsim calibrate``)."""
    calibration: Path | None = None
    """an existing calibration file (skips the measurement)."""
    out_dir: Path = REPORTS_DIR
    name: str | None = None
    budget_s: float = 300.0
    """scale a case down until its predicted run time on one rank is under this."""
    chart: bool = True
    overhead: bool = True
    """measure the runtime's per-layer framework overhead on a tiny twin of each case and add it to the
    prediction (:mod:`tpsim.validate.overhead`)."""
    probe: bool = True
    """time ~20 kernels of the profile first and correct it if it is off by more than 10%
    (:mod:`tpsim.validate.drift`)."""
    reprofile: bool = False
    """on a drift over 10%, measure a quick profile instead of rescaling."""
    repeat: int = 1
    """launches of the measured cases (:mod:`tpsim.validate.repeat`: the spread of their medians)."""


BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter")
"""collectives the calibration run measures; ``all_to_all`` is added when a launch runs context/expert-parallel
cases (Ulysses attention, the MoE dispatch). Ring send/receive pairs are not measured by bench-collectives: they
are timed with the host link's fitted values."""


def calibrate_collectives(cfg: LaunchConfig, cluster: str, work: Path,
                          ops: tuple[str, ...] = BENCH_OPS) -> Path:
    """Run a short ``tpsim bench-collectives`` with the same backend and rank count, then ``tpsim calibrate``;
    return the calibration file."""
    csv_path, cal_path = work / f"bench-collectives-{cfg.nproc}.csv", work / f"calibration-{cfg.nproc}.yaml"
    steps = [["bench-collectives", "--nproc", str(cfg.nproc), "--backend", cfg.backend,
              "--ops", *ops, "--sizes", *BENCH_SIZES,
              "--out", str(csv_path), "--timeout", str(int(cfg.timeout_s))],
             ["calibrate", str(csv_path), "--cluster", cluster, "--out", str(cal_path)]]
    for args in steps:
        proc = subprocess.run([sys.executable, "-m", "tpsim.cli", *args], capture_output=True, text=True,
                              timeout=max(300.0, 10 * cfg.timeout_s), preexec_fn=child_preexec)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RankFailure(f"collective calibration failed: tpsim {' '.join(args[:1])}: {last}")
    return cal_path


def _has_links(path: Path) -> bool:
    """Whether a calibration file holds collective (link) entries, not only a ``compute:`` section."""
    from ..collectives.calibration import load_link_values
    return bool(load_link_values(path))


@dataclass(frozen=True)
class Setup:
    """The prediction's inputs for one launch: cluster, compute model and where they came from."""

    cluster: Any
    compute: Any
    """the compute model predictions use (profile, rescaled or calibrated)."""
    raw: Any
    """the profile as shipped (or the quick profile), for the per-kind breakdown calibrate fits on."""
    profile: Path | None
    drift: DriftCheck
    calibration: Path | None
    """collective calibration (links)."""
    compute_cal: ComputeCalibration | None


def prepare(cfg: LaunchConfig, opts: Options, work: Path, probes: dict | None = None,
            bench_ops: tuple[str, ...] = BENCH_OPS) -> Setup:
    """Collective calibration, cluster, profile probe and compute model (module docstring of
    :mod:`tpsim.validate.drift` for the probe). ``probes`` keeps the probe's answer for the next launch of
    the same run (the profile and the machine are the same); ``bench_ops``: what the calibration measures."""
    compute_cal = read_compute_calibration(opts.calibration) if opts.calibration else None
    calibration = opts.calibration if opts.calibration and _has_links(opts.calibration) else None
    if calibration is None and opts.calibrate and cfg.nproc > 1 and cfg.nnodes == 1 and not cfg.joined:
        # bench-collectives starts ranks of its own on one node: not inside a launch the user started
        calibration = calibrate_collectives(cfg, opts.cluster, work, bench_ops)
    cluster = load_local_cluster(opts.cluster, cfg.nproc * cfg.nnodes, calibration, work)
    device_type = "cuda" if cfg.backend == "nccl" else "cpu"
    profile = (opts.profile or find_profile(device_type)) if opts.use_profile else None
    probes = {} if probes is None else probes
    key = (str(profile), cfg.threads, device_type)
    if key not in probes:
        probes[key] = check_profile(profile, cfg.threads, work, opts.reprofile and compute_cal is None,
                                    enabled=opts.probe, device=device_type)
    drift = probes[key]
    if compute_cal is not None and drift.probe is not None:
        drift = dataclasses.replace(drift, action="calibration", profile=profile, scales=None)
    raw = compute_model(cluster, drift.profile if drift.profile else profile)
    if compute_cal is not None:
        compute = ScaledCompute(raw, gemm=compute_cal.gemm_scale, attention=compute_cal.attention_scale,
                                memory=compute_cal.memory_scale, label=f"calibration {opts.calibration}")
    elif drift.action == "rescaled":
        compute = ScaledCompute(raw, **drift.scales, label="probe drift")
    else:
        compute = raw
    return Setup(cluster=cluster, compute=compute, raw=raw, profile=drift.profile or profile, drift=drift,
                 calibration=calibration, compute_cal=compute_cal)


def timing_allowed(cfg: LaunchConfig) -> tuple[bool, str]:
    """Timing claims need a core per rank on CPU (more ranks than cores share them: only numerics and
    communication are checked then)."""
    if cfg.backend == "nccl":
        return True, ""
    cores = os.cpu_count() or 1
    ranks = cfg.host_ranks or cfg.nproc
    if ranks > cores:
        return False, (f"not timed: {ranks} ranks on {cores} CPU cores (timing claims need a core per "
                       "rank); numerics and communication checked")
    return True, ""


def run_cases(cases: list, cfg: LaunchConfig, opts: Options, work: Path,
              env: dict[str, str] | None = None, probes: dict | None = None) -> list[dict[str, Any]]:
    """Predict, launch and summarize ``cases`` that share one launch config (same number of ranks)."""
    a2a = ("all_to_all",) if any(isinstance(c, AxisCase) for c in cases) else ()
    setup = prepare(cfg, opts, work, probes, BENCH_OPS + a2a)
    memory = int(setup.cluster.device.usable_memory_bytes) * cfg.nproc if cfg.backend == "nccl" else None
    timed, note = timing_allowed(cfg)
    blocks = [fit_case(c, cfg.nproc, setup.compute, opts.budget_s, memory_bytes=memory)
              for c in cases if isinstance(c, Case)]
    plans = [fit_plan_case(dataclasses.replace(c, timed=timed), cfg.nproc, setup.compute, opts.budget_s,
                           memory_bytes=memory) for c in cases if isinstance(c, PlanCase)]
    axes = [fit_axis_case(dataclasses.replace(c, timed=timed), cfg.nproc, setup.cluster, setup.compute,
                          opts.budget_s, memory_bytes=memory) for c in cases if isinstance(c, AxisCase)]
    # the fit may rename a case (shorter sequence, smaller micro-batch): each summary names the case asked for
    requested = {id(fitted): c.name for fitted, c in zip(
        blocks + plans + axes, [c for kind in (Case, PlanCase, AxisCase) for c in cases if isinstance(c, kind)])}
    twins = opts.overhead and setup.compute_cal is None and timed
    block_twins = {c.name: overhead_case(c) for c in blocks} if twins else {}
    plan_twins = {c.name: plan_overhead_case(c) for c in plans} if twins else {}
    axis_twins = {c.name: axis_overhead_case(c) for c in axes} if twins else {}
    twin_runs = [*block_twins.values(), *plan_twins.values(), *axis_twins.values()]
    runs = list({t.name: t for t in twin_runs}.values()) + blocks + plans + axes
    result = launch(runs, cfg, work / f"run-{cfg.nproc}ranks", env=env)
    if result is None:
        return []  # another node holds rank 0 and writes the report
    per_case: dict[str, list[dict[str, Any]]] = {}
    for rank_results in result["ranks"]:
        for r in rank_results:
            per_case.setdefault(r["case"], []).append(r)
    out = [_block_summary(c, per_case, block_twins.get(c.name), setup) for c in blocks]
    out += [_plan_summary(c, per_case, plan_twins.get(c.name), setup, note) for c in plans]
    out += [_axis_summary(c, per_case, axis_twins.get(c.name), setup, note) for c in axes]
    _repeat(out, blocks, plans, axes, cfg, opts, work, env, note)
    for s, fitted in zip(out, blocks + plans + axes):
        s["requested_case"] = requested[id(fitted)]
        s["profile"] = str(setup.profile) if setup.profile else None
        s["profile_check"] = setup.drift.to_dict()
        s["calibration"] = str(setup.calibration) if setup.calibration else None
        s["compute_calibration"] = setup.compute_cal.source if setup.compute_cal else None
        s["meta"] = result["meta"]
    return out


def _repeat(out: list[dict[str, Any]], blocks: list, plans: list, axes: list, cfg: LaunchConfig, opts: Options,
            work: Path, env: dict[str, str] | None, note: str) -> None:
    """``--repeat N``: launch the measured cases N - 1 more times (no twins) and put each case's spread of the
    launches' medians in its summary (``repeats``, :func:`tpsim.validate.repeat.launch_spread`)."""
    if opts.repeat <= 1 or cfg.joined:
        return
    from .repeat import launch_spread
    cases = blocks + plans + axes
    per_launch: list[list[dict[str, Any]]] = [out]
    for i in range(2, opts.repeat + 1):
        result = launch(cases, dataclasses.replace(cfg, trace_terms=False), work / f"run-{cfg.nproc}ranks-repeat{i}",
                        env=env)
        if result is None:
            return
        per_case: dict[str, list[dict[str, Any]]] = {}
        for rank_results in result["ranks"]:
            for r in rank_results:
                per_case.setdefault(r["case"], []).append(r)
        per_launch.append([summarize_case(c, per_case[c.name], None) for c in blocks]
                          + [summarize_plan(c, per_case[c.name], None, note) for c in plans]
                          + [summarize_axis(c, per_case[c.name], None, note) for c in axes])
    for j, s in enumerate(out):
        s["repeats"] = launch_spread([launch_out[j] for launch_out in per_launch])


def _block_summary(c: Case, per_case: dict[str, list], twin: Case | None, setup: Setup) -> dict[str, Any]:
    raw_pred = predict_case(c, setup.cluster, setup.compute)
    pred, overhead = raw_pred, None
    if twin is not None:
        tiny = predict_case(twin, setup.cluster, setup.compute)
        overhead = measured_overhead(per_case[twin.name], tiny)
        check = summarize_case(twin, per_case[twin.name], tiny)
        overhead.update(case=twin.name, numerics_ok=check["numerics_ok"], collectives_match=check["collectives_match"])
        pred = with_overhead(pred, overhead)
    elif setup.compute_cal is not None:
        overhead = dict(setup.compute_cal.overhead_s(), source="calibration", numerics_ok=True, collectives_match=True)
        pred = with_overhead(pred, overhead)
    s = summarize_case(c, per_case[c.name], pred)
    s["kind"] = "block"
    s["framework_overhead_s"] = overhead
    s["predicted_without_overhead_s"] = {"fwd": raw_pred.fwd_s, "bwd": raw_pred.bwd_s}
    s["profile_grid_hits"] = len(grid_hits(c, setup.profile))
    compute_s = _block_compute_s(c.model, c.plan(), c.fused, setup)
    s["calibration_inputs"] = calibration_inputs(s, setup, raw_pred.fwd_s + raw_pred.bwd_s
                                                 - compute_s(setup.compute), compute_s)
    return s


def _plan_summary(c: PlanCase, per_case: dict[str, list], twin: PlanCase | None, setup: Setup,
                  note: str) -> dict[str, Any]:
    overhead = None
    if twin is not None:
        over = _plan_twin_overhead(twin, per_case[twin.name], setup)
        overhead = dict(over)
        check = summarize_plan(twin, per_case[twin.name], None)
        overhead.update(case=twin.name, numerics_ok=check["numerics_ok"], collectives_match=check["collectives_match"])
    elif setup.compute_cal is not None:
        over = setup.compute_cal.overhead_s()
        overhead = dict(over, source="calibration", numerics_ok=True, collectives_match=True)
    else:
        over = {}
    raw_pred = predict_plan(c, setup.cluster, setup.compute)
    pred = predict_plan(c, setup.cluster, setup.compute, overhead=over)
    s = summarize_plan(c, per_case[c.name], pred, note)
    s["framework_overhead_s"] = overhead
    s["predicted_without_overhead_s"] = {k: raw_pred.slowest()[k] for k in ("fwd", "bwd", "optimizer", "other", "step")}
    if c.timed:
        block = c.block_case()
        compute_s = _block_compute_s(block.model, block.plan(), block.fused, setup)
        s["calibration_inputs"] = calibration_inputs(s, setup, raw_pred.slowest()["layer"]
                                                     - compute_s(setup.compute), compute_s)
    return s


def _busiest_load(case: AxisCase, ranks: list[dict[str, Any]]) -> int | None:
    """The most token copies any rank's experts processed (the recorded fp32 pass); None without experts."""
    return max(r["expert_load"] for r in ranks) if case.model.is_moe else None


def _axis_summary(c: AxisCase, per_case: dict[str, list], twin: AxisCase | None, setup: Setup,
                  note: str) -> dict[str, Any]:
    """A context/expert-parallel case: the prediction at the run's routing load, with the framework overhead of
    its tiny twin (or the calibration's) as for blocks."""
    ranks = per_case[c.name]
    load = _busiest_load(c, ranks)
    raw_pred = predict_axis(c, setup.cluster, setup.compute, load)
    pred, overhead = raw_pred, None
    if twin is not None:
        tiny = predict_axis(twin, setup.cluster, setup.compute, _busiest_load(twin, per_case[twin.name]))
        overhead = measured_overhead(per_case[twin.name], tiny)
        check = summarize_axis(twin, per_case[twin.name], tiny)
        overhead.update(case=twin.name, numerics_ok=check["numerics_ok"], collectives_match=check["collectives_match"])
    elif setup.compute_cal is not None:
        overhead = dict(setup.compute_cal.overhead_s(), source="calibration", numerics_ok=True, collectives_match=True)
    if overhead is not None:
        pred = with_overhead(pred, overhead)
    s = summarize_axis(c, ranks, pred, note)
    s["framework_overhead_s"] = overhead
    s["predicted_without_overhead_s"] = {"fwd": raw_pred.fwd_s, "bwd": raw_pred.bwd_s}
    if c.model.is_moe:
        est = predict_axis(c, setup.cluster, setup.compute)
        extra = (overhead or {"fwd": 0.0, "bwd": 0.0})
        s["predicted_at_estimator_imbalance_s"] = {"fwd": est.fwd_s + extra["fwd"], "bwd": est.bwd_s + extra["bwd"]}
    if s["phases"]:
        def axis_compute_s(compute: Any) -> float:
            p = predict_axis(c, setup.cluster, compute, load)
            return p.fwd_compute_s + p.bwd_compute_s
        comm = raw_pred.fwd_s + raw_pred.bwd_s - raw_pred.fwd_compute_s - raw_pred.bwd_compute_s
        s["calibration_inputs"] = calibration_inputs(s, setup, comm, axis_compute_s)
    return s


def _plan_twin_overhead(twin: PlanCase, ranks: list[dict[str, Any]], setup: Setup) -> dict[str, float]:
    """Framework overhead of a whole-plan case from its tiny twin: fwd/bwd per layer and micro-batch and the
    optimizer step first, then the rest of the step with those in the prediction (its bubble grows with them)."""
    measured = {p["name"]: p["measured_s"] for p in summarize_plan(twin, ranks, None)["phases"]}
    base = {p["name"]: p["predicted_s"] for p in
            summarize_plan(twin, ranks, predict_plan(twin, setup.cluster, setup.compute))["phases"]}
    over = plan_overhead(measured, base)
    with_fb = {p["name"]: p["predicted_s"] for p in summarize_plan(
        twin, ranks, predict_plan(twin, setup.cluster, setup.compute,
                                  overhead={"fwd": over["fwd"], "bwd": over["bwd"], "opt": over["opt"]}))["phases"]}
    over["other"] = plan_overhead(measured, with_fb)["other"]
    return over


def calibration_inputs(summary: dict[str, Any], setup: Setup, comm_s: float,
                       compute_s: Callable[[Any], float]) -> dict[str, Any] | None:
    """What ``tpsim calibrate --from-validation`` fits on: the measured fwd+bwd per layer and micro-batch, and
    the prediction's parts from the unscaled profile (GEMM, attention, memory-bound kernels; the rest, mostly
    exposed communication, as predicted). ``compute_s(compute)``: the case's predicted compute seconds under a
    compute model (each part: the unscaled profile with the other kinds of kernel set to zero)."""
    measured = next((p for p in summary["phases"] if p["name"] == "fwd+bwd"), None)
    if measured is None:
        return None
    kinds = ("gemm", "attention", "memory")
    parts = {f"{kind}_s": compute_s(ScaledCompute(setup.raw, **{k: float(k == kind) for k in kinds}))
             for kind in kinds}
    fwd = next((p["measured_s"] for p in summary["phases"] if p["name"] == "fwd"), None)
    return {"measured_s": measured["measured_s"], "measured_fwd_s": fwd, **parts, "comm_s": max(comm_s, 0.0),
            "device": setup.cluster.device.name, "profile": str(setup.profile) if setup.profile else None,
            "profile_device": _profile_device(setup.raw), "stack": VALIDATION_STACK}


def _block_compute_s(model: Any, plan: Any, fused: bool, setup: Setup) -> Callable[[Any], float]:
    """:func:`calibration_inputs`'s ``compute_s`` for a block (the estimator's own block costs)."""
    from ..estimator.block import predict_block

    def compute_s(compute: Any) -> float:
        blk = predict_block(model, setup.cluster, plan, compute=compute, flavor="dtensor", fused=fused)
        return blk.fwd_compute_s + blk.bwd_compute_s
    return compute_s


def _profile_device(compute: Any) -> str | None:
    profile = getattr(compute, "profile", None)
    return getattr(getattr(profile, "meta", None), "device", None)


def _world(case: Any) -> int:
    return case.world if isinstance(case, (PlanCase, AxisCase)) else case.tp


def validate(cases: list, cfg: LaunchConfig, opts: Options, name: str,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every case (grouped by rank count, one launch each), write ``<out_dir>/<name>.csv``, ``.png``,
    ``.json`` (and the collective calibration it measured); return the report (the ``--json`` object).

    The work folder (job, launcher log, every rank's errors) is removed after a successful run and kept after
    a failed one: :class:`RankFailure` names it."""
    summaries: list[dict[str, Any]] = []
    if cfg.trace_terms and not cfg.trace_dir and any(isinstance(c, PlanCase) for c in cases):
        cfg = dataclasses.replace(cfg, trace_dir=str(opts.out_dir / f"{_slug(name)}-traces"))
    cases = list({c.name: c for c in cases}.values())  # a case listed twice runs once (results are by name)
    work = Path(tempfile.mkdtemp(prefix=f"tpsim-validate-{_slug(name)}-"))
    probes: dict = {}
    try:
        for world in sorted({_world(c) for c in cases}):
            group = [c for c in cases if _world(c) == world]
            if cfg.joined and cfg.nproc * cfg.nnodes != world:
                from ..errors import InputError
                raise InputError(f"case {group[0].name} needs {world} ranks; the launch that started tpsim validate "
                                 f"has {cfg.nproc * cfg.nnodes} (WORLD_SIZE / SLURM_NTASKS)")
            launch_cfg = cfg if cfg.nproc * cfg.nnodes == world else dataclasses.replace(cfg, nproc=world, nnodes=1)
            summaries += run_cases(group, launch_cfg, opts, work, env, probes)
        _keep_calibration(summaries, work, opts.out_dir, name)
    except RankFailure as exc:
        raise RankFailure(f"{exc} [logs kept in {work}]") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the user stopped it (tpsim prints the one line); nothing to keep
        shutil.rmtree(work, ignore_errors=True)
        raise
    except BaseException:
        print(f"tpsim validate: logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    if not summaries:
        return {"name": name, "backend": cfg.backend, "note": "rank 0 ran on another node; its node writes "
                "the report", "numerics_ok": True, "collectives_match": True, "phases": [], "cases": []}
    report = _report(summaries, name, cfg.backend)
    csv_path = opts.out_dir / f"{name}.csv"
    write_csv(csv_path, summaries, cfg.backend)
    report["csv"] = str(csv_path)
    if opts.chart and _has_matplotlib() and any(p["predicted_s"] for s in summaries for p in s["phases"]):
        png = opts.out_dir / f"{name}.png"
        err = report["layer_error"]
        title = (f"tpsim validate {name}: {cfg.backend}, {len(summaries)} case(s); fwd+bwd |error| median "
                 f"{_pct(err['median_abs_error_pct'])}, worst {_pct(err['worst_abs_error_pct'])}")
        write_scatter(png, summaries, title)
        report["chart"] = str(png)
    if opts.chart and _has_matplotlib() and any(s.get("terms") for s in summaries):
        png = opts.out_dir / f"{name}-terms.png"
        write_terms_chart(png, summaries, f"tpsim validate {name}: step terms, predicted vs measured")
        report["terms_chart"] = str(png)
    write_atomic(opts.out_dir / f"{name}.json", json.dumps(report, indent=1, default=str).encode())
    return report


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)[:60]


def _keep_calibration(summaries: list[dict[str, Any]], work: Path, out_dir: Path, name: str) -> None:
    """Copy the collective measurements and calibrations made for this run next to the report
    (``<name>-calibration.yaml``, or ``<name>-calibration-<n>ranks.yaml`` when several rank counts ran)."""
    made = sorted({Path(s["calibration"]) for s in summaries
                   if s.get("calibration") and Path(s["calibration"]).parent == work})
    for cal in made:
        nproc = cal.stem.rsplit("-", 1)[1]
        suffix = "" if len(made) == 1 else f"-{nproc}ranks"
        kept = {}
        for src, what in ((cal, "calibration.yaml"), (work / f"bench-collectives-{nproc}.csv", "bench-collectives.csv")):
            if src.exists():
                stem, ext = what.rsplit(".", 1)
                dst = out_dir / f"{name}-{stem}{suffix}.{ext}"
                write_atomic(dst, src.read_bytes())
                kept[what] = dst
        for s in summaries:
            if s.get("calibration") == str(cal) and "calibration.yaml" in kept:
                s["calibration"] = str(kept["calibration.yaml"])


def _has_matplotlib() -> bool:
    """A bare GPU machine may lack matplotlib: the CSV and JSON are written anyway."""
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def _report(summaries: list[dict[str, Any]], name: str, backend: str) -> dict[str, Any]:
    phases = [dict(p, case=s["case"]) for s in summaries for p in s["phases"]] if len(summaries) > 1 \
        else summaries[0]["phases"]
    twins = [s["framework_overhead_s"] for s in summaries if s.get("framework_overhead_s")]
    return {"name": name, "backend": backend,
            "numerics_ok": all(s["numerics_ok"] for s in summaries) and all(t["numerics_ok"] for t in twins),
            "collectives_match": all(s["collectives_match"] for s in summaries)
            and all(t["collectives_match"] for t in twins),
            "phases": phases, "layer_error": layer_errors(summaries),
            "step_error": step_errors(summaries), "term_error": term_errors(summaries),
            "terms": summaries[0].get("terms") or {} if len(summaries) == 1 else {},
            "cases": summaries}
