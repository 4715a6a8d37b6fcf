"""Run-to-run spread across launches (issue 22): ``tpsim validate --repeat N`` launches the measured cases N
times (fresh ranks each time: new processes, new rendezvous, new allocations; the tiny twins, the collective
calibration and the profile probe once); each launch's compared figure is its median over the timed steps after
the warm-up (a whole plan's step, a layer's forward + backward for block and axis cases), and the spread is
``100 (max - min) / median`` of those medians. The report's other figures are the first launch's (torch-free)."""

from __future__ import annotations

import statistics
from typing import Any

COMPARED = ("step", "fwd+bwd")
"""the phase whose medians are compared, first found: a whole plan's step, else a layer's forward + backward."""


def compared_phase(summary: dict[str, Any]) -> tuple[str, float] | None:
    """(name, measured seconds) of the figure a launch is compared by; None when nothing was timed."""
    phases = {p["name"]: p for p in summary.get("phases") or []}
    for name in COMPARED:
        if name in phases and phases[name].get("measured_s") is not None:
            return name, float(phases[name]["measured_s"])
    return None


def launch_spread(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``repeats`` of one case from its summary per launch (the first is the report's own): the compared phase,
    each launch's median, their median, min, max and spread; None when a launch timed nothing."""
    figures = [compared_phase(s) for s in summaries]
    if not figures or any(f is None for f in figures):
        return None
    values = [f[1] for f in figures]
    med = statistics.median(values)
    return {"launches": len(values), "phase": figures[0][0], "medians_s": values, "median_s": med,
            "min_s": min(values), "max_s": max(values),
            "spread_pct": 100.0 * (max(values) - min(values)) / med if med > 0 else None}
