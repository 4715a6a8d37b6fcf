"""Sweep files (``tpsim design SWEEP.yaml``; schema in docs/DESIGN.md): the axes of the cluster designs, the
models with their token budgets, the stack and the objective; expanded into designs and planning tasks.

Every problem is one :class:`~tpsim.errors.InputError` line naming the axis (or key) and the value; the size
of the product is computed from the axis lengths before anything is expanded, so a product of a billion
designs is refused at once (``--allow-large-sweep`` lifts :data:`MAX_DESIGNS`, never :data:`HARD_MAX_DESIGNS`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InputError
from ..limits import HARD_MAX_DESIGNS, MAX_AXIS_VALUES, MAX_DESIGNS, MAX_MODELS  # noqa: F401 (importable here)
from ..schema import Any_, Bool, Enum, Float, Int, List, Map, Schema, Str, register

AXES = ("device", "nvlink_domain", "nics_per_gpu", "nic_gbps", "fabric", "oversubscription", "gpus",
        "gpu_hour_price", "power_w")
"""the axes of a design, in table order."""
PLANNING_AXES = AXES[:7]
"""the axes the best plan depends on (price and power only scale the cost and energy of a plan)."""
FABRICS = ("rail_optimized", "fat_tree", "torus")
NIC_GBPS = {200: ("hdr-nic", "hdr-switch", 40), 400: ("ndr-nic", "ndr-switch", 64),
            800: ("xdr-nic", "xdr-switch", 144)}
"""NIC line rate (Gb/s) -> (NIC link kind, switch link kind, switch radix) of topologies/links.yaml:
InfiniBand HDR (Quantum QM8700, 40 ports), NDR (Quantum-2 QM9700, 64 ports), XDR (Quantum-X800 Q3400, 144)."""
NVLINK_DOMAINS = (8, 36, 72)
OBJECTIVES = ("throughput", "time", "cost")
TOP_KEYS = ("name", "description", "axes", "models", "family", "stack", "dtype", "objective", "skip_impossible",
            "source", "note")
MODEL_KEYS = ("model", "tokens", "global_batch", "seq_len", "name")
FAMILY_KEYS = ("model", "scale", "global_batch", "tokens")
SECONDS_PER_TASK = 0.7
"""cold planning time of one task (one cluster x one model, Llama-3-70B's full plan space on one core of the
2-core reference machine: 0.7-0.9 s, benchmarks/bench_design.py) for the size estimate printed first."""


def _sweep_schema() -> Schema:
    from ..hardware import DTYPES

    optional = (None,)
    return Schema("sweep", {
        "name": Str(max_len=128), "description": Str(), "source": Any_(), "note": Any_(),
        "axes": Map(Schema("sweep axes", {
            axis: Any_(required=axis in ("device", "gpus"), doc="a value, a list, or a range {from, to, step|factor} "
                                                                "(tpsim/design/sweep.py checks each value)")
            for axis in AXES}, doc="other keys: refused by the reader, naming the axes"), required=True),
        "models": List(Any_(doc="a preset name or {model, tokens, global_batch, seq_len, name}"), max_len=MAX_MODELS,
                       required=True),
        "family": Map(Schema("sweep family", {
            "model": Str(max_len=4096, required=True),
            "scale": List(Float(minimum=0.01, inclusive=True, maximum=1e4), max_len=32),
            "global_batch": Int("global_batch", also=optional), "tokens": Any_(),
        }, extra="refuse"), also=optional),
        "stack": Str(max_len=4096), "dtype": Enum(*DTYPES), "objective": Enum(*OBJECTIVES),
        "skip_impossible": Bool(),
    }, extra="refuse", doc="a tpsim design sweep file (docs/DESIGN.md; expanded by tpsim/design/sweep.py)")


SWEEP = register(_sweep_schema())
"""the declared schema of a sweep file (tpsim.schema.SCHEMA_MODULES lists this module)."""


@dataclass(frozen=True)
class ModelEntry:
    ref: str
    """preset name or config.json path."""
    name: str
    tokens: float
    """training-token budget (time and cost for the budget)."""
    global_batch: int | None
    """sequences per step (None: the model preset's)."""
    seq_len: int | None


@dataclass(frozen=True)
class Family:
    """The largest trainable model of a family: the base model scaled by each ``scale`` (dense: hidden and ffn
    width by sqrt(scale), so parameters grow about linearly; mixture of experts: the number of experts)."""

    ref: str
    scales: tuple[float, ...]
    global_batch: int | None


@dataclass(frozen=True)
class Sweep:
    path: Path | None
    name: str
    axes: Mapping[str, tuple[Any, ...]]
    models: tuple[ModelEntry, ...]
    family: Family | None
    stack: str
    dtype: str
    objective: str
    skip_impossible: bool
    raw_sha: str
    """sha256 of the canonical JSON of the parsed sweep: a results folder belongs to one sweep."""
    size: int = 0
    """designs of the product (before impossible combinations are dropped)."""
    dropped: int = 0
    """impossible combinations left out (``skip_impossible: true``)."""
    designs: tuple["Design", ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Design:
    """One design: a value of every axis, and the model it trains."""

    id: str
    values: Mapping[str, Any]
    model: int
    """index into :attr:`Sweep.models`."""

    def planning_key(self) -> tuple:
        return tuple(self.values[a] for a in PLANNING_AXES) + (self.model,)


def _where(path: Path | None) -> str:
    return str(path) if path is not None else "sweep"


def _expand_axis(name: str, raw: Any, where: str) -> tuple[Any, ...]:
    """A list, a single value, or a range {from, to, step} / {from, to, factor}."""
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - {"from", "to", "step", "factor"})
        if unknown:
            raise InputError(f"{where}: axes.{name}: unknown range key {unknown[0]!r} (from, to, step or factor)")
        if "from" not in raw or "to" not in raw or ("step" in raw) == ("factor" in raw):
            raise InputError(f"{where}: axes.{name}={raw!r}: a range needs from, to and one of step, factor")
        lo, hi = raw["from"], raw["to"]
        for key, v in (("from", lo), ("to", hi), ("step", raw.get("step", 1)), ("factor", raw.get("factor", 2))):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InputError(f"{where}: axes.{name}.{key}={v!r} must be a positive number")
        if hi < lo:
            raise InputError(f"{where}: axes.{name}: to={hi!r} is below from={lo!r}")
        if "step" in raw:
            count = int((hi - lo) // raw["step"]) + 1
            if count > MAX_AXIS_VALUES:
                raise InputError(f"{where}: axes.{name} has {count} values, above {MAX_AXIS_VALUES}")
            values = [lo + i * raw["step"] for i in range(count)]
        else:
            if raw["factor"] <= 1:
                raise InputError(f"{where}: axes.{name}.factor={raw['factor']!r} must be above 1")
            count = int(math.floor(math.log(hi / lo) / math.log(raw["factor"]) + 1e-9)) + 1
            if count > MAX_AXIS_VALUES:
                raise InputError(f"{where}: axes.{name} has {count} values, above {MAX_AXIS_VALUES}")
            values = [lo * raw["factor"] ** i for i in range(count)]
        return tuple(int(round(v)) if float(v).is_integer() or isinstance(lo, int) else float(v) for v in values)
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise InputError(f"{where}: axes.{name} is empty: give at least one value")
    if len(values) > MAX_AXIS_VALUES:
        raise InputError(f"{where}: axes.{name} has {len(values)} values, above {MAX_AXIS_VALUES}")
    if len(set(map(repr, values))) != len(values):
        raise InputError(f"{where}: axes.{name} repeats a value")
    return tuple(values)


def _number(where: str, name: str, value: Any, *, low: float, high: float, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: axes.{name}={value!r} must be a number")
    if not low <= value <= high:
        raise InputError(f"{where}: axes.{name}={value!r} must be between {low:g} and {high:g}")
    if integer and value != int(value):
        raise InputError(f"{where}: axes.{name}={value!r} must be an integer")
    return int(value) if integer else float(value)


def _check_axis(name: str, values: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    from ..hardware import device_names, get_device

    out = []
    for v in values:
        if name == "device":
            if not isinstance(v, str):
                raise InputError(f"{where}: axes.device={v!r} must be a device name")
            try:
                out.append(get_device(v).name)
            except InputError:
                raise InputError(f"{where}: axes.device={v!r} is unknown (known: {', '.join(device_names())})") \
                    from None
        elif name == "nvlink_domain":
            n = _number(where, name, v, low=1, high=72, integer=True)
            if n not in NVLINK_DOMAINS:
                raise InputError(f"{where}: axes.nvlink_domain={v!r} is not one of "
                                 f"{', '.join(map(str, NVLINK_DOMAINS))}")
            out.append(n)
        elif name == "nics_per_gpu":
            x = _number(where, name, v, low=0.125, high=4)
            if x not in (0.125, 0.25, 0.5, 1, 2, 4):
                raise InputError(f"{where}: axes.nics_per_gpu={v!r} is not one of 0.125, 0.25, 0.5, 1, 2, 4")
            out.append(int(x) if x >= 1 else x)
        elif name == "nic_gbps":
            n = _number(where, name, v, low=1, high=1e5, integer=True)
            if n not in NIC_GBPS:
                raise InputError(f"{where}: axes.nic_gbps={v!r} is not one of {', '.join(map(str, NIC_GBPS))} "
                                 f"(InfiniBand HDR, NDR, XDR)")
            out.append(n)
        elif name == "fabric":
            if v not in FABRICS:
                raise InputError(f"{where}: axes.fabric={v!r} is not one of {', '.join(FABRICS)}")
            out.append(v)
        elif name == "oversubscription":
            out.append(_number(where, name, v, low=1, high=64))
        elif name == "gpus":
            out.append(_number(where, name, v, low=1, high=1 << 20, integer=True))
        elif name == "gpu_hour_price":
            out.append(_number(where, name, v, low=0.0, high=1e4))
        elif name == "power_w":
            out.append(_number(where, name, v, low=1, high=1e5))
    return tuple(out)


def _model_entry(i: int, raw: Any, where: str) -> ModelEntry:
    w = f"{where}: models[{i}]"
    if isinstance(raw, str):
        raw = {"model": raw}
    if not isinstance(raw, Mapping):
        raise InputError(f"{w} must be a model name or a mapping (model, tokens, global_batch)")
    unknown = sorted(set(raw) - set(MODEL_KEYS))
    if unknown:
        raise InputError(f"{w}: unknown key {unknown[0]!r} (known: {', '.join(MODEL_KEYS)})")
    ref = raw.get("model")
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(f"{w}: model={ref!r} must be a preset name or a config.json path")
    if ref.endswith(".ops.json"):
        raise InputError(f"{w}: model={ref!r}: traced op graphs are not swept yet (tpsim plan takes them); "
                         f"use a preset or a config.json")
    tokens = raw.get("tokens", 1e12)
    if isinstance(tokens, str):
        try:
            tokens = float(tokens)
        except ValueError:
            raise InputError(f"{w}: tokens={tokens!r} must be a number of tokens") from None
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not math.isfinite(tokens) \
            or not 1 <= tokens <= 1e18:
        raise InputError(f"{w}: tokens={tokens!r} must be a number of tokens between 1 and 1e18")
    gb = raw.get("global_batch")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, int) or not 1 <= gb <= 1 << 24):
        raise InputError(f"{w}: global_batch={gb!r} must be a positive integer")
    seq = raw.get("seq_len")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= 1 << 22):
        raise InputError(f"{w}: seq_len={seq!r} must be a positive integer")
    name = raw.get("name", ref)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{w}: name={name!r} must be a text")
    return ModelEntry(ref=ref, name=name, tokens=float(tokens), global_batch=gb, seq_len=seq)


def _family(raw: Any, where: str) -> Family | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: family must be a mapping (model, scale, global_batch)")
    unknown = sorted(set(raw) - set(FAMILY_KEYS))
    if unknown:
        raise InputError(f"{where}: family: unknown key {unknown[0]!r} (known: {', '.join(FAMILY_KEYS)})")
    ref = raw.get("model")
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(f"{where}: family.model={ref!r} must be a preset name or a config.json path")
    scales = raw.get("scale", [1, 2, 4, 8])
    if not isinstance(scales, list) or not scales or len(scales) > 32:
        raise InputError(f"{where}: family.scale={scales!r} must be a list of 1 to 32 size factors")
    for s in scales:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0.01 <= s <= 1e4:
            raise InputError(f"{where}: family.scale has {s!r}: each factor must be between 0.01 and 10000")
    gb = raw.get("global_batch")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, int) or gb < 1):
        raise InputError(f"{where}: family.global_batch={gb!r} must be a positive integer")
    return Family(ref=ref, scales=tuple(sorted(float(s) for s in scales)), global_batch=gb)


