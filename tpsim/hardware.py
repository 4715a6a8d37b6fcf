"""Accelerator specifications, read from ``tpsim/data/devices.yaml`` (every figure with its source).

One parser, :func:`device_from_mapping`, turns a device mapping (an entry of ``devices.yaml``, or a device
defined inline in a cluster YAML) into a :class:`DeviceSpec`; bad input raises one
:class:`~tpsim.errors.InputError` line naming the place, the field and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError, did_you_mean

DATA_DIR = Path(__file__).resolve().parent / "data"
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4")
MXFP8_BLOCK = 32
"""elements per shared E8M0 (1-byte) scale of MXFP8 (OCP Microscaling Formats (MX) v1.0 specification)."""
NVFP4_BLOCK = 16
"""elements per E4M3 (1-byte) scale of NVFP4, beside one fp32 scale per tensor (NVIDIA, "Introducing NVFP4
for efficient and accurate low-precision inference", 2025; arXiv 2509.25149, NVFP4 pretraining)."""
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1,
               "mxfp8": 1 + 1 / MXFP8_BLOCK, "nvfp4": 0.5 + 1 / NVFP4_BLOCK}
"""bytes per element as stored and moved, block scales included (the per-tensor fp32 scale of NVFP4 is one
number per tensor and not counted)."""
LOW_PRECISION_DTYPES = ("fp8", "mxfp8", "nvfp4")
"""GEMM dtypes whose operands are quantized from 16-bit activations and weights (Transformer Engine / torchao
recipes): attention stays 16-bit, activations between kernels stay 16-bit, the casts cost memory traffic
(:mod:`tpsim.compute.quantize`)."""


def is_low_precision(dtype: str) -> bool:
    """True for the quantized GEMM dtypes (:data:`LOW_PRECISION_DTYPES`): one rule for every path."""
    return dtype in LOW_PRECISION_DTYPES
ARCHITECTURES = ("volta", "ampere", "ada", "hopper", "blackwell", "cdna3", "tpu", "cpu")
"""Architecture families the kernel model knows (``tpsim/data/kernels/gemm.yaml`` has one entry per family)."""

REQUIRED_KEYS = ("compute_units", "peak_tflops", "hbm_TBps", "memory_bytes", "source")
OPTIONAL_KEYS = ("usable_memory_fraction", "architecture", "boost_clock_MHz", "sustained_clock_ratio",
                 "hbm_achieved_fraction", "l2_MiB", "overlap_compute_penalty", "power_limit_w",
                 "sustained_clock_mhz", "sources")
TEXT_KEYS = ("description", "note")
"""free-text keys a device entry may carry (documentation only)."""
DEFAULT_USABLE_MEMORY_FRACTION = 1.0
"""Used only when a mapping is parsed without the table's top-level ``usable_memory_fraction``."""


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    name: str
    peak_flops: Mapping[str, float]
    """dense peak FLOP/s per GEMM dtype (datasheet, at the clock ``boost_clock_MHz``)."""
    hbm_bandwidth: float
    """bytes/s, datasheet."""
    memory_bytes: int
    usable_memory_fraction: float
    compute_units: int
    """SMs (NVIDIA), CUs (AMD), MXUs (TPU): the parallel units a GEMM's tiles are spread over."""
    source: str
    architecture: str | None = None
    """family of ARCHITECTURES: selects GEMM tile shapes and attention kernels; None: unknown."""
    boost_clock_MHz: float | None = None
    """SM clock the datasheet peak is computed at (MHz)."""
    sustained_clock_ratio: float | None = None
    """sustained clock under dense GEMM load / ``boost_clock_MHz`` (power and thermal limits); None: no data."""
    hbm_achieved_fraction: float | None = None
    """fraction of ``hbm_bandwidth`` a streaming copy reaches (measured); None: no data."""
    l2_bytes: int | None = None
    """last-level (L2) cache size in bytes; None: not published."""
    overlap_compute_penalty: float | None = None
    """compute seconds each second of hidden communication costs on this device; None: the GPU figure of
    ``tpsim/data/efficiency.yaml`` (NCCL's SMs and HBM share). A CPU rank running one compute thread per core
    pays about all of it: its communication (gloo's copies, the loopback TCP stack) runs on the same cores."""
    power_limit_w: float | None = None
    """board power limit (TDP) in watts, datasheet; used for energy figures, not for the clock (the clock under
    load is ``sustained_clock_ratio``); None: not stated."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """optional key -> its source."""

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise InputError(f"dtype={dtype} is not supported by device {self.name} "
                             f"(supported: {', '.join(self.peak_flops)})")
        return self.peak_flops[dtype]

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_bytes * self.usable_memory_fraction


def _number(where: str, key: str, value: Any, *, low: float, high: float, integer: bool = False) -> float:
    """``value`` as a finite number in ``[low, high]`` (an int when ``integer``), else one InputError line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {key}={value!r} must be a number")
    if not math.isfinite(value) or not low <= value <= high:
        raise InputError(f"{where}: {key}={value!r} must be between {low:g} and {high:g}")
    if integer and value != int(value):
        raise InputError(f"{where}: {key}={value!r} must be an integer")
    return int(value) if integer else float(value)


