"""Per-unit costs of a traced op graph on one TP shard, for one micro-batch: the layer-cost source of the
estimator for traced models (torch-free, numpy over micro-batch sizes).

Compute time per op comes from the same :class:`~tpsim.compute.base.ComputeModel` as the transformer presets:

* linear: GEMM (tokens, out, in) forward; backward the data-gradient GEMM (tokens, in, out), skipped when the
  input needs no gradient (the model's input), and the weight-gradient GEMM (in, out, tokens);
* convolution: the implicit GEMM of cuDNN / CUTLASS (``m = batch x output pixels``, ``n = out channels /
  groups``, ``k = in channels / groups x kernel volume``, groups as the GEMM batch), the data gradient as the
  transposed convolution's GEMM (``m = batch x input pixels``, ``n = in / groups``, ``k = out / groups x
  kernel volume``), the weight gradient ``(out / groups, in / groups x kernel volume, batch x output
  pixels)``, each at its fastest split-K (:func:`split_k_gemm`); a conv kernel profile
  (``python -m tpsim.profiler.conv``) replaces them where it has points; depthwise
  convolutions (one channel per group) are memory-bound: timed as a pointwise kernel on the output (x2 in
  backward: data and weight gradients);
* batched matmul: GEMM with its batch, backward two GEMMs; attention (SDPA): the fused attention kernel of the
  compute model (cross-attention at the geometric mean of the query and key lengths);
* memory-bound ops with the compute model's kernels: norms (``layernorm``/``rmsnorm``; batch, group and
  instance norms as ``layernorm``: read, statistics, write), activations (``gelu``: read + write), dropout,
  softmax, pointwise ops (``residual_add`` for two tensor operands, ``gelu``'s traffic for one), layout copies
  and pooling (``gelu`` traffic on the larger of input and output), embedding gather (forward ``gelu``
  traffic, backward scatter-add ``residual_add``), cross-entropy (``softmax`` in fp32, as the presets);
* ops that need no gradient (computed from constants or the model input only) have no backward.

Quantities of ``batched`` ops scale with ``micro_batch / graph.batch``; ops whose layout is split over the TP
group (:mod:`tpsim.opgraph.layout`) run on 1/tp of their work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..compute.base import ComputeModel
from ..precision import activation_bytes
from .layout import UnitLayout, unit_layout
from .schema import CONV_KINDS, SAVED_DTYPES, SRC_CONST, SRC_EXTERNAL, Op, OpGraph, Unit
from .tp import TPPlan, is_depthwise, styles_at

CORE_KINDS = ("attention", "matmul", "softmax")
"""the attention core recomputed by selective recomputation (Korthikanti et al. 2022)."""


@dataclass(frozen=True)
class UnitCost:
    """One instance of a unit per micro-batch, arrays over the micro-batch sizes asked for."""

    fwd: np.ndarray
    bwd: np.ndarray
    recompute_selective: np.ndarray
    """forward time of the attention core (recomputed in backward by selective recomputation)."""
    wgrad: dict[int, np.ndarray]
    """op index -> weight-gradient GEMM time (what a colwise input-gradient reduction hides behind)."""
    dgrad: dict[int, np.ndarray]
    measured: np.ndarray
    """measured (profile) part of fwd + bwd, seconds."""
    activation_bytes: dict[int, np.ndarray]
    """recompute code (0 none, 1 selective, 2 full) -> saved bytes of one instance on one rank."""
    input_bytes: np.ndarray
    """activations live at the unit's start, bytes on one rank (a pipeline boundary sends them)."""


@dataclass(frozen=True)
class UnitStatic:
    """What one unit holds at one (tp, sp): its styles, layouts, collectives and parameters per rank."""

    styles: tuple[str, ...]
    layout: UnitLayout
    params: float
    """parameters of one instance on one rank."""
    param_local: Mapping[str, float]
    """parameter name -> elements one rank holds."""
    grad_reduce_params: float
    """parameters of one instance whose gradients are all-reduced over TP once per step."""


