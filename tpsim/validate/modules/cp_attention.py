"""Context-parallel attention as ``tpsim validate`` runs it (rank side, torch): the sequence split over the cp
group with causal load balancing, and the attention core computed by a ring of point-to-point K/V exchanges
(TransformerEngine ``AttnFuncWithCPAndKVP2P``, Megatron-Core ``--cp-comm-type p2p``) or by all-to-alls of heads
and sequence (Ulysses; TransformerEngine ``AttnFuncWithCPAndQKVOA2A``, ``--cp-comm-type a2a``).

**Layout** (Megatron-Core ``get_batch_on_this_cp_rank``, TE's DualChunkSwap): the sequence is cut into 2 cp
chunks of ``c = s / (2 cp)`` tokens and cp rank r holds chunks r and 2 cp - 1 - r, in that order, so that every
rank does the same share of causal attention.

**Ring** (:class:`RingAttention`, a custom autograd Function; the collectives below are its own, not autograd's):

* forward, cp steps: step i attends the rank's queries to the K/V block of rank r - i (mod cp) while that block
  is passed on to rank r + 1 (``batch_isend_irecv``, issued before the step's attention: cp - 1 exchanges). Step 0
  is causal attention on the rank's own block; a lower rank's block (i <= r) is seen whole by both query chunks
  through its first chunk only; a higher rank's block (i > r) is seen only by the second query chunk, whole.
  Partial outputs are merged with their log-sum-exp (flash-attention's online softmax).
* backward, cp steps in the reverse order (the ring runs towards rank r - 1): the first step starts from the
  last K/V block the forward received, so the rank's own block comes back at the last step. Step 0 sends K/V,
  steps 1 .. cp - 2 send K/V together with the dK/dV accumulated so far (one message of twice the size), the last
  step sends the accumulated dK/dV, which arrives at the block's home rank complete. Each step's gradients come
  from the flash backward kernel with the merged output and log-sum-exp.

This is TE's schedule exactly, so the messages are :func:`tpsim.comm_plan.cp_collectives`' list: forward
cp - 1 K/V blocks; backward 1 K/V, cp - 2 K/V + dK/dV, 1 dK/dV per rank.

**All-to-all** (:func:`ulysses_attention`): q, k and v are all-to-all'ed from (the rank's tokens, all heads) to
(the whole sequence, heads / cp), chunks put back in sequence order, causal attention runs on whole sequences,
and the output goes back the same way; autograd's backward of each all-to-all is the inverse all-to-all (dO out,
dQ, dK, dV back).

**Timing the exchanges** (:class:`CommLog`): in the iterations that time the communication each exchange and
all-to-all is waited for where it is issued, and its seconds recorded as ``"<phase>:<axis>:<op>"``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

SEQ_DIM = 1
"""the sequence dimension of a block's activations (batch, seq, hidden)."""


# ---- layout ------------------------------------------------------------------------------------------------
def chunk_ids(cp: int, rank: int) -> tuple[int, int]:
    """The two sequence chunks (of 2 cp) held by cp rank ``rank``."""
    return rank, 2 * cp - 1 - rank


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = SEQ_DIM) -> torch.Tensor:
    """This rank's part of a full-sequence tensor: chunks r and 2 cp - 1 - r along ``dim``."""
    chunks = x.chunk(2 * cp, dim=dim)
    a, b = chunk_ids(cp, rank)
    return torch.cat((chunks[a], chunks[b]), dim=dim).contiguous()


def positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Global token positions of this rank's tokens (for rotary embeddings)."""
    return shard_sequence(torch.arange(seq), cp, rank, dim=0)


# ---- timing hook -------------------------------------------------------------------------------------------
class CommLog:
    """Collects ``(key, seconds)`` of each exchange while active; ``clock()`` returns (wall, run-queue delay)
    pairs as :class:`tpsim.validate.block.measure.Clock` does."""

    def __init__(self, clock: Callable[[], tuple[float, float]]) -> None:
        self.clock = clock
        self.calls: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        t0 = self.clock()
        yield
        t1 = self.clock()
        self.calls.append((key, max((t1[0] - t0[0]) - (t1[1] - t0[1]), 0.0)))


