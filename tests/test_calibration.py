"""`tpsim calibrate`: reading CSVs and nccl-tests text, recovering known link constants from synthetic
measurements made with the model itself, writing a YAML that the model and the topology loader accept."""

import csv

import numpy as np
import pytest
import yaml

from tpsim.cli import main
from tpsim.collectives.calibration import aggregate, fit_calibration, load_link_values, read_measurements
from tpsim.collectives.model import CollectiveModel
from tpsim.errors import InputError
from test_collective_graphs import loopback, switch_node

SIZES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def synthetic_csv(path, cluster, calibration, ops=("all_reduce", "all_gather", "reduce_scatter"), noise=0.02):
    model = CollectiveModel(cluster, calibration=calibration)
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["backend", "op", "nranks", "bytes", "time_s"])
        for op in ops:
            for s in SIZES:
                t = model.run(op, s, ((0, 1),)).time_s
                for _ in range(5):
                    w.writerow(["gloo", op, 2, s, t * (1 + noise * rng.standard_normal())])
    return path


def test_fit_recovers_known_loopback_constants(tmp_path):
    truth = {"loopback": {"efficiency": 0.4, "latency_us": 50.0, "bw_GBps": 2.0}}
    path = synthetic_csv(tmp_path / "m.csv", loopback(2), truth)
    fit = fit_calibration(loopback(2), read_measurements([path]), stat="median")
    got = fit.per_type["loopback"]
    assert got["efficiency"] == pytest.approx(0.4, rel=0.03)
    assert got["latency_us"] == pytest.approx(50.0, rel=0.05)
    assert fit.error_after["median_rel"] < 0.02 < fit.error_before["median_rel"]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):  # every op on its own finds the same link
        assert fit.provenance["gloo_ops"][op]["efficiency"] == pytest.approx(0.4, rel=0.05)


def test_fit_recovers_nvlink_efficiency_from_nccl_tests_text(tmp_path):
    cluster = switch_node(8, lanes=2, switches=6)
    truth = {"nvlink": {"efficiency": 0.7, "bw_GBps": 40.0}}
    model = CollectiveModel(cluster, calibration=truth)
    lines = ["# nThread 1 nGpus 8 minBytes 1048576 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20",
             "#", "# Using devices"]
    lines += [f"#  Rank  {r} Group  0 Pid  100 on node1 device  {r} [0x07] NVIDIA A100-SXM4-80GB" for r in range(8)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
              "   algbw   busbw #wrong", "#        (B)    (elements)                               (us)  (GB/s)"
              "  (GB/s)            (us)  (GB/s)  (GB/s)"]
    for s in [1 << 20, 16 << 20, 256 << 20, 1 << 30]:
        r = model.run("all_reduce", s, (tuple(range(8)),))
        t = r.time_s * 1e6
        lines.append(f"{s:>12d} {s // 4:>13d}     float     sum      -1 {t:8.2f} {r.algbw_GBps:7.2f} "
                     f"{r.busbw_GBps:7.2f}      0 {t:8.2f} {r.algbw_GBps:7.2f} {r.busbw_GBps:7.2f}      0")
    lines.append("# Avg bus bandwidth    : 100.0")
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(lines) + "\n")
    samples = read_measurements([path])
    assert len(samples) == 4 and {s.op for s in samples} == {"all_reduce"} and samples[0].nranks == 8
    fit = fit_calibration(cluster, samples)
    assert fit.per_type["nvlink"]["efficiency"] == pytest.approx(0.7, rel=0.01)
    assert fit.error_after["max_rel"] < 0.01


def test_cli_writes_yaml_that_model_and_topology_loader_accept(tmp_path, capsys):
    truth = {"loopback": {"efficiency": 0.5, "latency_us": 40.0, "bw_GBps": 2.0}}
    from tpsim.topology import load_cluster

    blank = tmp_path / "blank.yaml"  # the shipped local-cpu calibration is replaced by the synthetic truth
    blank.write_text("source: none (test)\n")
    cluster = load_cluster("local-cpu", gpus=2, calibration=str(blank))
    path = synthetic_csv(tmp_path / "m.csv", cluster, truth, noise=0.0)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(path), "--cluster", "local-cpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "loopback" in text and "->" in text  # fit error before -> after
    data = yaml.safe_load(out.read_text())
    assert data["loopback"]["efficiency"] == pytest.approx(0.5, rel=0.01)
    assert data["tool"] == "tpsim calibrate" and data["fit_error_after"]["max_rel"] < 0.01
    cal = load_link_values(out)
    assert cal["loopback"]["latency_us"] == pytest.approx(40.0, rel=0.01)
    again = CollectiveModel(cluster, calibration=out).run("all_reduce", 1 << 20, ((0, 1),))
    assert again.time_s == pytest.approx(CollectiveModel(cluster, truth).run("all_reduce", 1 << 20, ((0, 1),)).time_s,
                                         rel=0.01)
    from tpsim.topology.spec import cluster_calibration as topo_load

    spec = topo_load(str(out), tmp_path, "test")  # the topology loader's validation accepts the file
    assert spec.per_type["loopback"]["efficiency"] == pytest.approx(0.5, rel=0.01)


def test_aggregate_stats():
    from tpsim.collectives.calibration import Sample

    s = [Sample("all_reduce", 2, 10, t) for t in (1.0, 1.1, 1.2, 5.0)]
    assert aggregate(s, "min")[0].time_s == 1.0
    assert aggregate(s, "median")[0].time_s == pytest.approx(1.15)
    assert aggregate(s, "p25")[0].time_s == pytest.approx(1.075)
    with pytest.raises(InputError, match="--stat"):
        aggregate(s, "max")


@pytest.mark.parametrize("content, match", [
    ("backend,op,nranks,bytes\ngloo,all_reduce,2,10\n", "lacks column"),
    ("backend,op,nranks,bytes,time_s\ngloo,allreduce,2,10,1e-3\n", "op='allreduce'"),
    ("backend,op,nranks,bytes,time_s\ngloo,all_reduce,2,ten,1e-3\n", "bytes='ten'"),
    ("backend,op,nranks,bytes,time_s\ngloo,all_reduce,1,10,1e-3\n", "nranks=1"),
    ("backend,op,nranks,bytes,time_s\n", "no measurements"),
    ("hello\n", "cannot tell which collective"),
])
def test_bad_files(tmp_path, content, match):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(InputError, match=match):
        read_measurements([p])


def test_cli_bad_input_exit_2(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "missing.csv")]) == 2
    assert "not found" in capsys.readouterr().err


def test_shipped_local_cpu_calibration_included_by_a_topology(tmp_path):
    """tpsim/data/calibration/local-cpu.yaml: a cluster file's `calibration:` key and an explicit
    calibration give the same gloo predictions (per-op values included)."""
    from tpsim.topology import load_cluster

    (tmp_path / "cpu.yaml").write_text(
        "name: cpu\ndescription: t\nnode: local-cpu\nfabric: none\ndevice: CPU-x86-1thread\ngpus: 2\n"
        "gpus_per_node: all\ncalibration: local-cpu\nsource: test\n")
    included = CollectiveModel(load_cluster(tmp_path / "cpu.yaml"))
    explicit = CollectiveModel(load_cluster("local-cpu"), calibration="local-cpu")
    assert set(included.gloo_ops) == {"all_reduce", "all_gather", "reduce_scatter"}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        a = included.run(op, 1 << 20, ((0, 1),))
        b = explicit.run(op, 1 << 20, ((0, 1),))
        assert a.time_s == pytest.approx(b.time_s) and a.algorithm.startswith("gloo")
        assert 1e-5 < a.time_s < 1e-1
