"""Issue 13, outputs: every writer checks its destination before the work, writes atomically (an interrupt
leaves the old file or the whole new one), and never replaces an existing report, README or output file
without --force; measurements are never lost to a bad path."""

import os
from pathlib import Path

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.io import atomic_write_bytes, atomic_write_text, atomic_writer, check_output_dir, check_output_file

ROOT = Path(__file__).resolve().parents[1]
UNWRITABLE = Path("/sys/kernel") if os.geteuid() == 0 else None  # root writes through permission bits
QUICK = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
BENCH_CSV = "backend,op,nranks,bytes,time_s\n" + "".join(
    f"gloo,all_reduce,2,{b},{t}\n" for b, t in ((4096, 3e-4), (65536, 6e-4), (1 << 20, 4e-3), (4 << 20, 1.5e-2)))


def _unwritable(tmp_path: Path) -> Path:
    if UNWRITABLE is not None:
        return UNWRITABLE
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# ------------------------------------------------------------------------------------------------- checks
def test_check_output_file(tmp_path):
    (tmp_path / "old.csv").write_text("mine")
    cases = {"": "empty", str(tmp_path): "is a folder", str(tmp_path / "no" / "x.csv"): "does not exist",
             str(tmp_path / "old.csv"): "already exists; pass --force",
             str(_unwritable(tmp_path) / "x.csv"): "cannot create files"}
    for path, needle in cases.items():
        with pytest.raises(InputError, match=needle):
            check_output_file(path, "--out")
    assert check_output_file(tmp_path / "old.csv", "--out", force=True) == tmp_path / "old.csv"
    assert check_output_file(tmp_path / "a" / "b.csv", "--out", create_parent=True) == tmp_path / "a" / "b.csv"
    with pytest.raises(InputError, match="unknown file type '.docx'"):
        check_output_file(tmp_path / "x.docx", "--out", suffixes=(".png",))
    assert check_output_file("/dev/null", "--out") == Path("/dev/null")  # written in place, never replaced


def test_check_output_dir(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "README.md").write_text("# mine\n")
    cases = {"": "empty", str(tmp_path / "f"): "is a file", str(tmp_path / "f" / "sub"): "is a file",
             str(tmp_path / "r"): "already holds README.md; pass --force",
             str(_unwritable(tmp_path) / "r"): "cannot create files"}
    for path, needle in cases.items():
        with pytest.raises(InputError, match=needle):
            check_output_dir(path, "--out")
    assert check_output_dir(tmp_path / "r", "--out", force=True) == tmp_path / "r"
    assert check_output_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not created


# ------------------------------------------------------------------------------------------------- atomic
def test_atomic_write_replaces_whole_files_only(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_writer(path, "wb") as f:
            f.write(b"half of the new cont")
            raise KeyboardInterrupt  # Ctrl-C in the middle of writing
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # the temporary file is gone
    atomic_write_bytes(path, b"new\n")
    assert path.read_bytes() == b"new\n" and oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_atomic_write_errors_are_one_line(tmp_path):
    with pytest.raises(InputError, match="cannot write"):
        atomic_write_text(tmp_path / "missing" / "x", "x")
    with pytest.raises(InputError, match="No space left"):
        atomic_write_text("/dev/full", "x" * 100_000)
    assert Path("/dev/null").exists() and not Path("/dev/null").is_file()
    atomic_write_text("/dev/null", "x")  # a device is written in place: /dev/null stays a device
    assert not Path("/dev/null").is_file()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_charts_are_written_atomically(tmp_path, monkeypatch):
    """A failure (Ctrl-C, a full disk) while a chart is written leaves the previous chart whole."""
    from matplotlib.figure import Figure

    import tpsim.io as tio
    from tpsim.report.charts import save_figure

    fig = Figure()
    fig.subplots().plot([1, 2, 3])
    stem = tmp_path / "chart"
    save_figure(fig, stem)
    before = (tmp_path / "chart.png").read_bytes()
    assert before.endswith(b"IEND\xaeB`\x82")
    original = tio.os.fsync

    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(tio.os, "fsync", interrupted)
    fig.subplots().plot([3, 2, 1])
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig, stem)
    monkeypatch.setattr(tio.os, "fsync", original)
    assert (tmp_path / "chart.png").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png", "chart.svg"]


