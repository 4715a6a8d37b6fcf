"""Issue 26, the one JSON reader (tpsim.boundedjson): its fast paths (byte counts, the referents walk, the
per-object hook for big objects) decide exactly what the slow, obvious reader decides: the same document, or
a refusal for a repeated key, for nesting past the limit, for a non-finite number."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.boundedjson import _PAIRS_PER_OBJECT, loads
from tpsim.errors import InputError

SETTINGS = settings(derandomize=True, deadline=None, max_examples=150, database=None)

# keys and strings rich in what the byte counts see: commas, brackets, colons, quotes, backslashes, braces
TEXT = st.text(alphabet=st.sampled_from(list('ab,:[]{}"\\ \u00e9')), max_size=6)
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), TEXT,
                 st.floats(allow_nan=False, allow_infinity=False, width=32),
                 st.sampled_from(["1.5e300", "1e999", "-1e999"]).map(float))
VALUE = st.recursive(LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.lists(st.tuples(TEXT, inner), max_size=5)), max_leaves=25)  # objects as pairs: keys may repeat


def _text(value, spaced: bool) -> str:
    """JSON text of ``value``, objects written from their pairs (so that keys may repeat), 1e999 as such."""
    sep = ", " if spaced else ","
    if isinstance(value, Obj):
        return "{" + sep.join(json.dumps(k) + (": " if spaced else ":") + _text(v, spaced) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + (" " if spaced and not value else "") + sep.join(_text(v, spaced) for v in value) + "]"
    if isinstance(value, float) and math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    return json.dumps(value)


class Obj(list):
    """An object as its list of pairs."""


def _objects(value):
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return Obj((k, _objects(v)) for k, v in value)
    if isinstance(value, list):
        return [_objects(v) for v in value]
    return value


def _reference(text: str, max_depth: int):
    """The obvious reader: a pairs hook that refuses repeated keys, inf refused, depth measured recursively."""
    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise KeyError
        return dict(items)

    def depth(v):
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        return 0

    def finite(t):
        if not math.isfinite(float(t)):
            raise OverflowError
        return float(t)

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_float=finite)
    except (KeyError, OverflowError):
        return "refused"
    return "refused" if depth(doc) > max_depth else doc


@SETTINGS
@given(VALUE, st.booleans(), st.integers(1, 6))
def test_loads_decides_what_the_obvious_reader_decides(value, spaced, max_depth):
    text = _text(_objects(value), spaced)
    expected = _reference(text, max_depth)
    try:
        got = loads(text, "doc.json", max_depth=max_depth)
    except InputError as exc:
        assert expected == "refused", (text, str(exc))
        assert str(exc).startswith("doc.json: ") and "\n" not in str(exc)
        return
    assert expected != "refused", text
    assert got == expected


@pytest.mark.parametrize("n", [_PAIRS_PER_OBJECT - 1, _PAIRS_PER_OBJECT, 5 * _PAIRS_PER_OBJECT])
@pytest.mark.parametrize("where", ["first", "middle", "last", "nested"])
def test_repeated_key_named_on_both_paths(n, where):
    """Below and above the colons per brace where the hook decodes: the repeated key is named either way."""
    keys = [f"k{i}" for i in range(n)]
    at = {"first": 0, "middle": n // 2, "last": n - 1}.get(where, 1)
    members = [f'"{k}": {i}' for i, k in enumerate(keys)] + [f'"{keys[at]}": [1]']
    if where == "nested":
        text = '{"outer": {' + ", ".join(members) + '}, "x": [{}, []]}'
    else:
        text = "{" + ", ".join(members) + "}"
    with pytest.raises(InputError, match=f"key '{keys[at]}' appears twice in one object"):
        loads(text, "doc.json")
    assert loads(text.replace(f'"{keys[at]}": [1]', '"extra": [1]'), "doc.json")["extra"] == [1] if where != "nested" \
        else loads(text.replace(f'"{keys[at]}": [1]', '"extra": [1]'), "doc.json")["outer"]["extra"] == [1]


def test_depth_exact_at_the_limit_with_empty_containers():
    """The walk counts a last level of empty containers: 64 levels pass, 65 are refused, whatever sits inside."""
    for inner in ("[]", "{}", "[1]", '{"a": 1}', '"x"'):
        ok = "[" * 63 + inner + "]" * 63
        deep = "[" * 64 + inner + "]" * 64
        depth_ok = 63 + (1 if inner[0] in "[{" else 0)
        assert depth_ok <= 64 and loads(ok, "d.json") is not None
        if inner[0] in "[{":
            with pytest.raises(InputError, match="nested deeper than 64 levels"):
                loads(deep, "d.json")
