"""Placement: Megatron-Core RankGenerator goldens (derived by hand) and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.topology import load_cluster
from tpsim.topology.placement import (group_nodes, nodes_spanned, place, place_on, rank_coords,
                                      rank_groups)

CONSECUTIVE = ((0, 1), (2, 3), (4, 5), (6, 7))
STRIDE2 = ((0, 2), (1, 3), (4, 6), (5, 7))
STRIDE4 = ((0, 4), (1, 5), (2, 6), (3, 7))


@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"])
def test_tp2_dp2_pp2_every_order(order):
    # rank = i_first + 2 * (i_second + 2 * i_third): the first axis pairs consecutive ranks, the second
    # stride-2 ranks, the third stride-4 ranks; groups enumerate the other axes innermost-fastest.
    first, second, third = order.split("-")
    groups = rank_groups(2, 2, 2, order)
    assert groups[first] == CONSECUTIVE
    assert groups[second] == STRIDE2
    assert groups[third] == STRIDE4


def test_megatron_docstring_example_tp2_pp3_dp4():
    # Megatron-Core generate_masked_orthogonal_rank_groups docstring: tp=2, pp=3, dp=4, order tp-pp-dp
    groups = rank_groups(tp=2, dp=4, pp=3, order="tp-pp-dp")
    assert groups["dp"] == ((0, 6, 12, 18), (1, 7, 13, 19), (2, 8, 14, 20), (3, 9, 15, 21),
                            (4, 10, 16, 22), (5, 11, 17, 23))
    assert groups["tp"][:3] == ((0, 1), (2, 3), (4, 5))
    assert groups["pp"][:4] == ((0, 2, 4), (1, 3, 5), (6, 8, 10), (7, 9, 11))


def test_asymmetric_dp_innermost():
    # order dp-tp-pp, tp=2 dp=3 pp=2: rank = dp + 3 * (tp + 2 * pp)
    groups = rank_groups(tp=2, dp=3, pp=2, order="dp-tp-pp")
    assert groups["dp"] == ((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11))
    assert groups["tp"] == ((0, 3), (1, 4), (2, 5), (6, 9), (7, 10), (8, 11))
    assert groups["pp"] == ((0, 6), (1, 7), (2, 8), (3, 9), (4, 10), (5, 11))


def test_tp4_dp2_pp2_on_nodes_of_4():
    p = place(tp=4, dp=2, pp=2, order="tp-dp-pp", gpus_per_node=4)
    assert p.groups["tp"] == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert p.groups["dp"] == ((0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15))
    assert p.groups["pp"][:2] == ((0, 8), (1, 9))
    assert p.intra_node("tp") and p.span("tp") == 1
    assert p.nodes("dp")[0] == (0, 1) and p.span("dp") == 2
    assert p.ranks_per_node("dp") == 1
    assert p.groups_sharing_node("dp") == 4   # the 4 DP groups of a node's ranks share its NICs
    assert p.nodes("pp")[0] == (0, 2)


def _megatron(parallel_size: list[int], mask: list[bool]) -> list[list[int]]:
    """Megatron-Core parallel_state.generate_masked_orthogonal_rank_groups, re-derived (innermost first)."""
    def prefix(sizes):
        out, acc = [1], 1
        for s in sizes:
            acc *= s
            out.append(acc)
        return out

    def decompose(index, shape):
        return [(index // d) % s for s, d in zip(shape, prefix(shape))]

    stride = prefix(parallel_size)
    masked = [s for s, m in zip(parallel_size, mask) if m]
    unmasked = [s for s, m in zip(parallel_size, mask) if not m]
    m_stride = [d for d, m in zip(stride, mask) if m]
    u_stride = [d for d, m in zip(stride, mask) if not m]
    groups = []
    for g in range(math.prod(unmasked)):
        gi = decompose(g, unmasked)
        base = sum(a * b for a, b in zip(gi, u_stride))
        groups.append([base + sum(a * b for a, b in zip(decompose(r, masked), m_stride))
                       for r in range(math.prod(masked))])
    return groups


ORDERS = st.permutations(["tp", "dp", "pp"]).map("-".join)


@settings(max_examples=60, deadline=None)
@given(tp=st.integers(1, 6), dp=st.integers(1, 6), pp=st.integers(1, 5), order=ORDERS)
def test_matches_megatron_and_partitions(tp, dp, pp, order):
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    dims = order.split("-")
    groups = rank_groups(tp, dp, pp, order)
    world = tp * dp * pp
    for axis in dims:
        expected = _megatron([sizes[d] for d in dims], [d == axis for d in dims])
        assert [list(g) for g in groups[axis]] == expected
        flat = sorted(r for g in groups[axis] for r in g)
        assert flat == list(range(world))
    # orthogonal: a TP group and a DP group share at most one rank
    tp0 = set(groups["tp"][0])
    assert all(len(tp0 & set(g)) <= 1 for g in groups["dp"])
    # coordinates invert the layout
    for r in range(0, world, max(1, world // 7)):
        c = rank_coords(r, tp, dp, pp, order)
        a, b, z = dims
        assert c[a] + sizes[a] * (c[b] + sizes[b] * c[z]) == r
        tp_group = next(g for g in groups["tp"] if r in g)
        assert tp_group.index(r) == c["tp"]


def test_nodes_and_devices_on_a_cluster():
    cluster = load_cluster("dgx-a100", gpus=32)
    p = place_on(cluster, tp=8, dp=2, pp=2)
    assert p.devices("tp", cluster)[0] == tuple(f"n0/gpu{i}" for i in range(8))
    assert p.devices("dp", cluster)[0] == ("n0/gpu0", "n1/gpu0")
    assert group_nodes((0, 8, 16), 8) == (0, 1, 2)
    assert nodes_spanned((0, 1, 9), 8) == 2


def test_bad_sizes_are_input_errors():
    with pytest.raises(InputError, match="order"):
        rank_groups(2, 2, 2, "tp-dp")
    with pytest.raises(InputError, match="tp=0"):
        rank_groups(0, 2, 2)
    with pytest.raises(InputError, match="does not match gpus=16"):
        place(2, 2, 2, num_gpus=16)
    with pytest.raises(InputError, match="axis"):
        place(2, 2, 2).span("ep")
