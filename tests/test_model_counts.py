"""Parameter and FLOP counts of the model spec against published figures (golden), and their invariants."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.model import ModelSpec, get_preset, load_model, with_overrides
from tpsim.model.counting import keys_per_query

CONFIGS = Path(__file__).parent / "data" / "configs"


def config(name: str) -> ModelSpec:
    return load_model(str(CONFIGS / f"{name}.json"))


# Exact totals: the parameter counts of the published safetensors checkpoints (Hugging Face model pages).
@pytest.mark.parametrize("name,params", [
    ("gpt2", 124_439_808), ("gpt_neox", 20_554_567_680), ("llama", 8_030_261_248), ("mistral", 7_241_732_096),
    ("qwen2", 7_615_616_512), ("gemma", 8_537_680_896), ("gemma2", 9_241_705_984), ("gemma2-27b", 27_227_128_320),
    ("phi3", 3_821_079_552), ("phi3-medium", 13_960_238_080), ("mixtral", 46_702_792_704),
    ("qwen3_moe", 30_532_122_624),
])
def test_total_params_match_published_checkpoints(name, params):
    assert config(name).total_params(padded=False) == params


# Rounded figures from the papers / model cards (total B, active B).
@pytest.mark.parametrize("name,total_b,active_b,rel", [
    ("mixtral", 46.7, 12.9, 0.005),      # Jiang et al. 2024, "Mixtral of Experts", section 2
    ("qwen2_moe", 14.3, 2.7, 0.005),     # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated
    ("qwen3_moe", 30.5, 3.3, 0.02),      # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
])
def test_moe_total_and_active_params(name, total_b, active_b, rel):
    m = config(name)
    assert m.total_params(padded=False) / 1e9 == pytest.approx(total_b, rel=0.005)
    assert m.active_params(padded=False) / 1e9 == pytest.approx(active_b, rel=rel)


# DeepSeek's activated counts leave out the input embedding (a lookup, not a matmul): V2-Lite 2.45B vs 2.4B,
# V2 20.85B vs 21B, V3 36.6B vs 37B (DeepSeek-V2 paper section 1 and appendix; DeepSeek-V3 report section 1).
@pytest.mark.parametrize("name,total_b,active_b", [
    ("deepseek_v2_lite", 15.7, 2.4), ("deepseek_v2", 236.0, 21.0), ("deepseek_v3", 671.0, 37.0),
])
def test_deepseek_total_and_active_params(name, total_b, active_b):
    m = config(name)
    assert m.total_params(padded=False) / 1e9 == pytest.approx(total_b, rel=0.002)
    active_no_input_embedding = m.active_params(padded=False) - m.embedding_params(padded=False)
    assert active_no_input_embedding / 1e9 == pytest.approx(active_b, rel=0.025)


def test_deepseek_v3_mtp_module_makes_the_685b_checkpoint():
    m = config("deepseek_v3")
    # the HF checkpoint (685B) holds the model, one MTP module and copies of the embedding and output head
    with_mtp = m.total_params(padded=False) + m.mtp_params() + 2 * m.vocab_size * m.hidden_size
    assert with_mtp / 1e9 == pytest.approx(685.0, rel=0.002)


@pytest.mark.parametrize("preset,config_name", [("mixtral-8x7b", "mixtral"), ("deepseek-v3", "deepseek_v3"),
                                                ("llama3-8b", "llama")])
def test_presets_agree_with_their_configs(preset, config_name):
    p, c = get_preset(preset), config(config_name)
    assert p.total_params(padded=False) == c.total_params(padded=False)
    assert p.active_params(padded=False) == c.active_params(padded=False)
    assert p.layer_kinds() == with_overrides(c, seq_len=p.seq_len).layer_kinds()


def test_per_layer_counts_deepseek_v3():
    m = get_preset("deepseek-v3")
    kinds = m.layer_kinds()
    assert [k.moe for k in kinds[:4]] == [False, False, False, True] and m.num_moe_layers == 58
    assert m.layer_params(0) == m.dense_layer_params() and m.layer_params(3) == m.moe_layer_params()
    # MLA attention of one layer: q_a 7168x1536 + q_b 1536x(128x192) + kv_a 7168x576 + kv_b 512x(128x256)
    # + o (128x128)x7168 + the two latent norms
    assert m.attention_params() == (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
                                    + 128 * 128 * 7168 + 1536 + 512)
    expert = 3 * 7168 * 2048
    assert m.moe_layer_params() - m.dense_layer_params() == 257 * expert + 256 * 7168 - 3 * 7168 * 18432


def test_qwen_moe_layer_pattern_from_sparse_step_and_mlp_only_layers():
    import json

    cfg = json.loads((CONFIGS / "qwen2_moe.json").read_text())
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[5])
    from tpsim.model import from_hf_config

    m = from_hf_config(cfg)
    # sparse where (i + 1) % 2 == 0 and i not in mlp_only_layers: 1, 3, 7, 9, ...
    assert [i for i in range(m.num_layers) if m.is_moe_layer(i)] == [1, 3, 7, 9, 11, 13, 15, 17, 19, 21, 23]


def test_dense_params_equal_the_estimator_layer_count():
    import numpy as np

    from tpsim.estimator.memory import layer_params_local

    for name in ("gpt3-175b", "llama3-70b"):
        m = get_preset(name)
        assert float(layer_params_local(m, np.array([1]))[0]) == m.layer_params()


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-1t", "llama3-8b", "llama3-405b"])
def test_forward_flops_equal_the_estimator_model_flops(name):
    from tpsim.estimator.core import model_flops_per_sequence

    m = get_preset(name)
    assert 3 * m.forward_flops_per_token() * m.seq_len == pytest.approx(model_flops_per_sequence(m), rel=1e-12)


@pytest.mark.parametrize("path", ["gemma2", "phi3"])
def test_forward_flops_equal_the_estimator_when_the_window_changes_nothing(path):
    from tpsim.estimator.core import model_flops_per_sequence

    m = with_overrides(config(path), seq_len=2047)
    assert 3 * m.forward_flops_per_token() * m.seq_len == pytest.approx(model_flops_per_sequence(m), rel=1e-12)


def test_gpt3_flops_formula():
    # Korthikanti et al. 2022: 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) per batch of B sequences = 3 x forward
    m = get_preset("gpt3-175b")
    s, l, h, v = m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    assert 3 * m.forward_flops_per_token() * s == pytest.approx(72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * h * l)))


def test_moe_flops_count_active_experts_only():
    m = get_preset("mixtral-8x7b")
    f = m.flops_per_token()
    assert f.mlp == pytest.approx(32 * 2 * 2 * 3 * 4096 * 14336)        # 2 experts of 3 matrices, 32 layers
    assert f.router == pytest.approx(32 * 2 * 4096 * 8)
    # linears (excluding scores and logits) are 2 x active non-embedding parameters, less biases/norms
    non_embedding = m.active_params(padded=False) - 2 * m.vocab_size * m.hidden_size
    linear = f.attention_linear + f.mlp + f.router
    assert linear / (2 * non_embedding) == pytest.approx(1.0, rel=1e-4)


def test_sliding_window_flops():
    m = config("mistral")  # window 4096 on every layer
    long = with_overrides(m, seq_len=16384)
    per_key = 4 * m.q_size
    assert long.flops_per_token().attention_scores == pytest.approx(32 * per_key * 4096)
    assert keys_per_query(16384, 0, False) == 16384
    assert keys_per_query(16384, 4096, True) == pytest.approx((4096 * 4097 / 2 + (16384 - 4096) * 4096) / 16384)
    assert keys_per_query(100, 0, True) == pytest.approx(50.5)
    assert long.flops_per_token(causal=True).attention_scores < long.flops_per_token().attention_scores
    g = config("gemma2")  # window on the 21 even layers only
    scores = g.flops_per_token().attention_scores
    assert scores == pytest.approx(4 * g.q_size * (21 * 4096 + 21 * 8192))


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 12), experts=st.integers(1, 16), k=st.integers(1, 16), first=st.integers(0, 11),
       freq=st.integers(1, 4), shared=st.integers(0, 2), window=st.sampled_from([0, 64, 256, 4096]),
       seq=st.sampled_from([128, 512, 2048]))
def test_count_invariants(layers, experts, k, first, freq, shared, window, seq):
    k = min(k, experts)
    first = min(first, layers - 1)
    try:
        m = ModelSpec(name="r", family="llama", num_layers=layers, hidden_size=256, num_attention_heads=4,
                      num_kv_heads=2, ffn_hidden_size=512, vocab_size=1000, seq_len=seq, max_positions=seq,
                      norm="rmsnorm", activation="swiglu", position="rotary", qkv_bias=False, linear_bias=False,
                      num_experts=experts, experts_per_token=k, moe_ffn_hidden_size=128,
                      num_shared_experts=shared, shared_expert_ffn_hidden_size=128 if shared else 0,
                      first_dense_layers=first, moe_layer_freq=freq, sliding_window=window)
    except InputError as exc:  # only "no MoE layer" / "freq above layers" can be refused here
        assert "no layer has the mixture-of-experts MLP" in str(exc) or "exceeds num_layers" in str(exc)
        return
    assert 0 < m.active_params() <= m.total_params()
    assert (m.active_params() == m.total_params()) == (k == experts)
    assert m.total_params() == sum(m.layer_params(i) for i in range(layers)) + m.embedding_params() + m.output_params()
    windowed = m.flops_per_token().attention_scores
    full = ModelSpec(**{**_fields(m), "sliding_window": 0}).flops_per_token().attention_scores
    assert windowed <= full and (windowed == full) == (window == 0 or window >= seq)
    assert m.flops_per_token(causal=True).total <= m.flops_per_token().total


def _fields(m: ModelSpec) -> dict:
    import dataclasses

    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
