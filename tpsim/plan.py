"""The sharding plan: TP x SP x CP x PP (x VPP) x DP x ZeRO, expert parallelism (EP, expert TP) for mixtures of
experts, micro-batching, recomputation, rank order.

A :class:`Plan` is torch-free and frozen. :func:`validate_plan` checks it against a model and a GPU count
and raises :class:`~tpsim.errors.PlanError` with a line naming the constraint and the numbers. Inside a
search, :func:`plan_violation` returns that line (or None) instead of raising, and :func:`violation_codes`
checks a whole :class:`PlanBatch` at once; all three read the one rule table :data:`RULES`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Any, Callable, Mapping

import numpy as np

from .errors import InputError, PlanError
from .hardware import DTYPES
from .model import ModelSpec
from .pipeline import EVEN_PP, INTERLEAVED, MIN_MICROBATCHES_PER_STAGE, REQUIRED_CHUNKS, SCHEDULES
from .pipeline import code as _schedule_code

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")
CP_KINDS = ("ring", "a2a")
"""context-parallel kinds (PlanBatch code 0, 1): ``ring`` = point-to-point K/V exchange overlapped with the
attention (Megatron-Core / TransformerEngine ``p2p``, causal load balancing), ``a2a`` = Ulysses all-to-all of
the q, k, v and output activations (TransformerEngine ``a2a``)."""
DIMS = ("tp", "dp", "pp")
"""the dense axes of the first wave; a three-axis rank order places cp right after tp."""
AXES = ("tp", "cp", "dp", "pp")
"""the dense plan axes that place ranks (docs/SCHEMAS.md section 1); experts re-factor tp x cp x dp."""
DEFAULT_ORDER = "tp-dp-pp"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One training plan. ``dp`` is derived: gpus / (tp x pp)."""

    tp: int = 1
    """tensor-parallel degree (Megatron column/row splits)."""
    cp: int = 1
    """context-parallel degree: the sequence split over cp ranks."""
    cp_kind: str = "ring"
    """ring (p2p K/V exchange overlapped with attention) | a2a (Ulysses all-to-all); see :data:`CP_KINDS`."""
    ep: int = 1
    """expert-parallel degree (mixture-of-experts models): routed experts split over ep ranks."""
    etp: int = 0
    """expert tensor-parallel degree; 0 means equal to tp (Megatron-Core's default)."""
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
    """GEMM precision: fp32 | tf32 | bf16 | fp16 | fp8 | mxfp8 | nvfp4 (:data:`tpsim.hardware.DTYPES`)."""
    overlap: bool = True
    """DP gradient reduction overlapped with the backward pass of the last micro-batch."""
    order: str = DEFAULT_ORDER
    """rank order, innermost first (Megatron-Core RankGenerator style)."""
    attention: str = "flash"
    """flash (scores never stored) | unfused (s x s scores stored and moved through memory)."""
    schedule: str = "1f1b"
    """pipeline schedule, one of :data:`SCHEDULES` (``1f1b`` with vpp > 1 is interleaved 1F1B)."""
    tp_overlap: bool = False
    """TP communication overlapped with the GEMMs (Megatron ``--tp-comm-overlap``, torchtitan async TP)."""
    pp_first: int = 0
    """decoder layers on the first pipeline stage (Megatron ``--decoder-first-pipeline-num-layers``); 0: even."""
    pp_last: int = 0
    """decoder layers on the last pipeline stage (``--decoder-last-pipeline-num-layers``); 0: even."""
    pp_embedding: bool = False
    """the embedding counts as one layer in the pipeline split (``--account-for-embedding-in-pipeline-split``)."""
    pp_loss: bool = False
    """the output layer and loss count as one layer (``--account-for-loss-in-pipeline-split``)."""
    pp_layout: tuple[int, ...] = ()
    """decoder layers of every model chunk in model order (chunk k on pipeline rank k mod pp; the embedding on
    the first chunk, the output layer and loss on the last), ``pp x vpp`` counts that sum to the model's layers:
    a split the other fields cannot express (Megatron ``--pipeline-model-parallel-layout``, torchtitan
    ``module_fqns_per_model_part``); () : the split of the fields above."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree with 0 resolved to tp."""
        return self.etp or self.tp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: tp x cp x dp / (etp x ep) (Megatron-Core expert rank generator)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per replica per step: global / (micro x dp)."""
        return self.global_batch // (self.micro_batch * self.dp)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """Compact label, e.g. ``tp8 pp16 dp8 sp sel z1 mb1``."""
        parts = [f"tp{self.tp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}" + ("/a2a" if self.cp_kind == "a2a" else ""))
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        parts.append(f"pp{self.pp}")
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        if self.pp_layout:
            parts.append(f"layout[{layout_text(self.pp_layout)}]")
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
    """``"tp-dp-pp"`` -> ("tp", "dp", "pp"): a permutation of tp, dp, pp (cp right after tp) or of tp, cp, dp,
    pp, as written."""
    dims = tuple(str(order).lower().split("-"))
    if sorted(dims) != sorted(DIMS) and sorted(dims) != sorted(AXES):
        raise InputError(f"order={order!r} must be a permutation of tp, dp, pp (or tp, cp, dp, pp) joined by '-' "
                         f"(e.g. tp-dp-pp)")
    return dims


def full_order(order: str) -> tuple[str, ...]:
    """The four dense axes of a rank order, innermost first: a three-axis order gets cp right after tp
    (Megatron-Core ``RankGenerator`` default ``tp-cp-ep-dp-pp``; docs/SCHEMAS.md section 1)."""
    dims = parse_order(order)
    if "cp" in dims:
        return dims
    i = dims.index("tp")
    return dims[:i + 1] + ("cp",) + dims[i + 1:]


def canonical_order(order: str) -> str:
    """The :data:`ORDERS` name of a rank order: three axes when cp sits right after tp, else all four."""
    dims = full_order(order)
    if dims.index("cp") == dims.index("tp") + 1:
        return "-".join(d for d in dims if d != "cp")
    return "-".join(dims)


def _count(name: str, value: Any, minimum: int = 1, limit: str | None = None) -> None:
    """A plan count: a real int (not a bool or a float) within the CLI's bound (tpsim/limits.py ``limit``,
    default the field's own entry): the Python API refuses what the command line refuses (issue 26)."""
    from .limits import LIMITS, check_int

    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(f"{name}={value!r} must be a {'positive' if minimum else 'non-negative'} integer")
    check_int(name, value, minimum=minimum, maximum=LIMITS.get(limit or name))


