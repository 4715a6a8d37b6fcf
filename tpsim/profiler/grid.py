"""The points ``tpsim profile`` measures (torch-free).

GEMM axes hold powers of two and the common model widths 5 x 2^j (hidden 5120 and its shards 2560, 1280, 640,
320); the same values serve m, n and k because backward GEMMs permute the forward's dims (tokens become k in
the weight gradient). Shapes with a factor 3 or 7 (fused QKV widths 3h, hidden 3072/6144/12288 and their
shards, token counts 384 or 1536, ffn 11008 or 14336) fall between grid values: they are interpolated, which
is what the validation relies on (its shapes must not be look-ups). Attention: batch x heads and sequence
in powers of two, head dims 64 and 128. Memory kernels: element counts 2^j and 5 x 2^j, on rows of
``memory_width`` elements.

Every table is measured in order of increasing work, and a point whose predicted time (its work at the best
rate seen so far in its table) exceeds ``max_kernel_s`` is skipped with every larger one: on CPU the grid stops
where one kernel takes about half a second (0.5 s cap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compute.base import MEMORY_KERNEL_NAMES
from ..compute.profile import ATTENTION_OPS, GEMM_OP, kernel_work

PointKey = tuple[str, str, str, str, tuple[int, ...]]
"""(kind, op, dtype, pass, dims) of one profile point."""


def _widths(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two and 5 x 2^j (from 320 up: model widths, not tiny sizes) in [lo, hi]."""
    values = {2 ** i for i in range(4, 31)} | {5 * 2 ** i for i in range(6, 29)}
    return tuple(sorted(v for v in values if lo <= v <= hi))


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2 ** i for i in range(0, 40) if lo <= 2 ** i <= hi)


@dataclass(frozen=True, kw_only=True)
class GridSpec:
    """What to measure."""

    name: str
    gemm_dims: tuple[int, ...]
    """values of each of m, n, k (full tensor product)."""
    attention_batch_heads: tuple[int, ...]
    attention_seq: tuple[int, ...]
    attention_head_dim: tuple[int, ...]
    memory_numel: tuple[int, ...]
    memory_width: int
    """row length (elements) of the 2-D input of memory kernels (the normalized / softmaxed dim)."""
    max_kernel_s: float
    """skip points predicted to take longer than this (seconds per call)."""
    budget_s: float
    """measurement time aimed at per point (more repetitions for fast kernels)."""


def cpu_grid(name: str = "full") -> GridSpec:
    """CPU grids: ``full`` (minutes), ``quick`` (under a minute), ``tiny`` (seconds, for tests)."""
    if name == "tiny":
        return GridSpec(name=name, gemm_dims=(32, 64, 128), attention_batch_heads=(1, 2, 4),
                        attention_seq=(32, 64, 128), attention_head_dim=(32,),
                        memory_numel=(2 ** 10, 2 ** 12, 2 ** 14),
                        memory_width=256, max_kernel_s=0.05, budget_s=0.002)
    if name == "quick":
        return GridSpec(name=name, gemm_dims=(64, 256, 1024, 4096), attention_batch_heads=(1, 4, 16),
                        attention_seq=(128, 512), attention_head_dim=(64, 128),
                        memory_numel=_pow2(2 ** 12, 2 ** 22)[::2], memory_width=1024, max_kernel_s=0.3,
                        budget_s=0.01)
    return GridSpec(name=name, gemm_dims=_widths(64, 8192), attention_batch_heads=_pow2(1, 128),
                    attention_seq=_pow2(128, 2048), attention_head_dim=(64, 128),
                    memory_numel=_widths(2 ** 12, 2 ** 25), memory_width=1024, max_kernel_s=0.5, budget_s=0.1)


def cuda_grid(name: str = "full") -> GridSpec:
    """GPU grids, sized so that a full profile of bf16, fp16 and fp8 takes a few minutes."""
    if name in ("tiny", "quick"):
        return GridSpec(name=name, gemm_dims=(256, 1024, 4096, 16384), attention_batch_heads=(8, 64),
                        attention_seq=(512, 4096), attention_head_dim=(128,),
                        memory_numel=_pow2(2 ** 16, 2 ** 28)[::4], memory_width=4096, max_kernel_s=0.05,
                        budget_s=0.002)
    return GridSpec(name=name, gemm_dims=_widths(256, 32768), attention_batch_heads=_pow2(4, 256),
                    attention_seq=_pow2(512, 16384), attention_head_dim=(64, 128),
                    memory_numel=_widths(2 ** 16, 2 ** 29), memory_width=4096, max_kernel_s=0.05,
                    budget_s=0.005)


def grid_tables(spec: GridSpec, dtypes: tuple[str, ...], kinds: tuple[str, ...],
                gemm_only_dtypes: tuple[str, ...] = ("fp8",)) -> list[list[PointKey]]:
    """One list of points per (kind, op, dtype, pass) table, each sorted by increasing work."""
    tables: list[list[PointKey]] = []
    for dtype in dtypes:
        if "gemm" in kinds:
            dims = [(m, n, k) for m in spec.gemm_dims for n in spec.gemm_dims for k in spec.gemm_dims]
            tables.append(_sorted("gemm", GEMM_OP, dtype, "fwd", dims))
        if dtype in gemm_only_dtypes:
            continue
        for pass_ in ("fwd", "bwd"):
            if "attention" in kinds:
                dims = [(b, s, d) for b in spec.attention_batch_heads for s in spec.attention_seq
                        for d in spec.attention_head_dim]
                tables.extend(_sorted("attention", op, dtype, pass_, dims) for op in ATTENTION_OPS)
            if "memory" in kinds:
                tables.extend(_sorted("memory", kernel, dtype, pass_, [(n,) for n in spec.memory_numel])
                              for kernel in MEMORY_KERNEL_NAMES)
    return tables


def work_of(key: PointKey) -> float:
    """The quantity a table's points are ordered by and its time cap extrapolates with: FLOPs (or bytes
    for memory kernels)."""
    kind, op, dtype, pass_, dims = key
    flops, nbytes = kernel_work(kind, op, pass_, dtype, tuple(np.array(float(d)) for d in dims))
    return float(flops) if kind != "memory" else float(nbytes)


def _sorted(kind: str, op: str, dtype: str, pass_: str, dims: list[tuple[int, ...]]) -> list[PointKey]:
    keys = [(kind, op, dtype, pass_, d) for d in dims]
    return sorted(keys, key=lambda k: (work_of(k), k[4]))
