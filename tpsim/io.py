"""Reading user files and writing outputs safely (issue 13): one place for both, used by every verb.

Reading (:func:`read_text`, :func:`read_bytes`): the path must name a regular file (not a folder, a FIFO that
would block, or a device such as ``/dev/zero`` that never ends), no larger than a bound, readable, and (for
text) UTF-8. Every failure is one :class:`~tpsim.errors.InputError` line naming the file.

Writing: a destination is checked *before* the work that produces it (:func:`check_output_file`,
:func:`check_output_dir`: an empty name, a folder where a file is needed or the reverse, a missing parent, a
folder that refuses new files, an existing file without ``force``), and written atomically
(:func:`atomic_write_bytes`, :func:`atomic_write_text`, :func:`atomic_writer`: a temporary file in the same
folder, flushed and fsynced, then ``os.replace``), so an interrupted run leaves the old file or the whole new
one, never half of one. Special files that already exist (``/dev/stdout``, ``/dev/null``, a FIFO) are
written in place, never replaced.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO, Iterator

from .errors import InputError
from .limits import MAX_INPUT_BYTES

PathLike = str | os.PathLike[str]


# ----------------------------------------------------------------------------------------------- reading
def _name(path: PathLike) -> str:
    text = os.fspath(path)
    return text if len(text) <= 200 else f"{text[:120]}...{text[-40:]} ({len(text)} characters)"


def input_path(path: PathLike, what: str, max_bytes: int = MAX_INPUT_BYTES) -> Path:
    """``path`` as a Path after checking it names a readable regular file of at most ``max_bytes``."""
    text = os.fspath(path)
    if not text.strip():
        raise InputError(f"{what}: the file name is empty")
    if "\0" in text:
        raise InputError(f"{what} {_name(text)!r}: a file name cannot contain a NUL byte")
    p = Path(text).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {_name(text)} does not exist") from None
    except OSError as exc:
        raise InputError(f"{what} {_name(text)}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} {_name(text)} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {_name(text)} is not a regular file (a device, pipe or socket)")
    if st.st_size > max_bytes:
        raise InputError(f"{what} {_name(text)} is {st.st_size:,} bytes, above the {max_bytes:,}-byte limit "
                         f"for this kind of file")
    return p


def read_bytes(path: PathLike, what: str = "file", max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see :func:`input_path`)."""
    p = input_path(path, what, max_bytes)
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{what} {_name(p)}: cannot read ({exc.strerror})") from None
    if len(data) > max_bytes:  # grew while being read
        raise InputError(f"{what} {_name(p)} is above the {max_bytes:,}-byte limit for this kind of file")
    return data


