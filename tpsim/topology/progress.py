"""Progress on stderr for phases that can take more than a second (building a full graph, routing many pairs
on it, checking a cluster): a tqdm bar that appears after one second, silent when stderr is not a terminal
and when the command prints JSON (the CLI calls :func:`set_enabled`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

_ENABLED = True


def set_enabled(enabled: bool) -> None:
    """Turn progress bars on (default; still only on a terminal) or off (``--json``)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def enabled() -> bool:
    return _ENABLED


def _is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def bar_or_silent(show: bool, **kwargs: object) -> Iterator[object]:
    """``tqdm(**kwargs)`` when ``show``, else a silent bar (tqdm is not imported: it is a tenth of a quick
    command's start)."""
    if not show:
        yield _Silent()
        return
    from tqdm import tqdm

    with tqdm(**kwargs) as bar:
        yield bar


@contextmanager
def progress(total: int | None, desc: str, unit: str = "it", quick: bool = False) -> Iterator[object]:
    """A bar with ``update(n)``; ``quick=True`` (the caller knows the work is small) gives a silent one
    without importing tqdm."""
    if quick or not _ENABLED or not _is_terminal(sys.stderr):  # what tqdm's disable=None would decide
        yield _Silent()
        return
    from tqdm import tqdm

    # disable=None: tqdm stays silent when stderr is not a terminal
    bar = tqdm(total=total, desc=desc, unit=unit, delay=1.0, disable=None, leave=False, file=sys.stderr,
               dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
