"""Stage 4, schedule: the step time of the slowest pipeline rank and its parts (1F1B or interleaved 1F1B,
Narayanan et al. 2021, sections 2.2 and 3.3), with data-parallel overlap.

``step = m t_stage + (pp - 1) / vpp x t_stage + exposed PP + exposed DP + optimizer``: ``t_stage`` is one
micro-batch's forward + backward (+ recomputation + exposed collectives + host overhead) on the rank, m the
micro-batches per replica. Each position's stage time is computed at once over the (position, plan) axes and
the slowest existing position is taken. The breakdown ``compute + recompute + bubble + optimizer +
exposed_comm + overhead`` sums to the step time; the ``*_comm`` totals include hidden parts.

Communication hidden behind compute still slows it (NCCL kernels hold SMs and memory bandwidth): a fraction
``overlap_compute_penalty`` (tpsim/data/efficiency.yaml) of every hidden collective counts as exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .comm import Comm
from .context import EstimationContext
from .partition import Partition, on_positions
from .source import LayerCosts


@dataclass(frozen=True)
class Schedule:
    """Seconds per step of the slowest pipeline rank, arrays over plans."""

    compute: np.ndarray
    recompute: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    exposed_comm: np.ndarray
    overhead: np.ndarray
    """host (framework) time per step that the kernels do not hide (calibration ``compute`` section)."""
    comm_total: dict[str, np.ndarray]
    """axis -> collective time per step, hidden parts included."""
    step: np.ndarray
    slowest: np.ndarray
    """position (index into POSITIONS) of the slowest rank."""
    micro_batches: np.ndarray
    """m: micro-batches per replica and step."""


def _pick(position: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[position[i], i] for (3, n) values."""
    return values[position, np.arange(position.size)]


def schedule(ctx: EstimationContext, *, costs: LayerCosts, comm: Comm, part: Partition, pp: np.ndarray,
             vpp: np.ndarray, dp: np.ndarray, zero: np.ndarray, recompute: np.ndarray, micro_batch: np.ndarray,
             global_batch: np.ndarray, overlap: np.ndarray, cp: np.ndarray | None = None,
             edp: np.ndarray | None = None) -> Schedule:
    """Step time and breakdown (everything gathered to plans). The optimizer step runs over the rank's share
    of the parameters: ZeRO shards the dense ones over dp x cp, the routed experts' over edp."""
    penalty = ctx.roofline.eff.overlap_compute_penalty
    full = recompute == 2
    fwd_total = _sum(comm.layer_fwd.values(), pp.shape)
    bwd_total = _sum(comm.layer_bwd.values(), pp.shape)
    f_exp, b_exp = comm.layer_fwd_exposed, comm.layer_bwd_exposed
    # per layer and micro-batch: full recomputation runs the forward (and its collectives) again
    hidden = (fwd_total - f_exp) + (bwd_total - b_exp)
    x_layer = f_exp + b_exp + np.where(full, f_exp, 0.0) + penalty * hidden
    single = pp == 1
    edge_c = on_positions(costs.first.fwd + costs.first.bwd, costs.last.fwd + costs.last.bwd, single)
    edge_x = _sum(comm.edge.values(), (3, pp.size))
    L = part.layers
    rank_c = L * (costs.fwd + costs.bwd) + edge_c
    rank_r = L * costs.recompute
    rank_x = L * x_layer + edge_x
    rank_o = L * ctx.host_overhead_s
    totals = np.where(part.valid, rank_c + rank_r + rank_x + rank_o, -1.0)  # -1: no such rank
    slow = np.argmax(totals, axis=0)
    c_stage, r_stage, x_stage, o_stage = (_pick(slow, v) for v in (rank_c, rank_r, rank_x, rank_o))
    layers = _pick(slow, L)
    t_stage = c_stage + r_stage + x_stage + o_stage

    m = global_batch // (micro_batch * dp)
    bubble = (pp - 1) / vpp * t_stage
    # pipeline point-to-point: activations forward, gradients backward, per chunk and micro-batch, plus the
    # pipeline fill and drain (exposed)
    pp_total = 2.0 * (m * vpp + pp - 1) * comm.p2p
    dp_total, dp_exposed = _data_parallel(costs, comm, layers, m, zero, overlap, penalty)
    params = np.where(zero >= 1, _sharded(part, dp if cp is None else dp * cp, edp), part.largest)
    optimizer = ctx.roofline.optimizer_time(params)
    compute, recompute_s, overhead = m * c_stage, m * r_stage, m * o_stage
    exposed = m * x_stage + pp_total + dp_exposed
    step = compute + recompute_s + bubble + optimizer + exposed + overhead
    comm_total = {axis: m * (layers * (comm.layer_fwd.get(axis, 0.0) + comm.layer_bwd.get(axis, 0.0)
                                       + np.where(full, comm.layer_fwd.get(axis, 0.0), 0.0))
                             + _pick(slow, comm.edge.get(axis, np.zeros((3, pp.size)))))
                  for axis in sorted(set(comm.layer_fwd) | set(comm.layer_bwd) | set(comm.edge))}
    comm_total["pp"] = pp_total
    comm_total["dp"] = dp_total
    return Schedule(compute=compute, recompute=recompute_s, bubble=bubble, optimizer=optimizer,
                    exposed_comm=exposed, overhead=overhead, comm_total=comm_total, step=step, slowest=slow,
                    micro_batches=m)


