"""The MoE presets' published plans and the memory physics they need: DeepSeek-V3 under its report's training
stack (tpsim/data/stacks/hai-llm.yaml: BF16 Adam moments, recomputation of the norms, MLA up-projections and
the MoE SwiGLU outputs, FP8 activation caching, DualPipe's mirrored stages), each term by hand."""

from __future__ import annotations

import dataclasses


import numpy as np
import pytest

from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.memory import activation_bytes_per_layer
from tpsim.estimator.moe import expert_shape
from tpsim.estimator.stackterms import stack_terms
from tpsim.model import get_preset, with_overrides
from tpsim.plan import Plan, make_plan
from tpsim.stacks import load_stack, profile_from_mapping
from tpsim.topology import load_cluster

GIB = 2 ** 30


def test_hai_llm_profile_carries_the_reports_memory_choices():
    s = load_stack("hai-llm")
    assert s.name == "hai-llm" and s.sources and all(f.source for sec in ("comm", "compute", "memory")
                                                     for f in getattr(s, sec).values())
    t = stack_terms(s)
    assert t.optimizer_state_bytes == 4.0 and t.main_params_bytes == 4.0 and t.grad_buffer_bytes == 4.0
    assert t.activation_storage.recompute_modules == {"layernorm", "mla_up_proj", "moe_act"}
    assert t.activation_storage.cache_bytes("fp8", 2) == (1.0, 1.5)
    assert t.activation_storage.cache_bytes("bf16", 2) == (2, 2)
    assert s.rules.schedules.keys() == {"dualpipe"} and s.rules.default_schedule == "dualpipe"
    megatron = stack_terms(load_stack("megatron"))
    assert megatron.activation_storage.recompute_modules == {"core_attn"}
    assert load_stack("megatron").rules.default_schedule == "1f1b"
    # what the report's run did not use is refused, naming the rule
    m = get_preset("deepseek-v3")
    assert "cp=2" in s.plan_violation(Plan(tp=1, cp=2, ep=64, pp=16, dp=64, global_batch=15360, zero=1,
                                           dtype="fp8"), m)


def test_bad_storage_figures_are_one_line_errors():
    import yaml

    from tpsim.stacks import STACKS_DIR
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    raw["memory"]["selective_recompute_modules"]["value"] = ["layernorm", "everything"]
    with pytest.raises(InputError, match=r"memory\.selective_recompute_modules=.*must be a list of"):
        stack_terms(profile_from_mapping(raw, "x.yaml"))
    raw = yaml.safe_load((STACKS_DIR / "hai-llm.yaml").read_text())
    raw["memory"]["fp8_activation_cache_bytes"]["value"] = 3
    with pytest.raises(InputError, match=r"memory\.fp8_activation_cache_bytes=3 must be bytes"):
        stack_terms(profile_from_mapping(raw, "x.yaml"))


def test_selective_recompute_modules_and_fp8_cache_by_hand():
    """One DeepSeek-V3 MoE layer, tp 1, ep 8, one sequence, FP8 training under HAI-LLM: bytes per token of the
    stored norm inputs (4h), the attention output in E5M6 (1.5 B x heads x v), the MLA latents in FP8, the
    shared expert's GEMM output (2 x 2f) and FP8 SwiGLU output (f), per routed copy its FP8 input (h) and FP8
    SwiGLU input (2f), the router's fp32 scores + map (5 E) and flash attention's fp32 log-sum-exp (4 heads)."""
    m = with_overrides(get_preset("deepseek-v3"), seq_len=1024)
    kind = [k for k in m.layer_kinds() if k.moe][0]
    one = lambda v: np.array([v])  # noqa: E731
    kw = dict(tp=one(1), sp=one(False), micro_batch=one(1), attention="flash", act_bytes=2, cp=one(1),
              kind=kind, ep=one(8), etp=one(1))
    got = activation_bytes_per_layer(m, recompute=one(1), modules=frozenset({"layernorm", "mla_up_proj",
                                                                             "moe_act"}),
                                     linear_bytes=1.0, attn_out_bytes=1.5, attn_out_shared=True, **kw)[0]
    T = m.seq_len
    h, H, f, fs = m.hidden_size, m.num_attention_heads, m.moe_ffn_hidden_size, m.shared_expert_ffn_hidden_size
    shape = expert_shape(m, tokens_total=one(float(T)), tp=one(1), sp=one(False), ep=one(8), etp=one(1))
    copies = float(shape.copies[0])
    latents = m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim
    per_token = (4 * h + 1.5 * H * m.v_head_dim + latents + (4 + 1) * fs + 5 * m.num_experts + 4 * H)
    expected = T * per_token + copies * (h + 2 * f)
    assert got == pytest.approx(expected, rel=1e-12)
    # none of it without recomputation and in 16 bits: q, k, v, both norm outputs and the experts' outputs stored
    plain = activation_bytes_per_layer(m, recompute=one(0), **kw)[0]
    qk = H * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    full16 = T * (8 * h + 2 * (2 * qk + H * m.v_head_dim) + 2 * H * m.v_head_dim + 2 * latents + 6 * fs
                  + 5 * m.num_experts + 4 * H) + copies * (2 * h + 6 * f)
    assert plain == pytest.approx(full16, rel=1e-12)


