"""Megatron-LM / Megatron-Core command lines: export a plan as ``pretrain_gpt.py`` arguments and read them back
(from a script or a pasted command).

Argument names are those of megatron/training/arguments.py at Megatron-LM commit 000c4ac2 (after
Megatron-Core 0.14); tests/data/megatron_args_000c4ac2.txt lists the names checked, with the source.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import LIMITS, ascii_int, check_int
from ..model import ModelSpec
from ..plan import Plan
from ..stacks import order_key
from .common import ExportContext, ImportedLaunch, axis, commented, header_lines, header_shape, read_header
from ..pipeline import LAYOUT_MAX_SYMBOLS, layout_chunks, layout_stages  # noqa: F401 (re-exported)
from .shell import Command, flag_values, parse_command

FILENAME = "megatron_args.sh"
MODEL_FEATURES = ("moe", "mla", "mtp")
"""model features the arguments state (--num-experts ..., --multi-latent-attention ..., --mtp-num-layers)."""
MEGATRON_VERSION = "Megatron-LM 000c4ac2 (Megatron-Core >= 0.14)"
CP_COMM = {"ring": "p2p", "a2a": "a2a"}
ZERO_FROM_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


# ------------------------------------------------------------------------------------------------- export

def plan_args(plan: Plan, model: ModelSpec) -> list[list[str]]:
    """Megatron arguments of the plan: parallel sizes, batch, recomputation, optimizer sharding, precision."""
    args: list[list[str]] = [["--tensor-model-parallel-size", str(plan.tp)],
                             ["--pipeline-model-parallel-size", str(plan.pp)]]
    if plan.pp > 1 and plan.pp_layout:
        args.append(["--pipeline-model-parallel-layout",
                     shlex.quote(layout(model.num_layers, plan.pp, plan.vpp, model.mtp_layers, plan.pp_layout))])
    elif plan.pp > 1 and split_flags(plan):
        args += split_flags(plan)
        if plan.vpp > 1:
            args.append(["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)])
    elif plan.pp > 1 and model.num_layers % (plan.pp * plan.vpp):
        args.append(["--pipeline-model-parallel-layout",
                     shlex.quote(layout(model.num_layers, plan.pp, plan.vpp, model.mtp_layers))])
    elif plan.vpp > 1:
        args.append(["--num-layers-per-virtual-pipeline-stage", str(model.num_layers // (plan.pp * plan.vpp))])
    if plan.sp:
        args.append(["--sequence-parallel"])
    if plan.tp_overlap:
        args.append(["--tp-comm-overlap"])
    cp, ep = axis(plan, "cp"), axis(plan, "ep")
    if cp > 1:
        args += [["--context-parallel-size", str(cp)], ["--cp-comm-type", CP_COMM[axis(plan, "cp_kind")]]]
    if ep > 1:
        args.append(["--expert-model-parallel-size", str(ep)])
        if axis(plan, "etp"):
            args.append(["--expert-tensor-parallel-size", str(axis(plan, "etp"))])
    if order_key(plan.order) == "tp-pp-dp":
        args.append(["--use-tp-pp-dp-mapping"])
    args += [["--micro-batch-size", str(plan.micro_batch)], ["--global-batch-size", str(plan.global_batch)]]
    args += _recompute(plan.recompute) + _zero(plan) + _precision(plan.dtype)
    # auto: Transformer Engine picks FlashAttention or cuDNN fused attention; neither stores the scores
    args.append(["--attention-backend", "auto" if plan.attention == "flash" else "unfused"])
    return args


def split_flags(plan: Plan) -> list[list[str]]:
    """The uneven pipeline split of the plan (docs/SCHEMAS.md T1) as Megatron's arguments: layers of the first
    and last stage, the embedding and the loss counted as layers."""
    args: list[list[str]] = []
    if plan.pp_first:
        args.append(["--decoder-first-pipeline-num-layers", str(plan.pp_first)])
    if plan.pp_last:
        args.append(["--decoder-last-pipeline-num-layers", str(plan.pp_last)])
    if plan.pp_embedding:
        args.append(["--account-for-embedding-in-pipeline-split"])
    if plan.pp_loss:
        args.append(["--account-for-loss-in-pipeline-split"])
    return args


def chunk_layers(num_layers: int, pp: int, vpp: int) -> list[int]:
    """Layers of each model chunk in model order (chunk k = virtual stage k // pp on rank k % pp), split as
    tpsim's estimator splits them (:func:`tpsim.estimator.partition.layer_split`, the stack's even rule)."""
    from ..estimator.partition import layer_split

    return list(layer_split(num_layers, pp, vpp))


def layout(num_layers: int, pp: int, vpp: int, mtp: int = 0, chunks: tuple[int, ...] = ()) -> str:
    """``--pipeline-model-parallel-layout`` of ``chunks`` (the plan's ``pp_layout``; empty: :func:`chunk_layers`):
    stages in model order separated by ``|``, ``E`` (embedding) first and ``L`` (loss) last, ``t*n`` for n
    decoder layers, ``m`` for each multi-token prediction layer after the last decoder layer, in the last stage
    (megatron/core/transformer/pipeline_parallel_layer_layout.py: the count of ``m`` must equal
    --mtp-num-layers, after every decoder layer, in the last virtual stage of a rank; a stage may be empty)."""
    sizes = list(chunks) if chunks else chunk_layers(num_layers, pp, vpp)
    stages = [f"t*{n}" if n > 1 else "t" * n for n in sizes]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * mtp + "L"
    return "|".join(stages)


def fields_of_layout(chunks: tuple[int, ...], pp: int, even_is_own: bool = True) -> dict[str, Any]:
    """The plan fields that give a layout's ``chunks`` (every import of a layout: Megatron, Megatron-Bridge,
    torchtitan): the split fields that reproduce them (:func:`split_of_layout`), else the layout itself
    (``pp_layout``). ``even_is_own`` False: the importing stack's own split is not Megatron's even one
    (torchtitan counts the embedding and the output as layers), so chunks equal to that keep the layout."""
    split = split_of_layout(chunks, pp)
    if split or (split is not None and even_is_own):
        return split
    return {"pp_layout": tuple(chunks)}


def split_of_layout(chunks: tuple[int, ...], pp: int) -> dict[str, Any] | None:
    """The plan's split fields (pp_first, pp_last, pp_embedding, pp_loss) whose pipeline split
    (:func:`tpsim.estimator.partition.layer_split`) is exactly the layout's ``chunks``, or None when none is."""
    from ..estimator.partition import layer_split

    if len(chunks) % pp:
        return None
    vpp, layers = len(chunks) // pp, sum(chunks)
    first = sum(chunks[k] for k in range(0, len(chunks), pp))
    last = sum(chunks[k] for k in range(pp - 1, len(chunks), pp))
    candidates = [dict(pp_first=f, pp_last=la, pp_embedding=e, pp_loss=lo)
                  for f, la in ((0, 0), (first, 0), (0, last), (first, last))
                  for e in (False, True) for lo in (False, True)]
    for fields in candidates:
        try:
            split = layer_split(layers, pp, vpp, first=fields["pp_first"], last=fields["pp_last"],
                                embedding=fields["pp_embedding"], loss=fields["pp_loss"])
        except (ValueError, ZeroDivisionError):
            continue
        if tuple(split) == tuple(chunks):
            return {k: v for k, v in fields.items() if v}
    return None


