"""The five trade-off charts. Each function returns a :class:`matplotlib.figure.Figure` (built without pyplot,
so no global state and no display) whose axes and artists carry labels that tests can inspect;
:func:`save_figure` writes it as PNG and SVG. matplotlib is imported inside the functions only.

1. :func:`breakdown_chart`   stacked bars of the step-time breakdown of the top plans
2. :func:`tp_sweep_chart`    step-time components and memory per GPU against tp, node boundary marked
3. :func:`time_memory_chart` step time vs. memory per GPU of all fitting plans, coloured by tp and by pp,
                             Pareto front highlighted
4. :func:`scaling_chart`     throughput and MFU against the number of GPUs
5. :func:`bandwidth_heatmap` TP-communication share over tp x inter-node bandwidth
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..search import SearchResult
from .analysis import BandwidthGrid, ContextSweep, Sweep

COMPONENTS = (("compute_s", "compute"), ("recompute_s", "recompute"), ("bubble_s", "pipeline bubble"),
              ("optimizer_s", "optimizer"), ("exposed_comm_s", "exposed communication"))
"""the step-time components, in stacking order (with OVERHEAD they sum to the step time)."""
OVERHEAD = ("overhead_s", "host overhead")
"""host time of a calibration's ``compute`` section: stacked last, only when some plan shown has it."""
COLORS = {"compute_s": "#4C72B0", "recompute_s": "#8172B2", "bubble_s": "#CCB974", "optimizer_s": "#64B5CD",
          "exposed_comm_s": "#C44E52", "overhead_s": "#937860"}
MAX_SCATTER = 12000
"""time-memory scatter: at most this many points are drawn (evenly sampled; the front is always drawn)."""


