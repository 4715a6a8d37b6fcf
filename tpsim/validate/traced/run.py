"""``tpsim validate --model X.ops.json``: run a traced model, sharded in its derived TP plan, on ``tp`` ranks and
compare with the op-graph cost model (torch-free here; the ranks run :mod:`tpsim.validate.traced.worker`).

Checked, as for transformer blocks (docs/VALIDATION.md): numerics (loss and every parameter gradient against
the unsharded model, in float64 to 1e-8: a whole model's fp32 rounding in another summation order exceeds the
block check's 1e-4), collectives (``CommDebugMode`` counts and bytes per type, forward and
backward, on every rank, against :func:`tpsim.opgraph.layout.unit_layout` with the ``dtensor`` flavor), and
time (forward and backward of one micro-batch of the traced input shapes, the median over ``reps``, against the
op-graph prediction on the machine the ranks run on: its kernel profile and its collective calibration).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...opgraph.layout import unit_layout
from ...opgraph.model import OpGraphModel
from ...opgraph.tp import is_depthwise, styles_at
from ...procs import child_preexec
from ..launch import MARK_ENV, LaunchConfig, RankFailure, _collect, _kill_all, _supervise, _terminate_as_exception

WORKER = "tpsim.validate.traced.worker"
FP64_BYTES = 8
"""the numerics-and-collectives pass runs in float64 (the timed pass in float32)."""
SUPPORTED = ("colwise", "rowwise", "vocab", "sharded", "vocab_loss", "replicate")


@dataclass(frozen=True, kw_only=True)
class TracedCase:
    """A traced model to run sharded on ``tp`` ranks."""

    model: OpGraphModel
    tp: int
    module_spec: str = ""
    """the model's factory, as the user gave it (``--module-spec``). Required: the ``source.module_spec``
    recorded in an op graph is data and is never run (issue 26); :func:`recorded_factory` shows it."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """the factory's keyword arguments (``--kwarg``)."""
    reps: int = 5
    warmup: int = 2
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.model.name}-tp{self.tp}-b{self.model.graph.batch}"

    def spec(self) -> tuple[str, dict[str, Any]]:
        """(factory, kwargs) the user gave; an op graph's own ``source.module_spec`` is never used."""
        if not self.module_spec:
            recorded, kwargs = recorded_factory(self.model)
            hint = (f" (it was traced from {recorded!r}"
                    + "".join(f" --kwarg {k}={v!r}" for k, v in kwargs.items())[:200] + ")") if recorded else ""
            raise InputError(f"{self.model.path}: validating a traced graph runs its model's code: give "
                             f"--module-spec MODULE:FN on the command line{hint}; a module named inside a data "
                             f"file is never run")
        return self.module_spec, dict(self.kwargs)


def recorded_factory(model: OpGraphModel) -> tuple[str, dict[str, Any]]:
    """The factory and kwargs an op graph says it was traced from (``source``), for display only: they are
    data from the file, and nothing runs them unless the caller passes them as :attr:`TracedCase.module_spec`."""
    src = model.graph.source
    spec = src.get("module_spec", "")
    kwargs = src.get("kwargs") or {}
    if not isinstance(spec, str) or not isinstance(kwargs, dict):
        return "", {}
    return spec[:300], {str(k)[:64]: _literal(v) for k, v in list(kwargs.items())[:32]}


def _literal(text: Any) -> Any:
    try:
        return ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError):
        return text


