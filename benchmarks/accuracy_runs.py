"""Accuracy on the development set of published training runs (issue 19), per family (device x stack).

    python benchmarks/accuracy_runs.py            # per row and per family, shipped constants
    python benchmarks/accuracy_runs.py --loo      # also each fitted constant refitted without each of its rows

Rows: ``tpsim/data/runs/development.csv`` through ``tpsim.runs.load_runs`` (docs/SCHEMAS.md T4; each row's plan
and the conversion of its published figure in its ``notes``). The measurement compared is the step time
(``Run.measured``: tokens/s, or TFLOP/s under the source's FLOP convention, converted to seconds per step).
A family is device x stack.

For each row: published and predicted step time, error (positive: tpsim predicts more throughput than
measured), whether the plan fits in memory. Per family: mean |error|, worst, signed mean, with the shipped
constants and with each fitted constant left out (its device class falling back to the SC21 value). With
``--loo``: each fitted constant refitted on its rows minus one, and that row predicted (leave-one-out).

The fitted constants (tpsim/data/efficiency.yaml, each with its rows): ``gemm_in_situ_fraction`` per device
architecture (``by_architecture``). Nothing else here is fitted.

The torchtitan H100 rows (``tt_*``) ran on Meta's lower-TDP (500 W) H100 SXM boards with 96 GB HBM2e (torchtitan
paper: "non-standard ... peak TFLOPs between SXM and NVL"); they run on the device ``H100-SXM-96GB``
(tpsim/data/devices.yaml: H100 peaks and kernel data, 2.4 TB/s, its clock interpolated in power between the
H100 NVL and SXM datasheet points, its fp8 GEMM anchor torchao's figure for that board in kernels/gemm.yaml, no
fitted figure) and stay out of the Hopper fit (its constant describes the
700 W part).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Row:
    run_id: str
    family: str
    model: object
    cluster: object
    plan: object
    stack: object
    measured_s: float


# ---- rows ---------------------------------------------------------------------------------------------------
def development_rows() -> list[Row]:
    """The development set (tpsim/data/runs/development.csv, docs/RUNS.md), read with the stack check off so a
    plan its stack refuses is reported as refused instead of stopping the table."""
    from tpsim.runs import DEVELOPMENT_CSV, load_runs
    from tpsim.stacks import load_stack

    rows = []
    for run in load_runs(DEVELOPMENT_CSV, check_stack=False):
        cluster = run.load_cluster()
        stack = load_stack(run.stack)
        rows.append(Row(run.run_id, f"{cluster.device.name} {stack.name}", run.model, cluster, run.plan, stack,
                        float(run.measured)))
    return rows


# ---- prediction and fitting ---------------------------------------------------------------------------------
def predict(row: Row, in_situ=None) -> tuple[float, bool]:
    """(step time, fits) of a row under the shipped constants or ``in_situ`` (a :class:`InSitu`)."""
    from tpsim.estimator import estimate
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.compute.training import training_compute
    from tpsim.estimator.context import resolve_stack

    compute = None
    if in_situ is not None:
        stack = resolve_stack(row.stack)
        impl = stack_terms(stack).attention_kernel(row.cluster.device.architecture)
        eager = stack_terms(stack).kernel_flavor == "eager"
        key = (row.cluster.device.name, impl, in_situ, eager)
        if key not in _COMPUTE:  # as the estimator builds its default compute (context.EstimationContext.build)
            from tpsim.compute.eager import EagerKernels
            base = training_compute(row.cluster.device, impl, in_situ=in_situ)[0]
            _COMPUTE[key] = EagerKernels(base) if eager else base
        compute = _COMPUTE[key]
    e = estimate(row.model, row.cluster, row.plan, compute=compute, stack=row.stack)
    return e.step_time_s, e.fits


_COMPUTE: dict = {}


def error_pct(measured_s: float, predicted_s: float) -> float:
    """Throughput error, percent: positive when tpsim predicts more throughput (a shorter step) than measured."""
    return 100.0 * (measured_s / predicted_s - 1.0)


def _with_arch(in_situ, arch: str, value: float | None):
    pairs = dict(in_situ.gemm_by_architecture)
    if value is None:
        pairs.pop(arch, None)
    else:
        pairs[arch] = value
    return in_situ.replace(gemm_by_architecture=tuple(sorted(pairs.items())))


def fit_architecture(rows: list[Row], arch: str, probes=(0.70, 0.95)) -> float:
    """Least-squares in-situ GEMM fraction of ``arch`` on ``rows`` (relative step-time error). Each row's step
    time is t(f) = a + b / f in the fraction f (GEMM time divided by f); two probes give a and b, the optimum
    is a 1-D bounded minimisation of the summed squared relative errors, refined by one re-evaluation."""
    from tpsim.compute.training import default_in_situ

    base = default_in_situ()
    t = np.array([[predict(r, _with_arch(base, arch, f))[0] for f in probes] for r in rows])
    inv = 1.0 / np.array(probes)
    b = (t[:, 0] - t[:, 1]) / (inv[0] - inv[1])
    a = t[:, 0] - b * inv[0]
    meas = np.array([r.measured_s for r in rows])
    grid = np.linspace(0.40, 1.10, 1401)
    cost = (((a[:, None] + b[:, None] / grid[None, :]) / meas[:, None] - 1.0) ** 2).sum(axis=0)
    return float(grid[int(np.argmin(cost))])


def fitted_rows(rows: list[Row], arch: str) -> list[Row]:
    """The rows a device class's in-situ GEMM fraction is fitted on: its devices' rows except the torchtitan
    papers' (``tt_*``: lower-TDP H100 SXM parts with HBM2e, another device than the 700 W DGX part)."""
    return [r for r in rows if r.cluster.device.architecture == arch and not r.run_id.startswith("tt_")]


