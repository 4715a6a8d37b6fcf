"""Measure collectives with torch.distributed: spawned ranks on this machine, one thread each.

Rendezvous through a file store in a fresh temporary folder (never a fixed port); the process group has a
timeout; the parent kills every rank that is still alive when it returns, on success or failure. Sizes follow
the nccl-tests byte convention (``tpsim/collectives/curve.py``): all_gather = gathered output, reduce_scatter
and all_to_all = input of one rank. Output rows: ``backend, op, nranks, bytes, time_s`` (one per timed
iteration; the time of an iteration is the slowest rank's wall time). On a shared machine the scheduler
preempts ranks for whole time slices; ``tpsim calibrate`` aggregates repeats with a lower quartile for that
reason (subtracting run-queue time from /proc/.../schedstat over-corrects: the kernel books a wait when the
thread is next scheduled, possibly after the timed call began).
"""

from __future__ import annotations

import csv
import datetime
import os
import queue
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InputError, TpsimError

BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
COLUMNS = ("backend", "op", "nranks", "bytes", "time_s")


class BenchError(TpsimError):
    """A benchmark run failed (a rank crashed or timed out); the message says which and why."""


@dataclass(frozen=True)
class Measurement:
    backend: str
    op: str
    nranks: int
    bytes: int
    time_s: float


def run_bench(nproc: int, backend: str = "gloo", sizes: Sequence[int] = DEFAULT_SIZES,
              ops: Sequence[str] = DEFAULT_OPS, iters: int = 5, warmup: int = 2,
              timeout_s: float = 60.0) -> list[Measurement]:
    """Spawn ``nproc`` ranks, time ``iters`` iterations of each (op, size) after ``warmup``; rows in order."""
    _check(nproc, backend, sizes, ops, iters, warmup, timeout_s)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="tpsim-bench-") as tmp:
        store = Path(tmp) / "store"
        spec = dict(backend=backend, sizes=list(sizes), ops=list(ops), iters=iters, warmup=warmup,
                    timeout_s=timeout_s, store=str(store))
        procs = [ctx.Process(target=_worker, args=(rank, nproc, spec, results), daemon=True)
                 for rank in range(nproc)]
        try:
            for p in procs:
                p.start()
            payload = _collect(procs, results, deadline=time.monotonic() + timeout_s + 60.0)
        finally:
            _reap(procs)
    return [Measurement(backend, op, nproc, nbytes, t) for op, nbytes, t in payload]


def _check(nproc: int, backend: str, sizes: Sequence[int], ops: Sequence[str], iters: int, warmup: int,
           timeout_s: float) -> None:
    if nproc < 2:
        raise InputError(f"--nproc={nproc} must be at least 2")
    if backend not in ("gloo", "nccl"):
        raise InputError(f"--backend={backend!r} must be gloo or nccl")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
            raise InputError(f"--backend=nccl needs {nproc} CUDA devices; this machine has "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    bad = [op for op in ops if op not in BENCH_OPS]
    if bad:
        raise InputError(f"--ops {bad[0]!r} is not measurable (choose from {', '.join(BENCH_OPS)})")
    if not sizes or any(s <= 0 for s in sizes):
        raise InputError(f"--sizes {list(sizes)} must be positive sizes")
    if iters < 1 or warmup < 0 or not timeout_s > 0:
        raise InputError(f"iters={iters}, warmup={warmup}, timeout={timeout_s}: need iters >= 1, warmup >= 0, "
                         "timeout > 0")


def _collect(procs, results, deadline: float) -> list[tuple[str, int, float]]:
    """Rank 0's rows, or BenchError naming the first rank that failed or the timeout."""
    payload = None
    while payload is None:
        try:
            kind, rank, body = results.get(timeout=0.2)
        except queue.Empty:
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise BenchError(f"rank {dead[0][0]} exited with code {dead[0][1]}") from None
            if time.monotonic() > deadline:
                raise BenchError("ranks did not finish before the timeout (--timeout)") from None
            continue
        if kind == "error":
            raise BenchError(f"rank {rank} failed: {body}")
        payload = body
    return payload


def _reap(procs) -> None:
    for p in procs:
        p.join(timeout=5.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


def _worker(rank: int, nproc: int, spec: dict, results) -> None:
    from ..procs import die_with_parent
    die_with_parent()  # spawned ranks outlive a SIGKILLed parent otherwise
    try:
        rows = _measure(rank, nproc, spec)
        if rank == 0:
            results.put(("rows", rank, rows))
    except Exception as exc:  # reported to the parent as one line
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        results.put(("error", rank, line or traceback.format_exc(limit=1)))
    # Flush the queue, then leave without C++ static teardown: a gloo thread still joinable there aborts the
    # process now and then (SIGABRT, 'terminate called without an active exception') after the work is done.
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _measure(rank: int, nproc: int, spec: dict) -> list[tuple[str, int, float]]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    backend = spec["backend"]
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=f"file://{spec['store']}", rank=rank, world_size=nproc,
                            timeout=datetime.timedelta(seconds=spec["timeout_s"]))
    try:
        warm = torch.ones(1024, device=device)
        for _ in range(10):  # connections and buffers of the process group are set up lazily
            dist.all_reduce(warm)
        rows = []
        for op in spec["ops"]:
            for nbytes in spec["sizes"]:
                call = _op(op, nbytes, nproc, device)
                for _ in range(spec["warmup"]):
                    call()
                times = torch.zeros(spec["iters"], dtype=torch.float64)
                for i in range(spec["iters"]):
                    dist.barrier()
                    _sync(device)
                    t0 = time.perf_counter()
                    call()
                    _sync(device)
                    times[i] = time.perf_counter() - t0
                dist.all_reduce(times, op=dist.ReduceOp.MAX)  # an iteration ends when the slowest rank does
                rows += [(op, int(nbytes), float(t)) for t in times]
        return rows
    finally:
        dist.destroy_process_group()


def _sync(device) -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def _op(op: str, nbytes: int, n: int, device):
    """A no-argument call running ``op`` on float32 buffers sized by the nccl-tests convention."""
    import torch
    import torch.distributed as dist

    elems = max(n, (int(nbytes) // 4) // n * n)  # divisible by n, at least one element per rank
    full = torch.ones(elems, dtype=torch.float32, device=device)
    part = torch.ones(elems // n, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.1x
        return lambda: gather(full, part)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    return lambda: dist.broadcast(full, 0)


def write_csv(rows: Sequence[Measurement], path: str | os.PathLike | None) -> str:
    """CSV text with COLUMNS; also written to ``path`` when given."""
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([r.backend, r.op, r.nranks, r.bytes, f"{r.time_s:.9g}"])
    text = buf.getvalue()
    if path:
        from ..io import atomic_write_text

        atomic_write_text(path, text, "--out")
    return text
