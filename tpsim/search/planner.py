"""The planner: enumerate every plan of a space, drop invalid ones with a reason, evaluate the rest in
batches with the vectorized estimator, and rank them.

Ranking (deterministic): plans that fit come first; then the objective ascending (``time``: step time;
``memory``: peak memory per GPU; ``cost``: dollars per million tokens); then step time, peak memory, GPUs and
the plan fields as tie-breakers.

Twins are one row: plans that differ only in the rank order and/or the DP-overlap flag and predict the same
step time and peak memory (to :data:`TWIN_RTOL`) are the same choice for the user, so the ranking lists the
best-ranked of them and ``variants`` names the others (``--json``: ``variants: [{order, overlap}, ...]``). Cost = GPUs x price per GPU-hour / 3600 / (tokens per second) x 1e6, so with
the default price of 1 $/GPU-hour it reads as GPU-hours per million tokens.

With ``objective="cost"`` the caller passes several clusters (one per GPU count, from one node up to N; see
:func:`cost_gpu_counts`) and plans of every count are ranked together.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..model import ModelSpec
from ..plan import CP_KINDS, ORDERS, RECOMPUTE, SCHEDULES, Plan, PlanBatch
from .pareto import pareto_front, pareto_front_max_y
from .space import SearchSpace, enumerate_valid
from .validity import HEADROOM, MEM_LIMIT, MEMORY, REASONS, STACK, reasons_from_counts, stack_codes

OBJECTIVES = ("time", "memory", "cost", "time-to-train", "energy")
WHOLE_RUN = ("time-to-train", "energy")
"""objectives that need a token budget (``cost`` ranks whole-run dollars with one, $/Mtok without)."""
RUN_COLUMNS = ("expected_days", "goodput", "cost_usd", "energy_mwh", "interruptions")
"""whole-run columns (tpsim.train.plan_columns) a search with ``tokens`` keeps."""
DEFAULT_GPU_HOUR_PRICE = 1.0
"""dollars per GPU-hour; 1.0 makes the cost column read as GPU-hours per million tokens."""
CHUNK = 1 << 14
"""plans per estimator call: bounds memory, lets the progress bar move; measured as fast as larger chunks."""

# EstimateBatch arrays the planner keeps for every evaluated plan
ESTIMATE_FIELDS = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                   "peak_memory_gib", "fits", "compute_s", "recompute_s", "bubble_s", "optimizer_s",
                   "exposed_comm_s", "overhead_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s", "ep_comm_s",
                   "mem_weights_gib", "mem_grads_gib", "mem_optimizer_states_gib", "mem_activations_gib",
                   "mem_other_gib", "mem_cuda_context_gib", "mem_nccl_buffers_gib", "mem_allocator_reserve_gib",
                   "step_time_s_low", "step_time_s_high", "tokens_per_s_low", "tokens_per_s_high", "mfu_low",
                   "mfu_high")
PLAN_FIELDS = ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch", "overlap", "order", "cp", "cp_kind",
               "ep", "etp", "schedule")
EXTRA_AXES = ("cp", "cp_kind", "ep", "etp")
"""plan columns of the parallel axes of issue 11 (docs/SCHEMAS.md section 1), used where the batches have them."""
BAND_FIELDS = ("step_time_s_low", "step_time_s_high", "tokens_per_s_low", "tokens_per_s_high", "mfu_low",
               "mfu_high")
"""error-band arrays (docs/SCHEMAS.md section 6), kept when the estimator's batches carry them."""
VARIANT_FIELDS = ("order", "overlap", "schedule")
"""the plan fields in which twins may differ (the schedule: pp = 1 plans of every schedule the stack offers)."""
TWIN_RTOL = 1e-9
"""relative tolerance under which two step times (or peak memories) are the same prediction: different rank
orders can reach the same figure through a different summation order (a few ulps apart)."""
BREAKDOWN = ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead")
SHAPE_FIELDS = ("tp", "cp", "pp", "ep", "zero")
TIE_COLUMNS = {"time": "step_time_s", "cost": "cost_per_mtok", "time-to-train": "expected_days",
               "energy": "energy_mwh"}
"""the ranked figure of each objective that the step-time error band widens (tie groups)."""
"""what makes two plans distinct shapes for ``--distinct`` (the parallel degrees and the ZeRO stage)."""
"""the components that sum to the step time."""

Estimator = Callable[..., Any]


def _default_estimator() -> Estimator:
    from ..estimator import estimate_batch
    return estimate_batch


_default_estimator_fn = _default_estimator


def _stack_refused(model: ModelSpec, plans: PlanBatch, stack: Any) -> tuple[dict[str, int], PlanBatch]:
    """({stack rule key: count} of the plans the training ``stack`` cannot run, the plans it can)."""
    from ..stacks import count_violations

    if not len(plans):
        return {}, plans
    codes = stack_codes(model, plans, stack)
    refused = codes > 0
    if not refused.any():
        return {}, plans
    return count_violations(codes[refused]), plans.take(np.flatnonzero(~refused))


def _without_oversized_states(model: ModelSpec, cluster: Any, plans: PlanBatch, compute: Any,
                              stack: Any = None) -> tuple[PlanBatch, int]:
    """The plans whose weights, gradients and optimizer states alone fit in the device's memory, and how many
    did not (they cannot fit whatever their activations: counted under the ``memory`` reason without being
    estimated, and without building their collective curves)."""
    if not len(plans):
        return plans, 0
    from ..estimator import context_for
    from ..estimator.core import model_states_bytes

    ctx = context_for(model, cluster, compute, stack=stack)
    states = np.zeros(len(plans))
    for start in range(0, len(plans), STATES_CHUNK):
        sub = plans.take(slice(start, start + STATES_CHUNK))
        states[start:start + len(sub)] = model_states_bytes(ctx, sub)
    keep = states <= cluster.device.memory_bytes
    if keep.all():
        return plans, 0
    if not keep.any():  # none can fit: still estimate one, so an empty result can say what the smallest needs
        keep[int(np.argmin(states))] = True
    return plans.take(np.flatnonzero(keep)), int((~keep).sum())


