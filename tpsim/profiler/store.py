"""Writing profile files (torch-free): the header, one flushed and fsynced row per measured point, and the
repair of a file whose last row a killed run left half-written. The format is in ``profiles/README.md``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, TextIO

from ..compute.profile import COLUMNS, DIM_COLUMNS, META_KEYS, Profile, ProfilePoint, parse_profile
from ..errors import InputError
from ..io import atomic_write_bytes, atomic_write_text
from .grid import PointKey

TITLE = "# tpsim kernel profile: median seconds per kernel call (format: profiles/README.md)"
#: header keys that must agree between a file and the run resuming it
RESUME_KEYS = ("device", "device_type", "threads", "format_version")


def header_text(meta: Mapping[str, object]) -> str:
    """The ``# key: value`` header and the column line."""
    lines = [TITLE]
    lines += [f"# {key}: {meta[key]}" for key in META_KEYS]
    lines += [f"# {key}: {value}" for key, value in meta.items() if key not in META_KEYS]
    lines.append(",".join(COLUMNS))
    return "\n".join(lines) + "\n"


def format_row(point: ProfilePoint) -> str:
    cells = dict.fromkeys(COLUMNS, "")
    cells.update({"kind": point.kind, "op": point.op, "dtype": point.dtype, "pass": point.pass_})
    for column, value in zip(DIM_COLUMNS[point.kind], point.dims):
        cells[column] = str(value)
    cells.update(time_s=f"{point.time_s:.6g}", reps=str(point.reps), spread_pct=f"{point.spread_pct:.1f}")
    return ",".join(cells[c] for c in COLUMNS) + "\n"


def point_key(point: ProfilePoint) -> PointKey:
    return (point.kind, point.op, point.dtype, point.pass_, point.dims)


def check_destination(path: Path | str, what: str = "--out") -> Path:
    """Check a profile destination before anything is measured: a regular file (a profile is appended to and
    resumed in place, so not a folder, a device or a pipe), under a folder that accepts new files (missing
    folders are created), and, if it exists, a tpsim profile (another file is never overwritten)."""
    from ..io import check_output_file

    p = check_output_file(path, what, force=True, create_parent=True)
    if p.exists():
        if not p.is_file():
            raise InputError(f"{what} {p} is not a regular file; a profile is written and resumed in place")
        try:
            with open(p, "rb") as f:
                head = f.read(len(TITLE))
        except OSError as exc:
            raise InputError(f"{what} {p}: cannot read ({exc.strerror})") from None
        if head and not head.startswith(TITLE[:22].encode()):
            raise InputError(f"profile {p}: exists and is not a tpsim profile; choose another --out")
    return p


def _repair(path: Path) -> None:
    """Drop a trailing half-written row (no final newline), rewriting the file atomically."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data[: data.rfind(b"\n") + 1]
    atomic_write_bytes(path, keep, "profile")


def drop_noisy_rows(path: Path, max_spread_pct: float) -> int:
    """Remove the rows whose interquartile spread exceeds ``max_spread_pct`` (measured while the machine was
    busy), rewriting the file atomically; a resumed run measures them again. Returns the rows removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    if not path.read_bytes().startswith(TITLE[:22].encode()):
        raise InputError(f"profile {path}: exists and is not a tpsim profile; choose another --out")
    _repair(path)
    keep, dropped = [], 0
    columns: list[str] | None = None
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("#") or not line.strip():
            keep.append(line)
            continue
        cells = line.rstrip("\n").split(",")
        if columns is None:
            columns = cells
            keep.append(line)
            continue
        spread = dict(zip(columns, cells)).get("spread_pct") or "0"
        try:
            noisy = float(spread) > max_spread_pct
        except ValueError:
            raise InputError(f"profile {path}: spread_pct={spread!r} is not a number") from None
        if noisy:
            dropped += 1
            continue
        keep.append(line)
    atomic_write_text(path, "".join(keep), "profile")
    return dropped


def _check_resumable(existing: Profile, meta: Mapping[str, object], path: Path) -> None:
    have = {"device": existing.meta.device, "device_type": existing.meta.device_type,
            "threads": existing.meta.threads, "format_version": existing.meta.format_version}
    for key in RESUME_KEYS:
        if str(have[key]) != str(meta[key]):
            raise InputError(f"profile {path}: {key}={have[key]!r} in the file but this run has {meta[key]!r}; "
                             f"resume it with the same settings or write to another --out")


class ProfileWriter:
    """Append-only writer: every row is flushed and fsynced as soon as it is measured, so a killed run loses
    no finished point; opening an existing file resumes it (``done`` maps its points to their seconds)."""

    def __init__(self, path: Path, meta: Mapping[str, object]) -> None:
        self.path = check_destination(path)
        self.done: dict[PointKey, float] = {}
        if self.path.exists() and self.path.stat().st_size > 0:
            _repair(self.path)
            text = self.path.read_text()
            rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
            if len(rows) >= 2:  # column line + measured rows: resume
                existing = parse_profile(text, str(self.path))
                _check_resumable(existing, meta, self.path)
                self.done = {point_key(p): p.time_s for p in existing.points}
                self._file: TextIO = self._open("a")
                return
            self._check_header_only(text, meta)
        self._file = self._open("w")
        self._write(header_text(meta))

    def _open(self, mode: str) -> TextIO:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, mode)
        except OSError as exc:
            raise InputError(f"profile {self.path}: cannot write ({exc.strerror})") from None

    def _write(self, text: str) -> None:
        """Append and fsync; a failure (a full disk) is one line, and every row before it is kept."""
        try:
            self._file.write(text)
            self._sync()
        except OSError as exc:
            raise InputError(f"profile {self.path}: cannot write ({exc.strerror}); the {len(self.done)} points "
                             "measured so far are kept, and a rerun with the same --out resumes") from None

    def _check_header_only(self, text: str, meta: Mapping[str, object]) -> None:
        """A profile file with no measured row (killed before the first point) is rewritten, if it is of the
        same device."""
        for line in text.splitlines():
            body = line.lstrip("#").strip()
            if line.startswith("#") and ":" in body:
                key, value = (s.strip() for s in body.split(":", 1))
                if key in RESUME_KEYS and value != str(meta[key]):
                    raise InputError(f"profile {self.path}: {key}={value!r} in the file but this run has "
                                     f"{meta[key]!r}; write to another --out")

    def append(self, point: ProfilePoint) -> None:
        self._write(format_row(point))
        self.done[point_key(point)] = point.time_s

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the write that failed already said so
            pass

    def __enter__(self) -> "ProfileWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