def _recompute(recompute: str) -> list[list[str]]:
    if recompute == "selective":
        return [["--recompute-granularity", "selective"]]
    if recompute == "full":
        return [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                ["--recompute-num-layers", "1"]]
    return []


def _zero(plan: Plan) -> list[list[str]]:
    overlap = [["--overlap-grad-reduce"]] if plan.overlap else []
    if plan.zero == 1:
        return [["--use-distributed-optimizer"]] + overlap + ([["--overlap-param-gather"]] if overlap else [])
    if plan.zero in (2, 3):
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        return ([["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", strategy],
                 ["--ckpt-format", "fsdp_dtensor"], ["--init-model-with-meta-device"]] + overlap
                + ([["--overlap-param-gather"]] if overlap else []))
    return overlap


def _precision(dtype: str) -> list[list[str]]:
    return {"bf16": [["--bf16"]], "fp16": [["--fp16"]], "fp8": [["--bf16"], ["--fp8-format", "hybrid"]],
            "mxfp8": [["--bf16"], ["--fp8-format", "e4m3"], ["--fp8-recipe", "mxfp8"]],
            "nvfp4": [["--bf16"], ["--fp4-format", "e2m1"], ["--fp4-recipe", "nvfp4"]],
            "fp32": []}[dtype]


def model_args(model: ModelSpec) -> list[list[str]]:
    """Megatron model-shape arguments (GPT: LayerNorm, GeLU, learned positions; Llama: RMSNorm, SwiGLU, RoPE)."""
    args = [["--num-layers", str(model.num_layers)], ["--hidden-size", str(model.hidden_size)],
            ["--ffn-hidden-size", str(model.ffn_hidden_size)],
            ["--num-attention-heads", str(model.num_attention_heads)]]
    if model.num_kv_heads != model.num_attention_heads:
        args += [["--group-query-attention"], ["--num-query-groups", str(model.num_kv_heads)]]
    if model.head_dim * model.num_attention_heads != model.hidden_size and model.attention_kind != "mla":
        args.append(["--kv-channels", str(model.head_dim)])
    args += [["--seq-length", str(model.seq_len)], ["--max-position-embeddings", str(model.max_positions)],
             ["--vocab-size", str(model.vocab_size)], ["--make-vocab-size-divisible-by", "128"]]
    if model.norm == "rmsnorm":
        args.append(["--normalization", "RMSNorm"])
    if model.activation == "swiglu":
        args.append(["--swiglu"])
    if model.position == "rotary":
        args.append(["--position-embedding-type", "rope"])
        args += rotary_args(model, "--rotary-base")
    if not model.tie_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    if not model.linear_bias:
        args.append(["--disable-bias-linear"])
        if model.qkv_bias:
            args.append(["--add-qkv-bias"])
    return args + moe_args(model)


def rotary_args(model: ModelSpec, base_flag: str) -> list[list[str]]:
    """The rotary base (``base_flag``: Megatron-LM ``--rotary-base``, Megatron-DeepSpeed
    ``--rotary-position-embeddings-theta``) when the model states one, and ``--rotary-percent`` when only part of
    each head is rotated."""
    args = [[base_flag, str(model.rotary_base)]] if model.rotary_base else []
    if model.rotary_fraction != 1.0:
        args.append(["--rotary-percent", f"{model.rotary_fraction:g}"])
    return args


