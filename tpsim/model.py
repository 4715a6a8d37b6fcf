"""Model specification: decoder-only transformers of the GPT and Llama families.

A :class:`ModelSpec` comes from a built-in preset (:data:`PRESETS`), from a Hugging Face ``config.json``
(:func:`from_hf_config`), and may be changed by overrides (:func:`with_overrides`). It is torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError

FAMILIES = ("gpt", "llama")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer (all sizes are element counts, not bytes)."""

    name: str
    family: str
    """"gpt" (LayerNorm, GeLU MLP, learned positions) or "llama" (RMSNorm, SwiGLU, rotary, GQA)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    """key/value heads (grouped-query attention); equal to num_attention_heads for multi-head attention."""
    ffn_hidden_size: int
    vocab_size: int
    """vocabulary before padding; :meth:`padded_vocab` pads to a multiple of 128 x tp as Megatron does."""
    seq_len: int
    """training sequence length, tokens."""
    max_positions: int
    head_dim: int = 0
    """per-head dimension; 0 means hidden_size / num_attention_heads."""
    norm: str = "layernorm"
    activation: str = "gelu"
    position: str = "learned"
    tie_embeddings: bool = False
    qkv_bias: bool = True
    linear_bias: bool = True
    """bias on the output projection and the MLP linears."""
    global_batch: int = 0
    """typical global batch in sequences (0: unknown)."""
    default_plan: Mapping[str, Any] = field(default_factory=dict)
    """typical plan (keys of :class:`tpsim.plan.Plan`, plus "cluster" and "gpus")."""

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
                object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                     "vocab_size", "seq_len", "max_positions", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"model {self.name}: {name}={value!r} must be a positive integer")
        if self.family not in FAMILIES:
            raise InputError(f"model {self.name}: family={self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise InputError(f"model {self.name}: norm={self.norm!r} is not layernorm or rmsnorm")
        if self.activation not in ("gelu", "swiglu"):
            raise InputError(f"model {self.name}: activation={self.activation!r} is not gelu or swiglu")
        if self.position not in ("learned", "rotary"):
            raise InputError(f"model {self.name}: position={self.position!r} is not learned or rotary")
        if self.num_attention_heads % self.num_kv_heads:
            raise InputError(f"model {self.name}: num_kv_heads={self.num_kv_heads} does not divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.global_batch < 0:
            raise InputError(f"model {self.name}: global_batch={self.global_batch} must be >= 0")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection output: heads x head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection output: kv_heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def gated(self) -> bool:
        """SwiGLU MLP: two input projections (gate and up)."""
        return self.activation == "swiglu"

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary padded to a multiple of 128 x tp (Megatron ``_vocab_size_with_padding``)."""
        multiple = 128 * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights, biases and norms)."""
        h, q, kv, f = self.hidden_size, self.q_size, self.kv_size, self.ffn_hidden_size
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.linear_bias:
            attn += h
        mlp_in = (2 if self.gated else 1) * h * f
        mlp = mlp_in + f * h
        if self.linear_bias:
            mlp += (2 if self.gated else 1) * f + h
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        return attn + mlp + norms

    def embedding_params(self, tp: int = 1) -> int:
        """Input embedding (+ learned positions) parameters, with the padded vocabulary."""
        pos = self.max_positions * self.hidden_size if self.position == "learned" else 0
        return self.padded_vocab(tp) * self.hidden_size + pos

    def output_params(self, tp: int = 1) -> int:
        """Final norm + output projection (0 extra weights for the projection if tied)."""
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        head = 0 if self.tie_embeddings else self.padded_vocab(tp) * self.hidden_size
        return final_norm + head

    def total_params(self, tp: int = 1) -> int:
        """All parameters (the vocabulary padded for ``tp``)."""
        return self.num_layers * self.layer_params() + self.embedding_params(tp) + self.output_params(tp)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["default_plan"] = dict(self.default_plan)
        d["params"] = self.total_params()
        return d


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int, gbs: int,
         plan: Mapping[str, Any], ffn: int | None = None, max_pos: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, family="gpt", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=ffn or 4 * hidden, vocab_size=vocab, seq_len=seq,
                     max_positions=max_pos or seq, norm="layernorm", activation="gelu", position="learned",
                     tie_embeddings=True, qkv_bias=True, linear_bias=True, global_batch=gbs, default_plan=plan)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, vocab: int, gbs: int,
           plan: Mapping[str, Any], max_pos: int = 131072) -> ModelSpec:
    return ModelSpec(name=name, family="llama", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_len=seq, max_positions=max_pos,
                     norm="rmsnorm", activation="swiglu", position="rotary", tie_embeddings=False,
                     qkv_bias=False, linear_bias=False, global_batch=gbs, default_plan=plan)


# Sources: GPT-3 (Brown et al. 2020, Table 2.1; Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh for
# tp=8 pp=16 mbs=1 gbs=1536); Megatron 1T (Narayanan et al. 2021, Table 1); Llama 3 (Llama Team 2024,
# "The Llama 3 Herd of Models", Tables 3 and 4; HF config.json of meta-llama/Meta-Llama-3-*).
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt("gpt3-175b", 96, 12288, 96, 2048, 50257, 1536,
             dict(cluster="dgx-a100", gpus=1024, tp=8, pp=16, sp=True, recompute="selective", zero=1,
                  micro_batch=1, dtype="bf16")),
        _gpt("megatron-1t", 128, 25600, 160, 2048, 51200, 3072,
             dict(cluster="dgx-a100", gpus=3072, tp=8, pp=64, recompute="full", micro_batch=1,
                  dtype="fp16", attention="unfused", overlap=False)),
        _gpt("gpt3-1.3b", 24, 2048, 16, 2048, 50257, 512,
             dict(cluster="dgx-a100", gpus=8, tp=1, pp=1, micro_batch=4, dtype="bf16")),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, 512,
               dict(cluster="dgx-h100", gpus=64, tp=2, pp=1, sp=True, zero=1, recompute="selective",
                    micro_batch=1, dtype="bf16"), max_pos=8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256, 512,
               dict(cluster="dgx-h100", gpus=64, tp=8, pp=4, sp=True, zero=1, recompute="selective",
                    micro_batch=1, dtype="bf16"), max_pos=8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256, 2048,
               dict(cluster="dgx-h100", gpus=16384, tp=8, pp=16, vpp=4, sp=True, zero=1, recompute="full",
                    micro_batch=1, dtype="bf16")),
    )
}


def get_preset(name: str) -> ModelSpec:
    key = name.lower()
    if key not in PRESETS:
        raise InputError(f"model={name!r} is not a preset ({', '.join(sorted(PRESETS))}) nor a config.json path")
    return PRESETS[key]


_HF_TYPES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")


def _get(cfg: Mapping[str, Any], key: str, source: str, default: Any = None, required: bool = True) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required and default is None:
        raise InputError(f"{source}: missing field {key!r}")
    return default


def from_hf_config(cfg: Mapping[str, Any], name: str = "hf-model", source: str = "config.json") -> ModelSpec:
    """Build a spec from the keys of a Hugging Face ``config.json`` (gpt2, gpt_neox, llama, mistral, qwen2)."""
    if not isinstance(cfg, Mapping):
        raise InputError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    mtype = cfg.get("model_type")
    if mtype not in _HF_TYPES:
        raise InputError(f"{source}: model_type={mtype!r} is not supported (supported: {', '.join(_HF_TYPES)})")
    g = lambda k, d=None, req=True: _get(cfg, k, source, d, req)  # noqa: E731
    if mtype == "gpt2":
        hidden = int(g("n_embd"))
        inner = g("n_inner", None, False)
        max_pos = int(g("n_positions", None, False) or g("n_ctx"))
        return ModelSpec(name=name, family="gpt", num_layers=int(g("n_layer")), hidden_size=hidden,
                         num_attention_heads=int(g("n_head")), num_kv_heads=int(g("n_head")),
                         ffn_hidden_size=int(inner) if inner else 4 * hidden, vocab_size=int(g("vocab_size")),
                         seq_len=min(max_pos, 8192), max_positions=max_pos, norm="layernorm", activation="gelu",
                         position="learned", tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                         qkv_bias=True, linear_bias=True)
    heads = int(g("num_attention_heads"))
    hidden = int(g("hidden_size"))
    max_pos = int(g("max_position_embeddings", 2048, False))
    common = dict(name=name, num_layers=int(g("num_hidden_layers")), hidden_size=hidden,
                  num_attention_heads=heads, ffn_hidden_size=int(g("intermediate_size")),
                  vocab_size=int(g("vocab_size")), seq_len=min(max_pos, 8192), max_positions=max_pos)
    if mtype == "gpt_neox":
        return ModelSpec(**common, family="gpt", num_kv_heads=heads, norm="layernorm", activation="gelu",
                         position="rotary", tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                         qkv_bias=bool(cfg.get("attention_bias", True)), linear_bias=True)
    head_dim = cfg.get("head_dim") or 0
    default_qkv_bias = mtype == "qwen2"
    return ModelSpec(**common, family="llama", num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                     head_dim=int(head_dim), norm="rmsnorm", activation="swiglu", position="rotary",
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                     qkv_bias=bool(cfg.get("attention_bias", default_qkv_bias)),
                     linear_bias=bool(cfg.get("mlp_bias", False)) and bool(cfg.get("attention_bias", False)))


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name or the path of a Hugging Face ``config.json`` (or of a folder holding one)."""
    if str(name_or_path).endswith(".ops.json"):  # the op graph sits above this layer: tpsim.load_model reads it
        raise InputError(f"model {name_or_path} is a traced op graph: read it with tpsim.load_model or "
                         "tpsim.opgraph.model.load_graph_model (the CLI takes it as --model)")
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if name_or_path.lower() in PRESETS:
        return PRESETS[name_or_path.lower()]
    if not path.exists():
        if path.suffix == ".json" or "/" in name_or_path:
            raise InputError(f"model file {name_or_path} does not exist")
        return get_preset(name_or_path)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    stem = path.parent.name if path.name == "config.json" else path.stem
    return from_hf_config(cfg, name=stem or "hf-model", source=str(path))


