"""Hugging Face ``config.json`` -> :class:`~tpsim.model.spec.ModelSpec`.

Types: gpt2, gpt_neox, llama, mistral, qwen2, gemma, gemma2, phi3, mixtral, qwen2_moe, qwen3_moe, deepseek_v2,
deepseek_v3. Key names and the defaults of absent keys are transformers' (``src/transformers/models/<type>/
configuration_<type>.py``; the layer patterns from their ``layer_types`` and decoder-layer code, DeepSeek's
``moe_layer_freq`` from its own ``modeling_deepseek.py``). Every key is used, listed as harmless, or refused
(:mod:`tpsim.model.hf_keys`); every number is checked (:mod:`tpsim.limits`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import InputError
from .hf_keys import MOE_HARMLESS, REQUIRED, ConfigReader, check_rope
from .spec import ModelSpec

DEFAULT_SEQ_CAP = 8192
"""Training sequence length of a config without one: its max_position_embeddings, at most this (--seq-len
overrides)."""
GELU_NAMES = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate", "gelu_python")
SILU_NAMES = ("silu", "swish")
LAYER_TYPES = ("full_attention", "sliding_attention")


def _activation(r: ConfigReader, key: str, default: str, gated: bool) -> str:
    """transformers' ACT2FN name -> gelu | swiglu | geglu."""
    name = r.str(key, default)
    if gated and name in SILU_NAMES:
        return "swiglu"
    if name in GELU_NAMES:
        return "geglu" if gated else "gelu"
    kind = "a gated MLP (silu/swish: SwiGLU, gelu variants: GeGLU)" if gated else "a GeLU MLP"
    raise r.fail(f"{key}={name!r} is not supported for {kind}")


def _shape(r: ConfigReader, *, kv_default: int | None, max_pos_default: int, kv_key: bool = True) -> dict[str, Any]:
    """Layers, widths, heads, vocabulary and positions under the common key names."""
    heads = r.int("num_attention_heads", "num_attention_heads")
    kv = heads if kv_default is None else kv_default
    max_pos = r.int("max_position_embeddings", "max_positions", default=max_pos_default)
    return dict(num_layers=r.int("num_hidden_layers", "num_layers"), hidden_size=r.int("hidden_size", "hidden_size"),
                num_attention_heads=heads,
                num_kv_heads=r.int("num_key_value_heads", "num_kv_heads", default=kv) if kv_key else heads,
                ffn_hidden_size=r.int("intermediate_size", "ffn_hidden_size"),
                vocab_size=r.int("vocab_size", "vocab_size"), max_positions=max_pos,
                seq_len=min(max_pos, DEFAULT_SEQ_CAP))


def _llama_like(r: ConfigReader, *, kv_default: int | None, max_pos_default: int, tie_default: bool,
                act_key: str = "hidden_act", act_default: str = "silu", head_dim_default: int | None = 0
                ) -> dict[str, Any]:
    """Pre-norm RMSNorm blocks with rotary positions and a gated MLP (family "llama")."""
    d = _shape(r, kv_default=kv_default, max_pos_default=max_pos_default)
    d.update(family="llama", norm="rmsnorm", position="rotary", activation=_activation(r, act_key, act_default, True),
             tie_embeddings=r.bool("tie_word_embeddings", tie_default))
    if head_dim_default is not None:
        d["head_dim"] = r.int("head_dim", "head_dim", default=head_dim_default)
    if r.present("partial_rotary_factor"):
        d["rotary_fraction"] = r.fraction("partial_rotary_factor", r.raw("partial_rotary_factor"))
    base = r.raw("rope_theta") if r.present("rope_theta") else None
    if isinstance(base, (int, float)) and not isinstance(base, bool) and 1 <= base <= 1e12:
        d["rotary_base"] = int(base)  # no cost; the exporters write it (Megatron --rotary-base)
    return d


