"""Declared schemas of tpsim's input formats (issue 26): the mechanism.

A format declares its schema once (:class:`Schema`: named :class:`Field` s with types, ranges from
:mod:`tpsim.limits`, enums, nesting, and cross-field :class:`Rule` s) and registers it (:func:`register`);
its reader calls :func:`check` on the parsed document *before* using any of it. The registry
(:func:`schemas`) is what the fuzz suite (tests/test_fuzz_schemas.py) generates hostile documents from, so a
field added to a schema is fuzzed without writing a test for it. The schemas themselves live in
:mod:`tpsim.schemas` (one place for every format); a new format adds its schema there, or declares it in its
own module and lists that module in :data:`SCHEMA_MODULES`.

Every failure is one :class:`~tpsim.errors.InputError` line ``<file>: <field path>=<value> <problem>``; a
number is checked by the same :func:`tpsim.limits.check_int` / :func:`tpsim.limits.check_float` as the
command line's flags, against the same bound.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .errors import InputError
from .limits import FLOAT_LIMITS, LIMITS, MAX_CLI_INT, check_float, check_int, show

KINDS = ("int", "float", "bool", "str", "enum", "list", "map", "any")


@dataclass(frozen=True)
class Field:
    """One field of a format: its kind and what values it accepts.

    ``limit`` names the :data:`tpsim.limits.LIMITS` (int) or :data:`tpsim.limits.FLOAT_LIMITS` (float) entry
    that bounds it, as for the flag of the same meaning; ``minimum``/``maximum`` override. ``also`` lists
    literal values accepted besides the kind (``"auto"`` in a DeepSpeed config, ``None`` for a nullable
    field). ``items`` is the element of a list; ``schema`` the nested schema of a map, ``values`` the field
    every value of a map with free keys obeys."""

    kind: str
    limit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()
    also: tuple = ()
    required: bool = False
    items: "Field | None" = None
    schema: "Schema | None" = None
    values: "Field | None" = None
    max_len: int | None = None
    inclusive: bool = True
    accept: Callable[[Any], bool] | None = field(default=None, compare=False)
    """values accepted as they are when this returns true (a NeMo ``${...}`` interpolation)."""
    doc: str = ""

    def bounds(self) -> tuple[float | None, float | None]:
        """(smallest, largest) accepted number, the limits table's bound when none is given."""
        if self.kind == "int":
            low = 1 if self.minimum is None else self.minimum
            high = self.maximum if self.maximum is not None else LIMITS.get(self.limit or "", MAX_CLI_INT)
            return low, high
        if self.kind == "float":
            low = 0.0 if self.minimum is None else self.minimum
            high = self.maximum if self.maximum is not None else FLOAT_LIMITS.get(self.limit or "", 1e15)
            return low, high
        return None, None


def Int(limit: str | None = None, *, minimum: int = 1, maximum: int | None = None, also: tuple = (),
        required: bool = False, doc: str = "") -> Field:
    """An integer in ``[minimum, LIMITS[limit]]`` (booleans, strings, fractions refused)."""
    return Field("int", limit=limit, minimum=minimum, maximum=maximum, also=also, required=required, doc=doc)


def Float(limit: str | None = None, *, minimum: float = 0.0, maximum: float | None = None, inclusive: bool = False,
          also: tuple = (), required: bool = False, doc: str = "") -> Field:
    """A finite number above ``minimum`` (or equal when ``inclusive``), at most the limit."""
    return Field("float", limit=limit, minimum=minimum, maximum=maximum, inclusive=inclusive, also=also,
                 required=required, doc=doc)


def Bool(*, also: tuple = (), required: bool = False, doc: str = "") -> Field:
    """A real boolean: ``"true"``, ``1`` and the like are refused (they were read as the opposite)."""
    return Field("bool", also=also, required=required, doc=doc)


def Str(*, max_len: int = 4096, also: tuple = (), required: bool = False, doc: str = "") -> Field:
    """A non-empty string of at most ``max_len`` characters."""
    return Field("str", max_len=max_len, also=also, required=required, doc=doc)


def Enum(*choices: Any, also: tuple = (), required: bool = False, doc: str = "") -> Field:
    """One of ``choices`` (compared with their types: ``1`` is not ``True``)."""
    return Field("enum", choices=tuple(choices), also=also, required=required, doc=doc)


def List(items: Field, *, max_len: int = 1 << 16, also: tuple = (), required: bool = False, doc: str = "") -> Field:
    """A list of at most ``max_len`` elements, each an ``items``."""
    return Field("list", items=items, max_len=max_len, also=also, required=required, doc=doc)


