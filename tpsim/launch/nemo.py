"""NeMo (1.x, Megatron-Core GPT) YAML: the ``trainer`` and ``model`` keys of NeMo's Megatron GPT config.

Keys are those of NeMo's ``megatron_gpt_config.yaml`` family as in the NeMo-Framework-Launcher base configs
(gpt3.yaml, llama3_8b.yaml reproduced in NVIDIA/NeMo nemo/collections/llm/tools/auto_configurator/tests/
base_configs_tests/test_base_configs.py at commit 00bdb97c): trainer.devices / num_nodes / precision; model
micro_batch_size, global_batch_size, tensor_model_parallel_size, pipeline_model_parallel_size,
virtual_pipeline_model_parallel_size, context_parallel_size, expert_model_parallel_size, sequence_parallel,
encoder_seq_length, num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups,
normalization, activation, position_embedding_type, bias, share_embeddings_and_output_weights,
activations_checkpoint_granularity / method / num_layers, mcore_gpt, fp8 / fp8_hybrid, use_flash_attention,
optim.name (the distributed optimizer: mcore_distributed_optim, Megatron-Core's, for the megatron stack;
distributed_fused_adam, NeMo's Apex DistributedFusedAdam, when the prediction is the nemo stack's) and
optim.overlap_grad_sync; ZeRO-2/3 are
NeMo's torch FSDP (fsdp, fsdp_sharding_strategy 'grad' / 'full'). Context-parallel kind, expert tensor
parallelism and the MoE shape are Megatron-Core ModelParallelConfig / TransformerConfig field names
(cp_comm_type, expert_tensor_parallel_size, num_moe_experts, moe_router_topk, moe_ffn_hidden_size,
moe_shared_expert_intermediate_size, moe_layer_freq, moe_grouped_gemm, moe_token_dispatcher_type,
moe_router_num_groups, moe_router_group_topk, moe_expert_capacity_factor, moe_router_score_function,
moe_router_enable_expert_bias), which NeMo's MegatronBaseModel.build_model_parallel_config /
build_transformer_config copy from the model config ("For attributes in the nemo model config that are the same
as the megatron core TransformerConfig, we will use the value from the nemo model config").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import ascii_int
from .common import ExportContext, ImportedLaunch, axis, commented, header_lines, header_shape, read_header

FILENAME = "nemo_megatron_gpt.yaml"
MODEL_FEATURES = ("moe",)
"""model features the config states: mixtures of experts (Megatron-Core TransformerConfig MoE fields); NeMo 1.x's
Megatron GPT model builds a plain TransformerConfig (no MLA config, no multi-token prediction block)."""
CP_COMM = {"ring": "p2p", "a2a": "a2a"}
"""tpsim cp_kind -> Megatron-Core TransformerConfig.cp_comm_type."""
NEMO_VERSION = "NeMo 1.x Megatron GPT config (launcher base configs, NVIDIA/NeMo 00bdb97c)"
PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": 32, "fp8": "bf16-mixed"}
FSDP = {2: "grad", 3: "full"}


def format_violation(ctx: ExportContext) -> str | None:
    from ..stacks import order_key

    plan, layers = ctx.plan, ctx.model.num_layers
    if plan.dtype in ("mxfp8", "nvfp4"):
        return (f"dtype={plan.dtype}: the NeMo 1.x config has fp8 / fp8_hybrid keys only (no MXFP8 or NVFP4 "
                f"recipe key); export for megatron instead")
    t1 = [f"{k}={getattr(plan, k)}" for k, default in (("schedule", "1f1b"), ("tp_overlap", False), ("pp_first", 0),
                                                        ("pp_last", 0), ("pp_embedding", False), ("pp_loss", False),
                                                        ("pp_layout", ()))
          if getattr(plan, k) != default]
    if t1:
        return (f"{', '.join(t1)}: not written to the NeMo 1.x YAML (the Megatron-LM and Megatron-Bridge formats "
                "write them)")
    if order_key(plan.order) != "tp-dp-pp":
        return f"order={plan.order}: NeMo's config has no rank-order key (Megatron's default tp-cp-ep-dp-pp)"
    if ctx.model.shared_expert_gate:
        return "shared_expert_gate: Megatron-Core's TransformerConfig has no shared-expert gate (Qwen2-MoE)"
    if layers % (plan.pp * plan.vpp):
        return (f"pp={plan.pp} x vpp={plan.vpp} does not divide num_layers={layers}: the NeMo 1.x config has no "
                f"uneven pipeline layout key")
    return None


def config(ctx: ExportContext) -> dict[str, Any]:
    plan, m = ctx.plan, ctx.model
    model: dict[str, Any] = {
        "mcore_gpt": True, "micro_batch_size": plan.micro_batch, "global_batch_size": plan.global_batch,
        "tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
        "context_parallel_size": axis(plan, "cp"), "expert_model_parallel_size": axis(plan, "ep"),
        "sequence_parallel": plan.sp,
        "encoder_seq_length": m.seq_len, "max_position_embeddings": m.max_positions, "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_query_groups": m.num_kv_heads,
        "kv_channels": None if m.head_dim * m.num_attention_heads == m.hidden_size else m.head_dim,
        "normalization": m.norm, "activation": "fast-swiglu" if m.activation == "swiglu" else "gelu",
        "position_embedding_type": "rope" if m.position == "rotary" else "learned_absolute",
        "bias": m.linear_bias, "share_embeddings_and_output_weights": m.tie_embeddings,
        "make_vocab_size_divisible_by": 128,
        "activations_checkpoint_granularity": None if plan.recompute == "none" else plan.recompute,
        "activations_checkpoint_method": "uniform" if plan.recompute == "full" else None,
        "activations_checkpoint_num_layers": 1 if plan.recompute == "full" else None,
        "megatron_amp_O2": plan.dtype in ("bf16", "fp16", "fp8"), "transformer_engine": True,
        "fp8": plan.dtype == "fp8", "fp8_hybrid": plan.dtype == "fp8",
        "use_flash_attention": plan.attention == "flash",
        "fsdp": plan.zero in FSDP,
        "optim": {"name": (("distributed_fused_adam" if (ctx.prediction or {}).get("stack") == "nemo"
                            else "mcore_distributed_optim") if plan.zero == 1 else "fused_adam"),
                  "overlap_grad_sync": bool(plan.overlap)},
    }
    if plan.zero in FSDP:
        model["fsdp_sharding_strategy"] = FSDP[plan.zero]
    if axis(plan, "cp") > 1:
        model["cp_comm_type"] = CP_COMM[axis(plan, "cp_kind")]
    if axis(plan, "ep") > 1 and axis(plan, "etp"):
        model["expert_tensor_parallel_size"] = axis(plan, "etp")
    model.update(moe_keys(m))
    trainer = {"devices": ctx.devices_per_node, "num_nodes": ctx.nodes, "accelerator": "gpu",
               "precision": PRECISION[plan.dtype]}
    return {"trainer": trainer, "model": model}


def moe_keys(m) -> dict[str, Any]:
    """Megatron-Core TransformerConfig MoE fields (NeMo's ``build_transformer_config`` takes every model key
    that names a TransformerConfig field): routed experts, top-k, widths, the MoE/dense layer pattern (an
    integer N or a list of 0/1), grouped GEMMs with the all-to-all dispatcher, group-limited routing, capacity,
    DeepSeek-V3's auxiliary-loss-free router."""
    from ..estimator.moe import moe_constants
    from .megatron import moe_layer_freq

    if not m.is_moe:
        return {}
    keys: dict[str, Any] = {"num_moe_experts": m.num_experts, "moe_router_topk": m.experts_per_token,
                            "moe_ffn_hidden_size": m.moe_ffn_hidden_size}
    shared = m.num_shared_experts * m.shared_expert_ffn_hidden_size
    if shared:
        keys["moe_shared_expert_intermediate_size"] = shared
    freq = moe_layer_freq(m)
    if freq != "1":
        keys["moe_layer_freq"] = (ascii_int(freq) if ascii_int(freq) is not None
                                  else [1 if m.is_moe_layer(i) else 0 for i in range(m.num_layers)])
    keys.update(moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall")
    if m.router_groups:
        keys.update(moe_router_num_groups=m.router_groups, moe_router_group_topk=m.router_group_topk)
    if m.capacity_factor:
        keys["moe_expert_capacity_factor"] = float(m.capacity_factor)
    if m.architecture in moe_constants().loss_free_architectures:
        keys.update(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)
    return keys


def export_files(ctx: ExportContext) -> dict[str, str]:
    import yaml

    notes = [f"keys: {NEMO_VERSION}; merge into megatron_gpt_config.yaml (tokenizer, data, optim lr and",
             f"scheduler come from there). Vocabulary {ctx.model.vocab_size} comes from the tokenizer."]
    body = yaml.safe_dump(config(ctx), sort_keys=False, default_flow_style=False)
    return {FILENAME: commented(header_lines(ctx, "NeMo") + notes) + body}


# ------------------------------------------------------------------------------------------------- import

def import_text(path: Path, text: str) -> ImportedLaunch:
    from ..topology.files import read_yaml  # strict: duplicate keys refused, one line naming the file

    where = str(path)
    from ..schema import check
    from ..schemas import NEMO

    data = read_yaml(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("model"), Mapping):
        raise InputError(f"{path}: a NeMo config needs a model: section")
    check(NEMO, data, where)  # types, ranges and enums before any use (issue 26)
    model, trainer = data["model"], data.get("trainer") or {}
    notes: list[str] = []
    get = lambda key, default=None: model.get(key, default)  # noqa: E731
    tp, pp = _int(get("tensor_model_parallel_size", 1), "tensor_model_parallel_size", where), \
        _int(get("pipeline_model_parallel_size", 1), "pipeline_model_parallel_size", where)
    vpp = get("virtual_pipeline_model_parallel_size")
    fields: dict[str, Any] = {
        "tp": tp, "pp": pp, "vpp": _int(vpp, "virtual_pipeline_model_parallel_size", where) if vpp else 1,
        "sp": bool(get("sequence_parallel", False)) and tp > 1,
        "micro_batch": _int(get("micro_batch_size", 1), "micro_batch_size", where),
        "global_batch": _int(get("global_batch_size"), "global_batch_size", where) if get("global_batch_size")
        else None,
        "recompute": _recompute(get("activations_checkpoint_granularity"), get("activations_checkpoint_method"),
                                get("activations_checkpoint_num_layers"), where, notes),
        "zero": _zero(model, where), "dtype": _dtype(trainer.get("precision", 32), model, where),
        "overlap": bool((get("optim") or {}).get("overlap_grad_sync", False)), "order": "tp-dp-pp",
        "attention": "flash" if get("use_flash_attention", True) else "unfused"}
    cp = _int(get("context_parallel_size", 1) or 1, "context_parallel_size", where)
    if cp > 1:
        kind = {"p2p": "ring", "a2a": "a2a"}.get(get("cp_comm_type") or "p2p")
        if kind is None:
            notes.append(f"cp_comm_type {get('cp_comm_type')!r}: estimated as ring (p2p)")
            kind = "ring"
        fields.update(cp=cp, cp_kind=kind)
    ep = _int(get("expert_model_parallel_size", 1) or 1, "expert_model_parallel_size", where)
    if ep > 1:
        fields["ep"] = ep
        etp = get("expert_tensor_parallel_size")
        if etp is not None and _int(etp, "expert_tensor_parallel_size", where) != tp:
            fields["etp"] = etp
    stack, overrides = _optimizer_stack(get("optim") or {}, notes)
    header = read_header(text)
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes", 1)
    gpus = devices * (nodes or 1) if isinstance(devices, int) and devices > 0 and isinstance(nodes, (int, type(None))) \
        else None
    return ImportedLaunch(format="nemo", path=path, plan_fields=fields,
                          model_shape={**header_shape(header), **_shape(model, where)},
                          model_ref=header.get("model"), cluster_ref=header.get("cluster"),
                          gpus=gpus or ascii_int(header.get("gpus")),
                          notes=tuple(notes), stack=stack, stack_overrides=overrides)


def _optimizer_stack(optim: Mapping[str, Any], notes: list[str]) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """The stack a NeMo 1.x config's optimizer runs and its figures: ``distributed_fused_adam`` is NeMo's own
    distributed optimizer (Apex DistributedFusedAdam, the ``nemo`` stack: 16-bit gradient buckets, the fp32
    master as bf16 parameters plus remainders); with ``dtype: bf16`` it keeps bf16 moments and updates the bf16
    parameters in place (no master copy: NeMo nemo/core/optim/distributed_adam.py with store_params off, as the
    Nemotron-4 340B launcher recipe sets; tpsim/data/runs/stacks/nemo-optim-bf16.yaml). Other optimizers
    (``mcore_distributed_optim``, ``fused_adam``) run Megatron-Core's (the format's ``megatron`` stack)."""
    name = str(optim.get("name", ""))
    if name != "distributed_fused_adam":
        return None, {}
    dtype = str(optim.get("dtype", "fp32")).lower()
    if dtype in ("bf16", "bfloat16", "torch.bfloat16"):
        return "nemo", {"memory": {"main_params_dtype": "none", "optimizer_state_dtype": "bf16"}}
    if dtype not in ("fp32", "float32", "32", "torch.float32"):
        notes.append(f"optim.dtype {optim.get('dtype')!r}: estimated as fp32 optimizer states")
    return "nemo", {}


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: model.{key}={value!r} must be a positive integer")
    return value


def _recompute(granularity: Any, method: Any, layers: Any, where: str, notes: list[str]) -> str:
    if granularity in (None, "null"):
        return "none"
    if granularity not in ("selective", "full"):
        raise InputError(f"{where}: activations_checkpoint_granularity={granularity!r} is not selective or full")
    if granularity == "full" and (method == "block" or layers not in (None, 1)):
        notes.append(f"activations_checkpoint_method {method} num_layers {layers}: estimated as full "
                     f"recomputation of every layer")
    return str(granularity)


def _zero(model: Mapping[str, Any], where: str) -> int:
    if model.get("fsdp"):
        strategy = model.get("fsdp_sharding_strategy", "full")
        if strategy not in ("grad", "full"):
            raise InputError(f"{where}: fsdp_sharding_strategy={strategy!r}: tpsim models 'grad' (ZeRO-2) and "
                             f"'full' (ZeRO-3)")
        return 2 if strategy == "grad" else 3
    optim = str((model.get("optim") or {}).get("name", "fused_adam"))
    return 1 if optim.startswith("distributed") or optim == "mcore_distributed_optim" else 0


def _dtype(precision: Any, model: Mapping[str, Any], where: str) -> str:
    if model.get("fp8"):
        return "fp8"
    text = str(precision)
    if text.startswith("bf16"):
        return "bf16"
    if text.startswith("16"):
        return "fp16"
    if text.startswith("32"):
        return "fp32"
    raise InputError(f"{where}: trainer.precision={precision!r} is not bf16-mixed, 16-mixed or 32")


def _shape(model: Mapping[str, Any], where: str) -> dict[str, Any]:
    shape: dict[str, Any] = {}
    for key, name in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                      ("ffn_hidden_size", "ffn_hidden_size"), ("num_attention_heads", "num_attention_heads"),
                      ("num_query_groups", "num_kv_heads"), ("encoder_seq_length", "seq_len"),
                      ("max_position_embeddings", "max_positions"), ("kv_channels", "head_dim")):
        value = model.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            shape[name] = value
    if "num_layers" in shape:
        activation = str(model.get("activation", "gelu"))
        shape["activation"] = "swiglu" if "swiglu" in activation else "gelu"
        shape["norm"] = "rmsnorm" if str(model.get("normalization", "layernorm")).lower() == "rmsnorm" else "layernorm"
        shape["position"] = "rotary" if model.get("position_embedding_type", "learned_absolute") == "rope" \
            else "learned"
        shape["tie_embeddings"] = bool(model.get("share_embeddings_and_output_weights", True))
        shape["linear_bias"] = shape["qkv_bias"] = bool(model.get("bias", True))
    shape.update(_moe_shape(model, shape.get("num_layers"), where))
    return shape


