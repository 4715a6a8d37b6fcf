"""Timing one kernel: median of repetitions after warm-up.

CPU: ``time.perf_counter`` around ``inner`` back-to-back calls (enough for >= MIN_SAMPLE_S per sample, so that
the timer's resolution and Python's call overhead stay below 1%). On a shared machine the OS takes the core
away now and then. With one thread torch computes on the calling thread (its CPU time equals the process's
and, on a quiet machine, the wall time), so a sample whose wall time exceeds the thread's CPU time
(``time.thread_time``) by more than DESCHEDULED_TOLERANCE was partly spent waiting for the core: that sample
counts the thread's CPU time, the time the kernel takes on a quiet machine. GPU: CUDA events around
``inner`` calls on the current stream, synchronized once per sample.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

MIN_SAMPLE_S = 2e-4
MIN_SAMPLES = 3
MAX_SAMPLES = 25
DESCHEDULED_TOLERANCE = 0.10
"""a CPU sample was descheduled when wall > (1 + this) x thread CPU time + DESCHEDULED_SLACK_S."""
DESCHEDULED_SLACK_S = 20e-6


@dataclass(frozen=True)
class Timing:
    median_s: float
    """seconds per call, median of the samples."""
    samples: int
    spread_pct: float
    """interquartile range / median x 100."""


Clock = Callable[[Callable[[], object], int], float]


def time_kernel(fn: Callable[[], object], device: torch.device, budget_s: float) -> Timing:
    """Time ``fn``: a warm-up call (it sizes the repetitions), then MIN_SAMPLES..MAX_SAMPLES samples filling
    about ``budget_s``."""
    clock = _clock(device)
    first = clock(fn, 1)  # warm-up: allocations, kernel selection, caches
    if first < budget_s / 4:
        first = min(first, clock(fn, 1))
    inner = max(1, math.ceil(MIN_SAMPLE_S / max(first, 1e-9)))
    samples = int(min(MAX_SAMPLES, max(MIN_SAMPLES, budget_s / max(first * inner, 1e-9))))
    times = sorted(clock(fn, inner) for _ in range(samples))
    q1, med, q3 = (_quantile(times, q) for q in (0.25, 0.5, 0.75))
    return Timing(median_s=med, samples=samples, spread_pct=100.0 * (q3 - q1) / med if med > 0 else 0.0)


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def _clock(device: torch.device) -> Clock:
    if device.type == "cuda":
        return _cuda_clock
    return _cpu_clock_checked if torch.get_num_threads() == 1 else _cpu_clock


def _cpu_clock(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def _cpu_clock_checked(fn: Callable[[], object], inner: int) -> float:
    """Seconds per call: the wall time, or the thread's CPU time if the thread was descheduled."""
    cpu0 = time.thread_time()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    wall = time.perf_counter() - start
    cpu = time.thread_time() - cpu0
    descheduled = wall > cpu * (1 + DESCHEDULED_TOLERANCE) + DESCHEDULED_SLACK_S
    return (cpu if descheduled else wall) / inner


def _cuda_clock(fn: Callable[[], object], inner: int) -> float:
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e-3 / inner
