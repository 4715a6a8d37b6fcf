"""Argument groups shared by the verbs (model, cluster, plan) and the builders they feed."""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable

from ..errors import InputError, did_you_mean

_DIGITS = re.compile(r"^\s*\+?[0-9]+\s*$")


def _integer(text: str, minimum: int, maximum: int) -> int:
    """Plain decimal digits only (``1e3``, ``0x10``, ``8.0`` and ``nan`` are refused), within the bounds;
    the length is checked before conversion, so a 400-digit number costs nothing."""
    from ..limits import show

    if not _DIGITS.match(text):
        kind = "a whole number" if minimum <= 0 else "a positive integer"
        raise argparse.ArgumentTypeError(f"{show(text)} is not {kind}")
    digits = text.strip().lstrip("+").lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise argparse.ArgumentTypeError(f"{show(int(digits)) if len(digits) < 4000 else show(text)} is above "
                                         f"the supported maximum {maximum}")
    value = int(digits)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer" if minimum == 1 else
                                         f"{value} must be >= {minimum}")
    return value


SIZE_SUFFIXES = {"k": 1024, "m": 1024 ** 2}
"""``--seq-len 8k`` = 8192, ``128k`` = 131072, ``1M`` = 1048576: sequence lengths and batches in powers of two, as
model cards write them (``8k context``)."""
_SIZED = re.compile(r"^\s*\+?([0-9]+)\s*([kKmM])\s*$")


def sized_arg(field: str, minimum: int = 1) -> Callable[[str], int]:
    """argparse type: :func:`count_arg` that also reads a size suffix (``8k``, ``128k``, ``1M``:
    :data:`SIZE_SUFFIXES`)."""
    plain = count_arg(field, minimum)

    def parse(text: str) -> int:
        m = _SIZED.match(text) if len(text) <= 40 else None
        if m is None:
            return plain(text)
        value = int(m.group(1)) * SIZE_SUFFIXES[m.group(2).lower()]
        return plain(str(value))
    parse.__name__ = field
    return parse


def choice_arg(field: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """argparse type: one of ``choices`` (argparse's own ``choices=`` gives no suggestion for a typo)."""
    def parse(text: str) -> str:
        if text in choices:
            return text
        from ..limits import show

        raise argparse.ArgumentTypeError(f"{show(text)} is not one of {', '.join(choices)}"
                                         + did_you_mean(text, choices))
    parse.__name__ = field
    return parse


def add_flops_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--flops-convention``: how MFU and model TFLOP/s count the model FLOPs (docs/SCHEMAS.md T5)."""
    from ..estimator.flops import FLOPS_CONVENTIONS

    p.add_argument("--flops-convention", default=None, choices=FLOPS_CONVENTIONS,
                   help="how MFU and model TFLOP/s count FLOPs: causal (default; attention over the keys the causal "
                        "mask keeps, as NeMo and torchtitan count), full (every key: Korthikanti et al. 2022, SC21), "
                        "megatron (Megatron-LM's num_floating_point_operations), palm (6N + 12 L h s), 6n")


def flops_convention(args: argparse.Namespace) -> str:
    """``--flops-convention`` or the default (causal)."""
    from ..estimator.flops import DEFAULT_FLOPS_CONVENTION

    return getattr(args, "flops_convention", None) or DEFAULT_FLOPS_CONVENTION


def in_convention(estimate: Any, model: Any, args: argparse.Namespace) -> Any:
    """``estimate`` with MFU and the FLOP rates counted as ``--flops-convention`` says."""
    from ..estimator.flops import convention_ratio

    name = flops_convention(args)
    if name == estimate.flops_convention:
        return estimate
    return estimate.in_convention(name, convention_ratio(model, name, estimate.flops_convention))


def format_columns(data: dict[str, Any], formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """{column: values} as a fixed-width text table: a header row, then one row per value, every column
    right-aligned to its widest cell and two spaces apart (``tpsim plan`` prints this; no pandas)."""
    formats = formats or {}
    cols = []
    for name, values in data.items():
        fmt = formats.get(name, _cell)
        cols.append([str(name)] + [fmt(v) for v in values])
    if not cols:
        return ""
    widths = [max(len(c) for c in col) for col in cols]
    rows = len(cols[0])
    return "\n".join("  ".join(col[r].rjust(w) for col, w in zip(cols, widths)).rstrip() for r in range(rows))


def _cell(value: Any) -> str:
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return str(bool(value))
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return f"{float(value):g}"
    if type(value).__name__.startswith("int"):
        return str(int(value))
    return str(value)


def positive_int(text: str) -> int:
    """An integer >= 1 (at most :data:`tpsim.limits.MAX_CLI_INT`)."""
    from ..limits import MAX_CLI_INT

    return _integer(text, 1, MAX_CLI_INT)


def count_arg(field: str, minimum: int = 1) -> Callable[[str], int]:
    """argparse type: an integer in ``[minimum, tpsim.limits.LIMITS[field]]`` (the one table of bounds)."""
    from ..limits import LIMITS

    def parse(text: str) -> int:
        return _integer(text, minimum, LIMITS[field])
    parse.__name__ = field
    return parse


def real_arg(field: str, minimum: float = 0.0, inclusive: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number above ``minimum`` (or equal, if ``inclusive``) and at most
    ``tpsim.limits.FLOAT_LIMITS[field]``."""
    def parse(text: str) -> float:
        from ..limits import check_float, show

        try:
            value = float(text) if len(text) <= 64 else float("inf")
        except ValueError:
            raise argparse.ArgumentTypeError(f"{show(text)} is not a number") from None
        try:
            return check_float(field, value, minimum=minimum, inclusive=inclusive)
        except InputError as exc:  # "field=<value> must ..." -> "<text as typed> must ..."
            shown = text.strip() if text.strip() and len(text) <= 40 else show(text)
            raise argparse.ArgumentTypeError(f"{shown} {str(exc).split(' ', 1)[-1]}") from None
    parse.__name__ = field
    return parse


def add_model_args(p: argparse.ArgumentParser, default: str | None = "gpt3-175b") -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=default,
                   help="preset name (gpt3-175b, megatron-1t, gpt3-1.3b, llama3-8b, llama3-70b, llama3-405b, "
                        "mixtral-8x7b, deepseek-v3) or a Hugging Face config.json (gpt2, gpt_neox, llama, mistral, "
                        "qwen2, gemma, gemma2, phi3, mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3) "
                        "(default: %(default)s)")
    add_model_overrides(g)


