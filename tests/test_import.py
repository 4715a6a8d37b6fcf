"""Import of launch configs (``tpsim estimate --from``): export followed by import gives the same plan and
model for every format over many plans; hand-written files (a pasted Megatron command with continuations,
variables, arrays and unknown flags; torchtitan, DeepSpeed and NeMo configs) read as their framework reads
them; bad files are one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.launch import (FORMATS, export_context, export_plan, export_violation, format_stack, import_launch,
                          resolve_model, resolve_plan, write_files)
from tpsim.model import load_model, with_overrides
from tpsim.plan import validate_plan
from tpsim.search.space import SearchSpace, enumerate_plans
from tpsim.topology import load_cluster

CASES = [  # (model, overrides, cluster, gpus, global batch)
    ("llama3-70b", {}, "dgx-h100", 64, 512),
    ("llama3-8b", {"layers": 8}, "h100-pcie", 16, 64),
    ("gpt3-1.3b", {}, "dgx-a100", 16, 128),
]


def _sample_plans(model, gpus, batch, seed, fmt):
    """Random plans of the whole space that are valid for tpsim and that the format's stack runs."""
    # context parallelism (ring and all-to-all) included: every format writes and reads what its stack runs
    plans = enumerate_plans(model, gpus, batch, SearchSpace(micro_batch=(1, 2), cp=(1, 2))).plans
    runnable = np.flatnonzero(~format_stack(fmt).violations(plans, model))
    for i in np.random.default_rng(seed).permutation(runnable):
        p = plans.plan(int(i))
        try:
            validate_plan(model, p, gpus)
        except InputError:
            continue
        yield p


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_then_import_gives_the_same_plan_on_many_plans(fmt, tmp_path):
    """Sampled plans of three problems (those the format's stack runs): export, import from the written
    files, rebuild model and plan: equal to the originals, field by field."""
    checked = 0
    for k, (name, overrides, cluster_name, gpus, batch) in enumerate(CASES):
        model = with_overrides(load_model(name), **overrides)
        cluster = load_cluster(cluster_name, gpus=gpus)
        done = 0
        for j, plan in enumerate(_sample_plans(model, gpus, batch, k, fmt)):
            ctx = export_context(model, cluster, plan, model_ref=name, cluster_ref=cluster_name,
                                 model_overrides=overrides)
            if done == 25:
                break
            if export_violation(fmt, ctx):
                continue
            done += 1
            paths = write_files(export_plan(fmt, ctx), tmp_path / f"{k}-{j}")
            source = next(p for p in paths if not p.name.endswith(".json")) if fmt == "deepspeed" else paths[0]
            imp = import_launch(source)
            assert imp.gpus == gpus and imp.cluster_ref == cluster_name
            model2 = resolve_model(imp)
            assert model2 == model, (fmt, name)
            assert resolve_plan(imp, model2, imp.gpus) == plan, (fmt, plan.short())
            checked += 1
    assert checked >= 40, checked


def test_export_folder_and_cli_estimate_from(tmp_path, capsys):
    args = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512", "--tp", "8",
            "--pp", "4", "--vpp", "5", "--sp", "--zero", "1", "--recompute", "selective"]
    assert main(["estimate", "--json"] + args) == 0
    direct = json.loads(capsys.readouterr().out)
    assert main(["export", "--format", "nemo", "--out", str(tmp_path)] + args) == 0
    capsys.readouterr()
    assert main(["estimate", "--json", "--from", str(tmp_path)]) == 0
    out = capsys.readouterr()
    imported = json.loads(out.out)
    assert imported["plan"] == direct["plan"] and imported["step_time_s"] == direct["step_time_s"]
    assert "imported" in out.err
    # command-line plan flags override the file's
    assert main(["estimate", "--json", "--from", str(tmp_path), "--micro-batch", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["micro_batch"] == 2


MEGATRON_SCRIPT = r"""
#!/bin/bash
# Runs the "175B" parameter model (style of Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh)
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=128
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
CHECKPOINT_PATH=$1 #<Specify path>
TP=${TP:-8}

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr $MASTER_ADDR   # unresolved on purpose
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --train-iters 500000
    --lr 6.0e-5 --lr-decay-style cosine
    --bf16
)
MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size $TP
	--pipeline-model-parallel-size 16
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --sequence-parallel --recompute-activations \
    --use-distributed-optimizer --overlap-grad-reduce \
    --vocab-size 50257 \
    --data-path $DATA_PATH --my-own-flag 3 \
    --save $CHECKPOINT_PATH
"""


def test_pasted_megatron_script_with_variables_arrays_and_unknown_flags(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(MEGATRON_SCRIPT)
    imp = import_launch(path)
    f = imp.plan_fields
    assert (f["tp"], f["pp"], f["sp"], f["recompute"], f["zero"], f["dtype"], f["overlap"]) == \
        (8, 16, True, "selective", 1, "bf16", True)
    assert (f["micro_batch"], f["global_batch"], imp.gpus) == (1, 1536, 1024)
    notes = " ".join(imp.notes)
    assert "$MASTER_ADDR" in notes and "$DATA_PATH" in notes          # unresolved variables listed
    assert "--my-own-flag" in notes and "--lr" in notes                # flags tpsim does not use listed
    model = resolve_model(imp)                                         # built from the shape flags alone
    assert (model.num_layers, model.hidden_size, model.vocab_size, model.family) == (96, 12288, 50257, "gpt")
    plan = resolve_plan(imp, model, imp.gpus)
    assert (plan.dp, plan.num_microbatches) == (8, 192)


def test_pasted_argument_list_and_model_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "args.txt"
    path.write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\\n"
                    "  --num-layers-per-virtual-pipeline-stage 4 --micro-batch-size 2 --global-batch-size 64 \\\n"
                    "  --recompute-granularity full --recompute-method block --recompute-num-layers 2 --fp16\n")
    imp = import_launch(path)
    assert "estimated as full recomputation of every layer" in " ".join(imp.notes)
    # no --num-layers in the file: vpp = layers of --model / (pp x layers per virtual stage)
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--cluster", "dgx-h100",
                 "--gpus", "16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["tp"], plan["pp"], plan["vpp"], plan["dp"], plan["recompute"], plan["dtype"]) == \
        (2, 2, 4, 4, "full", "fp16")
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--layers", "12", "--cluster", "dgx-h100",
                 "--gpus", "16"]) == 2   # 12 layers are not pp=2 x 4 layers per virtual stage
    assert "12 layers are not pp=2 x 4" in capsys.readouterr().err


