"""Every input format's schema and limits, in one place (issue 26; the mechanism is :mod:`tpsim.schema`).

Each reader checks the parsed document against its schema here before using any of it: a wrong type (``"bf16":
{"enabled": "true"}``, ``sequence_parallel: 'false'``, ``stage: true``, ``converters = 5``, ``trainer`` as a
list), a number outside the bound of the flag of the same meaning (:data:`tpsim.limits.LIMITS`), a value that
is not one of the format's names, and a broken cross-field rule are one line naming the file, the field path
and the value. File sizes, nesting and digits are bounded before parsing (:mod:`tpsim.boundedjson`,
:mod:`tpsim.safeyaml`, :func:`tpsim.io.read_text`) with the byte limits listed in :data:`FILE_LIMITS`.

Formats whose readers land in other modules (the runs CSV, ``tpsim design`` sweep files, the reliability
YAML) register their schema here too, or in their own module listed in :data:`tpsim.schema.SCHEMA_MODULES`.
"""

from __future__ import annotations

from typing import Any, Mapping

from .limits import (MAX_CONFIG_BYTES, MAX_INPUT_BYTES, MAX_LAUNCH_BYTES, MAX_OPGRAPH_BYTES, MAX_YAML_BYTES)
from .schema import Any_, Bool, Enum, Float, Int, List, Map, Rule, Schema, Str, register

FILE_LIMITS: dict[str, int] = {
    "config.json": MAX_CONFIG_BYTES, "ops.json": MAX_OPGRAPH_BYTES, "deepspeed": MAX_LAUNCH_BYTES,
    "nemo": MAX_LAUNCH_BYTES, "torchtitan": MAX_LAUNCH_BYTES, "megatron": MAX_LAUNCH_BYTES,
    "stack": MAX_YAML_BYTES, "calibration": MAX_YAML_BYTES, "cluster": MAX_YAML_BYTES,
    "profile": MAX_INPUT_BYTES, "runs": 8 << 20, "reliability": MAX_YAML_BYTES, "sweep": MAX_YAML_BYTES,
}
"""format -> largest file read (bytes), checked before the file is opened for parsing (runs: tpsim.runs.
MAX_RUNS_BYTES)."""

OPTIONAL = (None,)
"""``also`` of a field whose ``null`` means "absent"."""


