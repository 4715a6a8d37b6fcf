"""Children that die with their parent, whatever kills it (SIGKILL included), on Linux.

``tpsim validate`` starts a launcher (``torch.distributed.run``) that starts the ranks, and short helper
processes (the profile probe, ``tpsim bench-collectives`` and its ranks). A SIGKILL to ``tpsim validate`` runs no
handler, so the children must notice by themselves: each asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, through ctypes) and, as a second line where the parent died before that call (or
prctl is unavailable), a daemon thread watches the parent pid and exits the process when it changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
"""prctl option number (linux/prctl.h)."""
WATCH_INTERVAL_S = 0.5


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent exits; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_preexec() -> None:
    """``preexec_fn`` of a ``subprocess.Popen``: the child dies when the process that started it does (the
    setting survives ``exec``)."""
    set_pdeathsig(signal.SIGKILL)


def watch_parent(expected_parent: int | None = None, interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """A daemon thread that exits this process (status 1) when its parent pid is no longer
    ``expected_parent`` (default: the parent now). Returns the thread (already started)."""
    parent = os.getppid() if expected_parent is None else expected_parent

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(interval_s)

    thread = threading.Thread(target=watch, name="tpsim-parent-watchdog", daemon=True)
    thread.start()
    return thread


def die_with_parent() -> None:
    """Both guards, for a process started by someone else's code (the launcher's ranks). If the parent is
    already gone (adopted by init), exit now."""
    parent = os.getppid()
    set_pdeathsig(signal.SIGKILL)
    if parent == 1:
        os._exit(1)
    watch_parent(parent)
