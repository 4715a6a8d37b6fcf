"""What the on-disk caches trust (issue 26): only entries they wrote themselves, read safely.

Both caches (parsed YAML documents, :mod:`tpsim.parsecache`; search results, :mod:`tpsim.search.cache`) are
keyed by a SHA-256 of everything that determines the result. On top of that:

* **Entries are sealed.** Each entry stores its key and an HMAC-SHA-256 over the key and the entry's bytes,
  under a secret of this user (:func:`secret`: 32 random bytes in ``<cache root>/secret``, created with mode
  0600, used only when it is a regular file owned by this user and readable by nobody else). A checksum
  anyone can recompute proves nothing: an entry copied from another key, written by another user or tool,
  or edited and "re-checksummed" fails the seal and is recomputed.
* **Only regular files of bounded size are opened** (:func:`read_entry`): ``O_NOFOLLOW`` (a symlink, e.g. to
  ``/dev/zero``, is refused), ``O_NONBLOCK`` (a FIFO does not block the open) and ``fstat`` on the open file
  (not a FIFO, device or socket; not above the size bound; owned by this user), then at most the bound is
  read.

Any doubt is a miss with one warning line; the caller recomputes.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import threading
import stat
from pathlib import Path

SECRET_NAME = "secret"
SECRET_BYTES = 32


class Doubt(Exception):
    """An entry that must not be used; the message says why (one clause)."""


def cache_root() -> Path | None:
    """``$TPSIM_CACHE_DIR`` or ``$XDG_CACHE_HOME/tpsim`` or ``~/.cache/tpsim``; None when off or homeless."""
    root = os.environ.get("TPSIM_CACHE_DIR")
    if root and root.lower() in ("off", "none", "0"):
        return None
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    home = os.path.expanduser("~")
    if not xdg and not os.path.isabs(home):
        return None
    return Path(xdg or os.path.join(home, ".cache")) / "tpsim"


def secret(root: Path | None = None) -> bytes | None:
    """This user's sealing secret (created on first use), or None when it cannot be had safely (then the
    caches are not used: nothing read, nothing written)."""
    root = cache_root() if root is None else root
    if root is None:
        return None
    return _secret(str(root))


class _Secrets:
    """The secrets read so far, per cache root; a root whose secret could not be had is asked again next time
    (a reader that raced the creator must not keep the miss)."""

    def __init__(self) -> None:
        self._known: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, root: str) -> bytes | None:
        with self._lock:
            known = self._known.get(root)
            if known is None:
                known = _make_or_read(root)
                if known is not None:
                    self._known[root] = known
            return known

    def cache_clear(self) -> None:
        with self._lock:
            self._known.clear()


_secret = _Secrets()


def _make_or_read(root: str) -> bytes | None:
    """The secret at ``root``: read it, or write one to a private temporary file and link it into place (the
    file at the final name is always whole; when another process linked first, theirs is read)."""
    path = os.path.join(root, SECRET_NAME)
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    except OSError:
        return None
    tmp = os.path.join(root, f".{SECRET_NAME}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        try:
            os.write(fd, os.urandom(SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process or thread linked its secret first: use theirs
            pass
    except OSError:
        return None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    try:
        return _read_secret(path)
    except OSError:
        return None


def _read_secret(path: str) -> bytes | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 \
                or st.st_size != SECRET_BYTES:
            return None
        data = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    return data if len(data) == SECRET_BYTES else None


def seal(key: str, *parts: bytes, root: Path | None = None) -> bytes | None:
    """HMAC-SHA-256 (32 bytes) over ``key`` and ``parts`` under this user's secret; None without one."""
    s = secret(root)
    if s is None:
        return None
    mac = hmac.new(s, f"tpsim-cache\0{key}\0".encode(), hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.digest()


def verify(stored: bytes, key: str, *parts: bytes, root: Path | None = None) -> None:
    """Raise :class:`Doubt` unless ``stored`` is the seal of ``key`` and ``parts``."""
    expected = seal(key, *parts, root=root)
    if expected is None:
        raise Doubt("no sealing secret is available")
    if not hmac.compare_digest(stored, expected):
        raise Doubt("its seal does not verify (written by another user or tool, copied from another key, or "
                    "edited)")


def read_entry(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of a cache entry, or None when there is none. Raises :class:`Doubt` for anything but a
    regular file of this user of at most ``max_bytes`` (a symlink, a FIFO, a device, a folder, too large)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise Doubt("it is a symbolic link") from None
        return None  # unreadable: a plain miss
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Doubt("it is a folder")
        if not stat.S_ISREG(st.st_mode):
            raise Doubt("it is not a regular file (a FIFO, device or socket)")
        if st.st_uid != os.getuid():
            raise Doubt("it belongs to another user")
        if st.st_size > max_bytes:
            raise Doubt(f"it is {st.st_size:,} bytes, above the {max_bytes:,}-byte bound of an entry")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise Doubt("it grew while being read")
        return data
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    """Remove a doubtful entry (whatever it is: a link is removed, never its target)."""
    try:
        if path.is_dir() and not path.is_symlink():
            return
        path.unlink()
    except OSError:
        pass


__all__ = ["Doubt", "cache_root", "secret", "seal", "verify", "read_entry", "discard"]
