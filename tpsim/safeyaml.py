"""The one YAML reader of tpsim (issue 13): every YAML input (topology files, calibration files) goes through
:func:`read_yaml` or :func:`load_yaml`.

* Safe loading only (``SafeLoader``: no Python objects), with libyaml's parser where installed.
* Bounded before anything is built: one pass over the parser's events (iterative, no recursion) counts the
  nodes the document expands to, aliases included, and refuses more than
  :data:`tpsim.limits.MAX_YAML_NODES` (a "billion laughs" file of nine nested lists of ten aliases expands to
  1e9 nodes from 200 bytes) and nesting deeper than :data:`tpsim.limits.MAX_JSON_DEPTH`; recursive aliases
  are refused. The file itself is bounded by :data:`tpsim.limits.MAX_YAML_BYTES`.
* Strict mappings: a duplicate key (PyYAML silently keeps the last one) or an unhashable key (a list or a
  mapping used as a key) is an error naming its line.
* Parsed once: a document that passed every check is kept in the on-disk parse cache
  (:mod:`tpsim.parsecache`, keyed by the SHA-256 of the text and of the reader with its limits), so a later
  run reads it back without importing PyYAML. :func:`load_data` reads tpsim's own data files the same way
  (plain safe loading, as before).
* :func:`kind_of` names what a parsed file looks like (a cluster, a node template, a fabric, link kinds, a
  calibration, a model config, a kernel profile, collective measurements), so that a file of the wrong kind
  is refused with a line that says what it is.

Every problem is one :class:`~tpsim.errors.InputError` line ``<file>: <problem> (line N)``.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping

from .errors import InputError
from .io import read_text
from .limits import MAX_JSON_DEPTH, MAX_NUMBER_DIGITS, MAX_YAML_BYTES, MAX_YAML_NODES

if TYPE_CHECKING:
    import yaml

STRICT_READER = f"strict nodes={MAX_YAML_NODES} depth={MAX_JSON_DEPTH} digits={MAX_NUMBER_DIGITS}"
"""the parse cache's name of :func:`load_yaml`'s reader (with its limits: other limits, other entries)."""
SAFE_READER = "safe"
"""the parse cache's name of :func:`load_data`'s reader."""

# PyYAML is imported on first parse, not here: a document found in the parse cache (tpsim.parsecache) needs
# no parser, and `tpsim estimate` with every file cached does not import PyYAML at all.


@lru_cache(maxsize=1)
def base_loader() -> type:
    """libyaml's safe loader where PyYAML was built with it, else PyYAML's pure-Python ``SafeLoader`` (the
    two build the same documents: the parser differs, the constructors are the same)."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def strict_loader() -> type:
    """SafeLoader (:func:`base_loader`) that refuses duplicate and unhashable mapping keys."""
    import yaml

    class StrictLoader(base_loader()):  # type: ignore[misc, valid-type]
        """SafeLoader that refuses duplicate and unhashable mapping keys."""

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    return StrictLoader


def _construct_mapping(loader: Any, node: "yaml.MappingNode", deep: bool = False) -> dict:
    import yaml

    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise InputError(f"a {type(key).__name__} cannot be a key (line {line}); keys are names or "
                             "numbers") from None
        if key in seen:
            raise InputError(f"duplicate name {key!r} (line {line}, first defined on line {seen[key]})")
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|0x[0-9a-fA-F_]+|0o[0-7_]+|0b[01_]+|"
                     r"\.[0-9_]+(?:[eE][-+]?[0-9]+)?)")
"""a plain scalar YAML 1.1 may read as a number (ints with underscores, hex, octal, binary, floats)."""