def _both_enabled(doc: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    on = [k for k in ("bf16", "fp16") if isinstance(doc.get(k), Mapping) and doc[k].get("enabled") is True]
    if len(on) == 2:
        return "fp16.enabled", True, "and bf16.enabled are both true; DeepSpeed refuses that"
    return None


# ----------------------------------------------------------------------------------------------- launch files
_DS_PRECISION = Schema("deepspeed precision section", {
    "enabled": Bool(also=("auto",), doc="true/false; \"auto\" (HF Trainer fills it in) counts as off"),
    "loss_scale": Float(minimum=0.0, inclusive=True, maximum=1e30),
    "initial_scale_power": Int(minimum=0, maximum=64),
    "loss_scale_window": Int(maximum=1 << 30),
    "hysteresis": Int(maximum=1 << 20),
    "min_loss_scale": Float(minimum=0.0, inclusive=True, maximum=1e30),
})
DEEPSPEED = register(Schema("deepspeed", {
    "train_batch_size": Int("global_batch", also=("auto",)),
    "train_micro_batch_size_per_gpu": Int("micro_batch", also=("auto",)),
    "gradient_accumulation_steps": Int("global_batch", also=("auto",)),
    "zero_optimization": Map(Schema("deepspeed zero_optimization", {
        "stage": Enum(0, 1, 2, 3, doc="an integer 0-3 (true is not a stage)"),
        "overlap_comm": Bool(),
        "contiguous_gradients": Bool(),
        "reduce_scatter": Bool(),
        "reduce_bucket_size": Float("bucket_elements", also=("auto",)),
        "allgather_bucket_size": Float("bucket_elements", also=("auto",)),
        "stage3_prefetch_bucket_size": Float("bucket_elements", also=("auto",)),
        "stage3_param_persistence_threshold": Float("bucket_elements", minimum=0.0, inclusive=True,
                                                    also=("auto",)),
        "stage3_max_live_parameters": Float("bucket_elements", also=("auto",)),
        "offload_optimizer": Map(values=Any_()),
        "offload_param": Map(values=Any_()),
    })),
    "bf16": Map(_DS_PRECISION),
    "fp16": Map(_DS_PRECISION),
    "activation_checkpointing": Map(values=Any_()),
    "gradient_clipping": Float(minimum=0.0, inclusive=True, maximum=1e30, also=("auto",)),
    "steps_per_print": Int(maximum=1 << 40),
    "wall_clock_breakdown": Bool(),
}, rules=(Rule("bf16 and fp16 are not both enabled", _both_enabled),),
    doc="a DeepSpeed ds_config.json (deepspeed/runtime/config.py keys tpsim reads)"))


def is_interpolation(value: Any) -> bool:
    """A NeMo/OmegaConf interpolation (``${.encoder_seq_length}``): resolved by NeMo, not a value here."""
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def _nemo_int(limit: str, minimum: int = 1) -> Any:
    from dataclasses import replace

    return replace(Int(limit, minimum=minimum, also=OPTIONAL), accept=is_interpolation)


NEMO = register(Schema("nemo", {
    "model": Map(Schema("nemo model", {
        "tensor_model_parallel_size": _nemo_int("tp"),
        "pipeline_model_parallel_size": _nemo_int("pp"),
        "virtual_pipeline_model_parallel_size": _nemo_int("vpp"),
        "context_parallel_size": _nemo_int("cp"),
        "expert_model_parallel_size": _nemo_int("ep"),
        "expert_tensor_parallel_size": _nemo_int("tp"),
        "sequence_parallel": Bool(also=OPTIONAL),
        "micro_batch_size": _nemo_int("micro_batch"),
        "global_batch_size": _nemo_int("global_batch"),
        "activations_checkpoint_granularity": Enum("selective", "full", "null", also=OPTIONAL),
        "activations_checkpoint_method": Enum("uniform", "block", also=OPTIONAL),
        "activations_checkpoint_num_layers": _nemo_int("num_layers"),
        "cp_comm_type": Str(max_len=32, also=OPTIONAL),
        "fsdp": Bool(also=OPTIONAL),
        "fsdp_sharding_strategy": Str(max_len=32, also=OPTIONAL),
        "use_flash_attention": Bool(also=OPTIONAL),
        "fp8": Bool(also=OPTIONAL),
        "num_layers": _nemo_int("num_layers"),
        "hidden_size": _nemo_int("hidden_size"),
        "ffn_hidden_size": _nemo_int("ffn_hidden_size"),
        "num_attention_heads": _nemo_int("num_attention_heads"),
        "num_query_groups": _nemo_int("num_kv_heads"),
        "kv_channels": _nemo_int("head_dim"),
        "share_embeddings_and_output_weights": Bool(also=OPTIONAL),
        "bias": Bool(also=OPTIONAL),
        "num_moe_experts": _nemo_int("num_experts"),
        "moe_router_topk": _nemo_int("experts_per_token"),
        "moe_ffn_hidden_size": _nemo_int("moe_ffn_hidden_size"),
        "moe_shared_expert_intermediate_size": _nemo_int("shared_expert_ffn_hidden_size"),
        "moe_router_num_groups": _nemo_int("router_groups"),
        "moe_router_group_topk": _nemo_int("router_group_topk"),
        "moe_expert_capacity_factor": Float(maximum=1e6, also=OPTIONAL),
        "optim": Map(Schema("nemo optim", {"name": Str(max_len=128), "overlap_grad_sync": Bool(also=OPTIONAL),
                                            "dtype": Str(max_len=32)}),
                     also=OPTIONAL),
        "activation": Str(max_len=64, also=OPTIONAL),
        "normalization": Str(max_len=64, also=OPTIONAL),
        "position_embedding_type": Str(max_len=64, also=OPTIONAL),
    }), required=True),
    "trainer": Map(Schema("nemo trainer", {
        "devices": Int("node_devices", also=(-1, "auto", None)),
        "num_nodes": Int("nnodes", also=OPTIONAL),
        "precision": Any_(doc="bf16-mixed, 16-mixed, 32 (checked by the importer)"),
    }), also=OPTIONAL),
}, doc="a NeMo megatron_gpt_config.yaml (model and trainer sections)"))


TORCHTITAN = register(Schema("torchtitan", {
    "parallelism": Map(Schema("torchtitan [parallelism]", {
        "tensor_parallel_degree": Int("tp"),
        "pipeline_parallel_degree": Int("pp"),
        "context_parallel_degree": Int("cp"),
        "expert_parallel_degree": Int("ep"),
        "expert_tensor_parallel_degree": Int("tp"),
        "data_parallel_replicate_degree": Int("dp"),
        "data_parallel_shard_degree": Int("dp", also=(-1,)),
        "fsdp_reshard_after_forward": Enum("default", "always", "never"),
        "pipeline_parallel_microbatch_size": Int("micro_batch"),
        "pipeline_parallel_schedule": Str(max_len=64),
        "pipeline_parallel_layers_per_stage": Int("num_layers"),
        "module_fqns_per_model_part": List(List(Str(max_len=256), max_len=1 << 14), max_len=1 << 14),
        "enable_async_tensor_parallel": Bool(),
    })),
    "training": Map(Schema("torchtitan [training]", {
        "local_batch_size": Int("micro_batch"),
        "global_batch_size": Int("global_batch", also=(-1,)),
        "seq_len": Int("seq_len"),
        "steps": Int(maximum=1 << 40),
        "mixed_precision_param": Enum("bfloat16", "float32"),
        "mixed_precision_reduce": Enum("bfloat16", "float32"),
        "compile": Bool(),
    })),
    "compile": Map(Schema("torchtitan [compile]", {
        "enable": Bool(),
        "components": List(Str(max_len=64), max_len=16),
    })),
    "activation_checkpoint": Map(Schema("torchtitan [activation_checkpoint]", {
        "mode": Enum("none", "selective", "full"),
        "selective_ac_option": Str(max_len=16),
    })),
    "model": Map(Schema("torchtitan [model]", {
        "name": Str(max_len=128),
        "flavor": Str(max_len=128),
        "converters": List(Str(max_len=64), max_len=64),
    })),
    "job": Map(values=Any_()),
}, doc="a torchtitan job config (TOML)"))


MEGATRON_OTHER_INT = Int(minimum=0)
"""an integer flag of a Megatron script that has no entry below: a count, 0 allowed."""
_M0 = {"minimum": 0}
MEGATRON = register(Schema("megatron", {
    "--tensor-model-parallel-size": Int("tp"), "--pipeline-model-parallel-size": Int("pp"),
    "--context-parallel-size": Int("cp"), "--expert-model-parallel-size": Int("ep"),
    "--expert-tensor-parallel-size": Int("tp"), "--ds-sequence-parallel-size": Int("cp"),
    "--num-virtual-stages-per-pipeline-rank": Int("vpp"),
    "--num-layers-per-virtual-pipeline-stage": Int("num_layers"),
    "--decoder-first-pipeline-num-layers": Int("pp_layers", **_M0),
    "--decoder-last-pipeline-num-layers": Int("pp_layers", **_M0),
    "--micro-batch-size": Int("micro_batch"), "--global-batch-size": Int("global_batch"),
    "--recompute-num-layers": Int("num_layers"), "--zero-stage": Int(minimum=0, maximum=3),
    "--num-layers": Int("num_layers"), "--hidden-size": Int("hidden_size"),
    "--ffn-hidden-size": Int("ffn_hidden_size"), "--num-attention-heads": Int("num_attention_heads"),
    "--seq-length": Int("seq_len"), "--max-position-embeddings": Int("max_positions"),
    "--vocab-size": Int("vocab_size"), "--kv-channels": Int("head_dim"), "--num-query-groups": Int("num_kv_heads"),
    "--num-experts": Int("num_experts"), "--moe-router-topk": Int("experts_per_token"),
    "--moe-ffn-hidden-size": Int("moe_ffn_hidden_size"),
    "--moe-shared-expert-intermediate-size": Int("shared_expert_ffn_hidden_size", **_M0),
    "--moe-router-num-groups": Int("router_groups"), "--moe-router-group-topk": Int("router_group_topk"),
    "--q-lora-rank": Int("q_lora_rank", **_M0), "--kv-lora-rank": Int("kv_lora_rank"),
    "--qk-head-dim": Int("qk_nope_head_dim"), "--qk-pos-emb-head-dim": Int("qk_rope_head_dim"),
    "--v-head-dim": Int("v_head_dim"), "--mtp-num-layers": Int("mtp_layers", **_M0),
    "--pipeline-model-parallel-layout": Str(max_len=4096),
    "--moe-layer-freq": Str(max_len=1 << 16),
    "--moe-expert-capacity-factor": Str(max_len=40),
}, doc="the integer flags of a Megatron-LM / Megatron-DeepSpeed launch command (as parsed from the script: "
       "each value one ASCII integer within the bound of the plan or model field it sets)"))


# ----------------------------------------------------------------------------------------------- model files
HF_CONFIG = register(Schema("config.json", {
    "model_type": Str(max_len=128, required=True),
    "hidden_size": Int("hidden_size", also=OPTIONAL),
    "num_hidden_layers": Int("num_layers", also=OPTIONAL),
    "num_attention_heads": Int("num_attention_heads", also=OPTIONAL),
    "num_key_value_heads": Int("num_kv_heads", also=OPTIONAL),
    "intermediate_size": Int("ffn_hidden_size", also=OPTIONAL),
    "vocab_size": Int("vocab_size", also=OPTIONAL),
    "max_position_embeddings": Int("max_positions", also=OPTIONAL),
    "head_dim": Int("head_dim", also=OPTIONAL),
    "n_embd": Int("hidden_size", also=OPTIONAL),
    "n_layer": Int("num_layers", also=OPTIONAL),
    "n_head": Int("num_attention_heads", also=OPTIONAL),
    "n_positions": Int("max_positions", also=OPTIONAL),
    "n_inner": Int("ffn_hidden_size", also=OPTIONAL),
    "tie_word_embeddings": Bool(also=OPTIONAL),
    "sliding_window": Int("sliding_window", minimum=0, also=OPTIONAL),
    "num_local_experts": Int("num_experts", minimum=0, also=OPTIONAL),
    "n_routed_experts": Int("num_experts", minimum=0, also=OPTIONAL),
    "num_experts": Int("num_experts", minimum=0, also=OPTIONAL),
    "num_experts_per_tok": Int("experts_per_token", also=OPTIONAL),
    "moe_intermediate_size": Int("moe_ffn_hidden_size", also=OPTIONAL),
    "torch_dtype": Str(max_len=64, also=OPTIONAL, doc="listed as ignored (--dtype sets the training dtype)"),
    "architectures": List(Str(max_len=256), max_len=64, also=OPTIONAL),
}, doc="a Hugging Face config.json (the per-type keys are read by tpsim.model.hf_keys.ConfigReader)"))


_TENSOR = Map(values=Any_())
OPGRAPH = register(Schema("ops.json", {
    "format": Str(max_len=64, required=True),
    "version": Int(maximum=1 << 16, required=True),
    "name": Str(max_len=256, required=True),
    "batch": Int("micro_batch", required=True),
    "tokens_per_sample": Int("seq_len"),
    "dtype": Str(max_len=32),
    "params": Map(values=Any_(), max_len=1 << 20, required=True),
    "units": List(Map(values=Any_()), max_len=1 << 20, required=True),
    "inputs": List(_TENSOR, max_len=64, required=True),
    "source": Map(values=Any_(), doc="provenance only: a module_spec here is never run"),
}, doc="a traced op graph (tpsim/opgraph/schema.py checks each op)"))


# ----------------------------------------------------------------------------------------------- stacks
def _figure(value: Any, name: str) -> Any:
    return Map(Schema(f"stack figure {name}", {
        "value": value, "source": Str(max_len=4000), "unit": Str(max_len=64), "note": Str(max_len=4000),
        "range": List(Float(minimum=-1e30, maximum=1e30, inclusive=True), max_len=2),
    }, extra="refuse"))


_HOST_US = Float("host_us", minimum=0.0, inclusive=True, also=OPTIONAL)
_ELEMENTS = Float("bucket_elements", minimum=0.0, inclusive=True, also=OPTIONAL)
_BYTES = Float("bytes_per_element", minimum=0.0, inclusive=True, also=OPTIONAL)
_STACK_FIGURES: dict[str, dict[str, Any]] = {
    "comm": {"host_us_per_collective": _HOST_US, "reduce_bucket_elements": _ELEMENTS,
             "allgather_bucket_elements": _ELEMENTS, "zero3_prefetch_elements": _ELEMENTS,
             "zero3_persistence_threshold_elements": _ELEMENTS, "zero3_max_live_elements": _ELEMENTS,
             "ep_node_dedup": Bool(also=OPTIONAL), "ep_a2a_overlap": Bool(also=OPTIONAL),
             "tp_backward_overlap": Bool(also=OPTIONAL),
             "fsdp_reshard_after_backward": Bool(also=OPTIONAL), "zero1_in_optimizer_step": Bool(also=OPTIONAL),
             "zero1_flat_copies": Bool(also=OPTIONAL), "pp_send_split_over_tp": Bool(also=OPTIONAL),
             "pp_overlap_interleaved": Bool(also=OPTIONAL),
             "dp_sync_per_chunk": Bool(also=OPTIONAL)},
    "compute": {"host_us_per_layer": _HOST_US, "host_us_per_microbatch": _HOST_US, "host_us_per_op": _HOST_US,
                "optimizer_bytes_per_param": Float("bytes_per_param", also=OPTIONAL),
                "optimizer_bytes_per_param_fp32": Float("bytes_per_param", also=OPTIONAL),
                "grad_buffer_passes_per_step": Float(minimum=0.0, inclusive=True, maximum=100.0, also=OPTIONAL),
                "grad_accumulation_fusion": Bool(also=OPTIONAL), "pipeline_edges_as_layers": Bool(also=OPTIONAL),
                "model_edges": Bool(also=OPTIONAL)},
    "memory": {"allocator_reserve_fraction": Float(minimum=0.0, inclusive=True, maximum=0.9, also=OPTIONAL),
               "fp8_activation_cache_bytes": _BYTES, "attention_output_cache_bytes": _BYTES,
               "attention_output_shared": Bool(also=OPTIONAL),
               "pipeline_extra_in_flight": Int(minimum=0, maximum=1 << 10, also=OPTIONAL),
               "fp8_weights_kept": Bool(also=OPTIONAL), "pipeline_mirrored_stages": Bool(also=OPTIONAL),
               "optimizer_state_offload": Bool(also=OPTIONAL),
               "optimizer_cpu_fraction": Float(minimum=0.0, inclusive=True, maximum=1.0, also=OPTIONAL),
               "optimizer_cpu_overlap": Bool(also=OPTIONAL)},
}


def _stack_section(name: str) -> Any:
    # the section's key list stays with the loader that builds it (tpsim.stacks.SECTION_KEYS refuses others);
    # a figure without a typed value here is checked by that loader
    return Map(Schema(f"stack {name}", {key: _figure(value, key) for key, value in _STACK_FIGURES[name].items()}),
               required=True)


def _stack_schema() -> Schema:
    return Schema("stack", {
        "name": Str(max_len=128, required=True), "version": Str(required=True), "description": Str(),
        "sources": List(Str(), max_len=1024, required=True), "rules": Map(values=Any_(), required=True),
        "comm": _stack_section("comm"), "compute": _stack_section("compute"), "memory": _stack_section("memory"),
    }, extra="refuse", doc="a training-stack profile (tpsim/stacks.py, docs/SCHEMAS.md section 5)")


STACK = register(_stack_schema())


# ----------------------------------------------------------------------------------------------- calibration
_LINK = Map(Schema("calibration link", {
    "efficiency": Float(maximum=1.0), "latency_us": Float("latency_us", inclusive=True),
    "bw_GBps": Float("bw_GBps"), "source": Any_(), "fit_error": Any_(), "samples": Any_(), "note": Any_(),
}, extra="refuse"))
_SCALE = Float("calibration_scale")
CALIBRATION = register(Schema("calibration", {
    **{link: _LINK for link in ("nvlink", "pcie", "ib", "ethernet", "ici", "loopback", "cpu")},
    "gloo_ops": Map(values=_LINK, also=OPTIONAL),
    "compute": Map(Schema("calibration compute", {
        "gemm_scale": _SCALE, "attention_scale": _SCALE, "memory_scale": _SCALE,
        "host_overhead_per_layer_us": Float("host_us", inclusive=True),
        "host_overhead_fwd_share": Float(maximum=1.0, inclusive=True),
        "tp_exposed_scale": Float(maximum=10.0, inclusive=True),
        "dp_exposed_scale": Float(maximum=10.0, inclusive=True),
        "device": Str(max_len=128, also=OPTIONAL), "stack": Str(max_len=128, also=OPTIONAL),
        "leave_one_out": Map(values=Any_(), also=OPTIONAL), "source": Any_(), "samples": Any_(), "note": Any_(),
    }, extra="refuse"), also=OPTIONAL),
}, doc="a calibration YAML (tpsim/calibration.py); other top-level keys are provenance"))


# ----------------------------------------------------------------------------------------------- topology
CLUSTER = register(Schema("cluster", {
    "name": Str(max_len=128), "description": Str(), "source": Str(required=True), "note": Any_(),
    "node": Str(max_len=1024, required=True), "fabric": Any_(required=True, doc="a name or {use: name, ...}"),
    "device": Any_(required=True, doc="a device name or an inline device (tpsim.hardware)"),
    "gpus": Int("gpus", required=True), "gpus_per_node": Int("gpus", also=("all",)),
    "partial_nodes": Int("gpus", doc="GPUs of one unit of a node (a compute tray): a job that is not a whole "
                         "number of nodes fills each node evenly in these units (tpsim/topology/spec.py)"),
    "defaults": Map(Schema("cluster defaults", {"efficiency": Float(maximum=1.0)}, extra="refuse"), also=OPTIONAL),
    "calibration": Any_(doc="a calibration name, path or inline mapping (tpsim/calibration.py)"),
}, extra="refuse", doc="a cluster file (topologies/README.md; tpsim/topology/spec.py)"))

NODE = register(Schema("node template", {
    "name": Str(max_len=128), "description": Str(), "source": Str(required=True), "note": Any_(),
    "devices": Map(values=Map(Schema("node device group", {
        "kind": Str(max_len=32, doc="gpu, nvswitch, pcie_switch, cpu, nic (tpsim.topology.spec.DEVICE_KINDS)"),
        "count": Int("node_devices", also=("any",)), "sharp": Bool(), "memory_GBps": Float(maximum=1e5), "source": Any_(),
        "note": Any_(),
    }, extra="refuse")), max_len=64, required=True),
    "links": List(Map(values=Any_()), max_len=4096, required=True),
}, extra="refuse", doc="a node template (topologies/nodes/*.yaml)"))


# ----------------------------------------------------------------------------------------------- profile CSV
_DIM = Int("kernel_dim", also=(None,))
PROFILE_ROW = register(Schema("profile", {
    "kind": Str(max_len=32, required=True), "op": Str(max_len=64, required=True),
    "dtype": Str(max_len=16, required=True), "pass": Enum("fwd", "bwd", required=True),
    **{col: _DIM for col in ("m", "n", "k", "batch_heads", "seq", "head_dim", "numel")},
    "time_s": Float("max_kernel_s", required=True), "reps": Int("reps", also=(None,)),
    "spread_pct": Float("redo_noisy_pct", inclusive=True, also=(None,)),
}, doc="one row of a kernel profile CSV (profiles/README.md; cells are typed by tpsim.compute.profile)"))


# ----------------------------------------------------------------------------------------------- runs CSV
_CELL = Str(max_len=4096)
_MEASURED = Float(maximum=1e15)
RUNS_ROW = register(Schema("runs", {
    "run_id": _CELL, "model": _CELL, "cluster": _CELL, "gpus": Int("gpus"),
    "layers": Int("num_layers"), "hidden": Int("hidden_size"), "heads": Int("num_attention_heads"),
    "kv_heads": Int("num_kv_heads"), "ffn": Int("ffn_hidden_size"), "vocab": Int("vocab_size"),
    "seq_len": Int("seq_len"), "experts": Int("num_experts"), "top_k": Int("experts_per_token"),
    "moe_balance": Str(max_len=64), "stack": _CELL,
    "tp": Int("tp"), "cp": Int("cp"), "pp": Int("pp"), "vpp": Int("vpp"), "dp": Int("dp"),
    "pp_first": Int("pp_layers", minimum=0), "pp_last": Int("pp_layers", minimum=0), "pp_layout": _CELL,
    "zero": Int(minimum=0, maximum=3), "micro_batch": Int("micro_batch"), "global_batch": Int("global_batch"),
    "ep": Int("ep"), "etp": Int("tp", minimum=0),
    **{k: Bool() for k in ("sp", "pp_embedding", "pp_loss", "tp_overlap", "overlap")},
    **{k: Str(max_len=64) for k in ("cp_kind", "schedule", "recompute", "dtype", "order", "attention",
                                      "flops_convention")},
    **{k: _MEASURED for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")},
    "peak_memory_gib": Float("mem_limit_gib"), "source": _CELL, "notes": _CELL,
}, doc="one row of a runs CSV (docs/SCHEMAS.md T4, docs/RUNS.md; cells typed by tpsim.schema.typed_cells, the "
       "rows' cross-field rules in tpsim.runs)"))


# ----------------------------------------------------------------------------------------------- reliability
_SRC = Str(max_len=4000)
_RATE = Map(Schema("reliability component", {
    "per": Enum("gpu", "node", required=True), "events": Float(minimum=0.0, inclusive=True, maximum=1e12),
    "units": Float(maximum=1e12), "hours": Float(maximum=1e9), "planned": Bool(), "source": _SRC,
}, extra="refuse"))
_GBPS = Float(maximum=1e9)
RELIABILITY = register(Schema("reliability", {
    "fleet": Str(max_len=128), "description": Str(), "source": _SRC,
    "components": Map(values=_RATE, max_len=256),
    "checkpoint": Map(Schema("reliability checkpoint", {
        "mode": Enum("async", "sync"), "aggregate_write_GBps": _GBPS, "aggregate_read_GBps": _GBPS,
        "node_write_GBps": _GBPS, "node_read_GBps": _GBPS, "host_copy_GBps": _GBPS,
        **{k: _SRC for k in ("mode_source", "aggregate_source", "node_source", "host_copy_source")}})),
    "restart": Map(Schema("reliability restart", {"fixed_s": Float("timeout_s", inclusive=True), "source": _SRC})),
    "stragglers": Map(Schema("reliability stragglers", {
        "slow_rank_fraction": Float(maximum=1.0, inclusive=True), "slowdown": Float(inclusive=True, maximum=100.0),
        "source": _SRC})),
    "energy": Map(Schema("reliability energy", {
        "pue": Float(minimum=1.0, inclusive=True, maximum=10.0), "power_fraction": Float(maximum=2.0),
        "device_power_w": Float(maximum=1e5, also=OPTIONAL), "node_overhead_w_per_gpu": Float(
            minimum=0.0, inclusive=True, maximum=1e5, also=OPTIONAL),
        "node_overhead_ratio": Float(minimum=0.0, inclusive=True, maximum=10.0, also=OPTIONAL),
        **{k: _SRC for k in ("pue_source", "power_fraction_source", "device_power_source", "node_overhead_source")}})),
    "band": Map(Schema("reliability band", {
        "rate_low": Float(maximum=1.0, inclusive=True), "rate_high": Float(minimum=1.0, inclusive=True, maximum=1e3),
        "source": _SRC})),
}, extra="refuse", doc="a reliability override file (tpsim/train/reliability.py; the shipped fleets in "
                       "tpsim/data/reliability.yaml)"))


__all__ = ["RUNS_ROW", "RELIABILITY", "CLUSTER", "NODE", "PROFILE_ROW", "FILE_LIMITS", "MEGATRON", "MEGATRON_OTHER_INT", "DEEPSPEED", "NEMO", "TORCHTITAN", "HF_CONFIG", "OPGRAPH", "STACK", "CALIBRATION",
           "is_interpolation"]
