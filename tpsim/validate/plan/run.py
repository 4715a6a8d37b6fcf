"""What each rank measures for one :class:`~tpsim.validate.plan.case.PlanCase` (rank side).

* **Numerics** (first step, from the initial weights): the loss, every parameter gradient and every parameter
  after one Adam step equal those of the unsharded layer stack run on the whole global batch on this rank
  (fp32; the same relative tolerance as the block check, and for the step the update's own scale).
* **Communication** (third step: DDP has rebuilt its buckets, the pipeline stages know their shapes): every
  collective and point-to-point call by mesh axis (:class:`tpsim.validate.axis.rec.AxisRecorder`).
* **Time**: ``warmup`` then ``reps`` steps: the step, the forward and backward computation (the chunks'
  forward and backward, with the TP and FSDP communication inside them), the optimizer step, and the rest of
  the step (pipeline bubble, transfers, reductions outside the chunks); then ``reps`` steps with every
  collective waited where it is issued, for the time of each kind per axis.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..axis.rec import AxisRecorder, axis_of_groups, axis_of_ranks
from ..block.measure import MAGNITUDE_FLOOR, NUMERICS_RTOL, Clock, sync
from .case import PlanCase
from .stack import ADAM_EPS, ADAM_LR, RankRuntime, build_chunk, build_runtime, finalize_grads, linear_loss
from ..modules.styles import SEQ_DIM

STEP_RTOL = 1e-3
"""max |update - reference update| / max |reference update| allowed per parameter after one Adam step, beyond
what the gradient's own difference explains (see :func:`_step_err`): the update is a difference of O(1) weights,
so its rounding noise is ~1e-7 / lr relative."""


def _device(mesh: DeviceMesh) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")


def global_batch(case: PlanCase, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and target of the whole step: (dp x microbatches x micro_batch, seq, hidden), seeded."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    shape = (case.dp * case.microbatches * case.micro_batch, case.model.seq_len, case.model.hidden_size)
    return torch.randn(shape, generator=gen).to(device), torch.randn(shape, generator=gen).to(device)


def replica_part(case: PlanCase, t: torch.Tensor, coords: dict[str, int]) -> torch.Tensor:
    """This rank's share of a global tensor: its replica's micro-batches; the sequence shard under SP."""
    n = case.microbatches * case.micro_batch
    part = t[coords["dp"] * n:(coords["dp"] + 1) * n]
    if case.sp:
        part = part.chunk(case.tp, dim=SEQ_DIM)[coords["tp"]]
    return part.contiguous()


def _loss_fn(case: PlanCase) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    numel = case.tokens * case.model.hidden_size
    return lambda y, target: linear_loss(y, target, numel)


# ---- one training step ----------------------------------------------------------------------------------
class Timers:
    """Seconds spent in forward, backward and the optimizer during one step (this rank). On a GPU each phase is
    bracketed by a synchronization (the host clock would otherwise time the kernel launches)."""

    def __init__(self, clock: Clock, recorder: AxisRecorder | None = None,
                 device: torch.device | None = None, scopes: bool = False) -> None:
        self.clock, self.recorder, self.device, self.scopes = clock, recorder, device, scopes
        self.t = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.recorder is not None:
            self.recorder.phase = {"opt": "step"}.get(name, name)
        if self.device is not None:
            sync(self.device)
        t0 = self.clock.now()
        scope = contextlib.nullcontext()
        if self.scopes:  # profiled steps: the phase as a profiler range (tpsim/validate/plan/attribute.py)
            from torch.autograd.profiler import record_function
            scope = record_function(f"tpsim:{name}")
        try:
            with scope:
                yield
                if self.scopes and self.device is not None:
                    sync(self.device)
        finally:
            if self.device is not None:
                sync(self.device)
            self.t[name] += Clock.since(t0, self.clock.now())[0]
            if self.recorder is not None:
                self.recorder.phase = "other"


def _instrument_stages(rt: RankRuntime, timers_ref: list) -> None:
    """Time the stages' forward and backward of each micro-batch (the schedule calls these)."""
    for stage in rt.stages:
        fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

        def timed_fwd(*a, _f=fwd, **k):  # noqa: ANN001, ANN202
            with timers_ref[0].phase("fwd"):
                return _f(*a, **k)

        def timed_bwd(*a, _f=bwd, **k):  # noqa: ANN001, ANN202
            with timers_ref[0].phase("bwd"):
                return _f(*a, **k)
        stage.forward_one_chunk, stage.backward_one_chunk = timed_fwd, timed_bwd
        wgrad = getattr(stage, "backward_weight_one_chunk", None)
        if wgrad is not None:  # zero-bubble schedules: the deferred weight gradients are backward work too
            def timed_wgrad(*a, _f=wgrad, **k):  # noqa: ANN001, ANN202
                with timers_ref[0].phase("bwd"):
                    return _f(*a, **k)
            stage.backward_weight_one_chunk = timed_wgrad


