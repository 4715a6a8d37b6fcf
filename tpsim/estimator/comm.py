"""Stage 3, communication: every collective a plan runs, timed on the topology.

Collectives name their plan axes (``("tp",)``, ``("dp",)``, ``("pp",)``; later ``("cp",)``, ``("ep",)``) and
are timed with the context's envelope of ``CollectiveModel.axis_curve(op, layout, axes)`` for the plan's
:class:`~tpsim.topology.placement.RankLayout`. Rows are distinct communication patterns (the estimator
gathers the results back to the plans).

* per layer and micro-batch: the source's collectives (TP), totals per axis and the exposed part (what the
  compute each one overlaps with, ``hide``, does not cover), forward and backward;
* per micro-batch on the first / last pipeline rank: the edges' collectives (exposed);
* per micro-batch and model chunk: the pipeline send/receive of the boundary activation;
* per step: the data-parallel gradient reduction and, with ZeRO, the parameter all-gather (Megatron-Core
  distributed optimizer: reduce-scatter + all-gather); ZeRO-3 gathers each layer's weights in forward and
  backward and reduce-scatters its gradients, and treats the edge parameters as one more layer.

The algorithm NCCL would pick for each axis (at the axis's main message size) is always named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import ORDERS
from ..topology.placement import RankLayout
from .context import EstimationContext
from .partition import Partition
from .source import Collective, LayerCosts

GRAD_BYTES = 4.0
"""fp32 gradient accumulation and reduction (Megatron-Core ``main_grad``), bytes per parameter."""
NAMED_AXES = ("tp", "dp", "pp")
"""axes whose chosen algorithm every estimate names (docs/SCHEMAS.md, section 6)."""


@dataclass(frozen=True)
class Comm:
    """Seconds, arrays over rows (communication patterns) unless noted."""

    layer_fwd: dict[str, np.ndarray]
    """axis -> collective time of one layer's forward per micro-batch."""
    layer_bwd: dict[str, np.ndarray]
    """axis -> the same in backward."""
    layer_fwd_exposed: np.ndarray
    """part of one layer's forward collectives (all axes) not hidden by compute."""
    layer_bwd_exposed: np.ndarray
    edge: dict[str, np.ndarray]
    """axis -> (3, n) edge collective time per micro-batch on the first / last / middle rank (exposed)."""
    p2p: np.ndarray
    """one pipeline send/receive of the boundary activation."""
    dp_all_reduce: np.ndarray
    """gradient all-reduce of the largest rank (ZeRO 0)."""
    dp_reduce_scatter: np.ndarray
    """gradient reduce-scatter (ZeRO 1-2: the largest rank's; ZeRO 3: its edge parameters')."""
    dp_all_gather: np.ndarray
    """parameter all-gather after the optimizer step (ZeRO 1-2), or of the edge parameters (ZeRO 3)."""
    z3_all_gather: np.ndarray
    """ZeRO-3: one layer's parameter all-gather."""
    z3_reduce_scatter: np.ndarray
    """ZeRO-3: one layer's gradient reduce-scatter."""
    names: dict[str, np.ndarray]
    """axis -> code into ``name_table`` of the algorithm picked for the axis (-1: axis of size 1)."""
    name_table: tuple[str, ...]

    def take(self, index: np.ndarray) -> "Comm":
        """Rows ``index`` (gather to plans)."""
        pick = lambda a: a[..., index]  # noqa: E731 - (3, n) and (n,) arrays alike
        return Comm(layer_fwd={k: pick(v) for k, v in self.layer_fwd.items()},
                    layer_bwd={k: pick(v) for k, v in self.layer_bwd.items()},
                    layer_fwd_exposed=pick(self.layer_fwd_exposed), layer_bwd_exposed=pick(self.layer_bwd_exposed),
                    edge={k: pick(v) for k, v in self.edge.items()}, p2p=pick(self.p2p),
                    dp_all_reduce=pick(self.dp_all_reduce), dp_reduce_scatter=pick(self.dp_reduce_scatter),
                    dp_all_gather=pick(self.dp_all_gather), z3_all_gather=pick(self.z3_all_gather),
                    z3_reduce_scatter=pick(self.z3_reduce_scatter),
                    names={k: pick(v) for k, v in self.names.items()}, name_table=self.name_table)


