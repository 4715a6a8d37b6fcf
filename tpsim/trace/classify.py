"""What a recorded function call is: its op kind, kind-specific sizes, and the tensors autograd saves for it.

Kinds and the functions behind them are listed in docs/OPGRAPH.md. Saved tensors follow PyTorch's autograd
formulas (``tools/autograd/derivatives.yaml``): a linear or convolution saves its input (the weight is a
parameter), a batched matmul both operands, flash/efficient SDPA its q, k, v, output and the fp32
log-sum-exp, a norm its input and fp32 statistics, GeLU/SiLU their input and ReLU/sigmoid/tanh their output,
dropout a 1-byte mask, softmax its output, max pooling its input and int64 indices, cross-entropy its fp32
log-probabilities; additions, casts and layout copies save nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .record import RawOp

CONV_FNS = {"conv1d": 1, "conv2d": 2, "conv3d": 3, "conv_transpose1d": 1, "conv_transpose2d": 2,
            "conv_transpose3d": 3}
MATMUL_FNS = {"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "tensordot", "inner", "outer",
              "dot", "vdot", "mv", "addmv", "chain_matmul", "bilinear"}
NORM_FNS = {"layer_norm": "layernorm", "rms_norm": "rmsnorm", "batch_norm": "batchnorm",
            "group_norm": "groupnorm", "instance_norm": "instancenorm"}
ACT_SAVES_OUTPUT = {"relu", "relu6", "hardtanh", "sigmoid", "tanh", "elu", "celu", "selu", "threshold"}
ACT_SAVES_INPUT = {"gelu", "silu", "mish", "softplus", "leaky_relu", "hardswish", "hardsigmoid", "glu",
                   "logsigmoid", "prelu", "rrelu", "softsign", "tanhshrink", "softshrink", "hardshrink"}
DROPOUT_FNS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
SOFTMAX_FNS = {"softmax", "log_softmax", "softmin"}
POOL_FNS = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
            "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
            "adaptive_max_pool2d", "adaptive_max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
            "max_pool3d_with_indices", "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
            "pixel_shuffle", "pixel_unshuffle", "lp_pool1d", "lp_pool2d", "fractional_max_pool2d"}
LOSS_FNS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
            "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "cosine_embedding_loss"}
COPY_FNS = {"contiguous", "clone", "reshape", "flatten", "to", "float", "half", "bfloat16", "double", "type",
            "repeat", "repeat_interleave", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "pad",
            "roll", "flip", "tile", "__getitem__", "index_select", "gather", "permute", "transpose", "view",
            "copy_", "new_tensor", "type_as", "masked_select", "take", "unflatten", "narrow_copy"}
SAVES_INPUTS = {"mul", "div", "true_divide", "pow", "matmul", "prod", "addcmul", "addcdiv", "atan2", "hypot",
                "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "norm", "std", "var", "log", "sin", "cos"}
SAVES_OUTPUT = {"exp", "rsqrt", "sqrt", "reciprocal", "sigmoid", "tanh"}


@dataclass
class Saved:
    """A tensor saved for backward: a recorded tensor (``key``) or one made inside the op (``numel``)."""

    key: int | None
    dtype: str
    """"act", "fp32", "bool" or "int64" (schema SAVED_DTYPES)."""
    numel: int = 0
    """elements of a tensor made inside the op (key None)."""


@dataclass
class Classified:
    kind: str
    attrs: dict[str, Any] = field(default_factory=dict)
    saves: list[Saved] = field(default_factory=list)


def _arg(op: RawOp, index: int, name: str, default: Any = None) -> Any:
    if name in op.kwargs:
        return op.kwargs[name]
    return op.args[index] if len(op.args) > index else default


def _tuple(value: Any, dims: int) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)] * dims


def _float_class(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype.startswith("int") or dtype.startswith("uint"):
        return "int64"
    return "act"


def _input_saves(op: RawOp, indices: list[int] | None = None) -> list[Saved]:
    """The batched (activation) tensor inputs, by position."""
    picked = range(len(op.inputs)) if indices is None else indices
    return [Saved(op.inputs[i], _float_class(op.in_meta[i][1])) for i in picked
            if i < len(op.inputs) and op.in_batched[i]]


def _out_save(op: RawOp) -> list[Saved]:
    return [Saved(op.outputs[0], _float_class(op.out_meta[0][1]))]


def classify(op: RawOp) -> Classified:
    """Kind, attributes and saved tensors of one recorded call."""
    fn = op.fn.rstrip("_") if op.fn not in ("__getitem__",) else op.fn
    out_numel = math.prod(op.out_meta[0][0])
    if fn == "linear":
        return _linear(op, weight_out_in=True)
    if fn in CONV_FNS:
        return _conv(op, CONV_FNS[fn], transposed=fn.startswith("conv_transpose"))
    if fn in MATMUL_FNS:
        return _matmul(op)
    if fn == "scaled_dot_product_attention":
        return _attention(op)
    if fn in NORM_FNS:
        return _norm(op, NORM_FNS[fn])
    if fn in ACT_SAVES_OUTPUT or fn in ACT_SAVES_INPUT:
        saves = _out_save(op) if fn in ACT_SAVES_OUTPUT else _input_saves(op, [0])
        return Classified("activation", {"fn": fn}, saves)
    if fn in DROPOUT_FNS:
        p = float(_arg(op, 1, "p", 0.5))
        return Classified("dropout", {"p": p}, [Saved(None, "bool", out_numel)])
    if fn in SOFTMAX_FNS:
        shape = op.in_meta[0][0]
        dim = int(_arg(op, 1, "dim", -1) if _arg(op, 1, "dim", -1) is not None else -1) % max(len(shape), 1)
        return Classified("softmax", {"dim": dim, "width": shape[dim] if shape else 1,
                                      "last": dim == len(shape) - 1}, _out_save(op))
    if fn == "embedding":
        w = op.in_meta[1][0]
        return Classified("embedding", {"num_embeddings": w[0], "embedding_dim": w[1],
                                        "tokens": math.prod(op.in_meta[0][0])}, _input_saves(op, [0]))
    if fn in POOL_FNS:
        return _pool(op, fn, out_numel)
    if fn in LOSS_FNS:
        return _loss(op, fn)
    if fn in COPY_FNS:
        return Classified("copy", {"fn": fn})
    saves = _input_saves(op) if fn in SAVES_INPUTS else _out_save(op) if fn in SAVES_OUTPUT else []
    if op.flops > 0:
        return Classified("other", {"fn": fn}, _input_saves(op))
    return Classified("elementwise", {"fn": fn}, saves)


def _linear(op: RawOp, weight_out_in: bool) -> Classified:
    """``F.linear(x, w (out, in), b)`` or ``x @ w (in, out)``."""
    w = op.in_meta[1][0]
    out_f, in_f = (w[0], w[1]) if weight_out_in else (w[1], w[0])
    tokens = math.prod(op.in_meta[0][0]) // max(in_f, 1)
    return Classified("linear", {"in_features": in_f, "out_features": out_f, "tokens": tokens,
                                 "bias": len(op.params) > 1, "weight": op.params[0] if op.params else ""},
                      _input_saves(op, [0]))


def _conv(op: RawOp, dims: int, transposed: bool) -> Classified:
    x, w = op.in_meta[0][0], op.in_meta[1][0]
    out = op.out_meta[0][0]
    if transposed:  # conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)
        stride, padding = _arg(op, 3, "stride", 1), _arg(op, 4, "padding", 0)
        groups, dilation = int(_arg(op, 6, "groups", 1)), _arg(op, 7, "dilation", 1)
        cin, cout = w[0], w[1] * groups
    else:  # conv(input, weight, bias, stride, padding, dilation, groups)
        stride, padding = _arg(op, 3, "stride", 1), _arg(op, 4, "padding", 0)
        dilation, groups = _arg(op, 5, "dilation", 1), int(_arg(op, 6, "groups", 1))
        cin, cout = w[1] * groups, w[0]
    kernel = list(w[2:])
    dilation = _tuple(dilation, dims)
    if isinstance(padding, str):  # 'same' / 'valid'
        padding = [(k - 1) * d // 2 for k, d in zip(kernel, dilation)] if padding == "same" else [0] * dims
    has_batch = len(x) == dims + 2
    attrs = {"in_channels": cin, "out_channels": cout, "kernel": kernel, "stride": _tuple(stride, dims),
             "padding": _tuple(padding, dims), "dilation": dilation, "groups": groups,
             "batch": x[0] if has_batch else 1, "input_spatial": list(x[-dims:]),
             "output_spatial": list(out[-dims:]), "transposed": transposed,
             "bias": len(op.params) > 1, "weight": op.params[0] if op.params else ""}
    return Classified(f"conv{dims}d", attrs, _input_saves(op, [0]))


def _matmul(op: RawOp) -> Classified:
    # a matmul against a 2-D parameter is a linear layer written by hand (x @ W, W of shape (in, out))
    if op.fn in ("matmul", "mm") and len(op.in_meta) >= 2 and len(op.in_meta[1][0]) == 2 \
            and op.in_src[1] == -2 and op.params:
        return _linear(op, weight_out_in=False)
    attrs = {"batch": 1, "m": 1, "n": 1, "k": 1, "fn": op.fn}
    if op.mm_shapes:
        a, b = max(op.mm_shapes, key=lambda s: math.prod(s[0]) * s[1][-1])
        attrs.update(batch=math.prod(a[:-2]) if len(a) > 2 else 1, m=a[-2], k=a[-1], n=b[-1])
        count = len(op.mm_shapes)
        if count > 1:
            attrs["batch"] *= count  # several products in one call (einsum over a list): time them together
    return Classified("matmul", attrs, _input_saves(op, [0, 1]))


def _attention(op: RawOp) -> Classified:
    q, k = op.in_meta[0][0], op.in_meta[1][0]
    heads = q[-3] if len(q) >= 3 else 1
    causal = bool(_arg(op, 5, "is_causal", False))
    mask = _arg(op, 3, "attn_mask", None) is not None
    attrs = {"batch": math.prod(q[:-3]) if len(q) > 3 else 1, "heads": heads,
             "kv_heads": k[-3] if len(k) >= 3 else 1, "seq_q": q[-2], "seq_k": k[-2], "head_dim": q[-1],
             "causal": causal, "mask": mask, "dropout_p": float(_arg(op, 4, "dropout_p", 0.0) or 0.0)}
    lse = attrs["batch"] * heads * q[-2]
    return Classified("attention", attrs, _input_saves(op, [0, 1, 2]) + _out_save(op) + [Saved(None, "fp32", lse)])


def _norm(op: RawOp, kind: str) -> Classified:
    x = op.in_meta[0][0]
    numel = math.prod(x)
    if kind in ("layernorm", "rmsnorm"):
        shape = _arg(op, 1, "normalized_shape", x[-1:])
        normalized = math.prod(_tuple(shape, 1))
        tokens = numel // max(normalized, 1)
        attrs = {"type": kind, "normalized": normalized, "tokens": tokens, "channels": normalized}
        stats = (2 if kind == "layernorm" else 1) * tokens
    elif kind == "groupnorm":
        groups = int(_arg(op, 1, "num_groups", 1))
        attrs = {"type": kind, "groups": groups, "channels": x[1] if len(x) > 1 else 1}
        stats = 2 * (x[0] if x else 1) * groups
    else:  # batchnorm, instancenorm: per-channel statistics
        attrs = {"type": kind, "channels": x[1] if len(x) > 1 else x[0]}
        stats = 2 * attrs["channels"] * (x[0] if kind == "instancenorm" else 1)
    return Classified("norm", attrs, _input_saves(op, [0]) + [Saved(None, "fp32", stats)])


def _pool(op: RawOp, fn: str, out_numel: int) -> Classified:
    x = op.in_meta[0][0]
    attrs: dict[str, Any] = {"type": fn}
    if fn.startswith(("max_pool", "avg_pool", "lp_pool")):
        dims = int(fn.split("pool")[1][0]) if fn.split("pool")[1][:1].isdigit() else 2
        kernel = _tuple(_arg(op, 1, "kernel_size", 1), dims)
        stride = _arg(op, 2, "stride", None)
        attrs.update(kernel=kernel, stride=_tuple(stride, dims) if stride not in (None, [], ()) else kernel,
                     padding=_tuple(_arg(op, 3, "padding", 0), dims))
    attrs["input_spatial"] = list(x[2:])
    attrs["output_spatial"] = list(op.out_meta[0][0][2:])
    saves = []
    if fn.startswith(("max_pool", "adaptive_max_pool", "fractional_max")):
        saves = _input_saves(op, [0]) + [Saved(None, "int64", out_numel)]
    return Classified("pooling", attrs, saves)


def _loss(op: RawOp, fn: str) -> Classified:
    x = op.in_meta[0][0]
    classes = x[1] if len(x) >= 2 else x[0]
    attrs = {"fn": fn, "classes": classes, "tokens": math.prod(x) // max(classes, 1)}
    if fn in ("cross_entropy", "nll_loss"):
        saves = [Saved(None, "fp32", math.prod(x))] + _input_saves(op, [1])
    else:
        saves = _input_saves(op, [0, 1])
    return Classified("loss", attrs, saves)
