"""The kernel-profile probe of ``tpsim validate``: which points it times, how it judges the drift, what the
prediction does about it, and the rescaling compute model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpsim.compute.profile import load_profile
from tpsim.compute.roofline import RooflineModel
from tpsim.compute.scaled import ScaledCompute
from tpsim.hardware import get_device
from tpsim.profiler.probe import MAX_POINT_S, MIN_POINT_S, PROBE_SIZES, ProbePoint, ProbeResult, probe_points
from tpsim.validate import drift

SHIPPED = sorted(Path(__file__).resolve().parents[1].glob("profiles/cpu-*.csv"))


@pytest.mark.skipif(not SHIPPED, reason="no shipped CPU profile")
def test_probe_points_span_each_kind():
    points = probe_points(load_profile(SHIPPED[-1]))
    assert len(points) == sum(PROBE_SIZES.values()) == 20
    for kind, n in PROBE_SIZES.items():
        times = sorted(p.time_s for p in points if p.kind == kind)
        assert len(times) == n and MIN_POINT_S <= times[0] and times[-1] <= MAX_POINT_S
        assert times[-1] / times[0] > 10  # spread over the range, not clustered
    assert {p.dtype for p in points} == {"fp32"} and {p.pass_ for p in points if p.kind != "gemm"} == {"fwd", "bwd"}


def _result(ratios: dict[str, list[float]]) -> ProbeResult:
    points = tuple(ProbePoint(kind=k, op="mm", dtype="fp32", pass_="fwd", dims=(1, 2, 3), profile_s=1e-3,
                              measured_s=1e-3 * r) for k, rs in ratios.items() for r in rs)
    return ProbeResult(profile="p.csv", points=points, seconds=1.0)


def test_drift_judgement_and_scales():
    quiet = _result({"gemm": [1.02, 0.97, 1.05], "memory": [1.08, 0.95]})
    assert not quiet.exceeded and quiet.drift() == pytest.approx(1.02)
    slow = _result({"gemm": [1.3, 1.4, 1.5], "attention": [2.0], "memory": [1.1, 1.2]})
    assert slow.exceeded and slow.drift() == pytest.approx(1.35)
    # a kind with fewer than two points takes the overall drift
    assert slow.scales() == pytest.approx({"gemm": 1.4, "attention": 1.35, "memory": 1.15})
    again = ProbeResult.from_dict(json.loads(json.dumps(slow.to_dict())))
    assert again == slow


def test_prediction_follows_the_probe(monkeypatch, tmp_path):
    profile = tmp_path / "p.csv"
    monkeypatch.setattr(drift, "run_probe", lambda *_a, **_k: _result({"gemm": [1.5, 1.5], "memory": [1.2, 1.2]}))
    monkeypatch.setattr(drift, "quick_profile", lambda work, threads, device="cpu": work / "quick.csv")
    rescaled = drift.check_profile(profile, 1, tmp_path, reprofile=False)
    assert rescaled.action == "rescaled" and rescaled.scales["gemm"] == pytest.approx(1.5)
    assert rescaled.to_dict()["exceeded"] and rescaled.profile == profile
    re = drift.check_profile(profile, 1, tmp_path, reprofile=True)
    assert re.action == "reprofiled" and re.profile == tmp_path / "quick.csv"
    monkeypatch.setattr(drift, "run_probe", lambda *_a, **_k: _result({"gemm": [1.01, 0.99]}))
    assert drift.check_profile(profile, 1, tmp_path, reprofile=True).action == "none"
    assert drift.check_profile(None, 1, tmp_path, reprofile=False).action == "skipped"
    assert drift.check_profile(profile, 1, tmp_path, reprofile=False, enabled=False).action == "skipped"


def test_scaled_compute_multiplies_each_kind():
    base = RooflineModel(get_device("H100-SXM"))
    scaled = ScaledCompute(base, gemm=2.0, attention=0.5, memory=0.0, label="test")
    m = np.array([1024.0, 4096.0])
    assert np.allclose(scaled.gemm(m, 1024, 1024, "bf16")[0], 2.0 * base.gemm(m, 1024, 1024, "bf16")[0])
    assert np.allclose(scaled.attention(8, 2048, 128, True, "bf16", True)[0],
                       0.5 * base.attention(8, 2048, 128, True, "bf16", True)[0])
    assert np.all(scaled.memory("layernorm", m, "bf16", False)[0] == 0)
    assert scaled.source == "roofline (test: gemm x2, attention x0.5, memory x0)"
    with pytest.raises(ValueError, match="gemm scale=-1"):
        ScaledCompute(base, gemm=-1)


@pytest.mark.timeout(60)
def test_probe_measures_here(tmp_path):
    """The probe's subprocess on a small profile: every point timed, drift reported as JSON."""
    pytest.importorskip("torch")
    header = ["# format_version: 1", "# device: test cpu", "# device_type: cpu", "# torch_version: 2", "# threads: 1",
              "# date: 2026-01-01T00:00:00Z", "# tpsim_version: 0", "# memory_width: 256",
              "kind,op,dtype,pass,m,n,k,batch_heads,seq,head_dim,numel,time_s,reps,spread_pct"]
    rows = [f"gemm,mm,fp32,fwd,{d},{d},{d},,,,,{t},5,1.0" for d, t in ((128, 3e-4), (256, 2e-3))]
    rows += [f"memory,gelu,fp32,{p},,,,,,,{1 << 18},{t},5,1.0" for p, t in (("fwd", 3e-4), ("bwd", 6e-4))]
    path = tmp_path / "small.csv"
    path.write_text("\n".join(header + rows) + "\n")
    proc = subprocess.run([sys.executable, "-m", "tpsim.profiler.probe", str(path)], capture_output=True, text=True,
                          timeout=55)
    assert proc.returncode == 0, proc.stderr[-1500:]
    out = json.loads(proc.stdout)
    assert len(out["points"]) == 4 and all(p["measured_s"] > 0 for p in out["points"])
    assert out["median_drift"] > 0 and isinstance(out["exceeded"], bool) and out["seconds"] < 50