class _Acc:
    def __init__(self, n: int) -> None:
        self.t = np.zeros(n)
        self.m = np.zeros(n)

    def add(self, res: tuple[np.ndarray, np.ndarray], times: float = 1.0) -> np.ndarray:
        t, measured = res
        t = np.broadcast_to(np.asarray(t, dtype=float), self.t.shape) * times
        self.t = self.t + t
        self.m = self.m + np.where(measured, t, 0.0)
        return t


class GraphCosts:
    """Cost source of one op graph and TP plan: unit layouts per (tp, sp), unit costs per (tp, sp, mb)."""

    def __init__(self, graph: OpGraph, plan: TPPlan, compute: ComputeModel, flavor: str = "megatron",
                 conv_times: Any = None) -> None:
        self.graph = graph
        self.plan = plan
        self.compute = compute
        self.flavor = flavor
        self.conv_times = conv_times
        """optional ConvProfile (tpsim.opgraph.convprofile) consulted before the implicit GEMM."""
        self._static: dict[tuple[int, bool], tuple[list[UnitStatic], list[str]]] = {}
        self._needs_grad = [grad_flags(u, i) for i, u in enumerate(graph.units)]

    # ---- static per (tp, sp) ------------------------------------------------------------------------------
    def static(self, tp: int, sp: bool) -> tuple[list[UnitStatic], list[str]]:
        """Per unit: layout, parameters on one rank; and the plan's notes (regions replicated at this tp)."""
        key = (int(tp), bool(sp))
        if key not in self._static:
            styles, notes = styles_at(self.graph, self.plan, key[0])
            units = [self._unit_static(u, styles[u], key[0], key[1]) for u in range(len(self.graph.units))]
            self._static[key] = (units, notes)
        return self._static[key]

    def _unit_static(self, u: int, styles: tuple[str, ...], tp: int, sp: bool) -> UnitStatic:
        unit = self.graph.units[u]
        layout = unit_layout(self.graph, u, styles, tp, sp, self.flavor)
        seen: dict[str, float] = {}
        for j, op in enumerate(unit.ops):
            for name in op.params:
                if name not in seen:
                    numel = float(math.prod(self.graph.params[name]))
                    seen[name] = numel / tp if layout.param_split[j] else numel
        grads = sum(float(math.prod(self.graph.params[p])) for p in layout.grad_reduce)
        return UnitStatic(styles=styles if tp > 1 else ("replicate",) * len(unit.ops), layout=layout,
                          params=sum(seen.values()), param_local=dict(seen), grad_reduce_params=grads)

    # ---- gradients -------------------------------------------------------------------------------------
    def _input_needs_grad(self, u: int, op: Op) -> bool:
        t = op.inputs[0]
        if t.src >= 0:
            return self._needs_grad[u][t.src]
        return t.src == SRC_EXTERNAL and u > 0 and _floating(t.dtype)

    # ---- compute per (tp, sp, mb) ------------------------------------------------------------------------
    def unit_cost(self, u: int, tp: int, sp: bool, micro_batch: np.ndarray, dtype: str) -> UnitCost:
        """Costs of one instance of unit ``u`` for each micro-batch size (array)."""
        unit = self.graph.units[u]
        st = self.static(tp, sp)[0][u]
        mb = np.asarray(micro_batch, dtype=float)
        n = len(mb)
        fwd, bwd, core = _Acc(n), _Acc(n), _Acc(n)
        wgrad: dict[int, np.ndarray] = {}
        dgrad: dict[int, np.ndarray] = {}
        for j, op in enumerate(unit.ops):
            scale = mb / self.graph.batch if op.batched else np.ones(n)
            split = float(tp) if st.layout.split[j] else 1.0
            style = st.styles[j]
            self._op_time(u, j, op, style, split, scale, dtype, fwd, core if op.kind in CORE_KINDS else None,
                          bwd if self._needs_grad[u][j] else None, wgrad, dgrad)
        act = self._activations(unit, st, tp, sp, mb, dtype, first=u == 0)
        b_in = float(unit.input_numel) * mb / self.graph.batch * _act_bytes(dtype) / (tp if sp else 1)
        return UnitCost(fwd=fwd.t, bwd=bwd.t, recompute_selective=core.t, wgrad=wgrad, dgrad=dgrad,
                        measured=fwd.m + bwd.m, activation_bytes=act, input_bytes=b_in)

    def _op_time(self, u: int, j: int, op: Op, style: str, split: float, scale: np.ndarray, dtype: str,
                 fwd: _Acc, core: _Acc | None, bwd: _Acc | None, wgrad: dict, dgrad: dict) -> None:
        c = self.compute
        a = op.attrs
        if op.kind == "linear":
            m = a["tokens"] * scale
            n_, k_ = float(a["out_features"]), float(a["in_features"])
            if style == "colwise":
                n_ /= split
            elif style == "rowwise":
                k_ /= split
            elif split > 1:
                m = m / split
            fwd.add(c.gemm(m, n_, k_, dtype))
            if bwd is not None:
                if self._input_needs_grad(u, op):
                    dgrad[j] = bwd.add(c.gemm(m, k_, n_, dtype))
                wgrad[j] = bwd.add(c.gemm(k_, n_, m, dtype))
            return
        if op.kind in CONV_KINDS:
            self._conv(u, j, op, style, split, scale, dtype, fwd, bwd, wgrad, dgrad)
            return
        if op.kind == "matmul":
            b = a["batch"] * scale / split
            m, n_, k_ = float(a["m"]), float(a["n"]), float(a["k"])
            res = fwd.add(c.gemm(m, n_, k_, dtype, batch=b))
            if core is not None:
                core.add((res, np.zeros_like(res, dtype=bool)))
            if bwd is not None:
                bwd.add(c.gemm(m, k_, n_, dtype, batch=b))
                bwd.add(c.gemm(k_, n_, m, dtype, batch=b))
            return
        if op.kind == "attention":
            bh = a["batch"] * scale * a["heads"] / split
            seq = math.sqrt(a["seq_q"] * a["seq_k"])
            res = fwd.add(c.attention(bh, seq, a["head_dim"], bool(a["causal"]), dtype, False))
            if core is not None:
                core.add((res, np.zeros_like(res, dtype=bool)))
            if bwd is not None:
                bwd.add(c.attention(bh, seq, a["head_dim"], bool(a["causal"]), dtype, True))
            return
        kernel, numel, kdtype = _memory_kernel(op, dtype)
        numel = numel * scale / split
        numel_bwd = numel
        if op.kind == "loss" and op.fn in ("cross_entropy", "nll_loss"):
            # the fp32 cross-entropy's real memory traffic, as the transformer estimator costs it
            from ..estimator.layer import cross_entropy_elements
            numel, numel_bwd = cross_entropy_elements(numel)
        res = fwd.add(c.memory(kernel, numel, kdtype, False))
        if core is not None:
            core.add((res, np.zeros_like(res, dtype=bool)))
        if bwd is not None:
            back = "residual_add" if op.kind == "embedding" else kernel
            bwd.add(c.memory(back, numel_bwd, kdtype, True))

    def _conv(self, u: int, j: int, op: Op, style: str, split: float, scale: np.ndarray, dtype: str,
              fwd: _Acc, bwd: _Acc | None, wgrad: dict, dgrad: dict) -> None:
        c = self.compute
        a = op.attrs
        if is_depthwise(op):
            numel = a["batch"] * scale * a["out_channels"] * math.prod(a["output_spatial"]) / split
            fwd.add(c.memory("residual_add", numel, dtype, False))
            if bwd is not None:
                bwd.add(c.memory("residual_add", numel, dtype, True), 2.0)
            return
        g = float(a["groups"])
        cin, cout = a["in_channels"] / g, a["out_channels"] / g
        vol = float(math.prod(a["kernel"]))
        n_img = a["batch"] * scale
        out_px, in_px = float(math.prod(a["output_spatial"])), float(math.prod(a["input_spatial"]))
        if a.get("transposed"):  # a transposed convolution is the data gradient of the forward convolution
            out_px, in_px, cin, cout = in_px, out_px, cout, cin
        if style == "colwise":
            cout /= split
        elif style == "rowwise":
            cin /= split
        elif split > 1:  # on a spatial split: each rank its share of the pixels
            n_img = n_img / split
        shapes = {"fwd": (n_img * out_px, cout, cin * vol), "dgrad": (n_img * in_px, cin, cout * vol),
                  "wgrad": (cout, cin * vol, n_img * out_px)}
        profile = self.conv_times
        for phase, (m, n_, k_) in shapes.items():
            if phase != "fwd" and bwd is None:
                continue
            if phase == "dgrad" and not self._input_needs_grad(u, op):
                continue
            res = None
            if profile is not None:
                res = profile.lookup(op, phase, dtype, m, n_, k_, g)
            if res is None:
                res = split_k_gemm(c, m, n_, k_, dtype, g)
            t = (fwd if phase == "fwd" else bwd).add(res)
            if phase == "wgrad":
                wgrad[j] = t
            elif phase == "dgrad":
                dgrad[j] = t

    # ---- memory ----------------------------------------------------------------------------------------
    def _activations(self, unit: Unit, st: UnitStatic, tp: int, sp: bool, mb: np.ndarray, dtype: str,
                     first: bool) -> dict[int, np.ndarray]:
        """Saved bytes of one instance on one rank: no recomputation, selective (the attention core's own
        tensors dropped), full (only the unit's input kept). A saved tensor is split over the TP group when
        the layout of the op that made it is (channel or token split; or a vocabulary-parallel loss)."""
        boundary = "R" if first or not sp else "T"
        core_only = _core_only_saved(unit)
        none = np.zeros(len(mb))
        selective = np.zeros(len(mb))
        for s in unit.saved:
            scale = mb / self.graph.batch if s.batched else np.ones(len(mb))
            if s.src >= 0:
                split = st.layout.out[s.src] in ("C", "T") or st.styles[s.src] == "vocab_loss"
            else:
                split = s.src == SRC_EXTERNAL and boundary == "T"
            b = s.numel * scale * _act_bytes_of(s.dtype, dtype) / (tp if split and tp > 1 else 1)
            none = none + b
            if s.key not in core_only:
                selective = selective + b
        full = float(unit.input_numel) * mb / self.graph.batch * _act_bytes(dtype) / (tp if sp else 1)
        return {0: none, 1: selective, 2: full}

    # ---- FLOPs ---------------------------------------------------------------------------------------------
    def forward_flops(self, blocks_only: bool = False) -> tuple[float, float]:
        return forward_flops(self.graph, blocks_only)


