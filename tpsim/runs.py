"""Measured training runs: the runs CSV (docs/RUNS.md, docs/SCHEMAS.md "Third wave" T4) and its loader.

One measured run per line: the model (preset, config.json or ops.json, with shape overrides), the cluster
(name or YAML path), the GPU count, the training stack, every plan field, and the measurement (a step time, or a
throughput, or model TFLOP/s per GPU under a named FLOP convention), converted here to a step time in seconds:
the one conversion every reader (``calibrate --from-runs``, the residual bands, ``report --runs``,
``benchmarks/accuracy_runs.py``) uses.

Bad input is one line naming the file, the row (its line number), the run and the field: :class:`InputError`
(exit status 2 from the CLI).
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError
from .hardware import DATA_DIR
from .model import ModelSpec
from .plan import Plan, parse_layout

RUNS_DIR = DATA_DIR / "runs"
"""shipped runs files: ``development.csv`` (the published development set) and ``sc21.csv`` (SC21 Table 1)."""
DEVELOPMENT_CSV = RUNS_DIR / "development.csv"
SC21_CSV = RUNS_DIR / "sc21.csv"

MAX_RUNS_BYTES = 8 << 20
"""a runs file above this size is refused before it is read (100k runs of a few hundred bytes fit)."""
MAX_RUNS = 20_000
"""runs per file (a fit of 100 runs takes seconds; tens of thousands is a mistake, not a data set)."""
MAX_CELL = 4096
"""characters per cell (notes and sources included)."""

REQUIRED = ("run_id", "model", "cluster", "gpus")
MODEL_OVERRIDES = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "experts", "top_k")
INT_PLAN = ("tp", "cp", "pp", "vpp", "pp_first", "pp_last", "zero", "micro_batch", "global_batch", "ep", "etp",
            "dp")
BOOL_PLAN = ("sp", "pp_embedding", "pp_loss", "tp_overlap", "overlap")
STR_PLAN = ("cp_kind", "schedule", "recompute", "dtype", "order", "attention")
PLAN_COLUMNS = ("tp", "cp", "cp_kind", "pp", "vpp", "schedule", "pp_first", "pp_last", "pp_embedding", "pp_loss",
                "pp_layout", "zero", "sp", "recompute", "micro_batch", "global_batch", "dtype", "ep", "etp", "tp_overlap",
                "overlap", "order", "attention", "dp")
MEASUREMENTS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")
"""what a row may measure, in the order the loader takes the first one given (the others are kept)."""
OPTIONAL = ("stack", "moe_balance", "flops_convention", "peak_memory_gib", "source", "notes")
COLUMNS = REQUIRED + MODEL_OVERRIDES + ("moe_balance", "stack") + PLAN_COLUMNS + MEASUREMENTS + (
    "flops_convention", "peak_memory_gib", "source", "notes")
"""every column a runs CSV may have (docs/RUNS.md); any other column is refused (a typo would be lost)."""

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


@dataclass(frozen=True, kw_only=True)
class Run:
    """One measured run, validated (docs/SCHEMAS.md T4)."""

    run_id: str
    model: ModelSpec
    """the model with the row's overrides applied."""
    model_ref: str
    """the ``model`` cell as written (preset name or path)."""
    overrides: Mapping[str, int]
    """the row's model overrides (the CLI flags' names)."""
    cluster: str
    """cluster name or the resolved YAML path."""
    gpus: int
    stack: str
    """stack profile name or path."""
    plan: Plan
    measured: float
    """measured step time, seconds (converted from ``measured_as``)."""
    measured_as: str
    """the column the step time was converted from (one of :data:`MEASUREMENTS`)."""
    measured_value: float
    """that column's value as written."""
    flops_convention: str | None = None
    peak_memory_gib: float | None = None
    source: str = ""
    notes: str = ""
    row: int = 0
    """line number in the file (the header is line 1 unless comments precede it)."""
    path: str = ""
    """the file the run came from."""
    extra: Mapping[str, float] = field(default_factory=dict)
    """the other measurement columns of the row, as written."""

    @property
    def tokens_per_step(self) -> int:
        return self.plan.global_batch * self.model.seq_len

    @property
    def where(self) -> str:
        return f"{self.path}: row {self.row} ({self.run_id})"

    def load_cluster(self, calibration: Any = None):
        from .topology import load_cluster

        return load_cluster(self.cluster, gpus=self.gpus, calibration=calibration)

    @property
    def device(self) -> str:
        """The cluster's device name."""
        return self.load_cluster().device.name

    def key(self) -> tuple:
        """What makes two rows the same run (model, cluster, GPUs, stack, plan, measurement)."""
        return (self.model_ref, tuple(sorted(self.overrides.items())), self.cluster, self.gpus, stack_key(self.stack),
                tuple(sorted(self.plan.to_dict().items())), self.measured_as, self.measured_value)


