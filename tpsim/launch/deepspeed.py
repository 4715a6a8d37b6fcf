"""DeepSpeed: a ``ds_config.json`` (ZeRO, batch sizes, precision) and the Megatron-DeepSpeed launch
arguments that set tensor and pipeline parallelism (``megatron_deepspeed_args.sh``).

JSON keys: DeepSpeed's config (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``bf16`` / ``fp16``, ``zero_optimization`` with the defaults of
deepspeed/runtime/zero/config.py at commit 03dc2b92); DeepSpeed checks train_batch_size = micro x accumulation x
dp. Launch flags: Megatron-LM's plus Megatron-DeepSpeed's ``--deepspeed``, ``--deepspeed_config``,
``--zero-stage``, ``--no-pipeline-parallel``, ``--deepspeed-activation-checkpointing``, ``--use-flash-attn-v2``,
``--ds-sequence-parallel-size``.
JSON has no comments: the header is in the launch script.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import ascii_int
from ..plan import Plan
from . import megatron
from .common import ExportContext, ImportedLaunch, axis, commented, header_lines, header_shape, read_header

CONFIG = "ds_config.json"
SCRIPT = "megatron_deepspeed_args.sh"
HOSTFILE = "hostfile"
SCHEDULE_FLAGS = {"1f1b": [], "zb-h1": [["--enable-zbh1-pipeline"]]}
"""plan schedules Megatron-DeepSpeed states: its 1F1B pipeline engine, and ZB-H1 (``--enable-zbh1-pipeline``,
megatron/core/pipeline_parallel/deepspeed_zbh1_schedule.py)."""
DEEPSPEED_VERSION = "DeepSpeed zero/config.py 03dc2b92; Megatron-DeepSpeed arguments"


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed config of a plan (ZeRO-3 bucket and prefetch sizes at DeepSpeed's defaults, written out)."""
    zero: dict[str, Any] = {"stage": plan.zero, "overlap_comm": bool(plan.overlap),
                            "contiguous_gradients": True, "reduce_scatter": True,
                            "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000}
    if plan.zero == 3:
        zero.update(stage3_prefetch_bucket_size=50_000_000, stage3_param_persistence_threshold=100_000,
                    stage3_max_live_parameters=1_000_000_000, stage3_max_reuse_distance=1_000_000_000)
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if plan.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif plan.dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if plan.recompute == "full":
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    return config


DTYPE_FLAGS = {"bf16": [["--bf16"]], "fp16": [["--fp16"]], "fp32": []}
"""the precisions the exported arguments and ds_config.json state (the deepspeed stack's dtypes)."""


def format_violation(ctx: ExportContext) -> str | None:
    """What Megatron-DeepSpeed's arguments cannot state about the plan."""
    plan = ctx.plan
    if plan.schedule not in SCHEDULE_FLAGS:
        return (f"schedule={plan.schedule}: Megatron-DeepSpeed runs 1F1B or ZB-H1 (--enable-zbh1-pipeline) only")
    if plan.dtype not in DTYPE_FLAGS:  # --stack megatron let fp8/mxfp8 through to a KeyError (a traceback)
        return f"dtype={plan.dtype}: Megatron-DeepSpeed's engine is written for {', '.join(DTYPE_FLAGS)} only"
    if plan.tp_overlap:
        return "tp_overlap: Megatron-DeepSpeed's DeepSpeed engine has no TP-communication overlap"
    if plan.pp_first or plan.pp_last or plan.pp_embedding or plan.pp_loss or plan.pp_layout:
        return ("pp_first/pp_last/pp_embedding/pp_loss/pp_layout: not yet written for Megatron-DeepSpeed (its --custom-partition "
                "splits by layer counts of its own)")
    return None


def model_args(model: Any) -> list[list[str]]:
    """Megatron's model-shape arguments in Megatron-DeepSpeed's own names where its Llama scripts use them:
    ``--num-key-value-heads`` (GQA), ``--use-rotary-position-embeddings`` with
    ``--rotary-position-embeddings-theta``; Megatron-LM's GQA pair stays for the Megatron-Core layers the
    parser builds its TransformerConfig from."""
    args = []
    for a in megatron.model_args(model):
        if a[0] == "--position-embedding-type" or a[0] == "--rotary-base":
            continue
        args.append(a)
        if a[0] == "--num-query-groups":
            args.append(["--num-key-value-heads", a[1]])
    if model.position == "rotary":
        args += [["--use-rotary-position-embeddings"]] + [
            a for a in megatron.rotary_args(model, "--rotary-position-embeddings-theta")
            if a[0] != "--rotary-percent"]
    return args


def launch_args(ctx: ExportContext) -> list[list[str]]:
    """Megatron-DeepSpeed arguments: Megatron's model and parallel flags with DeepSpeed's ZeRO and engine."""
    plan = ctx.plan
    args = model_args(ctx.model)
    args += [["--tensor-model-parallel-size", str(plan.tp)], ["--pipeline-model-parallel-size", str(plan.pp)]]
    if plan.pp == 1:
        args.append(["--no-pipeline-parallel"])
    if plan.sp:
        args.append(["--sequence-parallel"])
    if axis(plan, "cp") > 1:
        args.append(["--ds-sequence-parallel-size", str(axis(plan, "cp"))])
    args += SCHEDULE_FLAGS[plan.schedule]
    args += [["--micro-batch-size", str(plan.micro_batch)], ["--global-batch-size", str(plan.global_batch)]]
    args += megatron._recompute(plan.recompute)
    if plan.recompute == "full":   # recompute through deepspeed.checkpointing (activation_checkpointing section)
        args.append(["--deepspeed-activation-checkpointing"])
    args += DTYPE_FLAGS[plan.dtype]
    if plan.attention == "flash":
        args.append(["--use-flash-attn-v2"])
    args += [["--deepspeed"], ["--deepspeed_config", CONFIG], ["--zero-stage", str(plan.zero)]]
    return args


def launcher(ctx: ExportContext) -> list[str]:
    """The ``deepspeed`` launcher lines: one node runs as is; several read the hosts from a hostfile (``HOSTFILE``,
    default ``hostfile`` in the directory the script runs from, like ``ds_config.json``; under Slurm it is written
    from ``SLURM_JOB_NODELIST``) whose first host is the master unless ``MASTER_ADDR`` is set."""
    head = f"deepspeed --num_gpus {ctx.devices_per_node} --num_nodes {ctx.nodes}"
    if ctx.nodes == 1:
        return [], head
    g = ctx.devices_per_node
    prologue = [
        'HOSTFILE="${HOSTFILE:-hostfile}"',
        'if [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
        f'    scontrol show hostnames "${{SLURM_JOB_NODELIST:-}}" | sed "s/$/ slots={g}/" > hostfile.slurm',
        '    HOSTFILE=hostfile.slurm',
        'fi',
        'MASTER_ADDR="${MASTER_ADDR:-$(grep -v ^# "$HOSTFILE" | head -n 1 | cut -d " " -f 1)}"']
    return prologue, (f'deepspeed --hostfile "$HOSTFILE" --num_nodes {ctx.nodes} --num_gpus {g} '
                      '--master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}"')


def hostfile(ctx: ExportContext) -> str:
    """DeepSpeed's hostfile (launcher/runner.py _parse_hostfile: ``host slots=N`` per line, ``#`` comments):
    placeholder host names to replace, one line per node."""
    lines = [f"# DeepSpeed hostfile for {ctx.nodes} nodes x {ctx.devices_per_node} GPUs (written by tpsim export):",
             "# replace node-<i> by your host names (ssh-reachable; the first is the master), or run under Slurm:",
             "# the launch script writes hostfile.slurm from SLURM_JOB_NODELIST."]
    lines += [f"node-{i} slots={ctx.devices_per_node}" for i in range(ctx.nodes)]
    return "\n".join(lines) + "\n"


def export_files(ctx: ExportContext) -> dict[str, str]:
    notes = [f"{CONFIG} beside this script holds ZeRO, batch sizes and precision; names: {DEEPSPEED_VERSION}.",
             "data, tokenizer, optimizer and checkpoint arguments: append them (passed through \"$@\")."]
    prologue, head = launcher(ctx)
    cmd = [f"{head} pretrain_gpt.py"]
    cmd += [" ".join(a) for a in launch_args(ctx)] + ['"$@"']
    script = ("#!/usr/bin/env bash\n" + commented(header_lines(ctx, "DeepSpeed (Megatron-DeepSpeed)") + notes)
              + "set -euo pipefail\n" + "".join(line + "\n" for line in prologue) + " \\\n    ".join(cmd) + "\n")
    files = {CONFIG: json.dumps(ds_config(ctx.plan), indent=2) + "\n", SCRIPT: script}
    if ctx.nodes > 1:
        files[HOSTFILE] = hostfile(ctx)
    return files


# ------------------------------------------------------------------------------------------------- import

def import_json(path: Path, text: str, launch: ImportedLaunch | None = None) -> ImportedLaunch:
    """A ds_config.json, alone (tp = pp = 1 unless ``launch``, the script's import, gives them)."""
    from ..model.files import parse_json_object  # bounded depth, finite numbers, no repeated keys (issue 13)

    from ..schema import check
    from ..schemas import DEEPSPEED

    data = parse_json_object(text, str(path))
    where = str(path)
    check(DEEPSPEED, data, where)  # types, ranges and enums before any use (issue 26)
    notes = list(launch.notes) if launch else []
    fields = dict(launch.plan_fields) if launch else {"tp": 1, "pp": 1, "sp": False, "recompute": "none",
                                                      "order": "tp-dp-pp", "attention": "unfused"}
    if launch is None:
        notes.append("tensor/pipeline sizes are not in a DeepSpeed config: tp = pp = 1 (import the launch "
                     "script, or give --tp/--pp)")
    zero_cfg = data.get("zero_optimization", {})
    if not isinstance(zero_cfg, Mapping):
        raise InputError(f"{where}: zero_optimization must be an object")
    stage = zero_cfg.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise InputError(f"{where}: zero_optimization.stage={stage!r} is not 0, 1, 2 or 3")
    fields["zero"] = stage
    default_overlap = stage == 3   # zero/config.py overlap_comm_valid
    fields["overlap"] = bool(zero_cfg.get("overlap_comm", default_overlap))
    fields["dtype"] = _dtype(data, where)
    micro = _positive(data, "train_micro_batch_size_per_gpu", where)
    accumulation = _positive(data, "gradient_accumulation_steps", where)
    batch = _positive(data, "train_batch_size", where)
    if micro:
        fields["micro_batch"] = micro
    if batch:
        fields["global_batch"] = batch
    if data.get("activation_checkpointing") and fields.get("recompute", "none") == "none":
        notes.append("activation_checkpointing section without checkpointed layers in the launch: recompute none")
    dp = batch // (micro * accumulation) if batch and micro and accumulation else None
    if dp is not None and batch % (micro * accumulation):
        raise InputError(f"{where}: train_batch_size {batch} is not micro {micro} x accumulation {accumulation} "
                         f"x dp")
    unused = sorted(set(data) - {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                 "zero_optimization", "bf16", "fp16", "activation_checkpointing"})
    if unused:
        notes.append(f"keys not used by tpsim: {', '.join(unused)}")
    gpus = launch.gpus if launch and launch.gpus else None
    if gpus is None and dp is not None:
        gpus = dp * fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
    return ImportedLaunch(format="deepspeed", path=path, plan_fields=fields,
                          model_shape=launch.model_shape if launch else {},
                          model_ref=launch.model_ref if launch else None,
                          cluster_ref=launch.cluster_ref if launch else None, gpus=gpus, dp=dp,
                          notes=tuple(dict.fromkeys(notes)))


def _positive(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: {key}={value!r} must be a positive integer")
    return value


def _dtype(data: Mapping[str, Any], where: str) -> str:
    for key, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        section = data.get(key, {})
        if not isinstance(section, Mapping):
            raise InputError(f"{where}: {key} must be an object")
        if section.get("enabled") is True:  # "auto" (the HF Trainer's placeholder) is not a choice
            return dtype
    return "fp32"


def import_script(path: Path, text: str) -> ImportedLaunch:
    """A Megatron-DeepSpeed launch script: its flags, and the ds_config.json it names (read when it exists)."""
    command, f, notes = megatron.read_command(path, text)
    fields = megatron.plan_fields(f, notes)
    if f.has("--deepspeed-activation-checkpointing") or f.has("--checkpoint-activations"):
        fields["recompute"] = "full"
    fields["attention"] = "flash" if f.has("--use-flash-attn-v2") or f.has("--use-flash-attn") else "unfused"
    if f.int("--ds-sequence-parallel-size") and f.int("--ds-sequence-parallel-size") > 1:
        fields.update(cp=f.int("--ds-sequence-parallel-size"), cp_kind="a2a")
    header = read_header(text)
    gpus = command.gpus_per_node * (command.nodes or 1) if command.gpus_per_node else None
    launch = ImportedLaunch(format="deepspeed", path=path, plan_fields=fields,
                            model_shape={**header_shape(header), **megatron.model_shape(f)},
                            model_ref=header.get("model"), cluster_ref=header.get("cluster"),
                            gpus=gpus or ascii_int(header.get("gpus")),
                            notes=tuple(notes))
    config = f.text("--deepspeed_config") or f.text("--deepspeed-config")
    if not config:
        raise InputError(f"{path}: no --deepspeed_config in the command (the ZeRO stage and batch sizes are there)")
    config_path = (path.parent / config) if not Path(config).is_absolute() else Path(config)
    if not config_path.is_file():
        raise InputError(f"{path}: --deepspeed_config {config}: {config_path} does not exist")
    from ..io import read_text
    from ..limits import MAX_LAUNCH_BYTES

    return import_json(config_path, read_text(config_path, "--deepspeed_config", MAX_LAUNCH_BYTES), launch)
