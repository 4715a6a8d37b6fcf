"""Every transfer of one training step of a :class:`PlanCase`, by mesh axis, predicted torch-free.

Two rule sets, both from the plan alone:

* ``torch`` (what ``tpsim validate`` runs: DTensor TP, DDP / FSDP2 / tpsim's ZeRO-1, ``torch.distributed.pipelining``;
  FSDP2 and pipelining as torchtitan, the stack of issue 10, uses them). The validation checks the measured
  calls against these exactly: count and bytes per (axis, kind) on every rank.
* ``megatron`` (the rules :func:`tpsim.estimator.estimate` costs: Megatron-LM's DDP and distributed optimizer,
  its pipeline's scatter/gather p2p). Reported beside, with every difference spelled out
  (:func:`differences`), so that a plan's prediction can be read against the stack it would run on.

Units: bytes in nccl-tests' convention (the full buffer), fp32 (4 bytes per element), per step and per rank.
"""

from __future__ import annotations

from typing import Any

from ...tp_plan import layer_collectives
from ..block.case import FP32_BYTES
from .case import PlanCase
from ..block.shapes import LocalParam, local_params, partial_grad_params

DDP_BUCKET_BYTES = 25 * 1024 * 1024
"""DDP's bucket cap (``bucket_cap_mb=25``, tpsim.validate.plan.stack.BUCKET_MB) in bytes."""

Comm = dict[str, dict[str, dict[str, int]]]
"""{axis: {op: {"n": calls, "bytes": total bytes}}} per step on one rank."""


def _add(out: Comm, axis: str, op: str, n: int, nbytes: int) -> None:
    if n <= 0:
        return
    d = out.setdefault(axis, {}).setdefault(op, {"n": 0, "bytes": 0})
    d["n"] += int(n)
    d["bytes"] += int(nbytes)


def _layer_params(case: PlanCase) -> list[LocalParam]:
    return local_params(case.model, case.tp, case.sp, case.fused)


