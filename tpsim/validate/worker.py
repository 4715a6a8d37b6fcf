"""Entry point of one rank, started by torch.distributed's launcher (``tpsim validate`` runs
``python -m torch.distributed.run ... -m tpsim.validate.worker --job JOB.json``), or by the user's launcher with
``--validate ARGS`` (``tpsim validate --print-launch``): the rank then runs ``tpsim validate ARGS``, which joins
the launch (:mod:`tpsim.validate.joined`).

Every rank: one thread (unless told otherwise), a process group with a timeout, a 1-D TP device mesh; for each
case the checks (numerics, collectives) then the timing; rank 0 gathers every rank's results and writes
``result.json`` atomically. A rank that fails writes ``error-rank<r>.json`` (time, type, message, traceback)
and exits at once without waiting for its peers; the launcher stops the others and reports the first real
error. ``TPSIM_VALIDATE_FAIL=<rank>:<stage>`` injects a failure (stage ``start``, ``check``, ``time``) or a hang
(``hang``) in one rank, for the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NoReturn

FAIL_ENV = "TPSIM_VALIDATE_FAIL"


def _inject(rank: int, stage: str) -> None:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return
    want_rank, _, want_stage = spec.partition(":")
    if int(want_rank) != rank:
        return
    if want_stage == "hang" and stage == "check":
        while True:  # a rank that never reaches its next collective
            time.sleep(1)
    if want_stage == stage:
        raise RuntimeError(f"injected failure in rank {rank} at stage {stage!r} ({FAIL_ENV}={spec})")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def init_group(backend: str, timeout_s: float) -> str:
    """Set the thread count's device and start the default process group from the environment (``env://``:
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); returns the device type."""
    import torch
    import torch.distributed as dist

    device_type = "cuda" if backend == "nccl" else "cpu"
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"--backend nccl needs CUDA GPUs, and torch {torch.__version__} sees none "
                               "(use --backend gloo on CPU)")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=float(timeout_s)))
    return device_type


def _run(job: dict[str, Any], out: Path, rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(job.get("threads", 1)))
    _inject(rank, "start")
    init_group(job.get("backend", "gloo"), job["timeout_s"])
    run_job(job, out, rank)
    dist.destroy_process_group()


def run_job(job: dict[str, Any], out: Path, rank: int) -> None:
    """Every case of the job on the ranks of the default process group (started); rank 0 gathers every rank's
    results and writes ``out/result.json``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .block.case import Case
    from .block.measure import check_case, time_case

    torch.set_num_threads(int(job.get("threads", 1)))
    backend = job.get("backend", "gloo")
    device_type = "cuda" if backend == "nccl" else "cpu"
    world = dist.get_world_size()
    meshes: dict[tuple, Any] = {}

    def mesh_of(axes: tuple[tuple[str, int], ...]) -> Any:
        if axes not in meshes:
            meshes[axes] = init_device_mesh(device_type, tuple(n for _, n in axes),
                                            mesh_dim_names=tuple(a for a, _ in axes))
        return meshes[axes]

    results = []
    for data in job["cases"]:
        if data.get("kind") == "plan":
            results.append(_run_plan(data, world, rank, mesh_of))
            continue
        if data.get("kind") == "axis":
            results.append(_run_axis(data, world, rank))
            continue
        case = Case.from_dict(data)
        if case.tp != world:
            raise ValueError(f"case {case.name}: tp={case.tp} but {world} ranks were started")
        mesh = mesh_of((("tp", world),))
        _inject(rank, "check")
        checks = check_case(case, mesh, rank)
        _inject(rank, "time")
        timing = time_case(case, mesh, rank)
        results.append({"case": case.name, "rank": rank, **checks, **timing})
        print(f"[tpsim validate] rank {rank}: {case.name} done", file=sys.stderr, flush=True)
    host = os.uname().nodename
    for r in results:
        r.setdefault("host", host)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(results, gathered, dst=0)
    if rank == 0:
        meta = {"world": world, "backend": backend, "torch": torch.__version__,
                "threads": torch.get_num_threads(), "hostname": host}
        write_json_atomic(out / "result.json", {"meta": meta, "ranks": gathered})


def _run_plan(data: dict[str, Any], world: int, rank: int, mesh_of: Any) -> dict[str, Any]:
    """Check and (unless the job says not to) time one whole-plan case on a mesh over its axes."""
    from .plan.case import PlanCase
    from .plan.run import check_plan, time_plan

    case = PlanCase.from_dict(data)
    if case.world != world:
        raise ValueError(f"case {case.name}: tp x pp x dp = {case.world} but {world} ranks were started")
    mesh = mesh_of(case.mesh_axes())
    _inject(rank, "check")
    checks = check_plan(case, mesh, rank)
    _inject(rank, "time")
    timing = time_plan(case, mesh, rank) if case.timed else {}
    print(f"[tpsim validate] rank {rank}: {case.name} done", file=sys.stderr, flush=True)
    return {"case": case.name, "rank": rank, **checks, **timing}


def _run_axis(data: dict[str, Any], world: int, rank: int) -> dict[str, Any]:
    """Check and (unless the job says not to) time one context/expert-parallel case on its own groups."""
    from .axis.case import AxisCase
    from .axis.run import check_axis, time_axis

    case = AxisCase.from_dict(data)
    if case.world != world:
        raise ValueError(f"case {case.name}: cp x dp = {case.world} but {world} ranks were started")
    _inject(rank, "check")
    checks = check_axis(case, rank)
    _inject(rank, "time")
    timing = time_axis(case, rank) if case.timed else {}
    print(f"[tpsim validate] rank {rank}: {case.name} done", file=sys.stderr, flush=True)
    return {"case": case.name, "rank": rank, **checks, **timing}


def run_rank(run: Callable[[], None], out: Path, rank: int) -> NoReturn:
    """Run one rank's work and leave the process: on an error, write ``error-rank<R>.json`` in ``out``, print
    one line and exit 1 at once (the launcher stops the peers); on success exit 0 without running interpreter
    and C++ static teardown: with the results written and the process group destroyed there is nothing left to
    do, and a gloo/DeviceMesh thread still joinable at static destruction aborts the rank ('terminate called
    without an active exception', SIGABRT) now and then."""
    try:
        run()
    except BaseException as exc:
        err = {"rank": rank, "time": time.time(), "type": type(exc).__name__, "message": str(exc),
               "traceback": traceback.format_exc()}
        try:
            write_json_atomic(out / f"error-rank{rank}.json", err)
        finally:
            print(f"[tpsim validate] rank {rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
            os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpsim.validate.worker")
    entry = parser.add_mutually_exclusive_group(required=True)
    entry.add_argument("--job", type=Path, help="a job tpsim validate wrote (its own launch)")
    entry.add_argument("--validate", nargs=argparse.REMAINDER, metavar="ARG",
                       help="the arguments of tpsim validate, run as one rank of the launch that started this "
                            "process (torchrun, srun: tpsim validate --print-launch)")
    args = parser.parse_args(argv)
    from ..procs import die_with_parent
    die_with_parent()  # a SIGKILL to tpsim validate kills the launcher, and this rank with it
    if args.validate is not None:  # the rank becomes `tpsim validate ARGS` (same process, same environment)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "tpsim.cli", "validate", *args.validate])
    job = json.loads(args.job.read_text())
    out = Path(job["out_dir"])
    rank = int(os.environ.get("RANK", 0))
    run_rank(lambda: _run(job, out, rank), out, rank)


if __name__ == "__main__":
    sys.exit(main())
