"""FLOP counts of a transformer (the SC21 / Korthikanti et al. 2022 convention: matmul FLOPs only)."""

from __future__ import annotations

from ..model import ModelSpec


def layer_forward_flops(model: ModelSpec) -> tuple[float, float]:
    """(matmul FLOPs of one layer's forward per sequence, of which the attention-score matmuls)."""
    s, h, q, kv, f = (float(x) for x in (model.seq_len, model.hidden_size, model.q_size, model.kv_size,
                                         model.ffn_hidden_size))
    linears = 2 * s * (h * (q + 2 * kv) + q * h + (3 if model.gated else 2) * h * f)
    scores = 4 * s * s * q  # QK^T and attention x V, full (non-causal), as Korthikanti et al. count
    return linears + scores, scores


def model_flops_per_sequence(model: ModelSpec) -> float:
    """3 x forward matmul FLOPs; GPT: 72 L s h^2 (1 + s/6h + V/12hL) per sequence (Korthikanti et al. 2022)."""
    layer, _ = layer_forward_flops(model)
    logits = 2.0 * model.seq_len * model.hidden_size * model.vocab_size
    return 3.0 * (model.num_layers * layer + logits)
