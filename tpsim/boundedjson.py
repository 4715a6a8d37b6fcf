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


def scan(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> None:
    """Refuse ``text`` when its depth, value count or longest digit run outside strings exceeds the bounds."""
    import numpy as np

    bare = _STRING.sub('""', text)
    long_number = _DIGITS.search(bare)
    if long_number is not None:
        digits = long_number.group()
        at = text.find(digits)
        line = f" on line {text.count(chr(10), 0, at) + 1}" if at >= 0 else ""
        keys = _KEY.findall(text[max(0, at - 400):max(at, 0)]) if at >= 0 else []
        field = f"{keys[-1]}=" if keys else "a number of "
        raise InputError(f"{where}: {field}{digits[:12]}...({len(digits)} digits){line}; numbers have at most "
                         f"{MAX_NUMBER_DIGITS} digits")
    constant = _CONSTANT.search(bare)
    if constant is not None:
        named = _NAMED_CONSTANT.search(text)
        field = f"{named.group(1)}={named.group(2)}" if named else constant.group(0)
        raise InputError(f"{where}: {field} is not a JSON number (NaN and Infinity are not JSON)")
    data = bare.encode("utf-8", "surrogatepass")
    codes = np.frombuffer(data, dtype=np.uint8)
    opens = (codes == 0x5B) | (codes == 0x7B)
    closes = (codes == 0x5D) | (codes == 0x7D)
    if opens.any():
        depth = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32))
        deepest = int(depth.max())
        if deepest > max_depth:
            raise InputError(f"{where}: JSON nested deeper than {max_depth} levels ({deepest})")
    items = int(np.count_nonzero(opens)) + int(np.count_nonzero(codes == 0x2C)) + int(np.count_nonzero(codes == 0x3A))
    if items > max_items:
        raise InputError(f"{where}: more than {max_items:,} values (found about {items:,}); is it the right file?")


def loads(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> Any:
    """The JSON document in ``text``, bounded (see the module doc); errors are one line naming ``where``."""
    if not isinstance(text, str):
        raise InputError(f"{where}: expected JSON text, got {type(text).__name__}")
    scan(text, where, max_depth, max_items)
    collecting = gc.isenabled()
    gc.disable()  # millions of new containers trigger full collections that make decoding superlinear
    try:
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


def _refuse_constant(name: str, where: str) -> Any:
    raise InputError(f"{where}: {name} is not a JSON number")


def _finite_float(text: str, where: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{where}: number {text[:40]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"{where}: key {key[:60]!r} appears twice in one object")
        out[key] = value
    return out


__all__ = ["loads", "scan"]