STATES_CHUNK = 1 << 20
"""plans per model-states check (bounds the memory of the pattern arrays)."""


@dataclass(frozen=True)
class Part:
    """Plans of one GPU count: the cluster and the estimator's batches (chunks) with their offsets."""

    cluster: Any
    chunks: tuple[Any, ...]
    offsets: tuple[int, ...]
    """global index of each chunk's first row."""


@dataclass(frozen=True, kw_only=True)
class RankedPlan:
    """One ranked plan: its rank (1 = best), GPU count, cost and the ``tpsim estimate --json`` object."""

    rank: int
    gpus: int
    cost_per_mtok: float
    """dollars per million tokens at the search's GPU-hour price."""
    estimate: Mapping[str, Any]
    """``Estimate.to_dict()`` of the plan (as ``tpsim estimate --json`` prints it)."""
    variants: tuple[Mapping[str, Any], ...] = ()
    """``{order, overlap}`` of every plan this row stands for (itself first): twins with the same prediction."""
    train_time: Mapping[str, Any] | None = None
    """the whole-run figures (``--tokens``), docs/SCHEMAS.md T8."""

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields at top level, ``variants``, then every field of ``tpsim estimate --json``."""
        plan = self.estimate.get("plan", {})
        out: dict[str, Any] = {"rank": self.rank, "gpus": self.gpus}
        out.update({k: plan[k] for k in PLAN_FIELDS + EXTRA_AXES if k in plan})
        out["cost_per_mtok"] = self.cost_per_mtok
        out["variants"] = [dict(v) for v in self.variants]
        out.update(self.estimate)
        if self.train_time is not None:
            out["train_time"] = dict(self.train_time)
        return out


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Everything a search found. ``columns`` are numpy arrays over all evaluated plans (all GPU counts);
    ``ranking`` indexes them, best first, and holds only the plans kept (fitting, or all with include_unfit)."""

    model: ModelSpec
    objective: str
    gpu_hour_price: float
    parts: tuple[Part, ...]
    columns: Mapping[str, np.ndarray]
    ranking: np.ndarray
    enumerated: int
    evaluated: int
    rejected: Mapping[str, int]
    elapsed_s: float
    mem_limit_gib: float | None = None
    compute: Any = None
    """the compute model the plans were evaluated with (None: the device roofline)."""
    space: SearchSpace = field(default_factory=SearchSpace)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """estimate dicts already computed, by row index (see :meth:`estimate_dict`)."""
    band_memo: dict = field(default_factory=dict, repr=False, compare=False)
    """residual bands already computed, by (part, tp, cp, pp, recompute) (see :meth:`residual_bands`)."""
    duplicates: int = 0
    """plans left out of the ranking because they are twins of a ranked plan (see :meth:`variants`)."""
    cached: bool = False
    """True when the result came from the on-disk cache (:mod:`tpsim.search.cache`)."""
    stack: Any = None
    """the training-stack profile the plans were filtered and evaluated for (None: megatron)."""
    stack_rejected: Mapping[str, int] = field(default_factory=dict)
    """{stack rule key: plans} behind the ``stack`` rejection count."""
    left_out: int = 0
    """plans of the full product that a pruned space (mixture-of-experts default) left out, every one
    rejected by a plan rule or the stack (:mod:`tpsim.search.space`); not in ``enumerated``."""
    tokens: float | None = None
    """the whole run's token budget (None: step-time figures only)."""
    reliability: Any = None
    """the :class:`tpsim.train.Reliability` of the whole-run figures."""
    convention: str | None = None
    """how the model FLOPs behind the ``mfu`` and ``model_tflops_per_gpu`` columns are counted (None: the
    estimator's, :data:`tpsim.estimator.flops.DEFAULT_FLOPS_CONVENTION`); see :attr:`flops_convention`."""
    flops_ratio: float = 1.0
    """model FLOPs under :attr:`flops_convention` over under the estimator's (applied to every estimate)."""
    distinct: bool = False
    """the ranking keeps only the best plan of each distinct shape (:data:`SHAPE_FIELDS`)."""

    def __len__(self) -> int:
        return int(self.ranking.size)

    # ---- conventions and views -------------------------------------------------------------------------
    @property
    def flops_convention(self) -> str:
        from ..estimator.flops import DEFAULT_FLOPS_CONVENTION

        return self.convention or DEFAULT_FLOPS_CONVENTION

    def in_convention(self, convention: str) -> "SearchResult":
        """This result with MFU and the FLOP rates counted under ``convention`` (docs/SCHEMAS.md T5)."""
        from ..estimator.flops import convention_ratio, in_convention

        if convention == self.flops_convention:
            return self
        ratio = convention_ratio(self.model, convention, self.flops_convention)
        cols = in_convention({k: v for k, v in self.columns.items()}, ratio)
        return dataclasses.replace(self, columns=cols, convention=convention,
                                   flops_ratio=self.flops_ratio * ratio, memo={})

    def distinct_shapes(self) -> "SearchResult":
        """This result ranking only the best plan of each distinct shape: tp, cp, pp, ep degrees and ZeRO
        stage (``tpsim plan --distinct``)."""
        c, idx = self.columns, np.asarray(self.ranking, dtype=np.int64)
        if not idx.size:
            return dataclasses.replace(self, distinct=True)
        keys = np.stack([np.asarray(c[f])[idx].astype(np.int64) for f in SHAPE_FIELDS], axis=1)
        _, first = np.unique(keys, axis=0, return_index=True)
        return dataclasses.replace(self, ranking=idx[np.sort(first)], distinct=True)

    def tie_groups(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Per ranked row of ``idx`` (default: the ranking), its tie group: 1 for the best row and every row
        whose prediction is within the best one's error band (the objective's figure at most the band's upper
        edge: step time, cost, days to train or energy scaled by the step-time band); the first row outside opens
        group 2, and so on. Rows of one group are ties: the estimator cannot tell them apart.
        ``objective="memory"`` ranks by a figure without a band: every row is its own group."""
        idx = np.asarray(self.ranking if idx is None else idx, dtype=np.int64)
        groups = np.zeros(idx.size, dtype=np.int64)
        c = self.columns
        column = TIE_COLUMNS.get(self.objective)
        if column is None or column not in c:
            return np.arange(1, idx.size + 1, dtype=np.int64)
        value = np.asarray(c[column], dtype=float)[idx]
        edge = self.residual_bands(idx)[1] * value
        fits = np.asarray(c["fits_effective"])[idx]
        group, start = 0, -1
        for k in range(idx.size):
            if start < 0 or fits[k] != fits[start] or not value[k] <= edge[start]:
                group, start = group + 1, k
            groups[k] = group
        return groups

    def residual_bands(self, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
        """Per row of ``idx`` (default: the ranking): the low and high factors of its step time and the
        ``band_basis`` of the residual band, the one ``tpsim estimate`` gives (:func:`tpsim.runfit.plan_band`;
        the calibration in force is the row's cluster's). Remembered per (GPU count, tp, cp, pp, recompute)."""
        from types import SimpleNamespace

        from ..runfit import plan_band

        idx = np.asarray(self.ranking if idx is None else idx, dtype=np.int64)
        c = self.columns
        keys = np.stack([np.asarray(c[name])[idx].astype(np.int64)
                         for name in ("part", "tp", "cp", "pp", "recompute")], axis=1).reshape(idx.size, 5)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        memo = self.band_memo
        bands = []
        for key in map(tuple, unique.tolist()):
            band = memo.get(key)
            if band is None:
                part, tp, cp, pp, rc = key
                cluster = self.parts[part].cluster
                plan = SimpleNamespace(tp=tp, cp=cp, pp=pp, dtype=self.space.dtype, recompute=RECOMPUTE[rc])
                cal = getattr(getattr(cluster, "spec", None), "calibration", None)
                band = memo[key] = plan_band(None, model=self.model, cluster=cluster, plan=plan,
                                             stack=self.stack_name, calibration=cal)
            bands.append(band)
        inverse = np.asarray(inverse).reshape(-1)
        low = np.array([b.low_factor for b in bands] or [1.0])[inverse]
        high = np.array([b.high_factor for b in bands] or [1.0])[inverse]
        basis = [bands[int(j)].basis for j in inverse]
        return low, high, basis

    def with_residual_bands(self) -> "SearchResult":
        """This result with its band columns (:data:`BAND_FIELDS`) from :meth:`residual_bands` for every row
        (report charts and tables), and a ``band_basis`` column (one text per row: kind, runs, group)."""
        c = dict(self.columns)
        if "step_time_s" not in c:
            return self
        idx = np.arange(np.asarray(c["step_time_s"]).size)
        low, high, basis = self.residual_bands(idx)
        step = np.asarray(c["step_time_s"], dtype=float)
        c["step_time_s_low"], c["step_time_s_high"] = step * low, step * high
        for key in ("tokens_per_s", "mfu"):
            if key in c:
                value = np.asarray(c[key], dtype=float)
                c[f"{key}_low"], c[f"{key}_high"] = value / high, value / low
        texts: dict[int, str] = {}
        c["band_basis"] = np.array([texts.setdefault(id(b), basis_text(b)) for b in basis], dtype=object)
        return dataclasses.replace(self, columns=c, memo={}, band_memo=self.band_memo)

    # ---- single plans --------------------------------------------------------------------------------
    def batch_estimate(self, i: int) -> Any:
        """Row ``i`` (an index into ``columns``) of the estimator's batch, as an :class:`Estimate` (collective
        algorithms and warnings included, from the batch's own arrays)."""
        return self.estimates([int(i)])[0]

    def plan(self, i: int) -> Any:
        """Evaluated plan ``i`` as a :class:`tpsim.plan.Plan`."""
        c = self.columns
        return Plan(tp=int(c["tp"][i]), cp=int(c["cp"][i]), cp_kind=CP_KINDS[int(c["cp_kind"][i])],
                    ep=int(c["ep"][i]), etp=int(c["etp"][i]), pp=int(c["pp"][i]), vpp=int(c["vpp"][i]),
                    dp=int(c["dp"][i]), sp=bool(c["sp"][i]), recompute=RECOMPUTE[int(c["recompute"][i])],
                    zero=int(c["zero"][i]), micro_batch=int(c["micro_batch"][i]),
                    global_batch=int(c["global_batch"][i]), dtype=self.space.dtype, overlap=bool(c["overlap"][i]),
                    order=ORDERS[int(c["order"][i])], attention=self.space.attention,
                    schedule=SCHEDULES[int(c["schedule"][i])])

    def estimate(self, i: int) -> Any:
        """The full :class:`Estimate` of evaluated plan ``i``, exactly as ``tpsim estimate`` gives it: the row
        of the batch the search evaluated (a test checks it equals ``tpsim.estimate`` of the plan)."""
        return self.estimates([int(i)])[0]

    def estimates(self, rows: Sequence[int]) -> list[Any]:
        """Estimates of evaluated plans ``rows``: rows of the search's batches; a result restored from the
        on-disk cache holds no batches, so its rows are evaluated again, one batch per GPU count."""
        out: dict[int, Any] = {}
        missing: dict[int, list[int]] = {}
        for i in rows:
            part_i = int(self.columns["part"][i])
            part = self.parts[part_i]
            if part.chunks:
                k = int(np.searchsorted(part.offsets, i, side="right")) - 1
                out[i] = self._converted(part.chunks[k].to_estimate(int(i - part.offsets[k])))
            else:
                missing.setdefault(part_i, []).append(int(i))
        for part_i, wanted in missing.items():
            from ..estimator import estimate_batch

            batch = estimate_batch(self.model, self.parts[part_i].cluster,
                                   PlanBatch.from_plans([self.plan(i) for i in wanted]), compute=self.compute,
                                   stack=self.stack)
            out.update({i: self._converted(batch.to_estimate(j)) for j, i in enumerate(wanted)})
        return [out[int(i)] for i in rows]

    def _converted(self, e: Any) -> Any:
        return e if self.flops_ratio == 1.0 else e.in_convention(self.flops_convention, self.flops_ratio)

    def estimate_dict(self, i: int) -> dict[str, Any]:
        """``self.estimate(i).to_dict()``, memoized (and kept by the on-disk plan cache)."""
        key = str(int(i))
        if key not in self.memo:
            self.memo[key] = self.estimate(int(i)).to_dict()
        return self.memo[key]

    def top(self, k: int | None = None) -> list[RankedPlan]:
        idx = self.ranking if k is None else self.ranking[:k]
        todo = [int(i) for i in idx if str(int(i)) not in self.memo]
        for i, e in zip(todo, self.estimates(todo)):
            self.memo[str(i)] = e.to_dict()
        return [RankedPlan(rank=r + 1, gpus=int(self.columns["gpus"][i]),
                           cost_per_mtok=float(self.columns["cost_per_mtok"][i]), estimate=self.estimate_dict(i),
                           variants=tuple(self.variant_fields(int(i))), train_time=self.train_time(int(i)))
                for r, i in enumerate(idx)]

    def train_time(self, i: int) -> dict[str, Any] | None:
        """The ``train_time`` object (docs/SCHEMAS.md T8) of evaluated plan ``i``; None without ``tokens``."""
        if self.tokens is None:
            return None
        from ..train import train_time_of

        c = self.columns
        band = {k: float(c[f"step_time_s_{k}"][i]) if f"step_time_s_{k}" in c else float("nan")
                for k in ("low", "high")}
        return train_time_of(self.model, self.parts[int(c["part"][i])].cluster, self.plan(i), self.tokens,
                             self.reliability, self.gpu_hour_price, step_s=float(c["step_time_s"][i]),
                             step_low=band["low"], step_high=band["high"],
                             weights_gib=float(c["mem_weights_gib"][i]),
                             optimizer_gib=float(c["mem_optimizer_states_gib"][i])).to_dict()

    # ---- twins ---------------------------------------------------------------------------------------
    def variants(self, i: int) -> np.ndarray:
        """Rows that ranked row ``i`` stands for: ``i`` itself first, then its twins (same plan up to rank
        order and overlap, same predicted step time and memory), by order then overlap on before off."""
        twin_of = self.columns.get("twin_of")
        if twin_of is None:
            return np.array([int(i)])
        rows = np.flatnonzero(twin_of == twin_of[i])
        rows = rows[rows != i]
        c = self.columns
        rows = rows[np.lexsort((~c["overlap"][rows].astype(bool), c["order"][rows]))]
        return np.concatenate([[int(i)], rows]).astype(np.int64)

    def variant_fields(self, i: int) -> list[dict[str, Any]]:
        """``[{order, overlap}, ...]`` of :meth:`variants`."""
        c = self.columns
        return [{"order": ORDERS[int(c["order"][j])], "overlap": bool(c["overlap"][j])} for j in self.variants(i)]

    def label(self, i: int) -> str:
        """Short label of evaluated plan ``i`` (``tp8 pp16 dp8 sp sel z1 mb1``, with GPUs if they vary)."""
        c = self.columns
        parts = [f"tp{c['tp'][i]}"]
        if c["cp"][i] > 1:
            parts.append(f"cp{c['cp'][i]}" + ("/a2a" if c["cp_kind"][i] == 1 else ""))
        if c["ep"][i] > 1:
            parts.append(f"ep{c['ep'][i]}")
        if c["etp"][i] and c["etp"][i] != c["tp"][i]:
            parts.append(f"etp{c['etp'][i]}")
        parts.append(f"pp{c['pp'][i]}")
        if c["vpp"][i] > 1:
            parts.append(f"v{c['vpp'][i]}")
        if c["schedule"][i]:
            parts.append(SCHEDULES[int(c["schedule"][i])])
        parts.append(f"dp{c['dp'][i]}")
        if c["sp"][i]:
            parts.append("sp")
        rc = ("", "sel", "full")[int(c["recompute"][i])]
        if rc:
            parts.append(rc)
        if c["zero"][i]:
            parts.append(f"z{c['zero'][i]}")
        parts.append(f"mb{c['micro_batch'][i]}")
        if not c["overlap"][i]:
            parts.append("no-ovl")
        if c["order"][i]:
            parts.append(ORDERS[int(c["order"][i])])
        if len(self.parts) > 1:
            parts.insert(0, f"{c['gpus'][i]}g")
        return " ".join(parts)

    # ---- fronts --------------------------------------------------------------------------------------
    def kept(self) -> np.ndarray:
        """Indices of the kept plans (ranked order)."""
        return self.ranking

    def pareto_time_memory(self) -> np.ndarray:
        """Indices (into columns) of the fitting plans on the step-time vs. memory-per-GPU front."""
        fit = np.flatnonzero(self.columns["fits_effective"])
        front = pareto_front(self.columns["peak_memory_gib"][fit], self.columns["step_time_s"][fit])
        return fit[front]

    def pareto_gpus_throughput(self) -> np.ndarray:
        """Indices of the fitting plans on the throughput vs. number-of-GPUs front (fewer GPUs, more tokens/s)."""
        fit = np.flatnonzero(self.columns["fits_effective"])
        front = pareto_front_max_y(self.columns["gpus"][fit], self.columns["tokens_per_s"][fit])
        return fit[front]

    def front_rows(self, front: np.ndarray) -> list[dict[str, Any]]:
        """Plan fields and the main figures of the rows ``front`` (no estimator call)."""
        c = self.columns
        rows = []
        for i in front:
            plan = self.plan(int(i))
            row = {"label": self.label(int(i)), "gpus": int(c["gpus"][i])}
            row.update({k: getattr(plan, k) for k in PLAN_FIELDS})
            row.update({k: float(c[k][i]) for k in ("step_time_s", "peak_memory_gib", "tokens_per_s", "mfu",
                                                     "cost_per_mtok")})
            rows.append(row)
        return rows

    # ---- output --------------------------------------------------------------------------------------
    def to_json(self, top: int | None = 10) -> dict[str, Any]:
        """The ``tpsim plan --json`` object (non-finite numbers become null, so it is strict JSON)."""
        return _finite({
            "model": self.model.name,
            "stack": self.stack_name,
            "flops_convention": self.flops_convention,
            "objective": self.objective,
            "distinct": self.distinct,
            "gpu_hour_price": self.gpu_hour_price,
            "gpus": sorted({int(p.cluster.num_gpus) for p in self.parts}),
            "enumerated": self.enumerated,
            "left_out": self.left_out,
            "evaluated": self.evaluated,
            "kept": int(self.ranking.size),
            "duplicates": self.duplicates,
            "rejected": dict(self.rejected),
            "stack_rejected": dict(self.stack_rejected),
            "planner_headroom_fraction": planner_headroom_fraction(),
            "elapsed_s": self.elapsed_s,
            "plans": [dict(p.to_dict(), tie_group=int(g)) for p, g in zip(self.top(top), self.tie_groups(
                self.ranking if top is None else self.ranking[:top]))],
            "pareto_time_memory": self.front_rows(self.pareto_time_memory()),
            "pareto_gpus_throughput": self.front_rows(self.pareto_gpus_throughput()) if len(self.parts) > 1 else [],
        })

    def table_columns(self, top: int | None = 10) -> dict[str, Any]:
        """The ranked plans with the breakdown columns, as {column: values} in display order (no pandas: the
        ``tpsim plan`` table prints from it; :meth:`table` wraps it in a DataFrame)."""
        idx = np.asarray(self.ranking if top is None else self.ranking[:top], dtype=np.int64)
        c = self.columns
        data: dict[str, Any] = {"rank": np.arange(1, idx.size + 1)}
        if idx.size and self.objective != "memory":
            data["tie"] = self.tie_groups(idx)
        if len(self.parts) > 1:
            data["gpus"] = c["gpus"][idx]
        data["tp"] = c["tp"][idx]
        if np.any(c["cp"][idx] > 1):
            data["cp"] = [f"{n}{'/a2a' if k == 1 else ''}" for n, k in zip(c["cp"][idx], c["cp_kind"][idx])]
        if np.any(c["ep"][idx] > 1):
            data["ep"] = c["ep"][idx]
        if np.any((c["etp"][idx] > 0) & (c["etp"][idx] != c["tp"][idx])):
            data["etp"] = np.where(c["etp"][idx] == 0, c["tp"][idx], c["etp"][idx])
        overlaps, orders, counts = self._variant_columns(idx)
        data.update({
            "pp": c["pp"][idx], "vpp": c["vpp"][idx],
            **({"schedule": [SCHEDULES[int(k)] for k in c["schedule"][idx]]} if np.any(c["schedule"][idx]) else {}),
            "dp": c["dp"][idx],
            "sp": np.where(c["sp"][idx], "y", "-"), "recompute": [RECOMPUTE[int(r)] for r in c["recompute"][idx]],
            "zero": c["zero"][idx], "mb": c["micro_batch"][idx], "overlap": overlaps, "order": orders,
            "variants": counts,
            "step_s": c["step_time_s"][idx], "tok/s": c["tokens_per_s"][idx],
            "tok/s/gpu": c["tokens_per_s"][idx] / c["gpus"][idx], "mfu": c["mfu"][idx],
            "mem_GiB": c["peak_memory_gib"][idx],
        })
        if "headroom_gib" in c:
            data["free_GiB"] = c["headroom_gib"][idx]
        if not c["fits_effective"][idx].all():
            data["fits"] = c["fits_effective"][idx]
        for name in BREAKDOWN + ("tp_comm", "pp_comm", "dp_comm", "cp_comm", "ep_comm"):
            if name in ("overhead", "cp_comm", "ep_comm") and not np.any(c[f"{name}_s"][idx]):
                continue  # no calibrated host overhead, no cp / ep: no column of zeros
            data[f"{name}_s"] = c[f"{name}_s"][idx]
        if self.objective == "cost" and self.tokens is None:
            data["$/Mtok"] = c["cost_per_mtok"][idx]
        if self.tokens is not None:
            data.update({"days": c["expected_days"][idx], "goodput": c["goodput"][idx], "$": c["cost_usd"][idx],
                         "MWh": c["energy_mwh"][idx]})
        return data

    def table(self, top: int | None = 10) -> "Any":
        """A pandas DataFrame of :meth:`table_columns` (imports pandas lazily: for ``--csv`` and the API)."""
        import pandas as pd

        return pd.DataFrame(self.table_columns(top))

    @property
    def stack_name(self) -> str:
        return "megatron" if self.stack is None else str(self.stack.name)

    def _variant_columns(self, idx: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
        """Per ranked row of ``idx``: overlap ("y", "-", or "y,-" when its twins have both), order (the row's,
        with "+k" when its twins have k other orders) and the number of plans the row stands for."""
        from ..estimator.keys import sorted_values

        c = self.columns
        n = c["tp"].size
        twin_of = c.get("twin_of", np.arange(n))
        on = np.bincount(twin_of, weights=c["overlap"].astype(float), minlength=n)[idx]
        count = np.bincount(twin_of, minlength=n)[idx]
        kinds = int(np.max(c["order"], initial=0)) + 1
        pairs = sorted_values(twin_of * kinds + np.asarray(c["order"], dtype=np.int64))  # (set, order) pairs
        orders = np.bincount(pairs // kinds, minlength=n)[idx]
        overlap_text = ["y,-" if 0 < k < m else "y" if k else "-" for k, m in zip(on, count)]
        order_text = [ORDERS[int(c["order"][i])] + (f"+{k - 1}" if k > 1 else "") for i, k in zip(idx, orders)]
        return overlap_text, order_text, count.astype(np.int64)

    def why(self) -> list[tuple[str, str, int]]:
        """(reason key, explanation, count) for every rejection reason, most frequent first."""
        rows = [(key, next(r.text for r in REASONS if r.key == key), n) for key, n in self.rejected.items()]
        return sorted(rows, key=lambda r: (-r[2], r[0]))


def _varies(cols: Mapping[str, np.ndarray], name: str, idx: np.ndarray) -> bool:
    """Whether plan column ``name`` exists and is above 1 somewhere in rows ``idx`` (cp/ep columns are shown
    only then)."""
    return name in cols and bool(np.any(np.asarray(cols[name])[idx] > 1))


def basis_text(basis: Mapping[str, Any]) -> str:
    """A ``band_basis`` (docs/SCHEMAS.md T7) as one line: ``residuals of 12 runs (same device and stack)``."""
    if basis.get("kind") == "prior":
        return str(basis.get("group", "input uncertainties"))
    kind = "calibration runs" if basis.get("kind") == "calibrated" else "measured runs"
    return f"90% band from the residuals of {basis.get('n', 0)} {kind} ({basis.get('group', '')})"


def _finite(obj: Any) -> Any:
    """Replace NaN and infinities (anywhere in nested dicts/lists) by None."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------------------------
def cost_gpu_counts(gpus_per_node: int, max_gpus: int) -> tuple[int, ...]:
    """GPU counts searched by the cost objective: one node, doubling, up to ``max_gpus`` (always included)."""
    if max_gpus < gpus_per_node:
        return (max_gpus,)
    counts, n = [], gpus_per_node
    while n < max_gpus:
        counts.append(n)
        n *= 2
    counts.append(max_gpus)
    return tuple(counts)


def _check_args(objective: str, gpu_hour_price: float, mem_limit_gib: float | None,
                tokens: float | None = None) -> None:
    if objective not in OBJECTIVES:
        raise InputError(f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
    if objective in WHOLE_RUN and tokens is None:
        raise InputError(f"--objective {objective} ranks whole runs: give the token budget, --tokens N")
    if not (gpu_hour_price > 0 and np.isfinite(gpu_hour_price)):
        raise InputError(f"gpu_hour_price={gpu_hour_price!r} must be a positive number of dollars per GPU-hour")
    if mem_limit_gib is not None and not (mem_limit_gib > 0 and np.isfinite(mem_limit_gib)):
        raise InputError(f"mem_limit_gib={mem_limit_gib!r} must be a positive number of GiB")


def _evaluate(model: ModelSpec, cluster: Any, plans: PlanBatch, compute: Any, estimator: Estimator,
              bar: Any, stack: Any = None) -> list[Any]:
    chunks = []
    for start in range(0, len(plans), CHUNK):
        sub = plans.take(slice(start, start + CHUNK))
        chunks.append(estimator(model, cluster, sub, compute=compute, stack=stack))
        bar.update(len(sub))
    return chunks


def _columns(chunks: Sequence[Any], plans: PlanBatch) -> dict[str, np.ndarray]:
    optional = tuple(name for name in BAND_FIELDS if all(hasattr(c, name) for c in chunks))
    cols = {name: np.concatenate([np.asarray(getattr(c, name)) for c in chunks])
            for name in ESTIMATE_FIELDS + optional}
    for name in PLAN_FIELDS + ("global_batch",) + tuple(a for a in EXTRA_AXES if hasattr(plans, a)):
        cols[name] = getattr(plans, name)
    return cols


def _rank(cols: Mapping[str, np.ndarray], objective: str) -> np.ndarray:
    """Indices of all rows, best first (np.lexsort: the last key is the primary one). With whole-run columns
    (``tokens``), ``cost`` ranks the whole run's dollars; ``time-to-train`` the expected days; ``energy`` MWh."""
    run = "expected_days" in cols
    primary = {"time": lambda: cols["step_time_s"], "memory": lambda: cols["peak_memory_gib"],
               "cost": lambda: cols["cost_usd"] if run else cols["cost_per_mtok"],
               "time-to-train": lambda: cols["expected_days"], "energy": lambda: cols["energy_mwh"]}[objective]()
    # tie-breakers: fewer GPUs, then the plan fields ascending in PLAN_FIELDS order, except that the default
    # overlap=True goes before overlap=False; packed into one key that sorts like that tuple
    fields = _packed([~cols[name] if name == "overlap" else cols[name] for name in ("gpus",) + PLAN_FIELDS])
    return np.lexsort([fields, cols["peak_memory_gib"], cols["step_time_s"], primary, ~cols["fits_effective"]])


def _check_api(model: Any, clusters: Any, global_batch: Any, space: Any) -> None:
    """One InputError naming a wrongly typed or out-of-range argument of :func:`search` (issue 26)."""
    from ..limits import check_int
    from ..topology import Cluster

    if not isinstance(model, ModelSpec) and type(model).__name__ != "OpGraphModel":
        raise InputError(f"model={type(model).__name__} must be a ModelSpec (tpsim.load_model(...))")
    for c in clusters if isinstance(clusters, (list, tuple)) else (clusters,):
        if not isinstance(c, Cluster):
            raise InputError(f"clusters={type(c).__name__} must be a Cluster or a list of them "
                             "(tpsim.load_cluster(name, gpus=N))")
    check_int("global_batch", global_batch)
    if space is not None and not isinstance(space, SearchSpace):
        raise InputError(f"space={type(space).__name__} must be a SearchSpace")


def search(model: ModelSpec, clusters: Any, global_batch: int, *, space: SearchSpace | None = None,
           objective: str = "time", gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE,
           mem_limit_gib: float | None = None, include_unfit: bool = False, compute: Any = None,
           progress: bool = False, estimator: Estimator | None = None, stack: Any = None,
           tokens: float | None = None, reliability: Any = None) -> SearchResult:
    """Rank every valid plan of ``space`` on ``clusters`` (one Cluster, or one per GPU count) that the training
    ``stack`` (a profile, name or path; default megatron) can run; the others count under ``stack``.

    ``estimator`` defaults to :func:`tpsim.estimator.estimate_batch`; ``progress`` shows a tqdm bar on
    stderr when the search takes more than about a second. With ``tokens`` (and ``reliability``, a
    :class:`tpsim.train.Reliability` or fleet name) every plan also gets its whole-run figures
    (:func:`tpsim.train.plan_columns`), which the ``time-to-train``, ``energy`` and ``cost`` objectives rank.
    """
    from ..estimator.context import resolve_stack

    started = time.perf_counter()
    _check_args(objective, gpu_hour_price, mem_limit_gib, tokens)
    _check_api(model, clusters, global_batch, space)
    space = space or SearchSpace()
    estimator = estimator or _default_estimator()
    stack = resolve_stack(stack)
    if space.schedule is None:  # the stack's schedules, searched like vpp
        space = dataclasses.replace(space, schedule=tuple(stack.rules.schedules))
    clusters = tuple(clusters) if isinstance(clusters, (list, tuple)) else (clusters,)
    if not clusters:
        raise InputError("no cluster to search")
    enumerations = [enumerate_valid(model, int(c.num_gpus), global_batch, space, stack) for c in clusters]
    enumerated = sum(e.enumerated for e in enumerations)
    counts = np.zeros(len(REASONS), dtype=np.int64)
    stack_rejected: dict[str, int] = {}
    valid = []
    for e in enumerations:  # the plan rules' counts, then the stack's rules on the plans they let through
        counts[:e.codes.size] += e.codes
        refused, kept = _stack_refused(model, e.plans, stack)
        counts[STACK] += sum(refused.values())
        for key, n in refused.items():
            stack_rejected[key] = stack_rejected.get(key, 0) + n
        valid.append(kept)
    states_over = 0
    if not include_unfit and estimator is _default_estimator_fn():
        kept = [_without_oversized_states(model, c, v, compute, stack) for c, v in zip(clusters, valid)]
        valid = [k for k, _ in kept]
        states_over = sum(n for _, n in kept)
    evaluated = sum(len(v) for v in valid)
    rejected = reasons_from_counts(counts)

    from ..topology.progress import bar_or_silent

    parts, col_parts, offset = [], [], 0
    with bar_or_silent(progress, total=evaluated, desc="evaluating plans", unit="plan", unit_scale=True, delay=1.0,
                       leave=False) as bar:
        for p, (cluster, plans) in enumerate(zip(clusters, valid)):
            if not len(plans):
                continue
            chunks = _evaluate(model, cluster, plans, compute, estimator, bar, stack)
            offsets = tuple(offset + i * CHUNK for i in range(len(chunks)))
            parts.append(Part(cluster=cluster, chunks=tuple(chunks), offsets=offsets))
            cols = _columns(chunks, plans)
            cols["part"] = np.full(len(plans), len(parts) - 1, dtype=np.int32)
            cols["gpus"] = np.full(len(plans), int(cluster.num_gpus), dtype=np.int64)
            col_parts.append(cols)
            offset += len(plans)
    columns = _merge(col_parts)
    columns["fits"] = columns["fits"].astype(bool)
    over_limit = (columns["peak_memory_gib"] > mem_limit_gib) if mem_limit_gib else np.zeros_like(columns["fits"])
    columns["headroom_gib"] = _headroom_gib(parts, columns)
    tight = columns["fits"] & ~over_limit & (columns["headroom_gib"] < _planner_headroom_gib(parts, columns))
    columns["fits_effective"] = columns["fits"] & ~over_limit & ~tight
    columns["cost_per_mtok"] = columns["gpus"] * gpu_hour_price / 3600.0 / columns["tokens_per_s"] * 1e6
    if tokens is not None:
        reliability = _whole_run_columns(model, parts, columns, tokens, reliability, gpu_hour_price, objective)
    order = _rank(columns, objective)
    columns["twin_of"] = _twin_of(columns, order)
    twins = columns["twin_of"] != np.arange(columns["twin_of"].size)
    order = order[~twins[order]]
    if not include_unfit:
        order = order[columns["fits_effective"][order]]
        extra = np.zeros(len(REASONS), dtype=np.int64)
        extra[MEMORY] = int((~columns["fits"]).sum()) + states_over
        extra[MEM_LIMIT] = int((columns["fits"] & over_limit).sum())
        extra[HEADROOM] = int(tight.sum())
        for code in (MEMORY, MEM_LIMIT, HEADROOM):
            if extra[code]:
                rejected[REASONS[code].key] = int(extra[code])
    return SearchResult(model=model, objective=objective, gpu_hour_price=gpu_hour_price, parts=tuple(parts),
                        columns=columns, ranking=order, enumerated=enumerated, evaluated=evaluated,
                        rejected=rejected, elapsed_s=time.perf_counter() - started, mem_limit_gib=mem_limit_gib,
                        compute=compute, space=space, duplicates=int((twins & (columns["fits_effective"] | include_unfit)).sum()),
                        stack=stack, stack_rejected=stack_rejected,
                        left_out=sum(e.left_out for e in enumerations), tokens=tokens, reliability=reliability)


def planner_headroom_fraction() -> float:
    """The share of the device memory a recommended plan leaves free beyond its named memory terms
    (tpsim/data/memory.yaml ``planner_headroom_fraction``: the planner's policy; ``estimate``'s ``fits`` does
    not use it)."""
    from ..estimator.memory import process_memory

    return process_memory().planner_headroom_fraction


def _device_memory_gib(parts: Sequence[Part], columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row, its cluster's usable device memory, GiB."""
    part = np.asarray(columns.get("part", np.zeros(0, dtype=np.int32)), dtype=np.int64)
    per_part = np.array([p.cluster.device.usable_memory_bytes / 2.0 ** 30 for p in parts] or [np.inf])
    return per_part[part] if part.size else np.zeros(0)


def _headroom_gib(parts: Sequence[Part], columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row, the device memory its peak leaves free, GiB (negative: does not fit)."""
    return _device_memory_gib(parts, columns) - np.asarray(columns["peak_memory_gib"], dtype=float)


def _planner_headroom_gib(parts: Sequence[Part], columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row, the free memory the planner's headroom policy asks for, GiB."""
    return planner_headroom_fraction() * _device_memory_gib(parts, columns)


def _whole_run_columns(model: ModelSpec, parts: Sequence[Part], columns: dict[str, np.ndarray], tokens: float,
                       reliability: Any, gpu_hour_price: float, objective: str) -> Any:
    """Add the whole-run columns (RUN_COLUMNS) to ``columns``, part by part; returns the Reliability used."""
    from ..train import check_tokens, load_reliability, plan_columns

    tokens = check_tokens(tokens)
    rel = reliability if hasattr(reliability, "components") else load_reliability(reliability)
    n = columns["tp"].size
    for name in RUN_COLUMNS:
        columns[name] = np.full(n, np.inf)
    for p, part in enumerate(parts):
        rows = np.flatnonzero(columns["part"] == p)
        for name, values in plan_columns(model, part.cluster, columns, rows, tokens, rel, gpu_hour_price).items():
            columns[name][rows] = values
    if objective == "energy" and not np.isfinite(columns["energy_mwh"]).any() and n:
        raise InputError(f"--objective energy: no power figure for device {parts[0].cluster.device.name} "
                         "(add energy.device_power_w to a --reliability file)")
    return rel


def _twin_of(cols: Mapping[str, np.ndarray], order: np.ndarray) -> np.ndarray:
    """For every row, the row that stands for it in the ranking (itself when it has no better-ranked twin).

    Twins: rows equal in every plan field but the rank order and the overlap flag (and in the GPU count),
    whose step time and peak memory agree to :data:`TWIN_RTOL` (e.g. an overlap that hides nothing, dp = 1
    stages or ZeRO-3's per-layer reductions; or rank orders that put every group on the same links). Of each
    set of twins the best-ranked row (first in ``order``) stands for the others.

    Rows are sorted by (plan group, rank) with one integer key, and a new set starts where the group changes
    or the step time or memory moves by more than the tolerance. This relies on ``order`` ranking rows of one
    group with equal figures next to each other, as :func:`_rank` does (its keys before the plan fields are
    all functions of the step time and memory within a group); an order that did not would split a set, never
    merge rows that differ."""
    n = cols["tp"].size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    names = tuple(dict.fromkeys(k for k in ("gpus",) + PLAN_FIELDS + EXTRA_AXES if k in cols))
    group = _row_groups([np.asarray(cols[k], dtype=np.int64) for k in names if k not in VARIANT_FIELDS])
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    s = np.argsort(group.astype(np.int64) * n + position)
    t, m = cols["step_time_s"][s], cols["peak_memory_gib"][s]
    new = np.ones(n, dtype=bool)
    new[1:] = (group[s][1:] != group[s][:-1]) | ~_close(t[1:], t[:-1]) | ~_close(m[1:], m[:-1])
    first = s[new]  # each set's best-ranked row
    twin_of = np.empty(n, dtype=np.int64)
    twin_of[s] = first[np.cumsum(new) - 1]
    return twin_of


def _close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal to :data:`TWIN_RTOL` (exactly equal infinities count as equal)."""
    with np.errstate(invalid="ignore"):
        return (a == b) | (np.abs(a - b) <= TWIN_RTOL * np.maximum(np.abs(a), np.abs(b)))


def _row_groups(keys: list[np.ndarray]) -> np.ndarray:
    """Group id per row of equal ``keys`` (non-negative ints), dense from 0: one packed int64 key
    (:func:`_packed`), then its unique values."""
    return np.unique(_packed(keys), return_inverse=True)[1].reshape(-1)


def _packed(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per row that sorts like the tuple of ``columns`` (non-negative integers or booleans, first
    most significant): each column replaced by the rank of its value among the values present, then mixed
    radix; unique rows when even that could overflow."""
    codes, radix = [], []
    for col in columns:
        c = np.asarray(col, dtype=np.int64)
        present = np.zeros(int(c.max()) + 1 if c.size else 1, dtype=bool)
        present[c] = True
        rank = np.cumsum(present) - 1
        codes.append(rank[c])
        radix.append(int(present.sum()))
    if math.prod(radix) >= 2**62:
        return np.unique(np.stack(codes, 1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    flat = np.zeros(codes[0].size, dtype=np.int64)
    for c, r in zip(codes, radix):
        flat = flat * r + c
    return flat


def _merge(col_parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not col_parts:
        empty = {name: np.zeros(0) for name in ESTIMATE_FIELDS + PLAN_FIELDS + ("global_batch",)}
        empty.update(part=np.zeros(0, dtype=np.int32), gpus=np.zeros(0, dtype=np.int64),
                     fits=np.zeros(0, dtype=bool), twin_of=np.zeros(0, dtype=np.int64))
        for name in PLAN_FIELDS:
            empty[name] = np.zeros(0, dtype=bool if name in ("sp", "overlap") else np.int64)
        return empty
    if len(col_parts) == 1:
        return dict(col_parts[0])
    return {k: np.concatenate([c[k] for c in col_parts]) for k in col_parts[0]}


__all__ = ["search", "SearchResult", "RankedPlan", "OBJECTIVES", "cost_gpu_counts", "DEFAULT_GPU_HOUR_PRICE"]
