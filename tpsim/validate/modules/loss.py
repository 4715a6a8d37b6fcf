"""The loss of a model whose forward does not return one (rank side and tracer, torch).

A traced model's forward may return a loss (a scalar) or its outputs (a classifier's logits, a U-Net's noise
prediction). ``tpsim trace`` and the validation ranks then use the same documented synthetic loss, so that the
op graph that is costed and the model that is run are one: **the mean of the first tensor output**
(docs/OPGRAPH.md). Its gradient is ``1 / numel`` at every element of that output, so every parameter gets a
gradient through the same backward ops a real loss would run. An output that is a tensor
shard (``DTensor``) is averaged as a ``DTensor``: DTensor reduces it over the mesh as the traced graph's ``mean``
does on the full tensor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _tensors(obj: Any) -> Iterator[Any]:
    """Tensors in a nested structure (lists, tuples, dicts), in order (torch imported here only)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def as_loss(out: Any) -> Any:
    """The model's loss: its output if that is a scalar, else the mean of its first tensor output (in fp32 at
    least: a bf16/fp16 output is averaged in fp32, an fp64 one, as the numerics check runs, in fp64)."""
    import torch

    tensors = list(_tensors(out))
    if not tensors:
        raise ValueError("the model's forward returned no tensor")
    first = tensors[0]
    if first.numel() == 1:
        return first
    return (first if first.dtype in (torch.float32, torch.float64) else first.float()).mean()
