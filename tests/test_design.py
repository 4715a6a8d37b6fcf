"""``tpsim design`` (issue 24): sweep files and their refusals, the table, frontier and charts, identical tables
for one process, a local pool and Ray, resuming an interrupted sweep, a worker that dies, ``--explain``."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tpsim.cli import main
from tpsim.design import load_sweep, run_sweep, tasks_of
from tpsim.design.build import cluster_files, load_design_cluster
from tpsim.design.engine import CRASH_ENV, RESULTS
from tpsim.design.evaluate import scaled_model
from tpsim.design.objective import train_figures
from tpsim.design.sweep import MAX_DESIGNS
from tpsim.errors import InputError
from tpsim.model import load_model

SMALL = {"name": "small",
         "axes": {"device": ["H200", "B200"], "nic_gbps": [400, 800], "gpus": [16, 32], "gpu_hour_price": [2, 3]},
         "models": [{"model": "llama3-8b", "tokens": 1e11, "global_batch": 64}]}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def _table(folder: Path) -> str:
    return (folder / "table.csv").read_text()


# ---------------------------------------------------------------------------------------------- sweep files
def test_sweep_expands_designs_and_shares_planning_tasks():
    sweep = load_sweep(data=SMALL)
    assert len(sweep.designs) == 2 * 2 * 2 * 2
    tasks, counts = tasks_of(sweep, Path("/tmp/unused"))
    assert len(tasks) == 8 and set(counts.values()) == {2}       # a price changes the cost, not the plan
    assert len({d.id for d in sweep.designs}) == 16
    assert load_sweep(data=SMALL).designs[3].id == sweep.designs[3].id   # stable ids


@pytest.mark.parametrize("change, message", [
    ({"axes": {"device": [], "gpus": [8]}}, "axes.device is empty"),
    ({"axes": {"device": ["H9000"], "gpus": [8]}}, "axes.device='H9000' is unknown"),
    ({"axes": {"device": ["H200"], "gpus": [8], "wings": [2]}}, "axes.wings is not an axis"),
    ({"axes": {"device": ["H200"], "gpus": [8], "nvlink_domain": [72]}}, "axes.nvlink_domain=72 with axes.device=H200"),
    ({"axes": {"device": ["H200"], "gpus": [12]}}, "axes.gpus=12 with axes.nvlink_domain=8"),
    ({"axes": {"device": ["TPU-v4"], "gpus": [64], "fabric": ["fat_tree"]}}, "axes.fabric=fat_tree"),
    ({"axes": {"device": ["H200"], "gpus": [8]}, "dtype": "nvfp4"}, "dtype=nvfp4 with axes.device=H200"),
    ({"axes": {"device": ["H200"], "gpus": {"from": 8, "to": 4, "step": 8}}}, "axes.gpus: to=4 is below from=8"),
    ({"axes": {"device": ["H200"], "gpus": [8], "nic_gbps": [300]}}, "axes.nic_gbps=300 is not one of"),
    ({"models": []}, "models must be a non-empty list"),
    ({"models": ["no-such-model"]}, "models: no-such-model"),
    ({"objective": "fame"}, "objective='fame'"),
    ({"colour": "red"}, "unknown key 'colour'"),
])
def test_hostile_sweep_files_get_one_line_naming_the_axis(change, message):
    data = {**SMALL, **change}
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        load_sweep(data=data)
    assert "\n" not in str(info.value)


def test_a_huge_product_needs_the_flag_and_a_billion_is_refused_at_once():
    big = {**SMALL, "axes": {"device": ["H200"], "gpus": {"from": 8, "to": 80000, "step": 8},
                             "gpu_hour_price": {"from": 1, "to": 3, "step": 1}}}
    with pytest.raises(InputError, match=r"30,000 designs .* --allow-large-sweep"):
        load_sweep(data=big)
    assert len(load_sweep(data=big, allow_large=True).designs) == 30000 > MAX_DESIGNS
    billion = {**SMALL, "axes": {"device": ["H200"], "gpus": {"from": 8, "to": 80000, "step": 8},
                                 "gpu_hour_price": {"from": 1, "to": 10000, "step": 1},
                                 "power_w": {"from": 100, "to": 1099, "step": 1}}}
    with pytest.raises(InputError, match="above the hard limit"):
        load_sweep(data=billion, allow_large=True)


def test_skip_impossible_leaves_combinations_out():
    data = {**SMALL, "axes": {"device": ["H200", "GB200"], "nvlink_domain": [8, 72], "gpus": [144]},
            "skip_impossible": True}
    sweep = load_sweep(data=data)
    assert sweep.dropped == 2 and {(d.values["device"], d.values["nvlink_domain"]) for d in sweep.designs} == \
        {("H200", 8), ("GB200", 72)}


def test_ranges_by_step_and_factor():
    data = {**SMALL, "axes": {"device": ["H200"], "gpus": {"from": 16, "to": 128, "factor": 2},
                              "gpu_hour_price": {"from": 1.5, "to": 2.5, "step": 0.5}}}
    sweep = load_sweep(data=data)
    assert sweep.axes["gpus"] == (16, 32, 64, 128) and sweep.axes["gpu_hour_price"] == (1.5, 2.0, 2.5)


# ---------------------------------------------------------------------------------------------- clusters
def test_designs_are_clusters_of_the_topology_schema(tmp_path):
    for values in ({"device": "GB200", "nvlink_domain": 72, "nics_per_gpu": 1, "nic_gbps": 800,
                    "fabric": "rail_optimized", "oversubscription": 1, "gpus": 144},
                   {"device": "H100-SXM", "nvlink_domain": 8, "nics_per_gpu": 0.5, "nic_gbps": 200,
                    "fabric": "fat_tree", "oversubscription": 2, "gpus": 64},
                   {"device": "TPU-v5p", "nvlink_domain": 8, "nics_per_gpu": 1, "nic_gbps": 400,
                    "fabric": "torus", "oversubscription": 1, "gpus": 64}):
        cluster = load_design_cluster(values, tmp_path)
        cluster.check()
        assert cluster.num_gpus == values["gpus"] and cluster.device.name == values["device"]
    files = cluster_files({"device": "H100-SXM", "nvlink_domain": 8, "nics_per_gpu": 0.5, "nic_gbps": 200,
                           "fabric": "fat_tree", "oversubscription": 2, "gpus": 64})
    assert files["node"]["devices"]["nic"]["count"] == 4 and files["fabric"]["oversubscription"] == 2
    a = cluster_files({"device": "B200", "nvlink_domain": 8, "nics_per_gpu": 1, "nic_gbps": 400,
                       "fabric": "rail_optimized", "oversubscription": 1, "gpus": 64})
    b = cluster_files({"device": "B200", "nvlink_domain": 8, "nics_per_gpu": 1, "nic_gbps": 400,
                       "fabric": "rail_optimized", "oversubscription": 1, "gpus": 1024})
    assert a["digest"] == b["digest"]     # one cluster file for every GPU count


def test_family_scaling_and_objective():
    base = load_model("llama3-8b")
    bigger = scaled_model(base, 4.0)
    assert 3.0 < bigger.total_params() / base.total_params() < 4.5
    moe = load_model("mixtral-8x7b")
    assert scaled_model(moe, 2.0).num_experts == 16
    kw = dict(tokens=1e12, tokens_per_step=1e6, step_s=1.0, gpus=1024, gpus_per_node=8, weights_gib=2.0,
              optimizer_gib=12.0, dp=128, cp=1, zero=1, device="H200")
    fig = train_figures(**kw, gpu_hour_price=2.0, power_w=700)
    assert fig["ideal_days"] == pytest.approx(1e6 / 86400)             # 1e6 steps of 1 s
    assert fig["expected_days"] > fig["ideal_days"] and 0.5 < fig["goodput"] < 1
    assert fig["cost_usd"] == pytest.approx(fig["expected_days"] * 24 * 1024 * 2.0)
    hot = train_figures(**kw, gpu_hour_price=2.0, power_w=1400)
    assert hot["energy_mwh"] > fig["energy_mwh"] > 0 and hot["cost_usd"] == fig["cost_usd"]


# ---------------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The small sweep in this process (jobs=1): the reference table."""
    out = tmp_path_factory.mktemp("design-ref")
    result = run_sweep(load_sweep(data=SMALL), out, jobs=1, charts=True)
    return out, result