# ------------------------------------------------------------------------------------------------- verbs
def test_report_never_overwrites_a_readme_and_checks_first(capsys, tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "README.md").write_text("# my notes\n")
    (tmp_path / "f").write_text("x")
    base = ["report", *QUICK, "--tp", "8", "--global-batch", "64", "--quiet"]
    for out, needle in ((tmp_path / "r", "already holds README.md; pass --force"), (tmp_path / "f", "is a file"),
                        ("", "empty"), (_unwritable(tmp_path) / "r", "cannot create files")):
        assert main([*base, "--out", str(out)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "r" / "README.md").read_text() == "# my notes\n"


def test_plan_csv_destination(capsys, tmp_path):
    (tmp_path / "old.csv").write_text("mine")
    base = ["plan", *QUICK, "--tp", "8", "--global-batch", "64", "--no-progress", "--no-cache"]
    for out, needle in ((tmp_path, "is a folder"), (tmp_path / "no" / "x.csv", "does not exist"),
                        (tmp_path / "old.csv", "pass --force"), ("", "empty"),
                        (_unwritable(tmp_path) / "x.csv", "cannot create files")):
        assert main([*base, "--csv", str(out)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and "--csv" in err[0] and needle in err[0], err
    assert (tmp_path / "old.csv").read_text() == "mine"
    assert main([*base, "--csv", str(tmp_path / "old.csv"), "--force"]) == 0
    assert (tmp_path / "old.csv").read_text().startswith("rank,tie,tp,")


def test_topo_draw_destination(capsys, tmp_path):
    (tmp_path / "mine.png").write_text("precious")
    for out, needle in ((tmp_path / "x.docx", "unknown file type"), (tmp_path, "is a folder"),
                        (tmp_path / "mine.png", "pass --force"), (tmp_path / "no" / "x.png", "does not exist")):
        assert main(["topo", "draw", "dgx-a100", "--gpus", "16", "--out", str(out)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "mine.png").read_text() == "precious"


def test_calibrate_out_is_checked_before_the_fit(capsys, tmp_path):
    (tmp_path / "m.csv").write_text(BENCH_CSV)
    for out, needle in ((tmp_path, "is a folder"), (tmp_path / "m.csv", "pass --force"),
                        ("/dev/full", "No space left")):
        assert main(["calibrate", str(tmp_path / "m.csv"), "--cluster", "local-cpu", "--out", str(out)]) == 2
        err = _err(capsys)
        assert "--out" in err[-1] and needle in err[-1], err
    assert (tmp_path / "m.csv").read_text() == BENCH_CSV  # its own input is never overwritten


def test_bench_out_is_checked_before_measuring(capsys, tmp_path):
    """No rank starts (no torch import here) when the CSV could not be written."""
    for out, needle in ((tmp_path, "is a folder"), (tmp_path / "no" / "x.csv", "does not exist"),
                        (_unwritable(tmp_path) / "x.csv", "cannot create files")):
        assert main(["bench-collectives", "--out", str(out)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and needle in err[0], err


def test_bench_measurements_go_to_a_named_fallback(capsys, tmp_path, monkeypatch):
    """A destination that breaks during the run: the rows are saved elsewhere and the line says where."""
    from tpsim.bench import collectives as bench

    rows = [bench.Measurement("gloo", "all_reduce", 2, 4096, 1e-4)]
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: rows)
    out = tmp_path / "x.csv"
    real = bench.write_csv

    def flaky(r, path):
        if path is not None and Path(path) == out:
            raise InputError(f"--out {out}: cannot write (No space left on device)")
        return real(r, path)
    monkeypatch.setattr(bench, "write_csv", flaky)
    assert main(["bench-collectives", "--out", str(out)]) == 2
    err = _err(capsys)[-1]
    spare = Path(err.split("saved to ")[1])
    assert spare.read_text().splitlines()[1] == "gloo,all_reduce,2,4096,0.0001"
    spare.unlink()


def test_profile_destination(capsys, tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    for out, needle in ((tmp_path, "is a folder"), ("/dev/full", "not a regular file"),
                        (tmp_path / "x.csv", "not a tpsim profile"),
                        (_unwritable(tmp_path) / "p.csv", "cannot create files")):
        assert main(["profile", "--grid", "tiny", "--out", str(out)]) == 2
        err = _err(capsys)
        assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "x.csv").read_text() == "a,b\n1,2\n"


def test_profile_writer_keeps_rows_on_a_write_failure(tmp_path):
    from tpsim.compute.profile import ProfilePoint
    from tpsim.profiler.store import ProfileWriter

    meta = {"format_version": 1, "device": "cpu", "device_type": "cpu", "torch_version": "x", "threads": 1,
            "date": "d", "tpsim_version": "v"}
    point = ProfilePoint(kind="memory", op="add", dtype="fp32", pass_="fwd", dims=(1024,), time_s=1e-6, reps=3,
                         spread_pct=1.0)
    path = tmp_path / "p.csv"
    writer = ProfileWriter(path, meta)
    writer.append(point)

    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")
    good, writer._file = writer._file, Full()
    with pytest.raises(InputError, match="1 points measured so far are kept"):
        writer.append(point)
    good.close()
    assert path.read_text().endswith("\n") and path.read_text().count("memory,add") == 1


EXPORT_ALL = ["export", "--format", "all", "--model", "llama3-8b", "--cluster", "h100-pcie", "--gpus", "16",
              "--tp", "2", "--zero", "3", "--no-predict"]


def test_export_all_refuses_a_non_empty_folder_before_any_work(tmp_path, capsys, monkeypatch):
    """Issue 26: `export --format all` into a folder that holds anything adds nothing without --force, and says
    so before the model is built."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    import tpsim.cli.export as export

    monkeypatch.setattr(export, "build_model", lambda _args: pytest.fail("work done before the refusal"))
    assert main([*EXPORT_ALL, "--out", str(out)]) == 2
    lines = _err(capsys)
    assert len(lines) == 1 and "already holds notes.txt" in lines[0] and "--force" in lines[0]
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_export_all_is_all_or_nothing(tmp_path, capsys, monkeypatch):
    """A write that fails part-way leaves no folder and no stage behind; a clean run makes every format."""
    import tpsim.launch as launch

    real, calls = launch.write_files, []

    def failing(files, out_dir, force=False):
        calls.append(out_dir)
        if len(calls) == 3:
            raise InputError(f"--out {out_dir}: disk full")
        return real(files, out_dir, force=force)

    monkeypatch.setattr(launch, "write_files", failing)
    out = tmp_path / "run"
    assert main([*EXPORT_ALL, "--out", str(out)]) == 2
    assert "disk full" in _err(capsys)[0]
    assert not out.exists() and os.listdir(tmp_path) == []
    monkeypatch.setattr(launch, "write_files", real)
    out.mkdir()  # an empty folder is fine
    assert main([*EXPORT_ALL, "--out", str(out)]) == 0
    capsys.readouterr()
    assert len(os.listdir(out)) >= 4 and os.listdir(tmp_path) == ["run"]
