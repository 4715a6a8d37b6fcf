"""Strict reading of topology YAML files: locating them, duplicate keys, unknown keys, positive numbers.

Every error is an :class:`~tpsim.errors.InputError` with one line ``<file>: <element>: <problem>``.
Parsed files are cached by (path, mtime), so loading the same cluster again costs nothing.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from ..errors import InputError

ENV_VAR = "TPSIM_TOPOLOGIES"
FOLDERS = {"node": "nodes", "fabric": "fabrics", "cluster": "clusters"}


def topologies_dir() -> Path:
    """The topologies folder: ``$TPSIM_TOPOLOGIES`` if set, else ``<repo root>/topologies`` (or
    ``tpsim/topologies`` when installed from a wheel that ships them there)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2] / "topologies"
    packaged = Path(__file__).resolve().parents[1] / "topologies"   # a wheel may ship them as package data
    return repo if repo.is_dir() or not packaged.is_dir() else packaged


def resolve(kind: str, name_or_path: str | os.PathLike[str], relative_to: Path | None = None) -> Path:
    """Path of a node template / fabric / cluster given a file stem in its folder or a path."""
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    looks_like_path = text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if looks_like_path:
        if not candidate.is_absolute() and relative_to is not None and (relative_to / candidate).exists():
            candidate = relative_to / candidate
        if candidate.is_file():
            return candidate.resolve()
        raise InputError(f"{kind} file {text!r} does not exist")
    folder = topologies_dir() / FOLDERS[kind]
    for suffix in (".yaml", ".yml"):
        path = folder / f"{text}{suffix}"
        if path.is_file():
            return path.resolve()
    known = ", ".join(available(kind)) or "none"
    raise InputError(f"{kind}={text!r} is unknown (known in {folder}: {known})")


def available(kind: str) -> list[str]:
    """File stems of the node templates / fabrics / clusters shipped in the topologies folder."""
    folder = topologies_dir() / FOLDERS[kind]
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise InputError(f"duplicate name {key!r} (line {key_node.start_mark.line + 1}, first defined "
                             f"on line {seen[key] + 1})")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parsed mapping of a YAML file (cached by path, modification time and size)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    return _read_cached(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _read_cached(path: str, mtime: int, size: int) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
        data = yaml.load(text, Loader=_StrictLoader)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        first = str(exc).replace("\n", " ")
        raise InputError(f"{path}: not valid YAML ({first})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def check_keys(data: Mapping[str, Any], allowed: Iterable[str], where: str,
               required: Iterable[str] = ()) -> None:
    """Unknown or missing keys -> InputError naming the element."""
    allowed = tuple(allowed)
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r} (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in data:
            raise InputError(f"{where}: missing key {key!r}")


def positive(value: Any, where: str, field: str, integer: bool = False) -> float:
    """A finite number > 0 (an int if ``integer``), else InputError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not (0 < float(value) < float("inf")):
        kind = "a positive integer" if integer else "a positive number"
        raise InputError(f"{where}: {field}={value!r} must be {kind}")
    return int(value) if integer else float(value)


def fraction(value: Any, where: str, field: str) -> float:
    """A number in (0, 1], else InputError."""
    number = positive(value, where, field)
    if number > 1:
        raise InputError(f"{where}: {field}={value!r} must be in (0, 1]")
    return number


def non_negative(value: Any, where: str, field: str) -> float:
    """A finite number >= 0, else InputError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (0 <= float(value) < float("inf")):
        raise InputError(f"{where}: {field}={value!r} must be a number >= 0")
    return float(value)
