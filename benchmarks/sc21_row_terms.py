"""Term-by-term read-out of the SC21 Table 1 rows (diagnosis of the 39.1B row, issue 19 / task w13-sc21).

    python benchmarks/sc21_row_terms.py

Per row, the step-time terms of the shipped estimate (seconds; ``Estimate.terms``), the step time implied by the
published TFLOP/s (paper FLOPs / (GPUs x TFLOP/s)) and the difference. Then the per-micro-batch stage work the
published figure implies once the terms that are not stage work (bubble factor, DP reduction, optimizer,
pipeline sends, host overhead) are taken as predicted: ``implied = (measured - dp - optimizer - pp - overhead)
/ (1 + (pp - 1) / (vpp m))`` against tpsim's ``compute + recompute + tp_comm``. A ratio away from 1 on one row
only, with the other terms small, says the gap is in the stage work (GEMM rate / TP all-reduce at that row's
shapes), not in the pipeline, DP or embedding terms. Nothing is fitted here.

Finding (w13-sc21, shipped constants 0.970 / 0.626): the 39.1B row is 0.79 s too slow (15.24 vs 14.45 s).
Its non-stage terms are as the 2021 code does them and too small to hold the gap: the 1F1B bubble is
(p - 1) / m = 1/12 of the stage work (1.13 s; Megatron's non-interleaved schedule, warm-up p - rank - 1),
the scatter/gather p2p sends 0.02 s, the LocalDDP fp16 all-reduce after the backward 0.41 s (about 4.9 GB
over 32 ranks at about 25 GB/s per GPU; 76.1B, which is 3.4% too fast, has the same 0.40 s), the tied
word-embedding all-reduce (51200 x 8192 / tp 8 fp16 = 105 MB over 2 ranks) a few ms, the optimizer 0.07 s.
The implied stage work is 5.7% below tpsim's compute + recompute + TP all-reduce, against -3.4% to +2.0%
on the other pipelined rows: the gap sits in the per-micro-batch GEMM / TP all-reduce cost at this row's
shapes (micro-batch 4 x 2048 tokens, h 8192), which no sourced pipeline, DP or embedding rule moves.
"""

from __future__ import annotations

import sys


def main() -> int:
    from tpsim.estimator.reference import sc21_cases, sc21_estimate

    keys = ("compute", "recompute", "tp_comm", "bubble", "pp_comm", "dp_comm", "optimizer", "overhead")
    print(f"{'row':16s} {'m':>4s} {'vpp':>3s} " + " ".join(f"{k:>9s}" for k in keys)
          + f" {'step':>7s} {'meas.':>7s} {'diff':>6s} {'stage':>7s} {'implied':>7s} {'ratio':>6s}")
    for case in sc21_cases():
        e = sc21_estimate(case)
        t = e.terms
        p = case.plan
        m = p.global_batch // (p.micro_batch * p.dp)
        measured = case.paper_flops() / (case.gpus * case.measured_tflops * 1e12)
        stage = t["compute"] + t["recompute"] + t["tp_comm"]
        implied = ((measured - t["dp_comm"] - t["optimizer"] - t["pp_comm"] - t["overhead"])
                   / (1.0 + (p.pp - 1) / (p.vpp * m)))
        print(f"{case.case_id:16s} {m:4d} {p.vpp:3d} " + " ".join(f"{t[k]:9.3f}" for k in keys)
              + f" {e.step_time_s:7.2f} {measured:7.2f} {e.step_time_s - measured:+6.2f} {stage:7.2f}"
              f" {implied:7.2f} {stage / implied:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
