"""Link efficiency per fabric level fitted from runs (`calibrate --from-runs`, docs/RUNS.md), on the shipped runs.

    python benchmarks/link_levels.py [--family meg_h100] [--choices 6]

For a family of the development set that spans node counts (default: Megatron-Core H100 weak and strong scaling,
1.7B on 6 nodes to 462B on 768), fits the runs with and without the two link-level factors
(``intra_link_scale``: NVLink inside a node, ``inter_link_scale``: the IB network; tpsim.runfit.LINK_FACTORS)
and prints:

* the fit of every run of the family: each factor with its uncertainty, every run's leave-one-out error, the
  guard's choice (the link levels are kept only when they predict the left-out runs better);
* ``--choices``: fits on a seeded sample of k runs (k = 6, 8: at least ``runs_fit.link_min_runs``), the family's
  other runs predicted, median |error| uncalibrated -> without -> with the link levels;
* the synthetic check of tests/test_runfit.py: the same family's models on 1-16 nodes with exposed DP reductions,
  measured as tpsim with the IB efficiency at 0.8 of the collective model's: the recovered factor.

Every figure is computed here from the current estimator.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpsim.runfit import LINK_FACTORS, fit_runs, predict, runs_link_levels  # noqa: E402
from tpsim.runs import shipped_runs  # noqa: E402


def _show(fit) -> str:
    return ", ".join(f"{f.name} {f.value:.3f}+-{f.uncertainty:.3f}" for f in fit.factors)


def whole_family(fam) -> None:
    print(f"fabric levels the runs exercise: {runs_link_levels(fam)}")
    for links in (False, True):
        fit = fit_runs(fam, links=links)
        loo = np.array([r.loo_error for r in fit.runs])
        print(f"\n{'with' if links else 'without'} link levels: blend {fit.blend:g}, sigma {100 * fit.sigma:.1f}%; "
              + _show(fit))
        print(f"  leave-one-out median |error| {100 * np.median(np.abs(loo)):.1f}%, mean "
              f"{100 * np.mean(np.abs(loo)):.1f}%  (uncalibrated median "
              f"{100 * np.median([abs(r.uncalibrated_s / r.measured_s - 1) for r in fit.runs]):.1f}%)")
        for r in fit.runs:
            print(f"    {r.run_id:34s} uncal {100 * (r.uncalibrated_s / r.measured_s - 1):+6.1f}%  "
                  f"fit {100 * (r.calibrated_s / r.measured_s - 1):+6.1f}%  leave-one-out {100 * r.loo_error:+6.1f}%")
        for w in fit.warnings:
            if w.startswith("guard") or "link" in w:
                print(f"  warning: {w}")


def held_out(fam, choices: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    print(f"\nfit on k runs, predict the family's others ({choices} seeded choices per k)")
    for k in (6, 8):
        rows = []
        for _ in range(choices):
            pick = sorted(rng.choice(len(fam), size=k, replace=False))
            on = [fam[i] for i in pick]
            off = [r for i, r in enumerate(fam) if i not in pick]
            errs = []
            for links in (False, True):
                v = fit_runs(on, links=links).values
                errs.append(np.median([abs(predict(r, v).step_time_s / r.measured - 1) for r in off]))
            uncal = np.median([abs(predict(r).step_time_s / r.measured - 1) for r in off])
            rows.append((uncal, *errs))
        a = np.array(rows)
        print(f"  k={k}: median |error| of the others: uncalibrated {100 * np.median(a[:, 0]):.1f}% -> without "
              f"link levels {100 * np.median(a[:, 1]):.1f}% -> with {100 * np.median(a[:, 2]):.1f}%  "
              f"(with worse than without in {int((a[:, 2] > a[:, 1] + 1e-9).sum())} of {len(a)})")


def synthetic(fam) -> None:
    base = [r for r in fam if r.run_id.startswith("meg_h100_weak")][:4]
    runs = []
    for r in base:
        for dp in {1: (8, 32), 2: (4, 16), 4: (2, 8, 32), 8: (2, 4, 16)}.get(r.plan.tp, ()):
            plan = dataclasses.replace(r.plan, dp=dp, global_batch=dp, overlap=False)
            runs.append(dataclasses.replace(r, run_id=f"{r.run_id}_dp{dp}", gpus=r.plan.tp * dp, plan=plan))
    if len(runs) < 6:
        return
    truth = {"inter_link_scale": 0.8}
    runs = [dataclasses.replace(r, measured=predict(r, truth).step_time_s) for r in runs]
    fit = fit_runs(runs)
    got = {f.name: f for f in fit.factors}
    ib = got.get(LINK_FACTORS["inter"])
    print(f"\nsynthetic: {len(runs)} runs on {sorted({-(-r.gpus // 8) for r in runs})} nodes, IB efficiency x0.8: "
          + (f"inter_link_scale {ib.value:.3f} +- {ib.uncertainty:.3f} (prior sd {ib.prior_sigma:g})" if ib else
             "inter_link_scale not kept") + f"; {_show(fit)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="meg_h100", help="run_id prefix of the family (one device and stack)")
    ap.add_argument("--choices", type=int, default=6, help="seeded choices of k runs (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.perf_counter()
    fam = [r for r in shipped_runs() if r.run_id.startswith(args.family)]
    print(f"{args.family}: {len(fam)} runs, {sorted({r.gpus for r in fam})} GPUs")
    whole_family(fam)
    if args.choices:
        held_out(fam, args.choices, args.seed)
    synthetic(fam)
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