def _windows(r: ConfigReader, n_layers: int, window: int, sliding: Callable[[int], bool]) -> dict[str, Any]:
    """sliding_window and full_attention_layers from an explicit ``layer_types`` list or the type's rule
    ``sliding(i)``. No window, or no layer using it, is full attention everywhere."""
    if not window:
        r.ignore("layer_types", "no sliding window is in use")
        return dict(sliding_window=0, full_attention_layers=())
    types = r.raw("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise r.fail(f"layer_types must be a list of num_hidden_layers={n_layers} entries")
        for i, kind in enumerate(types):
            if kind not in LAYER_TYPES:
                raise r.fail(f"layer_types[{i}]={kind!r} is an attention variant tpsim does not know "
                             f"({', '.join(LAYER_TYPES)})")
        full = tuple(i for i, kind in enumerate(types) if kind == "full_attention")
    else:
        full = tuple(i for i in range(n_layers) if not sliding(i))
    if len(full) == n_layers:
        return dict(sliding_window=0, full_attention_layers=())
    return dict(sliding_window=window, full_attention_layers=full)


def _use_window(r: ConfigReader, default_window: int) -> int:
    """Qwen's ``use_sliding_window`` switch: the window only when it is true (transformers sets
    sliding_window to None otherwise)."""
    use = r.bool("use_sliding_window", False)
    window = r.optional("sliding_window", "sliding_window", default_window)
    if not use:
        for key in ("sliding_window", "max_window_layers"):
            r.ignore(key, "use_sliding_window is false")
        return 0
    return window


DROPOUT_KEYS = {"gpt2": (("resid_pdrop", 0.1), ("attn_pdrop", 0.1))}
"""model_type -> (hidden-dropout key, transformers default), (attention-dropout key, default); other types:
:data:`_DEFAULT_DROPOUT_KEYS`."""
_DEFAULT_DROPOUT_KEYS = (("hidden_dropout", 0.0), ("attention_dropout", 0.0))
_HIDDEN_DROPOUT_TYPES = ("gpt2", "gpt_neox")
"""types whose decoder layers apply a hidden (residual) dropout; the llama-style layers of transformers have
none (modeling_llama.py, modeling_mistral.py, ...: only the attention probabilities get ``attention_dropout``)."""


def _dropout(r: ConfigReader, mtype: str) -> dict[str, float]:
    """hidden_dropout and attention_dropout from the type's keys (defaults: transformers' configuration
    classes, GPT2Config resid_pdrop = attn_pdrop = 0.1, GPTNeoXConfig hidden_dropout = attention_dropout = 0.0,
    the llama-style configs attention_dropout = 0.0)."""
    (hkey, hdef), (akey, adef) = DROPOUT_KEYS.get(mtype, _DEFAULT_DROPOUT_KEYS)
    if mtype in _HIDDEN_DROPOUT_TYPES:
        hidden = r.probability(hkey, hdef)
    else:
        hidden = 0.0
        r.ignore(hkey, f"model_type={mtype!r} layers have no hidden dropout")
    return dict(hidden_dropout=hidden, attention_dropout=r.probability(akey, adef))


# ---- dense types -------------------------------------------------------------------------------------
def _gpt2(r: ConfigReader) -> dict[str, Any]:
    hidden = r.int("n_embd", "hidden_size")
    if r.present("n_positions"):
        max_pos = r.int("n_positions", "max_positions")
        r.ignore("n_ctx", "context length of the old configs (n_positions is used)")
    else:
        max_pos = r.int("n_ctx", "max_positions", default=1024)
    for key in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        r.ignore(key, "attention-score scaling or precision (no cost)")
    for key in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels"):
        r.ignore(key, "sequence-summary head (not part of the language model)")
    heads = r.int("n_head", "num_attention_heads")
    return dict(family="gpt", num_layers=r.int("n_layer", "num_layers"), hidden_size=hidden,
                num_attention_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=r.int("n_inner", "ffn_hidden_size", default=4 * hidden),
                vocab_size=r.int("vocab_size", "vocab_size"), max_positions=max_pos,
                seq_len=min(max_pos, DEFAULT_SEQ_CAP), norm="layernorm",
                activation=_activation(r, "activation_function", "gelu_new", False), position="learned",
                tie_embeddings=r.bool("tie_word_embeddings", True), qkv_bias=True, linear_bias=True)


def _gpt_neox(r: ConfigReader) -> dict[str, Any]:
    d = _shape(r, kv_default=None, max_pos_default=2048, kv_key=False)
    pct = r.raw("rotary_pct")
    d.update(family="gpt", norm="layernorm", position="rotary",
             activation=_activation(r, "hidden_act", "gelu", False),
             rotary_fraction=0.25 if pct is None else r.fraction("rotary_pct", pct),
             parallel_residual=r.bool("use_parallel_residual", True), qkv_bias=r.bool("attention_bias", True),
             linear_bias=True, tie_embeddings=r.bool("tie_word_embeddings", False))
    return d


def _llama(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=None, max_pos_default=2048, tie_default=False)
    bias, mlp_bias = r.bool("attention_bias", False), r.bool("mlp_bias", False)
    # linear_bias covers the output projection and the MLP: both only when both flags are set
    d.update(qkv_bias=bias, linear_bias=bias and mlp_bias)
    return d


def _mistral(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=8, max_pos_default=131072, tie_default=False)
    r.ignore("layer_types", "transformers' Mistral ignores it (every layer uses sliding_window)")
    d.update(qkv_bias=False, linear_bias=False, sliding_window=r.optional("sliding_window", "sliding_window", 4096))
    return d


def _qwen2(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=32, max_pos_default=32768, tie_default=False)
    max_window = r.int("max_window_layers", "num_layers", default=28, minimum=0)
    window = _use_window(r, 4096)
    # transformers Qwen2Config: layer i slides when i >= max_window_layers
    d.update(qkv_bias=True, linear_bias=False, **_windows(r, d["num_layers"], window, lambda i: i >= max_window))
    return d


def _gemma(r: ConfigReader, kv_default: int = 16) -> dict[str, Any]:
    d = _llama_like(r, kv_default=kv_default, max_pos_default=8192, tie_default=True, act_key="hidden_activation",
                    act_default="gelu_pytorch_tanh", head_dim_default=256)
    r.ignore("hidden_act", "transformers' Gemma uses hidden_activation")
    d.update(qkv_bias=r.bool("attention_bias", False), linear_bias=False)
    return d


def _gemma2(r: ConfigReader) -> dict[str, Any]:
    d = _gemma(r, kv_default=4)
    window = r.optional("sliding_window", "sliding_window", 4096)
    legacy = r.raw("sliding_window_size")
    if legacy is not None and legacy != window:
        raise r.fail(f"sliding_window_size={legacy!r} disagrees with sliding_window={window}")
    r.ignore("sliding_window_size", "duplicate of sliding_window")
    r.false_only("use_bidirectional_attention", "bidirectional (non-causal) attention is not costed")
    r.ignore("query_pre_attn_scalar", "attention score scale (no cost)")
    r.ignore("attn_logit_softcapping", "tanh soft-capping of the attention scores: elementwise inside the "
                                       "attention kernel, not costed")
    r.ignore("final_logit_softcapping", "tanh soft-capping of the logits: elementwise over tokens x vocabulary, "
                                        "not costed")
    # transformers Gemma2Config: even layers (0, 2, ...) slide, odd layers attend globally
    d.update(norms_per_layer=4, **_windows(r, d["num_layers"], window, lambda i: i % 2 == 0))
    return d


def _phi3(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=None, max_pos_default=4096, tie_default=False)
    r.false_only("attention_bias", "transformers' Phi-3 has no attention bias")
    d.update(qkv_bias=False, linear_bias=False, sliding_window=r.optional("sliding_window", "sliding_window", 0))
    return d


# ---- mixtures of experts -------------------------------------------------------------------------------
def _mixtral(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=8, max_pos_default=131072, tie_default=False)
    key = "num_local_experts" if "num_local_experts" in r.cfg or "num_experts" not in r.cfg else "num_experts"
    d.update(qkv_bias=False, linear_bias=False, sliding_window=r.optional("sliding_window", "sliding_window", 0),
             num_experts=r.int(key, "num_experts", default=8),
             experts_per_token=r.int("num_experts_per_tok", "experts_per_token", default=2),
             moe_ffn_hidden_size=d["ffn_hidden_size"])
    return d


def _qwen_moe_layers(r: ConfigReader, n_layers: int, experts_default: int, k_default: int, ffn_default: int
                     ) -> dict[str, Any]:
    """Qwen2/Qwen3-MoE: layer i is sparse unless in mlp_only_layers or (i + 1) % decoder_sparse_step != 0
    (transformers Qwen2MoeDecoderLayer); num_experts = 0 is a dense model."""
    experts = r.int("num_experts", "num_experts", default=experts_default, minimum=0)
    if not experts:
        for key in ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                    "decoder_sparse_step", "mlp_only_layers"):
            r.ignore(key, "num_experts is 0 (dense model)")
        return {}
    step = r.int("decoder_sparse_step", "moe_layer_freq", default=1)
    dense = set(r.index_list("mlp_only_layers", n_layers)) | {i for i in range(n_layers) if (i + 1) % step}
    return dict(num_experts=experts, experts_per_token=r.int("num_experts_per_tok", "experts_per_token",
                                                             default=k_default),
                moe_ffn_hidden_size=r.int("moe_intermediate_size", "moe_ffn_hidden_size", default=ffn_default),
                dense_layers=tuple(sorted(dense)))


