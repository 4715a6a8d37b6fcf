"""Issue 9 (process start): the on-disk parse cache of YAML documents (tpsim.parsecache) returns exactly what
the reader returns, is keyed by content and reader, never keeps a failed parse, survives corrupt entries and
unwritable folders; tpsim's data files read the same with libyaml's parser as with PyYAML's Python one."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml

from tpsim import parsecache
from tpsim.errors import InputError
from tpsim.safeyaml import load_data, load_yaml

DATA = Path(__file__).resolve().parents[1] / "tpsim" / "data"
DOC = ("name: probe\nsizes: {1: 8, 2: 16}\nflags: [true, false, null]\nratio: 0.1\nbig: 1.0e+400\n"
       "tuple_like: [1, 2.5, '3']\nnested: {a: {b: [x, {c: 1}]}}\n")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(folder))
    return folder / "yaml"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + parsecache.SUFFIX)) if folder.exists() else []


def test_hit_returns_the_same_document_with_its_types_as_new_objects(cache):
    first = load_yaml(DOC, "doc")
    assert len(_entries(cache)) == 1
    second = load_yaml(DOC, "doc")
    assert second == first == yaml.safe_load(DOC)
    assert [type(k) for k in second["sizes"]] == [int, int] and second["flags"][0] is True
    assert second["big"] == float("inf") and type(second["tuple_like"][1]) is float
    second["nested"]["a"]["b"].append("changed")      # callers may modify what they get
    assert load_yaml(DOC, "doc") == first


def test_hit_does_not_call_the_parser(cache):
    calls = []

    def parse(text):
        calls.append(text)
        return {"n": len(text)}

    assert parsecache.cached_parse("abc", "probe", parse) == {"n": 3}
    assert parsecache.cached_parse("abc", "probe", parse) == {"n": 3}
    assert calls == ["abc"]
    assert parsecache.cached_parse("abc", "other reader", parse) == {"n": 3}   # the reader is in the key
    assert parsecache.cached_parse("abcd", "probe", parse) == {"n": 4}         # so is the text
    assert len(calls) == 3 and len(_entries(cache)) == 3


def test_a_file_with_an_error_is_refused_every_time_and_not_kept(cache):
    bad = "a: 1\na: 2\n"
    for _ in range(2):
        with pytest.raises(InputError, match="duplicate name 'a'"):
            load_yaml(bad, "dup.yaml")
    assert not _entries(cache)
    assert yaml.safe_load(bad) == {"a": 2}  # (PyYAML alone would keep the last key)


def test_strict_and_plain_readers_do_not_share_entries(cache, tmp_path):
    """The same text read strictly (user files) and plainly (data files) is two entries: the strict reader's
    refusals cannot be skipped by an entry the plain reader wrote."""
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\na: 2\n")
    assert load_data(path) == {"a": 2}
    with pytest.raises(InputError, match="duplicate name"):
        load_yaml(path.read_text(), str(path))


@pytest.mark.parametrize("damage", [b"", b"x" * 10, None], ids=["empty", "truncated", "payload flipped"])
def test_corrupt_entry_is_discarded_with_one_warning_and_rewritten(cache, capsys, damage):
    expected = load_yaml(DOC, "doc")
    (entry,) = _entries(cache)
    blob = entry.read_bytes()
    entry.write_bytes(damage if damage is not None else blob[:-3] + bytes(b ^ 0xFF for b in blob[-3:]))
    assert load_yaml(DOC, "doc") == expected
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "discarded cache entry" in err[0] and "parsing the file again" in err[0]
    assert entry.read_bytes() == blob                 # rewritten
    assert load_yaml(DOC, "doc") == expected and not capsys.readouterr().err


def test_checksummed_but_foreign_payload_is_discarded(cache, capsys):
    import hashlib

    load_yaml(DOC, "doc")
    (entry,) = _entries(cache)
    payload = b"\xff\xfe not marshal"
    entry.write_bytes(hashlib.sha256(payload).digest() + payload)
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    assert "seal does not verify" in capsys.readouterr().err  # a recomputed checksum proves nothing (issue 26)


def test_documents_marshal_cannot_keep_are_parsed_every_time(cache):
    doc = load_yaml("when: 2026-12-01\n", "t")
    assert doc == {"when": datetime.date(2026, 12, 1)} and not _entries(cache)


def test_off_and_unwritable_folders_still_parse(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPSIM_CACHE_DIR", "off")
    assert parsecache.cache_dir() is None
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(blocker))
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    assert not capsys.readouterr().err


def test_old_entries_are_pruned(cache, monkeypatch):
    monkeypatch.setattr(parsecache, "MAX_ENTRIES", 3)
    for i in range(6):
        parsecache.cached_parse(f"n: {i}", "probe", yaml.safe_load)
    assert len(_entries(cache)) == 3


@pytest.mark.parametrize("path", sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.yaml")))
def test_data_files_read_as_pyyaml_python_loader_reads_them(path, cache):
    """load_data (libyaml's parser where installed, then the cache) == PyYAML's pure-Python SafeLoader."""
    text = (DATA / path).read_text()
    expected = yaml.load(text, Loader=yaml.SafeLoader)
    assert load_data(DATA / path) == expected   # parsed (a miss)
    assert load_data(DATA / path) == expected   # read back (a hit)


def test_folder_follows_the_plan_cache_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(tmp_path))
    assert parsecache.cache_dir() == tmp_path / "yaml"
    monkeypatch.delenv("TPSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert parsecache.cache_dir() == tmp_path / "xdg" / "tpsim" / "yaml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parsecache.cache_dir() == tmp_path / "home" / ".cache" / "tpsim" / "yaml"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link", "link out of the folder", "folder"])
def test_strange_entries_are_never_opened_as_data(cache, capsys, kind, tmp_path):
    """Issue 26: a cache entry that is a FIFO (would block), a symlink to /dev/zero (never ends) or out of the
    cache folder, or a folder is discarded with one warning line and the file parsed again."""
    import os

    load_yaml(DOC, "doc")
    (entry,) = _entries(cache)
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dev-zero link":
        entry.symlink_to("/dev/zero")
    elif kind == "folder":
        entry.mkdir()
    else:
        outside = tmp_path / "outside"
        outside.write_bytes(b"x" * 64)
        entry.symlink_to(outside)
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "discarded cache entry" in err[0], err
    if kind != "folder":
        assert not entry.is_symlink()


def test_entries_of_another_secret_do_not_verify(cache, capsys, monkeypatch):
    """An entry sealed under another user's secret (a shared or copied cache folder) is recomputed."""
    from tpsim import cachefile

    load_yaml(DOC, "doc")
    (entry,) = _entries(cache)
    secret = cache.parent / cachefile.SECRET_NAME
    secret.chmod(0o600)
    secret.write_bytes(b"\x01" * cachefile.SECRET_BYTES)
    cachefile._secret.cache_clear()
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC)
    assert "seal does not verify" in capsys.readouterr().err
    secret.chmod(0o644)  # readable by others: not a secret, the caches are not used
    cachefile._secret.cache_clear()
    assert cachefile.secret() is None
    assert load_yaml(DOC, "doc") == yaml.safe_load(DOC) and not capsys.readouterr().err