def run_step(rt: RankRuntime, x: torch.Tensor, target: torch.Tensor, timers: Timers,
             optimizer_step: bool = True) -> float | None:
    """One training step on this rank's share of the batch; returns the mean loss of the micro-batches on the
    last pipeline stage (this rank's part of it under SP), else None."""
    case = rt.case
    rt.optimizer.zero_grad(set_to_none=True)
    loss_fn = _loss_fn(case)
    if case.pp == 1:
        model = rt.chunks[0]
        total = 0.0
        xs, ts = x.chunk(case.microbatches), target.chunk(case.microbatches)
        for i, (xi, ti) in enumerate(zip(xs, ts)):
            no_sync = getattr(model, "no_sync", None)
            ctx = no_sync() if no_sync is not None and i < case.microbatches - 1 else contextlib.nullcontext()
            with ctx:
                with timers.phase("fwd"):
                    loss = loss_fn(model(xi), ti) / case.microbatches
                with timers.phase("bwd"):
                    loss.backward()
            total += float(loss.detach()) * case.microbatches
        mean: float | None = total / case.microbatches
    else:
        losses: list[torch.Tensor] = []
        args = (x,) if rt.first else ()
        rt.schedule.step(*args, target=target if rt.last else None, losses=losses if rt.last else None,
                         return_outputs=False)
        mean = float(torch.stack([t.detach() for t in losses]).mean()) if rt.last and losses else None
    if optimizer_step:
        with timers.phase("opt"):
            finalize_grads(rt)
            rt.optimizer.step()
    return mean


# ---- numerics -------------------------------------------------------------------------------------------
def _full(t: torch.Tensor, p: torch.nn.Parameter | None = None) -> torch.Tensor:
    """The whole tensor of a DTensor (gathered), of a DDP-localized TP shard (``_st_info``), or ``t``."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        return t.full_tensor()
    spec = getattr(p, "_st_info", None)  # a DTensorSpec: mesh, placements, global shape
    if spec is not None:
        meta = getattr(spec, "tensor_meta", None)
        shape = dict(shape=meta.shape, stride=meta.stride) if meta is not None else {}
        return DTensor.from_local(t.contiguous(), spec.mesh, spec.placements, run_check=False, **shape).full_tensor()
    return t


def _rel(got: torch.Tensor, ref: torch.Tensor, floor: float) -> float:
    return (got - ref).abs().max().item() / max(ref.abs().max().item(), floor)


def _step_err(delta: torch.Tensor, ref_delta: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor | None,
              ref_grad: torch.Tensor) -> float:
    """The optimizer's own error of one parameter's first Adam update, relative to the largest reference update.

    Two differences are not the optimizer's: (1) the first update is ``lr * g / (|g| + eps)``, whose slope in
    ``g`` is at most ``lr / eps``, so a gradient that differs by ``dg`` (rounding, within the gradient check's
    tolerance) may move the update by ``lr / eps * |dg|``; (2) the update is read as a difference of weights, each
    rounded to its dtype, so it carries up to one unit in the last place of the weight (``|w| * eps_dtype``) from
    each side: a norm weight of 1.0 with a gradient of 1e-4 moves by ~1e-4, where that rounding is ~1e-3
    relative. What is left is the optimizer's (wrong shard, missing average, stale state): the step check of the
    tp x pp and tp x dp meshes failed on norm weights without these two terms.
    """
    explained = 2.0 * torch.finfo(weight.dtype).eps * weight.abs()
    if grad is not None:
        explained = explained + (ADAM_LR / ADAM_EPS) * (grad - ref_grad).abs()
    excess = ((delta - ref_delta).abs() - explained).clamp_min(0.0)
    return excess.max().item() / max(ref_delta.abs().max().item(), 1e-6)


def reference_step(case: PlanCase, x: torch.Tensor, target: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The unsharded stack on the whole global batch: loss (mean over micro-batches), gradients, and the
    parameters' change after one Adam step."""
    ref = build_chunk(case, range(case.model.num_layers)).to(device)
    loss_fn = _loss_fn(case)
    n_mb = case.dp * case.microbatches
    total = 0.0
    for xi, ti in zip(x.chunk(n_mb), target.chunk(n_mb)):
        loss = loss_fn(ref(xi), ti) / n_mb
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    torch.optim.Adam(ref.parameters(), lr=ADAM_LR, eps=ADAM_EPS, foreach=False).step()
    delta = {n: p.detach() - before[n] for n, p in ref.named_parameters()}
    return {"loss": total, "grads": grads, "delta": delta}


