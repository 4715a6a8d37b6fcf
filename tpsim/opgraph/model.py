"""A traced op graph as the model a plan is made for (``--model path.ops.json``), torch-free.

:class:`OpGraphModel` holds the graph, its derived TP plan and the user's overrides, and answers the few
questions the plan enumeration and validity rules ask of a model (``num_layers``: pipeline-splittable layers
= block instances + glue units; ``global_batch``; ``default_plan``). Transformer-specific divisibility rules
(heads, FFN, sequence length) do not apply to an op graph: a TP region whose split dims a degree does not
divide runs replicated at that degree (see :mod:`tpsim.opgraph.tp`); the adapter sets those fields to the GPU
count (which every TP degree divides) so the shared rules pass, and :func:`graph_violation` holds the rules
that do apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .schema import OpGraph, load_opgraph
from .tp import PlanOverrides, TPPlan, derive_plan, load_overrides


@dataclass(frozen=True, kw_only=True)
class OpGraphModel:
    """A traced model with its TP plan; what ``load_model`` returns for a ``*.ops.json`` path."""

    graph: OpGraph
    tp_plan: TPPlan
    overrides: PlanOverrides = field(default_factory=PlanOverrides)
    path: str = ""
    gpus_hint: int = 1
    """a multiple of every TP degree the planner tries (the GPU count): see the module docstring."""
    global_batch: int = 0
    default_plan: Mapping[str, Any] = field(default_factory=dict)

    family = "opgraph"
    # the mixture-of-experts and attention fields of the shared plan rules (tpsim/plan.py): a traced graph is
    # planned as a dense model with standard attention, without context or expert parallelism (its estimator
    # has neither; tpsim/cli/graph.py fixes cp = ep = 1)
    is_moe = False
    num_experts = 0
    moe_ffn_hidden_size = 0
    attention_kind = "standard"
    sliding_window = 0
    full_attention_layers = ()

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def num_layers(self) -> int:
        """Pipeline-splittable layers: every block instance and glue unit."""
        return sum(u.repeat for u in self.graph.units)

    @property
    def seq_len(self) -> int:
        """Tokens per sample (sequence models) or the input's last dim (images): what sp splits."""
        if self.graph.tokens_per_sample > 1:
            return self.graph.tokens_per_sample
        return int(self.graph.inputs[0].shape[-1])

    # fields of the shared validity rules that do not constrain an op graph (module docstring)
    @property
    def num_attention_heads(self) -> int:
        return self.gpus_hint

    @property
    def num_kv_heads(self) -> int:
        return self.gpus_hint

    @property
    def ffn_hidden_size(self) -> int:
        return self.gpus_hint

    def with_gpus(self, gpus: int) -> "OpGraphModel":
        import dataclasses
        return dataclasses.replace(self, gpus_hint=int(gpus))

    def total_params(self, tp: int = 1) -> int:  # noqa: ARG002 (unused: kept for the callers)
        return self.graph.total_params()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "family": "opgraph", "path": self.path, "params": self.graph.total_params(),
                "layers": self.num_layers, "units": len(self.graph.units), "ops": self.graph.num_ops(),
                "batch_traced": self.graph.batch, "tokens_per_sample": self.graph.tokens_per_sample,
                "tp_plan": self.tp_plan.described(self.graph), "conv": self.overrides.conv}


def load_graph_model(path: str | Path, tp_plan: str | Path | None = None) -> OpGraphModel:
    """An op graph file with its derived TP plan (and the overrides of ``tp_plan``, a YAML path)."""
    graph = load_opgraph(path)
    overrides = load_overrides(tp_plan) if tp_plan else PlanOverrides()
    return OpGraphModel(graph=graph, tp_plan=derive_plan(graph, overrides), overrides=overrides, path=str(path))


def graph_violation(model: OpGraphModel, plan: Any, num_gpus: int | None = None) -> str | None:
    """The first rule a plan breaks for an op graph, as a line (None: valid)."""
    if num_gpus is not None and plan.tp * plan.pp * plan.dp != num_gpus:
        return f"tp={plan.tp} x pp={plan.pp} x dp={plan.dp} = {plan.tp * plan.pp * plan.dp} != gpus={num_gpus}"
    if plan.sp and plan.tp == 1:
        return "sequence parallelism needs tp > 1 (tp=1)"
    if plan.vpp > 1 and plan.pp == 1:
        return f"vpp={plan.vpp} needs pp > 1 (pp=1)"
    if plan.pp * plan.vpp > model.num_layers:
        return (f"pp={plan.pp} x vpp={plan.vpp} = {plan.pp * plan.vpp} exceeds the {model.num_layers} layers "
                f"(block instances and glue units) of {model.name}")
    per_step = plan.micro_batch * plan.dp
    if plan.global_batch % per_step:
        return f"global batch {plan.global_batch} is not a multiple of micro-batch {plan.micro_batch} x dp {plan.dp}"
    if plan.vpp > 1 and (plan.global_batch // per_step) % plan.pp:
        return (f"interleaved schedule needs micro-batches {plan.global_batch // per_step} divisible by "
                f"pp={plan.pp} (vpp={plan.vpp})")
    if plan.zero and plan.dp == 1:
        return f"zero={plan.zero} needs dp > 1 (dp=1)"
    return None


def validate_graph_plan(model: OpGraphModel, plan: Any, num_gpus: int | None = None) -> Any:
    from ..errors import PlanError
    from ..plan import _check_types

    _check_types(plan)
    problem = graph_violation(model, plan, num_gpus)
    if problem:
        raise PlanError(problem)
    return plan


def make_graph_plan(model: OpGraphModel, num_gpus: int, *, global_batch: int | None = None, **fields: Any) -> Any:
    """:func:`tpsim.plan.make_plan` for an op graph (dp derived; global batch default: dp x micro-batch)."""
    from ..errors import PlanError
    from ..plan import Plan

    values = {k: v for k, v in fields.items() if v is not None}
    tp, pp = int(values.get("tp", 1)), int(values.get("pp", 1))
    if tp <= 0 or pp <= 0 or num_gpus <= 0:
        raise InputError(f"tp={tp}, pp={pp}, gpus={num_gpus} must be positive integers")
    if num_gpus % (tp * pp):
        raise PlanError(f"tp={tp} x pp={pp} = {tp * pp} does not divide gpus={num_gpus}")
    values["dp"] = num_gpus // (tp * pp)
    values["global_batch"] = int(global_batch or values.get("global_batch") or model.global_batch
                                 or values["dp"] * int(values.get("micro_batch", 1)))
    values.setdefault("vpp", 1)
    return validate_graph_plan(model, Plan(**values), num_gpus)
