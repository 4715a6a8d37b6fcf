"""Units and parsing of sizes.

Conventions used everywhere in tpsim: time in seconds, sizes in bytes, bandwidth in bytes/s internally
(files and reports use GB/s = 1e9 B/s, as nccl-tests does), memory reports in GiB = 2**30 B.
"""

from __future__ import annotations

import re

from .errors import InputError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
GB = 1e9
TB = 1e12
US = 1e-6

_SUFFIX = {
    "": 1, "b": 1,
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": GiB, "gb": GiB, "gib": GiB,
    "t": TiB, "tb": TiB, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]{1,4}))?\s*([A-Za-z]*)\s*$")
_MAX_SIZE_TEXT = 64
"""longest size text parsed (a 400-digit number is refused by its length, before any arithmetic)."""


def parse_bytes(text: str | int | float, field: str = "bytes") -> int:
    """Parse a size such as ``1GiB``, ``256M``, ``4096``, ``1.5k`` or ``2e6`` (binary suffixes: K = 2**10 ...)
    exactly (decimal arithmetic on the text, no float rounding: ``9007199254740993`` stays odd). The size
    must be a whole number of bytes in ``[1, tpsim.limits.LIMITS["bytes"]]``."""
    from fractions import Fraction

    from .limits import LIMITS, show

    top = LIMITS["bytes"]
    if isinstance(text, bool):
        raise InputError(f"{field}={text!r} is not a size")
    if isinstance(text, int):
        value = Fraction(text)
    elif isinstance(text, float):
        if text != text or text in (float("inf"), float("-inf")):
            raise InputError(f"{field}={text!r} must be a finite size")
        value = Fraction(text)
    else:
        raw = str(text)
        match = _SIZE_RE.match(raw) if len(raw) <= _MAX_SIZE_TEXT else None
        if len(raw) > _MAX_SIZE_TEXT and raw.strip().isdigit():
            raise InputError(f"{field}={show(raw)} is above the supported maximum {top} bytes")
        if not match or not (match.group(1) or match.group(2)) or match.group(4).lower() not in _SUFFIX:
            raise InputError(f"{field}={show(raw)} is not a size (examples: 4096, 64KiB, 256M, 1.5GiB)")
        whole, frac, exp, suffix = match.groups()
        exponent = int(exp or 0)
        if exponent > 30:
            raise InputError(f"{field}={raw!r} is above the supported maximum {top} bytes")
        digits = (whole or "") + (frac or "")
        value = Fraction(int(digits or "0"), 10 ** len(frac or "")) * Fraction(10) ** exponent
        value *= _SUFFIX[suffix.lower()]
    if value <= 0:
        raise InputError(f"{field}={show(text)} must be a positive size")
    if value.denominator != 1:
        raise InputError(f"{field}={show(text)} is not a whole number of bytes ({float(value):g})")
    if value > top:
        raise InputError(f"{field}={show(text)} is above the supported maximum {top} bytes")
    return int(value)


def format_bytes(n: float) -> str:
    """Human-readable binary size (``1.0 GiB``)."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    """Human-readable duration with a unit that keeps 3 significant figures."""
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"
