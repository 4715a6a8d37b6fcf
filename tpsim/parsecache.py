"""On-disk cache of parsed YAML documents, keyed by the SHA-256 of the file's text (issue 9: process start).

``tpsim estimate`` reads about fifteen YAML files (devices, kernel data, training stacks, the error band, the
NCCL model, the topology files) on every run. Parsing them, and importing PyYAML to do it, was a fifth of the
run's CPU time. A parsed document is a function of its text and of the reader that parsed it, so it is kept
under a key made of both: the SHA-256 of ``FORMAT``, the reader's name (:func:`tpsim.safeyaml.load_yaml`'s
strict, bounded reader with its limits, or the plain safe reader of the shipped data files), the Python
version and the text. An edited file has another key, so it is parsed again; nothing is keyed on paths or
modification times. Only documents that parsed without error are stored (a file with an error is parsed,
and refused with the same message, on every run).

Folder: ``$TPSIM_CACHE_DIR`` or ``~/.cache/tpsim`` (as for the plan cache), subfolder ``yaml``;
``TPSIM_CACHE_DIR=off`` disables it. Entry: the SHA-256 of the payload, then the payload (the document in
:mod:`marshal` form: dicts, lists, strings, numbers, booleans and None round-trip exactly, with their types;
a document holding anything else, e.g. a YAML timestamp, is not stored). An entry that is not a regular file of
this user of bounded size (a FIFO, a symlink, a device), or whose seal or payload does not verify (truncated,
corrupt, forged, written by another Python), is discarded with one warning line on
stderr and the file parsed again (then the entry rewritten). Entries are written atomically (a temporary
file in the folder, then ``os.replace``); a folder that cannot be written is not an error (the document is
just not kept). At most :data:`MAX_ENTRIES` entries are kept, oldest first out.

Seed (issue 21, cold start): tpsim's own YAML files come parsed with the package (:data:`SEED_FILE`, under
the same keys), looked up before the folder, so a process with an empty or no cache folder does not import
PyYAML for them either; a file whose text changed since the seed was written is parsed as any other.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
from pathlib import Path, PurePath
from typing import Any, Callable

FORMAT = 2
"""bumped when the entry layout or what a reader returns changes (2: sealed entries, issue 26)."""
MAX_ENTRIES = 512
MAX_ENTRY_BYTES = 64 << 20
"""largest entry read back (a parsed 4 MB YAML document is a few MB in marshal form)."""
SUFFIX = ".yamlc"
_DIGEST = 32
SEED_FILE = Path(__file__).resolve().parent / "data" / "parse_seed.marshal"
"""The documents of tpsim's shipped YAML files (``tpsim/data``, ``topologies``), parsed when they were last
written (:func:`tpsim.safeyaml.write_parse_seed`; ``python tests/test_parsecache.py --write``) under the same
keys as the cache entries: a cold process (an empty cache folder, or none) reads them without PyYAML. An edited
file has another key and is parsed as before, so an out-of-date seed costs time, never a wrong document."""
SEED_FORMAT = 1


def cache_dir() -> Path | None:
    """The folder of parsed documents, or None when on-disk caches are off (``TPSIM_CACHE_DIR=off``)."""
    from .cachefile import cache_root

    root = cache_root()
    return None if root is None else root / "yaml"


def package_hash(skip: tuple[str, ...]) -> str:
    """SHA-256 over tpsim's source and data files (relative paths and bytes), leaving out the packages in
    ``skip``: the key of on-disk results that are a function of the code (plan search results, run residuals)."""
    h = hashlib.sha256()
    skipped = set(skip)
    for rel, parts, data in _package_files():
        if not parts & skipped:
            h.update(rel)
            h.update(data)
    return h.hexdigest()


_FILES: list = []


def _package_files() -> list[tuple[bytes, frozenset, bytes]]:
    """(relative path, its parts, bytes) of tpsim's source and data files, read once per process (the code
    does not change while it runs; a process hashes them for several keys)."""
    if not _FILES:
        package = Path(__file__).resolve().parent
        found = []   # as sorted(package.rglob("*")) lists them (by path parts; symlinked folders not entered)
        for root, _, names in os.walk(package):
            rel = os.path.relpath(root, package)
            base = () if rel == os.curdir else tuple(rel.split(os.sep))
            for name in names:
                full = os.path.join(root, name)
                if PurePath(name).suffix in _HASHED and os.path.isfile(full):
                    found.append((base + (name,), full))
        for parts, full in sorted(found):
            with open(full, "rb") as f:
                _FILES.append((os.sep.join(parts).encode(), frozenset(parts), f.read()))
    return _FILES


_HASHED = (".py", ".yaml", ".yml", ".csv", ".json")


def entry_key(text: str, reader: str) -> str:
    """Hex SHA-256 naming the entry of ``text`` parsed by ``reader``."""
    h = hashlib.sha256(f"tpsim-yaml {FORMAT} {reader} {sys.version_info[0]}.{sys.version_info[1]} "
                       f"marshal {marshal.version}\0".encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def cached_parse(text: str, reader: str, parse: Callable[[str], Any]) -> Any:
    """``parse(text)``, or the document stored for the same ``text`` and ``reader``. Each call returns new
    objects (callers may modify what they get)."""
    from .cachefile import secret

    key = entry_key(text, reader)
    seeded = seed().get(key)
    if seeded is not None:
        return marshal.loads(seeded)
    folder = cache_dir()
    if folder is None or secret(folder.parent) is None:  # no secret to seal with: no cache (nothing unverified)
        return parse(text)
    path = folder / (key + SUFFIX)
    hit = _load(path)
    if hit is not _MISS:
        return hit
    data = parse(text)
    _save(folder, path, data)
    return data


_MISS = object()
_SEED: dict[str, bytes] = {}
_SEED_READ: list[bool] = []


def seed() -> dict[str, bytes]:
    """{entry key: marshal payload} of :data:`SEED_FILE` (read once per process; empty when the file is
    missing, unreadable or of another format: every document is then parsed or read from the cache)."""
    if not _SEED_READ:
        _SEED_READ.append(True)
        try:
            data = marshal.loads(SEED_FILE.read_bytes())
            entries = data.get("entries") if isinstance(data, dict) and data.get("format") == SEED_FORMAT else None
            if isinstance(entries, dict):
                _SEED.update((k, v) for k, v in entries.items() if isinstance(k, str) and isinstance(v, bytes))
        except (OSError, EOFError, ValueError, TypeError):
            pass
    return _SEED


def seed_payload(documents: dict[str, Any]) -> bytes:
    """The bytes of a seed file holding ``documents`` ({entry key: parsed document}); documents marshal cannot
    keep are left out."""
    entries = {}
    for key in sorted(documents):
        try:
            entries[key] = marshal.dumps(documents[key])
        except ValueError:
            continue
    return marshal.dumps({"format": SEED_FORMAT, "entries": entries})


def _load(path: Path) -> Any:
    from .cachefile import Doubt, read_entry, verify

    try:
        blob = read_entry(path, MAX_ENTRY_BYTES)
        if blob is None:  # no entry yet (or an unreadable folder: parse as if there were no cache)
            return _MISS
        seal, payload = blob[:_DIGEST], blob[_DIGEST:]
        if len(blob) <= _DIGEST:
            raise Doubt("it is truncated")
        verify(seal, path.name[: -len(SUFFIX)], payload)
    except Doubt as exc:
        return _discard(path, str(exc))
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError) as exc:
        return _discard(path, f"unreadable payload ({exc})")


def _discard(path: Path, why: str) -> Any:
    from .cachefile import discard

    print(f"tpsim: warning: discarded cache entry {path}: {why}; parsing the file again", file=sys.stderr)
    discard(path)
    return _MISS


def _save(folder: Path, path: Path, data: Any) -> None:
    from .cachefile import seal

    try:
        payload = marshal.dumps(data)
    except ValueError:  # a type marshal does not keep (a timestamp, ...): not stored
        return
    if len(payload) + _DIGEST > MAX_ENTRY_BYTES:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data):x}.tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mac = seal(path.name[: -len(SUFFIX)], payload)
        if mac is None:  # no sealing secret: nothing is kept that could not be verified
            return
        with open(tmp, "xb") as f:
            f.write(mac + payload)
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk, a file where the folder should be: just not kept
        try:
            tmp.unlink()
        except OSError:
            pass
        return
    _prune(folder)


def _prune(folder: Path) -> None:
    """Remove the oldest entries beyond :data:`MAX_ENTRIES` (after a write only: hits cost no listing)."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(SUFFIX)]
        if len(entries) <= MAX_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat().st_mtime_ns)
        for e in entries[:len(entries) - MAX_ENTRIES]:
            os.unlink(e.path)
    except OSError:  # another process pruned first
        pass


__all__ = ["cache_dir", "cached_parse", "entry_key", "FORMAT", "MAX_ENTRIES", "SEED_FILE", "seed", "seed_payload"]
