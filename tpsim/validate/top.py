"""``tpsim plan ... --validate-top K``: run the scaled-down versions of the K best plans (and a few lower-ranked
ones for contrast) and check that the measured order agrees with the predicted one (launcher side, torch-free).

Each ranked plan becomes a :class:`PlanCase` (its tp, pp, vpp, dp, ZeRO stage, SP, micro-batch, rank order and
micro-batches per step, fewer layers; fp32 and no recomputation, what validate runs); the prediction compared is
that of the scaled-down case (:func:`tpsim.validate.plan.predict.predict_plan`), so that predicted and measured
describe the same run. All plans of one search have the same GPU count, so they share one launch. Reported:
Spearman's rank correlation of predicted and measured step times, and the measured step of the predicted best
against the measured best.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..model import ModelSpec, with_overrides
from .plan.case import PlanCase

CONTRAST = 2
"""lower-ranked plans added for contrast (the median and the last of the ranking)."""
MAX_MICROBATCHES = 8
"""micro-batches per step of a scaled-down plan at most (the bubble's share is kept when pp divides it)."""
BEST_WITHIN = 0.10
"""the predicted best should be the measured best or within this of it (issue 12's target)."""


@dataclass(frozen=True)
class Pick:
    """One plan picked from the ranking."""

    search_rank: int
    """1-based position in the search's ranking."""
    plan: Any
    role: str
    """"top" or "contrast"."""


def runs_whole(plan: Any) -> bool:
    """Whether the whole-plan run can execute ``plan``'s axes: tp, pp (and vpp), dp and ZeRO; context and expert
    parallelism run per layer only (``tpsim validate --cp/--ep``), so plans with cp > 1 or ep > 1 are skipped."""
    return getattr(plan, "cp", 1) == 1 and getattr(plan, "ep", 1) == 1


def pick_plans(ranking: list[Any], k: int, contrast: int = CONTRAST,
               key: Any = None) -> list[Pick]:
    """The ``k`` best plans and ``contrast`` lower-ranked ones (evenly spread below them, the last included),
    among those the whole-plan run executes. ``key(plan)``: plans with equal keys run the same (they differ only
    in what validate does not run): only the first of each counts; a key of None marks a plan the runtime cannot
    run (:func:`runnable_key`), never picked, neither as a top plan nor for contrast."""
    if k <= 0:
        raise InputError(f"--validate-top={k} must be a positive integer")
    base = key or (lambda plan: plan)
    skip = object()

    def key(plan: Any) -> Any:
        if not runs_whole(plan):
            return skip
        value = base(plan)
        return skip if value is None else value
    seen: set = {skip}
    picks, last_top = [], -1
    for i, plan in enumerate(ranking):
        if len(picks) == k:
            break
        if key(plan) not in seen:
            seen.add(key(plan))
            picks.append(Pick(i + 1, plan, "top"))
            last_top = i
    rest = [i for i in range(last_top + 1, len(ranking)) if key(ranking[i]) not in seen]
    if rest and contrast:
        for j in np.linspace(0, len(rest) - 1, contrast + 1)[1:]:
            i = rest[int(round(j))]
            if key(ranking[i]) not in seen:
                seen.add(key(ranking[i]))
                picks.append(Pick(i + 1, ranking[i], "contrast"))
    return picks


def runnable_key(scaled: Any) -> Any:
    """``key`` for :func:`pick_plans` from ``scaled(plan) -> PlanCase``: the scaled case's name, or None where
    the case cannot be built, i.e. the runtime cannot run the plan (the one set of rules:
    :class:`PlanCase`'s own checks, e.g. torch's 1F1B needs micro-batches >= pp)."""
    def key(plan: Any) -> str | None:
        try:
            return scaled(plan).name
        except InputError:
            return None
    return key


def unrunnable(ranking: list[Any], picks: list[Pick], scaled: Any) -> dict[str, int]:
    """Why plans ranked above the last pick were skipped: {reason: count} (cp/ep, or the case's check)."""
    reasons: dict[str, int] = {}
    for plan in ranking[:max((pk.search_rank for pk in picks), default=0)]:
        if not runs_whole(plan):
            why = "cp > 1 or ep > 1 (tpsim validate --cp/--ep checks those axes per layer)"
        else:
            try:
                scaled(plan)
                continue
            except InputError as exc:
                why = str(exc)
        reasons[why] = reasons.get(why, 0) + 1
    return reasons


def plan_case(model: ModelSpec, plan: Any, layers_per_chunk: int, reps: int, warmup: int) -> PlanCase:
    """The scaled-down run of ``plan``: pp x vpp x layers_per_chunk layers, at most MAX_MICROBATCHES
    micro-batches (a multiple of pp), fp32, no recomputation."""
    m = plan.num_microbatches
    notes = []
    if m > MAX_MICROBATCHES:
        m = max(plan.pp, MAX_MICROBATCHES // plan.pp * plan.pp)
        notes.append(f"micro-batches {plan.num_microbatches}->{m}")
    if plan.recompute != "none":
        notes.append(f"recompute {plan.recompute} not run")
    if plan.dtype != "fp32":
        notes.append(f"{plan.dtype} run in fp32")
    if not plan.overlap:
        notes.append("no-overlap not run (DDP and FSDP2 overlap)")
    layers = plan.pp * plan.vpp * layers_per_chunk
    if layers != model.num_layers:
        notes.append(f"layers {model.num_layers}->{layers}")
    return PlanCase(model=with_overrides(model, layers=layers), tp=plan.tp, pp=plan.pp, vpp=plan.vpp, dp=plan.dp,
                    zero=plan.zero, sp=plan.sp, micro_batch=plan.micro_batch, microbatches=m, order=plan.order,
                    reps=reps, warmup=warmup, scaled="; ".join(notes))


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 2 values."""
    if len(a) < 2:
        return None
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if np.std(ra) == 0 or np.std(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        ranks[x == v] = ranks[x == v].mean()
    return ranks


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank correlation and the predicted best's measured step against the measured best's."""
    timed = [r for r in rows if r.get("measured_step_s") and r.get("predicted_step_s")]
    if not timed:
        return {"plans": 0, "spearman": None, "predicted_best": None, "measured_best": None, "best_gap_pct": None,
                "best_ok": None}
    pred = [r["predicted_step_s"] for r in timed]
    meas = [r["measured_step_s"] for r in timed]
    pb, mb = timed[int(np.argmin(pred))], timed[int(np.argmin(meas))]
    gap = 100.0 * (pb["measured_step_s"] - mb["measured_step_s"]) / mb["measured_step_s"]
    return {"plans": len(timed), "spearman": spearman(pred, meas), "predicted_best": pb["case"],
            "measured_best": mb["case"], "best_gap_pct": gap, "best_ok": gap <= 100 * BEST_WITHIN}


def rows_of(report: dict[str, Any], picks: list[Pick], cases: list[PlanCase]) -> list[dict[str, Any]]:
    """One row per picked plan: its search rank, the scaled case and predicted / measured step."""
    by_name = {s.get("requested_case", s["case"]): s for s in report["cases"]}  # the fit may rename a case
    rows = []
    for pick, case in zip(picks, cases):
        s = by_name.get(case.name, {})
        step = next((p for p in s.get("phases", []) if p["name"] == "step"), {})
        rows.append({"search_rank": pick.search_rank, "role": pick.role, "plan": pick.plan.short(),
                     "case": s.get("case", case.name), "scaled": s.get("scaled", case.scaled),
                     "predicted_step_s": step.get("predicted_s"), "measured_step_s": step.get("measured_s"),
                     "numerics_ok": s.get("numerics_ok"), "collectives_match": s.get("collectives_match")})
    return rows


def check_runnable(world: int, backend: str = "gloo") -> None:
    """The plans run on this machine's ranks; timing them needs a core per rank on CPU."""
    cores = os.cpu_count() or 1
    if backend == "gloo" and world > cores:
        raise InputError(f"--validate-top runs every plan on this machine: gpus={world} ranks on {cores} CPU cores "
                         "cannot be timed (plan for --cluster local-cpu --gpus 2, or fewer GPUs)")


def format_rows(rows: list[dict[str, Any]], agree: dict[str, Any]) -> str:
    lines = ["validate-top: scaled-down runs of the ranked plans (predicted vs measured step, this machine)"]
    for r in rows:
        p, m = r["predicted_step_s"], r["measured_step_s"]
        lines.append(f"  #{r['search_rank']:<4} {r['role']:<8} {r['plan']:<34} predicted "
                     f"{'-' if p is None else f'{p * 1e3:9.1f} ms'}  measured {'-' if m is None else f'{m * 1e3:9.1f} ms'}"
                     f"  {'ok' if r['numerics_ok'] and r['collectives_match'] else 'CHECK FAILED'}"
                     + (f"  ({r['scaled']})" if r["scaled"] else ""))
    if agree["plans"]:
        rho = "n/a" if agree["spearman"] is None else f"{agree['spearman']:.2f}"
        lines.append(f"  rank correlation (Spearman) over {agree['plans']} plans: {rho}; predicted best "
                     f"{agree['predicted_best']} measured {agree['best_gap_pct']:+.1f}% vs the measured best "
                     f"{agree['measured_best']} ({'within' if agree['best_ok'] else 'NOT within'} "
                     f"{100 * BEST_WITHIN:.0f}%)")
    return "\n".join(lines)


def validate_top(args: Any, result: Any, model: ModelSpec, cluster: Any) -> dict[str, Any]:
    """The ``--validate-top`` step of ``tpsim plan``: pick, run, compare, write ``<name>-ranking.json``; returns
    {"rows", "agreement", "skipped", "report", "ok"} (``error`` instead of rows when a rank failed). Prints
    nothing on stdout (``--json`` puts this object in its own)."""
    import json

    from .launch import LaunchConfig, RankFailure
    from .block.report import write_atomic
    from .run import REPORTS_DIR, Options, validate

    if len(result.parts) > 1:
        raise InputError("--validate-top needs one GPU count (not --objective cost)")
    ranking = [result.plan(int(i)) for i in result.ranking]
    if not ranking:
        raise InputError("--validate-top: no plan was ranked")
    world = int(cluster.num_gpus)
    check_runnable(world)

    def scaled(plan: Any) -> PlanCase:
        return plan_case(model, plan, args.validate_layers_per_chunk, reps=3, warmup=1)
    picks = pick_plans(ranking, args.validate_top, key=runnable_key(scaled))
    if not picks:
        raise InputError(f"--validate-top: none of the {len(ranking)} ranked plans can be run by the whole-plan "
                         "validation (cp/ep, or micro-batches < pp)")
    cases = [scaled(p.plan) for p in picks]
    name = args.validate_name or f"top-{model.name}-{cluster.name}-{world}"
    opts = Options(cluster=cluster.name if cluster.device.name.startswith("CPU") else "local-cpu",
                   out_dir=REPORTS_DIR if not args.validate_out_dir else __import__("pathlib").Path(args.validate_out_dir))
    cfg = LaunchConfig(nproc=world, timeout_s=120.0)
    skipped = unrunnable(ranking, picks, scaled)
    try:
        report = validate(cases, cfg, opts, name)
    except RankFailure as exc:
        return {"error": str(exc), "skipped": skipped, "ok": False}
    rows = rows_of(report, picks, cases)
    agree = agreement(rows)
    out = {"rows": rows, "agreement": agree, "skipped": skipped, "report": str(opts.out_dir / f"{name}.json"),
           "ok": all(r["numerics_ok"] and r["collectives_match"] for r in rows)}
    write_atomic(opts.out_dir / f"{name}-ranking.json",
                 json.dumps({k: out[k] for k in ("rows", "agreement", "skipped", "report")}, indent=1).encode())
    return out


def run_validate_top(args: Any, result: Any, model: ModelSpec, cluster: Any) -> int:
    """``--validate-top`` with text output: :func:`validate_top`, then its table."""
    out = validate_top(args, result, model, cluster)
    if "error" in out:
        print(f"tpsim plan: --validate-top: {out['error']}")
        return 1
    print(format_rows(out["rows"], out["agreement"]))
    for why, n in out["skipped"].items():
        print(f"validate-top: {n} plan(s) ranked among these were skipped: {why}")
    return 0 if out["ok"] else 1
