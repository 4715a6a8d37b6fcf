"""Accuracy read-out on the SC21 Megatron runs (Narayanan et al. 2021, Table 1; issue 10).

    python benchmarks/accuracy_sc21.py          # shipped constants, per row, with the 90% band (seconds)
    python benchmarks/accuracy_sc21.py --loo    # also the leave-one-row-out refits (about half a minute)

For each of the ten rows: the published per-GPU TFLOP/s, tpsim's prediction with the shipped constants (the
default compute model: the kernel model at training conditions, the megatron-sc21 stack; counted as the paper
counts, F / (step time x GPUs)), its error, and the prediction's 90% band (from ``step_time_s_low/high``);
whether the published figure lies inside the band. Then the mean / worst |error|, the constants the fit gives
now (they must equal the shipped ones: tests/test_sc21_golden.py) and, with ``--loo``, each row predicted by the
constants fitted on the other nine. Nothing here is fitted on anything but these ten rows.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def per_row() -> list[dict]:
    from tpsim.estimator.reference import sc21_cases, sc21_estimate

    rows = []
    for case in sc21_cases():
        e = sc21_estimate(case)
        scale = case.paper_flops() / (case.gpus * 1e12)  # TFLOP/s per GPU = scale / step time
        pred, low, high = scale / e.step_time_s, scale / e.step_time_s_high, scale / e.step_time_s_low
        rows.append(dict(case=case.case_id, gpus=case.gpus, tp=case.plan.tp, pp=case.plan.pp, dp=case.plan.dp,
                         measured=case.measured_tflops, predicted=pred, low=low, high=high,
                         error_pct=100.0 * (pred - case.measured_tflops) / case.measured_tflops,
                         inside=low <= case.measured_tflops <= high))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loo", action="store_true", help="also the leave-one-row-out refits")
    args = parser.parse_args(argv)

    from tpsim.compute.training import FITTED, default_in_situ
    from tpsim.estimator.reference import fit_constants, leave_one_out, sc21_cases

    rows = per_row()
    print("SC21 Table 1, per-GPU TFLOP/s (shipped constants, megatron-sc21 stack, selene)")
    print(f"{'row':16s} {'GPUs':>5s} {'tp':>3s} {'pp':>3s} {'dp':>4s} {'published':>9s} {'tpsim':>7s} "
          f"{'error':>7s}  {'90% band':>15s}  in band")
    for r in rows:
        print(f"{r['case']:16s} {r['gpus']:5d} {r['tp']:3d} {r['pp']:3d} {r['dp']:4d} {r['measured']:9.1f} "
              f"{r['predicted']:7.1f} {r['error_pct']:+6.1f}%  {r['low']:6.1f} - {r['high']:6.1f}  "
              f"{'yes' if r['inside'] else 'no'}")
    err = np.array([r["error_pct"] for r in rows])
    width = np.array([100.0 * (r["high"] - r["low"]) / 2 / r["predicted"] for r in rows])
    print(f"mean |error| {np.abs(err).mean():.2f}%, worst {np.abs(err).max():.2f}%, mean signed {err.mean():+.2f}%; "
          f"published inside the band {sum(r['inside'] for r in rows)}/{len(rows)}; "
          f"band half-width {width.min():.1f}-{width.max():.1f}%")

    shipped = default_in_situ()
    fitted = fit_constants(sc21_cases())
    print("fit on the ten rows now: " + ", ".join(f"{k} {fitted[k]:.3f} (shipped {getattr(shipped, k):.3f})"
                                                   for k in FITTED))
    if args.loo:
        print("leave-one-row-out (fit on nine, predict the tenth):")
        loo = leave_one_out(sc21_cases())
        for case_id, constants, e in loo:
            print(f"  {case_id:16s} " + ", ".join(f"{k} {v:.3f}" for k, v in constants.items())
                  + f"  error {e:+6.1f}%")
        le = np.array([e for _, _, e in loo])
        print(f"  mean |error| {np.abs(le).mean():.2f}%, worst {np.abs(le).max():.2f}%, "
              f"rms {np.sqrt((le ** 2).mean()):.2f}% (shipped band figure {shipped.loo_rms_pct:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
