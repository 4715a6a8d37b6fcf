"""Predicted time of one step of a :class:`PlanCase`, per rank and per phase (torch-free).

The pieces are the estimator's: one layer's forward and backward per micro-batch from
:func:`tpsim.estimator.predict_block` (the layer cost code of ``estimate``, flavor ``dtensor``: TP collectives
exposed), every data-parallel and pipeline transfer of :func:`tpsim.validate.plan.comm.expected_comm` timed by the
topology's collective model on the plan's groups (:func:`tpsim.topology.placement.rank_groups`), the Adam step
and the gradient accumulation by the estimator's rules under the runtime's stack profile
(tpsim/data/stacks/torch-validate.yaml, :func:`_runtime_fixed`). They are put together with the estimator's rules
(``tpsim/estimator/core.py``, Narayanan et al. 2021 section 2.2):

* step = m x t_stage + bubble + exposed pipeline sends + exposed DP + optimizer, the bubble and the sends the
  plan's schedule's (:mod:`tpsim.pipeline`: 1F1B ``(pp - 1) / vpp x t_stage`` and ``2 (m vpp + pp - 1) t_p2p``,
  zero-bubble schedules with the weight gradients filling the bubble);
* FSDP2 gathers and reduce-scatters hide behind one layer's forward / backward (prefetch one block ahead):
  exposed = max(0, comm - layer compute); DDP's buckets behind the backward of the last micro-batch (both the
  estimator's :func:`tpsim.estimator.schedule.dp_exposure`); hidden communication still costs
  ``overlap_compute_penalty`` of itself in compute (tpsim/data/efficiency.yaml);
* what the runtime does not overlap is exposed: tpsim's ZeRO-1 reduces and gathers inside the optimizer step,
  and the partial norm-weight gradients under SP are summed there too.

Phases match what the ranks measure (:mod:`tpsim.validate.plan.run`): ``fwd`` and ``bwd`` (the chunks' own
computation with the communication inside it), ``optimizer``, ``other`` (bubble, pipeline transfers, reductions
outside the chunks), ``step``, and ``layer`` = (fwd + bwd) / (micro-batches x layers on the rank); each
collective kind per axis per step (``comm:<axis>:<op>``).

Not yet the estimator's ``estimate_batch`` itself (issue 21): the per-phase split (fwd / bwd / optimizer / other)
and the per-rank phases are assembled here; tests/test_validate_plan.py holds the step within 2% of
``estimate`` under the ``torch-validate`` stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..block.case import FP32_BYTES
from .case import PlanCase
from .comm import Comm, ddp_buckets, expected_comm, fsdp_unit_bytes, rank_param_numel

RUNTIME_STACK = "torch-validate"
"""the stack profile of the runtime the ranks run (tpsim/data/stacks/torch-validate.yaml)."""


@dataclass(frozen=True)
class PlanPrediction:
    """Predicted seconds per step on each rank (``phases[rank]``) and what they were built from."""

    phases: list[dict[str, float]]
    """per rank: fwd, bwd, optimizer, other, step, layer, comm:<axis>:<op>."""
    layer_fwd_s: float
    layer_bwd_s: float
    compute_model: str
    measured_compute_fraction: float
    overhead: dict[str, float] = field(default_factory=dict)
    """framework overhead included: fwd/bwd per layer and micro-batch, opt/other per step (seconds)."""

    def slowest(self) -> dict[str, float]:
        """The phases of the rank with the longest step (it sets the pace)."""
        return max(self.phases, key=lambda p: p["step"])


@dataclass(frozen=True)
class _Curves:
    """Collective cost curves of the plan's groups, per axis and op."""

    cm: Any
    groups: dict[str, Any]

    def time(self, axis: str, op: str, nbytes: float) -> float:
        if nbytes <= 0 or self.cm is None:  # nothing to send, or a single rank
            return 0.0
        kind = "send_recv" if op in ("send", "recv") else op
        return float(self.cm.curve(kind, self.groups[axis]).time(float(nbytes)))


def comm_times(comm: Comm, curves: _Curves) -> dict[str, float]:
    """Seconds per step of each (axis, kind): count x time of one call of the average size."""
    out = {}
    for axis, ops in comm.items():
        for op, d in ops.items():
            out[f"comm:{axis}:{op}"] = d["n"] * curves.time(axis, op, d["bytes"] / d["n"])
    return out


