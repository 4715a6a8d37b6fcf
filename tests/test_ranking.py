"""benchmarks/ranking.py: Kendall tau-b, pair agreement and the grouping of the shipped published runs."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "ranking.py"
_spec = importlib.util.spec_from_file_location("ranking_benchmark", _PATH)
ranking = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ranking  # (its dataclasses look their module up)
_spec.loader.exec_module(ranking)


@pytest.mark.parametrize("x, y, tau", [
    ([1, 2, 3], [10, 20, 30], 1.0),
    ([1, 2, 3], [30, 20, 10], -1.0),
    ([1, 2, 3, 4], [1, 3, 2, 4], (5 - 1) / 6),                  # one discordant pair of six
    ([1, 2, 2, 3], [1, 2, 3, 4], 5 / math.sqrt(5 * 6)),         # one pair tied in x: n0 - n1 = 5, n0 - n2 = 6
    ([12, 2, 1, 12, 2], [1, 4, 7, 1, 0], -0.47140452079103173),  # scipy.stats.kendalltau's documented example
])
def test_kendall_tau_b_known_cases(x, y, tau):
    assert ranking.kendall_tau_b(x, y) == pytest.approx(tau, abs=1e-12)
    assert ranking.kendall_tau_b(y, x) == pytest.approx(tau, abs=1e-12)


@pytest.mark.parametrize("x, y", [([5, 5, 5], [1, 2, 3]), ([1, 2, 3], [4, 4, 4]), ([1], [2]), ([], [])])
def test_kendall_tau_b_is_undefined_without_an_ordering(x, y):
    assert math.isnan(ranking.kendall_tau_b(x, y))


def test_kendall_tau_b_rejects_unequal_lengths():
    with pytest.raises(ValueError, match="3 values"):
        ranking.kendall_tau_b([1, 2, 3], [1, 2])


@pytest.mark.parametrize("x, y, expected", [
    ([1, 2, 3], [1, 2, 3], (3, 3)),
    ([1, 2, 2], [1, 2, 3], (2, 3)),      # tied in x only: not the same order
    ([1, 1], [2, 2], (1, 1)),            # tied in both: the same order
    ([3, 2, 1], [1, 2, 3], (0, 3)),
])
def test_pair_agreement(x, y, expected):
    assert ranking.pair_agreement(x, y) == expected


def test_grouping_runs_on_the_shipped_runs():
    items = ranking.development_items() + ranking.sc21_items()
    results = ranking.rank_all(items=items)
    assert results
    for r in results:
        assert len(r.items) >= 2 and r.pairs == len(r.items) * (len(r.items) - 1) // 2
        assert len({(it.model_key, it.gpus, it.device, it.stack, it.source) for it in r.items}) == 1
        assert 0 <= r.agree <= r.pairs and (math.isnan(r.tau) or -1 <= r.tau <= 1)
        a, b = r.worst
        assert a.measured >= b.measured
    mean, agree, pairs, _ = ranking.pooled(results)
    assert pairs == sum(r.pairs for r in results) and 0 <= agree <= pairs
    # merging a framework's stack profiles only joins groups: never fewer pairs
    assert ranking.pooled(ranking.rank_all(True, items))[2] >= pairs