def _dp_mean_grad(rt: RankRuntime, g: torch.Tensor) -> torch.Tensor:
    """ZeRO-1 keeps the local (unreduced) gradient until its step: average it over dp to compare."""
    g = g.detach().clone()
    if rt.case.dp > 1 and rt.case.runtime == "zero1":
        local = getattr(g, "_local_tensor", g)
        dist.all_reduce(local, group=rt.mesh["dp"].get_group())
        local /= rt.case.dp
    return g


def check_plan(case: PlanCase, mesh: DeviceMesh, rank: int) -> dict[str, Any]:
    """Numerics of the first step and the communication of the second (see module docstring)."""
    device = _device(mesh)
    x, target = global_batch(case, device)
    ref = reference_step(case, x, target, device)
    rt = build_runtime(case, mesh, rank, _loss_fn(case), device)
    xs, ts = replica_part(case, x, rt.coords), replica_part(case, target, rt.coords)
    timers = Timers(Clock())
    loss = run_step(rt, xs, ts, timers, optimizer_step=False)
    finalize_grads(rt)
    errors: dict[str, float] = {}
    params = rt.parameters()
    before, grads = {}, {}
    for name, p in params:
        g = _full(_dp_mean_grad(rt, p.grad), p) if p.grad is not None else None
        errors[f"grad:{name}"] = _rel(g, ref["grads"][name], MAGNITUDE_FLOOR) if g is not None else float("inf")
        before[name], grads[name] = _full(p.detach(), p).clone(), g
    rt.optimizer.step()
    for name, p in params:
        delta = _full(p.detach(), p) - before[name]
        errors[f"step:{name}"] = (_step_err(delta, ref["delta"][name], before[name], grads[name],
                                            ref["grads"][name]) * NUMERICS_RTOL / STEP_RTOL)
    run_step(rt, xs, ts, Timers(Clock()))  # DDP rebuilds its buckets (two broadcasts) in this step
    # third step: the communication of a steady-state step
    recorder = AxisRecorder(axis_of_groups(mesh), by_ranks=axis_of_ranks(mesh))
    timers = Timers(Clock(), recorder)
    with recorder:
        run_step(rt, xs, ts, timers)
    return {"coords": rt.coords, "loss_local": loss, "loss_ref": ref["loss"], "numerics": errors,
            "numerics_ok": max(errors.values()) <= NUMERICS_RTOL, "comm": recorder.totals(),
            "comm_phases": recorder.by_phase(), "n_params": len(params)}


# ---- timing ---------------------------------------------------------------------------------------------
def time_plan(case: PlanCase, mesh: DeviceMesh, rank: int) -> dict[str, Any]:
    """Per step: step, fwd, bwd, opt and the rest (seconds without run-queue time, and wall); then the
    collectives' times per axis and kind in separate steps (see module docstring)."""
    device = _device(mesh)
    x, target = global_batch(case, device)
    clock = Clock()
    timers_ref: list[Timers] = [Timers(clock, device=device)]
    rt = build_runtime(case, mesh, rank, _loss_fn(case), device, dropout=True)
    _instrument_stages(rt, timers_ref)
    xs, ts = replica_part(case, x, rt.coords), replica_part(case, target, rt.coords)
    samples: list[dict[str, float]] = []
    for i in range(case.warmup + case.reps):
        timers_ref[0] = Timers(clock, device=device)
        dist.barrier()
        sync(device)
        t0 = clock.now()
        run_step(rt, xs, ts, timers_ref[0])
        sync(device)
        clean, wall = Clock.since(t0, clock.now())
        if i >= case.warmup:
            t = timers_ref[0].t
            samples.append({"step": clean, "step_wall": wall, "delay": wall - clean, **t,
                            "other": max(clean - t["fwd"] - t["bwd"] - t["opt"], 0.0)})
    calls = []
    groups, by_ranks = axis_of_groups(mesh), axis_of_ranks(mesh)
    for _ in range(case.reps):
        recorder = AxisRecorder(groups, timed=True, clock=clock.now, by_ranks=by_ranks)
        timers_ref[0] = Timers(clock, recorder, device)
        dist.barrier()
        with recorder:
            run_step(rt, xs, ts, timers_ref[0])
        calls.append([(f"{axis}:{op}", sec) for axis, _ph, op, _b, sec in recorder.calls if op not in ("send", "recv")])
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    mode = os.environ.get(TRACE_ENV, "")
    profiled = profile_steps(rt, xs, ts, clock, device, timers_ref, samples, auto=mode == "auto") \
        if mode in ("1", "auto") else None
    return {"time": med, "samples": samples, "comm_calls": calls, **({"profile": profiled} if profiled else {})}