def impossible(values: Mapping[str, Any]) -> str | None:
    """Why a combination of axis values cannot be built (naming the axes), or None."""
    from ..hardware import get_device

    device = get_device(values["device"])
    arch = device.architecture
    domain, fabric, gpus = values["nvlink_domain"], values["fabric"], values["gpus"]
    if (arch == "tpu") != (fabric == "torus"):
        return (f"axes.fabric={fabric} with axes.device={device.name}: TPU chips are joined by their ICI torus, "
                f"GPUs by a switched fabric (fat_tree or rail_optimized)")
    if arch == "tpu":
        if device.name not in ("TPU-v4", "TPU-v5p"):
            return (f"axes.device={device.name}: designs build 3D TPU tori (TPU-v4, TPU-v5p); the 2D torus of "
                    f"{device.name} is not built yet")
        if domain != 8 or values["nics_per_gpu"] != 1 or values["oversubscription"] != 1:
            return (f"axes.nvlink_domain / nics_per_gpu / oversubscription with axes.device={device.name}: a TPU "
                    f"torus has no NVLink domain, NICs or leaf oversubscription (use 8, 1, 1)")
    elif arch not in ("ampere", "hopper", "blackwell"):
        return (f"axes.device={device.name}: no NVLink node template for architecture {arch} "
                f"(designs build ampere, hopper and blackwell GPUs and TPU tori)")
    elif (domain > 8) != device.name.startswith("GB"):
        return (f"axes.nvlink_domain={domain} with axes.device={device.name}: NVL36/NVL72 racks hold Grace-"
                f"Blackwell GPUs (GB200, GB300), 8-GPU nodes the others")
    if arch != "tpu" and (domain * values["nics_per_gpu"]) % 1:
        return f"axes.nics_per_gpu={values['nics_per_gpu']} with axes.nvlink_domain={domain}: not a whole number of NICs"
    per_node = 4 if arch == "tpu" else domain
    if gpus % per_node:
        return (f"axes.gpus={gpus} with axes.nvlink_domain={domain}: not a whole number of "
                f"{'hosts of 4 chips' if arch == 'tpu' else f'{domain}-GPU nodes'}")
    return None


