"""``tpsim design --explain A B``: which axes and which step-time terms differ between two designs of a
finished (or partly finished) sweep folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .evaluate import BREAKDOWN_TERMS
from .sweep import AXES


def _load(folder: Path) -> tuple[Mapping[str, Any], dict[str, Mapping[str, Any]]]:
    from .engine import MANIFEST, RESULTS

    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"--out {folder}: no {MANIFEST}: not a tpsim design folder") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"--out {folder}: {MANIFEST} is not readable ({exc})") from None
    results: dict[str, Mapping[str, Any]] = {}
    path = folder / RESULTS
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                res = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(res, dict) and "task" in res:
                results.setdefault(res["task"], res)
    return manifest, results


def explain(folder: str | Path, a: str, b: str) -> str:
    """Lines comparing designs ``a`` and ``b`` (design ids of the table's ``design`` column)."""
    folder = Path(folder)
    manifest, results = _load(folder)
    designs = manifest.get("designs", {})
    for d in (a, b):
        if d not in designs:
            near = [k for k in designs if k.startswith(d[:4])][:3]
            raise InputError(f"--explain {d}: no such design in {folder}"
                             + (f" (did you mean {', '.join(near)}?)" if near else ""))
    da, db = designs[a], designs[b]
    ra, rb = results.get(da["task"]), results.get(db["task"])
    for d, r in ((a, ra), (b, rb)):
        if r is None:
            raise InputError(f"--explain {d}: the design has no result yet (rerun the sweep to resume it)")
    lines = [f"design {a} vs {b}" + (f" ({da['model']})" if da["model"] == db["model"]
                                     else f" ({da['model']} vs {db['model']})")]
    diff = [f"{k} {da['values'][k]} -> {db['values'][k]}" for k in AXES if da["values"].get(k) != db["values"].get(k)]
    lines.append("axes that differ: " + ("; ".join(diff) if diff else "none"))
    if not (ra["fits"] and rb["fits"]):
        for d, r in ((a, ra), (b, rb)):
            if not r["fits"]:
                lines.append(f"{d}: no plan fits ({r.get('why', '')})")
        return "\n".join(lines)
    lines.append(f"best plan: {ra['plan']} -> {rb['plan']}")
    sa, sb = ra["step_time_s"], rb["step_time_s"]
    lines.append(f"step time {sa:.3f} s -> {sb:.3f} s ({sb / sa - 1:+.1%}); tokens/s {ra['tokens_per_s']:,.0f} -> "
                 f"{rb['tokens_per_s']:,.0f}; MFU {ra['mfu']:.1%} -> {rb['mfu']:.1%}")
    lines.append(f"exposed communication share {ra['comm_share']:.1%} -> {rb['comm_share']:.1%}; memory "
                 f"{ra['memory_gib']:.1f} -> {rb['memory_gib']:.1f} GiB")
    ba, bb = ra["breakdown"], rb["breakdown"]
    terms = sorted(BREAKDOWN_TERMS, key=lambda k: -abs(bb.get(k, 0.0) - ba.get(k, 0.0)))
    lines.append("terms (seconds per step; communication per axis are totals, partly hidden), largest "
                 "difference first:")
    for k in terms:
        x, y = ba.get(k, 0.0), bb.get(k, 0.0)
        if x == 0.0 and y == 0.0:
            continue
        lines.append(f"  {k:<13} {x:9.3f} -> {y:9.3f}  ({y - x:+.3f})")
    return "\n".join(lines)
