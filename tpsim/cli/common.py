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


def _layout_arg(text: str) -> tuple[int, ...]:
    """argparse type of ``--pp-layout`` (:func:`tpsim.plan.parse_layout`)."""
    from ..plan import parse_layout

    try:
        return parse_layout(text, "--pp-layout")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


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
    g.add_argument("--moe-balance", metavar="forced|aux|FACTOR",
                   help="mixture-of-experts load balance: forced (tokens force-balanced), aux (the router's "
                        "measured imbalance, tpsim/data/moe.yaml; the default) or the busiest expert's tokens over "
                        "the mean (a number >= 1)")


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
                   help="training stack: megatron (default; a preset may name its own), nemo (NeMo 24.07's "
                        "distributed optimizer), torchtitan (eager), torchtitan-compile (training.compile), "
                        "llm-foundry, deepspeed, deepspeed-2021 (ZeRO-3 as in "
                        "SC21 Table 2), hai-llm (DeepSeek-V3's published run, the deepseek-v3 preset's), or a "
                        "profile YAML path "
                        "(tpsim/data/stacks): which plans it runs, how it communicates, computes and holds memory")


def build_stack(args: argparse.Namespace, model=None):
    """The StackProfile of ``--stack`` (default: the model preset's stack, else megatron)."""
    from ..stacks import StackProfile, load_stack

    if isinstance(getattr(args, "stack", None), StackProfile):  # a launch file's figures on its stack (--from)
        return args.stack
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
    add_dtype_arg(g, help="GEMM precision (mxfp8, nvfp4: Blackwell block-scaled formats)")
    g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="do not overlap the DP gradient reduction with the backward pass")
    g.add_argument("--order", help="rank order, innermost first (default tp-dp-pp; cp sits right after tp unless "
                                   "named, e.g. tp-dp-cp-pp)")
    g.add_argument("--attention", choices=("flash", "unfused"),
                   help="flash (default) or unfused attention (stores the s x s scores)")
    from ..plan import SCHEDULES

    g.add_argument("--schedule", choices=SCHEDULES,
                   help="pipeline schedule (default: the stack's, 1f1b for megatron, interleaved when --vpp > 1; "
                        "docs/MODEL.md \"Pipeline schedule\")")
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
    g.add_argument("--pp-layout", dest="pp_layout", type=_layout_arg, metavar="LAYOUT",
                   help="decoder layers of every model chunk (pp x vpp, in model order: 3,2,2,...,0) or a Megatron "
                        "--pipeline-model-parallel-layout string (Et*3|(tt|)*29m|L); replaces the split flags")


def add_dtype_arg(g: argparse.ArgumentParser | argparse._ArgumentGroup, help: str = "GEMM precision") -> None:
    """``--dtype``: one of :data:`tpsim.hardware.DTYPES` (a typo gets a suggestion)."""
    from ..hardware import DTYPES

    g.add_argument("--dtype", type=choice_arg("dtype", tuple(DTYPES)), default=None, metavar="{" + ",".join(DTYPES) + "}",
                   help=help)


def build_model(args: argparse.Namespace, modelled: bool = True):
    """The model of ``--model`` with the overrides; with ``modelled`` (every verb that estimates), a model
    with features the estimator does not model yet is refused (:func:`tpsim.model.require_modelled`)."""
    from ..model import load_model, require_modelled, with_overrides
    from ..model.overrides import with_moe_balance

    spec = load_model(args.model)
    spec = with_overrides(spec, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                          ffn=args.ffn, vocab=args.vocab, seq_len=args.seq_len,
                          experts=getattr(args, "experts", None), top_k=getattr(args, "top_k", None))
    spec = with_moe_balance(spec, getattr(args, "moe_balance", None))
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
            "pp_loss", "pp_layout")
    return {k: getattr(args, k, None) for k in keys if getattr(args, k, None) is not None}


