"""Prediction for one transformer block as ``tpsim validate`` runs it (per layer and micro-batch).

Same layer cost code as the step-time estimator (:func:`tpsim.estimator.layer.layer_cost`) with the same
:class:`~tpsim.estimator.context.EstimationContext` (compute model with the calibration's factors, collective
curves); the collectives come from :func:`tpsim.tp_plan.layer_collectives` with the runtime's flavor
(``dtensor`` for validation: nothing overlaps) and are timed on the plan's TP axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compute.base import ComputeModel
from ..compute.roofline import activation_bytes
from ..model import ModelSpec
from ..plan import Plan
from ..tp_plan import count_by_kind, layer_collectives
from .layer import layer_cost


@dataclass(frozen=True)
class BlockPrediction:
    """Seconds per layer and micro-batch on one rank."""

    fwd_s: float
    bwd_s: float
    fwd_compute_s: float
    bwd_compute_s: float
    fwd_comm_s: float
    bwd_comm_s: float
    comm: list = field(default_factory=list)
    """(phase, op, module, bytes, time_s) per collective."""
    counts: dict = field(default_factory=dict)
    """{"fwd": {op: n}, "bwd": {op: n}} as CommDebugMode counts them."""
    compute_model: str = "roofline"
    measured_compute_fraction: float = 0.0
    overhead_s: float = 0.0
    """host time per layer and micro-batch from the calibration's ``compute`` section (0 without one); not in
    ``fwd_s`` / ``bwd_s``: a measured forward + backward compares with ``fwd_s + bwd_s + overhead_s``."""

    def comm_time_by_op(self) -> dict[str, float]:
        """Total predicted time per collective kind (forward and backward together)."""
        out: dict[str, float] = {}
        for _phase, op, _module, _nbytes, t in self.comm:
            out[op] = out.get(op, 0.0) + t
        return out


def predict_block(model: ModelSpec, cluster, plan: Plan, compute: ComputeModel | None = None,
                  flavor: str = "dtensor", fused: bool = False) -> BlockPrediction:
    """Forward and backward time of one layer for ``plan.micro_batch`` sequences of ``model.seq_len``."""
    from ..topology.placement import RankLayout
    from .context import context_for

    ctx = context_for(model, cluster, compute, flavor=flavor)
    arr = lambda x: np.asarray([x])  # noqa: E731
    lc = layer_cost(model, ctx.compute, tp=arr(plan.tp), sp=arr(plan.sp), micro_batch=arr(plan.micro_batch),
                    recompute=arr(0), dtype=plan.dtype, attention=plan.attention, fused=fused)
    ops = layer_collectives(model, plan.tp, plan.sp, flavor, fused=fused)
    layout = RankLayout.from_order(plan.order, tp=plan.tp, dp=plan.dp, pp=plan.pp)
    act = plan.micro_batch * model.seq_len * model.hidden_size * activation_bytes(plan.dtype)
    comm, totals = [], {"fwd": 0.0, "bwd": 0.0}
    for c in ops:
        nbytes = float(act if c.activation else c.numel * 4)
        t = float(ctx.curve(c.op, layout, ("tp",)).curve.time(nbytes))
        comm.append((c.phase, c.op, c.module, nbytes, t))
        totals[c.phase] += t
    f, b = float(lc.fwd[0]), float(lc.bwd[0])
    return BlockPrediction(fwd_s=f + totals["fwd"], bwd_s=b + totals["bwd"], fwd_compute_s=f, bwd_compute_s=b,
                           fwd_comm_s=totals["fwd"], bwd_comm_s=totals["bwd"], comm=comm,
                           counts=count_by_kind(ops), compute_model=ctx.compute_source,
                           measured_compute_fraction=float(lc.measured[0]), overhead_s=ctx.host_overhead_s)
