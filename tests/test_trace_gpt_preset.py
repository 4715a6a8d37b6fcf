"""A GPT traced from PyTorch code (tpsim.trace.zoo.gpt, the gpt3-1.3b shapes) against the hand-written
gpt3-1.3b preset: the op-graph estimator must agree with the transformer estimator within 2% on step time,
over TP, SP, pipeline, interleaving, ZeRO, micro-batch and recomputation.

The vocabulary is 51200 (a multiple of 128 x 8) so that Megatron's vocabulary padding leaves it unchanged at
every TP degree used. What legitimately differs: the traced block copies the attention output to a contiguous
layout (one extra memory-bound kernel forward and backward) and keeps that copy for backward; the embedding
adds its positions as its own kernel; the output layer re-gathers its sequence-parallel input in backward.
Memory may differ more (8%): the saved attention-output copy, and ZeRO-3's prefetch buffer sized to the largest
unit (the embedding) where the preset sizes it to a transformer layer."""

from __future__ import annotations

import pytest

from tpsim.estimator.flops import convention_ratio

pytest.importorskip("torch")

from tpsim.estimator import estimate  # noqa: E402
from tpsim.model import load_model, with_overrides  # noqa: E402
from tpsim.opgraph.estimate import estimate_graph  # noqa: E402
from tpsim.opgraph.model import OpGraphModel, make_graph_plan  # noqa: E402
from tpsim.opgraph.tp import derive_plan  # noqa: E402
from tpsim.plan import make_plan  # noqa: E402
from tpsim.topology import load_cluster  # noqa: E402
from tpsim.trace import trace_spec  # noqa: E402
from tpsim.trace.spec import parse_input_shape  # noqa: E402

GPUS, BATCH = 64, 512
PLANS = [dict(tp=1), dict(tp=2), dict(tp=8, sp=True, recompute="selective"), dict(tp=8, micro_batch=2),
         dict(tp=2, pp=4, sp=True, recompute="selective"), dict(tp=4, pp=2, recompute="full", micro_batch=4),
         dict(tp=2, pp=4, vpp=2, sp=True), dict(tp=4, zero=3), dict(tp=2, zero=2, overlap=False)]


@pytest.fixture(scope="module")
def models():
    preset = with_overrides(load_model("gpt3-1.3b"), vocab=51200)
    graph = trace_spec("tpsim.trace.zoo:gpt", [parse_input_shape("1,2048:int64")],
                       dict(layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048))
    traced = OpGraphModel(graph=graph, tp_plan=derive_plan(graph)).with_gpus(GPUS)
    return preset, traced, load_cluster("dgx-a100", gpus=GPUS)


@pytest.mark.parametrize("fields", PLANS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_traced_gpt_agrees_with_the_preset(models, fields):
    preset, traced, cluster = models
    kw = {"zero": 1, "micro_batch": 1, **fields}  # explicit: the preset's default plan has other values
    a = estimate(preset, cluster, make_plan(preset, GPUS, global_batch=BATCH, **kw))
    a = a.in_convention("full", convention_ratio(preset, "full"))  # traced graphs count FLOPs as FlopCounterMode
    b = estimate_graph(traced, cluster, make_graph_plan(traced, GPUS, global_batch=BATCH, **kw))
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=0.02)
    assert b.model_tflops_per_gpu == pytest.approx(a.model_tflops_per_gpu, rel=0.02)
    assert b.breakdown["tp_comm"] == pytest.approx(a.breakdown["tp_comm"], rel=0.03, abs=1e-6)
    assert b.breakdown["dp_comm"] == pytest.approx(a.breakdown["dp_comm"], rel=0.02, abs=1e-6)
    assert b.peak_memory_gib == pytest.approx(a.peak_memory_gib, rel=0.08)


def test_traced_parameters_equal_the_preset(models):
    preset, traced, _ = models
    assert traced.graph.total_params() == preset.total_params()
    assert traced.num_layers == preset.num_layers + 2  # the embedding and output units
