"""Work bounded before it starts (issue 26): every verb estimates its work from its inputs and refuses, with one
line, what exceeds the bounds of :mod:`tpsim.limits` (:data:`tpsim.limits.WORK_LIMITS`), before it loads a
model, builds a topology or starts a process.

One estimator per verb (:data:`ESTIMATORS`); :func:`check_work` runs the verb's estimator on the parsed command
line (``tpsim.cli.main`` calls it before the verb). An estimator returns :class:`Amount` s: the quantity, how
much of it the inputs ask for, and its bound. A soft bound is lifted by the named flag (``--allow-large-work``,
which every verb takes; the plan search's and the sweep's own flags count too); a hard bound (memory that the
model's tables would need whatever the user says) is never lifted. Estimates are cheap: file sizes, the cluster
file's GPUs per node, the sweep's axis lengths, products of degrees. An input the estimator cannot read is left
to the verb, whose own check names it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from .errors import InputError
from .limits import WORK_LIMITS

WORK_FLAG = "--allow-large-work"


@dataclass(frozen=True)
class Amount:
    """How much of one quantity the inputs ask for, and its bound."""

    quantity: str
    """a key of :data:`tpsim.limits.WORK_LIMITS`."""
    amount: float
    what: str
    """the inputs it comes from, for the message (``--gpus 65536 on local-cpu``)."""

    @property
    def limit(self) -> float:
        return WORK_LIMITS[self.quantity][0]

    @property
    def hard(self) -> bool:
        return WORK_LIMITS[self.quantity][1]

    @property
    def unit(self) -> str:
        return WORK_LIMITS[self.quantity][2]


# ----------------------------------------------------------------------------------------------- estimators
def _quiet(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None when an input it reads is bad (the verb's own check names it)."""
    try:
        return fn()
    except (InputError, OSError, ValueError, TypeError, KeyError):
        return None


def _node_pairs(args: Any, cluster_default: str | None = None) -> list[Amount]:
    """GPU pairs of one node of the cluster the verb builds (the collective model's per-pair tables)."""
    cluster = getattr(args, "cluster", None) or cluster_default
    if not isinstance(cluster, str) or not cluster:
        return []
    gpus = getattr(args, "gpus", None)

    def load() -> int:
        from .topology.spec import load_cluster_spec

        spec = load_cluster_spec(cluster, gpus)
        return int(spec.gpus_per_node or spec.node.gpu_group.count or 0)
    gpn = _quiet(load)
    if not gpn:
        return []
    return [Amount("node_gpu_pairs", gpn * gpn, f"{gpn:,} GPUs in one node of {cluster}")]


def _node_devices(args: Any) -> list[Amount]:
    """Devices of one node (``tpsim topo`` builds the node's graph: GPUs and its switches)."""
    cluster = getattr(args, "cluster", None)
    if not isinstance(cluster, str) or not cluster:
        return []

    def load() -> int:
        from .topology.spec import load_cluster_spec

        spec = load_cluster_spec(cluster, getattr(args, "gpus", None))
        others = sum(g.count for g in spec.node.devices if g.kind != "gpu" and isinstance(g.count, int))
        return int(spec.gpus_per_node or 0) + others
    devices = _quiet(load)
    return [Amount("node_devices", devices, f"one node of {cluster}")] if devices else []


def _file_bytes(paths: list[Any], what: str) -> list[Amount]:
    total = 0
    for p in paths:
        try:
            total += os.stat(str(p)).st_size
        except (OSError, ValueError, TypeError):
            continue
    return [Amount("input_bytes", total, what)] if total else []


def _model_estimate(args: Any) -> list[Amount]:
    """``estimate``, ``train-time``, ``export``: one plan on the cluster."""
    return _node_pairs(args)


def _plan(args: Any) -> list[Amount]:
    """The cluster's node, and the plan space: the candidate plans (tp x cp x ep x pp x (vpp, schedule) x sp x
    recompute x ZeRO x micro-batch x overlap, as the search enumerates them) counted without building any,
    by the verb's own counter (``args.work``, set by the verb's parser: the command line builds the model)."""
    return _node_pairs(args)