def build_plan(args: argparse.Namespace, model, cluster, stack=None):
    """The plan of the plan flags on top of the preset's defaults; without ``--schedule`` the stack's own
    schedule (its ``rules.schedules.default``). A preset default that conflicts with a flag given (or with
    ``stack``'s rules) is dropped with one line on stderr (:func:`make_plan_as_typed`), printed by
    :func:`print_plan_notes` once the verb's checks have passed (a refusal after it stays one line)."""
    from ..plan import make_plan_as_typed

    fields = plan_fields(args)
    if "schedule" not in fields:
        fields["schedule"] = (stack if stack is not None else build_stack(args, model)).rules.default_schedule
    plan, notes = make_plan_as_typed(model, cluster.num_gpus, global_batch=args.global_batch, stack=stack, **fields)
    args.plan_notes = list(notes)
    return plan


def print_plan_notes(args: argparse.Namespace) -> None:
    """The notes of :func:`build_plan` on stderr (once), when nothing left can refuse the command."""
    import sys

    for line in getattr(args, "plan_notes", ()):
        print(line, file=sys.stderr)
    args.plan_notes = []


# ---- shared by estimate, export, plan, report and the traced-model paths (tpsim/cli/graph.py) ----------
SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")


EXPORT_FORMATS = ("megatron", "torchtitan", "deepspeed", "nemo", "bridge")
"""tpsim.launch.FORMATS, repeated here so that building the parser does not import the exporters."""


def model_ref(args: argparse.Namespace, model: Any) -> tuple[str, dict[str, int | None]]:  # noqa: ARG001
    """How to load the model again (the --model argument) and the shape overrides given on the command line."""
    return str(args.model), {k: getattr(args, k, None) for k in SHAPE_FLAGS}


def cluster_ref(args: argparse.Namespace, model: Any) -> str:
    return str(cluster_and_gpus(args, model)[0])


def compute_model(args: argparse.Namespace, cluster, model=None):
    """None (the estimator's default compute model) or ``--profile``'s measured kernels, falling back to the
    default model (the stack's attention implementation) where the profile has no points."""
    if not getattr(args, "profile", None):
        return None
    from ..compute.profile import ProfileModel
    from ..estimator.context import default_compute

    return ProfileModel(args.profile, fallback=default_compute(cluster.device, build_stack(args, model))[0])


def _pm(value: float, low: float, high: float) -> str:
    """"+x%/-y%" of a band around a value (one "±x%" when symmetric to 0.1%)."""
    up, down = 100 * (high / value - 1), 100 * (1 - low / value)
    return f"±{up:.1f}%" if abs(up - down) < 0.05 else f"+{up:.1f}%/-{down:.1f}%"


def _basis(e) -> str:
    """What set the band, for the text output."""
    b = getattr(e, "band_basis", None)
    if not b or b.get("kind") == "prior":
        return ""
    return f" from {b['n']} {'calibration ' if b['kind'] == 'calibrated' else ''}runs' residuals: {b['group']}"


def _runs(values: list[int]) -> str:
    """``2+3x30+2``: equal neighbours folded."""
    runs: list[list[int]] = []
    for n in values:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(f"{n}x{k}" if k > 1 else f"{n}" for n, k in runs)


def _split_text(split: dict) -> str:
    """``layers per rank 13+16x3 (chunks 2x20+1+...)``: the pipeline split the estimate costs."""
    ranks, chunks = split["layers_per_rank"], split["layers_per_chunk"]
    out = f"layers per rank {_runs(ranks)}"
    if len(chunks) > len(ranks):
        out += f" (chunks in model order {_runs(chunks)})"
    return out


