"""Fixed costs: kernel counts per layer, launch gaps and exposed host time, optimizer step, cross-entropy."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpsim.compute.fixed import (LayerTraits, cross_entropy_time, exposed_host_time, fixed_data, host_time,
                                 launch_time, layer_fixed_time, layer_kernel_counts, optimizer_bytes_per_param,
                                 optimizer_launches, optimizer_step_time)
from tpsim.errors import InputError
from tpsim.model import load_model


def test_layer_kernel_counts_follow_the_model_traits():
    gpt, llama = LayerTraits.of(load_model("gpt3-175b")), LayerTraits.of(load_model("llama3-70b"))
    assert gpt.dropout and not gpt.rotary and not gpt.gated
    assert llama.rotary and llama.gated and llama.gqa and not llama.dropout
    # Megatron-Core + TE (fixed.yaml list): GPT 10 forward (no RoPE), Llama 12 (+2 RoPE kernels)
    assert layer_kernel_counts("megatron_te", gpt) == (10, 20)
    assert layer_kernel_counts("megatron_te", llama) == (12, 20)
    fwd, bwd = layer_kernel_counts("eager", LayerTraits.of(load_model("llama3-70b"), separate_qkv=True))
    assert fwd == 37 and bwd == 2 * fwd
    assert layer_kernel_counts("eager", llama)[0] == 35  # one fused QKV GEMM instead of three linears
    with pytest.raises(InputError, match="flavor"):
        layer_kernel_counts("jax", gpt)


def test_launch_gaps_and_cuda_graphs():
    launch = fixed_data().launch
    assert float(launch_time(100)) == pytest.approx(100 * launch.gpu_gap_s)
    assert float(launch_time(100, cuda_graphs=True)) < float(launch_time(100))
    assert float(host_time(100, 20e-6, cuda_graphs=True)) == 0.0


@given(host=st.floats(0, 1), device=st.floats(0, 1))
def test_host_time_is_exposed_only_beyond_the_device_time(host, device):
    exposed = float(exposed_host_time(host, device))
    assert exposed == pytest.approx(max(0.0, host - device), abs=1e-15)
    assert 0.0 <= exposed <= host


def test_layer_fixed_time_host_bound_and_device_bound():
    traits = LayerTraits.of(load_model("llama3-8b"))
    kernels = sum(layer_kernel_counts("megatron_te", traits))
    gap = fixed_data().launch.gpu_gap_s
    fast, slow = layer_fixed_time("megatron_te", traits, np.array([1e-5, 1e-1]), 20e-6)
    assert slow == pytest.approx(kernels * gap)                       # GPU-bound: only the gaps
    assert fast == pytest.approx(kernels * 20e-6 - 1e-5)              # host-bound: the GPU waits for the host


def test_optimizer_bytes_per_param_by_dtype():
    # Megatron-Core distributed optimizer: fp32 grads, fp32 master + states, bf16 params, separate copy
    assert optimizer_bytes_per_param() == 42
    # master copy fused into the update kernel (TE FusedAdam master_weights): no re-read of the master
    assert optimizer_bytes_per_param(fused_master_copy=True) == 38
    # torch fused AdamW on fp32 params (FSDP2 sharded fp32), grads set to None instead of zeroed
    assert optimizer_bytes_per_param(master_bytes=0, param_bytes=4, zero_grad=False) == 32
    # bf16 optimizer states halve the state traffic
    assert optimizer_bytes_per_param(state_bytes=2) == 42 - 8


def test_optimizer_launches_and_time():
    # few large tensors: limited by chunks per launch; many small tensors: by tensors per launch (depth 4: 36)
    assert float(optimizer_launches(320 * 65536 * 10, 1, depth=4)) == pytest.approx(11)
    assert float(optimizer_launches(1000, 360, depth=4)) == 10
    t = float(optimizer_step_time(1e9, 500, 3e12, 42))
    assert t == pytest.approx(1e9 * 42 / 3e12, rel=0.02)
    with pytest.raises(InputError, match="depth"):
        optimizer_launches(10, 1, depth=9)


def test_cross_entropy_traffic():
    fwd, bwd = cross_entropy_time(8192, 16032, 3e12)
    gap = fixed_data().launch.gpu_gap_s
    assert float(fwd) == pytest.approx(8192 * 16032 * 38 / 3e12 + 6 * gap)
    assert float(bwd) == pytest.approx(8192 * 16032 * 14 / 3e12 + 2 * gap)
    fused, _ = cross_entropy_time(8192, 16032, 3e12, impl="megatron_fused")
    assert float(fused) < float(fwd)
    with pytest.raises(InputError, match="cross-entropy"):
        cross_entropy_time(1, 1, 1.0, impl="liger")
