"""The five charts: the Figure objects have the expected axes, series and markers (not just a file)."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.model import load_model, with_overrides
from tpsim.report import analysis, charts
from tpsim.report.network import inter_node_bandwidth_GBps, scale_inter_node_bandwidth
from tpsim.search import SearchSpace, search
from tpsim.topology import load_cluster

SPACE = SearchSpace(vpp=(1,), micro_batch=(1, 2), order=("tp-dp-pp",), zero=(0, 1), overlap=(True,))


@pytest.fixture(scope="module")
def problem():
    model = with_overrides(load_model("gpt3-1.3b"), layers=8)
    return model, load_cluster("dgx-a100", gpus=32)


@pytest.fixture(scope="module")
def result(problem):
    model, cluster = problem
    return search(model, cluster, 64, space=SPACE)


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_breakdown_chart_stacks_the_five_components(result):
    fig = charts.breakdown_chart(result, top=5)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "step time (s)"
    # the five components, and the fixed-cost overhead term when the plans have one (launch gaps: always)
    has_overhead = bool(np.any(result.columns["overhead_s"][result.ranking[:5]]))
    expected = charts.COMPONENTS + ((charts.OVERHEAD,) if has_overhead else ())
    bars = [c for c in ax.containers if hasattr(c, "patches")]
    assert len(bars) == len(expected)
    assert _legend(ax) == [name for _, name in expected]
    # bar ends = step times of the top plans
    ends = np.array([p.get_x() + p.get_width() for p in bars[-1].patches])
    top = result.ranking[:5]
    assert np.allclose(ends, result.columns["step_time_s"][top])
    # one whisker per bar: the 90% error band around the step time
    (band,) = [c for c in ax.containers if not hasattr(c, "patches")]
    (segments,) = band.lines[2]
    spans = np.array([seg[:, 0] for seg in segments.get_segments()])
    assert np.allclose(spans[:, 0], result.columns["step_time_s_low"][top])
    assert np.allclose(spans[:, 1], result.columns["step_time_s_high"][top])
    ticks = {t.get_text().split()[0]: t.get_position()[1] for t in ax.get_yticklabels()}
    assert sorted(ticks, key=ticks.get, reverse=True) == ["#1", "#2", "#3", "#4", "#5"]  # best on top


def test_tp_sweep_marks_the_node_boundary(problem):
    model, cluster = problem
    sweep = analysis.tp_sweep(model, cluster, 64, SPACE)
    assert sweep.x.tolist() == [1, 2, 4, 8, 16]  # the divisors of 16 heads (and of 32 GPUs)
    fig = charts.tp_sweep_chart(sweep)
    ax, mem = fig.axes[0], fig.axes[1]
    assert ax.get_ylabel() == "step time (s)" and mem.get_ylabel() == "peak memory per GPU (GiB)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
    boundary = [l for l in ax.lines if l.get_label() == "TP crosses the node boundary"]
    assert len(boundary) == 1 and boundary[0].get_xdata()[0] == 3.5  # between tp=8 and tp=16
    assert np.allclose(mem.lines[0].get_ydata(), sweep.columns["peak_memory_gib"])
    tp_comm = sweep.columns["tp_comm_s"]
    assert tp_comm[0] == 0 and np.all(tp_comm[1:] > 0)


def test_time_memory_chart_has_tp_and_pp_panels_and_front(result):
    fig = charts.time_memory_chart(result)
    left, right = fig.axes[:2]
    assert left.get_title() == "coloured by tp" and right.get_title() == "coloured by pp"
    for ax, key in ((left, "tp"), (right, "pp")):
        assert ax.get_xlabel() == "peak memory per GPU (GiB)" and ax.get_ylabel() == "step time (s)"
        labels = _legend(ax)
        assert "Pareto front" in labels
        values = np.unique(result.columns[key][result.columns["fits_effective"]])
        assert [l for l in labels if l.startswith(f"{key}=")] == [f"{key}={v}" for v in values]
        front = [l for l in ax.lines if l.get_label() == "Pareto front"][0]
        assert np.allclose(front.get_xdata(), result.columns["peak_memory_gib"][result.pareto_time_memory()])
    ranked_fit = int(result.columns["fits_effective"][result.ranking].sum())
    assert sum(len(c.get_offsets()) for c in left.collections) == min(ranked_fit, charts.MAX_SCATTER)


def test_scaling_chart_has_throughput_and_mfu(problem):
    model, _ = problem
    clusters = [load_cluster("dgx-a100", gpus=n) for n in (8, 16, 32)]
    sweep = analysis.scaling(model, clusters, 64, SPACE)
    fig = charts.scaling_chart(sweep)
    ax, mfu = fig.axes[0], fig.axes[1]
    assert ax.get_ylabel() == "throughput (tokens/s)" and mfu.get_ylabel() == "MFU (%)"
    assert ax.get_xscale() == "log"
    assert np.allclose(ax.lines[0].get_xdata(), [8, 16, 32])
    assert np.allclose(ax.lines[0].get_ydata(), sweep.columns["tokens_per_s"])
    assert np.allclose(mfu.lines[0].get_ydata(), 100 * sweep.columns["mfu"])
    assert sweep.columns["tokens_per_s"][-1] > sweep.columns["tokens_per_s"][0]


def test_bandwidth_heatmap_grid_and_figure(problem):
    model, cluster = problem
    base = inter_node_bandwidth_GBps(cluster)
    assert base == pytest.approx(25.0)  # 8 HDR NICs of 25 GB/s for 8 GPUs
    grid = analysis.bandwidth_grid(model, cluster, 64, scale_inter_node_bandwidth, base, SPACE,
                                   scales=(0.5, 1.0, 4.0))
    assert grid.tp_share.shape == (grid.tp.size, 3)
    i16 = int(np.flatnonzero(grid.tp == 16)[0])
    # TP across nodes: more network bandwidth, smaller TP share and shorter steps
    assert grid.tp_share[i16, 0] > grid.tp_share[i16, 2]
    assert grid.step_time_s[i16, 0] > grid.step_time_s[i16, 2]
    i1 = int(np.flatnonzero(grid.tp == 1)[0])
    assert np.all(grid.tp_share[i1] == 0)
    fig = charts.bandwidth_heatmap(grid)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "tensor-parallel degree"
    assert ax.images[0].get_array().shape == grid.tp_share.shape
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(t) for t in grid.tp]


def test_network_variant_scales_only_network_links():
    cluster = load_cluster("dgx-a100", gpus=16)
    variant = scale_inter_node_bandwidth(cluster, 2.0)
    assert variant.fingerprint() != cluster.fingerprint()
    for (u, v), attrs in cluster.edge_table.items():
        ratio = variant.edge_table[(u, v)].bw_GBps / attrs.bw_GBps
        assert ratio == pytest.approx(2.0 if attrs.type == "ib" else 1.0)
    assert scale_inter_node_bandwidth(cluster, 1.0) is cluster


def test_save_figure_writes_png_and_svg(result, tmp_path):
    paths = charts.save_figure(charts.breakdown_chart(result, top=3), tmp_path / "b")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and b"<svg" in paths[1].read_bytes()[:400]
