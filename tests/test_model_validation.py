"""Issue 13 for model configs: every field checked for type, range and consistency; config files read
defensively; overrides checked the same way. Every failure is one InputError line naming the field and value."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.limits import LIMITS, MAX_CONFIG_BYTES, MAX_JSON_DEPTH
from tpsim.model import ModelSpec, from_hf_config, get_preset, load_model, parse_json_object, with_overrides

CONFIGS = Path(__file__).parent / "data" / "configs"


def cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def refused(config: dict, needle: str) -> str:
    with pytest.raises(InputError) as info:
        from_hf_config(config, source="c.json")
    text = str(info.value)
    assert "\n" not in text
    assert needle in text, text
    return text


# ---- numbers: type and range ------------------------------------------------------------------------
@pytest.mark.parametrize("value,needle", [
    ("32", "num_hidden_layers='32' must be an integer"),
    (True, "num_hidden_layers=True must be an integer"),
    ([32], "num_hidden_layers=[32] must be an integer"),
    ({"n": 32}, "must be an integer"),
    (32.5, "num_hidden_layers=32.5 must be an integer"),
    (math.nan, "num_hidden_layers=nan must be an integer"),
    (math.inf, "num_hidden_layers=inf must be an integer"),
    (0, "num_hidden_layers=0 must be >= 1"),
    (-4, "num_hidden_layers=-4 must be >= 1"),
    (1e30, "is above the supported maximum"),
    (10 ** 400, "is above the supported maximum 4096"),
])
def test_numeric_field_type_and_range(value, needle):
    c = cfg("llama")
    c["num_hidden_layers"] = value
    refused(c, needle)


def test_integral_floats_are_integers():
    c = cfg("llama")
    c["num_hidden_layers"] = 32.0
    assert from_hf_config(c).num_layers == 32


@pytest.mark.parametrize("name,key", [
    ("llama", "hidden_size"), ("llama", "intermediate_size"), ("llama", "vocab_size"),
    ("llama", "max_position_embeddings"), ("llama", "head_dim"), ("mistral", "sliding_window"),
    ("mixtral", "num_local_experts"), ("mixtral", "num_experts_per_tok"), ("qwen2_moe", "moe_intermediate_size"),
    ("qwen2_moe", "shared_expert_intermediate_size"), ("deepseek_v3", "kv_lora_rank"),
    ("deepseek_v3", "q_lora_rank"), ("deepseek_v3", "first_k_dense_replace"), ("deepseek_v3", "n_group"),
    ("deepseek_v3", "num_nextn_predict_layers"), ("gpt2", "n_embd"), ("gpt_neox", "num_attention_heads"),
])
@pytest.mark.parametrize("bad", ["8", 2.5, True, 1 << 40])
def test_every_numeric_key_is_checked(name, key, bad):
    c = cfg(name)
    c[key] = bad
    text = refused(c, f"{key}=")
    assert "must be an integer" in text or "above the supported maximum" in text


@pytest.mark.parametrize("value", [1, 0, "true", "false", [True], 1.0])
def test_booleans_accept_only_json_booleans(value):
    c = cfg("llama")
    c["tie_word_embeddings"] = value
    refused(c, f"tie_word_embeddings={value!r} must be true or false")


@pytest.mark.parametrize("value", [0, 1.5, -0.25, "0.25", math.nan, True, 10 ** 40])
def test_fractions_are_checked(value):
    c = cfg("gpt_neox")
    c["rotary_pct"] = value
    refused(c, "rotary_pct=")


# ---- consistency ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,changes,needle", [
    ("llama", dict(num_key_value_heads=0), "num_key_value_heads=0 must be >= 1"),
    ("llama", dict(num_key_value_heads=3), "num_kv_heads=3 does not divide num_attention_heads=32"),
    ("llama", dict(num_key_value_heads=64), "num_kv_heads=64 does not divide num_attention_heads=32"),
    ("llama", dict(hidden_size=4001), "hidden_size=4001 is not a multiple of num_attention_heads=32"),
    ("mixtral", dict(num_experts_per_tok=9), "experts_per_token=9 must be between 1 and num_experts=8"),
    ("mixtral", dict(num_local_experts=0), "num_local_experts=0 must be >= 1"),
    ("deepseek_v3", dict(first_k_dense_replace=61), "first_dense_layers=61 leaves no mixture-of-experts layer"),
    ("deepseek_v3", dict(n_group=7), "router_groups=7 does not divide num_experts=256"),
    ("deepseek_v3", dict(topk_group=9), "router_group_topk=9 must be between 1 and router_groups=8"),
    ("deepseek_v3", dict(num_experts_per_tok=200), "exceeds the 128 experts of router_group_topk=4 groups"),
    ("deepseek_v3", dict(num_key_value_heads=16), "must equal num_attention_heads=128"),
    ("deepseek_v3", dict(moe_layer_freq=100), "moe_layer_freq=100 exceeds num_layers=61"),
    ("qwen2_moe", dict(mlp_only_layers=[3, 24]), "mlp_only_layers[1]=24 is above the supported maximum 23"),
    ("qwen2_moe", dict(mlp_only_layers="3"), "mlp_only_layers='3' must be a list"),
    ("qwen2_moe", dict(decoder_sparse_step=48), "no layer has the mixture-of-experts MLP"),
    ("qwen2", dict(use_sliding_window=True, layer_types=["full_attention"] * 3),
     "layer_types must be a list of num_hidden_layers=28 entries"),
])
def test_consistency(name, changes, needle):
    c = cfg(name)
    c.update(changes)
    refused(c, needle)


def test_missing_required_field():
    c = cfg("llama")
    del c["hidden_size"]
    refused(c, "missing field 'hidden_size'")


def test_spec_fields_checked_directly():
    base = dict(name="m", family="llama", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                ffn_hidden_size=128, vocab_size=100, seq_len=16, max_positions=16, norm="rmsnorm",
                activation="swiglu", position="rotary")
    ModelSpec(**base)
    for changes, needle in [
        (dict(num_layers=5000), "num_layers=5000 is above the supported maximum 4096"),
        (dict(tie_embeddings=1), "tie_embeddings=1 must be true or false"),
        (dict(activation="relu"), "activation='relu' is not one of gelu, swiglu, geglu"),
        (dict(num_experts=0, experts_per_token=2), "experts_per_token=2 needs num_experts > 0"),
        (dict(kv_lora_rank=64), "kv_lora_rank=64 needs attention_kind='mla'"),
        (dict(full_attention_layers=(0,)), "full_attention_layers given without a sliding_window"),
        (dict(sliding_window=8, full_attention_layers=(1, 0)), "must be sorted and without repeats"),
        (dict(rotary_fraction=math.nan), "rotary_fraction=nan must be a finite number"),
        (dict(capacity_factor=0.5, num_experts=2, experts_per_token=1, moe_ffn_hidden_size=8),
         "capacity_factor=0.5 must be 0 (dropless) or >= 1"),
    ]:
        with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            ModelSpec(**{**base, **changes})


# ---- files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe{}", "not UTF-8 text (byte 0xff at offset 0)"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b"", "malformed JSON"),
    (b"{not json", "malformed JSON"),
    (b'{"model_type": "llama", "hidden_size": NaN}', "NaN is not a JSON number"),
    (b'{"model_type": "llama", "hidden_size": Infinity}', "Infinity is not a JSON number"),
    (b'{"model_type": "llama", "hidden_size": 1e999}', "is out of range"),
    (b'{"model_type": "llama", "model_type": "mistral"}', "key 'model_type' appears twice"),
    (b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "nested deeper than"),
    (b'{"a": 1' + b"0" * 5000 + b"}", "numbers have at most 40 digits"),  # refused before decoding (issue 26)
])
def test_bad_files(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_file_size_and_kind(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b'{"a": "' + b"x" * MAX_CONFIG_BYTES + b'"}')
    with pytest.raises(InputError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_model(str(big))
    with pytest.raises(InputError, match="does not exist"):
        load_model(str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match="does not exist"):
        load_model(str(tmp_path))  # a folder without config.json
    if Path("/dev/null").exists():
        with pytest.raises(InputError, match="not a regular file"):
            load_model("/dev/null")


def test_brackets_inside_strings_do_not_count_as_depth():
    text = json.dumps({"model_type": "gpt2", "note": "[" * 500})
    assert parse_json_object(text, "s")["note"] == "[" * 500


def test_bom_is_accepted(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + (CONFIGS / "mistral.json").read_bytes())
    assert load_model(str(path)).num_layers == 32


# ---- overrides -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,needle", [
    (dict(layers=0), "--layers=0 must be >= 1"),
    (dict(layers=10 ** 9), "--layers=1000000000 is above the supported maximum 4096"),
    (dict(kv_heads=0), "--kv-heads=0 must be >= 1"),
    (dict(kv_heads=3), "num_kv_heads=3 does not divide num_attention_heads=32"),
    (dict(seq_len=True), "--seq-len=True must be an integer"),
    (dict(hidden=1000), "--heads=32 does not divide --hidden=1000"),
    (dict(experts=4), "--experts needs a mixture-of-experts model; model llama3-8b is dense"),
    (dict(vocab=LIMITS["vocab_size"] + 1), "is above the supported maximum"),
])
def test_overrides_are_checked(changes, needle):
    with pytest.raises(InputError) as info:
        with_overrides(get_preset("llama3-8b"), **changes)
    assert needle in str(info.value)


def test_moe_overrides():
    m = with_overrides(get_preset("mixtral-8x7b"), experts=16, top_k=4)
    assert (m.num_experts, m.experts_per_token) == (16, 4)
    with pytest.raises(InputError, match="experts_per_token=9 must be between 1 and num_experts=8"):
        with_overrides(get_preset("mixtral-8x7b"), top_k=9)


def test_layer_override_repeats_the_layer_pattern():
    g = load_model(str(CONFIGS / "gemma2.json"))
    assert with_overrides(g, layers=4).full_attention_layers == (1, 3)
    assert with_overrides(g, layers=44).full_attention_layers == tuple(range(1, 44, 2))
    small = with_overrides(get_preset("deepseek-v3"), layers=5)
    assert [small.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    with pytest.raises(InputError, match="first_dense_layers=3 leaves no mixture-of-experts layer"):
        with_overrides(get_preset("deepseek-v3"), layers=3)


def test_explicit_head_dim_survives_hidden_override():
    g = load_model(str(CONFIGS / "gemma.json"))
    assert with_overrides(g, hidden=1024).head_dim == 256
    assert with_overrides(get_preset("llama3-8b"), hidden=1024, heads=8).head_dim == 128


# ---- fuzz: whatever a config holds, the loader returns a spec or raises InputError --------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), data=st.data())
def test_fuzz_config_values(name, data):
    c = cfg(name)
    keys = sorted(c) + ["num_experts", "sliding_window", "layer_types", "head_dim", "num_key_value_heads",
                        "mlp_only_layers", "q_lora_rank", "unknown_key"]
    for _ in range(data.draw(st.integers(1, 3))):
        c[data.draw(st.sampled_from(keys))] = data.draw(JSON_VALUES)
    try:
        m = from_hf_config(c, source="fuzz.json")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.json: ")
        return
    total, active = m.total_params(), m.active_params()
    assert 0 < active <= total
    assert math.isfinite(m.forward_flops_per_token()) and m.forward_flops_per_token() > 0
    assert m.summary()
