"""Parameter and FLOP counts of a :class:`~tpsim.model.spec.ModelSpec`.

Parameters are counted weight by weight as the Hugging Face modeling files build them
(``modeling_llama.py``, ``modeling_mixtral.py``, ``modeling_qwen2_moe.py``, ``modeling_deepseek_v3.py``) and
as Megatron-Core's ``TransformerLayer`` / ``MoELayer`` / ``MLASelfAttention`` do. FLOPs are forward matmul
FLOPs (2 per multiply-add) per token, the quantity MFU divides (Korthikanti et al. 2022, "Reducing Activation
Recomputation", section 6; PaLM appendix B): MoE layers count only the experts a token is routed to
(Narayanan-style "active" FLOPs, as DeepSeek-V3's report and Megatron-Core's ``num_floating_point_operations``
count them).

Not counted (each below 1e-4 of any published model): DeepSeek-V3's router score-correction bias
(``e_score_correction_bias``, num_experts per MoE layer), norms' FLOPs and the rotary embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import ModelSpec


@dataclass(frozen=True)
class FlopCount:
    """Forward matmul FLOPs per token, by part (2 FLOPs per multiply-add)."""

    attention_linear: float
    """q/k/v (or MLA down/up) and output projections, all layers."""
    attention_scores: float
    """Q K^T and scores x V, all layers, over the keys each query attends to."""
    mlp: float
    """dense MLPs, routed experts a token is sent to and shared experts, all layers."""
    router: float
    """router (gate) linear and shared-expert gate of the MoE layers."""
    logits: float
    """output projection onto the (unpadded) vocabulary."""

    @property
    def total(self) -> float:
        return self.attention_linear + self.attention_scores + self.mlp + self.router + self.logits


# ---- parameters ------------------------------------------------------------------------------------
def mlp_weights(spec: "ModelSpec", width: int) -> int:
    """Weights of one MLP of ``width``: (gate +) up projection and down projection."""
    return (2 if spec.gated else 1) * spec.hidden_size * width + width * spec.hidden_size


def mlp_params(spec: "ModelSpec", width: int) -> int:
    """One MLP of ``width`` with its biases."""
    bias = ((2 if spec.gated else 1) * width + spec.hidden_size) if spec.linear_bias else 0
    return mlp_weights(spec, width) + bias


def attention_weights(spec: "ModelSpec") -> int:
    """Projection weights of one attention block (the matmul operands).

    Standard: W_q (h x q), W_k, W_v (h x kv), W_o (q x h). MLA (DeepSeek-V2 paper eq. 9-14, HF
    ``DeepseekV3Attention``): q_a (h x q_lora) and q_b (q_lora x heads (nope + rope)), or one q (h x heads
    (nope + rope)) without q_lora; kv_a (h x (kv_lora + rope)), kv_b (kv_lora x heads (nope + v)), o (heads v x h).
    """
    h, a = spec.hidden_size, spec.num_attention_heads
    if spec.attention_kind == "standard":
        return h * (spec.q_size + 2 * spec.kv_size) + spec.q_size * h
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    ql = spec.q_lora_rank
    q = h * ql + ql * a * qk if ql else h * a * qk
    kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * a * (spec.qk_nope_head_dim
                                                                                   + spec.v_head_dim)
    return q + kv + a * spec.v_head_dim * h


def attention_params(spec: "ModelSpec") -> int:
    """One attention block: projection weights, biases, per-head q/k norms (Qwen3), MLA latent norms."""
    params = attention_weights(spec)
    if spec.attention_kind == "mla":
        params += spec.q_lora_rank + spec.kv_lora_rank  # q_a_layernorm, kv_a_layernorm (RMSNorm)
    else:
        if spec.qkv_bias:
            params += spec.q_size + 2 * spec.kv_size
        if spec.qk_norm:
            params += 2 * spec.head_dim
    if spec.linear_bias:
        params += spec.hidden_size
    return params


def norm_params(spec: "ModelSpec") -> int:
    """The block's norms: weight (and bias for LayerNorm) over hidden_size each."""
    return spec.norms_per_layer * spec.hidden_size * (2 if spec.norm == "layernorm" else 1)


def expert_params(spec: "ModelSpec") -> int:
    """One routed expert (an MLP of moe_ffn_hidden_size)."""
    return mlp_params(spec, spec.moe_ffn_hidden_size)


