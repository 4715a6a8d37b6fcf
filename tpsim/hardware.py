"""Accelerator specifications, read from ``tpsim/data/devices.yaml`` (every figure with its source)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

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


@lru_cache(maxsize=None)
def _table() -> dict[str, DeviceSpec]:
    import yaml  # lazily: `import tpsim` works where PyYAML is missing (e.g. a bare GPU box running the profiler)

    raw = yaml.safe_load((DATA_DIR / "devices.yaml").read_text())
    frac = float(raw["usable_memory_fraction"])
    table = {}
    for name, d in raw["devices"].items():
        table[name] = DeviceSpec(
            name=name, peak_flops={k: float(v) * 1e12 for k, v in d["peak_tflops"].items()},
            hbm_bandwidth=float(d["hbm_TBps"]) * 1e12, memory_bytes=int(d["memory_bytes"]),
            usable_memory_fraction=float(d.get("usable_memory_fraction", frac)),
            compute_units=int(d["compute_units"]), source=str(d["source"]))
    return table


def device_names() -> list[str]:
    return sorted(_table())


def get_device(name: str) -> DeviceSpec:
    table = _table()
    if name in table:
        return table[name]
    lowered = {k.lower(): v for k, v in table.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    raise InputError(f"device={name!r} is unknown (known: {', '.join(sorted(table))})")
