"""Every key of a Hugging Face ``config.json`` is used, known to be harmless, or refused (issue 11).

:class:`ConfigReader` reads typed values (each checked against :data:`tpsim.limits.LIMITS`, issue 13) and
records which keys were used; :meth:`ConfigReader.finish` sorts the rest: a key of :data:`HARMLESS` (or of the
type's own harmless keys) is listed as ignored with its reason, a key set to ``null`` is absent (as in
transformers), and anything else is refused with one line naming it and why -- mixture-of-experts keys under a
dense ``model_type``, attention variants the type does not have, unknown keys (tpsim cannot tell whether they
change the cost). The table is documented in docs/MODELS.md.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ..errors import InputError
from ..limits import LIMITS, check_int

REQUIRED = object()
"""Default marker: the key must be present (and not null)."""

_META = "metadata, no effect on cost"
_TOKEN = "token id, no effect on cost"
_RUNTIME = "transformers runtime flag, no effect on training cost"
_GENERATION = "text-generation setting, not used in training"
_DROPOUT = ("dropout outside the transformer layers (embedding, heads): one small mask per micro-batch, "
            "not costed")
_OTHER_DROPOUT = "a dropout key this model_type's layers do not read (its own keys set the dropout costed)"
HARMLESS: dict[str, str] = {
    "architectures": "class names (model_type decides the architecture)",
    "transformers_version": _META, "_name_or_path": _META, "_commit_hash": _META, "auto_map": _META,
    "tokenizer_class": _META, "custom_pipelines": _META, "model_name": _META,
    "torch_dtype": "checkpoint dtype; the plan's --dtype sets the training precision",
    "dtype": "checkpoint dtype; the plan's --dtype sets the training precision",
    "use_bfloat16": "checkpoint dtype; the plan's --dtype sets the training precision",
    "quantization_config": "checkpoint quantization (storage format); the plan's --dtype sets the training precision",
    "bos_token_id": _TOKEN, "eos_token_id": _TOKEN, "pad_token_id": _TOKEN, "sep_token_id": _TOKEN,
    "decoder_start_token_id": _TOKEN, "forced_bos_token_id": _TOKEN, "forced_eos_token_id": _TOKEN,
    "initializer_range": "weight initialization only",
    "rms_norm_eps": "numerical epsilon of the norms", "layer_norm_eps": "numerical epsilon of the norms",
    "layer_norm_epsilon": "numerical epsilon of the norms",
    "use_cache": "inference KV cache",
    "cache_implementation": "inference KV-cache layout",
    "rope_theta": "rotary base frequency (no cost)", "rotary_emb_base": "rotary base frequency (no cost)",
    "original_max_position_embeddings": "context-extension bookkeeping (no cost)",
    "pretraining_tp": "transformers' emulation of split linears for exact reproduction (no cost)",
    "return_dict": _RUNTIME, "output_attentions": _RUNTIME, "output_hidden_states": _RUNTIME,
    "torchscript": _RUNTIME, "use_return_dict": _RUNTIME, "tf_legacy_loss": _RUNTIME,
    "chunk_size_feed_forward": _RUNTIME, "is_decoder": _RUNTIME, "tie_encoder_decoder": _RUNTIME,
    "_attn_implementation": "kernel choice; --attention sets the attention cost",
    "attn_implementation": "kernel choice; --attention sets the attention cost",
    "_attn_implementation_autoset": "kernel choice; --attention sets the attention cost",
    "gradient_checkpointing": "recomputation is a plan choice (--recompute)",
    "id2label": "classification-head metadata", "label2id": "classification-head metadata",
    "num_labels": "classification-head metadata", "problem_type": "classification-head metadata",
    "finetuning_task": "classification-head metadata",
    "task_specific_params": _GENERATION, "max_length": _GENERATION, "min_length": _GENERATION,
    "do_sample": _GENERATION, "early_stopping": _GENERATION, "num_beams": _GENERATION,
    "num_beam_groups": _GENERATION, "diversity_penalty": _GENERATION, "temperature": _GENERATION,
    "top_k": _GENERATION, "top_p": _GENERATION, "typical_p": _GENERATION, "repetition_penalty": _GENERATION,
    "length_penalty": _GENERATION, "no_repeat_ngram_size": _GENERATION,
    "encoder_no_repeat_ngram_size": _GENERATION, "bad_words_ids": _GENERATION,
    "num_return_sequences": _GENERATION, "output_scores": _GENERATION, "return_dict_in_generate": _GENERATION,
    "remove_invalid_values": _GENERATION, "exponential_decay_length_penalty": _GENERATION,
    "suppress_tokens": _GENERATION, "begin_suppress_tokens": _GENERATION, "prefix": _GENERATION,
    "embd_pdrop": _DROPOUT, "summary_first_dropout": _DROPOUT, "classifier_dropout": _DROPOUT,
    "attention_dropout": _OTHER_DROPOUT, "hidden_dropout": _OTHER_DROPOUT, "resid_pdrop": _OTHER_DROPOUT,
    "attn_pdrop": _OTHER_DROPOUT, "attention_probs_dropout_prob": _OTHER_DROPOUT,
    "hidden_dropout_prob": _OTHER_DROPOUT,
}
"""Keys of transformers' ``PretrainedConfig`` and common metadata: never change the training cost."""

