"""Run a profile: pick the device and dtypes, walk the grid, time each point, append it to the file."""

from __future__ import annotations

import datetime
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

from ..compute.profile import KINDS, ProfilePoint
from ..errors import InputError
from .grid import GridSpec, PointKey, cpu_grid, cuda_grid, grid_tables, work_of
from .progress import make_progress
from .store import ProfileWriter, drop_noisy_rows

if TYPE_CHECKING:  # torch is imported where the run starts, not at module import
    import torch

GRIDS = ("tiny", "quick", "full")
CPU_DTYPES = ("fp32", "bf16", "fp16")
CUDA_DTYPES = ("fp32", "bf16", "fp16", "fp8")
DEFAULT_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "fp8")}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    device: str = "cpu"
    """"cpu" or "cuda"."""
    dtypes: tuple[str, ...] = ()
    """empty: the device's defaults (DEFAULT_DTYPES)."""
    out: Path | None = None
    """None: profiles/<device slug>.csv."""
    grid: str = "full"
    threads: int = 1
    kinds: tuple[str, ...] = KINDS
    max_kernel_s: float | None = None
    """None: the grid's own cap."""
    redo_noisy_pct: float | None = None
    """measure again the points of the file whose spread_pct exceeds this (None: keep every point)."""
    progress: bool = True


@dataclass(frozen=True)
class RunSummary:
    path: Path
    measured: int
    already: int
    """points found in the file (a resumed run)."""
    skipped_slow: int
    """points over the time cap, not measured."""
    seconds: float
    warnings: tuple[str, ...] = field(default=())


def run_profile(options: RunOptions) -> RunSummary:
    import torch

    start = time.perf_counter()
    device = _torch_device(options.device)
    _check_options(options)
    torch.set_num_threads(options.threads)
    spec = _grid(device.type, options)
    warnings: list[str] = []
    dtypes = _dtypes(device, options.dtypes, warnings)
    meta = _metadata(device, spec, options.threads)
    out = Path(options.out) if options.out else default_out_path(device.type, str(meta["device"]), options.threads)
    tables = grid_tables(spec, dtypes, options.kinds)
    if options.redo_noisy_pct is not None:
        dropped = drop_noisy_rows(out, options.redo_noisy_pct)
        warnings.append(f"{dropped} point(s) with spread over {options.redo_noisy_pct:g}% dropped, "
                        f"measured again")
    with ProfileWriter(out, meta) as writer:
        already = sum(key in writer.done for table in tables for key in table)
        total = sum(len(t) for t in tables) - already
        with make_progress(total, f"profile {device.type}", options.progress) as bar:
            measured = skipped = 0
            for table in tables:
                m, s = _run_table(table, writer, device, spec, bar, warnings)
                measured, skipped = measured + m, skipped + s
    return RunSummary(out, measured, already, skipped, time.perf_counter() - start, tuple(warnings))


def _run_table(table: list[PointKey], writer: ProfileWriter, device: "torch.device", spec: GridSpec,
               bar: object, warnings: list[str]) -> tuple[int, int]:
    """Measure a table's missing points in order of work; stop at the time cap or at the first failure."""
    from .kernels import build_kernel
    from .timing import time_kernel

    best_rate = 0.0  # work per second, the best seen in this table
    measured = skipped = 0
    stopped = False
    for key in table:
        work = work_of(key)
        if key in writer.done:
            best_rate = max(best_rate, work / writer.done[key])
            continue
        if stopped or (best_rate > 0 and work / best_rate > spec.max_kernel_s):
            skipped += 1
            bar.update(1)
            continue
        try:
            fn = build_kernel(*key, device, spec.memory_width)
            timing = time_kernel(fn, device, spec.budget_s)
        except (RuntimeError, MemoryError, NotImplementedError) as exc:
            warnings.append(f"{'/'.join(key[:4])} {key[4]}: {_first_line(exc)}; larger points skipped")
            stopped = True
            skipped += 1
            bar.update(1)
            continue
        finally:
            fn = None
            _free(device)
        kind, op, dtype, pass_, dims = key
        writer.append(ProfilePoint(kind=kind, op=op, dtype=dtype, pass_=pass_, dims=dims, time_s=timing.median_s,
                                   reps=timing.samples, spread_pct=timing.spread_pct))
        best_rate = max(best_rate, work / timing.median_s)
        measured += 1
        bar.update(1)
    return measured, skipped


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _free(device: "torch.device") -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.empty_cache()


