"""``tpsim validate`` on 2 gloo ranks on CPU: numerics, collective counts and bytes, timing, failures.

Each test launches its ranks through torch.distributed.run (a few seconds) and stays well under a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import shared_launches

pytest.importorskip("torch")

from tpsim.model import PRESETS, with_overrides  # noqa: E402
from tpsim.validate import Case, LaunchConfig, RankFailure, launch  # noqa: E402
from tpsim.validate.launch import marked_pids  # noqa: E402
from tpsim.validate.block.report import summarize_case  # noqa: E402

pytestmark = pytest.mark.distributed

OVERLOADED = 2.0
"""load average per CPU above which a timing miss is reported as a skip (the ranks then share their cores)."""

GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=128, heads=4, seq_len=32)
LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=128, heads=4, kv_heads=1, ffn=224, seq_len=32)
"""kv_heads=1 < tp=2: the KV head is replicated over the TP group (Megatron's rule)."""


def _cases() -> list[Case]:
    return [Case(model=m, tp=2, sp=sp, fused=fused, micro_batch=3, reps=1, warmup=0)
            for m in (GPT, LLAMA) for sp in (False, True) for fused in (False, True)]


MATRIX = shared_launches.register(2, _cases())
"""the rule checks' cases: launched once with the other modules' 2-rank cases (tests/shared_launches.py)."""


@pytest.fixture(scope="module")
def matrix_result(shared_ranks):
    shared = shared_ranks(2)
    per_case = {c.name: shared["per_case"][c.name] for c in MATRIX}
    return MATRIX, per_case, shared["result"]


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_numerics_match_unsharded_block(matrix_result):
    cases, per_case, _ = matrix_result
    assert len(per_case) == len(cases) == 8
    for case in cases:
        ranks = per_case[case.name]
        assert len(ranks) == 2
        for r in ranks:
            worst = max(r["numerics"].values())
            assert r["numerics_ok"] and worst <= 1e-4, (case.name, worst)
            # every parameter gradient was compared
            n_params = 8 if case.model.family == "gpt" else 6
            assert sum(k.startswith("grad:") for k in r["numerics"]) >= n_params


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_collective_counts_and_bytes_equal_cost_model(matrix_result):
    cases, per_case, _ = matrix_result
    for case in cases:
        for r in per_case[case.name]:
            assert r["counts"] == case.expected_counts(), case.name
            assert r["bytes"] == case.expected_bytes(), case.name
    # the DTensor rules, spelled out: separate q/k/v reduce their input gradient each, SP gathers once
    sep = per_case["gpt3-1.3b-tp2-h128-s32-b3"][0]["counts"]
    assert sep == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 4}}
    llama_sep = per_case["llama3-8b-tp2-h128-s32-b3"][0]["counts"]
    assert llama_sep == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 5}}
    sp = per_case["llama3-8b-tp2-sp-h128-s32-b3"][0]["counts"]
    assert sp == {"fwd": {"all_gather": 2, "reduce_scatter": 2}, "bwd": {"all_gather": 2, "reduce_scatter": 2}}


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_summary_against_prediction(matrix_result):
    """The estimator's counts agree too, and every phase has a positive measured time."""
    from tpsim.compute.roofline import RooflineModel
    from tpsim.topology import load_cluster
    from tpsim.validate.block.predict import predict_case

    cases, per_case, _ = matrix_result
    cluster = load_cluster("local-cpu", gpus=2)
    for case in cases:
        pred = predict_case(case, cluster, RooflineModel(cluster.device))
        s = summarize_case(case, per_case[case.name], pred)
        assert s["numerics_ok"] and s["collectives_match"], case.name
        names = {p["name"] for p in s["phases"]}
        assert {"fwd", "bwd", "fwd+bwd"} <= names
        assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 for p in s["phases"])


def _tagged() -> dict[str, str]:
    """An environment entry that marks this test's processes: other runs of ``tpsim validate`` on the machine
    (another test session) carry run markers too and must not count as this test's leftovers."""
    return {"TPSIM_TEST_TAG": uuid.uuid4().hex}


def _ours(tag: dict[str, str]) -> set[int]:
    """Live processes of a run marked by ``tag`` (see :func:`_tagged`)."""
    needle = "{}={}".format(*next(iter(tag.items()))).encode()
    pids = set()
    for pid in marked_pids(None):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.add(pid)
        except OSError:
            continue
    return pids


def _no_process_left(tag: dict[str, str]) -> None:
    leftover = sorted(_ours(tag))
    assert not leftover, f"processes left behind: {leftover}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["check", "time"])
