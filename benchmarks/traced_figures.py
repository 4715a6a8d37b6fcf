"""Traced estimates (step, terms, memory) of the shipped op graphs over a plan grid, and their diff between two
checkouts (what a change to the traced path moves).

    PYTHONPATH=<checkout> python benchmarks/traced_figures.py snap OUT.json <checkout>
    python benchmarks/traced_figures.py diff BEFORE.json AFTER.json     # largest relative move per graph, field
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path


def snap(out: str, root: str) -> None:
    from tpsim.opgraph.estimate import estimate_graph
    from tpsim.opgraph.model import graph_violation, load_graph_model
    from tpsim.plan import Plan
    from tpsim.topology import load_cluster

    base = Path(root)
    graphs = sorted((base / "tests/data/opgraph").glob("*.ops.json")) + sorted(
        (base / "reports").glob("traced-*/model.ops.json"))
    rows = {}
    for path in graphs:
        name = path.parent.name if path.name == "model.ops.json" else path.stem
        cluster = load_cluster("dgx-h100" if "unet-8x" in name else "dgx-a100", gpus=8)
        model = load_graph_model(path).with_gpus(8)
        for tp, pp, vpp, zero, rc, mb, sp in itertools.product((1, 2), (1, 2, 4), (1, 2), (0, 1, 3),
                                                               ("none", "selective", "full"), (1, 4), (False, True)):
            plan = Plan(tp=tp, pp=pp, vpp=vpp, dp=8 // (tp * pp), zero=zero, recompute=rc, micro_batch=mb, sp=sp,
                        global_batch=64)
            if graph_violation(model, plan, 8):
                continue
            e = estimate_graph(model, cluster, plan)
            rows[f"{name} {plan.short()}"] = {"step": e.step_time_s, "peak": e.peak_memory_gib,
                                              **{f"b.{k}": v for k, v in e.breakdown.items()},
                                              **{f"m.{k}": v for k, v in e.memory_gib.items()}}
    Path(out).write_text(json.dumps(rows, indent=0))
    print(len(rows), "plans")


def diff(before: str, after: str) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    worst: dict = {}
    for key, fields in a.items():
        for f, v in fields.items():
            w = b.get(key, {}).get(f, float("nan"))
            rel = 0.0 if v == w else abs(w - v) / max(abs(v), 1e-12)
            g = key.split()[0]
            if rel > worst.get((g, f), (0.0,))[0]:
                worst[(g, f)] = (rel, key, v, w)
    for (g, f), (rel, key, v, w) in sorted(worst.items()):
        if rel > 1e-9:
            print(f"{g:28s} {f:24s} max rel {rel:.2e}  ({key}: {v:.6g} -> {w:.6g})")
    print(f"{len(a)} plans before, {len(b)} after")


if __name__ == "__main__":
    {"snap": snap, "diff": diff}[sys.argv[1]](*sys.argv[2:4])
