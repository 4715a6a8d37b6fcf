"""Training-stack profiles: what Megatron-LM, torchtitan and DeepSpeed can run, and how they communicate,
compute and hold memory (docs/SCHEMAS.md section 5).

A profile is a YAML file (``tpsim/data/stacks/<name>.yaml`` or any path) with ``name``, ``version``, ``sources``
and four sections: ``rules`` (which plans the stack runs and what it calls each choice), ``comm``, ``compute``
and ``memory`` (figures the estimator reads: each a ``value`` with its ``source``, ``null`` where nothing is
published and calibration must supply it). Every rule and figure carries its source; the loader refuses one
without.

The rules are one table (:data:`RULES`) of vectorized predicates over a :class:`~tpsim.plan.PlanBatch`:
:meth:`StackProfile.violation_codes` gives per plan the first rule it breaks (the planner counts them under
the rejection reason ``stack``), :meth:`StackProfile.plan_violation` gives that rule as one line for one plan
(``estimate`` and the exporters raise it). Rules that need the model (layer and sequence divisibility) run only
when a model is passed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .errors import InputError, did_you_mean
from .errors import check_keys as _check_keys
from .hardware import DTYPES
from .model import ModelSpec
from .plan import ATTENTION, ORDERS, RECOMPUTE, SCHEDULES, Plan, PlanBatch

STACKS_DIR = Path(__file__).resolve().parent / "data" / "stacks"
STACK_NAMES = ("megatron", "torchtitan", "torchtitan-compile", "deepspeed", "deepspeed-2021", "llm-foundry",
               "nemo")
PRESET_STACKS = ("hai-llm", "megatron-sc21")
"""shipped profiles of a published run (DeepSeek-V3's HAI-LLM; SC21's Megatron-LM of early 2021, which the SC21
reference runs and tpsim/data/runs/sc21.csv use), loadable by name but not general stacks: they offer only what
the run used."""
RUNTIME_STACKS = ("torch-validate",)
"""shipped profiles of tpsim's own runtimes (``tpsim validate``'s ranks), loadable by name."""
DEFAULT_STACK = "megatron"
CP_KINDS = ("ring", "a2a")
"""context-parallel kinds of docs/SCHEMAS.md section 1, in PlanBatch code order (0 ring, 1 a2a)."""

TOP_KEYS = ("name", "version", "description", "sources", "rules", "comm", "compute", "memory")
RULE_KEYS = ("zero", "ddp_only_pure_dp", "interleaving", "layers_divisible_by_stages", "sp", "cp", "ep",
             "recompute", "dtypes", "attention", "orders", "overlap_optional", "schedules", "uneven_split",
             "tp_overlap")
OPTIONAL_RULE_KEYS = ("schedules", "uneven_split", "tp_overlap")
"""rule keys a profile may leave out (``schedules``: 1F1B alone, tpsim/pipeline.py; ``uneven_split``: false;
``tp_overlap``: true)."""
SECTION_KEYS: Mapping[str, tuple[str, ...]] = {
    "comm": ("dp_reduction_timing", "grad_reduce_dtype", "param_gather_dtype", "dp_bucket_elements", "zero3_unit",
             "reshard_after_forward_default", "zero3_prefetch_elements", "zero3_persistence_threshold_elements",
             "zero3_max_live_elements", "reduce_bucket_elements", "allgather_bucket_elements",
             "overlap_dp_default", "tp_overlap", "tp_backward_overlap", "tp_overlap_phases",
             "tp_overlap_exposed_share", "tp_overlap_comm_sms", "pp_overlap_interleaved", "dp_sync_per_chunk",
             "host_us_per_collective",
             "ep_dispatch_dtype", "ep_node_dedup", "ep_a2a_overlap", "zero3_regather_in_recompute",
             "zero3_overlap_fraction",
             "host_us_per_collective_rank", "fsdp_copy_in_out", "fsdp_reshard_after_backward",
             "zero1_in_optimizer_step", "zero1_flat_copies", "pp_send_split_over_tp", "fp8_param_gather",
             "cp_ring_exchange", "cp_grad_exchange_dtype", "cp_exchange_overlap"),
    "compute": ("host_us_per_layer", "host_us_per_microbatch", "host_us_per_op", "kernels", "default_attention",
                "grad_accumulation_fusion", "optimizer_bytes_per_param", "optimizer_bytes_per_param_fp32",
                "grad_buffer_passes_per_step",
                "pipeline_edges_as_layers", "model_edges",
                "fp8_cast_bytes_per_element", "gqa_kv_repeat"),
    "memory": ("grad_buffer_dtype", "grad_accumulation_buffer", "main_params_dtype", "optimizer_state_dtype",
               "fp8_weights_kept", "allocator_reserve_fraction", "selective_recompute_modules",
               "fp8_activation_cache_bytes", "attention_output_cache_bytes", "attention_output_shared",
               "selective_recompute_policy", "logits_bytes_per_element", "optimizer_state_offload",
               "optimizer_cpu_fraction", "optimizer_cpu_overlap"),
}
ATTENTION_IMPLEMENTATIONS = ("flash2", "flash3", "cudnn", "unfused")
"""names of the kernel models' attention implementations (``compute.default_attention`` values)."""


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One figure of a stack section: its value (number, string, list or mapping; None = calibrate)."""

    value: Any
    source: str
    unit: str = ""
    range: tuple[float, float] | None = None
    """(low, high) of a prior's plausible values (the error band reads it); None: a published figure."""