SCHEDULE_WRITTEN = ("1f1b",)
"""plan schedules Megatron-LM 000c4ac2's arguments state (1F1B, interleaved with vpp > 1); arguments.py has no
zero-bubble or DualPipe argument."""


def format_violation(ctx: ExportContext) -> str | None:
    """What Megatron-LM 000c4ac2 cannot state about the model or the plan."""
    if ctx.plan.schedule not in SCHEDULE_WRITTEN:
        return (f"schedule={ctx.plan.schedule}: Megatron-LM 000c4ac2 has no argument for it (1F1B, interleaved "
                "with --num-layers-per-virtual-pipeline-stage)")
    if ctx.model.shared_expert_gate:
        return ("shared_expert_gate: Megatron-LM 000c4ac2 has no sigmoid gate on the shared expert (Qwen2-MoE); "
                "its arguments would describe a different model")
    return None


def moe_args(model: ModelSpec) -> list[list[str]]:
    """Mixture-of-experts, MLA and multi-token-prediction arguments (Megatron-Core MoE / MLA groups): the routed
    experts, top-k and expert width; the shared experts' total width; the MoE/dense layer pattern
    (``--moe-layer-freq``: an integer N = every N-th layer, or a Python list expression such as
    ``([0]*3+[1]*58)``); grouped GEMMs with the all-to-all dispatcher (what tpsim costs); group-limited
    routing; a capacity factor; DeepSeek-V3's auxiliary-loss-free router (sigmoid scores + expert bias)."""
    from ..estimator.moe import moe_constants

    args: list[list[str]] = []
    if model.is_moe:
        args += [["--num-experts", str(model.num_experts)], ["--moe-router-topk", str(model.experts_per_token)],
                 ["--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size)]]
        shared = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        if shared:
            args.append(["--moe-shared-expert-intermediate-size", str(shared)])
        freq = moe_layer_freq(model)
        if freq != "1":
            args.append(["--moe-layer-freq", shlex.quote(freq)])
        args += [["--moe-grouped-gemm"], ["--moe-token-dispatcher-type", "alltoall"]]
        if model.router_groups:
            args += [["--moe-router-num-groups", str(model.router_groups)],
                     ["--moe-router-group-topk", str(model.router_group_topk)]]
        if model.capacity_factor:
            args.append(["--moe-expert-capacity-factor", f"{model.capacity_factor:g}"])
        if model.architecture in moe_constants().loss_free_architectures:
            args += [["--moe-router-score-function", "sigmoid"], ["--moe-router-enable-expert-bias"]]
    if model.attention_kind == "mla":
        args.append(["--multi-latent-attention"])
        if model.q_lora_rank:
            args.append(["--q-lora-rank", str(model.q_lora_rank)])
        args += [["--kv-lora-rank", str(model.kv_lora_rank)], ["--qk-head-dim", str(model.qk_nope_head_dim)],
                 ["--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)], ["--v-head-dim", str(model.v_head_dim)]]
    if model.mtp_layers:
        args.append(["--mtp-num-layers", str(model.mtp_layers)])
    return args


def moe_layer_freq(model: ModelSpec) -> str:
    """``--moe-layer-freq`` of the model: "N" when layer i is MoE iff i % N == 0, else the run-length list
    expression of the pattern (1 = MoE layer), e.g. ``([0]*3+[1]*58)``."""
    pattern = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    for n in range(1, model.num_layers + 1):
        if pattern == [1 if i % n == 0 else 0 for i in range(model.num_layers)]:
            return str(n)
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def parse_layer_freq(text: str, num_layers: int | None, where: str) -> dict[str, Any]:
    """ModelSpec fields of a ``--moe-layer-freq`` value: an integer N, or a Python list expression of 0/1
    (integers, lists, ``+`` and ``*`` only, evaluated without ``eval``)."""
    import ast

    text = text.strip()
    if ascii_int(text):
        return {"moe_layer_freq": check_int("--moe-layer-freq", ascii_int(text), where,
                                            maximum=LIMITS["moe_layer_freq"]),
                "first_dense_layers": 0, "dense_layers": ()}
    longest = LIMITS["num_layers"]  # a pattern has one entry per layer: nothing longer is built

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int) \
                    and 0 <= right and len(left) * right <= longest:
                return left * right
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list) \
                    and len(left) + len(right) <= longest:
                return left + right
        raise ValueError

    try:
        if len(text) > 64 * longest or set(text) - set("0123456789[]()+*, "):
            raise ValueError(text[:40])
        pattern = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pattern = None
    if not isinstance(pattern, list) or any(v not in (0, 1) for v in pattern) or \
            (num_layers is not None and len(pattern) != num_layers):
        raise InputError(f"{where}: --moe-layer-freq {text!r} is not an integer nor a list of "
                         f"{num_layers if num_layers is not None else 'num_layers'} zeros and ones")
    first = next((i for i, v in enumerate(pattern) if v), len(pattern))
    return {"moe_layer_freq": 1, "first_dense_layers": first,
            "dense_layers": tuple(i for i, v in enumerate(pattern) if not v and i >= first)}


def launcher(ctx: ExportContext) -> str:
    """torchrun on every node: one node runs as is; several take the node rank from ``NODE_RANK`` or Slurm's
    ``SLURM_NODEID`` and need ``MASTER_ADDR`` (the first node; the script stops with a message when unset)."""
    if ctx.nodes == 1:
        return (f"torchrun --nproc-per-node {ctx.devices_per_node} --nnodes 1 --node-rank 0 "
                f"--master-addr \"${{MASTER_ADDR:-localhost}}\" --master-port \"${{MASTER_PORT:-6000}}\"")
    return (f"torchrun --nproc-per-node {ctx.devices_per_node} --nnodes {ctx.nodes} "
            f"--node-rank \"${{NODE_RANK:-${{SLURM_NODEID:?set NODE_RANK (0..{ctx.nodes - 1}) or run under srun}}}}\" "
            f"--master-addr \"${{MASTER_ADDR:?set MASTER_ADDR to the first node}}\" "
            f"--master-port \"${{MASTER_PORT:-6000}}\"")


def export_files(ctx: ExportContext) -> dict[str, str]:
    """``megatron_args.sh``: header, environment, and the torchrun command with one argument per line (data,
    tokenizer, learning-rate and checkpoint arguments are passed through ``"$@"``)."""
    plan, model = ctx.plan, ctx.model
    notes = ["data, tokenizer, optimizer and checkpoint arguments: append them (they are passed through \"$@\");",
             "--vocab-size states the vocabulary for tpsim; with a real tokenizer the tokenizer sets it.",
             f"argument names: {MEGATRON_VERSION} megatron/training/arguments.py."]
    env = []
    if plan.tp > 1 or axis(plan, "cp") > 1:
        env.append("export CUDA_DEVICE_MAX_CONNECTIONS=1   # required with tp or cp > 1 before Blackwell "
                   "(arguments.py validate_args)")
    lines = [launcher(ctx) + " pretrain_gpt.py"]
    lines += [" ".join(a) for a in model_args(model) + plan_args(plan, model)]
    lines.append('"$@"')
    body = " \\\n    ".join(lines)
    text = ("#!/usr/bin/env bash\n" + commented(header_lines(ctx, "Megatron-LM") + notes) + "set -euo pipefail\n"
            + "".join(e + "\n" for e in env) + body + "\n")
    return {FILENAME: text}


# ------------------------------------------------------------------------------------------------- import

INT_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
             "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
             "--micro-batch-size", "--global-batch-size", "--num-layers", "--hidden-size", "--ffn-hidden-size",
             "--num-attention-heads", "--num-query-groups", "--kv-channels", "--seq-length",
             "--max-position-embeddings", "--vocab-size", "--context-parallel-size", "--expert-model-parallel-size",
             "--expert-tensor-parallel-size", "--recompute-num-layers", "--make-vocab-size-divisible-by",
             "--zero-stage", "--ds-sequence-parallel-size", "--num-experts", "--moe-router-topk",
             "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-router-num-groups",
             "--moe-router-group-topk", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
             "--v-head-dim", "--mtp-num-layers", "--decoder-first-pipeline-num-layers",
             "--decoder-last-pipeline-num-layers", "--rotary-base", "--rotary-position-embeddings-theta",
             "--num-key-value-heads")
TEXT_FLAGS = ("--recompute-granularity", "--recompute-method", "--attention-backend", "--normalization",
              "--position-embedding-type", "--data-parallel-sharding-strategy", "--fp8-format", "--cp-comm-type",
              "--deepspeed_config", "--deepspeed-config", "--ckpt-format", "--recompute-modules",
             "--pipeline-model-parallel-layout", "--moe-layer-freq", "--moe-token-dispatcher-type",
              "--moe-expert-capacity-factor", "--moe-router-score-function", "--rotary-percent",
              "--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-params-dtype", "--main-grads-dtype",
              "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--optimizer-offload-fraction")
BOOL_FLAGS = ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-torch-fsdp2",
              "--torch-fsdp2-no-reshard-after-forward", "--bf16", "--fp16", "--overlap-grad-reduce",
              "--overlap-param-gather", "--use-tp-pp-dp-mapping", "--swiglu", "--untie-embeddings-and-output-weights",
              "--disable-bias-linear", "--add-qkv-bias", "--group-query-attention", "--recompute-activations",
              "--use-flash-attn", "--use-rotary-position-embeddings", "--deepspeed", "--no-pipeline-parallel",
              "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--use-flash-attn-v2",
              "--init-model-with-meta-device", "--account-for-embedding-in-pipeline-split",
              "--account-for-loss-in-pipeline-split", "--moe-grouped-gemm", "--moe-router-enable-expert-bias",
              "--multi-latent-attention", "--tp-comm-overlap", "--enable-zbh1-pipeline",
              "--use-precision-aware-optimizer", "--fp8-param-gather", "--grad-reduce-in-bf16",
              "--overlap-moe-expert-parallel-comm", "--moe-router-force-load-balancing", "--moe-enable-deepep",
              "--delay-wgrad-compute", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d")
NEWER_FLAGS = ("--offload-optimizer-states",)
"""flags read here that Megatron-LM gained after the pinned commit of the argument tables (000c4ac2):
``--offload-optimizer-states`` (Megatron-Core megatron/core/optimizer/cpu_offloading, OptimizerStateOffloader:
the distributed optimizer's moments and master weights kept in host memory between steps; the
Megatron-MoE-ModelZoo GB200 DeepSeek-V3 recipe sets it)."""
KNOWN_FLAGS = set(INT_FLAGS) | set(TEXT_FLAGS) | set(BOOL_FLAGS) | set(NEWER_FLAGS)


class Flags:
    """Typed access to parsed ``--flags`` (errors name the file, the flag and the value)."""

    def __init__(self, flags: Mapping[str, list[str]], where: str) -> None:
        self.flags = {name.replace("_", "-") if name != "--deepspeed_config" else name: values
                      for name, values in flags.items()}
        self.where = where

    def has(self, name: str) -> bool:
        return name in self.flags

    def int(self, name: str) -> int | None:
        values = self.flags.get(name)
        if values is None:
            return None
        number = ascii_int(values[0], signed=True) if len(values) == 1 else None
        if number is None:
            shown = " ".join(values)
            shown = shown if len(shown) <= 40 else f"{shown[:24]}...({len(shown)} characters)"
            raise InputError(f"{self.where}: {name} {shown!r} must be one integer (ASCII digits)")
        from ..schema import check_value
        from ..schemas import MEGATRON, MEGATRON_OTHER_INT

        return int(check_value(MEGATRON.fields.get(name, MEGATRON_OTHER_INT), number, name, self.where))

    def text(self, name: str) -> str | None:
        values = self.flags.get(name)
        if values is None:
            return None
        if not values:
            raise InputError(f"{self.where}: {name} needs a value")
        return values[0]

    def values(self, name: str) -> list[str]:
        return list(self.flags.get(name, []))


def read_command(path: Path, text: str) -> tuple[Command, Flags, list[str]]:
    """The training command of a script or pasted argument list, its flags and the notes so far."""
    command = parse_command(text, str(path))
    flags, loose = flag_values(command.args)
    notes = list(command.notes)
    if loose:
        notes.append(f"positional words ignored: {' '.join(loose[:6])}{' ...' if len(loose) > 6 else ''}")
    return command, Flags(flags, str(path)), notes


def import_text(path: Path, text: str) -> ImportedLaunch:
    """A Megatron launch script or pasted command line as an :class:`ImportedLaunch`."""
    command, f, notes = read_command(path, text)
    plan, shape = plan_fields(f, notes), model_shape(f)
    ignored = sorted(set(f.flags) - KNOWN_FLAGS)
    if ignored:
        notes.append(f"{len(ignored)} flags not used by tpsim (data, optimizer, logging, ...): "
                     + " ".join(ignored[:12]) + (" ..." if len(ignored) > 12 else ""))
    header = read_header(text)
    gpus = command.gpus_per_node * (command.nodes or 1) if command.gpus_per_node else None
    shape = {**header_shape(header), **shape}
    return ImportedLaunch(format="megatron", path=path, plan_fields=plan, model_shape=shape,
                          stack_overrides=stack_overrides(f, plan, notes),
                          layers_per_virtual_stage=f.int("--num-layers-per-virtual-pipeline-stage"),
                          model_ref=header.get("model"), cluster_ref=header.get("cluster"),
                          gpus=gpus or _int_or_none(header.get("gpus")), notes=tuple(notes))


def _int_or_none(text: str | None) -> int | None:
    return ascii_int(text)


def plan_fields(f: Flags, notes: list[str]) -> dict[str, Any]:
    """tpsim plan fields from Megatron flags (Megatron's defaults where a flag is absent)."""
    tp = f.int("--tensor-model-parallel-size") or 1
    pp = f.int("--pipeline-model-parallel-size") or 1
    fields: dict[str, Any] = {"tp": tp, "pp": pp, "sp": f.has("--sequence-parallel") and tp > 1,
                              "micro_batch": f.int("--micro-batch-size") or 1,
                              "global_batch": f.int("--global-batch-size"),
                              "recompute": _recompute_of(f, notes), "zero": _zero_of(f, notes),
                              "dtype": _dtype_of(f), "overlap": f.has("--overlap-grad-reduce"),
                              "order": "tp-pp-dp" if f.has("--use-tp-pp-dp-mapping") else "tp-dp-pp",
                              "attention": _attention_of(f, notes)}
    if f.has("--sequence-parallel") and tp == 1:
        notes.append("--sequence-parallel with tp=1: Megatron disables it")
    if f.has("--pipeline-model-parallel-layout"):
        fields.update(fields_of_layout(_layout_of(f), pp))
    if f.has("--tp-comm-overlap"):
        fields["tp_overlap"] = True
    for flag, name in (("--decoder-first-pipeline-num-layers", "pp_first"),
                       ("--decoder-last-pipeline-num-layers", "pp_last")):
        if f.int(flag):
            fields[name] = f.int(flag)
    for flag, name in (("--account-for-embedding-in-pipeline-split", "pp_embedding"),
                       ("--account-for-loss-in-pipeline-split", "pp_loss")):
        if f.has(flag):
            fields[name] = True
    if f.has("--enable-zbh1-pipeline"):
        fields["schedule"] = "zb-h1"
    fields["vpp"] = _vpp_of(f, pp)
    cp = f.int("--context-parallel-size") or 1
    if cp > 1:
        kinds = f.values("--cp-comm-type") or ["p2p"]
        kind = {"p2p": "ring", "a2a": "a2a"}.get(kinds[0])
        if kind is None or len(set(kinds)) > 1:
            notes.append(f"--cp-comm-type {' '.join(kinds)}: estimated as ring (p2p)")
            kind = "ring"
        fields.update(cp=cp, cp_kind=kind)
    ep = f.int("--expert-model-parallel-size") or 1
    if ep > 1:
        fields["ep"] = ep
        etp = f.int("--expert-tensor-parallel-size")
        if etp is not None and etp != tp:
            fields["etp"] = etp
    return fields


def _layout_of(f: Flags) -> tuple[int, ...]:
    """The decoder layers of each stage of ``--pipeline-model-parallel-layout`` (:func:`layout_chunks`), or the
    import's one line naming the flag and the value."""
    text = f.text("--pipeline-model-parallel-layout")
    try:
        return layout_chunks(text)
    except (ValueError, re.error):
        raise InputError(f"{f.where}: --pipeline-model-parallel-layout {text!r} is not a layout of E, t, m, L "
                         f"and |") from None


def _vpp_of(f: Flags, pp: int) -> int | None:
    """vpp from --pipeline-model-parallel-layout or --num-virtual-stages-per-pipeline-rank, or from
    --num-layers-per-virtual-pipeline-stage and --num-layers (without --num-layers: left to
    :func:`resolve_plan` once the model is known)."""
    if f.has("--pipeline-model-parallel-layout"):
        stages = len(_layout_of(f))
        if stages % pp:
            raise InputError(f"{f.where}: --pipeline-model-parallel-layout has {stages} stages, not a multiple of "
                             f"pp={pp}")
        return stages // pp
    per_rank = f.int("--num-virtual-stages-per-pipeline-rank")
    if per_rank:
        return per_rank
    per_stage = f.int("--num-layers-per-virtual-pipeline-stage")
    layers = f.int("--num-layers")
    if layers:   # validate_args counts the embedding and the loss as layers when told to
        layers += f.has("--account-for-embedding-in-pipeline-split") + f.has("--account-for-loss-in-pipeline-split")
    if not per_stage or not layers:
        return None
    if layers % (pp * per_stage):
        raise InputError(f"{f.where}: --num-layers {layers} is not a multiple of pp={pp} x "
                         f"--num-layers-per-virtual-pipeline-stage {per_stage}")
    return layers // (pp * per_stage)


MOE_COMM_OPTIONS = {"overlap_moe_expert_parallel_comm": "ep_a2a_overlap", "moe_enable_deepep": "ep_node_dedup"}
"""Megatron-Core MoE options (TransformerConfig fields; ``--overlap-moe-expert-parallel-comm``,
``--moe-enable-deepep`` on the command line) and the stack ``comm`` figure each sets true: the expert
all-to-alls of one micro-batch under another's computation; DeepEP's one RDMA copy per destination node,
forwarded over NVLink. The command line and a Megatron-Bridge recipe read them from here."""
FORCED_BALANCE_OPTION = "moe_router_force_load_balancing"
"""the benchmarks' forced expert balance (the model's ``moe_balance: forced``)."""

OPTIMIZER_DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
"""Megatron's --exp-avg-dtype / --exp-avg-sq-dtype / --main-params-dtype / --main-grads-dtype values
(arguments.py, the precision-aware optimizer of Transformer Engine's FusedAdam) as tpsim dtypes."""


def _flag(option: str) -> str:
    """The command-line flag of a Megatron-Core option (``moe_enable_deepep`` -> ``--moe-enable-deepep``)."""
    return "--" + option.replace("_", "-")


def recompute_module_figures(modules: list, where: str, notes: list[str]) -> dict[str, Any]:
    """``memory.selective_recompute_modules`` of Megatron-Core's recompute modules (empty when they are the
    default, ``core_attn``); the ones tpsim does not model are said in a note."""
    from ..estimator.stackterms import RECOMPUTE_MODULES

    names = [str(m) for m in modules]
    known = [m for m in names if m in RECOMPUTE_MODULES]
    other = [m for m in names if m not in RECOMPUTE_MODULES]
    if other:
        notes.append(f"{where} {' '.join(other)}: not modelled (their activations are counted as stored; tpsim "
                     f"recomputes {', '.join(RECOMPUTE_MODULES)})")
    return {} if known == ["core_attn"] else {"selective_recompute_modules": known}


def stack_overrides(f: Flags, plan: Mapping[str, Any], notes: list[str]) -> dict[str, dict[str, Any]]:
    """The stack figures the command line sets beyond the plan ({section: {key: value}}; the estimate runs the
    format's stack with them, :func:`tpsim.stacks.derived_stack`): the modules selective recomputation runs
    again (``--recompute-modules``), the precision-aware optimizer's moment, master and gradient dtypes, fp8
    parameters (``--fp8-param-gather``: fp8 compute weights kept and gathered), bf16 gradient reduction, the
    expert all-to-alls overlapped with another micro-batch's computation (``--overlap-moe-expert-parallel-comm``),
    DeepEP's node-deduplicated dispatch (``--moe-enable-deepep``), the optimizer states kept in host memory
    between steps (``--offload-optimizer-states``) and the share of them held and updated on the CPU
    (``--optimizer-cpu-offload``, ``--optimizer-offload-fraction``, ``--overlap-cpu-optimizer-d2h-h2d``)."""
    memory: dict[str, Any] = {}
    comm: dict[str, Any] = {}
    if plan.get("recompute") == "selective" and f.has("--recompute-modules"):
        memory.update(recompute_module_figures(f.values("--recompute-modules"), "--recompute-modules", notes))
    dtype_flags = ("--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-params-dtype", "--main-grads-dtype")
    given = {flag: f.text(flag) for flag in dtype_flags if f.has(flag)}
    for flag, value in given.items():
        if str(value).lower() not in OPTIMIZER_DTYPES:
            raise InputError(f"{f.where}: {flag} {value!r} is not one of {', '.join(OPTIMIZER_DTYPES)}")
    dt = {flag: OPTIMIZER_DTYPES[str(v).lower()] for flag, v in given.items()}
    if dt and not f.has("--use-precision-aware-optimizer"):
        if any(v != "fp32" for v in dt.values()):
            notes.append(f"{' '.join(dt)} without --use-precision-aware-optimizer: ignored (Megatron needs it for "
                         f"dtypes other than fp32)")
    elif dt:
        moments = {dt.get("--exp-avg-dtype", "fp32"), dt.get("--exp-avg-sq-dtype", "fp32")}
        if len(moments) > 1:  # one dtype for both moments in tpsim: the wider one, said
            notes.append(f"--exp-avg-dtype / --exp-avg-sq-dtype differ ({' / '.join(sorted(moments))}): both "
                         f"estimated as fp32")
            moments = {"fp32"}
        memory["optimizer_state_dtype"] = moments.pop()
        if "--main-params-dtype" in dt:
            memory["main_params_dtype"] = dt["--main-params-dtype"]
        if "--main-grads-dtype" in dt:
            memory["grad_buffer_dtype"] = dt["--main-grads-dtype"]
            comm["grad_reduce_dtype"] = dt["--main-grads-dtype"]
    if f.has("--fp8-param-gather"):
        if plan.get("dtype") in ("fp8", "mxfp8", "nvfp4"):
            memory["fp8_weights_kept"] = True
            comm["param_gather_dtype"] = "fp8"
        else:
            notes.append("--fp8-param-gather without an fp8 recipe: ignored")
    if f.has("--grad-reduce-in-bf16"):
        comm["grad_reduce_dtype"] = "bf16"
    comm.update({figure: True for option, figure in MOE_COMM_OPTIONS.items() if f.has(_flag(option))})
    if f.has("--offload-optimizer-states"):
        if plan.get("zero", 0) < 1:
            notes.append("--offload-optimizer-states without the distributed optimizer: ignored (Megatron-Core "
                         "offloads the distributed optimizer's states)")
        else:
            memory["optimizer_state_offload"] = True
    if f.has("--optimizer-cpu-offload"):
        memory.update(_cpu_optimizer(f, notes))
    elif f.has("--optimizer-offload-fraction") or f.has("--overlap-cpu-optimizer-d2h-h2d"):
        notes.append("--optimizer-offload-fraction / --overlap-cpu-optimizer-d2h-h2d without --optimizer-cpu-offload: "
                     "ignored")
    return {k: v for k, v in (("memory", memory), ("comm", comm)) if v}


def _cpu_optimizer(f: Flags, notes: list[str]) -> dict[str, Any]:
    """``memory.optimizer_cpu_fraction`` (``--optimizer-offload-fraction``, Megatron-LM's default 1.0) and
    ``memory.optimizer_cpu_overlap`` of ``--optimizer-cpu-offload`` (HybridDeviceOptimizer)."""
    import math

    text = f.text("--optimizer-offload-fraction")
    try:
        fraction = 1.0 if text is None else float(text)
    except ValueError:
        fraction = math.nan
    if not 0.0 <= fraction <= 1.0:
        raise InputError(f"{f.where}: --optimizer-offload-fraction {text!r} is not a fraction in [0, 1]")
    if f.has("--offload-optimizer-states"):
        raise InputError(f"{f.where}: --optimizer-cpu-offload with --offload-optimizer-states: the states either "
                         f"stay on the CPU or visit it between steps, not both")
    notes.append(f"--optimizer-cpu-offload: {fraction:g} of the optimizer states held and updated on the CPU "
                 f"(its update timed at the node's CPU memory bandwidth: a lower bound)")
    return {"optimizer_cpu_fraction": fraction, "optimizer_cpu_overlap": f.has("--overlap-cpu-optimizer-d2h-h2d")}


def _recompute_of(f: Flags, notes: list[str]) -> str:
    granularity = f.text("--recompute-granularity")
    if f.has("--recompute-activations") and granularity is None:
        granularity = "selective"
    if granularity is None:
        return "full" if f.has("--checkpoint-activations") else "none"
    if granularity == "selective":
        return "selective"  # the modules it runs again: stack_overrides
    if granularity != "full":
        raise InputError(f"{f.where}: --recompute-granularity {granularity!r} is not full or selective")
    method, layers = f.text("--recompute-method"), f.int("--recompute-num-layers")
    if method == "block" or (method == "uniform" and layers not in (None, 1)):
        notes.append(f"--recompute-method {method} --recompute-num-layers {layers}: estimated as full "
                     f"recomputation of every layer")
    return "full"


def _zero_of(f: Flags, notes: list[str]) -> int:  # noqa: ARG001 (unused: kept for the callers)
    if f.has("--zero-stage"):
        return f.int("--zero-stage") or 0
    if f.has("--use-megatron-fsdp"):
        strategy = f.text("--data-parallel-sharding-strategy") or "no_shard"
        if strategy not in ZERO_FROM_SHARDING:
            raise InputError(f"{f.where}: --data-parallel-sharding-strategy {strategy!r} is not one of "
                             f"{', '.join(ZERO_FROM_SHARDING)}")
        return ZERO_FROM_SHARDING[strategy]
    if f.has("--use-torch-fsdp2"):
        if f.has("--torch-fsdp2-no-reshard-after-forward"):
            return 2
        return 3
    return 1 if f.has("--use-distributed-optimizer") else 0


def _dtype_of(f: Flags) -> str:
    if f.has("--fp4-format"):
        return "nvfp4"
    if f.has("--fp8-format"):
        return "mxfp8" if f.text("--fp8-recipe") == "mxfp8" else "fp8"
    if f.has("--bf16"):
        return "bf16"
    return "fp16" if f.has("--fp16") else "fp32"


def _attention_of(f: Flags, notes: list[str]) -> str:
    backend = f.text("--attention-backend")
    if backend is None:
        return "flash" if not f.has("--deepspeed") or f.has("--use-flash-attn-v2") or f.has("--use-flash-attn") \
            else "unfused"
    if backend in ("unfused", "local"):
        return "unfused"
    if backend not in ("flash", "fused", "auto"):
        raise InputError(f"{f.where}: --attention-backend {backend!r} is not flash, fused, unfused, local or auto")
    if backend == "fused":
        notes.append("--attention-backend fused (cuDNN) estimated as flash attention (scores not stored)")
    return "flash"


def model_shape(f: Flags) -> dict[str, Any]:
    """ModelSpec fields the flags state (shape, and architecture when flags say so)."""
    shape: dict[str, Any] = {}
    for flag, key in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                      ("--ffn-hidden-size", "ffn_hidden_size"), ("--num-attention-heads", "num_attention_heads"),
                      ("--seq-length", "seq_len"), ("--max-position-embeddings", "max_positions"),
                      ("--vocab-size", "vocab_size")):
        value = f.int(flag)
        if value is not None:
            shape[key] = value
    kv_channels = f.int("--kv-channels")
    if kv_channels and shape.get("hidden_size") != kv_channels * shape.get("num_attention_heads", 0):
        shape["head_dim"] = kv_channels
    if f.int("--num-key-value-heads"):   # Megatron-DeepSpeed's name
        shape["num_kv_heads"] = f.int("--num-key-value-heads")
    elif f.has("--group-query-attention") and f.int("--num-query-groups"):
        shape["num_kv_heads"] = f.int("--num-query-groups")
    elif "num_attention_heads" in shape:
        shape["num_kv_heads"] = shape["num_attention_heads"]
    if f.has("--swiglu"):
        shape["activation"] = "swiglu"
    if f.text("--normalization") == "RMSNorm":
        shape["norm"] = "rmsnorm"
    if f.text("--position-embedding-type") == "rope" or f.has("--use-rotary-position-embeddings"):
        shape["position"] = "rotary"
    base = f.int("--rotary-base") or f.int("--rotary-position-embeddings-theta")
    if base:
        shape["rotary_base"] = base
    percent = f.text("--rotary-percent")
    if percent is not None:
        try:
            shape["rotary_fraction"] = float(percent)
        except ValueError:
            raise InputError(f"{f.where}: --rotary-percent {percent!r} must be a number") from None
    shape.update(moe_shape(f, shape.get("num_layers")))
    if f.has("--num-layers"):   # a full command states these choices by the presence of flags
        shape.setdefault("activation", "gelu")
        shape.setdefault("norm", "layernorm")
        shape.setdefault("position", "learned")
        shape["tie_embeddings"] = not f.has("--untie-embeddings-and-output-weights")
        shape["linear_bias"] = not f.has("--disable-bias-linear")
        shape["qkv_bias"] = shape["linear_bias"] or f.has("--add-qkv-bias")
    return shape


