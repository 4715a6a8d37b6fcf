"""``tpsim calibrate --from-validation``: the fit recovers known factors from synthetic validation reports, its
leave-one-out error, the file it writes (docs/SCHEMAS.md section 7) and the reader validate uses."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.validate.calfile import read_compute_calibration
from tpsim.validate.learn import fit, read_samples

TRUTH = {"gemm": 1.6, "attention": 0.8, "memory": 1.3, "overhead": 4e-3}


def synthetic_report(path, n=12, noise=0.0, device="CPU-x86-1thread", seed=0):
    """Cases whose measured layer time is TRUTH applied to random predicted parts (+ noise)."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        g, a, m, c = rng.uniform(2e-3, 40e-3), rng.uniform(0.2e-3, 8e-3), rng.uniform(0.5e-3, 10e-3), rng.uniform(0, 3e-3)
        meas = TRUTH["gemm"] * g + TRUTH["attention"] * a + TRUTH["memory"] * m + TRUTH["overhead"] + c
        meas *= 1 + noise * rng.standard_normal()
        cases.append({"case": f"c{i}", "framework_overhead_s": {"fwd": 1e-3, "bwd": 2.5e-3},
                      "calibration_inputs": {"measured_s": meas, "gemm_s": g, "attention_s": a, "memory_s": m,
                                             "comm_s": c, "device": device, "stack": "torchtitan"}})
    cases.append({"case": "untimed", "calibration_inputs": None})  # a 4-rank run on 2 cores: skipped
    path.write_text(json.dumps({"name": "synthetic", "cases": cases}))
    return path


def test_fit_recovers_known_factors(tmp_path):
    result = fit(read_samples([synthetic_report(tmp_path / "a.json")]))
    c = result.calibration
    assert (c.gemm_scale, c.attention_scale, c.memory_scale) == pytest.approx(
        (TRUTH["gemm"], TRUTH["attention"], TRUTH["memory"]), rel=0.04)  # the weak priors pull a little
    assert c.host_overhead_per_layer_us == pytest.approx(TRUTH["overhead"] * 1e6, rel=0.05)
    assert c.host_overhead_fwd_share == pytest.approx(1 / 3.5)  # the twins' forward share
    assert result.fit_error["median_pct"] < 1 and c.leave_one_out["cases"] == 12 and c.leave_one_out["max_pct"] < 2
    assert result.before_error["median_pct"] > 10  # the unscaled profile was off


def test_leave_one_out_grows_with_noise(tmp_path):
    clean = fit(read_samples([synthetic_report(tmp_path / "a.json")])).calibration.leave_one_out
    noisy = fit(read_samples([synthetic_report(tmp_path / "b.json", noise=0.08)])).calibration.leave_one_out
    assert noisy["median_pct"] > clean["median_pct"] and noisy["median_pct"] < 20


def test_cli_writes_a_calibration_validate_reads(tmp_path, capsys):
    report = synthetic_report(tmp_path / "r.json")
    link_cal = tmp_path / "r-calibration.yaml"
    link_cal.write_text("loopback:\n  efficiency: 0.4\n  latency_us: 50.0\n  bw_GBps: 2.0\ntool: tpsim calibrate\n")
    data = json.loads(report.read_text())
    data["cases"][0]["calibration"] = str(link_cal)
    report.write_text(json.dumps(data))
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-validation", str(report), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "leave-one-out: median" in text and re.search(r"gemm x1\.(5[7-9]|6[0-3])", text)
    body = yaml.safe_load(out.read_text())
    assert set(body["compute"]) >= {"gemm_scale", "attention_scale", "memory_scale", "host_overhead_per_layer_us",
                                    "device", "stack", "leave_one_out"}
    assert body["compute"]["device"] == "CPU-x86-1thread" and body["compute"]["stack"] == "torchtitan"
    assert body["loopback"]["efficiency"] == 0.4  # the runs' collective calibration joins the file
    cal = read_compute_calibration(out)
    assert cal.gemm_scale == pytest.approx(1.6, rel=0.04)
    assert sum(cal.overhead_s().values()) == pytest.approx(TRUTH["overhead"], rel=0.05)
    from tpsim.collectives.calibration import load_link_values
    assert load_link_values(out)["loopback"]["efficiency"] == 0.4  # the collective model reads the same file


def test_bad_inputs_are_one_line(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: c\nnode: dgx-a100\nnodes: 2\n")
    with pytest.raises(InputError, match="is a cluster file"):
        read_compute_calibration(cluster)
    bad = tmp_path / "bad.yaml"
    bad.write_text("compute:\n  gemm_scale: -2\n")
    with pytest.raises(InputError, match="compute.gemm_scale=-2 must be > 0"):
        read_compute_calibration(bad)
    a = synthetic_report(tmp_path / "a.json")
    b = synthetic_report(tmp_path / "b.json", device="NVIDIA H200")
    with pytest.raises(InputError, match="mix devices"):
        fit(read_samples([a, b]))
    assert fit(read_samples([a, b]), device="NVIDIA H200").calibration.device == "NVIDIA H200"
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"cases": [{"case": "x", "calibration_inputs": None}]}))
    assert main(["calibrate", "--from-validation", str(empty)]) == 2
    assert "no timed case" in capsys.readouterr().err


def test_collinear_terms_stay_in_the_kernel_bounds():
    """Memory-bound time that is the same in every case is collinear with the per-layer overhead, and these
    cases measure less than it: an unbounded fit drove the memory factor to ~0 (x0.036 on real reports). Every
    kernel factor stays in SCALE_BOUNDS and the GEMM factor is still found."""
    from tpsim.validate.learn import SCALE_BOUNDS, Sample, _solve

    samples = []
    for i, gemm in enumerate((0.05, 0.1, 0.2, 0.4, 0.8, 1.6)):
        measured = 0.9 * gemm + 0.001 + 0.0001 * (i % 2)
        samples.append(Sample(case=f"c{i}", source="x", measured_s=measured, gemm_s=gemm, attention_s=0.001,
                              memory_s=0.02, comm_s=0.0, device="CPU-x86-1thread", stack="torchtitan",
                              twin_overhead_s=None, twin_fwd_s=None))
    theta = _solve(samples, prior_overhead=0.001)
    lo, hi = SCALE_BOUNDS
    assert all(lo <= f <= hi for f in theta[:3]) and theta[3] >= 0, theta
    assert theta[0] == pytest.approx(0.9, rel=0.2)
