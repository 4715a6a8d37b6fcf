"""Traced models sharded in their derived plans on 2 gloo ranks (one launch, no timing): the loss and every
parameter gradient match the unsharded model (float64, 1e-8), and DTensor's collectives (counts and bytes per type, forward
and backward) are the ones the op-graph layout predicts (flavor ``dtensor``).

tiny-resnet exercises the convolution styles (output-channel split, batch norm on the channel shard,
input-channel split with the all-reduce, vocabulary-parallel classifier loss); tiny-unet group norms, the
co-colwise timestep projection and attention on feature maps; tiny-gpt the vocabulary-parallel embedding tied
to the output layer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tpsim.opgraph.model import load_graph_model  # noqa: E402
from tpsim.validate.launch import LaunchConfig  # noqa: E402
from tpsim.validate.traced.run import TracedCase, recorded_factory, run_cases  # noqa: E402

pytestmark = pytest.mark.distributed
DATA = Path(__file__).parent / "data" / "opgraph"
NAMES = ("tiny-resnet", "tiny-unet", "tiny-gpt")


LOGITS = "logits-resnet"
"""a classifier whose forward returns logits, not a loss (traced here; the synthetic loss on both sides)."""


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    from tpsim.cli import main

    graph = tmp_path_factory.mktemp("trace") / "logits.ops.json"
    assert main(["trace", f"{DATA / 'logits_models.py'}:build_convnet", "--input-shape", "4,3,32,32",
                 "--name", LOGITS, "--out", str(graph)]) == 0
    paths = [DATA / f"{n}.ops.json" for n in NAMES] + [graph]
    models = [load_graph_model(p) for p in paths]
    cases = [TracedCase(model=m, tp=2, reps=0, module_spec=recorded_factory(m)[0], kwargs=recorded_factory(m)[1])
             for m in models]  # the test names the factories (a graph's own module_spec is never run)
    out = run_cases(cases, LaunchConfig(nproc=2, timeout_s=60, run_timeout_s=170), tmp_path_factory.mktemp("run"))
    return dict(zip(NAMES + (LOGITS,), out))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", NAMES + (LOGITS,))
def test_sharded_traced_model_matches(summaries, name):
    s = summaries[name]
    assert s["numerics_ok"] and s["numerics_max_rel_err"] <= 1e-8, s["numerics_max_rel_err"]
    assert s["collectives_match"], (s["counts"], s["bytes"])


@pytest.mark.timeout(180)
def test_conv_pairs_issue_one_all_reduce_each_way(summaries):
    """tiny-resnet: 2 bottlenecks x (rowwise conv: forward all-reduce; colwise conv: backward all-reduce), the
    classifier's colwise input gradient (backward) and loss_parallel's 3 statistics (forward)."""
    measured = summaries["tiny-resnet"]["counts"]["measured"]
    assert measured == {"fwd": {"all_reduce": 2 + 3}, "bwd": {"all_reduce": 2 + 1}}


@pytest.mark.timeout(180)
def test_a_model_returning_logits_runs_with_the_synthetic_loss(summaries):
    """issue 22: a classifier returning logits failed on the ranks ("grad can be implicitly created only for scalar
    outputs"); both the trace and the ranks now take the mean of the first output as the loss, and its sharded
    convolution pairs issue their all-reduces (2 forward, 2 backward)."""
    s = summaries[LOGITS]
    assert s["numerics_ok"] and s["collectives_match"]
    assert s["counts"]["measured"] == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 2}}
