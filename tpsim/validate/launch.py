"""Launch the ranks through torch.distributed's launcher and collect what they wrote (torch-free here).

Single node: ``python -m torch.distributed.run --standalone`` (c10d rendezvous on a port the OS picks, never a
fixed one). Several nodes: the same command on every node with ``--nnodes``, ``--rdzv-endpoint HOST:PORT`` and
``--rdzv-id`` (see docs/VALIDATION.md). Every process of a run carries an environment marker so that, whatever
happens (a rank fails, the launcher is killed, the run times out), no process of the run is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, Terminated, TpsimError
from .block.case import Case
from ..procs import child_preexec

MARK_ENV = "TPSIM_VALIDATE_RUN"
"""environment variable set to a unique token in every process of one run."""

BACKENDS = ("gloo", "nccl")

# Messages of ranks that failed because a peer died or stopped answering: consequences, not causes.
_SECONDARY = re.compile(r"connection (closed|reset)|peer|timed? ?out|timeout|broken pipe|socket|"
                        r"SIGTERM|terminated|ECONNRESET|EPIPE|gloo", re.I)


class RankFailure(TpsimError):
    """A rank (or the launcher) failed; the message is the first real error, naming the rank."""


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the ranks."""

    nproc: int
    """ranks on this node."""
    backend: str = "gloo"
    timeout_s: float = 30.0
    """process-group timeout (every collective) and rendezvous join timeout, seconds."""
    threads: int = 1
    """intra-op threads per rank (torch.set_num_threads, OMP_NUM_THREADS)."""
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """HOST:PORT of the c10d rendezvous for several nodes; "" = standalone (free port on this node)."""
    rdzv_id: str = "tpsim-validate"
    run_timeout_s: float | None = None
    """wall-clock limit of the whole launch (None: none beyond the process-group timeout)."""
    joined: bool = False
    """this process is rank 0 of a launch the user started (torchrun, srun: :mod:`tpsim.validate.joined`):
    :func:`launch` runs the job on that launch's ranks instead of starting its own."""
    host_ranks: int = 0
    """ranks on the busiest host of a joined launch (0: ``nproc``), for the core-per-rank timing rule."""
    trace_terms: bool | str = False
    """whole-plan cases: profiled steps on rank 0 and one rank per stage (True: ``--trace-terms``; "auto", the
    CLI's default: stopped after the first when the profiler's overhead is too large to use them;
    :func:`tpsim.validate.plan.run.profile_steps`)."""
    trace_dir: str = ""
    """folder of the profiled ranks' chrome traces ("": none written)."""
    memory_limit_bytes: int | None = None
    """resident memory one process of the run (the launcher, a rank) may hold; above it the run is stopped and
    reported as failed (``validate --model X.ops.json --memory-limit-gib``: the user's module runs there). A
    watchdog on /proc, not ``RLIMIT_AS``: CUDA maps far more address space than it uses."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"--backend={self.backend!r} is not one of {', '.join(BACKENDS)}")
        for name in ("nproc", "threads", "nnodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"--{name}={value!r} must be a positive integer")
        if not self.timeout_s > 0:
            raise InputError(f"--timeout={self.timeout_s!r} must be a positive number of seconds")
        if self.nnodes > 1 and not self.rdzv_endpoint and not self.joined:
            raise InputError(f"--nnodes={self.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")

    def command(self, job_path: Path) -> list[str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}",
               "--max-restarts=0", "--monitor-interval=0.2"]
        if self.nnodes == 1 and not self.rdzv_endpoint:
            cmd.append("--standalone")
        else:
            cmd += [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                    f"--rdzv-id={self.rdzv_id}", f"--rdzv-conf=join_timeout={int(self.timeout_s)}"]
        return cmd + ["-m", "tpsim.validate.worker", "--job", str(job_path)]


def marked_pids(token: str | None) -> list[int]:
    """PIDs of live processes whose environment carries ``MARK_ENV=token`` (any token when None; Linux /proc)."""
    needle = f"{MARK_ENV}={token}".encode() if token is not None else f"{MARK_ENV}=".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        entries = env.split(b"\0")
        found = needle in entries if token is not None else any(e.startswith(needle) for e in entries)
        if found and state != "Z":
            pids.append(int(entry.name))
    return pids


def _kill_all(proc: subprocess.Popen, token: str, grace_s: float = 3.0) -> None:
    """SIGTERM the launcher and every process of the run, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        targets = set(marked_pids(token))
        if proc.poll() is None:
            targets.add(proc.pid)
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (proc.poll() is None or marked_pids(token)):
            time.sleep(0.05)
        if proc.poll() is not None and not marked_pids(token):
            return
    proc.wait()


