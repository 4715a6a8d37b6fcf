"""Record one forward pass of a module on the meta device: every torch function call as the user wrote it.

Two interception layers (torch.overrides.TorchFunctionMode above torch.utils._python_dispatch.TorchDispatchMode):
the function layer sees ``F.linear``, ``F.conv2d``, ``F.scaled_dot_product_attention``, ``x + y``... (what the
op *is*); the dispatch layer under it sees the aten ops each call decomposes into, which gives the FLOPs (the
``torch.utils.flop_counter`` registry, as ``FlopCounterMode`` counts them) and tells views (no kernel) from
copies. Global module forward hooks keep the stack of module paths, so every op knows the module it ran in.
Tensors are identified by object identity (every tensor seen is kept alive during the trace, so ids are never
reused); views map to the storage they alias, so saved-tensor memory is counted once per storage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ..validate.modules.loss import _tensors, as_loss

# aten ops that only create views (no kernel, no bytes moved)
VIEW_ATEN = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "select",
             "slice", "as_strided", "alias", "detach", "split", "split_with_sizes", "unbind", "narrow",
             "_reshape_alias", "unflatten", "lift_fresh", "view_as", "expand_as", "diagonal", "movedim",
             "chunk", "unfold", "view_as_real", "view_as_complex", "_unsafe_split"}
MM_ATEN = {"mm", "bmm", "addmm", "baddbmm"}
# functions whose result is not a tensor op of the model (metadata, properties)
SKIP_FUNCTIONS = {"__get__", "__set__", "size", "dim", "numel", "stride", "is_contiguous", "__len__", "__iter__",
                  "__format__", "__repr__", "__bool__", "__index__", "__int__", "__float__", "item", "tolist",
                  "data_ptr", "element_size", "get_device", "storage_offset", "requires_grad_", "__hash__",
                  "__contains__", "is_floating_point", "is_complex", "has_names",
                  "_has_compatible_shallow_copy_type", "__reduce_ex__", "__setstate__", "__deepcopy__"}


@dataclass
class TensorInfo:
    """What the recorder knows about one tensor object."""

    root: int
    """key of the storage it aliases (itself unless it is a view)."""
    producer: int
    """index of the raw op that wrote it last; -1 for model inputs, -2 for parameters / constants."""
    batched: bool
    numel: int
    """elements of the tensor itself (a view: the view's)."""
    dtype: str
    param: str = ""
    """parameter name if the tensor is a parameter or a view of one."""


@dataclass
class RawOp:
    """One recorded function call."""

    fn: str
    module: str
    module_type: str
    inputs: list[int]
    """tensor keys of the tensor arguments (in order, flattened)."""
    outputs: list[int]
    params: list[str]
    flops: float
    copies: bool
    """the call ran at least one non-view aten op (a kernel)."""
    args: tuple
    kwargs: dict
    out_meta: list[tuple[tuple[int, ...], str]]
    in_meta: list[tuple[tuple[int, ...], str]]
    in_src: list[int]
    """raw index of the op that produced each input when this op ran (-1 model input, -2 constant)."""
    in_root: list[int]
    """storage key of each input."""
    in_batched: list[bool]
    aten: list[str] = field(default_factory=list)
    mm_shapes: list[tuple[tuple[int, ...], ...]] = field(default_factory=list)
    """operand shapes of the mm / bmm / addmm / baddbmm aten ops the call ran (for matmul attributes)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _AtenCounter(TorchDispatchMode):
    """Counts FLOPs and notes kernels of the aten ops under one function call."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0
        self.kernels: list[str] = []
        self.mm_shapes: list[tuple[tuple[int, ...], ...]] = []

    def reset(self) -> None:
        self.flops = 0.0
        self.kernels = []
        self.mm_shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in flop_registry:
            self.flops += float(flop_registry[packet](*args, **kwargs, out_val=out))
        name = func._opname.rstrip("_") if func._opname not in ("t_",) else "t"
        if name not in VIEW_ATEN:
            self.kernels.append(func._opname)
        if func._opname in MM_ATEN:
            operands = args[1:] if func._opname in ("addmm", "baddbmm") else args
            self.mm_shapes.append(tuple(tuple(a.shape) for a in operands[:2]))
        return out


class Recorder(TorchFunctionMode):
    """Records the function calls of one forward pass (use :func:`record_forward`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.module_names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        self.module_types = {id(m): type(m).__name__ for m in model.modules()}
        self.param_names: dict[int, str] = {}
        for name, p in model.named_parameters():  # tied parameters: the first name only
            self.param_names.setdefault(id(p), name)
        self.const_ids = {id(b) for b in model.buffers()}
        self.stack: list[tuple[str, str]] = [("", type(model).__name__)]
        self.info: dict[int, TensorInfo] = {}
        self.keep: list[torch.Tensor] = []
        self.ops: list[RawOp] = []
        self.counter = _AtenCounter()

    # ---- module stack --------------------------------------------------------------------------------
    def push(self, module: torch.nn.Module) -> None:
        name = self.module_names.get(id(module))
        if name is not None:
            self.stack.append((name, self.module_types[id(module)]))

    def pop(self, module: torch.nn.Module) -> None:
        if id(module) in self.module_names and len(self.stack) > 1:
            self.stack.pop()

    # ---- tensors --------------------------------------------------------------------------------------
    def key(self, t: torch.Tensor) -> int:
        """The tensor's key, registering parameters, buffers and unseen tensors (constants) on first sight."""
        k = id(t)
        if k not in self.info:
            self.keep.append(t)
            self.info[k] = TensorInfo(root=k, producer=-2, batched=False, numel=t.numel(),
                                      dtype=dtype_name(t.dtype), param=self.param_names.get(k, ""))
        return k

    def add_input(self, t: torch.Tensor) -> None:
        k = id(t)
        self.keep.append(t)
        self.info[k] = TensorInfo(root=k, producer=-1, batched=True, numel=t.numel(), dtype=dtype_name(t.dtype))

    # ---- function calls -------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "") or str(func)
        if name in SKIP_FUNCTIONS or name.startswith("_") and name not in ("__getitem__",):
            return func(*args, **kwargs)
        in_tensors = list(_tensors((args, kwargs)))
        self.counter.reset()
        with self.counter:
            out = func(*args, **kwargs)
        out_tensors = list(_tensors(out))
        if not out_tensors:
            return out
        in_keys = [self.key(t) for t in in_tensors]
        in_info = [(self.info[k].producer, self.info[k].root, self.info[k].batched) for k in in_keys]
        kernels = list(self.counter.kernels)
        batched = any(self.info[k].batched for k in in_keys)
        if not kernels:  # a view (or a no-op such as .float() on a float tensor): alias the input's storage
            self._alias(out_tensors, in_keys, batched)
            return out
        if not in_keys and not batched:  # creation op (arange, zeros, randn): a constant, not timed
            for t in out_tensors:
                self.key(t)
            return out
        index = len(self.ops)
        params = list(dict.fromkeys(self.info[k].param for k in in_keys if self.info[k].param))
        out_keys = []
        for t in out_tensors:
            k = id(t)
            if k in self.info and k in in_keys:  # in-place: the same tensor, written by this op
                info = self.info[k]
                info.producer, info.batched = index, batched or info.batched
            else:
                self.keep.append(t)
                self.info[k] = TensorInfo(root=k, producer=index, batched=batched, numel=t.numel(),
                                          dtype=dtype_name(t.dtype))
            out_keys.append(k)
        module, mtype = self.stack[-1]
        self.ops.append(RawOp(fn=name, module=module, module_type=mtype, inputs=in_keys, outputs=out_keys,
                              params=params, flops=self.counter.flops, copies=True, args=args, kwargs=kwargs,
                              out_meta=[(tuple(t.shape), dtype_name(t.dtype)) for t in out_tensors],
                              in_meta=[(tuple(t.shape), dtype_name(t.dtype)) for t in in_tensors],
                              in_src=[i[0] for i in in_info], in_root=[i[1] for i in in_info],
                              in_batched=[i[2] for i in in_info], aten=kernels,
                              mm_shapes=list(self.counter.mm_shapes)))
        return out

    def _alias(self, out_tensors: list[torch.Tensor], in_keys: list[int], batched: bool) -> None:
        src = next((k for k in in_keys if self.info[k].producer != -2 or self.info[k].batched), None)
        if src is None:
            src = in_keys[0] if in_keys else None
        for t in out_tensors:
            k = id(t)
            if src is None:
                self.key(t)
                continue
            if k == src:
                continue
            base = self.info[src]
            self.keep.append(t)
            self.info[k] = TensorInfo(root=base.root, producer=base.producer, batched=base.batched or batched,
                                      numel=t.numel(), dtype=dtype_name(t.dtype), param=base.param)


def record_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> tuple[Recorder, Any]:
    """Run ``model(*inputs)`` once under the recorder; returns the recorder and the output (a scalar loss is
    appended when the output is not one: its mean)."""
    rec = Recorder(model)
    for t in inputs:
        rec.add_input(t)
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: rec.push(m))  # noqa: ARG005 (a fixed signature)
    post = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: rec.pop(m), always_call=True)  # noqa: ARG005 (a fixed signature)
    try:
        with rec:
            out = model(*inputs)
            loss = as_loss(out)
    finally:
        pre.remove()
        post.remove()
    return rec, loss


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