def _check_types(plan: Plan) -> None:
    for name in ("tp", "pp", "vpp", "dp", "micro_batch", "global_batch"):
        _count(name, getattr(plan, name))
    if plan.recompute not in RECOMPUTE:
        raise InputError(f"recompute={plan.recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if plan.zero not in (0, 1, 2, 3):
        raise InputError(f"zero={plan.zero!r} is not one of 0, 1, 2, 3")
    if plan.dtype not in DTYPES:
        raise InputError(f"dtype={plan.dtype!r} is not one of {', '.join(DTYPES)}")
    if plan.attention not in ATTENTION:
        raise InputError(f"attention={plan.attention!r} is not one of {', '.join(ATTENTION)}")
    if plan.schedule not in SCHEDULES:
        raise InputError(f"schedule={plan.schedule!r} is not one of {', '.join(SCHEDULES)}")
    for name in ("pp_first", "pp_last"):
        value = getattr(plan, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{name}={value!r} must be a non-negative integer (0: even split)")
        _count(name, value, minimum=0, limit="pp_layers")
    for name in ("tp_overlap", "pp_embedding", "pp_loss"):
        if not isinstance(getattr(plan, name), bool):
            raise InputError(f"{name}={getattr(plan, name)!r} must be true or false")
    _check_layout(plan.pp_layout)
    for name in ("cp", "ep"):
        _count(name, getattr(plan, name))
    if not isinstance(plan.etp, int) or isinstance(plan.etp, bool) or plan.etp < 0:
        raise InputError(f"etp={plan.etp!r} must be a positive integer (or 0: equal to tp)")
    if plan.cp_kind not in CP_KINDS:
        raise InputError(f"cp_kind={plan.cp_kind!r} is not one of {', '.join(CP_KINDS)}")
    parse_order(plan.order)


def _check_layout(layout: Any) -> None:
    """pp_layout: a tuple of non-negative layer counts (one per model chunk), at most LIMITS["pp_chunks"]."""
    from .limits import LIMITS

    if not isinstance(layout, tuple) or any(not isinstance(n, int) or isinstance(n, bool) or n < 0
                                            for n in layout):
        raise InputError(f"pp_layout={layout!r} must be a tuple of non-negative layer counts, one per model chunk")
    if len(layout) > LIMITS["pp_chunks"]:
        raise InputError(f"pp_layout has {len(layout)} chunks: at most {LIMITS['pp_chunks']}")
    for n in layout:
        _count("pp_layout", n, minimum=0, limit="pp_layers")


_LAYOUTS: dict[int, tuple[int, ...]] = {0: ()}
"""PlanBatch ``pp_layout`` code -> the layout (0: none). Codes are content hashes, the same in every
process, so that kept patterns and the plans of any process agree."""


def layout_code(layout: tuple[int, ...]) -> int:
    """The PlanBatch column value of a plan's ``pp_layout`` (registered for :func:`layout_of`)."""
    if not layout:
        return 0
    import hashlib

    code = 1 + int.from_bytes(hashlib.blake2b(",".join(map(str, layout)).encode(), digest_size=7).digest(), "big")
    _LAYOUTS.setdefault(code, tuple(layout))
    return code


def layout_of(code: Any) -> tuple[int, ...]:
    """The layout of a PlanBatch ``pp_layout`` code (:func:`layout_code`)."""
    return _LAYOUTS[int(code)]


def _layout_stat(p: Any, stat: Callable[[tuple[int, ...]], int]) -> Any:
    """``stat`` (len: chunks, sum: decoder layers) of each plan's pp_layout (0: none)."""
    if isinstance(p, Plan):
        return stat(p.pp_layout)
    codes = np.asarray(p.pp_layout)
    if not codes.any():
        return np.zeros(codes.shape, dtype=np.int64)
    return np.array([stat(layout_of(c)) for c in codes.tolist()], dtype=np.int64)


def _has_layout(p: Any) -> Any:
    return bool(p.pp_layout) if isinstance(p, Plan) else np.asarray(p.pp_layout) != 0


def parse_layout(text: str, where: str = "pp_layout") -> tuple[int, ...]:
    """A pipeline layout as the command line and the runs CSV give it: decoder layers per model chunk joined
    by commas (``3,2,2,...``), or a Megatron ``--pipeline-model-parallel-layout`` string (``Et*3|(tt|)*29m|L``:
    its decoder layers per stage). One line naming ``where`` and the value otherwise."""
    import re

    from .limits import LIMITS, show

    raw = str(text).strip()
    if not raw:
        raise InputError(f"{where} is empty: give decoder layers per model chunk (3,2,2) or a Megatron layout")
    if re.fullmatch(r"[0-9]+(\s*,\s*[0-9]+)*", raw):
        if raw.count(",") >= LIMITS["pp_chunks"]:
            raise InputError(f"{where}: more than {LIMITS['pp_chunks']} model chunks")
        layout = tuple(int(x) for x in raw.split(","))
    else:
        from .pipeline import layout_chunks

        try:
            if "E" not in raw or "L" not in raw:  # Megatron-Core: the embedding first, the loss last
                raise ValueError(raw)
            layout = layout_chunks(raw)
        except (ValueError, re.error):
            raise InputError(f"{where}={show(raw)} is neither decoder layers per model chunk (3,2,2) nor a "
                             f"Megatron pipeline layout of E, t, m, L and |") from None
    try:
        _check_layout(layout)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return layout


def layout_text(layout: tuple[int, ...]) -> str:
    """A layout as the command line and the runs CSV write it: layer counts joined by commas."""
    return ",".join(str(n) for n in layout)


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


def _etp(p: Any) -> Any:
    """Expert tensor-parallel degree with 0 resolved to tp (plans and batches alike)."""
    return p.etp + (p.etp == 0) * p.tp


def _a2a(p: Any) -> Any:
    """cp_kind is a2a (a Plan's string, a PlanBatch's code 1)."""
    return p.cp_kind == "a2a" if isinstance(p.cp_kind, str) else p.cp_kind == 1


def _windowed(m: ModelSpec) -> bool:
    """Some layer's sliding window is shorter than the sequence."""
    return bool(m.sliding_window) and m.sliding_window < m.seq_len and len(m.full_attention_layers) < m.num_layers


def _flag(x: Any) -> Any:
    """A bool field of a plan or a batch column, usable with ``&`` and ``|``."""
    return np.asarray(x, dtype=bool) if not isinstance(x, bool) else x


def _free_ranks(p: Any) -> Any:
    """Pipeline ranks whose layers the split chooses (those without pp_first / pp_last)."""
    return p.pp - (p.pp_first > 0) - (p.pp_last > 0)


def _free_slots(m: ModelSpec, p: Any) -> Any:
    """Layer slots of those ranks: the other layers, the embedding and the loss where they count."""
    return (m.num_layers - p.pp_first - p.pp_last + (_flag(p.pp_embedding) & (p.pp_first == 0))
            + (_flag(p.pp_loss) & (p.pp_last == 0)))


def _split_text(p: Plan) -> str:
    parts = [f"{k}={getattr(p, k)}" for k in ("pp_first", "pp_last") if getattr(p, k)]
    parts += [k for k in ("pp_embedding", "pp_loss") if getattr(p, k)]
    return " ".join(parts)


def _gpus_text(p: Plan) -> str:
    cp = f" x cp={p.cp}" if p.cp > 1 else ""
    return f"tp={p.tp}{cp} x pp={p.pp} x dp={p.dp} = {p.num_gpus}"


RULES: tuple[Rule, ...] = (
    Rule("gpus", "divisibility", "tp x cp x pp x dp differs from the GPU count",
         lambda m, p, g: p.tp * p.cp * p.pp * p.dp != g,
         lambda m, p, g: f"{_gpus_text(p)} != gpus={g}", needs_gpus=True),
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
    Rule("sp-seq", "divisibility", "tp (x cp) does not divide the sequence length (sequence parallelism)",
         lambda m, p, g: p.sp & (m.seq_len % (p.tp * p.cp) != 0),
         lambda m, p, g: (f"tp={p.tp} does not divide seq_len={m.seq_len} (sequence parallelism)" if p.cp == 1 else
                          f"tp={p.tp} x cp={p.cp} does not divide seq_len={m.seq_len} (sequence parallelism splits "
                          f"each context-parallel rank's tokens)")),
    Rule("vpp-needs-pp", "structure", "interleaving (vpp > 1) needs pp > 1",
         lambda m, p, g: (p.vpp > 1) & (p.pp == 1),
         lambda m, p, g: f"vpp={p.vpp} needs pp > 1 (pp=1)"),
    Rule("layers", "divisibility", "pp x vpp exceeds the number of layers (+2: embedding and output as chunks)",
         lambda m, p, g: p.pp * p.vpp > m.num_layers + 2,
         lambda m, p, g: (f"pp={p.pp} x vpp={p.vpp} = {p.pp * p.vpp} exceeds num_layers={m.num_layers} + 2 (one "
                          f"chunk per layer, the embedding and the output layer at most)")),
    # uneven pipeline stages (Megatron-Core get_num_layers_to_build)
    Rule("pp-split-needs-pp", "structure", "an uneven pipeline split needs pp > 1",
         lambda m, p, g: (p.pp == 1) & ((p.pp_first > 0) | (p.pp_last > 0) | _flag(p.pp_embedding)
                                        | _flag(p.pp_loss)),
         lambda m, p, g: f"{_split_text(p)} needs pp > 1 (pp={p.pp})"),
    Rule("pp-split-edges", "structure", "the first (last) stage's layers given and the embedding (loss) counted",
         lambda m, p, g: ((p.pp_first > 0) & _flag(p.pp_embedding)) | ((p.pp_last > 0) & _flag(p.pp_loss)),
         lambda m, p, g: (f"{_split_text(p)}: give the first (last) stage's layers or count the embedding (loss) "
                          f"as a layer, not both (Megatron-LM refuses the pair)")),
    Rule("pp-split-layers", "divisibility", "the first and last stages' layers leave none or too few for the rest",
         lambda m, p, g: (p.pp_first + p.pp_last > m.num_layers)
         | ((p.pp == 2) & (p.pp_first > 0) & (p.pp_last > 0) & (p.pp_first + p.pp_last != m.num_layers))
         | (((p.pp_first > 0) | (p.pp_last > 0)) & (_free_ranks(p) > 0) & (_free_slots(m, p) < _free_ranks(p))),
         lambda m, p, g: (f"pp_first={p.pp_first} + pp_last={p.pp_last} with pp={p.pp}: the stages must hold "
                          f"num_layers={m.num_layers} exactly, at most all of them on the first and last, and "
                          f"leave each other stage a layer")),
    # an explicit pipeline layout (Megatron-Core --pipeline-model-parallel-layout)
    Rule("pp-layout-needs-pp", "structure", "a pipeline layout needs pp > 1",
         lambda m, p, g: (p.pp == 1) & _has_layout(p),
         lambda m, p, g: f"pp_layout={layout_text(p.pp_layout)} needs pp > 1 (pp={p.pp})"),
    Rule("pp-layout-fields", "structure", "a pipeline layout and the uneven-split fields together",
         lambda m, p, g: _has_layout(p) & ((p.pp_first > 0) | (p.pp_last > 0) | _flag(p.pp_embedding)
                                           | _flag(p.pp_loss)),
         lambda m, p, g: (f"pp_layout={layout_text(p.pp_layout)} with {_split_text(p)}: the layout gives every "
                          f"chunk's layers; give it or the split fields, not both")),
    Rule("pp-layout-chunks", "structure", "a pipeline layout without one entry per model chunk (pp x vpp)",
         lambda m, p, g: _has_layout(p) & (_layout_stat(p, len) != p.pp * p.vpp),
         lambda m, p, g: (f"pp_layout has {len(p.pp_layout)} chunks: pp={p.pp} x vpp={p.vpp} needs "
                          f"{p.pp * p.vpp}")),
    Rule("pp-layout-layers", "structure", "a pipeline layout that does not hold the model's layers exactly",
         lambda m, p, g: _has_layout(p) & (_layout_stat(p, sum) != m.num_layers),
         lambda m, p, g: (f"pp_layout={layout_text(p.pp_layout)} holds {sum(p.pp_layout)} layers: the model has "
                          f"num_layers={m.num_layers}")),
    Rule("batch", "divisibility", "global batch is not a multiple of micro-batch x dp",
         lambda m, p, g: p.global_batch % (p.micro_batch * p.dp) != 0,
         lambda m, p, g: (f"global batch {p.global_batch} is not a multiple of micro-batch {p.micro_batch} "
                          f"x dp {p.dp}")),
    # pipeline schedules (tpsim/pipeline.py; without a pipeline, pp = 1, the schedule does not matter)
    Rule("schedule-vpp", "structure", "the pipeline schedule needs another number of model chunks per rank",
         lambda m, p, g: (p.pp > 1) & (REQUIRED_CHUNKS[_schedule_code(p.schedule)] > 0)
         & (p.vpp != REQUIRED_CHUNKS[_schedule_code(p.schedule)]),
         lambda m, p, g: (f"schedule={p.schedule} needs vpp={REQUIRED_CHUNKS[_schedule_code(p.schedule)]} "
                          f"(vpp={p.vpp}; "
                          f"{'two model chunks per rank in a V' if REQUIRED_CHUNKS[_schedule_code(p.schedule)] == 2 else 'one model chunk per rank'})")),
    Rule("schedule-even-pp", "structure", "DualPipe needs an even pp",
         lambda m, p, g: (p.pp > 1) & EVEN_PP[_schedule_code(p.schedule)] & (p.pp % 2 == 1),
         lambda m, p, g: f"schedule={p.schedule} needs an even pp (pp={p.pp}: DualPipe feeds both ends)"),
    Rule("schedule-microbatches", "divisibility", "the pipeline schedule needs more micro-batches",
         lambda m, p, g: (p.pp > 1)
         & (_micro_batches(p) < MIN_MICROBATCHES_PER_STAGE[_schedule_code(p.schedule)] * p.pp),
         lambda m, p, g: (f"schedule={p.schedule} needs micro-batches >= "
                          f"{MIN_MICROBATCHES_PER_STAGE[_schedule_code(p.schedule)]} x pp = "
                          f"{MIN_MICROBATCHES_PER_STAGE[_schedule_code(p.schedule)] * p.pp} "
                          f"(micro-batches {_micro_batches(p)})")),
    Rule("interleave-microbatches", "divisibility",
         "interleaved schedule needs the micro-batch count divisible by pp",
         lambda m, p, g: (p.vpp > 1) & INTERLEAVED[_schedule_code(p.schedule)] & (_micro_batches(p) % p.pp != 0),
         lambda m, p, g: (f"interleaved schedule needs micro-batches {_micro_batches(p)} divisible by "
                          f"pp={p.pp} (vpp={p.vpp})")),
    Rule("zero-needs-dp", "structure", "ZeRO needs dp x cp > 1 (Megatron shards over the dp x cp group)",
         lambda m, p, g: (p.zero > 0) & (p.dp * p.cp == 1),
         lambda m, p, g: f"zero={p.zero} needs dp > 1 (dp=1)"),
    # context parallelism: Megatron-LM validate_args and TransformerEngine attn_forward_func_with_cp
    Rule("cp-seq", "divisibility", "the sequence is not a multiple of 2 x cp (causal load balancing)",
         lambda m, p, g: (p.cp > 1) & (m.seq_len % (2 * p.cp) != 0),
         lambda m, p, g: (f"seq_len={m.seq_len} is not a multiple of 2 x cp = {2 * p.cp} (each context-parallel "
                          f"rank holds two of 2 x cp chunks: Megatron-LM validate_args)")),
    Rule("cp-a2a-heads", "divisibility", "all-to-all context parallelism: tp x cp does not divide the heads",
         lambda m, p, g: (p.cp > 1) & _a2a(p) & (
             (m.num_attention_heads % (p.tp * p.cp) != 0) | (np.maximum(m.num_kv_heads // p.tp, 1) % p.cp != 0)),
         lambda m, p, g: (f"cp={p.cp} with cp_kind=a2a needs tp x cp = {p.tp * p.cp} to divide "
                          f"num_attention_heads={m.num_attention_heads} and cp to divide the kv heads per TP rank "
                          f"({max(m.num_kv_heads // p.tp, 1)}): the all-to-all scatters heads")),
    Rule("cp-a2a-mla", "structure", "all-to-all context parallelism does not run multi-head latent attention",
         lambda m, p, g: (p.cp > 1) & _a2a(p) & (m.attention_kind == "mla"),
         lambda m, p, g: (f"cp={p.cp} with cp_kind=a2a: TransformerEngine runs multi-head latent attention (k and v "
                          f"head dims differ) only with the ring (p2p) kind")),
    Rule("cp-ring-window", "structure", "ring context parallelism does not run sliding-window attention",
         lambda m, p, g: (p.cp > 1) & ~np.asarray(_a2a(p), dtype=bool) & _windowed(m),
         lambda m, p, g: (f"cp={p.cp} with cp_kind=ring: TransformerEngine runs sliding-window attention "
                          f"(sliding_window={m.sliding_window}) only with the a2a (or all-gather) kind")),
    # expert parallelism: Megatron-LM validate_args, Megatron-Core MoELayer and its expert rank generator
    Rule("ep-needs-moe", "structure", "expert parallelism (ep, etp) needs a mixture-of-experts model",
         lambda m, p, g: (not m.is_moe) & ((p.ep > 1) | ((p.etp != 0) & (p.etp != p.tp))),
         lambda m, p, g: f"ep={p.ep}{f' etp={p.etp}' if p.etp else ''}: model {m.name} has no experts "
                         "(num_experts=0)"),
    Rule("ep-experts", "divisibility", "ep does not divide the number of experts",
         lambda m, p, g: m.is_moe & (max(m.num_experts, 1) % p.ep != 0),
         lambda m, p, g: f"ep={p.ep} does not divide num_experts={m.num_experts}"),
    Rule("etp-ffn", "divisibility", "expert tp does not divide the expert FFN size",
         lambda m, p, g: m.is_moe & (max(m.moe_ffn_hidden_size, 1) % _etp(p) != 0),
         lambda m, p, g: f"etp={_etp(p)} does not divide moe_ffn_hidden_size={m.moe_ffn_hidden_size}"),
    Rule("ep-ranks", "divisibility", "ep x expert tp does not divide tp x cp x dp",
         lambda m, p, g: m.is_moe & ((p.tp * p.cp * p.dp) % (p.ep * _etp(p)) != 0),
         lambda m, p, g: (f"ep={p.ep} x etp={_etp(p)} = {p.ep * _etp(p)} does not divide tp x cp x dp = "
                          f"{p.tp * p.cp * p.dp} (experts re-factor the non-pipeline ranks)")),
    Rule("moe-tp-sp", "structure", "mixture of experts with tp > 1 needs sequence parallelism",
         lambda m, p, g: m.is_moe & (p.tp > 1) & ~np.asarray(p.sp, dtype=bool),
         lambda m, p, g: (f"tp={p.tp} without sequence parallelism: Megatron-Core's MoE layer refuses tensor "
                          f"parallelism without --sequence-parallel")),
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
    """Build a plan from keyword fields; dp is derived from the GPU count; defaults from the model preset
    (a preset default that conflicts with the fields given is dropped: :func:`make_plan_as_typed`)."""
    return make_plan_as_typed(model, num_gpus, global_batch=global_batch, **fields)[0]


def make_plan_as_typed(model: ModelSpec, num_gpus: int, *, global_batch: int | None = None, stack: Any = None,
                       **fields: Any) -> tuple[Plan, tuple[str, ...]]:
    """The plan of the fields given (None: not given) on top of the model preset's plan defaults, and one
    line per preset default dropped. A field given is never overridden: when the plan breaks a plan rule (or
    a rule of ``stack``, a StackProfile, when given), the fewest preset defaults whose removal makes it valid
    fall back to the plain defaults (``--tp 1`` on a preset with sequence parallelism runs without it); when no
    such set exists the plan is refused with the rule, which then concerns what was typed."""
    import numbers

    from .limits import check_int

    if not isinstance(model, ModelSpec):
        raise InputError(f"model={type(model).__name__} must be a ModelSpec (tpsim.load_model('llama3-8b'), ...)")
    num_gpus = check_int("gpus", num_gpus)  # numpy integers accepted, the CLI's bound (issue 26)
    if global_batch is not None:
        global_batch = check_int("global_batch", global_batch)
    typed = {k: int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
             for k, v in fields.items() if v is not None}
    unknown = set(typed) - _PLAN_FIELDS
    if unknown:
        raise InputError(f"unknown plan field(s): {', '.join(sorted(unknown))}")
    for name in _PLAN_BOOL_FIELDS & set(typed):  # "yes" or 1 failed deep inside a rule (issue 26)
        if not isinstance(typed[name], (bool, np.bool_)):
            raise InputError(f"{name}={typed[name]!r} must be True or False")
        typed[name] = bool(typed[name])
    preset = {k: v for k, v in model.default_plan.items() if k in _PLAN_FIELDS and k not in typed}

    def build(drop: tuple[str, ...], lowered: dict | None = None) -> Plan:
        values = {k: v for k, v in preset.items() if k not in drop}
        values.update(lowered or {})
        values.update(typed)
        plan = _plan_of(model, num_gpus, global_batch, values)
        if stack is not None:
            problem = stack.plan_violation(plan, model)
            if problem:
                raise PlanError(problem)
        return plan

    try:
        return build(()), ()
    except PlanError as first:
        if not typed or not preset:
            raise
        # a preset's ZeRO stage the plan cannot take is lowered to the highest it can before it is dropped
        # (ZeRO-2 of a preset under a stack that offers ZeRO-1 with pipeline parallelism keeps its sharded
        # optimizer instead of the plain default, a replicated one)
        keys = tuple(preset)
        for size in range(1, len(keys) + 1):
            for drop in combinations(keys, size):
                lower = range(int(preset["zero"]) - 1, 0, -1) if "zero" in drop else ()
                for stage in (*lower, None):
                    try:
                        if stage is None:
                            plan = build(drop)
                        else:
                            plan = build(tuple(k for k in drop if k != "zero"), {"zero": stage})
                    except (PlanError, InputError):
                        continue
                    shown = ", ".join(f"{k}={preset[k]}" for k in drop)
                    how = "dropped" if stage is None else f"dropped (zero={stage} used)"
                    return plan, (f"note: the {model.name} preset's plan default {shown} conflicts with the plan "
                                  f"given ({first}): {how}",)
        raise


_PLAN_BOOL_FIELDS = frozenset(f.name for f in dataclasses.fields(Plan) if f.type in ("bool", bool))
"""fields of a plan that are booleans (make_plan refuses anything else for them)."""


def _plan_of(model: ModelSpec, num_gpus: int, global_batch: int | None, values: dict[str, Any]) -> Plan:
    """The plan of ``values`` (dp derived), validated."""
    values = dict(values)
    for name in ("tp", "pp", "cp"):
        _count(name, values.get(name, 1))
    tp, pp, cp = int(values.get("tp", 1)), int(values.get("pp", 1)), int(values.get("cp", 1))
    if num_gpus <= 0:
        raise InputError(f"gpus={num_gpus} must be a positive integer")
    if num_gpus % (tp * cp * pp):
        ctext = f" x cp={cp}" if cp > 1 else ""
        raise PlanError(f"tp={tp}{ctext} x pp={pp} = {tp * cp * pp} does not divide gpus={num_gpus}")
    values["dp"] = num_gpus // (tp * cp * pp)
    if "order" in values:
        parse_order(values["order"])
        values["order"] = canonical_order(values["order"])
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
    data = dict(data)
    if isinstance(data.get("pp_layout"), list):
        data["pp_layout"] = tuple(data["pp_layout"])
    plan = Plan(**data)
    _check_types(plan)
    return plan


def _orders() -> tuple[str, ...]:
    """The six orders of the first wave (cp right after tp, Megatron-Core's placement), then every order of
    the four axes with cp elsewhere."""
    first = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")
    rest = tuple("-".join(d) for d in permutations(AXES) if d.index("cp") != d.index("tp") + 1)
    return first + rest


ORDERS = _orders()
"""rank orders a PlanBatch indexes (canonical names, :func:`canonical_order`); the first six place cp right
after tp (Megatron-Core ``tp-cp-ep-dp-pp`` and ``tp-cp-ep-pp-dp``)."""
FULL_ORDERS = tuple(full_order(o) for o in ORDERS)
"""each order's four axes, innermost first."""
MEGATRON_ORDERS = ORDERS[:6]


@dataclass(frozen=True)
class PlanBatch:
    """Many plans as numpy arrays (struct of arrays) for the vectorized estimator.

    ``recompute`` is coded 0 none / 1 selective / 2 full; ``cp_kind`` 0 ring / 1 a2a; ``order`` indexes
    :data:`ORDERS`. ``dtype`` and ``attention`` are shared by the whole batch. ``cp``, ``cp_kind``, ``ep`` and
    ``etp`` default to 1, ring, 1 and 0 (= tp). Build with :meth:`from_plans` or directly from arrays.
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
    cp: np.ndarray = None  # type: ignore[assignment]
    cp_kind: np.ndarray = None  # type: ignore[assignment]
    ep: np.ndarray = None  # type: ignore[assignment]
    etp: np.ndarray = None  # type: ignore[assignment]
    schedule: np.ndarray = None  # type: ignore[assignment]
    tp_overlap: np.ndarray = None  # type: ignore[assignment]
    pp_first: np.ndarray = None  # type: ignore[assignment]
    pp_last: np.ndarray = None  # type: ignore[assignment]
    pp_embedding: np.ndarray = None  # type: ignore[assignment]
    pp_loss: np.ndarray = None  # type: ignore[assignment]
    pp_layout: np.ndarray = None  # type: ignore[assignment]
    """:func:`layout_code` of each plan's pp_layout (0: none)."""

    def __post_init__(self) -> None:
        n = int(self.tp.shape[0])
        for name, default in _AXIS_DEFAULTS.items():
            if getattr(self, name) is None:
                dt = bool if name in _BOOL_COLUMNS else np.int64
                object.__setattr__(self, name, np.full(n, default, dtype=dt))

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @classmethod
    def from_arrays(cls, *, dtype: str = "bf16", attention: str = "flash", **arrays: Any) -> "PlanBatch":
        sizes = [np.size(v) for v in arrays.values() if np.ndim(v) > 0]
        n = 0 if 0 in sizes else max(sizes, default=1)  # an empty column: an empty batch, scalars broadcast
        defaults = dict(tp=1, pp=1, vpp=1, dp=1, sp=False, recompute=0, zero=0, micro_batch=1, global_batch=1,
                        overlap=True, order=0, **_AXIS_DEFAULTS)
        cols = {}
        for key, default in defaults.items():
            value = np.asarray(arrays.get(key, default))
            dt = bool if key in ("sp", "overlap") + _BOOL_COLUMNS else np.int64
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
        # one array per column kind, rows = columns (each column a contiguous row): two conversions for the batch
        # instead of one per column (a one-plan estimate builds this every call)
        ints = np.array([(p.tp, p.pp, p.vpp, p.dp, RECOMPUTE.index(p.recompute), p.zero, p.micro_batch,
                          p.global_batch, _order_index(p.order), p.cp, CP_KINDS.index(p.cp_kind), p.ep, p.etp,
                          SCHEDULES.index(p.schedule), p.pp_first, p.pp_last, layout_code(p.pp_layout))
                         for p in plans], dtype=np.int64).T.copy()
        bools = np.array([(p.sp, p.overlap, p.tp_overlap, p.pp_embedding, p.pp_loss) for p in plans],
                         dtype=bool).T.copy()
        (tp, pp, vpp, dp, recompute, zero, micro_batch, global_batch, order, cp, cp_kind, ep, etp, schedule,
         pp_first, pp_last, pp_layout) = ints
        sp, overlap, tp_overlap, pp_embedding, pp_loss = bools
        return cls(tp=tp, pp=pp, vpp=vpp, dp=dp, sp=sp, recompute=recompute, zero=zero, micro_batch=micro_batch,
                   global_batch=global_batch, overlap=overlap, order=order, dtype=plans[0].dtype,
                   attention=plans[0].attention, cp=cp, cp_kind=cp_kind, ep=ep, etp=etp, schedule=schedule,
                   tp_overlap=tp_overlap, pp_first=pp_first, pp_last=pp_last, pp_embedding=pp_embedding,
                   pp_loss=pp_loss, pp_layout=pp_layout)

    def plan(self, i: int) -> Plan:
        """The i-th plan as a :class:`Plan`."""
        return Plan(tp=int(self.tp[i]), cp=int(self.cp[i]), cp_kind=CP_KINDS[int(self.cp_kind[i])],
                    ep=int(self.ep[i]), etp=int(self.etp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]),
                    dp=int(self.dp[i]), sp=bool(self.sp[i]), recompute=RECOMPUTE[int(self.recompute[i])],
                    zero=int(self.zero[i]), micro_batch=int(self.micro_batch[i]),
                    global_batch=int(self.global_batch[i]), dtype=self.dtype, overlap=bool(self.overlap[i]),
                    order=ORDERS[int(self.order[i])], attention=self.attention,
                    schedule=SCHEDULES[int(self.schedule[i])], tp_overlap=bool(self.tp_overlap[i]),
                    pp_first=int(self.pp_first[i]), pp_last=int(self.pp_last[i]),
                    pp_embedding=bool(self.pp_embedding[i]), pp_loss=bool(self.pp_loss[i]),
                    pp_layout=layout_of(self.pp_layout[i]))

    def take(self, index: np.ndarray) -> "PlanBatch":
        """Sub-batch of the rows ``index`` (boolean mask or integer indices)."""
        if type(index) is np.ndarray and index.dtype.kind in "iu":  # ndarray.take: the same rows, faster
            fields = {f.name: getattr(self, f.name).take(index, axis=0) for f in dataclasses.fields(self)
                      if f.name not in ("dtype", "attention")}
        else:
            fields = {f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)
                      if f.name not in ("dtype", "attention")}
        return PlanBatch(**fields, dtype=self.dtype, attention=self.attention)

    @property
    def expert_tp(self) -> np.ndarray:
        """Expert tensor-parallel degree with 0 resolved to tp."""
        return _etp(self)

    @property
    def num_gpus(self) -> np.ndarray:
        return self.tp * self.cp * self.pp * self.dp


_AXIS_DEFAULTS = {"cp": 1, "cp_kind": 0, "ep": 1, "etp": 0, "schedule": 0, "tp_overlap": False, "pp_first": 0,
                  "pp_last": 0, "pp_embedding": False, "pp_loss": False, "pp_layout": 0}
"""columns of the issue-11 and third-wave axes and their values in a plan without them."""
_BOOL_COLUMNS = ("tp_overlap", "pp_embedding", "pp_loss")


@functools.lru_cache(maxsize=256)
def _order_index(order: str) -> int:
    return ORDERS.index(canonical_order(order))
