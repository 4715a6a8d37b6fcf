"""A rank's part of a :class:`~tpsim.validate.plan.case.PlanCase`: its model chunks, sharded over every axis.

Layers are the blocks of :mod:`tpsim.validate.modules.block` (seeded per global layer index, so every rank builds the
same weights), grouped in model chunks (:class:`Chunk`, one pipeline stage each). Per chunk, in the order
torchtitan applies them:

1. tensor parallelism: each block through ``parallelize_module`` on the ``tp`` sub-mesh with the plan's styles
   (:func:`tpsim.validate.modules.styles.shard_block`);
2. data parallelism on the ``dp`` sub-mesh, by ZeRO stage (:data:`tpsim.validate.plan.case.ZERO_RUNTIME`):
   ZeRO-0 ``DistributedDataParallel`` (after ``_pre_dp_module_transform`` when the chunk holds DTensors: DDP
   takes local tensors); ZeRO-1 nothing here (the optimizer shards, :mod:`tpsim.validate.modules.zero1`); ZeRO-2/3
   FSDP2 ``fully_shard`` per block then on the chunk, ``reshard_after_forward`` False / True;
3. pipeline parallelism: a ``PipelineStage`` per chunk on the ``pp`` sub-mesh's group, driven by
   ``Schedule1F1B`` (vpp = 1) or ``ScheduleInterleaved1F1B``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from ..modules.block import build_block
from .case import PlanCase
from ..modules.styles import shard_block

BUCKET_MB = 25
"""DDP gradient bucket size, MiB (DDP's default; given explicitly so that the first bucket is no smaller)."""
ADAM_LR = 1e-2
ADAM_EPS = 1e-2
"""Adam of every run and of the reference: eps well above the gradients' rounding noise, so that the first
step's update lr g / (|g| + eps) is smooth in g (the default 1e-8 would turn gradients that are zero in theory
into +-lr updates of random sign)."""


class Chunk(nn.Module):
    """Consecutive transformer layers (one model chunk, a pipeline stage), named by global layer index."""

    def __init__(self, blocks: dict[int, nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): b for i, b in blocks.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers.values():
            x = block(x)
        return x


def build_chunk(case: PlanCase, layers: range, dropout: bool = False) -> Chunk:
    """Unsharded layers ``layers`` of the case's model (layer i seeded with ``case.seed + i``)."""
    m = case.model
    return Chunk({i: build_block(m, case.tp, case.fused, m.seq_len, case.seed + i, dropout=dropout) for i in layers})


def linear_loss(y: torch.Tensor, target: torch.Tensor, numel: int) -> torch.Tensor:
    """sum(y x target) / numel: linear in y, so its gradient target / numel is exact; ``numel`` is the
    micro-batch's full output size (under SP each TP rank holds a sequence shard and sums its part)."""
    return (y * target).sum() / numel


@dataclass
class RankRuntime:
    """What one rank runs: its chunks (wrapped), their pipeline stages and schedule, and the optimizer."""

    case: PlanCase
    mesh: DeviceMesh
    coords: dict[str, int]
    """this rank's index along each axis."""
    chunks: list[nn.Module]
    """model chunks as wrapped (DDP / FSDP2 / plain), in stage order."""
    stage_ids: list[int]
    optimizer: Any
    schedule: Any = None
    stages: list = field(default_factory=list)
    sp_norm_params: list = field(default_factory=list)
    """replicated norm weights under SP: their gradients are partial sums over the TP group until
    materialized (one all-reduce per step, DTensor's rule)."""
    params: list = field(default_factory=list)
    """(reference name, parameter) of every chunk, taken when the chunks were wrapped: DDP's TP composition
    swaps the parameters for DTensors during each forward and back, and leaves ``named_parameters()`` empty
    afterwards, so the list is kept rather than asked for again."""

    @property
    def first(self) -> bool:
        """This rank holds the first stage (it feeds the micro-batches)."""
        return 0 in self.stage_ids

    @property
    def last(self) -> bool:
        """This rank holds the last stage (it computes the loss): rank pp - 1, or rank 0 in a V."""
        return self.case.chunks - 1 in self.stage_ids

    def parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(reference name, parameter) of every chunk: ``layers.<i>.<...>`` without the wrappers' prefixes."""
        return list(self.params)


def axis_coords(case: PlanCase, rank: int) -> dict[str, int]:
    """Index of ``rank`` along each axis (innermost axis fastest)."""
    coords = {}
    for axis, size in reversed(case.mesh_axes()):
        rank, coords[axis] = divmod(rank, size)
    return coords


def sub_mesh(mesh: DeviceMesh, axis: str) -> DeviceMesh:
    return mesh[axis]


def build_runtime(case: PlanCase, mesh: DeviceMesh, rank: int, loss_fn: Callable, device: torch.device,
                  dropout: bool = False) -> RankRuntime:
    """This rank's chunks, sharded over tp, wrapped for dp, staged for pp, with the optimizer."""
    coords = axis_coords(case, rank)
    stage_ids = case.stages_of(coords["pp"])
    chunks, sp_norms = [], []
    for stage in stage_ids:
        chunk = build_chunk(case, case.stage_layers(stage), dropout).to(device)
        if case.tp > 1:
            for block in chunk.layers.values():
                shard_block(block, sub_mesh(mesh, "tp"), case.model, case.sp, case.fused)
        wrapped = _wrap_dp(case, chunk, mesh)
        if case.sp:  # the wrappers may replace the parameter objects: take them afterwards
            sp_norms += [p for n, p in wrapped.named_parameters() if "norm" in n]
        chunks.append(wrapped)
    params = [(name.removeprefix("module."), p) for c in chunks for name, p in c.named_parameters()]
    optimizer = _optimizer(case, [p for _, p in params], mesh)
    rt = RankRuntime(case=case, mesh=mesh, coords=coords, chunks=chunks, stage_ids=stage_ids, optimizer=optimizer,
                     sp_norm_params=sp_norms, params=params)
    if case.pp > 1:
        _pipeline(rt, loss_fn, device)
    return rt


def _wrap_dp(case: PlanCase, chunk: Chunk, mesh: DeviceMesh) -> nn.Module:
    if case.dp == 1 or case.zero == 1:
        return chunk
    dp_mesh = sub_mesh(mesh, "dp")
    if case.zero == 0:
        from torch.nn.parallel import DistributedDataParallel as DDP
        if case.tp > 1:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
            _pre_dp_module_transform(chunk)
        return DDP(chunk, process_group=dp_mesh.get_group(), bucket_cap_mb=BUCKET_MB, **_no_buffer_sync(DDP))
    from torch.distributed.fsdp import fully_shard
    reshard = case.zero == 3
    for block in chunk.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard)
    return chunk


def _no_buffer_sync(ddp_class: type) -> dict[str, bool]:
    """Do not broadcast buffers every forward (the rotary tables are the same on every rank): the flag is
    ``forward_sync_buffers`` from torch 2.13 on, ``broadcast_buffers`` before (deprecated since)."""
    import inspect
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp_class).parameters \
        else "broadcast_buffers"
    return {name: False}


