"""``tpsim validate`` when things go wrong: SIGKILL leaves no launcher or rank, a failed run keeps and names its
logs, ``--backend nccl`` without GPUs and an unusable ``--out-dir`` are refused before any rank starts; the
children's guards (PR_SET_PDEATHSIG, parent watchdog) on their own. Each test is bounded in time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

TAG = "TPSIM_TEST_TAG"
"""a variable set in the environment of the tpsim validate under test: its launcher and ranks inherit it, so they
are told apart from other runs on a shared machine."""

TINY = ["--model", "gpt3-1.3b", "--hidden", "64", "--heads", "2", "--seq-len", "16", "--micro-batch", "2",
        "--no-calibrate", "--no-probe", "--reps", "1", "--warmup", "0"]


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpsim.cli", "validate", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds ``TAG=tag`` (Linux /proc)."""
    needle = f"{TAG}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            pids.append(int(entry.name))
    return pids


def _wait_gone(tag: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = tagged_pids(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = tagged_pids(tag)
    return left


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_sigkill_to_tpsim_validate_leaves_no_launcher_or_rank(tmp_path):
    """SIGKILL runs no handler: the launcher dies by PR_SET_PDEATHSIG, the ranks by theirs (and watchdogs)."""
    pytest.importorskip("torch")
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "tpsim.cli", "validate", *TINY, "--tp", "1", "--dp", "2", "--timeout", "60",
           "--out-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, env={**os.environ, "TPSIM_VALIDATE_FAIL": "1:hang", TAG: tag},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(tagged_pids(tag)) < 4:
            time.sleep(0.2)  # tpsim validate, the launcher and both ranks are up
        assert len(tagged_pids(tag)) >= 4
        proc.kill()
        proc.wait(timeout=10)
        left = _wait_gone(tag, 15)
        assert not left, f"left running after SIGKILL: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in tagged_pids(tag):  # only what this test started
            os.kill(pid, signal.SIGKILL)


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_failed_run_keeps_and_names_its_logs(tmp_path):
    pytest.importorskip("torch")
    proc = _cli(*TINY, "--tp", "1", "--dp", "2", "--timeout", "30", "--out-dir", str(tmp_path),
                env={"TPSIM_VALIDATE_FAIL": "1:check"}, timeout=85)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "rank 1 failed" in line and "injected failure" in line and "logs kept in " in line
    logs = Path(line.rsplit("logs kept in ", 1)[1].rstrip("]"))
    try:
        assert logs.is_dir()
        assert list(logs.rglob("error-rank1.json")) and list(logs.rglob("launcher.log"))
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    assert not list(tmp_path.glob("*.json"))  # no report from a failed run


@pytest.mark.timeout(60)
def test_nccl_without_gpus_is_refused_before_any_rank_starts(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _cli(*TINY, "--tp", "2", "--backend", "nccl", "--out-dir", str(tmp_path), env={"TMPDIR": str(tmp)},
                timeout=55)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--backend=nccl needs 2 CUDA GPU(s)" in lines[0] and "torch sees 0" in lines[0]
    assert not list(tmp.iterdir())  # no work folder: nothing was launched


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "a-file", "is not a directory"),
    (lambda tmp: tmp / "a-file" / "below", "is not a writable directory"),
])
def test_out_dir_that_is_not_a_writable_directory_is_refused(tmp_path, make, message):
    (tmp_path / "a-file").write_text("x")
    proc = _cli(*TINY, "--tp", "2", "--out-dir", str(make(tmp_path)))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.timeout(30)
def test_child_dies_with_its_parent():
    """PR_SET_PDEATHSIG as tpsim's Popen calls set it: a grandchild outlives nothing."""
    code = ("import subprocess, sys, time\n"
            "from tpsim.procs import child_preexec\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=child_preexec)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)
    assert _gone(child, 10), "the child survived its SIGKILLed parent"


@pytest.mark.timeout(30)
def test_watchdog_exits_when_the_parent_changes():
    code = ("import os, time\n"
            "from tpsim.procs import watch_parent\n"
            "watch_parent(os.getppid() + 10**6, interval_s=0.05)\n"  # a parent it never had: exits at once
            "time.sleep(20)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], timeout=25)
    assert proc.returncode == 1 and time.monotonic() - t0 < 15


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False
