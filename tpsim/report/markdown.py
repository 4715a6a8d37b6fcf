"""``tpsim report``: a Markdown report with the five charts and the tables behind them.

:func:`write_report` runs the searches (:mod:`tpsim.report.analysis`), draws the charts
(:mod:`tpsim.report.charts`) and writes into ``out_dir``: ``README.md`` (the report), ``plans.csv`` (the top
plans with their breakdown), ``summary.json`` (the ``tpsim plan --json`` object) and each chart as PNG and SVG
with its text twin, a CSV of the numbers it draws.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__
from ..io import atomic_write_text
from ..model import ModelSpec
from ..search import SearchResult, SearchSpace
from . import analysis, charts
from .analysis import search  # the report's search: with the residual band of `tpsim estimate`
from .network import inter_node_bandwidth_GBps, scale_inter_node_bandwidth

CHART_FILES = ("breakdown", "tp_sweep", "time_memory", "scaling", "tp_bandwidth")
"""the charts of every report; ``ep_sweep`` is added for a mixture-of-experts model, ``cp_sweep`` for a long
context (:data:`LONG_CONTEXT`)."""
LONG_CONTEXT = 32768
"""sequence length (tokens) from which the report adds the context-parallel sweep."""


def context_seq_lens(seq_len: int) -> tuple[int, ...]:
    """Sequence lengths of the report's context sweep: the model's own and the powers of two from 4096 below
    it, at most five (long-context training extends a 4k-8k model)."""
    shorter = [1 << k for k in range(12, 31) if (1 << k) < seq_len]
    return tuple(shorter[-4:]) + (int(seq_len),)


@dataclass(frozen=True, kw_only=True)
class ReportInputs:
    """What a report is about. ``cluster`` is the name or path given to ``load_cluster``."""

    model: ModelSpec
    cluster: str
    gpus: int
    global_batch: int
    space: SearchSpace = field(default_factory=SearchSpace)
    gpu_hour_price: float = 1.0
    top: int = 10
    compute: Any = None
    command: str = ""
    """the command that regenerates the report (printed in it)."""
    stack: Any = None
    """training-stack profile, name or path (None: megatron)."""
    scaling_span: int = analysis.SCALING_SPAN
    """the scaling study searches gpus / span .. gpus x span (powers of two; counts the cluster refuses are
    left out)."""
    tokens: float | None = None
    """the whole run's token budget: adds the three whole-run charts (tpsim.report.wholerun)."""
    reliability: Any = None
    """the fleet of the whole-run figures (tpsim.train.Reliability; None: the default fleet)."""
    flops_convention: str | None = None
    """how MFU and TFLOP/s count the model FLOPs (None: causal, the default; docs/SCHEMAS.md T5)."""


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one char per column (l/r), default right for numbers."""
    align = align or "".join("r" if rows and isinstance(rows[0][i], (int, float, np.number)) else "l"
                             for i in range(len(headers)))
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


def _ms(x: float) -> str:
    return f"{x:.3f}"


def _plan_rows(result: SearchResult, idx: np.ndarray) -> list[list[Any]]:
    c = result.columns
    rows = []
    for r, i in enumerate(idx):
        rows.append([r + 1, result.label(int(i)), int(result.variants(int(i)).size), _step(c, int(i)),
                     float(c["tokens_per_s"][i]), f"{c['tokens_per_s'][i] / c['gpus'][i]:,.0f}",
                     f"{c['model_tflops_per_gpu'][i]:.0f}", f"{100 * c['mfu'][i]:.1f}%",
                     f"{c['peak_memory_gib'][i]:.1f}", _ms(c["compute_s"][i]), _ms(c["recompute_s"][i]),
                     _ms(c["bubble_s"][i]), _ms(c["optimizer_s"][i]), _ms(c["exposed_comm_s"][i]),
                     _ms(c["tp_comm_s"][i]), _ms(c["dp_comm_s"][i])])
    return rows


def _step(c: Any, i: int) -> str:
    """Step time in seconds, with the error band where the estimator gives one."""
    text = _ms(c["step_time_s"][i])
    if "step_time_s_low" in c and "step_time_s_high" in c and np.isfinite(c["step_time_s_low"][i]):
        text += f" ({_ms(c['step_time_s_low'][i])}-{_ms(c['step_time_s_high'][i])})"
    return text


PLAN_HEADERS = ("#", "plan", "variants", "step (s)", "tokens/s", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "mem (GiB)", "compute", "recompute",
                "bubble", "optimizer", "exposed comm", "TP comm (total)", "DP comm (total)")


def _section_best(result: SearchResult, top: int) -> str:
    from ..estimator.flops import MFU_WARNING_START

    idx = result.ranking[:top]
    if not idx.size:
        return "## Best plans\n\nNo plan fits on this cluster (see the rejections below).\n"
    best = result.estimate_dict(int(idx[0]))
    algos = best.get("collectives", {})
    text = ["## Best plans\n",
            f"The {idx.size} fastest plans that fit (seconds per step; the five components from *compute* to "
            f"*exposed comm* add up to the step time; TP/DP comm are totals, partly hidden behind compute). "
            f"*variants*: how many plans the row stands for, plans that differ only in the rank order or the DP "
            f"overlap flag and predict the same time and memory (listed in `summary.json`). The breakdown "
            f"chart's numbers are in `breakdown.csv`.\n",
            md_table(PLAN_HEADERS, _plan_rows(result, idx), align="rl" + "r" * (len(PLAN_HEADERS) - 2)), "",
            f"Best plan: `{result.label(int(idx[0]))}`"
            + ("; collectives chosen: " + ", ".join(f"{k}: {v}" for k, v in algos.items()) if algos else "") + ".",
            *[f"\n**Warning**: {w}." for w in best.get("warnings", ()) if w.startswith(MFU_WARNING_START)],
            f"\nMFU and TFLOP/s/GPU count {result.flops_convention} attention FLOPs (`--flops-convention`).",
            *([f"\nStep-time ranges and error bars: {result.columns['band_basis'][int(idx[0])]} for the best "
               "plan, as `tpsim estimate` gives it (each row's basis: the `band_basis` column of the CSV files)."]
              if "band_basis" in result.columns else []),
            "", "![Step-time breakdown of the top plans](breakdown.png)", ""]
    return "\n".join(text)


def _section_rejections(result: SearchResult) -> str:
    rows = [[key, text, n] for key, text, n in result.why()]
    return "\n".join(["## Rejected plans\n",
                      f"{result.enumerated} plans enumerated, {result.evaluated} evaluated by the estimator, "
                      f"{len(result)} fit and are ranked"
                      + (f" ({result.duplicates} more are twins of ranked plans: they differ only in the rank "
                         "order or the DP overlap flag and predict the same time and memory, so they are listed "
                         "once)" if result.duplicates else "")
                      + ". Reasons for the rest (first constraint broken):\n",
                      md_table(("reason", "constraint", "plans"), rows) if rows else "(none)", ""])


def _section_pareto(result: SearchResult) -> str:
    front = result.pareto_time_memory()
    c = result.columns
    rows = [[f"{c['peak_memory_gib'][i]:.1f}", _ms(c["step_time_s"][i]), result.label(int(i))] for i in front]
    return "\n".join([
        "## Step time vs. memory\n",
        "Every fitting plan, coloured by tp (left) and pp (right). The Pareto front (black) is the fastest plan "
        "for each memory budget: anything above it is slower *and* uses more memory than a plan on it.\n",
        "![Step time vs. memory per GPU](time_memory.png)\n",
        "Every point drawn is in `time_memory.csv` (column `pareto_front` marks the front).\n",
        md_table(("memory (GiB)", "step (s)", "plan"), rows, align="rrl") if rows else "(no fitting plan)", ""])


def _section_tp_sweep(sweep: analysis.Sweep) -> str:
    c = sweep.columns
    rows = [[int(t), sweep.labels[k], _step(c, k), f"{100 * c['tp_comm_s'][k] / c['step_time_s'][k]:.1f}%",
             f"{c['peak_memory_gib'][k]:.1f}", bool(c["fits_effective"][k]),
             "yes" if t > sweep.gpus_per_node else "no"] for k, t in enumerate(sweep.x)]
    return "\n".join([
        "## Tensor-parallel degree sweep\n",
        f"The best plan for each tp (every valid tp up to {analysis.TP_SWEEP_MAX}). Right of the dashed line the "
        f"TP group spans more than one node ({sweep.gpus_per_node} GPUs), so its all-reduces cross the network.\n",
        "![TP sweep](tp_sweep.png)\n",
        "Data: `tp_sweep.csv`.\n",
        md_table(("tp", "best plan", "step (s)", "TP comm / step", "mem (GiB)", "fits", "crosses nodes"), rows,
                 align="rlrrrll"), ""])


def _section_scaling(scaling: analysis.Sweep, result: SearchResult, price: float) -> str:
    c = scaling.columns
    front = {int(result.columns["gpus"][i]) for i in result.pareto_gpus_throughput()}
    rows = []
    for k, g in enumerate(scaling.x):
        rows.append([int(g) if g != scaling.reference else f"**{int(g)}** (asked)",
                     scaling.labels[k].partition(" ")[2], float(c["tokens_per_s"][k]),
                     f"{100 * c['mfu'][k]:.1f}%", _step(c, k), f"{c['cost_per_mtok'][k]:.2f}",
                     "yes" if int(g) in front else "no"])
    searched = ", ".join(str(g) for g in scaling.searched)
    missing = sorted(set(scaling.searched) - {int(g) for g in scaling.x})
    return "\n".join([
        "## Scaling and cost\n",
        f"The fastest fitting plan at each GPU count, from below to above the {scaling.reference} GPUs asked about "
        f"(searched: {searched}"
        + (f"; no plan fits at {', '.join(map(str, missing))}" if missing else "")
        + "). At one GPU count the fastest plan is also the cheapest; cost is dollars per million tokens at "
        f"${price:g} per GPU-hour. A count is on the throughput-vs-GPUs Pareto front when no smaller count is as "
        "fast. Data: `scaling.csv`.\n",
        "![Scaling](scaling.png)\n",
        md_table(("GPUs", "fastest plan", "tokens/s", "MFU", "step (s)", "$/M tokens", "on front"), rows,
                 align="rlrrrrl") if rows else "(no GPU count fits)", ""])


def _saturation_note(grid: analysis.BandwidthGrid, pcie_GBps: float) -> str:
    """A sentence when faster network links stop helping (the best step time no longer improves)."""
    best = np.nanmin(grid.step_time_s, axis=0)
    one = int(np.argmin(np.abs(grid.scales - 1.0)))
    flat = [s for s, b in zip(grid.scales, best) if s > 1.0 and b >= best[one] * (1 - 1e-3)]
    if not flat:
        return ""
    return (f" Faster network links stop paying off beyond 1x (no gain at {', '.join(f'{s:g}x' for s in flat)}): "
            "only the network links were scaled, so the bottleneck moves to the other links of the inter-node path "
            f"(each GPU reaches its NIC over PCIe, {pcie_GBps:g} GB/s per direction at line rate); faster NICs "
            "alone buy nothing on this node design.")


def _section_bandwidth(grid: analysis.BandwidthGrid, base: float, pcie_GBps: float) -> str:
    slow = grid.slowdown
    rows = []
    for i, t in enumerate(grid.tp):
        rows.append([int(t)] + [f"{slow[i, j]:.2f}x{'' if grid.fits[i, j] else '*'}, {grid.step_time_s[i, j]:.2f} s, "
                                f"TP {100 * grid.tp_share[i, j]:.0f}%: `{grid.labels[i][j]}`"
                                if np.isfinite(slow[i, j]) else "-" for j in range(grid.scales.size)])
    heads = ["tp"] + [f"{b:g} GB/s ({s:g}x)" for b, s in zip(grid.bandwidth_GBps, grid.scales)]
    best = np.nanmin(np.where(grid.fits, grid.step_time_s, np.nan), axis=0) if grid.fits.any() else \
        np.nanmin(grid.step_time_s, axis=0)
    gain = ", ".join(f"{s:g}x: {b:.3f} s" for s, b in zip(grid.scales, best))
    return "\n".join([
        "## What would more inter-node bandwidth buy?\n",
        f"The step time of the best plan for each (tp, inter-node bandwidth), as the slowdown against the best "
        f"cell (the fastest fitting plan of the whole grid, framed), with every network link of the cluster "
        f"scaled (1x = {base:g} GB/s per GPU per direction; for scale: HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = "
        "50 GB/s per NIC). Each cell names its plan, which may change from cell to cell; more bandwidth never "
        "makes a cell slower. Only the network links (NICs and switches) are scaled, not the PCIe links between "
        "GPU and NIC, so the gain stops where those become the bottleneck. Cells with * do not fit (the best of "
        "the plans that do not fit). The table adds TP communication as a share of that plan's step time. "
        "Best fitting step time over all tp at each bandwidth: " + gain + "."
        + _saturation_note(grid, pcie_GBps) + " Data: `tp_bandwidth.csv`.\n",
        "![Step time of the best plan over tp x bandwidth](tp_bandwidth.png)\n",
        md_table(heads, rows, align="r" * len(heads)), ""])


def report_files() -> tuple[str, ...]:
    """Every file a report writes into its folder."""
    from .wholerun import CHARTS as RUN_CHARTS

    charts_ = tuple(f"{name}{ext}" for name in CHART_FILES + ("ep_sweep", "cp_sweep") + RUN_CHARTS
                    for ext in (".png", ".svg", ".csv"))
    return ("README.md", "plans.csv", "summary.json") + charts_


def check_report_dir(out_dir: str | Path, force: bool = False) -> Path:
    """Check the report folder before any work: a folder (or a new one under a writable folder), not a file,
    and not one holding a report already unless ``force`` (a report or a README is never overwritten
    silently)."""
    from ..io import check_output_dir

    return check_output_dir(out_dir, "--out", force=force, protected=report_files())


def write_report(inputs: ReportInputs, out_dir: str | Path, *,
                 loader: Callable[..., Any] | None = None, progress: bool = False,
                 log: Callable[[str], None] = lambda s: None, force: bool = False) -> Path:  # noqa: ARG005 (a fixed signature)
    """Run every study, draw the five charts and write the report; returns the README.md path.

    The folder is checked first (:func:`check_report_dir`; ``force`` replaces an existing report), every
    file is written atomically (an interrupted run leaves whole files only), and README.md is written last."""
    from ..io import make_output_dir
    from ..search.explain import check_found
    from ..topology import load_cluster

    loader = loader or load_cluster
    out = check_report_dir(out_dir, force=force)
    model, space = inputs.model, inputs.space
    cluster = loader(inputs.cluster, gpus=inputs.gpus)
    kw = dict(compute=inputs.compute, progress=progress, stack=inputs.stack)
    log("searching the full space")
    result = search(model, cluster, inputs.global_batch, space=space, gpu_hour_price=inputs.gpu_hour_price, **kw)
    check_found(result)
    if inputs.flops_convention:
        result = result.in_convention(inputs.flops_convention)
    log("TP sweep")
    sweep = analysis.tp_sweep(model, cluster, inputs.global_batch, space, **kw)
    log("GPU-count scaling and cost")
    clusters = analysis.scaling_counts(inputs.gpus, lambda n: cluster if n == inputs.gpus else
                                       loader(inputs.cluster, gpus=n), inputs.scaling_span)
    run_kw = {} if inputs.tokens is None else {"tokens": inputs.tokens, "reliability": inputs.reliability}
    scaling, scaled = analysis.scaling(model, clusters, inputs.global_batch, space, reference=inputs.gpus,
                                       gpu_hour_price=inputs.gpu_hour_price, **kw, **run_kw)
    log("inter-node bandwidth grid")
    base = inter_node_bandwidth_GBps(cluster)
    grid = analysis.bandwidth_grid(model, cluster, inputs.global_batch, scale_inter_node_bandwidth, base, space,
                                   **kw)
    extra: dict[str, Any] = {}
    title = f"{model.name}, {inputs.gpus} x {cluster.device.name}"
    if model.is_moe:
        log("expert-parallel sweep")
        extra["ep_sweep"] = analysis.ep_sweep(model, cluster, inputs.global_batch, space, **kw)
    if model.seq_len >= LONG_CONTEXT:
        log("context-parallel sweep")
        extra["cp_sweep"] = analysis.context_sweep(model, cluster, inputs.global_batch * model.seq_len, space,
                                                   context_seq_lens(model.seq_len), **kw)
    log("charts")
    figures = {
        "breakdown": (charts.breakdown_chart(result, top=inputs.top, title=f"Step-time breakdown of the top plans "
                                                                           f"({title})"),
                      charts.breakdown_table(result, top=inputs.top)),
        "tp_sweep": (charts.tp_sweep_chart(sweep, title=f"TP-degree sweep ({title})"), charts.tp_sweep_table(sweep)),
        "time_memory": (charts.time_memory_chart(result), charts.time_memory_table(result)),
        "scaling": (charts.scaling_chart(scaling, title=f"Scaling of {model.name} on {cluster.name}"),
                    charts.scaling_table(scaling)),
        "tp_bandwidth": (charts.bandwidth_heatmap(grid, title=f"Step time of the best plan per tp and inter-node "
                                                              f"bandwidth ({title})"),
                         charts.bandwidth_table(grid)),
    }
    if "ep_sweep" in extra:
        figures["ep_sweep"] = (charts.ep_sweep_chart(extra["ep_sweep"], title=f"Expert-parallel sweep ({title})"),
                               charts.ep_sweep_table(extra["ep_sweep"]))
    if "cp_sweep" in extra:
        figures["cp_sweep"] = (charts.context_sweep_chart(extra["cp_sweep"],
                                                          title=f"Context parallelism ({title})"),
                               charts.context_sweep_table(extra["cp_sweep"]))
    if inputs.tokens is not None:
        from . import wholerun

        figures.update(wholerun.figures(scaled, title))
    text = _render(inputs, cluster, result, sweep, scaling, scaled, grid, base, extra)
    make_output_dir(out, "--out")
    for name, (fig, table) in figures.items():
        charts.save_chart(fig, table, out / name)
    _write(out / "plans.csv", result.table(max(inputs.top, 50)).to_csv(index=False))
    _write(out / "summary.json", json.dumps(result.to_json(inputs.top), indent=1, allow_nan=False) + "\n")
    path = out / "README.md"
    _write(path, text)  # last: a folder with a README holds a whole report
    return path


def _write(path: Path, text: str) -> None:
    atomic_write_text(path, text, "report")


def _render(inputs: ReportInputs, cluster: Any, result: SearchResult, sweep: analysis.Sweep,
            scaling: analysis.Sweep, scaled: SearchResult, grid: analysis.BandwidthGrid, base: float,
            extra: dict[str, Any] | None = None) -> str:
    m = inputs.model
    compute = getattr(inputs.compute, "source", "roofline") if inputs.compute else "roofline"
    params = m.total_params() / 1e9
    head = [
        f"# {m.name} on {inputs.gpus} x {cluster.device.name} ({cluster.name})\n",
        f"Predicted by tpsim {__version__} (compute model: {compute}; estimator flavor: megatron). "
        f"All numbers below come from running the planner; regenerate with:\n",
        f"```\n{inputs.command}\n```\n" if inputs.command else "",
        "## Setup\n",
        md_table(("", ""), [
            ["model", f"{m.name}: {params:.1f} B parameters, {m.num_layers} layers, hidden {m.hidden_size}, "
                      f"{m.num_attention_heads} heads ({m.num_kv_heads} KV), FFN {m.ffn_hidden_size}, "
                      f"vocabulary {m.vocab_size}, {m.family} family"],
            ["sequence length", m.seq_len],
            ["global batch", f"{inputs.global_batch} sequences ({inputs.global_batch * m.seq_len:,} tokens)"],
            ["cluster", f"{cluster.name}: {cluster.num_nodes} nodes x {cluster.gpus_per_node} "
                        f"{cluster.device.name}"],
            ["GEMM dtype / attention", f"{inputs.space.dtype} / {inputs.space.attention}"],
            ["training stack", result.stack_name],
            ["MFU and TFLOP/s/GPU", f"model FLOPs counted with {result.flops_convention} attention "
                                    "(`--flops-convention`; docs/SCHEMAS.md T5)"],
            ["search space", _describe_space(inputs.space)],
            ["search", f"{result.enumerated:,} plans enumerated, {result.evaluated:,} evaluated, "
                       f"{len(result):,} fit; {result.elapsed_s:.2f} s"],
        ], align="ll"), ""]
    body = [_section_best(result, inputs.top), _section_rejections(result), _section_pareto(result),
            _section_tp_sweep(sweep), _section_scaling(scaling, scaled, inputs.gpu_hour_price),
            _section_bandwidth(grid, base, float(cluster.injection_bandwidth().get("pcie", float("nan"))))]
    extra = extra or {}
    if "ep_sweep" in extra:
        body.append(_section_ep_sweep(extra["ep_sweep"]))
    if "cp_sweep" in extra:
        body.append(_section_cp_sweep(extra["cp_sweep"]))
    if inputs.tokens is not None:
        from .wholerun import section

        body.append(section(scaled, inputs.tokens, inputs.gpu_hour_price))
    foot = [f"---\nEvery chart is saved as PNG and SVG with a text twin, a CSV of the numbers it draws "
            f"({', '.join(f'`{n}.csv`' for n in CHART_FILES)}); `plans.csv` holds the top plans with every "
            f"breakdown column and `summary.json` the `tpsim plan --json` object. Generated with Python "
            f"{platform.python_version()}.\n"]
    return "\n".join(head + body + foot)


def _section_ep_sweep(sweep: analysis.Sweep) -> str:
    c = sweep.columns
    rows = [[int(e), sweep.labels[k], _ms(c["step_time_s"][k]), f"{100 * c['ep_comm_s'][k] / c['step_time_s'][k]:.1f}%",
             f"{c['peak_memory_gib'][k]:.1f}", bool(c["fits_effective"][k]),
             "yes" if e * max(int(c["etp"][k]), 1) > sweep.gpus_per_node else "no"] for k, e in enumerate(sweep.x)]
    return "\n".join([
        "## Expert-parallel degree sweep\n",
        "The best plan for each ep (every ep dividing the experts). Right of the dashed line the expert group "
        f"(ep x etp ranks) spans more than one node ({sweep.gpus_per_node} GPUs), so the dispatch and combine "
        "all-to-alls cross the network.\n",
        "![EP sweep](ep_sweep.png)\n",
        md_table(("ep", "best plan", "step (s)", "EP all-to-all / step", "mem (GiB)", "fits", "crosses nodes"), rows,
                 align="rlrrrll"), ""])


def _section_cp_sweep(sweep: analysis.ContextSweep) -> str:
    a, b = sweep.without_cp, sweep.with_cp
    rows = [[int(s), sweep.labels_without[k] or "(none fits)", float(a["tokens_per_s"][k]),
             sweep.labels_with[k] or "(none fits)", float(b["tokens_per_s"][k]), bool(sweep.pays()[k])]
            for k, s in enumerate(sweep.seq_len)]
    first = sweep.first_paying()
    verdict = (f"Context parallelism pays from {first:,} tokens on." if first is not None
               else "Context parallelism does not pay at the longest sequence shown.")
    return "\n".join([
        "## Where context parallelism pays\n",
        f"The best fitting plan without context parallelism (cp = 1) and with it (cp > 1) per sequence length, at "
        f"the same {sweep.tokens_per_step:,} tokens per step. {verdict}\n",
        "![CP sweep](cp_sweep.png)\n",
        md_table(("sequence", "best cp = 1 plan", "tokens/s", "best cp > 1 plan", "tokens/s", "cp pays"), rows,
                 align="rlrlrl"), ""])


def _describe_space(space: SearchSpace) -> str:
    def vals(v: Any) -> str:
        return "all divisors" if v is None else " ".join(str(x) for x in v)
    parts = [f"tp {vals(space.tp)}" + (f" (<= {space.max_tp})" if space.max_tp else ""),
             f"cp {vals(space.cp)} ({' '.join(space.cp_kind)})", f"ep {vals(space.ep)}",
             f"pp {vals(space.pp)}", f"vpp {vals(space.vpp)}", f"sp {vals(['off' if not s else 'on' for s in space.sp])}",
             f"recompute {vals(space.recompute)}", f"ZeRO {vals(space.zero)}", f"micro-batch {vals(space.micro_batch)}",
             f"overlap {vals(['on' if o else 'off' for o in space.overlap])}", f"{len(space.order)} rank orders"]
    return "; ".join(parts)


__all__ = ["ReportInputs", "write_report", "check_report_dir", "report_files", "md_table", "CHART_FILES",
           "LONG_CONTEXT", "context_seq_lens"]