def _report(args: Any) -> list[Amount]:
    from .limits import LIMITS

    out = _node_pairs(args)
    span = getattr(args, "scaling_span", None)
    gpus = getattr(args, "gpus", None)
    if isinstance(span, int) and 1 <= span <= LIMITS["gpus"] and isinstance(gpus, int) and gpus > 0:
        powers = [1 << i for i in range(span.bit_length()) if 1 << i <= span]  # as report.analysis.scaling_counts
        counts = {gpus // k for k in powers if gpus % k == 0} | {gpus * m for m in powers if gpus * m <= LIMITS["gpus"]}
        out.append(Amount("searches", len(counts), f"--scaling-span {span} with --gpus {gpus}: the scaling study"))
    return out


def _design(args: Any) -> list[Amount]:
    def size() -> int:
        from .design.sweep import sweep_size

        return sweep_size(args.sweep)
    from .design.sweep import SECONDS_PER_TASK

    sizes = _quiet(size)
    if not sizes:
        return []
    designs, tasks = sizes
    return [Amount("designs", designs, f"the axes of {args.sweep}"),
            Amount("planning_tasks", tasks, f"the axes of {args.sweep} (about {tasks * SECONDS_PER_TASK / 3600:.1f} "
                                            f"h on one core)")]


def _topo(args: Any) -> list[Amount]:
    return _node_devices(args)


def _collective(args: Any) -> list[Amount]:
    out = _node_pairs(args, "dgx-a100")
    sizes = 24 if getattr(args, "sweep", False) else 1
    out.append(Amount("collective_points", sizes, "--sweep" if sizes > 1 else "one size"))
    return out


def _calibrate(args: Any) -> list[Amount]:
    files = list(getattr(args, "files", None) or []) + list(getattr(args, "from_validation", None) or []) \
        + list(getattr(args, "from_runs", None) or []) + [p for pair in (getattr(args, "log", None) or []) for p in pair]
    out = _file_bytes(files, "the measurement files")
    if getattr(args, "gpus", None) is not None:
        out += _node_pairs(args)
    return out


def _validate(args: Any) -> list[Amount]:
    from .limits import RANK_PROCESS_BYTES, available_memory

    if getattr(args, "print_launch", None):
        return []  # prints a command; the ranks start elsewhere
    degrees = [getattr(args, k, None) for k in ("tp", "cp", "pp", "dp")]
    world = math.prod(d for d in degrees if isinstance(d, int) and d > 0)
    nnodes = getattr(args, "nnodes", 1) or 1
    nproc = getattr(args, "nproc", None) or max(1, world // nnodes)
    out = [Amount("local_ranks", nproc, f"{nproc} local ranks")]
    free = available_memory()
    if free:
        out.append(Amount("rank_memory_share", nproc * RANK_PROCESS_BYTES / free,
                          f"{nproc} local ranks of ~{RANK_PROCESS_BYTES >> 20} MB with "
                          f"{free / 2**30:.1f} GiB available"))
    return out


def _trace(args: Any) -> list[Amount]:
    from .limits import ascii_int

    elements = 0
    for text in getattr(args, "input_shape", None) or []:
        dims = [ascii_int(p.strip()) for p in str(text).partition(":")[0].replace("x", ",").split(",")]
        if dims and all(d is not None and d > 0 for d in dims) and len(dims) <= 8:
            elements = max(elements, math.prod(dims))  # type: ignore[arg-type]
    return [Amount("input_elements", elements, "the --input-shape tensors")] if elements else []


def _profile(args: Any) -> list[Amount]:
    if getattr(args, "check", None):
        return _file_bytes([args.check], str(args.check))

    def points() -> int:
        from .profiler.grid import cpu_grid, cuda_grid, grid_tables
        from .profiler.run import DEFAULT_DTYPES

        device = getattr(args, "device", "cpu")
        grid = getattr(args, "grid", None) or ("quick" if getattr(args, "quick", False) else "full")
        dtypes = tuple(d.strip() for item in getattr(args, "dtype", None) or [] for d in item.split(",")
                       if d.strip()) or tuple(DEFAULT_DTYPES[device])
        kinds = tuple(k.strip() for k in str(getattr(args, "kinds", "gemm,attention,memory")).split(","))
        spec = (cuda_grid if device == "cuda" else cpu_grid)(grid)
        return sum(len(t) for t in grid_tables(spec, dtypes, kinds))
    n = _quiet(points)
    return [Amount("kernel_points", n, "the profile grid")] if n else []


ESTIMATORS: dict[str, Callable[[Any], list[Amount]]] = {
    "estimate": _model_estimate, "train-time": _model_estimate, "export": _model_estimate, "plan": _plan,
    "report": _report, "design": _design, "topo": _topo, "collective": _collective, "calibrate": _calibrate,
    "validate": _validate, "trace": _trace, "profile": _profile,
}
"""verb -> its work estimator (from the parsed command line)."""

_OTHER_FLAGS = {"allow_large_space": "--allow-large-space", "allow_large_sweep": "--allow-large-sweep"}


WORK_FLAGS: dict[str, str] = {"plans": "--allow-large-space", "designs": "--allow-large-sweep",
                               "planning_tasks": "--allow-large-sweep"}
"""quantity -> the verb's own flag that lifts its bound (``--allow-large-work`` lifts every soft bound too)."""


def estimate_work(verb: str, args: Any) -> list[Amount]:
    """The work the verb's inputs ask for (an empty list for a verb without an estimator), plus what the
    verb's own counter ``args.work`` (a callable its parser sets with ``set_defaults(work=...)``: counts that
    need a model, like the plan space) adds; a counter that fails on a bad input leaves it to the verb."""
    estimator = ESTIMATORS.get(verb)
    amounts = estimator(args) if estimator is not None else []
    extra = getattr(args, "work", None)
    if callable(extra):
        amounts += _quiet(lambda: extra(args)) or []
    return amounts


def check_work(verb: str, args: Any) -> list[Amount]:
    """Refuse, with one line, the first amount above its bound (a soft bound passes with ``--allow-large-work``
    or the verb's own flag); returns the estimate."""
    amounts = estimate_work(verb, args)
    allowed = bool(getattr(args, "allow_large_work", False)) or any(getattr(args, k, False) for k in _OTHER_FLAGS)
    for a in amounts:
        if a.amount <= a.limit or (allowed and not a.hard):
            continue
        amount = f"{a.amount:,.0f}" if a.amount >= 10 or float(a.amount).is_integer() else f"{a.amount:.2f}"
        limit = f"{a.limit:,.0f}" if a.limit >= 10 or float(a.limit).is_integer() else f"{a.limit:g}"
        own = WORK_FLAGS.get(a.quantity)
        how = ("a hard limit (no flag lifts it)" if a.hard
               else f"pass {own} (or {WORK_FLAG}) to run it anyway" if own else f"pass {WORK_FLAG} to run it anyway")
        raise InputError(f"{a.what}: {amount} {a.unit}, above the limit of {limit} (tpsim/limits.py "
                         f"WORK_LIMITS[{a.quantity!r}]): {how}")
    return amounts


__all__ = ["Amount", "ESTIMATORS", "WORK_FLAG", "WORK_FLAGS", "check_work", "estimate_work"]