def _stack_with(name: str, key: str, value: float):
    """The shipped stack profile ``name`` with ``comm.<key>`` (a figure of the file) set to ``value``: a copy of
    the YAML in a temporary folder, loaded as any profile path."""
    import re
    import tempfile

    from tpsim.stacks import load_stack

    text = (ROOT / "tpsim" / "data" / "stacks" / f"{name}.yaml").read_text(encoding="utf-8")
    text, n = re.subn(rf"(\n  {key}:\n    value: )[^\n]*(\n    range: [^\n]*)?", rf"\g<1>{value!r}", text)
    assert n == 1, key  # (the prior range is dropped: the probed value may lie outside it)
    folder = Path(tempfile.mkdtemp(prefix="tpsim-fit-"))
    path = folder / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_stack(path)


def fit_stack_figure(rows: list[Row], name: str, key: str, probes=(8000.0, 24000.0)) -> float:
    """Least-squares value of a stack figure the step time is linear in (a serialized per-fetch time): two
    probes give each row's t = a + b x, the optimum of the summed squared relative errors is closed-form."""
    t = np.array([[predict(dataclasses.replace(r, stack=_stack_with(name, key, x)))[0] for x in probes]
                  for r in rows])
    b = (t[:, 1] - t[:, 0]) / (probes[1] - probes[0])
    a = t[:, 0] - b * probes[0]
    meas = np.array([r.measured_s for r in rows])
    # minimise sum((a + b x) / m - 1)^2
    u, v = a / meas - 1.0, b / meas
    return float(-(u * v).sum() / (v * v).sum())


STACK_FITS = {("deepspeed-2021", "host_us_per_collective"): ("A100-SXM4-80GB deepspeed-2021",)}
"""stack figures fitted on development-set families (their YAML says so)."""

FITS = ("hopper",)
"""architectures with their own fitted in-situ GEMM fraction (efficiency.yaml ``by_architecture``)."""


