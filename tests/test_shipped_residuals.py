"""The shipped residuals (``tpsim/data/runs/shipped_residuals.json``): every shipped run's band residual under the
code that wrote it. A cold ``tpsim plan`` reads the band's errors from that file instead of predicting the runs;
the file is ignored when its ``code_hash`` is not the current code's, so a stale file only costs time, and this
test fails on it. Regenerate after any change that moves a run prediction (in a commit of its own):

    python tests/test_shipped_residuals.py --write
"""

from __future__ import annotations

import json
import sys

import tpsim.runfit as rf

REGENERATE = "python tests/test_shipped_residuals.py --write"


def test_shipped_residuals_are_the_current_codes():
    """The file is keyed by the current code and holds what the code predicts now, run for run."""
    shipped = json.loads(rf.SHIPPED_FILE.read_text())
    assert shipped["code_hash"] == rf.code_hash(), f"{rf.SHIPPED_FILE.name} is stale: {REGENERATE}"
    fresh = json.loads(json.dumps(rf.shipped_residuals_document()))
    assert shipped == fresh, f"{rf.SHIPPED_FILE.name} differs from the current predictions: {REGENERATE}"


def test_cold_pool_reads_the_shipped_file(tmp_path, monkeypatch):
    """With an empty cache the pool takes every feature and error from the shipped file: no run is parsed or
    predicted; a file of other code is ignored (the runs are predicted again)."""
    monkeypatch.setenv("TPSIM_CACHE_DIR", str(tmp_path))
    shipped = json.loads(rf.SHIPPED_FILE.read_text())

    def refuse(*_):
        raise AssertionError("a run was parsed or predicted")

    monkeypatch.setattr("tpsim.runs.shipped_runs", refuse)
    monkeypatch.setattr(rf, "predict", refuse)
    pool = rf._ShippedPool(use_cache=True)
    assert pool.features == shipped["features"]
    assert [r.error for r in pool.items] == [shipped["errors"][str(i)] for i in range(len(pool.items))]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(shipped, code_hash="0" * 64)))
    monkeypatch.setattr(rf, "SHIPPED_FILE", other)
    try:
        rf._ShippedPool(use_cache=True)
    except AssertionError as e:
        assert "parsed or predicted" in str(e)
    else:
        raise AssertionError("a file of other code was used")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    doc = rf.shipped_residuals_document()
    rf.SHIPPED_FILE.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {rf.SHIPPED_FILE} ({len(doc['features'])} runs, code {doc['code_hash'][:12]})")
