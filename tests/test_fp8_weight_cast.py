"""Issue 19: the once-per-step quantization of the weights in low-precision training (Transformer Engine's
``is_first_microbatch`` caching): its formula and where it lands in the step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.estimator import estimate
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster


def test_weight_cast_reads_the_weight_and_writes_its_quantized_copies():
    from tpsim.estimator.context import context_for
    from tpsim.estimator.schedule import weight_cast_seconds

    model = with_overrides(load_model("gpt3-175b"), layers=4, hidden=4096, heads=32)
    ctx = context_for(model, load_cluster("dgx-h100", gpus=8), stack="megatron")
    params = np.array([1e9, 2e9])
    t = weight_cast_seconds(ctx, params, "fp8")
    assert ctx.terms.weight_cache_bytes("fp8") == 2.0  # the fp8 copy and its transpose
    assert t == pytest.approx(params * (2.0 + 2.0) / ctx.fixed.hbm)  # read bf16, write 2 x 1 B
    assert not weight_cast_seconds(ctx, params, "bf16").any()  # nothing to cast in 16-bit training


def test_fp8_step_pays_the_weight_cast_once_per_step_in_the_optimizer_term():
    model = with_overrides(load_model("gpt3-175b"), layers=4, hidden=4096, heads=32)
    cluster = load_cluster("dgx-h100", gpus=8)
    from tpsim.estimator.context import context_for
    from tpsim.estimator.schedule import weight_cast_seconds

    ctx = context_for(model, cluster, stack="megatron")
    few = make_plan(model, 8, tp=1, pp=1, zero=1, global_batch=8, micro_batch=1, dtype="fp8")
    many = dataclasses.replace(few, global_batch=32)  # four times the micro-batches, the same casts
    e_few, e_many = (estimate(model, cluster, p, stack="megatron") for p in (few, many))
    assert e_many.breakdown["optimizer"] == pytest.approx(e_few.breakdown["optimizer"])
    bf16 = estimate(model, cluster, dataclasses.replace(few, dtype="bf16"), stack="megatron")
    params = model.total_params()  # tp 1, pp 1: the rank holds every weight
    cast = float(weight_cast_seconds(ctx, np.array([float(params)]), "fp8")[0])
    assert e_few.breakdown["optimizer"] - bf16.breakdown["optimizer"] == pytest.approx(cast, rel=0.05)
