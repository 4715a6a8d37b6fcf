"""Issue 19, data-parallel exposure as Megatron-Core does it (tpsim/estimator/schedule.py chunked_exposure,
dp_exposure): each model chunk of an interleaved plan reduces after its own last backward and gathers before its
own first forward; the last gradient bucket and the first parameter bucket are exposed whatever the window."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.schedule import chunked_exposure
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster


def _queue(comm: float, window: float, chunks: int, slots: int, own: bool) -> float:
    """Exposure by simulation: the step's last pass ends at 0; chunk k (from the end) ends its last pass at
    -k x slots x window / chunks and is released then, or when that pass begins (``own``, and always for a single
    chunk: its buckets go during the pass); each chunk's share of comm queues on one stream."""
    w, c = window / chunks, comm / chunks
    t = -np.inf
    for k in reversed(range(chunks)):  # the earliest release first
        t = max(t, -(k * slots + (1 if own or chunks == 1 else 0)) * w) + c
    return max(t, 0.0)


@settings(max_examples=80, deadline=None)
@given(comm=st.floats(0, 10), window=st.floats(0, 10), chunks=st.integers(1, 12), slots=st.integers(1, 16),
       own=st.booleans())
def test_chunked_exposure_is_the_queue_of_chunks_released_one_round_apart(comm, window, chunks, slots, own):
    got = float(chunked_exposure(np.array([comm]), np.array([window]), np.array([chunks]), np.array([slots]),
                                 own_window=own)[0])
    assert got == pytest.approx(_queue(comm, window, chunks, slots, own), abs=1e-9)
    assert got <= max(comm - (window / chunks if own or chunks == 1 else 0.0), 0.0) + 1e-12  # <= the last chunk alone


@settings(max_examples=40, deadline=None)
@given(comm=st.floats(0, 10), window=st.floats(0, 10))
def test_one_chunk_is_the_plain_rule_and_the_last_bucket_always_shows(comm, window):
    one = chunked_exposure(np.array([comm]), np.array([window]))
    assert float(one[0]) == max(comm - window, 0.0)  # bit for bit: plans without interleaving are unchanged
    floor = float(chunked_exposure(np.array([comm]), np.array([window]), last_share=0.1)[0])
    assert floor == pytest.approx(max(comm - window, 0.1 * comm))


def _stack_copy(tmp_path, old: str, new: str) -> str:
    from pathlib import Path

    import tpsim

    text = (Path(tpsim.__file__).parent / "data" / "stacks" / "megatron.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1
    path = tmp_path / "megatron.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def gpt():
    model = with_overrides(load_model("gpt3-175b"), layers=16, hidden=4096, heads=32)
    return model, load_cluster("dgx-h100", gpus=64)


def test_interleaved_chunks_hide_their_reduction_behind_the_other_chunks(gpt, tmp_path):
    model, cluster = gpt
    off = _stack_copy(tmp_path, "  dp_sync_per_chunk:\n    value: true", "  dp_sync_per_chunk:\n    value: false")
    inter = make_plan(model, 64, tp=8, pp=2, vpp=4, sp=True, zero=1, micro_batch=1, global_batch=32)
    on_e, off_e = (estimate(model, cluster, inter, stack=s) for s in ("megatron", off))
    assert on_e.breakdown["dp_comm"] == pytest.approx(off_e.breakdown["dp_comm"])  # same traffic
    assert on_e.terms["dp_comm"] < off_e.terms["dp_comm"]
    assert on_e.step_time_s < off_e.step_time_s
    plain = make_plan(model, 64, tp=8, pp=2, sp=True, zero=1, micro_batch=1, global_batch=32)
    assert estimate(model, cluster, plain, stack="megatron").step_time_s == estimate(
        model, cluster, plain, stack=off).step_time_s


def test_the_last_bucket_is_exposed_even_when_the_backward_is_long(tmp_path):
    model = with_overrides(load_model("gpt3-175b"), layers=4, hidden=2048, heads=16)
    cluster = load_cluster("dgx-h100", gpus=16)
    plan = make_plan(model, 16, tp=1, pp=1, sp=False, zero=1, micro_batch=8, global_batch=128)
    one_bucket = _stack_copy(tmp_path, "  dp_bucket_elements:\n    value: max(4e7, 1e6 x dp)",
                             "  dp_bucket_elements:\n    value: 1e12")
    small, whole = (estimate(model, cluster, plan, stack=s) for s in ("megatron", one_bucket))
    assert whole.terms["dp_comm"] == pytest.approx(whole.breakdown["dp_comm"])  # one bucket: nothing hides
    assert small.terms["dp_comm"] < whole.terms["dp_comm"]


def test_bucket_rule_reads_megatrons_default_and_refuses_others(tmp_path):
    from tpsim.estimator.stackterms import stack_terms

    terms = stack_terms(load_stack("megatron"))
    assert terms.dp_bucket_elements == (4e7, 1e6)
    assert np.allclose(terms.dp_bucket(np.array([8, 48, 96])), [4e7, 4.8e7, 9.6e7])
    bad = _stack_copy(tmp_path, "  dp_bucket_elements:\n    value: max(4e7, 1e6 x dp)",
                      "  dp_bucket_elements:\n    value: lots")
    with pytest.raises(InputError, match="comm.dp_bucket_elements: 'lots'"):
        stack_terms(load_stack(bad))