def step_time_from(measured_as: str, value: float, *, model: ModelSpec, plan: Plan, gpus: int,
                   flops_convention: str | None = None) -> float:
    """A measurement converted to the step time in seconds: the one conversion (docs/RUNS.md).

    * ``step_time_s``: as is;
    * ``tokens_per_s``: global batch x sequence / tokens per second;
    * ``tokens_per_s_per_gpu``: global batch x sequence / (tokens per second per GPU x GPUs);
    * ``model_tflops_per_gpu``: global batch x model FLOPs per sequence (under ``flops_convention``, T5) /
      (TFLOP/s x 1e12 x GPUs)."""
    tokens = float(plan.global_batch) * float(model.seq_len)
    if measured_as == "step_time_s":
        return float(value)
    if measured_as == "tokens_per_s":
        return tokens / value
    if measured_as == "tokens_per_s_per_gpu":
        return tokens / (value * gpus)
    if measured_as == "model_tflops_per_gpu":
        from .estimator.flops import FLOPS_CONVENTIONS, model_flops_per_sequence_as

        if flops_convention not in FLOPS_CONVENTIONS:
            raise InputError(f"flops_convention={flops_convention!r} is not one of {', '.join(FLOPS_CONVENTIONS)}")
        flops = float(plan.global_batch) * model_flops_per_sequence_as(model, flops_convention)
        return flops / (value * 1e12 * gpus)
    raise InputError(f"measurement {measured_as!r} is not one of {', '.join(MEASUREMENTS)}")


def load_runs(path: str | Path, *, check_stack: bool = True) -> list[Run]:
    """Read and validate a runs CSV (docs/RUNS.md). Every error is one :class:`InputError` line naming the
    file, the row and the field. ``check_stack``: refuse a plan the row's stack cannot run (the estimator's
    rule, named); the development-set test reads with it off to mark such rows."""
    p = Path(path).expanduser()
    text = _read_text(p)
    return parse_runs(text, p, check_stack=check_stack)


def _read_text(p: Path) -> str:
    if not p.exists():
        raise InputError(f"runs file {p} does not exist")
    if not p.is_file():
        raise InputError(f"runs file {p}: not a regular file")
    size = p.stat().st_size
    if size > MAX_RUNS_BYTES:
        raise InputError(f"runs file {p}: {size} bytes is above the limit of {MAX_RUNS_BYTES} bytes")
    with open(p, "rb") as fh:
        raw = fh.read(MAX_RUNS_BYTES + 1)
    if len(raw) > MAX_RUNS_BYTES:
        raise InputError(f"runs file {p}: above the limit of {MAX_RUNS_BYTES} bytes")
    if b"\x00" in raw:
        raise InputError(f"runs file {p}: binary data (a NUL byte), not a CSV")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"runs file {p}: not UTF-8 (byte {exc.start})") from None


