"""Issue 13, processes: no verb leaves a child running after its own death, whatever signal killed it; SIGTERM
and SIGHUP end a verb like Ctrl-C (cleanup runs, exit status 128 + signal)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import sys, time; sys.path.insert(0, {root!r}); import tpsim.procs as p; {tweak}"
         "p.die_with_parent(); print('ready', flush=True); time.sleep(120)")
PARENT = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
          "stdout=subprocess.PIPE, text=True); c.stdout.readline(); print(c.pid, flush=True); time.sleep(120)")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("tweak", ["", "p.set_pdeathsig = lambda *a: False; "], ids=["prctl", "watchdog"])
def test_child_dies_with_a_killed_parent(tweak):
    child = CHILD.format(root=str(ROOT), tweak=tweak)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, child], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert _alive(pid)
        parent.kill()  # SIGKILL: no handler of the parent runs
        parent.wait(timeout=10)
        assert _wait_gone([pid]) == []
    finally:
        parent.kill()


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def test_killed_bench_collectives_takes_its_ranks_with_it(tmp_path):
    """SIGKILL of `tpsim bench-collectives` (2 gloo ranks): the ranks are gone within seconds."""
    cmd = [sys.executable, "-m", "tpsim.cli", "bench-collectives", "--nproc", "2", "--sizes", "4K", "--iters",
           "60000", "--timeout", "30", "--out", str(tmp_path / "m.csv")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        ranks: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
            if len(ranks) >= 2 and all(_torch_loaded(p) for p in ranks):
                break
            time.sleep(0.2)
        assert len(ranks) >= 2, proc.stderr.read().decode() if proc.poll() is not None else "no ranks started"
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(ranks, timeout=15) == []
    finally:
        proc.kill()
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_ends_a_verb_like_ctrl_c(capsys, monkeypatch, tmp_path, sig):
    """The signal arrives during the work: cleanup runs (no temporary file is left), status 128 + signal."""
    import tpsim.report.markdown as md

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("the signal did not interrupt")
    monkeypatch.setattr(md, "search", interrupted)
    before = signal.getsignal(sig)
    code = main(["report", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8",
                 "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 128 + sig
    assert f"terminated by {signal.Signals(sig).name}" in capsys.readouterr().err
    assert signal.getsignal(sig) is before  # main() restores the handler it replaced
    assert not (tmp_path / "r").exists()