def test_table_frontier_and_charts(reference):
    out, result = reference
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert len(rows) == 16 and result.ran == 8 and all(r["fits"] == "True" for r in rows)
    assert [float(r["tokens_per_s"]) for r in rows] == sorted((float(r["tokens_per_s"]) for r in rows),
                                                              reverse=True)   # objective: throughput
    r = rows[0]
    assert 0 <= float(r["comm_share"]) < 1 and 0 <= float(r["memory_headroom"]) < 1 and r["plan"]
    assert float(r["ideal_days"]) == pytest.approx(1e11 / float(r["tokens_per_s"]) / 86400, rel=1e-3)
    days = float(r["expected_days"])
    assert days > float(r["ideal_days"]) and float(r["goodput"]) == pytest.approx(float(r["ideal_days"]) / days)
    assert float(r["cost_usd"]) == pytest.approx(days * 24 * int(r["gpus"]) * float(r["gpu_hour_price"]))
    front = list(csv.DictReader((out / "frontier.csv").open()))
    assert front and all(f["frontier"] == "True" for f in front)
    for stem in ("tradeoff", "value", "cost_time", "multiples"):
        assert (out / f"{stem}.png").stat().st_size > 1000 and (out / f"{stem}.csv").exists()


def test_parquet_matches_the_csv(reference):
    pq = pytest.importorskip("pyarrow.parquet")
    out, _ = reference
    table = pq.read_table(out / "table.parquet").to_pylist()
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [t["design"] for t in table] == [r["design"] for r in rows]
    assert [t["step_time_s"] for t in table] == [float(r["step_time_s"]) for r in rows]   # same rounding


