"""A tensor-parallel plan for a traced op graph, derived per op in DTensor's vocabulary (torch-free).

Styles (what ``tpsim validate`` maps to ``parallelize_module``):

``colwise``     ColwiseParallel: a linear's output features / a convolution's output channels split; input
                Replicate, output channel-sharded.
``rowwise``     RowwiseParallel: input features / input channels split; the output is a partial sum,
                reduced (all-reduce, or reduce-scatter into the sequence-sharded layout with sp).
``sharded``     an op between a colwise and a rowwise op that runs on the channel shard as is: activations,
                dropout, elementwise ops, attention on a subset of heads, batch/group norm on a subset of
                channels, depthwise convolutions (their weight split with the channels), pooling.
``vocab``       an embedding whose rows (the vocabulary) are split: RowwiseParallel on ``nn.Embedding``,
                output partial -> reduced.
``vocab_loss``  cross-entropy on vocabulary-sharded logits (``loss_parallel``: three small all-reduces of the
                per-token max, sum of exponentials and target logit).
``spatial``     a convolution on an input split along its last spatial dim, with a halo exchange of the
                ``kernel // 2`` border columns with both neighbours (DTensor's ``tp_convolution``); weight
                replicated, its gradient reduced over the TP group once per step.
``replicate``   every rank runs the full op (no communication, no saving).

Derivation (Megatron-style pairing, Shoeybi et al. 2019, section 3): walking each unit's ops in order, a weight
op (linear, or convolution with groups = 1) and the not-yet-planned weight ops reading the same tensor (q, k,
v) become ``colwise`` if every path from their outputs runs through shard-transparent ops (above) to weight ops
that then become ``rowwise`` (or to a cross-entropy: ``vocab_loss``), and no tensor on those paths is used
outside the region (a residual) or after the unit. Communication then sits where Megatron puts it: at the
colwise input and the rowwise output. Batched embeddings are ``vocab``. Ops left over are ``replicate``. A
region whose split dims are not divisible by the TP degree falls back to ``replicate`` at that degree (the
estimate says so in a warning).

Overrides: a small YAML (``--tp-plan FILE``) maps module paths or op names (glob patterns: ``blocks.*.mlp.fc1``)
to a style, and ``conv: spatial`` makes every convolution ``spatial``; derivation runs around the pinned ops.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .schema import CONV_KINDS, SRC_CONST, Op, OpGraph, Unit

STYLES = ("colwise", "rowwise", "sharded", "replicate", "vocab", "vocab_loss", "spatial")
USER_STYLES = ("colwise", "rowwise", "replicate", "spatial", "vocab")
"""styles a user may pin in the override YAML."""
CONV_MODES = ("channel", "spatial", "replicate")
POINTWISE = {"add", "sub", "mul", "div", "true_divide", "neg", "abs", "pow", "rsqrt", "sqrt", "exp", "log",
             "clamp", "clip", "where", "maximum", "minimum", "sigmoid", "tanh", "relu", "square", "reciprocal",
             "masked_fill", "lerp", "addcmul", "addcdiv", "rsub", "floor", "ceil", "round", "sign", "sin", "cos",
             "erf", "to", "float", "half", "bfloat16", "type_as", "__mul__", "__add__", "__sub__"}
"""elementwise functions that act per element (shard-transparent); reductions (mean, sum, norm) are not."""
LAYOUT_COPIES = {"reshape", "flatten", "contiguous", "clone", "transpose", "permute", "view", "to", "float",
                 "half", "bfloat16", "type", "type_as", "unflatten"}
"""copies that keep a channel / head split (a reshape of the heads dim, a transpose)."""


def is_depthwise(op: Op) -> bool:
    a = op.attrs
    return op.kind in CONV_KINDS and a["groups"] > 1 and a["groups"] == a["in_channels"] == a["out_channels"]


def is_weight(op: Op) -> bool:
    """Ops that colwise / rowwise can split: linears and convolutions with groups = 1."""
    if op.kind == "linear":
        return bool(op.params)
    return op.kind in CONV_KINDS and op.attrs.get("groups", 1) == 1 and bool(op.params)


def transparent(op: Op) -> bool:
    """Runs on a channel / head shard without communication (or with a small statistic reduction)."""
    if op.kind in ("activation", "dropout", "attention", "softmax"):
        return True
    if op.kind == "matmul":
        return not op.params
    if op.kind == "norm":
        return op.attrs.get("type") in ("batchnorm", "groupnorm", "layernorm", "rmsnorm", "instancenorm")
    if op.kind == "elementwise":
        return op.fn.rstrip("_") in POINTWISE
    if op.kind == "copy":
        return op.fn in LAYOUT_COPIES
    if op.kind == "pooling":
        return True
    return is_depthwise(op)


@dataclass(frozen=True)
class Region:
    """One Megatron-style pair: colwise ops, the sharded ops between, the rowwise / vocab_loss ends."""

    unit: int
    colwise: tuple[int, ...]
    sharded: tuple[int, ...]
    ends: tuple[int, ...]

    @property
    def ops(self) -> tuple[int, ...]:
        return self.colwise + self.sharded + self.ends


@dataclass(frozen=True)
class TPPlan:
    """Style of every op of every unit (repeated instances share their unit's styles)."""

    styles: tuple[tuple[str, ...], ...]
    regions: tuple[Region, ...]
    pinned: Mapping[tuple[int, int], str] = field(default_factory=dict)
    """(unit, op) -> style set by an override."""
    conv: str = "channel"

    def style(self, unit: int, op: int) -> str:
        return self.styles[unit][op]

    def described(self, graph: OpGraph) -> dict[str, str]:
        """{op name: style} of the ops that are not replicated (first instance names)."""
        return {op.name: self.styles[u][i] for u, unit in enumerate(graph.units) for i, op in enumerate(unit.ops)
                if self.styles[u][i] != "replicate"}


# ---- derivation -----------------------------------------------------------------------------------------
def _consumers(unit: Unit) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in unit.ops]
    for j, op in enumerate(unit.ops):
        for t in op.inputs:
            if t.src >= 0 and j not in out[t.src]:
                out[t.src].append(j)
    return out


