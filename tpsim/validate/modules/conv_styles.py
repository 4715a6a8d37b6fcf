"""Parallel styles for convolutions and channel-wise norms, the ``parallelize_module`` counterparts of the op
graph's ``colwise`` / ``rowwise`` / ``sharded`` styles on ``nn.Conv*d``, ``nn.BatchNorm*d`` and ``nn.GroupNorm``.

DTensor has no sharding rule for a convolution whose weight is split (its ``tp_convolution`` covers the spatial
split only), so these styles keep the weight as a DTensor split along output channels (``Shard(0)``) or input
channels (``Shard(1)``) and run the convolution on the local shards, with the same boundary collectives as
``ColwiseParallel`` / ``RowwiseParallel`` (Megatron-Core ``mappings.py``):

* :class:`ConvColwise`: input replicated; forward local; backward all-reduces the input gradient (the input is
  annotated ``Replicate`` and its gradient ``Partial``). Output: the local out-channel shard.
* :class:`ConvRowwise`: input the local in-channel shard; the output is a partial sum, all-reduced in forward
  (``Partial -> Replicate``); the bias (replicated) is added after the reduction.
* :class:`ChannelShard`: batch / group norms (per-channel statistics, affine weights split with the channels)
  and depthwise convolutions (one group per channel) on the local channel shard, no communication.

The collectives are DTensor redistributions, so ``CommDebugMode`` counts them like DTensor's own styles.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

try:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
except ImportError:  # torch < 2.5
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed._tensor.placement_types import _Partial as Partial
from torch.distributed.tensor.parallel import ParallelStyle

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm)


def _shard_param(module: nn.Module, name: str, mesh: DeviceMesh, dim: int) -> None:
    param = getattr(module, name)
    if param is None:
        return
    dt = distribute_tensor(param.detach(), mesh, [Shard(dim)])
    delattr(module, name)
    module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))


def _local(param: torch.Tensor | None) -> torch.Tensor | None:
    if param is None:
        return None
    return param.to_local() if isinstance(param, DTensor) else param


def _check_divides(module: nn.Module, what: str, size: int, mesh: DeviceMesh) -> None:
    if size % mesh.size():
        raise ValueError(f"{type(module).__name__}: tp={mesh.size()} does not divide {what}={size}")


class ConvColwise(ParallelStyle):
    """Output channels split: weight (and bias) ``Shard(0)``."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, CONV_TYPES) or module.groups != 1:
            raise ValueError(f"ConvColwise needs an nn.Conv*d with groups=1, got {module}")
        _check_divides(module, "out_channels", module.out_channels, device_mesh)
        _shard_param(module, "weight", device_mesh, 0)
        _shard_param(module, "bias", device_mesh, 0)

        def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
            # identity forward; the input gradient (partial over the out-channel shards) is all-reduced
            x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False).to_local(
                grad_placements=[Partial()])
            return self._conv_forward(x, _local(self.weight), _local(self.bias))

        module.forward = types.MethodType(forward, module)
        return module


class ConvRowwise(ParallelStyle):
    """Input channels split: weight ``Shard(1)``; the partial output all-reduced, then the bias added."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, CONV_TYPES) or module.groups != 1:
            raise ValueError(f"ConvRowwise needs an nn.Conv*d with groups=1, got {module}")
        _check_divides(module, "in_channels", module.in_channels, device_mesh)
        _shard_param(module, "weight", device_mesh, 1)

        def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
            y = self._conv_forward(x, _local(self.weight), None)
            y = DTensor.from_local(y, device_mesh, [Partial()], run_check=False).redistribute(
                device_mesh, [Replicate()]).to_local()
            if self.bias is not None:
                y = y + self.bias.view(1, -1, *([1] * (y.dim() - 2)))
            return y

        module.forward = types.MethodType(forward, module)
        return module


class ChannelShard(ParallelStyle):
    """Batch / group norm or depthwise convolution on the local channel shard (no communication)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp = device_mesh.size()
        if isinstance(module, CONV_TYPES):
            if not (module.groups == module.in_channels == module.out_channels):
                raise ValueError(f"ChannelShard on a convolution needs a depthwise one, got {module}")
            _check_divides(module, "channels", module.out_channels, device_mesh)
            _shard_param(module, "weight", device_mesh, 0)
            _shard_param(module, "bias", device_mesh, 0)
            groups = module.groups // tp

            def conv_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
                conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[x.dim() - 2]
                return conv(x, _local(self.weight), _local(self.bias), self.stride, self.padding, self.dilation,
                            groups)

            module.forward = types.MethodType(conv_forward, module)
            return module
        if isinstance(module, nn.GroupNorm):
            _check_divides(module, "num_groups", module.num_groups, device_mesh)
            _shard_param(module, "weight", device_mesh, 0)
            _shard_param(module, "bias", device_mesh, 0)
            groups = module.num_groups // tp

            def gn_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
                return F.group_norm(x, groups, _local(self.weight), _local(self.bias), self.eps)

            module.forward = types.MethodType(gn_forward, module)
            return module
        if isinstance(module, NORM_TYPES):
            _check_divides(module, "num_features", module.num_features, device_mesh)
            rank, size = device_mesh.get_local_rank(), module.num_features // tp
            for name in ("running_mean", "running_var"):
                buf = getattr(module, name)
                if buf is not None:
                    setattr(module, name, buf[rank * size:(rank + 1) * size].clone())
            _shard_param(module, "weight", device_mesh, 0)
            _shard_param(module, "bias", device_mesh, 0)

            def bn_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
                if self.training and self.num_batches_tracked is not None:
                    self.num_batches_tracked.add_(1)
                return F.batch_norm(x, self.running_mean, self.running_var, _local(self.weight), _local(self.bias),
                                    self.training or self.running_mean is None, self.momentum or 0.0, self.eps)

            module.forward = types.MethodType(bn_forward, module)
            return module
        raise ValueError(f"ChannelShard supports batch / group norms and depthwise convolutions, got {module}")
