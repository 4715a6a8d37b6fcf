"""Plan-ranking agreement with published rankings (issue 19: "Kendall tau >= 0.8").

    python benchmarks/ranking.py                # per group and pooled, shipped constants
    python benchmarks/ranking.py --framework    # also grouped by framework (eager and compiled torchtitan together)

Rows: the development set (``tpsim/data/runs/development.csv`` through ``benchmarks/accuracy_runs.py``'s loader
and prediction) and SC21 Table 1 (``benchmarks/accuracy_sc21.py``'s per-row read-out). A published ranking is
the set of plans one source measured for the same workload on the same hardware, so a group is keyed by

  * the model as the estimator sees it (every ModelSpec field but its name and its typical batch/plan, so rows
    that override a preset's shape are their own model) -- the sequence length is part of it: it changes the
    work per token (attention is quadratic in it), so throughputs at two sequence lengths are no ranking;
  * the GPU count, the device and the stack profile (``--framework``: the stack's framework, the name before
    its first ``-``, so that torchtitan's eager and compiled runs of one table rank together);
  * the source cell (one paper table or one repository page at one commit): the torchtitan paper and the
    torchtitan repository measured the same plans with different software (5,762 and 6,258 tokens/s/GPU for one
    8-GPU plan), so pooling them would rank a plan against itself.

The global batch is not in the key: the figure ranked is throughput (tokens/s; TFLOP/s per GPU for SC21, the
same ordering at one model and GPU count), which is per token, so plans that differ in micro-batch and global
batch (torchtitan's Llama 2 70B rows) rank fairly; the per-step fixed costs a larger batch amortizes are part of
what the estimator models. Groups need at least two published plans. Plans tpsim cannot tell apart (the same
``Plan``: torchtitan's per-layer and per-op selective checkpointing both map to ``selective``) are predicted
tied; Kendall's tau-b counts the tie, and a group whose predictions are all tied has no tau (``n/a``).

Per group: each plan's published and predicted throughput, tau-b, the pairs ordered the same (a pair agrees when
the predicted order equals the measured one, ties included), and the worst-ordered pair. Pooled: the mean tau
weighted by each group's pairs (groups with a tau) and the overall pair agreement. Nothing is fitted here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the sibling benchmarks, imported for their loaders (not a package)
    sys.path.insert(0, str(HERE))

SC21_SOURCE = "Narayanan et al. 2021 SC21 (arXiv:2104.04473) Table 1"
_NOT_WORKLOAD = ("name", "global_batch", "default_plan")
"""ModelSpec fields that describe a preset, not the model a run trains."""


# ---- Kendall tau-b and pair agreement -----------------------------------------------------------------------
def _pair_signs(values) -> np.ndarray:
    """sign(v_i - v_j) for every pair i < j (-1, 0, 1)."""
    v = np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(v), k=1)
    return np.sign(v[i] - v[j])


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant) / sqrt((n0 - n1)(n0 - n2)),
    n0 the pairs, n1 / n2 the pairs tied in x / y (Kendall 1945). NaN when x or y is all tied or has fewer
    than two values (no ordering to compare)."""
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} values, y has {len(y)}")
    sx, sy = _pair_signs(x), _pair_signs(y)
    untied_x, untied_y = np.count_nonzero(sx), np.count_nonzero(sy)
    if untied_x == 0 or untied_y == 0:
        return math.nan
    return float((sx * sy).sum() / math.sqrt(untied_x * untied_y))


def pair_agreement(x, y) -> tuple[int, int]:
    """(pairs ordered the same by x and y, pairs): a pair agrees when sign(x_i - x_j) == sign(y_i - y_j), a tie
    in both counting as the same order."""
    sx, sy = _pair_signs(x), _pair_signs(y)
    return int((sx == sy).sum()), int(sx.size)


# ---- rows ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Item:
    """One published plan: its group fields and its measured and predicted throughput (higher is faster)."""

    run_id: str
    source: str
    model: str
    """the model as ranked (its name and shape, for the table)."""
    model_key: str
    gpus: int
    device: str
    stack: str
    plan: object
    measured: float
    predicted: float
    unit: str
    fits: bool = True