def _torch_device(name: str) -> "torch.device":
    import torch

    if name not in ("cpu", "cuda"):
        raise InputError(f"--device={name!r} is not cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device=cuda: torch sees no CUDA device on this machine")
    return torch.device(name)


def _check_options(options: RunOptions) -> None:
    if options.grid not in GRIDS:
        raise InputError(f"--grid={options.grid!r} is not one of {', '.join(GRIDS)}")
    if options.threads < 1:
        raise InputError(f"--threads={options.threads} must be >= 1")
    unknown = [k for k in options.kinds if k not in KINDS]
    if unknown or not options.kinds:
        raise InputError(f"--kinds={','.join(options.kinds)!r}: choose among {', '.join(KINDS)}")
    if options.max_kernel_s is not None and not options.max_kernel_s > 0:
        raise InputError(f"--max-kernel-s={options.max_kernel_s} must be positive")
    if options.redo_noisy_pct is not None and not options.redo_noisy_pct >= 0:
        raise InputError(f"--redo-noisy={options.redo_noisy_pct} must be a percentage >= 0")


def _grid(device_type: str, options: RunOptions) -> GridSpec:
    spec = (cuda_grid if device_type == "cuda" else cpu_grid)(options.grid)
    if options.max_kernel_s is None:
        return spec
    from dataclasses import replace
    return replace(spec, max_kernel_s=options.max_kernel_s)


def _dtypes(device: "torch.device", requested: tuple[str, ...], warnings: list[str]) -> tuple[str, ...]:
    """The dtypes to profile: the requested ones (an error if the device cannot run one), or the defaults
    minus those this torch build or GPU does not support (fp8: torch >= 2.1 ``_scaled_mm`` on sm_89+)."""
    allowed = CUDA_DTYPES if device.type == "cuda" else CPU_DTYPES
    for dtype in requested:
        if dtype not in allowed:
            raise InputError(f"--dtype={dtype} cannot be profiled on {device.type} (choose among {', '.join(allowed)})")
    chosen = requested or DEFAULT_DTYPES[device.type]
    if "fp8" in chosen and not _fp8_works(device):
        if requested:
            raise InputError("--dtype=fp8: this torch build or GPU has no fp8 GEMM (torch._scaled_mm, sm_89+)")
        warnings.append("fp8 skipped: no fp8 GEMM in this torch build or GPU")
        chosen = tuple(d for d in chosen if d != "fp8")
    return tuple(chosen)


def _fp8_works(device: "torch.device") -> bool:
    import torch
    from .kernels import build_kernel

    if getattr(torch, "float8_e4m3fn", None) is None or not hasattr(torch, "_scaled_mm"):
        return False
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False
    try:
        build_kernel("gemm", "mm", "fp8", "fwd", (64, 64, 64), device, 0)()
        torch.cuda.synchronize()
    except (RuntimeError, TypeError):
        return False
    return True


def device_name(device: "torch.device") -> str:
    """``torch.cuda.get_device_name`` on GPU; the CPU model name (from /proc/cpuinfo) on CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _metadata(device: "torch.device", spec: GridSpec, threads: int) -> dict[str, object]:
    import torch
    from .. import __version__

    timing = ("cuda events, median of repetitions after warm-up" if device.type == "cuda"
              else "time.perf_counter, median of repetitions after warm-up"
              + ("; samples descheduled by the OS count the thread's CPU time (time.thread_time)"
                 if threads == 1 else ""))
    return {"format_version": 1, "device": device_name(device).replace(",", " "), "device_type": device.type,
            "torch_version": torch.__version__, "threads": threads,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tpsim_version": __version__, "timing": timing, "grid": spec.name,
            "memory_width": spec.memory_width, "max_kernel_s": spec.max_kernel_s,
            "python": sys.version.split()[0]}


def default_out_path(device_type: str, name: str, threads: int) -> Path:
    """``profiles/h200.csv`` for a GPU, ``profiles/cpu-<model>-<threads>t.csv`` for a CPU."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "").replace("(r)", "")).strip("-")
    if device_type == "cuda":
        return Path("profiles") / f"{slug or 'gpu'}.csv"
    return Path("profiles") / f"cpu-{slug or 'unknown'}-{threads}t.csv"
