"""On-disk cache of search results, keyed by a SHA-256 of every input.

The key covers the model spec, each cluster's :meth:`fingerprint` (topology files, sizes, calibration), the
global batch, the search space, objective, price, memory limit, include-unfit, the compute model (the profile
file's bytes), and the bytes of tpsim's own source and data files (so any code or constant change is a miss).
Topology YAML files are covered by the cluster fingerprints. A hit restores the evaluated columns (``.npz``) and the estimate objects already printed (``.json``); ranking
is recomputed from the columns. Folder: ``$TPSIM_CACHE_DIR`` or ``~/.cache/tpsim``, subfolder ``plans``;
``TPSIM_CACHE_DIR=off`` disables it. Entries beyond :data:`MAX_ENTRIES` are removed oldest first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..model import ModelSpec
from .planner import Part, SearchResult, search
from .space import SearchSpace

MAX_ENTRIES = 64
FORMAT = 3
_PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path | None:
    """The cache folder, or None when disabled (``TPSIM_CACHE_DIR=off``)."""
    root = os.environ.get("TPSIM_CACHE_DIR")
    if root and root.lower() in ("off", "none", "0"):
        return None
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpsim"
    return base / "plans"


_NOT_KEYED = ("validate", "profiler", "bench", "cli", "report", "__pycache__")
"""packages that cannot change a search result (torch-side tools, the command line, reports)."""


@lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 over the source and data files a search result depends on (paths and bytes)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*")):
        rel = path.relative_to(_PACKAGE)
        if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".csv", ".json") \
                and not set(rel.parts) & set(_NOT_KEYED):
            h.update(str(rel).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(model: ModelSpec, clusters: Sequence[Any], global_batch: int, space: SearchSpace,
              compute_key: str, **options: Any) -> str:
    payload = {"format": FORMAT, "code": code_hash(), "model": model.to_dict(),
               "clusters": [c.fingerprint() for c in clusters], "global_batch": global_batch,
               "space": dataclasses.asdict(space), "compute": compute_key, "options": options}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def compute_key_of(profile_path: str | None) -> str:
    """"roofline", or "profile:" + SHA-256 of the profile file's bytes."""
    if not profile_path:
        return "roofline"
    try:
        return "profile:" + hashlib.sha256(Path(profile_path).read_bytes()).hexdigest()
    except OSError:
        return f"profile:{profile_path}"  # unreadable: the ProfileModel raises the user-facing error


def cached_search(model: ModelSpec, clusters: Sequence[Any], global_batch: int, *, space: SearchSpace,
                  compute: Any = None, compute_key: str = "roofline", **options: Any) -> SearchResult:
    """:func:`tpsim.search.search` through the on-disk cache (same arguments; ``progress`` is not keyed).
    ``compute_key`` names the compute model for the key (:func:`compute_key_of`)."""
    folder = cache_dir()
    progress = options.pop("progress", False)
    clusters = list(clusters)
    if folder is None:
        return search(model, clusters, global_batch, space=space, compute=compute, progress=progress, **options)
    from ..estimator.context import resolve_stack

    options["stack"] = resolve_stack(options.get("stack"))
    key = cache_key(model, clusters, global_batch, space, compute_key,
                    **{**options, "stack": options["stack"].fingerprint()})
    hit = _load(folder, key, model, clusters, space, compute, options)
    if hit is not None:
        return hit
    result = search(model, clusters, global_batch, space=space, compute=compute, progress=progress, **options)
    _save(folder, key, result)
    return result


def save_memo(result: SearchResult) -> None:
    """Keep the estimate dicts computed since loading (call after printing the top plans)."""
    folder = cache_dir()
    key = _KEYS.get(id(result))
    if folder is None or key is None:
        return
    meta_path = folder / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("memo") != result.memo:
            meta["memo"] = result.memo
            _write_atomic(meta_path, json.dumps(meta).encode())
    except (OSError, ValueError):
        pass


_KEYS: dict[int, str] = {}


def _save(folder: Path, key: str, result: SearchResult) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.npz"
        np.savez(tmp, __ranking=result.ranking, **{k: np.asarray(v) for k, v in result.columns.items()})
        os.replace(tmp, folder / f"{key}.npz")
        meta = {"enumerated": result.enumerated, "evaluated": result.evaluated, "rejected": result.rejected,
                "stack_rejected": dict(result.stack_rejected),
                "elapsed_s": result.elapsed_s, "memo": result.memo, "duplicates": result.duplicates,
                "gpus": [int(p.cluster.num_gpus) for p in result.parts]}
        _write_atomic(folder / f"{key}.json", json.dumps(meta).encode())
        _KEYS[id(result)] = key
        _prune(folder)
    except OSError:
        pass  # a cache that cannot be written is not an error


def _load(folder: Path, key: str, model: ModelSpec, clusters: list[Any], space: SearchSpace, compute: Any,
          options: dict[str, Any]) -> SearchResult | None:
    npz, meta_path = folder / f"{key}.npz", folder / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        with np.load(npz) as data:
            columns = {k: data[k] for k in data.files}
        ranking = columns.pop("__ranking")
    except (OSError, ValueError, KeyError):
        return None
    by_gpus = {int(c.num_gpus): c for c in clusters}
    parts = tuple(Part(cluster=by_gpus[g], chunks=(), offsets=()) for g in meta["gpus"] if g in by_gpus)
    if len(parts) != len(meta["gpus"]):
        return None
    os.utime(meta_path)
    result = SearchResult(model=model, objective=options.get("objective", "time"),
                          gpu_hour_price=options.get("gpu_hour_price", 1.0), parts=parts, columns=columns,
                          ranking=ranking, enumerated=meta["enumerated"],
                          evaluated=meta["evaluated"], rejected=meta["rejected"], elapsed_s=meta["elapsed_s"],
                          mem_limit_gib=options.get("mem_limit_gib"), compute=compute, space=space,
                          memo=dict(meta.get("memo", {})), duplicates=int(meta.get("duplicates", 0)),
                          cached=True, stack=options.get("stack"),
                          stack_rejected=dict(meta.get("stack_rejected", {})))
    _KEYS[id(result)] = key
    return result


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _prune(folder: Path) -> None:
    metas = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in metas[:-MAX_ENTRIES]:
        for path in (old, old.with_suffix(".npz")):
            path.unlink(missing_ok=True)