def _qwen2_moe(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=16, max_pos_default=32768, tie_default=False)
    max_window = r.int("max_window_layers", "num_layers", default=28, minimum=0)
    window = _use_window(r, 4096)
    # transformers Qwen2MoeConfig: layer i slides when (i + 1) % 2 and i < max_window_layers
    d.update(qkv_bias=r.bool("qkv_bias", True), linear_bias=False,
             **_windows(r, d["num_layers"], window, lambda i: (i + 1) % 2 == 1 and i < max_window))
    moe = _qwen_moe_layers(r, d["num_layers"], 60, 4, 1408)
    if moe:
        shared = r.int("shared_expert_intermediate_size", "shared_expert_ffn_hidden_size", default=5632, minimum=0)
        moe.update(num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=bool(shared))
    d.update(moe)
    return d


def _qwen3_moe(r: ConfigReader) -> dict[str, Any]:
    d = _llama_like(r, kv_default=4, max_pos_default=32768, tie_default=False)
    r.ignore("max_window_layers", "not read by transformers' qwen3_moe (use_sliding_window decides)")
    d.update(qkv_bias=r.bool("attention_bias", False), linear_bias=False, qk_norm=True,
             sliding_window=_use_window(r, 4096))
    d.update(_qwen_moe_layers(r, d["num_layers"], 128, 8, 768))
    return d


