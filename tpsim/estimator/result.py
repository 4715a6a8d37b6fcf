"""Estimate results: :class:`EstimateBatch` (struct of arrays) and :class:`Estimate` (one plan, frozen)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..plan import Plan, PlanBatch

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "tp_comm", "pp_comm", "dp_comm")
MEMORY_KEYS = ("weights", "grads", "optimizer_states", "activations", "other")
SCALAR_KEYS = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
               "peak_memory_gib", "fits")


@dataclass(frozen=True)
class Estimate:
    """Prediction for one plan; :meth:`to_dict` is the ``tpsim estimate --json`` object."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_memory_gib: float
    fits: bool
    breakdown: dict[str, float]
    memory_gib: dict[str, float]
    plan: Plan
    model: str
    cluster: dict[str, Any]
    compute_model: str
    measured_compute_fraction: float
    collectives: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["plan"] = self.plan.to_dict()
        d["plan"]["num_microbatches"] = self.plan.num_microbatches
        d["warnings"] = list(self.warnings)
        return d


@dataclass(frozen=True)
class EstimateBatch:
    """Predictions for a batch of plans: numpy arrays of equal length, same names as :class:`Estimate`."""

    plans: PlanBatch
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray
    hardware_tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    peak_memory_gib: np.ndarray
    fits: np.ndarray
    compute_s: np.ndarray
    recompute_s: np.ndarray
    bubble_s: np.ndarray
    optimizer_s: np.ndarray
    exposed_comm_s: np.ndarray
    tp_comm_s: np.ndarray
    pp_comm_s: np.ndarray
    dp_comm_s: np.ndarray
    mem_weights_gib: np.ndarray
    mem_grads_gib: np.ndarray
    mem_optimizer_states_gib: np.ndarray
    mem_activations_gib: np.ndarray
    mem_other_gib: np.ndarray
    measured_compute_fraction: np.ndarray
    model_name: str = ""
    cluster_info: dict = field(default_factory=dict)
    compute_model: str = "roofline"
    collectives: tuple = ()
    """per plan: {"tp": algorithm, "dp": ..., "pp": ...} (chosen at the plan's message sizes)."""

    def __len__(self) -> int:
        return len(self.step_time_s)

    def to_estimate(self, i: int, warnings: tuple[str, ...] = ()) -> Estimate:
        def f(x: np.ndarray) -> float:
            v = float(x[i])
            return v if math.isfinite(v) else float("nan")

        breakdown = {k: f(getattr(self, f"{k}_s")) for k in BREAKDOWN_KEYS}
        memory = {k: f(getattr(self, f"mem_{k}_gib")) for k in MEMORY_KEYS}
        return Estimate(
            step_time_s=f(self.step_time_s), tokens_per_s=f(self.tokens_per_s),
            model_tflops_per_gpu=f(self.model_tflops_per_gpu),
            hardware_tflops_per_gpu=f(self.hardware_tflops_per_gpu), mfu=f(self.mfu), hfu=f(self.hfu),
            peak_memory_gib=f(self.peak_memory_gib), fits=bool(self.fits[i]), breakdown=breakdown,
            memory_gib=memory, plan=self.plans.plan(i), model=self.model_name, cluster=dict(self.cluster_info),
            compute_model=self.compute_model, measured_compute_fraction=f(self.measured_compute_fraction),
            collectives=dict(self.collectives[i]) if self.collectives else {}, warnings=warnings)

    def columns(self) -> dict[str, np.ndarray]:
        """Plan fields and results as named columns (for tables and CSV)."""
        cols: dict[str, Any] = {}
        p = self.plans
        from ..plan import ORDERS, RECOMPUTE
        cols.update(tp=p.tp, pp=p.pp, vpp=p.vpp, dp=p.dp, sp=p.sp,
                    recompute=np.array(RECOMPUTE, dtype=object)[p.recompute], zero=p.zero,
                    micro_batch=p.micro_batch, overlap=p.overlap, order=np.array(ORDERS, dtype=object)[p.order])
        for name in SCALAR_KEYS:
            cols[name] = getattr(self, name)
        for k in BREAKDOWN_KEYS:
            cols[f"{k}_s"] = getattr(self, f"{k}_s")
        for k in MEMORY_KEYS:
            cols[f"mem_{k}_gib"] = getattr(self, f"mem_{k}_gib")
        return cols

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.columns())
