"""``tpsim validate`` under the user's launcher: two torchrun "nodes" on 127.0.0.1 (two launchers, ``--nnodes 2
--node-rank 0/1``, c10d rendezvous on a free port), gloo, tp 2 x pp 2 on 4 ranks, each rank started as
``-m tpsim.validate.worker --validate ARGS`` (what ``--print-launch torchrun`` prints). Success, a failing rank,
``kill -9`` of one rank and of one launcher: every run ends in bounded time, the failure is named with its rank
and host, and no process of the run is left. Slurm's environment is translated and tested without Slurm."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tpsim.errors import InputError  # noqa: E402
from tpsim.validate.launch import marked_pids  # noqa: E402
from tpsim.validate.launchers import detect, first_host, sbatch_script, tasks_on_first_node, torchrun_line  # noqa: E402

MARK = "TPSIM_TEST_TORCHRUN"
ARGS = ["--model", "gpt3-1.3b", "--layers", "4", "--hidden", "64", "--heads", "2", "--seq-len", "16", "--tp", "2",
        "--pp", "2", "--no-probe", "--timeout", "30", "--run-timeout", "150", "--reps", "1", "--warmup", "0",
        "--no-overhead", "--no-trace-terms"]
"""4 ranks on 2 cores check numerics and collectives only: one step, no tiny twin, no profiled steps."""
HOST = os.uname().nodename


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids(token: str, rank: int | None = None, launcher: bool = False) -> list[int]:
    """Live processes of one test run (the marker in their environment): its ranks or its launchers."""
    out = []
    for pid in marked_pids(None):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"{MARK}={token}".encode() not in env:
            continue
        is_launcher = b"torch.distributed.run" in cmd
        if launcher and is_launcher and f"--node-rank={rank}".encode() in cmd:
            out.append(pid)
        elif not launcher and not is_launcher and f"RANK={rank}".encode() in env:
            out.append(pid)
    return out


def _marked(token: str) -> list[int]:
    return [p for p in marked_pids(None) if f"{MARK}={token}".encode() in
            _environ(p)]


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def two_nodes(tmp_path: Path, extra_env: dict[str, str] | None = None, kill: str | None = None,
              deadline_s: float = 170.0) -> tuple[list[int], list[str], float, str]:
    """Start the two launchers; optionally ``kill -9`` rank 3 ("rank") or node 1's launcher ("launcher") once it
    runs; wait for both; return (exit codes, logs, seconds, token). Stragglers are killed and fail the test."""
    port, token = _free_port(), uuid.uuid4().hex
    env = {**os.environ, MARK: token, "TPSIM_VALIDATE_RUN": token, **(extra_env or {})}
    procs, logs = [], []
    start = time.monotonic()
    for node in (0, 1):
        log = open(tmp_path / f"node{node}.log", "wb")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
               "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id=test-{token[:8]}", "--max-restarts=0", "--monitor-interval=0.2",
               "-m", "tpsim.validate.worker", "--validate", *ARGS, "--out-dir", str(tmp_path / "out"),
               "--name", "two-nodes", "--json"]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        logs.append(log)
    try:
        if kill:
            rank3: list[int] = []
            while not rank3 and time.monotonic() - start < 90:
                time.sleep(0.5)
                rank3 = _pids(token, 3)
            assert rank3, "rank 3 never started"
            time.sleep(4.0)  # the ranks are up (rank 3 hanging in its checks or still starting: both must end)
            victim = rank3 if kill == "rank" else _pids(token, 1, launcher=True)
            assert victim, f"no {kill} process to kill"
            os.kill(victim[0], signal.SIGKILL)
        codes = []
        for p in procs:
            codes.append(p.wait(timeout=max(1.0, deadline_s - (time.monotonic() - start))))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()
    seconds = time.monotonic() - start
    texts = [(tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    return codes, texts, seconds, token


def _no_process_left(token: str) -> None:
    end = time.monotonic() + 10
    while _marked(token) and time.monotonic() < end:
        time.sleep(0.2)
    left = _marked(token)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left: {left}"


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_two_torchrun_nodes_tp2_pp2(tmp_path):
    codes, logs, seconds, token = two_nodes(tmp_path)
    assert codes == [0, 0], logs
    assert seconds < 180
    report = json.loads((tmp_path / "out" / "two-nodes.json").read_text())
    case, = report["cases"]
    assert case["numerics_ok"] and case["numerics_max_rel_err"] < 1e-4 and case["loss"]["ok"]
    assert case["collectives_match"], case["comm_mismatches"]
    assert case["config"]["tp"] == 2 and case["config"]["pp"] == 2
    assert case["meta"]["launcher"] == "torchrun" and case["meta"]["hosts"] == [HOST] * 4
    _no_process_left(token)


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_failing_rank_ends_the_job_naming_rank_and_host(tmp_path):
    codes, logs, seconds, token = two_nodes(tmp_path, {"TPSIM_VALIDATE_FAIL": "3:check"})
    assert codes[0] != 0 and codes[1] != 0
    assert f"rank 3 on {HOST} failed: RuntimeError: injected failure" in logs[0], logs[0][-3000:]
    _no_process_left(token)


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kill", ["rank", "launcher"])
def test_kill9_of_a_rank_or_a_launcher_ends_every_rank(tmp_path, kill):
    """Rank 3 hangs in its checks; then one process is SIGKILLed: rank 3 itself, or node 1's launcher (its ranks
    die with it). The other node's ranks stop at once (gloo sees the closed connections), within --timeout."""
    codes, logs, seconds, token = two_nodes(tmp_path, {"TPSIM_VALIDATE_FAIL": "3:hang"}, kill=kill)
    assert codes[0] != 0 and codes[1] != 0
    # the other node's ranks each end with one line naming themselves (their error, the dead peer, or the
    # launcher's SIGTERM); the dead rank is named by its launcher (torchrun's summary: rank and host)
    said = [ln for ln in logs[0].splitlines() if re.match(r"tpsim validate: (error: )?rank [0-3] ", ln)]
    assert said and all(f" on {HOST}" in ln for ln in said), logs[0][-3000:]
    if kill == "rank":
        assert re.search(r"rank\s+: 3 \(local_rank: 1\)", logs[1]) and "SIGKILL" in logs[1], logs[1][-3000:]
    assert seconds < 120
    _no_process_left(token)


