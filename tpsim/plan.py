"""The sharding plan: TP x SP x PP (x VPP) x DP x ZeRO, micro-batching, recomputation, rank order.

A :class:`Plan` is torch-free and frozen. :func:`validate_plan` checks it against a model and a GPU count
and raises :class:`~tpsim.errors.PlanError` with a line naming the constraint and the numbers. Inside a
search, :func:`plan_violation` returns that line (or None) instead of raising.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .errors import InputError, PlanError
from .hardware import DTYPES
from .model import ModelSpec

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")
DIMS = ("tp", "dp", "pp")
DEFAULT_ORDER = "tp-dp-pp"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One training plan. ``dp`` is derived: gpus / (tp x pp)."""

    tp: int = 1
    """tensor-parallel degree (Megatron column/row splits)."""
    pp: int = 1
    """pipeline stages."""
    vpp: int = 1
    """model chunks per pipeline rank (virtual pipeline size); > 1 means interleaved 1F1B."""
    dp: int = 1
    """data-parallel replicas."""
    sp: bool = False
    """sequence parallelism (needs tp > 1)."""
    recompute: str = "none"
    """none | selective (attention core, Korthikanti et al. 2022) | full (whole layer from its input)."""
    zero: int = 0
    """0: none; 1: optimizer states sharded over dp; 2: + gradients; 3: + weights."""
    micro_batch: int = 1
    """sequences per micro-batch."""
    global_batch: int = 1
    """sequences per step over all replicas."""
    dtype: str = "bf16"
    """GEMM precision: fp32 | tf32 | bf16 | fp16 | fp8."""
    overlap: bool = True
    """DP gradient reduction overlapped with the backward pass of the last micro-batch."""
    order: str = DEFAULT_ORDER
    """rank order, innermost first (Megatron-Core RankGenerator style)."""
    attention: str = "flash"
    """flash (scores never stored) | unfused (s x s scores stored and moved through memory)."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per replica per step: global / (micro x dp)."""
        return self.global_batch // (self.micro_batch * self.dp)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """Compact label, e.g. ``tp8 pp16 dp8 sp sel z1 mb1``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        parts.append(f"dp{self.dp}")
        if self.sp:
            parts.append("sp")
        parts.append({"none": "", "selective": "sel", "full": "full"}[self.recompute])
        if self.zero:
            parts.append(f"z{self.zero}")
        parts.append(f"mb{self.micro_batch}")
        if not self.overlap:
            parts.append("no-ovl")
        if self.order != DEFAULT_ORDER:
            parts.append(self.order)
        return " ".join(p for p in parts if p)


def parse_order(order: str) -> tuple[str, ...]:
    """``"tp-dp-pp"`` -> ("tp", "dp", "pp"); must be a permutation of tp, dp, pp."""
    dims = tuple(order.lower().split("-"))
    if sorted(dims) != sorted(DIMS):
        raise InputError(f"order={order!r} must be a permutation of tp, dp, pp joined by '-' (e.g. tp-dp-pp)")
    return dims


def _check_types(plan: Plan) -> None:
    for name in ("tp", "pp", "vpp", "dp", "micro_batch", "global_batch"):
        value = getattr(plan, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"{name}={value!r} must be a positive integer")
    if plan.recompute not in RECOMPUTE:
        raise InputError(f"recompute={plan.recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if plan.zero not in (0, 1, 2, 3):
        raise InputError(f"zero={plan.zero!r} is not one of 0, 1, 2, 3")
    if plan.dtype not in DTYPES:
        raise InputError(f"dtype={plan.dtype!r} is not one of {', '.join(DTYPES)}")
    if plan.attention not in ATTENTION:
        raise InputError(f"attention={plan.attention!r} is not one of {', '.join(ATTENTION)}")
    parse_order(plan.order)


def plan_violation(model: ModelSpec, plan: Plan, num_gpus: int | None = None) -> str | None:
    """The first constraint the plan breaks, as one line with the numbers; None if valid."""
    if num_gpus is not None and plan.tp * plan.pp * plan.dp != num_gpus:
        return f"tp={plan.tp} x pp={plan.pp} x dp={plan.dp} = {plan.tp * plan.pp * plan.dp} != gpus={num_gpus}"
    if model.num_attention_heads % plan.tp:
        return f"tp={plan.tp} does not divide num_attention_heads={model.num_attention_heads}"
    if model.num_kv_heads >= plan.tp and model.num_kv_heads % plan.tp:
        return (f"tp={plan.tp} does not divide num_kv_heads={model.num_kv_heads} (kv heads below tp are "
                f"replicated; at or above tp they must divide)")
    if model.ffn_hidden_size % plan.tp:
        return f"tp={plan.tp} does not divide ffn_hidden_size={model.ffn_hidden_size}"
    if plan.sp and plan.tp == 1:
        return "sequence parallelism needs tp > 1 (tp=1)"
    if plan.sp and model.seq_len % plan.tp:
        return f"tp={plan.tp} does not divide seq_len={model.seq_len} (sequence parallelism)"
    if plan.vpp > 1 and plan.pp == 1:
        return f"vpp={plan.vpp} needs pp > 1 (pp=1)"
    if plan.pp * plan.vpp > model.num_layers:
        return f"pp={plan.pp} x vpp={plan.vpp} = {plan.pp * plan.vpp} exceeds num_layers={model.num_layers}"
    per_step = plan.micro_batch * plan.dp
    if plan.global_batch % per_step:
        return (f"global batch {plan.global_batch} is not a multiple of micro-batch {plan.micro_batch} "
                f"x dp {plan.dp}")
    if plan.vpp > 1 and plan.num_microbatches % plan.pp:
        return (f"interleaved schedule needs micro-batches {plan.num_microbatches} divisible by "
                f"pp={plan.pp} (vpp={plan.vpp})")
    if plan.zero and plan.dp == 1:
        return f"zero={plan.zero} needs dp > 1 (dp=1)"
    return None


def validate_plan(model: ModelSpec, plan: Plan, num_gpus: int | None = None) -> Plan:
    """Raise :class:`PlanError` naming the first broken constraint; return the plan otherwise."""
    _check_types(plan)
    problem = plan_violation(model, plan, num_gpus)
    if problem:
        raise PlanError(problem)
    return plan


def make_plan(model: ModelSpec, num_gpus: int, *, global_batch: int | None = None,
              **fields: Any) -> Plan:
    """Build a plan from keyword fields; dp is derived from the GPU count; defaults from the model preset."""
    values: dict[str, Any] = {k: v for k, v in model.default_plan.items() if k in _PLAN_FIELDS}
    values.update({k: v for k, v in fields.items() if v is not None})
    unknown = set(values) - _PLAN_FIELDS
    if unknown:
        raise InputError(f"unknown plan field(s): {', '.join(sorted(unknown))}")
    tp, pp = int(values.get("tp", 1)), int(values.get("pp", 1))
    for name, value in (("tp", tp), ("pp", pp)):
        if value <= 0:
            raise InputError(f"{name}={value} must be a positive integer")
    if num_gpus <= 0:
        raise InputError(f"gpus={num_gpus} must be a positive integer")
    if num_gpus % (tp * pp):
        raise PlanError(f"tp={tp} x pp={pp} = {tp * pp} does not divide gpus={num_gpus}")
    values["dp"] = num_gpus // (tp * pp)
    gbs = global_batch or values.get("global_batch") or model.global_batch
    if not gbs:
        gbs = values["dp"] * int(values.get("micro_batch", 1))
    values["global_batch"] = int(gbs)
    if values.get("vpp") is None:
        values["vpp"] = 1
    plan = Plan(**values)
    return validate_plan(model, plan, num_gpus)


_PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}


