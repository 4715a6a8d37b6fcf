"""Megatron-Core H100 rows (development set): where the data-parallel and pipeline time goes (issue 19).

    python benchmarks/megatron_dp_terms.py

Prints, from tpsim's own terms (nothing here is fitted and nothing is changed):

1. The bus bandwidth a DP ring gets on dgx-h100 when each DP group has one GPU per node (tp 8) or two (tp 4):
   the collective model's reduce-scatter / all-gather over every concurrent DP group of the plan, for one
   Megatron-Core bucket (``comm.dp_bucket_elements`` = max(4e7, 1e6 x dp) parameters, fp32 gradients, bf16
   parameters) and for the whole buffer. The estimator times the whole buffer as one collective
   (tpsim/estimator/comm.py ``_reductions``); Megatron-Core issues one collective per bucket
   (megatron/core/distributed/param_and_grad_buffer.py ``_ParamAndGradBucketGroup.start_grad_sync`` /
   ``start_param_sync``), so the bucketed column is what the buckets would cost one after another.
2. Per row: micro-batches, parameters per rank (the largest rank), the gradient reduce-scatter and parameter
   all-gather, tpsim's DP total and exposed seconds, the error as shipped and the error if no DP second were
   exposed at all (a bound: what the DP model can explain of the row's error).
3. The strong-scaling end points against the weak 177B row: under the assumed plan (tp 8, pp 6, mb 1, no
   interleaving) all three rows run the same per-micro-batch work, so the measured step divided by the
   1F1B slots (m + pp - 1) must be the same or grow with the exposed DP time (larger dp, fewer micro-batches).
4. Sensitivity to plan fields the README leaves open (NOT adopted: the development set's plan is not re-chosen
   here): micro-batch size of the pp 1 rows, interleaving of the pp > 1 rows; and the gradient reduce dtype
   (Megatron-LM r0.8 validate_args forces fp32 for bf16 runs: a what-if only).
5. With ``--refit V``: the Hopper in-situ GEMM fraction refitted (benchmarks/accuracy_runs.py fit_architecture,
   its 32 rows) with the Megatron pp > 1 rows interleaved at vpp V where V divides their layers per stage, and
   every family's mean |error| under it (a what-if for the conversion's open "no interleaving" choice: the
   README's "pipeline-parallel communication (enabled by default)" is Megatron-LM's overlap_p2p_comm, which
   r0.8's validate_args turns off for the non-interleaved schedule).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_runs import development_rows, error_pct  # noqa: E402

GIB = float(1 << 30)


def ring_table() -> None:
    from tpsim.collectives.model import get_collective_model
    from tpsim.topology import load_cluster
    from tpsim.topology.placement import RankLayout

    print("1. DP ring on dgx-h100, 384 GPUs, every DP group at once (collective model)")
    print(f"   {'plan':10s} {'op':15s} {'bytes':>10s} {'time ms':>9s} {'busbw GB/s':>11s}")
    cluster = load_cluster("dgx-h100", gpus=384)
    model = get_collective_model(cluster)
    for tp in (4, 8):
        dp = 384 // tp
        layout = RankLayout.from_order("tp-dp-pp", tp=tp, dp=dp, pp=1)
        bucket = max(4e7, 1e6 * dp)
        for op, nbytes in (("reduce_scatter", bucket * 4), ("all_gather", bucket * 2),
                           ("reduce_scatter", 4e9 * 4), ("all_gather", 4e9 * 2)):
            curve = model.axis_curve(op, layout, "dp")
            t = float(curve.time([nbytes])[0])
            bus = nbytes / t * (dp - 1) / dp / 1e9
            label = "bucket" if nbytes < 1e9 else "4e9 params"
            print(f"   tp{tp} dp{dp:<4d} {op:15s} {nbytes / 1e6:8.0f}MB {1e3 * t:9.2f} {bus:11.1f}   ({label})")
    print()


def row_table(rows) -> None:
    from tpsim.collectives.model import get_collective_model
    from tpsim.estimator import estimate
    from tpsim.topology.placement import RankLayout

    print("2. Megatron rows: DP terms (s). RS = fp32 gradient reduce-scatter, AG = bf16 parameter all-gather,")
    print("   whole buffer / one collective per bucket; dp total and exposed as the estimator has them")
    print(f"   {'row':26s} {'m':>4s} {'params/rank':>11s} {'RS':>6s} {'RS bkt':>6s} {'AG':>6s} {'AG bkt':>6s} "
          f"{'dp tot':>6s} {'dp exp':>6s} {'comp/mb':>7s} {'error':>7s} {'no dp':>7s}")
    for r in rows:
        e = estimate(r.model, r.cluster, r.plan, stack=r.stack)
        p = e.plan
        params = e.memory_gib["weights"] * GIB / 2.0  # bf16 weights of the largest rank
        layout = RankLayout.from_order("tp-dp-pp", tp=r.plan.tp, dp=r.plan.dp, pp=r.plan.pp)
        model = get_collective_model(r.cluster)
        bucket = max(4e7, 1e6 * r.plan.dp)
        n_buckets = max(1.0, params / bucket)
        rs_curve, ag_curve = model.axis_curve("reduce_scatter", layout, "dp"), model.axis_curve("all_gather", layout,
                                                                                                  "dp")
        rs = float(rs_curve.time([params * 4])[0])
        ag = float(ag_curve.time([params * 2])[0])
        rs_b = n_buckets * float(rs_curve.time([params * 4 / n_buckets])[0])
        ag_b = n_buckets * float(ag_curve.time([params * 2 / n_buckets])[0])
        m = p.num_microbatches
        dp_exp = float(e.terms["dp_comm"])
        comp_mb = (float(e.terms["compute"]) + float(e.terms["recompute"])) / m
        err = error_pct(r.measured_s, e.step_time_s)
        no_dp = error_pct(r.measured_s, e.step_time_s - dp_exp)
        print(f"   {r.run_id[9:]:26s} {m:4d} {params / 1e9:10.2f}B {rs:6.3f} {rs_b:6.3f} {ag:6.3f} {ag_b:6.3f} "
              f"{e.breakdown['dp_comm']:6.3f} {dp_exp:6.3f} {comp_mb:7.3f} {err:+6.1f}% {no_dp:+6.1f}%")
    print()


def strong_table(rows) -> None:
    print("3. 177B under the assumed plan (tp8 pp6 mb1, 1F1B without interleaving): measured step / (m + pp - 1)")
    for r in rows:
        if "177B" not in r.run_id:
            continue
        m = r.plan.global_batch // (r.plan.micro_batch * r.plan.dp)
        slots = m + r.plan.pp - 1
        print(f"   {r.run_id[9:]:26s} dp{r.plan.dp:<3d} m {m:4d}  measured {r.measured_s:8.3f} s  "
              f"per slot {r.measured_s / slots:.4f} s")
    print("   (same per-slot work in all three; exposed DP can only lengthen the larger-dp rows' slots)")
    # step = (m + (pp - 1) / v) t: per-micro-batch time t and bubble chunks v that fit the three rows best
    import numpy as np

    pts = [(r.plan.global_batch // (r.plan.micro_batch * r.plan.dp), r.plan.pp, r.measured_s) for r in rows
           if "177B" in r.run_id]
    def fit(v):
        a = np.array([m + (pp - 1) / v for m, pp, _ in pts])
        y = np.array([s for _, _, s in pts])
        t = float((a / y).sum() / ((a / y) @ (a / y)))  # least squares on the relative error
        return v, t, float(np.sqrt(np.mean((a * t / y - 1.0) ** 2)))

    v, t, rel = min((fit(v) for v in np.arange(1.0, 8.01, 0.25)), key=lambda f: f[2])
    _, t1, rel1 = fit(1.0)
    print(f"   best fit of step = (m + (pp - 1) / v) t over the three: v = {v:.2f}, t = {t:.4f} s per micro-batch "
          f"(rms {100 * rel:.1f}%); v = 1 (no interleaving, as the rows assume): t = {t1:.4f} s, rms "
          f"{100 * rel1:.1f}%")
    from tpsim.estimator import estimate

    r96 = next(r for r in rows if r.run_id.endswith("177B_96gpu"))
    e = estimate(r96.model, r96.cluster, r96.plan, stack=r96.stack)
    rest = sum(float(e.terms[k]) for k in ("bubble", "dp_comm", "optimizer"))
    per_mb = (e.step_time_s - rest) / e.plan.num_microbatches
    print(f"   tpsim's per-micro-batch time of that plan (96-GPU row: step less bubble, DP and optimizer, / m): "
          f"{per_mb:.4f} s")
    print()


def sensitivity(rows) -> None:
    from tpsim.estimator import estimate

    print("4. Sensitivity to fields the README leaves open (not adopted), error per row")
    def change(p, r, mode):
        per_stage = r.model.num_layers // p.pp
        if mode in ("mb 2", "mb 4") and p.pp == 1:
            return dataclasses.replace(p, micro_batch=int(mode[-1]))
        if mode in ("vpp 2", "vpp 4") and p.pp > 1 and per_stage % int(mode[-1]) == 0:
            return dataclasses.replace(p, vpp=int(mode[-1]))
        return p

    for mode, label in (("shipped", "as shipped"), ("mb 2", "mb 2 (pp 1 rows)"), ("mb 4", "mb 4 (pp 1 rows)"),
                        ("vpp 2", "vpp 2 (pp > 1, layers/pp even)"),
                        ("vpp 4", "vpp 4 (pp > 1, layers/pp % 4 = 0)"),
                        ("bf16", "grad reduce bf16 (r0.8 forces fp32)")):
        parts = []
        stack = None
        if mode == "bf16":
            from accuracy_runs import _stack_with
            stack = _stack_with("megatron", "grad_reduce_dtype", "bf16")
        for r in rows:
            e = estimate(r.model, r.cluster, change(r.plan, r, mode), stack=stack or r.stack)
            parts.append(f"{r.run_id[9:].replace('weak_', '').replace('strong_177B_', 's')} "
                         f"{error_pct(r.measured_s, e.step_time_s):+.1f}")
        print(f"   {label:36s} " + "  ".join(parts))


def refit(v: int) -> None:
    from accuracy_runs import _with_arch, family_table, fit_architecture, fitted_rows, predict
    from tpsim.compute.training import default_in_situ

    def interleaved(r):
        p = r.plan
        if r.run_id.startswith("meg_h100") and p.pp > 1 and (r.model.num_layers // p.pp) % v == 0:
            return dataclasses.replace(r, plan=dataclasses.replace(p, vpp=v))
        return r

    rows = [interleaved(r) for r in development_rows()]
    value = fit_architecture(fitted_rows(rows, "hopper"), "hopper")
    alt = _with_arch(default_in_situ(), "hopper", value)
    errors = {r.run_id: error_pct(r.measured_s, predict(r, alt)[0]) for r in rows}
    print(f"\n5. Megatron pp > 1 rows at vpp {v} (where it divides the layers per stage): Hopper in-situ GEMM "
          f"refit {value:.3f} (shipped {default_in_situ().gemm_for('hopper'):.3f})")
    print("   " + "  ".join(f"{r.run_id[9:]} v{r.plan.vpp} {errors[r.run_id]:+.1f}" for r in rows
                          if r.run_id.startswith("meg_h100")))
    for name, n, mean, worst, signed in family_table(rows, errors):
        print(f"   {name:34s} n {n:2d}  mean {mean:4.1f}%  worst {worst:+5.1f}%  signed {signed:+5.1f}%")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", type=int, metavar="V", help="section 5 at vpp V (takes ~10 s)")
    args = parser.parse_args(argv)
    rows = [r for r in development_rows() if r.run_id.startswith("meg_h100_")]
    ring_table()
    row_table(rows)
    strong_table(rows)
    sensitivity(rows)
    if args.refit:
        refit(args.refit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
