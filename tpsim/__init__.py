"""tpsim: tensor-parallelism performance simulator and parallelism planner for large-model training.

Python API (torch-free)::

    import tpsim
    model = tpsim.load_model("gpt3-175b")
    cluster = tpsim.load_cluster("dgx-a100", gpus=1024)
    plan = tpsim.make_plan(model, 1024, tp=8, pp=16, sp=True, recompute="selective")
    result = tpsim.estimate(model, cluster, plan)   # frozen dataclass, same fields as `--json`
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import InputError, PlanError, TpsimError  # noqa: E402
from .model import ModelSpec, require_modelled, with_overrides  # noqa: E402
from .model import load_model as _load_spec  # noqa: E402
from .plan import Plan, make_plan, validate_plan  # noqa: E402


__all__ = ["InputError", "PlanError", "TpsimError", "ModelSpec", "load_model", "with_overrides", "Plan",
           "make_plan", "validate_plan", "estimate", "estimate_batch", "Estimate", "load_cluster", "Cluster"]


def load_model(name_or_path: str):  # noqa: ANN201 - ModelSpec or OpGraphModel
    """A preset name, a Hugging Face ``config.json`` (:func:`tpsim.model.load_model`), or a traced op graph
    (``*.ops.json`` from ``tpsim trace``: a :class:`tpsim.opgraph.model.OpGraphModel`, which
    :func:`tpsim.opgraph.estimate.estimate_graph` estimates; docs/OPGRAPH.md)."""
    import os

    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path) or "\0" in str(name_or_path):
        raise InputError(f"model={name_or_path!r:.60} must be a preset name or a path (config.json, *.ops.json)")
    if len(str(name_or_path)) > 4096:
        raise InputError(f"model={str(name_or_path)[:40]!r}... ({len(str(name_or_path))} characters) is no preset "
                         "name nor a usable path")
    if str(name_or_path).endswith(".ops.json"):
        from .opgraph.model import load_graph_model
        return load_graph_model(name_or_path)
    return _load_spec(name_or_path)


def _api_args(model, cluster, plan=None, plans=None, _batch=False) -> None:  # noqa: ANN001
    """One :class:`InputError` naming the argument for a None or a wrong type (issue 26: they failed deep
    inside with AttributeError or TypeError)."""
    from .topology import Cluster

    if not isinstance(model, ModelSpec) and type(model).__name__ != "OpGraphModel":
        raise InputError(f"model={type(model).__name__} must be a ModelSpec or an op-graph model "
                         f"(tpsim.load_model(...))")
    if not isinstance(cluster, Cluster):
        raise InputError(f"cluster={type(cluster).__name__} must be a Cluster (tpsim.load_cluster(name, gpus=N))")
    if plans is None and plan is None and _batch:
        raise InputError("plans=NoneType must be a PlanBatch (tpsim.plan.PlanBatch.from_plans([tpsim.make_plan(...), "
                         "...]))")
    if plans is None and not isinstance(plan, Plan):
        raise InputError(f"plan={type(plan).__name__} must be a Plan (tpsim.make_plan(model, gpus, ...))")
    if plans is not None:
        from .plan import PlanBatch

        if not isinstance(plans, PlanBatch):
            raise InputError(f"plans={type(plans).__name__} must be a PlanBatch "
                             f"(tpsim.plan.PlanBatch.from_plans([tpsim.make_plan(...), ...]))")


_ESTIMATE_KEYWORDS = ("compute", "flavor", "calibration", "stack", "context")
"""keyword arguments of tpsim.estimator.estimate and estimate_batch."""


def _api_keywords(kwargs: dict) -> None:
    import os

    unknown = sorted(set(kwargs) - set(_ESTIMATE_KEYWORDS))
    if unknown:
        raise InputError(f"unknown keyword argument {unknown[0]!r} (known: {', '.join(_ESTIMATE_KEYWORDS)})")
    from .calibration import Calibration

    compute, calibration = kwargs.get("compute"), kwargs.get("calibration")
    if compute is not None and not hasattr(compute, "gemm"):
        raise InputError(f"compute={type(compute).__name__} must be a compute model (tpsim.compute.load_compute)")
    if calibration is not None and not isinstance(calibration, (Calibration, str, os.PathLike)):
        raise InputError(f"calibration={type(calibration).__name__} must be a Calibration or a path to one")
    stack = kwargs.get("stack")
    if stack is not None and not isinstance(stack, (str, os.PathLike)) and not hasattr(stack, "rules"):
        raise InputError(f"stack={type(stack).__name__} must be a stack name, a path or a stack profile")


def estimate(model, cluster, plan, **kwargs):  # noqa: ANN001, ANN201 - see tpsim.estimator.estimate
    """:func:`tpsim.estimator.estimate`, after refusing a model whose features the estimator does not model
    yet (mixtures of experts, MLA, effective sliding windows: :func:`tpsim.model.unmodelled_features`)."""
    from . import estimator

    _api_args(model, cluster, plan)
    _api_keywords(kwargs)
    if isinstance(model, ModelSpec):
        require_modelled(model)
    return estimator.estimate(model, cluster, plan, **kwargs)


def estimate_batch(model, cluster, plans, **kwargs):  # noqa: ANN001, ANN201 - see tpsim.estimator
    """:func:`tpsim.estimator.estimate_batch`, after the same refusal as :func:`estimate`."""
    from . import estimator

    _api_args(model, cluster, plans=plans, _batch=True)
    _api_keywords(kwargs)
    if isinstance(model, ModelSpec):
        require_modelled(model)
    return estimator.estimate_batch(model, cluster, plans, **kwargs)


def __getattr__(name: str):  # lazy: keep `import tpsim` light
    if name == "Estimate":
        from . import estimator
        return getattr(estimator, name)
    if name in ("load_cluster", "Cluster"):
        from . import topology
        return getattr(topology, name)
    raise AttributeError(name)
