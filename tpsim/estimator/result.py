"""Estimate results: :class:`EstimateBatch` (struct of arrays) and :class:`Estimate` (one plan, frozen)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..plan import Plan, PlanBatch
from .flops import DEFAULT_FLOPS_CONVENTION, MFU_WARNING_START, mfu_warning
from .keys import sorted_values

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead", "tp_comm", "pp_comm",
                  "dp_comm", "cp_comm", "ep_comm")
STEP_PARTS = ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead")
"""the breakdown terms that sum to ``step_time_s`` (the ``*_comm`` ones are totals, partly hidden)."""
MEMORY_KEYS = ("weights", "grads", "optimizer_states", "activations", "cuda_context", "nccl_buffers",
               "allocator_reserve", "other")
"""named terms of ``memory_gib``; their sum is ``peak_memory_gib`` (docs/SCHEMAS.md section 6)."""
SCALAR_KEYS = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
               "peak_memory_gib", "fits")
BAND_KEYS = ("step_time_s_low", "step_time_s_high", "tokens_per_s_low", "tokens_per_s_high", "mfu_low", "mfu_high")
"""the error band (docs/SCHEMAS.md section 6: the values, not deltas; tpsim/estimator/band.py)."""


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
    stack: str = "megatron"
    """the training-stack profile the estimate follows."""
    step_time_s_low: float = math.nan
    step_time_s_high: float = math.nan
    tokens_per_s_low: float = math.nan
    tokens_per_s_high: float = math.nan
    mfu_low: float = math.nan
    mfu_high: float = math.nan
    terms: dict[str, float] = field(default_factory=dict)
    """step-time terms of the slowest rank, seconds, in order; they sum to ``step_time_s`` (docs/SCHEMAS.md
    T6: compute, recompute, bubble, optimizer, overhead and the exposed communication per axis)."""
    term_sources: dict[str, str] = field(default_factory=dict)
    """per term, the kernel data, device figure or stack rule it came from (``--explain``)."""
    pipeline_split: dict[str, list[int]] = field(default_factory=dict)
    """``layers_per_rank`` and ``layers_per_chunk`` (model order, chunk k on rank k mod pp) of the pipeline
    split the estimate costs (empty without a pipeline; tpsim.estimator.partition.layer_split)."""
    band_basis: dict[str, Any] | None = None
    """what set the band (docs/SCHEMAS.md T7): None = the input uncertainties (``band.PRIOR_BASIS``)."""
    tokens_per_s_per_gpu: float = math.nan
    """throughput per GPU (tokens_per_s / the cluster's GPUs)."""
    flops_convention: str = DEFAULT_FLOPS_CONVENTION
    """how the model FLOPs behind ``mfu`` and ``model_tflops_per_gpu`` are counted (docs/SCHEMAS.md T5)."""
    memory_headroom_gib: float = math.nan
    """device memory left free at the peak (usable memory - ``peak_memory_gib``; negative: does not fit)."""

    def in_convention(self, convention: str, ratio: float) -> "Estimate":
        """This estimate with MFU and the FLOP rates counted under ``convention`` (``ratio``: model FLOPs under
        it over under :attr:`flops_convention`, :func:`tpsim.estimator.flops.convention_ratio`)."""
        from .flops import in_convention

        keys = ("model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu", "mfu_low", "mfu_high")
        figures = in_convention({k: getattr(self, k) for k in keys}, ratio)
        high = mfu_warning(figures["mfu"], convention)  # the warning follows the figure shown
        warnings = tuple(w for w in self.warnings if not w.startswith(MFU_WARNING_START)) + ((high,) if high else ())
        return dataclasses.replace(self, flops_convention=convention, warnings=warnings, **figures)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("term_sources")
        d["terms"] = {k: {"seconds": v, "source": self.term_sources.get(k, "")} for k, v in self.terms.items()}
        if d["band_basis"] is None:
            from .band import PRIOR_BASIS

            d["band_basis"] = dict(PRIOR_BASIS)
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
    mem_cuda_context_gib: np.ndarray | None = None
    mem_nccl_buffers_gib: np.ndarray | None = None
    mem_allocator_reserve_gib: np.ndarray | None = None
    overhead_s: np.ndarray | None = None
    """host time per step not hidden by the kernels (None: zeros)."""
    cp_comm_s: np.ndarray | None = None
    """context-parallel collectives per step, hidden parts included (None: zeros)."""
    ep_comm_s: np.ndarray | None = None
    """expert-parallel collectives (ep all-to-alls, expert-tp gathers) per step (None: zeros)."""
    model_name: str = ""
    cluster_info: dict = field(default_factory=dict)
    compute_model: str = "roofline"
    collective_codes: Mapping[str, np.ndarray] = field(default_factory=dict)
    """axis -> per plan, index into ``collective_names`` of the algorithm chosen at the plan's message sizes
    (-1: the axis has size 1)."""
    collective_names: tuple[str, ...] = ()
    """``"op: algorithm"`` texts the codes index."""
    context_warnings: tuple[str, ...] = ()
    """warnings that hold for every plan of the batch (kernel profile of another device, ...)."""
    usable_memory_gib: float = math.inf
    """device memory a plan may use (for the ``does not fit`` warning)."""
    stack: str = "megatron"
    """the training-stack profile name."""
    step_time_s_low: np.ndarray | None = None
    step_time_s_high: np.ndarray | None = None
    tokens_per_s_low: np.ndarray | None = None
    tokens_per_s_high: np.ndarray | None = None
    mfu_low: np.ndarray | None = None
    mfu_high: np.ndarray | None = None
    exposed_axis: Mapping[str, np.ndarray] = field(default_factory=dict)
    """axis (tp, cp, ep, pp, dp) -> exposed communication per step (they sum to ``exposed_comm_s``)."""
    phases: Mapping[str, np.ndarray] = field(default_factory=dict)
    """fwd, bwd, optimizer, other: the step of the slowest rank by where its time passes (they sum to
    ``step_time_s``; :meth:`tpsim.estimator.schedule.Schedule.phases`, what ``tpsim validate`` compares)."""
    term_sources: Mapping[str, str] = field(default_factory=dict)
    """per term, where it comes from (:func:`tpsim.estimator.explain.term_sources`)."""
    num_layers: int = 0
    """the model's repeated layers (the pipeline split of :meth:`to_estimate`; 0: not stated)."""
    edges_as_layers: bool = False
    """the stack counts the embedding and the output layer as layers in its split."""
    layer_weights: tuple[float, ...] | None = None
    """per layer, what the split balances (layers of different costs: a traced graph's units; None: the
    stack's rule)."""
    flops_convention: str = DEFAULT_FLOPS_CONVENTION
    """how the model FLOPs behind ``mfu`` are counted (the layer source's convention)."""

    def __post_init__(self) -> None:
        for name in ("overhead_s", "cp_comm_s", "ep_comm_s", "mem_cuda_context_gib", "mem_nccl_buffers_gib",
                     "mem_allocator_reserve_gib"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros_like(self.step_time_s))
        for name in BAND_KEYS:  # no band given: the prediction itself
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self, name.rsplit("_", 1)[0]))

    def __len__(self) -> int:
        return len(self.step_time_s)

    def collectives(self, i: int) -> dict[str, str]:
        """{axis: "op: algorithm"} of plan ``i`` for its axes of size > 1."""
        return {axis: self.collective_names[int(codes[i])] for axis, codes in self.collective_codes.items()
                if codes[i] >= 0}

    def warnings(self, i: int, plan: Plan | None = None) -> tuple[str, ...]:
        """What ``tpsim estimate`` warns about for plan ``i`` (``plan``: its :class:`Plan` where the caller has
        it), computed from the batch's own arrays."""
        plan = self.plans.plan(i) if plan is None else plan
        out = list(_placement_warnings(plan, int(self.cluster_info.get("gpus_per_node", 0))))
        out += self.context_warnings
        high = mfu_warning(float(self.mfu[i]), self.flops_convention)
        if high:
            out.append(high)
        if not self.fits[i]:
            out.append(f"does not fit: {float(self.peak_memory_gib[i]):.1f} GiB needed, "
                       f"{self.usable_memory_gib:.1f} GiB usable on {self.cluster_info.get('device', '')}")
        return tuple(out)

    def to_estimate(self, i: int, warnings: tuple[str, ...] | None = None) -> Estimate:
        """Plan ``i`` as an :class:`Estimate` (the row of ``tpsim estimate --json``); ``warnings`` default to
        :meth:`warnings`."""
        def f(x: np.ndarray) -> float:
            v = float(x[i])
            return v if math.isfinite(v) else float("nan")

        breakdown = {k: f(getattr(self, f"{k}_s")) for k in BREAKDOWN_KEYS}
        memory = {k: f(getattr(self, f"mem_{k}_gib")) for k in MEMORY_KEYS}
        terms = self.terms(i)
        collectives = self.collectives(i)
        plan = self.plans.plan(i)
        return Estimate(
            step_time_s=f(self.step_time_s), tokens_per_s=f(self.tokens_per_s),
            model_tflops_per_gpu=f(self.model_tflops_per_gpu),
            hardware_tflops_per_gpu=f(self.hardware_tflops_per_gpu), mfu=f(self.mfu), hfu=f(self.hfu),
            peak_memory_gib=f(self.peak_memory_gib), fits=bool(self.fits[i]), breakdown=breakdown,
            memory_gib=memory, plan=plan, model=self.model_name, cluster=dict(self.cluster_info),
            compute_model=self.compute_model, measured_compute_fraction=f(self.measured_compute_fraction),
            collectives=collectives, warnings=self.warnings(i, plan) if warnings is None else tuple(warnings),
            stack=self.stack, terms=terms, pipeline_split=self.pipeline_split(i), term_sources=_plan_sources(self.term_sources, collectives, terms,
                                                     plan.schedule),
            **{k: f(getattr(self, k)) for k in BAND_KEYS},
            tokens_per_s_per_gpu=f(self.tokens_per_s) / float(self.cluster_info.get("gpus") or 1),
            flops_convention=self.flops_convention,
            memory_headroom_gib=_finite(float(self.usable_memory_gib) - f(self.peak_memory_gib)))

    def terms(self, i: int) -> dict[str, float]:
        """The step-time terms of plan ``i`` (docs/SCHEMAS.md T6), in order; they sum to its step time."""
        out = {k: float(getattr(self, f"{k}_s")[i]) for k in ("compute", "recompute", "bubble", "optimizer",
                                                               "overhead")}
        if not self.exposed_axis:  # a result built without the split: all exposed communication in one term
            out["exposed_comm"] = float(self.exposed_comm_s[i])
            return out
        shape = self.step_time_s.shape
        for axis in ("tp", "cp", "ep", "pp", "dp"):
            value = self.exposed_axis.get(axis)
            if value is None:
                out[f"{axis}_comm"] = 0.0
            elif type(value) is np.ndarray and value.shape == shape:  # the common case: no broadcast view
                out[f"{axis}_comm"] = float(value[i])
            else:
                out[f"{axis}_comm"] = float(np.broadcast_to(value, shape)[i])
        return out

    def pipeline_split(self, i: int) -> dict[str, list[int]]:
        """Layers per rank and per chunk of plan ``i`` (empty without a pipeline or a layer count)."""
        from .partition import layer_split

        p = self.plans
        pp, vpp = int(p.pp[i]), int(p.vpp[i])
        if pp == 1 or not self.num_layers:
            return {}
        chunks = list(layer_split(self.num_layers, pp, vpp, self.edges_as_layers, int(p.pp_first[i]),
                                  int(p.pp_last[i]), bool(p.pp_embedding[i]), bool(p.pp_loss[i]),
                                  self.layer_weights, layout=int(p.pp_layout[i])))
        return {"layers_per_rank": [sum(chunks[r::pp]) for r in range(pp)], "layers_per_chunk": chunks}

    def columns(self) -> dict[str, np.ndarray]:
        """Plan fields and results as named columns (for tables and CSV)."""
        cols: dict[str, Any] = {}
        p = self.plans
        from ..plan import ORDERS, RECOMPUTE
        cols.update(tp=p.tp, pp=p.pp, vpp=p.vpp, dp=p.dp, sp=p.sp,
                    recompute=np.array(RECOMPUTE, dtype=object)[p.recompute], zero=p.zero,
                    micro_batch=p.micro_batch, overlap=p.overlap, order=np.array(ORDERS, dtype=object)[p.order])
        for name in SCALAR_KEYS + BAND_KEYS:
            cols[name] = getattr(self, name)
        cols["tokens_per_s_per_gpu"] = self.tokens_per_s / float(self.cluster_info.get("gpus") or 1)
        for k in BREAKDOWN_KEYS:
            cols[f"{k}_s"] = getattr(self, f"{k}_s")
        for k in MEMORY_KEYS:
            cols[f"mem_{k}_gib"] = getattr(self, f"mem_{k}_gib")
        return cols

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.columns())


