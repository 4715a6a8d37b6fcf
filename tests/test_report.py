"""`tpsim report`: a Markdown report with the five charts and their tables, from the CLI."""

from __future__ import annotations

import json

from tpsim.cli import main
from tpsim.report.markdown import CHART_FILES, md_table


def test_report_cli_writes_markdown_charts_and_tables(tmp_path, capsys):
    out = tmp_path / "rep"
    argv = ["report", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "16", "--global-batch", "32",
            "--vpp", "1", "--micro-batch", "1", "--order", "tp-dp-pp", "--zero", "0", "1", "--out", str(out),
            "--quiet", "--top", "5"]
    assert main(argv) == 0
    text = (out / "README.md").read_text()
    for name in CHART_FILES:
        assert f"]({name}.png)" in text and f"`{name}.csv`" in text
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").exists()
        assert len((out / f"{name}.csv").read_text().splitlines()) > 1  # the text twin: a header and rows
    for heading in ("## Best plans", "## Rejected plans", "## Step time vs. memory", "## Tensor-parallel degree sweep",
                    "## Scaling and cost", "## What would more inter-node bandwidth buy?"):
        assert heading in text
    summary = json.loads((out / "summary.json").read_text())
    best = summary["plans"][0]
    assert f"{best['step_time_s']:.3f}" in text  # the table shows the planner's number
    assert (out / "plans.csv").read_text().startswith("rank,")
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    # the scaling study spans below and above the 16 GPUs asked (8 = one node .. 16 x 8)
    scaling = (out / "scaling.csv").read_text().splitlines()
    gpus = [int(line.split(",")[0]) for line in scaling[1:]]
    assert min(gpus) < 16 < max(gpus) and "16 GPUs asked about" in text


def test_report_bad_input_is_one_line(tmp_path, capsys):
    argv = ["report", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "9", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "9" in err and len(err.strip().splitlines()) == 1


def test_md_table():
    text = md_table(("a", "b"), [[1, "x"], [2.5, "y"]])
    assert text.splitlines()[1] == "|---:|:---|"
    assert "| 2.50 | y |" in text


def test_report_scaling_span_option(tmp_path, capsys):
    out = tmp_path / "rep"
    argv = ["report", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "16", "--global-batch", "32",
            "--vpp", "1", "--micro-batch", "1", "--order", "tp-dp-pp", "--zero", "1", "--recompute", "none",
            "--out", str(out), "--quiet", "--scaling-span", "2"]
    assert main(argv) == 0
    gpus = [int(line.split(",")[0]) for line in (out / "scaling.csv").read_text().splitlines()[1:]]
    assert gpus == [8, 16, 32]
    assert main(argv[:-1] + ["0", "--force"]) == 2
    assert "--scaling-span=0" in capsys.readouterr().err
