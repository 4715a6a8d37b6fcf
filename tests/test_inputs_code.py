"""Issue 26, code from data and modules under trace: code runs only when the command line names it, in a
bounded child; every way it can end is one line naming the module, and nothing is left running."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpsim.cli import main

DATA = Path(__file__).parent / "data" / "opgraph"
ROOT = Path(__file__).resolve().parents[1]


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("tpsim"), err
    return err[0]


def test_module_spec_inside_an_op_graph_never_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef f(): pass\n")
    graph = json.loads((DATA / "tiny-resnet.ops.json").read_text())
    graph["source"]["module_spec"] = f"{evil}:f"
    path = tmp_path / "g.ops.json"
    path.write_text(json.dumps(graph))
    assert main(["validate", "--model", str(path), "--tp", "2"]) == 2
    line = _one_line(capsys)
    assert "give --module-spec" in line and "never run" in line
    assert not marker.exists()


def test_trace_checks_name_and_output_before_running_the_module(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    mod = tmp_path / "m.py"
    mod.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef f(): pass\n")
    assert main(["trace", f"{mod}:f", "--input-shape", "1,4", "--name", "../escaped"]) == 2
    assert "--name '../escaped'" in _one_line(capsys)
    existing = tmp_path / "x.ops.json"
    existing.write_text("keep")
    assert main(["trace", f"{mod}:f", "--input-shape", "1,4", "--out", str(existing)]) == 2
    assert "already exists" in _one_line(capsys)
    assert not marker.exists() and existing.read_text() == "keep" and not (tmp_path.parent / "escaped.ops.json").exists()


def test_trace_of_a_module_that_hangs_or_exits_is_a_failure_naming_it(tmp_path, capsys):
    pid_file = tmp_path / "pid"
    loop = tmp_path / "loop.py"
    loop.write_text(f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n")
    start = time.monotonic()
    assert main(["trace", f"{loop}:f", "--input-shape", "1,4", "--timeout-s", "4",
                 "--out", str(tmp_path / "a.ops.json")]) == 2
    assert time.monotonic() - start < 60
    line = _one_line(capsys)
    assert "loop.py:f" in line and "no graph after 4 s" in line
    if pid_file.exists():  # the child got as far as the user's code: it is gone now
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\nsys.exit(0)\n")
    assert main(["trace", f"{quits}:f", "--input-shape", "1,4", "--out", str(tmp_path / "b.ops.json")]) == 2
    line = _one_line(capsys)
    assert "quits.py:f" in line and "sys.exit(0)" in line
    assert not (tmp_path / "a.ops.json").exists() and not (tmp_path / "b.ops.json").exists()


def _traced_validate(module: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tpsim.cli", "validate", "--model", str(DATA / "tiny-gpt.ops.json"), "--tp", "2",
            "--module-spec", f"{module}:f", "--no-calibrate", "--no-profile", "--no-probe",
            "--out-dir", str(module.parent / "out"), *extra]


def _env(tmp_path: Path) -> dict:
    return dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _validate_here(argv: list[str], tmp_path: Path, monkeypatch, capsys) -> tuple[int, list[str]]:
    """``tpsim validate`` in this process (its ranks are child processes either way; the SIGTERM test below
    checks the process boundary): exit status and the non-empty stderr lines."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    capsys.readouterr()
    rc = main(argv[3:])  # after [python, -m, tpsim.cli]
    return rc, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_validate_module_that_exits_at_import_is_a_failure_naming_it(tmp_path, monkeypatch, capsys):
    """Issue 26: sys.exit(0) at import of the --module-spec module was reported as a rank failure "SystemExit: 0"
    without the module; now the line names the module and the exit."""
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\nsys.exit(0)\ndef f(): pass\n")
    rc, err = _validate_here(_traced_validate(quits), tmp_path, monkeypatch, capsys)
    assert rc == 1 and len(err) == 1, (rc, err)
    assert "quits.py:f" in err[0] and "sys.exit(0)" in err[0]


def test_validate_module_over_the_memory_limit_is_stopped(tmp_path, monkeypatch, capsys):
    """The ranks that run the user's module are bounded in memory (--memory-limit-gib), as trace's child is."""
    hog = tmp_path / "hog.py"
    hog.write_text("import time\nx = bytearray(3 * 2**30)\nx[::4096] = b'\\x01' * len(range(0, len(x), 4096))\n"
                   "time.sleep(120)\ndef f(): pass\n")
    start = time.monotonic()
    rc, err = _validate_here(_traced_validate(hog, "--memory-limit-gib", "0.75"), tmp_path, monkeypatch, capsys)
    assert rc == 1 and len(err) == 1, (rc, err)
    assert "memory limit of 0.75 GiB" in err[0] and "hog.py:f" in err[0]
    assert time.monotonic() - start < 120


def test_sigterm_to_validate_is_one_line_and_143(tmp_path):
    """SIGTERM while the ranks run: the ranks are stopped, one line, status 143 (it was 1 and two lines)."""
    pid_file = tmp_path / "pid"
    slow = tmp_path / "slow.py"
    slow.write_text(f"import os, time\nopen({str(pid_file)!r} + str(os.getpid()), 'w').write('x')\n"
                    "time.sleep(120)\ndef f(): pass\n")
    proc = subprocess.Popen(_traced_validate(slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("pid*")) and proc.poll() is None:
            time.sleep(0.2)
        assert list(tmp_path.glob("pid*")), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = [ln for ln in stderr.splitlines() if ln.strip()]
    assert proc.returncode == 143 and err == ["tpsim validate: terminated by SIGTERM"], (proc.returncode, err)
    for marker in tmp_path.glob("pid*"):
        pid = int(marker.name[3:])
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"rank {pid} is still running")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tpsim-validate")]  # the work folder went too