TORCHTITAN_TOML = """
# torchtitan Config.toml (torchtitan/models/llama3/train_configs/llama3_70b.toml style)
[job]
dump_folder = "./outputs"
description = "Llama 3 70B training"

[model]
name = "llama3"
flavor = "70B"

[training]
local_batch_size = 8
seq_len = 8192
steps = 1000

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "full"

[float8]
enable_fsdp_float8_all_gather = false
"""


def test_handwritten_torchtitan_config(tmp_path, capsys):
    path = tmp_path / "llama3_70b.toml"
    path.write_text(TORCHTITAN_TOML)
    imp = import_launch(path)
    assert imp.model_ref == "llama3-70b" and imp.gpus is None       # dp_shard = -1: the GPU count decides
    assert "[float8]" in " ".join(imp.notes)
    model = resolve_model(imp)
    plan = resolve_plan(imp, model, 64)
    assert (plan.tp, plan.dp, plan.sp, plan.zero, plan.recompute, plan.micro_batch, plan.global_batch) == \
        (8, 8, True, 3, "full", 8, 64)   # global_batch_size -1: local x dp, one accumulation step
    assert main(["estimate", "--from", str(path), "--cluster", "dgx-h100", "--gpus", "64"]) == 0
    assert "tp8 pp1 dp8 sp full z3 mb8" in capsys.readouterr().out


def test_deepspeed_config_alone_and_its_checks(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}}))
    imp = import_launch(path)
    assert imp.dp == 32 and imp.gpus == 32 and imp.plan_fields["overlap"] is True   # overlap_comm: stage 3
    assert any("tp = pp = 1" in n for n in imp.notes) and any("optimizer" in n for n in imp.notes)
    model = load_model("llama3-8b")
    plan = resolve_plan(imp, model, 32)
    assert (plan.dp, plan.zero, plan.micro_batch, plan.num_microbatches) == (32, 3, 4, 2)
    with pytest.raises(InputError, match="implies dp=32"):
        resolve_plan(imp, model, 64)
    path.write_text('{"train_batch_size": 256, "zero_optimization": {"stage": 5}}')
    with pytest.raises(InputError, match=r"zero_optimization.stage=5"):
        import_launch(path)


NEMO_YAML = """
trainer:
  num_nodes: 16
  devices: 8
  precision: bf16
model:
  mcore_gpt: true
  micro_batch_size: 1
  global_batch_size: 2048
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  virtual_pipeline_model_parallel_size: null
  context_parallel_size: 1
  encoder_seq_length: 8192
  max_position_embeddings: 8192
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  normalization: rmsnorm
  bias: false
  activation: fast-swiglu
  position_embedding_type: rope
  share_embeddings_and_output_weights: false
  activations_checkpoint_granularity: null
  sequence_parallel: false
  use_flash_attention: true
  optim:
    name: distributed_fused_adam
    overlap_grad_sync: true
"""


def test_nemo_launcher_style_config(tmp_path):
    """The NeMo launcher's llama3_8b base config (context parallelism dropped): Llama-3 8B on 128 GPUs."""
    path = tmp_path / "llama3_8b.yaml"
    path.write_text(NEMO_YAML)
    imp = import_launch(path)
    model = resolve_model(imp, load_model("llama3-8b"))
    assert model == load_model("llama3-8b")
    plan = resolve_plan(imp, model, imp.gpus)
    assert (imp.gpus, plan.dp, plan.zero, plan.overlap, plan.recompute, plan.num_microbatches) == \
        (128, 128, 1, True, "none", 16)


