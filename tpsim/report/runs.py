"""``tpsim report --runs RUNS.csv``: predicted against measured step time for measured runs, with bands, before
and after calibration (docs/RUNS.md "Report").

*Before*: the uncalibrated estimator, with its band from the residuals of the shipped runs. *After*: with
``--calibration CAL.yaml`` (a ``calibrate --from-runs`` file), that calibration's predictions and bands; without
one, the runs calibrate themselves **leave-one-out** (each run predicted by the fit of the others of its device
and stack, its band from the others' leave-one-out residuals), so no run is predicted from its own measurement.

Writes ``README.md``, ``runs_predicted.csv`` (the numbers) and ``predicted_vs_measured.png``/``.svg``.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Sequence

from ..calibration import Calibration
from ..estimator.band import apply_band, residual_band
from ..runfit import calibrated_residuals, fit_runs, plan_band, predict, shipped_residuals
from ..runs import Run, stack_name

RUNS_REPORT_FILES = ("README.md", "runs_predicted.csv", "predicted_vs_measured.png", "predicted_vs_measured.svg")


def runs_table(runs: Sequence[Run], calibration: Calibration | None = None) -> list[dict[str, Any]]:
    """One row per run: measured, before (uncalibrated) and after (calibrated) step time with bands."""
    shipped = shipped_residuals()
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.device, stack_name(r.stack)), []).append(r)
    after: dict[str, tuple[float, float, float, str]] = {}
    if calibration is not None:
        for r in runs:
            est = predict(r, calibration=calibration)
            b = plan_band(None, model=r.model, cluster=r.load_cluster(), plan=r.plan, stack=est.stack,
                          calibration=calibration)
            est = apply_band(est, b)
            after[r.run_id] = (est.step_time_s, est.step_time_s_low, est.step_time_s_high,
                               f"{calibration.path}")
    else:
        for (device, stack), members in groups.items():
            if len(members) < 2:
                continue
            fit = fit_runs(members)
            own = calibrated_residuals(Calibration(provenance={"runs_fit": fit.to_yaml_dict()["runs_fit"]}))
            for r, res in zip(members, fit.runs):
                step = res.measured_s * (1.0 + res.loo_error)  # the fit of the others, on this run
                b = residual_band(own, device=device, stack=stack, params=float(r.model.total_params()),
                                  gpus=r.gpus, tp=r.plan.tp, cp=r.plan.cp, pp=r.plan.pp, dtype=r.plan.dtype,
                                  recompute=r.plan.recompute, seq_len=int(r.model.seq_len), kind="calibrated",
                                  exclude=r.run_id, prior_sigma=fit.sigma)
                after[r.run_id] = (step, step * b.low_factor, step * b.high_factor,
                                   f"leave-one-out fit of {len(members) - 1} runs")
    for r in runs:
        est = predict(r)
        b = residual_band(shipped, device=r.device, stack=stack_name(r.stack),
                          params=float(r.model.total_params()), gpus=r.gpus, tp=r.plan.tp, cp=r.plan.cp,
                          pp=r.plan.pp, dtype=r.plan.dtype, recompute=r.plan.recompute, seq_len=int(r.model.seq_len),
                          exclude=r.run_id)
        row = {"run_id": r.run_id, "device": r.device, "stack": stack_name(r.stack), "plan": r.plan.short(),
               "measured_s": r.measured, "before_s": est.step_time_s, "before_low_s": est.step_time_s * b.low_factor,
               "before_high_s": est.step_time_s * b.high_factor}
        a = after.get(r.run_id)
        row.update({"after_s": a[0] if a else math.nan, "after_low_s": a[1] if a else math.nan,
                    "after_high_s": a[2] if a else math.nan, "after_basis": a[3] if a else "no calibration "
                    "(the only run of its device and stack)"})
        rows.append(row)
    return rows


def predicted_vs_measured_chart(rows: Sequence[dict[str, Any]]) -> Any:
    """Two panels (before, after): predicted against measured step time, bands as error bars, the diagonal."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5), layout="constrained")
    axes = fig.subplots(1, 2)
    measured = [r["measured_s"] for r in rows]
    lo, hi = min(measured) / 1.6, max(measured) * 1.6
    for ax, key, title in ((axes[0], "before", "before calibration (uncalibrated)"),
                           (axes[1], "after", "after calibration")):
        pts = [r for r in rows if math.isfinite(r[f"{key}_s"])]
        x = [r["measured_s"] for r in pts]
        y = [r[f"{key}_s"] for r in pts]
        err = [[max(r[f"{key}_s"] - r[f"{key}_low_s"], 0.0) for r in pts],
               [max(r[f"{key}_high_s"] - r[f"{key}_s"], 0.0) for r in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o", ms=4, capsize=2, elinewidth=0.8, label="prediction, 90% band")
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, label="predicted = measured")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured step time (s)")
        ax.set_ylabel("predicted step time (s)")
        inside = sum(1 for r in pts if r[f"{key}_low_s"] <= r["measured_s"] <= r[f"{key}_high_s"])
        errs = sorted(abs(r[f"{key}_s"] / r["measured_s"] - 1) for r in pts)
        median = errs[len(errs) // 2] if errs else math.nan
        ax.set_title(f"{title}\nmedian |error| {100 * median:.1f}%, {inside}/{len(pts)} inside the band")
        ax.legend(loc="upper left", fontsize=8)
    return fig


def write_runs_report(runs: Sequence[Run], out_dir: str | Path, *, calibration: Calibration | None = None,
                      source: str = "") -> Path:
    """Write the runs report into ``out_dir`` (checked by the caller); returns the README path."""
    from ..io import atomic_write_text
    from .charts import save_figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = runs_table(runs, calibration)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write_text(out / "runs_predicted.csv", buf.getvalue(), "--out")
    save_figure(predicted_vs_measured_chart(rows), out / "predicted_vs_measured")

    def pct(a: float, b: float) -> str:
        return f"{100 * (a / b - 1):+.1f}%" if math.isfinite(a) else "-"

    lines = [f"# Predicted vs measured: {len(rows)} runs", "",
             f"Runs: `{source}`. Before: uncalibrated, band from the shipped runs' residuals (this run's own left "
             "out). After: " + (f"calibration `{calibration.path}`." if calibration is not None else
                                "each run predicted by the fit of the other runs of its device and stack "
                                "(leave-one-out), band from their leave-one-out residuals."), "",
             "![predicted vs measured](predicted_vs_measured.png)", "",
             "| run | device / stack | plan | measured s | before s | error | band | after s | error | band |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        inside_b = "in" if r["before_low_s"] <= r["measured_s"] <= r["before_high_s"] else "OUT"
        inside_a = ("in" if r["after_low_s"] <= r["measured_s"] <= r["after_high_s"] else "OUT") \
            if math.isfinite(r["after_s"]) else "-"
        lines.append(f"| {r['run_id']} | {r['device']} / {r['stack']} | {r['plan']} | {r['measured_s']:.4g} | "
                     f"{r['before_s']:.4g} | {pct(r['before_s'], r['measured_s'])} | {r['before_low_s']:.4g}-"
                     f"{r['before_high_s']:.4g} {inside_b} | "
                     + (f"{r['after_s']:.4g} | {pct(r['after_s'], r['measured_s'])} | {r['after_low_s']:.4g}-"
                        f"{r['after_high_s']:.4g} {inside_a} |" if math.isfinite(r["after_s"]) else "- | - | - |"))
    lines += ["", "Numbers: `runs_predicted.csv`. Schema and method: docs/RUNS.md.", ""]
    path = out / "README.md"
    atomic_write_text(path, "\n".join(lines), "--out")
    return path
