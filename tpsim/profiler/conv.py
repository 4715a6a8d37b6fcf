"""Convolution kernels for the kernel profile: forward, data-gradient and weight-gradient times of 2-D
convolutions over a grid of shapes, written as rows keyed by their implicit-GEMM dims (what the op-graph
cost model asks for; ``tpsim.opgraph.convprofile`` reads them).

``python -m tpsim.profiler.conv --out profiles/conv-cpu-1t.csv [--grid tiny|full] [--threads 1]
[--dtype fp32,bf16] [--device cpu|cuda]``

Grid (``full``): 3x3 (stride 1, padding 1) and 1x1 convolutions, batch 2, output sizes 7, 14, 28, 56 (square),
input and output channels 64, 128, 256, 512: the shapes of ResNet stages and U-Net levels. Implicit-GEMM
dims per pass (cuDNN / CUTLASS implicit GEMM): forward ``(batch x output pixels, out, in x kh x kw)``, data
gradient ``(batch x input pixels, in, out x kh x kw)``, weight gradient ``(out, in x kh x kw, batch x output
pixels)``; the grid is rectilinear in each pass's dims, so the profile interpolates between its points like
the GEMM table. Points predicted (at the best rate seen so far) to take longer than the grid's cap are skipped.
Timing as ``tpsim profile`` (:func:`tpsim.profiler.timing.time_kernel`: median of repetitions, one thread's CPU
time when the OS took the core away).

File: the profile CSV conventions (``# key: value`` header, then rows) with the columns of :data:`COLUMNS`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

COLUMNS = ("kind", "op", "dtype", "pass", "m", "n", "k", "batch", "in_channels", "out_channels", "size",
           "time_s", "reps", "spread_pct")
TITLE = "# tpsim conv kernel profile: median seconds per kernel call (format: tpsim/profiler/conv.py)"
PASSES = ("fwd", "dgrad", "wgrad")


@dataclass(frozen=True)
class ConvPoint:
    kernel: int
    batch: int
    size: int
    """output height = width."""
    cin: int
    cout: int

    def dims(self, pass_: str) -> tuple[int, int, int]:
        """Implicit-GEMM (m, n, k) of a pass (stride 1, 'same' padding: input size = output size)."""
        px, vol = self.batch * self.size * self.size, self.kernel * self.kernel
        return {"fwd": (px, self.cout, self.cin * vol), "dgrad": (px, self.cin, self.cout * vol),
                "wgrad": (self.cout, self.cin * vol, px)}[pass_]

    def flops(self) -> float:
        m, n, k = self.dims("fwd")
        return 2.0 * m * n * k


def conv_grid(name: str) -> tuple[list[ConvPoint], float, float]:
    """(points, cap seconds per call, timing budget per point)."""
    if name == "tiny":
        sizes, channels, cap, budget = (4, 8), (8, 16), 0.05, 0.002
    elif name == "full":
        sizes, channels, cap, budget = (7, 14, 28, 56), (64, 128, 256, 512), 0.5, 0.05
    else:
        raise InputError(f"--grid={name!r} is not tiny or full")
    points = [ConvPoint(k, 2, s, ci, co) for k in (1, 3) for s in sizes for ci in channels for co in channels]
    return sorted(points, key=lambda p: (p.kernel, p.flops())), cap, budget


def _kernel(point: ConvPoint, pass_: str, dtype, device):  # noqa: ANN001, ANN202
    import torch
    import torch.nn.functional as F

    x = torch.randn(point.batch, point.cin, point.size, point.size, device=device, dtype=dtype)
    w = torch.randn(point.cout, point.cin, point.kernel, point.kernel, device=device, dtype=dtype)
    pad = point.kernel // 2
    if pass_ == "fwd":
        return lambda: F.conv2d(x, w, padding=pad)
    grad = torch.randn(point.batch, point.cout, point.size, point.size, device=device, dtype=dtype)
    mask = [pass_ == "dgrad", pass_ == "wgrad", False]
    return lambda: torch.ops.aten.convolution_backward(grad, x, w, None, [1, 1], [pad, pad], [1, 1], False,
                                                       [0, 0], 1, mask)


def run(out: Path, grid: str = "full", dtypes: tuple[str, ...] = ("fp32",), threads: int = 1,
        device_name: str = "cpu", log=print) -> int:  # noqa: ANN001
    """Measure the grid's missing points into ``out`` (resumable: rows already there are kept)."""
    import torch

    from .timing import time_kernel

    torch.set_num_threads(threads)
    device = torch.device(device_name)
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for d in dtypes:
        if d not in torch_dtypes:
            raise InputError(f"--dtype {d!r} is not one of {', '.join(torch_dtypes)}")
    points, cap, budget = conv_grid(grid)
    done = _existing(out)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_header(device, threads, grid, cap))
    measured = 0
    with open(out, "a") as fh:
        for dtype in dtypes:
            for pass_ in PASSES:
                best_rate = 0.0
                for p in points:
                    key = (f"conv2d_k{p.kernel}", dtype, pass_) + p.dims(pass_)
                    if key in done:
                        continue
                    if best_rate > 0 and p.flops() / best_rate > cap:
                        continue
                    timing = time_kernel(_kernel(p, pass_, torch_dtypes[dtype], device), device, budget)
                    best_rate = max(best_rate, p.flops() / timing.median_s)
                    m, n, k = p.dims(pass_)
                    fh.write(",".join(map(str, ("conv", f"conv2d_k{p.kernel}", dtype, pass_, m, n, k, p.batch, p.cin,
                                                p.cout, p.size, f"{timing.median_s:.6g}", timing.samples,
                                                f"{timing.spread_pct:.1f}"))) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                    measured += 1
    log(f"measured {measured} conv points into {out}")
    return measured


def _existing(path: Path) -> set[tuple]:
    if not path.is_file():
        return set()
    if not path.read_text().startswith(TITLE[:30]):
        raise InputError(f"{path}: exists and is not a tpsim conv profile; choose another --out")
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#") or line.startswith("kind") or not line.strip():
            continue
        cells = line.split(",")
        if len(cells) == len(COLUMNS):
            out.add((cells[1], cells[2], cells[3], int(cells[4]), int(cells[5]), int(cells[6])))
    return out


def _header(device, threads: int, grid: str, cap: float) -> str:  # noqa: ANN001
    import torch

    from .. import __version__

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    if device.type == "cpu":
        try:
            name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                        if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    meta = {"format_version": 1, "device": name, "device_type": device.type, "torch_version": torch.__version__,
            "threads": threads, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tpsim_version": __version__, "grid": grid, "max_kernel_s": cap}
    return TITLE + "\n" + "".join(f"# {k}: {v}\n" for k, v in meta.items()) + ",".join(COLUMNS) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpsim.profiler.conv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--grid", default="full", choices=("tiny", "full"))
    parser.add_argument("--dtype", default="fp32", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    try:
        run(args.out, args.grid, tuple(args.dtype.split(",")), args.threads, args.device,
            log=lambda s: print(s, file=sys.stderr))
    except InputError as exc:
        print(f"tpsim.profiler.conv: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
