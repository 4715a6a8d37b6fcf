"""Kernel profiles, measured with torch on this CPU: a tiny profile, resumption after a kill, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from tpsim.cli import main  # noqa: E402
from tpsim.compute.base import MEMORY_KERNEL_NAMES  # noqa: E402
from tpsim.compute.profile import ProfileModel, load_profile  # noqa: E402
from tpsim.errors import InputError  # noqa: E402
from tpsim.profiler.grid import cpu_grid, grid_tables  # noqa: E402
from tpsim.profiler.run import RunOptions, run_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = RunOptions(grid="tiny", dtypes=("fp32",), progress=False)


def _tiny_total(dtypes=("fp32",)) -> int:
    return sum(len(t) for t in grid_tables(cpu_grid("tiny"), dtypes, ("gemm", "attention", "memory")))


def _rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith(("#", "kind,"))]


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "tiny.csv"
    summary = run_profile(RunOptions(**{**TINY.__dict__, "out": path}))
    assert summary.measured + summary.skipped_slow == _tiny_total()
    return path


def test_tiny_profile_is_measured_and_usable(tiny_profile):
    profile = load_profile(tiny_profile, device="cpu", dtypes=("fp32",))
    assert profile.meta.threads == 1 and profile.meta.device_type == "cpu"
    assert {"timing", "grid", "memory_width"} <= set(profile.meta.extra)
    kinds = {key[0] for key in profile.tables}
    assert kinds == {"gemm", "attention", "memory"}
    assert {key[1] for key in profile.tables if key[0] == "memory"} == set(MEMORY_KERNEL_NAMES)
    model = ProfileModel(profile)
    t, measured = model.gemm(np.array([48.0, 96.0]), 100, 40, "fp32")
    assert measured.all() and np.all((t > 0) & (t < 0.1))
    t_fwd, _ = model.attention(3, 100, 32, True, "fp32", backward=False)
    t_bwd, _ = model.attention(3, 100, 32, True, "fp32", backward=True)
    assert 0 < float(t_fwd) < float(t_bwd)  # backward does more work than forward
    assert float(model.memory("layernorm", 3000, "fp32", backward=True)[0]) > 0


def test_rerun_measures_nothing_new(tiny_profile):
    before = tiny_profile.read_text()
    summary = run_profile(RunOptions(**{**TINY.__dict__, "out": tiny_profile}))
    assert summary.measured == 0 and summary.already == len(_rows(tiny_profile))
    assert tiny_profile.read_text() == before


SLOW_RUN = """
import sys, time
import tpsim.profiler.timing as timing
original = timing.time_kernel
def slow(fn, device, budget_s):
    time.sleep(0.03)
    return original(fn, device, budget_s)
timing.time_kernel = slow
from tpsim.profiler.run import RunOptions, run_profile
run_profile(RunOptions(grid="tiny", dtypes=("fp32",), progress=False, out=sys.argv[1]))
"""


def test_killed_run_loses_no_point_and_resumes(tmp_path):
    path = tmp_path / "killed.csv"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, str(path)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not path.exists() or len(_rows(path)) < 8):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup, no flush: a real kill
    proc.wait()
    before = _rows(path)
    assert 8 <= len(before) < _tiny_total()
    with open(path, "a") as f:  # the kill can also leave a half-written row: it is dropped on resume
        f.write("gemm,mm,fp32,fwd,12")
    summary = run_profile(RunOptions(**{**TINY.__dict__, "out": path}))
    after = _rows(path)
    assert after[: len(before)] == before  # finished points kept as they were
    assert summary.already == len(before)
    assert summary.measured + summary.skipped_slow == _tiny_total() - len(before)
    assert len(load_profile(path).points) == len(after)


def test_resume_refuses_another_thread_count_or_a_foreign_file(tiny_profile, tmp_path):
    with pytest.raises(InputError, match=r"threads='?1'? in the file but this run has '?2'?"):
        run_profile(RunOptions(**{**TINY.__dict__, "out": tiny_profile, "threads": 2}))
    other = tmp_path / "notes.csv"
    other.write_text("a,b\n1,2")
    with pytest.raises(InputError, match="not a tpsim profile"):
        run_profile(RunOptions(**{**TINY.__dict__, "out": other}))
    assert other.read_text() == "a,b\n1,2"


def test_cli_profile_and_check(tmp_path, capsys):
    path = tmp_path / "cli.csv"
    assert main(["profile", "--grid", "tiny", "--dtype", "fp32", "--kinds", "gemm,memory", "--out", str(path),
                 "--no-progress"]) == 0
    assert "points measured" in capsys.readouterr().out
    assert main(["profile", "--check", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["points"] > 0 and result["median_error_pct"] >= 0 and result["p90_error_pct"] >= 0
    assert set(result["per_kind"]) == {"gemm", "memory"}


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "fp8"], "--dtype=fp8 cannot be profiled on cpu"),
    (["--threads", "0"], "--threads: 0 must be a positive integer"),
    (["--kinds", "conv"], "--kinds='conv'"),
    (["--json"], "--json and --roofline go with --check"),
])
def test_cli_bad_options_are_one_line(tmp_path, capsys, argv, message):
    assert main(["profile", "--grid", "tiny", "--out", str(tmp_path / "x.csv"), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["profile", "--device", "cuda", "--out", str(tmp_path / "g.csv"), "--no-progress"]) == 2
    assert "--device=cuda: torch sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_runs_without_tqdm(tmp_path):
    """A GPU machine's bare Python may lack tqdm: the run falls back to progress lines."""
    code = ("import sys; sys.modules['tqdm'] = None; "
            "from tpsim.profiler.run import RunOptions, run_profile; "
            f"run_profile(RunOptions(grid='tiny', dtypes=('fp32',), kinds=('memory',), "
            f"out={str(tmp_path / 'n.csv')!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "profile cpu:" in done.stderr and "points" in done.stderr


def test_redo_noisy_measures_the_noisy_points_again(tmp_path):
    path = tmp_path / "noisy.csv"
    options = RunOptions(grid="tiny", dtypes=("fp32",), kinds=("memory",), progress=False, out=path)
    run_profile(options)
    lines = path.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("memory,gelu"))
    cells = lines[row].rstrip("\n").split(",")
    lines[row] = ",".join(cells[:-1] + ["999999.0"]) + "\n"  # as if measured while the machine was busy
    path.write_text("".join(lines))
    summary = run_profile(RunOptions(**{**options.__dict__, "redo_noisy_pct": 99999.0}))
    assert summary.measured == 1 and summary.already == len(_rows(path)) - 1
    assert "999999.0" not in path.read_text()