def parse_runs(text: str, path: str | Path = "<runs>", *, check_stack: bool = True) -> list[Run]:
    """:func:`load_runs` of text already read (``path`` names it in errors; relative model and cluster paths
    resolve against its folder)."""
    p = Path(path)
    reader = csv.reader(io.StringIO(text), strict=True)
    header: list[str] | None = None
    runs: list[Run] = []
    ids: dict[str, int] = {}
    keys: dict[tuple, int] = {}
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if cells[0].lstrip().startswith("#"):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                _check_header(header, p)
                continue
            if len(runs) >= MAX_RUNS:
                raise InputError(f"{p}: more than {MAX_RUNS} runs (the limit per file)")
            if len(cells) != len(header):
                raise InputError(f"{p}: row {line}: {len(cells)} cells, the header has {len(header)}")
            for name, cell in zip(header, cells):
                if len(cell) > MAX_CELL:
                    raise InputError(f"{p}: row {line}: {name} is {len(cell)} characters (limit {MAX_CELL})")
            row = {k: v.strip() for k, v in zip(header, cells)}
            run = _run(row, line, p, check_stack)
            if run.run_id in ids:
                raise InputError(f"{p}: row {line}: run_id={run.run_id!r} repeats row {ids[run.run_id]}")
            ids[run.run_id] = line
            key = run.key()
            if key in keys:
                raise InputError(f"{p}: row {line} ({run.run_id}): the same run as row {keys[key]} (model, cluster, "
                                 "gpus, stack, plan and measurement all equal)")
            keys[key] = line
            runs.append(run)
    except csv.Error as exc:
        raise InputError(f"{p}: row {reader.line_num}: not valid CSV ({exc})") from None
    if header is None:
        raise InputError(f"{p}: no header row (columns: {', '.join(REQUIRED)}, ...; docs/RUNS.md)")
    if not runs:
        raise InputError(f"{p}: no runs (a header and no rows)")
    return runs


