"""Step time, throughput and memory of plans for a traced op graph, all plans of a batch at once (numpy).

One step-time model: every graph runs through the estimator's own stages (:mod:`tpsim.estimator`: layer
costs, partition, communication, schedule, memory, totals) in an
:class:`~tpsim.estimator.context.EstimationContext` under the plan's stack, as a preset does; only the layer
source is the graph's (:mod:`tpsim.opgraph.source`, costs from :mod:`tpsim.opgraph.cost` and the TP
collectives from :mod:`tpsim.opgraph.layout`):

* **transformer-like graphs** (one repeated block, glue before and after it): :class:`OpGraphSource`, the block
  as the repeated layer and the glue as the two edges;
* **any other graph** (ResNets, U-Nets: blocks of different shapes): :class:`UnitSource`, every block instance
  and glue unit a layer of its unit's kind, split over the pipeline into the contiguous chunks that balance
  their costs (:func:`tpsim.estimator.partition.balanced_split`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..compute.base import ComputeModel
from ..errors import InputError
from ..estimator.result import Estimate, EstimateBatch
from ..plan import Plan, PlanBatch
from .model import OpGraphModel, validate_graph_plan

_CONTEXTS: dict[tuple, tuple] = {}


def graph_context(model: OpGraphModel, cluster: Any, compute: ComputeModel | None = None, flavor: str = "megatron",
                  conv_times: Any = None, stack: Any = None, calibration: Any = None) -> Any:
    """An :class:`EstimationContext` whose layer source is the graph (:class:`OpGraphSource` for a
    transformer-like graph, else :class:`UnitSource`), remembered by the inputs' identity like
    :func:`tpsim.estimator.context_for`."""
    from ..estimator.context import EstimationContext
    from .source import OpGraphSource, UnitSource, transformer_like

    key = (id(model), id(cluster), id(compute), flavor, id(conv_times), id(stack), id(calibration))
    hit = _CONTEXTS.get(key)
    if hit is None or hit[1] is not model or hit[2] is not cluster:
        kind = OpGraphSource if transformer_like(model.graph) is not None else UnitSource
        source = kind(model.graph, model.tp_plan, flavor, conv_times)
        ctx = EstimationContext.build(model, cluster, compute, flavor=flavor, source=source, stack=stack,  # type: ignore[arg-type]
                                      calibration=calibration)
        hit = _CONTEXTS[key] = (ctx, model, cluster, compute, calibration)
        while len(_CONTEXTS) > 16:
            _CONTEXTS.pop(next(iter(_CONTEXTS)))
    return hit[0]


def estimate_graph_batch(model: OpGraphModel, cluster: Any, plans: PlanBatch, compute: ComputeModel | None = None,
                         flavor: str = "megatron", conv_times: Any = None, stack: Any = None,
                         calibration: Any = None) -> EstimateBatch:
    """Estimate every plan of the batch for the traced model (plans valid for it on ``cluster``) with the
    estimator's stages on the graph's layer source, under ``stack`` (a training-stack profile or name)."""
    from ..estimator.core import run_stages

    if len(plans) == 0:
        raise InputError("no plans to estimate")
    wrong = plans.tp * plans.pp * plans.dp != cluster.num_gpus
    if np.any(wrong):
        bad = int(np.argmax(wrong))
        raise InputError(f"plan {plans.plan(bad).short()} does not use the cluster's gpus={cluster.num_gpus}")
    return run_stages(graph_context(model, cluster, compute, flavor, conv_times, stack, calibration), plans)


def estimate_graph(model: OpGraphModel, cluster: Any, plan: Plan, compute: ComputeModel | None = None,
                   flavor: str = "megatron", conv_times: Any = None, stack: Any = None,
                   calibration: Any = None) -> Estimate:
    """Estimate one plan for the traced model (a batch of one); its warnings add the regions of the derived
    plan that run replicated at this TP degree."""
    validate_graph_plan(model, plan, cluster.num_gpus)
    batch = estimate_graph_batch(model, cluster, PlanBatch.from_plans([plan]), compute, flavor, conv_times, stack,
                                 calibration)
    return batch.to_estimate(0, tuple(plan_notes(model, plan.tp)) + batch.warnings(0))


def plan_notes(model: OpGraphModel, tp: int) -> list[str]:
    """Regions of the derived plan that run replicated at this TP degree (their dims do not divide)."""
    from .tp import styles_at
    return styles_at(model.graph, model.tp_plan, tp)[1]
