"""The traced op graph (``*.ops.json``): dataclasses, JSON round trip and strict validation (torch-free).

``tpsim trace`` writes it (:mod:`tpsim.trace`); the estimator, planner and ``tpsim validate`` read it with
:func:`load_opgraph`. The format is documented in docs/OPGRAPH.md; this module is its reference.

An :class:`OpGraph` is a sequence of :class:`Unit` in execution order. A unit is either a run of structurally
identical blocks (``repeat`` > 1: the ops of the first instance, the instance paths listed) or a single
block / a run of ops outside any block. Every :class:`Op` carries its kind, shapes, FLOPs, bytes moved,
parameters, the module path it belongs to, where its tensor inputs come from (``src``), and the tensors it
saves for backward. Everything is measured at the traced batch (``OpGraph.batch``): quantities of ``batched``
ops scale linearly with the micro-batch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InputError
from ..io import is_opgraph_path as is_opgraph_path  # re-exported: the CLI asks tpsim.io, without this module
from ..limits import FLOAT_LIMITS, LIMITS

FORMAT = "tpsim-opgraph"
VERSION = 1

KINDS = ("linear", "conv1d", "conv2d", "conv3d", "matmul", "attention", "norm", "activation", "elementwise",
         "dropout", "softmax", "embedding", "pooling", "loss", "copy", "other")
"""Op kinds (docs/OPGRAPH.md says what each covers and how the cost model times it)."""
CONV_KINDS = ("conv1d", "conv2d", "conv3d")
WEIGHT_KINDS = ("linear",) + CONV_KINDS
"""kinds whose weight tensor parallelism splits (colwise / rowwise)."""
NORM_TYPES = ("layernorm", "rmsnorm", "batchnorm", "groupnorm", "instancenorm")
SAVED_DTYPES = {"act": 0, "fp32": 4, "bool": 1, "int64": 8}
"""bytes per element of a saved tensor class; "act" = the plan's activation dtype (2 B bf16, 4 B fp32)."""
TORCH_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "bool", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "complex128", "complex32",
                "complex64", "float4_e2m1fn_x2", "float8_e4m3fn", "float8_e4m3fnuz",
                "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "int1", "int16", "int2", "int3", "int4",
                "int5", "int6", "int7", "int8", "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "uint1",
                "uint16", "uint2", "uint3", "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8")
"""tensor dtypes a graph may name: every ``torch.dtype`` of torch 2.13 without the ``torch.`` prefix (what
tpsim/trace/record.py writes); anything else in a file is refused, naming the field."""
SRC_EXTERNAL = -1
"""``src`` of an input produced before this unit (an earlier unit, or the model's input)."""
SRC_CONST = -2
"""``src`` of an input that is a parameter, a buffer or a tensor made without the model input."""
MAX_OPS = 1_000_000
"""ops a graph may hold (every one of them is read and validated)."""
MAX_DIMS = 8
"""tensor rank accepted in a shape."""
MAX_NUMEL = 1 << 50
"""elements per tensor accepted (far above any real activation; keeps products finite)."""


