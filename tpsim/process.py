"""Child processes that die with their parent (issue 13: no verb leaves a process running after its own death,
whatever signal killed it).

A child calls :func:`die_with_parent` first thing: on Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the
kernel kill it when the parent thread that started it exits, even on the parent's SIGKILL, which no handler
sees; a watchdog thread covers other systems (and the window before the call, when the parent may already be
gone) by polling the parent pid.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
"""``<linux/prctl.h>``."""
WATCH_INTERVAL_S = 0.5


def die_with_parent(parent_pid: int | None = None) -> None:
    """Arrange for this process to be killed when its parent dies; ``parent_pid`` is the pid the parent had
    when it started us (default: the current parent). Kills itself at once if the parent is already gone."""
    parent = parent_pid if parent_pid is not None else os.getppid()
    if sys.platform.startswith("linux"):
        _pdeathsig()
    if os.getppid() != parent:  # the parent died before the call: the signal will never come
        os.kill(os.getpid(), signal.SIGKILL)
    thread = threading.Thread(target=_watch, args=(parent,), name="tpsim-die-with-parent", daemon=True)
    thread.start()


def _pdeathsig() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc symbol: the watchdog remains
        pass


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["die_with_parent"]
