"""Charts of a design sweep (matplotlib imported inside the functions only; figures built without pyplot):

1. :func:`tradeoff_chart`   the largest trainable model of the family (billions of parameters) against the
                            communication share of its best plan, one point per design (the seed's trade-off)
2. :func:`value_chart`      throughput per dollar (tokens/s per $/GPU-hour x GPUs) against the network
                            bandwidth per GPU (the network's cost driver)
3. :func:`frontier_chart`   (cost_time.png) cost against time to train for every fitting design, frontier highlighted
4. :func:`multiples_chart`  small multiples: tokens/s against GPUs, one panel per device x fabric, one line per
                            NVLink domain x NIC speed

Each chart is written as ``<stem>.png`` and its numbers as ``<stem>.csv`` (the rows it draws).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..io import atomic_write_bytes, atomic_write_text


def _figure(width: float, height: float, nrows: int = 1, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _label(r: Mapping[str, Any]) -> str:
    return f"{r['device']} NVL{r['nvlink_domain']} {r['fabric']} {r['nic_gbps']}G x{r['nics_per_gpu']}"


def _fits(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["fits"]]


def tradeoff_chart(rows: Sequence[Mapping[str, Any]]):
    pts = [r for r in rows if r.get("largest_params_b") is not None]
    fig, ax = _figure(7.5, 5)
    ax = ax[0][0]
    devices = sorted({r["device"] for r in pts})
    for dev in devices:
        sel = [r for r in pts if r["device"] == dev]
        ax.scatter([100 * r["largest_comm_share"] for r in sel], [r["largest_params_b"] for r in sel], label=dev,
                   alpha=0.8)
    ax.set_xlabel("exposed communication share of the step (best plan of the largest model), %")
    ax.set_ylabel("largest trainable model of the family, B parameters")
    ax.set_title("trainable size vs communication overhead" + ("" if pts else " (no family in the sweep)"))
    if pts:
        ax.legend(fontsize=8)
    return fig, pts


def value_chart(rows: Sequence[Mapping[str, Any]]):
    pts = [r for r in _fits(rows) if r.get("network_gbps_per_gpu") is not None
           and r.get("tokens_per_s_per_usd_hour") is not None]
    fig, ax = _figure(7.5, 5)
    ax = ax[0][0]
    for dev in sorted({r["device"] for r in pts}):
        sel = [r for r in pts if r["device"] == dev]
        ax.scatter([r["network_gbps_per_gpu"] for r in sel], [r["tokens_per_s_per_usd_hour"] for r in sel],
                   label=dev, alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("network bandwidth per GPU, Gb/s (NICs per GPU x NIC speed)")
    ax.set_ylabel("tokens/s per $/h")
    ax.set_title("throughput per dollar vs network")
    if pts:
        ax.legend(fontsize=8)
    return fig, pts


def frontier_chart(rows: Sequence[Mapping[str, Any]]):
    pts = [r for r in _fits(rows) if r["expected_days"] is not None and r["cost_usd"] is not None]
    fig, ax = _figure(7.5, 5)
    ax = ax[0][0]
    for model in sorted({r["model"] for r in pts}):
        sel = [r for r in pts if r["model"] == model]
        ax.scatter([r["expected_days"] for r in sel], [r["cost_usd"] / 1e6 for r in sel], alpha=0.35, s=12,
                   label=f"{model}")
        front = sorted((r for r in sel if r["frontier"]), key=lambda r: r["expected_days"])
        ax.plot([r["expected_days"] for r in front], [r["cost_usd"] / 1e6 for r in front], marker="o",
                label=f"{model} frontier")
    ax.set_xscale("log")
    ax.set_xlabel("expected time to train the token budget, days (tpsim train-time model)")
    ax.set_ylabel("cost, M$ (GPU-hours of the expected time x price)")
    ax.set_title("cost vs time: the design frontier")
    if pts:
        ax.legend(fontsize=8)
    return fig, pts


def multiples_chart(rows: Sequence[Mapping[str, Any]]):
    pts = _fits(rows)
    panels = sorted({(r["device"], r["fabric"]) for r in pts}) or [("", "")]
    ncols = min(3, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = _figure(4.2 * ncols, 3.2 * nrows, nrows, ncols)
    for i, (dev, fab) in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        sel = [r for r in pts if (r["device"], r["fabric"]) == (dev, fab)]
        for line in sorted({(r["nvlink_domain"], r["nic_gbps"], r["nics_per_gpu"]) for r in sel}):
            pick = sorted((r for r in sel if (r["nvlink_domain"], r["nic_gbps"], r["nics_per_gpu"]) == line),
                          key=lambda r: r["gpus"])
            best: dict[int, float] = {}
            for r in pick:
                best[r["gpus"]] = max(best.get(r["gpus"], 0.0), r["tokens_per_s"])
            ax.plot(list(best), list(best.values()), marker="o", label=f"NVL{line[0]} {line[1]}G x{line[2]}")
        ax.set_title(f"{dev} {fab}", fontsize=9)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens/s")
        ax.set_xscale("log", base=2)
        if sel:
            ax.legend(fontsize=7)
    for j in range(len(panels), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    return fig, pts


CHARTS = {"tradeoff": tradeoff_chart, "value": value_chart, "cost_time": frontier_chart,
          "multiples": multiples_chart}


def save_charts(rows: Sequence[Mapping[str, Any]], folder: Path, columns: Sequence[str]) -> list[Path]:
    """Write every chart (png) and the rows it draws (csv) under ``folder``."""
    import csv

    written = []
    for stem, make in CHARTS.items():
        fig, pts = make(rows)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
        atomic_write_bytes(folder / f"{stem}.png", buf.getvalue(), "chart")
        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in pts:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in columns})
        atomic_write_text(folder / f"{stem}.csv", text.getvalue(), "chart data")
        written += [folder / f"{stem}.png", folder / f"{stem}.csv"]
    return written
