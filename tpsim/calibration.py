"""Calibration files: the one loader (docs/SCHEMAS.md, section 7).

A calibration YAML is what ``tpsim calibrate`` writes and what a cluster file includes with ``calibration:``
(or ``--calibration``). Top-level keys:

* link types (:data:`LINK_TYPES`: ``nvlink``, ``pcie``, ``ib``, ...): ``{efficiency, latency_us, bw_GBps}``
  overrides of the topology's links of that type (``bw_GBps`` is a whole edge, all lanes, per direction);
* ``gloo_ops``: per-collective link values for CPU ranks (gloo over loopback), same keys;
* ``compute``: scales fitted from validation runs on one device and training stack: ``gemm_scale``,
  ``attention_scale``, ``memory_scale`` (multiply the compute model's kernel times), ``host_overhead_per_layer_us``
  (host time per layer and micro-batch that the device's kernels do not hide), ``tp_exposed_scale`` and
  ``dp_exposed_scale`` (the achieved overlap of TP / DP communication: factors on the exposed part of those
  collectives, capped at their whole time), ``device`` and ``stack`` they apply to, and their ``leave_one_out``
  error;
* anything else is provenance (tool, date, inputs, fit errors).

A file of another kind (a cluster, node template, fabric or link-kinds file given as a calibration) is refused
with one line naming it. The loader sits below the topology and collective layers: both read calibrations
through :func:`load_calibration`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError

LINK_TYPES = ("nvlink", "pcie", "ib", "ethernet", "ici", "loopback", "cpu")
"""link types of the topology format (topologies/README.md); a calibration overrides them by type."""
LINK_KEYS = ("efficiency", "latency_us", "bw_GBps")
_LINK_EXTRA = ("source", "fit_error", "samples", "note")
"""keys a link entry may carry besides its values (written by ``tpsim calibrate``)."""
COMPUTE_SCALES = ("gemm_scale", "attention_scale", "memory_scale")
EXPOSED_SCALES = ("tp_exposed_scale", "dp_exposed_scale")
"""factors on the exposed TP / DP communication (the achieved overlap of a stack; 1: the stack profile's)."""
_COMPUTE_KEYS = COMPUTE_SCALES + EXPOSED_SCALES + ("host_overhead_per_layer_us", "host_overhead_fwd_share", "device", "stack",
                                  "leave_one_out", "source", "samples", "note")
DEFAULT_FWD_SHARE = 1.0 / 3.0
"""forward part of the host overhead when a file does not say (backward dispatches about twice the ops)."""
DATA_DIR = Path(__file__).resolve().parent / "data" / "calibration"
"""shipped calibrations, found by name (``local-cpu``)."""

# top-level keys that mark another kind of tpsim file (a calibration has none of them)
_OTHER_KINDS = (
    ("a cluster file", ("node", "fabric", "gpus")),
    ("a node template", ("devices", "links")),
    ("a fabric file", ("levels", "radix", "dims", "host_shape")),
    ("a link-kinds file", ("link_kinds",)),
)
_FABRIC_TYPES = ("none", "fat_tree", "rail_optimized", "torus")


@dataclass(frozen=True, kw_only=True)
class ComputeCalibration:
    """Fitted corrections of the compute model for one device and stack (units: factors, microseconds)."""

    gemm_scale: float = 1.0
    """factor on GEMM kernel times."""
    attention_scale: float = 1.0
    """factor on fused-attention kernel times."""
    memory_scale: float = 1.0
    """factor on memory-bound kernel times (norms, activations, softmax, residuals)."""
    host_overhead_per_layer_us: float = 0.0
    """host (framework) time per layer and micro-batch, forward and backward together, that kernels do not
    hide; microseconds."""
    device: str | None = None
    """device name (tpsim/data/devices.yaml) the fit applies to; None: any."""
    stack: str | None = None
    """training stack the fit applies to; None: any."""
    host_overhead_fwd_share: float = DEFAULT_FWD_SHARE
    """forward part of ``host_overhead_per_layer_us`` (``tpsim validate`` splits its per-phase prediction)."""
    tp_exposed_scale: float = 1.0
    """factor on the exposed part of the tensor-parallel layer collectives (the achieved overlap; the exposed
    time never exceeds the collectives' whole time, 0 hides them all)."""
    dp_exposed_scale: float = 1.0
    """factor on the exposed part of the data-parallel reductions and ZeRO gathers (same cap)."""
    leave_one_out: Mapping[str, Any] = field(default_factory=dict)
    """leave-one-out error of the fit (provenance, as written)."""
    source: str = ""
    """the file it was read from (empty when built in code)."""

    def overhead_s(self) -> dict[str, float]:
        """Host overhead per layer and micro-batch, seconds, split into forward and backward."""
        total = self.host_overhead_per_layer_us * 1e-6
        return {"fwd": total * self.host_overhead_fwd_share, "bwd": total * (1.0 - self.host_overhead_fwd_share)}

    def to_section(self) -> dict[str, Any]:
        """The ``compute:`` section as written to a calibration file."""
        return {"device": self.device, "stack": self.stack,
                **{k: round(getattr(self, k), 6) for k in COMPUTE_SCALES},
                "host_overhead_per_layer_us": round(self.host_overhead_per_layer_us, 3),
                "host_overhead_fwd_share": round(self.host_overhead_fwd_share, 4),
                **{k: round(getattr(self, k), 6) for k in EXPOSED_SCALES if getattr(self, k) != 1.0},
                "leave_one_out": dict(self.leave_one_out)}

    @property
    def scales_time(self) -> bool:
        """True when any kernel-time factor differs from 1."""
        return any(getattr(self, name) != 1.0 for name in COMPUTE_SCALES)

    @property
    def exposed_scales(self) -> dict[str, float]:
        """axis (``tp``, ``dp``) -> factor on its exposed communication, for the factors that differ from 1."""
        return {k.split("_")[0]: getattr(self, k) for k in EXPOSED_SCALES if getattr(self, k) != 1.0}


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One calibration file, validated. ``per_type`` and ``provenance`` keep the first wave's names (the
    topology's ``CalibrationSpec`` is this class)."""

    path: Path | None = None
    per_type: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """link type -> {efficiency, latency_us, bw_GBps} (any subset)."""
    gloo_ops: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """collective -> {efficiency, latency_us, bw_GBps} of the loopback links for CPU ranks."""
    compute: ComputeCalibration | None = None
    """compute-model corrections, when the file has a ``compute`` section."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """every top-level key that is not a link type, as written (``gloo_ops`` and ``compute`` included, which
    the collective model of the first wave reads from here)."""

    def link_overrides(self) -> dict[str, Any]:
        """``{link_type: {...}, "gloo_ops": {op: {...}}}``: the mapping :class:`CollectiveModel` takes."""
        out: dict[str, Any] = {t: dict(v) for t, v in self.per_type.items()}
        if self.gloo_ops:
            out["gloo_ops"] = {op: dict(v) for op, v in self.gloo_ops.items()}
        return out

    def fingerprint(self) -> str:
        """SHA-256 of the contents (a changed file is a different key for every cache that holds it)."""
        text = json.dumps({"per_type": self.per_type, "provenance": self.provenance}, sort_keys=True,
                          default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a component too long, ...: not a file
        return False


def find_calibration(ref: str | Path, relative_to: Path | None = None) -> Path:
    """The file a calibration reference names: a path (absolute, or relative to the working folder or to
    ``relative_to``), or the name of a shipped calibration in tpsim/data/calibration (with or without .yaml)."""
    text = str(ref)
    if not text.strip() or "\0" in text or len(text) > 4096:  # ENAMETOOLONG / NUL: an OSError, not a line
        from .limits import show

        raise InputError(f"calibration={show(text)}: not a file name or a shipped calibration")
    candidates = [Path(text).expanduser()]
    if relative_to is not None:
        candidates.append(relative_to / text)
    candidates += [DATA_DIR / text, DATA_DIR / f"{text}.yaml"]
    path = next((p for p in candidates if _is_file(p)), None)
    if path is None:
        where = f" (looked in {relative_to} and tpsim/data/calibration)" if relative_to else ""
        raise InputError(f"calibration={text!r}: file not found{where}")
    return path.resolve()


def load_calibration(ref: str | Path, relative_to: Path | None = None) -> Calibration:
    """Read and validate a calibration file (see the module docstring)."""
    path = find_calibration(ref, relative_to)
    from .schema import check
    from .schemas import CALIBRATION

    data = _read(path)
    _refuse_other_kinds(path, data)
    check(CALIBRATION, data, str(path))  # types and ranges before use (issue 26)
    per_type = {key: _link_entry(value, f"{path}: {key}") for key, value in data.items() if key in LINK_TYPES}
    gloo = data.get("gloo_ops") or {}
    if not isinstance(gloo, Mapping):
        raise InputError(f"{path}: gloo_ops must be a mapping collective -> {{efficiency, latency_us, bw_GBps}}")
    gloo_ops = {str(op): _link_entry(v, f"{path}: gloo_ops.{op}") for op, v in gloo.items()}
    compute = _compute(data["compute"], f"{path}: compute") if data.get("compute") is not None else None
    provenance = {k: v for k, v in data.items() if k not in LINK_TYPES}
    for key, value in provenance.items():  # a mistyped link type would be read as provenance, and ignored
        if isinstance(value, Mapping) and {"efficiency", "latency_us", "bw_GBps"} & set(map(str, value)) \
                and key not in ("gloo_ops", "compute"):
            raise InputError(f"{path}: {str(key)[:60]!r} is not a link type ({', '.join(sorted(LINK_TYPES))}); "
                             "its efficiency/latency would be ignored")
    return Calibration(path=path, per_type=per_type, gloo_ops=gloo_ops, compute=compute, provenance=provenance)


def _read(path: Path) -> dict[str, Any]:
    from .safeyaml import read_yaml  # the one YAML reader: bounded (bombs, depth, size), strict keys

    data = read_yaml(path, "calibration file")
    if data is None:  # an empty file is a truncated or wrong file, not "no calibration" (that is none.yaml)
        raise InputError(f"{path}: the calibration file is empty (tpsim/data/calibration/none.yaml means no "
                         "calibration)")
    if not isinstance(data, dict):
        raise InputError(f"{path}: a calibration file is a mapping of link types (got {type(data).__name__})")
    return data


def _refuse_other_kinds(path: Path, data: Mapping[str, Any]) -> None:
    if data.get("type") in _FABRIC_TYPES:
        raise InputError(f"{path}: is a fabric file (type: {data['type']}), not a calibration (link types, "
                         "gloo_ops, compute)")
    for kind, keys in _OTHER_KINDS:
        found = [k for k in keys if k in data]
        if found:
            raise InputError(f"{path}: is {kind} (keys {', '.join(found)}), not a calibration (link types, "
                             "gloo_ops, compute)")


def _number(value: Any, where: str, name: str, *, low: float, low_open: bool, high: float = math.inf) -> float:
    """A finite number above ``low`` (or at it when not ``low_open``) and at most ``high``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300  # no overflow
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        if high < math.inf:
            bound = f"in ({low:g}, {high:g}]"
        else:
            bound = "a positive number" if low_open and low == 0 else f"a number >= {low:g}"
        raise InputError(f"{where}: {name}={value!r} must be {bound}")
    return float(value)


def _check_keys(value: Any, allowed: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: must be a mapping with {', '.join(allowed[:3])}")
    for key in value:
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r} (allowed: {', '.join(allowed)})")
    return value


def _link_entry(value: Any, where: str) -> dict[str, float]:
    value = _check_keys(value, LINK_KEYS + _LINK_EXTRA, where)
    entry: dict[str, float] = {}
    if "efficiency" in value:
        entry["efficiency"] = _number(value["efficiency"], where, "efficiency", low=0.0, low_open=True, high=1.0)
    if "latency_us" in value:
        entry["latency_us"] = _number(value["latency_us"], where, "latency_us", low=0.0, low_open=False)
    if "bw_GBps" in value:
        entry["bw_GBps"] = _number(value["bw_GBps"], where, "bw_GBps", low=0.0, low_open=True)
    return entry


def _compute(value: Any, where: str) -> ComputeCalibration:
    value = _check_keys(value, _COMPUTE_KEYS, where)
    scales = {k: _number(value[k], where, k, low=0.0, low_open=True) for k in COMPUTE_SCALES if k in value}
    scales |= {k: _number(value[k], where, k, low=0.0, low_open=False, high=10.0) for k in EXPOSED_SCALES
               if k in value}
    host = _number(value.get("host_overhead_per_layer_us", 0.0), where, "host_overhead_per_layer_us", low=0.0,
                   low_open=False)
    names = {}
    for key in ("device", "stack"):
        if value.get(key) is not None:
            if not isinstance(value[key], str) or not value[key].strip():
                raise InputError(f"{where}: {key}={value[key]!r} must be a name")
            names[key] = value[key].strip()
    share = _number(value.get("host_overhead_fwd_share", DEFAULT_FWD_SHARE), where, "host_overhead_fwd_share",
                    low=0.0, low_open=False, high=1.0)
    loo = value.get("leave_one_out") or {}
    if not isinstance(loo, Mapping):
        raise InputError(f"{where}: leave_one_out must be a mapping (e.g. median_rel, max_rel)")
    return ComputeCalibration(**scales, host_overhead_per_layer_us=host, host_overhead_fwd_share=share,
                              leave_one_out=dict(loo), source=where.split(": compute")[0], **names)