def _sharded(part: Partition, group: np.ndarray, expert_group: np.ndarray | None) -> np.ndarray:
    """Parameters of the largest rank left to it by ZeRO: dense ones / group, routed experts' / expert group."""
    if part.expert is None or expert_group is None:
        return part.largest / group
    return (part.largest - part.largest_expert) / group + part.largest_expert / expert_group


def _sum(arrays, shape: tuple[int, ...]) -> np.ndarray:
    """Sum of per-axis arrays (zeros when there are none)."""
    arrays = list(arrays)
    if not arrays:
        return np.zeros(shape)
    total = arrays[0]
    for a in arrays[1:]:
        total = total + a
    return total


def _data_parallel(costs: LayerCosts, comm: Comm, layers: np.ndarray, m: np.ndarray, zero: np.ndarray,
                   overlap: np.ndarray, penalty: float) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) data-parallel time per step. Gradients hide behind the backward of the last
    micro-batch (bucketed), the ZeRO parameter all-gather behind the forward of the first micro-batch of the
    next step. ZeRO-2 keeps only a gradient shard, so it reduce-scatters after every micro-batch's backward;
    ZeRO-0/1 reduce once. ZeRO-3 gathers every layer's weights in forward and backward and reduce-scatters
    its gradients each micro-batch, each hidden behind that layer's compute; its edge shards are gathered in
    forward and backward and reduced every micro-batch."""
    f_layer = costs.fwd + comm.layer_fwd_exposed
    b_layer = costs.bwd + costs.recompute + comm.layer_bwd_exposed
    z3_ag, z3_rs = comm.z3_all_gather, comm.z3_reduce_scatter
    z3_total = m * layers * (2 * z3_ag + z3_rs)
    z3_exposed = m * layers * (np.maximum(z3_ag - f_layer, 0.0) + np.maximum(z3_ag + z3_rs - b_layer, 0.0))
    bwd_window = layers * b_layer
    fwd_window = layers * f_layer
    reductions = np.where(zero >= 2, m, 1)
    gathers = np.where(zero == 3, 2 * m, 1)
    grad_t = comm.dp_all_reduce + comm.dp_reduce_scatter
    t_ag = comm.dp_all_gather
    exposed = np.where(overlap, reductions * np.maximum(grad_t - bwd_window, 0.0)
                       + gathers * np.maximum(t_ag - fwd_window, 0.0),
                       reductions * grad_t + gathers * t_ag) + z3_exposed
    total = reductions * grad_t + gathers * t_ag + z3_total
    return total, exposed + penalty * (total - exposed)
