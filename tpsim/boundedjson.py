"""The one JSON reader of tpsim for user files (issue 26): bounded before parsing, linear in the input's size.

Every JSON input (a model ``config.json``, an ``*.ops.json`` op graph, a DeepSpeed ``ds_config.json``) goes
through :func:`loads`, which bounds

* the nesting depth of arrays and objects (at most ``max_depth``);
* the number of values (at most ``max_items``: commas, brackets and colons outside strings bound it);
* the longest run of digits outside strings (at most :data:`tpsim.limits.MAX_NUMBER_DIGITS`: converting a
  5,000-digit integer is quadratic, and no count in a training config needs more than 20 digits);

refuses NaN/Infinity (not JSON), non-finite floats (``1e999``) and repeated keys (JSON readers resolve them
differently). Every step runs at C speed and is linear in the size, for every shape (``benchmarks/
bench_parse.py``: 22 hostile shapes of 10 MB): byte counts and one table translation screen the text before the
C decoder runs (a screen that fires hands over to the exact, vectorized :func:`scan`), and one walk over the
decoded containers, level by level, measures depth and members afterwards (the decoder's recursion guard stops
what nests deeper than the screen allows). Every failure is one :class:`~tpsim.errors.InputError` line naming
``where``.
"""

from __future__ import annotations

import gc
import json
import math
import re
from operator import itemgetter
from typing import Any

from .errors import InputError
from .limits import MAX_JSON_DEPTH, MAX_JSON_ITEMS, MAX_NUMBER_DIGITS

# A JSON string: a quote, runs of ordinary characters and escapes, and the closing quote if there is one. The
# closing quote is optional so that the pattern matches wherever it starts: an unterminated string costs one
# pass to the end, never one pass per quote (the quadratic scan of issue 26).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_KEY = re.compile(r'"([^"\\]{1,80})"\s*:')
_CONSTANT = re.compile(r"-?\b(?:NaN|Infinity)\b")
_NAMED_CONSTANT = re.compile(r'"([^"\\]{1,80})"\s*:\s*\[?\s*(-?(?:NaN|Infinity))\b')
_DIGITS = re.compile(r"[0-9]{%d,}" % (MAX_NUMBER_DIGITS + 1))


def scan(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> int:
    """Refuse ``text`` when its depth, value count or longest digit run outside strings exceeds the bounds;
    returns the colons outside strings (the members of all objects of a valid document).

    Vectorized: escaped backslashes and quotes are dropped with ``str.replace`` (C speed; inside a JSON string
    backslashes pair left to right), then the bytes inside strings are found from the parity of the quotes
    before them (one cumulative sum) and blanked, and the depth, the value count and the digit runs are counted
    on what is left. No regular expression runs over the whole text (one per escape was 0.5 s per 2 MB)."""
    import numpy as np

    unescaped = text.replace("\\\\", "").replace('\\"', "")
    codes = np.frombuffer(unescaped.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    quote = codes == 0x22
    outside = (np.cumsum(quote, dtype=np.uint8) & 1) == 0  # parity survives the uint8 wrap-around
    outside &= ~quote
    bare = np.where(outside, codes, np.uint8(0x20))
    digit = ((bare >= 0x30) & (bare <= 0x39)).view(np.int8)
    longest = 0
    if digit.any():  # runs from the +1/-1 steps of the digit mask: memory in the number of runs, not the size
        steps = np.diff(digit, prepend=np.int8(0), append=np.int8(0))
        longest = int((np.flatnonzero(steps == -1) - np.flatnonzero(steps == 1)).max())
    if longest > MAX_NUMBER_DIGITS:
        stripped = _STRING.sub('""', text)
        long_number = _DIGITS.search(stripped)
        digits = long_number.group() if long_number is not None else "9" * longest
        at = text.find(digits)
        line = f" on line {text.count(chr(10), 0, at) + 1}" if at >= 0 else ""
        keys = _KEY.findall(text[max(0, at - 400):max(at, 0)]) if at >= 0 else []
        field = f"{keys[-1]}=" if keys else "a number of "
        raise InputError(f"{where}: {field}{digits[:12]}...({len(digits)} digits){line}; numbers have at most "
                         f"{MAX_NUMBER_DIGITS} digits")
    flat = bare.tobytes()
    if b"NaN" in flat or b"Infinity" in flat:
        constant = _CONSTANT.search(flat.decode("utf-8", "replace"))
        if constant is not None:
            named = _NAMED_CONSTANT.search(text)
            field = f"{named.group(1)}={named.group(2)}" if named else constant.group(0)
            raise InputError(f"{where}: {field} is not a JSON number (NaN and Infinity are not JSON)")
    opens = (bare == 0x5B) | (bare == 0x7B)
    closes = (bare == 0x5D) | (bare == 0x7D)
    if opens.any():
        depth = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32))
        deepest = int(depth.max())
        if deepest > max_depth:
            raise InputError(f"{where}: JSON nested deeper than {max_depth} levels ({deepest})")
    members = int(np.count_nonzero(bare == 0x3A))
    items = int(np.count_nonzero(opens)) + int(np.count_nonzero(bare == 0x2C)) + members
    if items > max_items:
        raise InputError(f"{where}: more than {max_items:,} values (found about {items:,}); is it the right file?")
    return members


