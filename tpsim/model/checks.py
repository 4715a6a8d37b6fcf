"""Checks of a :class:`~tpsim.model.spec.ModelSpec` (issue 13): types, documented ranges
(:data:`tpsim.limits.LIMITS`) and consistency. Every failure is one :class:`~tpsim.errors.InputError` line
naming the field and the value; nothing is replaced silently (0 kv heads is refused, not read as "all").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..limits import check_int

if TYPE_CHECKING:
    from .spec import ModelSpec

# field -> smallest accepted value (the largest is LIMITS[field])
_POSITIVE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
             "seq_len", "max_positions", "norms_per_layer", "moe_layer_freq")
_NON_NEGATIVE = ("global_batch", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim", "sliding_window", "num_experts", "experts_per_token", "moe_ffn_hidden_size",
                 "num_shared_experts", "shared_expert_ffn_hidden_size", "first_dense_layers", "router_groups",
                 "router_group_topk", "mtp_layers")
_BOOLS = ("tie_embeddings", "qkv_bias", "linear_bias", "qk_norm", "parallel_residual", "shared_expert_gate")
_CHOICES = {"family": ("gpt", "llama"), "norm": ("layernorm", "rmsnorm"), "activation": ("gelu", "swiglu", "geglu"),
            "position": ("learned", "rotary"), "attention_kind": ("standard", "mla")}
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_MOE_FIELDS = ("experts_per_token", "moe_ffn_hidden_size", "num_shared_experts", "shared_expert_ffn_hidden_size",
               "first_dense_layers", "router_groups", "router_group_topk")
MAX_CAPACITY_FACTOR = 64.0
"""Largest expert capacity factor accepted (Megatron-Core runs use 1-4; 64 experts' worth is far beyond)."""


def check_spec(spec: "ModelSpec") -> None:
    """Raise :class:`InputError` naming the first bad field of ``spec``."""
    where = f"model {spec.name}"
    if not isinstance(spec.name, str) or not spec.name:
        raise InputError(f"model name={spec.name!r} must be a non-empty string")
    _check_types(spec, where)
    _check_heads(spec, where)
    _check_attention(spec, where)
    _check_moe(spec, where)
    _check_layer_lists(spec, where)


def _check_types(spec: "ModelSpec", where: str) -> None:
    for name in _POSITIVE:
        check_int(name, getattr(spec, name), where, minimum=1)
    for name in _NON_NEGATIVE:
        check_int(name, getattr(spec, name), where, minimum=0)
    for name in _BOOLS:
        if not isinstance(getattr(spec, name), bool):
            raise InputError(f"{where}: {name}={getattr(spec, name)!r} must be true or false")
    for name, choices in _CHOICES.items():
        if getattr(spec, name) not in choices:
            raise InputError(f"{where}: {name}={getattr(spec, name)!r} is not one of {', '.join(choices)}")
    if not isinstance(spec.architecture, str):
        raise InputError(f"{where}: architecture={spec.architecture!r} must be a string")
    _check_float(where, "rotary_fraction", spec.rotary_fraction, low=0.0, high=1.0, low_open=True)
    _check_float(where, "capacity_factor", spec.capacity_factor, low=0.0, high=MAX_CAPACITY_FACTOR)
    for name in ("hidden_dropout", "attention_dropout"):
        _check_float(where, name, getattr(spec, name), low=0.0, high=0.99)
    if 0.0 < spec.capacity_factor < 1.0:
        raise InputError(f"{where}: capacity_factor={spec.capacity_factor} must be 0 (dropless) or >= 1")
    if spec.moe_balance not in MOE_BALANCE_NAMES:
        _check_float(where, "moe_balance", spec.moe_balance, low=1.0, high=MAX_MOE_BALANCE)


MOE_BALANCE_NAMES = ("forced", "aux")
"""``ModelSpec.moe_balance`` names (else a number in [1, MAX_MOE_BALANCE])."""
MAX_MOE_BALANCE = 1024.0
"""the busiest expert's tokens over the mean cannot exceed the number of experts (1024 bounds any model here)."""


def _check_float(where: str, name: str, value: Any, *, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not math.isfinite(value)):
        raise InputError(f"{where}: {name}={value!r} must be a finite number")
    if value < low or (low_open and value == low) or value > high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise InputError(f"{where}: {name}={value!r} is outside {interval}")


def _check_heads(spec: "ModelSpec", where: str) -> None:
    if spec.head_dim == 0:
        raise InputError(f"{where}: hidden_size={spec.hidden_size} is not a multiple of num_attention_heads="
                         f"{spec.num_attention_heads}; give head_dim explicitly")
    check_int("head_dim", spec.head_dim, where, minimum=1)
    if spec.num_kv_heads > spec.num_attention_heads or spec.num_attention_heads % spec.num_kv_heads:
        raise InputError(f"{where}: num_kv_heads={spec.num_kv_heads} does not divide "
                         f"num_attention_heads={spec.num_attention_heads}")


def _check_attention(spec: "ModelSpec", where: str) -> None:
    if spec.attention_kind == "mla":
        for name in _MLA_FIELDS[1:]:
            if getattr(spec, name) < 1:
                raise InputError(f"{where}: {name}={getattr(spec, name)} must be >= 1 for multi-head latent "
                                 f"attention")
        if spec.num_kv_heads != spec.num_attention_heads:
            raise InputError(f"{where}: num_kv_heads={spec.num_kv_heads} must equal num_attention_heads="
                             f"{spec.num_attention_heads} with multi-head latent attention")
        if spec.head_dim != spec.qk_nope_head_dim + spec.qk_rope_head_dim:
            raise InputError(f"{where}: head_dim={spec.head_dim} must be qk_nope_head_dim + qk_rope_head_dim = "
                             f"{spec.qk_nope_head_dim + spec.qk_rope_head_dim} with multi-head latent attention")
        if spec.qkv_bias or spec.qk_norm:
            raise InputError(f"{where}: qkv_bias/qk_norm are not defined for multi-head latent attention")
    else:
        for name in _MLA_FIELDS:
            if getattr(spec, name):
                raise InputError(f"{where}: {name}={getattr(spec, name)} needs attention_kind='mla' "
                                 f"(attention_kind={spec.attention_kind!r})")
    if spec.full_attention_layers and not spec.sliding_window:
        raise InputError(f"{where}: full_attention_layers given without a sliding_window")


def _check_moe(spec: "ModelSpec", where: str) -> None:
    if spec.num_experts == 0:
        for name in _MOE_FIELDS:
            if getattr(spec, name):
                raise InputError(f"{where}: {name}={getattr(spec, name)} needs num_experts > 0 (dense model)")
        if spec.dense_layers or spec.shared_expert_gate or spec.capacity_factor or spec.moe_layer_freq != 1:
            raise InputError(f"{where}: mixture-of-experts fields set on a dense model (num_experts=0)")
        return
    if not 1 <= spec.experts_per_token <= spec.num_experts:
        raise InputError(f"{where}: experts_per_token={spec.experts_per_token} must be between 1 and "
                         f"num_experts={spec.num_experts}")
    if spec.moe_ffn_hidden_size < 1:
        raise InputError(f"{where}: moe_ffn_hidden_size={spec.moe_ffn_hidden_size} must be >= 1")
    if (spec.num_shared_experts > 0) != (spec.shared_expert_ffn_hidden_size > 0):
        raise InputError(f"{where}: num_shared_experts={spec.num_shared_experts} and shared_expert_ffn_hidden_size="
                         f"{spec.shared_expert_ffn_hidden_size} must both be 0 or both positive")
    if spec.shared_expert_gate and not spec.num_shared_experts:
        raise InputError(f"{where}: shared_expert_gate needs a shared expert (num_shared_experts=0)")
    if spec.moe_layer_freq > spec.num_layers:
        raise InputError(f"{where}: moe_layer_freq={spec.moe_layer_freq} exceeds num_layers={spec.num_layers}")
    if spec.first_dense_layers >= spec.num_layers:
        raise InputError(f"{where}: first_dense_layers={spec.first_dense_layers} leaves no mixture-of-experts "
                         f"layer of num_layers={spec.num_layers}")
    _check_router_groups(spec, where)


def _check_router_groups(spec: "ModelSpec", where: str) -> None:
    groups, topk = spec.router_groups, spec.router_group_topk
    if not groups:
        if topk:
            raise InputError(f"{where}: router_group_topk={topk} needs router_groups > 0")
        return
    if spec.num_experts % groups:
        raise InputError(f"{where}: router_groups={groups} does not divide num_experts={spec.num_experts}")
    if not 1 <= topk <= groups:
        raise InputError(f"{where}: router_group_topk={topk} must be between 1 and router_groups={groups}")
    if spec.experts_per_token > topk * (spec.num_experts // groups):
        raise InputError(f"{where}: experts_per_token={spec.experts_per_token} exceeds the "
                         f"{topk * (spec.num_experts // groups)} experts of router_group_topk={topk} groups")


def _check_layer_lists(spec: "ModelSpec", where: str) -> None:
    for name in ("full_attention_layers", "dense_layers"):
        value = getattr(spec, name)
        if not isinstance(value, tuple):
            raise InputError(f"{where}: {name}={value!r} must be a list of layer indices")
        for index in value:
            check_int(name, index, where, minimum=0, maximum=spec.num_layers - 1)
        if list(value) != sorted(set(value)):
            raise InputError(f"{where}: {name}={list(value)} must be sorted and without repeats")
    if spec.num_experts and spec.num_moe_layers == 0:
        raise InputError(f"{where}: num_experts={spec.num_experts} but no layer has the mixture-of-experts MLP")
    if spec.sliding_window and len(spec.full_attention_layers) == spec.num_layers:
        raise InputError(f"{where}: sliding_window={spec.sliding_window} but every layer is in "
                         f"full_attention_layers")

