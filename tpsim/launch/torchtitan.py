"""torchtitan TOML job configs: export a plan as ``torchtitan.toml`` and read one back.

Keys are those of torchtitan/config/job_config.py at pytorch/torchtitan commit 000204a4 ([job], [model],
[training] local_batch_size / global_batch_size / seq_len / mixed_precision_param, [parallelism]
data_parallel_replicate_degree / data_parallel_shard_degree / fsdp_reshard_after_forward /
tensor_parallel_degree / pipeline_parallel_degree / pipeline_parallel_schedule /
pipeline_parallel_layers_per_stage / module_fqns_per_model_part / pipeline_parallel_microbatch_size /
context_parallel_degree / expert_parallel_degree, [activation_checkpoint] mode / selective_ac_option).

Batch semantics (torchtitan/train.py): gradient accumulation steps = global_batch_size / (local_batch_size x
dp); with pipeline parallelism one schedule step runs local_batch_size / pipeline_parallel_microbatch_size
micro-batches. So without pp, local_batch_size is tpsim's micro-batch; with pp it holds all micro-batches of a
replica (one accumulation step).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import ascii_int
from .common import ExportContext, ImportedLaunch, axis, commented, header_lines, header_shape, read_header

FILENAME = "torchtitan.toml"
TORCHTITAN_VERSION = "torchtitan 000204a4 (torchtitan/config/job_config.py)"
FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B", "deepseek-v3": "671B"}
"""tpsim presets with a torchtitan flavor of the same shape (torchtitan/models/llama3/__init__.py; the
deepseek_v3 model's deepseekv3_configs "671B": 61 layers, dim 7168, MLA q_lora 1536 / kv_lora 512, 256 experts of
2048 top-8 with 1 shared, 3 dense layers of 18432, 8 groups top-4 - read at torchtitan 0014ac2c; the preset
without its MTP module)."""
MODEL_FEATURES = ("moe", "mla")
"""model features a [model] name states: torchtitan's deepseek_v3 model (MLA, shared + routed experts, dense first
layers); no multi-token prediction module."""
MOE_ARCHITECTURES = ("deepseek_v3", "deepseek_v2")
"""tpsim architectures torchtitan's deepseek_v3 model trains (DeepSeek-V2 shapes are its 16B / 236B flavors)."""
RESHARD = {2: "never", 3: "always"}
ZERO_OF_RESHARD = {"never": 2, "always": 3}


TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-zb": "InterleavedZeroBubble",
                        "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
"""tpsim schedule -> torchtitan ``parallelism.pipeline_parallel_schedule`` (docs/SCHEMAS.md T1; the stack
profile's ``rules.schedules`` refuses the others before export)."""
SCHEDULE_OF_NAME = {**{v.lower(): k for k, v in TORCHTITAN_SCHEDULES.items()}, "interleaved1f1b": "1f1b"}
"""pipeline_parallel_schedule (any case) -> tpsim schedule, for the import."""


def format_violation(ctx: ExportContext) -> str | None:
    """torchtitan ships Llama-family models: a GPT-family model has no torchtitan model to name."""
    schedule = ctx.plan.schedule
    if schedule not in TORCHTITAN_SCHEDULES:
        return f"schedule={schedule}: torchtitan's pipeline_parallel_schedule has no {schedule} schedule"
    if ctx.model.family != "llama":
        return f"model family {ctx.model.family} has no torchtitan model (torchtitan trains llama3-style models)"
    plan = ctx.plan
    if plan.dtype == "mxfp8":
        return ("dtype=mxfp8: not yet exported for torchtitan (its MX converter section is not in the job_config "
                "keys this exporter targets, docs/EXPORT.md); export for megatron instead")
    if axis(plan, "cp") > 1 and axis(plan, "cp_kind") != "ring":
        return f"cp_kind={axis(plan, 'cp_kind')}: torchtitan's context parallelism rotates K/V shards (ring only)"
    if axis(plan, "cp") > 1 and plan.zero == 0:
        return (f"zero=0 with cp={axis(plan, 'cp')}: torchtitan applies FSDP over the dp_shard x cp mesh whenever "
                "context parallelism is on (parallelize_llama)")
    return _moe_violation(ctx)


