"""The five charts: the Figure objects have the expected axes, series and markers (not just a file), every
label lies inside the figure and no two overlap, each chart's text twin holds the numbers it draws, and error
bands appear as error bars when the estimator gives them."""

from __future__ import annotations

import io
import os

import numpy as np
import pandas as pd
import pytest

from tpsim.estimator import estimate_batch
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


@pytest.fixture(scope="module")
def sweep(problem):
    model, cluster = problem
    return analysis.tp_sweep(model, cluster, 64, SPACE)


@pytest.fixture(scope="module")
def scaled(problem):
    model, _ = problem
    clusters = analysis.scaling_counts(32, lambda n: load_cluster("dgx-a100", gpus=n), span=8)
    return analysis.scaling(model, clusters, 64, SPACE, reference=32)


@pytest.fixture(scope="module")
def grid(problem):
    model, cluster = problem
    base = inter_node_bandwidth_GBps(cluster)
    return analysis.bandwidth_grid(model, cluster, 64, scale_inter_node_bandwidth, base, SPACE,
                                   scales=(0.25, 0.5, 1.0, 4.0))


def _legend(fig_or_ax) -> list[str]:
    legends = fig_or_ax.legends if hasattr(fig_or_ax, "legends") and fig_or_ax.legends else [fig_or_ax.get_legend()]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def _drawn_texts(fig) -> list:
    """(text artist, window extent) of every text the renderer actually draws (tick labels outside the view
    are Text objects too, but never drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    drawn = []
    original = Text.draw

    def spy(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return original(self, renderer)

    Text.draw = spy
    try:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
    finally:
        Text.draw = original
    renderer = canvas.get_renderer()
    return [(t, t.get_window_extent(renderer)) for t in drawn]


def assert_labels_readable(fig) -> None:
    """Every drawn text lies inside the figure (nothing clipped at an edge) and no two texts overlap by more
    than a pixel each way."""
    texts = _drawn_texts(fig)
    assert texts
    box = fig.bbox
    outside = [t.get_text() for t, e in texts
               if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y1 > box.y1 + 0.5]
    assert not outside, f"clipped: {outside}"
    overlaps = []
    for a in range(len(texts)):
        for b in range(a + 1, len(texts)):
            ea, eb = texts[a][1], texts[b][1]
            dx = min(ea.x1, eb.x1) - max(ea.x0, eb.x0)
            dy = min(ea.y1, eb.y1) - max(ea.y0, eb.y0)
            if dx > 1 and dy > 1:
                overlaps.append((texts[a][0].get_text(), texts[b][0].get_text()))
    assert not overlaps, f"overlapping: {overlaps}"


# ---- the five charts ---------------------------------------------------------------------------------------
def test_breakdown_chart_stacks_the_components(result):
    fig = charts.breakdown_chart(result, top=5)
    ax = fig.axes[0]
    table = charts.breakdown_table(result, top=5)
    names = [name for key, name in charts.COMPONENTS if key in table]
    assert ax.get_xlabel() == "step time (s)"
    bars = [c for c in ax.containers if c.get_label() != "error band"]
    assert len(bars) == len(names) >= 5
    assert _legend(fig)[:len(names)] == names
    # bar ends = step times of the top plans = the twin's step_time_s
    ends = np.array([p.get_x() + p.get_width() for p in bars[-1].patches])
    assert np.allclose(ends, result.columns["step_time_s"][result.ranking[:5]])
    assert np.allclose(ends, table["step_time_s"])
    ticks = {t.get_text().split()[0]: t.get_position()[1] for t in ax.get_yticklabels()}
    assert sorted(ticks, key=ticks.get, reverse=True) == ["#1", "#2", "#3", "#4", "#5"]  # best on top
    # the estimator gives every plan its 90% band: one whisker per bar, from step_time_s_low to _high
    (band,) = [c for c in ax.containers if c.get_label() == "error band"]
    (segments,) = band.lines[2]
    spans = np.array([seg[:, 0] for seg in segments.get_segments()])
    assert np.allclose(spans[:, 0], table["step_time_s_low"]) and np.allclose(spans[:, 1], table["step_time_s_high"])
    assert_labels_readable(fig)


def test_tp_sweep_marks_the_node_boundary(sweep):
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
    table = charts.tp_sweep_table(sweep)
    assert table["crosses_nodes"].tolist() == [False, False, False, False, True]
    assert_labels_readable(fig)


def test_time_memory_chart_has_tp_and_pp_panels_and_front(result):
    fig = charts.time_memory_chart(result)
    left, right = fig.axes[:2]
    table = charts.time_memory_table(result)
    assert left.get_title() == "coloured by tp" and right.get_title() == "coloured by pp"
    for ax, key in ((left, "tp"), (right, "pp")):
        assert ax.get_xlabel() == "peak memory per GPU (GiB)" and ax.get_ylabel() == "step time (s)"
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "Pareto front" in labels
        values = np.unique(result.columns[key][result.columns["fits_effective"]])
        assert [l for l in labels if l.startswith(f"{key}=")] == [f"{key}={v}" for v in values]
        front = [l for l in ax.lines if l.get_label() == "Pareto front"][0]
        assert np.allclose(front.get_xdata(), result.columns["peak_memory_gib"][result.pareto_time_memory()])
        assert np.allclose(front.get_xdata(), table.loc[table["pareto_front"], "peak_memory_gib"])
    ranked_fit = int(result.columns["fits_effective"][result.ranking].sum())
    from matplotlib.collections import PathCollection  # the scatter points (the error band adds line collections)
    points = sum(len(c.get_offsets()) for c in left.collections if isinstance(c, PathCollection))
    assert points == len(table) == min(ranked_fit, charts.MAX_SCATTER)
    assert_labels_readable(fig)


def test_scaling_spans_below_and_above_the_gpus_asked(scaled):
    sweep, result = scaled
    assert sweep.searched == (8, 16, 32, 64, 128, 256)  # 32 / 4 (one node of 8) .. 32 x 8
    assert sweep.reference == 32 and sweep.x.min() < 32 < sweep.x.max()
    fig = charts.scaling_chart(sweep)
    ax, mfu = fig.axes[0], fig.axes[1]
    assert ax.get_ylabel() == "throughput (tokens/s)" and mfu.get_ylabel() == "MFU (%)"
    assert ax.get_xscale() == "log"
    assert np.allclose(ax.lines[0].get_xdata(), sweep.x)
    assert np.allclose(ax.lines[0].get_ydata(), sweep.columns["tokens_per_s"])
    assert np.allclose(mfu.lines[0].get_ydata(), 100 * sweep.columns["mfu"])
    marker = [l for l in ax.lines if l.get_label() == "--gpus 32"]
    assert len(marker) == 1 and marker[0].get_xdata()[0] == 32
    assert sweep.columns["tokens_per_s"][-1] > sweep.columns["tokens_per_s"][0]
    table = charts.scaling_table(sweep)
    assert table["asked"].tolist() == [g == 32 for g in sweep.x]
    # at one GPU count the fastest plan is the cheapest: the sweep's cost is the count's minimum
    c = result.columns
    for g, cost in zip(table["gpus"], table["cost_per_mtok"]):
        rows = result.ranking[c["gpus"][result.ranking] == g]
        assert cost == pytest.approx(c["cost_per_mtok"][rows].min())
    assert_labels_readable(fig)


def test_scaling_counts_skip_what_the_cluster_refuses():
    counts = analysis.scaling_counts(16, lambda n: load_cluster("dgx-a100", gpus=n), span=8)
    assert [c.num_gpus for c in counts] == [8, 16, 32, 64, 128]  # 2 and 4 GPUs are not whole nodes
    assert [c.num_gpus for c in analysis.scaling_counts(24, lambda n: load_cluster("dgx-a100", gpus=n), 2)] \
        == [24, 48]  # 12 GPUs are not whole nodes
    # a job smaller than a node is accepted, but a study of whole nodes leaves it out unless it is the one asked
    assert [c.num_gpus for c in analysis.scaling_counts(4, lambda n: load_cluster("dgx-a100", gpus=n), 4)] \
        == [4, 8, 16]


def test_bandwidth_heatmap_shows_the_best_plans_step_time(grid):
    step = grid.step_time_s
    assert step.shape == (grid.tp.size, 4)
    # more network bandwidth never makes the best plan of a row slower: each row only improves
    assert np.all(np.diff(step, axis=1) <= 1e-12 * step[:, 1:])
    i16 = int(np.flatnonzero(grid.tp == 16)[0])
    assert step[i16, 0] > step[i16, -1]  # TP across nodes gains from faster links
    assert np.nanmin(np.where(grid.fits, grid.slowdown, np.nan)) == pytest.approx(1.0)
    fig = charts.bandwidth_heatmap(grid)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "tensor-parallel degree"
    assert np.allclose(ax.images[0].get_array(), grid.slowdown)
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(t) for t in grid.tp]
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    for i in range(grid.tp.size):
        for j in range(grid.scales.size):
            text = cells[(i, j)]
            assert text.startswith(f"{grid.slowdown[i, j]:.2f}x") and f"{step[i, j]:.2f} s" in text
            label = grid.labels[i][j]
            assert f"pp{label.split('pp')[1].split()[0]}" in text  # the cell names its plan
    framed = [p for p in ax.patches if p.get_label() == "best cell"]
    assert len(framed) == 1
    row, col = grid.best_cell
    assert framed[0].get_xy() == (col - 0.5, row - 0.5)
    fastest = np.nanmin(np.where(grid.fits, step, np.nan))
    assert step[row, col] <= fastest * (1 + analysis.BEST_CELL_RTOL)  # the best, reached first (least bandwidth) ...
    assert not np.any(grid.fits[:, :col] & (step[:, :col] <= fastest * (1 + analysis.BEST_CELL_RTOL)))  # ... no cheaper link has it
    assert f"{grid.slowdown[row, col]:.2f}" == "1.00"  # the box never frames a cell that reads slower
    table = charts.bandwidth_table(grid)
    assert len(table) == step.size and np.allclose(table["step_time_s"], step.ravel())
    assert_labels_readable(fig)


def test_network_variant_scales_only_network_links():
    cluster = load_cluster("dgx-a100", gpus=16)
    variant = scale_inter_node_bandwidth(cluster, 2.0)
    assert variant.fingerprint() != cluster.fingerprint()
    for (u, v), attrs in cluster.edge_table.items():
        ratio = variant.edge_table[(u, v)].bw_GBps / attrs.bw_GBps
        assert ratio == pytest.approx(2.0 if attrs.type == "ib" else 1.0)
    assert scale_inter_node_bandwidth(cluster, 1.0) is cluster


def test_labels_stay_inside_with_long_labels(problem):
    """Many bars with long plan labels and unfitting cells (GPT-3 175B on 64 GPUs: most plans do not fit)."""
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100", gpus=64)
    space = SearchSpace(vpp=(1, 2), micro_batch=(1,), order=("tp-dp-pp", "dp-tp-pp"), zero=(1, 3))
    result = search(model, cluster, 64, space=space, include_unfit=True)
    assert_labels_readable(charts.breakdown_chart(result, top=12))
    tight = SearchSpace(vpp=(1,), micro_batch=(1,), order=("tp-dp-pp",), zero=(0,), recompute=("none",))
    sweep = analysis.tp_sweep(model, cluster, 64, tight)
    assert not sweep.columns["fits_effective"].all()  # "does not fit" marks are drawn
    assert_labels_readable(charts.tp_sweep_chart(sweep))


# ---- text twins and error bands ----------------------------------------------------------------------------
def test_save_chart_writes_png_svg_and_csv_twin(result, tmp_path):
    table = charts.breakdown_table(result, top=3)
    paths = charts.save_chart(charts.breakdown_chart(result, top=3), table, tmp_path / "b")
    assert [p.suffix for p in paths] == [".png", ".svg", ".csv"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and b"<svg" in paths[1].read_bytes()[:400]
    back = pd.read_csv(paths[2])
    assert list(back.columns) == list(table.columns)
    assert np.allclose(back["step_time_s"], table["step_time_s"], rtol=1e-5)
    assert back["plan"].tolist() == table["plan"].tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv", "b.png", "b.svg"]  # no temporary files left
    umask = os.umask(0o022)
    os.umask(umask)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~umask for p in paths)  # as a plain open() would make them


class _Banded:
    """An estimator batch with an error band of -5 % / +10 % on the step time (and the matching tokens/s and
    MFU bands), standing in for the fidelity work's band fields (docs/SCHEMAS.md section 6)."""

    def __init__(self, batch):
        self._batch = batch
        self.step_time_s_low = batch.step_time_s * 0.95
        self.step_time_s_high = batch.step_time_s * 1.10
        self.tokens_per_s_low = batch.tokens_per_s / 1.10
        self.tokens_per_s_high = batch.tokens_per_s / 0.95
        self.mfu_low = batch.mfu / 1.10
        self.mfu_high = batch.mfu / 0.95

    def __getattr__(self, name):
        return getattr(self._batch, name)


