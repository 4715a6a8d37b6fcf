"""Device specifications: one parser for the table and inline devices, strict one-line errors, sources."""

import math

import pytest

from tpsim.errors import InputError
from tpsim.hardware import OPTIONAL_KEYS, _table, device_from_mapping, device_names, get_device

H100 = {"compute_units": 132, "peak_tflops": {"bf16": 989.4, "fp8": 1978.9}, "hbm_TBps": 3.35,
        "memory_bytes": 85520809984, "source": "NVIDIA H100 datasheet"}


def test_table_devices_parse_and_keep_existing_keys():
    names = device_names()
    for name in ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM", "H200", "B200", "MI300X", "H100-PCIe", "L40S"):
        assert name in names
    h100 = get_device("H100-SXM")
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.hbm_bandwidth == pytest.approx(3.35e12)
    assert h100.compute_units == 132 and h100.architecture == "hopper"
    assert h100.usable_memory_fraction == pytest.approx(1.0)  # context, NCCL, allocator are memory terms now


def test_every_optional_figure_has_a_source():
    for dev in _table().values():
        present = {"architecture": dev.architecture, "boost_clock_MHz": dev.boost_clock_MHz,
                   "sustained_clock_ratio": dev.sustained_clock_ratio,
                   "hbm_achieved_fraction": dev.hbm_achieved_fraction, "l2_MiB": dev.l2_bytes,
                   "overlap_compute_penalty": dev.overlap_compute_penalty}
        for key, value in present.items():
            if value is not None and (dev.architecture not in ("volta", "tpu", "cpu")
                                      or key == "overlap_compute_penalty"):
                assert dev.sources.get(key), f"{dev.name}: {key} has no source"


def test_boost_clock_reproduces_the_datasheet_peak():
    # 4096 dense bf16 FLOP per clock per SM on Hopper, 2048 on Ampere (whitepapers)
    for name, per_clock in (("H100-SXM", 4096), ("H200", 4096), ("A100-SXM4-80GB", 2048)):
        d = get_device(name)
        assert d.compute_units * per_clock * d.boost_clock_MHz * 1e6 == pytest.approx(d.peak("bf16"), rel=0.002)


def test_inline_device_uses_the_same_parser_with_defaults():
    d = device_from_mapping("my-gpu", dict(H100, architecture="hopper"), "cluster.yaml")
    assert d.name == "my-gpu" and d.architecture == "hopper"
    assert d.sustained_clock_ratio is None and d.hbm_achieved_fraction is None and d.sources == {}
    assert d.usable_memory_fraction == pytest.approx(1.0)
    assert d.l2_bytes is None


@pytest.mark.parametrize("change, field", [
    ({"hbm_TBs": 3.0}, "hbm_TBs"),
    ({"compute_units": -1}, "compute_units"),
    ({"compute_units": 1.5}, "compute_units"),
    ({"hbm_TBps": math.nan}, "hbm_TBps"),
    ({"hbm_TBps": "fast"}, "hbm_TBps"),
    ({"peak_tflops": {"bf17": 1.0}}, "bf17"),
    ({"peak_tflops": {"bf16": math.inf}}, "peak_tflops.bf16"),
    ({"architecture": "pascal"}, "architecture"),
    ({"sustained_clock_ratio": 1.5}, "sustained_clock_ratio"),
    ({"hbm_achieved_fraction": 0.0}, "hbm_achieved_fraction"),
    ({"sources": {"colour": "x"}}, "colour"),
    ({"source": ""}, "source"),
])
def test_bad_fields_are_one_line_errors_naming_the_field(change, field):
    with pytest.raises(InputError) as err:
        device_from_mapping("x", {**H100, **change}, "cluster.yaml")
    message = str(err.value)
    assert field in message and "\n" not in message and message.startswith("cluster.yaml: device x")


def test_missing_field_and_non_mapping():
    with pytest.raises(InputError, match="missing field 'hbm_TBps'"):
        device_from_mapping("x", {k: v for k, v in H100.items() if k != "hbm_TBps"}, "f.yaml")
    with pytest.raises(InputError, match="must be a mapping"):
        device_from_mapping("x", [1, 2], "f.yaml")


def test_optional_keys_are_documented_in_the_table_header():
    from tpsim.hardware import DATA_DIR

    header = (DATA_DIR / "devices.yaml").read_text().split("devices:")[0]
    for key in OPTIONAL_KEYS:
        if key not in ("usable_memory_fraction", "sources"):
            assert key in header
