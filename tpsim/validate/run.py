"""``tpsim validate`` end to end: calibrate the collectives, launch the ranks, predict, compare, report."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..model import ModelSpec, with_overrides
from .case import Case
from .launch import LaunchConfig, RankFailure, launch
from .predict import (REPO_ROOT, compute_model, find_profile, grid_hits, load_local_cluster, predict_case)
from .report import layer_errors, summarize_case, write_atomic, write_csv, write_scatter
from .overhead import measured_overhead, overhead_case, with_overhead
from .scale import fit_case

REPORTS_DIR = REPO_ROOT / "reports" / "validation"
MATRIX_TP = (1, 2)
MATRIX_SP = (False, True)
MATRIX_HIDDEN = (512, 1024, 2048)
MATRIX_SEQ = (128, 512)
BENCH_SIZES = ("64K", "256K", "1M", "4M", "16M")
"""collective sizes of the calibration run: the validation's activations (tokens x hidden x 4 B) span them."""
MATRIX_HEAD_DIM = 64
"""head dim of the matrix's models (heads = hidden / 64)."""


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


def calibrate_collectives(cfg: LaunchConfig, cluster: str, work: Path) -> Path:
    """Run a short ``tpsim bench-collectives`` with the same backend and rank count, then ``tpsim calibrate``;
    return the calibration file."""
    csv_path, cal_path = work / "bench-collectives.csv", work / "calibration.yaml"
    steps = [["bench-collectives", "--nproc", str(cfg.nproc), "--backend", cfg.backend,
              "--ops", "all_reduce", "all_gather", "reduce_scatter", "--sizes", *BENCH_SIZES,
              "--out", str(csv_path), "--timeout", str(int(cfg.timeout_s))],
             ["calibrate", str(csv_path), "--cluster", cluster, "--out", str(cal_path)]]
    for args in steps:
        proc = subprocess.run([sys.executable, "-m", "tpsim.cli", *args], capture_output=True, text=True,
                              timeout=max(300.0, 10 * cfg.timeout_s))
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RankFailure(f"collective calibration failed: tpsim {' '.join(args[:1])}: {last}")
    return cal_path


