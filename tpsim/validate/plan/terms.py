"""Per-term attribution of a whole-plan step and its stragglers and variance (torch-free).

**Terms** (docs/SCHEMAS.md T6 names; seconds per step, the slowest rank's): the measured step is split by what
the ranks time separately in the same run (:mod:`tpsim.validate.plan.run`: the chunks' forward and backward, the
optimizer step, and every collective per mesh axis and kind, waited where it is issued, in separate steps):

* ``compute``: the busiest rank's forward and backward of every chunk and micro-batch less the TP collectives
  waited inside them (the per-layer framework overhead included, as in the prediction with its twin);
* ``tp_comm``: the TP collectives per step (the fastest rank's total per kind, as in the phases);
* ``optimizer``: the optimizer step (ZeRO-1's reduce-scatter and all-gather run inside it);
* the rest of the step (outside the chunks and the optimizer): ``bubble`` with a pipeline (the fill and drain,
  with the pipeline sends and receives the ranks wait in: torch's schedules wait for a transfer and for the
  peer's compute in the same call, so the two are not separable by timers), else ``dp_comm`` (DDP's buckets and
  FSDP2's collectives not hidden behind the backward, plus host gaps between the phases).

Predicted terms are the prediction's own pieces grouped the same way (:func:`plan_terms`). Measured terms add
up to the measured step by construction up to the rank skew (the busiest rank's chunks and optimizer are
not always one rank's): ``terms_sum_error_pct`` says how far. With profiled steps (``--trace-terms``, the
default) the measured terms come from the traces instead where the profiler is cheap (:func:`traced_terms`,
:mod:`tpsim.validate.plan.attribute`).

**Stragglers and variance** (:func:`per_rank`): every rank's median step (wall time less its run-queue delay)
over the timed steps after the warm-up, the slowest rank and its host, the rank-to-rank spread, and the
step-to-step spread of the step that is compared (min, median, max of the N steps).
"""

from __future__ import annotations

import statistics
from typing import Any

from .case import PlanCase

TERM_ORDER = ("compute", "recompute", "bubble", "optimizer", "overhead", "tp_comm", "cp_comm", "ep_comm",
              "pp_comm", "dp_comm")
"""docs/SCHEMAS.md T6: the estimator's step-time terms, in its order."""


def rest_term(case: PlanCase) -> str:
    """The term the part of the step outside the chunks and the optimizer is attributed to."""
    return "bubble" if case.pp > 1 else "dp_comm"


def plan_terms(case: PlanCase, predicted: dict[str, float], measured: dict[str, float]) -> dict[str, Any]:
    """``{name: {predicted_s, measured_s}}`` per step, T6 names in T6 order (terms absent from this plan left
    out), from the phase figures of :func:`tpsim.validate.plan.report.summarize_plan` (per layer and
    micro-batch for ``fwd+bwd``, per step for the rest, ``tp:<op>`` per step)."""
    per_step = case.microbatches * case.layers_per_rank

    def split(figures: dict[str, float]) -> dict[str, float] | None:
        if not figures or figures.get("fwd+bwd") is None:
            return None
        tp = sum(v for k, v in figures.items() if k.startswith("tp:") and v is not None)
        return {"compute": max(figures["fwd+bwd"] * per_step - tp, 0.0), "tp_comm": tp,
                "optimizer": figures.get("step:optimizer") or 0.0, rest_term(case): figures.get("step:other") or 0.0}
    p, m = split(predicted), split(measured)
    if m is None:
        return {}
    names = [n for n in TERM_ORDER if n in m and (n != "tp_comm" or case.tp > 1)]
    return {n: {"predicted_s": p[n] if p is not None else None, "measured_s": m[n]} for n in names}


TRACE_MAX_OVERHEAD_PCT = 5.0
"""the profiled steps give the terms when the profiler slowed the step by at most this (the sum of the terms is
then within it of the timed step); else the timers do."""


