"""``tpsim validate`` as one rank of a launch someone else started (torchrun, srun; rank side, torch).

Every rank runs the same ``tpsim validate`` command (:mod:`tpsim.validate.launchers` tells it where it stands).
They start the default process group first (``env://``, ``--timeout`` for every collective), exchange their host
names, then:

* **rank 0** does what ``tpsim validate`` does on its own launch: prepare (profile, probe; the collective
  calibration is skipped, it would need a launch of its own), fit the cases, and for each launch
  (:func:`run_launch`, the seam :func:`tpsim.validate.launch.launch` calls) broadcast the job to the others, run
  its own part (:func:`tpsim.validate.worker.run_job`), gather; then predict and write the report, and tell the
  others to stop;
* **every other rank** waits for a job (:func:`follow`), runs its part, and stops when rank 0 says so.

Failures: a rank that fails records ``{rank, host, type, message}`` in the launch's key-value store (torchrun's
agent store outlives the rank) and exits 1 at once; the launcher (torchrun with ``--max-restarts=0``, srun with
``--kill-on-bad-exit=1``) then ends every rank. Rank 0, when a collective fails, names the rank that recorded
the first failure and its host (or says that a peer died without a word, e.g. killed). No rank waits longer than
``--timeout`` in any collective, and ``--run-timeout`` bounds every rank's whole run.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .launchers import Joined

FAIL_PREFIX = "tpsim/validate/failed/"
_STATE: dict[str, Any] = {}
"""this process's joined launch: ``joined`` (:class:`Joined`), ``hosts`` (per rank), ``timeout_s``."""


def start(joined: Joined, backend: str, timeout_s: float, threads: int,
          run_timeout_s: float | None = None) -> list[str]:
    """Start the process group of the launch; returns every rank's host name (index = rank)."""
    import torch
    import torch.distributed as dist

    from .worker import _inject, init_group

    os.environ.update(joined.env())
    torch.set_num_threads(threads)
    _inject(joined.rank, "start")
    if run_timeout_s is not None:
        _watchdog(joined, run_timeout_s)
    init_group(backend, timeout_s)
    beat = Heartbeat(joined, dead_after_s=max(HEARTBEAT_MIN_DEAD_S, timeout_s / 3))
    hosts: list[Any] = [None] * joined.world
    dist.all_gather_object(hosts, joined.host)  # every rank has beaten once past here
    _STATE.update(joined=joined, hosts=hosts, timeout_s=timeout_s)
    beat.start(hosts)
    return hosts


HEARTBEAT_PERIOD_S = 1.0
HEARTBEAT_MIN_DEAD_S = 10.0
"""a rank whose heartbeat stopped for this long (at least; a third of --timeout) is dead."""


class Heartbeat:
    """Liveness of the ranks through the launch's key-value store, on a connection of its own: every rank bumps
    its counter each second; rank 0 watches every counter (one multi-get a second), the others rank 0's and the
    abort key. A rank killed with SIGKILL (no error to report) or a lost node is then found within
    ``dead_after_s``, whatever collective the survivors are blocked in (gloo does not always notice a peer that
    is gone), and every rank ends with one line naming the dead rank and its host."""

    def __init__(self, joined: Joined, dead_after_s: float) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        self.joined, self.dead_after_s = joined, dead_after_s
        self.store = dist.TCPStore(joined.master_addr, joined.master_port, is_master=False,
                                   timeout=timedelta(seconds=dead_after_s), wait_for_workers=False)
        self.count = 0
        self._beat()

    def _key(self, rank: int) -> str:
        return f"tpsim/validate/alive/{rank}"

    def _beat(self) -> None:
        self.count += 1
        self.store.set(self._key(self.joined.rank), str(self.count))

    def start(self, hosts: list[str]) -> None:
        self.hosts = hosts
        threading.Thread(target=self._run, daemon=True, name="tpsim-heartbeat").start()

    def _run(self) -> None:
        j = self.joined
        watched = list(range(j.world)) if j.rank == 0 else [0]
        keys = [self._key(r) for r in watched]
        seen = {r: (None, time.monotonic()) for r in watched}
        store_ok = time.monotonic()
        while True:
            time.sleep(HEARTBEAT_PERIOD_S)
            now = time.monotonic()
            try:
                self._beat()
                values = self.store.multi_get(keys)
                if j.rank != 0 and self.store.check(["tpsim/validate/abort"]):
                    _leave(self.store.get("tpsim/validate/abort").decode())
                store_ok = now
            except Exception:  # noqa: BLE001 - the store's host is gone, or busy: give it dead_after_s
                if now - store_ok > self.dead_after_s:
                    _leave(f"rank {j.rank} on {j.host}: the launch's store at {j.master_addr}:{j.master_port} "
                           f"stopped answering for {self.dead_after_s:.0f} s (its node or launcher is gone)")
                continue
            for r, v in zip(watched, values):
                last, since = seen[r]
                if v != last:
                    seen[r] = (v, now)
                elif r != j.rank and now - since > self.dead_after_s:
                    msg = (f"rank {r} on {self.hosts[r]} stopped (no heartbeat for {now - since:.0f} s: killed, "
                           f"or its node lost); seen by rank {j.rank} on {j.host}")
                    if j.rank == 0:
                        try:
                            self.store.set("tpsim/validate/abort", msg)
                        except Exception:  # noqa: BLE001
                            pass
                    _leave(msg)


