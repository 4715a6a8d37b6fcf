"""The one JSON reader of tpsim for user files (issue 26): bounded before parsing, linear in the input's size.

Every JSON input (a model ``config.json``, an ``*.ops.json`` op graph, a DeepSpeed ``ds_config.json``) goes
through :func:`loads`. Before :func:`json.loads` builds anything, one pass over the text (regular expressions
without backtracking and numpy, so linear in the size: a 10 MB document of any shape is scanned in well under
a second) measures

* the nesting depth of arrays and objects outside strings (at most ``max_depth``: the C decoder recurses);
* the number of values (at most ``max_items``: commas, brackets and colons outside strings bound it);
* the longest run of digits outside strings (at most :data:`tpsim.limits.MAX_NUMBER_DIGITS`: converting a
  5,000-digit integer is quadratic, and no count in a training config needs more than 20 digits).

Then the document is decoded with NaN/Infinity refused (not JSON), non-finite floats refused, and repeated keys
refused (JSON readers resolve them differently). Every failure is one :class:`~tpsim.errors.InputError` line
naming ``where``.
"""

from __future__ import annotations

import gc
import json
import math
import re
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


def loads(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> Any:
    """The JSON document in ``text``, bounded (see the module doc); errors are one line naming ``where``."""
    if not isinstance(text, str):
        raise InputError(f"{where}: expected JSON text, got {type(text).__name__}")
    members = scan(text, where, max_depth, max_items)
    collecting = gc.isenabled()
    gc.disable()  # millions of new containers trigger full collections that make decoding superlinear
    try:
        doc = json.loads(text, parse_constant=lambda c: _refuse_constant(c, where),
                         parse_float=lambda t: _finite_float(t, where))
        if _members(doc) == members:
            return doc  # no key repeats: every colon made a member (the decoder's C dict path, no hook)
        return json.loads(text, parse_constant=lambda c: _refuse_constant(c, where),
                          parse_float=lambda t: _finite_float(t, where),
                          object_pairs_hook=lambda pairs: _unique_keys(pairs, where))
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


def _members(doc: Any) -> int:
    """Members of every object in ``doc`` (iterative: a walk over the containers only)."""
    total, stack = 0, [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            total += len(node)
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return total


def _refuse_constant(name: str, where: str) -> Any:
    raise InputError(f"{where}: {name} is not a JSON number")


def _finite_float(text: str, where: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{where}: number {text[:40]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    out = dict(pairs)  # C speed; the loop below runs only when a key repeats
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise InputError(f"{where}: key {key[:60]!r} appears twice in one object")
            seen.add(key)
    return out


__all__ = ["loads", "scan"]
