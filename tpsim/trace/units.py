"""From recorded calls to the op graph: repeated blocks, units, local data flow, saved tensors, boundaries.

Repeated blocks: the children of every ``nn.ModuleList`` / ``nn.Sequential`` (outermost containers first) whose
recorded ops form consecutive ranges of the forward pass. A run of two or more consecutive children with the
same op signature (per op: kind, function, module path relative to the child, input/output shapes, parameter
shapes, where each input comes from within the child, attributes) becomes one unit with ``repeat`` = the run
length: a 96-layer model is one block x 96. Other children are units of their own (pipeline split points); ops
outside every container child are grouped into "glue" units by contiguity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..opgraph.schema import SRC_CONST, SRC_EXTERNAL, Op, SavedTensor, TensorMeta, Unit
from .classify import Classified, Saved
from .record import Recorder, RawOp

ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                 "int8": 1, "uint8": 1, "bool": 1, "complex64": 8}


@dataclass
class _Span:
    """A container child and the raw op range [start, stop) it ran."""

    path: str
    start: int
    stop: int
    depth: int


def _child_spans(model: torch.nn.Module, ops: list[RawOp]) -> list[list[_Span]]:
    """Per container (ModuleList / Sequential), the spans of its children that ran as contiguous op ranges."""
    containers = []
    for cname, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        spans = []
        for child, _ in mod.named_children():
            path = f"{cname}.{child}" if cname else child
            idx = [i for i, op in enumerate(ops) if op.module == path or op.module.startswith(path + ".")]
            if idx and idx[-1] - idx[0] + 1 == len(idx):
                spans.append(_Span(path, idx[0], idx[-1] + 1, cname.count(".") + (1 if cname else 0)))
        if spans:
            containers.append(spans)
    containers.sort(key=lambda spans: spans[0].depth)
    return containers


def _relative(path: str, base: str) -> str:
    return path[len(base):] if path.startswith(base) else "~" + path


def op_signature(ops: list[RawOp], classified: list[Classified], span: _Span, params: dict) -> tuple:
    """What must be equal for two children to be the same block."""
    sig = []
    for i in range(span.start, span.stop):
        op, c = ops[i], classified[i]
        srcs = tuple(s - span.start if span.start <= s < span.stop else (-1 if s != -2 else -2)
                     for s in op.in_src)
        attrs = tuple(sorted((k, repr(v)) for k, v in c.attrs.items() if k != "weight"))
        sig.append((c.kind, op.fn, _relative(op.module, span.path), tuple(op.in_meta), tuple(op.out_meta),
                    tuple(params[p] for p in op.params), srcs, attrs))
    return tuple(sig)


@dataclass
class _Group:
    spans: list[_Span]


def find_groups(model: torch.nn.Module, ops: list[RawOp], classified: list[Classified],
                params: dict) -> list[_Group]:
    """Runs of identical consecutive container children (repeat >= 1), outermost first, non-overlapping."""
    claimed = [False] * len(ops)
    groups: list[_Group] = []
    for spans in _child_spans(model, ops):
        if any(claimed[s.start] for s in spans):
            continue
        sigs = [op_signature(ops, classified, s, params) for s in spans]
        i = 0
        while i < len(spans):
            j = i + 1
            while j < len(spans) and sigs[j] == sigs[i] and spans[j].start == spans[j - 1].stop:
                j += 1
            groups.append(_Group(spans[i:j]))
            for s in spans[i:j]:
                claimed[s.start:s.stop] = [True] * (s.stop - s.start)
            i = j
    groups.sort(key=lambda g: g.spans[0].start)
    return groups


def _op_names(ops: list[RawOp], classified: list[Classified]) -> list[str]:
    """Module path for the first weight/norm/embedding op of a module call; ``module:fn`` otherwise; ``#k``
    suffixes keep names unique."""
    names, seen, first_in_module = [], {}, set()
    for op, c in zip(ops, classified):
        named_kind = c.kind in ("linear", "conv1d", "conv2d", "conv3d", "norm", "embedding")
        if named_kind and op.params and op.module and op.module not in first_in_module:
            base = op.module
            first_in_module.add(op.module)
        else:
            base = f"{op.module}:{op.fn}" if op.module else op.fn
        n = seen.get(base, 0) + 1
        seen[base] = n
        names.append(base if n == 1 else f"{base}#{n}")
    return names


def _ranges(n_ops: int, groups: list[_Group]) -> list[tuple[str, str, list[_Span]]]:
    """(kind, name, spans) per unit in execution order; glue ranges between groups."""
    units: list[tuple[str, str, list[_Span]]] = []
    pos = 0
    for g in groups:
        if g.spans[0].start > pos:
            units.append(("glue", "", [_Span("", pos, g.spans[0].start, 0)]))
        units.append(("block", g.spans[0].path, g.spans))
        pos = g.spans[-1].stop
    if pos < n_ops:
        units.append(("glue", "", [_Span("", pos, n_ops, 0)]))
    return units


def _last_use(ops: list[RawOp]) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for root in op.in_root:
            last[root] = i
    return last


def _live_numel(rec: Recorder, producers: dict[int, int], last: dict[int, int], boundary: int) -> int:
    """Elements of batched tensors made before ``boundary`` (model inputs included) and used at or after it:
    what a pipeline stage boundary there sends."""
    return sum(rec.info[root].numel for root, use in last.items()
               if rec.info[root].batched and producers.get(root, -1) < boundary <= use)


def _bytes(meta: list[tuple[tuple[int, ...], str]]) -> float:
    return float(sum(math.prod(s) * ELEMENT_BYTES.get(d, 4) for s, d in meta))


def build_units(rec: Recorder, classified: list[Classified], groups: list[_Group]) -> list[Unit]:
    ops = rec.ops
    names = _op_names(ops, classified)
    last = _last_use(ops)
    producers = {}
    for i, op in enumerate(ops):
        for k in op.outputs:
            producers.setdefault(rec.info[k].root, i)
    units = []
    for kind, name, spans in _ranges(len(ops), groups):
        span = spans[0]
        unit_ops, saved, keys = [], [], {}
        for i in range(span.start, span.stop):
            op, c = ops[i], classified[i]
            inputs = tuple(TensorMeta(shape=m[0], dtype=m[1], src=_local_src(op, j, span))
                           for j, m in enumerate(op.in_meta))
            saves = tuple(_saved_key(rec, s, i, span, keys, saved, producers) for s in c.saves)
            unit_ops.append(Op(name=names[i], module=op.module, module_type=op.module_type, kind=c.kind, fn=op.fn,
                               inputs=inputs, output=TensorMeta(shape=op.out_meta[0][0], dtype=op.out_meta[0][1]),
                               flops=op.flops, bytes=_bytes(op.in_meta) + _bytes(op.out_meta[:1]),
                               params=tuple(op.params), batched=any(op.in_batched), attrs=c.attrs,
                               saves=tuple(dict.fromkeys(k for k in saves if k is not None))))
        exports = tuple(sorted({i - span.start for i in range(span.start, span.stop)
                                for k in ops[i].outputs if last.get(rec.info[k].root, -1) >= span.stop}))
        units.append(Unit(name=name or (unit_ops[0].module.split(".")[0] or unit_ops[0].name),
                          kind=kind, repeat=len(spans), instances=tuple(s.path or name for s in spans),
                          ops=tuple(unit_ops), saved=tuple(saved),
                          input_numel=_live_numel(rec, producers, last, span.start),
                          output_numel=_live_numel(rec, producers, last, span.stop), exports=exports))
    return units


def _local_src(op: RawOp, j: int, span: _Span) -> int:
    src = op.in_src[j]
    if span.start <= src < span.stop:
        return src - span.start
    if src == -2 or not op.in_batched[j]:
        return SRC_CONST
    return SRC_EXTERNAL


def _saved_key(rec: Recorder, s: Saved, index: int, span: _Span, keys: dict, saved: list,
               producers: dict) -> int | None:
    """Register a saved tensor in the unit (once per storage); its unit-local key."""
    if s.key is None:
        key = len(saved)
        saved.append(SavedTensor(key=key, numel=s.numel, dtype=s.dtype, src=index - span.start,
                                 batched=any(rec.ops[index].in_batched)))
        return key
    info = rec.info[s.key]
    if info.producer == -2 and not info.batched:  # a parameter, buffer or constant: not an activation
        return None
    root = info.root
    if root in keys:
        return keys[root]
    made = producers.get(root, -1)
    src = made - span.start if span.start <= made < span.stop else SRC_EXTERNAL
    key = len(saved)
    keys[root] = key
    saved.append(SavedTensor(key=key, numel=rec.info[root].numel, dtype=s.dtype, src=src,
                             batched=rec.info[root].batched))
    return key
