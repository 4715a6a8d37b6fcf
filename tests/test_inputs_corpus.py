"""Issue 26: the corpus of hostile inputs found so far (tests/data/fuzz_corpus/), each one line + exit 2."""

import json
from pathlib import Path

import pytest

from tpsim.cli import main

CORPUS = Path(__file__).parent / "data" / "fuzz_corpus"
CASES = json.loads((CORPUS / "CASES.json").read_text())


def test_every_corpus_file_has_a_case():
    files = {p.name for p in CORPUS.iterdir() if p.name not in ("CASES.json", "README.md")}
    assert files == set(CASES), sorted(files ^ set(CASES))


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case_is_one_line_naming_the_field(name, capsys):
    case = CASES[name]
    if "call" in case:  # a reader without a verb yet: its Python entry point, "module:function"
        import importlib

        from tpsim.errors import InputError

        module, _, func = case["call"].partition(":")
        with pytest.raises(InputError) as info:
            getattr(importlib.import_module(module), func)(CORPUS / name)
        line = str(info.value)
        assert "\n" not in line and case["expect"] in line and name in line, line
        return
    argv = [a.replace("{file}", str(CORPUS / name)) for a in case["argv"]]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tpsim"), err
    assert case["expect"] in lines[0] and name in lines[0], lines[0]
