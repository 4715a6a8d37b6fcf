"""Print the kernel model next to the published kernel figures it rests on, per device.

    python benchmarks/kernel_figures.py            # every table
    python benchmarks/kernel_figures.py --sc21     # only the SC21 per-layer comparison

Tables: (1) devices and the provenance of each rate; (2) GEMM: anchors and independent published points,
model at burst clocks (comparable to short benchmarks) and sustained clocks (training); (3) attention:
every published point, model vs measured; (4) per-device figures at common shapes (profiles/README.md);
(5) the ten SC21 rows: per-layer compute time per micro-batch with the fitted roofline vs the kernel model and
its launch gaps, and the per-GPU TFLOP/s each gives through the current estimator (printed, not fitted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpsim.compute.attention_fit import fit_all, residuals  # noqa: E402
from tpsim.compute.base import ComputeModel  # noqa: E402
from tpsim.compute.fixed import LayerTraits, launch_time, layer_kernel_counts  # noqa: E402
from tpsim.compute.kernel_data import gemm_data  # noqa: E402
from tpsim.compute.kernel_model import KernelModel  # noqa: E402
from tpsim.hardware import get_device  # noqa: E402

DEVICES = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "MI300X")
DEFAULT_IMPL = {"ampere": "fa2", "hopper": "fa3", "blackwell": "fa2", "cdna3": "unfused"}


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [headers] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def kind(provenance: str) -> str:
    return provenance.split(":")[0].split(" (")[0]


def devices_table() -> str:
    rows = []
    for name in DEVICES:
        d = get_device(name)
        m = KernelModel(d, DEFAULT_IMPL[d.architecture])
        p = m.provenance()
        rows.append([name, d.architecture, d.compute_units, f"{d.peak('bf16') / 1e12:.0f}",
                     f"{m.rates['bf16'].large_fraction:.3f} ({kind(p['gemm.bf16'])})",
                     f"{m.clock:.3f}", f"{d.hbm_bandwidth / 1e12:.2f}", f"{m.hbm / 1e12:.2f} ({kind(p['memory'])})"])
    return table(["device", "arch", "SMs/CUs", "bf16 peak TF/s", "large-GEMM fraction", "sustained clock",
                  "HBM TB/s", "achieved TB/s"], rows)


def gemm_table() -> str:
    data = gemm_data()
    rows = []
    points = [(dev, dt, a.m, a.n, a.k, a.tflops, a.tflops, "anchor") for dev, by in data.anchors.items()
              for dt, a in by.items()]
    points += [(p.device, p.dtype, p.m, p.n, p.k, p.tflops_low, p.tflops_high, "independent") for p in data.published]
    for dev, dt, m, n, k, lo, hi, role in points:
        d = get_device(dev)
        burst = KernelModel(d, "unfused", sustained_clocks=False)
        sust = KernelModel(d, "unfused")
        flops = 2.0 * m * n * k
        tb = flops / float(burst.gemm(m, n, k, dt)[0]) / 1e12
        ts = flops / float(sust.gemm(m, n, k, dt)[0]) / 1e12
        err = 0.0 if lo <= tb <= hi else (tb - lo) / lo if tb < lo else (tb - hi) / hi
        pub = f"{lo:.1f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"
        rows.append([dev, dt, f"{m}x{n}x{k}", role, pub, f"{tb:.1f}", f"{100 * err:+.1f}%", f"{ts:.1f}"])
    return table(["device", "dtype", "M x N x K", "role", "published TF/s", "model (burst)", "error",
                  "model (sustained)"], rows)


def attention_table() -> str:
    rows = []
    res = residuals(fit_all())
    for q, e in res:
        rows.append([q.impl, q.device, q.dtype, q.pass_, "causal" if q.causal else "full",
                     f"{q.batch}x{q.heads}", q.head_dim, q.seq, f"{q.tflops:.1f}", f"{q.tflops * (1 + e):.1f}",
                     f"{100 * e:+.1f}%"])
    errs = np.array([abs(e) for _, e in res])
    summary = f"\n{len(errs)} points: median |error| {100 * np.median(errs):.1f}%, worst {100 * errs.max():.1f}%"
    return table(["impl", "device", "dtype", "pass", "mask", "batch x heads", "d", "seq", "published TF/s",
                  "model TF/s", "error"], rows) + summary


def device_figures() -> str:
    """bf16 figures at common shapes, kernel model (sustained clocks) next to the fitted roofline of
    efficiency.yaml (its SC21 constants, the same for every device): GEMM TFLOP/s, causal attention TFLOP/s
    (batch x heads 64, seq 4096, head dim 128; the device's default implementation), and the bandwidth of
    memory-bound kernels."""
    from tpsim.compute.roofline import RooflineModel

    rows = []
    bh, s, hd = 64, 4096, 128
    f = 4.0 * bh * s * s * hd * 0.5
    for name in DEVICES:
        d = get_device(name)
        impl = DEFAULT_IMPL[d.architecture]
        kern, roof = KernelModel(d, impl), RooflineModel(d)
        cells = []
        for size in (8192, 4096, 1024):
            g = [2.0 * size ** 3 / float(m.gemm(size, size, size, "bf16")[0]) / 1e12 for m in (kern, roof)]
            cells.append(f"{g[0]:.0f} / {g[1]:.0f}")
        for backward in (False, True):
            flops = f * (2.5 if backward else 1.0)
            a = [flops / float(m.attention(bh, s, hd, True, "bf16", backward)[0]) / 1e12 for m in (kern, roof)]
            cells.append(f"{a[0]:.0f} / {a[1]:.0f}")
        numel = 2 ** 28  # residual add: read two 16-bit inputs, write one (3 x 2 bytes per element)
        bw = [6.0 * numel / float(m.memory("residual_add", numel, "bf16", False)[0]) / 1e12 for m in (kern, roof)]
        cells.append(f"{bw[0]:.2f} / {bw[1]:.2f}")
        rows.append([name, impl] + cells)
    return table(["device", "attention", "GEMM 8192^3", "GEMM 4096^3", "GEMM 1024^3", "causal attn fwd",
                  "causal attn bwd", "memory-bound TB/s"], rows) + (
        "\nEach cell: kernel model / fitted roofline (TFLOP/s; TB/s for memory-bound kernels).")


class OnlyKind(ComputeModel):
    """Delegates one kind of kernel (gemm, attention or memory) and times the others as zero: splits a
    layer's time by kind."""

    def __init__(self, inner: ComputeModel, kind: str):
        self.inner, self.kind, self.source = inner, kind, inner.source

    def _zero(self, res):
        t, m = res
        return np.zeros_like(t), m

    def gemm(self, m, n, k, dtype, batch=1):
        res = self.inner.gemm(m, n, k, dtype, batch)
        return res if self.kind == "gemm" else self._zero(res)

    def attention(self, batch_heads, seq, head_dim, causal, dtype, backward):
        res = self.inner.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        return res if self.kind == "attention" else self._zero(res)

    def memory(self, kernel, numel, dtype, backward):
        res = self.inner.memory(kernel, numel, dtype, backward)
        return res if self.kind == "memory" else self._zero(res)


def sc21_table() -> str:
    from tpsim.compute.roofline import RooflineModel
    from tpsim.estimator.core import estimate
    from tpsim.estimator.layer import layer_cost
    from tpsim.estimator.reference import SC21_CLUSTER, sc21_cases
    from tpsim.topology import load_cluster

    rows = []
    errs = {"roofline": [], "kernel": []}
    for case in sc21_cases():
        cluster = load_cluster(SC21_CLUSTER, gpus=case.gpus)
        roof = RooflineModel(cluster.device)
        kern = KernelModel(cluster.device, "unfused")
        p = case.plan
        kw = dict(tp=np.array([p.tp]), sp=np.array([p.sp]), micro_batch=np.array([p.micro_batch]),
                  recompute=np.array([2]), dtype=p.dtype, attention=p.attention)
        times = {}
        for label, compute in (("roofline", roof), ("kernel", kern)):
            for part in ("all", "gemm", "memory"):
                c = compute if part == "all" else OnlyKind(compute, part)
                lc = layer_cost(case.model, c, **kw)
                times[(label, part)] = float(lc.fwd[0] + lc.bwd[0] + lc.recompute[0])
            times[label] = times[(label, "all")]
        fwd_k, bwd_k = layer_kernel_counts("megatron_te", LayerTraits.of(case.model))
        gaps = float(launch_time(2 * fwd_k + bwd_k))  # full recomputation repeats the forward kernels
        tflops = {}
        for label, compute in (("roofline", roof), ("kernel", kern)):
            est = estimate(case.model, cluster, p, compute=compute)
            tflops[label] = case.paper_flops() / (est.step_time_s * case.gpus) / 1e12
            errs[label].append(100 * (tflops[label] - case.measured_tflops) / case.measured_tflops)
        rows.append([case.case_id, f"{1e3 * times['roofline']:.2f}", f"{1e3 * times['kernel']:.2f}",
                     f"{1e3 * times[('roofline', 'gemm')]:.2f} / {1e3 * times[('kernel', 'gemm')]:.2f}",
                     f"{1e3 * times[('roofline', 'memory')]:.2f} / {1e3 * times[('kernel', 'memory')]:.2f}",
                     f"{1e3 * gaps:.3f}", f"{times['kernel'] / times['roofline']:.3f}",
                     f"{case.measured_tflops:.0f}", f"{tflops['roofline']:.0f}", f"{tflops['kernel']:.0f}"])
    summary = "\n".join(f"{k}: mean |error| {np.mean(np.abs(v)):.1f}%, mean signed {np.mean(v):+.1f}%"
                        for k, v in errs.items())
    return table(["row", "layer ms (roofline, fitted)", "layer ms (kernel model)", "GEMM ms (roof / kernel)",
                  "memory-bound ms (roof / kernel)", "launch gaps ms",
                  "kernel / roofline", "measured TF/s", "estimate TF/s (roofline)", "estimate TF/s (kernel)"],
                 rows) + "\n" + summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sc21", action="store_true", help="only the SC21 per-layer comparison")
    args = parser.parse_args(argv)
    sections = [("SC21 rows: per-layer time per micro-batch (fwd + bwd + full recompute), A100-SXM4-80GB",
                 sc21_table)]
    if not args.sc21:
        sections = [("Devices and the provenance of their rates (sustained clocks)", devices_table),
                    ("GEMM: model vs published figures", gemm_table),
                    ("Attention: model vs published kernel measurements (burst clocks)", attention_table),
                    ("Per-device figures, kernel model vs fitted roofline (bf16)", device_figures)] + sections
    for title, fn in sections:
        print(f"\n## {title}\n")
        print(fn())


if __name__ == "__main__":
    main()