def module_styles(model: OpGraphModel, tp: int) -> tuple[dict[str, str], bool, list[str]]:
    """({module path of every instance: style}, vocabulary-parallel loss used, its colwise logits modules).
    Raises InputError for styles ``parallelize_module`` cannot express here."""
    graph = model.graph
    styles, _ = styles_at(graph, model.tp_plan, tp)
    modules: dict[str, str] = {}
    loss_parallel, loss_inputs = False, []
    for u, unit in enumerate(graph.units):
        first = unit.instances[0]
        for j, op in enumerate(unit.ops):
            style = styles[u][j]
            if style not in SUPPORTED:
                raise InputError(f"{op.name}: style {style} is not run by tpsim validate (supported: "
                                 f"{', '.join(SUPPORTED)}); pin it with --tp-plan")
            if style == "replicate" or (style == "sharded" and not op.params):
                continue
            if style == "vocab_loss":
                loss_parallel = True
                loss_inputs += [_instance(unit.ops[t.src].module, first, p) for t in op.inputs[:1] if t.src >= 0
                                for p in unit.instances]
                continue
            if style == "sharded" and not (op.kind == "norm" and op.attrs.get("type") in ("batchnorm", "groupnorm")
                                           or is_depthwise(op)):
                raise InputError(f"{op.name}: a {op.kind} with parameters on a channel shard is not run by tpsim "
                                 "validate (batch / group norms and depthwise convolutions are)")
            if op.name != op.module or op.module_type not in ("Linear", "Embedding", "BatchNorm1d", "BatchNorm2d",
                                                               "BatchNorm3d", "GroupNorm") + tuple(
                                                                   f"Conv{d}d" for d in (1, 2, 3)):
                raise InputError(f"{op.name} ({op.kind} in module {op.module or '(root)'} of type {op.module_type}) is "
                                 "not a module parallelize_module can shard; pin it replicate with --tp-plan")
            for path in unit.instances:
                modules[_instance(op.module, first, path)] = style
    return modules, loss_parallel, list(dict.fromkeys(loss_inputs))


def _instance(module: str, first: str, path: str) -> str:
    return path + module[len(first):] if first and module.startswith(first) else module


def expected_collectives(model: OpGraphModel, tp: int) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(counts, float64 bytes) per phase and collective of one forward + backward, flavor ``dtensor``. Bytes
    cover the activation collectives: the statistic reductions of ``loss_parallel`` run inside DTensor's op
    handlers, below the dispatch hook that records bytes (their count is checked)."""
    counts: dict[str, dict[str, int]] = {"fwd": {}, "bwd": {}}
    nbytes: dict[str, dict[str, int]] = {"fwd": {}, "bwd": {}}
    if tp == 1:
        return counts, nbytes
    styles, _ = styles_at(model.graph, model.tp_plan, tp)
    for u, unit in enumerate(model.graph.units):
        for c in unit_layout(model.graph, u, styles[u], tp, False, "dtensor").comms:
            counts[c.phase][c.op] = counts[c.phase].get(c.op, 0) + unit.repeat
            if c.dtype == "act":
                nbytes[c.phase][c.op] = nbytes[c.phase].get(c.op, 0) + unit.repeat * int(c.numel * FP64_BYTES)
    return counts, nbytes


def predict(model: OpGraphModel, cluster: Any, compute: Any, tp: int, conv_times: Any = None) -> dict[str, Any]:
    """Forward and backward seconds of one micro-batch (the traced inputs) on one rank, fp32, no overlap;
    ``conv_times``: measured convolution kernels (:mod:`tpsim.opgraph.convprofile`)."""
    import numpy as np

    from ...opgraph.cost import GraphCosts
    from ...topology.placement import RankLayout

    graph = model.graph
    costs = GraphCosts(graph, model.tp_plan, compute, flavor="dtensor", conv_times=conv_times)
    mb = np.array([float(graph.batch)])
    fwd = bwd = 0.0
    comm: dict[str, float] = {}
    cm = None
    if tp > 1:
        from ...collectives.model import get_collective_model
        cm = get_collective_model(cluster)
    layout = RankLayout.from_order("tp-dp-pp", tp=tp, dp=1, pp=1)
    for u, unit in enumerate(graph.units):
        c = costs.unit_cost(u, tp, False, mb, "fp32")
        fwd += unit.repeat * float(c.fwd[0])
        bwd += unit.repeat * float(c.bwd[0])
        if cm is None:
            continue
        for x in costs.static(tp, False)[0][u].layout.comms:
            t = float(cm.axis_curve(x.op, layout, "tp").time(x.numel * 4.0)) * unit.repeat
            comm[f"{x.phase}:{x.op}"] = comm.get(f"{x.phase}:{x.op}", 0.0) + t
    comm_f = sum(t for k, t in comm.items() if k.startswith("fwd:"))
    comm_b = sum(t for k, t in comm.items() if k.startswith("bwd:"))
    return {"fwd_s": fwd + comm_f, "bwd_s": bwd + comm_b, "fwd_compute_s": fwd, "bwd_compute_s": bwd,
            "comm_s": comm, "compute_model": compute.source,
            "conv_profile": getattr(conv_times, "path", None)}


def case_job(case: TracedCase) -> dict[str, Any]:
    """What the ranks need to build, shard and run one case (JSON)."""
    spec, kwargs = case.spec()
    modules, loss_parallel, loss_inputs = module_styles(case.model, case.tp)
    graph = case.model.graph
    embeddings = [op.attrs["num_embeddings"] for u in graph.units for op in u.ops if op.kind == "embedding"]
    return {"name": case.name, "module_spec": spec, "kwargs": kwargs, "tp": case.tp, "seed": case.seed,
            "reps": case.reps, "warmup": case.warmup, "inputs": [[list(t.shape), t.dtype] for t in graph.inputs],
            "int_high": min(embeddings) if embeddings else 2, "modules": modules, "loss_parallel": loss_parallel,
            "loss_inputs": loss_inputs}


def job_for(cases: list[TracedCase], cfg: LaunchConfig, out_dir: Path) -> dict[str, Any]:
    return {"cases": [case_job(c) for c in cases], "backend": cfg.backend, "timeout_s": cfg.timeout_s,
            "threads": cfg.threads, "out_dir": str(out_dir)}


def run_cases(cases: list[TracedCase], cfg: LaunchConfig, work: Path,
              predictions: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Launch every case (same TP degree) once on ``cfg.nproc`` ranks; one summary per case."""
    result = launch_traced(job_for(cases, cfg, work), cfg, work)
    per_case: dict[str, list[dict[str, Any]]] = {}
    for rank_results in result["ranks"]:
        for r in rank_results:
            per_case.setdefault(r["case"], []).append(r)
    return [summarize(c, {"ranks": per_case[c.name], "meta": result.get("meta", {})},
                      (predictions or {}).get(c.name)) for c in cases]