@dataclass(frozen=True, kw_only=True)
class StackRules:
    """Which plans a stack can run, and its own name for each choice (tpsim value -> stack setting)."""

    zero_offered: tuple[int, ...]
    zero_names: Mapping[int, str]
    zero_max_with_pp: int
    """largest ZeRO stage the stack combines with pipeline parallelism."""
    ddp_only_pure_dp: bool
    """unsharded data parallelism (ZeRO-0) only when dp is the only parallel axis."""
    interleaving: bool
    layers_divisible_by_stages: bool
    """pp x vpp must divide the number of layers."""
    sp: str
    """``optional`` or ``with_tp`` (sequence parallelism exactly when tp > 1)."""
    cp_kinds: Mapping[str, str]
    """tpsim context-parallel kind -> the stack's name; empty: no context parallelism."""
    cp_seq_multiple_of_2cp: bool
    ep: bool
    recompute: Mapping[str, str]
    dtypes: Mapping[str, str]
    attention: Mapping[str, str]
    orders: Mapping[str, str]
    """rank orders (tpsim order strings without cp) -> the stack's setting."""
    overlap_optional: bool
    """whether DP communication can run without overlap (False: the stack always overlaps)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    schedules: Mapping[str, str] = field(default_factory=lambda: {"1f1b": "1F1B"})
    """pipeline schedules offered (tpsim/pipeline.py names -> the stack's setting), in the profile's order."""
    uneven_split: bool = False
    """the plan's own split is offered: first / last stage layers, embedding and loss counted as layers
    (``rules.uneven_split``; docs/SCHEMAS.md T1)."""
    tp_overlap: bool = True
    """the plan field ``tp_overlap`` (TP collectives pipelined with the GEMMs) is offered (``rules.tp_overlap``;
    false: the stack has no such mode, e.g. torchtitan's async TP needs torch.compile)."""
    default_schedule: str = "1f1b"
    """the schedule of a plan that names none (``rules.schedules.default``; the CLI's ``--schedule`` default)."""
    edges_as_layers: bool = False
    """the pipeline split counts the embedding and the output layer as one layer each (the profile's
    ``compute.pipeline_edges_as_layers``): pp x vpp may reach num_layers + 2."""


@dataclass(frozen=True, kw_only=True)
class StackProfile:
    """A training stack: name, version, sources, rules and the comm/compute/memory figures."""

    name: str
    version: str
    description: str
    sources: tuple[str, ...]
    rules: StackRules
    comm: Mapping[str, Figure]
    compute: Mapping[str, Figure]
    memory: Mapping[str, Figure]
    path: Path
    digest: str = field(repr=False)
    """SHA-256 of the file's parsed content (the profile's part of a cache key)."""

    def fingerprint(self) -> str:
        return self.digest

    def figure(self, section: str, key: str) -> Figure | None:
        """A figure of ``comm``, ``compute`` or ``memory`` (None when the profile does not state it)."""
        if section not in SECTION_KEYS:
            raise InputError(f"section={section!r} is not one of {', '.join(SECTION_KEYS)}")
        return getattr(self, section).get(key)

    def recompute_name(self, recompute: str) -> str:
        """The stack's own name of a tpsim recomputation flavor (``selective`` -> e.g. per-op SAC)."""
        if recompute not in self.rules.recompute:
            raise InputError(f"recompute={recompute!r} is not offered by {self.name} "
                             f"(offers {', '.join(self.rules.recompute)})")
        return self.rules.recompute[recompute]

    # ---- rules ---------------------------------------------------------------------------------------
    def violation_codes(self, batch: PlanBatch, model: ModelSpec | None = None) -> np.ndarray:
        """Per plan, 1 + the index into :data:`RULES` of the first rule it breaks (0 = the stack runs it)."""
        cols = _columns(batch)
        code = np.zeros(len(batch), dtype=np.int8)
        for i in range(len(RULES), 0, -1):  # the first failing rule wins: assign in reverse
            rule = RULES[i - 1]
            if rule.needs_model and model is None:
                continue
            code[rule.violated(cols, self.rules, model)] = i
        return code

    def violations(self, batch: PlanBatch, model: ModelSpec | None = None) -> np.ndarray:
        """Boolean array: True where the stack cannot run the plan."""
        return self.violation_codes(batch, model) > 0

    def plan_violation(self, plan: Plan, model: ModelSpec | None = None) -> str | None:
        """The first rule the plan breaks, as one line naming the stack, the rule and the values; None if the
        stack runs it. Same table (and order) as :meth:`violation_codes`."""
        code = int(self.violation_codes(PlanBatch.from_plans([plan]), model)[0])
        if not code:
            return None
        rule = RULES[code - 1]
        return f"{self.name} ({rule.key}): {rule.message(plan, self.rules, model)}"

    def check_plan(self, plan: Plan, model: ModelSpec | None = None) -> Plan:
        """Raise :class:`InputError` with :meth:`plan_violation`'s line; return the plan otherwise."""
        problem = self.plan_violation(plan, model)
        if problem:
            raise InputError(f"stack {problem}")
        return plan


# ------------------------------------------------------------------------------------------------- rule table

Columns = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    key: str
    """identifier (plan_violation's prefix, rejection sub-reason)."""
    text: str
    """what the rule says, for ``--why``."""
    violated: Callable[[Columns, StackRules, ModelSpec | None], np.ndarray]
    message: Callable[[Plan, StackRules, ModelSpec | None], str]
    needs_model: bool = False


def _columns(batch: PlanBatch) -> dict[str, Any]:
    """The batch's columns; cp, ep and cp_kind default to 1, 1 and ring where PlanBatch has no such column."""
    n = len(batch)
    cols: dict[str, Any] = {k: getattr(batch, k) for k in ("tp", "pp", "vpp", "dp", "sp", "recompute", "zero",
                                                          "micro_batch", "global_batch", "overlap", "order")}
    for name, default in (("cp", 1), ("ep", 1), ("cp_kind", 0), ("schedule", 0), ("pp_first", 0), ("pp_last", 0),
                          ("pp_embedding", False), ("pp_loss", False), ("tp_overlap", False), ("pp_layout", 0)):
        value = getattr(batch, name, None)
        cols[name] = np.broadcast_to(np.asarray(default if value is None else value), (n,))
    cols["dtype"], cols["attention"], cols["n"] = batch.dtype, batch.attention, n
    return cols


def order_key(order: str) -> str:
    """A rank order with cp folded into tp (``tp-cp-dp-pp`` -> ``tp-dp-pp``): the stacks place the cp axis
    right after tp (Megatron-Core ``tp-cp-ep-dp-pp``, torchtitan's mesh); cp elsewhere keeps its name and
    matches no stack order."""
    return order.replace("tp-cp", "tp")


def _plan_cp(plan: Plan) -> tuple[int, str, int]:
    return int(getattr(plan, "cp", 1)), str(getattr(plan, "cp_kind", "ring")), int(getattr(plan, "ep", 1))


def _whole(cols: Columns, bad: bool) -> np.ndarray:
    return np.full(cols["n"], bad, dtype=bool)


def _names(mapping: Mapping[Any, Any]) -> str:
    return ", ".join(str(k) for k in mapping) or "none"


RULES: tuple[Rule, ...] = (
    Rule("zero", "ZeRO stage not offered by the stack",
         lambda c, r, m: ~np.isin(c["zero"], r.zero_offered),
         lambda p, r, m: f"zero={p.zero} is not offered (offers ZeRO {', '.join(map(str, r.zero_offered))})"),
    Rule("zero-with-pp", "ZeRO stage not combined with pipeline parallelism by the stack",
         lambda c, r, m: (c["pp"] > 1) & (c["zero"] > r.zero_max_with_pp),
         lambda p, r, m: (f"zero={p.zero} with pp={p.pp} is not offered (ZeRO-{r.zero_max_with_pp} at most "
                          f"with pipeline parallelism)")),
    Rule("ddp-1d", "unsharded data parallelism only without tensor, pipeline or context parallelism",
         lambda c, r, m: (r.ddp_only_pure_dp & (c["zero"] == 0) & (c["dp"] > 1)
                          & ((c["tp"] > 1) | (c["pp"] > 1) | (c["cp"] > 1))),
         lambda p, r, m: (f"zero=0 (DDP) with dp={p.dp} needs tp=pp=cp=1 (tp={p.tp}, pp={p.pp}, "
                          f"cp={_plan_cp(p)[0]}); sharded data parallelism (ZeRO "
                          f"{', '.join(str(z) for z in r.zero_offered if z)}) composes with them")),
    Rule("interleaving", "interleaved pipeline schedule not offered",
         lambda c, r, m: (not r.interleaving) & (c["vpp"] > 1),
         lambda p, r, m: f"vpp={p.vpp}: the interleaved (virtual pipeline) schedule is not offered"),
    Rule("sp", "sequence parallelism fixed by the stack",
         lambda c, r, m: (r.sp == "with_tp") & (c["sp"] != (c["tp"] > 1)),
         lambda p, r, m: (f"sp={p.sp} with tp={p.tp}: tensor parallelism always runs with sequence "
                          f"parallelism here (sp exactly when tp > 1)")),
    Rule("cp", "context-parallel kind not offered",
         lambda c, r, m: (c["cp"] > 1) & ~np.isin(c["cp_kind"], [CP_KINDS.index(k) for k in r.cp_kinds]),
         lambda p, r, m: (f"cp={_plan_cp(p)[0]} cp_kind={_plan_cp(p)[1]} is not offered "
                          f"(context-parallel kinds: {_names(r.cp_kinds)})")),
    Rule("ep", "expert parallelism not offered",
         lambda c, r, m: (not r.ep) & (c["ep"] > 1),
         lambda p, r, m: f"ep={_plan_cp(p)[2]}: expert parallelism is not offered"),
    Rule("recompute", "recomputation flavor not offered",
         lambda c, r, m: ~np.isin(c["recompute"], [RECOMPUTE.index(k) for k in r.recompute]),
         lambda p, r, m: f"recompute={p.recompute} is not offered (offers {_names(r.recompute)})"),
    Rule("dtype", "GEMM precision not offered",
         lambda c, r, m: _whole(c, c["dtype"] not in r.dtypes),
         lambda p, r, m: f"dtype={p.dtype} is not offered (offers {_names(r.dtypes)})"),
    Rule("attention", "attention kind not offered",
         lambda c, r, m: _whole(c, c["attention"] not in r.attention),
         lambda p, r, m: f"attention={p.attention} is not offered (offers {_names(r.attention)})"),
    Rule("order", "rank order not expressible in the stack",
         lambda c, r, m: ~np.isin(c["order"], [i for i, o in enumerate(ORDERS) if order_key(o) in r.orders]),
         lambda p, r, m: f"order={p.order} is not expressible (orders: {_names(r.orders)})"),
    Rule("no-overlap", "DP communication always overlapped by the stack",
         lambda c, r, m: (not r.overlap_optional) & ~c["overlap"] & (c["dp"] * c["cp"] > 1),
         lambda p, r, m: (f"overlap=False with dp={p.dp}{f' x cp={_plan_cp(p)[0]}' if _plan_cp(p)[0] > 1 else ''}: "
                          f"the stack always overlaps the gradient reduction")),
    Rule("schedule", "pipeline schedule not offered by the stack",
         lambda c, r, m: (c["pp"] > 1) & ~np.isin(c["schedule"], [SCHEDULES.index(k) for k in r.schedules]),
         lambda p, r, m: (f"schedule={p.schedule} is not offered (offers {_names(r.schedules)}; "
                          f"--schedule {r.default_schedule} is the stack's)")),
    Rule("uneven-split", "the plan's own pipeline split not offered",
         lambda c, r, m: (not r.uneven_split) & ((c["pp_first"] > 0) | (c["pp_last"] > 0)
                                                 | np.asarray(c["pp_embedding"], dtype=bool)
                                                 | np.asarray(c["pp_loss"], dtype=bool) | (c["pp_layout"] != 0)),
         lambda p, r, m: (f"{'pp_layout' if p.pp_layout else 'pp_first/pp_last/pp_embedding/pp_loss'}: the stack "
                          "splits the layers its own way (an uneven split of the plan is not offered)")),
    Rule("tp-overlap", "TP communication overlap not offered by the stack",
         lambda c, r, m: (not r.tp_overlap) & np.asarray(c["tp_overlap"], dtype=bool) & (c["tp"] > 1),
         lambda p, r, m: (f"tp_overlap=True with tp={p.tp}: the stack has no mode that overlaps its TP "
                          f"collectives with the GEMMs (rules.tp_overlap)")),
    Rule("chunk-layers", "a model chunk would hold no layer",
         lambda c, r, m: (c["pp"] * c["vpp"] > m.num_layers + np.maximum(
             2 if r.edges_as_layers else 0, np.asarray(c["pp_embedding"], dtype=np.int64)
             + np.asarray(c["pp_loss"], dtype=np.int64))) & (c["pp_layout"] == 0),
         lambda p, r, m: (f"pp={p.pp} x vpp={p.vpp} = {p.pp * p.vpp} model chunks for num_layers={m.num_layers}: "
                          f"a chunk would hold no layer (the embedding and the output layer are not split as "
                          f"layers here)"), needs_model=True),
    Rule("stage-layers", "pp x vpp does not divide the layers",
         lambda c, r, m: r.layers_divisible_by_stages & (m.num_layers % (c["pp"] * c["vpp"]) != 0)
         & ~(r.edges_as_layers & ((m.num_layers + 2) % (c["pp"] * c["vpp"]) == 0)) & (c["pp_layout"] == 0),
         lambda p, r, m: (f"pp={p.pp} x vpp={p.vpp} = {p.pp * p.vpp} does not divide num_layers="
                          f"{m.num_layers}{' (nor num_layers + 2 with the embedding and output as layers)' if r.edges_as_layers else ''} "
                          f"(equal stages)"), needs_model=True),
    Rule("cp-seq", "sequence length not a multiple of 2 x cp",
         lambda c, r, m: r.cp_seq_multiple_of_2cp & (c["cp"] > 1) & (m.seq_len % (2 * c["cp"]) != 0),
         lambda p, r, m: (f"seq_len={m.seq_len} is not a multiple of 2 x cp = {2 * _plan_cp(p)[0]} "
                          f"(causal load balancing)"), needs_model=True),
    Rule("ep-experts", "ep does not divide the number of experts",
         lambda c, r, m: ((getattr(m, "num_experts", 0) or 0) > 0) & (c["ep"] > 1)
         & ((getattr(m, "num_experts", 0) or 1) % c["ep"] != 0),
         lambda p, r, m: (f"ep={_plan_cp(p)[2]} does not divide num_experts="
                          f"{getattr(m, 'num_experts', 0)}"), needs_model=True),
)
RULE_INDEX = {rule.key: i + 1 for i, rule in enumerate(RULES)}


def count_violations(codes: np.ndarray) -> dict[str, int]:
    """{rule key: count} of the non-zero codes of :meth:`StackProfile.violation_codes`, in table order."""
    counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=len(RULES) + 1)
    return {RULES[i - 1].key: int(n) for i, n in enumerate(counts) if i and n}


# ------------------------------------------------------------------------------------------------- loading

def stack_path(name_or_path: str | Path) -> Path:
    """``tpsim/data/stacks/<name>.yaml`` for a shipped name, else the path itself."""
    text = str(name_or_path)
    if text.lower() in STACK_NAMES + PRESET_STACKS + RUNTIME_STACKS:
        return STACKS_DIR / f"{text.lower()}.yaml"
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in text:
        if not path.is_file():
            raise InputError(f"stack file {text} does not exist")
        return path.resolve()
    raise InputError(f"stack={text!r} is unknown (known: {', '.join(STACK_NAMES + PRESET_STACKS)}, or a YAML "
                     f"path)" + did_you_mean(text, STACK_NAMES + PRESET_STACKS))


def load_stack(name_or_path: "str | Path | StackProfile" = DEFAULT_STACK) -> StackProfile:
    """A training-stack profile by name (megatron, torchtitan, deepspeed) or path; cached per file version. A
    profile is returned as given (a launch file's derived stack, :func:`derived_stack`)."""
    if isinstance(name_or_path, StackProfile):
        return name_or_path
    path = stack_path(name_or_path)
    stat = path.stat()
    return _load(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=32)
def _load(path: str, mtime: int, size: int) -> StackProfile:  # noqa: ARG001 (mtime, size: the cache key)
    from .topology.files import read_yaml  # strict YAML: duplicate keys, bounded documents

    data = read_yaml(Path(path))
    return profile_from_mapping(data, path)


def derived_stack(base: "str | Path | StackProfile", overrides: Mapping[str, Mapping[str, Any]],
                  why: str) -> StackProfile:
    """The profile ``base`` (a name, path or loaded profile) with the figures ``overrides`` ({section: {key:
    value}}, sections comm / compute / memory) set to these values, each sourced ``why`` (the launch file and
    flags that state them), validated as a profile file is. The name stays the base's (the residual groups and
    the bands of a stack are by name); the version says what was changed."""
    import copy

    from .topology.files import read_yaml

    path = base.path if isinstance(base, StackProfile) else stack_path(base)
    data = copy.deepcopy(dict(read_yaml(Path(path))))
    changed = []
    for section, figures in overrides.items():
        if section not in SECTION_KEYS:
            raise InputError(f"{why}: section={section!r} is not one of {', '.join(SECTION_KEYS)}")
        body = dict(data.get(section) or {})
        for key, value in figures.items():
            body[key] = {"value": value, "source": why}
            changed.append(f"{section}.{key}={value}")
        data[section] = body
    if not changed:
        return base if isinstance(base, StackProfile) else load_stack(base)
    data["version"] = f"{str(data['version']).strip()}; with {', '.join(changed)} ({why})"
    return profile_from_mapping(data, f"{path} + {why}")


def profile_from_mapping(data: Mapping[str, Any], where: str) -> StackProfile:
    """Validate a parsed profile (unknown or missing keys, a rule or figure without source) and build it."""
    _check_keys(data, TOP_KEYS, where, required=("name", "version", "sources", "rules", "comm", "compute",
                                                 "memory"))
    from .schema import check
    from .schemas import STACK

    check(STACK, data, where)  # the figures' types and ranges (issue 26: negative bytes, NaN, lists refused)
    sources = data["sources"]
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s.strip() for s in sources):
        raise InputError(f"{where}: sources must be a non-empty list of file paths or URLs")
    sections = {name: _section(data[name], name, where) for name in SECTION_KEYS}
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    rules = _rules(data["rules"], f"{where}: rules")
    edges = sections["compute"].get("pipeline_edges_as_layers")
    if edges is not None:
        if not isinstance(edges.value, bool):
            raise InputError(f"{where}: compute.pipeline_edges_as_layers: value={edges.value!r} must be a bool")
        rules = dataclasses.replace(rules, edges_as_layers=edges.value)
    return StackProfile(name=_text(data["name"], where, "name"), version=_text(data["version"], where, "version"),
                        description=str(data.get("description", "")).strip(),
                        sources=tuple(s.strip() for s in sources), rules=rules,
                        path=Path(where), digest=digest, **sections)