def _try_region(unit: Unit, index: int, cols: list[int], styles: list[str | None], consumers: list[list[int]],
                pinned: Mapping[int, str]) -> Region | None:
    """The region starting at ``cols`` (all made colwise), or None if it escapes or meets a non-transparent op."""
    exports = set(unit.exports)
    region: set[int] = set(cols)
    ends: list[int] = []
    sharded: list[int] = []
    frontier = list(cols)
    while frontier:
        j = frontier.pop()
        if j in exports:
            return None
        for c in consumers[j]:
            if c in region or c in ends:
                continue
            op = unit.ops[c]
            if styles[c] is not None and pinned.get(c) != "rowwise":
                return None
            if (is_weight(op) and pinned.get(c, "rowwise") == "rowwise" and op.inputs[0].src in region
                    and all(t.src in region or t.src == SRC_CONST for t in op.inputs)):
                ends.append(c)
                continue
            if op.kind == "loss" and op.fn in ("cross_entropy", "nll_loss") and op.inputs[0].src in region \
                    and all(unit.ops[k].kind == "linear" for k in cols):
                ends.append(c)
                continue
            if not transparent(op) or c in pinned:
                return None
            # every other activation input must be split the same way: the output of another (unplanned)
            # linear / convolution joins as colwise (a U-Net block's timestep projection added to its features);
            # a replicated activation cannot be added to a channel shard in the model's own code
            for t in op.inputs:
                if t.src == SRC_CONST or t.src in region:
                    continue
                other = unit.ops[t.src] if t.src >= 0 else None
                if other is None or styles[t.src] is not None or not is_weight(other) or t.src in pinned:
                    return None
                region.add(t.src)
                cols = cols + [t.src]
                frontier.append(t.src)
            region.add(c)
            sharded.append(c)
            frontier.append(c)
    if not ends:
        return None
    return Region(unit=index, colwise=tuple(sorted(cols)), sharded=tuple(sorted(sharded)), ends=tuple(sorted(ends)))


def _siblings(unit: Unit, j: int, styles: list[str | None], pinned: Mapping[int, str]) -> list[int]:
    """Unplanned weight ops (same kind family) reading the same tensor as op j, j first."""
    src = unit.ops[j].inputs[0].src
    same = [k for k, op in enumerate(unit.ops) if k != j and styles[k] is None and is_weight(op)
            and op.inputs[0].src == src and src != SRC_CONST and (op.kind == "linear") == (unit.ops[j].kind == "linear")
            and pinned.get(k, "colwise") == "colwise"]
    return [j] + same


