"""Parameters of one validation block as one TP rank holds them (torch-free).

The block of :mod:`tpsim.validate.modules.block` as built for TP degree ``tp`` (KV heads fewer than tp replicated, fused
weights laid out per rank), each parameter's local shape after ``parallelize_module`` with the plan's styles:
column-parallel weights and biases split on dim 0, row-parallel weights on dim 1 (their biases and the norm
weights replicated). Parameters are listed in ``named_parameters()`` order (modules in construction order,
weight before bias), which is the order DDP buckets them in (reversed) and FSDP2 packs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model import ModelSpec
from ...tp_plan import layer_plan


@dataclass(frozen=True, kw_only=True)
class LocalParam:
    """One parameter of a block on one TP rank."""

    name: str
    """name inside the block (``attention.wq.weight``)."""
    shape: tuple[int, ...]
    """local shape, elements."""
    style: str
    """the owning module's TP style ("colwise", "rowwise", "rowwise:seq", "sequence" or "" replicated)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _linears(model: ModelSpec, tp: int, fused: bool) -> list[tuple[str, int, int, bool]]:
    """(module, out features, in features, bias) of the block's linears as built, in construction order."""
    kv_built = model.num_kv_heads if model.num_kv_heads >= tp else tp
    q, kv, h, f = model.q_size, kv_built * model.head_dim, model.hidden_size, model.ffn_hidden_size
    qb, lb = model.qkv_bias, model.linear_bias
    att = [("attention.wqkv", q + 2 * kv, h, qb)] if fused else \
        [("attention.wq", q, h, qb), ("attention.wk", kv, h, qb), ("attention.wv", kv, h, qb)]
    att.append(("attention.wo", h, q, lb))
    if model.gated:
        ffn = [("feed_forward.w13", 2 * f, h, lb)] if fused else \
            [("feed_forward.w1", f, h, lb), ("feed_forward.w3", f, h, lb)]
    else:
        ffn = [("feed_forward.w1", f, h, lb)]
    ffn.append(("feed_forward.w2", h, f, lb))
    return att + ffn


def _norm(name: str, model: ModelSpec, style: str) -> list[LocalParam]:
    h = model.hidden_size
    params = [LocalParam(name=f"{name}.weight", shape=(h,), style=style)]
    if model.norm == "layernorm":
        params.append(LocalParam(name=f"{name}.bias", shape=(h,), style=style))
    return params


def local_params(model: ModelSpec, tp: int, sp: bool, fused: bool) -> list[LocalParam]:
    """Every parameter of one block on one TP rank, in ``named_parameters()`` order."""
    styles = layer_plan(model, sp, fused) if tp > 1 else {}
    linears = _linears(model, tp, fused)
    out = _norm("attention_norm", model, styles.get("attention_norm", ""))
    for i, (module, n, k, bias) in enumerate(linears):
        if module == "feed_forward.w1" or module == "feed_forward.w13":
            out += _norm("ffn_norm", model, styles.get("ffn_norm", ""))
        style = styles.get(module, "")
        col, row = style == "colwise", style.startswith("rowwise")
        out.append(LocalParam(name=f"{module}.weight", shape=(n // tp if col else n, k // tp if row else k),
                              style=style))
        if bias:
            out.append(LocalParam(name=f"{module}.bias", shape=(n // tp if col else n,), style=style))
    return out


def partial_grad_params(model: ModelSpec, tp: int, sp: bool, fused: bool) -> list[LocalParam]:
    """Replicated parameters whose gradient is a partial sum over the TP group: the norm weights under SP
    (``SequenceParallel`` keeps them replicated while their inputs are sequence shards)."""
    if tp == 1 or not sp:
        return []
    return [p for p in local_params(model, tp, sp, fused) if p.style == "sequence"]
