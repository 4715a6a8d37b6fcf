"""Issue 26, paths and outputs: a file that appears at a checked destination during the work is kept (the run
is refused, not silently replaced); `export --format all` writes every format or none; a graph name cannot
leave the output folder (tests/test_inputs_code.py)."""

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.io import atomic_write_text

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
        "--tp", "8", "--no-progress", "--no-cache"]


def test_no_clobber_write_keeps_a_file_that_appeared(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("theirs")
    with pytest.raises(InputError, match="appeared while tpsim was working"):
        atomic_write_text(path, "mine", "--csv", overwrite=False)
    assert path.read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]
    atomic_write_text(path, "mine", "--csv", overwrite=True)
    assert path.read_text() == "mine"


def test_plan_csv_created_during_the_search_is_not_replaced(tmp_path, capsys, monkeypatch):
    import tpsim.search as search_pkg

    csv = tmp_path / "plans.csv"
    real = search_pkg.search

    def search_and_meddle(*args, **kwargs):
        result = real(*args, **kwargs)
        csv.write_text("someone else's")
        return result

    monkeypatch.setattr(search_pkg, "search", search_and_meddle)
    assert main(PLAN + ["--csv", str(csv)]) == 2
    assert "appeared while tpsim was working" in capsys.readouterr().err
    assert csv.read_text() == "someone else's"


def test_export_all_writes_every_format_or_none(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "nemo").mkdir(parents=True)
    (out / "nemo" / "nemo_megatron_gpt.yaml").write_text("keep")
    argv = ["export", "--format", "all", "--out", str(out), "--model", "llama3-8b", "--cluster", "h100-pcie",
            "--gpus", "16", "--tp", "2"]
    assert main(argv) == 2
    assert "already holds" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["nemo"]  # no other format was written
    assert (out / "nemo" / "nemo_megatron_gpt.yaml").read_text() == "keep"
    assert main(argv + ["--force"]) == 0
    capsys.readouterr()
    assert len([p for p in out.iterdir() if p.is_dir()]) >= 2
