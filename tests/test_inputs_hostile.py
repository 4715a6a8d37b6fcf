"""Issue 26, a fresh hostile round (w7): bytes that are not what a file format says (a BOM, NUL bytes, invalid
UTF-8, CRLF, nothing), inputs that are not regular files (a FIFO, /dev/zero behind a symlink), and flags
with empty, negative, full-width or overflowing values: one line and status 2 each, never a hang."""

import os

import pytest

from tpsim.cli import main

BASE = ["estimate", "--cluster", "dgx-h100", "--gpus", "8"]
FILES = {
    "bom.json": b'\xef\xbb\xbf{"model_type": "llama", "hidden_size": 4096}',
    "nul.json": b'{"model_type": "llama",\r\n"hidden_size": 4096}\x00',
    "utf8.json": b'{"model_type": "ll\xffama"}',
    "empty.json": b"",
}


@pytest.fixture
def hostile(tmp_path):
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "crlf.yaml").write_bytes(b"gpus: 8\r\nnodes: [1, \x00]\r\n")
    return tmp_path


CASES = [[*BASE, "--model", "{d}/" + name] for name in (*FILES, "fifo.json", "zero.json")] + [
    ["estimate", "--model", "llama3-8b", "--cluster", "{d}/crlf.yaml", "--gpus", "8"],
    [*BASE, "--model", "llama3-8b", "--calibration", "{d}/fifo.json"],
    [*BASE, "--model", "llama3-8b", "--stack", "{d}/zero.json"],
    [*BASE, "--model", ""], ["estimate", "--model", "llama3-8b", "--cluster", "", "--gpus", "8"],
    ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "\uff18"],
    [*BASE, "--model", "llama3-8b", "--seq-len", "1e400"], [*BASE, "--model", "llama3-8b", "--tp", ""],
    [*BASE, "--model", "llama3-8b", "--micro-batch", "-0"], ["collective", "--gpus", "9" * 20],
    ["topo", "show", "dgx-a100", "--gpus", "inf"],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a)[:60])
def test_hostile_input_is_one_line_and_status_2(hostile, capsys, argv):
    assert main([a.replace("{d}", str(hostile)) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
