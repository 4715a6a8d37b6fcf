"""Trace a module (or a module spec) into an :class:`~tpsim.opgraph.schema.OpGraph`."""

from __future__ import annotations

import datetime
import math
from typing import Any

import torch

from .. import __version__
from ..errors import InputError
from ..opgraph.schema import OpGraph, TensorMeta
from .classify import classify
from .record import dtype_name, record_forward
from .spec import InputSpec, build_module
from .units import build_units, find_groups

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def _meta_input(spec: InputSpec) -> torch.Tensor:
    dtype = TORCH_DTYPES[spec.dtype]
    if dtype.is_floating_point:
        return torch.empty(spec.shape, dtype=dtype, device="meta")
    return torch.zeros(spec.shape, dtype=dtype, device="meta")


def trace_module(model: torch.nn.Module, inputs: list[InputSpec], name: str = "model",
                 source: dict[str, Any] | None = None, tokens_per_sample: int | None = None) -> OpGraph:
    """One forward pass of ``model`` (training mode, on whatever device its parameters live: meta for
    ``tpsim trace``) on inputs of the given shapes; the op graph it ran."""
    if not inputs:
        raise InputError("at least one --input-shape is needed")
    batch = inputs[0].shape[0]
    for spec in inputs[1:]:
        if spec.shape[0] != batch:
            raise InputError(f"--input-shape {spec.text()}: dim 0 must be the batch {batch} of every input")
    model.train()
    tensors = [_meta_input(s) for s in inputs]
    try:
        rec, _ = record_forward(model, tensors)
    except InputError:
        raise
    except Exception as exc:  # the user's forward on these shapes: one line
        raise InputError(f"the forward pass failed on inputs {[s.text() for s in inputs]}: "
                         f"{type(exc).__name__}: {exc}") from None
    if not rec.ops:
        raise InputError("the forward pass ran no operation")
    classified = [classify(op) for op in rec.ops]
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    groups = find_groups(model, rec.ops, classified, params)
    units = build_units(rec, classified, groups)
    if tokens_per_sample is None:
        first = inputs[0]
        integer = not TORCH_DTYPES[first.dtype].is_floating_point
        tokens_per_sample = math.prod(first.shape[1:]) if integer and len(first.shape) >= 2 else 1
    meta = {"tpsim_version": __version__, "torch_version": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "inputs": [s.text() for s in inputs], **(source or {})}
    return OpGraph(name=name, units=tuple(units), params=params, batch=batch,
                   inputs=tuple(TensorMeta(shape=s.shape, dtype=s.dtype) for s in inputs),
                   dtype=dtype_name(next(model.parameters()).dtype) if any(True for _ in model.parameters())
                   else "float32", tokens_per_sample=tokens_per_sample, source=meta)


def trace_spec(spec: str, inputs: list[InputSpec], kwargs: dict[str, Any] | None = None, name: str | None = None,
               tokens_per_sample: int | None = None) -> OpGraph:
    """Build ``spec`` with ``kwargs`` on the meta device and trace it."""
    kwargs = kwargs or {}
    model = build_module(spec, kwargs)
    default = spec.rpartition(":")[2].replace("_", "-")
    return trace_module(model, inputs, name=name or default,
                        source={"module_spec": spec, "kwargs": {k: repr(v) for k, v in kwargs.items()}},
                        tokens_per_sample=tokens_per_sample)
