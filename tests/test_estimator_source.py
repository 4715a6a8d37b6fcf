"""The layer-cost stage is a replaceable source: a hand-written source feeds the same partition, communication,
schedule, memory and totals stages (what a traced op graph will do, issue 15)."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.estimator import Collective, Edge, EstimationContext, LayerCosts, LayerSource, estimate
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster

F, B, PARAMS, ACT = 2e-3, 4e-3, 1e6, 3e6  # seconds, seconds, parameters, bytes per layer


class Uniform(LayerSource):
    """Every layer costs F forward and B backward, holds PARAMS parameters and ACT activation bytes; one
    all-reduce of ACT bytes per layer in backward over TP, hidden behind half of the backward."""

    def __init__(self, layers: int):
        self.num_layers = layers
        self.tokens_per_sequence = 1000

    def model_flops_per_sequence(self) -> float:
        return 1e12

    def recompute_flops_per_sequence(self, recompute: np.ndarray) -> np.ndarray:
        return np.zeros(recompute.shape)

    def costs(self, compute, keys, dtype, attention) -> LayerCosts:
        n = keys["tp"].size
        full = lambda v: np.full(n, float(v))  # noqa: E731
        zero = full(0.0)
        edge = Edge(fwd=zero, bwd=zero, comm=(), params=zero, shared_params=zero, buffer_bytes=zero)
        comm = (Collective(axes=("tp",), op="all_reduce", phase="bwd", nbytes=np.where(keys["tp"] > 1, ACT, 0.0),
                           hide=full(B / 2)),)
        return LayerCosts(fwd=full(F), bwd=full(B), recompute=zero, measured=zero, comm=comm, params=full(PARAMS),
                          activations=full(ACT), working=zero, boundary_bytes=full(ACT), first=edge, last=edge)


@pytest.fixture(scope="module")
def setup():
    model = with_overrides(load_model("gpt3-1.3b"), layers=8)
    return model, load_cluster("dgx-a100", gpus=8)


def test_a_custom_source_runs_through_every_stage(setup):
    model, cluster = setup
    ctx = EstimationContext.build(model, cluster, source=Uniform(8))
    plan = make_plan(model, 8, tp=1, pp=1, zero=0, micro_batch=1, global_batch=8)  # dp = 8, m = 1
    e = estimate(model, cluster, plan, context=ctx)
    assert e.breakdown["compute"] == pytest.approx(8 * (F + B), rel=1e-12)
    assert e.breakdown["tp_comm"] == 0.0 and e.breakdown["bubble"] == 0.0
    assert e.tokens_per_s == pytest.approx(8 * 1000 / e.step_time_s)
    assert e.model_tflops_per_gpu == pytest.approx(8 * 1e12 / (e.step_time_s * 8) / 1e12)
    parts = sum(e.breakdown[k] for k in ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead"))
    assert parts == pytest.approx(e.step_time_s, rel=1e-12)
    gib = 2 ** 30
    assert e.memory_gib["weights"] * gib == pytest.approx(8 * PARAMS * 2)  # 16-bit weights of 8 layers
    assert e.memory_gib["activations"] * gib == pytest.approx(8 * ACT)  # one micro-batch in flight


def test_a_custom_source_gets_its_collectives_timed_and_hidden(setup):
    model, cluster = setup
    ctx = EstimationContext.build(model, cluster, source=Uniform(8))
    plan = make_plan(model, 8, tp=2, pp=2, sp=False, zero=0, micro_batch=1, global_batch=8)  # dp 2, m 4
    e = estimate(model, cluster, plan, context=ctx)
    t = float(ctx.curve("all_reduce", ctx.layout("tp-dp-pp", tp=2, dp=2, pp=2), ("tp",)).curve.time(ACT))
    m, layers = 4, 4
    assert e.breakdown["tp_comm"] == pytest.approx(m * layers * t, rel=1e-9)
    assert e.breakdown["bubble"] > 0 and e.breakdown["pp_comm"] > 0
    assert set(e.collectives) == {"tp", "dp", "pp"}
