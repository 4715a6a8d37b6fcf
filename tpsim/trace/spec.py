"""Building a module spec's model on a device (the torch side of :mod:`tpsim.opgraph.spec`)."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..opgraph.spec import INPUT_DTYPES, InputSpec, parse_input_shape, parse_kwargs, resolve_factory

__all__ = ["INPUT_DTYPES", "InputSpec", "parse_input_shape", "parse_kwargs", "resolve_factory", "build_module"]


def build_module(spec: str, kwargs: dict[str, Any], device: str = "meta") -> Any:
    """``factory(**kwargs)`` built under ``torch.device(device)`` (meta: shapes only, no memory)."""
    import torch

    factory = resolve_factory(spec)
    try:
        with torch.device(device):
            model = factory(**kwargs)
    except Exception as exc:  # the user's factory: one line, not a traceback
        raise InputError(f"module spec {spec!r}: building the model failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"module spec {spec!r}: the factory returned {type(model).__name__}, not an nn.Module")
    return model