def _rules(body: Any, where: str) -> StackRules:
    _check_keys(body, RULE_KEYS, where, required=tuple(k for k in RULE_KEYS if k not in OPTIONAL_RULE_KEYS))
    sources = {}
    for key in (k for k in RULE_KEYS if k in body):
        sources[key] = _text(body[key].get("source") if isinstance(body[key], Mapping) else None,
                             f"{where}.{key}", "source")
    zero, cp = body["zero"], body["cp"]
    _check_keys(zero, ("offered", "names", "max_with_pp", "source"), f"{where}.zero", required=("offered", "names",
                                                                                                "max_with_pp"))
    _check_keys(cp, ("kinds", "seq_multiple_of_2cp", "source"), f"{where}.cp", required=("kinds",))
    offered = tuple(int(z) for z in zero["offered"])
    if not offered or any(z not in (0, 1, 2, 3) for z in offered):
        raise InputError(f"{where}.zero: offered={zero['offered']!r} must list ZeRO stages 0-3")
    names = {int(k): str(v) for k, v in (zero["names"] or {}).items()}
    if set(names) != set(offered):
        raise InputError(f"{where}.zero: names must name exactly the offered stages {offered}")
    sp = _flag(body["sp"], f"{where}.sp", str)
    if sp not in ("optional", "with_tp"):
        raise InputError(f"{where}.sp: value={sp!r} is not optional or with_tp")
    kinds = _names_map(cp, f"{where}.cp", CP_KINDS, key="kinds", allow_empty=True)
    return StackRules(
        zero_offered=offered, zero_names=names, zero_max_with_pp=int(zero["max_with_pp"]),
        ddp_only_pure_dp=_flag(body["ddp_only_pure_dp"], f"{where}.ddp_only_pure_dp", bool),
        interleaving=_flag(body["interleaving"], f"{where}.interleaving", bool),
        layers_divisible_by_stages=_flag(body["layers_divisible_by_stages"], f"{where}.layers_divisible_by_stages",
                                         bool),
        sp=sp, cp_kinds=kinds, cp_seq_multiple_of_2cp=bool(cp.get("seq_multiple_of_2cp", False)),
        ep=_flag(body["ep"], f"{where}.ep", bool),
        recompute=_names_map(body["recompute"], f"{where}.recompute", RECOMPUTE),
        dtypes=_names_map(body["dtypes"], f"{where}.dtypes", DTYPES),
        attention=_names_map(body["attention"], f"{where}.attention", ATTENTION),
        orders=_names_map(body["orders"], f"{where}.orders", tuple(order_key(o) for o in ORDERS)),
        overlap_optional=_flag(body["overlap_optional"], f"{where}.overlap_optional", bool), sources=sources,
        uneven_split=_flag(body["uneven_split"], f"{where}.uneven_split", bool) if "uneven_split" in body else False,
        tp_overlap=_flag(body["tp_overlap"], f"{where}.tp_overlap", bool) if "tp_overlap" in body else True,
        **_schedules(body.get("schedules"), f"{where}.schedules"))


