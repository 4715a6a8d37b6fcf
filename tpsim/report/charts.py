"""The five trade-off charts, each with a text twin. Each ``*_chart`` function returns a
:class:`matplotlib.figure.Figure` (built without pyplot, so no global state and no display) whose axes and
artists carry labels that tests can inspect; the matching ``*_table`` function returns the numbers the chart
draws as a pandas DataFrame (the chart is drawn from that table, so the two cannot disagree).
:func:`save_chart` writes ``stem.png``, ``stem.svg`` and the twin ``stem.csv``, each atomically.
matplotlib is imported inside the functions only.

1. :func:`breakdown_chart`   stacked bars of the step-time breakdown of the top plans
2. :func:`tp_sweep_chart`    step-time components and memory per GPU against tp, node boundary marked
3. :func:`time_memory_chart` step time vs. memory per GPU of all fitting plans, coloured by tp and by pp,
                             Pareto front highlighted
4. :func:`scaling_chart`     throughput and MFU against the number of GPUs, below and above ``--gpus``
5. :func:`bandwidth_heatmap` step time of the best plan per tp x inter-node bandwidth, as the slowdown
                             against the best cell, each cell labelled with its plan

Where the estimator gives an error band (``step_time_s_low``/``_high``, ``tokens_per_s_low``/``_high``;
docs/SCHEMAS.md section 6), the charts draw it as error bars and the twins carry it as columns.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from ..plan import ORDERS, RECOMPUTE
from ..search import SearchResult
from .analysis import BandwidthGrid, ContextSweep, Sweep

COMPONENTS = (("compute_s", "compute"), ("recompute_s", "recompute"), ("bubble_s", "pipeline bubble"),
              ("optimizer_s", "optimizer"), ("exposed_comm_s", "exposed communication"),
              ("overhead_s", "host overhead"))
"""the step-time components, in stacking order (they sum to the step time; a column the estimator does not
give, or that is zero for every plan drawn, is left out)."""
COLORS = {"compute_s": "#4C72B0", "recompute_s": "#8172B2", "bubble_s": "#CCB974", "optimizer_s": "#64B5CD",
          "exposed_comm_s": "#C44E52", "overhead_s": "#937860"}
MAX_SCATTER = 12000
"""time-memory scatter: at most this many points are drawn (evenly sampled; the front is always drawn)."""
ERROR_BAR = {"fmt": "none", "ecolor": "black", "elinewidth": 1.0, "capsize": 3, "label": "error band"}


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


# ---------------------------------------------------------------------------------------------------------
# writing
def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` in one step (tpsim.io): an interrupted run leaves the old file or the new one."""
    from ..io import atomic_write_bytes

    atomic_write_bytes(path, data, "chart")


