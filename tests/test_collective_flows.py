"""The vectorized flows of each algorithm load the links exactly as the literal per-group construction
(``ring_orders`` / ``_tree_python``, the first wave's code kept as the reference), for regular and ragged
groups; groups by symmetry (``GroupSet``) expand back to the groups they came from."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tpsim.collectives.flows import (Flows, Ragged, Segments, _ring_python, _tree_python, ring_flows,
                                     split_by_node, tree_flows)
from tpsim.collectives.groups import GroupSet, ShiftedFlows
from tpsim.collectives.model import CollectiveModel
from tpsim.topology import load_cluster
from tpsim.topology.placement import RankLayout

CLUSTER = load_cluster("dgx-a100", gpus=64)
ROUTER = CollectiveModel(CLUSTER).router


@st.composite
def per_node_groups(draw):
    """Disjoint groups on distinct nodes of the 8-node cluster, any number of ranks per node."""
    nodes = draw(st.permutations(range(8)))
    groups, at = [], 0
    for _ in range(draw(st.integers(1, 3))):
        span = draw(st.integers(1, 3))
        if at + span > 8:
            break
        group = []
        for node in nodes[at:at + span]:
            locals_ = draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
            group.append(sorted(node * 8 + i for i in locals_))
        groups.append(group)
        at += span
    return groups


def load(flows: Flows) -> float:
    return ROUTER.sec_per_byte(flows)


@settings(max_examples=60, deadline=None)
@given(per_node_groups(), st.booleans())
def test_ragged_rings_and_trees_equal_the_literal_construction(groups, chain):
    seg = Segments((), (), Ragged.of(groups))
    literal_ring = Flows.from_list([f for p in groups for f in _ring_python(p, chain)])
    assert np.isclose(load(ring_flows(seg, chain)), load(literal_ring), rtol=1e-12)
    literal_tree = Flows.from_list([f for p in groups for f in _tree_python(p)])
    assert np.isclose(load(tree_flows(seg)), load(literal_tree), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(8, 8, 1), (1, 64, 1), (2, 8, 4), (4, 2, 8), (16, 4, 1)]),
       st.sampled_from(["tp-dp-pp", "dp-tp-pp", "pp-dp-tp"]), st.sampled_from(["tp", "dp", "pp"]))
def test_regular_blocks_equal_the_literal_construction(sizes, order, axis):
    tp, dp, pp = sizes
    groups = np.ascontiguousarray(RankLayout.from_order(order, tp=tp, dp=dp, pp=pp).groups(axis))
    if groups.shape[1] == 1:
        return
    seg = split_by_node(groups, *np.divmod(groups, 8))
    per_node = seg.per_node()
    assert seg.ragged is None
    for chain in (False, True):
        literal = Flows.from_list([f for p in per_node for f in _ring_python(p, chain)])
        assert np.isclose(load(ring_flows(seg, chain)), load(literal), rtol=1e-12)
    literal = Flows.from_list([f for p in per_node for f in _tree_python(p)])
    assert np.isclose(load(tree_flows(seg)), load(literal), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(8, 16, 1), (2, 8, 8), (4, 4, 8), (1, 128, 1), (8, 2, 8)]),
       st.sampled_from(["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"]), st.sampled_from(["tp", "dp", "pp"]))
def test_group_sets_expand_to_their_groups(sizes, order, axis):
    tp, dp, pp = sizes
    groups = np.ascontiguousarray(RankLayout.from_order(order, tp=tp, dp=dp, pp=pp).groups(axis))
    gs = GroupSet.of(groups, 8)
    assert gs.num_groups == len(groups) and len(gs.reps) <= len(groups)
    back = gs.expand()
    assert sorted(map(tuple, back.tolist())) == sorted(map(tuple, groups.tolist()))
    # every copy is its representative moved by whole nodes
    for c in range(len(gs.reps)):
        assert np.all(gs.shifts(c) % 8 == 0) and 0 in gs.shifts(c)


def test_unsorted_groups_classify_with_negative_shifts():
    groups = np.array([[17, 18], [1, 2], [9, 10], [33, 34]])   # the same pair of GPUs on nodes 2, 0, 1, 4
    gs = GroupSet.of(groups, 8)
    assert len(gs.reps) == 1 and sorted(gs.shifts(0).tolist()) == [-16, -8, 0, 16]
    assert sorted(map(tuple, gs.expand().tolist())) == sorted(map(tuple, groups.tolist()))
    s = CollectiveModel(CLUSTER)
    r = CollectiveModel(CLUSTER, reference=True)
    for op in ("all_reduce", "all_gather", "all_to_all", "send_recv"):
        a, b = s.curve(op, groups), r.curve(op, groups)
        assert a.algorithms == b.algorithms and np.allclose(a.sec_per_byte, b.sec_per_byte, rtol=1e-12)


def test_shifted_flows_load_like_their_copies():
    groups = np.ascontiguousarray(RankLayout.from_order("tp-dp-pp", tp=8, dp=4, pp=2).groups("dp"))
    gs = GroupSet.of(groups, 8)
    seg = split_by_node(gs.reps, *np.divmod(gs.reps, 8))
    shifted = ShiftedFlows(ring_flows(seg), gs)
    full = ring_flows(split_by_node(groups, *np.divmod(groups, 8)))
    assert np.isclose(ROUTER.sec_per_byte(shifted), ROUTER.sec_per_byte(full), rtol=1e-12)
    assert len(shifted.expand()) == len(full)
