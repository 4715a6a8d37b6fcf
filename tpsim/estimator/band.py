"""The error band of a prediction: low and high step time (and tokens/s, MFU) from the documented uncertainty of
its inputs (figures and sources: ``tpsim/data/band.yaml``; formula: docs/MODEL.md "Error band").

Relative standard deviations, combined in quadrature over the step-time breakdown:

* compute-like time ``C = compute + recompute + bubble``:
  ``sigma_C^2 = sigma_fit^2 + (1 - f)^2 (sigma_dev^2 + sigma_kernel^2) + (f sigma_profile)^2`` with
  ``sigma_fit`` the leave-one-row-out RMS of the SC21 fit of the in-situ fractions, ``sigma_dev`` the prior for
  transferring them to a device other than the fit's (0 on it), ``sigma_kernel^2 = ((1 - a) sigma_gemm)^2 +
  (a sigma_attention)^2`` the kernel data's error by provenance (GEMM anchored / transferred / roofline prior,
  attention by implementation and device, ``a`` the flash-attention share of the layer time), and ``f`` the share
  of compute time a measured kernel profile gives (its interpolation error replaces the model's);
* exposed communication: the collective model's error; the optimizer step: a prior;
* fixed costs: the span of the overhead term between the low and high ends of the stack's host-time prior
  (taken as a 90% range).

``half-width = z x sqrt((C sigma_C)^2 + (X sigma_X)^2 + (O sigma_O)^2 + sigma_overhead^2)``; ``low/high = step
-/+ half-width``; tokens/s and MFU follow (low throughput = high step time).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..hardware import DATA_DIR

MIN_LOW_FRACTION = 0.2
"""the low step time never falls below this fraction of the prediction (a band, not a sign change)."""


@dataclass(frozen=True, kw_only=True)
class BandData:
    """``tpsim/data/band.yaml``."""

    z: float
    fit_device: str
    device_transfer_sigma: float
    gemm_sigma: Mapping[str, float]
    attention_sigma: Mapping[str, float]
    profile_sigma: float
    exposed_comm_sigma: float
    optimizer_sigma: float


@lru_cache(maxsize=1)
def band_data() -> BandData:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "band.yaml")
    value = lambda k: float(raw[k]["value"])  # noqa: E731
    return BandData(z=value("z"), fit_device=str(raw["fit_device"]["value"]),
                    device_transfer_sigma=value("device_transfer_sigma"),
                    gemm_sigma={k: float(v) for k, v in raw["gemm_sigma"].items() if k != "source"},
                    attention_sigma={k: float(v) for k, v in raw["attention_sigma"].items() if k != "source"},
                    profile_sigma=value("profile_sigma"), exposed_comm_sigma=value("exposed_comm_sigma"),
                    optimizer_sigma=value("optimizer_sigma"))


@dataclass(frozen=True, kw_only=True)
class BandInputs:
    """The relative uncertainties of one context's inputs (per dtype where the kernel data differ)."""

    z: float
    fit_sigma: float
    device_sigma: float
    gemm_sigma: Mapping[str, float]
    """dtype -> GEMM kernel-data sigma (missing dtypes: the roofline prior)."""
    attention_sigma: float
    profile_sigma: float
    comm_sigma: float
    optimizer_sigma: float
    gemm_default: float

    def gemm(self, dtype: str) -> float:
        return self.gemm_sigma.get(dtype, self.gemm_default)


def band_inputs(compute: Any, device: Any, loo_rms_pct: float) -> BandInputs:
    """Uncertainties of the compute model serving a context on ``device``: the kernel model's provenance (through
    a profile's fallback), or the roofline's prior."""
    data = band_data()
    model = compute
    while getattr(model, "fallback", None) is not None and not hasattr(model, "in_situ"):
        model = model.fallback  # a profile: its fallback times what it has not measured
    provenance = model.provenance() if hasattr(model, "provenance") and hasattr(model, "in_situ") else {}
    gemm = {key.split(".", 1)[1]: data.gemm_sigma["anchored" if text.startswith("anchored") else "transferred"]
            for key, text in provenance.items() if key.startswith("gemm.")}
    impl = str(getattr(getattr(model, "base", None), "attention_impl", "other"))
    if "attention" in provenance:  # the roofline times attention
        impl = "other"
    arch = str(getattr(device, "architecture", "") or "")
    key = f"fa2_{arch}" if impl == "fa2" else impl
    attention = data.attention_sigma.get(key, data.attention_sigma["other"])
    on_fit_device = getattr(device, "name", "") == data.fit_device
    return BandInputs(z=data.z, fit_sigma=loo_rms_pct / 100.0,
                      device_sigma=0.0 if on_fit_device else data.device_transfer_sigma, gemm_sigma=gemm,
                      attention_sigma=attention, profile_sigma=data.profile_sigma,
                      comm_sigma=data.exposed_comm_sigma, optimizer_sigma=data.optimizer_sigma,
                      gemm_default=data.gemm_sigma["roofline"])


def step_band(inputs: BandInputs, dtype: str, *, step: np.ndarray, compute_like: np.ndarray,
              attention_share: np.ndarray, measured: np.ndarray, exposed_comm: np.ndarray,
              optimizer: np.ndarray, overhead_low: np.ndarray, overhead_high: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) step time, arrays over plans (see the module docstring)."""
    a = np.clip(attention_share, 0.0, 1.0)
    f = np.clip(measured, 0.0, 1.0)
    kernel2 = ((1.0 - a) * inputs.gemm(dtype)) ** 2 + (a * inputs.attention_sigma) ** 2
    sigma_c2 = inputs.fit_sigma ** 2 + (1.0 - f) ** 2 * (inputs.device_sigma ** 2 + kernel2) \
        + (f * inputs.profile_sigma) ** 2
    overhead_sigma = (overhead_high - overhead_low) / (2.0 * inputs.z)
    var = (compute_like ** 2 * sigma_c2 + (exposed_comm * inputs.comm_sigma) ** 2
           + (optimizer * inputs.optimizer_sigma) ** 2 + overhead_sigma ** 2)
    half = inputs.z * np.sqrt(var)
    return np.maximum(step - half, MIN_LOW_FRACTION * step), step + half