def predict_plan(case: PlanCase, cluster: Any, compute: Any, overhead: dict[str, float] | None = None,
                 penalty: float | None = None) -> PlanPrediction:
    """Per-rank phases of one step (see module docstring). ``overhead``: framework overhead to add (fwd/bwd
    seconds per layer and micro-batch, opt/other seconds per step)."""
    from ...collectives.model import get_collective_model
    from ...compute.roofline import RooflineModel, default_efficiency
    from ...estimator.block import predict_block
    from ...topology.placement import rank_groups

    over = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0, "other": 0.0, **(overhead or {})}
    if penalty is None:
        from ...hardware import overlap_penalty
        penalty = overlap_penalty(cluster.device, default_efficiency().overlap_compute_penalty)
    blk = predict_block(case.model, cluster, case.plan(), compute=compute, flavor="dtensor", fused=case.fused)
    copies = _fsdp_copies(case, compute or RooflineModel(cluster.device))
    accum_s, optimizer_s = _runtime_fixed(case, cluster, compute)
    f, b = blk.fwd_s + over["fwd"], blk.bwd_s + accum_s + over["bwd"]
    groups = rank_groups(case.tp, case.dp, case.pp, case.order)
    curves = _Curves(get_collective_model(cluster) if case.world > 1 else None, groups)
    phases = []
    for rank in range(case.world):
        coords = _coords(case, rank)
        phases.append(_rank_phases(case, coords, f, b, curves, optimizer_s + over["opt"], over["other"], penalty,
                                   copies))
    return PlanPrediction(phases=phases, layer_fwd_s=f, layer_bwd_s=b, compute_model=str(blk.compute_model),
                          measured_compute_fraction=float(blk.measured_compute_fraction), overhead=over)


def _runtime_fixed(case: PlanCase, cluster: Any, compute: Any) -> tuple[float, float]:
    """(gradient accumulation per layer and micro-batch, optimizer step) seconds: the estimator's rules
    (:func:`tpsim.estimator.schedule.grad_accumulation_seconds`, :func:`~tpsim.estimator.schedule.optimizer_seconds`)
    under the runtime's stack profile (tpsim/data/stacks/torch-validate.yaml: autograd adds each micro-batch's
    weight gradients into ``.grad``, a shard of them under FSDP2 reducing every micro-batch; torch's Adam over the
    rank's fp32 parameters, the ZeRO shard of them)."""
    from ...estimator.context import context_for
    from ...estimator.schedule import grad_accumulation_seconds, optimizer_seconds

    ctx = context_for(case.model, cluster, compute, None, RUNTIME_STACK, "dtensor")
    one = lambda x: np.array([x])  # noqa: E731
    layer_params = rank_param_numel(case) / case.layers_per_rank
    sharded = ctx.terms.grads_sharded(one(case.zero), one(case.pp))
    accum = grad_accumulation_seconds(ctx, one(layer_params), sharded, one(case.dp), "fp32")[0]
    share = rank_param_numel(case) / (case.dp if case.zero >= 1 else 1)
    optimizer = optimizer_seconds(ctx, one(share), one(case.layers_per_rank), "fp32")[0]
    return float(accum), float(optimizer)


def _coords(case: PlanCase, rank: int) -> dict[str, int]:
    coords = {}
    for axis, size in reversed(case.mesh_axes()):
        rank, coords[axis] = divmod(rank, size)
    return coords


@dataclass(frozen=True)
class _DP:
    """Where the data-parallel (and SP partial-sum) communication of one step lands, seconds."""

    fwd_x: float = 0.0
    """exposed per layer and micro-batch in the forward (FSDP2 gathers)."""
    bwd_x: float = 0.0
    """exposed per layer and micro-batch in the backward (FSDP2 gathers and reduce-scatters)."""
    bwd_step: float = 0.0
    """exposed once per step in the backward (DDP's buckets, DDP/FSDP2's SP partial sums)."""
    hidden: float = 0.0
    """hidden per step: costs ``overlap_compute_penalty`` of itself."""
    in_optimizer: float = 0.0
    """inside the optimizer step (tpsim's ZeRO-1, the SP partial sums of the other runtimes)."""
    at_end: float = 0.0
    """after the last backward, outside the chunks (FSDP2's reduction under pipelining)."""


def _fsdp_copies(case: PlanCase, compute: Any) -> tuple[float, float]:
    """(per all-gather, per reduce-scatter) seconds of FSDP2's copy-in / copy-out of one block (the estimator's
    :func:`tpsim.estimator.schedule.fsdp_copy_seconds`, the runtime's stack profile
    tpsim/data/stacks/torch-validate.yaml ``comm.fsdp_copy_in_out``); zeros for the other runtimes."""
    from ...estimator.schedule import fsdp_copy_seconds
    from ...stacks import load_stack

    fig = load_stack(RUNTIME_STACK).figure("comm", "fsdp_copy_in_out")
    if case.runtime not in ("fsdp2", "fsdp2-no-reshard") or fig is None or not fig.value:
        return 0.0, 0.0
    ag, rs = fsdp_copy_seconds(compute, fsdp_unit_bytes(case) / FP32_BYTES, case.dp, "fp32")
    return float(ag), float(rs)