def family_table(rows: list[Row], errors: dict[str, float]) -> list[tuple]:
    fam = defaultdict(list)
    for r in rows:
        fam[r.family].append(errors[r.run_id])
    out = []
    for name in sorted(fam):
        v = np.array(fam[name])
        out.append((name, len(v), float(np.abs(v).mean()), float(v[np.argmax(np.abs(v))]), float(v.mean())))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loo", action="store_true", help="leave-one-out refits of each fitted constant")
    parser.add_argument("--fit", action="store_true", help="print each fitted constant refitted on all its rows")
    args = parser.parse_args(argv)
    from tpsim.compute.training import default_in_situ

    rows = development_rows()
    shipped = {}
    print(f"{'run':44s} {'family':26s} {'published s':>11s} {'tpsim s':>9s} {'error':>7s}  fits")
    refused = 0
    for r in rows:
        t, fits = predict(r)
        shipped[r.run_id] = error_pct(r.measured_s, t)
        refused += not fits
        print(f"{r.run_id:44s} {r.family:26s} {r.measured_s:11.3f} {t:9.3f} {shipped[r.run_id]:+6.1f}%  "
              f"{'yes' if fits else 'NO'}")
    print(f"\nplans judged not to fit: {refused} of {len(rows)}")
    base = default_in_situ()
    without = {}
    for arch in FITS:  # the fitted ones (blackwell's value is transferred, not fitted: no rows)
        alt = _with_arch(base, arch, None)
        without[f"{arch} in-situ"] = {r.run_id: error_pct(r.measured_s, predict(r, alt)[0]) if r.cluster.device.architecture == arch
                         else shipped[r.run_id] for r in rows}
    for (name, key), families in STACK_FITS.items():
        alt = _stack_with(name, key, 0.0)
        without[f"{name} {key}"] = {r.run_id: error_pct(r.measured_s, predict(dataclasses.replace(r, stack=alt))[0])
                                    if r.family in families else shipped[r.run_id] for r in rows}
    print(f"\n{'family':26s} {'n':>3s} {'mean |e|':>9s} {'worst':>7s} {'signed':>7s}   "
          + "   ".join(f"without {a}: mean/signed" for a in without))
    tables = {a: {f[0]: f for f in family_table(rows, e)} for a, e in without.items()}
    for name, n, mean, worst, signed in family_table(rows, shipped):
        extra = "   ".join(f"{tables[a][name][2]:6.1f}% {tables[a][name][4]:+6.1f}%" for a in without)
        print(f"{name:26s} {n:3d} {mean:8.1f}% {worst:+6.1f}% {signed:+6.1f}%   {extra}")
    fam_means = [f[2] for f in family_table(rows, shipped)]
    print(f"median of family means {np.median(fam_means):.1f}%, worst family {max(fam_means):.1f}%")
    if args.fit or args.loo:
        for arch in FITS:
            sub = fitted_rows(rows, arch)
            value = fit_architecture(sub, arch)
            print(f"\ngemm_in_situ_fraction[{arch}] fitted on {len(sub)} rows (its devices' rows but tt_*): {value:.3f} "
                  f"(shipped {base.gemm_for(arch):.3f})")
            if args.loo:
                errs = []
                for i, r in enumerate(sub):
                    v = fit_architecture(sub[:i] + sub[i + 1:], arch)
                    e = error_pct(r.measured_s, predict(r, _with_arch(base, arch, v))[0])
                    errs.append(e)
                    print(f"  {r.run_id:44s} refit {v:.3f}  error {e:+6.1f}%")
                errs = np.array(errs)
                print(f"  leave-one-out mean |error| {np.abs(errs).mean():.2f}%, worst {np.abs(errs).max():.2f}%, "
                      f"rms {np.sqrt((errs ** 2).mean()):.2f}%")
        for (name, key), families in STACK_FITS.items():
            sub = [r for r in rows if r.family in families]
            value = fit_stack_figure(sub, name, key)
            from tpsim.stacks import load_stack
            shipped_value = load_stack(name).figure("comm", key).value
            print(f"\n{name} comm.{key} fitted on {len(sub)} rows ({', '.join(families)}): {value:.0f} "
                  f"(shipped {shipped_value})")
            if args.loo:
                errs = []
                for i, r in enumerate(sub):
                    v = fit_stack_figure(sub[:i] + sub[i + 1:], name, key)
                    e = error_pct(r.measured_s, predict(dataclasses.replace(r, stack=_stack_with(name, key, v)))[0])
                    errs.append(e)
                    print(f"  {r.run_id:44s} refit {v:.0f}  error {e:+6.1f}%")
                errs = np.array(errs)
                print(f"  leave-one-out mean |error| {np.abs(errs).mean():.2f}%, worst {np.abs(errs).max():.2f}%, "
                      f"rms {np.sqrt((errs ** 2).mean()):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
