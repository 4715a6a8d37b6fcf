"""Command-line overrides of a model's shape (``--layers --hidden --heads --kv-heads --ffn --vocab --seq-len
--experts --top-k``), checked like config values (issue 13)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import InputError
from ..limits import LIMITS, check_int
from .spec import ModelSpec

OVERRIDES = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
             "kv_heads": "num_kv_heads", "ffn": "ffn_hidden_size", "vocab": "vocab_size", "seq_len": "seq_len",
             "experts": "num_experts", "top_k": "experts_per_token"}
"""override name (the flag without ``--``, dashes as underscores) -> ModelSpec field."""


def with_overrides(spec: ModelSpec, **overrides: int | None) -> ModelSpec:
    """Apply command-line overrides (None = keep). Each value must be an integer in [1, LIMITS[field]]; the
    result is checked as a whole (heads divide hidden, kv heads divide heads, top-k <= experts, ...)."""
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in OVERRIDES:
            raise InputError(f"unknown model override {key!r} (known: {', '.join(OVERRIDES)})")
        field = OVERRIDES[key]
        changes[field] = check_int(f"--{key.replace('_', '-')}", value, minimum=1, maximum=LIMITS[field])
    if not changes:
        return spec
    if ("num_experts" in changes or "experts_per_token" in changes) and not spec.is_moe:
        flag = "--experts" if "num_experts" in changes else "--top-k"
        raise InputError(f"{flag} needs a mixture-of-experts model; model {spec.name} is dense")
    _heads_and_widths(spec, changes)
    if "num_layers" in changes:
        _layer_lists(spec, changes["num_layers"], changes)
    if "seq_len" in changes and spec.position == "learned":
        changes["max_positions"] = max(spec.max_positions, changes["seq_len"])
    return dataclasses.replace(spec, **changes)


def _heads_and_widths(spec: ModelSpec, changes: dict[str, Any]) -> None:
    """A derived head_dim follows --hidden/--heads (an explicit one, as Gemma's 256, stays); kv heads follow
    --heads in multi-head attention; a GPT MLP stays 4 x hidden unless --ffn is given."""
    if "hidden_size" not in changes and "num_attention_heads" not in changes:
        return
    h = changes.get("hidden_size", spec.hidden_size)
    a = changes.get("num_attention_heads", spec.num_attention_heads)
    derived = spec.attention_kind == "standard" and spec.head_dim * spec.num_attention_heads == spec.hidden_size
    if derived:
        if h % a:
            raise InputError(f"--heads={a} does not divide --hidden={h}")
        changes["head_dim"] = 0
    if spec.family == "gpt" and "ffn_hidden_size" not in changes and "hidden_size" in changes:
        changes["ffn_hidden_size"] = 4 * h
    if "num_attention_heads" in changes and "num_kv_heads" not in changes \
            and spec.num_kv_heads == spec.num_attention_heads:
        changes["num_kv_heads"] = changes["num_attention_heads"]


def _layer_lists(spec: ModelSpec, layers: int, changes: dict[str, Any]) -> None:
    """Per-layer lists (full-attention layers, dense layers) for a new layer count: the config's pattern
    repeated, layer i taking the role of layer i mod the config's layer count."""
    for name in ("full_attention_layers", "dense_layers"):
        old = frozenset(getattr(spec, name))
        if old:
            changes[name] = tuple(i for i in range(layers) if i % spec.num_layers in old)
    if spec.sliding_window and len(changes.get("full_attention_layers", ())) == layers:
        changes.update(sliding_window=0, full_attention_layers=())


def with_moe_balance(spec: ModelSpec, text: str | None) -> ModelSpec:
    """``--moe-balance forced|aux|FACTOR`` (None = keep): one line naming the flag and the value when bad."""
    if text is None:
        return spec
    value = str(text).strip().lower()
    if value not in ("forced", "aux"):
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"--moe-balance={text!r} must be forced, aux or a number >= 1") from None
        if not (1.0 <= number <= 1024.0):  # NaN fails too
            raise InputError(f"--moe-balance={text!r} must be forced, aux or a number in [1, 1024]")
        value = number
    if not spec.is_moe:
        raise InputError(f"--moe-balance needs a mixture-of-experts model; model {spec.name} is dense")
    return dataclasses.replace(spec, moe_balance=value)
