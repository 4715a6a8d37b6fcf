"""Formulas of the candidate algorithms: each turns bandwidths measured on the graph into cost lines.

Units: seconds, bytes, bytes/s. ``S`` is the buffer size of the nccl-tests byte convention (see ``curve.py``).
Every NCCL candidate follows NCCL's own model (src/graph/tuning.cc)::

    time = latency + S * factor / busBw_protocol + 2 sqrt(S * factor / busBw_protocol * steps * o)

``latency = baseLat[algo][proto] + steps * hwLat[hw][algo][proto]``; ``busBw`` comes from the link loads of
the graph (:mod:`tpsim.collectives.fabric`), then NCCL's protocol factors and per-channel caps apply. The last
term is the pipelining cost of moving the data in chunks through ``steps`` sequential steps with a per-chunk
overhead ``o`` (``pipeline_chunk_overhead_us`` in ``nccl_model.yaml``; Thakur, Rabenseifner & Gropp 2005).
Gloo (CPU, loopback) has its own set: ring and recursive halving-doubling with ``alpha``/``beta`` terms only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .constants import ArchCaps, NcclConstants, nodes_index
from ..units import GB, US

RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
              "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n}
"""NCCL's ``nsteps`` per collective (tuning.cc)."""


@dataclass(frozen=True)
class Line:
    """One candidate: ``latency_s + S * sec_per_byte + sqrt_coef * sqrt(S)``."""

    name: str
    latency_s: float
    sec_per_byte: float
    sqrt_coef: float = 0.0

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes * self.sec_per_byte + self.sqrt_coef * math.sqrt(max(nbytes, 0.0))


@dataclass(frozen=True, kw_only=True)
class GroupShape:
    """What NCCL's tuner knows about a communicator."""

    n: int
    """ranks per group."""
    nodes: int
    """nodes a group spans (the most of any group)."""
    hw: str
    """hardware class inside a node: NVLINK or PCI."""
    channels: int
    caps: ArchCaps

    @property
    def ppn(self) -> float:
        return self.n / self.nodes


def pipelined(name: str, latency_s: float, sec_per_byte: float, steps: float, overhead_s: float) -> Line:
    """A chunked transfer through ``steps`` sequential steps (overhead ``overhead_s`` per chunk) with the chunk
    size that minimises time: ``T = L + S b + 2 sqrt(S b steps o)`` (optimal pipelining, Thakur et al. 2005)."""
    return Line(name, latency_s, sec_per_byte, 2.0 * math.sqrt(max(sec_per_byte * steps * overhead_s, 0.0)))


def ring_latency_us(op: str, g: GroupShape, proto: str, k: NcclConstants) -> float:
    """baseLat + intra steps x hwLat[intra] + inter-node steps x hwLat[NET] (tuning.cc, ring)."""
    steps = RING_STEPS[op](g.n)
    inter = {"all_reduce": 2 * (g.nodes - 1), "broadcast": g.nodes}.get(op, g.nodes - 1) if g.nodes > 1 else 0
    intra_lat = k.hw(g.hw, "Ring", proto) * (k.factors.ll_intra_multinode if g.nodes > 1 and proto == "LL"
                                              else 1.0)
    if op == "broadcast":
        per = k.hw("NET" if g.nodes > 1 else g.hw, "Tree" if proto == "Simple" else "Ring", proto)
        return k.base("Ring", proto) + steps * per
    return k.base("Ring", proto) + (steps - inter) * intra_lat + inter * k.hw("NET", "Ring", proto)


def ring_protocol_bw(op: str, g: GroupShape, proto: str, bus_bw: float, k: NcclConstants) -> float:
    """NCCL's protocol refinement of a ring's bus bandwidth (bytes/s; tuning.cc ncclTopoTuneModel, factors
    from nccl_model.yaml)."""
    col = nodes_index(g.nodes)
    f = k.factors
    if proto == "LL":
        factor = (f.ring_ll_multinode if g.nodes > 1 else f.ring_ll_allreduce if op == "all_reduce"
                  else f.ring_ll_other)
        return min(g.caps.ll_max_bw[col] * GB, bus_bw * factor)
    if proto == "LL128":
        factor = f.ring_ll128_ppn_lt_2 if g.ppn < 2 else f.ring_ll128_ppn_ge_2
        return min(bus_bw * factor, g.channels * g.caps.ring_ll128_per_channel[col] * GB)
    return bus_bw


def protocols(g: GroupShape) -> tuple[str, ...]:
    """NCCL enables LL128 only when GPUs talk over NVLink (tuning.cc: ``typeIntra <= PATH_NVB``)."""
    return ("LL", "Simple") if g.hw == "PCI" else ("LL", "LL128", "Simple")


def ring_lines(op: str, g: GroupShape, hop_bw: float, k: NcclConstants, label: str = "ring") -> list[Line]:
    """Ring with ``g.channels`` channels; ``hop_bw`` = bytes/s each hop gets with all groups loading the links."""
    lines = []
    overhead = k.pipeline_overhead_us * US
    for proto in protocols(g):
        bw = ring_protocol_bw(op, g, proto, hop_bw, k)
        lat = ring_latency_us(op, g, proto, k)
        if op == "all_reduce" and proto == "Simple" and g.nodes > 1:
            lat *= k.factors.ring_allreduce_plateau  # "plateau effect of ring" (compCap >= 80)
        spb = k.bus(op, g.n) / bw
        lines.append(pipelined(f"{label}/{proto} x{g.channels}ch", lat * US, spb, RING_STEPS[op](g.n), overhead))
    return lines


