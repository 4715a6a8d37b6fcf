"""Accelerator specifications, read from ``tpsim/data/devices.yaml`` (every figure with its source)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError

DATA_DIR = Path(__file__).resolve().parent / "data"
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    name: str
    peak_flops: Mapping[str, float]
    """dense peak FLOP/s per GEMM dtype."""
    hbm_bandwidth: float
    """bytes/s."""
    memory_bytes: int
    usable_memory_fraction: float
    compute_units: int
    """SMs (NVIDIA), CUs (AMD), MXUs (TPU): the parallel units a GEMM's tiles are spread over."""
    source: str

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise InputError(f"dtype={dtype} is not supported by device {self.name} "
                             f"(supported: {', '.join(self.peak_flops)})")
        return self.peak_flops[dtype]

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_bytes * self.usable_memory_fraction


DEVICE_KEYS = ("peak_tflops", "hbm_TBps", "memory_bytes", "usable_memory_fraction", "compute_units", "source",
               "description", "note")
"""keys of one device entry (devices.yaml or a cluster file's inline ``device:``)."""
REQUIRED_DEVICE_KEYS = ("peak_tflops", "hbm_TBps", "memory_bytes", "compute_units", "source")


def device_from_mapping(name: str, mapping: Mapping[str, Any], where: str,
                        default_usable_fraction: float | None = None) -> DeviceSpec:
    """One device from the keys of a ``tpsim/data/devices.yaml`` entry (the same function reads a cluster
    file's inline device). Units: ``peak_tflops`` dense TFLOP/s per GEMM dtype, ``hbm_TBps`` 1e12 B/s,
    ``memory_bytes`` bytes, ``compute_units`` SMs/CUs; ``source`` is required. Bad values raise one
    :class:`InputError` line ``<where>: device <name>: <field>=<value> ...``."""
    where = f"{where}: device {name}"
    if not isinstance(mapping, Mapping):
        raise InputError(f"{where}: must be a mapping of fields, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(DEVICE_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(DEVICE_KEYS)})")
    missing = [key for key in REQUIRED_DEVICE_KEYS if key not in mapping]
    if missing:
        raise InputError(f"{where}: missing field {missing[0]!r}")
    peaks = mapping["peak_tflops"]
    if not isinstance(peaks, Mapping) or not peaks:
        raise InputError(f"{where}: peak_tflops={peaks!r} must map dtypes ({', '.join(DTYPES)}) to TFLOP/s")
    flops = {}
    for dtype, value in peaks.items():
        if dtype not in DTYPES:
            raise InputError(f"{where}: peak_tflops has unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        flops[str(dtype)] = _positive(value, where, f"peak_tflops.{dtype}") * 1e12
    source = mapping["source"]
    if not isinstance(source, str) or not source.strip():
        raise InputError(f"{where}: source={source!r} must name where the figures come from")
    fraction = mapping.get("usable_memory_fraction", default_usable_fraction)
    if fraction is None:
        raise InputError(f"{where}: missing field 'usable_memory_fraction'")
    fraction = _positive(fraction, where, "usable_memory_fraction")
    if fraction > 1:
        raise InputError(f"{where}: usable_memory_fraction={fraction!r} must be in (0, 1]")
    return DeviceSpec(name=str(name), peak_flops=flops,
                      hbm_bandwidth=_positive(mapping["hbm_TBps"], where, "hbm_TBps") * 1e12,
                      memory_bytes=int(_positive(mapping["memory_bytes"], where, "memory_bytes", integer=True)),
                      usable_memory_fraction=fraction,
                      compute_units=int(_positive(mapping["compute_units"], where, "compute_units", integer=True)),
                      source=source.strip())


def _positive(value: Any, where: str, field: str, integer: bool = False) -> float:
    """A finite number > 0 (a whole number if ``integer``), else InputError naming the field and value."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value) and value > 0 and (not integer or float(value).is_integer())
    if not ok:
        kind = "a positive integer" if integer else "a positive number"
        raise InputError(f"{where}: {field}={value!r} must be {kind}")
    return float(value)


def default_usable_memory_fraction() -> float:
    """The devices file's ``usable_memory_fraction`` (the default for entries and inline devices)."""
    return float(_raw()["usable_memory_fraction"])


@lru_cache(maxsize=None)
def _raw() -> dict[str, Any]:
    import yaml  # lazily: `import tpsim` works where PyYAML is missing (e.g. a bare GPU box running the profiler)

    return yaml.safe_load((DATA_DIR / "devices.yaml").read_text())


@lru_cache(maxsize=None)
def _table() -> dict[str, DeviceSpec]:
    raw = _raw()
    frac = float(raw["usable_memory_fraction"])
    return {name: device_from_mapping(name, d, "devices.yaml", frac) for name, d in raw["devices"].items()}


def device_names() -> list[str]:
    return sorted(_table())


def device_entry(name: str) -> Mapping[str, Any]:
    """The raw keys of a devices.yaml entry (found as :func:`get_device` finds it), for inline overrides."""
    spec = get_device(name)
    return _raw()["devices"][spec.name]


def get_device(name: str) -> DeviceSpec:
    table = _table()
    if name in table:
        return table[name]
    lowered = {k.lower(): v for k, v in table.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    raise InputError(f"device={name!r} is unknown (known: {', '.join(sorted(table))})")
