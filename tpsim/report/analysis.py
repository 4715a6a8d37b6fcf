"""The studies behind the charts: best plan per TP degree, per GPU count, and per (TP degree, inter-node
bandwidth). Each is a search (:func:`tpsim.search.search`) reduced to the best-ranked plan of each group, so
charts and tables show numbers the estimator produced for real plans. Where the estimator gives an error band
(``step_time_s_low``/``_high`` etc., docs/SCHEMAS.md section 6), the studies carry it along.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..model import ModelSpec
from ..errors import InputError
from ..limits import LIMITS
from ..search import SearchResult, SearchSpace
from ..search import search as _plain_search
from ..search.planner import BAND_FIELDS

SWEEP_COLUMNS = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "compute_s", "recompute_s", "bubble_s",
                 "optimizer_s", "exposed_comm_s", "overhead_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s",
                 "ep_comm_s", "fits_effective", "tp", "pp", "dp", "cp", "ep", "etp", "gpus", "cost_per_mtok")
TP_SWEEP_MAX = 64
"""largest TP degree of the TP sweep (issue 5: every valid tp up to 64)."""
BANDWIDTH_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
"""multiples of the cluster's inter-node link bandwidth in the heat map (0.5x HDR ~ EDR, 2x HDR = NDR)."""
SCALING_SPAN = 8
"""the scaling study searches from gpus / SCALING_SPAN to gpus x SCALING_SPAN (powers of two in between)."""
BEST_CELL_RTOL = 5e-4
"""heat map: cells this close to the fastest one (relative) are as good as it; the best cell is the first of
them reached with the least bandwidth. Below the chart's resolution (slowdowns printed to 0.01), so the boxed
cell always reads 1.00x and a 0.001% gain from doubling the links does not move the box."""


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

    searched: tuple[int, ...] = ()
    """values of the axis that were searched (those without a fitting plan are not in ``x``)."""
    reference: int | None = None
    """the value the user asked about (``--gpus`` for the scaling study), marked on the chart."""

    def __len__(self) -> int:
        return int(self.x.size)


def search(*args: Any, **kw: Any) -> SearchResult:
    """:func:`tpsim.search.search` with the residual band of ``tpsim estimate`` on every row
    (:meth:`SearchResult.with_residual_bands`: the report's charts and tables show that band and its basis)."""
    return _plain_search(*args, **kw).with_residual_bands()