def test_dualpipe_mirrored_stages_hold_both_ends():
    """Under HAI-LLM's DualPipe rank r also holds stage pp - 1 - r: the first and the last rank hold the
    embedding, the first layers, the last layers, the output layer and the MTP module (which uses the rank's
    own embedding: no copy), a middle rank two middle stages."""
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import layer_costs, plan_patterns
    from tpsim.plan import PlanBatch

    m = with_overrides(get_preset("deepseek-v3"), layers=8, seq_len=1024)
    c = load_cluster("dgx-h100", gpus=16)
    plan = Plan(tp=1, pp=4, ep=4, dp=4, global_batch=16, zero=1, dtype="bf16", recompute="selective")
    parts = {}
    for stack in ("megatron", "hai-llm"):
        ctx = context_for(m, c, stack=stack)
        b = PlanBatch.from_plans([dataclasses.replace(plan, schedule=ctx.stack.rules.default_schedule)])
        costs, keys = layer_costs(ctx, b)
        parts[stack] = (plan_patterns(ctx, b, costs, keys)[0], costs)
    (one_f, costs), (two, _) = parts["megatron"], parts["hai-llm"]
    emb = m.padded_vocab(1) * m.hidden_size
    # 1F1B: the last rank holds an embedding copy for the MTP module; DualPipe's rank holds the real one
    assert two.params[0, 0] == pytest.approx(one_f.params[0, 0] + one_f.params[1, 0] - emb)
    assert two.params[1, 0] == pytest.approx(two.params[0, 0])
    assert two.params[2, 0] == pytest.approx(2 * one_f.params[2, 0])
    assert two.expert[0, 0] == pytest.approx(one_f.expert[0, 0] + one_f.expert[1, 0])


@pytest.fixture(scope="module")
def deepseek():
    m = get_preset("deepseek-v3")
    plan_fields = dict(m.default_plan)
    cluster = load_cluster(plan_fields.pop("cluster"), gpus=plan_fields.pop("gpus"))
    stack = plan_fields.pop("stack")
    # the stack's own schedule (DualPipe: what `tpsim estimate --model deepseek-v3` runs)
    plan_fields["schedule"] = load_stack(stack).rules.default_schedule
    return m, cluster, stack, make_plan(m, cluster.num_gpus, global_batch=m.global_batch, **plan_fields)


def test_deepseek_v3_preset_is_the_published_plan(deepseek):
    """Report section 3.2: 2048 GPUs, 16-way pipeline, 64-way EP, ZeRO-1, no TP, FP8, selective
    recomputation (RMSNorm, MLA up-projections), global batch 15360 of 4096 tokens, HAI-LLM."""
    m, cluster, stack, plan = deepseek
    assert (cluster.num_gpus, plan.tp, plan.pp, plan.ep, plan.zero, plan.dtype, plan.recompute) == \
        (2048, 1, 16, 64, 1, "fp8", "selective")
    assert plan.dp == 128 and plan.edp == 2 and stack == "hai-llm" and m.global_batch * m.seq_len == 15360 * 4096


def test_deepseek_v3_preset_memory_terms_by_hand(deepseek):
    """The peak rank's model states under HAI-LLM: weights 2 B + the fp8 casts 2 B (none for the embedding, the
    output head, the final norm and the MTP module's norms: they stay BF16; the MTP embedding is the first
    stage's, held once on DualPipe's edge rank), fp32 gradients 4 B, master 4 B + BF16 moments 4 B sharded
    (ZeRO-1) over dp = 128 for dense and edp = 2 for routed-expert parameters."""
    from tpsim.estimator.context import context_for
    from tpsim.estimator.core import layer_costs, plan_patterns
    from tpsim.plan import PlanBatch

    m, cluster, stack, plan = deepseek
    e = estimate(m, cluster, plan, stack=stack)
    ctx = context_for(m, cluster, stack=stack)
    b = PlanBatch.from_plans([plan])
    costs, keys = layer_costs(ctx, b)
    part = plan_patterns(ctx, b, costs, keys)[0]
    pos = int(np.argmax(part.params[:, 0]))  # the edge ranks (both ends) hold the most
    params, experts = part.params[pos, 0], part.expert[pos, 0]
    h = m.hidden_size
    uncached = 2 * m.padded_vocab(1) * h + h + m.mtp_layers * 2 * h  # embedding, head, final norm, MTP norms
    assert e.memory_gib["weights"] * GIB == pytest.approx(4.0 * params - 2.0 * uncached, rel=1e-9)
    assert e.memory_gib["grads"] * GIB == pytest.approx(4.0 * params, rel=1e-9)
    assert e.memory_gib["optimizer_states"] * GIB == pytest.approx(8.0 * ((params - experts) / 128 + experts / 2),
                                                                    rel=1e-9)
    assert sum(e.memory_gib.values()) == pytest.approx(e.peak_memory_gib, rel=1e-9)


def test_mixtral_preset_plan_fits_under_megatron():
    """Megatron-LM's Mixtral 8x7B recipe (TP1 EP8 PP4, distributed optimizer, bf16) fits an 80 GB H100."""
    m = get_preset("mixtral-8x7b")
    fields = dict(m.default_plan)
    cluster = load_cluster(fields.pop("cluster"), gpus=fields.pop("gpus"))
    plan = make_plan(m, cluster.num_gpus, global_batch=m.global_batch, **fields)
    e = estimate(m, cluster, plan)
    assert plan.edp == 2 and e.fits
    per_rank_experts = m.num_layers / 4 * m.num_experts / 8 * 3 * m.hidden_size * m.moe_ffn_hidden_size
    assert e.memory_gib["optimizer_states"] * GIB > 12.0 * per_rank_experts / 2  # experts' states over edp = 2
