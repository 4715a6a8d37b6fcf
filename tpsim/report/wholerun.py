"""The whole-run charts of ``tpsim report --tokens N`` (issue 23), each with its CSV twin:

1. ``goodput_scaling``: goodput and expected days of the plan that finishes first at each GPU count (where
   adding GPUs stops paying);
2. ``cost_time_frontier``: whole-run cost against expected days of every fitting plan over the GPU counts,
   the Pareto front marked (no plan is both cheaper and sooner than a plan on it);
3. ``lost_time``: the days lost to failures (redone work), checkpoints, restarts and stragglers by the plan of
   chart 1 at each GPU count.

Input: the scaling study's search run with ``tokens`` (its whole-run columns, tpsim.train.plan_columns); the
lost-time split is :meth:`SearchResult.train_time` of each count's plan (the single-plan path).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..search import SearchResult
from ..search.pareto import pareto_front
from ..train import LOST_KEYS

CHARTS = ("goodput_scaling", "cost_time_frontier", "lost_time")
COLORS = {"failures": "#C44E52", "checkpoints": "#4C72B0", "restarts": "#DD8452", "stragglers": "#8172B3"}


def best_per_count(result: SearchResult) -> list[int]:
    """Row of the fitting plan with the fewest expected days at each GPU count (ascending counts)."""
    c = result.columns
    rows = []
    for g in np.unique(c["gpus"]):
        ok = np.flatnonzero((c["gpus"] == g) & c["fits_effective"] & np.isfinite(c["expected_days"]))
        if ok.size:
            rows.append(int(ok[np.argmin(c["expected_days"][ok])]))
    return rows


def goodput_table(result: SearchResult) -> Any:
    import pandas as pd

    c, rows = result.columns, best_per_count(result)
    return pd.DataFrame({"gpus": c["gpus"][rows].astype(int), "plan": [result.label(i) for i in rows],
                         "expected_days": c["expected_days"][rows], "goodput": c["goodput"][rows],
                         "interruptions": c["interruptions"][rows], "cost_usd": c["cost_usd"][rows],
                         "energy_mwh": c["energy_mwh"][rows]})


def frontier_table(result: SearchResult) -> Any:
    import pandas as pd

    c = result.columns
    fit = np.flatnonzero(c["fits_effective"] & np.isfinite(c["expected_days"]))
    front = set(fit[pareto_front(c["expected_days"][fit], c["cost_usd"][fit])].tolist())
    return pd.DataFrame({"gpus": c["gpus"][fit].astype(int), "plan": [result.label(int(i)) for i in fit],
                         "expected_days": c["expected_days"][fit], "cost_usd": c["cost_usd"][fit],
                         "pareto_front": [int(i) in front for i in fit]})


def lost_table(result: SearchResult) -> Any:
    import pandas as pd

    rows = best_per_count(result)
    runs = [result.train_time(i) for i in rows]
    data: dict[str, Any] = {"gpus": result.columns["gpus"][rows].astype(int),
                            "plan": [result.label(i) for i in rows],
                            "ideal_days": [r["ideal_days"] for r in runs]}
    data.update({f"lost_{k}_days": [r["lost"][k] for r in runs] for k in LOST_KEYS})
    data["expected_days"] = [r["expected_days"] for r in runs]
    return pd.DataFrame(data)


def _figure(width: float, height: float) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, 1)


def goodput_chart(table: Any, title: str) -> Any:
    fig, ax = _figure(9, 5)
    g = table["gpus"].to_numpy(dtype=float)
    ax.plot(g, 100 * table["goodput"], "o-", color="#55A868", label="goodput (%)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(g, [str(int(x)) for x in g])
    ax.set_xlabel("number of GPUs (the plan that finishes first at each count)")
    ax.set_ylabel("goodput: ideal / expected time (%)")
    days = ax.twinx()
    days.plot(g, table["expected_days"], "s--", color="#4C72B0", label="expected days")
    days.set_yscale("log")
    days.set_ylabel("expected days to train")
    lines = ax.get_legend_handles_labels()[0] + days.get_legend_handles_labels()[0]
    fig.legend(lines, [h.get_label() for h in lines], loc="outside lower center", ncol=2, fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def frontier_chart(table: Any, title: str) -> Any:
    fig, ax = _figure(9, 5.5)
    gpus = table["gpus"].to_numpy()
    for g in np.unique(gpus):
        sel = gpus == g
        ax.scatter(table["expected_days"][sel], table["cost_usd"][sel], s=8, alpha=0.5, label=f"{g} GPUs")
    front = table[table["pareto_front"]].sort_values("expected_days")
    ax.plot(front["expected_days"], front["cost_usd"], "k.-", lw=1.2, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("expected days to train")
    ax.set_ylabel("cost of the whole run ($)")
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    return fig


def lost_chart(table: Any, title: str) -> Any:
    fig, ax = _figure(9, 5)
    x = np.arange(len(table))
    bottom = np.zeros(len(table))
    for k in LOST_KEYS:
        v = table[f"lost_{k}_days"].to_numpy(dtype=float)
        ax.bar(x, v, bottom=bottom, color=COLORS[k], label=k)
        bottom += v
    ax.set_xticks(x, [str(g) for g in table["gpus"]])
    ax.set_xlabel("number of GPUs")
    ax.set_ylabel("days lost over the whole run")
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def figures(result: SearchResult, title: str) -> dict[str, tuple[Any, Any]]:
    """{chart name: (figure, CSV table)} of the three whole-run charts."""
    g, f, l = goodput_table(result), frontier_table(result), lost_table(result)
    return {"goodput_scaling": (goodput_chart(g, f"Goodput and time to train against cluster size ({title})"), g),
            "cost_time_frontier": (frontier_chart(f, f"Cost vs. time to train over GPU counts and plans "
                                                     f"({title})"), f),
            "lost_time": (lost_chart(l, f"Where the time goes: days lost per cause ({title})"), l)}


def section(result: SearchResult, tokens: float, price: float) -> str:
    """The report's whole-run section (Markdown)."""
    from .markdown import md_table

    g, l = goodput_table(result), lost_table(result)
    rows = [[int(r.gpus), r.plan.partition(" ")[2], f"{r.expected_days:.2f}", f"{100 * r.goodput:.1f}%",
             f"{r.interruptions:,.0f}", f"{r.cost_usd:,.0f}"] for r in g.itertuples()]
    lost = [[int(r["gpus"])] + [f"{r[f'lost_{k}_days']:.2f}" for k in LOST_KEYS] for _, r in l.iterrows()]
    rel = getattr(result.reliability, "name", "default")
    return "\n".join([
        "## Time to train, goodput and cost\n",
        f"The whole run of {tokens:.4g} tokens (fleet `{rel}`, tpsim/data/reliability.yaml; docs/MODEL.md, "
        f"\"Time to train\"): at each GPU count the plan that finishes first, its goodput (ideal / expected "
        f"time), interruptions and cost at ${price:g} per GPU-hour. Data: `goodput_scaling.csv`.\n",
        "![Goodput vs. cluster size](goodput_scaling.png)\n",
        md_table(("GPUs", "plan", "expected days", "goodput", "interruptions", "cost ($)"), rows, align="rlrrrr"),
        "", "Every fitting plan of every count, cost against days; the front (black) holds the plans that no "
        "other plan beats on both. Data: `cost_time_frontier.csv`.\n",
        "![Cost vs. time to train](cost_time_frontier.png)\n",
        "Days lost per cause by the same plans. Data: `lost_time.csv`.\n",
        "![Lost time](lost_time.png)\n",
        md_table(("GPUs",) + LOST_KEYS, lost, align="r" * 5), ""])