def format_estimate(e, model=None) -> str:
    """The estimate as text; with ``model`` (a ModelSpec) its summary comes first."""
    p = e.plan
    b, m = e.breakdown, e.memory_gib
    lines = [
        *(model.summary().splitlines() if model is not None else [f"model    {e.model}"]),
        f"cluster  {e.cluster['name']}: {e.cluster['gpus']} x {e.cluster['device']}",
        f"stack    {e.stack}",
        f"plan     {p.short()}  (global batch {p.global_batch}, {p.num_microbatches} micro-batches per replica,"
        f" {p.dtype}, {p.attention} attention, order {p.order})",
        *([f"pipeline {_split_text(e.pipeline_split)}"] if getattr(e, "pipeline_split", None) else []),
        f"compute  {e.compute_model}" + (f" ({100 * e.measured_compute_fraction:.0f}% of compute time measured)"
                                         if e.compute_model.startswith("profile") else ""),
        "",
        f"step time            {e.step_time_s:10.3f} s  {_pm(e.step_time_s, e.step_time_s_low, e.step_time_s_high)}"
        f"  ({e.step_time_s_low:.3f}-{e.step_time_s_high:.3f} s, 90% band{_basis(e)})",
        f"throughput           {e.tokens_per_s:10.0f} tokens/s  ({e.tokens_per_s_low:.0f}-{e.tokens_per_s_high:.0f})"
        f"  {e.tokens_per_s_per_gpu:,.0f} tokens/s/GPU",
        f"model TFLOP/s/GPU    {e.model_tflops_per_gpu:10.1f}   MFU {100 * e.mfu:5.1f}%"
        f" ({100 * e.mfu_low:.1f}-{100 * e.mfu_high:.1f}%)  ({e.flops_convention} FLOPs: --flops-convention)",
        f"hardware TFLOP/s/GPU {e.hardware_tflops_per_gpu:10.1f}   HFU {100 * e.hfu:5.1f}%",
        "",
        "time breakdown (s)   " + "  ".join(f"{k} {b[k]:.3f}" for k in
                                            ("compute", "recompute", "bubble", "optimizer", "exposed_comm",
                                             "overhead")),
        "communication (s)    " + "  ".join(f"{k} {b[k]:.3f}" for k in ("tp_comm", "pp_comm", "dp_comm")
                                            + tuple(k for k in ("cp_comm", "ep_comm") if b.get(k)))
        + "  (totals, partly hidden)",
        "",
        f"memory per GPU       {e.peak_memory_gib:10.2f} GiB  "
        f"({'fits' if e.fits else 'DOES NOT FIT'})",
        "  " + "  ".join(f"{k} {v:.2f}" for k, v in m.items()),
    ]
    if e.collectives:
        lines.append("collectives          " + "; ".join(f"{k} {v}" for k, v in e.collectives.items()))
    for w in e.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def build_space(args: argparse.Namespace, model: Any) -> Any:
    """The SearchSpace of the constraint flags (defaults: the whole space)."""
    from ..search import SearchSpace

    defaults = dict(model.default_plan)
    kw: dict[str, Any] = {"dtype": args.dtype or defaults.get("dtype", "bf16"),
                          "attention": args.attention or defaults.get("attention", "flash")}
    if args.no_pp and args.pp:
        raise InputError(f"--no-pp conflicts with --pp={' '.join(map(str, args.pp))}")
    kw["tp"] = _positive("tp", args.tp)
    kw["pp"] = (1,) if args.no_pp else _positive("pp", args.pp)
    if args.max_tp is not None:
        if args.max_tp <= 0:
            raise InputError(f"--max-tp={args.max_tp} must be a positive integer")
        kw["max_tp"] = args.max_tp
    kw["cp"] = _positive("cp", args.cp)
    if args.max_cp is not None:
        kw["max_cp"] = args.max_cp
    if args.cp_kind:
        kw["cp_kind"] = tuple(args.cp_kind)
    kw["ep"] = _positive("ep", args.ep)
    if args.etp is not None:
        for v in args.etp:
            if v < 0:
                raise InputError(f"--etp={v} must be 0 (equal to tp) or a positive integer")
        kw["etp"] = tuple(args.etp)
    for name, flag in (("vpp", "vpp"), ("micro_batch", "micro-batch")):
        values = _positive(flag, getattr(args, name))
        if values:
            kw[name] = values
    if getattr(args, "schedule", None):
        kw["schedule"] = tuple(dict.fromkeys(args.schedule))
    if args.sp:
        kw["sp"] = (args.sp == "on",)
    if args.zero is not None:
        kw["zero"] = tuple(args.zero)
    if args.recompute is not None:
        kw["recompute"] = tuple(args.recompute)
    if args.order:
        kw["order"] = tuple(args.order)
    if args.no_overlap:
        kw["overlap"] = (False,)
    if getattr(args, "full_space", False):
        kw["full"] = True
    return SearchSpace(**kw)


