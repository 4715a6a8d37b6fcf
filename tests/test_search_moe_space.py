"""The pruned default space of mixture-of-experts models (tpsim/search/space.py, issue 11): it holds exactly the
plans the plan rules and the stack accept, ranks like the full space, and fits under the size guard without
flags."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.limits import MAX_PLANS
from tpsim.model import load_model
from tpsim.plan import violation_codes
from tpsim.search import SearchSpace, enumerate_plans, search
from tpsim.search.explain import check_space
from tpsim.search.space import enumerate_valid, space_size
from tpsim.stacks import load_stack
from tpsim.topology import load_cluster

SMALL = SearchSpace(vpp=(1, 2), micro_batch=(1, 2))
FULL = dataclasses.replace(SMALL, full=True)
PLAN_FIELDS = ("tp", "cp", "cp_kind", "ep", "etp", "pp", "vpp", "dp", "sp", "recompute", "zero", "micro_batch",
               "overlap", "order")


def _rows(batch) -> np.ndarray:
    return np.stack([np.asarray(getattr(batch, f), dtype=np.int64) for f in PLAN_FIELDS], axis=1)


@pytest.fixture(scope="module")
def mixtral():
    return load_model("mixtral-8x7b")


@pytest.mark.parametrize("stack_name", ["megatron", "torchtitan"])
def test_pruned_space_is_the_accepted_plans_of_the_full_product(mixtral, stack_name):
    stack = load_stack(stack_name)
    full = enumerate_plans(mixtral, 16, 64, FULL).plans
    accepted = full.take(np.flatnonzero((violation_codes(mixtral, full, 16) == 0)
                                        & (stack.violation_codes(full, mixtral) == 0)))
    pruned = enumerate_valid(mixtral, 16, 64, SMALL, stack)
    # every plan both rule tables accept is kept, in the product's order, and nothing else
    assert np.array_equal(_rows(pruned.plans), _rows(accepted))
    assert pruned.enumerated == len(accepted) == space_size(mixtral, 16, SMALL, 64, stack)
    assert pruned.left_out == len(full) - len(accepted) > 0
    assert pruned.codes[1:].sum() == 0


def test_dense_models_keep_the_full_product():
    gpt = load_model("gpt3-1.3b") if _has("gpt3-1.3b") else load_model("gpt3-175b")
    assert not SMALL.prunes(gpt) and SMALL.prunes(load_model("mixtral-8x7b"))
    v = enumerate_valid(gpt, 16, 64, SMALL)
    assert v.enumerated == space_size(gpt, 16, SMALL) == space_size(gpt, 16, SMALL, 64)
    assert v.left_out == 0


def _has(name: str) -> bool:
    try:
        load_model(name)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("stack_name", ["megatron", "torchtitan"])
def test_ranking_is_the_full_space_ranking(mixtral, stack_name):
    cluster = load_cluster("dgx-h100", gpus=16)
    pruned = search(mixtral, cluster, 64, space=SMALL, stack=stack_name)
    full = search(mixtral, cluster, 64, space=FULL, stack=stack_name)
    assert len(pruned) == len(full) > 0
    top_p, top_f = pruned.table(20), full.table(20)
    assert top_p.equals(top_f)
    assert pruned.estimate_dict(int(pruned.ranking[0])) == full.estimate_dict(int(full.ranking[0]))
    assert pruned.evaluated == full.evaluated
    assert pruned.enumerated + pruned.left_out == full.enumerated
    assert pruned.rejected.get("memory") == full.rejected.get("memory")
    assert pruned.rejected.get("headroom") == full.rejected.get("headroom")  # the planner's HBM headroom
    assert set(pruned.rejected) <= {"memory", "headroom"} and not pruned.stack_rejected


@pytest.mark.parametrize("name, gpus, batch", [("mixtral-8x7b", 64, 256), ("mixtral-8x7b", 256, 256),
                                               ("deepseek-v3", 2048, 15360)])
def test_default_moe_spaces_fit_under_the_guard(name, gpus, batch):
    model = load_model(name)
    held = check_space(model, [gpus], SearchSpace(), global_batch=batch)
    assert 0 < held < MAX_PLANS // 2
    assert space_size(model, gpus, SearchSpace(full=True)) > held


def test_full_space_is_under_the_time_guard():
    """The guard is the measured search rate (a minute of search), not a plan count: the full Mixtral space
    on 256 GPUs (1.4 M plans, under a second) runs without the flag; ten times the GPU counts' worth does not."""
    model = load_model("mixtral-8x7b")
    from tpsim.errors import InputError
    held = check_space(model, [256], SearchSpace(full=True), global_batch=256)
    assert 1_000_000 < held < MAX_PLANS
    with pytest.raises(InputError, match="at the measured"):
        check_space(model, [256], SearchSpace(full=True, micro_batch=tuple(range(1, 257))), global_batch=256)


def test_cli_full_space_flag_and_left_out_count(capsys, tmp_path, monkeypatch):
    import json

    from tpsim.cli import main

    monkeypatch.setenv("TPSIM_CACHE_DIR", str(tmp_path))
    base = ["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64",
            "--vpp", "1", "2", "--micro-batch", "1", "2", "--no-progress", "--json", "--top", "3"]
    assert main(base) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert main(base + ["--full-space"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert pruned["left_out"] > 0 and full["left_out"] == 0
    assert pruned["enumerated"] + pruned["left_out"] == full["enumerated"]
    assert [p["step_time_s"] for p in pruned["plans"]] == [p["step_time_s"] for p in full["plans"]]
    assert [p["plan"] for p in pruned["plans"]] == [p["plan"] for p in full["plans"]]
    assert main(base[:-3] + ["--why"]) == 0
    assert "left out of the space:" in capsys.readouterr().out
    assert main(["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "256", "--no-progress",
                 "--full-space", "--micro-batch", *map(str, range(1, 257))]) == 2
    assert "--allow-large-space" in capsys.readouterr().err
