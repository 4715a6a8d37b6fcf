"""What each rank measures for one :class:`~tpsim.validate.axis.case.AxisCase` (rank side, torch).

* **Numerics** (fp64, so that rounding cannot flip a token's top-k experts between the sharded and the
  unsharded run): the unsharded block on each replica's micro-batch against the sharded block on this rank's
  part (the load-balanced sequence chunks of its replica): output, input gradient and every parameter gradient.
  A replicated parameter's gradient is summed over the ranks first and a routed expert's over its expert
  data-parallel group (the dp x cp and edp gradient reductions of a training step, which the cost model puts in
  the step, not the layer), outside the recorded region.
* **Communication** (fp32, the plan's dtype): one forward and backward under
  :class:`tpsim.validate.axis.rec.AxisRecorder`, every collective and send/receive by axis and phase.
* **Time** (fp32): ``warmup`` then ``reps`` iterations of forward and backward (seconds without run-queue time,
  and wall); then ``reps`` iterations with every exchange and all-to-all waited for where it is issued, for the
  time of each kind (:class:`tpsim.validate.modules.cp_attention.CommLog`).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist

from .block import build_reference, expert_slice, shard_block
from .case import AxisCase
from .rec import AxisRecorder
from ..modules.cp_attention import CommLog, logging_comm, shard_sequence
from ..block.measure import MAGNITUDE_FLOOR, Clock, sync
from ..modules.moe import MoEFeedForward

NUMERICS_RTOL_FP64 = 1e-9
"""max |sharded - unsharded| / max(max |unsharded|, 1) per tensor in fp64 (rounding is ~1e-16 per operation)."""

_GROUPS: dict[tuple[int, int, int], dict[str, Any]] = {}


def _layout_groups(world: int, size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rank lists of an axis of ``size`` that is innermost (consecutive ranks) and of the axis outside it."""
    inner = [list(range(b * size, (b + 1) * size)) for b in range(world // size)]
    outer = [list(range(o, world, size)) for o in range(size)]
    return inner, outer


def axis_groups(case: AxisCase, rank: int) -> dict[str, Any]:
    """This rank's process group per axis (cp, dp: dense; ep, edp: experts), None for an axis of size 1. Every
    rank creates every group in the same order (``new_group`` is collective); each axis gets a group of its
    own, so that the recorder tells axes apart by group even when two axes span the same ranks."""
    key = (case.cp, case.dp, case.ep)
    if key not in _GROUPS:
        world, groups = case.world, {}
        for (inner, outer), (a, b) in ((_layout_groups(world, case.cp), ("cp", "dp")),
                                       (_layout_groups(world, case.ep), ("ep", "edp"))):
            for axis, lists in ((a, inner), (b, outer)):
                groups[axis] = None
                if len(lists[0]) == 1:
                    continue
                for ranks in lists:
                    pg = dist.new_group(ranks)
                    if rank in ranks:
                        groups[axis] = pg
        _GROUPS[key] = groups
    return _GROUPS[key]


def global_inputs(case: AxisCase, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and output gradient of every replica: (dp x micro_batch, seq, hidden), N(0, 1), seeded."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    shape = (case.dp * case.micro_batch, case.model.seq_len, case.model.hidden_size)
    return (torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype),
            torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype))


def local_part(case: AxisCase, t: torch.Tensor, coords: dict[str, int]) -> torch.Tensor:
    """This rank's part of a global tensor: its replica's micro-batch, its load-balanced sequence chunks."""
    b = case.micro_batch
    part = t[coords["dp"] * b:(coords["dp"] + 1) * b]
    return shard_sequence(part, case.cp, coords["cp"]) if case.cp > 1 else part.contiguous()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _sharded(case: AxisCase, ref: torch.nn.Module, groups: dict[str, Any]) -> torch.nn.Module:
    return shard_block(ref, case.model, case.fused, case.model.seq_len, cp_group=groups["cp"],
                       cp_kind=case.cp_kind, ep_group=groups["ep"])


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got - ref).abs().max().item() / max(ref.abs().max().item(), MAGNITUDE_FLOOR)