def save_figure(fig: Any, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` (150 dpi) and ``stem.svg`` atomically (rendered in memory first); returns both."""
    import matplotlib


    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=150)
    with matplotlib.rc_context({"svg.hashsalt": "tpsim"}):  # stable element ids: reruns give the same file
        fig.savefig(svg, format="svg", metadata={"Date": None})
    _atomic_write(paths[0], png.getvalue())
    _atomic_write(paths[1], svg.getvalue())
    return paths


def save_chart(fig: Any, table: Any, stem: str | Path) -> list[Path]:
    """Write the chart (``stem.png``, ``stem.svg``) and its text twin ``stem.csv`` (the DataFrame ``table``,
    numbers at full precision), each atomically; returns the three paths."""
    paths = save_figure(fig, stem)
    csv = Path(stem).with_suffix(".csv")
    _atomic_write(csv, table.to_csv(index=False, float_format="%.6g").encode())
    return paths + [csv]


# ---------------------------------------------------------------------------------------------------------
# helpers
def _components(columns: Any) -> list[tuple[str, str]]:
    """The step-time components present in ``columns`` (a mapping or DataFrame), zero-only optional ones out."""
    out = []
    for key, name in COMPONENTS:
        if key not in columns:
            continue
        if key == "overhead_s" and not np.any(np.asarray(columns[key])):
            continue
        out.append((key, name))
    return out


def _has_band(frame: Any, key: str) -> bool:
    return f"{key}_low" in frame and f"{key}_high" in frame and bool(np.isfinite(frame[f"{key}_low"]).any())


def _band(frame: Any, key: str) -> np.ndarray:
    """``[[value - low], [high - value]]`` for matplotlib's xerr/yerr (never negative)."""
    value = np.asarray(frame[key], dtype=float)
    return np.vstack([np.maximum(value - np.asarray(frame[f"{key}_low"], dtype=float), 0),
                      np.maximum(np.asarray(frame[f"{key}_high"], dtype=float) - value, 0)])


def _plan_columns(result: SearchResult, idx: np.ndarray) -> dict[str, Any]:
    c = result.columns
    out = {"plan": [result.label(int(i)) for i in idx], "gpus": c["gpus"][idx], "tp": c["tp"][idx],
           "pp": c["pp"][idx], "vpp": c["vpp"][idx], "dp": c["dp"][idx], "sp": c["sp"][idx].astype(bool),
           "recompute": [RECOMPUTE[int(r)] for r in c["recompute"][idx]], "zero": c["zero"][idx],
           "micro_batch": c["micro_batch"][idx], "overlap": c["overlap"][idx].astype(bool),
           "order": [ORDERS[int(o)] for o in c["order"][idx]]}
    for axis in ("cp", "ep"):
        if axis in c:
            out[axis] = c[axis][idx]
    return out


def _bands_of(columns: Any, idx: Any = slice(None)) -> dict[str, np.ndarray]:
    from .analysis import band_columns

    return {name: np.asarray(columns[name])[idx] for name in band_columns(columns)}


# ---------------------------------------------------------------------------------------------------------
# 1. breakdown
def breakdown_table(result: SearchResult, top: int = 10) -> Any:
    """The top plans (ranked rows, twins collapsed): plan fields, the step-time components, the step time and
    its band where present, and how many plans (twins) each row stands for."""
    import pandas as pd

    idx = result.ranking[:top]
    c = result.columns
    data: dict[str, Any] = {"rank": np.arange(1, idx.size + 1)}
    data.update(_plan_columns(result, idx))
    data["variants"] = [int(result.variants(int(i)).size) for i in idx]
    data.update({key: c[key][idx] for key, _ in _components(c)})
    data["step_time_s"] = c["step_time_s"][idx]
    data.update(_bands_of(c, idx))
    return pd.DataFrame(data)


def breakdown_chart(result: SearchResult, top: int = 10, title: str | None = None) -> Any:
    """Horizontal stacked bars: one bar per ranked plan (best on top), one segment per time component; the
    error band of the step time as a bar where the estimator gives one."""
    t = breakdown_table(result, top)
    labels = [f"#{r} {p}" for r, p in zip(t["rank"], t["plan"])]
    fig, ax = _figure(10, 1.4 + 0.42 * max(len(t), 1))
    y = np.arange(len(t))[::-1]
    left = np.zeros(len(t))
    components = _components(t)
    for key, name in components:
        values = t[key].to_numpy(dtype=float)
        ax.barh(y, values, left=left, color=COLORS[key], label=name, height=0.7)
        left += values
    right = left.copy()
    if _has_band(t, "step_time_s"):
        ax.errorbar(t["step_time_s"], y, xerr=_band(t, "step_time_s"), **ERROR_BAR)
        right = np.maximum(right, t["step_time_s_high"].to_numpy(dtype=float))
    for yi, total, end in zip(y, left, right):
        ax.text(end, yi, f" {total:.3g} s", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_xlim(0, (right.max() if right.size else 1) * 1.18)
    _title_and_legend(fig, [ax], title or f"Step-time breakdown of the top {len(t)} plans ({result.model.name})")
    return fig


def _title_and_legend(fig: Any, axes: list[Any], title: str, ncol: int = 4) -> None:
    """The title over the (first) axes and one legend of every series of ``axes`` at the bottom of the
    figure, outside the axes (constrained layout reserves room for both: neither covers the data)."""
    handles, labels = [], []
    for ax in axes:
        h, l = ax.get_legend_handles_labels()
        handles += h
        labels += l
    axes[0].set_title(title)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(ncol, max(len(labels), 1)), fontsize=8,
               frameon=False)


# ---------------------------------------------------------------------------------------------------------
# 2. tp sweep
def tp_sweep_table(sweep: Sweep) -> Any:
    """The best plan per tp: label, components, step time (and band), TP-communication total, memory, fits,
    and whether the TP group leaves one node."""
    import pandas as pd

    c = sweep.columns
    data: dict[str, Any] = {"tp": sweep.x.astype(int), "plan": list(sweep.labels)}
    data.update({key: c[key] for key, _ in _components(c)})
    data["step_time_s"] = c["step_time_s"]
    data.update(_bands_of(c))
    data.update({"tp_comm_s": c["tp_comm_s"], "peak_memory_gib": c["peak_memory_gib"],
                 "fits": c["fits_effective"].astype(bool), "crosses_nodes": sweep.x > sweep.gpus_per_node})
    return pd.DataFrame(data)


def tp_sweep_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Stacked step-time components of the best plan per tp (bars, left axis) and its memory per GPU (line,
    right axis); a dashed line marks where the TP group leaves one node (tp > GPUs per node)."""
    t = tp_sweep_table(sweep)
    fig, ax = _figure(9, 5.5)
    x = np.arange(len(t))
    bottom = np.zeros(len(t))
    for key, name in _components(t):
        values = t[key].to_numpy(dtype=float)
        ax.bar(x, values, bottom=bottom, color=COLORS[key], label=name, width=0.65)
        bottom += values
    top = bottom.copy()
    if _has_band(t, "step_time_s"):
        ax.errorbar(x, t["step_time_s"], yerr=_band(t, "step_time_s"), **ERROR_BAR)
        top = np.maximum(top, t["step_time_s_high"].to_numpy(dtype=float))
    for xi, fits in zip(x, t["fits"]):
        if not fits:
            ax.text(xi, top[xi], "does not fit", ha="center", va="bottom", fontsize=7, color="#C44E52")
    ax.set_xticks(x, [str(v) for v in t["tp"]])
    ax.set_xlabel("tensor-parallel degree (best plan for each tp)")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(0, max(top.max(initial=0.0), 1e-9) * 1.25)
    mem = ax.twinx()
    mem.plot(x, t["peak_memory_gib"], "o-", color="black", label="memory per GPU")
    if np.isfinite(sweep.device_memory_gib):
        mem.axhline(sweep.device_memory_gib, color="gray", ls=":", lw=1, label="usable device memory")
    mem.set_ylabel("peak memory per GPU (GiB)")
    mem.set_ylim(0, max(np.nanmax(t["peak_memory_gib"], initial=0.0), np.nan_to_num(sweep.device_memory_gib)) * 1.15)
    inside = t["crosses_nodes"].to_numpy() == False  # noqa: E712 (numpy array)
    if inside.any() and (~inside).any():
        boundary = float(np.flatnonzero(inside)[-1]) + 0.5
        ax.axvline(boundary, color="#C44E52", ls="--", lw=1.5, label="TP crosses the node boundary")
        ax.text(boundary, ax.get_ylim()[1] * 0.97, f" tp > {sweep.gpus_per_node} GPUs/node:\n TP over the network",
                va="top", fontsize=8, color="#C44E52")
    _title_and_legend(fig, [ax, mem], title or "Tensor-parallel degree sweep")
    return fig


# ---------------------------------------------------------------------------------------------------------
# 3. time vs. memory
def _drawn_rows(result: SearchResult) -> tuple[np.ndarray, int]:
    """(rows drawn in the scatter, number of fitting ranked plans): every fitting ranked plan, evenly sampled
    down to :data:`MAX_SCATTER`, plus the Pareto front."""
    c = result.columns
    fit = np.sort(result.ranking[c["fits_effective"][result.ranking]])  # ranked (twins collapsed) and fitting
    shown = fit.size
    if fit.size > MAX_SCATTER:
        fit = fit[np.linspace(0, fit.size - 1, MAX_SCATTER).astype(int)]
    return fit, shown


def time_memory_table(result: SearchResult) -> Any:
    """Every point of the scatter: memory, step time (and band), tp, pp, the plan, and whether it is on the
    Pareto front (front rows are always included, even when the scatter is sampled)."""
    import pandas as pd

    c = result.columns
    rows, _ = _drawn_rows(result)
    front = result.pareto_time_memory()
    rows = np.union1d(rows, front)
    data = {"peak_memory_gib": c["peak_memory_gib"][rows], "step_time_s": c["step_time_s"][rows]}
    data.update(_bands_of(c, rows))
    data.update({"tp": c["tp"][rows], "pp": c["pp"][rows], "plan": [result.label(int(i)) for i in rows],
                 "pareto_front": np.isin(rows, front)})
    return pd.DataFrame(data).sort_values(["peak_memory_gib", "step_time_s"], kind="stable").reset_index(drop=True)


def ep_sweep_table(sweep: Sweep) -> Any:
    """Text twin of :func:`ep_sweep_chart`: the best plan per ep, its components, step time (and band),
    expert all-to-all total, memory and whether it fits."""
    import pandas as pd

    c = sweep.columns
    data: dict[str, Any] = {"ep": sweep.x.astype(int), "plan": list(sweep.labels)}
    data.update({key: c[key] for key, _ in _components(c)})
    data["step_time_s"] = c["step_time_s"]
    data.update(_bands_of(c))
    data.update({"ep_comm_s": c["ep_comm_s"], "peak_memory_gib": c["peak_memory_gib"],
                 "fits": c["fits_effective"].astype(bool)})
    return pd.DataFrame(data)


def context_sweep_table(sweep: ContextSweep) -> Any:
    """Text twin of :func:`context_sweep_chart`: per sequence length, throughput and plan of the best cp = 1
    and best cp > 1 plans (NaN where none fits) and whether context parallelism pays."""
    import pandas as pd

    a, b = sweep.without_cp, sweep.with_cp
    return pd.DataFrame({"seq_len": sweep.seq_len, "tokens_per_s_cp1": a["tokens_per_s"],
                         "plan_cp1": list(sweep.labels_without), "tokens_per_s_cp": b["tokens_per_s"],
                         "cp": b["cp"], "plan_cp": list(sweep.labels_with), "cp_pays": sweep.pays()})


def ep_sweep_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Stacked step-time components of the best plan per expert-parallel degree (bars, left axis), its exposed
    share of expert-parallel communication (ep_comm_s, hatched outline) and memory per GPU (line, right axis);
    a dashed line marks where the expert group (ep x etp ranks) leaves one node, so the dispatch and combine
    all-to-alls cross the network."""
    fig, ax = _figure(9, 5)
    x = np.arange(len(sweep))
    c = sweep.columns
    bottom = np.zeros(len(sweep))
    for key, name in _components(c):
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


def _si(value: float) -> str:
    """500000 -> 500k, 12000000 -> 12M (tick labels)."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _log_axis(axis: Any, fmt: Any = "{:g}".format) -> None:
    """Log scale with plain-number tick labels (20, 50, 100 rather than 2 x 10^1)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis.axis_name == "y":
        axis.axes.set_yscale("log")
    else:
        axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_formatter(NullFormatter())


def time_memory_chart(result: SearchResult, title: str | None = None) -> Any:
    """Two panels of step time vs. peak memory per GPU over all fitting plans, coloured by tp (left) and by
    pp (right); the Pareto front (fastest plan for each memory budget) is the black staircase, with the error
    band of its plans where the estimator gives one."""
    t = time_memory_table(result)
    _, shown = _drawn_rows(result)
    front = t[t["pareto_front"]]
    fig, (left, right) = _figure(12, 5.2, ncols=2)
    for ax, key in ((left, "tp"), (right, "pp")):
        _categorical(ax, t["peak_memory_gib"].to_numpy(), t["step_time_s"].to_numpy(), t[key].to_numpy(), key)
        ax.step(front["peak_memory_gib"], front["step_time_s"], where="post", color="black", lw=1.5,
                label="Pareto front")
        ax.plot(front["peak_memory_gib"], front["step_time_s"], "o", color="black", ms=3)
        if _has_band(front, "step_time_s"):
            ax.errorbar(front["peak_memory_gib"], front["step_time_s"], yerr=_band(front, "step_time_s"),
                        **ERROR_BAR)
        ax.set_xlabel("peak memory per GPU (GiB)")
        ax.set_ylabel("step time (s)")
        _log_axis(ax.yaxis)
        ax.set_title(f"coloured by {key}")
        ax.legend(fontsize=7, markerscale=2, ncol=2, loc="upper right")
    sample = f", {len(t)} drawn" if len(t) < shown else ""
    fig.suptitle(title or f"Step time vs. memory of {shown} fitting plans{sample} ({result.model.name})")
    return fig


# ---------------------------------------------------------------------------------------------------------
# 4. scaling
def scaling_table(sweep: Sweep) -> Any:
    """The fastest fitting plan per GPU count: label, tokens/s (and band), the linear-scaling reference of
    the most efficient count, MFU, step time, $ per million tokens (at that count the fastest plan is the
    cheapest), and whether the count is the one asked about (``--gpus``)."""
    import pandas as pd

    c = sweep.columns
    gpus = sweep.x.astype(float)
    ideal = np.full(gpus.size, np.nan)
    if gpus.size:
        best = int(np.argmax(c["tokens_per_s"] / gpus))
        ideal = c["tokens_per_s"][best] * gpus / gpus[best]
    data: dict[str, Any] = {"gpus": sweep.x.astype(int), "plan": [_without_gpus(l) for l in sweep.labels],
                            "tokens_per_s": c["tokens_per_s"]}
    data.update({k: v for k, v in _bands_of(c).items() if k.startswith("tokens_per_s")})
    data.update({"tokens_per_s_linear": ideal, "mfu": c["mfu"]})
    data.update({k: v for k, v in _bands_of(c).items() if k.startswith("mfu")})
    data.update({"step_time_s": c["step_time_s"], "cost_per_mtok": c["cost_per_mtok"],
                 "asked": sweep.x.astype(int) == (sweep.reference or -1)})
    return pd.DataFrame(data)


def _two_lines(label: str) -> str:
    words = label.split()
    half = (len(words) + 1) // 2
    return " ".join(words[:half]) + ("\n" + " ".join(words[half:]) if words[half:] else "")


def _without_gpus(label: str) -> str:
    head, _, rest = label.partition(" ")
    return rest if head.endswith("g") and head[:-1].isdigit() else label


def scaling_chart(sweep: Sweep, title: str | None = None) -> Any:
    """Throughput (tokens/s, left axis, log-log) and MFU (right axis) of the best plan per GPU count, from
    below to above the count asked about (marked), with the ideal linear scaling of the most efficient count
    (highest tokens/s per GPU) for reference and the error band of the throughput where given."""
    from matplotlib.ticker import NullLocator

    t = scaling_table(sweep)
    fig, ax = _figure(10, 5.5)
    gpus = t["gpus"].to_numpy(dtype=float)
    ax.plot(gpus, t["tokens_per_s"], "o-", color="#4C72B0", label="throughput (tokens/s)")
    if _has_band(t, "tokens_per_s"):
        ax.errorbar(gpus, t["tokens_per_s"], yerr=_band(t, "tokens_per_s"), **ERROR_BAR)
    if gpus.size:
        best = int(np.argmax(t["tokens_per_s"].to_numpy() / gpus))
        ax.plot(gpus, t["tokens_per_s_linear"], ":", color="#4C72B0", alpha=0.6,
                label=f"linear scaling of the best per-GPU count ({int(gpus[best])})")
    if sweep.reference is not None:
        ax.axvline(sweep.reference, color="gray", ls="--", lw=1, label=f"--gpus {sweep.reference}")
    ax.set_xscale("log", base=2)
    _log_axis(ax.yaxis, _si)
    ax.set_xticks(gpus, [str(int(g)) for g in gpus])
    ax.xaxis.set_minor_locator(NullLocator())
    missing = sorted(set(sweep.searched) - {int(g) for g in gpus})
    ax.set_xlabel("number of GPUs (best plan at each count"
                  + (f"; no plan fits at {', '.join(map(str, missing))}" if missing else "") + ")")
    ax.set_ylabel("throughput (tokens/s)")
    if gpus.size:  # room for the plan labels above and below the points
        ax.set_xlim(gpus.min() / 1.5, gpus.max() * 1.5)
        tokens = np.concatenate([t["tokens_per_s"].to_numpy(), t["tokens_per_s_linear"].to_numpy()])
        ax.set_ylim(np.nanmin(tokens) / 1.8, np.nanmax(tokens) * 1.8)
    mfu = ax.twinx()
    mfu.plot(gpus, t["mfu"] * 100, "s--", color="#C44E52", label="MFU (%)")
    mfu.set_ylabel("MFU (%)")
    mfu.set_ylim(0, max(100 * np.nanmax(t["mfu"], initial=0.0) * 1.3, 1))
    for k, (g, tok, label) in enumerate(zip(gpus, t["tokens_per_s"], t["plan"])):
        # alternate above/below so neighbouring labels do not overlap; anchored to stay inside the axes
        above = k % 2 == 0
        ax.annotate(_two_lines(label), (g, tok), textcoords="offset points",
                    xytext=(0, 8 if above else -10), ha="center", va="bottom" if above else "top", fontsize=6)
    _title_and_legend(fig, [ax, mfu], title or "Scaling: throughput and MFU against the number of GPUs", ncol=3)
    return fig


# ---------------------------------------------------------------------------------------------------------
# 5. bandwidth heat map
def bandwidth_table(grid: BandwidthGrid) -> Any:
    """One row per (tp, bandwidth) cell: the best plan's label, step time (and band), slowdown against the
    best cell, whether it fits, and its TP-communication share."""
    import pandas as pd

    tp, scale = np.meshgrid(grid.tp, grid.scales, indexing="ij")
    data: dict[str, Any] = {"tp": tp.ravel().astype(int), "bandwidth_scale": scale.ravel(),
                            "bandwidth_GBps": np.broadcast_to(grid.bandwidth_GBps, tp.shape).ravel(),
                            "plan": [label for row in grid.labels for label in row],
                            "step_time_s": grid.step_time_s.ravel()}
    data.update({name: band.ravel() for name, band in grid.bands.items()})
    data.update({"slowdown": grid.slowdown.ravel(), "fits": grid.fits.ravel(), "tp_share": grid.tp_share.ravel()})
    return pd.DataFrame(data)


def _cell_label(label: str) -> str:
    """A plan label without its tp (the row says it), on two lines: layout, then the rest."""
    words = [w for w in _without_gpus(label).split() if not (w.startswith("tp") and w[2:].isdigit())]
    layout = [w for w in words if w[:2] in ("pp", "dp", "cp", "ep") or (w[:1] == "v" and w[1:].isdigit())]
    rest = [w for w in words if w not in layout]
    return " ".join(layout) + ("\n" + " ".join(rest) if rest else "")


def bandwidth_heatmap(grid: BandwidthGrid, title: str | None = None) -> Any:
    """Step time of the best plan per (tp, inter-node bandwidth), coloured by the slowdown against the best
    (fastest fitting) cell; each cell gives the slowdown, the step time (with its band where given) and the
    plan. With more bandwidth a cell can only get faster, so each row fades left to right."""
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import NullLocator

    t = bandwidth_table(grid)
    slow = t["slowdown"].to_numpy().reshape(grid.step_time_s.shape)
    low_band = "step_time_s_low" in t and "step_time_s_high" in t
    fig, ax = _figure(max(8.0, 1.6 + 1.55 * grid.scales.size), 1.6 + (0.8 if low_band else 0.68) * max(grid.tp.size, 1))
    top = float(np.nanmax(slow, initial=1.0))
    norm = LogNorm(vmin=1.0, vmax=top) if top > 1.0 + 1e-9 else Normalize(vmin=0.5, vmax=1.5)
    image = ax.imshow(slow, aspect="auto", cmap="YlOrRd", origin="lower", norm=norm)
    best = grid.best_cell
    cmap = image.get_cmap()
    for i in range(grid.tp.size):
        for j in range(grid.scales.size):
            if not np.isfinite(slow[i, j]):
                continue
            k = i * grid.scales.size + j
            step = f"{grid.step_time_s[i, j]:.2f} s"
            if low_band:
                step += f"\n({t['step_time_s_low'][k]:.2f}-{t['step_time_s_high'][k]:.2f})"
            mark = "" if grid.fits[i, j] else "*"
            text = f"{slow[i, j]:.2f}x{mark}\n{step}\n{_cell_label(grid.labels[i][j])}"
            r, g, b, _ = cmap(norm(slow[i, j]))
            ax.text(j, i, text, ha="center", va="center", fontsize=6.5, linespacing=1.1,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
    if best is not None:
        ax.add_patch(Rectangle((best[1] - 0.5, best[0] - 0.5), 1, 1, fill=False, ec="#1f77b4", lw=2.5,
                               label="best cell"))
    ax.set_xticks(np.arange(grid.scales.size),
                  [f"{b:g} GB/s\n({s:g}x)" for b, s in zip(grid.bandwidth_GBps, grid.scales)], fontsize=8)
    ax.set_yticks(np.arange(grid.tp.size), [str(int(v)) for v in grid.tp])
    ax.set_xlabel("inter-node bandwidth per GPU (per direction; multiple of the cluster's)")
    ax.set_ylabel("tensor-parallel degree")
    inside = grid.tp <= grid.gpus_per_node
    if inside.any() and (~inside).any():
        ax.axhline(float(np.flatnonzero(inside)[-1]) + 0.5, color="#1f77b4", ls="--", lw=1.5)
    bar = fig.colorbar(image, ax=ax, label="step time / the best cell's")
    ticks = [v for v in (1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000) if v <= top] or [1]
    bar.set_ticks(ticks, labels=[f"{v:g}x" for v in ticks])
    bar.ax.yaxis.set_minor_locator(NullLocator())
    ax.set_title(title or "Step time of the best plan per cell (slowdown vs. the best cell; * = does not fit)")
    return fig


__all__ = ["breakdown_chart", "tp_sweep_chart", "time_memory_chart", "scaling_chart", "bandwidth_heatmap",
           "breakdown_table", "tp_sweep_table", "time_memory_table", "scaling_table", "bandwidth_table",
           "save_figure", "save_chart", "COMPONENTS"]