def _check_header(header: list[str], p: Path) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise InputError(f"{p}: column {name!r} appears twice in the header")
        seen.add(name)
        if name not in COLUMNS:
            from difflib import get_close_matches

            near = get_close_matches(name, COLUMNS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise InputError(f"{p}: unknown column {name!r}{hint}; columns are listed in docs/RUNS.md")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{p}: missing column(s) {', '.join(missing)} (required: {', '.join(REQUIRED)})")
    if not any(m in header for m in MEASUREMENTS):
        raise InputError(f"{p}: no measurement column (one of {', '.join(MEASUREMENTS)})")


def _int(value: str, where: str, name: str, minimum: int = 1) -> int:
    from .limits import LIMITS

    text = value.strip()
    if not text.lstrip("+").isdigit():
        raise InputError(f"{where}: {name}={value!r} must be {'a positive' if minimum >= 1 else 'a whole'} integer")
    if len(text) > 12:
        raise InputError(f"{where}: {name}={value!r} is above the supported maximum")
    number = int(text)
    limit = LIMITS.get({"pp_first": "pp_layers", "pp_last": "pp_layers", "layers": "num_layers",
                        "hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_kv_heads",
                        "ffn": "ffn_hidden_size", "vocab": "vocab_size", "experts": "num_experts",
                        "top_k": "experts_per_token", "etp": "tp"}.get(name, name))
    if number < minimum:
        raise InputError(f"{where}: {name}={number} must be >= {minimum}")
    if limit is not None and number > limit:
        raise InputError(f"{where}: {name}={number} is above the supported maximum {limit}")
    return number


def _float(value: str, where: str, name: str) -> float:
    try:
        number = float(value) if len(value) <= 64 else math.inf
    except ValueError:
        raise InputError(f"{where}: {name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"{where}: {name}={value!r} must be a finite number")
    if number <= 0:
        raise InputError(f"{where}: {name}={value!r} must be positive")
    if number < 1e-15:  # 1e-300 s overflowed the fit's ratios into a NaN factor
        raise InputError(f"{where}: {name}={value!r} is below the supported minimum 1e-15")
    if number > 1e15:
        raise InputError(f"{where}: {name}={value!r} is above the supported maximum 1e15")
    return number


def _bool(value: str, where: str, name: str) -> bool:
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InputError(f"{where}: {name}={value!r} must be true or false")


def _resolve_path(ref: str, base: Path) -> str:
    """A cell naming a file: relative to the runs file's folder when it exists there."""
    if ("/" in ref or ref.endswith((".yaml", ".yml", ".json"))) and not Path(ref).is_absolute():
        candidate = base.parent / ref
        if candidate.exists():
            return str(candidate.resolve())
    return ref


def _run(row: Mapping[str, str], line: int, p: Path, check_stack: bool) -> Run:
    from .model import load_model, require_modelled, with_overrides
    from .plan import make_plan

    run_id = row.get("run_id", "")
    if not run_id:
        raise InputError(f"{p}: row {line}: run_id is empty")
    where = f"{p}: row {line} ({run_id})"
    for name in REQUIRED:
        if not row.get(name):
            raise InputError(f"{where}: {name} is empty")
    from .schema import check, typed_cells
    from .schemas import RUNS_ROW

    check(RUNS_ROW, typed_cells(RUNS_ROW, row), where)  # the declared schema, before any use (issue 26)
    try:
        model_ref = _resolve_path(row["model"], p)
        overrides = {k: _int(row[k], where, k) for k in MODEL_OVERRIDES if row.get(k)}
        from .io import is_opgraph_path

        traced = is_opgraph_path(model_ref)
        gpus = _int(row["gpus"], where, "gpus")
        if traced:  # a traced graph (tpsim trace), read as `tpsim estimate --model X.ops.json` reads it
            model = _graph_model(row, model_ref, p, overrides, gpus)
        else:
            model = load_model(model_ref)
            model = with_overrides(model, **overrides)
            require_modelled(model)
        if row.get("moe_balance"):
            model = _moe_balance(model, row["moe_balance"], where)
        cluster = _resolve_path(row["cluster"], p)
        stack = _resolve_path(row.get("stack") or model.default_plan.get("stack") or "megatron", p)
        fields: dict[str, Any] = {}
        for name in INT_PLAN:
            if row.get(name):
                fields[name] = _int(row[name], where, name, minimum=0 if name in ("pp_first", "pp_last", "zero",
                                                                                    "etp") else 1)
        for name in BOOL_PLAN:
            if row.get(name):
                fields[name] = _bool(row[name], where, name)
        for name in STR_PLAN:
            if row.get(name):
                fields[name] = row[name]
        if row.get("pp_layout"):
            fields["pp_layout"] = parse_layout(row["pp_layout"], f"{where}: pp_layout")
        dp = fields.pop("dp", None)
        gbs = fields.pop("global_batch", None)
        # a runs file states its plan: what it leaves out takes the Plan defaults, not the preset's plan
        if traced:
            plan = _graph_plan(model, gpus, gbs, fields)
        else:
            plan = make_plan(dataclass_defaults_model(model), gpus, global_batch=gbs, **fields)
        if dp is not None and dp != plan.dp:
            raise InputError(f"{where}: dp={dp} disagrees with gpus / (tp x cp x pp) = {plan.dp}")
        measured_as = next((m for m in MEASUREMENTS if row.get(m)), None)
        if measured_as is None:
            raise InputError(f"{where}: no measurement (one of {', '.join(MEASUREMENTS)} must be given)")
        values = {m: _float(row[m], where, m) for m in MEASUREMENTS if row.get(m)}
        convention = row.get("flops_convention") or None
        if "model_tflops_per_gpu" in values:
            from .estimator.flops import FLOPS_CONVENTIONS

            if convention is None:
                raise InputError(f"{where}: flops_convention is empty (model_tflops_per_gpu needs one of "
                                 f"{', '.join(FLOPS_CONVENTIONS)})")
            if convention not in FLOPS_CONVENTIONS:
                raise InputError(f"{where}: flops_convention={convention!r} is not one of "
                                 f"{', '.join(FLOPS_CONVENTIONS)}")
        measured = step_time_from(measured_as, values[measured_as], model=model, plan=plan, gpus=gpus,
                                  flops_convention=convention)
        if not math.isfinite(measured) or measured <= 0 or measured > 1e7:
            raise InputError(f"{where}: {measured_as}={values[measured_as]!r} gives a step time of {measured!r} s")
        memory = _float(row["peak_memory_gib"], where, "peak_memory_gib") if row.get("peak_memory_gib") else None
        run = Run(run_id=run_id, model=model, model_ref=model_ref, overrides=overrides, cluster=cluster, gpus=gpus,
                  stack=stack, plan=plan, measured=measured, measured_as=measured_as,
                  measured_value=values[measured_as], flops_convention=convention, peak_memory_gib=memory,
                  source=row.get("source", ""), notes=row.get("notes", ""), row=line, path=str(p),
                  extra={k: v for k, v in values.items() if k != measured_as})
        cluster_obj = run.load_cluster()
        if cluster_obj.num_gpus != gpus:
            raise InputError(f"{where}: gpus={gpus} but cluster {cluster} has {cluster_obj.num_gpus}")
        if check_stack:
            check_run_stack(run)
        return run
    except InputError as exc:
        message = str(exc)
        if message.startswith(str(p)):
            raise
        raise InputError(f"{where}: {message}") from None


def _graph_model(row: Mapping[str, str], ref: str, p: Path, overrides: Mapping[str, int], gpus: int) -> Any:
    """The :class:`tpsim.opgraph.model.OpGraphModel` of a row naming a ``*.ops.json`` file (a relative path is
    relative to the runs file's folder; the bounded reader of ``tpsim estimate --model X.ops.json``)."""
    from .opgraph.model import load_graph_model

    if overrides:
        raise InputError(f"{', '.join(overrides)}: a traced model's shapes are its op graph's (trace it again "
                         "with other --kwarg values)")
    if row.get("moe_balance"):
        raise InputError("moe_balance: a traced model is planned as a dense model")
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = p.parent / path
    return load_graph_model(path).with_gpus(gpus)


def _graph_plan(model: Any, gpus: int, gbs: int | None, fields: Mapping[str, Any]) -> Plan:
    """The plan of a traced-model row (``make_graph_plan``: no context or expert parallelism)."""
    from .opgraph.model import make_graph_plan

    for name in ("cp", "ep", "etp"):
        if int(fields.get(name) or 1) > 1:
            raise InputError(f"{name}={fields[name]}: a traced model has no context or expert parallelism")
    values = {k: v for k, v in fields.items() if k not in ("cp", "cp_kind", "ep", "etp")}
    return make_graph_plan(model, gpus, global_batch=gbs, **values)


def dataclass_defaults_model(model: ModelSpec) -> ModelSpec:
    """The model without its preset plan (a runs row's plan is what the row says, with :class:`Plan`'s
    defaults for the rest), keeping the preset's global batch only when the row gives none."""
    import dataclasses

    return dataclasses.replace(model, default_plan={})


def check_run_stack(run: Run) -> None:
    """Refuse (InputError naming the rule) a run whose plan its stack cannot run."""
    from .stacks import load_stack

    load_stack(run.stack).check_plan(run.plan, run.model)


def _moe_balance(model: ModelSpec, value: str, where: str) -> ModelSpec:
    import dataclasses

    names = {f.name for f in dataclasses.fields(model)}
    if "moe_balance" not in names:
        raise InputError(f"{where}: moe_balance={value!r}: not yet supported by this tpsim (docs/SCHEMAS.md T2)")
    text = value.strip().lower()
    if text not in ("forced", "aux"):
        number = _float(text, where, "moe_balance")
        if number < 1:
            raise InputError(f"{where}: moe_balance={value!r} must be forced, aux or a number >= 1")
        return dataclasses.replace(model, moe_balance=number)
    return dataclasses.replace(model, moe_balance=text)


def runs_device_stack(runs: list[Run]) -> tuple[str, str]:
    """(device, stack) all ``runs`` share; a run of another device or stack is one InputError naming its row
    and field."""
    first = runs[0]
    device, stack = first.device, stack_name(first.stack)
    for run in runs[1:]:
        if run.device != device:
            raise InputError(f"{run.where}: cluster {run.cluster} is device {run.device}, row {first.row} is "
                             f"{device} (a runs calibration is for one device and stack)")
        if stack_name(run.stack) != stack:
            raise InputError(f"{run.where}: stack={stack_name(run.stack)}, row {first.row} is {stack} (a runs "
                             "calibration is for one device and stack)")
    return device, stack


def stack_key(ref: Any) -> str:
    """A hashable key of a stack reference: the name or path, or a derived profile's fingerprint."""
    return ref if isinstance(ref, str) else f"{ref.name}@{ref.fingerprint()[:16]}"


def stack_name(ref: str) -> str:
    """The profile name of a stack reference (name or path)."""
    from .stacks import load_stack

    return load_stack(ref).name


def shipped_runs() -> list[Run]:
    """The development set and SC21 Table 1 (the uncalibrated residual bands read them)."""
    return load_runs(DEVELOPMENT_CSV, check_stack=False) + load_runs(SC21_CSV, check_stack=False)


# ------------------------------------------------------------------------------------------------ training logs

@dataclass(frozen=True)
class LogMeasurement:
    """What a training log measured: the median over its iterations after the warm-up ones."""

    format: str
    """``megatron`` (Megatron-LM / NeMo) or ``torchtitan``."""
    measured_as: str
    """the runs-CSV measurement column it fills (:data:`MEASUREMENTS`)."""
    value: float
    samples: int
    flops_convention: str | None = None
    peak_memory_gib: float | None = None


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_MEGATRON_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_NEMO_TIME = re.compile(r"train_step_timing(?: in s)?[:=]\s*" + _NUM)
_TT_TPS = re.compile(r"\btps:\s*" + _NUM)
_TT_MEMORY = re.compile(r"\bmemory:\s*" + _NUM + r"\s*GiB")
_TT_STEP = re.compile(r"\bstep:\s*([0-9]+)")
WARMUP_FRACTION = 0.2
"""leading share of a log's iterations left out (compilation, allocator and NCCL warm-up); at least one."""
MAX_LOG_BYTES = 256 << 20


def _median_after_warmup(values: list[float]) -> tuple[float, int]:
    skip = max(1, int(len(values) * WARMUP_FRACTION)) if len(values) > 1 else 0
    kept = sorted(values[skip:])
    mid = len(kept) // 2
    median = kept[mid] if len(kept) % 2 else 0.5 * (kept[mid - 1] + kept[mid])
    return median, len(kept)


def read_log(path: str | Path) -> LogMeasurement:
    """The measurement of a Megatron-LM / NeMo or torchtitan training log (docs/RUNS.md "Logs"): Megatron's
    ``elapsed time per iteration (ms)`` (else ``throughput per GPU (TFLOP/s/GPU)``, Megatron's FLOP count),
    NeMo's ``train_step_timing``, torchtitan's ``tps`` (tokens/s per GPU) and ``memory`` (GiB); the median after
    the warm-up iterations. A log with none of them is one InputError line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"log {p} does not exist or is not a regular file")
    if p.stat().st_size > MAX_LOG_BYTES:
        raise InputError(f"log {p}: above the limit of {MAX_LOG_BYTES} bytes")
    times: list[float] = []
    tflops: list[float] = []
    nemo: list[float] = []
    tps: list[float] = []
    memory: list[float] = []
    with open(p, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = _ANSI.sub("", line)
            for pattern, out in ((_MEGATRON_TIME, times), (_MEGATRON_TFLOPS, tflops), (_NEMO_TIME, nemo)):
                m = pattern.search(line)
                if m:
                    out.append(float(m.group(1).replace(",", "")))
            if _TT_STEP.search(line):
                m = _TT_TPS.search(line)
                if m:
                    tps.append(float(m.group(1).replace(",", "")))
                    mem = _TT_MEMORY.search(line)
                    if mem:
                        memory.append(float(mem.group(1).replace(",", "")))
    for values, fmt, column, scale, convention in (
            (times, "megatron", "step_time_s", 1e-3, None), (nemo, "megatron", "step_time_s", 1.0, None),
            (tflops, "megatron", "model_tflops_per_gpu", 1.0, "megatron"),
            (tps, "torchtitan", "tokens_per_s_per_gpu", 1.0, None)):
        good = [v for v in values if math.isfinite(v) and v > 0]
        if good:
            value, n = _median_after_warmup(good)
            memory = [m for m in memory if math.isfinite(m) and m > 0]  # "memory: 1e999GiB" read as inf
            return LogMeasurement(fmt, column, value * scale, n, convention, max(memory) if memory else None)
    raise InputError(f"log {p}: no iteration lines (Megatron 'elapsed time per iteration (ms)', NeMo "
                     "'train_step_timing', torchtitan 'step: ... tps: ...')")


def run_from_log(log: str | Path, *, run_id: str, model: ModelSpec, model_ref: str, cluster: str, gpus: int,
                 stack: str, plan: Plan) -> Run:
    """A :class:`Run` of a training log and the plan of its launch file (built by the caller)."""
    m = read_log(log)
    measured = step_time_from(m.measured_as, m.value, model=model, plan=plan, gpus=gpus,
                              flops_convention=m.flops_convention)
    return Run(run_id=run_id, model=model, model_ref=model_ref, overrides={}, cluster=cluster, gpus=gpus,
               stack=stack, plan=plan, measured=measured, measured_as=m.measured_as, measured_value=m.value,
               flops_convention=m.flops_convention, peak_memory_gib=m.peak_memory_gib, source=str(log),
               notes=f"{m.format} log, median of {m.samples} iterations after warm-up", row=0, path=str(log))
