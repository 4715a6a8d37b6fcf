"""What every launch format shares: the export context, the imported launch, the comment header, and turning
an import back into a model and a plan.

Exported files start with a comment header naming the model, the cluster and tpsim's prediction; its last
line, ``# tpsim: model=<ref> cluster=<ref> gpus=<n>``, lets an import find the model and cluster again. It
never carries plan fields: the plan is always read from the framework's own keys, so an import of a file a
framework user wrote by hand reads the same way.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import ascii_int
from ..model import ModelSpec, load_model, with_overrides
from ..plan import Plan, make_plan

HEADER_TAG = "tpsim:"
MOE_SHAPE_FIELDS = ("num_experts", "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts",
                    "shared_expert_ffn_hidden_size", "first_dense_layers", "moe_layer_freq", "dense_layers",
                    "capacity_factor", "router_groups", "router_group_topk", "attention_kind", "q_lora_rank",
                    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_layers",
                    "moe_balance")
"""ModelSpec fields of mixtures of experts, MLA and multi-token prediction an import may state."""
PLAN_AXES_LATER = ("cp", "cp_kind", "ep", "etp")
"""plan fields of docs/SCHEMAS.md section 1 that a Plan may not have yet (read with defaults)."""
AXIS_DEFAULTS = {"cp": 1, "cp_kind": "ring", "ep": 1, "etp": 0}


def axis(plan: Plan, name: str) -> Any:
    """A plan field that may not exist yet (cp, cp_kind, ep, etp), with its schema default."""
    return getattr(plan, name, AXIS_DEFAULTS[name])


@dataclass(frozen=True, kw_only=True)
class ExportContext:
    """Everything an exporter writes: the model, the plan, the GPUs and (for the header) the prediction."""

    model: ModelSpec
    plan: Plan
    gpus: int
    gpus_per_node: int
    model_ref: str
    """how to load the model again: a preset name or a config.json path."""
    model_overrides: Mapping[str, int] = field(default_factory=dict)
    """command-line shape overrides applied to ``model_ref`` (layers, hidden, heads, kv_heads, ffn, vocab,
    seq_len): written to the header so an import rebuilds the same model."""
    cluster_ref: str
    cluster_desc: str
    """e.g. ``dgx-h100: 64 x H100-SXM``."""
    prediction: Mapping[str, Any] | None = None
    """``Estimate.to_dict()`` of the plan (None: no prediction in the header)."""

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def devices_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)


@dataclass(frozen=True, kw_only=True)
class ImportedLaunch:
    """A launch config read back: plan fields and model shape in tpsim's names, plus what was not understood."""

    format: str
    path: Path
    plan_fields: Mapping[str, Any]
    """Plan fields found (tp, pp, vpp, sp, recompute, zero, micro_batch, global_batch, dtype, overlap, order,
    attention, and cp/cp_kind/ep/etp when not the defaults)."""
    model_shape: Mapping[str, Any] = field(default_factory=dict)
    """``ModelSpec`` fields the file states (num_layers, hidden_size, ...; norm, activation, position, ...)."""
    model_ref: str | None = None
    cluster_ref: str | None = None
    gpus: int | None = None
    dp: int | None = None
    """data-parallel degree the file implies (DeepSpeed batch sizes, torchtitan degrees), checked against gpus."""
    batch_per_replica: int | None = None
    """sequences per data-parallel replica per step when the file sets the global batch that way (torchtitan
    global_batch_size = -1): global batch = this x dp."""
    layers_per_virtual_stage: int | None = None
    """layers per (virtual) pipeline stage when the file states vpp that way: vpp = layers / (pp x this),
    computed once the model is known."""
    notes: tuple[str, ...] = ()
    """unknown flags, unresolved variables, settings tpsim approximates: listed for the user."""
    stack: str | None = None
    """the stack the file's framework runs when the file says (a NeMo config's distributed_fused_adam: the
    ``nemo`` stack); None: the format's (``tpsim.launch.FORMAT_STACK``)."""
    stack_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """stack figures the file sets beyond the plan ({section: {key: value}}: recomputed modules, optimizer and
    gradient dtypes, fp8 parameters), applied to the format's stack (:func:`tpsim.stacks.derived_stack`)."""


