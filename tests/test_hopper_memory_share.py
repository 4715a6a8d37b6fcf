"""benchmarks/hopper_memory_share.py: the joint two-fraction least squares (issue 19 diagnosis)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "hopper_memory_share.py"
_spec = importlib.util.spec_from_file_location("hopper_memory_share_benchmark", _PATH)
hms = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = hms
_spec.loader.exec_module(hms)


@pytest.mark.parametrize("g, m", [(0.90, 0.50), (0.80, 0.75), (1.00, 0.40)])
def test_fit_joint_recovers_the_fractions_of_consistent_rows(g, m):
    # rows whose GEMM and memory shares differ (else the two fractions are not separable)
    coef = np.array([[0.1, 0.7, 0.1], [0.3, 0.5, 0.05], [0.0, 0.6, 0.3], [0.05, 0.9, 0.02]])
    meas = coef[:, 0] + coef[:, 1] / g + coef[:, 2] / m
    assert hms.fit_joint(coef, meas) == pytest.approx((g, m), abs=1e-9)


def test_fit_joint_weights_relative_errors():
    # one row says g = 0.8, a ten times longer row says g = 1.0 (no memory time: m is free); relative errors
    # weigh both rows alike, so the optimum lies between, not at the long row's value
    coef = np.array([[0.0, 1.0, 0.0], [0.0, 10.0, 0.0]])
    meas = np.array([1.0 / 0.8, 10.0 / 1.0])
    g, _m = hms.fit_joint(coef, meas)
    assert 0.85 < g < 0.95