def read_text(path: PathLike, what: str = "file", max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; a BOM is dropped."""
    data = read_bytes(path, what, max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{what} {_name(path)}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line "
                         f"{line}); is it the right file?") from None
    if "\0" in text:
        raise InputError(f"{what} {_name(path)}: binary data (a NUL byte on line "
                         f"{text[: text.index(chr(0))].count(chr(10)) + 1}); is it the right file?")
    return text


# ----------------------------------------------------------------------------------------------- checking
def _probe_writable(folder: Path, what: str) -> None:
    """Create and remove a file in ``folder``: the only test that holds for root, ACLs and read-only mounts."""
    try:
        import tempfile  # here, not at the top: reading files (every verb) does not need it

        fd, tmp = tempfile.mkstemp(prefix=".tpsim-check-", dir=folder)
    except OSError as exc:
        raise InputError(f"{what}: cannot create files in {_name(folder)} ({exc.strerror})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _existing_parent(path: Path) -> Path:
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_output_file(path: PathLike | None, what: str, *, force: bool = False, create_parent: bool = False,
                      suffixes: tuple[str, ...] = ()) -> Path:
    """Check a file destination before the work that produces it; returns it as a Path.

    Refused with one line: an empty name, a folder, a missing parent folder (unless ``create_parent``: then
    the nearest existing ancestor must be a writable folder), a folder that refuses new files, a suffix not
    in ``suffixes`` (when given), and an existing regular file unless ``force`` (never overwrite). An
    existing special file (``/dev/stdout``, a FIFO) is accepted: it is written in place."""
    text = "" if path is None else os.fspath(path)
    if not text.strip():
        raise InputError(f"{what}: the output file name is empty")
    if "\0" in text:
        raise InputError(f"{what} {_name(text)!r}: a file name cannot contain a NUL byte")
    p = Path(text).expanduser()
    if p.is_dir() or text.endswith(os.sep):
        raise InputError(f"{what} {_name(text)} is a folder; give a file name")
    if suffixes and p.suffix.lower() not in suffixes:
        raise InputError(f"{what} {_name(text)}: unknown file type {p.suffix or '(no suffix)'!r} "
                         f"(use {', '.join(suffixes)})")
    if p.exists():
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            if not os.access(p, os.W_OK):
                raise InputError(f"{what} {_name(text)}: not writable")
            return p
        if not force:
            raise InputError(f"{what} {_name(text)} already exists; pass --force to replace it")
    parent = p.parent if p.parent != Path("") else Path(".")
    if not parent.exists():
        if not create_parent:
            raise InputError(f"{what} {_name(text)}: folder {_name(parent)} does not exist")
        parent = _existing_parent(p)
    if not parent.is_dir():
        raise InputError(f"{what} {_name(text)}: {_name(parent)} is not a folder")
    _probe_writable(parent, f"{what} {_name(text)}")
    return p


def check_output_dir(path: PathLike | None, what: str, *, force: bool = False,
                     protected: tuple[str, ...] = ("README.md",)) -> Path:
    """Check a folder destination (created later with its parents); returns it as a Path.

    Refused: an empty name, an existing file, a path under a file, an ancestor that refuses new folders, and
    (unless ``force``) a folder that already holds one of the ``protected`` files."""
    text = "" if path is None else os.fspath(path)
    if not text.strip():
        raise InputError(f"{what}: the output folder name is empty")
    if "\0" in text:
        raise InputError(f"{what} {_name(text)!r}: a folder name cannot contain a NUL byte")
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise InputError(f"{what} {_name(text)} is a file, not a folder")
    if p.is_dir():
        clash = [name for name in protected if (p / name).exists()]
        if clash and not force:
            held = ", ".join(clash[:3]) + (f" and {len(clash) - 3} more" if len(clash) > 3 else "")
            raise InputError(f"{what} {_name(text)} already holds {held}; pass --force to replace "
                             f"{'it' if len(clash) == 1 else 'them'}, or choose another folder")
        _probe_writable(p, f"{what} {_name(text)}")
        return p
    ancestor = _existing_parent(p)
    if not ancestor.is_dir():
        raise InputError(f"{what} {_name(text)}: {_name(ancestor)} is a file, not a folder")
    _probe_writable(ancestor, f"{what} {_name(text)}")
    return p


def make_output_dir(path: PathLike, what: str) -> Path:
    """Create a checked output folder (and its parents)."""
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what} {_name(p)}: cannot create the folder ({exc.strerror})") from None
    return p


# ----------------------------------------------------------------------------------------------- writing
def _special(path: Path) -> bool:
    """An existing non-regular file (a device, a FIFO): written in place, never replaced."""
    try:
        return not stat.S_ISREG(path.stat().st_mode) and not path.is_dir()
    except OSError:
        return False


@contextlib.contextmanager
def atomic_writer(path: PathLike, mode: str = "wb", what: str = "output", overwrite: bool = True,
                  durable: bool = True) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` in one step
    (``os.replace``), on any failure or interrupt it is removed and ``path`` is left as it was. The new file
    gets the permissions a plain ``open(path, "w")`` would give. OSError -> InputError naming ``path``.

    ``overwrite=False`` (a destination checked before the work without ``--force``): the new file is linked
    into place only if nothing is there, in one step (``os.link`` fails on an existing name), so a file that
    appeared at ``path`` during the work is kept and the run is refused with one line (issue 26).

    ``durable=False`` skips the ``fsync`` before the rename: for files whose reader verifies them and recomputes
    a bad one (cache entries, sealed and checksummed), where a crash may cost the entry but never a wrong one."""
    p = Path(path).expanduser()
    if _special(p):
        try:
            with open(p, mode) as f:
                yield f
        except OSError as exc:
            raise InputError(f"{what} {_name(p)}: cannot write ({exc.strerror})") from None
        return
    folder = p.parent if str(p.parent) else Path(".")
    try:
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:64]}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"{what} {_name(p)}: cannot write ({exc.strerror})") from None
    done = False
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        if overwrite:
            os.replace(tmp, p)
        else:
            _link_new(tmp, p, what)
        done = True
    except OSError as exc:
        raise InputError(f"{what} {_name(p)}: cannot write ({exc.strerror})") from None
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _link_new(tmp: str, p: Path, what: str) -> None:
    """Put ``tmp`` at ``p`` only if ``p`` does not exist (atomic); the temporary name is then removed."""
    try:
        os.link(tmp, p)
    except FileExistsError:
        raise InputError(f"{what} {_name(p)} appeared while tpsim was working; it is kept (pass --force to "
                         f"replace it)") from None
    except OSError:  # a file system without hard links: check, then replace (a narrower window than before)
        if p.exists():
            raise InputError(f"{what} {_name(p)} appeared while tpsim was working; it is kept (pass --force "
                             f"to replace it)") from None
        os.replace(tmp, p)
        return
    os.unlink(tmp)


def atomic_write_bytes(path: PathLike, data: bytes, what: str = "output", overwrite: bool = True,
                       durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, "wb", what, overwrite=overwrite, durable=durable) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str, what: str = "output", overwrite: bool = True) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_writer`)."""
    return atomic_write_bytes(path, text.encode("utf-8"), what, overwrite=overwrite)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fallback_path(stem: str, suffix: str) -> Path:
    """A fresh file in the temporary folder for data that could not be written where asked (measurements
    are never dropped): ``/tmp/<stem>-XXXX<suffix>``."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f"{stem}-", suffix=suffix)
    os.close(fd)
    return Path(name)


__all__ = ["read_text", "read_bytes", "input_path", "check_output_file", "check_output_dir", "make_output_dir",
           "atomic_writer", "atomic_write_bytes", "atomic_write_text", "fallback_path"]


def is_opgraph_path(name: str) -> bool:
    """True for a ``--model`` value that names an op graph file (``*.ops.json``, :mod:`tpsim.opgraph.schema`)."""
    return str(name).endswith(".ops.json")