# ------------------------------------------------------------------------------------------------- header

def header_lines(ctx: ExportContext, fmt: str) -> list[str]:
    """The comment header (without comment markers): model, cluster, plan, prediction, then the tag line."""
    from .. import __version__

    m, p = ctx.model, ctx.plan
    kv = f", {m.num_kv_heads} kv heads" if m.num_kv_heads != m.num_attention_heads else ""
    lines = [f"{fmt} launch config written by tpsim {__version__} (tpsim export; docs/EXPORT.md)",
             f"model:      {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads"
             f"{kv}, ffn {m.ffn_hidden_size}, vocab {m.vocab_size}, seq {m.seq_len}",
             f"cluster:    {ctx.cluster_desc}",
             f"plan:       {p.short()} (global batch {p.global_batch}, {p.num_microbatches} micro-batches per "
             f"replica, {p.dtype}, {p.attention} attention, order {p.order})"]
    e = ctx.prediction
    if e:
        per_gpu = e.get("tokens_per_s_per_gpu") or e["tokens_per_s"] / max(1, ctx.gpus)
        lines.append(f"prediction: step {e['step_time_s']:.3f} s, {e['tokens_per_s']:,.0f} tokens/s "
                     f"({per_gpu:,.0f} per GPU), MFU {100 * e['mfu']:.1f}% ({e.get('flops_convention', 'causal')} "
                     f"FLOPs), peak memory {e['peak_memory_gib']:.1f} GiB per GPU "
                     f"({'fits' if e['fits'] else 'DOES NOT FIT'})")
        lines.append(f"            for the {e.get('stack', 'megatron')} stack (this format's), compute model "
                     f"{e.get('compute_model', '?')}")
    extra = "".join(f" {k}={int(v)}" for k, v in ctx.model_overrides.items() if v is not None)
    lines.append(f"{HEADER_TAG} model={_ref(ctx.model_ref)} cluster={_ref(ctx.cluster_ref)} gpus={ctx.gpus}{extra}")
    return lines


def _ref(text: str) -> str:
    if re.search(r"\s", text):
        raise InputError(f"model/cluster reference {text!r} contains whitespace (not written to the header)")
    return text


def commented(lines: list[str], marker: str = "#") -> str:
    return "".join(f"{marker} {line}".rstrip() + "\n" for line in lines)


def header_shape(header: Mapping[str, str]) -> dict[str, int]:
    """ModelSpec fields of the header's shape overrides (``layers=4`` -> ``num_layers: 4``)."""
    names = {v: k for k, v in _SHAPE_OVERRIDES.items()}
    return {names[k]: ascii_int(v) for k, v in header.items() if k in names and ascii_int(v) is not None}


def read_header(text: str) -> dict[str, str]:
    """The ``# tpsim: model=... cluster=... gpus=...`` line of an exported file ({} when absent)."""
    match = re.search(r"^\s*#\s*tpsim:\s*(.+)$", text, re.MULTILINE)
    if not match:
        return {}
    return dict(item.split("=", 1) for item in match.group(1).split() if "=" in item)


# ------------------------------------------------------------------------------------------------- checks

MODEL_FEATURES = ("moe", "mla", "mtp")
"""model features a format may write (its module's ``MODEL_FEATURES``); the others are never written."""


def model_features(m: ModelSpec) -> list[tuple[str, str]]:
    """(feature key, description) of what the model has beyond a dense GPT/Llama block."""
    found = [(key, what) for key, what, present in (
        ("moe", "mixture of experts", (getattr(m, "num_experts", 0) or 0) > 0),
        ("mla", "MLA attention", getattr(m, "attention_kind", "standard") != "standard"),
        ("mtp", "multi-token prediction", (getattr(m, "mtp_layers", 0) or 0) > 0),
        ("activation", f"{m.activation} activation", m.activation not in ("gelu", "swiglu")),
        ("window", "sliding-window attention", bool(getattr(m, "sliding_window", 0))),
        ("residual", "parallel residual", bool(getattr(m, "parallel_residual", False)))) if present]
    return found