def _components(columns: Any, rows: Any) -> tuple[tuple[str, str], ...]:
    """COMPONENTS, and OVERHEAD when the rows have any."""
    has = OVERHEAD[0] in columns and np.any(np.asarray(columns[OVERHEAD[0]])[rows])
    return COMPONENTS + ((OVERHEAD,) if has else ())


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def save_figure(fig: Any, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` (150 dpi) and ``stem.svg`` atomically (rendered in memory, then a temporary file
    replaces the old one: an interrupt never leaves a truncated chart); returns both paths."""
    import io

    import matplotlib

    from ..io import atomic_write_bytes

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=150)
    with matplotlib.rc_context({"svg.hashsalt": "tpsim"}):  # stable element ids: reruns give the same file
        fig.savefig(svg, format="svg", metadata={"Date": None})
    atomic_write_bytes(paths[0], png.getvalue(), "chart")
    atomic_write_bytes(paths[1], svg.getvalue(), "chart")
    return paths


def breakdown_chart(result: SearchResult, top: int = 10, title: str | None = None) -> Any:
    """Horizontal stacked bars: one bar per ranked plan (best on top), one segment per time component; the
    whisker is the prediction's 90% error band."""
    idx = result.ranking[:top]
    labels = [f"#{r + 1} {result.label(int(i))}" for r, i in enumerate(idx)]
    fig, ax = _figure(10, 1.2 + 0.42 * max(len(idx), 1))
    y = np.arange(len(idx))[::-1]
    left = np.zeros(len(idx))
    for key, name in _components(result.columns, idx):
        values = result.columns[key][idx]
        ax.barh(y, values, left=left, color=COLORS[key], label=name, height=0.7)
        left += values
    low, high = _band(result.columns, idx, left)
    ax.errorbar(left, y, xerr=[left - low, high - left], fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    for yi, total, hi in zip(y, left, high):
        ax.text(hi, yi, f" {total:.2f} s", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_xlim(0, (high.max() if high.size else 1) * 1.15)
    ax.set_title(title or f"Step-time breakdown of the top {len(idx)} plans ({result.model.name})")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=len(COMPONENTS), fontsize=8, frameon=False)
    return fig


def _band(columns: Any, idx: Any, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) step time of the rows (the estimate's error band; the step itself where a column lacks it)."""
    if "step_time_s_low" not in columns:
        return step, step
    return np.asarray(columns["step_time_s_low"])[idx], np.asarray(columns["step_time_s_high"])[idx]


def tp_sweep_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Stacked step-time components of the best plan per tp (bars, left axis, with the 90% error band as a
    whisker) and its memory per GPU (line, right axis); a dashed line marks where the TP group leaves one node
    (tp > GPUs per node)."""
    fig, ax = _figure(9, 5)
    x = np.arange(len(sweep))
    c = sweep.columns
    bottom = np.zeros(len(sweep))
    for key, name in _components(c, slice(None)):
        ax.bar(x, c[key], bottom=bottom, color=COLORS[key], label=name, width=0.65)
        bottom += c[key]
    low, high = _band(c, slice(None), bottom)
    ax.errorbar(x, bottom, yerr=[bottom - low, high - bottom], fmt="none", ecolor="black", elinewidth=0.8,
                capsize=3)
    for xi, fits in zip(x, c["fits_effective"]):
        if not fits:
            ax.text(xi, high[xi], "does not fit", ha="center", va="bottom", fontsize=7, color="#C44E52")
    ax.set_xticks(x, [str(int(t)) for t in sweep.x])
    ax.set_xlabel("tensor-parallel degree (best plan for each tp)")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(0, max(high.max() if high.size else 0, 1e-9) * 1.2)
    mem = ax.twinx()
    mem.plot(x, c["peak_memory_gib"], "o-", color="black", label="memory per GPU")
    if np.isfinite(sweep.device_memory_gib):
        mem.axhline(sweep.device_memory_gib, color="gray", ls=":", lw=1, label="usable device memory")
    mem.set_ylabel("peak memory per GPU (GiB)")
    mem.set_ylim(0, max(np.nanmax(c["peak_memory_gib"]), np.nan_to_num(sweep.device_memory_gib)) * 1.15)
    inside = sweep.x <= sweep.gpus_per_node
    if inside.any() and (~inside).any():
        boundary = float(np.flatnonzero(inside)[-1]) + 0.5
        ax.axvline(boundary, color="#C44E52", ls="--", lw=1.5, label="TP crosses the node boundary")
        ax.text(boundary, ax.get_ylim()[1] * 0.97, f" tp > {sweep.gpus_per_node} GPUs/node:\n TP over the network",
                va="top", fontsize=8, color="#C44E52")
    handles = ax.get_legend_handles_labels()
    more = mem.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="lower center", bbox_to_anchor=(0.5, 1.02),
              ncol=4, fontsize=8, frameon=False)
    ax.set_title(title or "Tensor-parallel degree sweep", pad=40)
    return fig


def ep_sweep_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Stacked step-time components of the best plan per expert-parallel degree (bars, left axis), its exposed
    share of expert-parallel communication (ep_comm_s, hatched outline) and memory per GPU (line, right axis);
    a dashed line marks where the expert group (ep x etp ranks) leaves one node, so the dispatch and combine
    all-to-alls cross the network."""
    fig, ax = _figure(9, 5)
    x = np.arange(len(sweep))
    c = sweep.columns
    bottom = np.zeros(len(sweep))
    for key, name in _components(c, slice(None)):
        ax.bar(x, c[key], bottom=bottom, color=COLORS[key], label=name, width=0.65)
        bottom += c[key]
    ax.bar(x, c["ep_comm_s"], width=0.65, fill=False, hatch="//", edgecolor="black", lw=0.5,
           label="expert all-to-all (total, partly hidden)")
    for xi, fits in zip(x, c["fits_effective"]):
        if not fits:
            ax.text(xi, bottom[xi], "does not fit", ha="center", va="bottom", fontsize=7, color="#C44E52")
    ax.set_xticks(x, [str(int(e)) for e in sweep.x])
    ax.set_xlabel("expert-parallel degree (best plan for each ep)")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(0, max(bottom.max(initial=0.0), np.nanmax(c["ep_comm_s"], initial=0.0), 1e-9) * 1.2)
    mem = ax.twinx()
    mem.plot(x, c["peak_memory_gib"], "o-", color="black", label="memory per GPU")
    if np.isfinite(sweep.device_memory_gib):
        mem.axhline(sweep.device_memory_gib, color="gray", ls=":", lw=1, label="usable device memory")
    mem.set_ylabel("peak memory per GPU (GiB)")
    mem.set_ylim(0, max(np.nanmax(c["peak_memory_gib"]), np.nan_to_num(sweep.device_memory_gib)) * 1.15)
    inside = c["ep"] * np.maximum(c["etp"], 1) <= sweep.gpus_per_node
    if inside.any() and (~inside).any():
        boundary = float(np.flatnonzero(inside)[-1]) + 0.5
        ax.axvline(boundary, color="#C44E52", ls="--", lw=1.5, label="expert group crosses the node boundary")
        ax.text(boundary, ax.get_ylim()[1] * 0.97, f" ep x etp > {sweep.gpus_per_node} GPUs/node:\n"
                " all-to-all over the network", va="top", fontsize=8, color="#C44E52")
    handles = ax.get_legend_handles_labels()
    more = mem.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="lower center", bbox_to_anchor=(0.5, 1.02),
              ncol=4, fontsize=8, frameon=False)
    ax.set_title(title or "Expert-parallel degree sweep", pad=40)
    return fig


def context_sweep_chart(sweep: ContextSweep, title: str | None = None) -> Any:
    """Throughput of the best plan without context parallelism and of the best with it per sequence length
    (log-log, same tokens per step), the cp of the latter annotated; a dashed line marks the shortest sequence
    from which context parallelism pays."""
    fig, ax = _figure(9, 5)
    s = sweep.seq_len.astype(float)
    a, b = sweep.without_cp, sweep.with_cp
    ax.plot(s, a["tokens_per_s"], "o-", color="#4C72B0", label="best plan with cp = 1")
    ax.plot(s, b["tokens_per_s"], "s-", color="#C44E52", label="best plan with cp > 1")
    for si, t, cp, kind in zip(s, b["tokens_per_s"], b["cp"], b["cp_kind"]):
        if np.isfinite(t):
            ax.annotate(f"cp{int(cp)}" + ("/a2a" if kind == 1 else ""), (si, t), textcoords="offset points",
                        xytext=(4, 6), fontsize=7, color="#C44E52")
    for si, t in zip(s, a["tokens_per_s"]):
        if not np.isfinite(t):
            ax.annotate("cp = 1 does not fit", (si, np.nanmin(b["tokens_per_s"], initial=1.0)),
                        textcoords="offset points", xytext=(0, -14), ha="center", fontsize=7, color="#4C72B0")
    ax.set_xscale("log", base=2)
    _log_axis(ax.yaxis)
    ax.set_xticks(s, [f"{int(v) // 1024}k" if v >= 1024 else str(int(v)) for v in s])
    ax.set_xlabel(f"sequence length (tokens; {sweep.tokens_per_step:,} tokens per step)")
    ax.set_ylabel("throughput (tokens/s)")
    first = sweep.first_paying()
    if first is not None:
        ax.axvline(first, color="#C44E52", ls="--", lw=1.2, label=f"context parallelism pays from {first:,} tokens")
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "Where context parallelism starts to pay")
    return fig


def _categorical(ax: Any, x: np.ndarray, y: np.ndarray, groups: np.ndarray, name: str) -> None:
    """One scatter, points in a fixed shuffled order (no category hides the others), one legend entry per
    value of ``groups``."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    cmap = colormaps["tab10"]
    values = np.unique(groups)
    colour_index = np.searchsorted(values, groups) % 10
    order = np.random.default_rng(0).permutation(x.size)
    ax.scatter(x[order], y[order], s=5, c=cmap(colour_index[order]), rasterized=True,
               linewidths=0)
    for k, value in enumerate(values):
        ax.add_line(Line2D([], [], ls="", marker="o", ms=4, color=cmap(k % 10), label=f"{name}={int(value)}"))


def _log_axis(axis: Any) -> None:
    """Log scale with plain-number tick labels (20, 50, 100 rather than 2 x 10^1)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    if axis.axis_name == "y":
        axis.axes.set_yscale("log")
    else:
        axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def time_memory_chart(result: SearchResult, title: str | None = None) -> Any:
    """Two panels of step time vs. peak memory per GPU over all fitting plans, coloured by tp (left) and by
    pp (right); the Pareto front (fastest plan for each memory budget) is the black staircase."""
    fig, (left, right) = _figure(12, 5, ncols=2)
    c = result.columns
    fit = np.sort(result.ranking[c["fits_effective"][result.ranking]])  # ranked (no duplicates) and fitting
    shown = fit.size
    if fit.size > MAX_SCATTER:
        fit = fit[np.linspace(0, fit.size - 1, MAX_SCATTER).astype(int)]
    front = result.pareto_time_memory()
    for ax, key in ((left, "tp"), (right, "pp")):
        _categorical(ax, c["peak_memory_gib"][fit], c["step_time_s"][fit], c[key][fit], key)
        ax.step(c["peak_memory_gib"][front], c["step_time_s"][front], where="post", color="black", lw=1.5,
                label="Pareto front")
        ax.plot(c["peak_memory_gib"][front], c["step_time_s"][front], "o", color="black", ms=3)
        ax.set_xlabel("peak memory per GPU (GiB)")
        ax.set_ylabel("step time (s)")
        _log_axis(ax.yaxis)
        ax.set_title(f"coloured by {key}")
        ax.legend(fontsize=7, markerscale=2, ncol=2, loc="upper right")
    sample = f", {MAX_SCATTER} drawn" if shown > MAX_SCATTER else ""
    fig.suptitle(title or f"Step time vs. memory of {shown} fitting plans{sample} ({result.model.name})")
    return fig


def scaling_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Throughput (tokens/s, left axis, log-log) and MFU (right axis) of the best plan per GPU count, with the
    ideal linear scaling of the most efficient count (highest tokens/s per GPU) for reference."""
    fig, ax = _figure(9, 5)
    c = sweep.columns
    gpus = sweep.x.astype(float)
    ax.plot(gpus, c["tokens_per_s"], "o-", color="#4C72B0", label="throughput (tokens/s)")
    if gpus.size:  # ideal: every count as efficient per GPU as the most efficient one
        best = int(np.argmax(c["tokens_per_s"] / gpus))
        ax.plot(gpus, c["tokens_per_s"][best] * gpus / gpus[best], ":", color="#4C72B0", alpha=0.6,
                label=f"linear scaling of the best per-GPU count ({int(gpus[best])})")
    ax.set_xscale("log", base=2)
    _log_axis(ax.yaxis)
    ax.set_xticks(gpus, [str(int(g)) for g in gpus])
    ax.set_xlabel("number of GPUs (best plan at each count)")
    ax.set_ylabel("throughput (tokens/s)")
    mfu = ax.twinx()
    mfu.plot(gpus, c["mfu"] * 100, "s--", color="#C44E52", label="MFU (%)")
    mfu.set_ylabel("MFU (%)")
    mfu.set_ylim(0, max(100 * np.nanmax(c["mfu"], initial=0.0) * 1.3, 1))
    for g, t, label in zip(gpus, c["tokens_per_s"], sweep.labels):
        head, _, rest = label.partition(" ")
        ax.annotate(rest if head.endswith("g") else label, (g, t),
                    textcoords="offset points", xytext=(4, -12), fontsize=6)
    handles = ax.get_legend_handles_labels()
    more = mfu.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=8)
    ax.set_title(title or "Scaling: throughput and MFU against the number of GPUs")
    return fig


def bandwidth_heatmap(grid: BandwidthGrid, title: str | None = None) -> Any:
    """TP-communication share of the step time (%) of the best plan per (tp, inter-node bandwidth)."""
    fig, ax = _figure(8, 1.5 + 0.55 * max(grid.tp.size, 1))
    share = grid.tp_share * 100
    image = ax.imshow(share, aspect="auto", cmap="viridis", origin="lower",
                      vmin=0, vmax=max(np.nanmax(share, initial=0.0), 1e-9))
    for i in range(grid.tp.size):
        for j in range(grid.scales.size):
            if np.isfinite(share[i, j]):
                mark = "" if grid.fits[i, j] else "*"
                ax.text(j, i, f"{share[i, j]:.1f}%{mark}", ha="center", va="center", fontsize=8,
                        color="white" if share[i, j] < 0.6 * np.nanmax(share) else "black")
    ax.set_xticks(np.arange(grid.scales.size),
                  [f"{b:g} GB/s\n({s:g}x)" for b, s in zip(grid.bandwidth_GBps, grid.scales)], fontsize=8)
    ax.set_yticks(np.arange(grid.tp.size), [str(int(t)) for t in grid.tp])
    ax.set_xlabel("inter-node bandwidth per GPU (per direction; multiple of the cluster's)")
    ax.set_ylabel("tensor-parallel degree")
    inside = grid.tp <= grid.gpus_per_node
    if inside.any() and (~inside).any():
        ax.axhline(float(np.flatnonzero(inside)[-1]) + 0.5, color="white", ls="--", lw=1.5)
    fig.colorbar(image, ax=ax, label="TP communication / step time (%)")
    ax.set_title(title or "TP communication share (best plan per cell; * = does not fit)")
    return fig