def _model_key(model) -> str:
    fields = dataclasses.asdict(model)
    return repr(sorted((k, v) for k, v in fields.items() if k not in _NOT_WORKLOAD))


def _model_label(model) -> str:
    return f"{model.name} L{model.num_layers} h{model.hidden_size} s{model.seq_len}"


def development_items() -> list[Item]:
    """The development set, predicted with the shipped constants (accuracy_runs' loader and ``predict``);
    throughput in tokens/s = tokens per step / step time."""
    import accuracy_runs
    from tpsim.runs import DEVELOPMENT_CSV, load_runs

    runs = {r.run_id: r for r in load_runs(DEVELOPMENT_CSV, check_stack=False)}
    items = []
    for row in accuracy_runs.development_rows():
        run = runs[row.run_id]
        step, fits = accuracy_runs.predict(row)
        items.append(Item(row.run_id, run.source, _model_label(row.model), _model_key(row.model), run.gpus,
                          row.cluster.device.name, row.stack.name, row.plan, run.tokens_per_step / row.measured_s,
                          run.tokens_per_step / step, "tokens/s", fits))
    return items


def sc21_items() -> list[Item]:
    """SC21 Table 1 (accuracy_sc21's per-row read-out): per-GPU TFLOP/s, published and predicted."""
    import accuracy_sc21
    from tpsim.estimator.reference import SC21_CLUSTER, sc21_cases, sc21_stack
    from tpsim.topology import load_cluster

    stack = sc21_stack().name
    items = []
    for case, row in zip(sc21_cases(), accuracy_sc21.per_row(), strict=True):
        assert row["case"] == case.case_id
        device = load_cluster(SC21_CLUSTER, gpus=case.gpus).device.name
        items.append(Item(case.case_id, SC21_SOURCE, _model_label(case.model), _model_key(case.model), case.gpus,
                          device, stack, case.plan, row["measured"], row["predicted"], "TFLOP/s/GPU"))
    return items


def framework(stack: str) -> str:
    """The framework of a stack profile: its name up to the first ``-`` (torchtitan-compile -> torchtitan)."""
    return stack.split("-", 1)[0]


def group_items(items: list[Item], by_framework: bool = False) -> dict[tuple, list[Item]]:
    """Groups of at least two published plans: (model, GPUs, device, stack or framework, source) -> items."""
    groups = defaultdict(list)
    for it in items:
        stack = framework(it.stack) if by_framework else it.stack
        groups[(it.model_key, it.gpus, it.device, stack, it.source)].append(it)
    return {k: v for k, v in groups.items() if len(v) >= 2}


# ---- per group ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class GroupResult:
    key: tuple
    items: list[Item]
    tau: float
    agree: int
    pairs: int
    distinct: int
    """plans tpsim tells apart (distinct ``Plan`` and stack)."""
    worst: tuple[Item, Item] | None
    """the pair whose predicted order is furthest from the measured one (a, b: a measured faster or equal)."""


def worst_pair(items: list[Item]) -> tuple[Item, Item] | None:
    """The pair ordered worst: the smallest predicted log-ratio taken in the direction of the measured order
    (negative: ordered wrong; 0: predicted tied), ties broken by the larger measured gap. A measured tie scores
    minus the predicted gap."""
    best = None
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            a, b = items[i], items[j]
            if b.measured > a.measured:
                a, b = b, a
            m = math.log(a.measured / b.measured)
            p = math.log(a.predicted / b.predicted)
            score = (-abs(p) if m == 0 else p, -m)
            if best is None or score < best[0]:
                best = (score, (a, b))
    return best[1] if best else None


def evaluate(key: tuple, items: list[Item]) -> GroupResult:
    meas = [it.measured for it in items]
    pred = [it.predicted for it in items]
    agree, pairs = pair_agreement(pred, meas)
    distinct = len({(repr(sorted(it.plan.to_dict().items())), it.stack) for it in items})
    return GroupResult(key, items, kendall_tau_b(pred, meas), agree, pairs, distinct, worst_pair(items))


