"""ZeRO-1: Adam with its states sharded over the data-parallel group (rank side).

Why tpsim's own and not ``torch.distributed.optim.ZeroRedundancyOptimizer``: that one expects gradients already
all-reduced (by DDP) and then broadcasts every rank's updated parameters, an all-reduce plus broadcasts per
step. ZeRO-1 as Megatron's distributed optimizer and DeepSpeed stage 1 run it, and as the estimator costs it, is
a reduce-scatter of the gradients and an all-gather of the updated weights per step. This optimizer does exactly
that: the rank's local gradients (DTensor local shards under TP) are laid end to end in one flat fp32 buffer,
padded to a multiple of dp; ``reduce_scatter_tensor`` (sum, then / dp: gloo has no average) leaves each rank its
contiguous 1/dp of the averaged gradient; Adam updates that slice of a flat fp32 master copy; and
``all_gather_into_tensor`` brings every rank the updated flat weights, copied back into the parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own storage of a (possibly DTensor) tensor."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class ShardedAdam:
    """Adam over ``params`` with master weights and moments sharded over ``group`` (see module docstring)."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup, lr: float, eps: float) -> None:
        self.params = params
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        locals_ = [_local(p.detach()) for p in params]
        self.numels = [t.numel() for t in locals_]
        total = sum(self.numels)
        self.shard = -(-total // self.size)
        self.padded = self.shard * self.size
        flat = torch.zeros(self.padded, dtype=torch.float32, device=locals_[0].device)
        torch.cat([t.reshape(-1).float() for t in locals_], out=flat[:total])
        lo = self.rank * self.shard
        self.master = nn.Parameter(flat[lo:lo + self.shard].clone())
        self.inner = torch.optim.Adam([self.master], lr=lr, eps=eps, foreach=False)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (a fixed signature)
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        device = self.master.device
        flat = torch.zeros(self.padded, dtype=torch.float32, device=device)
        offset = 0
        for p, n in zip(self.params, self.numels):
            if p.grad is not None:
                flat[offset:offset + n].copy_(_local(p.grad).reshape(-1))
            offset += n
        grad = torch.empty(self.shard, dtype=torch.float32, device=device)
        dist.reduce_scatter_tensor(grad, flat, group=self.group)
        self.master.grad = grad.div_(self.size)
        self.inner.step()
        weights = torch.empty(self.padded, dtype=torch.float32, device=device)
        dist.all_gather_into_tensor(weights, self.master.detach(), group=self.group)
        offset = 0
        for p, n in zip(self.params, self.numels):
            local = _local(p.data)
            local.copy_(weights[offset:offset + n].view_as(local))
            offset += n

    def sharded_numel(self) -> int:
        """Elements of master weights (and of each Adam moment) this rank holds."""
        return self.shard