def _moe_violation(ctx: ExportContext) -> str | None:
    """torchtitan 000204a4's MoE: its deepseek_v3 model only, expert parallelism "dp2ep" (cp <= ep <= dp_shard x
    cp, job_config.py expert_parallel_degree) with the routed experts split over tp (no expert tensor-parallel
    degree key)."""
    m, plan = ctx.model, ctx.plan
    if m.is_moe and m.architecture not in MOE_ARCHITECTURES:
        return (f"architecture {m.architecture or m.family}: torchtitan ships no such mixture-of-experts model "
                f"(its MoE model is deepseek_v3)")
    ep, cp, etp = axis(plan, "ep"), axis(plan, "cp"), axis(plan, "etp")
    if ep > 1:
        shard = plan.dp if plan.zero else 1
        if not cp <= ep <= shard * cp:
            return (f"ep={ep}: torchtitan's dp2ep expert parallelism needs cp={cp} <= ep <= data_parallel_shard_degree"
                    f" x cp = {shard * cp}")
        if etp and etp != plan.tp:
            return (f"etp={etp}: torchtitan 000204a4 has no expert tensor-parallel degree (the routed experts are "
                    f"split over tp={plan.tp})")
    return None


def _flavor(ctx: ExportContext) -> str:
    """torchtitan's flavor name when the model is exactly a preset with one (shape overrides change it; the
    deepseek-v3 preset without its MTP module is torchtitan's 671B)."""
    import dataclasses

    from ..model import PRESETS

    ref = ctx.model_ref.lower()
    preset = PRESETS.get(ref)
    if preset is not None and preset.mtp_layers:
        preset = dataclasses.replace(preset, mtp_layers=0)
    if ref in FLAVORS and preset == ctx.model:
        return FLAVORS[ref]
    return ctx.model.name if not ctx.model_overrides else f"{ctx.model.name}-custom"