def _banded_estimator(*args, **kw):
    return _Banded(estimate_batch(*args, **kw))


def _error_bars(ax) -> list:
    from matplotlib.container import ErrorbarContainer

    return [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.get_label() == "error band"]


def test_error_bands_are_drawn_as_error_bars(problem, monkeypatch):
    from tpsim import runfit
    from tpsim.estimator.band import ResidualBand

    # the report's studies take the residual band of `tpsim estimate` (runfit.plan_band): the same factors here
    monkeypatch.setattr(runfit, "plan_band", lambda *a, **k: ResidualBand(0.95, 1.10, {"kind": "residuals",
                                                                                      "runs": [], "n": 0,
                                                                                      "group": "test"}))
    model, cluster = problem
    result = search(model, cluster, 64, space=SPACE, estimator=_banded_estimator)
    assert "step_time_s_low" in result.columns and "tokens_per_s_high" in result.columns
    # breakdown: horizontal bars from low to high around each step time
    fig = charts.breakdown_chart(result, top=4)
    bars = _error_bars(fig.axes[0])
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    step = result.columns["step_time_s"][result.ranking[:4]]
    assert np.allclose([s[0][0] for s in segments], 0.95 * step)
    assert np.allclose([s[1][0] for s in segments], 1.10 * step)
    table = charts.breakdown_table(result, top=4)
    assert np.allclose(table["step_time_s_high"], 1.10 * step)
    assert_labels_readable(fig)
    # TP sweep, scaling and time-memory front carry them too
    sweep = analysis.tp_sweep(model, cluster, 64, SPACE, estimator=_banded_estimator)
    assert len(_error_bars(charts.tp_sweep_chart(sweep).axes[0])) == 1
    assert "step_time_s_low" in charts.tp_sweep_table(sweep)
    clusters = [load_cluster("dgx-a100", gpus=n) for n in (16, 32)]
    scaled, _ = analysis.scaling(model, clusters, 64, SPACE, reference=32, estimator=_banded_estimator)
    fig = charts.scaling_chart(scaled)
    bars = _error_bars(fig.axes[0])
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    assert np.allclose([s[1][1] for s in segments], scaled.columns["tokens_per_s"] / 0.95)
    assert {"tokens_per_s_low", "tokens_per_s_high", "mfu_low"} <= set(charts.scaling_table(scaled))
    assert_labels_readable(fig)
    assert all(len(_error_bars(ax)) == 1 for ax in charts.time_memory_chart(result).axes[:2])
    # the heat map gives the band in each cell and in its twin
    grid = analysis.bandwidth_grid(model, cluster, 64, scale_inter_node_bandwidth,
                                   inter_node_bandwidth_GBps(cluster), SPACE, scales=(1.0, 2.0),
                                   estimator=_banded_estimator)
    assert np.allclose(grid.bands["step_time_s_high"], 1.10 * grid.step_time_s)
    fig = charts.bandwidth_heatmap(grid)
    assert any(f"({0.95 * grid.step_time_s[0, 0]:.2f}-{1.10 * grid.step_time_s[0, 0]:.2f})" in t.get_text()
               for t in fig.axes[0].texts)
    assert "step_time_s_low" in charts.bandwidth_table(grid)
    assert_labels_readable(fig)


