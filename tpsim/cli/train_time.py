"""``tpsim train-time``: the whole run of one plan (ideal and expected days with a band, goodput,
interruptions, checkpoints, restarts, GPU-hours, cost, energy); the same figures as ``estimate --tokens N``.

Example::

    tpsim train-time --model llama3-405b --tokens 15.6e12
    tpsim train-time --model llama3-405b --tokens 15.6e12 --reliability rsc-a100 --gpu-hour-price 2.5 --json
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .common import real_arg


def add_train_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    """``--tokens``, ``--reliability``, ``--gpu-hour-price`` (train-time, estimate, plan)."""
    g = p.add_argument_group("whole run (docs/MODEL.md, Time to train)")
    g.add_argument("--tokens", type=real_arg("tokens", minimum=1.0, inclusive=True), required=required,
                   default=None, metavar="N",
                   help="training tokens of the whole run (e.g. 15.6e12): adds the expected days, goodput, "
                        "interruptions, cost and energy")
    g.add_argument("--reliability", default=None, metavar="FLEET|FILE",
                   help="failure rates, checkpoint storage, restart, energy: a shipped fleet (llama3-h100, the "
                        "default; rsc1-a100, rsc2-a100, rsc-a100) or a YAML file overriding its figures "
                        "(tpsim/data/reliability.yaml)")
    if not any(a.dest == "gpu_hour_price" for a in p._actions):
        g.add_argument("--gpu-hour-price", type=real_arg("gpu_hour_price"), default=None,
                       help="dollars per GPU-hour for the cost (default 1.0: the cost reads as GPU-hours)")


def register(sub: Any) -> None:
    from .estimate import add_estimate_args, run as run_estimate

    p = sub.add_parser("train-time", help="predict the whole run of a plan: days, goodput, cost, energy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_estimate_args(p)
    add_train_args(p, required=True)
    p.set_defaults(func=run_estimate)


def refuse_tokens(args: argparse.Namespace, what: str) -> None:
    """One line instead of silently dropping ``--tokens`` where the whole run is not modelled yet."""
    from ..errors import InputError

    if getattr(args, "tokens", None) is not None:
        raise InputError(f"--tokens: the whole run of {what} is not modelled yet")


def require_tokens(args: argparse.Namespace) -> None:
    """``--reliability`` without ``--tokens`` would be ignored: one line instead."""
    from ..errors import InputError

    if getattr(args, "tokens", None) is None and getattr(args, "reliability", None) is not None:
        raise InputError(f"--reliability {args.reliability} needs --tokens N (the whole run it is for)")


def whole_run(args: argparse.Namespace, model: Any, cluster: Any, estimate: Any) -> Any:
    """The :class:`tpsim.train.TrainTime` of ``--tokens`` (None without it)."""
    if getattr(args, "tokens", None) is None:
        require_tokens(args)
        return None
    from ..train import DEFAULT_GPU_HOUR_PRICE, train_time

    price = args.gpu_hour_price if getattr(args, "gpu_hour_price", None) is not None else DEFAULT_GPU_HOUR_PRICE
    return train_time(model, cluster, estimate.plan, estimate, args.tokens, args.reliability, price)


def format_train_time(t: Any) -> str:
    """The whole-run figures as text."""
    lost = "  ".join(f"{k} {v:.2f}" for k, v in t.lost.items())
    energy = f"{t.energy_mwh:,.0f} MWh" if t.energy_mwh is not None else "n/a"
    lines = [
        f"whole run            {t.tokens:.4g} tokens, {t.steps:,} steps  (reliability {t.reliability})",
        f"ideal time           {t.ideal_days:10.2f} days",
        f"expected time        {t.expected_days:10.2f} days  ({t.expected_days_low:.2f}-{t.expected_days_high:.2f},"
        f" band of step time and failure rates)",
        f"goodput              {100 * t.goodput:10.1f} %  (ideal / expected)",
        f"interruptions        {t.interruptions:10.0f}    ({t.interruptions_per_day:.2f} per day, "
        f"{t.unexpected_per_day:.2f} unexpected; "
        + (f"one every {t.mtbf_hours:.2f} h)" if math.isfinite(t.mtbf_hours) else "no failure rate: none expected)"),
        f"checkpoint           every {t.checkpoint_interval_s:,.0f} s, {t.checkpoint_mode}: "
        f"{t.checkpoint_gib_per_rank:.2f} GiB per rank, {t.checkpoint_tb:.2f} TB in all, write "
        f"{t.checkpoint_write_s:.1f} s, stall {t.checkpoint_stall_s:.3f} s",
        f"restart              {t.restart_s:10.0f} s per interruption",
        f"lost (days)          {lost}",
        f"GPU-hours            {t.gpu_hours:14,.0f}   cost ${t.cost_usd:,.0f} at ${t.gpu_hour_price:g}/GPU-hour",
        f"energy               {energy}",
    ]
    lines += [f"warning: {w}" for w in t.warnings]
    return "\n".join(lines)