def shared_params(spec: "ModelSpec") -> int:
    """Shared experts and their gate (Qwen2-MoE ``shared_expert_gate``: Linear(hidden, 1))."""
    params = spec.num_shared_experts * mlp_params(spec, spec.shared_expert_ffn_hidden_size)
    return params + (spec.hidden_size if spec.shared_expert_gate else 0)


def router_params(spec: "ModelSpec") -> int:
    """The router: Linear(hidden, num_experts) without bias."""
    return spec.hidden_size * spec.num_experts


def dense_layer_params(spec: "ModelSpec") -> int:
    return attention_params(spec) + mlp_params(spec, spec.ffn_hidden_size) + norm_params(spec)


def moe_layer_params(spec: "ModelSpec") -> int:
    return (attention_params(spec) + spec.num_experts * expert_params(spec) + shared_params(spec)
            + router_params(spec) + norm_params(spec))


def total_params(spec: "ModelSpec", tp: int = 1, padded: bool = True) -> int:
    n_moe = spec.num_moe_layers
    layers = (spec.num_layers - n_moe) * dense_layer_params(spec) + n_moe * moe_layer_params(spec)
    return layers + spec.embedding_params(tp, padded) + spec.output_params(tp, padded)


def active_params(spec: "ModelSpec", tp: int = 1, padded: bool = True) -> int:
    idle = spec.num_moe_layers * (spec.num_experts - spec.experts_per_token) * expert_params(spec) \
        if spec.num_experts else 0
    return total_params(spec, tp, padded) - idle


def mtp_params(spec: "ModelSpec") -> int:
    """Multi-token-prediction modules (DeepSeek-V3 report section 2.2): each a transformer layer like the last
    one, a projection M (2h -> h) and three RMSNorms (enorm, hnorm, the shared head's norm); the embedding and
    output head are shared with the model."""
    if not spec.mtp_layers:
        return 0
    last = spec.layer_params(spec.num_layers - 1)
    return spec.mtp_layers * (last + 2 * spec.hidden_size * spec.hidden_size + 3 * spec.hidden_size)


# ---- FLOPs ------------------------------------------------------------------------------------------
def keys_per_query(seq: int, window: int, causal: bool) -> float:
    """Mean number of keys one query is scored against. Non-causal convention (Korthikanti et al. 2022,
    the estimator's model FLOPs): every key of the window, min(window, s) (s for full attention). Causal:
    query i sees min(i + 1, window) keys, averaged over the s queries."""
    w = seq if window == 0 else min(window, seq)
    if not causal:
        return float(w)
    return (w * (w + 1) / 2 + (seq - w) * w) / seq


def score_flops_per_key(spec: "ModelSpec") -> float:
    """FLOPs of one query against one key, all heads: Q K^T over the q/k head dim, P V over the v head dim."""
    a = spec.num_attention_heads
    if spec.attention_kind == "mla":
        return 2.0 * a * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + 2.0 * a * spec.v_head_dim
    return 4.0 * spec.q_size


def flops_per_token(spec: "ModelSpec", causal: bool = False) -> FlopCount:
    """Forward matmul FLOPs per token (active experts; each layer's sliding window honoured)."""
    per_key = score_flops_per_key(spec)
    scores = sum(count * per_key * keys_per_query(spec.seq_len, kind.window, causal)
                 for kind, count in spec.layer_counts().items())
    n_moe = spec.num_moe_layers
    dense_mlp = (spec.num_layers - n_moe) * 2.0 * mlp_weights(spec, spec.ffn_hidden_size)
    moe_mlp, router = 0.0, 0.0
    if n_moe:
        shared = spec.num_shared_experts * mlp_weights(spec, spec.shared_expert_ffn_hidden_size)
        moe_mlp = n_moe * 2.0 * (spec.experts_per_token * mlp_weights(spec, spec.moe_ffn_hidden_size) + shared)
        router = n_moe * 2.0 * spec.hidden_size * (spec.num_experts + (1 if spec.shared_expert_gate else 0))
    return FlopCount(attention_linear=spec.num_layers * 2.0 * attention_weights(spec), attention_scores=scores,
                     mlp=dense_mlp + moe_mlp, router=router, logits=2.0 * spec.hidden_size * spec.vocab_size)
