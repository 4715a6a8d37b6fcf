"""The example design sweeps committed under ``reports/design-*/``; regenerate them with::

    python -m tpsim.design.examples [NAME ...]

Each is ``tpsim design tpsim/data/design/<sweep>.yaml --out reports/<NAME>/ --force`` run from scratch (the
folder's results are removed first), plus the folder's README.md written from the table: every number in them
comes from running the sweep.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..hardware import DATA_DIR

EXAMPLES = {"design-llama70b-network": "llama70b-network.yaml", "design-tradeoff": "tradeoff.yaml"}
ROOT = Path(__file__).resolve().parents[2]


def _fmt(v, spec: str) -> str:
    return "-" if v is None or v == "" else format(float(v), spec)


def readme(name: str, sweep, result, seconds: float, jobs: int, load: float) -> str:
    rows = result.rows
    fits = [r for r in rows if r["fits"]]
    lines = [f"# {name}", "",
             f"`tpsim design tpsim/data/design/{EXAMPLES[name]} --out reports/{name}/` "
             f"(regenerate: `python -m tpsim.design.examples {name}`; docs/DESIGN.md).", "",
             f"{len(rows)} designs ({len(fits)} with a plan that fits; {result.tasks} planning tasks, "
             f"{result.plans:,} plans evaluated, {seconds:.0f} s with {jobs} workers on the 2-core reference "
             f"machine at load average {load:.1f}, shared with other jobs), model(s) {', '.join(m.name for m in sweep.models)}, stack {sweep.stack}, dtype "
             f"{sweep.dtype}, ordered by {sweep.objective}.", "",
             "Files: `table.csv` / `table.parquet` (every design), `frontier.csv` (cost vs expected time), "
             "charts `tradeoff.png`, `value.png`, `cost_time.png`, `multiples.png` (each with its `.csv`).", "",
             "## Best designs", "",
             "| design | device | NVLink | fabric | NIC | GPUs | $/GPU-h | best plan | tokens/s | MFU | exposed comm "
             "| memory headroom | expected days | cost M$ |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fits[:12]:
        lines.append(f"| {r['design']} | {r['device']} | {r['nvlink_domain']} | {r['fabric']} o{r['oversubscription']:g} "
                     f"| {r['nic_gbps']}G x{r['nics_per_gpu']} | {r['gpus']} | {r['gpu_hour_price']:g} | {r['plan']} "
                     f"| {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r['comm_share']:.1%} | "
                     f"{r['memory_headroom']:.1%} | {_fmt(r['expected_days'], '.1f')} | "
                     f"{_fmt(None if r['cost_usd'] is None else r['cost_usd'] / 1e6, '.2f')} |")
    front = [r for r in fits if r["frontier"]]
    lines += ["", "## Frontier (cost vs expected time)", "",
              "| design | device | NVLink | NIC | GPUs | $/GPU-h | expected days | cost M$ |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(front, key=lambda r: r["cost_usd"]):
        lines.append(f"| {r['design']} | {r['device']} | {r['nvlink_domain']} | {r['nic_gbps']}G | {r['gpus']} | "
                     f"{r['gpu_hour_price']:g} | {_fmt(r['expected_days'], '.1f')} | {r['cost_usd'] / 1e6:.2f} |")
    fam = [r for r in rows if r.get("largest_params_b") is not None]
    if fam:
        lines += ["", f"## Largest trainable model of the family ({sweep.family.ref} x scale)", "",
                  "| design | device | NVLink | NIC | GPUs | scale | B parameters | exposed comm of its best plan |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(fam, key=lambda r: -r["largest_params_b"]):
            lines.append(f"| {r['design']} | {r['device']} | {r['nvlink_domain']} | {r['nic_gbps']}G | {r['gpus']} | "
                         f"{r['largest_scale']:g} | {r['largest_params_b']:.0f} | {r['largest_comm_share']:.1%} |")
    if len(fits) >= 2:
        lines += ["", "## Explain the best two", "", "```",
                  f"$ tpsim design --out reports/{name} --explain {fits[0]['design']} {fits[1]['design']}"]
        from .explain import explain
        lines += [explain(ROOT / "reports" / name, fits[0]["design"], fits[1]["design"]), "```"]
    return "\n".join(lines) + "\n"


def main(names: list[str]) -> int:
    from ..io import atomic_write_text
    from . import run_sweep
    from .engine import MANIFEST, RESULTS
    from .sweep import load_sweep

    jobs = os.cpu_count() or 1
    for name in names or list(EXAMPLES):
        if name not in EXAMPLES:
            print(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})", file=sys.stderr)
            return 2
        out = ROOT / "reports" / name
        for f in (RESULTS, MANIFEST):
            (out / f).unlink(missing_ok=True)
        sweep = load_sweep(DATA_DIR / "design" / EXAMPLES[name])
        t0 = time.perf_counter()
        result = run_sweep(sweep, out, jobs=jobs, force=True)
        seconds = time.perf_counter() - t0
        atomic_write_text(out / "README.md", readme(name, sweep, result, seconds, jobs, os.getloadavg()[0]),
                          "README")
        print(f"{name}: {len(result.rows)} designs in {seconds:.0f} s -> reports/{name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
