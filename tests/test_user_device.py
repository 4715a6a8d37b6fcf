"""User-defined hardware (issue 14): a cluster file may define or override its device inline, parsed by the
same function as tpsim/data/devices.yaml (``tpsim.hardware.device_from_mapping``); ``tpsim topo check`` refuses
a bad one; the shipped H100-PCIe, L40S and MI300X examples load; a user device works in estimate and plan."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.hardware import DATA_DIR, device_from_mapping, get_device
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster, topologies_dir

GOOD = {"peak_tflops": {"bf16": 500, "fp16": 500, "fp32": 50}, "hbm_TBps": 2.5, "memory_bytes": 96 * 2**30,
        "compute_units": 120, "source": "test figures"}


def test_devices_yaml_entries_are_parsed_by_device_from_mapping():
    raw = yaml.safe_load((DATA_DIR / "devices.yaml").read_text())
    for name, entry in raw["devices"].items():
        direct = device_from_mapping(name, entry, "devices.yaml", raw["usable_memory_fraction"])
        assert direct == get_device(name)
    h100 = get_device("H100-SXM")
    assert h100.peak("bf16") == 989.4e12 and h100.hbm_bandwidth == 3.35e12 and h100.compute_units == 132


@pytest.mark.parametrize("change,match", [
    ({"source": ""}, "source"),
    ({"peak_tflops": {"int4": 10}}, "peak_tflops.*int4"),
    ({"peak_tflops": {"bf16": -1}}, r"peak_tflops\.bf16=-1 must be"),
    ({"hbm_TBps": float("nan")}, "hbm_TBps=nan"),
    ({"memory_bytes": 1.5}, "memory_bytes=1.5 must be"),
    ({"compute_units": True}, "compute_units=True"),
    ({"usable_memory_fraction": 1.2}, "usable_memory_fraction=1.2 must be"),
    ({"clock_mhz": 1980}, "unknown field 'clock_mhz'"),
])
def test_bad_device_fields_name_field_and_value(change, match):
    with pytest.raises(InputError, match=match):
        device_from_mapping("X", {**GOOD, **change}, "cluster.yaml: device", 0.92)
    missing = dict(GOOD)
    del missing["compute_units"]
    with pytest.raises(InputError, match="missing field 'compute_units'"):
        device_from_mapping("X", missing, "here", 0.92)


def _cluster_file(tmp_path, device, name="user", gpus=16):
    body = {"name": name, "node": "pcie-gen5-8gpu", "fabric": "ndr-rail-optimized", "gpus": gpus, "device": device,
            "source": "test"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_inline_device_and_base_override(tmp_path):
    cluster = load_cluster(_cluster_file(tmp_path, {"name": "MyGPU", **GOOD}))
    assert cluster.device.name == "MyGPU" and cluster.device.peak("bf16") == 500e12
    assert cluster.device.usable_memory_fraction == get_device("H100-SXM").usable_memory_fraction
    override = {"name": "H100-SXM-capped", "base": "H100-SXM", "peak_tflops": {"bf16": 800},
                "source": "H100 SXM with a 500 W cap (test)"}
    capped = load_cluster(_cluster_file(tmp_path, override, name="capped")).device
    assert capped.peak("bf16") == 800e12 and capped.peak("fp8") == get_device("H100-SXM").peak("fp8")
    assert capped.hbm_bandwidth == 3.35e12 and capped.source.startswith("H100 SXM with a 500 W cap")
    with pytest.raises(InputError, match="needs its own source"):
        load_cluster(_cluster_file(tmp_path, {"name": "x", "base": "H100-SXM", "hbm_TBps": 2}, name="nosrc"))
    with pytest.raises(InputError, match="base: device='Z100' is unknown"):
        load_cluster(_cluster_file(tmp_path, {"name": "x", "base": "Z100", "source": "s"}, name="nobase"))
    with pytest.raises(InputError, match="an inline device needs a name"):
        load_cluster(_cluster_file(tmp_path, dict(GOOD), name="noname"))


def test_topo_check_refuses_a_bad_inline_device(tmp_path, capsys):
    good = _cluster_file(tmp_path, {"name": "MyGPU", **GOOD})
    assert main(["topo", "check", str(good)]) == 0
    bad = _cluster_file(tmp_path, {"name": "MyGPU", **GOOD, "hbm_TBps": 0}, name="bad")
    assert main(["topo", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bad.yaml: device MyGPU: hbm_TBps=0 must be" in err


@pytest.mark.parametrize("name,device,bf16,links", [
    ("h100-pcie", "H100-PCIe", 756e12, {"pcie": {63.0}, "cpu": {22.0}}),
    ("l40s", "L40S", 362.05e12, {"pcie": {63.0, 31.5}, "cpu": {22.0}}),
    ("mi300x", "MI300X", 1307.4e12, {"nvlink": {64.0}, "pcie": {63.0}, "cpu": {24.0}}),
])
def test_shipped_examples(name, device, bf16, links):
    """The example clusters: inline H100-PCIe and L40S, MI300X with its Infinity Fabric mesh; the PCIe Gen5
    servers' socket link is NCCL's Sapphire Rapids figure (22 GB/s), not the Skylake/Gen4-era constant (10)."""
    cluster = load_cluster(name, gpus=16)
    assert cluster.device.name == device and cluster.device.peak("bf16") == bf16
    cluster.check()
    found: dict[str, set[float]] = {}
    for _, _, attrs in cluster.links():
        if attrs.type in links:
            found.setdefault(attrs.type, set()).add(attrs.bw_GBps)
    assert found == links
    if name == "mi300x":   # 7 Infinity Fabric links per GPU, one to every other GPU of the node
        assert cluster.paths(0, 5) == [(1.0, (("n0/gpu0", "n0/gpu5"),))]
    raw = yaml.safe_load((topologies_dir() / "clusters" / f"{name}.yaml").read_text())
    assert (isinstance(raw["device"], dict) and raw["device"]["source"]) or raw["device"] == "MI300X"


def test_user_device_in_estimate_and_plan(tmp_path, capsys):
    """A device only the cluster file knows is used by estimate (its peak sets MFU) and plan."""
    path = _cluster_file(tmp_path, {"name": "MyGPU", **GOOD})
    model = with_overrides(load_model("llama3-8b"), layers=4)
    cluster = load_cluster(path)
    plan = make_plan(model, 16, tp=2, zero=1, global_batch=32)
    e = estimate(model, cluster, plan)
    assert e.cluster["device"] == "MyGPU" and 0 < e.mfu < 1
    assert e.model_tflops_per_gpu == pytest.approx(e.mfu * 500, rel=1e-9)
    args = ["--model", "llama3-8b", "--layers", "4", "--cluster", str(path), "--global-batch", "32"]
    assert main(["estimate", "--json", "--tp", "2", "--zero", "1"] + args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"]["device"] == "MyGPU" and out["step_time_s"] == pytest.approx(e.step_time_s)
    assert main(["plan", "--json", "--no-progress", "--no-cache", "--top", "3", "--micro-batch", "1"] + args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plans"] and all(p["cluster"]["device"] == "MyGPU" for p in result["plans"])
    # a faster device gives a shorter predicted step for the same plan
    fast = load_cluster(_cluster_file(tmp_path, {"name": "Fast", **GOOD, "peak_tflops": {"bf16": 1000}},
                                      name="fast"))
    assert estimate(model, fast, plan).step_time_s < e.step_time_s


def test_cluster_file_text_with_comments_parses(tmp_path):
    text = textwrap.dedent("""\
        name: tiny
        node: pcie-gen5-8gpu
        fabric: none
        gpus: 8
        device:            # inline
          name: Tiny
          compute_units: 10
          peak_tflops: {bf16: 10, fp32: 1}
          hbm_TBps: 0.5
          memory_bytes: 17179869184
          usable_memory_fraction: 0.9
          source: made up for a test
        source: test
        """)
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    cluster = load_cluster(path)
    assert cluster.device.usable_memory_bytes == 0.9 * 16 * 2**30
