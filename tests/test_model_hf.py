"""Hugging Face config.json types: what each reads, and that every key is used, listed as harmless, or refused."""

import json
from pathlib import Path

import pytest

from tpsim.errors import InputError
from tpsim.model import HF_TYPES, from_hf_config, load_model

CONFIGS = Path(__file__).parent / "data" / "configs"


def cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def load(name: str, **changes):
    c = cfg(name)
    for key, value in changes.items():
        if value is ...:
            c.pop(key, None)
        else:
            c[key] = value
    return from_hf_config(c, name=name)


def test_one_fixture_per_supported_type():
    types = {cfg(p.stem)["model_type"] for p in CONFIGS.glob("*.json")}
    assert types == set(HF_TYPES)


@pytest.mark.parametrize("path", sorted(p.stem for p in CONFIGS.glob("*.json")))
def test_every_key_is_used_or_listed(path):
    m = load_model(str(CONFIGS / f"{path}.json"))
    assert set(m.source_keys) == set(cfg(path))
    assert all(v == "used" or v.startswith("ignored: ") for v in m.source_keys.values())
    assert m.architecture == cfg(path)["model_type"]
    assert {"num_attention_heads", "vocab_size"} & set(m.used_keys) or path == "gpt2"


def test_dense_types():
    gpt2 = load("gpt2")
    assert (gpt2.family, gpt2.activation, gpt2.position, gpt2.tie_embeddings, gpt2.seq_len) == \
        ("gpt", "gelu", "learned", True, 1024)
    assert "summary_type" in gpt2.ignored_keys and "n_ctx" in gpt2.ignored_keys
    neox = load("gpt_neox")
    assert neox.parallel_residual and neox.rotary_fraction == 0.25 and neox.family == "gpt" and neox.qkv_bias
    llama = load("llama")
    assert (llama.seq_len, llama.max_positions, llama.num_kv_heads) == (8192, 131072, 8)
    assert "llama3" in llama.ignored_keys["rope_scaling"]
    gemma = load("gemma")
    assert gemma.activation == "geglu" and gemma.gated and gemma.head_dim == 256 and gemma.q_size == 4096
    assert gemma.tie_embeddings  # transformers' Gemma default: the key is absent from the published config
    qwen = load("qwen2")
    assert qwen.qkv_bias and not qwen.linear_bias and qwen.sliding_window == 0
    assert "use_sliding_window is false" in qwen.ignored_keys["sliding_window"]


def test_sliding_windows():
    mistral = load("mistral")
    assert mistral.sliding_window == 4096 and mistral.full_attention_layers == ()
    assert load("mistral", sliding_window=...).sliding_window == 4096   # transformers' default when absent
    assert load("mistral", sliding_window=None).sliding_window == 0     # null: no window
    phi3 = load("phi3")
    assert phi3.sliding_window == 2047 and phi3.layer_window(31) == 2047
    gemma2 = load("gemma2")
    assert gemma2.norms_per_layer == 4 and gemma2.sliding_window == 4096
    assert gemma2.full_attention_layers == tuple(range(1, 42, 2))      # even layers slide
    assert "not costed" in gemma2.ignored_keys["attn_logit_softcapping"]
    assert "not costed" in gemma2.ignored_keys["final_logit_softcapping"]
    qwen = load("qwen2", use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    assert [qwen.layer_window(i) for i in (19, 20, 27)] == [0, 4096, 4096]  # layers >= max_window_layers slide
    types = ["full_attention", "sliding_attention"] * 14
    explicit = load("qwen2", use_sliding_window=True, sliding_window=1024, layer_types=types)
    assert explicit.full_attention_layers == tuple(range(0, 28, 2))
    everywhere_full = load("qwen2", use_sliding_window=True, max_window_layers=28)
    assert everywhere_full.sliding_window == 0


def test_moe_types():
    mixtral = load("mixtral")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.moe_ffn_hidden_size) == (8, 2, 14336)
    assert mixtral.sliding_window == 0 and mixtral.num_moe_layers == 32
    qwen = load("qwen2_moe")
    assert (qwen.num_experts, qwen.experts_per_token, qwen.num_shared_experts, qwen.shared_expert_ffn_hidden_size,
            qwen.shared_expert_gate, qwen.qkv_bias) == (60, 4, 1, 5632, True, True)
    qwen3 = load("qwen3_moe")
    assert qwen3.qk_norm and qwen3.head_dim == 128 and qwen3.num_shared_experts == 0
    assert qwen3.experts_per_token == 8 and "max_window_layers" in qwen3.ignored_keys
    dense = load("qwen3_moe", num_experts=0)
    assert not dense.is_moe and "num_experts is 0" in dense.ignored_keys["moe_intermediate_size"]


