"""Per-term attribution figures of whole-plan validation reports (issue 22): for each timed plan case of
``tpsim validate`` JSON reports, the step's terms (docs/SCHEMAS.md T6 names) predicted and measured, whether the
measured terms add up to the measured step, and per term the median |error| over the cases.

Reports written before the terms existed are read through the same function (:func:`plan_terms`) from their
phases, so a committed matrix report gives the figures of the machine it was measured on.

The predicted side is **what the current code predicts** for the measured run (:func:`repredict`): the case's
prediction made again with ``tpsim.validate.plan.predict.predict_plan`` from what the report recorded of its run
(the kernel profile and the probe's drift scales, the collective calibration file, the framework overhead the
run's tiny twin measured), so a change of the cost model shows here without re-measuring; the report's own
prediction is printed beside it (``then``). ``--as-reported`` keeps the report's predictions.

    python benchmarks/validation_terms.py reports/validation/matrix-gpt-gloo-plans.json [more.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tpsim.model import PRESETS, with_overrides
from tpsim.validate.plan.case import PlanCase
from tpsim.validate.plan.terms import plan_terms, term_errors, terms_sum_error_pct


def case_of(config: dict) -> PlanCase:
    """The PlanCase of a report's ``config`` (the fields the terms need: axes, layers, micro-batches)."""
    base = PRESETS["gpt3-1.3b" if config["family"] == "gpt" else "llama3-8b"]
    model = with_overrides(base, layers=config["layers"], hidden=config["hidden"], heads=config["heads"],
                           kv_heads=config["kv_heads"], ffn=config["ffn"], seq_len=config["seq_len"])
    return PlanCase(model=model, tp=config["tp"], pp=config["pp"], vpp=config["vpp"], dp=config["dp"],
                    zero=config["zero"], sp=config["sp"], fused=config["fused"], micro_batch=config["micro_batch"],
                    microbatches=config["microbatches"], order=config["order"])


ROOT = Path(__file__).resolve().parent.parent


def _here(recorded: str | None, folder: str) -> Path | None:
    """A file the report names by the path of the machine it ran on, in this checkout (same name)."""
    if not recorded:
        return None
    path = ROOT / folder / Path(recorded).name
    return path if path.exists() else None


def repredict(summary: dict) -> dict[str, float] | None:
    """The phase figures (:func:`tpsim.validate.plan.report._predicted`) the current code predicts for the case
    of ``summary``, with the inputs its run recorded; None when they are not in this checkout."""
    from tpsim.compute.scaled import ScaledCompute
    from tpsim.validate.block.predict import compute_model, load_local_cluster
    from tpsim.validate.plan.predict import predict_plan
    from tpsim.validate.plan.report import _predicted

    case = case_of(summary["config"])
    check = summary.get("profile_check") or {}
    profile = _here(summary.get("profile"), "profiles")
    calibration = _here(summary.get("calibration"), "reports/validation")
    if summary.get("profile") and profile is None or summary.get("calibration") and calibration is None:
        return None
    import tempfile
    with tempfile.TemporaryDirectory(prefix="tpsim-terms-") as work:
        cluster = load_local_cluster("local-cpu", case.world, calibration, Path(work))
        compute = compute_model(cluster, profile)
        if check.get("action") == "rescaled" and check.get("scales"):
            compute = ScaledCompute(compute, **check["scales"], label="probe drift")
        over = {k: v for k, v in (summary.get("framework_overhead_s") or {}).items()
                if k in ("fwd", "bwd", "opt", "other")}
        return _predicted(predict_plan(case, cluster, compute, overhead=over), case)


def terms_of(summary: dict, now: bool = True) -> dict:
    """The case's terms, the predicted ones as the current code predicts them (``now``) or as reported."""
    if now:
        predicted = repredict(summary)
        if predicted is not None:
            measured = {p["name"]: p["measured_s"] for p in summary["phases"]}
            return plan_terms(case_of(summary["config"]), predicted, measured)
    return _reported_terms(summary)


def _reported_terms(summary: dict) -> dict:
    if summary.get("terms"):
        return summary["terms"]
    phases = {p["name"]: p for p in summary["phases"]}
    predicted = {k: p["predicted_s"] for k, p in phases.items() if p["predicted_s"] is not None}
    measured = {k: p["measured_s"] for k, p in phases.items()}
    return plan_terms(case_of(summary["config"]), predicted, measured)


def main(argv: list[str]) -> int:
    now = "--as-reported" not in argv
    paths = [a for a in argv if a != "--as-reported"]
    summaries = []
    for path in paths:
        report = json.loads(Path(path).read_text())
        for s in report["cases"]:
            if s.get("kind") != "plan" or not s.get("phases") or not any(p["name"] == "step" for p in s["phases"]):
                continue
            then = _reported_terms(s)
            s = dict(s, terms=terms_of(s, now))
            step = next(p["measured_s"] for p in s["phases"] if p["name"] == "step")
            gap = terms_sum_error_pct(s["terms"], step)
            print(f"{s['case']}  measured step {step * 1e3:.1f} ms, terms sum {gap:+.1f}% "
                  f"(terms from the {s.get('terms_source') or 'timers'}; predicted by "
                  f"{'the current code' if now else 'the report'})")
            for n, t in s["terms"].items():
                p, m = t["predicted_s"], t["measured_s"]
                err = f"{100 * (p - m) / m:+6.1f}%" if p is not None and m else ""
                was = (then.get(n) or {}).get("predicted_s")
                was = f"  (then {was * 1e3:.2f})" if now and was is not None else ""
                print(f"  {n:<10} predicted {p * 1e3:10.2f} ms  measured {m * 1e3:10.2f} ms  {err}{was}")
            summaries.append(s)
    te = term_errors(summaries)
    gaps = [abs(terms_sum_error_pct(s["terms"], next(p["measured_s"] for p in s["phases"] if p["name"] == "step")))
            for s in summaries]
    print(f"{len(summaries)} timed plan case(s); |terms sum - step|: median {statistics.median(gaps):.1f}%, "
          f"worst {max(gaps):.1f}%" if gaps else "no timed plan case")
    for n, v in te["terms"].items():
        print(f"  {n:<10} {v['cases']} case(s): median |error| {v['median_abs_error_pct']:.1f}%, worst "
              f"{v['worst_abs_error_pct']:.1f}%, within 25%: {v['within_25pct']}")
    if te["values"]:
        print(f"  every term of every case ({te['values']} values): median |error| {te['median_abs_error_pct']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
