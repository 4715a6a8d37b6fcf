"""Device roofline with shape-dependent efficiency (constants in ``tpsim/data/efficiency.yaml``).

GEMM: ``t = max(2 b m n k / (peak x eff), bytes / (HBM x f_mem)) + overhead`` with
``eff = gemm_peak_fraction x tile_eff(m, n) x wave_eff(b, m, n) x k / (k + k_half)``: tile quantization
(partial 128x128 output tiles do full work), wave quantization (the last wave of tiles leaves units idle) and a
small-k pipeline-fill loss (NVIDIA, Matrix Multiplication Background User's Guide). Memory-bound kernels move
``bytes_per_element x numel x element size`` at ``HBM x f_elementwise``. Flash attention runs at a fixed fraction of
peak scaled by the same shape factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..hardware import DATA_DIR, DTYPE_BYTES, DeviceSpec, is_low_precision
from ..precision import activation_bytes  # noqa: F401  (re-exported: the one rule, tpsim/precision.py)
from .base import ArrayLike, ComputeModel


@dataclass(frozen=True)
class Efficiency:
    gemm_peak_fraction: float
    tile_m: int
    tile_n: int
    k_half: float
    memory_fraction: float
    elementwise_fraction: float
    kernel_overhead_s: float
    flash_forward: float
    flash_backward: float
    bytes_per_element: dict
    optimizer_bytes_per_param: float
    overlap_compute_penalty: float

    def replace(self, **changes) -> "Efficiency":
        import dataclasses
        return dataclasses.replace(self, **changes)


@lru_cache(maxsize=1)
def default_efficiency() -> Efficiency:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "efficiency.yaml")
    return Efficiency(
        gemm_peak_fraction=float(raw["gemm_peak_fraction"]["value"]),
        tile_m=int(raw["gemm_tile"]["m"]), tile_n=int(raw["gemm_tile"]["n"]),
        k_half=float(raw["gemm_k_half"]["value"]),
        memory_fraction=float(raw["memory_bandwidth_fraction"]["value"]),
        elementwise_fraction=float(raw["elementwise_bandwidth_fraction"]["value"]),
        kernel_overhead_s=float(raw["kernel_overhead_us"]["value"]) * 1e-6,
        flash_forward=float(raw["flash_attention_fraction"]["forward"]),
        flash_backward=float(raw["flash_attention_fraction"]["backward"]),
        bytes_per_element={k: (float(v["forward"]), float(v["backward"]))
                           for k, v in raw["bytes_per_element"].items()},
        optimizer_bytes_per_param=float(raw["optimizer_bytes_per_param"]["value"]),
        overlap_compute_penalty=float(raw["overlap_compute_penalty"]["value"]),
    )


class RooflineModel(ComputeModel):
    """Compute times from the device's peak FLOP/s and HBM bandwidth with shape-dependent efficiency."""

    def __init__(self, device: DeviceSpec, efficiency: Efficiency | None = None):
        self.device = device
        self.eff = efficiency or default_efficiency()
        self.source = "roofline"

    # ---- shape factors -------------------------------------------------------------------------------
    def _shape_efficiency(self, batch: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        tm, tn = self.eff.tile_m, self.eff.tile_n
        tiles_m = np.ceil(m / tm)
        tiles_n = np.ceil(n / tn)
        tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = batch * tiles_m * tiles_n
        units = self.device.compute_units
        wave_eff = tiles / (np.ceil(tiles / units) * units)
        k_eff = k / (k + self.eff.k_half)
        return tile_eff * wave_eff * k_eff

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        m, n, k, b = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
        flops = 2.0 * b * m * n * k
        in_bytes = DTYPE_BYTES[dtype]
        out_bytes = max(in_bytes, 2)
        moved = b * ((m * k + k * n) * in_bytes + m * n * out_bytes)
        rate = self.device.peak(dtype) * self.eff.gemm_peak_fraction * self._shape_efficiency(b, m, n, k)
        t = np.maximum(flops / rate, moved / (self.device.hbm_bandwidth * self.eff.memory_fraction))
        t = t + self.eff.kernel_overhead_s
        return t, np.zeros(np.shape(t), dtype=bool)

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        bh, s, d = (np.asarray(x, dtype=float) for x in (batch_heads, seq, head_dim))
        flops = 4.0 * bh * s * s * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
        frac = self.eff.flash_backward if backward else self.eff.flash_forward
        # query tiles of 128 rows per (batch, head) are the parallel work items
        shape = self._shape_efficiency(bh, s, np.full_like(s, self.eff.tile_n), d)
        kernel_dtype = "bf16" if is_low_precision(dtype) else dtype
        rate = self.device.peak(kernel_dtype) * frac * shape
        t = flops / rate + self.eff.kernel_overhead_s
        return t, np.zeros(np.shape(t), dtype=bool)

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        per = self.eff.bytes_per_element[kernel][1 if backward else 0]
        moved = per * np.asarray(numel, dtype=float) * activation_bytes(dtype)
        t = moved / (self.device.hbm_bandwidth * self.eff.elementwise_fraction) + self.eff.kernel_overhead_s
        return t, np.zeros(np.shape(t), dtype=bool)

    def optimizer_time(self, params: ArrayLike) -> np.ndarray:
        """Adam step over ``params`` parameters (memory-bound)."""
        moved = np.asarray(params, dtype=float) * self.eff.optimizer_bytes_per_param
        return moved / (self.device.hbm_bandwidth * self.eff.memory_fraction)