def _peaks(where: str, raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping) or not raw:
        raise InputError(f"{where}: peak_tflops={raw!r} must be a mapping of dtype -> TFLOP/s")
    peaks = {}
    for dtype, value in raw.items():
        if dtype not in DTYPES:
            raise InputError(f"{where}: peak_tflops has unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        peaks[dtype] = _number(where, f"peak_tflops.{dtype}", value, low=1e-6, high=1e6) * 1e12
    return peaks


def _sources(where: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise InputError(f"{where}: sources must be a mapping of field -> source text")
    unknown = sorted(set(raw) - set(OPTIONAL_KEYS))
    if unknown:
        raise InputError(f"{where}: sources names unknown field {unknown[0]!r}")
    return {str(k): v for k, v in raw.items()}


def device_from_mapping(name: str, mapping: Mapping[str, Any], where: str,
                        default_usable_fraction: float | None = None) -> DeviceSpec:
    """A :class:`DeviceSpec` from one device mapping (the schema of ``tpsim/data/devices.yaml``).

    Required keys: ``compute_units``, ``peak_tflops`` (dtype -> dense TFLOP/s), ``hbm_TBps``, ``memory_bytes``,
    ``source``. Optional: ``usable_memory_fraction``, ``architecture``, ``boost_clock_MHz``,
    ``sustained_clock_ratio`` (or ``sustained_clock_mhz`` with ``boost_clock_MHz``), ``hbm_achieved_fraction``,
    ``l2_MiB``, ``overlap_compute_penalty``, ``power_limit_w``, ``sources`` (field -> source).
    ``where`` (a file name, ``cluster.yaml: device``...) starts every error message.
    """
    where = f"{where}: device {name}"
    if not isinstance(mapping, Mapping):
        raise InputError(f"{where}: must be a mapping of fields, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS) - set(TEXT_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} "
                         f"(known: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
    missing = [k for k in REQUIRED_KEYS if k not in mapping]
    if missing:
        raise InputError(f"{where}: missing field {missing[0]!r}")
    if not isinstance(mapping["source"], str) or not mapping["source"].strip():
        raise InputError(f"{where}: source={mapping['source']!r} must name where the figures come from")
    usable = mapping.get("usable_memory_fraction", default_usable_fraction or DEFAULT_USABLE_MEMORY_FRACTION)
    arch = mapping.get("architecture")
    if arch is not None and arch not in ARCHITECTURES:
        raise InputError(f"{where}: architecture={arch!r} is unknown (known: {', '.join(ARCHITECTURES)})")

    def optional(key: str, low: float, high: float) -> float | None:
        return None if mapping.get(key) is None else _number(where, key, mapping[key], low=low, high=high)

    l2 = optional("l2_MiB", 1e-3, 1e6)
    ratio = optional("sustained_clock_ratio", 0.1, 1.0)
    clock = optional("sustained_clock_mhz", 1.0, 1e5)
    if clock is not None:
        boost = optional("boost_clock_MHz", 1.0, 1e5)
        if boost is None:
            raise InputError(f"{where}: sustained_clock_mhz={clock:g} needs boost_clock_MHz (the clock the peaks "
                             f"are computed at)")
        if ratio is not None:
            raise InputError(f"{where}: give sustained_clock_mhz or sustained_clock_ratio, not both")
        if clock > boost:
            raise InputError(f"{where}: sustained_clock_mhz={clock:g} is above boost_clock_MHz={boost:g}")
        ratio = max(0.1, clock / boost)
    return DeviceSpec(
        name=name, peak_flops=_peaks(where, mapping["peak_tflops"]),
        hbm_bandwidth=_number(where, "hbm_TBps", mapping["hbm_TBps"], low=1e-6, high=1e4) * 1e12,
        memory_bytes=_number(where, "memory_bytes", mapping["memory_bytes"], low=1, high=2.0 ** 60, integer=True),
        usable_memory_fraction=_number(where, "usable_memory_fraction", usable, low=0.01, high=1.0),
        compute_units=_number(where, "compute_units", mapping["compute_units"], low=1, high=1e6, integer=True),
        source=mapping["source"].strip(), architecture=arch,
        boost_clock_MHz=optional("boost_clock_MHz", 1.0, 1e5),
        sustained_clock_ratio=ratio,
        hbm_achieved_fraction=optional("hbm_achieved_fraction", 0.05, 1.0),
        l2_bytes=None if l2 is None else int(l2 * 2 ** 20),
        overlap_compute_penalty=optional("overlap_compute_penalty", 0.0, 1.0),
        power_limit_w=optional("power_limit_w", 1.0, 1e5),
        sources=_sources(where, mapping.get("sources")))


def default_usable_memory_fraction() -> float:
    """The devices file's ``usable_memory_fraction`` (the default for entries and inline devices)."""
    return float(_raw()["usable_memory_fraction"])


@lru_cache(maxsize=None)
def _raw() -> dict[str, Any]:
    from .safeyaml import load_data  # PyYAML only when parsing: `import tpsim` works where it is missing

    return load_data(DATA_DIR / "devices.yaml")


@lru_cache(maxsize=None)
def _table() -> dict[str, DeviceSpec]:
    raw = _raw()
    frac = float(raw["usable_memory_fraction"])
    return {name: device_from_mapping(name, d, "devices.yaml", default_usable_fraction=frac)
            for name, d in raw["devices"].items()}


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
    raise InputError(f"device={name!r} is unknown (known: {', '.join(sorted(table))})" + did_you_mean(name, table))


def overlap_penalty(device: DeviceSpec, default: float) -> float:
    """The device's ``overlap_compute_penalty`` where it states one, else ``default`` (efficiency.yaml's)."""
    return default if device.overlap_compute_penalty is None else device.overlap_compute_penalty