def _schedules(body: Any, where: str) -> dict[str, Any]:
    """``rules.schedules``: ``names`` (schedule -> the stack's setting) and ``default`` (one of them)."""
    if body is None:
        return {}
    _check_keys(body, ("names", "default", "source"), where, required=("names", "default"))
    names = _names_map({"names": body["names"]}, where, SCHEDULES)
    default = body["default"]
    if default not in names:
        raise InputError(f"{where}: default={default!r} is not one of the offered schedules {_names(names)}")
    return dict(schedules=names, default_schedule=str(default))


def _names_map(body: Any, where: str, allowed: tuple[str, ...], key: str = "names",
               allow_empty: bool = False) -> dict[str, str]:
    """``{names: {tpsim value: stack name}}`` with values checked against ``allowed`` (other keys of the
    entry are checked by the caller)."""
    if key == "names":
        _check_keys(body, (key, "source"), where, required=(key,))
    names = body[key] or {}
    if not isinstance(names, Mapping) or (not names and not allow_empty):
        raise InputError(f"{where}: {key} must map {', '.join(allowed)} to the stack's names")
    for k in names:
        if k not in allowed:
            raise InputError(f"{where}: {key}.{k}: not one of {', '.join(allowed)}")
    return {str(k): str(v) for k, v in names.items()}


