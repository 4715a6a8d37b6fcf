"""The sharding plan: TP x SP x PP (x VPP) x DP x ZeRO, micro-batching, recomputation, rank order.

A :class:`Plan` is torch-free and frozen. :func:`validate_plan` checks it against a model and a GPU count
and raises :class:`~tpsim.errors.PlanError` with a line naming the constraint and the numbers. Inside a
search, :func:`plan_violation` returns that line (or None) instead of raising, and :func:`violation_codes`
checks a whole :class:`PlanBatch` at once; all three read the one rule table :data:`RULES`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

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


# ---- validity rules: one table for single plans (the message) and batches (vectorized) -------------------
@dataclass(frozen=True)
class Rule:
    """One constraint on a plan. ``broken`` uses only operators that work on a :class:`Plan` (Python numbers)
    and on a :class:`PlanBatch` (numpy arrays) alike, so one expression serves ``tpsim estimate`` and the
    planner; ``message`` is the line a single plan gets, with the numbers."""

    key: str
    """identifier of the rejection reason (``tpsim plan --json``: ``rejected``)."""
    kind: str
    """"divisibility" or "structure"."""
    text: str
    """what the constraint says (``tpsim plan --why``)."""
    broken: Callable[[ModelSpec, Any, int], Any]
    """(model, plan or batch, GPU count) -> True / bool array where the plan breaks the rule."""
    message: Callable[[ModelSpec, Plan, int], str]
    needs_gpus: bool = False
    """checked only when the GPU count is known."""


def _micro_batches(p: Any) -> Any:
    return p.global_batch // (p.micro_batch * p.dp)


RULES: tuple[Rule, ...] = (
    Rule("gpus", "divisibility", "tp x pp x dp differs from the GPU count",
         lambda m, p, g: p.tp * p.pp * p.dp != g,
         lambda m, p, g: f"tp={p.tp} x pp={p.pp} x dp={p.dp} = {p.tp * p.pp * p.dp} != gpus={g}", needs_gpus=True),
    Rule("tp-heads", "divisibility", "tp does not divide the attention heads",
         lambda m, p, g: m.num_attention_heads % p.tp != 0,
         lambda m, p, g: f"tp={p.tp} does not divide num_attention_heads={m.num_attention_heads}"),
    Rule("tp-kv-heads", "divisibility", "tp does not divide the key/value heads (kv heads >= tp)",
         lambda m, p, g: (m.num_kv_heads >= p.tp) & (m.num_kv_heads % p.tp != 0),
         lambda m, p, g: (f"tp={p.tp} does not divide num_kv_heads={m.num_kv_heads} (kv heads below tp are "
                          f"replicated; at or above tp they must divide)")),
    Rule("tp-ffn", "divisibility", "tp does not divide the FFN hidden size",
         lambda m, p, g: m.ffn_hidden_size % p.tp != 0,
         lambda m, p, g: f"tp={p.tp} does not divide ffn_hidden_size={m.ffn_hidden_size}"),
    Rule("sp-needs-tp", "structure", "sequence parallelism needs tp > 1",
         lambda m, p, g: p.sp & (p.tp == 1),
         lambda m, p, g: "sequence parallelism needs tp > 1 (tp=1)"),
    Rule("sp-seq", "divisibility", "tp does not divide the sequence length (sequence parallelism)",
         lambda m, p, g: p.sp & (m.seq_len % p.tp != 0),
         lambda m, p, g: f"tp={p.tp} does not divide seq_len={m.seq_len} (sequence parallelism)"),
    Rule("vpp-needs-pp", "structure", "interleaving (vpp > 1) needs pp > 1",
         lambda m, p, g: (p.vpp > 1) & (p.pp == 1),
         lambda m, p, g: f"vpp={p.vpp} needs pp > 1 (pp=1)"),
    Rule("layers", "divisibility", "pp x vpp exceeds the number of layers",
         lambda m, p, g: p.pp * p.vpp > m.num_layers,
         lambda m, p, g: f"pp={p.pp} x vpp={p.vpp} = {p.pp * p.vpp} exceeds num_layers={m.num_layers}"),
    Rule("batch", "divisibility", "global batch is not a multiple of micro-batch x dp",
         lambda m, p, g: p.global_batch % (p.micro_batch * p.dp) != 0,
         lambda m, p, g: (f"global batch {p.global_batch} is not a multiple of micro-batch {p.micro_batch} "
                          f"x dp {p.dp}")),
    Rule("interleave-microbatches", "divisibility",
         "interleaved schedule needs the micro-batch count divisible by pp",
         lambda m, p, g: (p.vpp > 1) & (_micro_batches(p) % p.pp != 0),
         lambda m, p, g: (f"interleaved schedule needs micro-batches {_micro_batches(p)} divisible by "
                          f"pp={p.pp} (vpp={p.vpp})")),
    Rule("zero-needs-dp", "structure", "ZeRO needs dp > 1",
         lambda m, p, g: (p.zero > 0) & (p.dp == 1),
         lambda m, p, g: f"zero={p.zero} needs dp > 1 (dp=1)"),
)
"""Every plan constraint, in the order a plan is checked (the first broken rule names the reason). Adding a
constraint (cp, ep, a training stack's) is one row."""


def first_broken(model: ModelSpec, plan: Plan, num_gpus: int | None = None,
                 rules: tuple[Rule, ...] = RULES) -> Rule | None:
    """The first rule the plan breaks, or None."""
    for rule in rules:
        if rule.needs_gpus and num_gpus is None:
            continue
        if rule.broken(model, plan, num_gpus):
            return rule
    return None


def plan_violation(model: ModelSpec, plan: Plan, num_gpus: int | None = None,
                   rules: tuple[Rule, ...] = RULES) -> str | None:
    """The first constraint the plan breaks, as one line with the numbers; None if valid."""
    rule = first_broken(model, plan, num_gpus, rules)
    return None if rule is None else rule.message(model, plan, num_gpus)


def violation_codes(model: ModelSpec, batch: "PlanBatch", num_gpus: int | None = None,
                    rules: tuple[Rule, ...] = RULES) -> np.ndarray:
    """Per plan of the batch, 1 + the index of the first rule it breaks (0 = valid); int8 array."""
    n = len(batch)
    code = np.zeros(n, dtype=np.int8)
    for i in range(len(rules), 0, -1):  # the first broken rule wins: assign in reverse
        rule = rules[i - 1]
        if rule.needs_gpus and num_gpus is None:
            continue
        code[np.broadcast_to(np.asarray(rule.broken(model, batch, num_gpus), dtype=bool), (n,))] = i
    return code


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
        ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
        bools = lambda values: np.array(values, dtype=bool)  # noqa: E731
        return cls(tp=ints([p.tp for p in plans]), pp=ints([p.pp for p in plans]), vpp=ints([p.vpp for p in plans]),
                   dp=ints([p.dp for p in plans]), sp=bools([p.sp for p in plans]),
                   recompute=ints([RECOMPUTE.index(p.recompute) for p in plans]), zero=ints([p.zero for p in plans]),
                   micro_batch=ints([p.micro_batch for p in plans]),
                   global_batch=ints([p.global_batch for p in plans]), overlap=bools([p.overlap for p in plans]),
                   order=ints([_order_index(p.order) for p in plans]), dtype=plans[0].dtype,
                   attention=plans[0].attention)

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
