"""The validation's mixture-of-experts layer without a process group: the dispatcher's permutation and combine
against a token-by-token reference, the experts' split, the expert FFN override and the tiny twin."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from tpsim.errors import InputError  # noqa: E402
from tpsim.model import PRESETS, with_overrides  # noqa: E402
from tpsim.validate.axis.case import AxisCase, moe_layer_model, with_expert_ffn  # noqa: E402
from tpsim.validate.axis.scale import overhead_case  # noqa: E402
from tpsim.validate.modules.moe import MoEFeedForward, init_moe  # noqa: E402

MIXTRAL = with_expert_ffn(moe_layer_model(with_overrides(PRESETS["mixtral-8x7b"], hidden=32, heads=4, kv_heads=2,
                                                         ffn=64, seq_len=16, layers=1)), 24)
QWEN_LIKE = dataclasses.replace(MIXTRAL, num_shared_experts=1, shared_expert_ffn_hidden_size=40, shared_expert_gate=True)


def _moe(model):
    moe = MoEFeedForward(model).double()
    init_moe(moe, torch.Generator().manual_seed(0))
    return moe


@pytest.mark.parametrize("model", [MIXTRAL, QWEN_LIKE], ids=["routed", "shared+gate"])
def test_dispatch_and_combine_equal_token_by_token_experts(model):
    """Every token: the sum over its top-k experts of the renormalized probability times the expert's SwiGLU MLP,
    plus the (gated) shared expert: what the permutation, the per-expert GEMMs and the unpermutation compute."""
    moe = _moe(model)
    x = torch.randn(3, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = moe(x)
    tokens = x.reshape(-1, 32)
    scores = torch.softmax(tokens @ moe.router.weight.t(), dim=-1)
    w = moe.experts
    want = torch.zeros_like(tokens)
    for t, xt in enumerate(tokens):
        top, idx = scores[t].topk(model.experts_per_token)
        for p, e in zip(top / top.sum(), idx.tolist()):
            want[t] += p * ((torch.nn.functional.silu(w.w1[e] @ xt) * (w.w3[e] @ xt)) @ w.w2[e].t())
        if moe.shared is not None:
            s = moe.shared
            want[t] += s.w2(torch.nn.functional.silu(s.w1(xt)) * s.w3(xt)) * torch.sigmoid(s.gate(xt))
    torch.testing.assert_close(y.reshape(-1, 32), want, rtol=0, atol=1e-12)
    assert moe.load == tokens.shape[0] * model.experts_per_token
    y.sum().backward()
    assert all(p.grad is not None for p in moe.parameters())


def test_expert_ffn_override_keeps_the_shared_ratio():
    m = with_expert_ffn(PRESETS["deepseek-v3"], 512)
    assert m.moe_ffn_hidden_size == 512 and m.shared_expert_ffn_hidden_size == 512
    q = with_expert_ffn(dataclasses.replace(MIXTRAL, num_shared_experts=1, shared_expert_ffn_hidden_size=96), 48)
    assert q.shared_expert_ffn_hidden_size == 192
    with pytest.raises(InputError, match="--moe-ffn"):
        with_expert_ffn(MIXTRAL, 0)


def test_the_validated_layer_is_a_moe_layer():
    m = moe_layer_model(PRESETS["deepseek-v3"])
    assert m.num_layers == 1 and m.first_dense_layers == 0 and m.is_moe_layer(0)


def test_tiny_twin_keeps_axes_experts_and_gqa():
    case = AxisCase(model=with_overrides(QWEN_LIKE, hidden=512, heads=8, kv_heads=4, seq_len=512), cp=2, ep=2,
                    micro_batch=3)
    twin = overhead_case(case)
    m = twin.model
    assert (twin.cp, twin.ep, twin.dp, twin.cp_kind) == (2, 2, 1, "ring")
    assert (m.num_experts, m.experts_per_token, m.num_shared_experts) == (8, 2, 1)
    assert m.num_kv_heads < m.num_attention_heads and m.seq_len == 16 and twin.micro_batch == 1


def test_tiny_twin_of_latent_attention_is_a_valid_model():
    ds = with_expert_ffn(moe_layer_model(with_overrides(PRESETS["deepseek-v3"], hidden=512, heads=8, seq_len=512,
                                                        experts=8, top_k=2)), 512)
    twin = overhead_case(AxisCase(model=ds, cp=2, ep=2))
    m = twin.model
    assert m.attention_kind == "mla" and m.head_dim == m.qk_nope_head_dim + m.qk_rope_head_dim == 32
    assert m.q_lora_rank == 64 and m.kv_lora_rank == 64 and m.num_shared_experts == 1