def Map(schema: "Schema | None" = None, *, values: Field | None = None, max_len: int = 1 << 16, also: tuple = (),
        required: bool = False, doc: str = "") -> Field:
    """A mapping: named fields (``schema``) or free keys whose values are each a ``values``."""
    return Field("map", schema=schema, values=values, max_len=max_len, also=also, required=required, doc=doc)


def Any_(*, required: bool = False, doc: str = "") -> Field:
    """Anything (the reader checks it; the fuzz suite still sends hostile values)."""
    return Field("any", required=required, doc=doc)


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: ``test(document)`` returns None when it holds, else ``(field path, value,
    problem)``."""

    doc: str
    test: Callable[[Mapping[str, Any]], "tuple[str, Any, str] | None"]


@dataclass(frozen=True)
class Schema:
    """The fields of one mapping (a file's top level or a nested section). ``extra``: what to do with a key
    that is not declared (``"ignore"``: the reader lists it as unused; ``"refuse"``)."""

    name: str
    fields: Mapping[str, Field]
    rules: tuple[Rule, ...] = ()
    extra: str = "ignore"
    doc: str = ""
    example: Callable[[], Any] | None = field(default=None, compare=False)
    """a valid document (the fuzz suite mutates it)."""
    read: Callable[[Any, str], Any] | None = field(default=None, compare=False)
    """the format's entry point on a parsed document (``read(document, where)``): what the fuzz suite calls."""


def _fail(where: str, path: str, value: Any, problem: str) -> InputError:
    prefix = f"{where}: " if where else ""
    return InputError(f"{prefix}{path}={show(value)} {problem}")


def check_value(spec: Field, value: Any, path: str, where: str) -> Any:
    """``value`` checked against ``spec`` (a float field returns a float; everything else as given)."""
    if any(value is v or (type(value) is type(v) and value == v) for v in spec.also):
        return value
    if spec.accept is not None and spec.accept(value):
        return value
    kind = spec.kind
    if kind == "any":
        return value
    if kind == "int":
        low, high = spec.bounds()
        return check_int(path, value, where, minimum=int(low), maximum=int(high))
    if kind == "float":
        low, high = spec.bounds()
        return check_float(path, value, where, minimum=float(low), inclusive=spec.inclusive, maximum=float(high))
    if kind == "bool":
        if not isinstance(value, bool):
            hint = " (a string, not a boolean)" if isinstance(value, str) else ""
            raise _fail(where, path, value, f"must be true or false{hint}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _fail(where, path, value, "must be a string")
        if not value.strip():
            raise _fail(where, path, value, "must not be empty")
        if spec.max_len is not None and len(value) > spec.max_len:
            raise _fail(where, path, value, f"is longer than {spec.max_len} characters")
        return value
    if kind == "enum":
        for choice in spec.choices:
            if type(value) is type(choice) and value == choice:
                return value
        names = ", ".join(str(c) for c in spec.choices[:12]) + (", ..." if len(spec.choices) > 12 else "")
        raise _fail(where, path, value, f"is not one of {names}")
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise _fail(where, path, value, "must be a list")
        if spec.max_len is not None and len(value) > spec.max_len:
            raise _fail(where, path, value, f"has {len(value):,} elements, more than {spec.max_len:,}")
        assert spec.items is not None
        return [check_value(spec.items, v, f"{path}[{i}]", where) for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, Mapping):
            raise _fail(where, path, value, "must be a mapping (an object of named fields)")
        if spec.max_len is not None and len(value) > spec.max_len:
            raise _fail(where, path, value, f"has {len(value):,} entries, more than {spec.max_len:,}")
        if spec.schema is not None:
            check(spec.schema, value, where, prefix=f"{path}.")
        if spec.values is not None:
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _fail(where, f"{path}.{k!r}", k, "must be a name (a string key)")
                check_value(spec.values, v, f"{path}.{k}", where)
        return value
    raise ValueError(f"unknown field kind {kind!r}")  # a schema bug, not an input error


def check(schema: Schema, data: Any, where: str, prefix: str = "") -> Any:
    """Check ``data`` against ``schema`` (required fields, each present field, unknown keys, the rules);
    returns ``data`` unchanged. The first problem is raised as one line."""
    top = prefix.rstrip(".") or "top level"
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: {top} must be a mapping of named fields, not {_kind_name(data)}")
    if not prefix:
        check_depth(data, where)
    for key in data:
        if not isinstance(key, str):
            raise _fail(where, f"{prefix}{key!r}", key, "must be a name (a string key)")
    for name, spec in schema.fields.items():
        if name not in data:
            if spec.required:
                raise InputError(f"{where}: {prefix}{name} is missing (required)")
            continue
        value = data[name]
        if value is None and spec.required is False and None in spec.also:
            continue
        check_value(spec, value, f"{prefix}{name}", where)
    if schema.extra == "refuse":
        unknown = [k for k in data if k not in schema.fields]
        if unknown:
            known = ", ".join(sorted(schema.fields))
            raise InputError(f"{where}: {top}: unknown key {unknown[0]!r} (allowed: {known})")
    for rule in schema.rules:
        problem = rule.test(data)
        if problem is not None:
            path, value, text = problem
            raise _fail(where, f"{prefix}{path}", value, text)
    return data


def check_depth(data: Any, where: str, limit: int | None = None) -> None:
    """Refuse a document nested deeper than :data:`tpsim.limits.MAX_JSON_DEPTH` (any format: TOML tables
    ``[a.a.a...]`` and YAML flow collections reach the schema without a byte-level depth scan). Iterative and
    linear in the containers of the document."""
    from .limits import MAX_JSON_DEPTH

    top = MAX_JSON_DEPTH if limit is None else limit
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > top:
            raise InputError(f"{where}: nested more than {top} levels deep")
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (Mapping, list, tuple)))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (Mapping, list, tuple)))