def check_size(text: str, max_nodes: int = MAX_YAML_NODES, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a document that expands to more than ``max_nodes`` nodes (aliases counted at their expanded
    size), nests deeper than ``max_depth``, or uses a recursive or undefined alias. Iterative over the
    parser's events: nothing is constructed."""
    import yaml

    expanded = 0
    open_nodes: list[tuple[str | None, int]] = []
    sizes: dict[str, int] = {}
    expect_key: list[bool | None] = [None]  # per open collection: a mapping's next node is a key (None: a list)
    last_key = ""

    def is_key() -> bool:  # the node this event starts is a mapping key; the mapping's slot flips
        slot = expect_key[-1]
        if slot is None:
            return False
        expect_key[-1] = not slot
        return slot

    for event in yaml.parse(text, Loader=base_loader()):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            is_key()
            expect_key.append(True if isinstance(event, yaml.MappingStartEvent) else None)
            open_nodes.append((event.anchor, expanded))
            expanded += 1
            if len(open_nodes) > max_depth:
                raise InputError(f"nested more than {max_depth} levels deep (line {event.start_mark.line + 1})")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            expect_key.pop()
            anchor, start = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = expanded - start
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
            value = event.value
            if is_key():
                last_key = value[:80]
            elif not event.style and len(value) > MAX_NUMBER_DIGITS and _NUMBER.fullmatch(value):
                digits = sum(ch.isdigit() for ch in value)
                if digits > MAX_NUMBER_DIGITS:  # int() of 5,000 digits raises ValueError; of 4,000, slowly
                    field = f"{last_key}={value[:12]}...({digits} digits)" if last_key else f"a number of {digits} digits"
                    raise InputError(f"{field} (line {event.start_mark.line + 1}); numbers have at most "
                                     f"{MAX_NUMBER_DIGITS} digits")
        elif isinstance(event, yaml.AliasEvent):
            is_key()
            if event.anchor not in sizes:
                raise InputError(f"alias *{event.anchor} refers to an unfinished or undefined anchor "
                                 f"(line {event.start_mark.line + 1}); recursive aliases are not allowed")
            expanded += sizes[event.anchor]
        else:
            continue
        if expanded > max_nodes:
            raise InputError(f"expands to more than {max_nodes:,} values (aliases/anchors counted at their "
                             f"expanded size, line {event.start_mark.line + 1}); is it a YAML bomb?")


def _yaml_problem(exc: "yaml.YAMLError") -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{context + ': ' if context else ''}{problem}{where}".replace("\n", " ")


def load_yaml(text: str, where: str) -> Any:
    """Parse ``text`` (bounded and strict, see the module doc); errors name ``where``. A text parsed before
    comes from the parse cache (:mod:`tpsim.parsecache`; only documents that passed every check are kept)."""
    from .parsecache import cached_parse

    return cached_parse(text, STRICT_READER, lambda t: _parse_strict(t, where))


def _parse_strict(text: str, where: str) -> Any:
    import yaml

    try:
        check_size(text)
        return yaml.load(text, Loader=strict_loader())
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a scalar no constructor can read (check_size bounds numbers)
        raise InputError(f"{where}: unreadable value ({str(exc).splitlines()[0][:100]})") from None


def load_data(path: str | os.PathLike[str]) -> Any:
    """A YAML data file shipped with tpsim (``tpsim/data/...``): PyYAML's safe loading (with libyaml's parser
    where installed), through the parse cache. Not for user files: those go through :func:`read_yaml`."""
    from pathlib import Path

    from .parsecache import cached_parse

    return cached_parse(Path(path).read_text(), SAFE_READER, _parse_safe)


def _parse_safe(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=base_loader())


def write_parse_seed(folders: list[os.PathLike[str]]) -> tuple[int, int]:
    """Write :data:`tpsim.parsecache.SEED_FILE`: every YAML file under ``folders`` (tpsim/data and the
    topologies folder) as both readers parse it (a file the strict reader refuses has no strict entry).
    Returns (files, entries)."""
    from pathlib import Path

    from .io import atomic_write_bytes
    from .parsecache import SEED_FILE, entry_key, seed_payload

    files = [p for folder in folders for p in sorted(Path(folder).rglob("*.yaml"))]
    documents: dict[str, Any] = {}
    for path in files:
        text = path.read_text()
        documents[entry_key(text, SAFE_READER)] = _parse_safe(text)
        try:
            documents[entry_key(text, STRICT_READER)] = _parse_strict(text, str(path))
        except InputError:
            pass
    atomic_write_bytes(SEED_FILE, seed_payload(documents), "parse seed")
    return len(files), len(documents)


def read_yaml(path: str | os.PathLike[str], what: str = "YAML file", max_bytes: int = MAX_YAML_BYTES) -> Any:
    """The parsed document of a YAML file (see :func:`load_yaml`); the file is read with
    :func:`tpsim.io.read_text` (a regular UTF-8 file of at most ``max_bytes``)."""
    text = read_text(path, what, max_bytes)
    return load_yaml(text, os.fspath(path))


# ----------------------------------------------------------------------------------------------- kinds
_LINK_TYPES = ("nvlink", "pcie", "ib", "ethernet", "ici", "loopback", "cpu")
_FABRIC_TYPES = ("none", "fat_tree", "rail_optimized", "torus")


def kind_of(data: Any, text: str = "") -> str | None:
    """What a parsed YAML/JSON file looks like: ``cluster``, ``node template``, ``fabric``, ``link kinds``,
    ``calibration``, ``model config``, ``kernel profile``, ``collective measurements`` or None."""
    head = text.lstrip()[:200]
    if head.startswith("# tpsim kernel profile") or head.startswith("kind,op,dtype"):
        return "kernel profile"
    if head.replace(" ", "").startswith("backend,op,nranks"):
        return "collective measurements"
    if not isinstance(data, Mapping):
        return None
    keys = {k for k in data if isinstance(k, str)}
    if {"node", "fabric"} <= keys:
        return "cluster"
    if {"devices", "links"} <= keys:
        return "node template"
    if "link_kinds" in keys:
        return "link kinds"
    if data.get("type") in _FABRIC_TYPES and not keys & {"node", "devices"}:
        return "fabric"
    if keys & {"model_type", "hidden_size", "num_hidden_layers", "n_embd", "n_layer"}:
        return "model config"
    if keys & (set(_LINK_TYPES) | {"gloo_ops", "compute"}) and not keys & {"node", "fabric", "devices"}:
        return "calibration"
    return None


def check_kind(data: Any, expected: str, where: str, text: str = "") -> None:
    """Refuse a file that is recognisably of another kind than ``expected``, naming what it is."""
    found = kind_of(data, text)
    if found is not None and found != expected:
        article = "an" if found[0] in "aeiou" else "a"
        raise InputError(f"{where} is {article} {found} file, not a {expected}")


__all__ = ["strict_loader", "base_loader", "load_yaml", "load_data", "read_yaml", "check_size", "kind_of",
           "check_kind"]
