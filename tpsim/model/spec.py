"""The model specification: one frozen dataclass for every decoder-only transformer tpsim knows.

Dense GPT/Llama blocks, grouped-query and multi-head latent attention (DeepSeek-V2/V3), sliding-window
attention (Mistral, Qwen2, Gemma 2, Phi-3), gated MLPs (SwiGLU, GeGLU) and mixtures of experts (Mixtral,
Qwen-MoE, DeepSeek) with shared experts, dense first layers and a layer frequency. Field names follow
docs/SCHEMAS.md section 8; every field is checked in ``__post_init__`` (:mod:`tpsim.model.checks`).
Parameter and FLOP counts live in :mod:`tpsim.model.counting`; this module only holds the shape.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from . import counting
from .checks import check_spec
from .describe import summary

FAMILIES = ("gpt", "llama")
"""Block styles the estimator costs: ``gpt`` = Megatron GPT blocks (LayerNorm, GeLU MLP); ``llama`` = pre-norm
blocks (RMSNorm, gated MLP). Every Hugging Face type maps to one of them; the architecture itself is
:attr:`ModelSpec.architecture`. Dropout is not a family rule but the model's own probabilities
(:attr:`ModelSpec.hidden_dropout`, :attr:`ModelSpec.attention_dropout`)."""
FAMILY_DROPOUT = {"gpt": 0.1, "llama": 0.0}
"""dropout probability of a spec that does not state one: GPT-2/GPT-3 and Megatron's GPT defaults
(transformers GPT2Config resid_pdrop = attn_pdrop = 0.1; Megatron-LM arguments.py --hidden-dropout and
--attention-dropout 0.1); Llama-style blocks have no dropout (transformers LlamaConfig attention_dropout 0.0,
no hidden dropout in modeling_llama.py)."""
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu", "geglu")
POSITIONS = ("learned", "rotary")
ATTENTION_KINDS = ("standard", "mla")


@dataclass(frozen=True)
class LayerKind:
    """What one transformer layer is, as far as its cost goes."""

    moe: bool
    """mixture-of-experts MLP (else the dense MLP of ``ffn_hidden_size``)."""
    window: int
    """keys a query may attend to (sliding window); 0 = the whole causal prefix."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer (all sizes are element counts, not bytes)."""

    name: str
    family: str
    """block style the estimator costs: "gpt" or "llama" (see :data:`FAMILIES`)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    """key/value heads (grouped-query attention); equal to num_attention_heads for multi-head attention
    and for multi-head latent attention (every head has its own up-projected key and value)."""
    ffn_hidden_size: int
    """MLP width of a dense layer (per gate for gated MLPs)."""
    vocab_size: int
    """vocabulary before padding; :meth:`padded_vocab` pads to a multiple of 128 x tp as Megatron does."""
    seq_len: int
    """training sequence length, tokens."""
    max_positions: int
    head_dim: int = 0
    """per-head dimension of queries and keys; 0 means hidden_size / num_attention_heads. For MLA:
    qk_nope_head_dim + qk_rope_head_dim."""
    norm: str = "layernorm"
    activation: str = "gelu"
    """gelu (one input projection) | swiglu | geglu (gated: two input projections, gate and up)."""
    position: str = "learned"
    tie_embeddings: bool = False
    qkv_bias: bool = True
    linear_bias: bool = True
    """bias on the output projection and the MLP linears."""
    global_batch: int = 0
    """typical global batch in sequences (0: unknown)."""
    default_plan: Mapping[str, Any] = field(default_factory=dict)
    """typical plan (keys of :class:`tpsim.plan.Plan`, plus "cluster" and "gpus")."""

    # ---- architecture details (issue 11) --------------------------------------------------------------
    architecture: str = ""
    """the Hugging Face ``model_type`` or the preset's architecture (gpt2, llama, mixtral, deepseek_v3, ...);
    "" = the family itself."""
    norms_per_layer: int = 2
    """normalization layers per block: 2 (pre-attention, pre-MLP); Gemma 2 has 4 (also after each)."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (Qwen3): head_dim weights each."""
    parallel_residual: bool = False
    """attention and MLP read the same input and are added together (GPT-J, GPT-NeoX)."""
    rotary_fraction: float = 1.0
    """share of each head's dimensions that get rotary embeddings (GPT-NeoX rotary_pct 0.25)."""
    rotary_base: int = 0
    """rotary base frequency (Hugging Face ``rope_theta``; no cost): exporters write it (Megatron
    ``--rotary-base``); 0 = not stated (the frameworks' default, 10000)."""

    attention_kind: str = "standard"
    """"standard" (multi-head or grouped-query) or "mla" (multi-head latent attention, DeepSeek-V2/V3)."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection; 0 = queries projected directly (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed key/value latent."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key dimensions without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key dimensions with rotary embedding (the key part is shared by all heads)."""
    v_head_dim: int = 0
    """MLA: per-head value dimension."""
    sliding_window: int = 0
    """keys a query attends to in sliding-window layers (HF ``sliding_window``); 0 = none."""
    full_attention_layers: tuple[int, ...] = ()
    """layers (0-based) that attend to the whole prefix although ``sliding_window`` > 0 (Gemma 2's odd layers,
    Qwen2's first ``max_window_layers``); empty = every layer has the window."""

    num_experts: int = 0
    """routed experts per MoE layer; 0 = dense model."""
    experts_per_token: int = 0
    """routed experts each token is sent to (top-k)."""
    moe_ffn_hidden_size: int = 0
    """MLP width of one routed expert."""
    num_shared_experts: int = 0
    """experts every token goes through besides its routed ones (DeepSeek, Qwen2-MoE)."""
    shared_expert_ffn_hidden_size: int = 0
    """MLP width of one shared expert (Megatron-Core's moe_shared_expert_intermediate_size is this times
    num_shared_experts)."""
    shared_expert_gate: bool = False
    """a sigmoid gate (Linear(hidden, 1)) scales the shared expert's output (Qwen2-MoE)."""
    first_dense_layers: int = 0
    """leading layers with the dense MLP (DeepSeek first_k_dense_replace)."""
    moe_layer_freq: int = 1
    """after the dense ones, layer i is MoE when i % moe_layer_freq == 0 (DeepSeek / Megatron-Core)."""
    dense_layers: tuple[int, ...] = ()
    """further layers (0-based) with the dense MLP (Qwen-MoE mlp_only_layers and decoder_sparse_step)."""
    capacity_factor: float = 0.0
    """expert capacity as a multiple of the balanced load; 0 = dropless (every HF model type here)."""
    moe_balance: str | float = "aux"
    """expert load balance (docs/SCHEMAS.md T2): ``"forced"`` (tokens force-balanced, imbalance 1, as many
    published benchmarks run), ``"aux"`` (the router's own balancing: the measured imbalance of
    tpsim/data/moe.yaml, auxiliary-loss or DeepSeek-V3's loss-free) or a number >= 1 (tokens of the busiest
    expert over the mean)."""
    router_groups: int = 0
    """group-limited routing: experts split into this many groups (DeepSeek n_group, one per node); 0 = none."""
    router_group_topk: int = 0
    """groups a token's experts may come from (DeepSeek topk_group: tokens reach at most this many nodes)."""
    mtp_layers: int = 0
    """multi-token-prediction modules trained beside the model (DeepSeek-V3 num_nextn_predict_layers); not
    part of :meth:`total_params` (DeepSeek's 671B excludes them)."""
    hidden_dropout: float | None = None
    """dropout probability after the attention and the MLP (the residual branches; HF ``resid_pdrop`` /
    ``hidden_dropout``, Megatron ``--hidden-dropout``, NeMo ``hidden_dropout``); > 0 costs two dropout kernels
    and two 1-byte masks per layer. None = the family's default (:data:`FAMILY_DROPOUT`)."""
    attention_dropout: float | None = None
    """dropout probability on the attention probabilities (HF ``attn_pdrop`` / ``attention_dropout``, Megatron
    ``--attention-dropout``); > 0 costs the dropout of unfused attention's scores and their 1-byte mask (flash
    attention regenerates its mask from the RNG state). None = the family's default."""
    source_keys: Mapping[str, str] = field(default_factory=dict)
    """config key -> "used" or "ignored: <why>" (empty for presets); listed by :meth:`summary`."""

    def __post_init__(self) -> None:
        for name in ("full_attention_layers", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, list):  # a spec read back from JSON
                object.__setattr__(self, name, tuple(value))
        for name in ("hidden_dropout", "attention_dropout"):
            if getattr(self, name) is None and self.family in FAMILY_DROPOUT:
                object.__setattr__(self, name, FAMILY_DROPOUT[self.family])
        if (self.head_dim == 0 and self.attention_kind == "standard" and isinstance(self.hidden_size, int)
                and isinstance(self.num_attention_heads, int) and not isinstance(self.num_attention_heads, bool)
                and self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0):
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim == 0 and self.attention_kind == "mla" and isinstance(self.qk_nope_head_dim, int) \
                and isinstance(self.qk_rope_head_dim, int):
            object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        check_spec(self)

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
        """Gated MLP (SwiGLU, GeGLU): two input projections (gate and up)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def has_hidden_dropout(self) -> bool:
        """Dropout after attention and MLP is applied (its kernels and 1-byte masks are costed)."""
        return bool(self.hidden_dropout)

    @property
    def has_attention_dropout(self) -> bool:
        """Dropout on the attention probabilities (costed with unfused attention)."""
        return bool(self.attention_dropout)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def used_keys(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.source_keys.items() if v == "used")

    @property
    def ignored_keys(self) -> dict[str, str]:
        """config key -> why it does not change the cost."""
        return {k: v.removeprefix("ignored: ") for k, v in self.source_keys.items() if v != "used"}

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary padded to a multiple of 128 x tp (Megatron ``_vocab_size_with_padding``)."""
        multiple = 128 * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    # ---- layers --------------------------------------------------------------------------------------
    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has the mixture-of-experts MLP (DeepSeek ``first_k_dense_replace`` and
        ``moe_layer_freq``; Qwen-MoE ``mlp_only_layers``)."""
        return (self.num_experts > 0 and index >= self.first_dense_layers and index % self.moe_layer_freq == 0
                and index not in self._dense_set)

    def layer_window(self, index: int) -> int:
        """Sliding window of layer ``index`` in keys, 0 = full causal attention."""
        if self.sliding_window and index not in self._full_set:
            return self.sliding_window
        return 0

    @cached_property
    def _dense_set(self) -> frozenset[int]:
        return frozenset(self.dense_layers)

    @cached_property
    def _full_set(self) -> frozenset[int]:
        return frozenset(self.full_attention_layers)

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """One :class:`LayerKind` per layer, in order."""
        return self._layer_kinds

    @cached_property
    def _layer_kinds(self) -> tuple[LayerKind, ...]:
        return tuple(LayerKind(moe=self.is_moe_layer(i), window=self.layer_window(i))
                     for i in range(self.num_layers))

    def layer_counts(self) -> dict[LayerKind, int]:
        """How many layers of each kind (a new dict; the count is computed once per spec)."""
        return dict(self._layer_counts)

    @cached_property
    def _layer_counts(self) -> dict[LayerKind, int]:
        out: dict[LayerKind, int] = {}
        for kind in self.layer_kinds():
            out[kind] = out.get(kind, 0) + 1
        return out

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    # ---- parameters (tpsim.model.counting) -------------------------------------------------------------
    def attention_params(self) -> int:
        """Parameters of one attention block (projections, biases, q/k norms, MLA latent norms)."""
        return counting.attention_params(self)

    def dense_layer_params(self) -> int:
        """Parameters of one layer with the dense MLP (weights, biases and norms)."""
        return counting.dense_layer_params(self)

    def moe_layer_params(self) -> int:
        """Parameters of one mixture-of-experts layer: every routed and shared expert and the router."""
        return counting.moe_layer_params(self)

    def layer_params(self, index: int | None = None) -> int:
        """Parameters of layer ``index``; without an index, of a layer with the dense MLP (every layer of a
        dense model)."""
        if index is not None and self.is_moe_layer(index):
            return self.moe_layer_params()
        return self.dense_layer_params()

    def embedding_params(self, tp: int = 1, padded: bool = True) -> int:
        """Input embedding (+ learned positions) parameters, the vocabulary padded for ``tp`` unless
        ``padded=False``."""
        vocab = self.padded_vocab(tp) if padded else self.vocab_size
        pos = self.max_positions * self.hidden_size if self.position == "learned" else 0
        return vocab * self.hidden_size + pos

    def output_params(self, tp: int = 1, padded: bool = True) -> int:
        """Final norm + output projection (0 extra weights for the projection if tied)."""
        vocab = self.padded_vocab(tp) if padded else self.vocab_size
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        head = 0 if self.tie_embeddings else vocab * self.hidden_size
        return final_norm + head

    def total_params(self, tp: int = 1, padded: bool = True) -> int:
        """All parameters (the vocabulary padded for ``tp``; ``padded=False`` gives the count publishers
        quote). Multi-token-prediction modules are not included (:meth:`mtp_params`)."""
        return counting.total_params(self, tp, padded)

    def active_params(self, tp: int = 1, padded: bool = True) -> int:
        """Parameters one token uses: everything but the routed experts it is not sent to (the top-k routed
        experts, the shared experts, the router, attention, norms, embedding and output layer). Equal to
        :meth:`total_params` for dense models."""
        return counting.active_params(self, tp, padded)

    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules (shared embedding and output head not counted)."""
        return counting.mtp_params(self)

    # ---- FLOPs (tpsim.model.counting) -----------------------------------------------------------------
    def flops_per_token(self, causal: bool = False) -> counting.FlopCount:
        """Forward matmul FLOPs per token by part (active experts only; sliding windows honoured)."""
        return counting.flops_per_token(self, causal)

    def forward_flops_per_token(self, causal: bool = False) -> float:
        """Forward matmul FLOPs per token: active linears + attention scores + logits. ``causal=False``
        counts every key of the window (s keys per query in full layers), as Korthikanti et al. 2022 and
        the estimator's model FLOPs do; ``causal=True`` counts only the keys a causal mask keeps."""
        return counting.flops_per_token(self, causal).total

    # ---- text ----------------------------------------------------------------------------------------
    def summary(self) -> str:
        """A few lines: parameters (total and active), layers, attention, experts, sequence, ignored keys."""
        return summary(self)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["default_plan"] = dict(self.default_plan)
        d["source_keys"] = dict(self.source_keys)
        d["params"] = self.total_params()
        d["active_params"] = self.active_params()
        return d
