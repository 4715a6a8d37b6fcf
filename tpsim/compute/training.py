"""The estimator's default compute model: the kernel model at training conditions.

:class:`TrainingCompute` serves :class:`~tpsim.compute.base.ComputeModel` from the per-device
:class:`~tpsim.compute.kernel_model.KernelModel` (published kernel benchmarks, sustained clocks) divided by two
**in-situ fractions**, the only constants fitted on end-to-end training runs (the ten SC21 rows,
``tests/test_sc21_golden.py``; values and leave-one-out errors in ``tpsim/data/efficiency.yaml``):

* ``gemm_in_situ_fraction``: tensor-core kernels (GEMMs, flash attention) in a training step run at this
  fraction of their isolated-benchmark rate: operands streamed from HBM instead of L2-resident repeats, the
  transposed operands of the backward GEMMs, NCCL kernels sharing the SMs, library heuristics on shapes a
  sweep does not tune;
* ``memory_in_situ_fraction``: memory-bound kernels (norms, softmax and cross-entropy reductions, dropout with
  its random numbers, activations) reach this fraction of the streaming-copy bandwidth.

Devices without kernel data (no ``architecture`` or no published GEMM figure: TPUs, CPUs, some user devices)
fall back to the :class:`~tpsim.compute.roofline.RooflineModel` (its own constants, no in-situ factor on top);
a flash implementation without data for the device (FA2 on MI300X) times attention with the roofline's
attention and says so. A measured profile (``--profile``) replaces either per kernel where it has points.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..hardware import DATA_DIR, DeviceSpec
from .base import ArrayLike, ComputeModel
from .roofline import RooflineModel

FITTED = ("gemm_in_situ_fraction", "memory_in_situ_fraction")
FLASH_ORDER = ("fa3", "cudnn", "fa2")
"""flash implementations tried, in order, when the stack's own has no data for the device."""
"""the fitted constants (efficiency.yaml), in fit order."""


@dataclass(frozen=True, kw_only=True)
class InSitu:
    """The in-situ fractions (efficiency.yaml) and their leave-one-row-out spread."""

    gemm_in_situ_fraction: float
    memory_in_situ_fraction: float
    loo_rms_pct: float = 0.0
    """RMS of the leave-one-row-out errors of the SC21 fit, percent (the error band reads it)."""
    gemm_by_architecture: tuple[tuple[str, float], ...] = ()
    """(architecture, gemm_in_situ_fraction) where a device class sustains another in-situ GEMM rate than the
    SC21 A100s (efficiency.yaml ``gemm_in_situ_fraction.by_architecture``: Hopper and Blackwell, power-limited
    under a training step's full load); the others use ``gemm_in_situ_fraction``."""

    def gemm_for(self, architecture: str | None) -> float:
        """The in-situ GEMM fraction of a device of ``architecture``."""
        return dict(self.gemm_by_architecture).get(architecture or "", self.gemm_in_situ_fraction)

    def replace(self, **changes: float) -> "InSitu":
        import dataclasses
        return dataclasses.replace(self, **changes)


@lru_cache(maxsize=1)
def default_in_situ() -> InSitu:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "efficiency.yaml")
    by_arch = raw["gemm_in_situ_fraction"].get("by_architecture") or {}
    return InSitu(gemm_in_situ_fraction=float(raw["gemm_in_situ_fraction"]["value"]),
                  memory_in_situ_fraction=float(raw["memory_in_situ_fraction"]["value"]),
                  loo_rms_pct=float(raw["gemm_in_situ_fraction"].get("leave_one_out_rms_pct", 0.0)),
                  gemm_by_architecture=tuple(sorted((str(k), float(v["value"])) for k, v in by_arch.items())))


class TrainingCompute(ComputeModel):
    """A compute model's kernel times at training conditions (see the module docstring). ``measured`` flags
    pass through unchanged."""

    def __init__(self, base: ComputeModel, in_situ: InSitu, attention_fallback: ComputeModel | None = None,
                 note: str = ""):
        self.base = base
        self.in_situ = in_situ
        self.gemm_fraction = in_situ.gemm_for(getattr(base.device, "architecture", None))
        """the in-situ GEMM fraction of this device's class (:meth:`InSitu.gemm_for`)."""
        self.attention_fallback = attention_fallback
        self.note = note
        self.source = base.source

    @property
    def device(self) -> DeviceSpec:
        return self.base.device  # type: ignore[attr-defined]

    @property
    def hbm(self) -> float:
        """Achieved streaming bandwidth of the device, bytes/s (fixed costs: optimizer step)."""
        return float(getattr(self.base, "hbm"))

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.gemm(m, n, k, dtype, batch)
        return t / self.gemm_fraction, measured

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.attention_fallback is not None:
            return self.attention_fallback.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        try:
            t, measured = self.base.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        except InputError:
            # no published kernel data for this dtype (fp32/tf32 flash attention): the roofline's prior
            return RooflineModel(self.device).attention(batch_heads, seq, head_dim, causal, dtype, backward)
        return t / self.gemm_fraction, measured

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.memory(kernel, numel, dtype, backward)
        return t / self.in_situ.memory_in_situ_fraction, measured

    def provenance(self) -> dict[str, str]:
        out = dict(self.base.provenance()) if hasattr(self.base, "provenance") else {}
        if self.attention_fallback is not None:
            out["attention"] = f"roofline prior ({self.note})"
        return out

    def describe(self) -> str:
        return self.base.describe()


def training_compute(device: DeviceSpec, attention_impl: str = "fa2",
                     in_situ: InSitu | None = None) -> tuple[ComputeModel, str]:
    """The default compute model of ``device`` with the flash implementation ``attention_impl`` (fa2, fa3,
    cudnn), and a note when something fell back to the roofline ("" otherwise)."""
    from .kernel_model import KernelModel

    fit = in_situ or default_in_situ()
    first = ""
    for impl in (attention_impl,) + tuple(i for i in FLASH_ORDER if i != attention_impl):
        try:
            model = TrainingCompute(KernelModel(device, impl), fit)
        except InputError as exc:
            first = first or str(exc)
            continue
        note = "" if impl == attention_impl else f"attention {attention_impl} has no data for {device.name}: {impl}"
        return model, note
    try:
        kernel = KernelModel(device, "unfused")
    except InputError as exc:
        return RooflineModel(device), f"no kernel data for {device.name} ({exc}): roofline priors"
    note = f"attention {attention_impl} has no data for {device.name} ({first})"
    return TrainingCompute(kernel, fit, attention_fallback=RooflineModel(device), note=note), note


def achieved_hbm(compute: ComputeModel, device: DeviceSpec) -> float:
    """Streaming bytes/s for memory-bound fixed costs: the kernel model's measured fraction, else the roofline's
    ``memory_bandwidth_fraction``."""
    hbm = getattr(compute, "hbm", None)
    if hbm is not None:
        return float(hbm)
    fallback = getattr(compute, "fallback", None)
    if fallback is not None and fallback is not compute:
        return achieved_hbm(fallback, device)
    eff = RooflineModel(device).eff
    return device.hbm_bandwidth * eff.memory_fraction
