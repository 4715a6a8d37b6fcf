"""Accuracy on the development set of published training runs (issue 19), per family (device x stack).

    python benchmarks/accuracy_runs.py            # per row and per family, shipped constants
    python benchmarks/accuracy_runs.py --loo      # also each fitted constant refitted without each of its rows

Rows: ``tpsim/data/runs/development.csv`` through ``tpsim.runs.load_runs`` (docs/SCHEMAS.md T4) when it is in
the tree; until then this script's own reading of ``../shared/data/runs/*.csv`` (:func:`provisional_rows`: each
CSV row turned into the ``tpsim estimate`` flags of its published plan, the conversion stated per file). The
measurement compared is the step time (published tokens/s, or TFLOP/s with the source's own FLOP formula,
converted to seconds per step).

For each row: published and predicted step time, error (positive: tpsim predicts more throughput than
measured), whether the plan fits in memory. Per family: mean |error|, worst, signed mean, with the shipped
constants and with each fitted constant left out (its device class falling back to the SC21 value). With
``--loo``: each fitted constant refitted on its rows minus one, and that row predicted (leave-one-out).

The fitted constants (tpsim/data/efficiency.yaml, each with its rows): ``gemm_in_situ_fraction`` per device
architecture (``by_architecture``). Nothing else here is fitted.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED_RUNS = ROOT.parent.parent / "shared" / "data" / "runs"


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
def _cli_row(run_id: str, family: str, flags: list[str], measured_s: float) -> Row:
    """A row from ``tpsim estimate`` flags (the CLI's own model, cluster, plan and stack builders)."""
    from tpsim.cli import estimate as est
    from tpsim.cli.common import build_cluster, build_model, build_plan, build_stack

    parser = argparse.ArgumentParser()
    est.register(parser.add_subparsers())
    args = parser.parse_args(["estimate"] + flags)
    model = build_model(args)
    cluster = build_cluster(args, model)
    return Row(run_id, family, model, cluster, build_plan(args, model, cluster), build_stack(args, model), measured_s)


_NEMO = {
    "GPT3-5B": ["--model", "gpt3-175b", "--layers", "24", "--hidden", "4096", "--heads", "32"],
    "GPT3-20B": ["--model", "gpt3-175b", "--layers", "44", "--hidden", "6144", "--heads", "48"],
    "GPT3-175B": ["--model", "gpt3-175b"],
    "LLAMA2-7B": ["--model", "llama3-8b", "--kv-heads", "32", "--ffn", "11008", "--vocab", "32000"],
    "LLAMA2-13B": ["--model", "llama3-8b", "--layers", "40", "--hidden", "5120", "--heads", "40", "--kv-heads", "40",
                   "--ffn", "13824", "--vocab", "32000"],
    "LLAMA2-70B": ["--model", "llama3-70b", "--vocab", "32000"],
    "LLAMA3-8B": ["--model", "llama3-8b"],
    "LLAMA3-70B": ["--model", "llama3-70b"],
    "Nemotron-8B": ["--model", "gpt3-175b", "--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn", "16384",
                    "--vocab", "256000"],
    "Nemotron-22B": ["--model", "gpt3-175b", "--layers", "40", "--hidden", "6144", "--heads", "48", "--ffn", "24576",
                     "--vocab", "256000"],
    "Nemotron-340B": ["--model", "llama3-70b", "--layers", "96", "--hidden", "18432", "--heads", "96", "--kv-heads", "8",
                      "--ffn", "73728", "--vocab", "256000"],
}
"""NeMo 24.07 models as preset overrides (shapes of the NeMo recipes: GPT-3 configs, Llama 2/3 HF configs,
Nemotron-4 15B/340B reports; Nemotron's squared-ReLU MLP is costed as gelu, its GQA on the 340B only)."""

_TITAN = {"Llama 3.1 8B": ["--model", "llama3-8b"], "Llama 3 8B": ["--model", "llama3-8b"],
          "Llama 3 70B": ["--model", "llama3-70b"], "Llama 2 13B": _NEMO["LLAMA2-13B"],
          "Llama 2 70B": _NEMO["LLAMA2-70B"]}


def _read(name: str) -> list[dict]:
    with open(SHARED_RUNS / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _tp_flags(tp: int, overlap: bool) -> list[str]:
    return (["--sp"] + (["--tp-overlap"] if overlap else [])) if tp > 1 else ["--no-sp"]


def provisional_rows() -> list[Row]:
    """The shared development CSVs read directly (until tpsim/data/runs/development.csv exists). Unstated plan
    fields: micro-batch 1 (Megatron-Core), distributed optimizer (zero 1) for Megatron/NeMo, no recomputation
    unless the source names it, sequence parallelism whenever tp > 1, --tp-comm-overlap where the source lists it
    (Megatron-Core README) and for NeMo's tp > 1 recipes."""
    rows = []
    for r in _read("megatron_core_h100.csv"):
        if not r["tp"]:
            continue  # strong-scaling end points: plan not published
        tp, pp = int(r["tp"]), int(r["pp"])
        flags = ["--model", "gpt3-175b", "--layers", r["num_layers"], "--hidden", r["hidden_size"], "--heads",
                 r["num_attention_heads"], "--seq-len", r["seq_length"], "--vocab", r["vocab_size"], "--cluster",
                 "dgx-h100", "--gpus", r["num_gpus"], "--tp", str(tp), "--pp", str(pp), "--global-batch",
                 r["global_batch_size"], "--micro-batch", "1", "--zero", "1", "--dtype", "bf16", "--recompute",
                 "none"] + _tp_flags(tp, "--tp-comm-overlap" in r["comm_overlap"])
        rows.append(_cli_row(r["case_id"], "H100 megatron", flags, float(r["derived_iter_time_s"])))
    for r in _read("nemo_h100_fp8.csv"):
        tp, pp, cp, vp = (int(r[k]) for k in ("tp", "pp", "cp", "vp"))
        flags = _NEMO[r["model"]] + [
            "--seq-len", r["seq_length"], "--cluster", "dgx-h100", "--gpus", r["num_gpus"], "--tp", str(tp), "--pp",
            str(pp), "--cp", str(cp), "--vpp", str(vp), "--global-batch", r["global_batch_size"], "--micro-batch",
            r["micro_batch_size"], "--zero", "1", "--dtype", "fp8", "--recompute", "none"] + _tp_flags(tp, True)
        tokens = int(r["global_batch_size"]) * int(r["seq_length"])
        rows.append(_cli_row(r["case_id"], "H100 nemo", flags,
                             tokens / (float(r["measured_tokens_per_s_per_gpu"]) * int(r["num_gpus"]))))
    for r in _read("mpt_llmfoundry_fsdp.csv"):
        a100 = "A100" in r["gpu_type"]
        zero = 3 if r["fsdp_sharding_strategy"] == "FULL_SHARD" else 2
        flags = ["--model", "gpt3-175b", "--layers", r["num_layers"], "--hidden", r["hidden_size"], "--heads",
                 r["num_attention_heads"], "--vocab", r["vocab_size"], "--seq-len", r["seq_length"], "--cluster",
                 "dgx-a100" if a100 else "dgx-h100", "--gpus", r["num_gpus"], "--tp", "1", "--pp", "1",
                 "--global-batch", r["global_batch_size"], "--micro-batch", r["micro_batch_size"], "--zero",
                 str(zero), "--dtype", "bf16", "--recompute",
                 "full" if r["activation_checkpointing"] == "True" else "none", "--stack", "torchtitan", "--no-sp"]
        rows.append(_cli_row(r["case_id"], ("A100" if a100 else "H100") + " fsdp (llm-foundry)", flags,
                             float(r["derived_step_time_s"])))
    for r in _read("torchtitan_fsdp2.csv"):
        a100 = "A100" in r["gpu_type"]
        tp, cp, dpf = int(r["tp"]), int(r["cp"]), int(r["dp_shard_fsdp"])
        gbs = int(r["global_batch_size"] or int(r["local_batch_size"]) * dpf)
        ac = r["activation_checkpointing"]
        rc = "full" if ac.startswith("full") else "none" if ac == "none" else "selective"
        flags = _TITAN[r["model"]] + [
            "--seq-len", r["seq_length"], "--cluster", "dgx-a100" if a100 else "dgx-h100", "--gpus", r["num_gpus"],
            "--tp", str(tp), "--cp", str(cp), "--pp", "1", "--global-batch", str(gbs), "--micro-batch",
            r["local_batch_size"], "--zero", "3", "--dtype", "fp8" if "Float8" in r["precision"] else "bf16",
            "--recompute", rc, "--stack", "torchtitan"] + _tp_flags(tp, r["async_tp"] == "yes")
        tokens = gbs * int(r["seq_length"])
        rows.append(_cli_row(r["case_id"], ("A100" if a100 else "H100") + " torchtitan", flags,
                             tokens / (float(r["measured_tokens_per_s_per_gpu"]) * int(r["num_gpus"]))))
    for r in _read("deepspeed_zero3_sc21.csv"):
        g, mb = int(r["num_gpus"]), r["micro_batch_size"]
        B, s, L, h, V = (int(r[k]) for k in ("global_batch_size", "seq_length", "num_layers", "hidden_size",
                                             "vocab_size"))
        flags = ["--model", "gpt3-175b", "--vocab", str(V), "--cluster", "selene", "--gpus", str(g), "--tp", "1",
                 "--pp", "1", "--global-batch", str(B), "--micro-batch", mb, "--zero", "3", "--dtype", "fp16",
                 "--recompute", "full", "--stack", _DEEPSPEED_2021, "--no-sp"]
        flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))  # the paper's eq. 3 (recompute)
        rows.append(_cli_row(r["case_id"], "A100 deepspeed-2021", flags,
                             flops / (g * float(r["measured_tflops_per_gpu"]) * 1e12)))
    return rows