def _leave(message: str) -> None:
    print(f"tpsim validate: error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def ranks_per_host(hosts: list[str]) -> int:
    return max(hosts.count(h) for h in set(hosts)) if hosts else 1


def _watchdog(joined: Joined, run_timeout_s: float) -> None:
    """Every rank ends after ``--run-timeout``, whatever it is waiting for."""
    def expire() -> None:
        print(f"tpsim validate: error: rank {joined.rank} on {joined.host}: --run-timeout={run_timeout_s:g} s "
              "exceeded", file=sys.stderr, flush=True)
        os._exit(1)
    timer = threading.Timer(run_timeout_s, expire)
    timer.daemon = True
    timer.start()


def guard_signals(joined: Joined) -> None:
    """The launcher stops the ranks of a failed run with SIGTERM; a rank blocked in a collective (C++, up to
    ``--timeout``) would run no Python handler until it returns. A thread waits for the signal instead (blocked
    in every other thread: call this before any other thread starts) and ends the rank at once with one line
    (the failure a rank recorded, if any)."""
    import signal

    sigs = {signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

    def wait() -> None:
        sig = signal.sigwait(sigs)
        first = recorded_failures(joined.world) if _STATE else []
        why = (f": rank {first[0]['rank']} on {first[0]['host']} failed: {first[0]['type']}: {first[0]['message']}"
               if first else "")
        print(f"tpsim validate: rank {joined.rank} on {joined.host} stopped by the launcher "
              f"({signal.Signals(sig).name}){why}", file=sys.stderr, flush=True)
        os._exit(128 + sig)
    threading.Thread(target=wait, daemon=True, name="tpsim-sigterm").start()


def _bounded(fn: Any, seconds: float, default: Any) -> Any:
    """``fn()`` in a thread, or ``default`` after ``seconds`` (a store whose host died may not answer)."""
    box = [default]

    def run() -> None:
        try:
            box[0] = fn()
        except Exception:  # noqa: BLE001 - best effort
            pass
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    return box[0]


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d
        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: failures are then named by the launcher only
        return None


def record_failure(exc: BaseException, joined: Joined | None = None) -> None:
    """Put this rank's failure in the launch's store (best effort), unless it is a consequence of a peer's."""
    from .launch import _SECONDARY

    joined = joined or _STATE.get("joined")
    store = _store() if _STATE else None
    if joined is None or store is None or _SECONDARY.search(f"{type(exc).__name__}: {exc}"):
        return
    value = {"rank": joined.rank, "host": joined.host, "time": time.time(), "type": type(exc).__name__,
             "message": str(exc).splitlines()[0][:500] if str(exc) else ""}
    _bounded(lambda: store.set(f"{FAIL_PREFIX}{joined.rank}", json.dumps(value)), 2.0, None)


def recorded_failures(world: int) -> list[dict[str, Any]]:
    """The failures ranks recorded, earliest first (within 3 s: none if the store's host is gone)."""
    store = _store()
    if store is None:
        return []

    def read() -> list[dict[str, Any]]:
        found = []
        for r in range(world):
            key = f"{FAIL_PREFIX}{r}"
            if store.check([key]):
                found.append(json.loads(store.get(key)))
        return found
    return sorted(_bounded(read, 3.0, []), key=lambda e: e["time"])


def failure_message(exc: BaseException, joined: Joined | None = None) -> str:
    """This rank's account of a failed run: the first failure any rank recorded (rank, host, error), else its
    own error (a peer that stopped answering without a word is said to be one)."""
    from .launch import _SECONDARY

    joined = joined or _STATE["joined"]
    own = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    secondary = bool(_SECONDARY.search(own))
    if secondary:
        if _STATE:
            time.sleep(0.5)  # a peer that failed first is recording its failure
            for err in recorded_failures(joined.world):
                return f"rank {err['rank']} on {err['host']} failed: {err['type']}: {err['message']}"
        return (f"rank {joined.rank} on {joined.host}: a peer rank stopped answering without reporting an error "
                f"(killed, or its node lost; the launcher's log on each node names it): {own}")
    return f"rank {joined.rank} on {joined.host} failed: {own}"


def run_launch(job: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Rank 0: one launch of the joined run (every rank runs ``job``); returns the gathered ``result.json``."""
    import torch.distributed as dist

    from .launch import RankFailure
    from .worker import run_job

    joined = _STATE["joined"]
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        dist.broadcast_object_list([job], src=0)
        run_job(job, run_dir, joined.rank)
    except Exception as exc:  # noqa: BLE001 - reported with the rank and host that failed first
        _STATE["broken"] = True
        record_failure(exc)
        raise RankFailure(failure_message(exc)) from None
    result = json.loads((run_dir / "result.json").read_text())
    result.setdefault("meta", {})["hosts"] = _STATE["hosts"]
    result["meta"]["launcher"] = joined.launcher
    return result


def broken() -> bool:
    """Whether a launch of this run failed (the process group is then no longer usable)."""
    return bool(_STATE.get("broken"))


def stop_followers() -> None:
    """Rank 0, after the report: the other ranks may leave."""
    import torch.distributed as dist

    dist.broadcast_object_list([None], src=0)
    dist.destroy_process_group()


def follow(work: Path) -> None:
    """A rank other than 0: run every job rank 0 broadcasts until it says stop."""
    import torch.distributed as dist

    from .worker import run_job

    joined = _STATE["joined"]
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        job = box[0]
        if job is None:
            break
        run_job(job, work, joined.rank)
    dist.destroy_process_group()