def tree_lines(g: GroupShape, tree_sec_per_byte: float, k: NcclConstants) -> list[Line]:
    """Double binary tree all-reduce (chain inside a node). ``tree_sec_per_byte``: link-load time of both trees
    (each carries half the buffer up and down); NCCL's busBw = 2 / that, algBw = busBw / 2."""
    col = nodes_index(g.nodes)
    bus = 2.0 / tree_sec_per_byte
    f = k.factors
    bus = min(bus * f.tree, g.channels * g.caps.tree_per_channel[col] * GB)
    intra_steps = g.ppn - 1
    inter_steps = math.ceil(math.log2(g.nodes)) if g.nodes > 1 else 0
    lines = []
    overhead = k.pipeline_overhead_us * US
    for proto in protocols(g):
        if proto == "LL":
            bw = min(bus * f.tree_ll, g.caps.ll_max_bw[col] * GB)
        elif proto == "LL128":
            bw = min(bus * (f.tree_ll128_single_node if g.nodes == 1 else f.tree_ll128_multinode),
                     g.channels * g.caps.tree_ll128_per_channel[col] * GB)
        else:
            bw = bus
        lat = k.base("Tree", proto) + 2 * (intra_steps * k.hw(g.hw, "Tree", proto)
                                           + inter_steps * k.hw("NET", "Tree", proto))
        steps = 2 * (intra_steps + inter_steps)
        lines.append(pipelined(f"tree/{proto} x{g.channels}ch", lat * US, 2.0 / bw, steps, overhead))
    return lines


NVLS_TRAFFIC = {"all_reduce": lambda n: ((n + 1) / n, (n + 1) / n), "all_gather": lambda n: (1 / n, 1.0),
                "reduce_scatter": lambda n: (1.0, 1 / n)}
"""(bytes into the switch, bytes out of it) per GPU per byte of buffer with in-switch reduction/multicast:
all-reduce = multimem.ld_reduce of every slice (S in) + multicast store of the own slice (S/n in), and the
mirror image out of the switch."""


def nvls_line(op: str, g: GroupShape, switch_sec_per_byte: float, k: NcclConstants) -> Line:
    """NVLink SHARP: ``switch_sec_per_byte`` is the load time of the GPU<->NVSwitch links (already scaled by
    the architecture's NVLS efficiency). Latency: baseLat + hwLat of NVLS (Simple only)."""
    lat = k.base("NVLS", "Simple") + k.hw("NVLINK", "NVLS", "Simple")
    return pipelined("nvls/Simple", lat * US, switch_sec_per_byte, RING_STEPS[op](g.n),
                     k.pipeline_overhead_us * US)


def direct_lines(g: GroupShape, sec_per_byte: float, k: NcclConstants, hw: str, label: str = "direct") -> list[Line]:
    """All-to-all as concurrent sends to every peer (NCCL p2p, n-1 rounds): Simple, and LL for small sizes
    (half the bandwidth: LL sends 8-byte flag+data lines)."""
    steps = g.n - 1
    overhead = k.pipeline_overhead_us * US
    lines = []
    for proto, factor in (("LL", k.factors.p2p_ll), ("Simple", k.factors.p2p_simple)):
        lat = k.base("Ring", proto) + steps * k.hw(hw, "Ring", proto)
        lines.append(pipelined(f"{label}/{proto}", lat * US, sec_per_byte / factor, 1, overhead))
    return lines


def p2p_lines(sec_per_byte: float, k: NcclConstants, hw: str) -> list[Line]:
    """One send/receive per pair (every pair of the axis at once): base + one step of latency."""
    overhead = k.pipeline_overhead_us * US
    return [pipelined(f"p2p/{proto}", (k.base("Ring", proto) + k.hw(hw, "Ring", proto)) * US,
                      sec_per_byte / factor, 1, overhead)
            for proto, factor in (("LL", k.factors.p2p_ll), ("Simple", k.factors.p2p_simple))]


def combine(name: str, parts: list[tuple[Line, float]]) -> Line:
    """Sequential phases; phase i moves ``scale_i`` bytes per byte of buffer."""
    return Line(name, sum(p.latency_s for p, _ in parts), sum(p.sec_per_byte * s for p, s in parts),
                sum(p.sqrt_coef * math.sqrt(s) for p, s in parts))


# ----------------------------------------------------------------------------------------------- gloo
GLOO_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
              "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1,
              "broadcast": lambda n: math.ceil(math.log2(n)), "send_recv": lambda n: 1}  # noqa: ARG005 (a fixed signature)
GLOO_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: math.ceil(math.log2(n)), "send_recv": lambda n: 1.0}  # noqa: ARG005 (a fixed signature)


def gloo_lines(op: str, n: int, alpha_s: float, hop_sec_per_byte: float) -> list[Line]:
    """Gloo on CPU ranks (Thakur et al. 2005 alpha-beta forms): ring (2(n-1) or n-1 steps), recursive
    halving-doubling all-reduce for a power-of-two n (2 log2 n steps, same bytes), binomial broadcast.
    ``alpha_s``: latency of one message; ``hop_sec_per_byte``: 1 / bandwidth of one hop under load."""
    lines = [Line(f"gloo-ring/{op}", GLOO_STEPS[op](n) * alpha_s, GLOO_FACTOR[op](n) * hop_sec_per_byte)]
    if op == "all_reduce" and n > 2 and n & (n - 1) == 0:
        lines.append(Line("gloo-halving-doubling", 2 * math.log2(n) * alpha_s,
                          GLOO_FACTOR[op](n) * hop_sec_per_byte))
    return lines
