"""docs/ARCHITECTURE.md matches the code: the JSON key lists of ``tpsim estimate --json`` are the fields of
``tpsim.estimator.result`` (Estimate, BREAKDOWN_KEYS, MEMORY_KEYS, the pipeline split's keys)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tpsim.estimator.result import BREAKDOWN_KEYS, MEMORY_KEYS, Estimate

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


def _lists() -> dict[str, list[str]]:
    """``* name: `a`, `b` ...`` bullets of the JSON section, by name (a bullet may wrap)."""
    text = DOC.read_text()
    section = text[text.index("## JSON of `tpsim estimate --json`"):]
    section = section[:section.index("\n## ", 3)]
    out: dict[str, list[str]] = {}
    for bullet in re.split(r"\n\* ", section)[1:]:
        head, _, body = bullet.partition(":")
        keys = re.findall(r"`([a-z_]+)`", body.split(" (")[0])
        out[head.strip().strip("`")] = keys
    return out


def test_json_key_lists_are_the_result_fields():
    lists = _lists()
    assert lists["top level"] == [f.name for f in dataclasses.fields(Estimate)]
    assert lists["breakdown"] == list(BREAKDOWN_KEYS)
    assert lists["memory_gib"] == list(MEMORY_KEYS)


def test_pipeline_split_keys_are_those_of_an_estimate():
    from tpsim.estimator import estimate
    from tpsim.model import get_preset
    from tpsim.plan import make_plan
    from tpsim.topology import load_cluster

    m = get_preset("gpt3-1.3b")
    e = estimate(m, load_cluster("dgx-a100", gpus=8), make_plan(m, 8, pp=2, global_batch=16))
    assert _lists()["pipeline_split"] == list(e.pipeline_split)