def add_model_overrides(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """The shape overrides (checked against tpsim/limits.py by :func:`tpsim.model.with_overrides`)."""
    for flag, what in (("--layers", "number of layers"), ("--hidden", "hidden size"),
                       ("--heads", "attention heads"), ("--kv-heads", "key/value heads (GQA)"),
                       ("--ffn", "MLP hidden size"), ("--vocab", "vocabulary size (before padding)"),
                       ("--experts", "routed experts per MoE layer (mixture-of-experts models)"),
                       ("--top-k", "routed experts per token (mixture-of-experts models)")):
        g.add_argument(flag, type=positive_int, help=f"override the model's {what}")
    g.add_argument("--seq-len", type=sized_arg("seq_len"),
                   help="training sequence length, suffixes allowed (8k = 8192, 128k, 1M) (default: the preset's, "
                        "else the config's maximum positions capped at 8192)")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", help="cluster name in topologies/clusters (dgx-a100, dgx-h100, hgx-h200, "
                                     "gb200-nvl72, pcie-8gpu, tpu-v4, local-cpu, ...) or a YAML path "
                                     "(default: the model preset's)")
    g.add_argument("--gpus", type=count_arg("gpus"), help="number of GPUs (default: the model preset's)")
    g.add_argument("--calibration", metavar="YAML",
                   help="calibration file (link values from `tpsim calibrate`, and/or a fitted `compute` section) "
                        "replacing the cluster file's `calibration:`")


def add_stack_arg(p: argparse.ArgumentParser) -> None:
    """``--stack``: the training stack whose rules, communication, compute and memory the estimate follows."""
    p.add_argument("--stack", default=None, metavar="NAME",
                   help="training stack: megatron (default; a preset may name its own), torchtitan, deepspeed, "
                        "hai-llm (DeepSeek-V3's published run, the deepseek-v3 preset's), or a profile YAML path "
                        "(tpsim/data/stacks): which plans it runs, how it communicates, computes and holds memory")


def build_stack(args: argparse.Namespace, model=None):
    """The StackProfile of ``--stack`` (default: the model preset's stack, else megatron)."""
    from ..stacks import load_stack

    preset = (model.default_plan.get("stack") if model is not None else None)
    return load_stack(getattr(args, "stack", None) or preset or "megatron")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan (defaults: the model preset's plan)")
    g.add_argument("--tp", type=count_arg("tp"), help="tensor-parallel degree")
    g.add_argument("--cp", type=count_arg("cp"), help="context-parallel degree (the sequence split over cp ranks)")
    g.add_argument("--cp-kind", choices=("ring", "a2a"),
                   help="context parallelism: ring (p2p K/V exchange overlapped with attention, default) or a2a "
                        "(Ulysses all-to-all)")
    g.add_argument("--ep", type=count_arg("ep"), help="expert-parallel degree (mixture-of-experts models)")
    g.add_argument("--etp", type=count_arg("tp", minimum=0),
                   help="expert tensor-parallel degree (default: equal to --tp)")
    g.add_argument("--pp", type=count_arg("pp"), help="pipeline stages")
    g.add_argument("--vpp", type=count_arg("vpp"),
                   help="model chunks per pipeline rank (virtual pipeline; >1 = interleaved 1F1B)")
    sp = g.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_true", default=None, help="sequence parallelism (tp > 1)")
    sp.add_argument("--no-sp", dest="sp", action="store_false", help="no sequence parallelism")
    g.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recomputation: selective = attention core (Korthikanti et al. 2022), "
                        "full = every layer from its input")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3),
                   help="ZeRO stage: 1 optimizer states, 2 + gradients, 3 + weights sharded over dp")
    g.add_argument("--micro-batch", type=count_arg("micro_batch"), help="sequences per micro-batch")
    g.add_argument("--global-batch", type=sized_arg("global_batch"),
                   help="sequences per step, suffixes allowed (1k = 1024) (default: the preset's)")
    add_dtype_arg(g)
    g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="do not overlap the DP gradient reduction with the backward pass")
    g.add_argument("--order", help="rank order, innermost first (default tp-dp-pp; cp sits right after tp unless "
                                   "named, e.g. tp-dp-cp-pp)")
    g.add_argument("--attention", choices=("flash", "unfused"),
                   help="flash (default) or unfused attention (stores the s x s scores)")
    from ..plan import SCHEDULES

    g.add_argument("--schedule", choices=SCHEDULES,
                   help="pipeline schedule (default 1f1b, interleaved when --vpp > 1; docs/MODEL.md)")
    tpo = g.add_mutually_exclusive_group()
    tpo.add_argument("--tp-overlap", dest="tp_overlap", action="store_true", default=None,
                     help="overlap TP communication with the GEMMs (Megatron --tp-comm-overlap, async TP)")
    tpo.add_argument("--no-tp-overlap", dest="tp_overlap", action="store_false", help="no TP overlap")
    g.add_argument("--pp-first-layers", dest="pp_first", type=count_arg("pp_layers", minimum=0),
                   help="decoder layers on the first pipeline stage (default: an even split)")
    g.add_argument("--pp-last-layers", dest="pp_last", type=count_arg("pp_layers", minimum=0),
                   help="decoder layers on the last pipeline stage (default: an even split)")
    g.add_argument("--pp-embedding-as-layer", dest="pp_embedding", action="store_true", default=None,
                   help="count the embedding as a layer in the pipeline split")
    g.add_argument("--pp-loss-as-layer", dest="pp_loss", action="store_true", default=None,
                   help="count the output layer and loss as a layer in the pipeline split")