def launch_traced(job: dict[str, Any], cfg: LaunchConfig, run_dir: Path) -> dict[str, Any]:
    """Run the traced-model worker on ``cfg.nproc`` ranks (the block validation's launcher and clean-up)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    job_path = run_dir / "job.json"
    job_path.write_text(json.dumps(job))
    command = cfg.command(job_path)
    command[command.index("tpsim.validate.worker")] = WORKER
    token = uuid.uuid4().hex
    env = {**os.environ, MARK_ENV: token, "OMP_NUM_THREADS": str(cfg.threads), "PYTHONUNBUFFERED": "1"}
    log_path = run_dir / "launcher.log"
    with open(log_path, "wb") as log, _terminate_as_exception():
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=child_preexec)
        try:
            _supervise(proc, cfg, run_dir, token)
        finally:
            _kill_all(proc, token)
    try:
        result = _collect(proc.returncode, run_dir, log_path, False)
    except RankFailure as exc:  # the user's module ran there: name it (os._exit at import leaves no error file)
        specs = sorted({str(c["module_spec"]) for c in job["cases"]})
        if not any(s in str(exc) for s in specs):
            raise RankFailure(f"{exc} [running --module-spec {', '.join(specs)}]") from None
        raise
    assert result is not None  # single node: rank 0 is here
    return result


def summarize(case: TracedCase, result: dict[str, Any], pred: dict[str, Any] | None) -> dict[str, Any]:
    ranks = result["ranks"]
    counts, nbytes = expected_collectives(case.model, case.tp)
    norm = lambda d: {p: {k: v for k, v in d.get(p, {}).items() if v} for p in ("fwd", "bwd")}  # noqa: E731
    counts_ok = all(norm(r["counts"]) == norm(counts) for r in ranks)
    bytes_ok = all(norm(r["bytes"]) == norm(nbytes) for r in ranks)
    out: dict[str, Any] = {
        "case": case.name, "model": case.model.name, "tp": case.tp, "batch": case.model.graph.batch,
        "numerics_ok": all(r["numerics_ok"] for r in ranks),
        "numerics_max_rel_err": max(max(r["numerics"].values()) for r in ranks),
        "collectives_match": counts_ok and bytes_ok,
        "counts": {"measured": ranks[0]["counts"], "expected": counts},
        "bytes": {"measured": ranks[0]["bytes"], "expected": nbytes}, "meta": result.get("meta", {})}
    if "fwd_s" in ranks[0]:
        measured = {"fwd": max(r["fwd_s"] for r in ranks), "bwd": max(r["bwd_s"] for r in ranks)}
        measured["fwd+bwd"] = measured["fwd"] + measured["bwd"]
        phases = []
        for name, meas in measured.items():
            p = None
            if pred is not None:
                p = pred["fwd_s"] if name == "fwd" else pred["bwd_s"] if name == "bwd" else pred["fwd_s"] + pred["bwd_s"]
            phases.append({"name": name, "predicted_s": p, "measured_s": meas,
                           "error_pct": None if p is None else 100.0 * (p - meas) / meas})
        out["phases"] = phases
        out["prediction"] = pred
    return out


def find_conv_profile(device_type: str = "cpu") -> Path | None:
    """The newest ``profiles/conv-cpu-*.csv`` (CPU) or other ``profiles/conv-*.csv`` (GPU), written by
    ``python -m tpsim.profiler.conv``, if any (named apart from the kernel profiles ``find_profile`` picks)."""
    from ..block.predict import PROFILES_DIR
    found = [p for p in PROFILES_DIR.glob("conv-*.csv") if p.name.startswith("conv-cpu-") == (device_type == "cpu")]
    found.sort(key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def validate_traced(case: TracedCase, cfg: LaunchConfig, out_dir: Path, *, cluster: str = "local-cpu",
                    profile: Path | None = None, use_profile: bool = True, calibrate: bool = True,
                    calibration: Path | None = None, conv_profile: Path | None = None) -> dict[str, Any]:
    """Predict, run and compare one traced case; writes ``<out_dir>/<case>.json``; returns the report."""
    from ..block.predict import compute_model, find_profile, load_local_cluster
    from ..run import calibrate_collectives

    if cfg.nproc != case.tp or cfg.nnodes != 1:
        raise InputError(f"--nproc={cfg.nproc} must equal --tp={case.tp} on one node for a traced model")
    case.spec()  # a missing --module-spec is refused before the collectives are calibrated (tens of seconds)
    work = Path(tempfile.mkdtemp(prefix="tpsim-validate-traced-"))  # kept after a failure: the error names it
    try:
        if calibration is None and calibrate and case.tp > 1:
            calibration = calibrate_collectives(cfg, cluster, work)
        local = load_local_cluster(cluster, case.tp, calibration, work)
        device_type = "cuda" if cfg.backend == "nccl" else "cpu"
        prof = (profile or find_profile(device_type)) if use_profile else None
        compute = compute_model(local, prof)
        conv_path = (conv_profile or find_conv_profile(device_type)) if use_profile else None
        conv = None
        if conv_path is not None:
            from ...opgraph.convprofile import load_conv_profile
            conv = load_conv_profile(conv_path)
        pred = predict(case.model, local, compute, case.tp, conv) if case.reps > 0 else None
        report = run_cases([case], cfg, work / "run", {case.name: pred} if pred else None)[0]
    except RankFailure:
        raise  # its message names the rank logs under `work`: kept (issue 26: it named a deleted folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    report["calibration"] = str(calibration) if calibration else None
    report["profile"] = str(prof) if prof else None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{case.name}.json"
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp_path.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp_path, path)
    report["json"] = str(path)
    return report


def format_traced(report: dict[str, Any]) -> str:
    lines = [f"{report['case']}  numerics {'ok' if report['numerics_ok'] else 'FAIL'} (max rel err "
             f"{report['numerics_max_rel_err']:.1e})  collectives "
             f"{'match' if report['collectives_match'] else 'MISMATCH'}"]
    c = report["counts"]
    for phase in ("fwd", "bwd"):
        lines.append(f"  {phase} collectives measured {c['measured'].get(phase, {})} expected {c['expected'].get(phase, {})}")
    for p in report.get("phases", []):
        pred = "-" if p["predicted_s"] is None else f"{p['predicted_s'] * 1e3:10.3f} ms"
        err = "" if p["error_pct"] is None else f"{p['error_pct']:+7.1f}%"
        lines.append(f"  {p['name']:<8} predicted {pred:>13}  measured {p['measured_s'] * 1e3:10.3f} ms  {err}")
    lines.append(f"report: {report['json']}")
    return "\n".join(lines)