def test_tables_parse_back_as_csv(result, sweep, scaled, grid):
    for table in (charts.breakdown_table(result), charts.tp_sweep_table(sweep), charts.time_memory_table(result),
                  charts.scaling_table(scaled[0]), charts.bandwidth_table(grid)):
        text = table.to_csv(index=False)
        back = pd.read_csv(io.StringIO(text))
        assert list(back.columns) == list(table.columns) and len(back) == len(table)


def test_best_cell_is_the_least_bandwidth_that_reads_as_fast():
    """A 0.001% gain from doubling the links does not move the box; a 1% gain does (the box reads 1.00x)."""
    def grid_of(steps):
        steps = np.array([steps], dtype=float)
        return analysis.BandwidthGrid(tp=np.array([4]), scales=np.array([1.0, 2.0, 4.0]),
                                      bandwidth_GBps=np.array([50.0, 100.0, 200.0]), step_time_s=steps,
                                      labels=(("a", "b", "c"),), fits=np.ones(steps.shape, dtype=bool),
                                      tp_share=np.zeros(steps.shape), gpus_per_node=8)

    assert grid_of([60.757, 60.7566, 60.7566]).best_cell == (0, 0)
    assert grid_of([61.4, 60.7566, 60.7566]).best_cell == (0, 1)
    assert grid_of([61.4, 61.0, 60.7566]).best_cell == (0, 2)