def pooled(results: list[GroupResult]) -> tuple[float, int, int, int]:
    """(mean tau weighted by pairs over the groups with a tau, pairs agreeing, pairs, groups with a tau)."""
    with_tau = [r for r in results if not math.isnan(r.tau)]
    weights = np.array([r.pairs for r in with_tau], dtype=float)
    mean = float((weights * [r.tau for r in with_tau]).sum() / weights.sum()) if with_tau else math.nan
    return mean, sum(r.agree for r in results), sum(r.pairs for r in results), len(with_tau)


def _fmt_tau(tau: float) -> str:
    return "  n/a" if math.isnan(tau) else f"{tau:+.2f}"


def _short_source(source: str) -> str:
    return source if len(source) <= 70 else source[:67] + "..."


def _rank(item: Item, items: list[Item], figure: str) -> int:
    """1 + the plans strictly faster by ``figure`` (tied plans share a rank)."""
    return 1 + sum(getattr(o, figure) > getattr(item, figure) for o in items)


def print_groups(results: list[GroupResult], title: str) -> None:
    print(f"== {title}: {len(results)} groups")
    for r in results:
        first = r.items[0]
        print(f"\n{first.model}  {first.gpus} GPUs  {first.device}  {r.key[3]}  [{_short_source(first.source)}]")
        print(f"  plans {len(r.items)} ({r.distinct} distinct to tpsim)  tau-b {_fmt_tau(r.tau)}  "
              f"pairs agreeing {r.agree}/{r.pairs}")
        order_m = sorted(r.items, key=lambda it: -it.measured)
        print(f"    {'run':40s} {'plan':38s} {'published':>10s} {'tpsim':>10s} {'rank m/p':>8s}  ({first.unit})")
        for it in order_m:
            label = f"{it.plan.short()} {it.plan.dtype}" + (" tp-ovl" if it.plan.tp_overlap else "") + \
                    ("" if it.stack == first.stack else f" {it.stack}")
            rank = f"{_rank(it, r.items, 'measured'):>4d}/{_rank(it, r.items, 'predicted'):<3d}"
            print(f"    {it.run_id:40s} {label:38s} {it.measured:10.1f} {it.predicted:10.1f} {rank}"
                  + ("" if it.fits else "  (judged not to fit)"))
        if r.worst:
            a, b = r.worst
            verdict = ("published tied" if a.measured == b.measured else "predicted tied"
                       if a.predicted == b.predicted else "ordered wrong" if a.predicted < b.predicted
                       else "ordered right")
            print(f"  worst pair: {a.run_id} vs {b.run_id}: published {a.measured:.1f} vs {b.measured:.1f} "
                  f"({100 * (a.measured / b.measured - 1):+.1f}%), tpsim {a.predicted:.1f} vs {b.predicted:.1f} "
                  f"({100 * (a.predicted / b.predicted - 1):+.1f}%), {verdict}")
    mean, agree, pairs, n_tau = pooled(results)
    print(f"\n{title}, pooled: mean tau-b weighted by pairs {_fmt_tau(mean)} over {n_tau} groups with a tau "
          f"(of {len(results)}); pairs agreeing {agree}/{pairs} ({100 * agree / pairs:.0f}%)" if pairs else
          f"\n{title}, pooled: no groups")


def rank_all(by_framework: bool = False, items: list[Item] | None = None) -> list[GroupResult]:
    items = items if items is not None else development_items() + sc21_items()
    groups = group_items(items, by_framework)
    return [evaluate(k, v) for k, v in sorted(groups.items(), key=lambda kv: (kv[1][0].device, kv[0][3],
                                                                               kv[1][0].gpus, kv[1][0].run_id))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", action="store_true",
                        help="also group by framework (a stack's name before its first '-') instead of stack")
    args = parser.parse_args(argv)
    items = development_items() + sc21_items()
    n_sc21 = sum(it.source == SC21_SOURCE for it in items)
    grouped = sum(len(v) for k, v in group_items(items).items() if k[4] == SC21_SOURCE)
    print(f"rows: {len(items) - n_sc21} development-set, {n_sc21} SC21 Table 1 ({grouped} of them in a group: "
          "each SC21 row is another model on another GPU count)\n")
    print_groups(rank_all(False, items), "by model, GPUs, device, stack, source")
    if args.framework:
        print()
        print_groups(rank_all(True, items), "by model, GPUs, device, framework, source")
    return 0


if __name__ == "__main__":
    sys.exit(main())
