"""One calibration loader (tpsim.calibration) and its compute section in the estimator: kernel-time factors,
host overhead as the ``overhead`` breakdown term, device / stack checks, files of the wrong kind refused."""

from __future__ import annotations

import json

import pytest

from tpsim.calibration import Calibration, load_calibration
from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import EstimationContext, estimate, predict_block
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster, topologies_dir

MODEL = dict(layers=4)


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def _problem(calibration=None):
    model = with_overrides(load_model("llama3-8b"), **MODEL)
    cluster = load_cluster("dgx-h100", gpus=16, calibration=calibration)
    return model, cluster, make_plan(model, 16, tp=2, pp=2, sp=True, zero=1, global_batch=64)


def test_shipped_calibration_loads_with_links_and_gloo_ops():
    cal = load_calibration("local-cpu")
    assert isinstance(cal, Calibration) and cal.path.name == "local-cpu.yaml"
    assert set(cal.per_type) == {"loopback"} and set(cal.gloo_ops) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert cal.compute is None and cal.provenance["tool"] == "tpsim calibrate"
    assert load_cluster("local-cpu").spec.calibration.per_type == cal.per_type  # the topology reads the same


def test_compute_scales_multiply_kernel_times_exactly(tmp_path):
    path = _write(tmp_path, "c.yaml", "compute: {gemm_scale: 2.0, attention_scale: 2.0, memory_scale: 2.0, "
                                      "device: H100-SXM}\nsource: test\n")
    base = estimate(*_problem())
    scaled = estimate(*_problem(str(path)))
    assert scaled.breakdown["compute"] == pytest.approx(2 * base.breakdown["compute"], rel=1e-12)
    assert scaled.breakdown["optimizer"] == base.breakdown["optimizer"]  # the optimizer step is not a kernel fit
    # longer kernels hide more of the host's issue time: the fixed-cost term never grows
    assert scaled.breakdown["overhead"] <= base.breakdown["overhead"] and not scaled.warnings


def test_host_overhead_is_a_breakdown_term_in_the_step_sum(tmp_path):
    path = _write(tmp_path, "h.yaml", "compute: {host_overhead_per_layer_us: 200, stack: megatron}\n")
    model, cluster, plan = _problem(str(path))
    base = estimate(*_problem())
    e = estimate(model, cluster, plan)
    layers_on_slowest_rank, micro_batches = 2, plan.num_microbatches
    assert e.breakdown["overhead"] == pytest.approx(base.breakdown["overhead"]
                                                    + micro_batches * layers_on_slowest_rank * 200e-6, rel=1e-9)
    parts = sum(e.breakdown[k] for k in ("compute", "recompute", "bubble", "optimizer", "exposed_comm", "overhead"))
    assert parts == pytest.approx(e.step_time_s, rel=1e-12)
    # the host time also lengthens each stage, so the bubble grows by (pp - 1) / vpp of it
    stage_overhead = layers_on_slowest_rank * 200e-6
    assert e.breakdown["bubble"] == pytest.approx(base.breakdown["bubble"] + (plan.pp - 1) * stage_overhead,
                                                  rel=1e-9)


@pytest.mark.parametrize("section, reason", [
    ("{gemm_scale: 1.5, device: A100-SXM4-80GB}", "fitted on device A100-SXM4-80GB, the cluster has H100-SXM"),
    ("{host_overhead_per_layer_us: 100, stack: torchtitan}", "fitted for stack torchtitan, the estimate is for megatron"),
])
def test_a_fit_for_another_device_or_stack_is_not_applied_and_says_so(tmp_path, section, reason):
    path = _write(tmp_path, "x.yaml", f"compute: {section}\n")
    e = estimate(*_problem(str(path)))
    base = estimate(*_problem())
    assert e.step_time_s == base.step_time_s
    assert any(reason in w and "x.yaml" in w for w in e.warnings), e.warnings


def test_an_explicit_calibration_overrides_the_clusters_own(tmp_path):
    path = _write(tmp_path, "c.yaml", "compute: {gemm_scale: 1.25}\n")
    model, cluster, plan = _problem()
    ctx = EstimationContext.build(model, cluster, calibration=load_calibration(path))
    assert ctx.compute.scales["gemm"] == 1.25 and ctx.calibration.path == path.resolve()
    slow = estimate(model, cluster, plan, calibration=ctx.calibration)
    assert slow.step_time_s > estimate(model, cluster, plan).step_time_s


def test_block_prediction_carries_the_host_overhead(tmp_path):
    path = _write(tmp_path, "h.yaml", "compute: {host_overhead_per_layer_us: 150, gemm_scale: 1.1}\n")
    model, cluster, plan = _problem(str(path))
    calibrated = predict_block(model, cluster, plan)
    plain = predict_block(*_problem())
    assert calibrated.overhead_s == pytest.approx(150e-6) and plain.overhead_s == 0.0
    assert calibrated.fwd_compute_s > plain.fwd_compute_s


@pytest.mark.parametrize("text, match", [
    ("compute: {gemm_scale: 0}\n", "compute.gemm_scale=0 must be > 0"),
    ("compute: {host_overhead_per_layer_us: -1}\n", "compute.host_overhead_per_layer_us=-1 must be >= 0"),
    ("compute: {gemm_scales: 1.1}\n", "unknown key 'gemm_scales'"),
    ("ib: {efficiency: 1.5}\n", r"ib.efficiency=1.5 is above the supported maximum 1"),
    ("gloo_ops: [1, 2]\n", r"gloo_ops=\[1, 2\] must be a mapping"),
    ("- a\n- b\n", "a calibration file is a mapping"),
])
def test_bad_calibrations_name_the_field(tmp_path, text, match):
    with pytest.raises(InputError, match=match):
        load_calibration(_write(tmp_path, "bad.yaml", text))


@pytest.mark.parametrize("kind, path", [
    ("a cluster file", "clusters/dgx-h100.yaml"),
    ("a node template", "nodes/dgx-h100.yaml"),
    ("a link-kinds file", "links.yaml"),
])
def test_a_file_of_another_kind_is_refused(kind, path):
    target = topologies_dir() / path
    if not target.is_file():
        pytest.skip(f"{path} not shipped")
    with pytest.raises(InputError, match=f"is {kind}"):
        load_calibration(target)


def test_cli_calibration_flag(tmp_path, capsys):
    path = _write(tmp_path, "h.yaml", "compute: {host_overhead_per_layer_us: 100}\n")
    args = ["estimate", "--model", "llama3-8b", "--layers", "4", "--cluster", "dgx-h100", "--gpus", "16", "--tp",
            "2", "--pp", "2", "--global-batch", "64", "--json"]
    assert main(args + ["--calibration", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["breakdown"]["overhead"] > 0
    assert main(args + ["--calibration", str(topologies_dir() / "clusters" / "dgx-h100.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a cluster file" in err and "dgx-h100.yaml" in err


def test_a_neutral_compute_section_changes_nothing(tmp_path):
    path = _write(tmp_path, "n.yaml", "compute: {gemm_scale: 1, attention_scale: 1.0, memory_scale: 1, "
                                      "host_overhead_per_layer_us: 0, device: H100-SXM, stack: megatron}\n")
    got = estimate(*_problem(str(path))).to_dict()
    want = estimate(*_problem()).to_dict()
    assert got == want
