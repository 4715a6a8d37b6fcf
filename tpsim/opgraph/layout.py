"""Where a planned unit communicates: tensor layouts propagated op by op, and the collective at every change.

Layouts of an activation over the TP group (DTensor placements): ``R`` replicated, ``C`` split along channels
/ features / heads (Shard of the feature dim), ``T`` split along tokens or positions (Shard(1) of (batch, seq,
hidden): sequence parallelism; the last spatial dim of an image), ``P`` partial sums (Partial). A layout
change is a collective, with its backward twin (DTensor ``_collective_utils``; Megatron-Core
``tensor_parallel/mappings.py``):

=========  ===================  ===================
change     forward              backward
=========  ===================  ===================
R -> C, T  none (local slice)   all-gather
C -> R     all-gather           none (local slice)
T -> R     all-gather           reduce-scatter
P -> R     all-reduce           none
P -> T, C  reduce-scatter       all-gather
=========  ===================  ===================

A colwise op reading a replicated input gets a partial input gradient: one all-reduce in backward (Megatron's
``copy_to_tensor_model_parallel_region``). Megatron-Core (flavor ``megatron``) converts each tensor once
however many colwise ops read it (fused QKV) and overlaps the input-gradient reduction with the weight-gradient
GEMM and, under sequence parallelism, re-gathers the input in backward for the weight gradient behind the
data-gradient GEMM; DTensor (flavor ``dtensor``, what ``tpsim validate`` runs) converts per module and overlaps
nothing. Units meet in the boundary layout: ``T`` with sequence parallelism (Megatron keeps the residual stream
sequence-split), else ``R``; the model's own inputs are ``R``.

Token-wise replicated ops (linear, layer/RMS norm, pointwise ops, activations, dropout, softmax, embedding,
loss, copies) run on ``T`` locally with sequence parallelism; a convolution or a pooling window on ``T`` needs
a halo exchange of its border columns with both neighbours (send/recv), a batch / group norm on ``T`` an
all-reduce of its statistics, a layer norm on ``C`` too; attention, batched matmuls and indexing need ``R``.
Parameters of ops that run on ``T`` get partial gradients: all-reduced over the TP group once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .schema import CONV_KINDS, SRC_CONST, SRC_EXTERNAL, Op, OpGraph

CHANGES: dict[tuple[str, str], tuple[str | None, str | None]] = {
    ("R", "C"): (None, "all_gather"), ("R", "T"): (None, "all_gather"),
    ("C", "R"): ("all_gather", None), ("T", "R"): ("all_gather", "reduce_scatter"),
    ("P", "R"): ("all_reduce", None), ("P", "T"): ("reduce_scatter", "all_gather"),
    ("P", "C"): ("reduce_scatter", "all_gather"), ("C", "T"): ("all_gather", "all_gather"),
    ("T", "C"): ("all_gather", "reduce_scatter"),
}
"""(from, to) -> (forward collective, backward collective); None = local."""
TOKENWISE = {"linear", "elementwise", "activation", "dropout", "softmax", "embedding", "loss", "copy"}
NEEDS_REPLICATED = {"attention", "matmul", "other"}


@dataclass(frozen=True)
class Comm:
    """One collective over the TP group in one instance of a unit, per micro-batch."""

    phase: str
    """"fwd" or "bwd"."""
    op: str
    """all_reduce | all_gather | reduce_scatter | send_recv."""
    where: str
    """the op whose input (or output) changes layout."""
    numel: float
    """elements at the traced batch (full tensor, nccl-tests convention; send_recv: per direction)."""
    dtype: str = "act"
    """"act" (the plan's activation dtype) or "fp32"."""
    batched: bool = True
    overlap: str = ""
    """"wgrad" / "dgrad": hidden behind those GEMMs of ``hide`` (megatron flavor); "" exposed."""
    hide: tuple[int, ...] = ()


@dataclass(frozen=True)
class UnitLayout:
    """A unit's layouts and communication at one (tp, sp)."""

    out: tuple[str, ...]
    """layout of each op's output."""
    split: tuple[bool, ...]
    """the op's work and its saved tensors are split over the TP group."""
    param_split: tuple[bool, ...]
    """the op's weight is split over the TP group (colwise, rowwise, vocab, sharded norms / depthwise)."""
    comms: tuple[Comm, ...]
    grad_reduce: tuple[str, ...] = ()
    """parameters whose gradients are partial (op on T): all-reduced over TP once per step."""


def _is_tokenwise(op: Op) -> bool:
    if op.kind in TOKENWISE:
        return not (op.kind == "copy" and op.fn == "__getitem__")
    if op.kind == "norm":
        return op.attrs.get("type") in ("layernorm", "rmsnorm")
    if op.kind in CONV_KINDS:
        a = op.attrs
        return all(k == 1 for k in a["kernel"]) and all(s == 1 for s in a["stride"]) or _window_local(
            a["kernel"][-1], a["stride"][-1], a["padding"][-1])
    return False


def _window_local(kernel: int, stride: int, padding: int) -> bool:
    """A window op on a last-dim split needs no halo when windows do not overlap and do not pad."""
    return kernel == stride and padding == 0


def _t_capable(op: Op) -> bool:
    """Can run on a token / position split (locally, or with a halo / statistics reduction)."""
    return op.kind not in NEEDS_REPLICATED and not (op.kind == "copy" and op.fn == "__getitem__")


def _halo_numel(op: Op) -> float:
    """Border elements one rank exchanges per direction for a window op on a last-spatial-dim split."""
    a = op.attrs
    kernel = a.get("kernel") or [1]
    dilation = a.get("dilation") or [1] * len(kernel)
    width = (kernel[-1] - 1) * dilation[-1] // 2
    if width <= 0:
        return 0.0
    shape = op.inputs[0].shape
    return float(width * math.prod(shape[:-1]))


class _Sim:
    def __init__(self, graph: OpGraph, unit_index: int, styles: tuple[str, ...], tp: int, sp: bool,
                 flavor: str) -> None:
        self.unit = graph.units[unit_index]
        self.styles = styles
        self.megatron = flavor == "megatron"
        self.prefer_t = sp or "spatial" in styles
        self.boundary = "T" if sp else "R"
        self.external = "R" if unit_index == 0 else self.boundary
        self.comms: list[Comm] = []
        self.done: set[tuple] = set()
        self.out: list[str] = []
        self.tp = tp

    def have(self, src: int) -> str:
        return self.external if src == SRC_EXTERNAL else self.out[src]

    def convert(self, j: int, src: int, numel: float, want: str, colwise: bool) -> None:
        """Change the layout of input tensor ``src`` to ``want`` for op ``j``."""
        have = self.have(src)
        key = (src, numel, want)
        if self.megatron and key in self.done:
            return
        self.done.add(key)
        name = self.unit.ops[j].name
        hide = self._colwise_group(src) if colwise else ()
        if have == want:
            if colwise and want == "R":  # partial input gradient of a replicated input
                self.comms.append(Comm("bwd", "all_reduce", name, numel, overlap="wgrad" if self.megatron else "",
                                       hide=hide))
            return
        fwd, bwd = CHANGES[(have, want)]
        if fwd:
            self.comms.append(Comm("fwd", fwd, name, numel))
        if bwd:
            tag = "wgrad" if colwise and self.megatron else ""
            self.comms.append(Comm("bwd", bwd, name, numel, overlap=tag, hide=hide if tag else ()))
        if colwise and have == "T" and self.megatron:  # re-gather the sequence-split input for the wgrad
            self.comms.append(Comm("bwd", "all_gather", name, numel, overlap="dgrad", hide=hide))

    def _colwise_group(self, src: int) -> tuple[int, ...]:
        return tuple(k for k, op in enumerate(self.unit.ops) if self.styles[k] == "colwise"
                     and op.inputs and op.inputs[0].src == src)

    def run(self) -> UnitLayout:
        split, psplit, grads = [], [], []
        for j, op in enumerate(self.unit.ops):
            style = self.styles[j]
            out = self.step(j, op, style)
            self.out.append(out)
            split.append(out in ("C", "T") or style in ("colwise", "rowwise", "vocab_loss")
                         or (style == "vocab"))
            psplit.append(style in ("colwise", "rowwise", "vocab") or (style == "sharded" and bool(op.params)))
            if out == "T" and op.params and style in ("replicate", "spatial"):
                grads.extend(op.params)
        for e in self.unit.exports:  # hand the unit's results on in the boundary layout
            op = self.unit.ops[e]
            if self.out[e] != self.boundary and op.batched:
                self.convert_export(e, float(op.output.numel))
        return UnitLayout(out=tuple(self.out), split=tuple(split), param_split=tuple(psplit),
                          comms=tuple(self.comms), grad_reduce=tuple(dict.fromkeys(grads)))

    def convert_export(self, e: int, numel: float) -> None:
        have, want = self.out[e], self.boundary
        fwd, bwd = CHANGES[(have, want)]
        name = self.unit.ops[e].name
        if fwd:
            self.comms.append(Comm("fwd", fwd, name, numel))
        if bwd:
            self.comms.append(Comm("bwd", bwd, name, numel))

    def inputs(self, op: Op) -> list[tuple[int, float]]:
        """(src, numel) of the op's batched activation inputs."""
        return [(t.src, float(t.numel)) for t in op.inputs if t.src != SRC_CONST]

    def step(self, j: int, op: Op, style: str) -> str:
        ins = self.inputs(op)
        if style == "colwise":
            for src, n in ins[:1]:
                self.convert(j, src, n, "R", colwise=True)
            return "C"
        if style == "rowwise":
            for src, n in ins[:1]:
                self.convert(j, src, n, "C", colwise=False)
            return self._reduce_partial(j, op)
        if style == "vocab":
            return self._reduce_partial(j, op)
        if style == "vocab_loss":
            tokens = float(op.attrs.get("tokens", 1))
            for _ in range(3):  # max, sum of exponentials, target logit (Megatron vocab_parallel_cross_entropy)
                self.comms.append(Comm("fwd", "all_reduce", op.name, tokens, dtype="fp32"))
            return "R"
        if style == "sharded":
            for src, n in ins:
                self.convert(j, src, n, "C", colwise=False)
            if op.kind == "norm" and op.attrs.get("type") in ("layernorm", "rmsnorm"):
                self._stats(op)
            return "C"
        # replicate / spatial
        if self.prefer_t and _t_capable(op) and (style == "spatial" or op.kind not in CONV_KINDS
                                                 or _is_tokenwise(op)):
            for src, n in ins:
                self.convert(j, src, n, "T", colwise=False)
            self._on_tokens(op)
            return "T"
        for src, n in ins:
            self.convert(j, src, n, "R", colwise=False)
        return "R"

    def _reduce_partial(self, j: int, op: Op) -> str:  # noqa: ARG002 (a fixed signature)
        """A rowwise / vocab output is a partial sum, reduced right away into R or, under SP, T."""
        want = "T" if self.prefer_t else "R"
        fwd, bwd = CHANGES[("P", want)]
        n = float(op.output.numel)
        self.comms.append(Comm("fwd", fwd, op.name, n))
        if bwd:
            self.comms.append(Comm("bwd", bwd, op.name, n))
        return want

    def _stats(self, op: Op) -> None:
        """Norm statistics over a split dim: a small fp32 all-reduce forward and backward."""
        a = op.attrs
        if a.get("type") in ("layernorm", "rmsnorm"):
            n = 2.0 * a.get("tokens", 1)
        elif a.get("type") == "groupnorm":
            n = 2.0 * op.inputs[0].shape[0] * a.get("groups", 1)
        else:
            n = 2.0 * a.get("channels", 1)
        for phase in ("fwd", "bwd"):
            self.comms.append(Comm(phase, "all_reduce", op.name, n, dtype="fp32",
                                   batched=a.get("type") in ("layernorm", "rmsnorm", "groupnorm")))

    def _on_tokens(self, op: Op) -> None:
        """Extra communication of an op on a token / position split."""
        if op.kind == "norm" and op.attrs.get("type") in ("batchnorm", "groupnorm", "instancenorm"):
            self._stats(op)
        elif op.kind in CONV_KINDS or (op.kind == "pooling" and "kernel" in op.attrs):
            a = op.attrs
            if not _window_local(a["kernel"][-1], a["stride"][-1], a.get("padding", [0])[-1]) \
                    and not (op.kind in CONV_KINDS and all(k == 1 for k in a["kernel"])):
                halo = _halo_numel(op)
                for phase in ("fwd", "bwd"):
                    self.comms.append(Comm(phase, "send_recv", op.name, halo))
        elif op.kind == "pooling" and op.output.numel * 4 <= op.inputs[0].numel:  # global pooling: sum the parts
            self.comms.append(Comm("fwd", "all_reduce", op.name, float(op.output.numel)))


def unit_layout(graph: OpGraph, unit_index: int, styles: tuple[str, ...], tp: int, sp: bool,
                flavor: str = "megatron") -> UnitLayout:
    """Layouts and collectives of one instance of unit ``unit_index`` at TP degree ``tp``."""
    if tp == 1:
        n = len(graph.units[unit_index].ops)
        return UnitLayout(out=("R",) * n, split=(False,) * n, param_split=(False,) * n, comms=())
    return _Sim(graph, unit_index, styles, tp, sp, flavor).run()
