"""Per-term attribution of a profiled step by interval arithmetic (issue 22; torch-free: the rank hands plain
intervals over, :func:`tpsim.validate.plan.run.profile_steps`).

A profiled rank's step is given as intervals in microseconds:

* ``step``: the step's scope (``tpsim:step``), ``fwd`` / ``bwd`` / ``opt``: the phase scopes the runtime opens
  (the chunks' forward and backward under the schedules, the optimizer step), ``pp_wait``: the pipeline
  schedules' waits for their sends and receives (``torch.distributed.pipelining.schedules._wait_batch_p2p``);
* ``busy``: the main thread's computing events (leaves and ``aten::`` operators), ``comm_main``: its
  communication events (DTensor's functional collectives and their ``wait_tensor``, the c10d calls, gloo's
  ``gloo:send`` / ``gloo:recv``, which span their waits), ``comm_bg``: communication
  running elsewhere (gloo's worker threads, ``gloo:*``; NCCL kernels on a CUDA stream), ``kernels``: other CUDA
  kernels (compute on the GPU; empty on CPU).

The step window W is split, without overlap, into: the chunks C (fwd and bwd scopes), the optimizer O, the rest
R = W - C - O. Terms (docs/SCHEMAS.md T6 names, grouped as the prediction groups them,
:func:`tpsim.validate.plan.terms.plan_terms`): ``tp_comm`` = |C n comm_main| with tp > 1, ``compute`` = |C| -
``tp_comm``, ``optimizer`` = |O|, the rest |R| to ``bubble`` with a pipeline, else to ``dp_comm``; they add up
to W exactly. The finer split (``detail``), with idle = W - busy - kernels (the main thread waiting or idle): DP
communication exposed in the chunks (C n idle n communication: the main thread waits while a collective runs;
with tp the main thread's own collectives there are TP's), hidden (comm_bg n (busy u kernels)), exposed in the
rest, inside the optimizer (tpsim's ZeRO-1), the pipeline waits in the rest (pp_wait less busy), and host gaps
(R n idle with no communication running and outside the pipeline waits).
"""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]


def union(spans: Iterable[Interval]) -> list[Interval]:
    """Sorted disjoint intervals covering ``spans`` (empty ones dropped)."""
    out: list[list[float]] = []
    for s, e in sorted((s, e) for s, e in spans if e > s):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """a n b of two disjoint sorted lists (:func:`union`'s output)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """a - b of two disjoint sorted lists."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
            if cur >= e:
                break
        if cur < e:
            out.append((cur, e))
    return out


def length(a: list[Interval]) -> float:
    return sum(e - s for s, e in a)


def step_terms(spans: dict[str, list[Interval]], tp: int, pp: int) -> dict[str, object]:
    """The terms and the detail of one profiled step, seconds (see module docstring); ``spans`` in us."""
    u = {k: union(v) for k, v in spans.items()}
    get = lambda k: u.get(k, [])  # noqa: E731
    w = get("step")
    chunks = intersect(union(get("fwd") + get("bwd")), w)
    opt = subtract(intersect(get("opt"), w), chunks)
    rest = subtract(subtract(w, chunks), opt)
    working = union(get("busy") + get("kernels"))  # the main thread computing, or the GPU
    tp_s = length(intersect(chunks, get("comm_main"))) if tp > 1 else 0.0
    idle = subtract(w, working)  # waiting (inside a communication call or not) or idle
    bg, comm = get("comm_bg"), union(get("comm_main") + get("comm_bg"))
    waits = subtract(intersect(rest, get("pp_wait")), working)
    exposed_rest = subtract(intersect(intersect(rest, idle), comm), waits)
    dp_in_chunks = bg if tp > 1 else comm  # with tp, the main thread's collectives in the chunks are TP's
    terms = {"compute": length(chunks) - tp_s, "optimizer": length(opt),
             "bubble" if pp > 1 else "dp_comm": length(rest)}
    if tp > 1:
        terms["tp_comm"] = tp_s
    detail = {"step": length(w),
              "dp_exposed_in_chunks": length(subtract(intersect(intersect(chunks, idle), dp_in_chunks),
                                                      get("comm_main") if tp > 1 else [])),
              "dp_hidden": length(intersect(intersect(w, working), bg)), "dp_exposed_in_rest": length(exposed_rest),
              "comm_in_optimizer": length(intersect(intersect(opt, idle), comm)),
              "pp_wait": length(waits),
              "host_gaps": length(subtract(subtract(intersect(rest, idle), comm), waits))}
    return {"terms": {k: v / 1e6 for k, v in terms.items()}, "detail": {k: v / 1e6 for k, v in detail.items()}}


def median_step(steps: list[dict[str, object]]) -> dict[str, object] | None:
    """The step whose window is the median one (its terms add up to it: medians per term would not)."""
    if not steps:
        return None
    ranked = sorted(steps, key=lambda s: s["detail"]["step"])  # type: ignore[index]
    return ranked[(len(ranked) - 1) // 2]