def band_columns(columns: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The error-band columns present (both ends of each band), in :data:`BAND_FIELDS` order."""
    def pair(name: str) -> str:
        base = name.rsplit("_", 1)[0]
        return base + ("_high" if name.endswith("_low") else "_low")

    present = tuple(name for name in BAND_FIELDS if name in columns and pair(name) in columns)
    return present + (("band_basis",) if present and "band_basis" in columns else ())


def _sweep(result: SearchResult, axis: str, cluster: Any) -> Sweep:
    x, idx = best_per(result, axis)
    cols = {name: result.columns[name][idx] for name in SWEEP_COLUMNS + band_columns(result.columns)}
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


def scaling_counts(gpus: int, loader: Callable[[int], Any], span: int = SCALING_SPAN) -> list[Any]:
    """Clusters for the scaling study: ``gpus x 2**k`` from ``gpus / span`` to ``gpus x span`` (whole counts
    only), each kept where ``loader(count)`` builds it (a whole number of nodes that the topology can hold;
    a count it refuses is left out) and uses as many GPUs of each node as the asked count does (a study adds
    or removes whole nodes: 4 GPUs, part of a DGX node, are left out of a 32-GPU study)."""
    if span < 1:
        raise InputError(f"scaling span={span} must be at least 1")
    counts, k = [], 1
    while k <= span:
        if gpus % k == 0:
            counts.append(gpus // k)
        k *= 2
    counts = sorted(set(counts + [gpus * m for m in _powers_of_two(span) if gpus * m <= LIMITS["gpus"]]))
    loaded = {}
    for n in counts:
        try:
            loaded[n] = loader(n)
        except InputError:
            if n == gpus:
                raise
    per_node = getattr(loaded[gpus], "gpus_per_node", 0)
    return [c for n, c in loaded.items() if n == gpus or getattr(c, "gpus_per_node", per_node) >= per_node]


def _powers_of_two(span: int) -> list[int]:
    out, k = [], 2
    while k <= span:
        out.append(k)
        k *= 2
    return out


def scaling(model: ModelSpec, clusters: Sequence[Any], global_batch: int, space: SearchSpace | None = None,
            reference: int | None = None, **kw: Any) -> tuple[Sweep, SearchResult]:
    """Best fitting plan (by step time) per GPU count, and the search behind it; counts where nothing fits
    are left out of the sweep (``Sweep.searched`` lists every count). At one GPU count the fastest plan is
    also the cheapest (cost = GPUs x price / tokens per second), so the sweep's cost column is the cheapest
    cost of each count."""
    result = search(model, list(clusters), global_batch, space=space, objective="time", **kw)
    sweep = _sweep(result, "gpus", clusters[-1])
    sweep = dataclasses.replace(sweep, searched=tuple(int(c.num_gpus) for c in clusters), reference=reference)
    return sweep, result


@dataclass(frozen=True)
class BandwidthGrid:
    """The best plan per (tp, inter-node bandwidth): its step time, label, whether it fits, and its TP share."""

    tp: np.ndarray
    scales: np.ndarray
    """multiples of the cluster's inter-node bandwidth (columns)."""
    bandwidth_GBps: np.ndarray
    """inter-node bandwidth per GPU at each scale, GB/s per direction."""
    step_time_s: np.ndarray
    """[tp, scale] step time of the best plan; NaN where that tp has no plan."""
    labels: tuple[tuple[str, ...], ...]
    """[tp][scale] label of that plan ("" where none)."""
    fits: np.ndarray
    """[tp, scale] whether that best plan fits (else it is the best of the unfitting ones)."""
    tp_share: np.ndarray
    """[tp, scale] tp_comm_s / step_time_s of that plan (for the table)."""
    gpus_per_node: int
    bands: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """[tp, scale] error-band arrays (``step_time_s_low``/``_high``) where the estimator gives them."""

    @property
    def best_step_time_s(self) -> float:
        """The fastest fitting cell's step time (over every cell when none fits)."""
        pool = np.where(self.fits, self.step_time_s, np.nan) if self.fits.any() else self.step_time_s
        return float(np.nanmin(pool)) if np.isfinite(pool).any() else float("nan")

    @property
    def best_cell(self) -> tuple[int, int] | None:
        """(row, column) of the best cell: the fastest fitting one; of cells within :data:`BEST_CELL_RTOL` of
        it, the one with the least bandwidth (then the smallest tp), where that speed is first reached. None if
        nothing fits."""
        if not self.fits.any():
            return None
        near = self.fits & (self.step_time_s <= self.best_step_time_s * (1 + BEST_CELL_RTOL))
        rows, cols = np.nonzero(near)
        k = int(np.lexsort((rows, cols))[0])
        return int(rows[k]), int(cols[k])

    @property
    def slowdown(self) -> np.ndarray:
        """[tp, scale] step time / the fastest fitting cell's (1 = the best cell)."""
        return self.step_time_s / self.best_step_time_s


def bandwidth_grid(model: ModelSpec, cluster: Any, global_batch: int,
                   variant: Callable[[Any, float], Any], base_bandwidth_GBps: float,
                   space: SearchSpace | None = None, scales: Sequence[float] = BANDWIDTH_SCALES,
                   max_tp: int = TP_SWEEP_MAX, **kw: Any) -> BandwidthGrid:
    """Search the space once per bandwidth scale on ``variant(cluster, scale)`` (a cluster whose inter-node
    links are ``scale`` times faster) and keep the best plan per tp (fitting plans first)."""
    space = space or SearchSpace()
    space = dataclasses.replace(space, max_tp=min(max_tp, space.max_tp or max_tp))
    per_scale = []
    for s in scales:
        result = search(model, variant(cluster, float(s)), global_batch, space=space, include_unfit=True, **kw)
        per_scale.append(best_per(result, "tp") + (result,))
    tps = np.unique(np.concatenate([p[0] for p in per_scale]))
    shape = (tps.size, len(scales))
    share, step, fits = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=bool)
    labels = [[""] * len(scales) for _ in tps]
    bands = {name: np.full(shape, np.nan) for name in ("step_time_s_low", "step_time_s_high")
             if all(name in p[2].columns for p in per_scale)}
    for j, (values, idx, result) in enumerate(per_scale):
        rows = np.searchsorted(tps, values)
        c = result.columns
        step[rows, j] = c["step_time_s"][idx]
        share[rows, j] = c["tp_comm_s"][idx] / c["step_time_s"][idx]
        fits[rows, j] = c["fits_effective"][idx]
        for name, band in bands.items():
            band[rows, j] = c[name][idx]
        for r, i in zip(rows, idx):
            labels[r][j] = result.label(int(i))
    return BandwidthGrid(tp=tps, scales=np.asarray(scales, dtype=float),
                         bandwidth_GBps=np.asarray(scales, dtype=float) * base_bandwidth_GBps, step_time_s=step,
                         labels=tuple(tuple(row) for row in labels), fits=fits, tp_share=share,
                         gpus_per_node=int(cluster.gpus_per_node), bands=bands)



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
