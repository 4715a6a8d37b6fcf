"""Fixed costs as their own terms: kernel launches, host overhead, the optimizer step, cross-entropy.

Figures and sources: ``tpsim/data/kernels/fixed.yaml``. Every function is vectorized over numpy arrays (plans)
and returns seconds. Per training stack values (host cost per op, fused or eager layers, CUDA graphs) are the
stack profiles' data; these functions take them as inputs.

* Launches: each kernel in a stream costs the GPU ``gpu_gap_us`` between kernels when the host is ahead
  (:func:`launch_time`); the host's own time per op (driver launch plus framework dispatch) is hidden while the
  CPU runs ahead of the GPU and exposed when it does not (:func:`exposed_host_time`). With CUDA graphs the host
  cost vanishes and the gap is ``cuda_graph_gap_us``.
* Optimizer: fused Adam moves :func:`optimizer_bytes_per_param` bytes per parameter at the achieved HBM
  bandwidth, in :func:`optimizer_launches` multi-tensor launches.
* Cross-entropy: Megatron's vocab-parallel loss moves ``forward_bytes`` / ``backward_bytes`` per logit element
  of the rank's vocabulary shard (fp32 logits written, read for the softmax, the gradient written).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from ..errors import InputError
from ..model import ModelSpec
from .base import ArrayLike
from .kernel_data import load_kernel_yaml, positive, require_keys

US = 1e-6
CONDITIONS = ("always", "gated", "not_gated", "rotary", "dropout", "no_dropout", "gqa", "separate_qkv", "fused_qkv",
              "rmsnorm", "layernorm")


@dataclass(frozen=True, kw_only=True)
class LayerTraits:
    """What decides which kernels a dense transformer layer launches."""

    gated: bool
    """SwiGLU / GeGLU MLP (two input projections, a gating multiply)."""
    rotary: bool
    dropout: bool
    gqa: bool
    """fewer key/value heads than query heads (the eager path copies them with repeat_kv)."""
    separate_qkv: bool
    """q, k, v as separate linears (eager torchtitan) instead of one fused GEMM."""
    norm: str
    """"layernorm" or "rmsnorm"."""

    @classmethod
    def of(cls, model: ModelSpec, separate_qkv: bool = False) -> "LayerTraits":
        """The traits of a preset or config model; a traced graph (tpsim.opgraph) lacks the architecture fields:
        it gets a plain layer (ungated, learned positions, no dropout, LayerNorm) for its launch gaps."""
        heads = getattr(model, "num_attention_heads", 1)
        return cls(gated=bool(getattr(model, "gated", False)), rotary=getattr(model, "position", "") == "rotary",
                   dropout=bool(getattr(model, "hidden_dropout", 0.0)),
                   gqa=getattr(model, "num_kv_heads", heads) < heads, separate_qkv=separate_qkv,
                   norm=getattr(model, "norm", "layernorm"))

    def holds(self, condition: str) -> bool:
        return {"always": True, "gated": self.gated, "not_gated": not self.gated, "rotary": self.rotary,
                "dropout": self.dropout, "no_dropout": not self.dropout, "gqa": self.gqa,
                "separate_qkv": self.separate_qkv, "fused_qkv": not self.separate_qkv,
                "rmsnorm": self.norm == "rmsnorm", "layernorm": self.norm != "rmsnorm"}[condition]


@dataclass(frozen=True, kw_only=True)
class LaunchCosts:
    gpu_gap_s: float
    host_launch_s: float
    cuda_graph_gap_s: float


@dataclass(frozen=True, kw_only=True)
class CrossEntropyCost:
    forward_bytes: float
    backward_bytes: float
    forward_kernels: int
    backward_kernels: int


@dataclass(frozen=True, kw_only=True)
class FixedData:
    launch: LaunchCosts
    flavors: Mapping[str, tuple[tuple[str, float, float | None, str], ...]]
    """flavor -> (op, forward kernels, backward kernels or None, condition)."""
    backward_per_forward: Mapping[str, float]
    chunk_elements: int
    max_blocks_per_launch: int
    max_tensors_per_launch: Mapping[int, int]
    cross_entropy: Mapping[str, CrossEntropyCost]


def _value(where: str, raw: Mapping, key: str) -> float:
    return positive(where, key, require_keys(f"{where}.{key}", raw[key], ("value", "source"))["value"])


@lru_cache(maxsize=1)
def fixed_data() -> FixedData:
    raw, name = load_kernel_yaml("fixed.yaml")
    launch = require_keys(f"{name}: launch", raw.get("launch"), ("gpu_gap_us", "host_launch_us", "cuda_graph_gap_us"))
    flavors, ratios = {}, {}
    for flavor, body in require_keys(f"{name}: kernels_per_layer", raw.get("kernels_per_layer"), ()).items():
        where = f"{name}: kernels_per_layer.{flavor}"
        require_keys(where, body, ("ops", "source"))
        ops = []
        for op in body["ops"]:
            if op.get("when") not in CONDITIONS:
                raise InputError(f"{where}: when={op.get('when')!r} (known: {', '.join(CONDITIONS)})")
            ops.append((str(op["op"]), float(op["forward"]), None if "backward" not in op else float(op["backward"]),
                        op["when"]))
        flavors[flavor] = tuple(ops)
        ratios[flavor] = float(body.get("backward_per_forward", 0.0))
        if ratios[flavor] == 0.0 and any(o[2] is None for o in ops):
            raise InputError(f"{where}: an op without a backward count needs backward_per_forward")
    opt = require_keys(f"{name}: optimizer", raw.get("optimizer"), ("multi_tensor", "source"))["multi_tensor"]
    ce = {k: CrossEntropyCost(forward_bytes=float(v["forward_bytes"]), backward_bytes=float(v["backward_bytes"]),
                              forward_kernels=int(v["forward_kernels"]), backward_kernels=int(v["backward_kernels"]))
          for k, v in require_keys(f"{name}: cross_entropy", raw.get("cross_entropy"), ()).items()}
    return FixedData(
        launch=LaunchCosts(gpu_gap_s=_value(name, launch, "gpu_gap_us") * US,
                           host_launch_s=_value(name, launch, "host_launch_us") * US,
                           cuda_graph_gap_s=_value(name, launch, "cuda_graph_gap_us") * US),
        flavors=flavors, backward_per_forward=ratios, chunk_elements=int(opt["chunk_elements"]),
        max_blocks_per_launch=int(opt["max_blocks_per_launch"]),
        max_tensors_per_launch={int(k): int(v) for k, v in opt["max_tensors_per_launch"].items()},
        cross_entropy=ce)


# ---- launches and host overhead ----------------------------------------------------------------------------
def layer_kernel_counts(flavor: str, traits: LayerTraits) -> tuple[float, float]:
    """(forward, backward) kernels one layer launches per micro-batch in ``flavor`` (``megatron_te`` fused
    Transformer Engine layers, ``eager`` PyTorch modules); counts and their derivation in fixed.yaml."""
    data = fixed_data()
    if flavor not in data.flavors:
        raise InputError(f"kernel flavor={flavor!r} is unknown (known: {', '.join(data.flavors)})")
    fwd = bwd = 0.0
    for _, f, b, when in data.flavors[flavor]:
        if traits.holds(when):
            fwd += f
            bwd += b if b is not None else f * data.backward_per_forward[flavor]
    return fwd, bwd


def launch_time(kernels: ArrayLike, cuda_graphs: bool = False) -> np.ndarray:
    """GPU-side time of ``kernels`` back-to-back launches beyond their execution (the gap per kernel)."""
    launch = fixed_data().launch
    gap = launch.cuda_graph_gap_s if cuda_graphs else launch.gpu_gap_s
    return np.asarray(kernels, dtype=float) * gap


def host_time(ops: ArrayLike, per_op_host_s: ArrayLike, cuda_graphs: bool = False) -> np.ndarray:
    """CPU time to issue ``ops`` operations at ``per_op_host_s`` each (framework dispatch + driver launch: the
    stack profile's figure); a replayed CUDA graph issues them all at once (zero per op)."""
    if cuda_graphs:
        return np.zeros(np.broadcast(np.asarray(ops), np.asarray(per_op_host_s)).shape)
    return np.asarray(ops, dtype=float) * np.asarray(per_op_host_s, dtype=float)


def exposed_host_time(host_s: ArrayLike, device_s: ArrayLike) -> np.ndarray:
    """Host time the GPU waits for: the CPU issues work asynchronously and runs ahead while its issue time
    is below the GPU's execution time of the same ops; only the excess shows up."""
    return np.maximum(np.asarray(host_s, dtype=float) - np.asarray(device_s, dtype=float), 0.0)


def layer_fixed_time(flavor: str, traits: LayerTraits, device_s: ArrayLike, per_op_host_s: ArrayLike,
                     cuda_graphs: bool = False) -> np.ndarray:
    """Fixed seconds one layer adds to its forward + backward kernel time ``device_s`` per micro-batch: the
    GPU gap of every kernel plus the host time the GPU waits for."""
    fwd, bwd = layer_kernel_counts(flavor, traits)
    kernels = fwd + bwd
    gaps = launch_time(kernels, cuda_graphs)
    host = host_time(kernels, per_op_host_s, cuda_graphs)
    return gaps + exposed_host_time(host, np.asarray(device_s, dtype=float) + gaps)


# ---- optimizer step ----------------------------------------------------------------------------------------
def optimizer_bytes_per_param(*, grad_bytes: float = 4, param_bytes: float = 2, state_bytes: float = 4,
                              master_bytes: float = 4, clip_grad: bool = True, zero_grad: bool = True,
                              fused_master_copy: bool = False) -> float:
    """HBM bytes per parameter of one fused-Adam step (fixed.yaml, optimizer.source):
    update = read grad + param + 2 states, write param + 2 states, on the fp32 master when ``master_bytes``
    (else on the model params); the master -> model copy reads the master and writes the model param (inside
    the update kernel when ``fused_master_copy``); gradient clipping reads every grad once; zeroing writes it.
    Megatron-Core defaults (bf16 params, fp32 main grads, fp32 master and states, separate copy): 42 B."""
    updated = master_bytes if master_bytes else param_bytes
    total = grad_bytes + 2 * updated + 4 * state_bytes
    if master_bytes:
        total += param_bytes + (0 if fused_master_copy else master_bytes)
    if clip_grad:
        total += grad_bytes
    if zero_grad:
        total += grad_bytes
    return float(total)


def optimizer_launches(params: ArrayLike, tensors: ArrayLike, depth: int = 5) -> np.ndarray:
    """Multi-tensor-apply launches of one fused step over ``params`` elements in ``tensors`` tensors: one
    launch per ``max_blocks_per_launch`` chunks of ``chunk_elements`` or per the list-depth tensor limit."""
    data = fixed_data()
    if depth not in data.max_tensors_per_launch:
        raise InputError(f"multi-tensor depth={depth} (known: {', '.join(map(str, data.max_tensors_per_launch))})")
    p, n = np.asarray(params, dtype=float), np.asarray(tensors, dtype=float)
    chunks = p / data.chunk_elements + n  # each tensor's last chunk is partial
    return np.maximum(np.ceil(chunks / data.max_blocks_per_launch), np.ceil(n / data.max_tensors_per_launch[depth]))


def optimizer_step_time(params: ArrayLike, tensors: ArrayLike, hbm_bytes_per_s: float, bytes_per_param: float,
                        depth: int = 5) -> np.ndarray:
    """Seconds of one optimizer step over a rank's ``params`` (memory-bound) plus its launch gaps."""
    moved = np.asarray(params, dtype=float) * bytes_per_param / hbm_bytes_per_s
    return moved + launch_time(optimizer_launches(params, tensors, depth))


# ---- cross-entropy -----------------------------------------------------------------------------------------
def cross_entropy_time(tokens: ArrayLike, vocab_local: ArrayLike, hbm_bytes_per_s: float,
                       impl: str = "megatron") -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the vocab-parallel cross-entropy on ``tokens`` x ``vocab_local`` logits
    (the rank's shard), memory-bound, plus the launch gaps of its vocabulary-sized kernels."""
    data = fixed_data()
    if impl not in data.cross_entropy:
        raise InputError(f"cross-entropy impl={impl!r} is unknown (known: {', '.join(data.cross_entropy)})")
    c = data.cross_entropy[impl]
    logits = np.asarray(tokens, dtype=float) * np.asarray(vocab_local, dtype=float)
    fwd = logits * c.forward_bytes / hbm_bytes_per_s + launch_time(c.forward_kernels)
    bwd = logits * c.backward_bytes / hbm_bytes_per_s + launch_time(c.backward_kernels)
    return fwd, bwd
