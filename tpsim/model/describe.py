"""What a model is, in words: the summary printed by ``tpsim estimate``/``plan``/``model show``, and the one
place that says which features the estimator cannot cost yet (:func:`unmodelled_features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from .spec import ModelSpec


def unmodelled_features(spec: "ModelSpec") -> tuple[str, ...]:
    """Features of ``spec`` that change its cost and that the estimator does not model, one phrase each
    (empty: the estimator costs it). Mixtures of experts, multi-head latent attention, sliding windows and
    multi-token prediction modules are modelled (issue 11: ``tpsim/estimator/moe.py``, ``layer.py``,
    ``source.py``); the hook stays for features a later model type brings."""
    del spec
    return ()


def _windowed_layers(spec: "ModelSpec") -> int:
    """Layers whose window is shorter than the sequence (a window >= seq_len changes nothing)."""
    if not spec.sliding_window or spec.sliding_window >= spec.seq_len:
        return 0
    return spec.num_layers - len(spec.full_attention_layers)


def require_modelled(spec: "ModelSpec") -> None:
    """Refuse, in one line, a model the estimator would cost wrongly (called where the CLI and
    ``tpsim.estimate`` take a model)."""
    features = unmodelled_features(spec)
    if not features:
        return
    listed = features[0] if len(features) == 1 else ", ".join(features[:-1]) + " and " + features[-1]
    line = f"model {spec.name} has {listed}, which this estimator does not model yet"
    if _windowed_layers(spec):
        line += f" (with --seq-len {spec.sliding_window} or less the window changes nothing)"
    raise InputError(line)


def approximations(spec: "ModelSpec") -> tuple[str, ...]:
    """Details the dense estimator costs approximately (each well under 1% of a layer's time)."""
    out = []
    if spec.norms_per_layer != 2:
        out.append(f"{spec.norms_per_layer} norms per layer (costed as 2)")
    if spec.qk_norm:
        out.append("per-head query/key RMSNorm (not costed)")
    if spec.parallel_residual:
        out.append("parallel attention and MLP (costed as sequential: same FLOPs, two TP all-reduces where "
                   "a fused implementation needs one)")
    if spec.rotary_fraction < 1:
        out.append(f"rotary embedding on {100 * spec.rotary_fraction:g}% of each head (costed on all of it)")
    return tuple(out)


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _attention(spec: "ModelSpec") -> str:
    if spec.attention_kind == "mla":
        q = f"q_lora {spec.q_lora_rank}, " if spec.q_lora_rank else ""
        return (f"MLA {spec.num_attention_heads} heads ({q}kv_lora {spec.kv_lora_rank}, qk {spec.qk_nope_head_dim}"
                f"+{spec.qk_rope_head_dim} rope, v {spec.v_head_dim})")
    kind = "MHA" if spec.num_kv_heads == spec.num_attention_heads else (
        "MQA" if spec.num_kv_heads == 1 else "GQA")
    return f"{kind} {spec.num_attention_heads} heads / {spec.num_kv_heads} kv x {spec.head_dim}"


def _window(spec: "ModelSpec") -> str:
    if not spec.sliding_window:
        return "full causal attention"
    n = spec.num_layers - len(spec.full_attention_layers)
    where = "every layer" if n == spec.num_layers else f"{n} of {spec.num_layers} layers (full on the others)"
    note = "" if spec.sliding_window < spec.seq_len else " (not shorter than the sequence: no effect)"
    return f"sliding window {spec.sliding_window} on {where}{note}"


def _experts(spec: "ModelSpec") -> str:
    dense = spec.num_layers - spec.num_moe_layers
    text = (f"{spec.num_experts} routed experts of {spec.moe_ffn_hidden_size}, top-{spec.experts_per_token}")
    if spec.num_shared_experts:
        text += f", {spec.num_shared_experts} shared of {spec.shared_expert_ffn_hidden_size}"
    text += f"; {spec.num_moe_layers} MoE layers" + (f", {dense} dense (MLP {spec.ffn_hidden_size})" if dense else "")
    if spec.router_groups:
        text += f"; routing limited to {spec.router_group_topk} of {spec.router_groups} expert groups"
    text += "; dropless" if not spec.capacity_factor else f"; capacity factor {spec.capacity_factor:g}"
    return text + "; load balance " + _balance(spec)


def _balance(spec: "ModelSpec") -> str:
    """The ``moe_balance`` in words (``--moe-balance`` states the default: aux)."""
    b = spec.moe_balance
    if b == "forced":
        return "forced (--moe-balance forced: every expert at the mean)"
    if b == "aux":
        return ("aux (default: the router's measured imbalance, tpsim/data/moe.yaml max_violation; "
                "--moe-balance forced|aux|FACTOR)")
    return f"{float(b):g} x the mean on the busiest expert (--moe-balance)"


def summary(spec: "ModelSpec") -> str:
    """The model in a few lines (parameter counts with the unpadded vocabulary, as publishers quote them)."""
    total, active = spec.total_params(padded=False), spec.active_params(padded=False)
    params = f"{_count(total)} parameters"
    if active != total:
        params += f", {_count(active)} active per token"
    if spec.mtp_layers:
        params += f" (+{_count(spec.mtp_params())} in {spec.mtp_layers} MTP module)"
    arch = spec.architecture or spec.family
    mlp = f"{spec.activation} MLP {spec.ffn_hidden_size}" if not spec.is_moe else f"{spec.activation} experts"
    lines = [
        f"model        {spec.name} ({arch}, {spec.family}-style blocks): {params}; "
        f"{spec.forward_flops_per_token() / 1e9:.1f} GFLOP forward per token",
        f"layers       {spec.num_layers} x ({_attention(spec)}, {mlp}), hidden {spec.hidden_size}, "
        f"vocab {spec.vocab_size}{', tied embeddings' if spec.tie_embeddings else ''}, {spec.norm}, {spec.position}",
        f"attention    {_window(spec)}; sequence {spec.seq_len} tokens (max positions {spec.max_positions})",
    ]
    if spec.is_moe:
        lines.append(f"experts      {_experts(spec)}")
    ignored = spec.ignored_keys
    plain = [k for k, why in ignored.items() if "not costed" not in why]
    if plain:
        lines.append(f"ignored keys {', '.join(sorted(plain))} (no effect on cost)")
    for key, why in sorted(ignored.items()):
        if "not costed" in why:
            lines.append(f"not costed   {key}: {why}")
    for note in approximations(spec):
        lines.append(f"approximate  {note}")
    features = unmodelled_features(spec)
    if features:
        lines.append(f"not modelled {'; '.join(features)} (estimate, plan and report refuse this model)")
    return "\n".join(lines)
