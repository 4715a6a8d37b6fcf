"""``tpsim model show MODEL``: what tpsim reads from a preset or a config.json.

Examples::

    tpsim model show mixtral-8x7b
    tpsim model show path/to/config.json --seq-len 4096 --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import add_model_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="show a model: parameters (total, active), layers, ignored config keys",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="model_verb", metavar="show", required=True)
    show = verbs.add_parser("show", help="summary of a preset or a Hugging Face config.json")
    show.add_argument("model", help="preset name or config.json path (or a folder holding one)")
    add_model_overrides(show.add_argument_group("overrides"))
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .common import build_model

    spec = build_model(args, modelled=False)
    if args.json:
        print(json.dumps(model_json(spec), indent=1, allow_nan=False))
    else:
        print(spec.summary())
        defaults = preset_defaults_line(spec)
        if defaults:
            print(defaults)
    return 0


def preset_defaults_line(spec: Any) -> str:
    """``preset plan   cluster dgx-h100, 64 GPUs, stack megatron; tp=8 pp=4 ...`` (empty for a config.json):
    what every verb uses for a flag not given (a default that conflicts with a flag given is dropped)."""
    d = dict(spec.default_plan)
    if not d:
        return ""
    where = [f"cluster {d.pop('cluster')}" if "cluster" in d else "", f"{d.pop('gpus')} GPUs" if "gpus" in d else "",
             f"stack {d.pop('stack', 'megatron')}", f"global batch {spec.global_batch}" if spec.global_batch else ""]
    fields = " ".join(f"{k}={v}" for k, v in d.items())
    return (f"preset plan  {', '.join(w for w in where if w)}; {fields} (defaults of every verb; a flag given "
            "replaces its default, and a default conflicting with the flags is dropped with a note)")


def model_json(spec: Any) -> dict[str, Any]:
    """The spec's fields plus counts (unpadded vocabulary), FLOPs per token and what is not modelled."""
    from ..model import approximations, unmodelled_features

    d = spec.to_dict()
    flops = spec.flops_per_token()
    d.update(params=spec.total_params(padded=False), active_params=spec.active_params(padded=False),
             mtp_params=spec.mtp_params(), forward_flops_per_token=flops.total,
             flops_per_token={k: getattr(flops, k) for k in ("attention_linear", "attention_scores", "mlp", "router",
                                                             "logits")},
             unmodelled_features=list(unmodelled_features(spec)), approximations=list(approximations(spec)))
    return d
