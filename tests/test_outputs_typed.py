"""Issue 25: plans as typed (presets never override a flag), MFU conventions, ranking ties, did-you-mean, size
suffixes, output locations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.cli import main
from tpsim.errors import InputError, PlanError
from tpsim.estimator.flops import convention_ratio, measured_mfu_limit
from tpsim.model import load_model
from tpsim.plan import make_plan_as_typed
from tpsim.stacks import load_stack

QUICK = ["--no-progress", "--no-cache"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- plans as typed -----------------------------------------------------------------------------------------
def test_a_conflicting_preset_default_is_dropped_with_one_line(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--tp", "1")
    assert code == 0, err
    assert err.count("\n") == 1 and "preset's plan default sp=True conflicts" in err and "dropped" in err
    assert "plan     tp1 pp1" in out and " sp " not in out.split("plan ", 1)[1].split("\n")[0]
    code, out, err = run(capsys, "estimate", "--model", "llama3-70b", "--tp", "8", "--zero", "3", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["zero"], plan["pp"]) == (8, 3, 1) and "pp=4" in err


def test_a_preset_zero_stage_the_plan_cannot_take_is_lowered_not_dropped(capsys):
    """llama3-405b's preset runs ZeRO-2; Megatron offers ZeRO-1 at most with pipeline parallelism: the typed pp
    keeps a sharded optimizer (zero=1), not a replicated one (the plain default 0: 12 B of Adam state per
    parameter on every data-parallel rank)."""
    code, out, err = run(capsys, "estimate", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "1024",
                         "--tp", "8", "--pp", "16", "--stack", "megatron", "--json")
    assert code == 0, err
    assert err.count("\n") == 1 and "zero=2 conflicts" in err and "dropped (zero=1 used)" in err
    assert json.loads(out)["plan"]["zero"] == 1


def test_a_conflict_between_typed_flags_is_refused_with_the_rule(capsys):
    code, _, err = run(capsys, "estimate", "--model", "llama3-70b", "--tp", "8", "--zero", "3", "--pp", "4")
    assert code == 2 and "zero=3 with pp=4" in err and "preset" not in err
    code, _, err = run(capsys, "estimate", "--model", "llama3-8b", "--ep", "8")
    assert code == 2 and "ep=8: model llama3-8b has no experts" in err and "etp" not in err


TYPED = st.fixed_dictionaries({}, optional={
    "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 4]), "zero": st.sampled_from([0, 1, 2, 3]),
    "sp": st.booleans(), "recompute": st.sampled_from(["none", "selective", "full"]),
    "micro_batch": st.sampled_from([1, 2]), "vpp": st.sampled_from([1, 2])})


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "llama3-70b", "gpt3-175b"]), typed=TYPED)
def test_no_preset_leak(name, typed):
    """Every combination of typed plan flags runs as typed (each typed field is in the plan) or is refused."""
    model, stack = load_model(name), load_stack("megatron")
    try:
        plan, notes = make_plan_as_typed(model, 64, stack=stack, **typed)
    except (PlanError, InputError):
        return
    assert all(getattr(plan, k) == v for k, v in typed.items()), (typed, plan)
    assert stack.plan_violation(plan, model) is None
    assert len(notes) <= 1


def test_model_show_lists_the_preset_plan_defaults(capsys):
    code, out, _ = run(capsys, "model", "show", "llama3-405b")
    assert code == 0
    line = out.strip().splitlines()[-1]
    assert line.startswith("preset plan") and "stack torchtitan" in line and "pp=16" in line and "16384 GPUs" in line


# ---- did-you-mean, size suffixes ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, hint", [
    (["--model", "llama-3-70b"], "did you mean 'llama3-70b'"),
    (["--cluster", "dgx-h10"], "did you mean 'dgx-h100'"),
    (["--stack", "torchtitn"], "did you mean 'torchtitan'"),
    (["--dtype", "bf61"], "did you mean 'bf16'"),
])
def test_typos_get_a_suggestion(capsys, argv, hint):
    code, _, err = run(capsys, "estimate", *argv)
    assert code == 2 and hint in err and err.count("\n") == 1


def test_sizes_take_suffixes(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--seq-len", "16k", "--global-batch", "1k",
                         "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["plan"]["global_batch"] == 1024
    code, out, _ = run(capsys, "model", "show", "llama3-8b", "--seq-len", "1M", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == 1 << 20
    code, _, err = run(capsys, "estimate", "--seq-len", "8q")
    assert code == 2 and "--seq-len" in err


# ---- MFU conventions ----------------------------------------------------------------------------------------
LONG = ["--model", "llama3-8b", "--seq-len", "128k", "--cluster", "dgx-h100", "--gpus", "64", "--cp", "8", "--tp",
        "1", "--no-sp", "--global-batch", "64", "--json"]


def test_mfu_is_causal_by_default_and_the_convention_is_named(capsys):
    code, out, _ = run(capsys, "estimate", *LONG)
    causal = json.loads(out)
    code, out, _ = run(capsys, "estimate", *LONG, "--flops-convention", "full")
    full = json.loads(out)
    assert causal["flops_convention"] == "causal" and full["flops_convention"] == "full"
    from tpsim.model import with_overrides

    ratio = convention_ratio(with_overrides(load_model("llama3-8b"), seq_len=131072), "full")
    assert ratio > 1.5  # at 128k the score matmuls dominate: the non-causal count is far higher
    assert full["mfu"] == pytest.approx(causal["mfu"] * ratio, rel=1e-12)
    assert full["step_time_s"] == causal["step_time_s"]
    assert full["tokens_per_s_per_gpu"] == pytest.approx(causal["tokens_per_s"] / 64, rel=1e-12)
    warn, top, source = measured_mfu_limit()
    assert top < warn and "torchtitan" in source
    high = [w for w in full["warnings"] if w.startswith("MFU ")]
    assert (full["mfu"] > warn) == bool(high) and (causal["mfu"] > warn) == any(
        w.startswith("MFU ") for w in causal["warnings"])
    code, out, _ = run(capsys, "estimate", *LONG[:-1])
    assert "tokens/s/GPU" in out and "(causal FLOPs" in out


# ---- rankings -----------------------------------------------------------------------------------------------
PLAN = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", *QUICK]


def test_ties_are_grouped_and_distinct_keeps_one_row_per_shape(capsys):
    code, out, _ = run(capsys, *PLAN, "--json", "--top", "30")
    data = json.loads(out)
    plans = data["plans"]
    groups = [p["tie_group"] for p in plans]
    assert groups[0] == 1 and groups == sorted(groups) and data["flops_convention"] == "causal"
    best_high = plans[0]["step_time_s_high"]
    for p in plans:
        assert (p["tie_group"] == 1) == (p["step_time_s"] <= best_high)
    code, out, _ = run(capsys, *PLAN, "--json", "--top", "30", "--distinct")
    distinct = json.loads(out)["plans"]
    shapes = [(p["tp"], p["plan"]["cp"], p["pp"], p["plan"]["ep"], p["zero"]) for p in distinct]
    assert len(shapes) == len(set(shapes)) and distinct[0]["step_time_s"] == plans[0]["step_time_s"]
    code, out, _ = run(capsys, *PLAN, "--top", "5", "--distinct")
    assert "one row per distinct shape" in out and "tie: rows with the same number" in out


def test_plan_table_needs_no_pandas(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pandas", None)  # importing pandas now fails
    code, out, err = run(capsys, *PLAN, "--top", "3")
    assert code == 0, err
    assert "stack megatron; MFU counts causal attention FLOPs" in out


# ---- output locations ----------------------------------------------------------------------------------------
def test_validation_reports_default_to_the_current_directory():
    from tpsim.validate.run import REPORTS_DIR

    assert not REPORTS_DIR.is_absolute() and REPORTS_DIR == Path("reports") / "validation"


# ---- CLI structure (issue 21) --------------------------------------------------------------------------------
def test_no_import_cycle_among_the_verbs():
    """estimate, export, graph and plan share helpers through tpsim/cli/common.py: the verb modules they import
    (at module level or inside functions) form no cycle."""
    import ast

    root = Path(__file__).resolve().parent.parent / "tpsim" / "cli"
    verbs = ("estimate", "export", "graph", "plan", "report", "validate", "model")
    edges = {}
    for name in verbs:
        tree = ast.parse((root / f"{name}.py").read_text())
        edges[name] = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                       and node.level == 1 and node.module in verbs} - {name}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in edges[start])

    cycles = [v for v in verbs if reaches(v, v)]
    assert not cycles, edges
    assert not edges["export"] and not edges["graph"]  # the leaves use common only