def check_exportable(ctx: ExportContext, stack: Any, fmt: str, extra: str | None = None,
                     writes: frozenset = frozenset()) -> None:
    """The plan must be valid for tpsim and runnable by the format's stack: an error naming the reason.
    ``writes``: the model features (:data:`MODEL_FEATURES`) the format's files state; a model with another is
    refused (the files would describe a different model)."""
    from ..plan import validate_plan

    validate_plan(ctx.model, ctx.plan, ctx.gpus)
    m = ctx.model
    unwritten = [what for key, what in model_features(m) if key not in writes]
    if unwritten:
        raise InputError(f"cannot export {m.name} to {fmt}: {', '.join(unwritten)} not written by the {fmt} "
                         f"exporter (the files would describe a different model)")
    problem = stack.plan_violation(ctx.plan, ctx.model) or extra
    if problem:
        raise InputError(f"cannot export plan {ctx.plan.short()} to {fmt}: {problem}")


# ------------------------------------------------------------------------------------------------- import -> plan

def resolve_model(imp: ImportedLaunch, model: ModelSpec | None = None) -> ModelSpec:
    """The model of an import: ``model`` (the caller's, e.g. ``--model``) or the header's/flavor's reference,
    with the shape the file states applied on top; or a model built from the file's shape alone."""
    base = model
    if base is None and imp.model_ref:
        base = load_model(imp.model_ref)
    shape = dict(imp.model_shape)
    if base is not None:
        return _apply_shape(base, shape, imp)
    return _model_from_shape(shape, imp)


_SHAPE_OVERRIDES = {"num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
                    "num_kv_heads": "kv_heads", "ffn_hidden_size": "ffn", "vocab_size": "vocab", "seq_len": "seq_len"}


def _apply_shape(base: ModelSpec, shape: Mapping[str, Any], imp: ImportedLaunch) -> ModelSpec:  # noqa: ARG001 (unused: kept for the callers)
    overrides = {_SHAPE_OVERRIDES[k]: int(v) for k, v in shape.items()
                 if k in _SHAPE_OVERRIDES and int(v) != getattr(base, k)}
    spec = with_overrides(base, **overrides)
    shape = dict(shape)
    if "shared_expert_ffn_hidden_size" in shape and (shape.get("num_shared_experts", 0)
                                                     * shape["shared_expert_ffn_hidden_size"]
                                                     == spec.num_shared_experts * spec.shared_expert_ffn_hidden_size):
        shape.pop("num_shared_experts", None)  # the same total width stated as one shared expert
        shape.pop("shared_expert_ffn_hidden_size")
    extra = {k: v for k, v in shape.items() if k in ("norm", "activation", "position", "tie_embeddings",
                                                     "qkv_bias", "linear_bias", "head_dim", "rotary_base",
                                                     "rotary_fraction") + MOE_SHAPE_FIELDS
             and getattr(spec, k) != v}
    return dataclasses.replace(spec, **extra) if extra else spec


def _model_from_shape(shape: Mapping[str, Any], imp: ImportedLaunch) -> ModelSpec:
    required = ("num_layers", "hidden_size", "num_attention_heads", "seq_len", "vocab_size")
    missing = [k for k in required if k not in shape]
    if missing:
        raise InputError(f"{imp.path}: the model is not named (no tpsim header) and the file lacks "
                         f"{', '.join(missing)}: give --model (a preset or config.json)")
    values = dict(shape)
    llama = values.get("activation") == "swiglu"
    values.setdefault("num_kv_heads", values["num_attention_heads"])
    values.setdefault("ffn_hidden_size", 4 * values["hidden_size"])
    values.setdefault("max_positions", values["seq_len"])
    values.setdefault("norm", "rmsnorm" if llama else "layernorm")
    values.setdefault("activation", "gelu")
    values.setdefault("position", "rotary" if llama else "learned")
    values.setdefault("tie_embeddings", not llama)
    values.setdefault("qkv_bias", not llama)
    values.setdefault("linear_bias", not llama)
    return ModelSpec(name=f"{imp.format}-import", family="llama" if llama else "gpt", **values)


