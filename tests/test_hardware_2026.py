"""2025-2026 hardware (issue 19): devices B300, GB200, GB300, H800, TPU v5p/v6e with their own figures, the
block-scaled dtypes mxfp8 and nvfp4 with their cast/scale cost, FP8 scaling recipes, the clusters dgx-b200,
dgx-b300, gb200-nvl72, gb300-nvl72 and jobs on part of an NVL72 rack, on estimate, plan, report and export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tpsim.cli import main
from tpsim.compute.quantize import block_cast_bytes, linear_cast_bytes
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.hardware import DTYPE_BYTES, DTYPES, device_from_mapping, get_device, is_low_precision
from tpsim.model import load_model
from tpsim.plan import make_plan
from tpsim.topology import load_cluster

NEW_DEVICES = ("B300", "GB200", "GB300", "H800", "TPU-v5p", "TPU-v6e")
NEW_CLUSTERS = ("dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72", "gb200-nvl72-64", "gb300-nvl72-64",
                "hgx-h800")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:   # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


# ---------------------------------------------------------------------------------------------- devices
def test_dtypes_and_their_bytes_include_the_block_scales():
    assert {"mxfp8", "nvfp4"} <= set(DTYPES)
    assert DTYPE_BYTES["mxfp8"] == pytest.approx(1 + 1 / 32)      # one E8M0 scale per 32 elements
    assert DTYPE_BYTES["nvfp4"] == pytest.approx(0.5 + 1 / 16)    # 4-bit values, one E4M3 scale per 16
    assert [d for d in DTYPES if is_low_precision(d)] == ["fp8", "mxfp8", "nvfp4"]


@pytest.mark.parametrize("name", NEW_DEVICES + ("B200",))
def test_new_devices_have_sourced_figures(name):
    d = get_device(name)
    assert d.source and d.memory_bytes > 30e9 and d.hbm_bandwidth > 1e12
    assert d.peak("bf16") > 0
    for key in ("power_limit_w", "boost_clock_MHz", "l2_MiB"):
        if key in d.sources:
            assert d.sources[key].strip()


def test_blackwell_peaks_follow_the_datasheets():
    b200, b300, gb200, gb300 = (get_device(n) for n in ("B200", "B300", "GB200", "GB300"))
    assert b300.peak("nvfp4") == pytest.approx(1.5 * b200.peak("nvfp4"))        # Blackwell Ultra: 1.5x FP4
    assert gb300.peak("nvfp4") == pytest.approx(1.5 * gb200.peak("nvfp4"))
    for d in (b200, b300, gb200, gb300):
        assert d.peak("mxfp8") == d.peak("fp8") == 2 * d.peak("bf16")
    assert gb200.peak("bf16") > b200.peak("bf16") and gb200.power_limit_w > b200.power_limit_w
    assert gb300.memory_bytes == b300.memory_bytes > gb200.memory_bytes > 180e9


@pytest.mark.parametrize("name, dtype", [("H100-SXM", "mxfp8"), ("H200", "nvfp4"), ("A100-SXM4-80GB", "fp8"),
                                         ("TPU-v6e", "fp8")])
def test_a_device_without_a_figure_refuses_the_dtype(name, dtype):
    with pytest.raises(InputError, match=f"dtype={dtype} is not supported by device {name}"):
        get_device(name).peak(dtype)


def test_sustained_clock_mhz_sets_the_ratio_and_is_checked():
    base = {"compute_units": 132, "peak_tflops": {"bf16": 989.4}, "hbm_TBps": 3.35, "memory_bytes": 96 * 2 ** 30,
            "source": "test", "boost_clock_MHz": 1830, "power_limit_w": 500}
    d = device_from_mapping("H100-500W", dict(base, sustained_clock_mhz=1464), "test")
    assert d.sustained_clock_ratio == pytest.approx(0.8) and d.power_limit_w == 500
    with pytest.raises(InputError, match="sustained_clock_mhz=2000 is above boost_clock_MHz=1830"):
        device_from_mapping("x", dict(base, sustained_clock_mhz=2000), "test")
    with pytest.raises(InputError, match="not both"):
        device_from_mapping("x", dict(base, sustained_clock_mhz=1500, sustained_clock_ratio=0.9), "test")
    no_boost = {k: v for k, v in base.items() if k != "boost_clock_MHz"}
    with pytest.raises(InputError, match="needs boost_clock_MHz"):
        device_from_mapping("x", dict(no_boost, sustained_clock_mhz=1500), "test")


def test_block_scaled_gemm_rates_are_anchored_or_transferred_with_their_provenance():
    from tpsim.compute.kernel_model import KernelModel

    b200, gb300 = KernelModel(get_device("B200")), KernelModel(get_device("GB300"))
    prov = b200.provenance()
    assert prov["gemm.mxfp8"].startswith("anchored") and prov["gemm.nvfp4"].startswith("anchored")
    assert gb300.provenance()["gemm.nvfp4"] == "transferred: nvfp4 fraction of B200 (same architecture)"
    # the measured MXFP8 kernel runs a little below the per-tensor FP8 one (FlashInfer vs MAMF), NVFP4 above both
    assert b200.gemm_rate("mxfp8") < b200.gemm_rate("fp8") < b200.gemm_rate("nvfp4")
    assert gb300.gemm_rate("nvfp4") == pytest.approx(1.5 * KernelModel(get_device("GB200")).gemm_rate("nvfp4"))


# ---------------------------------------------------------------------------------------------- cast cost
def test_cast_bytes_per_format():
    assert linear_cast_bytes("bf16", (2.0, 4.0)) is None
    assert linear_cast_bytes("fp8", (2.0, 4.0)) == (2.0, 4.0)            # the stack's fp8 recipe
    assert linear_cast_bytes("mxfp8", None) == pytest.approx((2 * (1 + 1 / 32), 2 + 2 * (1 + 1 / 32)))
    assert linear_cast_bytes("nvfp4", None) == pytest.approx((2 + 2 * (0.5 + 1 / 16), 4 + 2 * (0.5 + 1 / 16)))
    with pytest.raises(InputError, match="dtype=fp16 is not a block-scaled format"):
        block_cast_bytes("fp16")


def test_block_formats_pay_their_casts_on_every_linear():
    """On the roofline (one peak for fp8 and mxfp8) an mxfp8 layer costs more than an fp8 one by its casts'
    extra bytes, and an fp8 layer more than the same without casts."""
    from tpsim.stacks import load_stack

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-b200", gpus=8)
    assert load_stack("megatron").compute["fp8_cast_bytes_per_element"].value == {"forward": 2, "backward": 4}
    plans = {d: make_plan(model, 8, tp=1, sp=False, dtype=d, global_batch=64) for d in ("bf16", "fp8", "mxfp8")}
    t = {d: estimate(model, cluster, p).breakdown["compute"] for d, p in plans.items()}
    assert t["fp8"] < t["bf16"] and t["mxfp8"] < t["bf16"]
    from tpsim.compute.roofline import RooflineModel
    from tpsim.estimator.layer import layer_cost

    roof = RooflineModel(get_device("B200"))
    one = np.ones(1)
    cost = {d: layer_cost(model, roof, tp=one, sp=np.zeros(1, bool), micro_batch=one, recompute=np.zeros(1),
                          dtype=d, attention="flash", fp8_cast=(2.0, 4.0)) for d in ("fp8", "mxfp8", "nvfp4")}
    gemm_only = {d: layer_cost(model, roof, tp=one, sp=np.zeros(1, bool), micro_batch=one, recompute=np.zeros(1),
                               dtype=d, attention="flash", fp8_cast=(0.0, 0.0)) for d in ("fp8",)}
    # the roofline runs fp8 and mxfp8 at one peak: the difference is the casts' extra bytes
    assert cost["mxfp8"].fwd[0] > cost["fp8"].fwd[0] > gemm_only["fp8"].fwd[0]


# ---------------------------------------------------------------------------------------------- clusters
@pytest.mark.parametrize("name", NEW_CLUSTERS)
def test_new_clusters_load_and_check(name):
    cluster = load_cluster(name)
    cluster.check()
    assert cluster.num_gpus % cluster.gpus_per_node == 0


def test_nvl72_clusters_use_their_own_devices_and_nics():
    assert load_cluster("gb200-nvl72").device.name == "GB200"
    assert load_cluster("gb300-nvl72").device.name == "GB300"
    from tpsim.topology.analysis import injection_bandwidth

    assert injection_bandwidth(load_cluster("gb300-nvl72", gpus=144))["network"] == 100    # ConnectX-8 800G
    assert injection_bandwidth(load_cluster("gb200-nvl72", gpus=144))["network"] == 50     # ConnectX-7 400G
    assert injection_bandwidth(load_cluster("dgx-b300"))["network"] == 100
    assert injection_bandwidth(load_cluster("dgx-b300"))["nvlink"] == 900                  # 18 x 50 GB/s


def test_part_of_an_nvl72_rack_is_expressible():
    part = load_cluster("gb200-nvl72-64")                       # 256 GPUs on 4 racks
    assert (part.num_gpus, part.num_nodes, part.gpus_per_node) == (256, 4, 64)
    big = load_cluster("gb200-nvl72-64", gpus=131072)           # 131,072 GPUs: not a whole number of racks of 72
    assert big.num_nodes == 2048 and 131072 % 72
    ranks = [n for n, a in part.graph.nodes(data=True) if a["kind"] == "gpu" and a["rank"] >= 0]
    spare = [n for n, a in part.graph.nodes(data=True) if a["kind"] == "gpu" and a["rank"] < 0]
    assert len(ranks) == 256 and len(spare) == 4 * 8
    assert part.gpu_id(64) == "n1/gpu0"
    with pytest.raises(InputError, match="gpus_per_node=80 but node gb200-nvl72 has 72 GPUs"):
        from tpsim.topology.spec import load_cluster_spec
        import yaml
        raw = yaml.safe_load(part.spec.path.read_text())
        raw["gpus_per_node"] = 80
        bad = part.spec.path.parent / "_tmp_bad_nvl72.yaml"
        try:
            bad.write_text(yaml.safe_dump(raw))
            load_cluster_spec(str(bad))
        finally:
            bad.unlink()


def test_a_partial_rack_estimates_like_whole_racks_for_intra_rack_groups():
    model = load_model("llama3-70b")
    plan = make_plan(model, 256, tp=8, pp=4, dtype="fp8", global_batch=512)
    part = estimate(model, load_cluster("gb200-nvl72-64"), plan)
    whole = estimate(model, load_cluster("gb200-nvl72", gpus=288),
                     make_plan(model, 288, tp=8, pp=4, dtype="fp8", global_batch=576))
    assert part.fits and part.breakdown["compute"] == pytest.approx(whole.breakdown["compute"], rel=1e-9)
    big = estimate(model, load_cluster("gb300-nvl72-64", gpus=131072),
                   make_plan(model, 131072, tp=8, pp=4, dtype="mxfp8", global_batch=16384))
    assert big.fits and np.isfinite(big.step_time_s)


# ---------------------------------------------------------------------------------------------- every verb
@pytest.mark.parametrize("cluster, gpus, dtype", [("gb300-nvl72", "72", "nvfp4"), ("dgx-b300", "64", "mxfp8"),
                                                  ("gb200-nvl72-64", "256", "mxfp8"), ("hgx-h800", "16", "fp8"),
                                                  ("dgx-b200", "16", "nvfp4")])
def test_estimate_cli_on_new_hardware(capsys, cluster, gpus, dtype):
    code, out, err = _run(capsys, "estimate", "--model", "llama3-8b", "--cluster", cluster, "--gpus", gpus,
                          "--tp", "8", "--dtype", dtype, "--global-batch", "576" if gpus == "72" else "512",
                          "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["plan"]["dtype"] == dtype and data["step_time_s"] > 0


def test_dtype_refusals_are_one_line(capsys):
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--tp", "8", "--zero", "0", "--dtype", "mxfp8")
    assert code == 2 and "dtype=mxfp8 is not supported by H100-SXM" in err and "Traceback" not in err
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "8",
                        "--tp", "8", "--zero", "0", "--dtype", "nvfp4", "--stack", "torchtitan")
    assert code == 2 and "dtype=nvfp4 is not offered" in err and len(err.strip().splitlines()) == 1


def test_plan_and_report_on_new_hardware(capsys, tmp_path):
    code, out, err = _run(capsys, "plan", "--model", "llama3-8b", "--cluster", "gb300-nvl72", "--gpus", "72",
                          "--dtype", "nvfp4", "--global-batch", "576", "--top", "3", "--json")
    assert code == 0, err
    rows = json.loads(out)
    rows = rows["plans"] if isinstance(rows, dict) else rows
    assert rows and all(r["plan"]["dtype"] == "nvfp4" for r in rows)
    code, out, err = _run(capsys, "report", "--model", "llama3-8b", "--cluster", "dgx-b300", "--gpus", "16",
                          "--dtype", "mxfp8", "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert any((tmp_path / "rep").iterdir())


def test_export_block_scaled_dtypes(capsys, tmp_path):
    from tpsim.launch import FORMATS

    assert "megatron" in FORMATS
    code, _, err = _run(capsys, "export", "--format", "megatron", "--out", str(tmp_path / "m"), "--model",
                        "llama3-8b", "--cluster", "dgx-b300", "--gpus", "16", "--tp", "8", "--dtype", "mxfp8",
                        "--no-predict")
    assert code == 0, err
    text = "\n".join(p.read_text() for p in (tmp_path / "m").iterdir())
    assert "--fp8-recipe mxfp8" in text and "--fp8-format e4m3" in text
    code, _, err = _run(capsys, "export", "--format", "megatron", "--out", str(tmp_path / "n"), "--model",
                        "llama3-8b", "--cluster", "gb300-nvl72", "--gpus", "72", "--tp", "8", "--dtype", "nvfp4",
                        "--global-batch", "576", "--no-predict")
    assert code == 0, err
    text = "\n".join(p.read_text() for p in (tmp_path / "n").iterdir())
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text
    code, _, err = _run(capsys, "export", "--format", "nemo", "--out", str(tmp_path / "x"), "--model",
                        "llama3-8b", "--cluster", "dgx-b300", "--gpus", "16", "--tp", "8", "--dtype", "mxfp8",
                        "--no-predict")
    assert code == 2 and "dtype=mxfp8" in err


@pytest.mark.parametrize("device", NEW_DEVICES)
def test_every_new_device_estimates_on_a_cluster(tmp_path, device):
    """Each new device on a cluster file (inline name): a GPU on an 8-GPU HGX-style node, a TPU on TPU hosts."""
    tpu = device.startswith("TPU")
    node, fabric = ("tpu-v4-host", "tpu-v4-torus") if tpu else ("dgx-h100", "ndr-rail-optimized")
    if device.startswith("GB"):
        node = "gb300-nvl72" if device == "GB300" else "gb200-nvl72"
    gpus = 64 if tpu else (72 if device.startswith("GB") else 16)
    (tmp_path / "c.yaml").write_text(f"name: t\nnode: {node}\nfabric: {fabric}\ndevice: {device}\ngpus: {gpus}\n"
                                     f"source: test\n")
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    model = load_model("llama3-8b")
    dtype = "nvfp4" if device in ("B300", "GB200", "GB300") else "bf16"
    est = estimate(model, cluster, make_plan(model, gpus, tp=8, dtype=dtype, global_batch=8 * gpus))
    assert est.step_time_s > 0 and np.isfinite(est.mfu)
    assert est.to_dict()["cluster"]["device"] == device