def test_local_pool_gives_the_same_table(reference, tmp_path):
    out, _ = reference
    run_sweep(load_sweep(data=SMALL), tmp_path / "pool", jobs=2, charts=False)
    assert _table(tmp_path / "pool") == _table(out)


def test_resume_after_an_interruption_runs_only_what_is_missing(reference, tmp_path):
    out, _ = reference
    folder = tmp_path / "resume"
    folder.mkdir()
    lines = (out / RESULTS).read_text().splitlines()
    (folder / RESULTS).write_text("\n".join(lines[:3] + [lines[0]]) + "\n" + lines[3][:40])   # a dup, a cut line
    result = run_sweep(load_sweep(data=SMALL), folder, jobs=1, charts=False)
    assert result.ran == 5 and _table(folder) == _table(out)
    kept = [json.loads(x) for x in (folder / RESULTS).read_text().splitlines() if x.endswith("}")]
    assert len({k["task"] for k in kept}) == 8
    again = run_sweep(load_sweep(data=SMALL), folder, jobs=1, charts=False)
    assert again.ran == 0 and _table(folder) == _table(out)


def test_another_sweep_in_the_folder_is_refused(reference):
    out, _ = reference
    other = {**SMALL, "name": "other", "axes": {**SMALL["axes"], "gpus": [16]}}
    with pytest.raises(InputError, match="holds the results of another sweep"):
        run_sweep(load_sweep(data=other), out, jobs=1)


def test_a_worker_that_dies_is_replaced_and_its_task_retried(reference, tmp_path, monkeypatch):
    out, _ = reference
    marker = tmp_path / "crash"
    marker.mkdir()
    monkeypatch.setenv(CRASH_ENV, str(marker))
    result = run_sweep(load_sweep(data=SMALL), tmp_path / "crashy", jobs=2, charts=False)
    assert (marker / "crashed").exists() and result.ran == 8
    assert _table(tmp_path / "crashy") == _table(out)


@pytest.mark.timeout(240)
def test_ray_with_two_workers_gives_the_same_table(reference, tmp_path):
    pytest.importorskip("ray")
    out, _ = reference
    result = run_sweep(load_sweep(data=SMALL), tmp_path / "ray", jobs=2, engine="ray", charts=False)
    assert result.ran == 8 and _table(tmp_path / "ray") == _table(out)


def test_cli_runs_explains_and_refuses(capsys, reference, tmp_path):
    out, _ = reference
    rows = list(csv.DictReader((out / "table.csv").open()))
    code, text, err = _run(capsys, "design", "--out", str(out), "--explain", rows[0]["design"], rows[-1]["design"])
    assert code == 0, err
    assert "axes that differ" in text and "step time" in text and "compute" in text
    code, _, err = _run(capsys, "design", "--out", str(out), "--explain", rows[0]["design"], "dnothere")
    assert code == 2 and "no such design" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes: {device: [H200], gpus: []}\nmodels: [llama3-8b]\n")
    code, _, err = _run(capsys, "design", str(bad), "--out", str(tmp_path / "o"))
    assert code == 2 and "axes.gpus is empty" in err and "Traceback" not in err
    sweep = tmp_path / "ok.yaml"
    sweep.write_text(json.dumps({**SMALL, "axes": {"device": ["B200"], "gpus": [16]}}))
    code, text, err = _run(capsys, "design", str(sweep), "--out", str(tmp_path / "cli"), "--jobs", "1",
                           "--no-charts")
    assert code == 0, err
    assert "1 designs" in text or "1 design" in text
    assert "planning tasks" in err and (tmp_path / "cli" / "table.csv").exists()


def test_family_gives_the_largest_trainable_model(tmp_path):
    data = {"name": "fam", "axes": {"device": ["H200"], "gpus": [16]},
            "models": [{"model": "llama3-8b", "tokens": 1e11, "global_batch": 64}],
            "family": {"model": "llama3-8b", "scale": [1, 4, 1000], "global_batch": 64}}
    result = run_sweep(load_sweep(data=data), tmp_path, jobs=1, charts=False)
    row = result.rows[0]
    assert row["largest_scale"] == 4 and 25 < row["largest_params_b"] < 40
    assert 0 <= row["largest_comm_share"] < 1
