"""Runs CSV rows whose model is a traced op graph (``*.ops.json``, tpsim trace): read as ``tpsim estimate
--model X.ops.json`` reads it, predicted, fitted and charted; hostile cells are one line, exit 2 (issue 20)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.runs import load_runs

GRAPH = Path(__file__).parent / "data" / "opgraph" / "tiny-gpt.ops.json"
HEADER = "run_id,model,cluster,gpus,tp,pp,micro_batch,global_batch,step_time_s\n"
ROWS = ("a,graphs/tiny-gpt.ops.json,dgx-a100,8,2,1,1,16,0.010\n"
        "b,graphs/tiny-gpt.ops.json,dgx-a100,8,1,2,1,16,0.012\n"
        "c,graphs/tiny-gpt.ops.json,dgx-a100,8,2,2,2,32,0.020\n")


def _runs_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "graphs").mkdir(exist_ok=True)
    shutil.copy(GRAPH, tmp_path / "graphs" / GRAPH.name)
    p = tmp_path / "runs.csv"
    p.write_text(HEADER + text)
    return p


def test_traced_rows_load_relative_to_the_file_and_predict_as_estimate_does(tmp_path, monkeypatch, capsys):
    from tpsim.opgraph.estimate import estimate_graph
    from tpsim.opgraph.model import load_graph_model, make_graph_plan
    from tpsim.runfit import predict
    from tpsim.topology import load_cluster

    p = _runs_file(tmp_path, ROWS)
    monkeypatch.chdir(tmp_path / "graphs")  # the path is the CSV folder's, not the working directory's
    runs = load_runs(p)
    assert [r.model.family for r in runs] == ["opgraph"] * 3 and runs[2].plan.dp == 2
    cluster = load_cluster("dgx-a100", gpus=8)
    model = load_graph_model(GRAPH).with_gpus(8)
    direct = estimate_graph(model, cluster, make_graph_plan(model, 8, global_batch=16, tp=2, pp=1, micro_batch=1))
    assert predict(runs[0]).step_time_s == pytest.approx(direct.step_time_s, rel=1e-9)
    # the fit's factors apply (host time per layer: 1 ms on a ms-long step)
    assert predict(runs[0], {"host_overhead_per_layer_us": 1000.0}).step_time_s > 1.5 * direct.step_time_s
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-runs", str(p), "--out", str(out)]) == 0
    assert out.exists() and "leave-one-out" in capsys.readouterr().out
    rep = tmp_path / "rep"
    assert main(["report", "--runs", str(p), "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "8",
                 "--out", str(rep), "--quiet"]) == 0
    lines = (rep / "runs_predicted.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[1].startswith("a,")


@pytest.mark.parametrize("cell,extra,message", [
    ("graphs/missing.ops.json", "", "no such file"),
    ("graphs", "", ""),  # not an op graph name: the model loader's own refusal
    ("dir.ops.json", "", "folder"),
    ("graphs/tiny-gpt.ops.json", "cp", "no context or expert parallelism"),
    ("graphs/tiny-gpt.ops.json", "layers", "a traced model's shapes are its op graph's"),
])
def test_hostile_traced_rows_are_one_line(tmp_path, capsys, cell, extra, message):
    (tmp_path / "dir.ops.json").mkdir()
    header = HEADER.rstrip("\n") + (f",{extra}\n" if extra else "\n")
    value = {"cp": ",2", "layers": ",4"}.get(extra, "")
    p = _runs_file(tmp_path, f"a,{cell},dgx-a100,8,2,1,1,16,0.010{value}\n")
    p.write_text(header + f"a,{cell},dgx-a100,8,2,1,1,16,0.010{value}\n")
    with pytest.raises(InputError) as err:
        load_runs(p)
    text = str(err.value)
    assert "\n" not in text and "row 2 (a)" in text and message in text
    assert main(["calibrate", "--from-runs", str(p), "--out", str(tmp_path / "c.yaml")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_huge_op_graph_is_refused_by_the_bounded_reader(tmp_path, monkeypatch):
    import tpsim.limits

    p = _runs_file(tmp_path, ROWS[:ROWS.index("\n") + 1])
    monkeypatch.setattr(tpsim.limits, "MAX_OPGRAPH_BYTES", 100)
    with pytest.raises(InputError) as err:
        load_runs(p)
    assert "\n" not in str(err.value) and "row 2 (a)" in str(err.value)