_OVERRIDES = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_kv_heads", "ffn": "ffn_hidden_size", "vocab": "vocab_size", "seq_len": "seq_len"}


def with_overrides(spec: ModelSpec, **overrides: int | None) -> ModelSpec:
    """Apply command-line overrides (``layers, hidden, heads, kv_heads, ffn, vocab, seq_len``; None = keep)."""
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in _OVERRIDES:
            raise InputError(f"unknown model override {key!r}")
        if not isinstance(value, int) or value <= 0:
            raise InputError(f"--{key.replace('_', '-')}={value!r} must be a positive integer")
        changes[_OVERRIDES[key]] = value
    if not changes:
        return spec
    if "hidden_size" in changes or "num_attention_heads" in changes:
        changes.setdefault("head_dim", 0)
        h = changes.get("hidden_size", spec.hidden_size)
        a = changes.get("num_attention_heads", spec.num_attention_heads)
        if h % a:
            raise InputError(f"--heads={a} does not divide --hidden={h}")
        if spec.family == "gpt" and "ffn_hidden_size" not in changes and "hidden_size" in changes:
            changes["ffn_hidden_size"] = 4 * h
    if "num_attention_heads" in changes and "num_kv_heads" not in changes and spec.num_kv_heads == \
            spec.num_attention_heads:
        changes["num_kv_heads"] = changes["num_attention_heads"]
    if "seq_len" in changes and spec.position == "learned":
        changes["max_positions"] = max(spec.max_positions, changes["seq_len"])
    return dataclasses.replace(spec, **changes)