def moe_shape(f: Flags, num_layers: int | None) -> dict[str, Any]:
    """ModelSpec fields of the MoE, MLA and MTP arguments (Megatron's defaults where a flag is absent: top-2,
    expert width = --ffn-hidden-size, every layer MoE). The shared experts' total width is one shared expert
    of that width (the same parameters, FLOPs and activations as several narrower ones)."""
    shape: dict[str, Any] = {}
    experts = f.int("--num-experts")
    if experts:
        shape.update(num_experts=experts, experts_per_token=f.int("--moe-router-topk") or 2,
                     moe_ffn_hidden_size=f.int("--moe-ffn-hidden-size") or f.int("--ffn-hidden-size") or 0)
        shared = f.int("--moe-shared-expert-intermediate-size")
        shape.update(num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared or 0)
        freq = f.text("--moe-layer-freq")
        shape.update(parse_layer_freq(freq, num_layers, f.where) if freq is not None
                     else {"moe_layer_freq": 1, "first_dense_layers": 0, "dense_layers": ()})
        if f.has(_flag(FORCED_BALANCE_OPTION)):
            shape["moe_balance"] = "forced"
        groups = f.int("--moe-router-num-groups")
        if groups:
            shape.update(router_groups=groups, router_group_topk=f.int("--moe-router-group-topk") or groups)
        capacity = f.text("--moe-expert-capacity-factor")
        if capacity is not None:
            try:
                shape["capacity_factor"] = float(capacity)
            except ValueError:
                raise InputError(f"{f.where}: --moe-expert-capacity-factor {capacity!r} must be a number") from None
    if f.has("--multi-latent-attention"):
        shape.update(attention_kind="mla", q_lora_rank=f.int("--q-lora-rank") or 0,
                     kv_lora_rank=f.int("--kv-lora-rank") or 512, qk_nope_head_dim=f.int("--qk-head-dim") or 128,
                     qk_rope_head_dim=f.int("--qk-pos-emb-head-dim") or 64, v_head_dim=f.int("--v-head-dim") or 128)
    mtp = f.int("--mtp-num-layers")
    if mtp:
        shape["mtp_layers"] = mtp
    return shape