def plan_from_mapping(data: Mapping[str, Any]) -> Plan:
    """Inverse of :meth:`Plan.to_dict` (JSON round trip); unknown keys are an input error."""
    unknown = set(data) - _PLAN_FIELDS
    if unknown:
        raise InputError(f"unknown plan field(s): {', '.join(sorted(unknown))}")
    plan = Plan(**data)
    _check_types(plan)
    return plan


ORDERS = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")


@dataclass(frozen=True)
class PlanBatch:
    """Many plans as numpy arrays (struct of arrays) for the vectorized estimator.

    ``recompute`` is coded 0 none / 1 selective / 2 full; ``order`` indexes :data:`ORDERS`. ``dtype`` and
    ``attention`` are shared by the whole batch. Build with :meth:`from_plans` or directly from arrays.
    """

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    dp: np.ndarray
    sp: np.ndarray
    recompute: np.ndarray
    zero: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    overlap: np.ndarray
    order: np.ndarray
    dtype: str = "bf16"
    attention: str = "flash"

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @classmethod
    def from_arrays(cls, *, dtype: str = "bf16", attention: str = "flash", **arrays: Any) -> "PlanBatch":
        n = max(np.size(v) for v in arrays.values())
        defaults = dict(tp=1, pp=1, vpp=1, dp=1, sp=False, recompute=0, zero=0, micro_batch=1, global_batch=1,
                        overlap=True, order=0)
        cols = {}
        for key, default in defaults.items():
            value = np.asarray(arrays.get(key, default))
            dt = bool if key in ("sp", "overlap") else np.int64
            cols[key] = np.broadcast_to(value, (n,)).astype(dt)
        return cls(**cols, dtype=dtype, attention=attention)

    @classmethod
    def from_plans(cls, plans: "list[Plan]") -> "PlanBatch":
        if not plans:
            raise InputError("an empty list of plans")
        dtypes = {p.dtype for p in plans}
        attentions = {p.attention for p in plans}
        if len(dtypes) > 1 or len(attentions) > 1:
            raise InputError("a plan batch shares one dtype and one attention kind")
        return cls.from_arrays(
            dtype=plans[0].dtype, attention=plans[0].attention,
            tp=[p.tp for p in plans], pp=[p.pp for p in plans], vpp=[p.vpp for p in plans],
            dp=[p.dp for p in plans], sp=[p.sp for p in plans],
            recompute=[RECOMPUTE.index(p.recompute) for p in plans], zero=[p.zero for p in plans],
            micro_batch=[p.micro_batch for p in plans], global_batch=[p.global_batch for p in plans],
            overlap=[p.overlap for p in plans], order=[_order_index(p.order) for p in plans])

    def plan(self, i: int) -> Plan:
        """The i-th plan as a :class:`Plan`."""
        return Plan(tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]), dp=int(self.dp[i]),
                    sp=bool(self.sp[i]), recompute=RECOMPUTE[int(self.recompute[i])], zero=int(self.zero[i]),
                    micro_batch=int(self.micro_batch[i]), global_batch=int(self.global_batch[i]),
                    dtype=self.dtype, overlap=bool(self.overlap[i]), order=ORDERS[int(self.order[i])],
                    attention=self.attention)

    def take(self, index: np.ndarray) -> "PlanBatch":
        """Sub-batch of the rows ``index`` (boolean mask or integer indices)."""
        fields = {f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)
                  if f.name not in ("dtype", "attention")}
        return PlanBatch(**fields, dtype=self.dtype, attention=self.attention)


def _order_index(order: str) -> int:
    dims = "-".join(parse_order(order))
    return ORDERS.index(dims)
