"""``tpsim profile``: measure kernel times with torch (``--check``: leave-one-out error of a profile)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError
from .common import count_arg, real_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure GEMM, attention and memory-kernel times into a profile file",
        description="Measure kernel times with torch on this machine's CPU or GPU and write a profile file "
                    "(profiles/README.md). Resumable: rerunning with the same --out measures only the missing "
                    "points. --check FILE reports the profile's leave-one-out interpolation error.")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device to measure (default cpu)")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="dtype to measure, repeatable or comma-separated (default: fp32,bf16 on cpu; "
                        "bf16,fp16,fp8 on cuda where supported)")
    p.add_argument("--out", type=Path, help="profile file to write or resume (default profiles/<device>.csv)")
    p.add_argument("--quick", action="store_true", help="coarse grid (under a minute on CPU); same as --grid quick")
    p.add_argument("--grid", choices=("tiny", "quick", "full"), help="grid size (default full; tiny: tests)")
    p.add_argument("--threads", type=count_arg("threads"), default=1, help="CPU threads, torch.set_num_threads (default 1)")
    p.add_argument("--kinds", default="gemm,attention,memory", help="kernel kinds to measure (default all)")
    p.add_argument("--max-kernel-s", type=real_arg("max_kernel_s"), help="skip points predicted slower than this (seconds)")
    p.add_argument("--redo-noisy", type=real_arg("redo_noisy_pct", inclusive=True), metavar="PCT",
                   help="first drop the file's points whose interquartile spread exceeds PCT %% (measured on a "
                        "busy machine), then measure what is missing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--check", type=Path, metavar="FILE", help="report leave-one-out interpolation error of FILE")
    p.add_argument("--json", action="store_true", help="with --check: print one JSON object")
    p.add_argument("--roofline", metavar="DEVICE",
                   help="with --check: also compare the roofline of DEVICE (device table name, e.g. H200) "
                        "with the profile's measured times")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.check:
        return _check(args.check, args.json, args.roofline)
    if args.json or args.roofline:
        raise InputError("--json and --roofline go with --check FILE")
    from ..profiler.run import RunOptions, run_profile
    from ..profiler.store import check_destination

    if args.out is not None:  # before torch starts and anything is measured
        check_destination(args.out)

    for item in args.dtype:  # an empty --dtype is not "the defaults" (issue 26)
        if not item.strip() or any(not d.strip() for d in item.split(",")):
            raise InputError(f"--dtype {item!r}: names an empty dtype (give fp32, bf16, fp16, fp8 ... or leave "
                             f"the flag out for the defaults)")
    dtypes = tuple(d.strip() for item in args.dtype for d in item.split(",") if d.strip())
    grid = args.grid or ("quick" if args.quick else "full")
    if args.quick and args.grid not in (None, "quick"):
        raise InputError(f"--quick contradicts --grid={args.grid}")
    options = RunOptions(device=args.device, dtypes=dtypes, out=args.out, grid=grid, threads=args.threads,
                         kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
                         max_kernel_s=args.max_kernel_s, redo_noisy_pct=args.redo_noisy,
                         progress=not args.no_progress)
    summary = run_profile(options)
    for line in summary.warnings:
        print(f"warning: {line}")
    print(f"{summary.path}: {summary.measured} points measured, {summary.already} already in the file, "
          f"{summary.skipped_slow} skipped (over the time cap or failed) in {summary.seconds:.1f} s")
    return 0


def profile_kind(path: Path) -> str:
    """``conv`` for a convolution profile (``python -m tpsim.profiler.conv``, its column line), else ``kernel``
    (GEMM, attention and memory kernels; the profile loaders then check the file in full)."""
    from ..opgraph.convprofile import COLUMNS as CONV_COLUMNS

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    return "conv" if tuple(c.strip() for c in line.split(",")) == CONV_COLUMNS else "kernel"
    except OSError:
        pass
    return "kernel"


def _check_conv(path: Path, as_json: bool, roofline_device: str | None) -> int:
    """``--check`` of a convolution profile: the same leave-one-out error, per (op, dtype, pass) table."""
    import numpy as np

    from ..opgraph.convprofile import load_conv_profile
    from ..profiler.check import check_conv_profile

    if roofline_device:
        raise InputError(f"--roofline={roofline_device}: the roofline comparison is for kernel profiles (GEMM, "
                         f"attention, memory); {path} is a convolution profile")
    profile = load_conv_profile(path)
    result = check_conv_profile(profile)
    device = f"cpu: {profile.device}" if profile.device_type == "cpu" else profile.device
    if as_json:
        print(json.dumps({"file": str(path), "kind": "conv", "device": device, **result.to_dict()}))
        return 0
    points = sum(int((~np.isnan(t.log_time)).sum()) for t in profile.tables.values())
    print(f"{path} (convolution profile, {device}, {len(profile.tables)} tables, {points} points): "
          "leave-one-out interpolation error")
    _print_rows(result)
    return 0


def _check(path: Path, as_json: bool, roofline_device: str | None) -> int:
    from ..compute.profile import load_profile, profile_device_name
    from ..profiler.check import check_profile

    if profile_kind(path) == "conv":
        return _check_conv(path, as_json, roofline_device)
    profile = load_profile(path)
    result = check_profile(profile)
    comparison = _roofline_comparison(profile, roofline_device) if roofline_device else None
    if as_json:
        extra = {"roofline": {"device": roofline_device, "tables": comparison}} if comparison else {}
        print(json.dumps({"file": str(path), "kind": "kernel", "device": profile_device_name(profile),
                          **result.to_dict(), **extra}))
        return 0
    _print_check(path, profile, result)
    if comparison:
        print(f"roofline of {roofline_device} vs measured (predicted / measured time):")
        for row in comparison:
            print(f"  {row['kind']:<9} {row['op']:<12} {row['dtype']:<4} {row['pass']}  {row['points']:5d} points  "
                  f"p10 {row['ratio_p10']:7.3f}  median {row['ratio_median']:7.3f}  p90 {row['ratio_p90']:7.3f}")
    return 0


def _roofline_comparison(profile: object, device_name: str) -> list[dict[str, object]]:
    from ..compute.roofline import RooflineModel
    from ..hardware import get_device
    from ..profiler.check import compare_with_model

    return compare_with_model(profile, RooflineModel(get_device(device_name)))


def _print_check(path: Path, profile: object, result: object) -> None:
    from ..compute.profile import profile_device_name

    print(f"{path} ({profile_device_name(profile)}, {profile.meta.threads} thread(s), "
          f"{len(profile.points)} points): leave-one-out interpolation error")
    _print_rows(result)


def _print_rows(result: object) -> None:
    rows = [("all", result.to_dict())] + list(result.per_kind.items())
    for label, s in rows:
        if not s["points"]:
            print(f"  {label:<10}     0 points (no axis has 3 values: nothing to leave out)")
            continue
        print(f"  {label:<10} {s['points']:5d} points  median {s['median_error_pct']:6.2f}%  "
              f"p90 {s['p90_error_pct']:6.2f}%  max {s['max_error_pct']:7.2f}%")
