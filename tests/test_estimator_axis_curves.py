"""The communication stage's batched collective timing (AxisCurves.timed_and_named, which times only the rows
that move bytes, from per-layout tables) against each row's own layout envelope, one size at a time."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.estimator import context_for
from tpsim.estimator.comm import AxisCurves, layouts_of
from tpsim.model import load_model
from tpsim.search import SearchSpace
from tpsim.search.space import enumerate_valid
from tpsim.topology import load_cluster

CASES = [("mixtral-8x7b", 64, 256, ("ep",), "all_to_all"), ("mixtral-8x7b", 64, 256, ("edp",), "reduce_scatter"),
         ("mixtral-8x7b", 64, 256, ("tp",), "all_reduce"), ("mixtral-8x7b", 64, 256, ("dp", "cp"), "all_gather"),
         ("mixtral-8x7b", 64, 256, ("pp",), "send_recv")]


@pytest.mark.parametrize("name, gpus, batch, axes, op", CASES)
def test_timed_rows_match_the_curve_of_their_layout(name, gpus, batch, axes, op):
    model, cluster = load_model(name), load_cluster("dgx-h100", gpus=gpus)
    ctx = context_for(model, cluster)
    plans = enumerate_valid(model, gpus, batch, SearchSpace(vpp=(1,), micro_batch=(1,))).plans
    layouts, inverse = layouts_of(ctx, plans)
    rng = np.random.default_rng(7)
    nbytes = np.where(rng.random(len(plans)) < 0.3, 0.0, 10.0 ** rng.uniform(2, 11, len(plans)))
    seconds, codes = AxisCurves(ctx, layouts, inverse).timed_and_named(axes, op, nbytes)
    expert = set(axes) <= {"etp", "ep", "edp"}
    names = ctx.name_table
    checked = 0
    for i in rng.choice(len(plans), size=min(len(plans), 300), replace=False):
        layout = (layouts.expert if expert else layouts.dense)[inverse[i]]
        env = ctx.curve(op, layout, axes)
        if nbytes[i] <= 0:
            assert seconds[i] == 0.0 and codes[i] == -1
            continue
        lines = env.latency_s + nbytes[i] * env.sec_per_byte
        best = int(np.argmin(lines))
        assert seconds[i] == lines[best]
        assert codes[i] == env.codes[best]
        if codes[i] >= 0:
            assert names[codes[i]].startswith(f"{op}: ")
            checked += 1
    assert checked > 50


def test_results_do_not_depend_on_the_order_layouts_enter_the_tables():
    """Envelope tables grow as chunks bring new layouts (rows by layout number, padded to the widest): one
    batch on a fresh context and the same plans in reversed chunks on another give identical results."""
    from tpsim.estimator import estimate_batch
    from tpsim.estimator.context import EstimationContext

    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", gpus=64)
    plans = enumerate_valid(model, 64, 256, SearchSpace(vpp=(1, 2), micro_batch=(1, 2))).plans
    whole = estimate_batch(model, cluster, plans, context=EstimationContext.build(model, cluster))
    ctx = EstimationContext.build(model, cluster)
    bounds = np.linspace(0, len(plans), 7).astype(int)
    parts = {}
    for lo, hi in reversed(list(zip(bounds[:-1], bounds[1:]))):
        parts[lo] = estimate_batch(model, cluster, plans.take(np.arange(lo, hi)), context=ctx)
    joined = [parts[lo] for lo in bounds[:-1]]
    for name in ("step_time_s", "peak_memory_gib", "exposed_comm_s", "dp_comm_s", "ep_comm_s", "tp_comm_s"):
        assert np.array_equal(np.concatenate([getattr(p, name) for p in joined]), getattr(whole, name)), name
    for axis, codes in whole.collective_codes.items():
        names = [whole.collective_names[c] if c >= 0 else "" for c in codes]
        mine = [p.collective_names[c] if c >= 0 else "" for p in joined for c in p.collective_codes[axis]]
        assert mine == names, axis
