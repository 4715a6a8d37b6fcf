"""On-disk cache of search results, keyed by a SHA-256 of every input.

The key covers the model spec, each cluster's :meth:`fingerprint` (topology files, sizes, calibration), the
global batch, the search space, objective, price, memory limit, include-unfit, the compute model (the profile
file's bytes), tpsim's version and the bytes of its own source and data files (so any code or constant change
is a miss), and the entry format. Topology YAML files are covered by the cluster fingerprints. A hit restores
the evaluated columns (``.npz``) and the estimate objects already printed (``.json``); ranking is recomputed
from the columns. Folder: ``$TPSIM_CACHE_DIR`` or ``~/.cache/tpsim``, subfolder ``plans``;
``TPSIM_CACHE_DIR=off`` (or ``--no-cache``) disables it. Entries beyond :data:`MAX_ENTRIES` are removed
oldest first.

Integrity (issues 13, 26): the ``.json`` of an entry holds the entry format, its own key, the SHA-256 of the
``.npz`` bytes and of its own metadata, and a seal (:mod:`tpsim.cachefile`: an HMAC over the key, the
``.npz`` checksum and the metadata under this user's secret): checksums anyone can recompute, the seal only
this user's tpsim. Both files are opened only as regular files of this user of bounded size (no FIFO,
device, or symlink out of the folder). An entry that is truncated, corrupt, hand-edited (even with its
checksums recomputed), written by another format or user, or copied from another key is discarded with one warning line on stderr and recomputed (then
overwritten). Both files are written atomically under unique temporary names, so concurrent writers of the
same key cannot interleave their bytes; a pair mixed from two writers fails the checksum and is recomputed.
A cache folder that cannot be written is not an error (the result is just not kept).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import InputError
from ..model import ModelSpec
from .planner import Part, SearchResult, search
from .space import SearchSpace

MAX_ENTRIES = 64
FORMAT = 6
_KEY_NAME = re.compile(r"^[0-9a-f]{64}$")
REQUIRED_COLUMNS = ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch", "overlap", "order",
                    "global_batch", "part", "gpus", "step_time_s", "peak_memory_gib", "fits", "fits_effective",
                    "headroom_gib")
"""columns every cached result must hold (a foreign .npz lacks them)."""


MAX_NPZ_BYTES = 512 << 20
"""largest .npz read back: 1,000,000 plans (MAX_PLANS) of ~25 columns of 8 bytes are 200 MB."""
MAX_META_BYTES = 64 << 20
"""largest .json read back (the printed estimates of the top plans: a few hundred kB)."""


def cache_dir() -> Path | None:
    """The cache folder, or None when disabled (``TPSIM_CACHE_DIR=off``)."""
    from ..cachefile import cache_root

    root = cache_root()
    return None if root is None else root / "plans"


_NOT_KEYED = ("validate", "profiler", "bench", "cli", "report", "__pycache__")
"""packages that cannot change a search result (torch-side tools, the command line, reports)."""


@lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 over the source and data files a search result depends on (paths and bytes)."""
    from ..parsecache import package_hash

    return package_hash(_NOT_KEYED)