_DEEPSPEED_2021 = "deepspeed-2021" if (ROOT / "tpsim" / "data" / "stacks" / "deepspeed-2021.yaml").exists() \
    else "deepspeed"


def development_rows() -> list[Row]:
    """The development set: the shipped runs CSV where it exists, else :func:`provisional_rows`."""
    shipped = ROOT / "tpsim" / "data" / "runs" / "development.csv"
    try:
        from tpsim.runs import load_runs  # noqa: F401
    except ImportError:
        return provisional_rows()
    if not shipped.exists():
        return provisional_rows()
    from tpsim.runs import load_runs
    from tpsim.stacks import load_stack
    from tpsim.topology import load_cluster

    rows = []
    for run in load_runs(shipped):
        cluster = load_cluster(run.cluster, gpus=run.gpus)
        stack = load_stack(run.stack) if run.stack else None
        family = f"{cluster.device.name} {run.stack or 'megatron'}"
        rows.append(Row(run.run_id, family, run.model, cluster, run.plan, stack, float(run.measured)))
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
        compute = _COMPUTE.setdefault((row.cluster.device.name, impl, in_situ),
                                      training_compute(row.cluster.device, impl, in_situ=in_situ)[0])
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


def fitted_rows(rows: list[Row], arch: str, families: tuple[str, ...]) -> list[Row]:
    return [r for r in rows if r.cluster.device.architecture == arch and r.family in families]