TRACE_ENV = "TPSIM_VALIDATE_TRACE"
"""``1`` (``tpsim validate --trace-terms``): ``TRACE_STEPS`` profiled steps after the timed ones
(:func:`profile_steps`); ``auto`` (the default): the same, but the profiling stops after the first profiled step
when that step's overhead is over ``TRACE_MAX_OVERHEAD_PCT`` (its terms could not be used)."""
TRACE_DIR_ENV = "TPSIM_VALIDATE_TRACE_DIR"
"""folder the profiled ranks write their chrome traces to (``<case>-rank<r>.json``); unset: none written."""
TRACE_STEPS = 3
"""profiled steps (at most ``reps``): the attribution takes the median one."""
COMM_NAMES = ("c10d", "gloo", "nccl", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
              "broadcast", "send", "recv", "wait_tensor", "record_param_comms", "barrier", "all_to_all", "alltoall")
"""profiler event names (lower case) of communication: collectives, point-to-point transfers and their waits."""


def _is_comm(name: str) -> bool:
    low = name.lower()
    return not low.startswith("tpsim:") and any(k in low for k in COMM_NAMES)


@contextlib.contextmanager
def _p2p_wait_scopes():
    """The pipeline schedules' waits for their transfers as ``tpsim:pp_wait`` profiler ranges."""
    from torch.autograd.profiler import record_function
    from torch.distributed.pipelining import schedules

    orig = schedules._wait_batch_p2p

    def wait(work):  # noqa: ANN001, ANN202
        with record_function("tpsim:pp_wait"):
            return orig(work)
    schedules._wait_batch_p2p = wait
    try:
        yield
    finally:
        schedules._wait_batch_p2p = orig


def _stop_profiling(over_pct: float | None) -> bool:
    """Every rank's vote (a profiled rank's first profiled step more than ``TRACE_MAX_OVERHEAD_PCT`` off its timed
    median, either way: :func:`tpsim.validate.plan.terms.traced_terms` would not use it; the other ranks
    vote no), the largest kept: all ranks run the same number of steps (their collectives pair up)."""
    from .terms import TRACE_MAX_OVERHEAD_PCT

    vote = torch.tensor([1 if over_pct is not None and abs(over_pct) > TRACE_MAX_OVERHEAD_PCT else 0])
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return bool(vote.item())