@pytest.mark.parametrize("name,text,match", [
    ("bad.toml", "[parallelism\ntensor_parallel_degree = 2", "not valid TOML"),
    ("bad.json", '{"train_batch_size": 8,', "malformed JSON"),
    ("bad.yaml", "model: [1, 2", "not valid YAML"),
    ("dup.yaml", "model:\n  num_layers: 2\n  num_layers: 3\n", "duplicate name"),
    ("noflags.sh", "echo hello\n", "no command with --flags"),
    ("badint.sh", "python pretrain_gpt.py --tensor-model-parallel-size two\n", "must be one integer"),
    ("fsdp.yaml", "model:\n  fsdp: true\n  fsdp_sharding_strategy: hybrid\n", "hybrid"),
])
def test_bad_files_are_one_line_errors(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match=match) as info:
        import_launch(path)
    assert "\n" not in str(info.value)
    assert main(["estimate", "--from", str(path)]) == 2


def test_missing_file_and_oversized_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        import_launch(tmp_path / "nope.sh")
    big = tmp_path / "big.sh"
    big.write_text("#" * (2 << 20))
    with pytest.raises(InputError, match="above the 1,048,576-byte limit"):
        import_launch(big)


MOE_CASES = [  # (format, preset, gpus, plan fields, drop the MTP module)
    ("megatron", "mixtral-8x7b", 64, dict(tp=2, sp=True, pp=4, ep=4, etp=1, zero=1), False),
    ("megatron", "mixtral-8x7b", 64, dict(tp=1, pp=2, cp=2, cp_kind="a2a", ep=8, zero=1), False),
    ("megatron", "deepseek-v3", 2048, dict(tp=1, pp=16, ep=64, zero=1, dtype="fp8", global_batch=15360), False),
    ("megatron", "deepseek-v3", 1024, dict(tp=2, sp=True, pp=8, vpp=2, ep=32, etp=1, zero=1, global_batch=4096),
     False),
    ("nemo", "mixtral-8x7b", 64, dict(tp=2, sp=True, pp=4, ep=4, etp=1, zero=1), False),
    ("nemo", "mixtral-8x7b", 64, dict(tp=2, sp=True, pp=2, cp=2, cp_kind="a2a", ep=8, zero=1), False),
    ("nemo", "llama3-70b", 64, dict(tp=4, sp=True, pp=4, cp=2, cp_kind="ring", zero=1), False),
    ("torchtitan", "deepseek-v3", 448, dict(tp=1, pp=7, ep=64, zero=2, global_batch=15360), True),
    ("torchtitan", "deepseek-v3", 448, dict(tp=2, sp=True, pp=7, cp=2, ep=16, zero=2, global_batch=15360), True),
    ("deepspeed", "llama3-70b", 64, dict(tp=4, sp=True, pp=1, cp=2, cp_kind="a2a", zero=2), False),
]


@pytest.mark.parametrize("fmt,name,gpus,fields,no_mtp", MOE_CASES)
def test_context_and_expert_parallel_plans_round_trip(fmt, name, gpus, fields, no_mtp, tmp_path):
    """Plans with cp (ring and all-to-all) and ep / etp, on MoE models with dense first layers, MLA and MTP where
    the format states them: export, import, the same plan and (from the written files alone, without the
    tpsim header) the same model shape."""
    import dataclasses
    import re

    from tpsim.launch import format_stack
    from tpsim.model import PRESETS
    from tpsim.plan import make_plan_as_typed

    model = PRESETS[name]
    if no_mtp:
        model = dataclasses.replace(model, mtp_layers=0)
    cluster = load_cluster("dgx-h100", gpus=gpus)
    fields = dict(fields)
    # as the CLI builds it: a preset default the format's stack refuses (deepseek-v3's dualpipe) is dropped
    plan = make_plan_as_typed(model, gpus, global_batch=fields.pop("global_batch", 512), stack=format_stack(fmt),
                              **fields)[0]
    ctx = export_context(model, cluster, plan, model_ref=name, cluster_ref="dgx-h100")
    assert export_violation(fmt, ctx) is None
    paths = write_files(export_plan(fmt, ctx), tmp_path / "out")
    source = next(p for p in paths if not p.name.endswith(".json")) if fmt == "deepspeed" else paths[0]
    imp = import_launch(source)
    model2 = resolve_model(imp)
    assert model2 == model
    assert resolve_plan(imp, model2, imp.gpus) == plan, plan.short()
    if fmt == "megatron":  # the arguments alone (no header) give the same MoE / MLA / MTP shape
        bare = tmp_path / "bare.sh"
        bare.write_text("\n".join(line for line in source.read_text().splitlines()
                                  if not line.startswith("#")))
        shape = import_launch(bare).model_shape
        for key in ("num_experts", "experts_per_token", "moe_ffn_hidden_size", "first_dense_layers",
                    "router_groups", "router_group_topk", "q_lora_rank", "kv_lora_rank", "mtp_layers"):
            assert shape.get(key, 0) == getattr(model, key), key
        assert shape["shared_expert_ffn_hidden_size"] * shape["num_shared_experts"] == \
            model.shared_expert_ffn_hidden_size * model.num_shared_experts
        if model.mtp_layers and re.search("pipeline-model-parallel-layout", source.read_text()):
            assert "mL'" in source.read_text()
