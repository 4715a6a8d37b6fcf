"""Argument groups shared by the verbs (model, cluster, plan) and the builders they feed."""

from __future__ import annotations

import argparse
from typing import Any



def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


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
    g.add_argument("--seq-len", type=positive_int,
                   help="training sequence length (default: the preset's, else the config's maximum "
                        "positions capped at 8192)")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", help="cluster name in topologies/clusters (dgx-a100, dgx-h100, hgx-h200, "
                                     "gb200-nvl72, pcie-8gpu, tpu-v4, local-cpu, ...) or a YAML path "
                                     "(default: the model preset's)")
    g.add_argument("--gpus", type=positive_int, help="number of GPUs (default: the model preset's)")
    g.add_argument("--calibration", metavar="YAML",
                   help="calibration file (link values from `tpsim calibrate`, and/or a fitted `compute` section) "
                        "replacing the cluster file's `calibration:`")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan (defaults: the model preset's plan)")
    g.add_argument("--tp", type=positive_int, help="tensor-parallel degree")
    g.add_argument("--cp", type=positive_int, help="context-parallel degree (the sequence split over cp ranks)")
    g.add_argument("--cp-kind", choices=("ring", "a2a"),
                   help="context parallelism: ring (p2p K/V exchange overlapped with attention, default) or a2a "
                        "(Ulysses all-to-all)")
    g.add_argument("--ep", type=positive_int, help="expert-parallel degree (mixture-of-experts models)")
    g.add_argument("--etp", type=int, help="expert tensor-parallel degree (default: equal to --tp)")
    g.add_argument("--pp", type=positive_int, help="pipeline stages")
    g.add_argument("--vpp", type=positive_int,
                   help="model chunks per pipeline rank (virtual pipeline; >1 = interleaved 1F1B)")
    sp = g.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_true", default=None, help="sequence parallelism (tp > 1)")
    sp.add_argument("--no-sp", dest="sp", action="store_false", help="no sequence parallelism")
    g.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recomputation: selective = attention core (Korthikanti et al. 2022), "
                        "full = every layer from its input")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3),
                   help="ZeRO stage: 1 optimizer states, 2 + gradients, 3 + weights sharded over dp")
    g.add_argument("--micro-batch", type=positive_int, help="sequences per micro-batch")
    g.add_argument("--global-batch", type=positive_int, help="sequences per step (default: the preset's)")
    g.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16", "fp8"), help="GEMM precision")
    g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="do not overlap the DP gradient reduction with the backward pass")
    g.add_argument("--order", help="rank order, innermost first (default tp-dp-pp; cp sits right after tp unless "
                                   "named, e.g. tp-dp-cp-pp)")
    g.add_argument("--attention", choices=("flash", "unfused"),
                   help="flash (default) or unfused attention (stores the s x s scores)")


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
    name = args.cluster or model.default_plan.get("cluster") or "dgx-a100"
    gpus = args.gpus or (model.default_plan.get("gpus") if not args.cluster else None)
    return name, gpus


def build_cluster(args: argparse.Namespace, model):
    from ..topology import load_cluster

    name, gpus = cluster_and_gpus(args, model)
    return load_cluster(name, gpus=gpus, calibration=getattr(args, "calibration", None))


def plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("tp", "cp", "cp_kind", "ep", "etp", "pp", "vpp", "sp", "recompute", "zero", "micro_batch", "dtype",
            "overlap", "order", "attention")
    return {k: getattr(args, k, None) for k in keys if getattr(args, k, None) is not None}


def build_plan(args: argparse.Namespace, model, cluster):
    from ..plan import make_plan

    fields = plan_fields(args)
    return make_plan(model, cluster.num_gpus, global_batch=args.global_batch, **fields)

