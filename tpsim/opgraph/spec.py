"""Module specs (``package.module:factory`` or ``path/to/file.py:callable``), keyword arguments and input
shapes as ``tpsim trace`` and ``tpsim validate`` take them (torch-free: the factory is resolved, not called)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError
from ..limits import LIMITS, MAX_INPUT_NUMEL, ascii_int  # noqa: F401 (MAX_INPUT_NUMEL: importable here)

INPUT_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """One model input: shape (dim 0 = batch) and dtype."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def text(self) -> str:
        return ",".join(map(str, self.shape)) + ("" if self.dtype == "float32" else f":{self.dtype}")


def parse_input_shape(text: str) -> InputSpec:
    """``1,3,224,224`` or ``1x2048:int64`` -> InputSpec (dims > 0; dim 0 is the batch)."""
    body, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    aliases = {"long": "int64", "int": "int64", "float": "float32", "half": "float16", "bf16": "bfloat16",
               "fp32": "float32", "fp16": "float16"}
    dtype = aliases.get(dtype, dtype)
    if dtype not in INPUT_DTYPES:
        raise InputError(f"--input-shape {text}: dtype {dtype!r} is not one of {', '.join(INPUT_DTYPES)}")
    parts = body.replace("x", ",").split(",")
    dims = [ascii_int(p.strip()) for p in parts]  # ASCII digits only: int() reads '١' as 1 (issue 26)
    if any(d is None for d in dims):
        raise InputError(f"--input-shape {text}: dims must be integers separated by ',' or 'x'")
    shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    if not shape or len(shape) > 8 or any(d <= 0 for d in shape):
        raise InputError(f"--input-shape {text}: 1 to 8 dims, each a positive integer")
    if shape[0] > LIMITS["micro_batch"]:
        raise InputError(f"--input-shape {text}: batch {shape[0]} is above the supported maximum "
                         f"{LIMITS['micro_batch']}")
    if math.prod(shape) > MAX_INPUT_NUMEL:
        raise InputError(f"--input-shape {text}: {math.prod(shape)} elements, above the supported {MAX_INPUT_NUMEL}")
    return InputSpec(shape=shape, dtype=dtype)


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """``key=value`` items; values are Python literals (``24``, ``(3, 4, 6, 3)``, ``'gelu'``) or plain words."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise InputError(f"--kwarg {item!r}: expected NAME=VALUE")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The callable a module spec names."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise InputError(f"module spec {spec!r}: expected package.module:factory or path/to/file.py:callable")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise InputError(f"module spec {spec!r}: file {target} does not exist")
        name = f"tpsim_traced_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise InputError(f"module spec {spec!r}: {target} cannot be imported")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: report, do not crash
            raise InputError(f"module spec {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise InputError(f"module spec {spec!r}: cannot import {target} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"module spec {spec!r}: {target} has no callable {attr!r}")
    return factory