_LOG: list[CommLog] = []


@contextlib.contextmanager
def logging_comm(log: CommLog) -> Iterator[CommLog]:
    """Within this context every exchange is waited for where it is issued and timed into ``log``."""
    _LOG.append(log)
    try:
        yield log
    finally:
        _LOG.pop()


def active_log() -> CommLog | None:
    return _LOG[-1] if _LOG else None


# ---- attention kernels -------------------------------------------------------------------------------------
def _repeat_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    return t.repeat_interleave(rep, dim=1) if rep > 1 else t


def _sum_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    """The gradient of :func:`_repeat_kv`: sum the copies of each KV head."""
    if rep == 1:
        return t
    b, h, n, d = t.shape
    return t.reshape(b, h // rep, rep, n, d).sum(dim=2)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention (batch, heads, n, d) and the log-sum-exp of each query's scaled scores (batch, heads,
    n); ``scale`` defaults to 1/sqrt(d). CPU: the flash kernel of ``scaled_dot_product_attention``; elsewhere
    :func:`attention_math`."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse
    return attention_math(q, k, v, causal, scale)


def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of softmax attention given the (merged) output and log-sum-exp of the queries: with a ring's
    final ``out`` and ``lse`` this is one K/V block's share of the gradient (Dao 2023, FlashAttention-2, alg. 2).
    CPU: the flash kernel's backward; elsewhere :func:`attention_backward_math`."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse.contiguous(),
            0.0, causal, scale=scale)
    return attention_backward_math(dout, q, k, v, out, lse, causal, scale)


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) * _scale(q, scale)
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores


def attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_with_lse` written out: P = exp(S - lse), O = P V, S = Q K^T / sqrt(d)."""
    scores = _scores(q, k, causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def attention_backward_math(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, causal: bool,
                            scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`attention_backward` written out: dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K / sqrt(d),
    dK = dS^T Q / sqrt(d)."""
    scale = _scale(q, scale)
    p = torch.exp(_scores(q, k, causal, scale) - lse[..., None])
    dv = p.transpose(-1, -2) @ dout
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, dv


# ---- ring --------------------------------------------------------------------------------------------------
def _exchange(send: torch.Tensor, recv: torch.Tensor, group: Any, dst: int, src: int, key: str) -> list[Any]:
    """Send ``send`` to group rank ``dst`` and receive ``recv`` from ``src`` (``batch_isend_irecv``, even ranks
    sending first as TE does); returns the works to wait for, or [] when a :class:`CommLog` is active (then the
    exchange is waited for and timed here)."""
    rank = group.rank()
    send_op = dist.P2POp(dist.isend, send, dist.get_global_rank(group, dst), group)
    recv_op = dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, src), group)
    ops = [send_op, recv_op] if rank % 2 == 0 else [recv_op, send_op]
    log = active_log()
    if log is None:
        return dist.batch_isend_irecv(ops)
    with log.timed(key):
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return []


def _wait(works: list[Any]) -> None:
    for work in works:
        work.wait()


def step_parts(step: int, rank: int, half: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice, slice, bool]:
    """What forward step ``step`` (K/V block of rank ``rank - step``) computes under causal load balancing:
    (queries, keys, values, query rows, key rows, causal)."""
    full, first, second = slice(None), slice(0, half), slice(half, None)
    if step == 0:
        return q, k, v, full, full, True
    if step <= rank:  # a lower rank's block: both query chunks see its first chunk whole
        return q, k[:, :, first], v[:, :, first], full, first, False
    return q[:, :, second], k, v, second, full, False  # a higher rank's block: the second chunk sees it


def _pad(t: torch.Tensor, d: int) -> torch.Tensor:
    return t if t.shape[-1] == d else F.pad(t, (0, d - t.shape[-1]))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
           rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's attention with its log-sum-exp: KV heads repeated ``rep`` times (grouped-query attention);
    key and value head dims may differ (multi-head latent attention): the kernel takes one head dim, so the
    narrower of q/k and v is padded with zeros (which changes neither the scores, scaled by the query/key dim,
    nor the output's own columns)."""
    dk, dv = q.shape[-1], v.shape[-1]
    d = max(dk, dv)
    out, lse = attention_with_lse(_pad(q, d), _pad(_repeat_kv(k, rep), d), _pad(_repeat_kv(v, rep), d), causal,
                                  scale=1.0 / math.sqrt(dk))
    return out[..., :dv], lse


def attend_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, causal: bool, rep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of :func:`attend` (KV gradients summed over the repeated heads)."""
    dk, dv = q.shape[-1], v.shape[-1]
    d = max(dk, dv)
    dq, dk_, dv_ = attention_backward(_pad(dout, d), _pad(q, d), _pad(_repeat_kv(k, rep), d),
                                      _pad(_repeat_kv(v, rep), d), _pad(out, d), lse, causal,
                                      scale=1.0 / math.sqrt(dk))
    return dq[..., :dk], _sum_kv(dk_[..., :dk], rep), _sum_kv(dv_[..., :dv], rep)


def merge_step(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, l: torch.Tensor, rows: slice) -> None:
    """Fold one step's partial attention (``o``, ``l`` for the query ``rows``) into the running output and
    log-sum-exp, in place: lse' = log(e^lse + e^l), out' = out e^(lse - lse') + o e^(l - lse')."""
    o_rows, l_rows = out[:, :, rows], lse[:, :, rows]
    merged = torch.logaddexp(l_rows, l)
    o_rows.mul_(torch.exp(l_rows - merged)[..., None]).add_(o * torch.exp(l - merged)[..., None])
    l_rows.copy_(merged)


class RingAttention(torch.autograd.Function):
    """Causal ring attention over the cp group (module docstring). q (batch, heads, n, dk), k (batch, kv heads, n,
    dk) and v (batch, kv heads, n, dv) with n = the rank's 2 chunks; returns (batch, heads, n, dv). A K/V block
    travels as one message, k and v side by side in the last dim (TE concatenates them likewise)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any) -> torch.Tensor:
        cp, rank = group.size(), group.rank()
        rep, half, dk = q.shape[1] // k.shape[1], q.shape[2] // 2, k.shape[-1]
        bufs = [torch.cat((k, v), dim=-1).contiguous()]
        bufs.append(torch.empty_like(bufs[0]))
        out = lse = None
        works: list[Any] = []
        for step in range(cp):
            _wait(works)
            kv = bufs[step % 2]
            if step < cp - 1:  # pass the block on while attending to it
                works = _exchange(kv, bufs[(step + 1) % 2], group, (rank + 1) % cp, (rank - 1) % cp, "fwd:cp:send_recv")
            qs, ks, vs, rows, _cols, causal = step_parts(step, rank, half, q, kv[..., :dk], kv[..., dk:])
            o, l = attend(qs, ks, vs, causal, rep)
            if out is None:
                out, lse = o.clone(), l.clone()
            else:
                merge_step(out, lse, o, l, rows)
        ctx.save_for_backward(q, out, lse, bufs[(cp - 1) % 2])  # the last block received: the backward's first
        ctx.group, ctx.rep = group, rep
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        q, out, lse, last_kv = ctx.saved_tensors
        group, rep = ctx.group, ctx.rep
        cp, rank = group.size(), group.rank()
        half, dk = q.shape[2] // 2, q.shape[-1]
        dq = torch.zeros_like(q)
        # each buffer: [K/V block, dK/dV accumulated for it]
        bufs = [torch.empty((2, *last_kv.shape), dtype=q.dtype, device=q.device) for _ in range(2)]
        bufs[0][0].copy_(last_kv)
        works: list[Any] = []
        for i in range(cp):
            _wait(works)
            send, recv = bufs[i % 2], bufs[(i + 1) % 2]
            if i == 0:
                send, recv = send[0], recv[0]
            elif i == cp - 1:
                send, recv = send[1], recv[1]
            works = _exchange(send, recv, group, (rank - 1) % cp, (rank + 1) % cp, "bwd:cp:send_recv")
            step = cp - 1 - i  # the forward step of this block
            kv = bufs[i % 2][0]
            qs, ks, vs, rows, cols, causal = step_parts(step, rank, half, q, kv[..., :dk], kv[..., dk:])
            dq_, dk_, dv_ = attend_backward(dout[:, :, rows], qs, ks, vs, out[:, :, rows], lse[:, :, rows], causal,
                                            rep)
            dq[:, :, rows] += dq_
            _wait(works)
            works = []
            dkv = bufs[(i + 1) % 2][1]
            if i == 0:  # nothing accumulated yet: the first exchange carried K/V only
                dkv.zero_()
            dkv[:, :, cols, :dk] += dk_
            dkv[:, :, cols, dk:] += dv_
        dkv = bufs[cp % 2][1]
        return dq, dkv[..., :dk].clone(), dkv[..., dk:].clone(), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any) -> torch.Tensor:
    """:class:`RingAttention` on (batch, seq, heads, d) tensors; returns (batch, seq, heads, d)."""
    t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
    return RingAttention.apply(t(q), t(k), t(v), group).transpose(1, 2)


# ---- all-to-all (Ulysses) ----------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, group: Any, key: str) -> torch.Tensor:
    """Equal-split all-to-all of dim 0 (one slice per rank)."""
    out = torch.empty_like(x)
    log = active_log()
    if log is None:
        dist.all_to_all_single(out, x, group=group)
        return out
    with log.timed(key):
        dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, group: Any, key: str) -> torch.Tensor:
    """(batch, n, heads, d) on each rank -> (batch, s, heads / cp, d): the whole sequence in order, this rank's
    head group."""
    cp = group.size()
    b, n, h, d = x.shape
    send = x.view(b, n, cp, h // cp, d).permute(2, 0, 1, 3, 4).contiguous()  # (cp, b, n, h/cp, d)
    recv = _all_to_all(send, group, key)  # slice j: rank j's tokens, this rank's heads
    half = n // 2
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for j in range(cp):
        a, c = chunk_ids(cp, j)
        chunks[a], chunks[c] = recv[j][:, :half], recv[j][:, half:]
    return torch.cat(chunks, dim=1)


def _heads_to_seq(x: torch.Tensor, group: Any, key: str) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`: (batch, s, heads / cp, d) -> (batch, n, heads, d)."""
    cp = group.size()
    b, s, hl, d = x.shape
    chunks = x.chunk(2 * cp, dim=1)
    send = torch.stack([torch.cat([chunks[i] for i in chunk_ids(cp, j)], dim=1) for j in range(cp)])
    recv = _all_to_all(send.contiguous(), group, key)  # slice j: this rank's tokens, rank j's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // cp, cp * hl, d)


class _AllToAll(torch.autograd.Function):
    """``exchange`` (:func:`_seq_to_heads` or :func:`_heads_to_seq`) forward, its ``inverse`` on the gradient
    (DeepSpeed-Ulysses' ``_SeqAllToAll`` likewise swaps its scatter and gather dims in backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, exchange: Callable, inverse: Callable) -> torch.Tensor:
        ctx.group, ctx.inverse = group, inverse
        return exchange(x, group, "fwd:cp:all_to_all")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return ctx.inverse(grad.contiguous(), ctx.group, "bwd:cp:all_to_all"), None, None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any) -> torch.Tensor:
    """All-to-all context-parallel causal attention on (batch, n, heads, d) tensors (module docstring): 3
    all-to-alls before (q, k, v), 1 after (the output); the same 4 in backward."""
    qh, kh, vh = (_AllToAll.apply(t, group, _seq_to_heads, _heads_to_seq) for t in (q, k, v))
    rep = qh.shape[2] // kh.shape[2]
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    o = F.scaled_dot_product_attention(t(qh), _repeat_kv(t(kh), rep), _repeat_kv(t(vh), rep), is_causal=True)
    return _AllToAll.apply(t(o).contiguous(), group, _heads_to_seq, _seq_to_heads)
