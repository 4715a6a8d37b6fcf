"""Kernel-level data of the kernel model, read from ``tpsim/data/kernels/*.yaml`` (torch-free).

Each file's header states the model its figures feed and every figure's source. This module only parses and
validates (one :class:`~tpsim.errors.InputError` line naming the file and the field on bad data) into frozen
dataclasses; the physics lives in :mod:`tpsim.compute.gemm_model`, :mod:`tpsim.compute.attention_model` and
:mod:`tpsim.compute.fixed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..errors import InputError
from ..hardware import DATA_DIR, DTYPES

KERNELS_DIR = DATA_DIR / "kernels"


@dataclass(frozen=True, kw_only=True)
class Tile:
    m: int
    """output-tile rows."""
    n: int
    """output-tile columns."""
    ctas_per_sm: float
    """tiles resident on one SM (CU) at once; 0.5 = one tile per SM pair (Blackwell 2-SM MMA)."""


@dataclass(frozen=True, kw_only=True)
class ArchGemm:
    """GEMM kernel properties of one architecture family."""

    name: str
    tiles: tuple[Tile, ...]
    full_rate_intensity: float
    """tile reuse m n / (m + n) at which a tile reaches the large-GEMM rate."""
    k_fill: float
    """per-tile pipeline fill and drain, in reduction-dimension elements."""
    split_k: tuple[int, ...]
    stream_k_block: float
    """k-block of the stream-K scheduler (0: the architecture's libraries do not use stream-K)."""
    source: str


@dataclass(frozen=True, kw_only=True)
class GemmAnchor:
    """One published large-GEMM measurement: ``tflops`` at shape (m, n, k)."""

    m: int
    n: int
    k: int
    tflops: float
    source: str


@dataclass(frozen=True, kw_only=True)
class GemmPoint:
    """An independent published GEMM figure (a range when the source gives one)."""

    device: str
    dtype: str
    m: int
    n: int
    k: int
    tflops_low: float
    tflops_high: float
    source: str


@dataclass(frozen=True, kw_only=True)
class GemmData:
    architectures: Mapping[str, ArchGemm]
    anchors: Mapping[str, Mapping[str, GemmAnchor]]
    """device -> dtype -> anchor."""
    published: tuple[GemmPoint, ...]


def _load_yaml(name: str) -> tuple[dict, str]:
    from ..safeyaml import load_data

    path = KERNELS_DIR / name
    raw = load_data(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path.name}: must be a mapping")
    return raw, path.name


def require_keys(where: str, mapping: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``mapping`` if it is a mapping holding every key of ``keys``; else one InputError line."""
    if not isinstance(mapping, Mapping):
        raise InputError(f"{where}: must be a mapping, got {mapping!r}")
    for key in keys:
        if key not in mapping:
            raise InputError(f"{where}: missing field {key!r}")
    return mapping


def positive(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(f"{where}: {key}={value!r} must be a positive number")
    return float(value)


def _arch(where: str, raw: Mapping[str, Any]) -> tuple[tuple[Tile, ...], float, float, tuple[int, ...]]:
    require_keys(where, raw, ("tiles", "full_rate_intensity", "k_fill", "split_k", "source"))
    tiles = tuple(Tile(m=int(positive(where, "tiles.m", t["m"])), n=int(positive(where, "tiles.n", t["n"])),
                       ctas_per_sm=positive(where, "tiles.ctas_per_sm", t["ctas_per_sm"]))
                  for t in raw["tiles"])
    splits = tuple(int(positive(where, "split_k", s)) for s in raw["split_k"])
    if not tiles or 1 not in splits:
        raise InputError(f"{where}: needs at least one tile and split_k containing 1")
    return (tiles, positive(where, "full_rate_intensity", raw["full_rate_intensity"]),
            positive(where, "k_fill", raw["k_fill"]), splits)


@lru_cache(maxsize=1)
def gemm_data() -> GemmData:
    raw, name = _load_yaml("gemm.yaml")
    archs_raw = require_keys(name, raw.get("architectures"), ())
    archs: dict[str, ArchGemm] = {}
    for arch, body in archs_raw.items():
        target = archs_raw[body["same_as"]] if "same_as" in body else body
        tiles, intensity, fill, splits = _arch(f"{name}: architectures.{arch}", target)
        stream_k = target.get("stream_k_block", 0)
        archs[arch] = ArchGemm(name=arch, tiles=tiles, full_rate_intensity=intensity, k_fill=fill,
                               split_k=splits, stream_k_block=float(stream_k) if stream_k else 0.0,
                               source=str(body["source"]))
    anchors: dict[str, dict[str, GemmAnchor]] = {}
    for device, body in require_keys(name, raw.get("anchors"), ()).items():
        where = f"{name}: anchors.{device}"
        source = str(require_keys(where, body, ("source",))["source"])
        anchors[device] = {}
        for dtype, a in body.items():
            if dtype == "source":
                continue
            if dtype not in DTYPES:
                raise InputError(f"{where}: unknown dtype {dtype!r}")
            require_keys(f"{where}.{dtype}", a, ("m", "n", "k", "tflops"))
            anchors[device][dtype] = GemmAnchor(m=int(a["m"]), n=int(a["n"]), k=int(a["k"]),
                                                tflops=positive(where, "tflops", a["tflops"]), source=source)
    published = tuple(
        GemmPoint(device=p["device"], dtype=p["dtype"], m=int(p["m"]), n=int(p["n"]), k=int(p["k"]),
                  tflops_low=float(min(p["tflops"])), tflops_high=float(max(p["tflops"])), source=p["source"])
        for p in raw.get("published", ()))
    return GemmData(architectures=archs, anchors=anchors, published=published)


def load_kernel_yaml(name: str) -> tuple[dict, str]:
    """The raw mapping of ``tpsim/data/kernels/<name>`` and its file name (for error messages)."""
    return _load_yaml(name)
