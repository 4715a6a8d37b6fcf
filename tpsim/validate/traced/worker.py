"""Rank side of ``tpsim validate --model X.ops.json``: build the traced model for real (seeded, fp32, CPU or
GPU), shard it with ``parallelize_module`` in the plan's styles, and check numerics against the unsharded
model, count the collectives (``CommDebugMode``, and bytes through :class:`CollectiveRecorder`), and time the
forward and backward passes.

Started by torch.distributed's launcher (``python -m torch.distributed.run ... -m
tpsim.validate.traced.worker --job JOB.json``); failure handling as :mod:`tpsim.validate.worker`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

try:
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.debug import CommDebugMode
except ImportError:  # torch < 2.5
    from torch.distributed._tensor import DTensor, Replicate
    from torch.distributed._tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                               parallelize_module)

from ..modules.loss import as_loss
from ..modules.conv_styles import CONV_TYPES, ChannelShard, ConvColwise, ConvRowwise
from ..block.measure import Clock, CollectiveRecorder
from ..worker import run_rank, write_json_atomic

NUMERICS_RTOL = 1e-8
"""max |sharded - unsharded| / max(max |unsharded|, 1) per tensor. The numerics check runs in float64: a
whole model (tens of layers, batch norms) accumulates fp32 rounding of a different summation order above
1e-4, while a wrong shard, a missing or extra reduction is off by O(1); float64 keeps the two apart."""
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}


def module_plan(model: nn.Module, styles: dict[str, str], loss_inputs: tuple[str, ...] = ()) -> dict[str, Any]:
    """{module path: ParallelStyle} from {module path: op-graph style} (modules of the traced ops);
    ``loss_inputs``: colwise linears whose logits feed a vocabulary-parallel loss (their output stays a
    DTensor sharded over the classes, for ``loss_parallel``)."""
    plan: dict[str, Any] = {}
    modules = dict(model.named_modules())
    for path, style in styles.items():
        mod = modules.get(path)
        if mod is None:
            raise ValueError(f"the plan names module {path!r}, which the model does not have")
        conv = isinstance(mod, CONV_TYPES)
        if style == "colwise":
            if conv:
                plan[path] = ConvColwise()
            elif isinstance(mod, nn.Linear):
                plan[path] = ColwiseParallel(use_local_output=path not in loss_inputs)
            else:
                raise ValueError(f"colwise on {path}: {type(mod).__name__} is not an nn.Linear or nn.Conv*d")
        elif style == "rowwise":
            if conv:
                plan[path] = ConvRowwise()
            elif isinstance(mod, (nn.Linear, nn.Embedding)):
                plan[path] = RowwiseParallel()
            else:
                raise ValueError(f"rowwise on {path}: {type(mod).__name__} is not an nn.Linear or nn.Conv*d")
        elif style == "vocab":
            if not isinstance(mod, nn.Embedding):
                raise ValueError(f"vocab on {path}: {type(mod).__name__} is not an nn.Embedding")
            plan[path] = RowwiseParallel(input_layouts=Replicate())  # token ids: replicated (torchtitan's)
        elif style == "sharded":
            plan[path] = ChannelShard()
        else:
            raise ValueError(f"style {style!r} of {path} is not supported by tpsim validate")
    return plan


def shard_model(model: nn.Module, mesh: DeviceMesh, job: dict[str, Any]) -> nn.Module:
    """Apply the job's plan, then tie again the parameters the original model ties (an embedding shared
    with the output layer: both sharded alike)."""
    tied = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        tied[id(p)].append(name)
    plan = module_plan(model, dict(job["modules"]), tuple(job.get("loss_inputs", ())))
    parallelize_module(model, mesh, plan)
    for names in tied.values():
        if len(names) > 1:
            first_mod, _, first_attr = names[0].rpartition(".")
            keep = getattr(model.get_submodule(first_mod), first_attr)
            for other in names[1:]:
                mod, _, attr = other.rpartition(".")
                setattr(model.get_submodule(mod), attr, keep)
    return model


def build(job: dict[str, Any], device: torch.device) -> nn.Module:
    """The job's model, seeded (the same weights on every rank), on ``device``, in training mode."""
    from ...opgraph.spec import resolve_factory
    torch.manual_seed(int(job["seed"]))
    try:
        model = resolve_factory(job["module_spec"])(**job["kwargs"])
    except SystemExit as exc:  # sys.exit at import or in the factory is the module failing, even sys.exit(0)
        raise RuntimeError(f"{job['module_spec']} called sys.exit({exc.code!r}) while building the model") from None
    if not isinstance(model, nn.Module):
        raise TypeError(f"{job['module_spec']} returned {type(model).__name__}, not an nn.Module")
    model = model.to(device)
    model.train()
    return model


