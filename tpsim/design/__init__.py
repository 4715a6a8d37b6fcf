"""``tpsim design``: sweep cluster designs (device, NVLink domain, NICs, fabric, oversubscription, GPU count,
price, power) x models x the whole plan space; one table of the best plan of every design, its frontier (cost
vs time) and charts. docs/DESIGN.md has the sweep file schema and the outputs.

``run_sweep(load_sweep(path), out)`` runs it; the engines are in :mod:`tpsim.design.engine`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .sweep import Sweep, load_sweep, planning_tasks, task_id

__all__ = ["Sweep", "SweepRun", "load_sweep", "run_sweep", "tasks_of"]


@dataclass
class SweepRun:
    rows: list[dict[str, Any]]
    tasks: int
    ran: int
    """tasks run by this call (the others were in the folder already)."""
    plans: int
    """plans evaluated by this call."""
    elapsed_s: float
    parquet: bool
    files: list[Path]


def tasks_of(sweep: Sweep, folder: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The planning tasks (JSON-able, as the workers take them) and the number of designs of each."""
    tasks, counts = [], {}
    for key, designs in planning_tasks(sweep).items():
        tid = task_id(key, sweep)
        m = sweep.models[key[-1]]
        values = {a: designs[0].values[a] for a in ("device", "nvlink_domain", "nics_per_gpu", "nic_gbps", "fabric",
                                                    "oversubscription", "gpus")}
        fam = sweep.family
        tasks.append({"id": tid, "values": values, "stack": sweep.stack, "dtype": sweep.dtype,
                      "folder": str(folder / "clusters"),
                      "model": {"ref": m.ref, "seq_len": m.seq_len, "global_batch": m.global_batch},
                      "family": None if fam is None or key[-1] != 0 else
                      {"ref": fam.ref, "scales": list(fam.scales), "global_batch": fam.global_batch}})
        counts[tid] = len(designs)
    return tasks, counts


def _manifest(sweep: Sweep) -> dict[str, Any]:
    ids = {key: task_id(key, sweep) for key in planning_tasks(sweep)}
    return {"sweep_sha": sweep.raw_sha, "name": sweep.name, "objective": sweep.objective, "stack": sweep.stack,
            "dtype": sweep.dtype, "path": None if sweep.path is None else str(sweep.path),
            "designs": {d.id: {"task": ids[d.planning_key()], "model": sweep.models[d.model].name,
                               "values": d.values} for d in sweep.designs}}


def prepare_folder(sweep: Sweep, out: str | Path, force: bool = False) -> Path:
    """The output folder, created; a folder of another sweep is refused (``force``: its results are removed)."""
    from ..io import atomic_write_text, check_output_dir, make_output_dir
    from .engine import MANIFEST, RESULTS

    folder = check_output_dir(out, "--out", force=True)
    make_output_dir(folder, "--out")
    manifest = folder / MANIFEST
    if manifest.exists():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        if old.get("sweep_sha") != sweep.raw_sha:
            if not force:
                raise InputError(f"--out {folder}: the folder holds the results of another sweep "
                                 f"({old.get('name', '?')}); use another folder or --force to start over")
            (folder / RESULTS).unlink(missing_ok=True)
    atomic_write_text(manifest, json.dumps(_manifest(sweep), sort_keys=True, indent=1, default=str), "manifest")
    return folder


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int = 1, engine: str = "local", address: str | None = None,
              progress: bool = False, force: bool = False, charts: bool = True) -> SweepRun:
    """Run (or resume) the sweep into ``out`` and write ``table.csv``, ``table.parquet`` (with pyarrow),
    ``frontier.csv`` and the charts."""
    from .engine import Progress, ResultStore, run_tasks

    started = time.perf_counter()
    folder = prepare_folder(sweep, out, force)
    tasks, counts = tasks_of(sweep, folder)
    store = ResultStore(folder, [t["id"] for t in tasks])
    already = sum(counts[t] for t in store.results)
    bar = Progress(len(sweep.designs), already, progress)
    stats = {"ran": 0, "plans": 0}

    def on_result(res):
        stats["ran"] += 1
        stats["plans"] += int(res.get("evaluated", 0))
        bar.update(counts[res["task"]], int(res.get("evaluated", 0)))
    try:
        run_tasks(tasks, store, jobs=jobs, engine=engine, address=address, on_result=on_result)
    finally:
        bar.close()
        store.close()
    files = write_outputs(sweep, folder, store.results, charts=charts)
    rows = files.pop("rows")
    return SweepRun(rows=rows, tasks=len(tasks), ran=stats["ran"], plans=stats["plans"],
                    elapsed_s=time.perf_counter() - started, parquet=bool(files.pop("parquet")),
                    files=files.pop("files"))


def write_outputs(sweep: Sweep, folder: Path, results, charts: bool = True) -> dict[str, Any]:
    from ..io import atomic_write_text
    from .table import COLUMNS, csv_text, design_rows, frontier_rows, write_parquet

    rows = design_rows(sweep, results)
    files = [folder / "table.csv", folder / "frontier.csv"]
    atomic_write_text(files[0], csv_text(rows), "design table")
    atomic_write_text(files[1], csv_text(frontier_rows(rows)), "design frontier")
    parquet = write_parquet(rows, folder / "table.parquet")
    if parquet:
        files.append(folder / "table.parquet")
    if charts:
        from .charts import save_charts
        files += save_charts(rows, folder, COLUMNS)
    return {"rows": rows, "parquet": parquet, "files": files}