def test_failing_rank_stops_all_ranks_with_its_error(stage, tmp_path):
    tag = _tagged()
    timeout = 20.0
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(_cases()[:1], LaunchConfig(nproc=2, timeout_s=timeout), tmp_path,
               env={"TPSIM_VALIDATE_FAIL": f"1:{stage}", **tag})
    end, elapsed = time.time(), time.monotonic() - t0
    msg = str(info.value)
    assert "rank 1 failed" in msg and "injected failure" in msg and stage in msg
    # the job ends soon after the failure, not at the peers' process-group timeout: timed from the failing
    # rank's error record (startup on a loaded machine is not the launcher's doing)
    errors = list(tmp_path.rglob("error-rank1.json"))
    assert errors, list(tmp_path.rglob("*"))
    failed_at = json.loads(errors[0].read_text())["time"]
    assert end - failed_at < timeout / 2, (end - failed_at, elapsed)
    assert not (tmp_path / "result.json").exists()
    _no_process_left(tag)


@pytest.mark.timeout(60)
def test_hanging_rank_ends_within_timeout(tmp_path):
    tag = _tagged()
    timeout = 8.0
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(_cases()[:1], LaunchConfig(nproc=2, timeout_s=timeout), tmp_path,
               env={"TPSIM_VALIDATE_FAIL": "1:hang", **tag})
    elapsed = time.monotonic() - t0
    assert "rank 0 failed" in str(info.value) and "Timed out" in str(info.value)
    # startup + the process-group timeout + stopping the ranks
    assert elapsed < timeout + 25, elapsed
    _no_process_left(tag)


@pytest.mark.timeout(60)
def test_run_timeout_kills_everything(tmp_path):
    tag = _tagged()
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="run-timeout"):
        launch(_cases()[:1], LaunchConfig(nproc=2, timeout_s=30, run_timeout_s=8), tmp_path,
               env={"TPSIM_VALIDATE_FAIL": "1:hang", **tag})
    assert time.monotonic() - t0 < 20
    _no_process_left(tag)


@pytest.mark.timeout(90)
def test_cli_json_report_and_timing(tmp_path):
    """The CLI end to end: JSON keys, the CSV and chart written, numerics and counts exact, and the predicted
    fwd+bwd time within a factor of 2 of the measurement (shared, noisy machine)."""
    cmd = [sys.executable, "-m", "tpsim.cli", "validate", "--model", "gpt3-1.3b", "--hidden", "512",
           "--heads", "8", "--seq-len", "128", "--tp", "2", "--sp", "--reps", "3", "--warmup", "1",
           "--no-calibrate", "--no-probe", "--timeout", "30", "--json", "--out-dir", str(tmp_path), "--name", "t"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=85)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["numerics_ok"] is True and report["collectives_match"] is True
    phases = {p["name"]: p for p in report["phases"]}
    assert {"fwd", "bwd", "fwd+bwd", "fwd:all_gather", "fwd:reduce_scatter", "bwd:all_gather",
            "bwd:reduce_scatter"} <= set(phases)
    for p in phases.values():
        assert set(p) >= {"name", "predicted_s", "measured_s", "error_pct"}
    assert (tmp_path / "t.csv").read_text().count("\n") == len(report["phases"]) + 1
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "t.json").read_text())["phases"] == report["phases"]
    total = phases["fwd+bwd"]
    ratio = total["predicted_s"] / total["measured_s"]
    load = os.getloadavg()[0]
    # --no-probe: the shipped CPU profile (a Xeon) is used as is; the drift probe measured about 2.1x slower
    # kernels on an AMD EPYC host (the profile-drift probe of docs/VALIDATION.md), so the bound allows 3x either way: it catches a broken
    # launch or a wrong unit, not the profile's drift
    if load > OVERLOADED * (os.cpu_count() or 1) and not 1 / 3 <= ratio <= 3.0:
        pytest.skip(f"timing not asserted: predicted/measured = {ratio:.2f} with load average {load:.1f} on "
                    f"{os.cpu_count()} CPUs (other processes compete with the ranks)")
    assert 1 / 3 <= ratio <= 3.0, (ratio, total)


@pytest.mark.timeout(60)
def test_sigterm_to_tpsim_validate_leaves_no_process(tmp_path):
    """Stopping ``tpsim validate`` itself (SIGTERM) stops the launcher and the ranks, which run in sessions
    of their own."""
    import signal

    tag = _tagged()
    cmd = [sys.executable, "-m", "tpsim.cli", "validate", "--hidden", "128", "--heads", "4", "--seq-len", "32",
           "--tp", "2", "--no-calibrate", "--no-probe", "--no-overhead", "--timeout", "60", "--out-dir", str(tmp_path)]
    env = {**os.environ, "TPSIM_VALIDATE_FAIL": "1:hang", **tag}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_ours(tag)) < 3:
        time.sleep(0.2)  # the launcher and both ranks are up
    assert len(_ours(tag)) >= 3
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=20)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 143 and lines == ["tpsim validate: terminated by SIGTERM"], (proc.returncode, lines)
    _no_process_left(tag)
    assert not list(tmp_path.glob("*.csv"))
