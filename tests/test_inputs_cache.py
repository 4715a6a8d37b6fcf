"""Issue 13, caches: a truncated, corrupt, foreign, hand-edited or copied planner cache entry is discarded with
one warning line and recomputed (the answer equals an uncached search); concurrent writers stay safe."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from tpsim.cli import main
from tpsim.model import load_model
from tpsim.search import SearchSpace, search
from tpsim.search import cache as cache_mod
from tpsim.topology import load_cluster

ARGV = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
        "--tp", "4", "8", "--no-progress"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "plans"


def _plan(capsys, *extra):
    code = main(ARGV + list(extra))
    out, err = capsys.readouterr()
    table = [ln for ln in out.splitlines() if "plans enumerated" not in ln]  # that line says "(cached result)"
    return code, table, err


def _entry(folder: Path) -> tuple[Path, Path]:
    npz = sorted(folder.glob("*.npz"))
    assert len(npz) == 1
    return npz[0], npz[0].with_suffix(".json")


def _edit_json(path: Path, **changes):
    header = json.loads(path.read_text())
    header["meta"].update(changes)
    path.write_text(json.dumps(header))


def _edit_npz(path: Path):
    with np.load(path) as data:
        cols = {k: data[k] for k in data.files}
    cols["step_time_s"] = cols["step_time_s"] * 0.5
    np.savez(path, **cols)  # the name ends in .npz: numpy writes it as is


def _forge(npz: Path, meta: Path, drop: str | None = None):
    """Halve the step times and recompute every checksum, as a forger who read the format would (issue 26)."""
    import hashlib

    _edit_npz(npz)
    header = json.loads(meta.read_text())
    if drop:
        del header["meta"][drop]
    header["npz_sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()
    header["meta_sha256"] = hashlib.sha256(json.dumps(header["meta"], sort_keys=True).encode()).hexdigest()
    meta.write_text(json.dumps(header))


def _fifo(path: Path):
    import os

    path.unlink()
    os.mkfifo(path)


def _link(path: Path, target: str):
    path.unlink()
    path.symlink_to(target)


DAMAGE = {
    "forged, checksums recomputed": (lambda npz, meta: _forge(npz, meta), "seal does not verify"),
    "forged meta without a field": (lambda npz, meta: _forge(npz, meta, drop="enumerated"), "seal does not verify"),
    "npz is a FIFO": (lambda npz, meta: _fifo(npz), "not a regular file"),
    "json is a FIFO": (lambda npz, meta: _fifo(meta), "not a regular file"),
    "npz links to /dev/zero": (lambda npz, meta: _link(npz, "/dev/zero"), "symbolic link"),
    "json links out of the folder": (lambda npz, meta: _link(meta, "/etc/hostname"), "symbolic link"),
    "truncated npz": (lambda npz, meta: npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2]), "checksum"),
    "garbage json": (lambda npz, meta: meta.write_bytes(b"\x00\xff{not json"), "not valid JSON"),
    "empty files": (lambda npz, meta: (npz.write_bytes(b""), meta.write_bytes(b"")), "not valid JSON"),
    "hand-edited json": (lambda npz, meta: _edit_json(meta, enumerated=7), "checksum (edited by hand?)"),
    "hand-edited npz": (lambda npz, meta: _edit_npz(npz), ".npz fails its checksum"),
    "old format": (lambda npz, meta: meta.write_text(json.dumps({"enumerated": 1, "gpus": [8]})), "format"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_discarded_with_one_warning(capsys, _cache, damage):
    code, fresh, _ = _plan(capsys, "--no-cache")
    assert code == 0
    _plan(capsys)  # fills the cache
    npz, meta = _entry(_cache)
    spoil, needle = DAMAGE[damage]
    spoil(npz, meta)
    code, table, err = _plan(capsys)
    assert code == 0 and table == fresh
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "discarded cache entry" in warnings[0] and needle in warnings[0], err
    code, table, err = _plan(capsys)  # recomputed and rewritten: a clean hit now
    assert code == 0 and table == fresh and "warning" not in err


def test_entry_of_other_inputs_is_not_used(capsys, _cache):
    """An entry copied over another key (both files) holds the other search's key: discarded."""
    code, fresh, _ = _plan(capsys, "--no-cache")
    _plan(capsys)
    npz, meta = _entry(_cache)
    main(ARGV[: ARGV.index("--tp")] + ["--tp", "2", "--no-progress"])  # another search, another entry
    capsys.readouterr()
    other = [p for p in _cache.glob("*.npz") if p != npz][0]
    npz.write_bytes(other.read_bytes())
    meta.write_bytes(other.with_suffix(".json").read_bytes())
    code, table, err = _plan(capsys)
    assert code == 0 and table == fresh and "holds the result of other inputs" in err


def test_foreign_files_and_unusable_folders_are_harmless(capsys, tmp_path, monkeypatch, _cache):
    code, fresh, _ = _plan(capsys, "--no-cache")
    _cache.mkdir(parents=True)
    (_cache / "notes.txt").write_text("mine")
    (_cache / "zzzz.json").write_text("[]")
    (_cache / "sub.json").mkdir()
    assert _plan(capsys)[:2] == (0, fresh)
    assert (_cache / "notes.txt").read_text() == "mine" and (_cache / "sub.json").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(blocker))
    code, table, err = _plan(capsys)
    assert code == 0 and table == fresh and not err.strip()


def test_key_covers_the_inputs(monkeypatch):
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    space = SearchSpace(tp=(8,))
    key = cache_mod.cache_key(model, [cluster], 64, space, "roofline", objective="time")
    other = [cache_mod.cache_key(model, [cluster], 128, space, "roofline", objective="time"),
             cache_mod.cache_key(model, [load_cluster("dgx-h100", gpus=16)], 64, space, "roofline", objective="time"),
             cache_mod.cache_key(model, [cluster], 64, SearchSpace(tp=(4,)), "roofline", objective="time"),
             cache_mod.cache_key(model, [cluster], 64, space, "profile:abc", objective="time"),
             cache_mod.cache_key(model, [cluster], 64, space, "roofline", objective="cost"),
             cache_mod.cache_key(load_model("llama3-70b"), [cluster], 64, space, "roofline", objective="time")]
    assert len({key, *other}) == 7
    monkeypatch.setattr("tpsim.__version__", "999")
    assert cache_mod.cache_key(model, [cluster], 64, space, "roofline", objective="time") != key


def test_concurrent_writers_leave_a_valid_entry(_cache):
    """Threads writing the same key at once (unique temporary files, os.replace): the entry that remains
    passes its checksums and loads."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    space = SearchSpace(tp=(8,))
    result = search(model, cluster, 64, space=space)
    key = cache_mod.cache_key(model, [cluster], 64, space, "roofline")
    threads = [threading.Thread(target=cache_mod._save, args=(_cache, key, result)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hit = cache_mod._load(_cache, key, model, [cluster], space, None, {})
    assert hit is not None and hit.cached and len(hit) == len(result)
    assert sorted(p.name for p in _cache.iterdir()) == [f"{key}.json", f"{key}.npz"]
