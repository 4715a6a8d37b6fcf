"""Predicted time of one step of a :class:`PlanCase`, per rank and per phase (torch-free): the estimator's own.

The step is :func:`tpsim.estimator.estimate_batch` of the case's plan under the stack profile of the runtime
the ranks run (tpsim/data/stacks/torch-validate.yaml: DTensor TP collectives exposed, DDP under no_sync, FSDP2
resharding after every reduction and its copies, tpsim's ZeRO-1 inside the optimizer step, autograd's gradient
accumulation, torch's Adam, no embedding or output layer), so that a bug in the estimator shows in validation.
Its phases are the estimator's split of that step (:meth:`tpsim.estimator.schedule.Schedule.phases`): ``fwd``
and ``bwd`` (the chunks' own computation with the communication inside it), ``optimizer``, ``other`` (bubble,
pipeline transfers, reductions after the last backward), ``step``, and ``layer`` = (fwd + bwd) / (micro-batches
x layers on the rank). Nothing here times a step; what is added is bookkeeping:

* a framework overhead measured on a tiny twin (:mod:`tpsim.validate.overhead`): fwd/bwd per layer and
  micro-batch go into the estimator's host time per layer (so the bubble grows with them), opt/other per step
  are added to their phase;
* each collective kind per axis per step (``comm:<axis>:<op>``) of :func:`tpsim.validate.plan.comm.expected_comm`
  on each rank, timed by the topology's collective model on the plan's groups: what the report compares with
  the counted collectives, not part of the step.

The ranks of a scaled-down case hold the same layers and no edges: each rank's phases are the slowest rank's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .case import PlanCase
from .comm import Comm, expected_comm

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


def predict_plan(case: PlanCase, cluster: Any, compute: Any, overhead: dict[str, float] | None = None
                 ) -> PlanPrediction:
    """Per-rank phases of one step (see module docstring). ``overhead``: framework overhead to add (fwd/bwd
    seconds per layer and micro-batch, opt/other seconds per step)."""
    import dataclasses

    from ...collectives.model import get_collective_model
    from ...estimator import estimate_batch
    from ...estimator.context import context_for
    from ...plan import PlanBatch
    from ...topology.placement import rank_groups

    over = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0, "other": 0.0, **(overhead or {})}
    ctx = context_for(case.model, cluster, compute, None, RUNTIME_STACK, "dtensor")
    if over["fwd"] or over["bwd"]:
        ctx = dataclasses.replace(ctx, host_overhead_s=ctx.host_overhead_s + over["fwd"] + over["bwd"])
    plan = case.plan()
    ctx.check_stack(plan)
    est = estimate_batch(case.model, cluster, PlanBatch.from_plans([plan]), compute, "dtensor", context=ctx)
    passes = case.microbatches * case.layers_per_rank
    phases = {k: float(v[0]) for k, v in est.phases.items()}
    # the estimator's host time per layer sits in the backward phase: the measured forward part moves to fwd
    phases["fwd"] += passes * over["fwd"]
    phases["bwd"] -= passes * over["fwd"]
    phases["optimizer"] += over["opt"]
    phases["other"] += over["other"]
    step = float(est.step_time_s[0]) + over["opt"] + over["other"]
    timed = {**phases, "step": step, "layer": (phases["fwd"] + phases["bwd"]) / passes}
    groups = rank_groups(case.tp, case.dp, case.pp, case.order)
    curves = _Curves(get_collective_model(cluster) if case.world > 1 else None, groups)
    ranks = [{**timed, **comm_times(expected_comm(case, _coords(case, rank)), curves)} for rank in range(case.world)]
    return PlanPrediction(phases=ranks, layer_fwd_s=phases["fwd"] / passes, layer_bwd_s=phases["bwd"] / passes,
                          compute_model=str(est.compute_model),
                          measured_compute_fraction=float(est.measured_compute_fraction[0]), overhead=over)


def _coords(case: PlanCase, rank: int) -> dict[str, int]:
    coords = {}
    for axis, size in reversed(case.mesh_axes()):
        rank, coords[axis] = divmod(rank, size)
    return coords