def _derive_unit(unit: Unit, index: int, pinned: Mapping[int, str], conv: str) -> tuple[list[str], list[Region]]:
    styles: list[str | None] = [pinned.get(j) for j in range(len(unit.ops))]
    consumers = _consumers(unit)
    regions: list[Region] = []
    for j, op in enumerate(unit.ops):
        if styles[j] is not None:
            continue
        if op.kind == "embedding" and op.inputs[0].src != SRC_CONST:
            styles[j] = "vocab"
            continue
        if op.kind in CONV_KINDS and conv != "channel":
            styles[j] = "spatial" if conv == "spatial" and _spatial_ok(op) else "replicate"
            continue
        if not is_weight(op):
            continue
        siblings = _siblings(unit, j, styles, pinned)
        for cols in ([siblings, [j]] if len(siblings) > 1 else [siblings]):
            region = _try_region(unit, index, cols, styles, consumers, pinned)
            if region is not None:
                for k in region.colwise:
                    styles[k] = "colwise"
                for k in region.sharded:
                    styles[k] = "sharded"
                for k in region.ends:
                    styles[k] = "rowwise" if unit.ops[k].kind != "loss" else "vocab_loss"
                regions.append(region)
                break
    return [s or "replicate" for s in styles], regions


def _spatial_ok(op: Op) -> bool:
    """DTensor's tp_convolution: dilation 1; with padding, stride 1; without, stride = kernel (last dim)."""
    a = op.attrs
    if op.kind not in CONV_KINDS or a.get("transposed"):
        return False
    k, s, p, d = a["kernel"][-1], a["stride"][-1], a["padding"][-1], a["dilation"][-1]
    return d == 1 and ((p > 0 and s == 1) or (p == 0 and s == k))


def derive_plan(graph: OpGraph, overrides: "PlanOverrides | None" = None) -> TPPlan:
    """The TP plan of every op (see the module docstring)."""
    overrides = overrides or PlanOverrides()
    pinned_all = overrides.resolve(graph)
    styles, regions = [], []
    for u, unit in enumerate(graph.units):
        pinned = {j: s for (uu, j), s in pinned_all.items() if uu == u}
        s, r = _derive_unit(unit, u, pinned, overrides.conv)
        styles.append(tuple(s))
        regions.extend(r)
    return TPPlan(styles=tuple(styles), regions=tuple(regions), pinned=pinned_all, conv=overrides.conv)


# ---- divisibility at a TP degree --------------------------------------------------------------------------
def split_dims(unit: Unit, region: Region) -> list[tuple[str, str, int]]:
    """(op name, what, size) of every dim the region splits (each must be divisible by tp)."""
    dims = []
    for k in region.colwise:
        op = unit.ops[k]
        what = "out_features" if op.kind == "linear" else "out_channels"
        dims.append((op.name, what, op.attrs.get(what, 0)))
    for k in region.ends:
        op = unit.ops[k]
        if op.kind == "loss":
            continue
        what = "in_features" if op.kind == "linear" else "in_channels"
        dims.append((op.name, what, op.attrs.get(what, 0)))
    for k in region.sharded:
        op = unit.ops[k]
        a = op.attrs
        if op.kind == "attention":
            dims.append((op.name, "heads", a["heads"]))
            if a["kv_heads"] != a["heads"]:
                dims.append((op.name, "kv_heads", a["kv_heads"]))
        elif op.kind == "norm" and a.get("type") == "groupnorm":
            dims.append((op.name, "groups", a["groups"]))
        elif op.kind == "norm" and a.get("type") in ("batchnorm", "instancenorm"):
            dims.append((op.name, "channels", a["channels"]))
        elif is_depthwise(op):
            dims.append((op.name, "channels", a["in_channels"]))
    return dims


def region_problem(graph: OpGraph, region: Region, tp: int) -> str | None:
    """None if tp divides every split dim of the region, else the first one as a line."""
    if tp == 1:
        return None
    for name, what, size in split_dims(graph.units[region.unit], region):
        if size % tp:
            return f"tp={tp} does not divide {what}={size} of {name}"
    return None


