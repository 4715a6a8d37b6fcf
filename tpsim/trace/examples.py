"""Example reports of traced models (``reports/traced-*/``): a model of the zoo traced on the meta device, its
derived tensor-parallel plan, the best plans of a search and the TP sweep chart. Regenerate them all with::

    python -m tpsim.trace.examples             # or: python -m tpsim.trace.examples traced-resnet50-8xa100

Each report keeps the op graph it was made from (``model.ops.json``, from ``tpsim trace``); ``--retrace``
traces the model again (needs torch), otherwise the committed graph is read (torch-free).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..search import SearchSpace

REPORTS_DIR = Path("reports")


@dataclass(frozen=True)
class TracedExample:
    spec: str
    inputs: tuple[str, ...]
    kwargs: dict[str, Any]
    cluster: str
    gpus: int
    global_batch: int
    """samples (sequences or images) per step."""
    why: str
    """where the shapes and the batch come from."""
    space: dict[str, Any] = field(default_factory=dict)


EXAMPLES = {
    "traced-vit-l16-64xa100": TracedExample(
        "tpsim.trace.zoo:vit_l16", ("1,3,224,224",), {}, "dgx-a100", 64, 4096,
        "ViT-L/16 (Dosovitskiy et al. 2021, Table 1), 224x224 images, batch 4096 (their pre-training batch)",
        {"micro_batch": (8, 16, 32, 64)}),
    "traced-resnet50-8xa100": TracedExample(
        "tpsim.trace.zoo:resnet50", ("32,3,224,224",), {}, "dgx-a100", 8, 1024,
        "ResNet-50 (He et al. 2016), 224x224 images, batch 1024 (Goyal et al. 2017: 32 per GPU x 32 GPUs; "
        "here 128 per GPU on one DGX A100)", {"micro_batch": (16, 32, 64, 128)}),
    "traced-unet-8xh100": TracedExample(
        "tpsim.trace.zoo:unet", ("8,3,64,64", "8"), {}, "dgx-h100", 8, 512,
        "a small diffusion U-Net (Ho et al. 2020 blocks, base width 128, 64x64 images), batch 512",
        {"micro_batch": (8, 16, 32, 64)}),
}


def trace_command(name: str) -> str:
    ex = EXAMPLES[name]
    kwargs = "".join(f" --kwarg {k}={v!r}" for k, v in ex.kwargs.items())
    shapes = "".join(f" --input-shape {s}" for s in ex.inputs)
    return f"tpsim trace {ex.spec}{kwargs}{shapes} --out {REPORTS_DIR / name / 'model.ops.json'}"


def _graph(name: str, retrace: bool):  # noqa: ANN202 - OpGraph
    from ..opgraph.schema import load_opgraph

    path = REPORTS_DIR / name / "model.ops.json"
    if retrace or not path.exists():
        from .api import trace_spec
        from .spec import parse_input_shape

        ex = EXAMPLES[name]
        graph = trace_spec(ex.spec, [parse_input_shape(s) for s in ex.inputs], dict(ex.kwargs))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(graph.to_json())
    return load_opgraph(path)


def make(name: str, retrace: bool = False, log=print) -> Path:  # noqa: ANN001
    """Write one report: README.md, tp_sweep.png/.svg, plans.csv, summary.json, model.ops.json."""
    from functools import partial

    from ..opgraph.estimate import estimate_graph, estimate_graph_batch
    from ..opgraph.model import OpGraphModel
    from ..opgraph.tp import derive_plan
    from ..search import search
    from ..topology import load_cluster
    from ..report.analysis import SWEEP_COLUMNS, TP_SWEEP_MAX, Sweep, best_per
    from ..report.charts import save_figure, tp_sweep_chart

    ex = EXAMPLES[name]
    out = REPORTS_DIR / name
    graph = _graph(name, retrace)
    cluster = load_cluster(ex.cluster, gpus=ex.gpus)
    model = OpGraphModel(graph=graph, tp_plan=derive_plan(graph), path=str(out / "model.ops.json")) \
        .with_gpus(cluster.num_gpus)
    space = SearchSpace(dtype="bf16", cp=(1,), ep=(1,), **ex.space)  # traced graphs: no cp/ep (as `tpsim plan`)
    estimator = partial(estimate_graph_batch)
    started = time.perf_counter()
    result = search(model, cluster, ex.global_batch, space=space, estimator=estimator)
    elapsed = time.perf_counter() - started
    log(f"{name}: {result.evaluated} plans in {elapsed:.1f} s")
    # the TP sweep: best plan per tp (unfitting plans only where none fits), from one search
    swept = search(model, cluster, ex.global_batch, space=dataclasses.replace(space, max_tp=TP_SWEEP_MAX),
                   include_unfit=True, estimator=estimator)
    tps, idx = best_per(swept, "tp")
    sweep = Sweep(axis="tp", x=tps, labels=tuple(swept.label(int(i)) for i in idx),
                  columns={k: swept.columns[k][idx] for k in SWEEP_COLUMNS}, gpus_per_node=cluster.gpus_per_node,
                  device_memory_gib=cluster.device.usable_memory_bytes / 2**30)
    save_figure(tp_sweep_chart(sweep, title=f"{graph.name} on {ex.gpus} x {cluster.device.name}: best plan per TP "
                                            "degree"), out / "tp_sweep")
    best = [int(i) for i in result.ranking[:10]]
    estimates = [estimate_graph(model, cluster, result.plan(i)) for i in best]
    sweep_estimates = {int(t): estimate_graph(model, cluster, swept.plan(int(i))) for t, i in zip(tps, idx)}
    result.table(10).to_csv(out / "plans.csv", index=False)
    summary = {"model": graph.name, "cluster": ex.cluster, "gpus": ex.gpus, "global_batch": ex.global_batch,
               "evaluated": result.evaluated, "best": [e.to_dict() for e in estimates[:3]],
               "tp_sweep": {t: e.to_dict() for t, e in sweep_estimates.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "README.md").write_text(_markdown(name, ex, model, cluster, result, estimates, sweep, sweep_estimates,
                                             elapsed))
    return out


def _markdown(name: str, ex: TracedExample, model: Any, cluster: Any, result: Any, estimates: list,
              sweep: Any, sweep_estimates: dict, elapsed: float) -> str:  # noqa: ARG001 (unused: kept for the callers)
    from ..opgraph.estimate import plan_notes

    g = model.graph
    samples = "sequences" if g.tokens_per_sample > 1 else "images"
    unit = "tokens/s" if g.tokens_per_sample > 1 else "images/s"
    styles = model.tp_plan.described(g)
    counts: dict[str, int] = {}
    for s in styles.values():
        counts[s] = counts.get(s, 0) + 1
    lines = [f"# {g.name} on {ex.gpus} x {cluster.device.name} ({ex.cluster}), traced from PyTorch", "",
             f"Predicted by tpsim {__version__} from the op graph of the model's own PyTorch code (no preset). "
             "Regenerate with `python -m tpsim.trace.examples " + name + "` (add `--retrace` to trace again).", "",
             "## The model", "", f"{ex.why}.", "", "```", trace_command(name), "```", "", "```", g.summary(), "```",
             "", "## Derived tensor-parallel plan", "",
             "Megatron-style pairs found in the op graph (`tpsim trace model.ops.json --show` lists every op); "
             "ops not listed run replicated on every TP rank.", "",
             "| op | style |", "|:---|:---|"]
    for op_name, style in list(styles.items())[:40]:
        lines.append(f"| `{op_name}` | {style} |")
    if len(styles) > 40:
        lines.append(f"| ... ({len(styles) - 40} more) | |")
    lines += ["", "Styles: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", "",
              "## Best plans", "",
              f"Global batch {ex.global_batch} {samples}, bf16, {result.evaluated:,} plans evaluated in "
              f"{elapsed:.1f} s. Seconds per step; compute to exposed comm add up to the step time.", "",
              f"| # | plan | step (s) | {unit} | MFU | mem (GiB) | compute | recompute | bubble | optimizer | "
              "exposed comm | TP comm (total) |", "|---:|:---|" + "---:|" * 10]
    for r, e in enumerate(estimates, 1):
        b = e.breakdown
        lines.append(f"| {r} | {e.plan.short()} | {e.step_time_s:.3f} | {e.tokens_per_s:,.0f} | {100 * e.mfu:.1f}% | "
                     f"{e.peak_memory_gib:.1f} | {b['compute']:.3f} | {b['recompute']:.3f} | {b['bubble']:.3f} | "
                     f"{b['optimizer']:.3f} | {b['exposed_comm']:.3f} | {b['tp_comm']:.3f} |")
    lines += ["", "## TP sweep", "", "![TP sweep](tp_sweep.png)", "",
              "Best plan for each tensor-parallel degree (where no plan fits, the best unfitting one).", "",
              f"| tp | plan | step (s) | {unit} | MFU | TP comm (total) | mem (GiB) | fits | notes |",
              "|---:|:---|---:|---:|---:|---:|---:|:---|:---|"]
    for t, e in sweep_estimates.items():
        notes = plan_notes(model, t)
        note = f"{len(notes)} region(s) replicated: split dims not divisible by {t}" if notes else ""
        lines.append(f"| {t} | {e.plan.short()} | {e.step_time_s:.3f} | {e.tokens_per_s:,.0f} | {100 * e.mfu:.1f}% | "
                     f"{e.breakdown['tp_comm']:.3f} | {e.peak_memory_gib:.1f} | {'yes' if e.fits else 'no'} | {note} |")
    compute = ", ".join(dict.fromkeys(e.compute_model for e in estimates)) or "none"
    stack = ", ".join(dict.fromkeys(str(e.stack) for e in estimates)) or "none"
    lines += ["", f"Compute model: `{compute}` (the stack's default: measured kernels where the device has them, "
              "the roofline priors elsewhere); convolutions as implicit GEMMs at their fastest split-K. Stack: "
              f"`{stack}` (its fixed costs, optimizer step and process memory, as for presets). Collectives: the "
              "topology's collective model. Format and cost model: docs/OPGRAPH.md.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    retrace = "--retrace" in argv
    names = [a for a in argv if a != "--retrace"] or list(EXAMPLES)
    for name in names:
        if name not in EXAMPLES:
            print(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})", file=sys.stderr)
            return 2
        started = time.perf_counter()
        path = make(name, retrace, log=lambda s: print(f"  {s}", file=sys.stderr))
        print(f"wrote {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