def run_cases(cases: list[Case], cfg: LaunchConfig, opts: Options, work: Path,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Predict, launch and summarize ``cases`` that share one launch config (same TP degree)."""
    calibration = opts.calibration
    if calibration is None and opts.calibrate and cfg.nproc > 1 and cfg.nnodes == 1:  # bench runs on one node
        calibration = calibrate_collectives(cfg, opts.cluster, work)
    cluster = load_local_cluster(opts.cluster, cfg.nproc * cfg.nnodes, calibration, work)
    device_type = "cuda" if cfg.backend == "nccl" else "cpu"
    profile = (opts.profile or find_profile(device_type)) if opts.use_profile else None
    compute = compute_model(cluster, profile)
    memory = int(cluster.device.usable_memory_bytes) * cfg.nproc if device_type == "cuda" else None
    cases = [fit_case(c, cfg.nproc, compute, opts.budget_s, memory_bytes=memory) for c in cases]
    tiny = {c.name: overhead_case(c) for c in cases} if opts.overhead else {}
    runs = list({t.name: t for t in tiny.values()}.values()) + cases
    preds = {c.name: predict_case(c, cluster, compute) for c in runs}
    result = launch(runs, cfg, work / f"run-tp{cfg.nproc}", env=env)
    if result is None:
        return []  # another node holds rank 0 and writes the report
    per_case: dict[str, list[dict[str, Any]]] = {}
    for rank_results in result["ranks"]:
        for r in rank_results:
            per_case.setdefault(r["case"], []).append(r)
    out = []
    for c in cases:
        pred, overhead = preds[c.name], None
        if c.name in tiny:
            t = tiny[c.name]
            overhead = measured_overhead(per_case[t.name], preds[t.name])
            check = summarize_case(t, per_case[t.name], preds[t.name])
            overhead.update(case=t.name, numerics_ok=check["numerics_ok"],
                            collectives_match=check["collectives_match"])
            pred = with_overhead(pred, overhead)
        s = summarize_case(c, per_case[c.name], pred)
        s["framework_overhead_s"] = overhead
        s["predicted_without_overhead_s"] = {"fwd": preds[c.name].fwd_s, "bwd": preds[c.name].bwd_s}
        s["profile"] = str(profile) if profile else None
        s["profile_grid_hits"] = len(grid_hits(c, profile))
        s["calibration"] = str(calibration) if calibration else None
        s["meta"] = result["meta"]
        out.append(s)
    return out


def validate(cases: list[Case], cfg: LaunchConfig, opts: Options, name: str,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every case (grouped by TP degree, one launch each), write ``<out_dir>/<name>.csv``, ``.png``,
    ``.json`` (and the collective calibration it measured); return the report (the ``--json`` object)."""
    summaries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpsim-validate-") as tmp:
        for tp in sorted({c.tp for c in cases}):
            group = [c for c in cases if c.tp == tp]
            launch_cfg = cfg if cfg.nproc * cfg.nnodes == tp else dataclasses.replace(cfg, nproc=tp, nnodes=1)
            summaries += run_cases(group, launch_cfg, opts, Path(tmp), env)
        _keep_calibration(summaries, Path(tmp), opts.out_dir, name)
    if not summaries:
        return {"name": name, "backend": cfg.backend, "note": "rank 0 ran on another node; its node writes "
                "the report", "numerics_ok": True, "collectives_match": True, "phases": [], "cases": []}
    report = _report(summaries, name, cfg.backend)
    csv_path = opts.out_dir / f"{name}.csv"
    write_csv(csv_path, summaries, cfg.backend)
    report["csv"] = str(csv_path)
    if opts.chart and _has_matplotlib():
        png = opts.out_dir / f"{name}.png"
        err = report["layer_error"]
        title = (f"tpsim validate {name}: {cfg.backend}, {len(summaries)} case(s); fwd+bwd |error| median "
                 f"{_pct(err['median_abs_error_pct'])}, worst {_pct(err['worst_abs_error_pct'])}")
        write_scatter(png, summaries, title)
        report["chart"] = str(png)
    write_atomic(opts.out_dir / f"{name}.json", json.dumps(report, indent=1, default=str).encode())
    return report


def _keep_calibration(summaries: list[dict[str, Any]], work: Path, out_dir: Path, name: str) -> None:
    """Copy the collective measurements and calibration made for this run next to the report."""
    for s in summaries:
        cal = s.get("calibration")
        if cal and Path(cal).parent == work:
            for src, suffix in ((Path(cal), "calibration.yaml"), (work / "bench-collectives.csv",
                                                                   "bench-collectives.csv")):
                if src.exists():
                    dst = out_dir / f"{name}-{suffix}"
                    write_atomic(dst, src.read_bytes())
                    if suffix == "calibration.yaml":
                        s["calibration"] = str(dst)


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
            "phases": phases, "layer_error": layer_errors(summaries), "cases": summaries}


def matrix_cases(base: ModelSpec, fused: bool = False, micro_batch: int = 3, reps: int = 5,
                 warmup: int = 2, tps: tuple[int, ...] = MATRIX_TP, hiddens: tuple[int, ...] = MATRIX_HIDDEN,
                 seqs: tuple[int, ...] = MATRIX_SEQ) -> list[Case]:
    """tp x sp x hidden x seq (sp only with tp > 1), heads = hidden / 64, GPT ffn = 4h, Llama ffn = 3.5h."""
    cases = []
    for tp in tps:
        for sp in MATRIX_SP:
            if sp and tp == 1:
                continue
            for h in hiddens:
                for s in seqs:
                    heads = h // MATRIX_HEAD_DIM
                    kv = min(base.num_kv_heads, heads) if base.num_kv_heads < base.num_attention_heads else heads
                    ffn = 4 * h if base.family == "gpt" else 7 * h // 2
                    model = with_overrides(base, hidden=h, heads=heads, kv_heads=kv, ffn=ffn, seq_len=s)
                    cases.append(Case(model=model, tp=tp, sp=sp, fused=fused, micro_batch=micro_batch,
                                      reps=reps, warmup=warmup))
    if not cases:
        raise InputError("the validation matrix is empty")
    return cases