def _optimizer(case: PlanCase, params: list[nn.Parameter], mesh: DeviceMesh) -> Any:
    if case.dp > 1 and case.zero == 1:
        from ..modules.zero1 import ShardedAdam
        return ShardedAdam(params, sub_mesh(mesh, "dp").get_group(), lr=ADAM_LR, eps=ADAM_EPS)
    return torch.optim.Adam(params, lr=ADAM_LR, eps=ADAM_EPS, foreach=False)


def _pipeline(rt: RankRuntime, loss_fn: Callable, device: torch.device) -> None:
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage

    from .case import TORCH_SCHEDULES

    case = rt.case
    group = sub_mesh(rt.mesh, "pp").get_group()
    rt.stages = [PipelineStage(chunk, stage, case.chunks, device, group=group)
                 for chunk, stage in zip(rt.chunks, rt.stage_ids)]
    if case.runtime == "ddp":
        _settle_ddp_buckets(rt, device)
    if case.pp_schedule == "1f1b" and case.vpp > 1:
        rt.schedule = pipelining.ScheduleInterleaved1F1B(rt.stages, case.microbatches, loss_fn=loss_fn)
    elif case.pp_schedule in ("1f1b", "gpipe"):
        cls = getattr(pipelining, TORCH_SCHEDULES[case.pp_schedule])
        rt.schedule = cls(rt.stages[0], case.microbatches, loss_fn=loss_fn)
    else:  # multi-stage schedules (zero-bubble, DualPipeV): every local stage
        cls = getattr(pipelining.schedules, TORCH_SCHEDULES[case.pp_schedule])
        rt.schedule = cls(rt.stages, case.microbatches, loss_fn=loss_fn)


def _settle_ddp_buckets(rt: RankRuntime, device: torch.device) -> None:
    """Two plain forward/backward passes of each DDP chunk before the schedule runs, then gradients cleared.

    In torch 2.13, DDP under ``PipelineStage`` fails the bucket rebuild of its second step (``rebuilt
    parameter indices size is not same as original model parameters size``: the first step's micro-batch
    backwards record the gradient-ready order more than once). After two ordinary iterations DDP has rebuilt
    its buckets and never does again; the schedule then runs as torchtitan-style PP + DDP would."""
    case = rt.case
    seq = case.model.seq_len // case.tp if case.sp else case.model.seq_len
    x = torch.zeros(case.micro_batch, seq, case.model.hidden_size, device=device)
    for chunk in rt.chunks:
        for _ in range(2):
            chunk(x).sum().backward()
        chunk.zero_grad(set_to_none=True)


def finalize_grads(rt: RankRuntime) -> None:
    """Sum the partial gradients of the replicated norm weights under SP over the TP group, once per step
    (DTensor materializes them with one all-reduce each; Megatron's ``finalize_model_grads`` does the same).
    FSDP2 does it itself before each reduce-scatter; under DDP's TP composition the parameters are local
    tensors re-wrapped by ``DTensor.from_local`` in every forward, whose backward already sums them."""
    if not rt.sp_norm_params or rt.case.runtime in ("fsdp2", "fsdp2-no-reshard", "ddp"):
        return
    from torch.distributed.tensor import DTensor, Replicate
    for p in rt.sp_norm_params:
        if isinstance(p.grad, DTensor):
            p.grad = p.grad.redistribute(placements=[Replicate()])
