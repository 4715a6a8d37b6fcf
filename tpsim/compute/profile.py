"""Measured kernel profiles: load, validate, interpolate (torch-free).

A profile is a CSV file written by ``tpsim profile`` (format: ``profiles/README.md``): a ``# key: value``
metadata header, then one row per measured kernel point with its median time. :func:`load_profile` validates
it strictly (one-line :class:`~tpsim.errors.InputError` naming the file and the problem) and
:class:`ProfileModel` serves the :class:`~tpsim.compute.base.ComputeModel` interface from it:

* inside a table's grid: multilinear interpolation of log(time) over the log of the grid axes
  (GEMM: m, n, k; attention: batch x heads, sequence, head dim; memory kernels: element count), exact for
  power laws ``t = c * m^a * n^b * k^g`` between grid points; ``measured=True``;
* outside the grid: the profile's own fitted roofline ``t = t0 + flops / F + bytes / B``
  (:class:`FittedRoofline`, fitted per table to the measured points), anchored to the nearest grid point
  (time there x fit(query) / fit(grid point)) so that time is continuous at the grid's edge;
  ``measured=False``;
* grid points never measured (beyond the CPU profile's time cap) hold the fitted roofline scaled to the
  table's largest measured points, so a query whose cell touches one is interpolated continuously too, with
  ``measured=False``.

Everything is vectorized with numpy (no Python loop per element): the planner evaluates ~1e6 plans/s.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import InputError
from ..limits import LIMITS, ascii_int, show
from .base import MEMORY_KERNEL_NAMES, ArrayLike, ComputeModel

FORMAT_VERSION = 1
KINDS = ("gemm", "attention", "memory")
PASSES = ("fwd", "bwd")
GEMM_OP = "mm"
ATTENTION_OPS = ("causal", "full")
#: bytes per element of each dtype a profile may hold (same table as tpsim.hardware.DTYPE_BYTES; kept here so
#: the profiler runs on a machine without PyYAML).
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DIM_COLUMNS = {"gemm": ("m", "n", "k"), "attention": ("batch_heads", "seq", "head_dim"), "memory": ("numel",)}
DIM_COLUMNS_ALL = frozenset(c for cols in DIM_COLUMNS.values() for c in cols)
COLUMNS = ("kind", "op", "dtype", "pass", "m", "n", "k", "batch_heads", "seq", "head_dim", "numel",
           "time_s", "reps", "spread_pct")
META_KEYS = ("format_version", "device", "device_type", "torch_version", "threads", "date", "tpsim_version")
# Flash-attention backward runs 5 matmuls of the forward's size for the forward's 2 (Dao 2023, sec. 3.1);
# the fit absorbs any error in this ratio, it only shapes the roofline's extrapolation.
ATTENTION_BWD_FLOP_RATIO = 2.5

TableKey = tuple[str, str, str, str]
"""(kind, op, dtype, pass) of one interpolation table."""


@dataclass(frozen=True, kw_only=True)
class ProfileMeta:
    """The metadata header of a profile file."""

    format_version: int
    device: str
    """device name as torch reports it (``torch.cuda.get_device_name`` or the CPU model name)."""
    device_type: str
    """"cpu" or "cuda"."""
    torch_version: str
    threads: int
    """CPU threads (``torch.set_num_threads``) the kernels ran with."""
    date: str
    tpsim_version: str
    extra: Mapping[str, str] = field(default_factory=dict)
    """other header keys (timing method, memory-kernel row width, time cap...)."""


@dataclass(frozen=True, kw_only=True)
class ProfilePoint:
    """One measured kernel: its table key, its dims (in DIM_COLUMNS order) and its median time."""

    kind: str
    op: str
    dtype: str
    pass_: str
    dims: tuple[int, ...]
    time_s: float
    """median seconds of one kernel call."""
    reps: int = 1
    spread_pct: float = 0.0
    """(p75 - p25) / median of the repetitions, in percent."""

    @property
    def key(self) -> TableKey:
        return (self.kind, self.op, self.dtype, self.pass_)


@dataclass(frozen=True)
class FittedRoofline:
    """``t = latency_s + flops / flops_per_s + bytes / bytes_per_s`` (inf rates: term absent), fitted to a
    table's points by non-negative least squares on the relative error."""

    latency_s: float
    flops_per_s: float
    bytes_per_s: float

    def time(self, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return self.latency_s + flops / self.flops_per_s + nbytes / self.bytes_per_s


def kernel_work(kind: str, op: str, pass_: str, dtype: str,
                dims: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved) of a kernel, the features of the fitted roofline.

    GEMM: 2 m n k FLOPs, (m k + k n + m n) elements. Attention (flash): 4 bh s^2 d FLOPs forward (QK^T and PV),
    halved when causal, x ATTENTION_BWD_FLOP_RATIO backward; q, k, v, o read/written once (x2 backward).
    Memory kernels: bytes of the input only (the per-kernel constant is absorbed by the fit).
    """
    size = DTYPE_BYTES[dtype]
    if kind == "gemm":
        m, n, k = dims
        return 2.0 * m * n * k, size * (m * k + k * n + m * n)
    if kind == "attention":
        bh, s, d = dims
        flops = 4.0 * bh * s * s * d * (0.5 if op == "causal" else 1.0)
        nbytes = 4.0 * size * bh * s * d
        if pass_ == "bwd":
            return flops * ATTENTION_BWD_FLOP_RATIO, 2.0 * nbytes
        return flops, nbytes
    (numel,) = dims
    return np.zeros_like(numel, dtype=float), size * numel


def fit_roofline(flops: np.ndarray, nbytes: np.ndarray, times: np.ndarray) -> FittedRoofline:
    """Non-negative least squares of ``t0 + flops * a + bytes * b`` against ``times`` in relative error.

    Three unknowns: every subset of them is solved by least squares and the best non-negative solution kept.
    """
    features = np.stack([np.ones_like(times), flops, nbytes], axis=1) / times[:, None]
    target = np.ones_like(times)
    best: tuple[float, np.ndarray] | None = None
    for size in (1, 2, 3):
        for subset in itertools.combinations(range(3), size):
            cols = [c for c in subset if np.any(features[:, c] > 0)]
            if len(cols) != len(subset):
                continue
            coef, *_ = np.linalg.lstsq(features[:, cols], target, rcond=None)
            if np.any(coef < 0):
                continue
            resid = float(np.sum((features[:, cols] @ coef - target) ** 2))
            if best is None or resid < best[0]:
                full = np.zeros(3)
                full[cols] = coef
                best = (resid, full)
    assert best is not None  # the latency-only subset always gives a non-negative solution
    t0, a, b = best[1]
    return FittedRoofline(latency_s=float(t0), flops_per_s=1.0 / a if a > 0 else math.inf,
                          bytes_per_s=1.0 / b if b > 0 else math.inf)


@dataclass(frozen=True)
class GridCell:
    """Where queries fall on a grid: the flat index of each query's lower cell corner, the flat offset of
    one step along each axis (0 on a single-value axis) and the blend weight along each axis."""

    base: np.ndarray
    steps: tuple[int, ...]
    weights: tuple[np.ndarray | None, ...]

    def corners(self) -> list[np.ndarray]:
        """Flat indices of the 2^d cell corners, the first axis's bit most significant."""
        return [self.base + sum(bit * step for bit, step in zip(bits, self.steps))
                for bits in itertools.product((0, 1), repeat=len(self.steps))]

    def blend(self, flat: np.ndarray) -> np.ndarray:
        """Multilinear blend of the grid values ``flat`` (raveled grid) at the queries."""
        values = [flat[index] for index in self.corners()]
        for w in self.weights:  # blend pairs along the first remaining axis
            half = len(values) // 2
            if w is None:
                values = values[:half]
                continue
            values = [lo + w * (hi - lo) for lo, hi in zip(values[:half], values[half:])]
        return values[0]


def locate(axes_log: tuple[np.ndarray, ...], query_log: tuple[np.ndarray, ...]) -> GridCell:
    """The grid cell of each query (queries inside the axes' ranges, broadcast together)."""
    shape = np.broadcast_shapes(*(np.shape(q) for q in query_log))
    sizes = [len(ax) for ax in axes_log]
    strides = [int(np.prod(sizes[d + 1:])) for d in range(len(sizes))]
    base = np.zeros(shape, dtype=np.intp)
    weights, steps = [], []
    for ax, q, stride in zip(axes_log, query_log, strides):
        if len(ax) == 1:
            weights.append(None)
            steps.append(0)
            continue
        lo = np.minimum(np.maximum(np.searchsorted(ax, q, side="right") - 1, 0), len(ax) - 2)
        weights.append(np.broadcast_to(np.minimum(np.maximum((q - ax[lo]) / (ax[lo + 1] - ax[lo]), 0.0), 1.0),
                                       shape))
        base = base + lo * stride
        steps.append(stride)
    return GridCell(base, tuple(steps), tuple(weights))


def interpolate_log(axes_log: tuple[np.ndarray, ...], log_time: np.ndarray,
                    query_log: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Multilinear interpolation of ``log_time`` (NaN = not measured) at ``query_log`` (inside the axes).

    Returns (log time, ok): ok is False where a grid-cell corner with non-zero weight is NaN. One gather per
    cell corner, then linear blends axis after axis (no Python loop per element).
    """
    shape = np.broadcast_shapes(*(np.shape(q) for q in query_log))
    result = np.broadcast_to(locate(axes_log, query_log).blend(log_time.ravel()), shape).copy()
    ok = ~np.isnan(result)
    if not ok.all():  # a NaN corner may carry zero weight (query on the cell's measured face): redo those
        redo = np.nonzero(~ok.ravel())[0]
        sub = tuple(np.broadcast_to(q, shape).ravel()[redo] for q in query_log)
        value, sub_ok = _interpolate_careful(axes_log, log_time, sub)
        result.ravel()[redo] = value
        ok.ravel()[redo] = sub_ok
    return result, ok


def _interpolate_careful(axes_log: tuple[np.ndarray, ...], log_time: np.ndarray,
                         query_log: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interpolate_log` that ignores NaN corners of zero weight (slower; for the few such queries)."""
    n = len(query_log[0])
    lows, weights = [], []
    for ax, q in zip(axes_log, query_log):
        if len(ax) == 1:
            lows.append(np.zeros(n, dtype=np.intp))
            weights.append(np.zeros(n))
            continue
        lo = np.clip(np.searchsorted(ax, q, side="right") - 1, 0, len(ax) - 2)
        lows.append(lo)
        weights.append(np.clip((q - ax[lo]) / (ax[lo + 1] - ax[lo]), 0.0, 1.0))
    total = np.zeros(n)
    ok = np.ones(n, dtype=bool)
    for corner in itertools.product((0, 1), repeat=len(axes_log)):
        weight = np.ones(n)
        index = []
        for dim, bit in enumerate(corner):
            weight = weight * (weights[dim] if bit else 1.0 - weights[dim])
            index.append(np.minimum(lows[dim] + bit, len(axes_log[dim]) - 1))
        value = log_time[tuple(index)]
        used = weight > 0
        ok &= ~(used & np.isnan(value))
        total += np.where(used, np.nan_to_num(value) * weight, 0.0)
    return total, ok


@dataclass(frozen=True)
class GridTable:
    """The points of one (kind, op, dtype, pass) on their rectilinear grid."""

    key: TableKey
    axes: tuple[np.ndarray, ...]
    """sorted distinct values of each dim (DIM_COLUMNS order)."""
    log_time: np.ndarray
    """log(seconds) on the grid; NaN where the point was not measured."""
    fit: FittedRoofline

    @staticmethod
    def from_points(key: TableKey, points: list[ProfilePoint]) -> "GridTable":
        dims = np.array([p.dims for p in points], dtype=float)
        times = np.array([p.time_s for p in points])
        axes = tuple(np.unique(dims[:, d]) for d in range(dims.shape[1]))
        grid = np.full(tuple(len(a) for a in axes), np.nan)
        index = tuple(np.searchsorted(axes[d], dims[:, d]) for d in range(dims.shape[1]))
        grid[index] = np.log(times)
        flops, nbytes = kernel_work(*key[:2], key[3], key[2], tuple(dims.T))
        return GridTable(key, axes, grid, fit_roofline(flops, nbytes, times))

    def lookup(self, dims: tuple[ArrayLike, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, measured) at ``dims`` (arrays broadcast together); 0 s (measured) where a dim is <= 0."""
        arrays = np.broadcast_arrays(*(np.asarray(d, dtype=float) for d in dims))
        positive = np.logical_and.reduce([a > 0 for a in arrays])
        if not positive.all():
            arrays = [np.where(positive, a, ax[0]) for a, ax in zip(arrays, self.axes)]
        clamped = [np.minimum(np.maximum(a, ax[0]), ax[-1]) for a, ax in zip(arrays, self.axes)]
        inside = np.logical_and.reduce([c == a for c, a in zip(clamped, arrays)])
        cell = locate(self._axes_log, tuple(np.log(c) for c in clamped))
        filled, measured_grid = self._filled
        seconds = np.exp(cell.blend(filled.ravel()))
        measured = inside
        if measured_grid is not None:  # every cell corner with weight must be a measured point
            complete = np.logical_and.reduce([measured_grid.ravel()[i] > 0 for i in cell.corners()])
            partial = np.nonzero(~complete.ravel())[0]
            if partial.size:  # a query on the measured face of a partly measured cell is still measured
                sub = GridCell(cell.base.ravel()[partial], cell.steps,
                               tuple(None if w is None else w.ravel()[partial] for w in cell.weights))
                complete.ravel()[partial] = sub.blend(measured_grid.ravel()) > 1.0 - 1e-9
            measured = measured & complete
        off = np.nonzero(~inside.ravel())[0]
        if off.size:
            seconds.ravel()[off] *= self._extrapolation(tuple(a.ravel()[off] for a in arrays),
                                                        tuple(c.ravel()[off] for c in clamped))
        if not positive.all():
            seconds = np.where(positive, seconds, 0.0)
            measured = measured | ~positive
        return seconds, measured

    @cached_property
    def _axes_log(self) -> tuple[np.ndarray, ...]:
        return tuple(np.log(a) for a in self.axes)

    @cached_property
    def _filled(self) -> tuple[np.ndarray, np.ndarray | None]:
        """log(time) with the unmeasured grid points (beyond the time cap) filled by the fitted roofline,
        scaled by the median measured / fitted ratio of the table's largest decile of measured points; and the
        0/1 grid of measured points (None when every grid point was measured)."""
        missing = np.isnan(self.log_time)
        if not missing.any():
            return self.log_time, None
        kind, op, dtype, pass_ = self.key
        grids = np.meshgrid(*self.axes, indexing="ij")
        fitted = self.fit.time(*kernel_work(kind, op, pass_, dtype, tuple(grids)))
        fitted_measured = fitted[~missing]
        ratio = np.exp(self.log_time[~missing]) / fitted_measured
        scale = float(np.median(ratio[fitted_measured >= np.percentile(fitted_measured, 90)]))
        return np.where(missing, np.log(fitted * scale), self.log_time), (~missing).astype(float)

    def _extrapolation(self, dims: tuple[np.ndarray, ...], clamped: tuple[np.ndarray, ...]) -> np.ndarray:
        """Fitted-roofline time at ``dims`` over that at the clamped point (the nearest on the grid)."""
        kind, op, dtype, pass_ = self.key
        fit_at = self.fit.time(*kernel_work(kind, op, pass_, dtype, dims))
        return fit_at / self.fit.time(*kernel_work(kind, op, pass_, dtype, clamped))


@dataclass(frozen=True)
class Profile:
    """A loaded, validated profile file."""

    path: str
    meta: ProfileMeta
    points: tuple[ProfilePoint, ...]

    @property
    def name(self) -> str:
        return Path(self.path).name

    @cached_property
    def tables(self) -> dict[TableKey, GridTable]:
        groups: dict[TableKey, dict[tuple[int, ...], ProfilePoint]] = {}
        for p in self.points:  # a later row of the same point replaces an earlier one
            groups.setdefault(p.key, {})[p.dims] = p
        return {key: GridTable.from_points(key, list(pts.values())) for key, pts in sorted(groups.items())}

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(sorted({p.dtype for p in self.points}))


def profile_device_name(profile: Profile) -> str:
    """The device the profile was measured on, e.g. ``NVIDIA H200`` or ``cpu: Intel(R) Xeon(R) Processor``."""
    if profile.meta.device_type == "cpu":
        return f"cpu: {profile.meta.device}"
    return profile.meta.device


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def profile_matches_device(profile: Profile, device: str) -> bool:
    """True when ``device`` (a device-table name such as ``H200`` or ``CPU-x86-1thread``, a torch device
    type ``cpu``/``cuda``, or a full device name) names the device the profile was measured on."""
    wanted = _normalize(device)
    if not wanted:
        return False
    if wanted in ("cpu", "cuda"):
        return profile.meta.device_type == wanted
    if profile.meta.device_type == "cpu":
        return wanted.startswith("cpu") or wanted in _normalize(profile.meta.device)
    have = _normalize(profile.meta.device)
    return wanted in have or have in wanted or _device_model(wanted) == _device_model(have) != ""


def _device_model(normalized: str) -> str:
    """The chip model in a normalized name (``nvidiah200`` -> ``h200``, ``h100sxm`` -> ``h100``)."""
    match = re.search(r"([a-z]{1,3}\d{2,4}[a-z]?)", normalized.replace("nvidia", "").replace("amd", ""))
    return match.group(1) if match else ""


# --------------------------------------------------------------------------------------------- parsing

def _parse_meta(lines: list[tuple[int, str]], name: str) -> ProfileMeta:
    values: dict[str, str] = {}
    for _, line in lines:
        body = line.lstrip("#").strip()
        if ":" in body:
            key, value = body.split(":", 1)
            values[key.strip()] = value.strip()
    missing = [k for k in META_KEYS if k not in values]
    if missing:
        raise InputError(f"profile {name}: header is missing {', '.join(missing)} "
                         f"(a '# key: value' line each; see profiles/README.md)")
    if values["format_version"] != str(FORMAT_VERSION):
        raise InputError(f"profile {name}: format_version={values['format_version']!r} is not supported "
                         f"(this tpsim reads version {FORMAT_VERSION})")
    if values["device_type"] not in ("cpu", "cuda"):
        raise InputError(f"profile {name}: device_type={values['device_type']!r} is not cpu or cuda")
    try:
        threads = int(values["threads"])
    except ValueError:
        raise InputError(f"profile {name}: threads={values['threads']!r} is not an integer") from None
    extra = {k: v for k, v in values.items() if k not in META_KEYS}
    return ProfileMeta(format_version=FORMAT_VERSION, device=values["device"],
                       device_type=values["device_type"], torch_version=values["torch_version"],
                       threads=threads, date=values["date"], tpsim_version=values["tpsim_version"], extra=extra)


def _typed(cells: dict[str, str]) -> dict[str, Any]:
    """The row's cells as the profile schema's types: ASCII integers and finite-or-not floats converted, an
    empty optional cell None, anything else left as text (the schema then names it)."""
    out: dict[str, Any] = {}
    for key, text in cells.items():
        if key in ("reps",) or key in DIM_COLUMNS_ALL:
            out[key] = None if text == "" else (ascii_int(text) if ascii_int(text) is not None else text)
        elif key in ("time_s", "spread_pct"):
            try:
                out[key] = None if text == "" and key == "spread_pct" else float(text) if len(text) <= 64 else text
            except ValueError:
                out[key] = text
        else:
            out[key] = text
    return out


def _parse_row(cells: dict[str, str], where: str) -> ProfilePoint:
    from ..schema import check
    from ..schemas import PROFILE_ROW

    check(PROFILE_ROW, _typed({k: v for k, v in cells.items() if k in COLUMNS}), where)  # issue 26
    kind, op, dtype, pass_ = cells["kind"], cells["op"], cells["dtype"], cells["pass"]
    if kind not in KINDS:
        raise InputError(f"{where}: kind={kind!r} is not one of {', '.join(KINDS)}")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{where}: dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if pass_ not in PASSES:
        raise InputError(f"{where}: pass={pass_!r} is not fwd or bwd")
    valid_ops = {"gemm": (GEMM_OP,), "attention": ATTENTION_OPS, "memory": MEMORY_KERNEL_NAMES}[kind]
    if op not in valid_ops:
        raise InputError(f"{where}: op={op!r} is not a {kind} op ({', '.join(valid_ops)})")
    dims = []
    for col in DIM_COLUMNS[kind]:
        text = cells[col]
        if len(text) > 20 or not (text.isascii() and text.isdigit()):  # bounded before int(): a 400-digit dim is refused, not parsed
            raise InputError(f"{where}: {col}={show(text)} is not an integer up to {LIMITS['kernel_dim']}")
        value = int(text)
        if not 0 < value <= LIMITS["kernel_dim"]:
            raise InputError(f"{where}: {col}={value} must be in [1, {LIMITS['kernel_dim']}]")
        dims.append(value)
    try:
        time_s = float(cells["time_s"])
    except ValueError:
        raise InputError(f"{where}: time_s={cells['time_s']!r} is not a number") from None
    if not (time_s > 0 and math.isfinite(time_s)):
        raise InputError(f"{where}: time_s={cells['time_s']} must be a positive finite time")
    try:
        reps = int(cells["reps"] or 1)
        spread = float(cells["spread_pct"] or 0.0)
    except ValueError:
        raise InputError(f"{where}: reps={cells['reps']!r} or spread_pct={cells['spread_pct']!r} "
                         f"is not a number") from None
    return ProfilePoint(kind=kind, op=op, dtype=dtype, pass_=pass_, dims=tuple(dims), time_s=time_s,
                        reps=reps, spread_pct=spread)


def parse_profile(text: str, name: str) -> Profile:
    """Parse the text of a profile file (``name`` is used in messages and as ``Profile.path``)."""
    numbered = list(enumerate(text.splitlines(), start=1))
    header = [(i, l) for i, l in numbered if l.startswith("#")]
    body = [(i, l) for i, l in numbered if l.strip() and not l.startswith("#")]
    meta = _parse_meta(header, name)
    if not body:
        raise InputError(f"profile {name}: no column header and no rows")
    columns = [c.strip() for c in body[0][1].split(",")]
    repeated = sorted({c for c in columns if columns.count(c) > 1}) if len(columns) != len(set(columns)) else []
    if repeated:
        raise InputError(f"profile {name}: column {repeated[0][:40]!r} appears twice in the column header")
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise InputError(f"profile {name}: missing column(s) {', '.join(missing)} "
                         f"(expected {','.join(COLUMNS)})")
    points = []
    for lineno, line in body[1:]:
        values = line.split(",")
        if len(values) != len(columns):
            raise InputError(f"profile {name} line {lineno}: {len(values)} fields, expected {len(columns)} "
                             f"(truncated row? rerun `tpsim profile --out` on this file to repair it)")
        points.append(_parse_row(dict(zip(columns, (v.strip() for v in values))), f"profile {name} line {lineno}"))
    if not points:
        raise InputError(f"profile {name}: no measured rows")
    return Profile(path=name, meta=meta, points=tuple(points))


def load_profile(path: str | Path, device: str | None = None,
                 dtypes: tuple[str, ...] | None = None) -> Profile:
    """Read and validate a profile file.

    ``device`` (optional): raise unless the profile was measured on it (see :func:`profile_matches_device`).
    ``dtypes`` (optional): raise unless every one of them has measurements in the profile.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"profile {path}: no such file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"profile {path}: cannot be read ({exc})") from None
    profile = parse_profile(text, str(path))
    if device is not None and not profile_matches_device(profile, device):
        raise InputError(f"profile {path.name}: measured on {profile_device_name(profile)!r}, "
                         f"not on device {device!r}")
    for dtype in dtypes or ():
        if dtype not in profile.dtypes:
            raise InputError(f"profile {path.name}: has no {dtype} measurements "
                             f"(dtypes: {', '.join(profile.dtypes)})")
    return profile


# --------------------------------------------------------------------------------------------- model

class ProfileModel(ComputeModel):
    """Kernel times from a measured profile (see the module docstring); ``fallback`` serves the kinds and
    dtypes the profile does not hold (without one, asking for them raises InputError)."""

    def __init__(self, path_or_profile: str | Path | Profile, fallback: ComputeModel | None = None) -> None:
        self.profile = (path_or_profile if isinstance(path_or_profile, Profile)
                        else load_profile(path_or_profile))
        self.fallback = fallback
        self.source = f"profile:{self.profile.name}"

    def _table(self, key: TableKey) -> GridTable | None:
        table = self.profile.tables.get(key)
        if table is None and self.fallback is None:
            kind, op, dtype, pass_ = key
            have = sorted({k[2] for k in self.profile.tables if k[:2] == key[:2] and k[3] == pass_})
            raise InputError(f"profile {self.profile.name}: no {kind} {op} {pass_} measurements for "
                             f"dtype={dtype} (profiled: {', '.join(have) or 'none'}); "
                             f"profile that dtype or use the roofline")
        return table

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` products time as one GEMM of ``batch * m`` rows (same FLOPs, shared operand shape)."""
        table = self._table(("gemm", GEMM_OP, dtype, "fwd"))
        if table is None:
            return self.fallback.gemm(m, n, k, dtype, batch)
        return table.lookup((np.asarray(m) * np.asarray(batch), n, k))

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        key = ("attention", "causal" if causal else "full", dtype, "bwd" if backward else "fwd")
        table = self._table(key)
        if table is None:
            return self.fallback.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        return table.lookup((batch_heads, seq, head_dim))

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        if kernel not in MEMORY_KERNEL_NAMES:
            raise InputError(f"kernel={kernel!r} is not a memory kernel ({', '.join(MEMORY_KERNEL_NAMES)})")
        table = self._table(("memory", kernel, dtype, "bwd" if backward else "fwd"))
        if table is None:
            return self.fallback.memory(kernel, numel, dtype, backward)
        return table.lookup((numel,))

    def describe(self) -> str:
        return f"{self.source} ({profile_device_name(self.profile)}, {self.profile.meta.threads} thread(s))"
