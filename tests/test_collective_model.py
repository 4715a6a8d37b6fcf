"""Collective cost model: each algorithm's formula against hand-computed cases on hand-built graphs,
contention, protocol choice, caching, bad input, and every shipped topology costed."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tpsim.collectives.constants import nccl_constants
from tpsim.collectives.curve import CostCurve
from tpsim.collectives.model import CollectiveModel, get_collective_model
from tpsim.errors import InputError
from test_collective_graphs import loopback, switch_node

K = nccl_constants()
O = K.pipeline_overhead_us * 1e-6
GB = 1e9


def line(model, op, groups, prefix):
    return next(ln for ln in model.candidates(op, groups) if ln.name.startswith(prefix))


def sqrt_term(spb, steps):
    return 2 * math.sqrt(spb * steps * O)


# ------------------------------------------------------------------------------------------- formulas
def test_ring_allreduce_formula_single_switch():
    # 4 GPUs, 5 NVLink lanes of 20 GB/s each to one switch: every ring hop gets 100 GB/s
    m = CollectiveModel(switch_node(4))
    ln = line(m, "all_reduce", ((0, 1, 2, 3),), "ring/Simple")
    spb = 2 * 3 / 4 / (100 * GB)
    assert ln.sec_per_byte == pytest.approx(spb)
    assert ln.latency_s == pytest.approx((8.4 + 6 * 3.4) * 1e-6)  # baseLat + 2(n-1) x hwLat NVLink Simple
    assert ln.sqrt_coef == pytest.approx(sqrt_term(spb, 6))
    ll = line(m, "all_reduce", ((0, 1, 2, 3),), "ring/LL ")
    assert ll.sec_per_byte == pytest.approx(2 * 3 / 4 / (25 * GB))  # LL = busBw / 4 (< llMaxBw 87.7)
    ll128 = line(m, "all_reduce", ((0, 1, 2, 3),), "ring/LL128")
    assert ll128.sec_per_byte == pytest.approx(2 * 3 / 4 / (92 * GB))  # 0.92 x busBw, 5 ch x 20 not binding
    assert ll128.latency_s == pytest.approx((14.0 + 6 * 1.9) * 1e-6)


def test_nccl_link_assumption_caps_line_rate():
    # 25 GB/s lanes in the file, NCCL reaches 20 per lane on Ampere (topo.h SM80_NVLINK_BW)
    m = CollectiveModel(switch_node(4, lane_GBps=25.0))
    ln = line(m, "all_gather", ((0, 1, 2, 3),), "ring/Simple")
    assert ln.sec_per_byte == pytest.approx(3 / 4 / (100 * GB))
    assert ln.latency_s == pytest.approx((8.4 + 3 * 3.4) * 1e-6)


def test_tree_formula_single_node_chain():
    # chains 0-1-2-3 and 0-3-2-1: GPU 2 sends on 4 chain edges x 1/2 buffer = 2 bytes per byte
    m = CollectiveModel(switch_node(4))
    ln = line(m, "all_reduce", ((0, 1, 2, 3),), "tree/Simple")
    bus = min(2 / (2.0 / (100 * GB)) * 0.92, 5 * 24.0 * GB)  # busBw x 0.92, capped by 5 ch x perChMaxTreeBw
    assert ln.sec_per_byte == pytest.approx(2 / bus)
    assert ln.latency_s == pytest.approx((0.0 + 2 * 3 * 4.0) * 1e-6)  # base + 2 (ppn-1) hwLat Tree Simple


def test_nvls_formula():
    m = CollectiveModel(switch_node(8, device="H100-SXM", lanes=18, lane_GBps=20.6, sharp=True))
    ln = line(m, "all_reduce", (tuple(range(8)),), "nvls")
    cap = 18 * 20.6 * GB  # one switch, 18 lanes at NCCL's 20.6 GB/s (SM90_NVLINK_BW)
    spb = (9 / 8) / (cap * 0.85)
    assert ln.sec_per_byte == pytest.approx(spb)
    assert ln.latency_s == pytest.approx((K.base("NVLS", "Simple") + K.hw("NVLINK", "NVLS", "Simple")) * 1e-6)
    # no NVLS without in-switch reduction, nor on Ampere
    plain = CollectiveModel(switch_node(8, device="H100-SXM", lanes=18, lane_GBps=20.6, sharp=False))
    assert not any(x.name.startswith("nvls") for x in plain.candidates("all_reduce", (tuple(range(8)),)))
    ampere = CollectiveModel(switch_node(8, sharp=True))
    assert not any(x.name.startswith("nvls") for x in ampere.candidates("all_reduce", (tuple(range(8)),)))


def test_all_to_all_and_send_recv_formulas():
    m = CollectiveModel(switch_node(4))
    a2a = line(m, "all_to_all", ((0, 1, 2, 3),), "direct/Simple")
    assert a2a.sec_per_byte == pytest.approx(0.75 / (100 * GB))  # each GPU sends 3/4 of its buffer
    assert a2a.latency_s == pytest.approx((8.4 + 3 * 3.4) * 1e-6)
    p2p = line(m, "send_recv", ((0, 1),), "p2p/Simple")
    assert p2p.sec_per_byte == pytest.approx(1 / (100 * GB))
    assert p2p.latency_s == pytest.approx((8.4 + 3.4) * 1e-6)


def test_hierarchical_is_the_sum_of_its_phases():
    c = switch_node(4, nodes=2, nics_per_node=4, nic_GBps=25.0)
    m = CollectiveModel(c)
    h = line(m, "all_reduce", (tuple(range(8)),), "hierarchical/Simple")
    rs = line(m, "reduce_scatter", ((0, 1, 2, 3), (4, 5, 6, 7)), "ring/Simple")
    ag = line(m, "all_gather", ((0, 1, 2, 3), (4, 5, 6, 7)), "ring/Simple")
    inter = line(m, "all_reduce", ((0, 4), (1, 5), (2, 6), (3, 7)), "ring/Simple")
    assert h.latency_s == pytest.approx(rs.latency_s + inter.latency_s + ag.latency_s)
    assert h.sec_per_byte == pytest.approx(rs.sec_per_byte + inter.sec_per_byte / 4 + ag.sec_per_byte)
    assert h.sqrt_coef == pytest.approx(rs.sqrt_coef + inter.sqrt_coef / 2 + ag.sqrt_coef)
    # the inter-node ring of one rail: 2 hops over a 25 GB/s NIC (x 0.96 what NCCL reaches on IB)
    assert inter.sec_per_byte == pytest.approx(1.0 / (25 * 0.96 * GB))


def test_gloo_alpha_beta_on_loopback():
    m = CollectiveModel(loopback(2, bw_GBps=2.0, latency_us=30.0))
    names = [x.name for x in m.candidates("all_reduce", ((0, 1),))]
    assert names == ["gloo-ring/all_reduce"]  # no NCCL protocols on CPU ranks
    ar = m.candidates("all_reduce", ((0, 1),))[0]
    alpha = 60e-6  # rank -> host -> rank: two loopback traversals
    assert ar.latency_s == pytest.approx(2 * alpha)
    assert ar.sec_per_byte == pytest.approx(1 / (2 * GB))  # 2(n-1)/n = 1 byte per byte
    ag = m.candidates("all_gather", ((0, 1),))[0]
    assert ag.latency_s == pytest.approx(alpha) and ag.sec_per_byte == pytest.approx(0.5 / (2 * GB))
    four = CollectiveModel(loopback(4)).candidates("all_reduce", ((0, 1, 2, 3),))
    assert {x.name for x in four} == {"gloo-ring/all_reduce", "gloo-halving-doubling"}


def test_calibration_overrides_link_type():
    m = CollectiveModel(loopback(2), calibration={"loopback": {"efficiency": 0.5, "latency_us": 10.0}})
    ar = m.candidates("all_reduce", ((0, 1),))[0]
    assert ar.latency_s == pytest.approx(2 * 20e-6)
    assert ar.sec_per_byte == pytest.approx(1 / (1 * GB))


# ----------------------------------------------------------------------------------------- contention
def test_two_groups_sharing_a_nic_get_half_its_bandwidth():
    # 2 nodes x 2 GPUs, one NIC per node shared by both GPUs
    c = switch_node(2, nodes=2, nics_per_node=1, nic_GBps=25.0)
    m = CollectiveModel(c)
    alone = line(m, "all_reduce", ((0, 2),), "ring/Simple").sec_per_byte
    shared = line(m, "all_reduce", ((0, 2), (1, 3)), "ring/Simple").sec_per_byte
    assert shared == pytest.approx(2 * alone)
    assert 1 / alone == pytest.approx(25 * 0.96 * GB)  # one hop each way through the NIC
    # with a NIC per GPU the groups do not interfere
    c2 = switch_node(2, nodes=2, nics_per_node=2, nic_GBps=25.0)
    m2 = CollectiveModel(c2)
    assert line(m2, "all_reduce", ((0, 2), (1, 3)), "ring/Simple").sec_per_byte == pytest.approx(alone)


def test_curve_is_slowest_group():
    c = switch_node(2, nodes=2, nics_per_node=1)
    m = CollectiveModel(c)
    # one group inside node 0 (NVLink), one across nodes (NIC): the curve is the cross-node one
    both = m.curve("all_reduce", ((0, 1), (2, 3)))
    cross = m.curve("all_reduce", ((0, 2),))
    intra = m.curve("all_reduce", ((0, 1),))
    assert both.time(1 << 30) == pytest.approx(intra.time(1 << 30))
    assert cross.time(1 << 30) > intra.time(1 << 30)


# ------------------------------------------------------------------------------------- protocol choice
def test_protocol_choice_across_sizes():
    m = CollectiveModel(switch_node(8, lanes=2, switches=6))  # DGX A100-like: 12 lanes per GPU
    g = (tuple(range(8)),)
    assert m.run("all_reduce", 1024, g).algorithm.startswith(("ring/LL ", "tree/LL "))
    assert "LL128" in m.run("all_reduce", 4 << 20, g).algorithm
    assert m.run("all_reduce", 1 << 30, g).algorithm.startswith("ring/Simple")
    small, big = m.run("all_reduce", 1024, g), m.run("all_reduce", 8 << 30, g)
    assert small.busbw_GBps < 1 < 200 < big.busbw_GBps <= 240  # 12 lanes x 20 GB/s (NCCL) bound


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=1 << 34))
def test_curve_time_is_min_of_candidates_and_monotone(nbytes):
    m = CollectiveModel(switch_node(8, lanes=2, switches=6))
    g = (tuple(range(8)),)
    curve = m.curve("all_reduce", g)
    t = float(curve.time(nbytes))
    exact = min(ln.time(nbytes) for ln in m.candidates("all_reduce", g))
    assert exact * (1 - 1e-9) <= t <= exact * 1.01  # tangent lines: exact at powers of two, < 1% above
    if nbytes & (nbytes - 1) == 0 and nbytes >= 64:
        assert t == pytest.approx(exact)
    assert float(curve.time(nbytes * 2)) >= t
    r = m.run("all_reduce", nbytes, g)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 14 / 8)
    assert r.algbw_GBps == pytest.approx(nbytes / t / 1e9)


def test_forced_algorithm_like_nccl_algo():
    m = CollectiveModel(switch_node(8, device="H100-SXM", lanes=18, lane_GBps=20.6, sharp=True))
    g = (tuple(range(8)),)
    assert m.run("all_reduce", 1024, g, algorithms=["nvls"]).algorithm == "nvls/Simple"
    with pytest.raises(InputError, match="match no candidate"):
        m.curve("all_reduce", g, algorithms=["nope"])


# ----------------------------------------------------------------------------------------- caching
def test_curve_cached_per_layout_and_model_per_cluster():
    c = switch_node(8, lanes=2, switches=6)
    m = get_collective_model(c)
    assert get_collective_model(c) is m
    g = tuple((i,) for i in range(8))
    assert m.curve("all_reduce", g) == CostCurve.zero()
    g = (tuple(range(8)),)
    first = m.curve("all_gather", g)
    assert m.curve("all_gather", g) is first                   # speed of lookups: benchmarks/bench_scale.py
    assert m.curve("all_gather", np.array(g)) is first         # the same groups as an array share the curve


# --------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("op, groups, match", [
    ("allreduce", ((0, 1),), "op='allreduce'"),
    ("all_reduce", ((0, 9),), "rank 9"),
    ("all_reduce", ((0, 1), (2,)), "different sizes"),
    ("all_reduce", ((0, 0),), "twice"),
    ("all_reduce", (), "at least one group"),
])
def test_bad_input(op, groups, match):
    m = CollectiveModel(switch_node(4))
    with pytest.raises(InputError, match=match):
        m.curve(op, groups)


def test_bad_size():
    m = CollectiveModel(switch_node(4))
    for bad in (0, -5, float("nan")):
        with pytest.raises(InputError, match="bytes"):
            m.run("all_reduce", bad, ((0, 1),))


def test_every_op_costs_finite_positive():
    m = CollectiveModel(switch_node(4, nodes=2, nics_per_node=2))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"):
        r = m.run(op, 1 << 20, (tuple(range(8)),))
        assert np.isfinite(r.time_s) and r.time_s > 0 and r.busbw_GBps > 0, op


def test_broadcast_pipelined_chain_formula():
    m = CollectiveModel(switch_node(4))
    ln = line(m, "broadcast", ((0, 1, 2, 3),), "ring/Simple")
    assert ln.sec_per_byte == pytest.approx(1 / (100 * GB))  # every hop carries the whole buffer
    # NCCL: nsteps = n, Simple uses the Tree hwLat ("add some chunk latency"), tuning.cc
    assert ln.latency_s == pytest.approx((8.4 + 4 * K.hw("NVLINK", "Tree", "Simple")) * 1e-6)
    assert ln.sqrt_coef == pytest.approx(sqrt_term(ln.sec_per_byte, 4))


def test_hierarchical_nvls_on_multi_node_sharp_switches():
    c = switch_node(4, device="H100-SXM", lanes=18, lane_GBps=20.6, sharp=True, nodes=2, nics_per_node=4,
                    nic_GBps=50.0)
    m = CollectiveModel(c)
    names = [x.name for x in m.candidates("all_reduce", (tuple(range(8)),))]
    assert "hierarchical-nvls/Simple" in names and "nvls/Simple" not in names  # NVLS only inside a node
    h = line(m, "all_reduce", (tuple(range(8)),), "hierarchical-nvls")
    intra = ((0, 1, 2, 3), (4, 5, 6, 7))
    rs, ag = line(m, "reduce_scatter", intra, "nvls"), line(m, "all_gather", intra, "nvls")
    inter = line(m, "all_reduce", ((0, 4), (1, 5), (2, 6), (3, 7)), "ring/Simple")
    assert h.sec_per_byte == pytest.approx(rs.sec_per_byte + inter.sec_per_byte / 4 + ag.sec_per_byte)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=4), st.sampled_from(["all_reduce", "all_gather", "all_to_all"]),
       st.integers(min_value=10, max_value=32))
def test_more_concurrent_groups_never_faster(k, op, log_bytes):
    # 4 nodes x 4 GPUs sharing 2 NICs per node: group i = GPU i of every node
    c = switch_node(4, nodes=4, nics_per_node=2)
    m = CollectiveModel(c)
    groups = tuple(tuple(n * 4 + i for n in range(4)) for i in range(4))
    s = float(1 << log_bytes)
    fewer = float(m.curve(op, groups[:k]).time(s))
    more = float(m.curve(op, groups[: min(k + 1, 4)]).time(s))
    assert more >= fewer * (1 - 1e-12)


@settings(max_examples=20, deadline=None)
@given(st.floats(min_value=5.0, max_value=100.0), st.floats(min_value=1.01, max_value=4.0),
       st.integers(min_value=10, max_value=32))
def test_faster_nic_never_slower(nic, factor, log_bytes):
    g = (tuple(range(8)),)
    slow = CollectiveModel(switch_node(4, nodes=2, nics_per_node=2, nic_GBps=nic))
    fast = CollectiveModel(switch_node(4, nodes=2, nics_per_node=2, nic_GBps=nic * factor))
    s = float(1 << log_bytes)
    assert float(fast.curve("all_reduce", g).time(s)) <= float(slow.curve("all_reduce", g).time(s)) * (1 + 1e-12)