def profile_steps(rt: RankRuntime, xs: torch.Tensor, ts: torch.Tensor, clock: Clock, device: torch.device,
                  timers_ref: list, samples: list[dict[str, float]], auto: bool = False) -> dict[str, Any] | None:
    """``TRACE_STEPS`` more steps under torch.profiler (CPU and CUDA events) on rank 0 and one rank per pipeline
    stage (tp and dp coordinate 0; the other ranks run them plainly); each step's intervals split by
    :func:`tpsim.validate.plan.attribute.step_terms`, the median step kept; the profiler's overhead is the
    median profiled step against this rank's median timed step; the chrome trace is written to
    ``$TPSIM_VALIDATE_TRACE_DIR``. None on the ranks not profiled. ``auto``: when the first profiled step of a
    profiled rank is over ``TRACE_MAX_OVERHEAD_PCT`` slower than the timed median (less its run-queue time), every
    rank stops there: no more steps, no event parsing, no trace; the profiled rank returns its overhead and
    ``stopped`` (why), no ``terms`` (the timers give them)."""

    from .attribute import median_step, step_terms
    from .terms import TRACE_MAX_OVERHEAD_PCT

    case = rt.case
    n = max(1, min(TRACE_STEPS, case.reps))
    profiled = not (rt.coords.get("tp", 0) or rt.coords.get("dp", 0))
    timed = statistics.median(s["step"] for s in samples) if samples else None  # without run-queue time
    if not profiled:
        for i in range(n):
            timers_ref[0] = Timers(clock, device=device)
            dist.barrier()
            run_step(rt, xs, ts, timers_ref[0])
            sync(device)
            if auto and i == 0 and _stop_profiling(None):
                break
        return None
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    delays = []  # run-queue seconds of each profiled step (a preempted step is not the profiler's doing)
    first, stop = None, False  # (overhead %, wall) of the first profiled step; auto stopped after it
    with _p2p_wait_scopes(), profile(activities=activities) as prof:
        for i in range(n):
            timers_ref[0] = Timers(clock, device=device, scopes=True)
            dist.barrier()
            sync(device)
            t0 = clock.now()
            with record_function("tpsim:step"):
                run_step(rt, xs, ts, timers_ref[0])
                sync(device)
            clean, wall = Clock.since(t0, clock.now())
            delays.append(wall - clean)
            if auto and i == 0:
                first = (100.0 * (clean - timed) / timed if timed else None, wall)
                stop = _stop_profiling(first[0])
                if stop:
                    break
    if stop and first is not None:
        over = first[0]
        return {"rank": dist.get_rank(), "stage": rt.coords.get("pp", 0), "steps": 1, "wall_s": first[1],
                "delay_s": delays[0], "walls_s": [first[1]], "timed_step_s": timed, "overhead_pct": over,
                "terms": None, "detail": None, "events": 0, "trace": None,
                "stopped": ("profiling stopped after one step: " + (
                    f"rank {dist.get_rank()}'s profiled step {over:+.1f}% off its timed step"
                    if over is not None and abs(over) > TRACE_MAX_OVERHEAD_PCT else "another profiled rank's step was")
                    + " over the profiler-overhead limit (--trace-terms auto): terms from the timers")}
    events = list(prof.events())
    steps_ev = [e for e in events if e.name == "tpsim:step"]
    if not steps_ev:
        return None
    main = steps_ev[0].thread
    scopes: dict[str, list] = {}
    busy, comm_main, comm_bg, kernels = [], [], [], []
    for e in events:
        span = (float(e.time_range.start), float(e.time_range.end))
        if e.device_type.name != "CPU":
            (comm_bg if "nccl" in e.name.lower() else kernels).append(span)
        elif e.thread != main:
            if _is_comm(e.name):
                comm_bg.append(span)
        elif e.name.startswith("tpsim:"):
            scopes.setdefault(e.name[len("tpsim:"):], []).append(span)
        elif _is_comm(e.name):
            comm_main.append(span)
        elif not e.cpu_children or e.name.startswith("aten::"):
            busy.append(span)
    per_step = []
    for i, (s0, s1) in enumerate(sorted((float(e.time_range.start), float(e.time_range.end)) for e in steps_ev)):
        def within(spans: list) -> list:
            return [(max(a, s0), min(b, s1)) for a, b in spans if b > s0 and a < s1]
        spans = {k: within(v) for k, v in scopes.items()}
        spans.update(step=[(s0, s1)], busy=within(busy), comm_main=within(comm_main), comm_bg=within(comm_bg),
                     kernels=within(kernels))
        per_step.append(dict(step_terms(spans, case.tp, case.pp), delay_s=delays[i] if i < len(delays) else 0.0))
    best = median_step(per_step)
    wall = best["detail"]["step"]
    clean = max(wall - best["delay_s"], 0.0)
    path = None
    folder = os.environ.get(TRACE_DIR_ENV)
    if folder:
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{case.name}-rank{dist.get_rank()}.json")
            prof.export_chrome_trace(path)
        except OSError:
            path = None
    return {"rank": dist.get_rank(), "stage": rt.coords.get("pp", 0), "steps": n, "wall_s": wall,
            "delay_s": best["delay_s"], "walls_s": [p["detail"]["step"] for p in per_step], "timed_step_s": timed,
            "overhead_pct": 100.0 * (clean - timed) / timed if timed else None,
            "terms": best["terms"], "detail": best["detail"], "events": len(events), "trace": path}