def _dp(case: PlanCase, comm: Comm, times: dict[str, float], f: float, b: float, curves: _Curves,
        copies: tuple[float, float] = (0.0, 0.0)) -> _DP:
    m, layers, runtime = case.microbatches, case.layers_per_rank, case.runtime
    fsdp = runtime in ("fsdp2", "fsdp2-no-reshard")
    # under SP the only TP all-reduces are the partial norm-weight gradients (plancomm._tp)
    partial = times.get("comm:tp:all_reduce", 0.0) if case.sp else 0.0
    if fsdp:
        ag, rs = (curves.time("dp", op, fsdp_unit_bytes(case)) for op in ("all_gather", "reduce_scatter"))
        gathers = comm["dp"]["all_gather"]["n"] / (m * layers)  # per layer and micro-batch
        fwd_ag, bwd_ag = min(gathers, 1.0) * ag, max(gathers - 1.0, 0.0) * ag
        per_mb_rs = rs if case.pp == 1 else 0.0  # under pipelining one reduce-scatter per block at the end
        # per layer and micro-batch: the forward gather behind the layer's forward, the backward's gather and
        # reduce-scatter behind its backward
        fwd_t, fwd_x = _exposure(0.0, fwd_ag, f, f)
        bwd_t, bwd_x = _exposure(bwd_ag + per_mb_rs, 0.0, b, f)
        hidden = m * layers * (fwd_t + bwd_t - fwd_x - bwd_x)
        # FSDP2's copy-in / copy-out run on the compute stream: exposed where their collective is
        copy_ag, copy_rs = copies
        fwd_x += min(gathers, 1.0) * copy_ag
        bwd_x += max(gathers - 1.0, 0.0) * copy_ag + (copy_rs if case.pp == 1 else 0.0)
        if case.pp == 1:
            return _DP(fwd_x=fwd_x, bwd_x=bwd_x, bwd_step=partial, hidden=hidden)
        return _DP(fwd_x=fwd_x, bwd_x=bwd_x, hidden=hidden, at_end=layers * (rs + copy_rs) + partial)
    if runtime == "ddp":
        ar = sum(curves.time("dp", "all_reduce", x) for x in ddp_buckets(case)) * case.vpp
        total, exposed = _exposure(ar, 0.0, layers * b, layers * f)  # behind the last micro-batch's backward
        return _DP(bwd_step=exposed + partial, hidden=total - exposed)
    zero1 = times.get("comm:dp:reduce_scatter", 0.0) + times.get("comm:dp:all_gather", 0.0) \
        if runtime == "zero1" else 0.0
    return _DP(in_optimizer=zero1 + partial)


def _exposure(grad_t: float, gather_t: float, bwd_window: float, fwd_window: float) -> tuple[float, float]:
    """(total, exposed) of one reduction of ``grad_t`` behind ``bwd_window`` and one gather of ``gather_t``
    behind ``fwd_window``: the estimator's rule (:func:`tpsim.estimator.schedule.dp_exposure`), its overlap
    penalty left out (the phases charge it on the hidden part, in the backward)."""
    from ...estimator.schedule import dp_exposure

    one = lambda x: np.array([x], dtype=float)  # noqa: E731
    total, exposed = dp_exposure(one(grad_t), one(gather_t), one(1.0 if grad_t else 0.0),
                                 one(1.0 if gather_t else 0.0), one(bwd_window), one(fwd_window),
                                 np.array([True]), 0.0)
    return float(total[0]), float(exposed[0])


def _rank_phases(case: PlanCase, coords: dict[str, int], f: float, b: float, curves: _Curves, optimizer_s: float,
                 other_overhead: float, penalty: float, copies: tuple[float, float] = (0.0, 0.0)) -> dict[str, float]:
    m, layers = case.microbatches, case.layers_per_rank
    comm = expected_comm(case, coords)
    times = comm_times(comm, curves)
    dp = _dp(case, comm, times, f, b, curves, copies)
    fwd = m * layers * (f + dp.fwd_x)
    bwd = m * layers * (b + dp.bwd_x) + dp.bwd_step + penalty * dp.hidden
    t_stage = layers * (f + b + dp.fwd_x + dp.bwd_x)
    bubble, p2p = _pipeline(case, t_stage, layers * (b + dp.bwd_x), curves.time("pp", "send", _p2p_bytes(case)))
    opt = optimizer_s + dp.in_optimizer
    other = bubble + p2p + dp.at_end + other_overhead
    step = fwd + bwd + opt + other
    return {"fwd": fwd, "bwd": bwd, "optimizer": opt, "other": other, "step": step,
            "layer": (fwd + bwd) / (m * layers), **times}


def _pipeline(case: PlanCase, t_stage: float, t_backward: float, t_p2p: float) -> tuple[float, float]:
    """(bubble, exposed pipeline sends) per step: the plan's schedule's rules (tpsim.pipeline, as the
    estimator's schedule stage uses them)."""
    if case.pp == 1:
        return 0.0, 0.0
    from ... import pipeline

    one = lambda x: np.array([x])  # noqa: E731
    code = one(pipeline.SCHEDULES.index(case.pp_schedule))
    frac = t_backward / t_stage if t_stage > 0 else 0.0
    bubble = pipeline.bubble(code, one(case.pp), one(case.vpp), one(t_stage), frac)[0]
    _, exposed = pipeline.pipeline_sends(code, one(case.pp), one(case.vpp), one(case.microbatches), one(t_p2p))
    return float(bubble), float(exposed[0])


def _p2p_bytes(case: PlanCase) -> int:
    seq = case.model.seq_len // case.tp if case.sp else case.model.seq_len
    return case.micro_batch * seq * case.model.hidden_size * FP32_BYTES
