"""Export of launch configs (tpsim/launch, ``tpsim export``, ``tpsim plan --export``): the files parse with the
standard libraries, use only keys and argument names the frameworks define (at the versions stated in
docs/EXPORT.md), carry the header, and refuse plans the framework's stack cannot run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.launch import FORMATS, export_context, export_plan, export_violation, write_files
from tpsim.model import load_model
from tpsim.plan import make_plan
from tpsim.topology import load_cluster

DATA = Path(__file__).resolve().parent / "data"
LLAMA70 = load_model("llama3-70b")
H100 = load_cluster("dgx-h100", gpus=64)


def megatron_names() -> set[str]:
    return {line.strip() for line in (DATA / "megatron_args_000c4ac2.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def deepspeed_extra_names() -> set[str]:
    return {line.strip() for line in (DATA / "megatron_deepspeed_args.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def flags_of(script: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", script.split("pretrain_gpt.py", 1)[1]))


def ctx_for(model=LLAMA70, cluster=H100, prediction=False, **plan_kw):
    plan = make_plan(model, cluster.num_gpus, global_batch=plan_kw.pop("global_batch", 512), **plan_kw)
    pred = estimate(model, cluster, plan).to_dict() if prediction else None
    return export_context(model, cluster, plan, model_ref=model.name, cluster_ref=cluster.name, prediction=pred)


# Keys the frameworks define, read from their sources at the stated versions (docs/EXPORT.md).
TORCHTITAN_KEYS = {  # torchtitan/config/job_config.py @ 000204a4
    "job": {"config_file", "dump_folder", "description", "use_for_integration_test", "print_args"},
    "model": {"name", "flavor", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "mixed_precision_param", "mixed_precision_reduce", "compile", "gc_freq",
                 "gc_debug", "seed", "deterministic"},
    "parallelism": {"data_parallel_replicate_degree", "enable_compiled_autograd", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree", "pipeline_parallel_split_points",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_rotate_method", "expert_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns"},
}
DEEPSPEED_ZERO_KEYS = {  # deepspeed/runtime/zero/config.py @ 03dc2b92 (field names and aliases)
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights", "offload_param",
    "offload_optimizer", "sub_group_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_model_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params", "ignore_unused_parameters", "round_robin_gradients",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"}
DEEPSPEED_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                      "fp16", "zero_optimization", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
                      "activation_checkpointing"}
NEMO_MODEL_KEYS = {  # NeMo launcher base configs gpt3.yaml / llama3_8b.yaml (NVIDIA/NeMo 00bdb97c) and fsdp keys
    "mcore_gpt", "micro_batch_size", "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
    "sequence_parallel", "encoder_seq_length", "max_position_embeddings", "num_layers", "hidden_size",
    "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "normalization", "activation",
    "position_embedding_type", "bias", "share_embeddings_and_output_weights", "make_vocab_size_divisible_by",
    "activations_checkpoint_granularity", "activations_checkpoint_method", "activations_checkpoint_num_layers",
    "megatron_amp_O2", "transformer_engine", "fp8", "fp8_hybrid", "use_flash_attention", "fsdp",
    "fsdp_sharding_strategy", "optim"}


PLANS = [dict(tp=8, pp=4, vpp=5, sp=True, zero=1, recompute="selective"),
         dict(tp=4, pp=2, sp=True, zero=1, recompute="full", micro_batch=2, order="tp-pp-dp"),
         dict(tp=8, pp=1, sp=True, zero=3, recompute="full", overlap=False),
         dict(tp=8, pp=1, sp=True, zero=2, recompute="none", dtype="fp8"),
         dict(tp=8, pp=1, sp=False, zero=0, attention="unfused", dtype="fp16")]


def test_megatron_script_uses_only_argument_names_of_megatron_lm(tmp_path):
    names = megatron_names()
    assert len(names) > 300
    seen = set()
    for kw in PLANS:
        ctx = ctx_for(**kw)
        if export_violation("megatron", ctx):
            continue
        script = export_plan("megatron", ctx)["megatron_args.sh"]
        flags = flags_of(script)
        assert flags <= names, sorted(flags - names)
        seen |= flags
        path = write_files({"megatron_args.sh": script}, tmp_path, force=True)[0]
        if shutil.which("bash"):
            assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
                 "--num-layers-per-virtual-pipeline-stage", "--recompute-granularity", "--recompute-method",
                 "--recompute-num-layers", "--use-distributed-optimizer", "--micro-batch-size", "--global-batch-size",
                 "--use-tp-pp-dp-mapping", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--fp8-format",
                 "--attention-backend", "--num-query-groups", "--swiglu"):
        assert flag in seen, flag


def test_deepspeed_files_parse_and_use_known_keys_and_flags(tmp_path):
    names = megatron_names() | deepspeed_extra_names()
    for kw in (dict(tp=8, pp=4, sp=True, zero=1, recompute="full"), dict(tp=8, pp=1, sp=True, zero=3),
               dict(tp=4, pp=1, sp=False, zero=2, attention="unfused", dtype="fp16")):
        files = export_plan("deepspeed", ctx_for(**kw))
        config = json.loads(files["ds_config.json"])
        assert set(config) <= DEEPSPEED_TOP_KEYS and set(config["zero_optimization"]) <= DEEPSPEED_ZERO_KEYS
        plan = make_plan(LLAMA70, 64, global_batch=512, **kw)
        assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * \
            config["gradient_accumulation_steps"] * plan.dp == 512
        assert config["zero_optimization"]["stage"] == kw["zero"]
        flags = flags_of(files["megatron_deepspeed_args.sh"])
        assert flags <= names, sorted(flags - names)
        assert ("--no-pipeline-parallel" in flags) == (kw["tp"] and plan.pp == 1)


def test_torchtitan_toml_parses_with_tomllib_and_uses_job_config_keys():
    for kw in (dict(tp=8, pp=4, vpp=2, sp=True, zero=3, recompute="selective", micro_batch=2),
               dict(tp=8, pp=1, sp=True, zero=2, recompute="full", dtype="fp8")):
        text = export_plan("torchtitan", ctx_for(**kw))["torchtitan.toml"]
        data = tomllib.loads(text)
        for table, keys in data.items():
            assert set(keys) <= TORCHTITAN_KEYS[table], (table, set(keys) - TORCHTITAN_KEYS[table])
        plan = make_plan(LLAMA70, 64, global_batch=512, **kw)
        par, training = data["parallelism"], data["training"]
        assert par["tensor_parallel_degree"] == plan.tp and par["data_parallel_shard_degree"] == plan.dp
        assert data["model"]["flavor"] == "70B"
        accumulation = training["global_batch_size"] // (training["local_batch_size"] * plan.dp)
        micro_per_step = training["local_batch_size"] // par.get("pipeline_parallel_microbatch_size",
                                                                  training["local_batch_size"])
        assert accumulation * micro_per_step == plan.num_microbatches      # torchtitan/train.py batch semantics
    assert data["model"]["converters"] == ["float8"] and data["activation_checkpoint"]["mode"] == "full"


def test_nemo_yaml_parses_and_uses_megatron_gpt_config_keys():
    ctx = ctx_for(tp=8, pp=4, vpp=2, sp=True, zero=1, recompute="selective")
    text = export_plan("nemo", ctx)["nemo_megatron_gpt.yaml"]
    data = yaml.safe_load(text)
    assert set(data) == {"trainer", "model"} and set(data["model"]) <= NEMO_MODEL_KEYS
    assert data["trainer"]["devices"] * data["trainer"]["num_nodes"] == 64
    assert data["model"]["optim"]["name"] == "mcore_distributed_optim"  # Megatron-Core's (the megatron stack)
    assert data["model"]["virtual_pipeline_model_parallel_size"] == 2


def test_header_names_model_cluster_and_prediction():
    ctx = ctx_for(prediction=True, tp=8, pp=1, sp=True, zero=3, recompute="full")   # every format runs it
    for fmt in FORMATS:
        files = export_plan(fmt, ctx)
        text = next(t for name, t in files.items() if not name.endswith(".json"))
        e = ctx.prediction
        assert "llama3-70b: 80 layers" in text and "dgx-h100: 64 x H100-SXM" in text
        assert f"step {e['step_time_s']:.3f} s" in text and f"MFU {100 * e['mfu']:.1f}%" in text
        assert "# tpsim: model=llama3-70b cluster=dgx-h100 gpus=64" in text


@pytest.mark.parametrize("fmt,kw,rule", [
    ("megatron", dict(tp=8, pp=4, sp=True, zero=2), "megatron (zero-with-pp)"),
    ("nemo", dict(tp=8, pp=4, sp=True, zero=3), "megatron (zero-with-pp)"),
    ("deepspeed", dict(tp=8, pp=4, sp=True, zero=2), "deepspeed (zero-with-pp)"),
    ("deepspeed", dict(tp=8, pp=4, vpp=2, sp=True, zero=1), "deepspeed (interleaving)"),
    ("torchtitan", dict(tp=8, pp=4, sp=True, zero=1), "torchtitan (zero)"),
    ("torchtitan", dict(tp=8, pp=1, sp=False, zero=3), "torchtitan (sp)"),
    ("nemo", dict(tp=8, pp=4, sp=True, zero=1, order="tp-pp-dp"), "NeMo's config has no rank-order key"),
])
def test_plans_the_framework_cannot_run_are_refused_with_the_rule(fmt, kw, rule):
    with pytest.raises(InputError, match=re.escape(rule)):
        export_plan(fmt, ctx_for(**kw))


def test_uneven_pipeline_split_is_written_as_megatron_layout_and_read_back(tmp_path):
    """Llama-3 405B (126 layers) on pp=16 x vpp=4: Megatron runs it with --pipeline-model-parallel-layout; the
    layout holds every layer once, E first and L last, and per rank the layer counts tpsim's estimator uses."""
    from tpsim.estimator.partition import stage_layers
    from tpsim.launch import import_launch, resolve_model, resolve_plan
    from tpsim.launch.megatron import chunk_layers, layout_stages

    model = load_model("llama3-405b")
    cluster = load_cluster("dgx-h100", gpus=1024)
    plan = make_plan(model, 1024, tp=8, pp=16, vpp=4, sp=True, zero=1, recompute="full", global_batch=1024)
    ctx = export_context(model, cluster, plan, model_ref="llama3-405b", cluster_ref="dgx-h100")
    script = export_plan("megatron", ctx)["megatron_args.sh"]
    text = re.search(r"--pipeline-model-parallel-layout '([^']+)'", script).group(1)
    assert text.startswith("E") and text.endswith("L") and layout_stages(text) == (64, 126)
    assert "--num-layers-per-virtual-pipeline-stage" not in script
    counts = chunk_layers(126, 16, 4)
    per_rank = [sum(counts[r::16]) for r in range(16)]
    split = stage_layers(126, np.array([16]), np.array([4]))
    assert (per_rank[0], per_rank[-1], max(per_rank[1:-1])) == (split.first[0], split.last[0], split.middle[0])
    path = write_files({"megatron_args.sh": script}, tmp_path)[0]
    imp = import_launch(path)
    assert resolve_plan(imp, resolve_model(imp), 1024) == plan
    with pytest.raises(InputError, match="no uneven pipeline layout key"):
        export_plan("nemo", ctx)


