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
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float, field: str = "bytes") -> int:
    """Parse a size such as ``1GiB``, ``256M``, ``4096`` or ``1.5k`` (binary suffixes: K = 2**10 ...)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE_RE.match(str(text))
        if not match or match.group(2).lower() not in _SUFFIX:
            raise InputError(f"{field}={text!r} is not a size (examples: 4096, 64KiB, 256M, 1GiB)")
        value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not value > 0 or value != value:
        raise InputError(f"{field}={text!r} must be a positive size")
    return int(round(value))


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