@dataclass(frozen=True, kw_only=True)
class TensorMeta:
    """Shape and dtype of one tensor input or output of an op."""

    shape: tuple[int, ...]
    dtype: str
    """torch dtype name without the ``torch.`` prefix (float32, bfloat16, int64, bool, ...)."""
    src: int = SRC_EXTERNAL
    """inputs only: index of the producing op in the same unit, SRC_EXTERNAL or SRC_CONST."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, kw_only=True)
class SavedTensor:
    """A tensor kept for the backward pass (autograd's saved tensors), counted once per storage."""

    key: int
    """unit-local id; ops name it in ``saves``."""
    numel: int
    """elements at the traced batch (the whole storage, for views)."""
    dtype: str
    """one of SAVED_DTYPES."""
    src: int
    """producing op index in the unit (its TP layout shards the tensor), or SRC_EXTERNAL (unit input)."""
    batched: bool = True


@dataclass(frozen=True, kw_only=True)
class Op:
    """One operation as a user wrote it (``F.linear``, ``F.conv2d``, ``F.scaled_dot_product_attention``...)."""

    name: str
    """unique in the graph: the module path, with ``:fn`` (and ``#k``) for functional ops inside a module."""
    module: str
    """innermost module path the op ran in ("" = the root module)."""
    module_type: str
    """class name of that module."""
    kind: str
    fn: str
    """torch function name (linear, conv2d, scaled_dot_product_attention, add, gelu, ...)."""
    inputs: tuple[TensorMeta, ...]
    output: TensorMeta
    flops: float
    """forward FLOPs at the traced batch, as torch.utils.flop_counter counts them (multiply-add = 2)."""
    bytes: float
    """forward bytes moved at the traced batch and the traced dtype: tensor inputs + output (no fusion)."""
    params: tuple[str, ...] = ()
    """names of the parameters the op uses (OpGraph.params holds their shapes)."""
    batched: bool = True
    """True if the op depends on the model input (its cost scales with the micro-batch)."""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    """kind-specific sizes (docs/OPGRAPH.md)."""
    saves: tuple[int, ...] = ()
    """keys of the unit's SavedTensor kept for backward by this op."""


@dataclass(frozen=True, kw_only=True)
class Unit:
    """A block (``repeat`` structurally identical instances) or a run of ops outside blocks."""

    name: str
    """path of the first instance ("" prefix / suffix units are named by their first op's module)."""
    kind: str
    """"block" (a child of a ModuleList / Sequential) or "glue" (ops outside any block)."""
    repeat: int
    instances: tuple[str, ...]
    ops: tuple[Op, ...]
    saved: tuple[SavedTensor, ...] = ()
    input_numel: int = 0
    """elements of the batched activations live at the unit's start (a pipeline stage boundary before the unit
    sends them), at the traced batch."""
    output_numel: int = 0
    """elements of the batched activations live after the unit's end (one instance)."""
    exports: tuple[int, ...] = ()
    """indices of the ops whose outputs are used after the unit (by later units or as the loss)."""


@dataclass(frozen=True, kw_only=True)
class OpGraph:
    """A traced model: units in execution order, parameter shapes, provenance."""

    name: str
    units: tuple[Unit, ...]
    params: Mapping[str, tuple[int, ...]]
    """parameter name -> shape (tied parameters appear once)."""
    batch: int
    """micro-batch the model was traced at (dim 0 of every input)."""
    inputs: tuple[TensorMeta, ...]
    dtype: str = "float32"
    """dtype the model was traced in (the estimator uses the plan's dtype)."""
    tokens_per_sample: int = 1
    """samples -> tokens for throughput figures (sequence length; 1 for images)."""
    source: Mapping[str, Any] = field(default_factory=dict)
    """module_spec, kwargs, input shapes, torch version, date, tpsim version."""

    # ---- derived ------------------------------------------------------------------------------------
    def expanded(self) -> list[tuple[Unit, str]]:
        """(unit, instance path) for every block instance, in execution order."""
        return [(u, path) for u in self.units for path in u.instances]

    def total_params(self) -> int:
        return sum(math.prod(s) for s in self.params.values())

    def forward_flops(self) -> float:
        """Forward FLOPs of the whole model at the traced batch."""
        return sum(u.repeat * sum(op.flops for op in u.ops) for u in self.units)

    def num_ops(self) -> int:
        return sum(u.repeat * len(u.ops) for u in self.units)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "name": self.name, "batch": self.batch,
                "tokens_per_sample": self.tokens_per_sample, "dtype": self.dtype,
                "inputs": [_tensor_dict(t, src=False) for t in self.inputs],
                "params": {k: list(v) for k, v in self.params.items()},
                "source": dict(self.source),
                "units": [_unit_dict(u) for u in self.units]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    def summary(self) -> str:
        """A few lines: units, repeats, ops, parameters, FLOPs."""
        lines = [f"{self.name}: {len(self.units)} units, {self.num_ops()} ops, "
                 f"{self.total_params() / 1e6:.1f} M parameters, "
                 f"{self.forward_flops() / self.batch / 1e9:.2f} GFLOP forward per sample"]
        for u in self.units:
            flops = sum(op.flops for op in u.ops) / self.batch
            rep = f" x {u.repeat}" if u.repeat > 1 else ""
            lines.append(f"  {u.kind:5s} {u.name or '(root)'}{rep}: {len(u.ops)} ops, "
                         f"{flops / 1e9:.3f} GFLOP/sample each")
        return "\n".join(lines)


def _tensor_dict(t: TensorMeta, src: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"shape": list(t.shape), "dtype": t.dtype}
    if src:
        d["src"] = t.src
    return d


def _op_dict(op: Op) -> dict[str, Any]:
    d: dict[str, Any] = {"name": op.name, "module": op.module, "module_type": op.module_type, "kind": op.kind,
                         "fn": op.fn, "inputs": [_tensor_dict(t) for t in op.inputs],
                         "output": _tensor_dict(op.output, src=False), "flops": op.flops, "bytes": op.bytes,
                         "batched": op.batched}
    if op.params:
        d["params"] = list(op.params)
    if op.attrs:
        d["attrs"] = dict(op.attrs)
    if op.saves:
        d["saves"] = list(op.saves)
    return d


def _unit_dict(u: Unit) -> dict[str, Any]:
    return {"name": u.name, "kind": u.kind, "repeat": u.repeat, "instances": list(u.instances),
            "input_numel": u.input_numel, "output_numel": u.output_numel, "exports": list(u.exports),
            "saved": [{"key": s.key, "numel": s.numel, "dtype": s.dtype, "src": s.src, "batched": s.batched}
                      for s in u.saved],
            "ops": [_op_dict(op) for op in u.ops]}


# ---- reading and validation ----------------------------------------------------------------------------
class _Reader:
    """Typed access to a JSON object with one-line errors naming the file and the field path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str) -> InputError:
        return InputError(f"{self.source}: {where}: {message}")

    def obj(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        return value

    def get(self, obj: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
        if key not in obj:
            if default is ...:
                raise self.fail(where, f"missing field {key!r}")
            return default
        return obj[key]

    def integer(self, value: Any, where: str, minimum: int = 0, maximum: int | None = None) -> int:
        """An int in [minimum, maximum]; without a maximum, at most LIMITS["kernel_dim"] (2^40: a dimension
        of 10^30 printed 1.55e21 s, issue 26)."""
        if maximum is None:
            maximum = LIMITS["kernel_dim"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"{value!r} is not an integer")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise self.fail(where, f"{value} must be {bound}")
        return value

    def number(self, value: Any, where: str, limit: str = "op_flops") -> float:
        """A finite number in [0, FLOAT_LIMITS[limit]] (1e308 FLOPs printed inf, issue 26)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            raise self.fail(where, f"{value!r} is not a finite number >= 0")
        if value > FLOAT_LIMITS[limit]:
            raise self.fail(where, f"{value!r} is above the supported maximum {FLOAT_LIMITS[limit]:g}")
        return float(value)

    def text(self, value: Any, where: str, choices: Sequence[str] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"{value!r} is not a string")
        if choices is not None and value not in choices:
            known = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:6]) + f", ... ({len(choices)} names)"
            raise self.fail(where, f"{value[:40]!r} is not one of {known}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"{value!r} is not true or false")
        return value

    def array(self, value: Any, where: str, limit: int = MAX_OPS) -> list:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {type(value).__name__}")
        if len(value) > limit:
            raise self.fail(where, f"{len(value)} entries, more than the supported {limit}")
        return value

    def shape(self, value: Any, where: str) -> tuple[int, ...]:
        dims = self.array(value, where, MAX_DIMS)
        shape = tuple(self.integer(d, f"{where}[{i}]", 0) for i, d in enumerate(dims))
        if math.prod(shape) > MAX_NUMEL:
            raise self.fail(where, f"{list(shape)} holds more than {MAX_NUMEL} elements")
        return shape


def _tensor(r: _Reader, raw: Any, where: str, n_ops: int | None) -> TensorMeta:
    obj = r.obj(raw, where)
    shape = r.shape(r.get(obj, "shape", where), f"{where}.shape")
    dtype = r.text(r.get(obj, "dtype", where), f"{where}.dtype", TORCH_DTYPES)
    src = SRC_EXTERNAL
    if n_ops is not None:
        src = r.integer(r.get(obj, "src", where), f"{where}.src", SRC_CONST, max(n_ops - 1, SRC_CONST))
    return TensorMeta(shape=shape, dtype=dtype, src=src)


def _op(r: _Reader, raw: Any, where: str, index: int, saved_keys: set[int], params: Mapping) -> Op:
    obj = r.obj(raw, where)
    name = r.text(r.get(obj, "name", where), f"{where}.name")
    where = f"{where} ({name})" if name else where
    kind = r.text(r.get(obj, "kind", where), f"{where}.kind", KINDS)
    inputs = tuple(_tensor(r, t, f"{where}.inputs[{i}]", index)
                   for i, t in enumerate(r.array(r.get(obj, "inputs", where), f"{where}.inputs", 64)))
    for i, t in enumerate(inputs):
        if t.src >= index:
            raise r.fail(f"{where}.inputs[{i}].src", f"{t.src} is not an earlier op of the unit (op {index})")
    op_params = tuple(r.text(p, f"{where}.params[{i}]")
                      for i, p in enumerate(r.array(obj.get("params", []), f"{where}.params", 64)))
    for p in op_params:
        if p not in params:
            raise r.fail(f"{where}.params", f"{p!r} is not in the graph's params")
    attrs = r.obj(obj.get("attrs", {}), f"{where}.attrs")
    saves = tuple(r.integer(k, f"{where}.saves[{i}]")
                  for i, k in enumerate(r.array(obj.get("saves", []), f"{where}.saves", 64)))
    for k in saves:
        if k not in saved_keys:
            raise r.fail(f"{where}.saves", f"key {k} is not a saved tensor of the unit")
    op = Op(name=name, module=r.text(r.get(obj, "module", where), f"{where}.module"),
            module_type=r.text(obj.get("module_type", ""), f"{where}.module_type"), kind=kind,
            fn=r.text(r.get(obj, "fn", where), f"{where}.fn"), inputs=inputs,
            output=_tensor(r, r.get(obj, "output", where), f"{where}.output", None),
            flops=r.number(r.get(obj, "flops", where), f"{where}.flops"),
            bytes=r.number(r.get(obj, "bytes", where), f"{where}.bytes", "op_bytes"), params=op_params,
            batched=r.boolean(obj.get("batched", True), f"{where}.batched"), attrs=dict(attrs), saves=saves)
    _check_attrs(r, op, where)
    return op


_REQUIRED_ATTRS = {
    "linear": ("in_features", "out_features", "tokens"),
    "conv1d": ("in_channels", "out_channels", "kernel", "stride", "padding", "dilation", "groups", "batch",
               "input_spatial", "output_spatial"),
    "matmul": ("batch", "m", "n", "k"),
    "attention": ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal"),
    "norm": ("type",),
    "embedding": ("num_embeddings", "embedding_dim", "tokens"),
}
_REQUIRED_ATTRS["conv2d"] = _REQUIRED_ATTRS["conv3d"] = _REQUIRED_ATTRS["conv1d"]


def _check_attrs(r: _Reader, op: Op, where: str) -> None:
    for key in _REQUIRED_ATTRS.get(op.kind, ()):
        if key not in op.attrs:
            raise r.fail(f"{where}.attrs", f"missing {key!r} (needed by kind {op.kind})")
    a = op.attrs
    if op.kind in CONV_KINDS:
        dims = int(op.kind[4])
        for key in ("kernel", "stride", "padding", "dilation", "input_spatial", "output_spatial"):
            values = r.array(a[key], f"{where}.attrs.{key}", dims)
            if len(values) != dims:
                raise r.fail(f"{where}.attrs.{key}", f"{values} must have {dims} entries ({op.kind})")
            for v in values:
                r.integer(v, f"{where}.attrs.{key}", 0 if key == "padding" else 1)
        groups = r.integer(a["groups"], f"{where}.attrs.groups", 1)
        for key in ("in_channels", "out_channels"):
            if r.integer(a[key], f"{where}.attrs.{key}", 1) % groups:
                raise r.fail(f"{where}.attrs.{key}", f"{a[key]} is not a multiple of groups={groups}")
        r.integer(a["batch"], f"{where}.attrs.batch", 1)
    elif op.kind == "norm":
        r.text(a["type"], f"{where}.attrs.type", NORM_TYPES)
    elif op.kind == "attention":
        for key in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"):
            r.integer(a[key], f"{where}.attrs.{key}", 1)
        r.boolean(a["causal"], f"{where}.attrs.causal")
        if a["heads"] % a["kv_heads"]:
            raise r.fail(f"{where}.attrs.kv_heads", f"{a['kv_heads']} does not divide heads={a['heads']}")
    else:
        for key in _REQUIRED_ATTRS.get(op.kind, ()):
            r.integer(a[key], f"{where}.attrs.{key}", 1)


def _saved(r: _Reader, raw: Any, where: str, n_ops: int) -> SavedTensor:
    obj = r.obj(raw, where)
    return SavedTensor(key=r.integer(r.get(obj, "key", where), f"{where}.key"),
                       numel=r.integer(r.get(obj, "numel", where), f"{where}.numel", 0, MAX_NUMEL),
                       dtype=r.text(r.get(obj, "dtype", where), f"{where}.dtype", tuple(SAVED_DTYPES)),
                       src=r.integer(r.get(obj, "src", where), f"{where}.src", SRC_CONST, max(n_ops - 1, 0)),
                       batched=r.boolean(obj.get("batched", True), f"{where}.batched"))


def _unit(r: _Reader, raw: Any, where: str, params: Mapping) -> Unit:
    obj = r.obj(raw, where)
    name = r.text(r.get(obj, "name", where), f"{where}.name")
    where = f"{where} ({name})" if name else where
    ops_raw = r.array(r.get(obj, "ops", where), f"{where}.ops")
    saved = tuple(_saved(r, s, f"{where}.saved[{i}]", len(ops_raw))
                  for i, s in enumerate(r.array(obj.get("saved", []), f"{where}.saved")))
    keys = {s.key for s in saved}
    if len(keys) != len(saved):
        raise r.fail(f"{where}.saved", "duplicate keys")
    ops = tuple(_op(r, o, f"{where}.ops[{i}]", i, keys, params) for i, o in enumerate(ops_raw))
    if not ops:
        raise r.fail(f"{where}.ops", "a unit needs at least one op")
    repeat = r.integer(r.get(obj, "repeat", where), f"{where}.repeat", 1, 1 << 20)
    instances = tuple(r.text(p, f"{where}.instances[{i}]")
                      for i, p in enumerate(r.array(r.get(obj, "instances", where), f"{where}.instances")))
    if len(instances) != repeat:
        raise r.fail(f"{where}.instances", f"{len(instances)} paths for repeat={repeat}")
    exports = tuple(r.integer(k, f"{where}.exports[{i}]", 0, len(ops) - 1)
                    for i, k in enumerate(r.array(obj.get("exports", []), f"{where}.exports")))
    return Unit(name=name, kind=r.text(r.get(obj, "kind", where), f"{where}.kind", ("block", "glue")), exports=exports,
                repeat=repeat, instances=instances, ops=ops, saved=saved,
                input_numel=r.integer(obj.get("input_numel", 0), f"{where}.input_numel", 0, MAX_NUMEL),
                output_numel=r.integer(obj.get("output_numel", 0), f"{where}.output_numel", 0, MAX_NUMEL))


def opgraph_from_dict(data: Any, source: str = "op graph") -> OpGraph:
    """Validate every field of a parsed ``*.ops.json`` and build the :class:`OpGraph`."""
    r = _Reader(source)
    obj = r.obj(data, "top level")
    fmt = r.get(obj, "format", "top level")
    if fmt != FORMAT:
        raise r.fail("format", f"{fmt!r} is not {FORMAT!r} (not a tpsim op graph)")
    version = r.get(obj, "version", "top level")
    if version != VERSION:
        raise r.fail("version", f"{version!r} is not supported (this tpsim reads version {VERSION})")
    params_raw = r.obj(r.get(obj, "params", "top level"), "params")
    params = {r.text(k, "params"): r.shape(v, f"params.{k}") for k, v in params_raw.items()}
    units = tuple(_unit(r, u, f"units[{i}]", params)
                  for i, u in enumerate(r.array(r.get(obj, "units", "top level"), "units")))
    if not units:
        raise r.fail("units", "the graph has no units")
    names = [op.name for u in units for op in u.ops]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise r.fail("units", f"op name {dup!r} appears twice")
    total_ops = sum(u.repeat * len(u.ops) for u in units)
    if total_ops > MAX_OPS:
        raise r.fail("units", f"{total_ops} ops after expanding repeats, more than the supported {MAX_OPS}")
    inputs = tuple(_tensor(r, t, f"inputs[{i}]", None)
                   for i, t in enumerate(r.array(r.get(obj, "inputs", "top level"), "inputs", 64)))
    if not inputs:
        raise r.fail("inputs", "the graph has no inputs")
    batch = r.integer(r.get(obj, "batch", "top level"), "batch", 1, 1 << 16)
    for i, t in enumerate(inputs):
        if not t.shape or t.shape[0] != batch:
            raise r.fail(f"inputs[{i}].shape", f"{list(t.shape)}: dim 0 must be the batch {batch}")
    return OpGraph(name=r.text(r.get(obj, "name", "top level"), "name"), units=units, params=params,
                   batch=batch, inputs=inputs, dtype=r.text(obj.get("dtype", "float32"), "dtype", TORCH_DTYPES),
                   tokens_per_sample=r.integer(obj.get("tokens_per_sample", 1), "tokens_per_sample", 1, 1 << 24),
                   source=dict(r.obj(obj.get("source", {}), "source")))


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed JSON, stopping at ``limit`` + 1 (iterative: no recursion on hostile input)."""
    stack, deepest = [(value, 1)], 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def parse_opgraph(text: str, source: str = "op graph") -> OpGraph:
    """An op graph from JSON text: bounded and linear before decoding (:mod:`tpsim.boundedjson`), the
    top level checked against its declared schema (:data:`tpsim.schemas.OPGRAPH`), then every op."""
    from ..boundedjson import loads
    from ..schema import check
    from ..schemas import OPGRAPH

    data = loads(text, source)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        check(OPGRAPH, data, source)
    return opgraph_from_dict(data, source)


def load_opgraph(path: str | Path) -> OpGraph:
    """Read and validate a ``*.ops.json`` file (one-line :class:`InputError` naming the file and the field)."""
    from ..io import read_text
    from ..limits import MAX_OPGRAPH_BYTES

    path = Path(path)
    if not path.exists():
        raise InputError(f"op graph {path}: no such file")
    text = read_text(path, "op graph", MAX_OPGRAPH_BYTES)  # a regular file of bounded size, never read whole first
    return parse_opgraph(text, str(path))

