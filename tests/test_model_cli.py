"""The model in the CLI and the API: refusal of what the estimator cannot cost yet, dense features end to end
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


@pytest.mark.parametrize("verb", ["estimate", "plan", "report"])
@pytest.mark.parametrize("model,needle", [
    ("mixtral-8x7b", "model mixtral-8x7b has mixture-of-experts layers (num_experts=8, top-2, on 32 of 32 layers), "
                     "which this estimator does not model yet"),
    (str(CONFIGS / "deepseek_v3.json"), "mixture-of-experts layers (num_experts=256, top-8, on 58 of 61 layers), "
                                        "multi-head latent attention"),
    (str(CONFIGS / "mistral.json"), "sliding-window attention (sliding_window=4096 on 32 of 32 layers, "
                                    "seq_len=8192), which this estimator does not model yet (with --seq-len 4096"),
])
def test_unmodelled_features_are_refused_in_one_line(capsys, tmp_path, verb, model, needle):
    extra = ["--out", str(tmp_path / "r")] if verb == "report" else []
    code, out, err = run(capsys, verb, "--model", model, *SMALL, *extra)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_api_refuses_too():
    cluster = tpsim.load_cluster("dgx-h100", gpus=64)
    model = get_preset("mixtral-8x7b")
    plan = tpsim.make_plan(model, 64, tp=1, pp=4, global_batch=256)
    with pytest.raises(InputError, match="mixture-of-experts"):
        tpsim.estimate(model, cluster, plan)


def test_window_at_least_the_sequence_is_not_a_feature():
    mistral = load_model(str(CONFIGS / "mistral.json"))
    assert unmodelled_features(with_overrides(mistral, seq_len=4096)) == ()
    assert unmodelled_features(with_overrides(mistral, seq_len=4097))
    assert unmodelled_features(get_preset("llama3-405b")) == ()


@pytest.mark.parametrize("config,seq", [("gemma2", 4096), ("gemma2-27b", 4096), ("phi3", 1024), ("gemma", 8192),
                                        ("gpt_neox", 2048), ("qwen2", 8192)])
def test_dense_configs_estimate_end_to_end(capsys, config, seq):
    code, out, err = run(capsys, "estimate", "--model", str(CONFIGS / f"{config}.json"), "--seq-len", str(seq),
                         "--tp", "2", "--sp", "--recompute", "selective", *SMALL, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert 0 < d["mfu"] < 1 and d["step_time_s"] > 0
    # the estimator's model FLOPs are the spec's forward FLOPs x 3 (no sliding window in effect here)
    m = with_overrides(load_model(str(CONFIGS / f"{config}.json")), seq_len=seq)
    flops = 3 * m.forward_flops_per_token() * d["tokens_per_s"] / 8
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
    assert code == 0 and "671.03 B parameters, 37.55 B active per token" in out and "not modelled" in out
    code, out, _ = run(capsys, "model", "show", str(CONFIGS / "mixtral.json"), "--json")
    d = json.loads(out)
    assert (d["params"], d["num_experts"], d["source_keys"]["num_local_experts"]) == (46_702_792_704, 8, "used")
    assert d["unmodelled_features"] and d["flops_per_token"]["router"] > 0
    assert main(["model", "show", "llama3-8b", "--layers", "0"]) == 2  # argparse's own check, one line too
    err = capsys.readouterr().err
    assert "--layers: 0 must be a positive integer" in err and err.count("\n") == 1
    code, _, err = run(capsys, "model", "show", "llama3-8b", "--layers", "100000")
    assert code == 2 and "--layers=100000 is above the supported maximum 4096" in err