def _shipped_yaml() -> list[Path]:
    from tpsim.topology.files import topologies_dir

    return [p for folder in (DATA, Path(topologies_dir())) for p in sorted(folder.rglob("*.yaml"))]


def test_seed_documents_are_what_the_readers_build(tmp_path, monkeypatch):
    """Every entry of the shipped parse seed (tpsim/data/parse_seed.marshal) that a current file's text and
    reader key is the document that reader builds now; an entry keyed by no current file is never read."""
    from tpsim.safeyaml import SAFE_READER, STRICT_READER, _parse_safe, _parse_strict

    monkeypatch.setenv("TPSIM_CACHE_DIR", "off")
    seed = parsecache.seed()
    checked = 0
    for path in _shipped_yaml():
        text = path.read_text()
        for reader, parse in ((SAFE_READER, _parse_safe), (STRICT_READER, lambda t: _parse_strict(t, str(path)))):
            key = parsecache.entry_key(text, reader)
            if key in seed:
                assert parsecache.cached_parse(text, reader, lambda t: pytest.fail("parsed")) == parse(text)
                checked += 1
    assert checked > 0
    calls = []
    assert parsecache.cached_parse("seed: probe\n", SAFE_READER, lambda t: calls.append(t) or {"p": 1}) == {"p": 1}
    assert calls == ["seed: probe\n"]   # not in the seed: parsed


def test_seed_covers_every_shipped_yaml_file():
    """The seed is current: each shipped YAML file has its entry (else regenerate it:
    ``python tests/test_parsecache.py --write``; an out-of-date seed only costs a cold process time)."""
    from tpsim.safeyaml import SAFE_READER

    seed = parsecache.seed()
    stale = [str(p) for p in _shipped_yaml() if parsecache.entry_key(p.read_text(), SAFE_READER) not in seed]
    assert not stale, f"parse seed out of date for {stale}: run python tests/test_parsecache.py --write"


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv[1:]:
        from tpsim.safeyaml import write_parse_seed
        from tpsim.topology.files import topologies_dir

        files, entries = write_parse_seed([DATA, topologies_dir()])
        print(f"wrote {parsecache.SEED_FILE}: {files} files, {entries} entries")
