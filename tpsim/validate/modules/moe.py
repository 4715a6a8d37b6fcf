"""The mixture-of-experts MLP of a block as ``tpsim validate`` runs it (rank side, torch), with Megatron-Core's
``alltoall`` token dispatcher over the expert-parallel group.

* **Router**: a linear layer to the routed experts' logits, softmax, top-k, the k probabilities renormalized
  (Mixtral's routing; Megatron-Core's default ``topk`` then ``softmax`` gives the same weights). Dropless: every
  token goes to its k experts (no capacity factor).
* **Dispatch** (``MoEAlltoAllTokenDispatcher``): each rank counts the copies it sends to every expert, the counts
  are all-gathered over the ep group (metadata: each rank learns how many copies it receives from each rank for
  each of its experts), the copies are permuted expert by expert and all-to-all'ed with those split sizes, then
  sorted by local expert (``sort_chunks_by_idxs``).
* **Experts**: ``num_experts / ep`` local experts (at least 2 per rank), each a SwiGLU (or GeLU) MLP of
  ``moe_ffn_hidden_size``, run one after the other on their tokens (what a grouped GEMM computes).
* **Combine**: the reverse sort, the reverse all-to-all, then each copy weighted by its routing probability and
  summed into its token (``unpermute``). The backward of each all-to-all is the reverse all-to-all
  (Megatron-Core ``_AllToAll``).
* **Shared experts** (DeepSeek, Qwen-MoE): a dense MLP of ``num_shared_experts x shared_expert_ffn_hidden_size``
  on every token, added to the routed output (Qwen's sigmoid gate when the model has one).

The probabilities are applied after the combine (Megatron-Core releases up to 0.11 and the cost model); current
Megatron-Core main all-to-alls them with the tokens instead (a second, small all-to-all each way): see
docs/VALIDATION.md. ``ep = 1`` (the unsharded reference) runs every expert locally with no communication.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...model import ModelSpec
from .cp_attention import active_log


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with split sizes over a group; backward: the reverse all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any,
                key: str) -> torch.Tensor:
        ctx.args = (in_splits, out_splits, group, key.replace("fwd:", "bwd:"))
        return _all_to_all(x, out_splits, in_splits, group, key)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        out_splits, in_splits, group, key = ctx.args
        return _all_to_all(grad.contiguous(), out_splits, in_splits, group, key), None, None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any,
                key: str) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    log = active_log()
    if log is None:
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out
    with log.timed(key):
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def _all_gather(t: torch.Tensor, group: Any) -> torch.Tensor:
    """(size, *t.shape): every rank's ``t`` (``all_gather_single`` where torch has it)."""
    out = t.new_empty((group.size() * t.shape[0], *t.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    log = active_log()
    if log is None:
        gather(out, t.contiguous(), group=group)
    else:
        with log.timed("fwd:ep:all_gather"):
            gather(out, t.contiguous(), group=group)
    return out.view(group.size(), *t.shape)


class Experts(nn.Module):
    """``local`` routed experts, weights stacked: w1 (and w3, gated) (local, ffn, hidden), w2 (local, hidden, ffn)."""

    def __init__(self, hidden: int, ffn: int, local: int, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.w1 = nn.Parameter(torch.empty(local, ffn, hidden))
        if gated:
            self.w3 = nn.Parameter(torch.empty(local, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(local, hidden, ffn))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``x``: the copies sorted by local expert, ``counts[e]`` of them for expert e."""
        # unbind once: indexing the stack per expert would make each expert's backward write a zero-filled
        # gradient of the whole stack (E times the work)
        w1, w2 = self.w1.unbind(0), self.w2.unbind(0)
        w3 = self.w3.unbind(0) if self.gated else None
        outs = []
        for e, xe in enumerate(torch.split(x, counts)):
            h = xe @ w1[e].t()
            h = F.silu(h) * (xe @ w3[e].t()) if w3 is not None else F.gelu(h)
            outs.append(h @ w2[e].t())
        return torch.cat(outs) if outs else x[:0]


class SharedExperts(nn.Module):
    """The always-on experts as one dense MLP (w1, w3 gated, w2), with Qwen-MoE's sigmoid gate if any."""

    def __init__(self, hidden: int, ffn: int, gated: bool, gate: bool) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False) if gated else None
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.gate = nn.Linear(hidden, 1, bias=False) if gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.w1(x)) * self.w3(x) if self.w3 is not None else F.gelu(self.w1(x))
        y = self.w2(h)
        return y * torch.sigmoid(self.gate(x)) if self.gate is not None else y


class MoEFeedForward(nn.Module):
    """Router, routed experts (all of them, or this rank's ``E / ep`` with ``ep_group``) and shared experts."""

    def __init__(self, model: ModelSpec, ep_group: Any = None) -> None:
        super().__init__()
        self.num_experts, self.top_k = model.num_experts, model.experts_per_token
        self.ep_group = ep_group
        ep = ep_group.size() if ep_group is not None else 1
        self.local = self.num_experts // ep
        self.first = (ep_group.rank() if ep_group is not None else 0) * self.local
        h = model.hidden_size
        self.router = nn.Linear(h, self.num_experts, bias=False)
        self.experts = Experts(h, model.moe_ffn_hidden_size, self.local, model.gated)
        shared = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        self.shared = SharedExperts(h, shared, model.gated, model.shared_expert_gate) if shared else None
        self.load = 0
        """token copies this rank's experts processed in the last forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs, routing_map = self._route(tokens)
        y = self._dispatch_and_combine(tokens, probs, routing_map)
        if self.shared is not None:
            y = y + self.shared(tokens)
        return y.view(shape)

    def _route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities (N, E), zero outside the top k; routing map (N, E) bool)."""
        scores = torch.softmax(self.router(tokens), dim=-1)
        top, idx = scores.topk(self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, idx, True)
        return torch.zeros_like(scores).scatter(1, idx, top), routing_map

    def _dispatch_and_combine(self, tokens: torch.Tensor, probs: torch.Tensor,
                              routing_map: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[0]
        # permute: every copy, expert by expert, tokens in order (Megatron-Core moe_utils.permute)
        token_idx = torch.arange(n, device=tokens.device).expand(self.num_experts, n).masked_select(routing_map.t())
        copy_probs = probs.t().masked_select(routing_map.t())
        permuted = tokens.index_select(0, token_idx)
        counts = routing_map.sum(dim=0)
        if self.ep_group is None:
            out = self.experts(permuted, counts.tolist())
            self.load = int(counts.sum())
        else:
            out = self._expert_parallel(permuted, counts)
        # unpermute: weight each copy and sum it into its token
        return tokens.new_zeros(tokens.shape).index_add(0, token_idx, out * copy_probs[:, None])

    def _expert_parallel(self, permuted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """All-to-all the copies to the ranks holding their experts, run the local experts, bring them back."""
        ep, local = self.ep_group.size(), self.local
        gathered = _all_gather(counts, self.ep_group)  # (ep, E): copies each rank sends to each expert
        in_splits = counts.view(ep, local).sum(dim=1).tolist()
        mine = gathered[:, self.first:self.first + local]  # (ep, local): from rank j to local expert e
        out_splits = mine.sum(dim=1).tolist()
        received = AllToAll.apply(permuted, out_splits, in_splits, self.ep_group, "fwd:ep:all_to_all")
        # (source rank, local expert) chunks -> (local expert, source rank) (sort_chunks_by_idxs)
        sizes = mine.reshape(-1).tolist()
        chunks = torch.split(received, sizes)
        by_expert = [chunks[j * local + e] for e in range(local) for j in range(ep)]
        per_expert = mine.sum(dim=0).tolist()
        self.load = int(sum(per_expert))
        out = self.experts(torch.cat(by_expert), per_expert)
        back = torch.split(out, [sizes[j * local + e] for e in range(local) for j in range(ep)])
        by_rank = [back[e * ep + j] for j in range(ep) for e in range(local)]
        return AllToAll.apply(torch.cat(by_rank), in_splits, out_splits, self.ep_group, "fwd:ep:all_to_all")


def init_moe(moe: MoEFeedForward, gen: torch.Generator) -> None:
    """Seeded weights: every matrix ~ N(0, 1/fan_in) (activations stay O(1)); the experts drawn as one stack so
    that a rank's slice of the reference is its own experts' weights."""
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


def shard_experts(ref: MoEFeedForward, model: ModelSpec, ep_group: Any) -> MoEFeedForward:
    """The expert-parallel copy of ``ref``: the same router and shared experts, this rank's slice of the
    routed experts, dispatch over ``ep_group``."""
    moe = MoEFeedForward(model, ep_group).to(device=ref.router.weight.device, dtype=ref.router.weight.dtype)
    state = {k: v for k, v in ref.state_dict().items() if not k.startswith("experts.")}
    lo, hi = moe.first, moe.first + moe.local
    state.update({f"experts.{k}": v[lo:hi].clone() for k, v in ref.experts.state_dict().items()})
    moe.load_state_dict(state)
    return moe
