"""The residual band of ``tpsim estimate`` (tpsim/runfit.py ``plan_band``) is the band of the planner's tie
groups and of the report's charts and CSV twins (one rule, one place: issue 20)."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim import runfit
from tpsim.estimator.band import ResidualBand
from tpsim.topology import load_cluster
from tpsim.model import get_preset
from tpsim.report import analysis
from tpsim.search import SearchSpace, search

SPACE = SearchSpace(vpp=(1,), micro_batch=(1,), order=("tp-dp-pp",), zero=(0, 1))


@pytest.fixture(scope="module")
def problem():
    return get_preset("gpt3-1.3b"), load_cluster("dgx-a100", gpus=16)


def _fake_band(low: float, high: float):
    def plan_band(residuals, *, model, cluster, plan, stack, calibration=None, exclude=None):
        # wide for tp 1, narrow otherwise: the band depends on the plan, as the residual band does
        h = high if plan.tp == 1 else 1.0 + (high - 1.0) / 100
        return ResidualBand(low, h, {"kind": "residuals", "runs": ["r1"], "n": 1, "group": "fake group"})
    return plan_band


def test_tie_groups_follow_the_residual_band(problem, monkeypatch):
    model, cluster = problem
    result = search(model, cluster, 32, space=SPACE)
    idx = result.ranking[:20]
    low, high, basis = result.residual_bands(idx)
    real = [runfit.plan_band(None, model=model, cluster=result.parts[0].cluster, plan=result.plan(int(i)),
                             stack=result.stack_name) for i in idx[:3]]
    assert list(high[:3]) == [b.high_factor for b in real] and basis[0] == real[0].basis
    monkeypatch.setattr(runfit, "plan_band", _fake_band(0.5, 10.0))
    wide = search(model, cluster, 32, space=SPACE)
    groups = wide.tie_groups(wide.ranking[:20])
    step = np.asarray(wide.columns["step_time_s"])[wide.ranking[:20]]
    fits = np.asarray(wide.columns["fits_effective"])[wide.ranking[:20]]
    tp = np.asarray(wide.columns["tp"])[wide.ranking[:20]]
    expect, start, g = [], -1, 0
    for k in range(step.size):
        edge = (10.0 if start >= 0 and tp[start] == 1 else 1.09) * step[start] if start >= 0 else 0
        if start < 0 or fits[k] != fits[start] or not step[k] <= edge:
            g, start = g + 1, k
        expect.append(g)
    assert list(groups) == expect
    assert max(groups) < 20  # some rows tie under a 10x band


def test_report_views_carry_the_residual_band_and_its_basis(problem, monkeypatch):
    model, cluster = problem
    monkeypatch.setattr(runfit, "plan_band", _fake_band(0.5, 3.0))
    sweep = analysis.tp_sweep(model, cluster, 32, SPACE)
    c = sweep.columns
    step = np.asarray(c["step_time_s"], dtype=float)
    assert np.allclose(c["step_time_s_low"], 0.5 * step)
    want = np.where(sweep.x == 1, 3.0, 1.02) * step
    assert np.allclose(c["step_time_s_high"], want)
    assert np.allclose(c["tokens_per_s_high"], np.asarray(c["tokens_per_s"]) / 0.5)
    assert all("fake group" in text and "1 measured runs" in text for text in c["band_basis"])
    from tpsim.report import charts

    table = charts.tp_sweep_table(sweep)
    assert "band_basis" in table.columns


def test_report_readme_names_the_band_basis(tmp_path):
    from tpsim.cli import main

    out = tmp_path / "rep"
    assert main(["report", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "16", "--global-batch", "32",
                 "--vpp", "1", "--micro-batch", "1", "--order", "tp-dp-pp", "--zero", "0", "1", "--out", str(out),
                 "--quiet", "--top", "5"]) == 0
    text = (out / "README.md").read_text()
    assert "Step-time ranges and error bars: 90% band from the residuals of" in text
    assert "band_basis" in (out / "breakdown.csv").read_text().splitlines()[0]
