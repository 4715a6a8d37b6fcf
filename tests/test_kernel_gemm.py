"""GEMM kernel model against published kernel figures, and its invariants.

Tolerances: the model is anchored on one large-GEMM measurement per device and dtype (gemm.yaml ``anchors``);
the independent published points (``published``) must come within 3% on NVIDIA devices (same software
generation as the anchor) and within 20% on MI300X, whose two published figures differ by 15% between ROCm
6.2 and 6.3 (the spread of the kernel data is the uncertainty there).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.compute.kernel_data import gemm_data
from tpsim.compute.kernel_model import KernelModel
from tpsim.errors import InputError
from tpsim.hardware import get_device

TOLERANCE = {"MI300X": 0.20}
DEFAULT_TOLERANCE = 0.03


def tflops(model: KernelModel, m, n, k, dtype="bf16", batch=1):
    t, measured = model.gemm(m, n, k, dtype, batch)
    assert not np.any(measured)
    return 2.0 * batch * np.asarray(m, float) * n * k / t / 1e12


@pytest.mark.parametrize("device, dtype", [(d, dt) for d, a in gemm_data().anchors.items() for dt in a])
def test_anchor_reproduced_at_its_shape(device, dtype):
    a = gemm_data().anchors[device][dtype]
    model = KernelModel(get_device(device), "unfused", sustained_clocks=False)
    assert float(tflops(model, a.m, a.n, a.k, dtype)) == pytest.approx(a.tflops, rel=2e-3)


@pytest.mark.parametrize("point", gemm_data().published, ids=lambda p: f"{p.device}-{p.m}x{p.n}x{p.k}")
def test_independent_published_points(point):
    model = KernelModel(get_device(point.device), "unfused", sustained_clocks=False)
    got = float(tflops(model, point.m, point.n, point.k, point.dtype))
    tol = TOLERANCE.get(point.device, DEFAULT_TOLERANCE)
    assert point.tflops_low * (1 - tol) <= got <= point.tflops_high * (1 + tol), (got, point)


def test_h200_sustained_rate_is_the_slow_end_of_the_measured_range():
    """769-798 TFLOP/s measured on one H200 at 8192^3: the sustained (power-limited) model sits at 769."""
    model = KernelModel(get_device("H200"), "unfused")
    assert float(tflops(model, 8192, 8192, 8192)) == pytest.approx(769, rel=0.02)


def test_power_capped_h100_keeps_torchaos_fp8_fraction_under_sustained_load():
    """Meta's 500 W H100 (H100-SXM-96GB): torchao's large-GEMM figures for that board are 0.78 of the fp8 peak
    and 0.69 of the bf16 peak (kernels/gemm.yaml); the sustained model is the fp8 one times H100-SXM's
    sustained-load throttle 0.964, the bf16 one within 5% of torchao's, so fp8 runs more than twice as fast as
    bf16 there while the 700 W part's MAMF rows give less than twice."""
    capped = KernelModel(get_device("H100-SXM-96GB"), "unfused")
    fp8 = float(tflops(capped, 8192, 8192, 8192, "fp8"))
    bf16 = float(tflops(capped, 8192, 8192, 8192, "bf16"))
    assert fp8 == pytest.approx(0.78 * 1978.9 * 0.964, rel=0.01)
    assert bf16 == pytest.approx(0.69 * 989.4 * 0.964, rel=0.05)
    full = KernelModel(get_device("H100-SXM"), "unfused")
    assert fp8 / bf16 > 2.0 > float(tflops(full, 8192, 8192, 8192, "fp8") / tflops(full, 8192, 8192, 8192))


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40000), n=st.integers(1, 40000), k=st.integers(1, 40000), dm=st.integers(1, 300),
       dn=st.integers(1, 300), device=st.sampled_from(["A100-SXM4-80GB", "H100-SXM", "B200", "MI300X"]))
def test_bigger_outputs_never_run_faster_and_never_beat_the_large_gemm_rate(m, n, k, dm, dn, device):
    model = KernelModel(get_device(device), "unfused")
    t0 = model.gemm(m, n, k, "bf16")[0]
    assert model.gemm(m + dm, n, k, "bf16")[0] >= t0 * (1 - 1e-12)
    assert model.gemm(m, n + dn, k, "bf16")[0] >= t0 * (1 - 1e-12)
    assert 2.0 * m * n * k / t0 <= model.gemm_rate("bf16") * (1 + 1e-9)


def test_shape_losses_tile_wave_and_small_k():
    model = KernelModel(get_device("A100-SXM4-80GB"), "unfused")
    big = float(tflops(model, 8192, 8192, 8192))
    assert big > 0.93 * model.gemm_rate("bf16") / 1e12
    assert float(tflops(model, 8192, 8192, 64)) < 0.6 * big          # pipeline fill dominates at k = 64
    assert float(tflops(model, 1024, 1024, 1024)) < 0.7 * big        # one partial wave on 108 SMs
    assert float(tflops(model, 8192, 8192 + 1, 8192)) < big          # a partial tile column does full work


def test_batched_equals_repeated_when_waves_are_full():
    model = KernelModel(get_device("H100-SXM"), "unfused")
    one = model.gemm(4096, 4096, 4096, "bf16")[0]
    eight = model.gemm(4096, 4096, 4096, "bf16", batch=8)[0]
    assert eight == pytest.approx(8 * one, rel=0.02)


def test_vectorized_over_distinct_shapes():
    rng = np.random.default_rng(0)
    m, n, k = (rng.integers(16, 30000, 5000) for _ in range(3))
    model = KernelModel(get_device("H100-SXM"), "fa3")
    t, measured = model.gemm(m, n, k, "bf16")
    assert t.shape == (5000,) and np.all(np.isfinite(t)) and np.all(t > 0) and not measured.any()


def test_memory_bound_gemm_runs_at_the_achieved_bandwidth():
    dev = get_device("H100-SXM")
    model = KernelModel(dev, "unfused")
    m = 2 ** 20  # a matrix-vector product: bytes dominate
    t = float(model.gemm(m, 1, 4096, "bf16")[0])
    moved = (m * 4096 + 4096 + m) * 2
    assert t == pytest.approx(moved / (dev.hbm_bandwidth * dev.hbm_achieved_fraction), rel=1e-6)


def test_transferred_rates_say_so_and_missing_data_is_an_error():
    pcie = KernelModel(get_device("H100-PCIe"), "unfused")
    assert pcie.provenance()["gemm.bf16"].startswith("transferred")
    sxm = KernelModel(get_device("H100-SXM"), "unfused")
    assert sxm.provenance()["gemm.bf16"].startswith("anchored")
    with pytest.raises(InputError, match="L40S"):
        KernelModel(get_device("L40S"), "unfused")
    with pytest.raises(InputError, match="TPU-v4"):
        KernelModel(get_device("TPU-v4"), "unfused")
    with pytest.raises(InputError, match="fp8"):
        KernelModel(get_device("A100-SXM4-80GB"), "unfused").gemm(1024, 1024, 1024, "fp8")