def test_cli_format_list_matches_the_exporters():
    from tpsim.cli.export import FORMATS as CLI_FORMATS

    assert CLI_FORMATS == FORMATS


def test_torchtitan_refuses_gpt_models():
    gpt = load_model("gpt3-1.3b")
    cluster = load_cluster("dgx-a100", gpus=8)
    with pytest.raises(InputError, match="no torchtitan model"):
        export_plan("torchtitan", ctx_for(model=gpt, cluster=cluster, global_batch=64, tp=1, pp=1, zero=3))


def test_cli_export_and_plan_export(tmp_path, capsys):
    args = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512"]
    assert main(["export", "--format", "all", "--out", str(tmp_path / "all"), "--tp", "8", "--pp", "4", "--sp",
                 "--zero", "2"] + args) == 0
    out = capsys.readouterr()
    assert (tmp_path / "all" / "torchtitan" / "torchtitan.toml").is_file()
    assert not (tmp_path / "all" / "megatron").exists() and "skipped megatron" in out.err
    assert main(["export", "--format", "megatron", "--out", str(tmp_path / "m"), "--tp", "8", "--pp", "4",
                 "--sp", "--zero", "2"] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "zero=2 with pp=4 is not offered" in err
    assert main(["plan", "--no-progress", "--no-cache", "--top", "2", "--export", "deepspeed",
                 "--out", str(tmp_path / "p"), "--export-top", "2", "--micro-batch", "1", "--tp", "8"] + args) == 0
    out = capsys.readouterr().out
    exported = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert len(exported) == 2 and all(name.startswith("rank") for name in exported), exported
    for folder in exported:
        config = json.loads((tmp_path / "p" / folder / "ds_config.json").read_text())
        script = (tmp_path / "p" / folder / "megatron_deepspeed_args.sh").read_text()
        stage, pp = config["zero_optimization"]["stage"], int(re.search(r"--pipeline-model-parallel-size (\d+)",
                                                                          script).group(1))
        assert pp == 1 or stage <= 1
    assert "export: rank" in out
    assert main(["plan", "--no-progress", "--no-cache", "--export", "megatron"] + args) == 2


MCORE_CONFIG_KEYS = {  # Megatron-Core ModelParallelConfig / TransformerConfig fields NeMo passes through
    "cp_comm_type", "expert_tensor_parallel_size", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_grouped_gemm", "moe_token_dispatcher_type",
    "moe_router_num_groups", "moe_router_group_topk", "moe_expert_capacity_factor", "moe_router_score_function",
    "moe_router_enable_expert_bias"}


def _moe_ctx(name, gpus, **plan_kw):
    import dataclasses

    from tpsim.model import PRESETS

    model = PRESETS[name]
    if plan_kw.pop("no_mtp", False):
        model = dataclasses.replace(model, mtp_layers=0)
    cluster = load_cluster("dgx-h100", gpus=gpus)
    plan = make_plan(model, gpus, global_batch=plan_kw.pop("global_batch", 512), **plan_kw)
    return export_context(model, cluster, plan, model_ref=name, cluster_ref="dgx-h100")


def test_mixture_of_experts_models_are_written_where_the_framework_states_them():
    """Megatron-LM writes the MoE shape (--num-experts ...) and NeMo the TransformerConfig MoE keys; DeepSpeed's
    exporter writes none (refused, naming it) and torchtitan has no Mixtral model (refused, naming it)."""
    ctx = _moe_ctx("mixtral-8x7b", 64, tp=2, sp=True, pp=4, ep=4, etp=1, zero=1)
    script = export_plan("megatron", ctx)["megatron_args.sh"]
    assert flags_of(script) <= megatron_names()
    for flag in ("--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 14336",
                 "--expert-model-parallel-size 4", "--expert-tensor-parallel-size 1", "--moe-grouped-gemm"):
        assert flag in script
    assert "--moe-layer-freq" not in script  # every layer is MoE: Megatron's default 1
    nemo = yaml.safe_load(export_plan("nemo", ctx)["nemo_megatron_gpt.yaml"])["model"]
    assert set(nemo) <= NEMO_MODEL_KEYS | MCORE_CONFIG_KEYS
    assert (nemo["num_moe_experts"], nemo["moe_router_topk"], nemo["expert_model_parallel_size"],
            nemo["expert_tensor_parallel_size"]) == (8, 2, 4, 1)
    with pytest.raises(InputError, match="mixture of experts not written by the deepspeed exporter"):
        export_plan("deepspeed", ctx)
    with pytest.raises(InputError, match="torchtitan ships no such mixture-of-experts model"):
        export_plan("torchtitan", _moe_ctx("mixtral-8x7b", 64, tp=1, pp=1, ep=8, zero=3))


def test_deepseek_v3_exports():
    """Megatron-LM states MLA, the dense first layers (--moe-layer-freq list) and the MTP layer (its 'm' in the
    pipeline layout, after the last decoder layer); NeMo 1.x's GPT config has no MLA and torchtitan's deepseek_v3
    no MTP (refused, naming them); torchtitan's 671B flavor is the preset without MTP."""
    ctx = _moe_ctx("deepseek-v3", 2048, tp=1, pp=16, ep=64, zero=1, dtype="fp8", global_batch=15360)
    script = export_plan("megatron", ctx)["megatron_args.sh"]
    assert flags_of(script) <= megatron_names()
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in script and "--multi-latent-attention" in script
    assert "--mtp-num-layers 1" in script and re.search(r"\|t\*3mL'", script)
    with pytest.raises(InputError, match="MLA attention, multi-token prediction not written by the nemo"):
        export_plan("nemo", ctx)
    # torchtitan: 61 layers + embedding + output = 63 slots over 7 equal stages (its exporter's rule)
    with pytest.raises(InputError, match="multi-token prediction not written by the torchtitan exporter"):
        export_plan("torchtitan", _moe_ctx("deepseek-v3", 448, tp=1, pp=7, ep=64, zero=2, global_batch=15360))
    tt = _moe_ctx("deepseek-v3", 448, tp=1, pp=7, ep=64, zero=2, global_batch=15360, no_mtp=True)
    data = tomllib.loads(export_plan("torchtitan", tt)["torchtitan.toml"])
    assert (data["model"]["name"], data["model"]["flavor"]) == ("deepseek_v3", "671B")
    assert data["parallelism"]["expert_parallel_degree"] == 64
    assert set(data["parallelism"]) <= TORCHTITAN_KEYS["parallelism"]
    with pytest.raises(InputError, match="dp2ep expert parallelism needs"):
        export_plan("torchtitan", _moe_ctx("deepseek-v3", 448, tp=2, sp=True, pp=7, ep=64, etp=1, zero=2,
                                           global_batch=15360, no_mtp=True))
    with pytest.raises(InputError, match="no expert tensor-parallel degree"):
        export_plan("torchtitan", _moe_ctx("deepseek-v3", 448, tp=2, sp=True, pp=7, ep=32, etp=1, zero=2,
                                           global_batch=15360, no_mtp=True))


def test_context_parallel_kinds_are_exported_where_the_framework_runs_them():
    """Megatron-LM and NeMo run ring (p2p) and all-to-all (a2a) context parallelism; DeepSpeed only Ulysses
    (a2a), torchtitan only its ring (refused with the stack rule)."""
    for kind, mcore in (("ring", "p2p"), ("a2a", "a2a")):
        ctx = ctx_for(tp=4, pp=2, cp=2, cp_kind=kind, sp=True, zero=1)
        assert f"--cp-comm-type {mcore}" in export_plan("megatron", ctx)["megatron_args.sh"]
        nemo = yaml.safe_load(export_plan("nemo", ctx)["nemo_megatron_gpt.yaml"])["model"]
        assert nemo["cp_comm_type"] == mcore and nemo["context_parallel_size"] == 2
    assert export_violation("deepspeed", ctx_for(tp=4, pp=2, cp=2, cp_kind="ring", sp=True, zero=1))
    assert export_violation("torchtitan", ctx_for(tp=4, pp=2, cp=2, cp_kind="a2a", sp=True, zero=2))
