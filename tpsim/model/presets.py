"""Built-in model presets, each with its typical training plan and global batch, and their sources."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import InputError, did_you_mean
from .spec import ModelSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int, gbs: int,
         plan: Mapping[str, Any], ffn: int | None = None, max_pos: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, family="gpt", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=ffn or 4 * hidden, vocab_size=vocab, seq_len=seq,
                     max_positions=max_pos or seq, norm="layernorm", activation="gelu", position="learned",
                     tie_embeddings=True, qkv_bias=True, linear_bias=True, global_batch=gbs, default_plan=plan)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, vocab: int, gbs: int,
           plan: Mapping[str, Any], max_pos: int = 131072, **extra: Any) -> ModelSpec:
    return ModelSpec(name=name, family="llama", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_len=seq, max_positions=max_pos,
                     norm="rmsnorm", activation="swiglu", position="rotary", tie_embeddings=False,
                     qkv_bias=False, linear_bias=False, global_batch=gbs, default_plan=plan, **extra)


# Sources: GPT-3 (Brown et al. 2020, Table 2.1; Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh for
# tp=8 pp=16 mbs=1 gbs=1536); Megatron 1T (Narayanan et al. 2021, Table 1); Llama 3 (Llama Team 2024,
# "The Llama 3 Herd of Models", Tables 3 and 4; HF config.json of meta-llama/Meta-Llama-3-*, whose rope_theta
# 500000 is rotary_base; Mixtral's 1000000 and DeepSeek-V3's 10000 from their config.json files).
#
# llama3-405b: the plan of the Llama 3 paper's 16K-GPU stage (section 3.3.2, Table 4): TP8 CP1 PP16 on 16,384
# H100 80GB, sequence 8192, 16M tokens per batch (2048 sequences, dp 128); FSDP shards optimizer states and
# gradients without resharding the weights after forward (tpsim ZeRO-2); an interleaved schedule whose first
# chunk holds only the embedding and last chunk only the output and loss (126 layers + 2 = 128 = 16 x 8 chunks:
# vpp 8 with the torchtitan split that counts them as layers); no activation checkpointing at 8K. Runs under the
# torchtitan stack profile (the PyTorch-native FSDP + pipelining stack that implements this split and reduces each
# chunk's gradients after its last backward); the stack is the preset's default `--stack`.
#
# mixtral-8x7b: shape from the HF config.json of mistralai/Mixtral-8x7B-v0.1 (Jiang et al. 2024, "Mixtral of
# Experts", Table 1: 46.7B total, 12.9B active). The paper publishes no training plan; the plan is Megatron-LM's
# recommended one (examples/mixtral/README.md "TP1EP8PP4"; examples/mixtral/train_mixtral_8x7b_distributed.sh:
# seq 4096, micro-batch 1, global batch 256, distributed optimizer, bf16). 64 GPUs (dp 16) is our choice.
#
# deepseek-v3: shape from the HF config.json of deepseek-ai/DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3
# Technical Report", section 4.2: 61 layers, MLA, 1 shared + 256 routed experts, top-8, at most 4 nodes per token,
# first 3 layers dense, 1 MTP module; 671B total, 37B active). Plan (section 3.2): 2048 H800 GPUs, 16-way
# pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor parallelism, FP8 GEMMs;
# sequence 4096 and global batch 15360 (section 4.2, after the batch-size ramp); recomputation of the RMSNorms
# and MLA up-projections (section 3.2.3: tpsim's selective under the hai-llm stack profile, which also holds
# the report's BF16 moments, FP8 activation caches and DualPipe's mirrored stages; the preset's default
# `--stack`). dgx-h100 stands in for the H800 nodes (same SMs; H800 NVLink is 400 GB/s instead of 900).
#
# nemotron4-340b: NVIDIA NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml
# (model section; Nemotron-4 340B Technical Report, NVIDIA 2024, section 2.2): 96 layers, hidden 18432, 96 heads
# with 8 query groups, ffn 4h = 73728 with squared-ReLU (not gated: costed as the one-projection GeLU MLP), no
# biases, LayerNorm (layernorm1p), rotary on half of each head (rotary_percentage 0.5), untied embedding and output,
# 256k vocabulary, sequence 4096, and no dropout (hidden_dropout, attention_dropout, ffn_dropout 0.0). Plan: the
# same file's, tp 8, pp 8, vpp 12, sequence parallel, distributed optimizer, no recomputation, micro-batch 1,
# global batch 2304 on 768 DGX-H100 nodes, under NeMo (the preset's default `--stack`).
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt("gpt3-175b", 96, 12288, 96, 2048, 50257, 1536,
             dict(cluster="dgx-a100", gpus=1024, tp=8, pp=16, sp=True, recompute="selective", zero=1,
                  micro_batch=1, dtype="bf16")),
        _gpt("megatron-1t", 128, 25600, 160, 2048, 51200, 3072,
             dict(cluster="dgx-a100", gpus=3072, tp=8, pp=64, recompute="full", micro_batch=1,
                  dtype="fp16", attention="unfused", overlap=False)),
        _gpt("gpt3-1.3b", 24, 2048, 16, 2048, 50257, 512,
             dict(cluster="dgx-a100", gpus=8, tp=1, pp=1, micro_batch=4, dtype="bf16")),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, 512,
               dict(cluster="dgx-h100", gpus=64, tp=2, pp=1, sp=True, zero=1, recompute="selective",
                    micro_batch=1, dtype="bf16"), max_pos=8192, rotary_base=500000),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256, 512,
               dict(cluster="dgx-h100", gpus=64, tp=8, pp=4, sp=True, zero=1, recompute="selective",
                    micro_batch=1, dtype="bf16"), max_pos=8192, rotary_base=500000),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256, 2048,
               dict(cluster="dgx-h100", gpus=16384, tp=8, pp=16, vpp=8, sp=True, zero=2, recompute="none",
                    micro_batch=1, dtype="bf16", stack="torchtitan"), rotary_base=500000),
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 4096, 32000, 256,
               dict(cluster="dgx-h100", gpus=64, tp=1, pp=4, ep=8, zero=1, micro_batch=1, dtype="bf16"),
               max_pos=32768, rotary_base=1000000, architecture="mixtral", num_experts=8,
               experts_per_token=2,
               moe_ffn_hidden_size=14336),
        _llama("deepseek-v3", 61, 7168, 128, 128, 18432, 4096, 129280, 15360,
               dict(cluster="dgx-h100", gpus=2048, tp=1, pp=16, ep=64, zero=1, micro_batch=1, dtype="fp8",
                    recompute="selective", stack="hai-llm"),
               max_pos=163840, rotary_base=10000, architecture="deepseek_v3", attention_kind="mla",
               q_lora_rank=1536,
               kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=256,
               experts_per_token=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
               shared_expert_ffn_hidden_size=2048, first_dense_layers=3, router_groups=8, router_group_topk=4,
               mtp_layers=1),
        ModelSpec(name="nemotron4-340b", family="gpt", num_layers=96, hidden_size=18432, num_attention_heads=96,
                  num_kv_heads=8, ffn_hidden_size=73728, vocab_size=256000, seq_len=4096, max_positions=4096,
                  norm="layernorm", activation="gelu", position="rotary", rotary_fraction=0.5,
                  tie_embeddings=False, qkv_bias=False, linear_bias=False, hidden_dropout=0.0,
                  attention_dropout=0.0, architecture="nemotron", global_batch=2304,
                  default_plan=dict(cluster="dgx-h100", gpus=6144, tp=8, pp=8, vpp=12, sp=True, zero=1,
                                    recompute="none", micro_batch=1, dtype="bf16", stack="nemo")),
    )
}


def get_preset(name: str) -> ModelSpec:
    key = name.lower()
    if key not in PRESETS:
        raise InputError(f"model={name!r} is not a preset ({', '.join(sorted(PRESETS))}) nor a config.json path"
                         + did_you_mean(name, PRESETS))
    return PRESETS[key]