def _flag(body: Any, where: str, kind: type) -> Any:
    _check_keys(body, ("value", "source"), where, required=("value",))
    value = body["value"]
    if not isinstance(value, kind):
        raise InputError(f"{where}: value={value!r} must be a {kind.__name__}")
    return value


def _section(body: Any, name: str, where: str) -> dict[str, Figure]:
    w = f"{where}: {name}"
    _check_keys(body, SECTION_KEYS[name], w)
    out = {}
    for key, entry in body.items():
        _check_keys(entry, ("value", "unit", "source", "note", "range"), f"{w}.{key}", required=("value",))
        out[key] = Figure(value=entry["value"], source=_text(entry.get("source"), f"{w}.{key}", "source"),
                          unit=str(entry.get("unit", "")), range=_range(entry.get("range"), entry["value"],
                                                                        f"{w}.{key}"))
    attention = out.get("default_attention")
    if attention is not None:
        values = attention.value.values() if isinstance(attention.value, Mapping) else [attention.value]
        for v in values:
            if v not in ATTENTION_IMPLEMENTATIONS:
                raise InputError(f"{w}.default_attention: {v!r} is not one of {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return out


def _range(raw: Any, value: Any, where: str) -> tuple[float, float] | None:
    """A prior's ``[low, high]``: two numbers around the value."""
    if raw is None:
        return None
    ok = (isinstance(raw, list) and len(raw) == 2 and all(isinstance(x, (int, float)) for x in raw)
          and isinstance(value, (int, float)) and raw[0] <= value <= raw[1])
    if not ok:
        raise InputError(f"{where}: range={raw!r} must be [low, high] numbers around value={value!r}")
    return float(raw[0]), float(raw[1])


def _text(value: Any, where: str, field_name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: {field_name} is missing (every rule and figure names its source)")
    return value.strip()


