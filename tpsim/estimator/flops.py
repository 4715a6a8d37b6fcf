"""FLOP counts of a transformer (the SC21 / Korthikanti et al. 2022 convention: matmul FLOPs only).

Dense blocks with standard attention and no effective sliding window use the closed form below; any other model
(mixtures of experts: active experts only; MLA; sliding windows) takes the count of
:meth:`tpsim.model.ModelSpec.flops_per_token` (non-causal: every key of the window), which equals the closed
form on dense models."""

from __future__ import annotations

from ..model import ModelSpec


def _plain(model: ModelSpec) -> bool:
    """A dense block with standard attention whose window (if any) covers the sequence."""
    windowed = bool(model.sliding_window) and model.sliding_window < model.seq_len
    return not model.is_moe and model.attention_kind == "standard" and not windowed


def layer_forward_flops(model: ModelSpec) -> tuple[float, float]:
    """(matmul FLOPs of one layer's forward per sequence, of which the attention-score matmuls); the mean
    layer for models whose layers differ."""
    s = float(model.seq_len)
    if not _plain(model):
        count = model.flops_per_token(causal=False)
        per_layer = s / model.num_layers
        return (count.total - count.logits) * per_layer, count.attention_scores * per_layer
    h, q, kv, f = (float(x) for x in (model.hidden_size, model.q_size, model.kv_size, model.ffn_hidden_size))
    linears = 2 * s * (h * (q + 2 * kv) + q * h + (3 if model.gated else 2) * h * f)
    scores = 4 * s * s * q  # QK^T and attention x V, full (non-causal), as Korthikanti et al. count
    return linears + scores, scores


def model_flops_per_sequence(model: ModelSpec) -> float:
    """3 x forward matmul FLOPs; GPT: 72 L s h^2 (1 + s/6h + V/12hL) per sequence (Korthikanti et al. 2022).
    Mixtures of experts count the active experts (top-k routed and shared) and the router."""
    if not _plain(model):
        return 3.0 * model.seq_len * model.forward_flops_per_token(causal=False)
    layer, _ = layer_forward_flops(model)
    logits = 2.0 * model.seq_len * model.hidden_size * model.vocab_size
    return 3.0 * (model.num_layers * layer + logits)