MOE_HARMLESS: dict[str, str] = {
    "output_router_logits": "inference flag",
    "router_aux_loss_coef": "load-balancing loss weight (a few FLOPs per token)",
    "aux_loss_alpha": "load-balancing loss weight (a few FLOPs per token)",
    "seq_aux": "sequence-wise balance loss (a few FLOPs per token)",
    "router_jitter_noise": "multiplicative noise on the router input (elementwise)",
    "norm_topk_prob": "renormalizes the top-k routing weights (elementwise)",
    "routed_scaling_factor": "scales the routed experts' output (elementwise)",
    "scoring_func": "sigmoid or softmax over the router logits (elementwise)",
    "topk_method": "routing rule (n_group and topk_group are used when it limits groups)",
    "ep_size": "inference expert-parallel size; the plan sets ep",
}
"""Router details that do not change the cost, accepted under mixture-of-experts types only."""

MOE_KEYS = frozenset({
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "mlp_only_layers", "n_group", "topk_group", "num_nextn_predict_layers",
    "moe_topk", "num_shared_experts", "expert_interval", "moe_every_k_layers",
}) | frozenset(MOE_HARMLESS)
MLA_KEYS = frozenset({"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
ATTENTION_VARIANT_KEYS = frozenset({
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "sliding_window_pattern",
    "sliding_window_size", "attention_type", "attention_types", "attention_layers", "window_size",
    "local_attention", "attention_window", "use_bidirectional_attention", "attn_logit_softcapping",
    "alibi", "use_alibi", "position_embedding_type", "attention_sink", "attention_chunk_size",
    "no_rope_layers", "global_attn_every_n_layers", "linear_attention",
})
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "su", "llama3")
"""Rotary scaling rules that change frequencies only (no shape, no FLOPs): transformers
``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` ("su" is Phi-3's old name for longrope)."""
FALSE_ONLY = {"is_encoder_decoder": "encoder-decoder models are not decoder-only",
              "add_cross_attention": "cross-attention is not part of a decoder-only model"}
"""Keys accepted only as false (their true value describes a model tpsim does not cost)."""


class ConfigReader:
    """Typed, checked access to one config; remembers what was used and why the rest was ignored."""

    def __init__(self, cfg: Mapping[str, Any], source: str, model_type: str) -> None:
        self.cfg, self.source, self.model_type = cfg, source, model_type
        self.status: dict[str, str] = {"model_type": "used"}

    # ---- raw access -----------------------------------------------------------------------------------
    def present(self, key: str) -> bool:
        """The key is in the config with a non-null value."""
        return self.cfg.get(key) is not None

    def raw(self, key: str) -> Any:
        """The value (None when absent or null), marking the key used."""
        if key in self.cfg:
            self.status[key] = "used"
        return self.cfg.get(key)

    def fail(self, message: str) -> InputError:
        return InputError(f"{self.source}: {message}")

    def ignore(self, key: str, why: str) -> None:
        """The key is known for this type but does not change the cost."""
        if key in self.cfg:
            self.status[key] = f"ignored: {why}"

    # ---- typed values ---------------------------------------------------------------------------------
    def int(self, key: str, field: str, default: Any = REQUIRED, minimum: int = 1) -> int:
        """An integer within ``[minimum, LIMITS[field]]``; ``default`` when absent or null."""
        value = self.raw(key)
        if value is None:
            if default is REQUIRED:
                raise self.fail(f"missing field {key!r}")
            return default
        return check_int(key, value, self.source, minimum=minimum, maximum=LIMITS[field])

    def bool(self, key: str, default: bool) -> bool:
        """A JSON boolean (1, "true" and the like are refused)."""
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key}={value!r} must be true or false")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(f"{key}={value!r} must be a string")
        return value

    def fraction(self, key: str, value: Any) -> float:
        """A number in (0, 1] (rotary_pct, partial_rotary_factor)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (isinstance(value, float) and not math.isfinite(value)) or not 0 < value <= 1:
            raise self.fail(f"{key}={value!r} must be a number in (0, 1]")
        return float(value)

    def probability(self, key: str, default: float) -> float:
        """A dropout probability in [0, 1); ``default`` when absent or null."""
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value < 1:
            raise self.fail(f"{key}={value!r} must be a probability in [0, 1)")
        return float(value)

    def index_list(self, key: str, length: int) -> tuple[int, ...]:
        """A list of layer indices in [0, length); null or absent = empty."""
        value = self.raw(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(f"{key}={value!r} must be a list of layer indices")
        out = sorted({check_int(f"{key}[{i}]", v, self.source, minimum=0, maximum=length - 1)
                      for i, v in enumerate(value)})
        return tuple(out)

    def optional(self, key: str, field: str, default: int) -> int:
        """An integer >= 0 whose absence means transformers' ``default`` for the type and whose null (or 0)
        means "none" (sliding_window, q_lora_rank, n_routed_experts, ...)."""
        if key not in self.cfg:
            return default
        return self.int(key, field, default=0, minimum=0)

    def false_only(self, key: str, why: str) -> None:
        """Accept ``key`` only when false (or absent); mark it ignored."""
        value = self.cfg.get(key)
        if value is None:
            return
        if value is not False:
            raise self.fail(f"{key}={value!r} is not supported: {why}")
        self.ignore(key, "false (feature off)")

    # ---- the rest -------------------------------------------------------------------------------------
    def finish(self, harmless: Mapping[str, str] = {}) -> dict[str, str]:
        """Classify every key not read yet; refuse those that may change the cost. Returns key -> status."""
        for key, why in FALSE_ONLY.items():
            self.false_only(key, why)
        pruned = self.cfg.get("pruned_heads")
        if pruned:
            raise self.fail(f"pruned_heads={pruned!r} is not supported: pruned heads change every layer's shape")
        self.ignore("pruned_heads", "empty")
        for key, value in self.cfg.items():
            if key in self.status:
                continue
            if key in harmless or key in HARMLESS:
                self.status[key] = f"ignored: {harmless.get(key) or HARMLESS[key]}"
            elif value is None:
                self.status[key] = "ignored: null (absent)"
            else:
                raise self.fail(self._refusal(key))
        return dict(self.status)

    def _refusal(self, key: str) -> str:
        mtype = self.model_type
        if key in MOE_KEYS or key.startswith("moe_") or "expert" in key or key.startswith("router"):
            return (f"key {key!r} describes a mixture of experts, but model_type={mtype!r} is dense: use the "
                    f"mixture-of-experts model_type (mixtral, qwen2_moe, qwen3_moe, deepseek_v3) or remove it")
        if key in MLA_KEYS:
            return (f"key {key!r} describes multi-head latent attention, which model_type={mtype!r} does not "
                    f"have (deepseek_v2/deepseek_v3 do)")
        if key in ATTENTION_VARIANT_KEYS:
            return (f"key {key!r} describes an attention variant that model_type={mtype!r} does not have in "
                    f"transformers; tpsim will not cost it as plain attention")
        return (f"unknown key {key!r} for model_type={mtype!r}: tpsim cannot tell whether it changes the cost "
                f"(remove it if it does not; known keys: docs/MODELS.md)")


def check_rope(reader: ConfigReader) -> float | None:
    """Validate ``rope_scaling`` / ``rope_parameters`` (a known frequency-only type; per-layer-type blocks
    allowed) and return their ``partial_rotary_factor`` if one is given."""
    fraction: float | None = None
    for key in ("rope_scaling", "rope_parameters"):
        value = reader.cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise reader.fail(f"{key}={value!r} must be an object")
        blocks: Iterable[Any] = value.values() if value and all(isinstance(v, Mapping) for v in value.values()) \
            else [value]
        kinds = []
        for block in blocks:
            kind = block.get("rope_type", block.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise reader.fail(f"{key} type {kind!r} is not a known rotary scaling ({', '.join(ROPE_TYPES)}): "
                                  f"tpsim cannot tell whether it changes the cost")
            kinds.append(kind)
            if block.get("partial_rotary_factor") is not None:
                fraction = reader.fraction(f"{key}.partial_rotary_factor", block["partial_rotary_factor"])
        status = f"ignored: rotary frequency scaling {'/'.join(sorted(set(kinds)))} (changes no shape or FLOP count)"
        reader.status[key] = "used" if fraction is not None else status
    return fraction