def add_dtype_arg(g: argparse.ArgumentParser | argparse._ArgumentGroup, help: str = "GEMM precision") -> None:
    """``--dtype``: one of :data:`tpsim.hardware.DTYPES` (a typo gets a suggestion)."""
    from ..hardware import DTYPES

    g.add_argument("--dtype", type=choice_arg("dtype", tuple(DTYPES)), default=None, metavar="{" + ",".join(DTYPES) + "}",
                   help=help)


def build_model(args: argparse.Namespace, modelled: bool = True):
    """The model of ``--model`` with the overrides; with ``modelled`` (every verb that estimates), a model
    with features the estimator does not model yet is refused (:func:`tpsim.model.require_modelled`)."""
    from ..model import load_model, require_modelled, with_overrides

    spec = load_model(args.model)
    spec = with_overrides(spec, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                          ffn=args.ffn, vocab=args.vocab, seq_len=args.seq_len,
                          experts=getattr(args, "experts", None), top_k=getattr(args, "top_k", None))
    if modelled:
        require_modelled(spec)
    return spec


def cluster_and_gpus(args: argparse.Namespace, model) -> tuple[str, int | None]:
    if args.cluster is not None and not args.cluster.strip():
        raise InputError("--cluster: the name is empty (a cluster name or a YAML path)")
    name = args.cluster or model.default_plan.get("cluster") or "dgx-a100"
    gpus = args.gpus or (model.default_plan.get("gpus") if not args.cluster else None)
    return name, gpus


def build_cluster(args: argparse.Namespace, model):
    from ..topology import load_cluster

    name, gpus = cluster_and_gpus(args, model)
    return load_cluster(name, gpus=gpus, calibration=getattr(args, "calibration", None))


def plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("tp", "cp", "cp_kind", "ep", "etp", "pp", "vpp", "sp", "recompute", "zero", "micro_batch", "dtype",
            "overlap", "order", "attention", "schedule", "tp_overlap", "pp_first", "pp_last", "pp_embedding",
            "pp_loss")
    return {k: getattr(args, k, None) for k in keys if getattr(args, k, None) is not None}


def build_plan(args: argparse.Namespace, model, cluster, stack=None):
    """The plan of the plan flags on top of the preset's defaults; a preset default that conflicts with a
    flag given (or with ``stack``'s rules) is dropped with one line on stderr (:func:`make_plan_as_typed`)."""
    import sys

    from ..plan import make_plan_as_typed

    fields = plan_fields(args)
    plan, notes = make_plan_as_typed(model, cluster.num_gpus, global_batch=args.global_batch, stack=stack, **fields)
    for line in notes:
        print(line, file=sys.stderr)
    return plan