def fsdp_unit_bytes(case: PlanCase) -> int:
    """Bytes FSDP2 gathers (and reduce-scatters) for one block: each local parameter's dim 0 padded to a
    multiple of dp (``torch.chunk`` sharding), packed into one buffer."""
    total = 0
    for p in _layer_params(case):
        rows = -(-p.shape[0] // case.dp) * case.dp
        total += rows * (p.numel // p.shape[0])
    return total * FP32_BYTES


def ddp_buckets(case: PlanCase) -> list[int]:
    """Bytes of each DDP bucket of one chunk: parameters in the order their gradients become ready (the
    reverse of ``named_parameters()``), a bucket closed once it holds at least the cap (DDP's
    ``compute_bucket_assignment_by_size`` after the first iteration's rebuild)."""
    sizes = [p.numel * FP32_BYTES for p in _layer_params(case)] * case.layers_per_chunk
    buckets, current = [], 0
    for nbytes in reversed(sizes):
        current += nbytes
        if current >= DDP_BUCKET_BYTES:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def rank_param_numel(case: PlanCase) -> int:
    """Parameters one rank holds before data-parallel sharding (its layers' TP shards)."""
    return sum(p.numel for p in _layer_params(case)) * case.layers_per_rank


def _tp(case: PlanCase, out: Comm, reductions: int) -> None:
    """TP collectives of the rank's layers (DTensor's rules, ``tp_plan.layer_collectives(flavor="dtensor")``)
    per micro-batch, and the all-reduce of each partial norm-weight gradient under SP: per gradient reduction
    (once per step; FSDP2 per reduce-scatter), per micro-batch under DDP (its TP composition re-wraps the local
    parameters with ``DTensor.from_local`` in every forward, whose backward sums the partial gradient)."""
    if case.tp == 1:
        return
    act = case.tokens * case.model.hidden_size * FP32_BYTES
    per_layer = case.layers_per_rank * case.microbatches
    for c in layer_collectives(case.model, case.tp, case.sp, flavor="dtensor", fused=case.fused):
        _add(out, "tp", c.op, per_layer, per_layer * (act if c.activation else c.numel * FP32_BYTES))
    partial = partial_grad_params(case.model, case.tp, case.sp, case.fused)
    if case.runtime == "ddp":  # DTensor.from_local's backward sums them in every micro-batch's backward
        reductions = case.microbatches
    n = len(partial) * case.layers_per_rank * reductions
    _add(out, "tp", "all_reduce", n, sum(p.numel for p in partial) * FP32_BYTES * case.layers_per_rank * reductions)


def _fsdp_reductions(case: PlanCase) -> int:
    """Gradient reductions per step: FSDP2 reduce-scatters after every micro-batch's backward unless
    pipelining defers it to the end of the step (``PipelineStage`` turns gradient sync off and reduces once
    in ``perform_reduce_grad``); every other runtime reduces once."""
    fsdp = case.runtime in ("fsdp2", "fsdp2-no-reshard")
    return case.microbatches if fsdp and case.pp == 1 else 1


def _dp_torch(case: PlanCase, out: Comm) -> None:
    if case.dp == 1:
        return
    layers = case.layers_per_rank
    if case.runtime == "ddp":
        buckets = ddp_buckets(case) * case.vpp
        _add(out, "dp", "all_reduce", len(buckets), sum(buckets))
    elif case.runtime == "zero1":
        flat = -(-rank_param_numel(case) // case.dp) * case.dp * FP32_BYTES
        _add(out, "dp", "reduce_scatter", 1, flat)
        _add(out, "dp", "all_gather", 1, flat)
    else:
        unit = fsdp_unit_bytes(case)
        gathers = fsdp_gathers_per_layer(case)
        _add(out, "dp", "all_gather", gathers * layers, gathers * layers * unit)
        rs = _fsdp_reductions(case) * layers
        _add(out, "dp", "reduce_scatter", rs, rs * unit)


def fsdp_gathers_per_layer(case: PlanCase) -> int:
    """FSDP2 all-gathers of one block per step.

    Without pipelining (a loop over micro-batches, FSDP2's defaults): ZeRO-3 gathers in every micro-batch's
    forward and again in its backward (``reshard_after_forward=True``), ZeRO-2 in every forward (the weights
    are freed after each backward). With pipelining, ``PipelineStage`` keeps the weights unsharded after each
    backward until the step's end (``set_reshard_after_backward(False)``): ZeRO-2 gathers once per step;
    ZeRO-3 gathers before the chunk's first forward and before whatever follows each forward (a forward
    reshards; a backward does not), m + 1 per step whatever the order of the schedule's forwards and
    backwards (the chunk's sequence starts with a forward and ends with a backward).
    """
    m = case.microbatches
    if case.pp == 1:
        return 2 * m if case.zero == 3 else m
    return m + 1 if case.zero == 3 else 1


def _pp(case: PlanCase, coords: dict[str, int], out: Comm, divide_by_tp: bool) -> None:
    """Pipeline transfers of the rank's stages: each micro-batch's activation to the next stage and its
    gradient back. torch sends each TP rank's stage output as it is (a sequence shard under SP, the whole
    activation otherwise); Megatron sends 1/tp of it either way (scatter/gather optimization)."""
    if case.pp == 1:
        return
    seq = case.model.seq_len // case.tp if (case.sp or divide_by_tp) else case.model.seq_len
    nbytes = case.micro_batch * seq * case.model.hidden_size * FP32_BYTES
    m = case.microbatches
    rank = coords["pp"]
    for stage in case.stages_of(rank):
        # next stage, previous stage; a neighbour on the same rank (the turn of a V) is passed locally
        for peer in (stage + 1, stage - 1):
            if 0 <= peer < case.chunks and case.rank_of_stage(peer) != rank:
                _add(out, "pp", "send", m, m * nbytes)
                _add(out, "pp", "recv", m, m * nbytes)


def expected_comm(case: PlanCase, coords: dict[str, int]) -> Comm:
    """What torch issues on the rank at ``coords`` in one step (the ``torch`` rules)."""
    out: Comm = {}
    _tp(case, out, _fsdp_reductions(case))
    _dp_torch(case, out)
    _pp(case, coords, out, divide_by_tp=False)
    return out


def estimator_comm(case: PlanCase, coords: dict[str, int]) -> Comm:
    """The estimator's rules for the same step (Megatron-LM: ``tpsim.estimator.core``): one all-reduce of all
    fp32 gradients (ZeRO-0), a reduce-scatter of the gradients and an all-gather of the weights per step
    (ZeRO-1; ZeRO-2 reduce-scatters after every micro-batch), ZeRO-3's per-layer gathers in forward and
    backward and reduce-scatter per micro-batch; pipeline transfers of 1/tp of the activation; norm-weight
    gradients under SP all-reduced once per step."""
    out: Comm = {}
    _tp(case, out, 1)
    if case.dp > 1:
        grads = rank_param_numel(case) * FP32_BYTES
        m, layers = case.microbatches, case.layers_per_rank
        if case.zero == 0:
            _add(out, "dp", "all_reduce", 1, grads)
        elif case.zero in (1, 2):
            reductions = m if case.zero == 2 else 1
            _add(out, "dp", "reduce_scatter", reductions, reductions * grads)
            _add(out, "dp", "all_gather", 1, grads)
        else:
            unit = sum(p.numel for p in _layer_params(case)) * FP32_BYTES
            _add(out, "dp", "all_gather", 2 * m * layers, 2 * m * layers * unit)
            _add(out, "dp", "reduce_scatter", m * layers, m * layers * unit)
    _pp(case, coords, out, divide_by_tp=True)
    return out


def differences(torch_rules: Comm, megatron_rules: Comm) -> list[str]:
    """One line per (axis, kind) where the two rule sets disagree on the count or the bytes."""
    lines = []
    keys = sorted({(a, o) for r in (torch_rules, megatron_rules) for a, ops in r.items() for o in ops})
    for axis, op in keys:
        t = torch_rules.get(axis, {}).get(op, {"n": 0, "bytes": 0})
        m = megatron_rules.get(axis, {}).get(op, {"n": 0, "bytes": 0})
        if t != m:
            lines.append(f"{axis} {op}: torch (DDP/FSDP2/pipelining, torchtitan) {t['n']} call(s), {t['bytes']} B; "
                         f"estimator (Megatron-LM) {m['n']} call(s), {m['bytes']} B")
    return lines


def normalize(comm: dict[str, Any]) -> Comm:
    """Measured totals ({axis: {op: {n, bytes, time_s}}}) reduced to counts and bytes, zero entries dropped."""
    return {a: {o: {"n": int(d["n"]), "bytes": int(d["bytes"])} for o, d in ops.items() if d["n"]}
            for a, ops in comm.items() if any(d["n"] for d in ops.values())}