def job_config(ctx: ExportContext) -> dict[str, dict[str, Any]]:
    """The TOML tables of the plan."""
    plan, model = ctx.plan, ctx.model
    flavor = _flavor(ctx)
    training: dict[str, Any] = {"seq_len": model.seq_len, "global_batch_size": plan.global_batch,
                                "mixed_precision_param": "float32" if plan.dtype == "fp32" else "bfloat16",
                                "mixed_precision_reduce": "float32"}
    pp = plan.pp
    training["local_batch_size"] = plan.micro_batch * (plan.num_microbatches if pp > 1 else 1)
    par: dict[str, Any] = {"data_parallel_replicate_degree": plan.dp if plan.zero == 0 else 1,
                           "data_parallel_shard_degree": plan.dp if plan.zero else 1,
                           "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": pp,
                           "context_parallel_degree": axis(plan, "cp")}
    if plan.zero in RESHARD:
        par["fsdp_reshard_after_forward"] = RESHARD[plan.zero]
    if plan.tp_overlap:
        par["enable_async_tensor_parallel"] = True
    if pp > 1:
        par["pipeline_parallel_schedule"] = ("Interleaved1F1B" if plan.schedule == "1f1b" and plan.vpp > 1
                                             else TORCHTITAN_SCHEDULES[plan.schedule])
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        if _own_split(plan):
            # the plan's uneven split or layout, stage by stage (the chunks every path costs: layer_split)
            from ..estimator.partition import layer_split

            chunks = layer_split(model.num_layers, pp, plan.vpp, first=plan.pp_first, last=plan.pp_last,
                                 embedding=plan.pp_embedding, loss=plan.pp_loss, layout=plan.pp_layout)
            par["module_fqns_per_model_part"] = module_fqns(chunks)
        elif plan.vpp > 1:
            # torchtitan counts tok_embeddings and norm + output as one layer each when it splits the stages
            # (generate_llm_fqn_per_model_part input_weight=1, output_weight=1): layers + 2 when that divides
            chunks = pp * plan.vpp
            slots = model.num_layers + 2 if (model.num_layers + 2) % chunks == 0 else model.num_layers
            par["pipeline_parallel_layers_per_stage"] = slots // chunks
    if axis(plan, "ep") > 1:
        par["expert_parallel_degree"] = axis(plan, "ep")
    ac: dict[str, Any] = {"mode": {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"
    model_table: dict[str, Any] = {"name": "deepseek_v3" if model.is_moe else "llama3", "flavor": flavor}
    if plan.dtype == "fp8":
        model_table["converters"] = ["float8"]
    return {"job": {"description": f"{model.name} on {ctx.cluster_desc} ({plan.short()})"},
            "model": model_table, "training": training, "parallelism": par, "activation_checkpoint": ac}


def _own_split(plan: Any) -> bool:
    return bool(plan.pp_first or plan.pp_last or plan.pp_embedding or plan.pp_loss or plan.pp_layout)


def module_fqns(chunks: tuple[int, ...]) -> list[list[str]]:
    """``parallelism.module_fqns_per_model_part`` of the decoder layers per model chunk: ``tok_embeddings`` on
    the first, ``norm`` and ``output`` on the last, ``layers.i`` in order (the module names of torchtitan's
    llama3 and deepseek_v3 models; torchtitan/distributed/pipeline_parallel.py pipeline_llm builds one stage
    per list)."""
    out, start = [], 0
    for k, n in enumerate(chunks):
        stage = [f"layers.{i}" for i in range(start, start + n)]
        start += n
        if k == 0:
            stage.insert(0, "tok_embeddings")
        if k == len(chunks) - 1:
            stage += ["norm", "output"]
        out.append(stage)
    return out


def chunks_of_fqns(parts: Any, where: str) -> tuple[int, ...]:
    """Decoder layers per model chunk of ``module_fqns_per_model_part``: every ``layers.i`` once, in order over
    the chunks, ``tok_embeddings`` on the first and ``norm`` / ``output`` on the last; one line naming the key
    otherwise."""
    key = f"{where}: parallelism.module_fqns_per_model_part"
    if not isinstance(parts, list) or not parts or not all(isinstance(p, list) for p in parts):
        raise InputError(f"{key} must be a non-empty list of module-name lists (one per model chunk)")
    layers: list[int] = []
    chunks = []
    for k, part in enumerate(parts):
        n = 0
        for name in part:
            if not isinstance(name, str):
                raise InputError(f"{key}[{k}]: {name!r} is not a module name")
            if name.startswith("layers.") and name[7:].isascii() and name[7:].isdigit():
                layers.append(int(name[7:]))
                n += 1
            elif name == "tok_embeddings" and k != 0:
                raise InputError(f"{key}[{k}]: tok_embeddings must be on the first model chunk")
            elif name in ("norm", "output") and k != len(parts) - 1:
                raise InputError(f"{key}[{k}]: {name} must be on the last model chunk")
            elif name not in ("tok_embeddings", "norm", "output"):
                raise InputError(f"{key}[{k}]: {name!r} is not tok_embeddings, layers.<i>, norm or output")
        chunks.append(n)
    if layers != list(range(len(layers))):
        raise InputError(f"{key}: the layers.<i> must appear once each, in order from layers.0 (got "
                         f"{len(layers)} names, not 0..{len(layers) - 1} in order)")
    return tuple(chunks)


def export_files(ctx: ExportContext) -> dict[str, str]:
    notes = [f"keys: {TORCHTITAN_VERSION}; run with NGPU={ctx.devices_per_node} on {ctx.nodes} node(s):",
             "torchrun --nproc-per-node $NGPU --nnodes N -m torchtitan.train --job.config_file torchtitan.toml",
             "add [training] dataset / steps, [optimizer] and [checkpoint] as needed."]
    if _flavor(ctx) not in FLAVORS.values():
        name = "deepseek_v3" if ctx.model.is_moe else "llama3"
        notes.append(f"[model] flavor {_flavor(ctx)!r}: register a {name} flavor with this shape in torchtitan.")
    tables = job_config(ctx)
    return {FILENAME: commented(header_lines(ctx, "torchtitan") + notes) + "\n" + dump_toml(tables)}


def dump_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """Tables of scalars and string lists as TOML (JSON string and list syntax is valid TOML for these)."""
    out = []
    for name, table in tables.items():
        out.append(f"[{name}]")
        for key, value in table.items():
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (int, float, str, list)):
                text = json.dumps(value)
            else:
                raise TypeError(f"{name}.{key}: {type(value).__name__} is not written to TOML")
            out.append(f"{key} = {text}")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------- import

def import_text(path: Path, text: str) -> ImportedLaunch:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:  # arrays nested thousands deep (issue 13)
        raise InputError(f"{path}: not valid TOML (nested too deeply)") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (issue 26)
        raise InputError(f"{path}: not valid TOML ({str(exc).splitlines()[0][:100]})") from None
    where = str(path)
    from ..schema import check
    from ..schemas import TORCHTITAN

    check(TORCHTITAN, data, where)  # types, ranges and enums before any use (issue 26)
    notes: list[str] = []
    par, training = _table(data, "parallelism", where), _table(data, "training", where)
    ac, model = _table(data, "activation_checkpoint", where), _table(data, "model", where)
    tp, pp = _int(par, "tensor_parallel_degree", 1, where), _int(par, "pipeline_parallel_degree", 1, where)
    cp = _int(par, "context_parallel_degree", 1, where)
    replicate, shard = _int(par, "data_parallel_replicate_degree", 1, where), _int(par, "data_parallel_shard_degree",
                                                                                     -1, where)
    zero = _zero(replicate, shard, pp, str(par.get("fsdp_reshard_after_forward", "default")), where, notes, cp)
    layers_per_stage = None
    fields: dict[str, Any] = {"tp": tp, "pp": pp, "sp": tp > 1, "zero": zero, "overlap": True,
                              "order": "tp-dp-pp", "attention": "flash",
                              "recompute": _recompute(ac, where, notes), "dtype": _dtype(training, model, where)}
    local = _int(training, "local_batch_size", 8, where)
    if pp > 1:
        micro = _int(par, "pipeline_parallel_microbatch_size", 1, where)
        if local % micro:
            raise InputError(f"{where}: local_batch_size {local} is not a multiple of "
                             f"pipeline_parallel_microbatch_size {micro}")
        fields["micro_batch"] = micro
        parts = par.get("module_fqns_per_model_part")
        if parts is not None:   # the stages as listed (pipeline_llm uses them instead of its own split)
            from .megatron import fields_of_layout

            chunks = chunks_of_fqns(parts, where)
            if len(chunks) % pp:
                raise InputError(f"{where}: parallelism.module_fqns_per_model_part has {len(chunks)} model chunks, "
                                 f"not a multiple of pipeline_parallel_degree {pp}")
            fields.update(vpp=len(chunks) // pp, **fields_of_layout(chunks, pp, even_is_own=False))
        else:
            layers_per_stage = _layers_per_stage(par, where)
        if parts is None and layers_per_stage is None:
            fields["vpp"] = 1
        name = str(par.get("pipeline_parallel_schedule", "1F1B"))
        schedule = SCHEDULE_OF_NAME.get(name.lower())
        if schedule is None:
            notes.append(f"pipeline_parallel_schedule {name!r}: estimated as 1F1B")
        elif schedule != "1f1b":
            fields["schedule"] = schedule
    else:
        fields["micro_batch"] = local
    if par.get("enable_async_tensor_parallel") is True:
        fields["tp_overlap"] = True
    if cp > 1:
        fields.update(cp=cp, cp_kind="ring")
    if _int(par, "expert_parallel_degree", 1, where) > 1:
        fields["ep"] = _int(par, "expert_parallel_degree", 1, where)
    global_batch = _int(training, "global_batch_size", -1, where)
    dp = replicate * shard if shard > 0 else None
    if global_batch > 0:
        fields["global_batch"] = global_batch
    elif dp is not None:
        fields["global_batch"] = local * dp
    else:   # torchtitan/train.py: global_batch_size < 0 means local_batch_size x dp (one accumulation step)
        notes.append("global_batch_size -1 with data_parallel_shard_degree -1: global batch = local batch x dp")
    header = read_header(text)
    flavor_ref = next((k for k, v in FLAVORS.items() if v == str(model.get("flavor"))), None)
    shape = {**header_shape(header), "seq_len": _int(training, "seq_len", 2048, where)}
    if model.get("name") == "deepseek_v3":
        shape["mtp_layers"] = 0  # torchtitan's deepseek_v3 trains no multi-token prediction module
    gpus = ascii_int(header.get("gpus"))
    if gpus is None and dp is not None:
        gpus = dp * tp * pp * cp
    compiled = _compiled(data, training, notes)
    return ImportedLaunch(format="torchtitan", path=path, plan_fields=fields, model_shape=shape,
                          stack="torchtitan-compile" if compiled else None,
                          model_ref=header.get("model") or flavor_ref, cluster_ref=header.get("cluster"), gpus=gpus,
                          dp=dp, layers_per_virtual_stage=layers_per_stage, notes=tuple(notes) + _unused(data),
                          batch_per_replica=local if global_batch <= 0 and dp is None else None)


def _table(data: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        raise InputError(f"{where}: [{name}] must be a table")
    return table


def _int(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {key}={value!r} must be an integer")
    return value


def _zero(replicate: int, shard: int, pp: int, policy: str, where: str, notes: list[str], cp: int = 1) -> int:
    if policy not in ("default", "always", "never"):
        raise InputError(f"{where}: fsdp_reshard_after_forward={policy!r} is not default, always or never")
    if shard == 1 and cp == 1:  # with cp > 1 torchtitan shards over the dp_shard x cp mesh, even dp_shard = 1
        return 0
    if replicate > 1:
        notes.append(f"HSDP (replicate {replicate} x shard {shard}) estimated as ZeRO over all dp ranks")
    if policy == "default":
        return 2 if pp > 1 else 3   # apply_fsdp: reshard after forward only without pp
    return ZERO_OF_RESHARD[policy]


def _recompute(ac: Mapping[str, Any], where: str, notes: list[str]) -> str:
    mode = ac.get("mode", "selective")   # job_config.py ActivationCheckpoint.mode default
    if mode in ("none", "full"):
        return str(mode)
    if mode != "selective":
        raise InputError(f"{where}: [activation_checkpoint] mode={mode!r} is not none, selective or full")
    option = str(ac.get("selective_ac_option", "2"))
    if option == "op":
        return "selective"
    if option.isdigit():
        notes.append(f"selective_ac_option {option} (full checkpoint of every {option}th layer) estimated as "
                     f"{'full' if option == '1' else 'selective'} recomputation")
        return "full" if option == "1" else "selective"
    raise InputError(f"{where}: selective_ac_option={option!r} is not 'op' or a layer period")


def _dtype(training: Mapping[str, Any], model: Mapping[str, Any], where: str) -> str:
    if "float8" in (model.get("converters") or []):
        return "fp8"
    param = training.get("mixed_precision_param", "bfloat16")
    if param not in ("bfloat16", "float32"):
        raise InputError(f"{where}: mixed_precision_param={param!r} is not bfloat16 or float32")
    return "bf16" if param == "bfloat16" else "fp32"


def _layers_per_stage(par: Mapping[str, Any], where: str) -> int | None:
    """pipeline_parallel_layers_per_stage (vpp follows once the model's layers are known); None: one stage per
    rank (1F1B-style schedules)."""
    schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
    per_stage = par.get("pipeline_parallel_layers_per_stage")
    if per_stage is None:
        if schedule.lower().startswith(("interleaved", "looped")):
            raise InputError(f"{where}: {schedule} without pipeline_parallel_layers_per_stage: give the layers per "
                             f"stage so tpsim knows the virtual stages")
        return None
    if isinstance(per_stage, bool) or not isinstance(per_stage, int) or per_stage <= 0:
        raise InputError(f"{where}: pipeline_parallel_layers_per_stage={per_stage!r} must be a positive integer")
    return per_stage


def _compiled(data: Mapping[str, Any], training: Mapping[str, Any], notes: list[str]) -> bool:
    """The job compiles the model (``training.compile = true``, or the later ``[compile] enable = true`` with
    ``components`` holding "model"): it runs the ``torchtitan-compile`` stack's fused kernels."""
    table = data.get("compile")
    if isinstance(table, Mapping) and table.get("enable") is True:
        components = table.get("components", ["model", "loss"])
        if "model" not in components:
            notes.append(f"[compile] components {components}: the model is not compiled (torchtitan eager)")
            return False
        return True
    return training.get("compile") is True


def _unused(data: Mapping[str, Any]) -> tuple[str, ...]:
    read = {"job", "model", "training", "parallelism", "activation_checkpoint", "compile"}
    others = sorted(k for k in data if k not in read)
    return (f"tables not used by tpsim: {', '.join(f'[{k}]' for k in others)}",) if others else ()
