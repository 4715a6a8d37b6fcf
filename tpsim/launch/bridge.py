"""Megatron-Bridge (NeMo 2's training library) recipes: export a plan as a Python recipe file that builds the
framework's ``ConfigContainer``, and read one back without running it.

The file follows the recipe API of megatron-bridge 0.3.1 (``megatron/bridge/recipes/llama/llama3.py``): start
from ``megatron.bridge.recipes.common._pretrain_common()``, set ``cfg.model`` to a ``GPTModelProvider`` (a
Megatron-Core ``TransformerConfig`` with GPT fields: megatron-core 0.16.1) and the training, DDP, dataset and
mixed-precision fields, and launch with ``megatron.bridge.training.pretrain.pretrain(cfg, forward_step)``. Every
keyword and attribute written is a field of those dataclasses; tests/test_export_frameworks.py checks it against
the installed package's source and, where the package imports (it needs Transformer Engine, so a GPU machine),
builds the config.

The import reads the literal keyword arguments of ``GPTModelProvider(...)`` and the ``cfg.<section>.<field> =
<literal>`` assignments with :mod:`ast` (nothing is executed); other statements are listed as not used.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .common import ExportContext, ImportedLaunch, axis, commented, header_lines, header_shape, read_header

FILENAME = "megatron_bridge_recipe.py"
BRIDGE_VERSION = "megatron-bridge 0.3.1 recipe API, megatron-core 0.16.1 TransformerConfig"
MODEL_FEATURES = ("moe",)
"""model features the recipe states (GPTModelProvider's MoE fields); MLA needs another provider class."""
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed"}
"""plan dtype -> a recipe name of megatron/bridge/training/mixed_precision.py (fp32: no mixed precision)."""
DTYPE_OF_PRECISION = {v: k for k, v in MIXED_PRECISION.items()}
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
CP_COMM = {"ring": "p2p", "a2a": "a2a"}


def format_violation(ctx: ExportContext) -> str | None:
    """What the recipe cannot state: schedules other than (interleaved) 1F1B, the rank order, a shared-expert
    gate."""
    from ..stacks import order_key

    plan = ctx.plan
    if plan.schedule != "1f1b":
        return f"schedule={plan.schedule}: Megatron-Core's schedules in Megatron-Bridge are 1F1B and interleaved 1F1B"
    if order_key(plan.order) not in ("tp-dp-pp",):
        return f"order={plan.order}: the recipe has no rank-order field (Megatron-Core's default tp-cp-ep-dp-pp)"
    if ctx.model.shared_expert_gate:
        return "shared_expert_gate: Megatron-Core's TransformerConfig has no shared-expert gate (Qwen2-MoE)"
    if plan.pp > 1 and not (plan.pp_first or plan.pp_last or plan.pp_layout) and ctx.model.num_layers % (plan.pp * plan.vpp):
        return (f"pp={plan.pp} x vpp={plan.vpp} does not divide num_layers={ctx.model.num_layers}: give "
                "--pp-first-layers / --pp-last-layers")
    return None


def model_fields(ctx: ExportContext) -> dict[str, Any]:
    """Keyword arguments of ``GPTModelProvider``: shape, parallel sizes, recomputation, pipeline split."""
    m, plan = ctx.model, ctx.plan
    kw: dict[str, Any] = {"num_layers": m.num_layers, "hidden_size": m.hidden_size,
                          "ffn_hidden_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
                          "num_query_groups": m.num_kv_heads, "kv_channels": m.head_dim, "seq_length": m.seq_len,
                          "vocab_size": m.vocab_size, "make_vocab_size_divisible_by": 128,
                          "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
                          "gated_linear_unit": m.activation == "swiglu",
                          "position_embedding_type": "rope" if m.position == "rotary" else "learned_absolute",
                          "add_bias_linear": bool(m.linear_bias), "add_qkv_bias": bool(m.qkv_bias),
                          "share_embeddings_and_output_weights": bool(m.tie_embeddings)}
    if m.position == "rotary":
        kw["rotary_base"] = int(m.rotary_base or 10000)
        kw["rotary_percent"] = float(m.rotary_fraction)
    kw.update(tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
              virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
              context_parallel_size=axis(plan, "cp"), sequence_parallel=bool(plan.sp),
              tp_comm_overlap=bool(plan.tp_overlap))
    if axis(plan, "cp") > 1:
        kw["cp_comm_type"] = CP_COMM[axis(plan, "cp_kind")]
    if plan.pp_layout and plan.pp > 1:  # TransformerConfig.pipeline_model_parallel_layout (Megatron's layout string)
        from .megatron import layout

        kw["pipeline_model_parallel_layout"] = layout(m.num_layers, plan.pp, plan.vpp, m.mtp_layers, plan.pp_layout)
    if plan.pp_first:
        kw["num_layers_in_first_pipeline_stage"] = plan.pp_first
    if plan.pp_last:
        kw["num_layers_in_last_pipeline_stage"] = plan.pp_last
    if plan.pp_embedding:
        kw["account_for_embedding_in_pipeline_split"] = True
    if plan.pp_loss:
        kw["account_for_loss_in_pipeline_split"] = True
    if plan.recompute == "selective":
        kw.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif plan.recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if m.is_moe:
        from .megatron import moe_layer_freq

        kw.update(num_moe_experts=m.num_experts, moe_router_topk=m.experts_per_token,
                  moe_ffn_hidden_size=m.moe_ffn_hidden_size, moe_grouped_gemm=True,
                  moe_token_dispatcher_type="alltoall", expert_model_parallel_size=axis(plan, "ep"),
                  expert_tensor_parallel_size=axis(plan, "etp") or plan.tp)
        shared = m.num_shared_experts * m.shared_expert_ffn_hidden_size
        if shared:
            kw["moe_shared_expert_intermediate_size"] = shared
        freq = moe_layer_freq(m)
        kw["moe_layer_freq"] = int(freq) if freq.isdigit() else [1 if m.is_moe_layer(i) else 0
                                                                  for i in range(m.num_layers)]
        if m.router_groups:
            kw.update(moe_router_num_groups=m.router_groups, moe_router_group_topk=m.router_group_topk)
        if m.capacity_factor:
            kw["moe_expert_capacity_factor"] = float(m.capacity_factor)
    return kw


def config_fields(ctx: ExportContext) -> dict[str, dict[str, Any]]:
    """``cfg.<section>.<field>`` values: batch sizes, sequence length, data-parallel sharding and overlap."""
    plan = ctx.plan
    ddp: dict[str, Any] = {"use_distributed_optimizer": plan.zero >= 1, "overlap_grad_reduce": bool(plan.overlap),
                           "overlap_param_gather": bool(plan.overlap and plan.zero >= 1),
                           "use_megatron_fsdp": plan.zero >= 2,
                           "data_parallel_sharding_strategy": SHARDING.get(plan.zero, "no_shard")}
    return {"train": {"global_batch_size": plan.global_batch, "micro_batch_size": plan.micro_batch},
            "dataset": {"seq_length": ctx.model.seq_len}, "ddp": ddp,
            "optimizer": {"use_distributed_optimizer": plan.zero >= 1}}


def launch_line(ctx: ExportContext) -> str:
    from .megatron import launcher

    return launcher(ctx) + f" {FILENAME}"


def export_files(ctx: ExportContext) -> dict[str, str]:
    """``megatron_bridge_recipe.py``: the header as comments, then a ``pretrain_config()`` recipe and a
    ``__main__`` that trains it (mock data unless ``cfg.dataset.blend`` is set)."""
    notes = [f"fields: {BRIDGE_VERSION}; launch on every node (one rank per GPU):",
             launch_line(ctx),
             "data: cfg.dataset.blend (mock data by default); tokenizer: cfg.tokenizer (NullTokenizer by default)."]
    lines = ['"""tpsim plan as a Megatron-Bridge recipe (tpsim export --format bridge; docs/EXPORT.md)."""', "",
             "import torch.nn.functional as F", "",
             "from megatron.bridge.models.gpt_provider import GPTModelProvider",
             "from megatron.bridge.recipes.common import _pretrain_common",
             "from megatron.bridge.training.config import ConfigContainer", "", "",
             "def pretrain_config() -> ConfigContainer:",
             '    """The tpsim plan: the recipe API\'s common pre-training defaults with this model and plan."""',
             "    cfg = _pretrain_common()",
             "    cfg.model = GPTModelProvider("]
    model = model_fields(ctx)
    for k, v in model.items():
        lines.append(f"        {k}={v!r},")
    if ctx.model.activation == "swiglu":
        lines.append("        activation_func=F.silu,")
    lines.append("    )")
    for section, values in config_fields(ctx).items():
        for k, v in values.items():
            lines.append(f"    cfg.{section}.{k} = {v!r}")
    precision = MIXED_PRECISION.get(ctx.plan.dtype)
    lines.append(f"    cfg.mixed_precision = {precision!r}")
    lines += ["    return cfg", "", "", 'if __name__ == "__main__":',
              "    from megatron.bridge.training.gpt_step import forward_step",
              "    from megatron.bridge.training.pretrain import pretrain", "",
              "    pretrain(pretrain_config(), forward_step)", ""]
    return {FILENAME: "#!/usr/bin/env python3\n" + commented(header_lines(ctx, "Megatron-Bridge") + notes)
            + "\n".join(lines)}


# ------------------------------------------------------------------------------------------------- import

def _cpu_optimizer(config: Mapping[tuple[str, ...], Any], where: str, notes: list[str]) -> dict[str, Any]:
    """``memory.optimizer_cpu_fraction`` / ``optimizer_cpu_overlap`` of ``cfg.optimizer.optimizer_cpu_offload``
    (Megatron-Core OptimizerConfig: ``optimizer_offload_fraction`` defaults to 0.0 there, unlike Megatron-LM's
    command line)."""
    fraction = config.get(("optimizer", "optimizer_offload_fraction"), 0.0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise InputError(f"{where}: cfg.optimizer.optimizer_offload_fraction={fraction!r} is not a fraction in [0, 1]")
    notes.append(f"cfg.optimizer.optimizer_cpu_offload: {float(fraction):g} of the optimizer states held and updated "
                 f"on the CPU (its update timed at the node's CPU memory bandwidth: a lower bound)")
    return {"optimizer_cpu_fraction": float(fraction),
            "optimizer_cpu_overlap": config.get(("optimizer", "overlap_cpu_optimizer_d2h_h2d")) is True}


def _layout_fields(text: Any, pp: int, where: str) -> dict[str, Any]:
    """Plan fields of ``pipeline_model_parallel_layout``: vpp, and the split fields that reproduce it or the
    layout itself (:func:`tpsim.launch.megatron.split_of_layout`)."""
    import re

    from .megatron import fields_of_layout, layout_chunks

    if not isinstance(text, str):
        raise InputError(f"{where}: pipeline_model_parallel_layout={text!r} must be a layout string of E, t, m, L "
                         f"and |")
    try:
        chunks = layout_chunks(text)
    except (ValueError, re.error):
        raise InputError(f"{where}: pipeline_model_parallel_layout {text[:80]!r} is not a layout of E, t, m, L "
                         f"and |") from None
    if len(chunks) % max(pp, 1):
        raise InputError(f"{where}: pipeline_model_parallel_layout has {len(chunks)} stages, not a multiple of "
                         f"pp={pp}")
    return {"vpp": len(chunks) // max(pp, 1), **fields_of_layout(chunks, pp)}


PLAN_OF_MODEL = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
                 "virtual_pipeline_model_parallel_size": "vpp", "context_parallel_size": "cp",
                 "sequence_parallel": "sp", "tp_comm_overlap": "tp_overlap", "expert_model_parallel_size": "ep",
                 "num_layers_in_first_pipeline_stage": "pp_first", "num_layers_in_last_pipeline_stage": "pp_last",
                 "account_for_embedding_in_pipeline_split": "pp_embedding",
                 "account_for_loss_in_pipeline_split": "pp_loss"}
SHAPE_OF_MODEL = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
                  "num_attention_heads": "num_attention_heads", "num_query_groups": "num_kv_heads",
                  "seq_length": "seq_len", "vocab_size": "vocab_size", "rotary_base": "rotary_base",
                  "rotary_percent": "rotary_fraction", "num_moe_experts": "num_experts",
                  "moe_router_topk": "experts_per_token", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
                  "moe_router_num_groups": "router_groups", "moe_router_group_topk": "router_group_topk",
                  "moe_expert_capacity_factor": "capacity_factor"}
READ_MODEL = set(PLAN_OF_MODEL) | set(SHAPE_OF_MODEL) | {
    "kv_channels", "make_vocab_size_divisible_by", "normalization", "gated_linear_unit", "position_embedding_type",
    "add_bias_linear", "add_qkv_bias", "share_embeddings_and_output_weights", "cp_comm_type", "recompute_granularity",
    "recompute_modules", "recompute_method", "recompute_num_layers", "moe_grouped_gemm", "moe_token_dispatcher_type",
    "expert_tensor_parallel_size", "moe_shared_expert_intermediate_size", "moe_layer_freq", "activation_func",
    "overlap_moe_expert_parallel_comm", "moe_enable_deepep", "moe_router_force_load_balancing",
    "pipeline_model_parallel_layout"}
"""(the last three: tpsim/launch/megatron.py MOE_COMM_OPTIONS and FORCED_BALANCE_OPTION)"""
READ_CONFIG = {("train", "global_batch_size"), ("train", "micro_batch_size"), ("dataset", "seq_length"),
               ("ddp", "use_distributed_optimizer"), ("ddp", "overlap_grad_reduce"), ("ddp", "overlap_param_gather"),
               ("ddp", "use_megatron_fsdp"), ("ddp", "data_parallel_sharding_strategy"),
               ("optimizer", "use_distributed_optimizer"), ("optimizer", "optimizer_cpu_offload"),
               ("optimizer", "optimizer_offload_fraction"), ("optimizer", "overlap_cpu_optimizer_d2h_h2d"),
               ("mixed_precision",)}


def read_recipe(path: Path, text: str) -> tuple[dict[str, Any], dict[tuple[str, ...], Any], list[str]]:
    """(GPTModelProvider keywords, {cfg attribute path: value}, notes) of a recipe file, by :mod:`ast`."""
    try:
        tree = ast.parse(text, str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise InputError(f"{path}: not valid Python ({str(exc).splitlines()[0][:200]})") from None
    model: dict[str, Any] = {}
    config: dict[tuple[str, ...], Any] = {}
    notes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == \
                "GPTModelProvider":
            for kw in node.keywords:
                if kw.arg is None:
                    notes.append("GPTModelProvider(**...) not read")
                    continue
                model[kw.arg] = _literal(kw.value, kw.arg)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            chain = _attribute_chain(node.targets[0])
            if chain and chain[0] == "cfg" and len(chain) > 1 and chain[1] != "model":
                config[tuple(chain[1:])] = _literal(node.value, ".".join(chain))
    if not model:
        raise InputError(f"{path}: no GPTModelProvider(...) call: not a Megatron-Bridge recipe tpsim reads")
    unused = sorted(k for k in model if k not in READ_MODEL)
    unused += sorted(".".join(k) for k in config if k not in READ_CONFIG)
    if unused:
        notes.append("fields not used by tpsim: " + " ".join(unused[:12]) + (" ..." if len(unused) > 12 else ""))
    return model, config, notes


class _Opaque:
    """A value the import cannot read as a literal (a function such as ``F.silu``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _literal(node: ast.AST, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return _Opaque(ast.unparse(node)[:80] if hasattr(ast, "unparse") else where)


def _attribute_chain(node: ast.AST) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + names[::-1]
    return None


def import_text(path: Path, text: str) -> ImportedLaunch:
    """A Megatron-Bridge recipe file as an :class:`ImportedLaunch`."""
    model, config, notes = read_recipe(path, text)
    where = str(path)

    def value(key: str, kind: type, default: Any) -> Any:
        v = model.get(key, default)
        if v is None:
            return default
        if kind is bool:
            if not isinstance(v, bool):
                raise InputError(f"{where}: {key}={v!r} must be True or False")
            return v
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise InputError(f"{where}: {key}={v!r} must be an integer")
        return v

    fields: dict[str, Any] = {}
    for key, name in PLAN_OF_MODEL.items():
        kind = bool if name in ("sp", "tp_overlap", "pp_embedding", "pp_loss") else int
        default = {"vpp": 1, "cp": 1, "ep": 1, "tp": 1, "pp": 1}.get(name, False if kind is bool else 0)
        v = value(key, kind, default)
        if v not in (default,) or name in ("tp", "pp", "vpp", "sp"):
            fields[name] = v
    if int(fields.get("cp", 1)) > 1:
        comm = model.get("cp_comm_type", "p2p")
        fields["cp_kind"] = "a2a" if comm == "a2a" else "ring"
        if comm not in ("p2p", "a2a"):
            notes.append(f"cp_comm_type {comm!r}: estimated as ring (p2p)")
    layout_value = model.get("pipeline_model_parallel_layout")
    if layout_value is not None:
        fields.update(_layout_fields(layout_value, int(fields.get("pp", 1)), where))
    etp = model.get("expert_tensor_parallel_size")
    if int(fields.get("ep", 1)) > 1 and isinstance(etp, int) and etp != fields.get("tp", 1):
        fields["etp"] = etp
    granularity = model.get("recompute_granularity")
    fields["recompute"] = granularity if granularity in ("selective", "full") else "none"
    memory: dict[str, Any] = {}
    comm: dict[str, Any] = {}
    modules = model.get("recompute_modules")
    if granularity == "selective" and isinstance(modules, (list, tuple)):
        from .megatron import recompute_module_figures

        memory.update(recompute_module_figures(list(modules), "recompute_modules", notes))
    from .megatron import FORCED_BALANCE_OPTION, MOE_COMM_OPTIONS

    comm.update({figure: True for option, figure in MOE_COMM_OPTIONS.items() if model.get(option) is True})
    if config.get(("optimizer", "optimizer_cpu_offload")) is True:
        memory.update(_cpu_optimizer(config, where, notes))
    ddp = {k[1]: v for k, v in config.items() if k[0] == "ddp" and len(k) == 2}
    strategy = ddp.get("data_parallel_sharding_strategy", "no_shard")
    if ddp.get("use_megatron_fsdp") and strategy in ("optim_grads", "optim_grads_params"):
        fields["zero"] = 2 if strategy == "optim_grads" else 3
    else:
        fields["zero"] = 1 if ddp.get("use_distributed_optimizer") else 0
    fields["overlap"] = bool(ddp.get("overlap_grad_reduce", False))
    precision = config.get(("mixed_precision",))
    if precision is not None and precision not in DTYPE_OF_PRECISION:
        notes.append(f"mixed_precision {precision!r}: estimated as bf16")
    fields["dtype"] = DTYPE_OF_PRECISION.get(precision, "bf16") if precision is not None else "fp32"
    fields["attention"], fields["order"] = "flash", "tp-dp-pp"
    for key, name in (("micro_batch_size", "micro_batch"), ("global_batch_size", "global_batch")):
        v = config.get(("train", key))
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise InputError(f"{where}: cfg.train.{key}={v!r} must be a positive integer")
            fields[name] = v
    shape = {name: model[key] for key, name in SHAPE_OF_MODEL.items()
             if isinstance(model.get(key), (int, float)) and not isinstance(model.get(key), bool)}
    if "num_layers" in shape:   # a full provider states these choices
        shape.update(norm="rmsnorm" if model.get("normalization") == "RMSNorm" else "layernorm",
                     activation="swiglu" if model.get("gated_linear_unit") else "gelu",
                     position="rotary" if model.get("position_embedding_type") == "rope" else "learned",
                     tie_embeddings=bool(model.get("share_embeddings_and_output_weights", True)),
                     linear_bias=bool(model.get("add_bias_linear", True)),
                     qkv_bias=bool(model.get("add_qkv_bias", model.get("add_bias_linear", True))))
        kv = model.get("kv_channels")
        if isinstance(kv, int) and kv * shape.get("num_attention_heads", 0) != shape.get("hidden_size"):
            shape["head_dim"] = kv
    if "num_experts" in shape:
        from .megatron import parse_layer_freq

        shared = model.get("moe_shared_expert_intermediate_size") or 0
        shape.update(num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=int(shared))
        freq = model.get("moe_layer_freq", 1)
        shape.update(parse_layer_freq(str(freq).replace(" ", ""), shape.get("num_layers"), where))
        if model.get(FORCED_BALANCE_OPTION) is True:
            shape["moe_balance"] = "forced"
    header = read_header(text)
    shape = {**header_shape(header), **shape}
    gpus = int(header["gpus"]) if header.get("gpus", "").isdigit() else None
    overrides = {k: v for k, v in (("memory", memory), ("comm", comm)) if v}
    return ImportedLaunch(format="bridge", path=path, plan_fields=fields, model_shape=shape,
                          model_ref=header.get("model"), cluster_ref=header.get("cluster"), gpus=gpus,
                          notes=tuple(notes), stack_overrides=overrides)
