"""Model specs: presets, Hugging Face config.json families, overrides, vocabulary padding, bad input."""

import json

import pytest

from tpsim.errors import InputError
from tpsim.model import PRESETS, from_hf_config, get_preset, load_model, with_overrides


@pytest.mark.parametrize("name,params_b", [("gpt3-175b", 174.6), ("megatron-1t", 1008.0), ("llama3-8b", 8.03),
                                           ("llama3-70b", 70.55), ("llama3-405b", 405.85)])
def test_preset_parameter_counts(name, params_b):
    # published sizes: GPT-3 175B, Megatron 1008B (SC21 Table 1), Llama 3 8.03B / 70.6B / 405.9B
    assert get_preset(name).total_params() / 1e9 == pytest.approx(params_b, rel=0.005)


def test_presets_have_training_defaults():
    for spec in PRESETS.values():
        assert spec.seq_len > 0 and spec.global_batch > 0
        assert {"tp", "cluster", "gpus"} <= set(spec.default_plan)


def test_padded_vocab_megatron_rule():
    gpt = get_preset("gpt3-175b")
    assert gpt.padded_vocab(1) == 50304
    assert gpt.padded_vocab(2) == 50432  # 50257 padded to a multiple of 256
    assert gpt.padded_vocab(8) % 1024 == 0


def test_hf_gpt2():
    cfg = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
           "n_positions": 1024, "n_inner": None}
    m = from_hf_config(cfg)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.seq_len, m.family) == (12, 768, 3072, 1024, "gpt")
    assert m.tie_embeddings and m.position == "learned"
    assert m.total_params() == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small, padded vocab 50304


def test_hf_llama_gqa_head_dim_and_bias():
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False}
    m = from_hf_config(cfg)
    assert m.num_kv_heads == 8 and m.head_dim == 128 and m.seq_len == 8192 and m.gated
    assert not m.qkv_bias


def test_hf_mistral_qwen2_neox():
    mistral = from_hf_config({"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 5120,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                              "intermediate_size": 14336, "vocab_size": 131072, "max_position_embeddings": 4096})
    assert mistral.head_dim == 128 and mistral.q_size == 4096 and mistral.seq_len == 4096
    qwen = from_hf_config({"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
                           "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                           "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False})
    assert qwen.qkv_bias and qwen.num_kv_heads == 4
    neox = from_hf_config({"model_type": "gpt_neox", "num_hidden_layers": 44, "hidden_size": 6144,
                           "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
                           "max_position_embeddings": 2048})
    assert neox.family == "gpt" and neox.position == "rotary"


def test_unknown_model_type_is_one_clear_error():
    with pytest.raises(InputError, match="model_type='bert' is not supported"):
        from_hf_config({"model_type": "bert"})


def test_missing_field_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(InputError, match="missing field 'num_attention_heads'|missing field 'num_hidden_layers'"):
        load_model(str(path))


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_model(str(path))


def test_unknown_preset():
    with pytest.raises(InputError, match="not a preset"):
        load_model("gpt5-10t")


def test_overrides():
    m = with_overrides(get_preset("gpt3-175b"), layers=4, hidden=1024, heads=16, seq_len=512)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.head_dim, m.seq_len) == (4, 1024, 4096, 64, 512)
    with pytest.raises(InputError, match="--heads=7 does not divide --hidden=1024"):
        with_overrides(get_preset("gpt3-175b"), hidden=1024, heads=7)


def test_non_positive_field():
    with pytest.raises(InputError, match="n_layer=0 must be >= 1"):
        from_hf_config({"model_type": "gpt2", "n_layer": 0, "n_embd": 64, "n_head": 4, "vocab_size": 100,
                        "n_positions": 128})
