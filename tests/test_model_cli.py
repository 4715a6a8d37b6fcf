"""The model in the CLI and the API: mixtures of experts, MLA and sliding windows estimated end to end, dense features end to end
(gemma2: explicit head_dim, GeGLU, tied embeddings; phi3), the model summary in estimate/plan, `tpsim model show`."""

import json
from pathlib import Path

import pytest

import tpsim
from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.model import get_preset, load_model, unmodelled_features, with_overrides

CONFIGS = Path(__file__).parent / "data" / "configs"
SMALL = ["--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16"]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("model,extra,check", [
    ("mixtral-8x7b", ["--ep", "8", "--pp", "1"], lambda d: d["breakdown"]["ep_comm"] > 0 and d["plan"]["ep"] == 8),
    (str(CONFIGS / "deepseek_v3.json"), ["--ep", "8", "--pp", "1", "--recompute", "full"],
     lambda d: d["breakdown"]["ep_comm"] > 0 and d["peak_memory_gib"] > 80),
    (str(CONFIGS / "mistral.json"), [], lambda d: d["breakdown"]["ep_comm"] == 0),
])
def test_moe_mla_and_window_models_estimate_end_to_end(capsys, model, extra, check):
    code, out, err = run(capsys, "estimate", "--model", model, *SMALL, *extra, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert 0 < d["mfu"] < 1 and d["step_time_s"] > 0 and check(d)


def test_api_estimates_moe():
    cluster = tpsim.load_cluster("dgx-h100", gpus=64)
    model = get_preset("mixtral-8x7b")
    plan = tpsim.make_plan(model, 64, tp=1, pp=4, ep=8, global_batch=256)
    e = tpsim.estimate(model, cluster, plan)
    assert e.breakdown["ep_comm"] > 0 and e.collectives["ep"].startswith("all_to_all")


def test_window_at_least_the_sequence_changes_nothing():
    """A window as long as the sequence is full causal attention: same estimate as without it; a shorter one
    is faster (fewer keys per query)."""
    import dataclasses

    mistral = load_model(str(CONFIGS / "mistral.json"))
    cluster = tpsim.load_cluster("dgx-h100", gpus=8)
    plan = tpsim.make_plan(mistral, 8, tp=1, pp=1, global_batch=8)
    est = lambda m: tpsim.estimate(m, cluster, plan).step_time_s  # noqa: E731
    at = with_overrides(mistral, seq_len=4096)
    assert est(at) == est(dataclasses.replace(at, sliding_window=0))
    longer = with_overrides(mistral, seq_len=16384)
    assert est(longer) < est(dataclasses.replace(longer, sliding_window=0))
    assert unmodelled_features(longer) == ()


@pytest.mark.parametrize("config,seq", [("gemma2", 4096), ("gemma2-27b", 4096), ("phi3", 1024), ("gemma", 8192),
                                        ("gpt_neox", 2048), ("qwen2", 8192)])
def test_dense_configs_estimate_end_to_end(capsys, config, seq):
    code, out, err = run(capsys, "estimate", "--model", str(CONFIGS / f"{config}.json"), "--seq-len", str(seq),
                         "--tp", "2", "--sp", "--recompute", "selective", *SMALL, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert 0 < d["mfu"] < 1 and d["step_time_s"] > 0
    # the estimator's model FLOPs are the spec's causal forward FLOPs x 3 (the default convention)
    assert d["flops_convention"] == "causal"
    m = with_overrides(load_model(str(CONFIGS / f"{config}.json")), seq_len=seq)
    flops = 3 * m.forward_flops_per_token(causal=True) * d["tokens_per_s"] / 8
    assert flops / 1e12 == pytest.approx(d["model_tflops_per_gpu"], rel=1e-6)


def test_gemma2_reads_head_dim_geglu_and_tied_embeddings(capsys):
    m = with_overrides(load_model(str(CONFIGS / "gemma2.json")), seq_len=4096)
    assert m.q_size == 16 * 256 != m.hidden_size and m.gated and m.tie_embeddings
    code, out, _ = run(capsys, "estimate", "--model", str(CONFIGS / "gemma2.json"), "--seq-len", "4096", "--tp", "2",
                       *SMALL)
    assert code == 0
    assert "geglu MLP 14336" in out and "tied embeddings" in out and "16 heads / 8 kv x 256" in out
    assert "not costed   attn_logit_softcapping" in out and "ignored keys" in out
    assert "(not shorter than the sequence: no effect)" in out and "step time" in out


def test_plan_prints_the_summary(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama3-8b", *SMALL, "--tp", "2", "--pp", "1", "--micro-batch",
                       "1", "--zero", "1", "--recompute", "selective", "--sp", "on", "--order", "tp-dp-pp",
                       "--no-cache", "--no-progress", "--top", "1")
    assert code == 0
    assert out.startswith("model        llama3-8b (llama, llama-style blocks): 8.03 B parameters")


def test_model_show(capsys):
    code, out, _ = run(capsys, "model", "show", "deepseek-v3")
    assert code == 0 and "671.03 B parameters, 37.55 B active per token" in out and "not modelled" not in out
    code, out, _ = run(capsys, "model", "show", str(CONFIGS / "mixtral.json"), "--json")
    d = json.loads(out)
    assert (d["params"], d["num_experts"], d["source_keys"]["num_local_experts"]) == (46_702_792_704, 8, "used")
    assert d["unmodelled_features"] == [] and d["flops_per_token"]["router"] > 0
    assert main(["model", "show", "llama3-8b", "--layers", "0"]) == 2  # argparse's own check, one line too
    err = capsys.readouterr().err
    assert "--layers: 0 must be a positive integer" in err and err.count("\n") == 1
    code, _, err = run(capsys, "model", "show", "llama3-8b", "--layers", "100000")
    assert code == 2 and "--layers=100000 is above the supported maximum 4096" in err