def _kind_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number" if not isinstance(value, float) or math.isfinite(value) else "a non-finite number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


# ----------------------------------------------------------------------------------------------- CSV rows
CSV_TRUE = ("true", "yes", "1", "on")
CSV_FALSE = ("false", "no", "0", "off")


def typed_cells(schema: Schema, cells: Mapping[str, str]) -> dict[str, Any]:
    """A CSV row's text cells as the schema's kinds, for :func:`check`: ASCII integers (at most
    :data:`tpsim.limits.MAX_NUMBER_DIGITS` digits) for int fields, numbers of at most 64 characters for float
    fields, ``true/false/yes/no/1/0/on/off`` for bool fields; an empty cell is absent; anything else stays text
    (the check then names it: ``²``, ``8.0``, ``nan`` in an int column)."""
    from .limits import ascii_int

    out: dict[str, Any] = {}
    for key, text in cells.items():
        text = text.strip() if isinstance(text, str) else text
        if text == "" or text is None:
            continue
        spec = schema.fields.get(key)
        kind = spec.kind if spec is not None else "str"
        if kind == "int":
            number = ascii_int(text.lstrip("+"), signed=True)
            out[key] = number if number is not None else text
        elif kind == "float":
            try:
                out[key] = float(text) if len(text) <= 64 else text
            except ValueError:
                out[key] = text
        elif kind == "bool":
            low = text.lower()
            out[key] = True if low in CSV_TRUE else False if low in CSV_FALSE else text
        else:
            out[key] = text
    return out


# ----------------------------------------------------------------------------------------------- registry
_REGISTRY: dict[str, Schema] = {}
SCHEMA_MODULES = ("tpsim.schemas", "tpsim.design.sweep")
"""Modules that declare and register schemas; :func:`schemas` imports them all. A format whose schema is
declared in its own module (the runs CSV in tpsim/runs.py, a sweep file in tpsim/design/) lists it here."""


def register(schema: Schema) -> Schema:
    """Add ``schema`` to the registry under its name (a second schema of the same name is a bug)."""
    if schema.name in _REGISTRY and _REGISTRY[schema.name] is not schema:
        raise ValueError(f"schema {schema.name!r} registered twice")
    _REGISTRY[schema.name] = schema
    return schema


def schemas() -> dict[str, Schema]:
    """Every registered format's schema, by name (imports :data:`SCHEMA_MODULES`)."""
    for module in SCHEMA_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a format whose module has not landed yet
            if exc.name != module:
                raise
    return dict(_REGISTRY)


def get(name: str) -> Schema:
    """The registered schema ``name``."""
    found = schemas().get(name)
    if found is None:
        raise KeyError(f"no schema {name!r} (registered: {', '.join(sorted(_REGISTRY))})")
    return found


def walk(schema: Schema, prefix: str = "") -> Iterator[tuple[str, Field]]:
    """Every (field path, field) of ``schema``, nested maps included (``[]`` marks a list element)."""
    for name, spec in schema.fields.items():
        path = f"{prefix}{name}"
        yield path, spec
        inner = spec
        while inner.kind == "list" and inner.items is not None:
            path += "[]"
            inner = inner.items
        if inner.kind == "map" and inner.schema is not None:
            yield from walk(inner.schema, f"{path}.")


__all__ = ["Field", "Int", "Float", "Bool", "Str", "Enum", "List", "Map", "Any_", "Rule", "Schema", "check",
           "check_depth",
           "typed_cells", "CSV_TRUE", "CSV_FALSE",
           "check_value", "register", "schemas", "get", "walk", "SCHEMA_MODULES", "KINDS"]
