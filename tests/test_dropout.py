"""Dropout is a property of the model (its configured probabilities), not of the block family (issue 19):
Nemotron-4 and Llama train without it, GPT-2/GPT-3 with 0.1. Costed only when > 0."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.memory import activation_bytes_per_layer
from tpsim.model import get_preset
from tpsim.model.hf import from_hf_config
from tpsim.plan import make_plan
from tpsim.topology import load_cluster


def _acts(m, **kw):
    one = lambda v: np.array([v])  # noqa: E731
    args = dict(tp=one(1), sp=one(False), micro_batch=one(1), recompute=one(0), attention="flash", act_bytes=2)
    args.update(kw)
    return activation_bytes_per_layer(m, **args)[0]


def test_family_defaults_and_presets():
    assert get_preset("gpt3-175b").hidden_dropout == 0.1 and get_preset("gpt3-175b").attention_dropout == 0.1
    assert get_preset("llama3-8b").hidden_dropout == 0.0
    nemotron = get_preset("nemotron4-340b")  # launcher conf/training/nemotron/nemotron_340b.yaml: 0.0
    assert nemotron.family == "gpt" and nemotron.hidden_dropout == 0.0 and nemotron.attention_dropout == 0.0


def test_hidden_dropout_costs_two_one_byte_masks_only_when_set():
    gpt = get_preset("gpt3-175b")
    off = dataclasses.replace(gpt, hidden_dropout=0.0)
    T, h = gpt.seq_len, gpt.hidden_size
    assert _acts(gpt) - _acts(off) == 2 * T * h
    # the unfused scores keep a 1-byte mask and the 2-byte dropout output only with attention dropout
    no_attn = dataclasses.replace(gpt, attention_dropout=0.0)
    scores = gpt.num_attention_heads * T * T
    assert _acts(gpt, attention="unfused") - _acts(no_attn, attention="unfused") == 3 * scores


def test_dropout_kernels_are_timed_only_when_set():
    gpt = get_preset("gpt3-1.3b")
    cluster = load_cluster("dgx-a100", gpus=8)
    plan = make_plan(gpt, 8, global_batch=32, tp=1, pp=1, micro_batch=4, dtype="bf16")
    with_d = estimate(gpt, cluster, plan)
    without = estimate(dataclasses.replace(gpt, hidden_dropout=0.0, attention_dropout=0.0), cluster, plan)
    assert without.step_time_s < with_d.step_time_s
    assert without.peak_memory_gib < with_d.peak_memory_gib


def test_hf_dropout_keys():
    base = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}
    m = from_hf_config(base)
    assert (m.hidden_dropout, m.attention_dropout) == (0.1, 0.1)  # GPT2Config defaults
    m = from_hf_config(dict(base, resid_pdrop=0.0, attn_pdrop=0.0))
    assert (m.hidden_dropout, m.attention_dropout) == (0.0, 0.0) and m.source_keys["resid_pdrop"] == "used"
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 100, "attention_dropout": 0.1}
    m = from_hf_config(llama)
    assert (m.hidden_dropout, m.attention_dropout) == (0.0, 0.1)
    with pytest.raises(InputError, match="attention_dropout"):
        from_hf_config(dict(llama, attention_dropout=1.5))


def test_bad_probability_is_refused():
    with pytest.raises(InputError, match="hidden_dropout"):
        dataclasses.replace(get_preset("gpt3-175b"), hidden_dropout=-0.1)
