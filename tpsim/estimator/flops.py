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


FLOPS_CONVENTIONS = ("full", "causal", "megatron", "palm", "6n")
"""How model FLOPs per step are counted (docs/SCHEMAS.md "Third wave", T5); every MFU / model TFLOP/s figure
names one, and a measured TFLOP/s of a runs file is converted with the convention its source used:

* ``full``: every matmul with non-causal attention (every key of the window), 3 x forward: tpsim's count since
  the first wave, Korthikanti et al. 2022 eq. (SC21 Table 1's convention for GPT).
* ``causal``: as ``full`` but a query attends only to the keys the causal mask keeps (about half the score
  FLOPs at long sequence), as NeMo and torchtitan count.
* ``megatron``: Megatron-LM's ``num_floating_point_operations`` (training.py, r0.8): 12 s L h^2 ((1 + g/a +
  s/h) q/h + (f/h) k_routed x (3/2 if gated) + V/(2 L h)) per sequence; equals ``full`` on a GPT with ffn = 4h.
* ``palm``: 6 N + 12 L h s per token with N the non-embedding parameters (PaLM appendix B, torchtitan's
  ``get_num_flop_per_token``; llm-foundry MPT counts N with the tied embedding: use ``6n`` plus the runs'
  own column if exact agreement matters).
* ``6n``: 6 N per token with N all (active) parameters, the "6ND" rule of thumb.
"""


DEFAULT_FLOPS_CONVENTION = "causal"
"""the convention MFU and model TFLOP/s are reported in unless ``--flops-convention`` names another (NeMo and
torchtitan count causal attention; docs/SCHEMAS.md T5)."""
FLOP_RATE_KEYS = ("model_tflops_per_gpu", "mfu", "mfu_low", "mfu_high")
"""result figures proportional to the model FLOPs (a convention scales them)."""


def convention_ratio(model: ModelSpec, to: str, frm: str = DEFAULT_FLOPS_CONVENTION) -> float:
    """Model FLOPs under ``to`` over model FLOPs under ``frm`` (the factor MFU and model TFLOP/s scale by)."""
    if to == frm:
        return 1.0
    return model_flops_per_sequence_as(model, to) / model_flops_per_sequence_as(model, frm)


def in_convention(figures: dict, ratio: float) -> dict:
    """``figures`` (a result's ``model_tflops_per_gpu``, ``mfu``, ``mfu_low``, ``mfu_high``, ``hfu``,
    ``hardware_tflops_per_gpu``: floats or arrays, whichever it has) with the model FLOPs scaled by ``ratio``;
    hardware FLOPs are the model FLOPs plus the recomputed ones, so they move by the model FLOPs' change."""
    out = dict(figures)
    for key in FLOP_RATE_KEYS:
        if key in out:
            out[key] = out[key] * ratio
    if "hfu" in out and "mfu" in figures:
        out["hfu"] = figures["hfu"] + figures["mfu"] * (ratio - 1.0)
    if "hardware_tflops_per_gpu" in out and "model_tflops_per_gpu" in figures:
        out["hardware_tflops_per_gpu"] = (figures["hardware_tflops_per_gpu"]
                                          + figures["model_tflops_per_gpu"] * (ratio - 1.0))
    return out


def measured_mfu_limit() -> tuple[float, float, str]:
    """(MFU above which a prediction is flagged, the highest MFU ever measured, its source) from
    tpsim/data/measured_limits.yaml."""
    return _measured_limits()


def _measured_limits() -> tuple[float, float, str]:
    global _LIMITS
    if _LIMITS is None:
        from pathlib import Path

        from ..safeyaml import load_data

        data = load_data(Path(__file__).resolve().parent.parent / "data" / "measured_limits.yaml")
        top = data["mfu_max_measured"]
        _LIMITS = (float(data["mfu_warn_above"]["value"]), float(top["value"]), " ".join(str(top["source"]).split()))
    return _LIMITS


_LIMITS: tuple[float, float, str] | None = None


MFU_WARNING_START = "MFU "
"""how :func:`mfu_warning`'s line starts (a change of convention replaces it)."""


def mfu_warning(mfu: float, convention: str = DEFAULT_FLOPS_CONVENTION) -> str | None:
    """The warning of a predicted MFU above what any training run has measured (None: below)."""
    warn, top, _ = measured_mfu_limit()
    if not mfu > warn:
        return None
    return (f"{MFU_WARNING_START}{100 * mfu:.1f}% ({convention} FLOPs) is above {100 * warn:.0f}%: no published training run "
            f"has measured more than {100 * top:.1f}% (tpsim/data/measured_limits.yaml); the prediction is likely "
            "optimistic")


def model_flops_per_sequence_as(model: ModelSpec, convention: str = "full") -> float:
    """Model FLOPs of one training sequence (forward + backward, no recomputation) under ``convention``."""
    from ..errors import InputError

    s = float(model.seq_len)
    if convention == "full":
        return model_flops_per_sequence(model)
    if convention == "causal":
        return 3.0 * s * model.forward_flops_per_token(causal=True)
    if convention == "megatron":
        h, L, a = float(model.hidden_size), float(model.num_layers), float(model.num_attention_heads)
        g = float(model.num_kv_heads or model.num_attention_heads)
        q_ratio = float(model.q_size) / h
        routed = float(model.experts_per_token + model.num_shared_experts) if model.is_moe else 1.0
        ffn = float(model.moe_ffn_hidden_size if model.is_moe and getattr(model, "moe_ffn_hidden_size", 0)
                    else model.ffn_hidden_size)
        gated = 1.5 if model.gated else 1.0
        return 12.0 * s * L * h * h * ((1.0 + g / a + s / h) * q_ratio + (ffn / h) * routed * gated
                                       + model.vocab_size / (2.0 * L * h))
    if convention in ("palm", "6n"):
        from ..model.counting import active_params

        n = float(active_params(model, padded=False))
        if convention == "6n":
            return 6.0 * n * s
        n -= float(model.embedding_params(1, False))  # the output projection is counted, as torchtitan does
        return (6.0 * n + 12.0 * model.num_layers * model.hidden_size * s) * s
    raise InputError(f"flops_convention={convention!r} is not one of {', '.join(FLOPS_CONVENTIONS)}")