def design_id(values: Mapping[str, Any], model: str) -> str:
    """A stable short id of a design (its axis values and model): the same design has the same id in every
    sweep and across resumed runs."""
    text = json.dumps({"values": {k: values[k] for k in AXES}, "model": model}, sort_keys=True, default=str)
    return "d" + hashlib.sha1(text.encode()).hexdigest()[:10]


def sweep_size(path: str | Path) -> tuple[int, int]:
    """(designs, planning tasks) of the sweep file's product (axis lengths x models), from the axes alone: what
    ``tpsim design`` would expand and plan (tpsim/work.py checks them before anything is loaded)."""
    from ..safeyaml import read_yaml
    from ..schema import check

    p = Path(path)
    data = read_yaml(p, "sweep file")
    check(SWEEP, data, str(p))
    axes = data["axes"]
    lengths = {a: len(_expand_axis(a, axes[a], str(p))) for a in AXES if a in axes}
    models = len(data["models"])
    return math.prod(lengths.values()) * models, math.prod(lengths.get(a, 1) for a in PLANNING_AXES) * models


def load_sweep(path: str | Path | None = None, data: Mapping[str, Any] | None = None, *,
               allow_large: bool = False) -> Sweep:
    """Parse and expand a sweep file (or an already parsed mapping)."""
    from ..hardware import DTYPES, get_device
    from ..safeyaml import read_yaml
    from ..search.planner import DEFAULT_GPU_HOUR_PRICE

    p = Path(path) if path is not None else None
    where = _where(p)
    if data is None:
        if p is None:
            raise InputError("design: a sweep file is needed")
        data = read_yaml(p, "sweep file")
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: a sweep file is a mapping (axes, models, stack, objective)")
    from ..schema import check

    check(SWEEP, data, where)  # types, enums and sizes of every key before any of it is used (issue 26)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(TOP_KEYS)})")
    axes_raw = data.get("axes")
    if not isinstance(axes_raw, Mapping) or not axes_raw:
        raise InputError(f"{where}: axes must be a mapping of axis -> values (at least device and gpus)")
    bad = sorted(set(axes_raw) - set(AXES))
    if bad:
        raise InputError(f"{where}: axes.{bad[0]} is not an axis (known: {', '.join(AXES)})")
    for required in ("device", "gpus"):
        if required not in axes_raw:
            raise InputError(f"{where}: axes.{required} is missing")
    defaults = {"nvlink_domain": [8], "nics_per_gpu": [1], "nic_gbps": [400], "fabric": ["rail_optimized"],
                "oversubscription": [1], "gpu_hour_price": [DEFAULT_GPU_HOUR_PRICE], "power_w": [None]}
    axes: dict[str, tuple[Any, ...]] = {}
    for name in AXES:
        if name in axes_raw:
            axes[name] = _check_axis(name, _expand_axis(name, axes_raw[name], where), where)
        else:
            axes[name] = tuple(defaults[name])
    if "fabric" not in axes_raw and all(get_device(d).architecture == "tpu" for d in axes["device"]):
        axes["fabric"] = ("torus",)
    models_raw = data.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise InputError(f"{where}: models must be a non-empty list (preset names or {{model, tokens}})")
    if len(models_raw) > MAX_MODELS:
        raise InputError(f"{where}: models has {len(models_raw)} entries, above {MAX_MODELS}")
    models = tuple(_model_entry(i, m, where) for i, m in enumerate(models_raw))
    for m in models:   # unknown presets and bad config files: one line naming the entry
        _load_model(m, where)
    family = _family(data.get("family"), where)
    stack = data.get("stack", "megatron")
    if not isinstance(stack, str) or not stack.strip():
        raise InputError(f"{where}: stack={stack!r} must be a stack name or path")
    from ..stacks import load_stack
    try:
        load_stack(stack)
    except InputError as exc:
        raise InputError(f"{where}: stack: {exc}") from None
    dtype = data.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise InputError(f"{where}: dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    objective = data.get("objective", "throughput")
    if objective not in OBJECTIVES:
        raise InputError(f"{where}: objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
    skip = data.get("skip_impossible", False)
    if not isinstance(skip, bool):
        raise InputError(f"{where}: skip_impossible={skip!r} must be true or false")
    for d in axes["device"]:
        if dtype not in get_device(d).peak_flops:
            msg = f"{where}: dtype={dtype} with axes.device={d}: the device has no {dtype} figure"
            if not skip:
                raise InputError(msg)
    size = math.prod(len(v) for v in axes.values()) * len(models)
    if size > HARD_MAX_DESIGNS:
        raise InputError(f"{where}: the axes make {size:,} designs, above the hard limit of {HARD_MAX_DESIGNS:,}: "
                         f"narrow an axis (largest: axes.{max(axes, key=lambda a: len(axes[a]))} with "
                         f"{max(len(v) for v in axes.values())} values)")
    if size > MAX_DESIGNS and not allow_large:
        tasks = math.prod(len(axes[a]) for a in PLANNING_AXES) * len(models)
        raise InputError(f"{where}: the axes make {size:,} designs ({tasks:,} planning tasks, about "
                         f"{_duration(tasks * SECONDS_PER_TASK)} on one core): above {MAX_DESIGNS:,}, pass "
                         f"--allow-large-sweep to run it")
    canonical = json.dumps({"axes": {k: list(v) for k, v in axes.items()},
                            "models": [m.__dict__ for m in models],
                            "family": None if family is None else family.__dict__,
                            "stack": stack, "dtype": dtype}, sort_keys=True, default=str)
    designs, dropped, first_problem = [], 0, None
    for combo in itertools.product(*(axes[a] for a in AXES)):
        values = dict(zip(AXES, combo))
        if values["power_w"] is None:
            values["power_w"] = get_device(values["device"]).power_limit_w
        problem = impossible(values) or (None if dtype in get_device(values["device"]).peak_flops else
                                         f"dtype={dtype} with axes.device={values['device']}: no {dtype} figure")
        if problem:
            if not skip:
                raise InputError(f"{where}: {problem} (set skip_impossible: true to leave such combinations out)")
            dropped += len(models)
            first_problem = first_problem or problem
            continue
        for i, m in enumerate(models):
            designs.append(Design(id=design_id(values, m.name), values=values, model=i))
    if not designs:
        raise InputError(f"{where}: every combination of the axes is impossible ({first_problem})")
    return Sweep(path=p, name=str(data.get("name", p.stem if p else "sweep")), axes=axes, models=models,
                 family=family, stack=stack, dtype=dtype, objective=objective, skip_impossible=skip,
                 raw_sha=hashlib.sha256(canonical.encode()).hexdigest(), size=size, dropped=dropped,
                 designs=tuple(designs))


def _load_model(entry: ModelEntry, where: str):
    from ..model import load_model, require_modelled, with_overrides

    try:
        spec = load_model(entry.ref)
        spec = with_overrides(spec, seq_len=entry.seq_len)
        require_modelled(spec)
    except InputError as exc:
        raise InputError(f"{where}: models: {entry.ref}: {exc}") from None
    return spec


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def planning_tasks(sweep: Sweep) -> dict[tuple, list[Design]]:
    """Designs grouped by what their best plan depends on (:data:`PLANNING_AXES` and the model), in a stable
    order that keeps designs of one cluster together (they share its collective curves in a worker)."""
    groups: dict[tuple, list[Design]] = {}
    for d in sweep.designs:
        groups.setdefault(d.planning_key(), []).append(d)
    order = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    return {k: groups[k] for k in order}


def task_id(key: Sequence[Any], sweep: Sweep) -> str:
    """Stable id of a planning task (its key, the model entry, the stack, dtype and family)."""
    model = sweep.models[key[-1]]
    text = json.dumps({"key": list(key[:-1]), "model": model.__dict__, "stack": sweep.stack, "dtype": sweep.dtype,
                       "family": None if sweep.family is None else sweep.family.__dict__},
                      sort_keys=True, default=str)
    return "t" + hashlib.sha1(text.encode()).hexdigest()[:12]