def first_error(run_dir: Path) -> dict[str, Any] | None:
    """The first real error among the ranks' error files: the earliest one that is not a consequence of a
    peer failing (closed connection, timeout), else the earliest one."""
    errors = []
    for path in run_dir.glob("error-rank*.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not errors:
        return None
    errors.sort(key=lambda e: e["time"])
    primary = [e for e in errors if not _SECONDARY.search(f"{e['type']}: {e['message']}")]
    return (primary or errors)[0]


def launch(cases: list[Case], cfg: LaunchConfig, run_dir: Path | None = None,
           env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Run ``cases`` on ``cfg.nproc`` ranks; return rank 0's ``result.json`` ({"meta", "ranks"}), or None on
    a node of a multi-node run that did not hold rank 0 (the results are on that node).

    Raises :class:`RankFailure` with the first real error (rank, type, message) if any rank fails, or if the
    run exceeds ``cfg.run_timeout_s``; in every case no process of the run is left.
    """
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="tpsim-validate-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*run_dir.glob("error-rank*.json"), run_dir / "result.json"]:
        stale.unlink(missing_ok=True)  # a reused folder: only this run's errors and result count
    job = {"cases": [c.to_dict() for c in cases], "backend": cfg.backend, "timeout_s": cfg.timeout_s,
           "threads": cfg.threads, "out_dir": str(run_dir)}
    if cfg.joined:  # the user's launcher started the ranks: they are waiting for this job
        from .joined import run_launch
        return run_launch(job, run_dir)
    job_path = run_dir / "job.json"
    job_path.write_text(json.dumps(job))
    token = uuid.uuid4().hex
    penv = {**os.environ, **(env or {}), MARK_ENV: token, "OMP_NUM_THREADS": str(cfg.threads),
            "PYTHONUNBUFFERED": "1", **({"TPSIM_VALIDATE_TRACE": "auto" if cfg.trace_terms == "auto" else "1"} if cfg.trace_terms else {}),
            **({"TPSIM_VALIDATE_TRACE_DIR": cfg.trace_dir} if cfg.trace_terms and cfg.trace_dir else {})}
    log_path = run_dir / "launcher.log"
    with open(log_path, "wb") as log, _terminate_as_exception():
        proc = subprocess.Popen(cfg.command(job_path), stdout=log, stderr=subprocess.STDOUT, env=penv,
                                start_new_session=True, preexec_fn=child_preexec)
        try:
            _supervise(proc, cfg, run_dir, token)
        finally:
            _kill_all(proc, token)
    return _collect(proc.returncode, run_dir, log_path, cfg.nnodes > 1)


@contextlib.contextmanager
def _terminate_as_exception():
    """SIGTERM (and SIGHUP) to this process raise, so that the ``finally`` above stops the ranks (the launcher
    and the ranks run in sessions of their own and would not get the signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Terminated(signum)  # like Ctrl-C: the ranks are stopped, tpsim prints one line, exit 128 + signal
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _supervise(proc: subprocess.Popen, cfg: LaunchConfig, run_dir: Path, token: str) -> None:  # noqa: ARG001 (unused: kept for the callers)
    """Wait for the launcher; stop everything on the wall-clock limit or when a failed rank's peers linger
    longer than the process-group timeout."""
    start = time.monotonic()
    failed_at = None
    checked_memory = start
    while proc.poll() is None:
        now = time.monotonic()
        if cfg.run_timeout_s is not None and now - start > cfg.run_timeout_s:
            (run_dir / "error-rank-launcher.json").write_text(json.dumps(
                {"rank": "launcher", "time": time.time(), "type": "Timeout",
                 "message": f"the run exceeded --run-timeout={cfg.run_timeout_s:g} s"}))
            return
        if cfg.memory_limit_bytes is not None and now - checked_memory >= 0.2:
            checked_memory = now
            over = _over_memory([proc.pid, *marked_pids(token)], cfg.memory_limit_bytes)
            if over is not None:
                pid, rss = over
                (run_dir / "error-rank-launcher.json").write_text(json.dumps(
                    {"rank": "launcher", "time": time.time(), "type": "MemoryLimit",
                     "message": f"process {pid} of the run holds {rss / 2**30:.1f} GiB, above the memory limit of "
                                f"{cfg.memory_limit_bytes / 2**30:g} GiB per process (--memory-limit-gib)"}))
                return
        if failed_at is None and any(run_dir.glob("error-rank*.json")):
            failed_at = now
        if failed_at is not None and now - failed_at > cfg.timeout_s:
            return
        time.sleep(0.1)


def _over_memory(pids: list[int], limit: int) -> tuple[int, int] | None:
    """(pid, resident bytes) of the first of ``pids`` above ``limit``, else None (/proc/PID/status VmRSS)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        rss = int(line.split()[1]) * 1024
                        if rss > limit:
                            return pid, rss
                        break
        except (OSError, ValueError, IndexError):
            continue
    return None


def _collect(returncode: int | None, run_dir: Path, log_path: Path, multi_node: bool) -> dict[str, Any] | None:
    result_path = run_dir / "result.json"
    err = first_error(run_dir)
    if err is None and returncode == 0:
        if result_path.exists():
            return json.loads(result_path.read_text())
        if multi_node:
            return None
    if err is None and result_path.exists():
        # Every rank's results were gathered and written by rank 0 before a rank died in teardown (after
        # destroy_process_group): the measurements are complete; keep them and record how the launcher ended.
        result = json.loads(result_path.read_text())
        result.setdefault("meta", {})["launcher_status"] = returncode
        return result
    if err is not None:
        where = f"rank {err['rank']}" if err["rank"] != "launcher" else "launcher"
        raise RankFailure(f"{where} failed: {err['type']}: {err['message']} (logs: {run_dir})")
    line = _last_exception(log_path)
    raise RankFailure(f"the launcher exited with status {returncode} and no rank reported an error"
                      f"{': ' + line if line else ''} (logs: {run_dir})")


_EXCEPTION_LINE = re.compile(r"^\s*(\[rank\d+\]:\s*)?([A-Za-z_.]*(Error|Exception|Interrupt)): ")


def _last_exception(log_path: Path) -> str:
    """The last ``SomeError: message`` line of the launcher's log that is not the launcher's own
    ``ChildFailedError`` (a rank that died before it could write its error file: an import error, a crash),
    else the log's last line."""
    if not log_path.exists():
        return ""
    lines = log_path.read_text(errors="replace").strip().splitlines()
    found = [ln.strip() for ln in lines if _EXCEPTION_LINE.match(ln) and "ChildFailedError" not in ln]
    return (found or lines[-1:] or [""])[-1][:300]