def _stack_with(name: str, key: str, value: float):
    """The shipped stack profile ``name`` with ``comm.<key>`` (a figure of the file) set to ``value``: a copy of
    the YAML in a temporary folder, loaded as any profile path."""
    import re
    import tempfile

    from tpsim.stacks import load_stack

    text = (ROOT / "tpsim" / "data" / "stacks" / f"{name}.yaml").read_text(encoding="utf-8")
    text, n = re.subn(rf"(\n  {key}:\n    value: )[^\n]*", rf"\g<1>{value!r}", text)
    assert n == 1, key
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


STACK_FITS = {("deepspeed-2021", "host_us_per_collective"): ("A100 deepspeed-2021",)}
"""stack figures fitted on development-set families (their YAML says so)."""

FITS = {"hopper": ("H100 megatron", "H100 nemo", "H100 fsdp (llm-foundry)")}
"""per architecture with its own in-situ GEMM fraction: the families it is fitted on (efficiency.yaml)."""


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
    for arch in dict(base.gemm_by_architecture):
        alt = _with_arch(base, arch, None)
        without[arch] = {r.run_id: error_pct(r.measured_s, predict(r, alt)[0]) if r.cluster.device.architecture == arch
                         else shipped[r.run_id] for r in rows}
    print(f"\n{'family':26s} {'n':>3s} {'mean |e|':>9s} {'worst':>7s} {'signed':>7s}   "
          + "   ".join(f"without {a} in-situ: mean/signed" for a in without))
    tables = {a: {f[0]: f for f in family_table(rows, e)} for a, e in without.items()}
    for name, n, mean, worst, signed in family_table(rows, shipped):
        extra = "   ".join(f"{tables[a][name][2]:6.1f}% {tables[a][name][4]:+6.1f}%" for a in without)
        print(f"{name:26s} {n:3d} {mean:8.1f}% {worst:+6.1f}% {signed:+6.1f}%   {extra}")
    fam_means = [f[2] for f in family_table(rows, shipped)]
    print(f"median of family means {np.median(fam_means):.1f}%, worst family {max(fam_means):.1f}%")
    if args.fit or args.loo:
        for arch, families in FITS.items():
            sub = fitted_rows(rows, arch, families)
            value = fit_architecture(sub, arch)
            print(f"\ngemm_in_situ_fraction[{arch}] fitted on {len(sub)} rows ({', '.join(families)}): {value:.3f} "
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
