"""The studies behind the charts: best plan per TP degree, per GPU count, and per (TP degree, inter-node
bandwidth). Each is a search (:func:`tpsim.search.search`) reduced to the best-ranked plan of each group, so
charts and tables show numbers the estimator produced for real plans.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..model import ModelSpec
from ..search import SearchResult, SearchSpace, search

SWEEP_COLUMNS = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "compute_s", "recompute_s", "bubble_s",
                 "optimizer_s", "exposed_comm_s", "overhead_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s",
                 "ep_comm_s", "fits_effective", "tp", "pp", "dp", "cp", "ep", "etp", "gpus")
TP_SWEEP_MAX = 64
"""largest TP degree of the TP sweep (issue 5: every valid tp up to 64)."""
BANDWIDTH_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
"""multiples of the cluster's inter-node link bandwidth in the heat map (0.5x HDR ~ EDR, 2x HDR = NDR)."""


def best_per(result: SearchResult, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values of column ``key`` ascending, index of the best-ranked plan of each)."""
    ranked = result.ranking
    values = result.columns[key][ranked]
    uniq, first = np.unique(values, return_index=True)  # first occurrence in ranked order = best
    return uniq, ranked[first]


@dataclass(frozen=True)
class Sweep:
    """The best plan for each value of one axis (``x``): its label and its estimate columns."""

    axis: str
    x: np.ndarray
    labels: tuple[str, ...]
    columns: Mapping[str, np.ndarray]
    gpus_per_node: int
    device_memory_gib: float

    def __len__(self) -> int:
        return int(self.x.size)


def _sweep(result: SearchResult, axis: str, cluster: Any) -> Sweep:
    x, idx = best_per(result, axis)
    cols = {name: result.columns[name][idx] for name in SWEEP_COLUMNS}
    return Sweep(axis=axis, x=x, labels=tuple(result.label(int(i)) for i in idx), columns=cols,
                 gpus_per_node=int(cluster.gpus_per_node), device_memory_gib=_usable_gib(cluster))


def _usable_gib(cluster: Any) -> float:
    device = getattr(cluster, "device", None)
    usable = getattr(device, "usable_memory_bytes", None)
    return float(usable) / 2**30 if usable else float("nan")


def tp_sweep(model: ModelSpec, cluster: Any, global_batch: int, space: SearchSpace | None = None,
             max_tp: int = TP_SWEEP_MAX, **kw: Any) -> Sweep:
    """Best plan per TP degree (every valid tp up to ``max_tp``); unfitting plans only where none fits."""
    space = space or SearchSpace()
    limit = min(max_tp, space.max_tp or max_tp)
    result = search(model, cluster, global_batch, space=dataclasses.replace(space, max_tp=limit),
                    include_unfit=True, **kw)
    return _sweep(result, "tp", cluster)


def scaling(model: ModelSpec, clusters: Sequence[Any], global_batch: int, space: SearchSpace | None = None,
            **kw: Any) -> Sweep:
    """Best fitting plan (by step time) per GPU count; counts where nothing fits are left out."""
    result = search(model, list(clusters), global_batch, space=space, objective="time", **kw)
    return _sweep(result, "gpus", clusters[-1])


@dataclass(frozen=True)
class BandwidthGrid:
    """TP-communication share of the step time of the best plan per (tp, inter-node bandwidth)."""

    tp: np.ndarray
    scales: np.ndarray
    """multiples of the cluster's inter-node bandwidth (columns)."""
    bandwidth_GBps: np.ndarray
    """inter-node bandwidth per GPU at each scale, GB/s per direction."""
    tp_share: np.ndarray
    """[tp, scale] tp_comm_s / step_time_s; NaN where that tp has no plan."""
    step_time_s: np.ndarray
    """[tp, scale] step time of the best plan."""
    fits: np.ndarray
    """[tp, scale] whether that best plan fits (else it is the best of the unfitting ones)."""
    gpus_per_node: int


