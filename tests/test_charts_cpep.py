"""The expert-parallel and context-parallel sweeps of the report: analysis results and Figure objects."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.model import load_model, with_overrides
from tpsim.report import analysis, charts
from tpsim.search import SearchSpace
from tpsim.topology import load_cluster

SPACE = SearchSpace(vpp=(1,), micro_batch=(1,), order=("tp-dp-pp",), zero=(1,), overlap=(True,),
                    recompute=("selective", "full"), sp=(True,), cp=(1,), etp=(1,))


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.fixture(scope="module")
def ep_sweep():
    model = with_overrides(load_model("tests/data/configs/deepseek_v2_lite.json"), layers=2, seq_len=2048)
    return analysis.ep_sweep(model, load_cluster("dgx-h100", gpus=32), 64, SPACE)


def test_ep_sweep_has_every_expert_degree_and_marks_the_node_boundary(ep_sweep):
    sweep = ep_sweep
    assert sweep.x.tolist() == [1, 2, 4, 8, 16, 32]  # divisors of 64 experts that divide 32 GPUs
    c = sweep.columns
    assert c["ep_comm_s"][0] == 0 and np.all(c["ep_comm_s"][1:] > 0)
    fig = charts.ep_sweep_chart(sweep)
    ax, mem = fig.axes[0], fig.axes[1]
    assert ax.get_xlabel().startswith("expert-parallel degree")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16", "32"]
    boundary = [l for l in ax.lines if l.get_label() == "expert group crosses the node boundary"]
    assert len(boundary) == 1 and boundary[0].get_xdata()[0] == 3.5  # between ep=8 and ep=16 (8 GPUs/node)
    assert np.allclose(mem.lines[0].get_ydata(), c["peak_memory_gib"])
    tops = np.array([p.get_y() + p.get_height() for p in ax.containers[len(charts.COMPONENTS) - 1].patches])
    assert np.allclose(tops, c["step_time_s"])  # every component, the fixed-cost overhead included
    hatched = ax.containers[-1]
    assert np.allclose([p.get_height() for p in hatched.patches], c["ep_comm_s"])
    # the same dispatch bytes per rank leave NVLink for the network: the all-to-all time jumps at the boundary
    assert c["ep_comm_s"][4] > 2 * c["ep_comm_s"][3]
    assert "expert all-to-all (total, partly hidden)" in _legend(ax)


def test_context_sweep_finds_where_cp_pays():
    model = with_overrides(load_model("llama3-8b"), layers=2)
    sweep = analysis.context_sweep(model, load_cluster("dgx-h100", gpus=16), 1 << 18,
                                   SearchSpace(vpp=(1,), micro_batch=(1,), zero=(1,), overlap=(True,),
                                               order=("tp-dp-pp",), recompute=("selective",), sp=(True,)),
                                   seq_lens=(4096, 32768, 262144))
    a, b = sweep.without_cp, sweep.with_cp
    assert sweep.seq_len.tolist() == [4096, 32768, 262144]
    assert np.all(b["cp"][np.isfinite(b["cp"])] > 1) and np.all(a["cp"][np.isfinite(a["cp"])] == 1)
    # the same tokens per step: a shorter sequence has proportionally more sequences per step
    assert np.all(np.isfinite(b["tokens_per_s"]))
    pays = sweep.pays()
    assert pays.tolist() == [not (x >= y) for x, y in zip(a["tokens_per_s"], b["tokens_per_s"])]
    assert pays[-1] and not np.isfinite(a["tokens_per_s"][-1])  # 256k tokens: no cp = 1 plan fits 16 H100s
    first = sweep.first_paying()
    assert first is not None and pays[sweep.seq_len.tolist().index(first):].all()
    fig = charts.context_sweep_chart(sweep)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "throughput (tokens/s)"
    lines = {l.get_label(): l for l in ax.lines}
    np.testing.assert_allclose(lines["best plan with cp > 1"].get_ydata(), b["tokens_per_s"])
    np.testing.assert_allclose(lines["best plan with cp = 1"].get_ydata(), a["tokens_per_s"])
    assert f"context parallelism pays from {first:,} tokens" in lines
    assert [t.get_text() for t in ax.texts][: int(np.isfinite(b["tokens_per_s"]).sum())] == [
        f"cp{int(c)}" + ("/a2a" if k == 1 else "") for c, k in zip(b["cp"], b["cp_kind"])]


def test_report_adds_the_ep_and_cp_sweeps_for_a_long_context_moe_model(tmp_path):
    from tpsim.cli import main
    from tpsim.report.markdown import CHART_FILES, context_seq_lens

    out = tmp_path / "rep"
    argv = ["report", "--model", "mixtral-8x7b", "--layers", "2", "--seq-len", "32768", "--cluster", "dgx-h100",
            "--gpus", "16", "--global-batch", "4", "--vpp", "1", "--micro-batch", "1", "--order", "tp-dp-pp",
            "--zero", "1", "--recompute", "selective", "--sp", "on", "--etp", "1", "--cp-kind", "ring", "--out",
            str(out), "--quiet", "--top", "3"]
    assert main(argv) == 0
    text = (out / "README.md").read_text()
    for name in CHART_FILES + ("ep_sweep", "cp_sweep"):
        assert f"]({name}.png)" in text and (out / f"{name}.png").stat().st_size > 1000
    assert "## Expert-parallel degree sweep" in text and "## Where context parallelism pays" in text
    assert context_seq_lens(32768) == (4096, 8192, 16384, 32768)
    for s in context_seq_lens(32768):
        assert f"| {s:,} |" in text or f"| {s} |" in text