def cache_key(model: ModelSpec, clusters: Sequence[Any], global_batch: int, space: SearchSpace,
              compute_key: str, **options: Any) -> str:
    from .. import __version__

    payload = {"format": FORMAT, "version": __version__, "code": code_hash(), "model": model.to_dict(),
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
    from ..cachefile import secret

    if folder is None or secret(folder.parent) is None:  # no secret to seal with: no cache (nothing unverified)
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
    entry = _KEYS.get(id(result))
    if folder is None or entry is None:
        return
    key, npz_sha = entry
    from ..cachefile import Doubt, read_entry

    try:
        raw = read_entry(folder / f"{key}.json", MAX_META_BYTES)
        if raw is None:
            return
        header = json.loads(raw)
        if header.get("seal") != _seal(key, npz_sha, header.get("meta")):  # only an entry we wrote is rewritten
            return
        if header.get("meta", {}).get("memo") != result.memo and header.get("npz_sha256") == npz_sha:
            meta = dict(header["meta"], memo=result.memo)
            _write_atomic(folder / f"{key}.json", _header_bytes(key, npz_sha, meta))
    except (OSError, ValueError, AttributeError, TypeError, InputError, Doubt):
        pass


_KEYS: dict[int, tuple[str, str]] = {}
"""id(result) -> (key, SHA-256 of its .npz): where :func:`save_memo` keeps the printed estimates."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_sha(meta: dict[str, Any]) -> str:
    return _sha(json.dumps(meta, sort_keys=True).encode())


def _seal(key: str, npz_sha: str, meta: dict[str, Any]) -> str | None:
    from ..cachefile import seal

    mac = seal(key, npz_sha.encode(), json.dumps(meta, sort_keys=True).encode())
    return None if mac is None else mac.hex()


def _header_bytes(key: str, npz_sha: str, meta: dict[str, Any]) -> bytes:
    mac = _seal(key, npz_sha, meta)
    if mac is None:
        raise OSError("no sealing secret")  # nothing is kept that could not be verified
    header = {"format": FORMAT, "key": key, "npz_sha256": npz_sha, "meta_sha256": _meta_sha(meta), "meta": meta,
              "seal": mac}
    return json.dumps(header).encode()


def _save(folder: Path, key: str, result: SearchResult) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, __ranking=result.ranking, **{k: np.asarray(v) for k, v in result.columns.items()})
        data = buf.getvalue()
        npz_sha = _sha(data)
        meta = {"enumerated": result.enumerated, "evaluated": result.evaluated, "rejected": dict(result.rejected),
                "stack_rejected": dict(result.stack_rejected),
                "elapsed_s": result.elapsed_s, "memo": result.memo, "duplicates": result.duplicates,
                "left_out": result.left_out, "gpus": [int(p.cluster.num_gpus) for p in result.parts]}
        header = _header_bytes(key, npz_sha, meta)
        _write_atomic(folder / f"{key}.npz", data)
        _write_atomic(folder / f"{key}.json", header)
        _KEYS[id(result)] = (key, npz_sha)
        _prune(folder)
    except (OSError, InputError):
        pass  # a cache that cannot be written is not an error


class _Discard(Exception):
    """A cache entry that must not be used; the message says why."""


def _load(folder: Path, key: str, model: ModelSpec, clusters: list[Any], space: SearchSpace, compute: Any,
          options: dict[str, Any]) -> SearchResult | None:
    from ..cachefile import Doubt, discard, read_entry

    npz, meta_path = folder / f"{key}.npz", folder / f"{key}.json"
    try:
        header_bytes = read_entry(meta_path, MAX_META_BYTES)
        data = read_entry(npz, MAX_NPZ_BYTES) if header_bytes is not None else None
    except Doubt as exc:  # a FIFO, a symlink (to /dev/zero, out of the folder), a device, too large
        _warn(meta_path, str(exc))
        for path in (meta_path, npz):
            discard(path)
        return None
    if header_bytes is None or data is None:
        return None  # no entry (or half of one from a writer still at work): a plain miss
    try:
        meta, columns, ranking = _verify(key, header_bytes, data)
        by_gpus = {int(c.num_gpus): c for c in clusters}
        if sorted(meta["gpus"]) != sorted(by_gpus):
            raise _Discard(f"GPU counts {meta['gpus']} differ from the search's {sorted(by_gpus)}")
    except _Discard as exc:
        _warn(meta_path, str(exc))
        return None
    parts = tuple(Part(cluster=by_gpus[g], chunks=(), offsets=()) for g in meta["gpus"])
    try:
        os.utime(meta_path)
    except OSError:
        pass
    result = SearchResult(model=model, objective=options.get("objective", "time"),
                          gpu_hour_price=options.get("gpu_hour_price", 1.0), parts=parts, columns=columns,
                          ranking=ranking, enumerated=meta["enumerated"],
                          evaluated=meta["evaluated"], rejected=meta["rejected"], elapsed_s=meta["elapsed_s"],
                          mem_limit_gib=options.get("mem_limit_gib"), compute=compute, space=space,
                          memo=dict(meta.get("memo", {})), duplicates=int(meta.get("duplicates", 0)),
                          left_out=int(meta.get("left_out", 0)),
                          cached=True, stack=options.get("stack"),
                          stack_rejected=dict(meta.get("stack_rejected", {})), tokens=options.get("tokens"),
                          reliability=options.get("reliability"))
    _KEYS[id(result)] = (key, _sha(data))
    return result


def _verify(key: str, header_bytes: bytes, data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray]:
    """(meta, columns, ranking) of an entry whose checksums, key, format and columns hold, else _Discard."""
    try:
        header = json.loads(header_bytes)
    except ValueError:
        raise _Discard("its .json is not valid JSON (truncated or corrupt)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _Discard(f"format {header.get('format') if isinstance(header, dict) else '?'} is not {FORMAT}")
    if header.get("key") != key:
        raise _Discard("it holds the result of other inputs (copied or renamed)")
    meta = header.get("meta")
    if not isinstance(meta, dict) or header.get("meta_sha256") != _meta_sha(meta):
        raise _Discard("its metadata fails its checksum (edited by hand?)")
    if header.get("npz_sha256") != _sha(data):
        raise _Discard("its .npz fails its checksum (truncated, corrupt or edited)")
    seal = header.get("seal")
    if not isinstance(seal, str) or seal != _seal(key, header["npz_sha256"], meta):
        raise _Discard("its seal does not verify (written by another user or tool, or edited and "
                       "re-checksummed)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            columns = {k: npz[k] for k in npz.files}
        ranking = columns.pop("__ranking")
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise _Discard(f"its .npz cannot be read ({type(exc).__name__})") from None
    _check_columns(meta, columns, ranking)
    return meta, columns, ranking


def _check_columns(meta: dict[str, Any], columns: dict[str, np.ndarray], ranking: np.ndarray) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise _Discard(f"its .npz lacks column(s) {', '.join(missing[:3])}")
    sizes = {v.shape for v in columns.values()}
    n = len(columns["tp"])
    if len(sizes) != 1 or any(v.ndim != 1 for v in columns.values()):
        raise _Discard("its columns differ in length")
    if ranking.ndim != 1 or ranking.dtype.kind not in "iu" or (ranking.size and (ranking.min() < 0 or
                                                                                 ranking.max() >= n)):
        raise _Discard("its ranking indexes rows that do not exist")
    for field in ("enumerated", "evaluated", "duplicates", "left_out"):
        if not isinstance(meta.get(field, 0), int) or isinstance(meta.get(field, 0), bool):
            raise _Discard(f"{field} is not a count")
    for field in ("enumerated", "evaluated"):
        if field not in meta:
            raise _Discard(f"its metadata lacks {field}")
    if not isinstance(meta.get("gpus"), list) or not all(type(g) is int and g > 0 for g in meta["gpus"]) \
            or not isinstance(meta.get("rejected"), dict):
        raise _Discard("its metadata lacks gpus or rejected")
    if not isinstance(meta.get("elapsed_s"), (int, float)) or isinstance(meta.get("elapsed_s"), bool):
        raise _Discard("its metadata lacks elapsed_s")
    for field in ("memo", "stack_rejected"):
        if not isinstance(meta.get(field, {}), dict):
            raise _Discard(f"its {field} is not a mapping")


def _warn(path: Path, why: str) -> None:
    print(f"tpsim: warning: discarded cache entry {path.with_suffix('')}: {why}; recomputing", file=sys.stderr)


def _write_atomic(path: Path, data: bytes) -> None:
    from ..io import atomic_write_bytes

    atomic_write_bytes(path, data, "cache entry", durable=False)  # verified when read: a torn entry is recomputed


def _prune(folder: Path) -> None:
    """Remove the oldest entries beyond MAX_ENTRIES (only files named like entries: never a user's file)."""
    metas = []
    for p in folder.glob("*.json"):
        try:
            if _KEY_NAME.match(p.stem) and p.is_file():
                metas.append((p.stat().st_mtime, p))
        except OSError:
            continue
    for _, old in sorted(metas)[:-MAX_ENTRIES]:
        for path in (old, old.with_suffix(".npz")):
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