def bandwidth_grid(model: ModelSpec, cluster: Any, global_batch: int,
                   variant: Callable[[Any, float], Any], base_bandwidth_GBps: float,
                   space: SearchSpace | None = None, scales: Sequence[float] = BANDWIDTH_SCALES,
                   max_tp: int = TP_SWEEP_MAX, **kw: Any) -> BandwidthGrid:
    """Search the space once per bandwidth scale on ``variant(cluster, scale)`` (a cluster whose inter-node
    links are ``scale`` times faster) and keep the best plan per tp."""
    space = space or SearchSpace()
    space = dataclasses.replace(space, max_tp=min(max_tp, space.max_tp or max_tp))
    per_scale = []
    for s in scales:
        result = search(model, variant(cluster, float(s)), global_batch, space=space, include_unfit=True, **kw)
        per_scale.append(best_per(result, "tp") + (result,))
    tps = np.unique(np.concatenate([p[0] for p in per_scale]))
    shape = (tps.size, len(scales))
    share, step, fits = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=bool)
    for j, (values, idx, result) in enumerate(per_scale):
        rows = np.searchsorted(tps, values)
        c = result.columns
        step[rows, j] = c["step_time_s"][idx]
        share[rows, j] = c["tp_comm_s"][idx] / c["step_time_s"][idx]
        fits[rows, j] = c["fits_effective"][idx]
    return BandwidthGrid(tp=tps, scales=np.asarray(scales, dtype=float),
                         bandwidth_GBps=np.asarray(scales, dtype=float) * base_bandwidth_GBps, tp_share=share,
                         step_time_s=step, fits=fits, gpus_per_node=int(cluster.gpus_per_node))


def ep_sweep(model: ModelSpec, cluster: Any, global_batch: int, space: SearchSpace | None = None,
             **kw: Any) -> Sweep:
    """Best plan per expert-parallel degree (every ep dividing the experts that has a valid plan); unfitting
    plans only where none fits. A dense model has the one value ep = 1."""
    result = search(model, cluster, global_batch, space=space or SearchSpace(), include_unfit=True, **kw)
    return _sweep(result, "ep", cluster)


CONTEXT_SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072)
"""sequence lengths of the context-parallel sweep (tokens)."""


@dataclass(frozen=True)
class ContextSweep:
    """Per sequence length, the best fitting plan without context parallelism (cp = 1) and with it (cp > 1),
    at the same tokens per step (global batch = tokens // sequence length). Columns are NaN (fits False) where
    that side has no fitting plan."""

    seq_len: np.ndarray
    tokens_per_step: int
    without_cp: Mapping[str, np.ndarray]
    with_cp: Mapping[str, np.ndarray]
    labels_without: tuple[str, ...]
    labels_with: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.seq_len.size)

    def pays(self) -> np.ndarray:
        """Where the best cp > 1 plan has more throughput than the best cp = 1 plan, or is the only one that
        fits."""
        a, b = self.without_cp["tokens_per_s"], self.with_cp["tokens_per_s"]
        return np.isfinite(b) & ~(a >= b)

    def first_paying(self) -> int | None:
        """The shortest sequence length from which context parallelism pays at every longer one (None: never)."""
        pays = self.pays()
        if not pays.any() or not pays[-1]:
            return None
        k = len(pays) - 1
        while k > 0 and pays[k - 1]:
            k -= 1
        return int(self.seq_len[k])


def context_sweep(model: ModelSpec, cluster: Any, tokens_per_step: int, space: SearchSpace | None = None,
                  seq_lens: Sequence[int] = CONTEXT_SEQ_LENS, **kw: Any) -> ContextSweep:
    """One search per sequence length (the model with that ``seq_len``; learned positions grow with it), each
    reduced to its best fitting cp = 1 and cp > 1 plans: where context parallelism starts to pay."""
    from ..model import with_overrides

    space = dataclasses.replace(space or SearchSpace(), cp_min_seq=1)  # cp > 1 at every length of the sweep
    names = SWEEP_COLUMNS + ("cp_kind",)
    sides: dict[str, dict[str, list]] = {"without": {n: [] for n in names}, "with": {n: [] for n in names}}
    labels: dict[str, list[str]] = {"without": [], "with": []}
    for s in seq_lens:
        batch = max(1, int(tokens_per_step) // int(s))
        result = search(with_overrides(model, seq_len=int(s)), cluster, batch, space=space, **kw)
        ranked = result.ranking
        cp = result.columns["cp"][ranked]
        for side, rows in (("without", ranked[cp == 1]), ("with", ranked[cp > 1])):
            i = int(rows[0]) if rows.size else -1
            for n in names:
                value = result.columns[n][i] if i >= 0 else np.nan
                sides[side][n].append(float(value))
            labels[side].append(result.label(i) if i >= 0 else "")
    cols = {side: {n: np.asarray(v, dtype=float) for n, v in d.items()} for side, d in sides.items()}
    for d in cols.values():
        d["fits_effective"] = np.nan_to_num(d["fits_effective"]).astype(bool)
    return ContextSweep(seq_len=np.asarray(seq_lens, dtype=np.int64), tokens_per_step=int(tokens_per_step),
                        without_cp=cols["without"], with_cp=cols["with"], labels_without=tuple(labels["without"]),
                        labels_with=tuple(labels["with"]))