def make_inputs(job: dict[str, Any], device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(int(job["seed"]) + 1)
    out = []
    for shape, dtype in job["inputs"]:
        if dtype.startswith("int"):
            out.append(torch.randint(0, int(job["int_high"]), tuple(shape), generator=gen).to(device))
        else:
            out.append(torch.randn(tuple(shape), generator=gen).to(device))
    return out


def _no_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _counts(mode: CommDebugMode) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for packet, n in mode.get_comm_counts().items():
        base = str(packet).split(".")[-1] if not hasattr(packet, "_opname") else packet._opname
        out[_FUNCOL.get(base, base)] += int(n)
    return dict(out)


def _loss_ctx(job: dict[str, Any]) -> Any:
    return loss_parallel() if job.get("loss_parallel") else contextlib.nullcontext()


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def check(job: dict[str, Any], mesh: DeviceMesh, device: torch.device) -> dict[str, Any]:
    """Loss and every parameter gradient against the unsharded model; collectives of one fwd + bwd."""
    ref = build(job, device).double()
    _no_dropout(ref)
    sharded = shard_model(copy.deepcopy(ref), mesh, job)
    inputs = [t.double() if t.is_floating_point() else t for t in make_inputs(job, device)]
    loss_ref = as_loss(ref(*inputs))
    loss_ref.backward()
    rec_f, rec_b = CollectiveRecorder(), CollectiveRecorder()
    with _loss_ctx(job):
        with CommDebugMode() as comm_f, rec_f:
            loss = as_loss(sharded(*inputs))
        with CommDebugMode() as comm_b, rec_b:
            loss.backward()
    errors = {"loss": _rel_err(_scalar(loss).detach(), loss_ref.detach())}
    ref_params = dict(ref.named_parameters())
    for name, p in sharded.named_parameters():
        if p.grad is not None:
            errors[f"grad:{name}"] = _rel_err(_full(p.grad), ref_params[name].grad)
    return {"numerics": errors, "numerics_ok": max(errors.values()) <= NUMERICS_RTOL,
            "counts": {"fwd": _counts(comm_f), "bwd": _counts(comm_b)},
            "bytes": {"fwd": {k: v["bytes"] for k, v in rec_f.by_op().items()},
                      "bwd": {k: v["bytes"] for k, v in rec_b.by_op().items()}}}


def time_model(job: dict[str, Any], mesh: DeviceMesh, device: torch.device) -> dict[str, Any]:
    """Median forward and backward seconds (without run-queue time, :class:`Clock`) over ``reps``."""
    model = shard_model(build(job, device), mesh, job)
    inputs = make_inputs(job, device)
    group = mesh.get_group() if mesh.size() > 1 else None
    clock = Clock()

    def step() -> tuple[tuple[float, float], tuple[float, float]]:
        for p in model.parameters():
            p.grad = None
        if group is not None:
            dist.barrier(group=group)
        t0 = clock.now()
        with _loss_ctx(job):
            loss = as_loss(model(*inputs))
            t1 = clock.now()
            loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return Clock.since(t0, t1), Clock.since(t1, clock.now())

    for _ in range(int(job["warmup"])):
        step()
    fwd, bwd = zip(*(step() for _ in range(int(job["reps"]))))
    return {"fwd_s": statistics.median(f[0] for f in fwd), "bwd_s": statistics.median(b[0] for b in bwd),
            "fwd_wall_s": statistics.median(f[1] for f in fwd), "bwd_wall_s": statistics.median(b[1] for b in bwd),
            "fwd_all_s": [f[0] for f in fwd], "bwd_all_s": [b[0] for b in bwd]}


def _run(job: dict[str, Any], out: Path, rank: int) -> None:
    torch.set_num_threads(int(job.get("threads", 1)))
    backend = job.get("backend", "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=float(job["timeout_s"])))
    world = dist.get_world_size()
    for case in job["cases"]:
        if world != int(case["tp"]):
            raise ValueError(f"case {case['name']}: tp={case['tp']} but {world} ranks were started")
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    results = []
    for case in job["cases"]:
        result = {"case": case["name"], "rank": rank, **check(case, mesh, device)}
        if int(case.get("reps", 0)) > 0:
            result.update(time_model(case, mesh, device))
        results.append(result)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(results, gathered, dst=0)
    if rank == 0:
        meta = {"world": world, "backend": backend, "torch": torch.__version__, "threads": torch.get_num_threads()}
        write_json_atomic(out / "result.json", {"meta": meta, "ranks": gathered})
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpsim.validate.traced.worker")
    parser.add_argument("--job", required=True, type=Path)
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    out = Path(job["out_dir"])
    rank = int(os.environ.get("RANK", 0))
    run_rank(lambda: _run(job, out, rank), out, rank)


if __name__ == "__main__":
    sys.exit(main())