# Screens over the UTF-8 bytes: C-speed table lookups and searches (no per-character Python, no numpy pass).
# A screen is conservative (it also sees inside strings): when one fires, the exact :func:`scan` decides.
_SHAPE = bytes(0x30 if 0x30 <= c <= 0x39 else 0x65 if c in b"eE" else 0x73 if c in b"+-" else 0x2E
               for c in range(256))  # digit -> 0, exponent -> e, sign -> s, anything else -> .
_KEEP_QUOTES_COLONS = bytes(c for c in range(256) if c not in b'":')
_LONG_DIGITS = b"0" * (MAX_NUMBER_DIGITS + 1)
_BIG_EXPONENTS = (b"0e000", b"0es000")  # 1e308 overflows from three exponent digits on (40-digit mantissas)


def loads(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> Any:
    """The JSON document in ``text``, bounded (see the module doc); errors are one line naming ``where``.

    Fast path, linear and at C speed for every shape: a few byte counts and one table translation screen the
    value count, the digit runs, overflowing exponents and the nesting (each conservative: it sees inside
    strings too; when one fires, the exact :func:`scan` decides); the C decoder builds the document with plain
    dicts (its recursion guard stops nesting the screen let through), or, for a document of few objects with
    many members each (at least :data:`_PAIRS_PER_OBJECT` colons per brace), with a hook per object that
    refuses a repeated key at once. One walk over the containers, level by level with
    :func:`gc.get_referents` (C; it never looks at the type of a leaf), measures the depth and counts the
    values; values fewer than the text's upper bound (commas + brackets - empty containers) may mean a
    repeated key: the members are then counted exactly against the colons outside strings, and a repeated
    key is named by a second decode with a pairs hook."""
    if not isinstance(text, str):
        raise InputError(f"{where}: expected JSON text, got {type(text).__name__}")
    raw = text.encode("utf-8", "surrogatepass")
    braces = raw.count(b"{")
    opens = raw.count(b"[") + braces
    commas = raw.count(b",")
    colons = raw.count(b":")
    shape = raw.translate(_SHAPE)
    if opens + commas + colons > max_items or _LONG_DIGITS in shape:
        scan(text, where, max_depth, max_items)  # refuses, or the counts were inside strings
    big_exponent = any(e in shape for e in _BIG_EXPONENTS)
    unique_keys = (lambda pairs: _unique_keys(pairs, where)) if braces and colons >= _PAIRS_PER_OBJECT * braces \
        else None  # a few big objects: one hook call per object checks its keys (cheaper than a second decode)
    collecting = gc.isenabled()
    gc.disable()  # millions of new containers trigger full collections that make decoding superlinear
    try:
        try:
            doc = json.loads(text, parse_constant=lambda c: _refuse_constant(c, text, where),
                             object_pairs_hook=unique_keys)
        except RecursionError:
            raise InputError(f"{where}: JSON nested deeper than {max_depth} levels") from None
        if not big_exponent and opens <= max_depth and (
                unique_keys is not None or colons == 0
                or (opens == 1 and isinstance(doc, dict) and len(doc) == colons)):
            return doc  # no deeper than its brackets, and keys checked, or no colon, or one object with them all
        depth, values, infinite = _walk(doc, max_depth, big_exponent)
        if depth > max_depth:
            raise InputError(f"{where}: JSON nested deeper than {max_depth} levels ({depth})")
        if infinite:  # names the number
            json.loads(text, parse_constant=lambda c: _refuse_constant(c, text, where),
                       parse_float=lambda t: _finite_float(t, where))
        if unique_keys is not None or colons == 0 or _all_values(raw, values, commas, opens, colons):
            return doc
        members = _members(doc)
        if members == colons or members == _colons_outside(raw):
            return doc  # no key repeats (every colon outside strings made a member)
        return json.loads(text, parse_constant=lambda c: _refuse_constant(c, text, where),
                          object_pairs_hook=lambda pairs: _unique_keys(pairs, where))  # names the repeated key
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: malformed JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except InputError:
        raise
    except (ValueError, RecursionError, MemoryError) as exc:
        raise InputError(f"{where}: malformed JSON ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") \
            from None
    finally:
        if collecting:
            gc.enable()


# Colons per brace from which the decoder checks keys with a hook per object (one Python call per object
# costs about as much as decoding 64 members; below, a repeated key is found from the counts).
_PAIRS_PER_OBJECT = 64
_EMPTY = re.compile(rb"[\[{]\s*[\]}]")
# What gc.get_referents gives for one member of a dict with string keys: its value (CPython 3.11 on), or its
# key and its value.
_REFS_PER_MEMBER = len(gc.get_referents({"k": 0}))


def _all_values(raw: bytes, values: int, commas: int, opens: int, colons: int) -> bool:
    """Whether the decoded document holds every value of the text, so that no key repeated (a repeated key
    drops a member and its value's subtree). Every value but the root follows a comma or opens a non-empty
    container, outside strings: the byte counts (commas + brackets - empty containers) bound that number from
    above, equal when no comma or bracket sits inside a string; ``values`` (the walk's referents) bounds it
    from below, equal when no key repeated. Equal bounds prove it; otherwise the exact count decides."""
    extra = colons if _REFS_PER_MEMBER == 2 else 0  # older dicts also give their keys
    bound = commas + opens + extra - raw.count(b"[]") - raw.count(b"{}")
    if values == bound:
        return True
    return bound > values and values == commas + opens + extra - len(_EMPTY.findall(raw))


def _walk(doc: Any, max_depth: int, floats: bool = False) -> tuple[int, int, bool]:
    """(depth, values under the root, an infinite float?) of a decoded document, one level at a time: the next
    level is :func:`gc.get_referents` of this one (C: a list's items, a dict's values; strings and numbers
    have none, so a leaf's type is never looked at); ``floats``: look for infinite floats too (the decoder
    turns 1e999 into inf). Each non-empty level of referents is one level of nesting; the last level's empty
    containers add one, looked at only where that decides the bound."""
    depth = values = 0
    infinite = False
    level = [doc]
    while True:
        if floats and not infinite:
            infinite = math.inf in level or -math.inf in level
        deeper = gc.get_referents(*level)
        if not deeper:
            if depth >= max_depth and not {list, dict}.isdisjoint(map(type, level)):
                depth += 1  # empty containers one level deeper
            return depth, values, infinite
        depth += 1
        values += len(deeper)
        level = deeper


def _members(doc: Any) -> int:
    """Members of every object of a decoded document, one level at a time (the dicts of each level filtered
    and their sizes summed at C speed)."""
    members = 0
    level = [doc]
    while True:
        kinds = set(map(type, level))  # one C pass; most levels hold one or two kinds
        if dict not in kinds and list not in kinds:
            return members
        if dict in kinds:
            members += sum(map(len, filter(dict.__instancecheck__, level))) if len(kinds) > 1 else \
                sum(map(len, level))
        level = gc.get_referents(*level)


def _colons_outside(raw: bytes) -> int:
    """Colons outside strings of a valid JSON document: escapes dropped and everything but quotes and colons
    deleted at C speed, then the colons after an even number of quotes counted (one cumulative sum)."""
    import numpy as np

    bare = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _KEEP_QUOTES_COLONS)
    codes = np.frombuffer(bare, dtype=np.uint8)
    inside = (np.cumsum(codes == 0x22, dtype=np.uint8) & 1).view(bool)  # parity survives the uint8 wrap-around
    return int(np.count_nonzero(codes == 0x3A)) - int(np.count_nonzero(inside & (codes == 0x3A)))


def _refuse_constant(name: str, text: str, where: str) -> Any:
    named = _NAMED_CONSTANT.search(text)
    field = f"{named.group(1)}={named.group(2)}" if named else name
    raise InputError(f"{where}: {field} is not a JSON number (NaN and Infinity are not JSON)")


def _finite_float(text: str, where: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{where}: number {text[:40]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    out = dict(pairs)  # C speed; what follows runs only when a key repeats
    if len(out) != len(pairs):
        keys = list(map(itemgetter(0), pairs))
        last = dict(zip(keys, range(len(keys))))  # key -> its last position (C speed)
        at = min(set(range(len(keys))).difference(last.values()))  # the first position that is not a key's last
        raise InputError(f"{where}: key {keys[at][:60]!r} appears twice in one object")
    return out


__all__ = ["loads", "scan"]
