"""The prediction of a context- or expert-parallel validation case (torch-free): the estimator's own pieces for
one layer per micro-batch on the machine the ranks ran on.

* compute: :func:`tpsim.estimator.layer.layer_cost` with the case's cp, cp kind, ep and layer kind (ring
  attention steps, the rank's b s / cp tokens, router, permutation, the local experts' GEMMs, shared experts),
  separate q/k/v (and gate/up) GEMMs unless ``--fused``, as the block runs them;
* communication: the estimator's collectives of the layer (:func:`tpsim.estimator.source.cp_layer_collectives`,
  :func:`~tpsim.estimator.source.moe_layer_collectives`) timed by the collective model on the plan's rank
  layouts (:class:`tpsim.estimator.comm.AxisCurves`), each ring exchange hidden behind its step's attention as far
  as that lasts (exposed = max(0, exchange - step)), the all-to-alls exposed.

**Routing load.** The estimator sizes the busiest rank's expert work and its all-to-all by a load-imbalance
factor measured on trained routers (:mod:`tpsim.estimator.moe`); a validation block's router has random
weights, so its imbalance is whatever this micro-batch's routing gives. With ``load`` (the copies the busiest
rank's experts processed, measured) the expert compute and the ep all-to-all are sized by it instead: the
prediction then checks the compute and communication model at the run's own load, and the estimator's factor
is reported beside the run's (``imbalance``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .case import AxisCase


@dataclass(frozen=True)
class AxisPrediction:
    """Predicted seconds per layer and micro-batch on one rank."""

    fwd_s: float
    """forward: compute + exposed communication."""
    bwd_s: float
    fwd_compute_s: float
    bwd_compute_s: float
    comm_s: dict = field(default_factory=dict)
    """{"<phase>:<axis>:<op>": seconds}: every collective of the kind, hidden or not."""
    exposed_s: dict = field(default_factory=dict)
    """{"fwd": s, "bwd": s}: the communication not hidden by compute."""
    compute_model: str = "roofline"
    measured_compute_fraction: float = 0.0
    imbalance: dict | None = None
    """{"estimator": factor, "run": factor}: busiest rank's copies over the balanced count (MoE)."""
    overhead_s: float = 0.0
    """host time per layer from a calibration's compute section (not in fwd_s / bwd_s)."""

    @property
    def counts(self) -> dict:
        return {}


class _Seconds:
    """Sums what :func:`tpsim.estimator.moe.add_expert_compute` adds (``add((seconds, measured), times)``) for
    one plan."""

    def __init__(self) -> None:
        self.t = 0.0

    def add(self, res: tuple, times: float = 1.0) -> None:
        self.t += float(np.asarray(res[0]).reshape(-1)[0]) * times


def _a(x: float) -> np.ndarray:
    return np.asarray([x])


def predict_axis(case: AxisCase, cluster, compute=None, load: int | None = None) -> AxisPrediction:  # noqa: ANN001
    """Forward and backward time of the case's layer (module docstring); ``load``: the busiest rank's routed
    copies measured in the run (None: the estimator's imbalance factor)."""
    from ...estimator.comm import AxisCurves, layouts_of
    from ...estimator.context import context_for
    from ...estimator.layer import layer_cost
    from ...estimator.source import cp_layer_collectives, moe_layer_collectives
    from ...model import LayerKind
    from ...plan import PlanBatch

    model, plan = case.model, case.plan()
    ctx = context_for(model, cluster, compute, flavor="dtensor")
    axes = dict(tp=_a(1), sp=_a(False), micro_batch=_a(case.micro_batch), cp=_a(case.cp), ep=_a(case.ep),
                etp=_a(0), act_bytes=4)
    cp_kind = _a(1 if case.cp_kind == "a2a" else 0)
    kind = LayerKind(moe=model.is_moe, window=0)
    lc = layer_cost(model, ctx.compute, tp=axes["tp"], sp=axes["sp"], micro_batch=axes["micro_batch"],
                    recompute=_a(0), dtype="fp32", attention="flash", fused=case.fused, cp=axes["cp"],
                    cp_kind=cp_kind, ep=axes["ep"], etp=axes["etp"], kind=kind)
    fwd_c, bwd_c = float(lc.fwd[0]), float(lc.bwd[0])
    comm = cp_layer_collectives(model, lc, axes, cp_kind)
    imbalance = None
    if model.is_moe:
        comm += moe_layer_collectives(model, axes)
        imbalance, comm, delta = _at_load(case, ctx.compute, comm, load)
        fwd_c, bwd_c = fwd_c + delta[0], bwd_c + delta[1]
    layouts, inverse = layouts_of(ctx, PlanBatch.from_plans([plan]))
    curves = AxisCurves(ctx, layouts, inverse)
    totals: dict[str, float] = {}
    exposed = {"fwd": 0.0, "bwd": 0.0}
    for c in comm:
        t = float(curves.time(c.axes, c.op, np.asarray(c.nbytes, dtype=float))[0] * np.asarray(c.count).reshape(-1)[0])
        if t <= 0:
            continue
        key = f"{c.phase}:{'-'.join(c.axes)}:{c.op}"
        totals[key] = totals.get(key, 0.0) + t
        exposed[c.phase] += max(t - float(np.asarray(c.hide).reshape(-1)[0]), 0.0)
    return AxisPrediction(fwd_s=fwd_c + exposed["fwd"], bwd_s=bwd_c + exposed["bwd"], fwd_compute_s=fwd_c,
                          bwd_compute_s=bwd_c, comm_s=totals, exposed_s=exposed, compute_model=ctx.compute_source,
                          measured_compute_fraction=float(lc.measured[0]), imbalance=imbalance,
                          overhead_s=ctx.host_overhead_s)


def _at_load(case: AxisCase, compute, comm: list, load: int | None) -> tuple[dict, list, tuple[float, float]]:  # noqa: ANN001
    """The estimator's imbalance, and with a measured ``load``: the ep all-to-alls resized and the change of the
    expert compute (forward, backward) from the estimator's busiest-rank copies to ``load``."""
    from ...estimator.moe import add_expert_compute, expert_shape

    model = case.model
    shape = expert_shape(model, tokens_total=_a(float(case.tokens)), tp=_a(1), sp=_a(False), ep=_a(case.ep),
                         etp=_a(1))
    balanced = float(case.routed_copies)
    info = {"estimator": float(shape.imbalance[0]), "run": None if load is None else load / balanced}
    if load is None:
        return info, comm, (0.0, 0.0)
    observed = dataclasses.replace(shape, copies=_a(float(load)), imbalance=_a(load / balanced))
    sums = []
    for s in (shape, observed):
        f, b = _Seconds(), _Seconds()
        add_expert_compute(f, b, compute, model, s, "fp32")
        sums.append((f.t, b.t))
    ratio = load / float(shape.copies[0])
    resized = [dataclasses.replace(c, nbytes=np.asarray(c.nbytes) * ratio) if c.axes == ("ep",) else c for c in comm]
    return info, resized, (sums[1][0] - sums[0][0], sums[1][1] - sums[0][1])