def styles_at(graph: OpGraph, plan: TPPlan, tp: int) -> tuple[tuple[tuple[str, ...], ...], list[str]]:
    """Per-unit styles at TP degree ``tp`` (regions that do not divide fall back to replicate) and a line per
    fallback."""
    styles = [list(s) for s in plan.styles]
    notes = []
    if tp > 1:
        for region in plan.regions:
            problem = region_problem(graph, region, tp)
            if problem:
                for k in region.ops:
                    styles[region.unit][k] = "replicate"
                notes.append(f"{problem}: that region runs replicated")
        for u, unit in enumerate(graph.units):
            for j, op in enumerate(unit.ops):
                if styles[u][j] == "vocab" and op.attrs["num_embeddings"] < tp:
                    styles[u][j] = "replicate"
    else:
        styles = [["replicate"] * len(s) for s in styles]
    return tuple(tuple(s) for s in styles), notes


# ---- overrides --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PlanOverrides:
    """User overrides of the derived plan (the ``--tp-plan`` YAML)."""

    ops: Mapping[str, str] = field(default_factory=dict)
    """pattern (module path or op name, fnmatch glob) -> style (USER_STYLES)."""
    conv: str = "channel"
    """how convolutions are split by default: "channel" (colwise/rowwise pairs), "spatial", "replicate"."""
    source: str = ""

    def resolve(self, graph: OpGraph) -> dict[tuple[int, int], str]:
        """(unit, op) -> pinned style; every pattern must match at least one op."""
        pinned: dict[tuple[int, int], str] = {}
        for pattern, style in self.ops.items():
            hits = [(u, j) for u, unit in enumerate(graph.units) for j, op in enumerate(unit.ops)
                    if _matches(pattern, unit, op)]
            if not hits:
                raise InputError(f"{self.source or 'tp plan'}: {pattern!r} matches no op of {graph.name} "
                                 f"(op names look like {graph.units[min(1, len(graph.units) - 1)].ops[0].name!r})")
            for u, j in hits:
                op = graph.units[u].ops[j]
                if style in ("colwise", "rowwise") and not is_weight(op):
                    raise InputError(f"{self.source or 'tp plan'}: {pattern}: {style} needs a linear or a "
                                     f"convolution with groups=1, {op.name} is {op.kind}")
                if style == "spatial" and not _spatial_ok(op):
                    raise InputError(f"{self.source or 'tp plan'}: {pattern}: spatial needs a convolution with "
                                     f"dilation 1 and (padding with stride 1, or stride = kernel): {op.name}")
                if style == "vocab" and op.kind != "embedding":
                    raise InputError(f"{self.source or 'tp plan'}: {pattern}: vocab needs an embedding, "
                                     f"{op.name} is {op.kind}")
                pinned[(u, j)] = style
        return pinned


def _matches(pattern: str, unit: Unit, op: Op) -> bool:
    names = {op.name, op.module}
    first = unit.instances[0]
    for path in unit.instances[1:]:  # other instances of a repeated block: same op, other prefix
        if first and op.name.startswith(first):
            names.add(path + op.name[len(first):])
            names.add(path + op.module[len(first):])
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def load_overrides(path: str | Path) -> PlanOverrides:
    """Read a ``--tp-plan`` YAML: ``{conv: channel|spatial|replicate, ops: {pattern: style}}``."""
    from ..topology.files import read_yaml

    path = Path(path)
    if not path.is_file():
        raise InputError(f"tp plan {path}: no such file")
    data = read_yaml(path)
    return overrides_from_mapping(data, str(path))


def overrides_from_mapping(data: Any, source: str = "tp plan") -> PlanOverrides:
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: expected a mapping with keys conv and ops")
    unknown = set(data) - {"conv", "ops"}
    if unknown:
        raise InputError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))} (keys: conv, ops)")
    conv = data.get("conv", "channel")
    if conv not in CONV_MODES:
        raise InputError(f"{source}: conv={conv!r} is not one of {', '.join(CONV_MODES)}")
    ops = data.get("ops", {}) or {}
    if not isinstance(ops, Mapping):
        raise InputError(f"{source}: ops must map module paths to styles")
    for pattern, style in ops.items():
        if not isinstance(pattern, str) or style not in USER_STYLES:
            raise InputError(f"{source}: ops.{pattern}={style!r} is not one of {', '.join(USER_STYLES)}")
    return PlanOverrides(ops=dict(ops), conv=conv, source=source)