class AxisCurves:
    """Collective times of rows that sit on a few distinct rank layouts: per (axes, op) the layouts'
    envelopes are stacked once, padded to one width (repeating the last line keeps the minimum)."""

    def __init__(self, ctx: EstimationContext, layouts: list[RankLayout], inverse: np.ndarray):
        self.ctx = ctx
        self.layouts = layouts
        self.inverse = inverse
        self._stacked: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def _rows(self, axes: tuple[str, ...], op: str) -> tuple[np.ndarray, np.ndarray]:
        key = (axes, op)
        hit = self._stacked.get(key)
        if hit is None:
            envs = [self.ctx.curve(op, layout, axes) for layout in self.layouts]
            k = max(e.latency_s.size for e in envs)
            lat = np.empty((len(envs), k))
            spb = np.empty((len(envs), k))
            for i, e in enumerate(envs):
                n = e.latency_s.size
                lat[i, :n], lat[i, n:] = e.latency_s, e.latency_s[-1]
                spb[i, :n], spb[i, n:] = e.sec_per_byte, e.sec_per_byte[-1]
            hit = self._stacked[key] = (lat[self.inverse], spb[self.inverse])
        return hit

    def time(self, axes: tuple[str, ...], op: str, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of ``op`` on ``nbytes`` per row (0 where nbytes <= 0)."""
        lat, spb = self._rows(axes, op)
        b = np.asarray(nbytes, dtype=float)
        t = (lat + b[:, None] * spb).min(axis=1)
        return np.where(b > 0, t, 0.0)

    def names(self, axes: tuple[str, ...], ops: np.ndarray, nbytes: np.ndarray, table: dict[str, int],
              op_names: tuple[str, ...]) -> np.ndarray:
        """Code (into ``table``, extended) of ``"op: algorithm"`` per row, the algorithm as
        ``CostCurve.best`` picks it at ``nbytes``; -1 where the axis has size 1 or ``ops`` is -1."""
        codes = np.full(ops.shape, -1, dtype=np.int32)
        group = self.inverse * (len(op_names) + 1) + (ops + 1)
        for g in (np.unique(group) if group.size > 1 else group):
            layout_i, op_i = divmod(int(g), len(op_names) + 1)
            op_i -= 1
            layout = self.layouts[layout_i]
            if op_i < 0 or layout.size(*axes) == 1:
                continue
            rows = np.flatnonzero(group == g)
            env = self.ctx.curve(op_names[op_i], layout, axes)
            lines = env.all_latency_s[None, :] + np.asarray(nbytes, dtype=float)[rows, None] * env.all_sec_per_byte
            best, which = np.unique(np.argmin(lines, axis=1), return_inverse=True)
            texts = [f"{op_names[op_i]}: {env.curve.algorithms[j]}" for j in best]
            codes[rows] = np.array([table.setdefault(t, len(table)) for t in texts])[which.reshape(-1)]
        return codes


def layouts_of(tp: np.ndarray, pp: np.ndarray, dp: np.ndarray, order: np.ndarray) -> tuple[list[RankLayout], np.ndarray]:
    """The distinct rank layouts of the rows and each row's index into them."""
    from .keys import distinct

    keys = distinct(tp, pp, dp, order)
    layouts = [RankLayout.from_order(ORDERS[int(o)], tp=int(t), dp=int(d), pp=int(p))
               for t, p, d, o in keys.rows]
    return layouts, keys.inverse


def communication(ctx: EstimationContext, curves: AxisCurves, *, costs: LayerCosts, part: Partition,
                  pp: np.ndarray, sp: np.ndarray, zero: np.ndarray, dp: np.ndarray, w_bytes: float) -> Comm:
    """Every collective time of the rows (see the module docstring); ``costs`` and ``part`` are gathered to
    the same rows."""
    fwd: dict[str, np.ndarray] = {}
    bwd: dict[str, np.ndarray] = {}
    n = pp.size
    exposed = {"fwd": np.zeros(n), "bwd": np.zeros(n)}
    for c in costs.comm:
        t = _timed(curves, c)
        axis = "-".join(c.axes)
        totals = fwd if c.phase == "fwd" else bwd
        totals[axis] = totals.get(axis, 0.0) + t
        exposed[c.phase] = exposed[c.phase] + np.maximum(t - c.hide, 0.0)
    edge = _edges(curves, costs, pp == 1)
    boundary = np.where(pp > 1, costs.boundary_bytes, 0.0)
    p2p = curves.time(("pp",), "send_recv", boundary)
    dp_times, grad_bytes = _data_parallel(curves, part, zero, dp, costs.params, w_bytes)
    table: dict[str, int] = {}
    names = {"tp": _tp_names(curves, costs, table), "dp": _dp_names(curves, zero, grad_bytes, table),
             "pp": curves.names(("pp",), np.zeros(n, dtype=np.int64), boundary, table, ("send_recv",))}
    return Comm(layer_fwd=fwd, layer_bwd=bwd, layer_fwd_exposed=exposed["fwd"], layer_bwd_exposed=exposed["bwd"],
                edge=edge, p2p=p2p, names=names, name_table=tuple(table), **dp_times)


def _timed(curves: AxisCurves, c: Collective) -> np.ndarray:
    t = curves.time(c.axes, c.op, c.nbytes)
    return t * c.count if c.count != 1.0 else t


def _edges(curves: AxisCurves, costs: LayerCosts, single: np.ndarray) -> dict[str, np.ndarray]:
    """axis -> (3, n) exposed edge collective time per micro-batch, by pipeline position."""
    from .partition import on_positions

    per_axis: dict[str, list[np.ndarray]] = {}
    for which, edge in ((0, costs.first), (1, costs.last)):
        for c in edge.comm:
            sums = per_axis.setdefault("-".join(c.axes), [0.0, 0.0])
            sums[which] = sums[which] + _timed(curves, c)
    n = single.size
    return {axis: on_positions(np.broadcast_to(f, (n,)), np.broadcast_to(la, (n,)), single)
            for axis, (f, la) in per_axis.items()}


def _data_parallel(curves: AxisCurves, part: Partition, zero: np.ndarray, dp: np.ndarray,
                   layer_params: np.ndarray, w_bytes: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    has_dp = dp > 1
    grad_b, weight_b = part.largest * GRAD_BYTES, part.largest * w_bytes
    z12 = has_dp & (zero >= 1) & (zero <= 2)
    z3 = has_dp & (zero == 3)
    axes = ("dp",)
    times = {
        "dp_all_reduce": curves.time(axes, "all_reduce", np.where(has_dp & (zero == 0), grad_b, 0.0)),
        "dp_reduce_scatter": curves.time(axes, "reduce_scatter", np.where(
            z12, grad_b, np.where(z3, part.largest_edge * GRAD_BYTES, 0.0))),
        "dp_all_gather": curves.time(axes, "all_gather", np.where(
            z12, weight_b, np.where(z3, part.largest_edge * w_bytes, 0.0))),
        "z3_all_gather": curves.time(axes, "all_gather", np.where(z3, layer_params * w_bytes, 0.0)),
        "z3_reduce_scatter": curves.time(axes, "reduce_scatter", np.where(z3, layer_params * GRAD_BYTES, 0.0)),
    }
    return times, grad_b


_REDUCTIONS = ("reduce_scatter", "all_reduce")


def _tp_names(curves: AxisCurves, costs: LayerCosts, table: dict[str, int]) -> np.ndarray:
    """The TP axis is named by the first forward reduction of a layer (reduce-scatter with sequence
    parallelism, else all-reduce) at its message size."""
    n = costs.fwd.size
    ops = np.full(n, -1, dtype=np.int64)
    nbytes = np.zeros(n)
    for c in reversed([c for c in costs.comm if c.axes == ("tp",) and c.phase == "fwd" and c.op in _REDUCTIONS]):
        runs = c.nbytes > 0
        ops = np.where(runs, _REDUCTIONS.index(c.op), ops)
        nbytes = np.where(runs, c.nbytes, nbytes)
    # a layer without TP traffic (tp = 1) runs none: the curve of a one-rank group says "none"
    ops = np.where(ops < 0, 1, ops)
    return curves.names(("tp",), ops, nbytes, table, _REDUCTIONS)


def _dp_names(curves: AxisCurves, zero: np.ndarray, grad_bytes: np.ndarray, table: dict[str, int]) -> np.ndarray:
    """The DP axis is named by the gradient reduction (reduce-scatter with ZeRO, else all-reduce)."""
    ops = np.where(zero > 0, 0, 1)
    return curves.names(("dp",), ops, grad_bytes, table, _REDUCTIONS)