def _deepseek(r: ConfigReader, v3: bool) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention, shared + routed experts, dense first layers, group-limited
    routing, multi-token prediction (V3). Defaults: transformers DeepseekV2Config / DeepseekV3Config."""
    d = _llama_like(r, kv_default=128 if v3 else None, max_pos_default=4096 if v3 else 2048, tie_default=False,
                    head_dim_default=None)
    r.ignore("head_dim", "transformers sets it to qk_rope_head_dim; MLA uses its own head dimensions")
    r.ignore("rope_interleave", "rotary layout (no cost)")
    r.false_only("attention_bias", "biases on the MLA projections are not costed")
    r.false_only("mlp_bias", "biases on the DeepSeek MLPs are not costed")
    d.update(qkv_bias=False, linear_bias=False, attention_kind="mla",
             q_lora_rank=r.optional("q_lora_rank", "q_lora_rank", 1536),
             kv_lora_rank=r.int("kv_lora_rank", "kv_lora_rank", default=512),
             qk_nope_head_dim=r.int("qk_nope_head_dim", "qk_nope_head_dim", default=128),
             qk_rope_head_dim=r.int("qk_rope_head_dim", "qk_rope_head_dim", default=64),
             v_head_dim=r.int("v_head_dim", "v_head_dim", default=128),
             mtp_layers=r.int("num_nextn_predict_layers", "mtp_layers", default=0, minimum=0))
    d.update(_deepseek_moe(r, v3))
    return d


def _deepseek_moe(r: ConfigReader, v3: bool) -> dict[str, Any]:
    experts = r.optional("n_routed_experts", "num_experts", 256 if v3 else 64)
    if not experts:
        for key in ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                    "moe_layer_freq", "n_group", "topk_group"):
            r.ignore(key, "n_routed_experts is null (dense model)")
        return {}
    shared = r.optional("n_shared_experts", "num_shared_experts", 1 if v3 else 2)
    ffn = r.int("moe_intermediate_size", "moe_ffn_hidden_size", default=2048 if v3 else 1407)
    method = r.str("topk_method", "noaux_tc" if v3 else "greedy")
    groups = r.optional("n_group", "router_groups", 8 if v3 else 0)
    topk_groups = r.optional("topk_group", "router_group_topk", 4 if v3 else 0)
    r.status["topk_method"] = f"ignored: {MOE_HARMLESS['topk_method']}"
    # transformers' V3 router always limits groups; V2 only with topk_method group_limited_greedy
    if groups <= 1 or not (v3 or method == "group_limited_greedy"):
        for key in ("n_group", "topk_group"):
            r.ignore(key, f"routing does not limit groups (topk_method={method!r}, n_group={groups})")
        groups, topk_groups = 0, 0
    return dict(num_experts=experts,
                experts_per_token=r.int("num_experts_per_tok", "experts_per_token", default=8 if v3 else REQUIRED),
                moe_ffn_hidden_size=ffn, num_shared_experts=shared, shared_expert_ffn_hidden_size=ffn if shared else 0,
                first_dense_layers=r.int("first_k_dense_replace", "first_dense_layers", default=3 if v3 else 0,
                                         minimum=0),
                moe_layer_freq=r.int("moe_layer_freq", "moe_layer_freq", default=1),
                router_groups=groups, router_group_topk=topk_groups)


_MOE = dict(MOE_HARMLESS)
PARSERS: dict[str, tuple[Callable[[ConfigReader], dict[str, Any]], Mapping[str, str]]] = {
    "gpt2": (_gpt2, {}), "gpt_neox": (_gpt_neox, {}), "llama": (_llama, {}), "mistral": (_mistral, {}),
    "qwen2": (_qwen2, {}), "gemma": (_gemma, {}), "gemma2": (_gemma2, {}), "phi3": (_phi3, {}),
    "mixtral": (_mixtral, _MOE), "qwen2_moe": (_qwen2_moe, _MOE), "qwen3_moe": (_qwen3_moe, _MOE),
    "deepseek_v2": (lambda r: _deepseek(r, v3=False), _MOE), "deepseek_v3": (lambda r: _deepseek(r, v3=True), _MOE),
}
HF_TYPES = tuple(PARSERS)


def from_hf_config(cfg: Mapping[str, Any], name: str = "hf-model", source: str = "config.json") -> ModelSpec:
    """Build a spec from the keys of a Hugging Face ``config.json`` (types: :data:`HF_TYPES`)."""
    if not isinstance(cfg, Mapping):
        raise InputError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    bad = next((k for k in cfg if not isinstance(k, str)), None)
    if bad is not None:
        raise InputError(f"{source}: key {bad!r} is not a string")
    from ..schema import check
    from ..schemas import HF_CONFIG

    mtype = cfg.get("model_type")
    if isinstance(mtype, str) and mtype in PARSERS:
        check(HF_CONFIG, cfg, source)  # types and ranges of the shape keys (issue 26)
    if not isinstance(mtype, str) or mtype not in PARSERS:
        raise InputError(f"{source}: model_type={mtype!r} is not supported (supported: {', '.join(HF_TYPES)})")
    reader = ConfigReader(cfg, source, mtype)
    parse, harmless = PARSERS[mtype]
    fields = parse(reader)
    fields.update(_dropout(reader, mtype))
    fraction = check_rope(reader)
    if fraction is not None:
        fields["rotary_fraction"] = fraction
    status = reader.finish(harmless)
    try:
        return ModelSpec(name=name, architecture=mtype, source_keys=status, **fields)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
