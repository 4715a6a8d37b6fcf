"""Measured convolution kernels (``python -m tpsim.profiler.conv``) for the op-graph cost model (torch-free).

Rows are keyed by (kernel size, dtype, pass) and the pass's implicit-GEMM dims (m, n, k); each table is a
:class:`tpsim.compute.profile.GridTable` (the GEMM profile's machinery: multilinear interpolation of log time
over log dims inside the grid, ``measured=True``; outside it the table's fitted roofline anchored at the
nearest grid point, ``measured=False``). Convolutions the file has no table for (other kernel sizes, groups,
3-D) are timed by the compute model's implicit GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..compute.profile import GridTable, ProfilePoint
from ..errors import InputError

COLUMNS = ("kind", "op", "dtype", "pass", "m", "n", "k", "batch", "in_channels", "out_channels", "size",
           "time_s", "reps", "spread_pct")
PASSES = ("fwd", "dgrad", "wgrad")


@dataclass(frozen=True)
class ConvProfile:
    path: str
    device: str
    device_type: str
    tables: dict[tuple[str, str, str], GridTable]
    """(op such as conv2d_k3, dtype, pass) -> table over (m, n, k)."""

    @property
    def source(self) -> str:
        return f"conv-profile:{Path(self.path).name}"

    def lookup(self, op: Any, phase: str, dtype: str, m: Any, n: Any, k: Any,
               groups: float = 1.0) -> tuple[np.ndarray, np.ndarray] | None:
        """(seconds, measured) of one pass of a traced convolution op, or None when there is no table."""
        a = op.attrs
        if op.kind != "conv2d" or groups != 1 or a.get("transposed") or len(set(a["kernel"])) != 1:
            return None
        table = self.tables.get((f"conv2d_k{a['kernel'][0]}", dtype, phase))
        if table is None:
            return None
        return table.lookup((m, n, k))


def load_conv_profile(path: str | Path) -> ConvProfile:
    """Read and validate a conv profile file (one-line InputError naming the file and line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"conv profile {path}: no such file")
    meta: dict[str, str] = {}
    groups: dict[tuple[str, str, str], dict[tuple[int, int, int], float]] = {}
    columns = None
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#"):
            key, _, value = line.lstrip("#").partition(":")
            meta[key.strip()] = value.strip()
            continue
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if columns is None:
            if tuple(cells) != COLUMNS:
                raise InputError(f"conv profile {path} line {lineno}: columns {cells} are not {list(COLUMNS)}")
            columns = cells
            continue
        if len(cells) != len(COLUMNS):
            raise InputError(f"conv profile {path} line {lineno}: {len(cells)} fields, expected {len(COLUMNS)}")
        row = dict(zip(COLUMNS, cells))
        if row["kind"] != "conv" or row["pass"] not in PASSES:
            raise InputError(f"conv profile {path} line {lineno}: kind={row['kind']!r} pass={row['pass']!r}")
        try:
            dims = (int(row["m"]), int(row["n"]), int(row["k"]))
            t = float(row["time_s"])
        except ValueError:
            raise InputError(f"conv profile {path} line {lineno}: m, n, k must be integers and time_s a number") \
                from None
        if min(dims) <= 0 or not np.isfinite(t) or t <= 0:
            raise InputError(f"conv profile {path} line {lineno}: dims and time_s must be positive")
        groups.setdefault((row["op"], row["dtype"], row["pass"]), {})[dims] = t
    if not groups:
        raise InputError(f"conv profile {path}: no measured rows")
    tables = {}
    for key, points in groups.items():
        pts = [ProfilePoint(kind="gemm", op="mm", dtype=key[1], pass_="fwd", dims=d, time_s=t)
               for d, t in points.items()]
        tables[key] = GridTable.from_points(("gemm", "mm", key[1], "fwd"), pts)
    return ConvProfile(path=str(path), device=meta.get("device", ""), device_type=meta.get("device_type", ""),
                       tables=tables)