def first_group_nodes(plan: Plan, axes: tuple[str, ...], gpus_per_node: int) -> int:
    """Nodes the first group of ``axes`` (every other axis index 0) touches: its ranks are the sums of the
    axes' indices times their strides in the plan's rank order (no group tables are built)."""
    return _first_group_nodes(plan.order, plan.tp, plan.cp, plan.dp, plan.pp, axes, gpus_per_node)


@lru_cache(maxsize=1024)
def _first_group_nodes(order: str, tp: int, cp: int, dp: int, pp: int, axes: tuple[str, ...],
                       gpus_per_node: int) -> int:
    from ..plan import full_order
    from ..topology.placement import RankLayout

    layout = RankLayout.from_order(full_order(order), tp=tp, cp=cp, dp=dp, pp=pp)
    ranks = np.zeros(1, dtype=np.int64)
    stride = 1
    for name, size in layout.dims:
        if name in axes:
            ranks = (ranks[:, None] + stride * np.arange(size, dtype=np.int64)[None, :]).reshape(-1)
        stride *= size
    return int(sorted_values(ranks // gpus_per_node).size)


def _placement_warnings(plan: Plan, gpus_per_node: int) -> tuple[str, ...]:
    if gpus_per_node <= 0 or plan.tp == 1:
        return ()
    nodes = first_group_nodes(plan, ("tp",), gpus_per_node)
    if nodes <= 1:
        return ()
    return (f"TP group of {plan.tp} spans {nodes} nodes: tensor-parallel traffic crosses the inter-node network",)


def _plan_sources(base: Mapping[str, str], collectives: Mapping[str, str], terms: Mapping[str, float],
                  schedule: str = "") -> dict[str, str]:
    from .explain import plan_sources

    out = plan_sources(base, collectives, schedule if base else "")
    return {k: out.get(k, "") for k in terms}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.nan