def test_deepseek_types():
    v3 = load("deepseek_v3")
    assert v3.attention_kind == "mla" and v3.head_dim == 192 and v3.q_lora_rank == 1536
    assert (v3.first_dense_layers, v3.router_groups, v3.router_group_topk, v3.mtp_layers) == (3, 8, 4, 1)
    assert "storage" in v3.ignored_keys["quantization_config"] and "yarn" in v3.ignored_keys["rope_scaling"]
    lite = load("deepseek_v2_lite")
    assert lite.q_lora_rank == 0 and lite.router_groups == 0 and "does not limit groups" in lite.ignored_keys["n_group"]
    v2 = load("deepseek_v2")
    assert (v2.router_groups, v2.router_group_topk, v2.num_shared_experts) == (8, 3, 2)
    dense = load("deepseek_v3", n_routed_experts=None)
    assert not dense.is_moe and dense.attention_kind == "mla"


@pytest.mark.parametrize("name,key,value,needle", [
    ("llama", "num_local_experts", 8, "key 'num_local_experts' describes a mixture of experts"),
    ("qwen2", "moe_intermediate_size", 1408, "describes a mixture of experts, but model_type='qwen2' is dense"),
    ("llama", "router_aux_loss_coef", 0.01, "describes a mixture of experts"),
    ("mistral", "kv_lora_rank", 512, "describes multi-head latent attention"),
    ("llama", "sliding_window", 4096, "key 'sliding_window' describes an attention variant"),
    ("llama", "layer_types", ["full_attention"] * 32, "attention variant"),
    ("phi3", "attention_type", "local", "attention variant"),
    ("llama", "some_new_knob", 3, "unknown key 'some_new_knob' for model_type='llama'"),
    ("qwen2", "layer_types", ["linear_attention"] * 28, "use_sliding_window is false|attention variant"),
    ("llama", "rope_scaling", {"rope_type": "mrope"}, "rope_scaling type 'mrope' is not a known rotary scaling"),
    ("llama", "rope_scaling", [1, 2], "rope_scaling=\\[1, 2\\] must be an object"),
    ("llama", "is_encoder_decoder", True, "is_encoder_decoder=True is not supported"),
    ("gpt2", "add_cross_attention", True, "cross-attention"),
    ("llama", "pruned_heads", {"0": [1]}, "pruned heads change every layer's shape"),
    ("gemma2", "use_bidirectional_attention", True, "bidirectional"),
    ("gemma2", "sliding_window_size", 2048, "sliding_window_size=2048 disagrees with sliding_window=4096"),
    ("llama", "hidden_act", "relu", "hidden_act='relu' is not supported for a gated MLP"),
    ("gpt2", "activation_function", "relu", "activation_function='relu' is not supported for a GeLU MLP"),
    ("deepseek_v3", "attention_bias", True, "attention_bias=True is not supported"),
    ("phi3", "attention_bias", True, "Phi-3 has no attention bias"),
])
def test_keys_the_model_cannot_honour_are_refused(name, key, value, needle):
    c = cfg(name)
    if key == "layer_types" and name == "qwen2":
        c.update(use_sliding_window=True)
    c[key] = value
    with pytest.raises(InputError, match=needle):
        from_hf_config(c, source="x/config.json")


def test_refusal_is_one_line_naming_file_and_key():
    c = cfg("llama")
    c["num_experts"] = 8
    with pytest.raises(InputError) as info:
        from_hf_config(c, source="x/config.json")
    text = str(info.value)
    assert "\n" not in text and text.startswith("x/config.json: ") and "'num_experts'" in text


def test_null_values_are_absent():
    c = cfg("llama")
    c.update(num_experts=None, sliding_window=None, some_future_key=None)
    m = from_hf_config(c)
    assert m.ignored_keys["num_experts"] == "null (absent)" and not m.is_moe


def test_unknown_model_type_is_one_clear_error():
    with pytest.raises(InputError, match="model_type='bert' is not supported"):
        from_hf_config({"model_type": "bert"})
    with pytest.raises(InputError, match="model_type=None is not supported"):
        from_hf_config({"hidden_size": 64})


def test_the_key_table_is_documented():
    from tpsim.model.hf_keys import HARMLESS, MOE_HARMLESS, ROPE_TYPES

    doc = (Path(__file__).parents[1] / "docs" / "MODELS.md").read_text()
    missing = [k for k in (*HARMLESS, *MOE_HARMLESS, *ROPE_TYPES, *HF_TYPES) if f"`{k}`" not in doc and k not in doc]
    assert not missing, missing
