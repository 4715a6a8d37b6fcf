"""Context- and expert-parallel layers on gloo ranks on CPU: numerics (fp64) against the unsharded layer and every
collective per axis against tpsim.comm_plan, on 2 ranks (ring, all-to-all, experts split, both at once, with multi-head latent attention) and on
4 (ring with the K/V + dK/dV messages of cp > 2); the CLI end to end with timing. One launch per rank count,
shared with the other distributed modules' rule checks (tests/shared_launches.py), serves the checks (tiny
shapes, no timing)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import shared_launches

pytest.importorskip("torch")

from tpsim.model import PRESETS, with_overrides  # noqa: E402
from tpsim.validate.axis.case import AxisCase, moe_layer_model, with_expert_ffn  # noqa: E402
from tpsim.validate.axis.report import summarize_axis  # noqa: E402

pytestmark = pytest.mark.distributed

LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=64, heads=4, kv_heads=2, ffn=128, seq_len=32, layers=1)
GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=64, heads=4, seq_len=32, layers=1)
MIXTRAL = with_expert_ffn(moe_layer_model(with_overrides(PRESETS["mixtral-8x7b"], hidden=64, heads=4, kv_heads=2,
                                                         ffn=128, seq_len=32, layers=1)), 48)
SHARED = dataclasses.replace(MIXTRAL, name="qwen-like", num_shared_experts=1, shared_expert_ffn_hidden_size=32,
                             shared_expert_gate=True)
DEEPSEEK = dataclasses.replace(with_expert_ffn(moe_layer_model(with_overrides(
    PRESETS["deepseek-v3"], hidden=64, heads=4, seq_len=32, experts=8, top_k=2)), 32),
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=4, head_dim=16)
"""multi-head latent attention (value heads narrower than keys), a shared expert, 8 routed experts."""
KW = dict(micro_batch=2, reps=1, warmup=0, timed=False)


TWO = shared_launches.register(2, [
    AxisCase(model=LLAMA, cp=2, **KW), AxisCase(model=GPT, cp=2, **KW),
    AxisCase(model=LLAMA, cp=2, cp_kind="a2a", **KW), AxisCase(model=MIXTRAL, ep=2, dp=2, **KW),
    AxisCase(model=SHARED, cp=2, ep=2, **KW), AxisCase(model=DEEPSEEK, cp=2, ep=2, **KW)])
"""launched once with the other modules' 2-rank cases (tests/shared_launches.py)."""
FOUR_MODEL = with_overrides(LLAMA, heads=8, kv_heads=4, seq_len=64)
FOUR = shared_launches.register(4, [
    AxisCase(model=FOUR_MODEL, cp=4, **KW), AxisCase(model=FOUR_MODEL, cp=4, cp_kind="a2a", **KW),
    AxisCase(model=with_overrides(MIXTRAL, seq_len=64), cp=2, dp=2, ep=4, **KW)])
"""launched once with the whole-plan 4-rank meshes of test_validate_plan_distributed."""


def _per_case(shared: dict, cases: list[AxisCase]) -> dict[str, list[dict]]:
    return {c.name: shared["per_case"][c.name] for c in cases}


@pytest.fixture(scope="module")
def two_ranks(shared_ranks):
    return _per_case(shared_ranks(2), TWO)


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_two_ranks_match_the_unsharded_layer(two_ranks):
    for case in TWO:
        ranks = two_ranks[case.name]
        assert len(ranks) == 2
        s = summarize_axis(case, ranks, None)
        assert s["numerics_ok"], (case.name, s["numerics_max_rel_err"])
        assert s["numerics_max_rel_err"] < 1e-12
        # every parameter's gradient was compared, the experts' on their own rank
        for r in ranks:
            assert {"output", "input_grad"} <= set(r["numerics"]) and sum(k.startswith("grad:") for k in r["numerics"]) > 8


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_two_ranks_communicate_what_the_cost_model_lists(two_ranks):
    for case in TWO:
        s = summarize_axis(case, two_ranks[case.name], None)
        assert s["collectives_match"], (case.name, s["comm"]["per_rank"])
    ring = two_ranks[TWO[0].name][0]["comm"]["cp"]
    assert ring["fwd"]["send"]["n"] == 1 and ring["bwd"]["send"]["n"] == 2
    moe = summarize_axis(TWO[3], two_ranks[TWO[3].name], None)["comm"]["ep_group"]
    assert sum(moe["loads"]) == 2 * moe["balanced_load"]  # every routed copy went out once and came back


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_a_wrong_expectation_is_caught(two_ranks):
    """The comparison can fail: a ring expected to exchange one message fewer in backward does not match."""
    case = TWO[0]
    ranks = [dict(r, comm={**r["comm"], "cp": {**r["comm"]["cp"], "bwd": {
        op: {"n": d["n"] - 1, "bytes": d["bytes"] / 2} for op, d in r["comm"]["cp"]["bwd"].items()}}})
        for r in two_ranks[case.name]]
    assert not summarize_axis(case, ranks, None)["collectives_match"]


@pytest.mark.timeout(shared_launches.TEST_TIMEOUT_S)
def test_four_ranks_ring_and_all_to_all(shared_ranks):
    """cp = 4: the middle backward steps send K/V with the accumulated dK/dV (twice the message); a2a over 4;
    experts over 4 ranks (2 each) with cp 2 x dp 2 for the dense part."""
    model, cases = FOUR_MODEL, FOUR
    per_case = _per_case(shared_ranks(4), cases)
    for case in cases:
        s = summarize_axis(case, per_case[case.name], None)
        assert s["numerics_ok"] and s["collectives_match"], (case.name, s["numerics_max_rel_err"], s["comm"]["per_rank"])
    kv = (2 * 64 // 4) * 4 * 2 * model.head_dim * 4  # tokens per rank x kv heads x (k + v) x head dim x 4 B
    bwd = per_case[cases[0].name][0]["comm"]["cp"]["bwd"]["send"]
    assert bwd == {"n": 4, "bytes": kv + 2 * 2 * kv + kv}


@pytest.mark.timeout(150)
def test_cli_expert_parallel_layer_end_to_end(tmp_path):
    """``tpsim validate --ep 2`` with timing: exit 0, the report's phases predicted and measured, the ep group's
    routing, the stack differences, and the CSV rows with the new columns."""
    cmd = [sys.executable, "-m", "tpsim.cli", "validate", "--model", "mixtral-8x7b", "--hidden", "64", "--heads", "4",
           "--kv-heads", "2", "--ffn", "128", "--moe-ffn", "48", "--seq-len", "32", "--ep", "2", "--micro-batch", "2",
           "--reps", "2", "--warmup", "1", "--no-calibrate", "--no-probe", "--no-overhead", "--timeout", "30",
           "--json", "--out-dir", str(tmp_path), "--name", "ep"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    case = report["cases"][0]
    assert case["kind"] == "axis" and case["numerics_ok"] and case["collectives_match"]
    names = {p["name"] for p in case["phases"]}
    assert {"fwd", "bwd", "fwd+bwd", "fwd:ep:all_to_all", "bwd:ep:all_to_all", "fwd:ep:all_gather"} <= names
    assert all(p["predicted_s"] > 0 for p in case["phases"] if p["name"] != "fwd:ep:all_gather")
    assert case["imbalance"]["run"] >= 1.0 and case["stack_differences"]
    header = (tmp_path / "ep.csv").read_text().splitlines()[0].split(",")
    assert {"cp", "cp_kind", "ep"} <= set(header)