def _moe_shape(model: Mapping[str, Any], num_layers: int | None, where: str) -> dict[str, Any]:
    """ModelSpec fields of the MoE keys (Megatron-Core's defaults where absent: top-2, expert width =
    ffn_hidden_size, every layer MoE); the shared experts' total width as one shared expert."""
    experts = model.get("num_moe_experts")
    if not experts:
        return {}
    out: dict[str, Any] = {"num_experts": _int(experts, "num_moe_experts", where),
                           "experts_per_token": _int(model.get("moe_router_topk", 2), "moe_router_topk", where)}
    ffn = model.get("moe_ffn_hidden_size") or model.get("ffn_hidden_size")
    if ffn is not None:
        out["moe_ffn_hidden_size"] = _int(ffn, "moe_ffn_hidden_size", where)
    shared = model.get("moe_shared_expert_intermediate_size")
    out.update(num_shared_experts=1 if shared else 0,
               shared_expert_ffn_hidden_size=_int(shared, "moe_shared_expert_intermediate_size", where)
               if shared else 0)
    freq = model.get("moe_layer_freq", 1)
    if isinstance(freq, list):
        from .megatron import parse_layer_freq
        out.update(parse_layer_freq("[" + ",".join(str(v) for v in freq) + "]", num_layers,
                                    f"{where}: model.moe_layer_freq"))
    else:
        out.update(moe_layer_freq=_int(freq, "moe_layer_freq", where), first_dense_layers=0, dense_layers=())
    if model.get("moe_router_num_groups"):
        out.update(router_groups=_int(model["moe_router_num_groups"], "moe_router_num_groups", where),
                   router_group_topk=_int(model.get("moe_router_group_topk", model["moe_router_num_groups"]),
                                          "moe_router_group_topk", where))
    capacity = model.get("moe_expert_capacity_factor")
    if capacity is not None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)) or capacity <= 0:
            raise InputError(f"{where}: model.moe_expert_capacity_factor={capacity!r} must be a positive number")
        out["capacity_factor"] = float(capacity)
    return out
