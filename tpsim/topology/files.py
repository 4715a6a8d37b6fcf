"""Strict reading of topology YAML files: locating them, duplicate keys, unknown keys, positive numbers.

Every error is an :class:`~tpsim.errors.InputError` with one line ``<file>: <element>: <problem>``.
Parsed files are cached by (path, mtime), so loading the same cluster again costs nothing.
"""

from __future__ import annotations

import math
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError, check_keys, did_you_mean  # noqa: F401 - check_keys: the loaders' rule

ENV_VAR = "TPSIM_TOPOLOGIES"
FOLDERS = {"node": "nodes", "fabric": "fabrics", "cluster": "clusters"}


def topologies_dir() -> Path:
    """The topologies folder: ``$TPSIM_TOPOLOGIES`` if set, else ``<repo root>/topologies`` (or
    ``tpsim/topologies`` when installed from a wheel that ships them there)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    repo, packaged = _default_dirs()
    return repo if repo.is_dir() or not packaged.is_dir() else packaged


@lru_cache(maxsize=1)
def _default_dirs() -> tuple[Path, Path]:
    """(<repo root>/topologies, tpsim/topologies): where this file is does not change while it runs."""
    here = Path(__file__).resolve()
    return here.parents[2] / "topologies", here.parents[1] / "topologies"   # a wheel may ship them as package data


def resolve(kind: str, name_or_path: str | os.PathLike[str], relative_to: Path | None = None) -> Path:
    """Path of a node template / fabric / cluster given a file stem in its folder or a path."""
    from ..io import input_path
    from ..limits import MAX_YAML_BYTES, show

    text = str(name_or_path)
    if not text.strip():
        raise InputError(f"{kind}: the name is empty (known: {', '.join(available(kind)) or 'none'})")
    looks_like_path = text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if looks_like_path:
        candidate = Path(text).expanduser()
        if not candidate.is_absolute() and relative_to is not None and _exists(relative_to / candidate):
            candidate = relative_to / candidate
        return input_path(candidate, f"{kind} file", MAX_YAML_BYTES).resolve()
    if len(text) > 255 or not _NAME.match(text):
        raise InputError(f"{kind}={show(text)} is not a file name or a known {kind} "
                         f"(known: {', '.join(available(kind)) or 'none'})")
    folder = topologies_dir() / FOLDERS[kind]
    for suffix in (".yaml", ".yml"):
        path = folder / f"{text}{suffix}"
        if path.is_file():
            return path.resolve()
    known = ", ".join(available(kind)) or "none"
    raise InputError(f"{kind}={text!r} is unknown (known in {folder}: {known})" + did_you_mean(text, available(kind)))


_NAME = re.compile(r"^[\w.+-]+$")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long for the file system
        return False


def available(kind: str) -> list[str]:
    """File stems of the node templates / fabrics / clusters shipped in the topologies folder."""
    folder = topologies_dir() / FOLDERS[kind]
    try:
        return sorted(p.stem for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:  # no such folder, or TPSIM_TOPOLOGIES names a file
        return []


def read_yaml(path: Path) -> dict[str, Any]:
    """Parsed mapping of a YAML file (cached by path, modification time and size), read by the one bounded,
    strict YAML reader (:mod:`tpsim.safeyaml`)."""
    from ..io import input_path
    from ..limits import MAX_YAML_BYTES

    stat = input_path(path, "YAML file", MAX_YAML_BYTES).stat()
    return _read_cached(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _read_cached(path: str, mtime: int, size: int) -> dict[str, Any]:  # noqa: ARG001 (mtime, size: the cache key)
    from ..io import read_text
    from ..limits import MAX_YAML_BYTES
    from ..safeyaml import kind_of, load_yaml

    text = read_text(path, "YAML file", MAX_YAML_BYTES)
    data = load_yaml(text, path)
    if not isinstance(data, dict):
        kind = kind_of(data, text)
        got = f"a {kind} file" if kind else type(data).__name__ if data is not None else "an empty file"
        raise InputError(f"{path}: expected a mapping of names to values at the top level, got {got}")
    return data


def check_kind(data: Mapping[str, Any], expected: str, path: Path | str) -> None:
    """Refuse a file of another recognisable kind (a node template given as a cluster, ...), naming it."""
    from ..safeyaml import check_kind as _check

    _check(data, expected, str(path))


def positive(value: Any, where: str, field: str, integer: bool = False, maximum: float | None = None) -> float:
    """A finite number > 0 (an int if ``integer``) and at most ``maximum`` (for integers, default
    ``tpsim.limits.LIMITS[field]`` where the table has the field), else InputError."""
    from ..limits import LIMITS, show

    kind = "a positive integer" if integer else "a positive number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, int):
        number = value
    elif ok and math.isfinite(value) and (not integer or float(value).is_integer()):
        number = int(value) if integer else float(value)
    else:
        raise InputError(f"{where}: {field}={show(value)} must be {kind}")
    if not number > 0:
        raise InputError(f"{where}: {field}={show(value)} must be {kind}")
    top = maximum if maximum is not None else LIMITS.get(field) if integer else None
    if top is not None and number > top:
        raise InputError(f"{where}: {field}={show(value)} is above the supported maximum "
                         f"{top if isinstance(top, int) else f'{top:g}'}")
    if not integer and number > 1e300:
        raise InputError(f"{where}: {field}={show(value)} is out of range")
    return int(number) if integer else float(number)


def fraction(value: Any, where: str, field: str) -> float:
    """A number in (0, 1], else InputError."""
    number = positive(value, where, field)
    if number > 1:
        raise InputError(f"{where}: {field}={value!r} must be in (0, 1]")
    return number


def non_negative(value: Any, where: str, field: str) -> float:
    """A finite number >= 0 (below 1e300), else InputError."""
    from ..limits import show

    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= 1e300:
        raise InputError(f"{where}: {field}={show(value)} must be a number >= 0")
    return float(value)
