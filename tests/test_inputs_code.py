"""Issue 26, code from data and modules under trace: code runs only when the command line names it, in a
bounded child; every way it can end is one line naming the module, and nothing is left running."""

import json
import os
import time
from pathlib import Path

import pytest

from tpsim.cli import main

DATA = Path(__file__).parent / "data" / "opgraph"


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