def forward_flops(graph: OpGraph, blocks_only: bool = False) -> tuple[float, float]:
    """(forward matmul FLOPs per sample: linear, conv, matmul, attention; of which attention and batched
    matmuls), at the FlopCounterMode convention (full, non-causal attention, as Korthikanti et al. count);
    ``blocks_only``: of the block units (what full recomputation runs again)."""
    total = core = 0.0
    for unit in graph.units:
        if blocks_only and unit.kind != "block":
            continue
        for op in unit.ops:
            if op.kind in ("linear", "matmul", "attention") + CONV_KINDS:
                f = op.flops * unit.repeat / (graph.batch if op.batched else 1)
                total += f
                if op.kind in ("matmul", "attention"):
                    core += f
    return total, core


SPLIT_K = (1, 2, 4, 8, 16, 32, 64)
"""split-K slice counts a convolution GEMM may use (CUTLASS / cuDNN split-K and stream-K kernels)."""


def split_k_gemm(c: ComputeModel, m: Any, n: Any, k: Any, dtype: str, groups: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A convolution's implicit GEMM at its fastest split-K: a weight gradient is (out x in*kernel) by the
    batch's pixels, a few output tiles with a huge inner dim, which cuDNN / CUTLASS split along k into slices
    run as a batch and then sum (fp32 partials: one more memory-bound pass). Without splitting, the roofline's
    wave quantization would leave most of the device idle."""
    m, n, k, groups = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x, dtype=float)) for x in (m, n, k, groups)))
    s = np.asarray(SPLIT_K, dtype=float)[:, None]  # every split at once: one call per kernel
    slices = np.where(s == 1.0, k, np.maximum(np.floor(k / s), 1.0))
    full = lambda x: np.broadcast_to(x, slices.shape).ravel()  # noqa: E731
    t, measured = c.gemm(full(m), full(n), slices.ravel(), dtype, batch=(groups * s).ravel())
    t = np.array(t, dtype=float).reshape(slices.shape)
    measured = np.asarray(measured)
    measured = measured.reshape(t.shape) if measured.size == t.size else np.broadcast_to(measured, t.shape)
    # the fp32 partial sums of a split added up: one more memory-bound pass
    reduce_t, _ = c.memory("residual_add", np.broadcast_to(m * n * groups * (s[1:] + 1) / 3.0,
                                                           (s.size - 1, m.size)).ravel(), "fp32", False)
    t[1:] += np.asarray(reduce_t, dtype=float).reshape(s.size - 1, m.size)
    best = np.argmin(t, axis=0)  # the first of equal times (no split before any split)
    cols = np.arange(m.size)
    return t[best, cols], measured[best, cols]


def grad_flags(unit: Unit, index: int) -> list[bool]:
    """Whether each op's output needs a gradient: it uses parameters or a tensor that does. The model's
    inputs (first unit's external tensors) and integer tensors need none."""
    flags: list[bool] = []
    for op in unit.ops:
        need = bool(op.params)
        for t in op.inputs:
            if t.src >= 0:
                need = need or flags[t.src]
            elif t.src == SRC_EXTERNAL:
                need = need or (index > 0 and _floating(t.dtype))
        flags.append(need)
    return flags


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


_act_bytes = activation_bytes


def _act_bytes_of(kind: str, dtype: str) -> float:
    return float(_act_bytes(dtype)) if kind == "act" else float(SAVED_DTYPES[kind])


def _core_only_saved(unit: Unit) -> set[int]:
    """Saved tensors made by the attention core and saved by it alone (dropped by selective recomputation)."""
    core = {j for j, op in enumerate(unit.ops) if op.kind in CORE_KINDS
            or (op.kind == "dropout" and op.inputs and op.inputs[0].src >= 0
                and unit.ops[op.inputs[0].src].kind == "softmax")}
    by: dict[int, set[int]] = {}
    for j, op in enumerate(unit.ops):
        for k in op.saves:
            by.setdefault(k, set()).add(j)
    return {s.key for s in unit.saved if s.src in core and by.get(s.key, set()) <= core}


def _memory_kernel(op: Op, dtype: str) -> tuple[str, float, str]:
    """(compute-model memory kernel, element count, dtype) of a memory-bound op."""
    out = float(op.output.numel)
    first = float(op.inputs[0].numel) if op.inputs else out
    if op.kind == "norm":
        return ("rmsnorm" if op.attrs.get("type") == "rmsnorm" else "layernorm"), first, dtype
    if op.kind == "dropout":
        return "dropout", out, dtype
    if op.kind == "softmax":
        return "softmax", out, dtype
    if op.kind == "loss":
        if op.fn in ("cross_entropy", "nll_loss"):
            return "softmax", first, "fp32"
        return "residual_add", first, dtype
    if op.kind == "embedding":
        return "gelu", out, dtype
    if op.kind == "elementwise":
        tensors = [t for t in op.inputs if t.src != SRC_CONST or t.numel > 1]
        if len(tensors) >= 2:
            return "residual_add", max(out, first), dtype
        return "gelu", max(out, first), dtype
    return "gelu", max(out, first), dtype  # activation, copy, pooling, other
