"""What each rank measures for one :class:`~tpsim.validate.block.case.Case`: numerics against the unsharded
block, collectives per type (``CommDebugMode`` counts, bytes and times through a dispatch hook on the
functional collectives DTensor issues), and forward/backward times.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
except ImportError:  # torch < 2.5
    from torch.distributed._tensor import DTensor
    from torch.distributed._tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..modules.block import build_block
from .case import Case
from .report import comm_by_type
from ..modules.styles import SEQ_DIM, shard_block

NUMERICS_RTOL = 1e-4
"""max |sharded - unsharded| / max(max |unsharded|, MAGNITUDE_FLOOR) allowed, per tensor (fp32)."""
MAGNITUDE_FLOOR = 1.0
"""inputs and output gradients are N(0, 1) and weights keep activations O(1), so 1 is the natural scale; the
floor keeps gradients that are exactly zero in theory (the key bias: softmax is invariant to a shift of all
scores of a query) from dividing rounding noise by rounding noise."""

# torch.ops._c10d_functional op name -> nccl-tests op name; bytes convention of tpsim/collectives/curve.py
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
           "broadcast": "broadcast"}


def _op_name(packet: Any) -> str:
    """``c10d_functional.all_reduce`` (CommDebugMode key) or an OpOverload -> nccl-tests op name."""
    base = str(packet).split(".")[-1] if not hasattr(packet, "_opname") else packet._opname
    base = base.split(".")[0]
    return _FUNCOL.get(base, base)


def _nbytes(op: str, args: tuple) -> int:
    """Full-buffer bytes (nccl-tests convention) of one functional collective call."""
    t = args[0]
    size = t.numel() * t.element_size()
    if op == "all_gather":
        return size * int(args[1])  # all_gather_into_tensor(input, group_size, group_name)
    return size


class CollectiveRecorder(TorchDispatchMode):
    """Records (op, bytes, seconds) of every functional collective (the ops DTensor's redistribute issues).

    With ``timed``, each collective is waited for inside the hook so that its time is the issue-to-completion
    time on this rank (DTensor waits at the next use anyway; nothing overlaps in this runtime).
    """

    def __init__(self, timed: bool = False, clock: "Clock | None" = None) -> None:
        super().__init__()
        self.timed = timed
        self.clock = clock
        self.calls: list[tuple[str, int, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func.namespace != "_c10d_functional" or func._opname not in _FUNCOL:
            return func(*args, **kwargs)
        op = _FUNCOL.get(func._opname, func._opname)
        cuda = self.timed and args[0].is_cuda
        if cuda:
            torch.cuda.synchronize()
        t0 = self.clock.now() if self.clock else (time.perf_counter(), 0.0)
        out = func(*args, **kwargs)
        if self.timed:
            out = torch.ops._c10d_functional.wait_tensor(out)
            if cuda:
                torch.cuda.synchronize()
        t1 = self.clock.now() if self.clock else (time.perf_counter(), 0.0)
        self.calls.append((op, _nbytes(op, args), Clock.since(t0, t1)[0]))
        return out

    def by_op(self) -> dict[str, dict[str, float]]:
        """{op: {"n": count, "bytes": total, "time_s": total}}."""
        out: dict[str, dict[str, float]] = {}
        for op, nbytes, sec in self.calls:
            d = out.setdefault(op, {"n": 0, "bytes": 0, "time_s": 0.0})
            d["n"] += 1
            d["bytes"] += nbytes
            d["time_s"] += sec
        return out


@dataclass
class Inputs:
    x: torch.Tensor
    """full input (batch, seq, hidden)."""
    dy: torch.Tensor
    """full output gradient."""


def make_inputs(case: Case, device: torch.device) -> Inputs:
    gen = torch.Generator().manual_seed(case.seed + 1)
    shape = (case.micro_batch, case.model.seq_len, case.model.hidden_size)
    return Inputs(torch.randn(shape, generator=gen).to(device), torch.randn(shape, generator=gen).to(device))


def sync(device: torch.device) -> None:
    """Wait for queued kernels (GPU) so that host clocks bracket the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def local_part(t: torch.Tensor, case: Case, rank: int) -> torch.Tensor:
    """This rank's block input/output: the sequence shard under SP, the full tensor otherwise."""
    return t.chunk(case.tp, dim=SEQ_DIM)[rank].contiguous() if case.sp else t


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / max(scale, MAGNITUDE_FLOOR)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def check_case(case: Case, mesh: DeviceMesh, rank: int) -> dict[str, Any]:
    """Numerics (output, input gradient, every parameter gradient) and collectives of one fwd+bwd."""
    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" \
        else torch.device("cpu")
    ref = build_block(case.model, case.tp, case.fused, case.model.seq_len, case.seed).to(device)
    sharded = shard_block(copy.deepcopy(ref), mesh, case.model, case.sp, case.fused)
    inp = make_inputs(case, device)
    x_ref = inp.x.clone().requires_grad_()
    y_ref = ref(x_ref)
    y_ref.backward(inp.dy)

    x = local_part(inp.x, case, rank).clone().requires_grad_()
    rec_f, rec_b = CollectiveRecorder(), CollectiveRecorder()
    with CommDebugMode() as comm_f, rec_f:
        y = sharded(x)
    dy = local_part(inp.dy, case, rank)
    with CommDebugMode() as comm_b, rec_b:
        y.backward(dy)

    errors = {"output": _rel_err(y.detach(), local_part(y_ref.detach(), case, rank)),
              "input_grad": _rel_err(x.grad, local_part(x_ref.grad, case, rank))}
    ref_params = dict(ref.named_parameters())
    for name, p in sharded.named_parameters():  # full_tensor() gathers (outside the counted regions)
        errors[f"grad:{name}"] = _rel_err(_full(p.grad), ref_params[name].grad)
    counts = {"fwd": _counts(comm_f), "bwd": _counts(comm_b)}
    return {"numerics": errors, "numerics_ok": max(errors.values()) <= NUMERICS_RTOL, "counts": counts,
            "bytes": {"fwd": {k: v["bytes"] for k, v in rec_f.by_op().items()},
                      "bwd": {k: v["bytes"] for k, v in rec_b.by_op().items()}}}


def _counts(mode: CommDebugMode) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for packet, n in mode.get_comm_counts().items():
        out[_op_name(packet)] += int(n)
    return dict(out)


class Clock:
    """Wall-clock seconds of this thread minus the time it sat on a CPU run queue (runnable but preempted
    by another process: Linux ``/proc/thread-self/schedstat`` field 2). Waiting for a collective is sleep,
    not run-queue time, so it still counts; other processes of a shared machine do not. Both are kept."""

    def __init__(self) -> None:
        self._path = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def _delay(self) -> float:
        try:
            with open(self._path) as f:
                return int(f.read().split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return 0.0

    def now(self) -> tuple[float, float]:
        return time.perf_counter(), self._delay()

    @staticmethod
    def since(start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
        """(seconds without run-queue time, wall seconds)."""
        wall = end[0] - start[0]
        return max(wall - (end[1] - start[1]), 0.0), wall


def time_case(case: Case, mesh: DeviceMesh, rank: int) -> dict[str, Any]:
    """Median forward and backward seconds over ``case.reps`` after ``case.warmup`` (see :class:`Clock`),
    then the per-type collective times (median over reps of each iteration's total per (phase, op)) in
    separate iterations."""
    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" \
        else torch.device("cpu")
    ref = build_block(case.model, case.tp, case.fused, case.model.seq_len, case.seed, dropout=True).to(device)
    block = shard_block(ref, mesh, case.model, case.sp, case.fused)
    inp = make_inputs(case, device)
    x0, dy = local_part(inp.x, case, rank), local_part(inp.dy, case, rank)
    group = mesh.get_group() if case.tp > 1 else None
    clock = Clock()

    def step(recorders: tuple | None = None) -> tuple[tuple[float, float], tuple[float, float]]:
        for p in block.parameters():
            p.grad = None
        x = x0.detach().requires_grad_()
        if group is not None:
            dist.barrier(group=group)
        sync(device)
        t0 = clock.now()
        with recorders[0] if recorders else contextlib.nullcontext():
            y = block(x)
        sync(device)
        t1 = clock.now()
        with recorders[1] if recorders else contextlib.nullcontext():
            y.backward(dy)
        sync(device)
        return Clock.since(t0, t1), Clock.since(t1, clock.now())

    for _ in range(case.warmup):
        step()
    fwd, bwd = zip(*(step() for _ in range(case.reps)))
    calls: list[list[tuple[str, float]]] = []
    if case.tp > 1:
        for _ in range(case.reps):
            rf, rb = CollectiveRecorder(timed=True, clock=clock), CollectiveRecorder(timed=True, clock=clock)
            step((rf, rb))
            calls.append([(f"{phase}:{op}", sec) for phase, rec in (("fwd", rf), ("bwd", rb))
                          for op, _nbytes, sec in rec.calls])
    return {"fwd_s": statistics.median(f[0] for f in fwd), "bwd_s": statistics.median(b[0] for b in bwd),
            "fwd_wall_s": statistics.median(f[1] for f in fwd), "bwd_wall_s": statistics.median(b[1] for b in bwd),
            "fwd_all_s": [f[0] for f in fwd], "bwd_all_s": [b[0] for b in bwd],
            "fwd_wall_all_s": [f[1] for f in fwd], "bwd_wall_all_s": [b[1] for b in bwd],
            "fwd_delay_all_s": [f[1] - f[0] for f in fwd], "bwd_delay_all_s": [b[1] - b[0] for b in bwd],
            "comm_calls": calls, "comm_s": comm_by_type([calls])}

