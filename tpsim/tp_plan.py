"""A plan's tensor-parallel part in DTensor's vocabulary, and the collectives it implies.

The same description drives the estimator (torch-free, here) and ``tpsim validate`` (which maps each style to
``ColwiseParallel()``, ``RowwiseParallel()``, ``SequenceParallel()``, ``PrepareModuleInput`` for
``parallelize_module``), so what is predicted and what runs are one thing.

Module names follow torchtitan's Llama block: ``attention_norm``, ``attention.{wq,wk,wv,wo}`` (or a fused
``attention.wqkv``), ``ffn_norm``, ``feed_forward.{w1,w3,w2}`` (w3 only for SwiGLU).

Styles:
  ``colwise``          ColwiseParallel(): weight Shard(0), input Replicate, output sharded on the last dim
  ``rowwise``          RowwiseParallel(): weight Shard(1), output Partial -> Replicate (all-reduce)
  ``rowwise:seq``      RowwiseParallel(output_layouts=Shard(1)): Partial -> Shard(1) (reduce-scatter)
  ``sequence``         SequenceParallel(): norm on a sequence-sharded input, parameters replicated
  ``gather:seq``       PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()):
                       all-gather of the sequence-sharded input

Collectives (DTensor ``_collective_utils`` table; Megatron-Core ``tensor_parallel/mappings.py`` pairs):
Partial->Replicate = all-reduce, Shard->Replicate = all-gather, Partial->Shard = reduce-scatter; the backward of
an all-gather is a reduce-scatter and vice versa; the backward of a Replicate input consumed by colwise linears
is an all-reduce of the input gradient.

Two runtimes differ, and ``flavor`` says which one is predicted:
* ``megatron`` (Megatron-Core): fused QKV and fused gate/up, so one input-gradient reduction per block; under
  sequence parallelism the column-parallel linears keep only the sharded input and all-gather it again in
  backward for the weight gradient (overlapped with the data-gradient GEMM); the input-gradient all-reduce /
  reduce-scatter is asynchronous and overlaps the weight-gradient GEMM; norm-weight gradients are all-reduced
  over TP once per step (``finalize_model_grads``), not per micro-batch.
* ``dtensor`` (torch.distributed.tensor.parallel, as ``tpsim validate`` runs it): separate q/k/v and w1/w3
  unless fused; without sequence parallelism every colwise linear reduces its own input gradient
  (``DTensor.from_local`` backward), with it the gather boundary reduces once; the gathered input is saved
  for backward (no re-gather); nothing overlaps. Under sequence parallelism the replicated norm weights
  (``SequenceParallel``) get ``Partial(sum)`` gradients: backward issues no collective for them, the sum is
  taken when the gradient is first materialized (optimizer step, grad clipping), so it is a per-step cost
  like Megatron's, not a per-layer one. Verified with ``CommDebugMode`` on torch 2.13 (``tpsim validate``,
  tests/test_validate_distributed.py): forward/backward counts per collective type equal this function's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import ModelSpec

FLAVORS = ("megatron", "dtensor")


def layer_plan(model: ModelSpec, sp: bool, fused: bool = True) -> dict[str, str]:
    """Parallelize plan of one transformer block: module path -> style (see module docstring)."""
    plan: dict[str, str] = {}
    if sp:
        plan["attention_norm"] = "sequence"
        plan["attention"] = "gather:seq"
    if fused:
        plan["attention.wqkv"] = "colwise"
    else:
        plan.update({"attention.wq": "colwise", "attention.wk": "colwise", "attention.wv": "colwise"})
    plan["attention.wo"] = "rowwise:seq" if sp else "rowwise"
    if sp:
        plan["ffn_norm"] = "sequence"
        plan["feed_forward"] = "gather:seq"
    if model.gated and fused:
        plan["feed_forward.w13"] = "colwise"
    else:
        plan["feed_forward.w1"] = "colwise"
        if model.gated:
            plan["feed_forward.w3"] = "colwise"
    plan["feed_forward.w2"] = "rowwise:seq" if sp else "rowwise"
    return plan


@dataclass(frozen=True)
class CommOp:
    """One collective over the TP group in one layer and one micro-batch."""

    phase: str
    """"fwd" or "bwd"."""
    op: str
    """all_reduce | all_gather | reduce_scatter (nccl-tests byte convention: full tensor)."""
    module: str
    """module whose boundary issues it."""
    activation: bool = True
    """True: the tensor is one activation of tokens x hidden elements; False: ``numel`` elements."""
    numel: int = 0
    overlap: str = ""
    """GEMM it can hide behind in this runtime: "" (exposed), "wgrad" or "dgrad"."""


def _consumer_groups(plan: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(block, colwise modules sharing that block's input) in forward order."""
    groups: dict[str, list[str]] = {}
    for name, style in plan.items():
        if style == "colwise":
            groups.setdefault(name.split(".")[0], []).append(name)
    return list(groups.items())


def layer_collectives(model: ModelSpec, tp: int, sp: bool, flavor: str = "megatron",
                      fused: bool | None = None) -> list[CommOp]:
    """Collectives of one block (forward and backward) for a TP degree; [] when tp == 1."""
    if flavor not in FLAVORS:
        raise ValueError(f"flavor={flavor!r} is not one of {FLAVORS}")
    if tp == 1:
        return []
    if fused is None:
        fused = flavor == "megatron"
    plan = layer_plan(model, sp, fused)
    ops: list[CommOp] = []
    megatron = flavor == "megatron"
    for block, consumers in _consumer_groups(plan):
        if sp:
            ops.append(CommOp("fwd", "all_gather", block))
            ops.append(CommOp("bwd", "reduce_scatter", block, overlap="wgrad" if megatron else ""))
            if megatron:  # input re-gathered for the weight gradient (sequence-parallel column linear)
                ops.append(CommOp("bwd", "all_gather", block, overlap="dgrad"))
        else:
            reductions = 1 if megatron else len(consumers)
            for name in consumers[:reductions]:
                ops.append(CommOp("bwd", "all_reduce", name, overlap="wgrad" if megatron else ""))
        row = next(n for n, s in plan.items() if n.startswith(block + ".") and s.startswith("rowwise"))
        if sp:
            ops.append(CommOp("fwd", "reduce_scatter", row))
            ops.append(CommOp("bwd", "all_gather", row))
        else:
            ops.append(CommOp("fwd", "all_reduce", row))
    # Norm-weight gradients under SP: none per layer in either flavor. DTensor leaves them Partial(sum) until
    # they are materialized (once per step); Megatron all-reduces them in finalize_model_grads (once per step).
    return sorted(ops, key=lambda c: c.phase != "fwd")


def count_by_kind(ops: list[CommOp]) -> dict[str, dict[str, int]]:
    """{"fwd": {"all_reduce": 2, ...}, "bwd": {...}}, the form CommDebugMode counts are compared in."""
    out: dict[str, dict[str, int]] = {"fwd": {}, "bwd": {}}
    for c in ops:
        out[c.phase][c.op] = out[c.phase].get(c.op, 0) + 1
    return out
