"""Map the styles of :func:`tpsim.tp_plan.layer_plan` to torch's ``ParallelStyle`` objects.

This is the only place where the plan's vocabulary meets torch's API, so what the estimator costs and what
``parallelize_module`` runs come from one description (``layer_plan``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
try:
    from torch.distributed.tensor import Replicate, Shard
except ImportError:  # torch < 2.5
    from torch.distributed._tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from ...model import ModelSpec
from ...tp_plan import layer_plan

SEQ_DIM = 1
"""sequence dimension of the (batch, seq, hidden) activations."""


def to_style(style: str) -> ParallelStyle:
    """One ``layer_plan`` style name as a torch ParallelStyle (see :mod:`tpsim.tp_plan` for the meanings)."""
    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    if style == "rowwise:seq":
        return RowwiseParallel(output_layouts=Shard(SEQ_DIM))
    if style == "sequence":
        return SequenceParallel(sequence_dim=SEQ_DIM)
    if style == "gather:seq":
        return PrepareModuleInput(input_layouts=(Shard(SEQ_DIM),), desired_input_layouts=(Replicate(),))
    raise ValueError(f"unknown tensor-parallel style {style!r}")


def parallelize_plan(model: ModelSpec, sp: bool, fused: bool) -> dict[str, ParallelStyle]:
    """``layer_plan(model, sp, fused)`` translated for ``parallelize_module``."""
    return {name: to_style(style) for name, style in layer_plan(model, sp, fused).items()}


def shard_block(block: nn.Module, mesh: DeviceMesh, model: ModelSpec, sp: bool, fused: bool) -> nn.Module:
    """Shard ``block`` in place over the 1-D TP ``mesh`` with the plan's styles; returns it. With one rank
    (tp = 1) the block stays a plain module: no DTensor, as a run without tensor parallelism has none."""
    if mesh.size() == 1:
        return block
    return parallelize_module(block, mesh, parallelize_plan(model, sp, fused))
