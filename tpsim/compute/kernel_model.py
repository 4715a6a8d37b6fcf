"""The kernel model: per-device compute times from kernel-level data (torch-free, vectorized).

``KernelModel(device, attention_impl="fa2")`` serves :class:`~tpsim.compute.base.ComputeModel`:

* ``gemm``: tile and wave quantization on the device's SMs with the tile shapes of its architecture, split-k and
  stream-K, at the large-GEMM rate measured on that device (:mod:`tpsim.compute.gemm_model`,
  ``tpsim/data/kernels/gemm.yaml``);
* ``attention``: the flash-attention implementation ``attention_impl`` (``fa2``, ``fa3``, ``cudnn``) with its
  kernel parameters fitted to published measurements (:mod:`tpsim.compute.attention_model`), or ``unfused``
  (batched ``QK^T`` and ``PV`` GEMMs and the softmax through memory);
* ``memory``: bytes moved (``bytes_per_element`` of ``efficiency.yaml``) at the device's measured streaming
  bandwidth (``hbm_achieved_fraction`` in ``devices.yaml``).

Times are kernel execution times only: launches, the GPU-side gap between kernels, host overhead, the
optimizer step and cross-entropy are their own terms in :mod:`tpsim.compute.fixed`. With ``sustained_clocks``
(default) compute rates are scaled by the device's ``sustained_clock_ratio`` (power-limited clock under
sustained dense load); the published kernel figures are short bursts, so comparisons with them use
``sustained_clocks=False``. Nothing is fitted on training runs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InputError
from ..hardware import DeviceSpec
from . import attention_model as am
from .base import MEMORY_KERNEL_NAMES, ArrayLike, ComputeModel
from .gemm_model import GemmRate, achieved_hbm, architecture_of, gemm_time, resolve_rate
from .roofline import activation_bytes, default_efficiency

ATTENTION_IMPLS = ("fa2", "fa3", "cudnn", "unfused")


class KernelModel(ComputeModel):
    """Compute times of one device from kernel-level data; see the module docstring."""

    def __init__(self, device: DeviceSpec, attention_impl: str = "fa2", sustained_clocks: bool = True):
        if attention_impl not in ATTENTION_IMPLS:
            raise InputError(f"attention_impl={attention_impl!r} is unknown (known: {', '.join(ATTENTION_IMPLS)})")
        self.device = device
        self.attention_impl = attention_impl
        self.source = f"kernel:{attention_impl}"
        self.arch = architecture_of(device)
        self.hbm, self.hbm_provenance = achieved_hbm(device)
        self.clock = (device.sustained_clock_ratio or 1.0) if sustained_clocks else 1.0
        self.bytes_per_element = default_efficiency().bytes_per_element
        self.rates, self.rate_errors = self._resolve_rates()
        self.attention_params, self.attention_errors = self._resolve_attention()

    # ---- resolution (eager: the object holds no lazily filled caches) --------------------------------------
    def _resolve_rates(self) -> tuple[Mapping[str, GemmRate], Mapping[str, str]]:
        rates, errors = {}, {}
        for dtype in self.device.peak_flops:
            try:
                rates[dtype] = resolve_rate(self.device, dtype, self.hbm)
            except InputError as exc:
                errors[dtype] = str(exc)
        if not rates:
            raise InputError(next(iter(errors.values())))
        return rates, errors

    def _resolve_attention(self) -> tuple[Mapping[tuple[str, bool], am.ResolvedAttention], Mapping]:
        params, errors = {}, {}
        if self.attention_impl == "unfused":
            return params, errors
        for dtype in self.device.peak_flops:
            for backward in (False, True):
                try:
                    params[(dtype, backward)] = am.resolve(self.attention_impl, self.device, dtype, backward)
                except InputError as exc:
                    errors[(dtype, backward)] = str(exc)
        if not params:
            raise InputError(next(iter(errors.values())))
        return params, errors

    def gemm_rate(self, dtype: str) -> float:
        """Large-GEMM FLOP/s for ``dtype`` (peak x measured fraction x clock ratio)."""
        if dtype not in self.rates:
            raise InputError(self.rate_errors.get(dtype) or f"dtype={dtype} is not supported by {self.device.name}")
        r = self.rates[dtype]
        return r.peak * r.large_fraction * self.clock

    # ---- ComputeModel --------------------------------------------------------------------------------------
    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        t = gemm_time(self.arch, self.device.compute_units, self.gemm_rate(dtype), self.hbm, m, n, k, batch, dtype)
        return t, np.zeros(np.shape(t), dtype=bool)

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.attention_impl == "unfused":
            t = self._unfused(batch_heads, seq, head_dim, dtype, backward)
            return t, np.zeros(np.shape(t), dtype=bool)
        key = (dtype, backward)
        if key not in self.attention_params:
            raise InputError(self.attention_errors.get(key) or f"dtype={dtype} is not supported by {self.device.name}")
        r = self.attention_params[key]
        p = r.params
        rate = self.device.peak(r.kernel_dtype) * r.fraction * self.clock
        t = am.flash_time(units=self.device.compute_units, rate=rate, block=r.block, seq_fill=p.seq_fill,
                          overhead_s=p.overhead_s, causal_factor=p.causal_factor, d_half=p.d_half,
                          batch_heads=batch_heads, seq=seq, head_dim=head_dim, causal=causal, backward=backward)
        return t, np.zeros(np.shape(t), dtype=bool)

    def _unfused(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, dtype: str,
                 backward: bool) -> np.ndarray:
        """Scores through memory: QK^T and PV as batched GEMMs and the (fused scale-mask-) softmax; backward
        dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q and the softmax backward. Masking does not save work."""
        bh, s, d = (np.asarray(x, dtype=float) for x in (batch_heads, seq, head_dim))
        scores = bh * s * s
        if not backward:
            t = self.gemm(s, s, d, dtype, batch=bh)[0] + self.gemm(s, d, s, dtype, batch=bh)[0]
            return t + self.memory("softmax", scores, dtype, False)[0]
        t = self.gemm(s, s, d, dtype, batch=bh)[0] + 3.0 * self.gemm(s, d, s, dtype, batch=bh)[0]
        return t + self.memory("softmax", scores, dtype, True)[0]

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        if kernel not in MEMORY_KERNEL_NAMES:
            raise InputError(f"memory kernel={kernel!r} is unknown (known: {', '.join(MEMORY_KERNEL_NAMES)})")
        per = self.bytes_per_element[kernel][1 if backward else 0]
        t = per * np.asarray(numel, dtype=float) * activation_bytes(dtype) / self.hbm
        return t, np.zeros(np.shape(t), dtype=bool)

    # ---- provenance ----------------------------------------------------------------------------------------
    def provenance(self) -> dict[str, str]:
        """Where each rate comes from (for reports and the error band: measured, fitted or transferred)."""
        out = {f"gemm.{dt}": r.provenance for dt, r in self.rates.items()}
        out.update({f"attention.{self.attention_impl}.{dt}.{'bwd' if b else 'fwd'}": r.provenance
                    for (dt, b), r in self.attention_params.items()})
        out["memory"] = self.hbm_provenance
        out["clock"] = (f"sustained_clock_ratio {self.clock}" if self.clock != 1.0 else "no clock derating")
        return out

    def describe(self) -> str:
        return f"{self.source} on {self.device.name}"
