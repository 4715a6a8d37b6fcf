"""KernelModel through the ComputeModel interface: memory-bound kernels, clocks, and the estimator using it."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.compute.base import MEMORY_KERNEL_NAMES
from tpsim.compute.kernel_model import KernelModel
from tpsim.compute.roofline import default_efficiency
from tpsim.errors import InputError
from tpsim.hardware import get_device


H200_MODEL = KernelModel(get_device("H200"), "fa3")


@settings(deadline=None)
@given(numel=st.integers(1, 2 ** 34), kernel=st.sampled_from(MEMORY_KERNEL_NAMES), backward=st.booleans(),
       dtype=st.sampled_from(["bf16", "fp32"]))
def test_memory_kernels_move_their_bytes_at_the_achieved_bandwidth(numel, kernel, backward, dtype):
    dev, model = get_device("H200"), H200_MODEL
    per = default_efficiency().bytes_per_element[kernel][1 if backward else 0]
    size = 4 if dtype == "fp32" else 2
    t = float(model.memory(kernel, numel, dtype, backward)[0])
    assert t == pytest.approx(per * numel * size / (dev.hbm_bandwidth * 0.896), rel=1e-9)


def test_unknown_memory_kernel_is_an_error():
    with pytest.raises(InputError, match="memory kernel='rope'"):
        KernelModel(get_device("H100-SXM"), "fa3").memory("rope", 10, "bf16", False)


def test_sustained_clocks_scale_compute_not_memory():
    dev = get_device("H100-SXM")
    burst, sustained = KernelModel(dev, "fa3", sustained_clocks=False), KernelModel(dev, "fa3")
    ratio = dev.sustained_clock_ratio
    g = float(sustained.gemm(8192, 8192, 8192, "bf16")[0] / burst.gemm(8192, 8192, 8192, "bf16")[0])
    assert g == pytest.approx(1 / ratio, rel=1e-3)
    assert float(sustained.memory("rmsnorm", 1e8, "bf16", False)[0]) == float(burst.memory("rmsnorm", 1e8, "bf16",
                                                                                            False)[0])
    a100 = get_device("A100-SXM4-80GB")
    assert KernelModel(a100, "fa2").gemm_rate("bf16") == KernelModel(a100, "fa2", sustained_clocks=False).gemm_rate(
        "bf16")


def test_estimator_runs_with_the_kernel_model():
    from tpsim import estimate, load_cluster, load_model, make_plan

    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(model, 8, tp=8, sp=True, zero=0, global_batch=8, dtype="bf16")
    result = estimate(model, cluster, plan, compute=KernelModel(cluster.device, "fa3"))
    assert result.compute_model == "kernel:fa3"
    assert math.isfinite(result.step_time_s) and result.step_time_s > 0
    roof = estimate(model, cluster, plan)
    # kernel data put H100 compute above the SC21-fitted roofline's efficiencies: faster compute
    assert result.breakdown["compute"] < roof.breakdown["compute"]


def test_attention_arrays_broadcast():
    model = KernelModel(get_device("A100-SXM4-80GB"), "fa2")
    t, measured = model.attention(np.array([8, 16, 32]), np.array([1024, 2048, 4096]), 128, True, "bf16", True)
    assert t.shape == (3,) and np.all(np.diff(t) > 0) and not measured.any()