def traced_terms(timers: dict[str, Any], profiled: list[dict[str, Any]]
                 ) -> tuple[dict[str, Any] | None, str]:
    """The measured terms from the profiled ranks (the busiest one's median profiled step: its compute the
    largest, as the timers take the busiest rank's chunks), the predicted ones as :func:`plan_terms` gave them;
    (None, why) when there is no profiled step, or the profiler's overhead is over ``TRACE_MAX_OVERHEAD_PCT``."""
    usable = [p for p in profiled if p.get("terms")]
    stopped = [p["stopped"] for p in profiled if p.get("stopped")]
    if stopped and not usable:
        return None, stopped[0]
    if not usable or not timers:
        return None, "no profiled step" if not usable else "nothing timed"
    busiest = max(usable, key=lambda p: p["terms"].get("compute", 0.0))
    over = busiest.get("overhead_pct")
    if over is None:
        return None, "no timed step to compare the profiler with"
    if abs(over) > TRACE_MAX_OVERHEAD_PCT:
        return None, (f"profiled step {over:+.1f}% off the timed step (over {TRACE_MAX_OVERHEAD_PCT:.0f}%: the "
                      "profiler's overhead): terms from the timers")
    preempted = 100.0 * busiest.get("delay_s", 0.0) / busiest["wall_s"] if busiest["wall_s"] > 0 else 0.0
    if preempted > TRACE_MAX_OVERHEAD_PCT:
        return None, (f"the profiled step sat {preempted:.0f}% of its time on a run queue (a loaded machine): "
                      "terms from the timers")
    names = [n for n in TERM_ORDER if n in busiest["terms"]]
    out = {n: {"predicted_s": (timers.get(n) or {}).get("predicted_s"), "measured_s": busiest["terms"][n]}
           for n in names}
    return out, (f"from the profiled steps of rank {busiest['rank']} (profiler overhead {over:+.1f}%)")


def terms_sum_error_pct(terms: dict[str, Any], measured_step_s: float | None) -> float | None:
    """100 (sum of the measured terms - the measured step) / the measured step."""
    if not terms or not measured_step_s:
        return None
    total = sum(t["measured_s"] for t in terms.values())
    return 100.0 * (total - measured_step_s) / measured_step_s


def term_errors(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per term over the cases: |predicted - measured| / measured in %, median and worst, and how many are
    within 25 %; terms under 1 % of their step are left out (their relative error is noise)."""
    per: dict[str, list[float]] = {}
    for s in summaries:
        step = next((p["measured_s"] for p in s.get("phases", []) if p["name"] == "step"), None)
        for name, t in (s.get("terms") or {}).items():
            if t["predicted_s"] is None or not t["measured_s"] or not step or t["measured_s"] < 0.01 * step:
                continue
            per.setdefault(name, []).append(100.0 * abs(t["predicted_s"] - t["measured_s"]) / t["measured_s"])
    every = [e for v in per.values() for e in v]
    return {"terms": {n: {"cases": len(v), "median_abs_error_pct": statistics.median(v),
                          "worst_abs_error_pct": max(v), "within_25pct": sum(e <= 25 for e in v)}
                      for n, v in per.items()},
            "median_abs_error_pct": statistics.median(every) if every else None, "values": len(every)}


def per_rank(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Stragglers and variance of the timed steps (see module docstring); None when nothing was timed."""
    timed = [r for r in ranks if r.get("samples")]
    if not timed:
        return None
    rows = []
    for r in sorted(timed, key=lambda r: r["rank"]):
        steps = [max(s["step_wall"] - s["delay"], 0.0) for s in r["samples"]]
        med = statistics.median(steps)
        rows.append({"rank": r["rank"], "host": r.get("host"), "coords": r.get("coords"), "step_s": med,
                     "min_s": min(steps), "max_s": max(steps),
                     "spread_pct": 100.0 * (max(steps) - min(steps)) / med if med > 0 else None})
    slowest = max(rows, key=lambda x: x["step_s"])
    fastest = min(rows, key=lambda x: x["step_s"])
    n = len(timed[0]["samples"])
    per_iter = [max(max(r["samples"][i]["step_wall"] for r in timed) - max(r["samples"][i]["delay"] for r in timed),
                    0.0) for i in range(n)]
    med = statistics.median(per_iter)
    return {"ranks": rows, "slowest": {"rank": slowest["rank"], "host": slowest["host"], "step_s": slowest["step_s"]},
            "rank_spread_pct": 100.0 * (slowest["step_s"] - fastest["step_s"]) / fastest["step_s"]
            if fastest["step_s"] > 0 else None,
            "steps": n, "step_median_s": med, "step_min_s": min(per_iter), "step_max_s": max(per_iter),
            "step_spread_pct": 100.0 * (max(per_iter) - min(per_iter)) / med if med > 0 else None}