def _positive(name: str, values: list[int] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    for v in values:
        if v <= 0:
            raise InputError(f"--{name}={v} must be a positive integer")
    return tuple(values)


def load_compute(args: argparse.Namespace, cluster: Any, model: Any = None) -> Any:
    """None (the estimator's default: the device's kernel model) or a ProfileModel for ``--profile`` that falls
    back to it where the profile has no points."""
    return compute_model(args, cluster, model)


def gpu_counts_for(name: str, gpus: int, objective: str) -> list[int]:
    """The GPU counts searched: ``gpus``, or with ``--objective cost`` every count :func:`cost_gpu_counts`
    gives (cheap: no cluster is built)."""
    from ..search import cost_gpu_counts
    from ..topology import load_cluster

    if objective not in ("cost", "energy"):
        return [gpus]
    return list(cost_gpu_counts(load_cluster(name, gpus=gpus).gpus_per_node, gpus))


def clusters_for(name: str, gpus: int, objective: str, calibration: str | None = None) -> list[Any]:
    """The cluster at ``gpus``, or with ``--objective cost`` one per searched GPU count."""
    from ..topology import load_cluster

    return [load_cluster(name, gpus=n, calibration=calibration) for n in gpu_counts_for(name, gpus, objective)]


def plan_header(result: Any, model: Any, cluster: Any, batch: int) -> str:
    gpus = ", ".join(str(int(p.cluster.num_gpus)) for p in result.parts) or str(cluster.num_gpus)
    return (f"{model.name} on {cluster.name} ({gpus} x {cluster.device.name}), global batch {batch}, "
            f"seq {model.seq_len}: {result.enumerated} plans enumerated, {result.evaluated} evaluated, "
            f"{len(result)} ranked by {result.objective} in {result.elapsed_s:.2f} s"
            + (" (cached result)" if result.cached else "")
            + f"\nstack {result.stack_name}; MFU counts {result.flops_convention} attention FLOPs"
            + (f" (--flops-convention {result.flops_convention})" if result.flops_convention not in ("causal", "full")
               else "") + "; tok/s/gpu = tokens/s per GPU"
            + ("; one row per distinct shape (tp, cp, pp, ep, ZeRO)" if result.distinct else ""))


DISPLAY_NAMES = {"recompute": "recomp", "overlap": "ovl", "variants": "var", "compute_s": "compute",
                 "recompute_s": "recomp_s", "bubble_s": "bubble", "optimizer_s": "optim", "exposed_comm_s": "exp_comm",
                 "overhead_s": "overhead",
                 "tp_comm_s": "tp_comm", "pp_comm_s": "pp_comm", "dp_comm_s": "dp_comm", "cp_comm_s": "cp_comm",
                 "ep_comm_s": "ep_comm"}


def format_table(data: dict[str, Any]) -> str:
    """The ranked plans (:meth:`SearchResult.table_columns`) as fixed-width text: times in seconds (3 decimals;
    compute to exp_comm add up to step_s, the *_comm columns are totals, partly hidden), MFU in %. No pandas."""
    data = {DISPLAY_NAMES.get(k, k): v for k, v in data.items()}
    fmt: dict[str, Any] = {c: "{:.3f}".format for c in data if c.endswith("_s")
                           or c in {DISPLAY_NAMES[k] for k in DISPLAY_NAMES if k.endswith("_s")}}
    fmt.update({"tok/s": "{:,.0f}".format, "tok/s/gpu": "{:,.0f}".format, "mfu": lambda v: f"{100 * v:.1f}%",
                "mem_GiB": "{:.1f}".format, "free_GiB": "{:.1f}".format, "$/Mtok": "{:.3f}".format, "days": "{:.2f}".format,
                "goodput": lambda v: f"{100 * v:.1f}%", "$": "{:,.0f}".format, "MWh": "{:,.0f}".format})
    return format_columns(data, fmt)


def format_ties(result: Any, top: int) -> str:
    """The line under the table that says which rows are ties (the ``tie`` column)."""
    idx = result.ranking[:top]
    if not len(idx) or result.objective == "memory":
        return ""
    groups = result.tie_groups(idx)
    first = int((groups == 1).sum())
    return (f"tie: rows with the same number are within the error band of that group's first row (90% band of its "
            f"step time): {first} of the {len(idx)} shown tie with #1" + ("" if result.distinct else
                                                                          "; --distinct shows one row per shape"))


def format_pareto(result: Any) -> str:
    lines = ["Pareto front, step time vs. memory per GPU (fitting plans; no plan is both faster and smaller):"]
    for row in result.front_rows(result.pareto_time_memory()):
        lines.append(f"  {row['peak_memory_gib']:8.1f} GiB  {row['step_time_s']:10.3f} s  {row['label']}")
    if len(result.parts) > 1:
        lines.append("Pareto front, throughput vs. number of GPUs (no smaller count is as fast):")
        for row in result.front_rows(result.pareto_gpus_throughput()):
            lines.append(f"  {row['gpus']:6d} GPUs  {row['tokens_per_s']:12,.0f} tokens/s  "
                         f"{row['cost_per_mtok']:8.3f} $/Mtok  {row['label']}")
    return "\n".join(lines)


def format_why(result: Any) -> str:
    lines = [f"rejected {sum(result.rejected.values())} of {result.enumerated} plans:"]
    for key, text, count in result.why():
        lines.append(f"  {count:>10}  {key:<24} {text}")
    if not result.rejected:
        lines.append("  (none)")
    if getattr(result, "left_out", 0):
        lines.append(f"left out of the space: {result.left_out} plans of the full product, each rejected by a plan "
                     "rule or the stack (mixture-of-experts default; --full-space enumerates and counts them)")
    return "\n".join(lines)


def write_plan_csv(result: Any, path: str, top: int, force: bool = False) -> None:
    """The ranked plans as CSV; without ``force`` a file that appeared at ``path`` during the search is kept
    and the run refused (the path was checked before the search)."""
    from ..io import atomic_write_text

    atomic_write_text(path, result.table(top).to_csv(index=False), what="--csv", overwrite=force)


def mfu_above_measured(result: Any, top: int) -> str | None:
    """The warning of the best shown plan's MFU when it is above what any training run has measured."""
    import numpy as np

    from ..estimator.flops import mfu_warning

    idx = result.ranking[:top]
    if not len(idx):
        return None
    mfu = np.asarray(result.columns["mfu"])[idx]
    best = int(np.argmax(mfu))
    line = mfu_warning(float(mfu[best]), result.flops_convention)
    return f"rank {best + 1}: {line}" if line else None


def print_ranking(result: Any, args: argparse.Namespace, compared: Any = None) -> None:
    """The text body of a search (`tpsim plan` and traced-model plans): the ranking table (or the ``--compare``
    table), then ``--why`` and ``--pareto`` when asked."""
    if compared is not None:
        from ..report.compare import format_comparison

        print(format_comparison(compared))
    elif len(result):
        print(format_table(result.table_columns(args.top)))
        ties = format_ties(result, args.top)
        if ties:
            print(ties)
        high = mfu_above_measured(result, args.top)
        if high:
            print(f"warning: {high}")
    else:
        print("no plan fits: see --why, try --include-unfit, more GPUs, recomputation or ZeRO")
    if args.why:
        print(format_why(result))
    if args.pareto:
        print(format_pareto(result))