# ---- detection and the printed commands, without a launcher -----------------------------------------
def test_detect_torchrun_and_slurm_environments():
    assert detect({}) is None
    t = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n0",
                "MASTER_PORT": "29400", "SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_STEP_ID": "0"})
    assert (t.launcher, t.rank, t.world, t.local_rank, t.nnodes, t.master_addr, t.master_port) == \
        ("torchrun", 3, 4, 1, 2, "n0", 29400)  # torchrun's workers win inside srun
    s = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
                "SLURM_STEP_NODELIST": "gpu[07-10]", "SLURM_STEP_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "123"})
    assert (s.launcher, s.rank, s.world, s.local_rank, s.nnodes, s.master_addr, s.master_port) == \
        ("slurm", 5, 8, 1, 4, "gpu07", 29500 + 123)
    assert s.env() == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "gpu07", "MASTER_PORT": "29623"}
    # the batch script itself (no job step) is not a rank
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NODELIST": "a"}) is None
    assert first_host("node[3-5,9],gpu1") == "node3" and first_host("a,b") == "a" and first_host("x") == "x"
    assert tasks_on_first_node("4(x2),1") == 4
    for bad in ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
                {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}):
        with pytest.raises(InputError, match="RANK"):
            detect(bad)


def test_print_launch_lines_run_the_worker_with_the_same_arguments(capsys):
    from tpsim.cli import main

    argv = ["validate", *ARGS, "--nnodes", "2", "--nproc", "2"]
    assert main([*argv, "--print-launch", "torchrun"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d ")
    assert line.endswith("-m tpsim.validate.worker --validate " + " ".join(ARGS) + " --nnodes 2 --nproc 2")
    assert line == torchrun_line(argv, 2, 2, line.split("--rdzv-id=")[1].split()[0])
    assert main([*argv, "--print-launch", "slurm"]) == 0
    script = capsys.readouterr().out
    assert script == sbatch_script(argv, 2, 2, "gloo", job_name=script.split("--job-name=")[1].split()[0])
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "srun --kill-on-bad-exit=1" in script and "export MASTER_PORT=" in script


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_srun_tasks_join_as_slurm_ranks(tmp_path):
    """What srun gives each task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_ID, the node list),
    without Slurm: two tasks of a tp 2 block on this host; rank 0 writes the report, naming the launcher."""
    token = uuid.uuid4().hex
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                              "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    slurm = {"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "localhost",
             "SLURM_STEP_TASKS_PER_NODE": "2", "MASTER_PORT": str(_free_port()), MARK: token}
    args = ["--model", "gpt3-1.3b", "--layers", "1", "--hidden", "128", "--heads", "4", "--seq-len", "32", "--tp", "2",
            "--no-probe", "--no-overhead", "--timeout", "30", "--run-timeout", "100", "--reps", "1", "--warmup", "0",
            "--out-dir", str(tmp_path / "out"), "--name", "srun", "--json"]
    procs = [subprocess.Popen([sys.executable, "-m", "tpsim.validate.worker", "--validate", *args],
                              env={**base, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    report = json.loads(outs[0][0])
    case, = report["cases"]
    assert case["numerics_ok"] and case["collectives_match"]
    assert case["meta"]["launcher"] == "slurm" and case["meta"]["hosts"] == [HOST, HOST]
    assert outs[1][0].strip() == ""  # only rank 0 reports
    _no_process_left(token)


def test_print_launch_refuses_what_one_launch_cannot_run(capsys):
    from tpsim.cli import main

    assert main(["validate", "--matrix", "plans", "--print-launch", "slurm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need 2, 4 ranks; one launch has one rank count" in err[0]
    graph = Path(__file__).parent / "data" / "opgraph" / "tiny-gpt.ops.json"
    assert main(["validate", "--model", str(graph), "--tp", "2", "--print-launch", "torchrun"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "traced model runs on tpsim validate's own launch only" in err[0]
