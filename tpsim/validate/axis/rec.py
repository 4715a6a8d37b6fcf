"""Every collective and point-to-point transfer one rank issues, by mesh axis (rank side).

A ``TorchDispatchMode`` sees both kinds of communication ops torch dispatches: the functional collectives
DTensor issues (``_c10d_functional.*``, group named by a string argument) and the ``c10d.*`` ops behind
``torch.distributed``'s calls that DDP's reducer, FSDP2 and the pipelining stages make (group passed as a
``ProcessGroup`` object). Each call is attributed to the mesh axis whose process group it ran on, and recorded
as (axis, phase, op, bytes, seconds) with nccl-tests' byte convention (full buffer: the all-gather's output,
the reduce-scatter's input, an all-to-all's send buffer (with uneven splits, as the MoE dispatch, the received
size differs from rank to rank); a send or receive its tensor).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# op name (either namespace) -> nccl-tests name
OPS = {
    "all_reduce": "all_reduce", "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather", "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all",
    "broadcast": "broadcast", "broadcast_": "broadcast",
    "send": "send", "recv_": "recv",
}
P2P = ("send", "recv")


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def call_bytes(namespace: str, opname: str, args: tuple) -> int:
    """Full-buffer bytes of one call (see module docstring)."""
    op = OPS[opname]
    if namespace == "_c10d_functional":
        size = _nbytes(args[0])
        return size * int(args[1]) if op == "all_gather" else size
    if op == "all_gather":  # c10d ops take (output(s), input(s), group, ...)
        return sum(_nbytes(t) for t in _tensors(args[0]))
    if op in ("reduce_scatter", "all_to_all"):  # the input; an all-to-all's with uneven splits is its send buffer
        return sum(_nbytes(t) for t in _tensors(args[1]))
    return sum(_nbytes(t) for t in _tensors(args[0]))


def _group_name(namespace: str, args: tuple, kwargs: dict) -> str | None:
    if namespace == "_c10d_functional":
        names = [a for a in list(args) + list(kwargs.values()) if isinstance(a, str)]
        return names[-1] if names else None
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a).group_name
            except RuntimeError:
                continue
    return None


def axis_of_groups(mesh: Any) -> dict[str, str]:
    """Process-group name -> mesh axis; where two axes share a group (two axes each spanning the world), the
    larger axis wins."""
    out: dict[str, tuple[int, str]] = {}
    for axis in mesh.mesh_dim_names:
        size = mesh[axis].size()
        for group in (mesh.get_group(axis), mesh[axis].get_group()):
            name = group.group_name
            if name not in out or size > out[name][0]:
                out[name] = (size, axis)
    return {name: axis for name, (_size, axis) in out.items()}


def axis_of_ranks(mesh: Any) -> dict[tuple[int, ...], str]:
    """This rank's group along each axis, as a rank tuple -> axis (for groups torch created elsewhere over the
    same ranks: a DeviceMesh may reuse an earlier mesh's group)."""
    out: dict[tuple[int, ...], tuple[int, str]] = {}
    for axis in mesh.mesh_dim_names:
        ranks = tuple(dist.get_process_group_ranks(mesh.get_group(axis)))
        size = len(ranks)
        if ranks not in out or size > out[ranks][0]:
            out[ranks] = (size, axis)
    return {ranks: axis for ranks, (_size, axis) in out.items()}


def _ranks_of(group_name: str) -> tuple[int, ...] | None:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group
        return tuple(dist.get_process_group_ranks(_resolve_process_group(group_name)))
    except (RuntimeError, ValueError, KeyError, ImportError):
        return None


class AxisRecorder(TorchDispatchMode):
    """Records every communication call; ``phase`` is set by the caller (fwd / bwd / step / other).

    ``timed``: each collective (not a send or receive: gloo's point-to-point works cannot be waited twice) is
    waited for where it is issued, so its seconds are issue-to-completion on this rank; ``clock`` returns
    (wall, run-queue delay) pairs (:class:`tpsim.validate.block.measure.Clock`).
    """

    def __init__(self, groups: dict[str, str], timed: bool = False,
                 clock: Callable[[], tuple[float, float]] | None = None,
                 by_ranks: dict[tuple[int, ...], str] | None = None) -> None:
        super().__init__()
        self.groups = dict(groups)
        self.by_ranks = by_ranks or {}
        self.timed = timed
        self.clock = clock or (lambda: (time.perf_counter(), 0.0))
        self.phase = "other"
        self.calls: list[tuple[str, str, str, int, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        ns = func.namespace
        if ns not in ("c10d", "_c10d_functional") or func._opname not in OPS:
            return func(*args, **kwargs)
        op = OPS[func._opname]
        axis = self._axis(_group_name(ns, args, kwargs) or "")
        t0 = self.clock()
        out = func(*args, **kwargs)
        if self.timed and op not in P2P:
            _wait(ns, out)
        t1 = self.clock()
        seconds = max((t1[0] - t0[0]) - (t1[1] - t0[1]), 0.0)
        self.calls.append((axis, self.phase, op, call_bytes(ns, func._opname, args), seconds))
        return out

    def _axis(self, name: str) -> str:
        """The mesh axis of a process group, by name, else by its ranks (remembered)."""
        if name not in self.groups:
            ranks = _ranks_of(name) if name else None
            self.groups[name] = self.by_ranks.get(ranks, "?") if ranks is not None else "?"
        return self.groups[name]

    def totals(self) -> dict[str, dict[str, dict[str, float]]]:
        """{axis: {op: {"n", "bytes", "time_s"}}} over everything recorded."""
        out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
        for axis, _phase, op, nbytes, sec in self.calls:
            d = out[axis].setdefault(op, {"n": 0, "bytes": 0, "time_s": 0.0})
            d["n"] += 1
            d["bytes"] += nbytes
            d["time_s"] += sec
        return {a: dict(v) for a, v in out.items()}

    def by_phase(self) -> dict[str, dict[str, int]]:
        """{"<axis>:<op>": {phase: count}}: where in the step each kind was issued (informational)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for axis, phase, op, _nbytes, _sec in self.calls:
            out[f"{axis}:{op}"][phase] += 1
        return {k: dict(v) for k, v in out.items()}


def _wait(namespace: str, out: Any) -> None:
    if namespace == "_c10d_functional":
        torch.ops._c10d_functional.wait_tensor(out)
        return
    items = out if isinstance(out, (tuple, list)) else [out]
    for item in items:
        if isinstance(item, torch.ScriptObject):
            try:
                dist.distributed_c10d.Work.unbox(item).wait()
            except RuntimeError:
                continue
    for t in _tensors(out):
        if t.is_cuda:
            torch.cuda.synchronize(t.device)
            break