FILE_STATES = {"schedule": "1f1b", "tp_overlap": False, "pp_first": 0, "pp_last": 0, "pp_embedding": False,
               "pp_loss": False, "pp_layout": ()}
"""plan fields (docs/SCHEMAS.md T1) every launch format states by a flag or key whose absence is the default."""


_SPLIT_SHAPE = frozenset(("pp", "vpp", "pp_first", "pp_last", "pp_embedding", "pp_loss"))
"""command-line plan fields that replace an imported pipeline layout (they give another split)."""


def resolve_plan(imp: ImportedLaunch, model: ModelSpec, gpus: int, global_batch: int | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Plan:
    """The plan of an import on ``gpus`` GPUs (dp derived), with ``overrides`` (command-line plan flags) on top;
    the dp the file implies must match."""
    fields = {k: v for k, v in imp.plan_fields.items() if v is not None}
    for k, v in FILE_STATES.items():   # a launch file states these: absent means the framework's default, not
        fields.setdefault(k, v)        # the model preset's (deepseek-v3's dualpipe is hai-llm's schedule)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if fields.get("pp_layout") and "pp_layout" not in given and given.keys() & _SPLIT_SHAPE:
        fields["pp_layout"] = ()  # the file's layout was for its own pipeline shape: the command line's wins
    fields.update(given)
    later = [k for k in PLAN_AXES_LATER if k in fields and fields[k] != AXIS_DEFAULTS[k]]
    missing = [k for k in later if k not in Plan.__dataclass_fields__]
    if missing:
        values = ", ".join(f"{k}={fields[k]}" for k in missing)
        raise InputError(f"{imp.path}: {values}: this tpsim's plans have no {'/'.join(missing)} axis yet")
    for k in PLAN_AXES_LATER:
        if k in fields and k not in later:
            fields.pop(k)
    if imp.layers_per_virtual_stage and "vpp" not in (overrides or {}):
        fields["vpp"] = _vpp(imp, model, int(fields.get("pp", 1)))
    batch = global_batch if global_batch is not None else fields.pop("global_batch", None)
    if batch is None and imp.batch_per_replica:
        model_ranks = int(fields.get("tp", 1)) * int(fields.get("pp", 1)) * int(fields.get("cp", 1))
        batch = imp.batch_per_replica * max(1, gpus // model_ranks)
    fields.pop("global_batch", None)
    plan = make_plan(model, gpus, global_batch=batch, **fields)
    if imp.dp is not None and plan.dp != imp.dp and not (overrides and {"tp", "pp"} & set(overrides)):
        raise InputError(f"{imp.path}: the file implies dp={imp.dp} but {gpus} GPUs with tp={plan.tp} "
                         f"pp={plan.pp} give dp={plan.dp} (give --gpus {imp.dp * gpus // plan.dp})")
    return plan


def _vpp(imp: ImportedLaunch, model: ModelSpec, pp: int) -> int:
    per_stage = int(imp.layers_per_virtual_stage or 1)
    layers = model.num_layers
    if imp.format == "torchtitan" and (layers + 2) % (pp * per_stage) == 0:
        # torchtitan splits the layers + 2 (embedding and output as one layer each) over its virtual stages
        # when they divide evenly; the layers alone otherwise (the export's two cases, told apart here)
        alone = layers // (pp * per_stage)
        if layers % (pp * per_stage) or (layers + 2) % (pp * alone) == 0:
            layers += 2
    if layers % (pp * per_stage):
        raise InputError(f"{imp.path}: {layers} layers are not pp={pp} x {per_stage} layers per virtual "
                         f"stage")
    return layers // (pp * per_stage)