def check_numerics(case: AxisCase, rank: int, groups: dict[str, Any]) -> dict[str, float]:
    """Relative error per tensor (output, input gradient, every parameter gradient) in fp64."""
    device, coords = _device(), case.coords(rank)
    ref = build_reference(case.model, case.fused, case.model.seq_len, case.seed).to(device, torch.float64)
    block = _sharded(case, ref, groups)
    x_all, dy_all = global_inputs(case, torch.float64, device)
    x_ref = x_all.clone().requires_grad_()
    b = case.micro_batch
    y_ref = torch.cat([ref(x_ref[j * b:(j + 1) * b]) for j in range(case.dp)])  # each replica on its own
    y_ref.backward(dy_all)
    x = local_part(case, x_all, coords).requires_grad_()
    y = block(x)
    y.backward(local_part(case, dy_all, coords))
    errors = {"output": _rel(y.detach(), local_part(case, y_ref.detach(), coords)),
              "input_grad": _rel(x.grad, local_part(case, x_ref.grad, coords))}
    ref_params = dict(ref.named_parameters())
    for name, p in block.named_parameters():
        rows = expert_slice(name, block.feed_forward)
        grad = p.grad.detach().clone()
        group = groups["edp"] if rows is not None else dist.group.WORLD
        if rows is None or group is not None:
            dist.all_reduce(grad, group=group)
        want = ref_params[name].grad if rows is None else ref_params[name].grad[rows]
        errors[f"grad:{name}"] = _rel(grad, want)
    return errors


def record_comm(case: AxisCase, rank: int, groups: dict[str, Any]) -> tuple[dict, int]:
    """Every collective of one fp32 forward and backward by (axis, phase, op): {"n", "bytes"}; and the token
    copies this rank's experts processed (0 without experts)."""
    device, coords = _device(), case.coords(rank)
    block = _sharded(case, build_reference(case.model, case.fused, case.model.seq_len, case.seed).to(device), groups)
    x_all, dy_all = global_inputs(case, torch.float32, device)
    x = local_part(case, x_all, coords).requires_grad_()
    names = {pg.group_name: axis for axis, pg in groups.items() if pg is not None}
    recorder = AxisRecorder(names)
    with recorder:
        recorder.phase = "fwd"
        y = block(x)
        recorder.phase = "bwd"
        y.backward(local_part(case, dy_all, coords))
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for axis, phase, op, nbytes, _sec in recorder.calls:
        d = out.setdefault(axis, {}).setdefault(phase, {}).setdefault(op, {"n": 0, "bytes": 0})
        d["n"] += 1
        d["bytes"] += nbytes
    return out, _load(block)


def _load(block: torch.nn.Module) -> int:
    ff = block.feed_forward
    return ff.load if isinstance(ff, MoEFeedForward) else 0


def check_axis(case: AxisCase, rank: int) -> dict[str, Any]:
    """Numerics (fp64) and communication (fp32) of one case on this rank."""
    groups = axis_groups(case, rank)
    errors = check_numerics(case, rank, groups)
    comm, load = record_comm(case, rank, groups)
    return {"coords": case.coords(rank), "numerics": errors, "numerics_ok": max(errors.values()) <= NUMERICS_RTOL_FP64,
            "comm": comm, "expert_load": load}


def time_axis(case: AxisCase, rank: int) -> dict[str, Any]:
    """Forward and backward seconds per iteration (see module docstring), then the communication's."""
    groups = axis_groups(case, rank)
    device, coords = _device(), case.coords(rank)
    ref = build_reference(case.model, case.fused, case.model.seq_len, case.seed, dropout=True).to(device)
    block = _sharded(case, ref, groups)
    del ref
    x_all, dy_all = global_inputs(case, torch.float32, device)
    x0, dy = local_part(case, x_all, coords), local_part(case, dy_all, coords)
    clock = Clock()

    def step() -> tuple[tuple[float, float], tuple[float, float]]:
        for p in block.parameters():
            p.grad = None
        x = x0.detach().requires_grad_()
        dist.barrier()
        sync(device)
        t0 = clock.now()
        y = block(x)
        sync(device)
        t1 = clock.now()
        y.backward(dy)
        sync(device)
        return Clock.since(t0, t1), Clock.since(t1, clock.now())

    for _ in range(case.warmup):
        step()
    fwd, bwd = zip(*(step() for _ in range(case.reps)))
    calls = []
    for _ in range(case.reps):
        with logging_comm(CommLog(clock.now)) as log:
            step()
        calls.append(log.calls)
    return {"fwd_s": statistics.median(f[0] for f in fwd), "bwd_s": statistics.median(b[0] for b in bwd),
            "fwd_wall_all_s": [f[1] for f in fwd], "bwd_wall_all_s": [b[1] for b in bwd],
            "fwd_all_s": [f[0] for f in fwd], "bwd_all_s": [b[0] for b in bwd],
            "fwd_delay_all_s": [f[1] - f[0] for f in fwd], "bwd_delay_all_s": [b[1] - b[0] for b in bwd],
            "comm_calls": calls, "expert_load_timed": _load(block)}
