"""Issue 19: Megatron-Core's hybrid CPU optimizer (--optimizer-cpu-offload, HybridDeviceOptimizer): a share of the
optimizer states held and updated in host memory. The device holds the rest; the step takes the longer of the GPU
part and the CPU part, which streams CPU_ADAM_BYTES per parameter at the node's CPU memory bandwidth per GPU and
moves gradients and values over the host link (tpsim/estimator/schedule.py cpu_optimizer_seconds)."""

from __future__ import annotations

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.schedule import CPU_ADAM_BYTES, CPU_COPY_BYTES
from tpsim.launch import import_launch
from tpsim.model import load_model
from tpsim.plan import make_plan
from tpsim.stacks import derived_stack
from tpsim.topology import load_cluster

RUN = """torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \\
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --use-distributed-optimizer \\
  --sequence-parallel --micro-batch-size 1 --global-batch-size 64 --num-layers 80 --hidden-size 8192 \\
  --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 \\
  --seq-length 8192 --max-position-embeddings 8192 --swiglu --normalization RMSNorm --disable-bias-linear \\
  --untie-embeddings-and-output-weights --position-embedding-type rope --bf16 --vocab-size 128256 \\
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 {extra}
"""


@pytest.fixture(scope="module")
def case():
    model = load_model("llama3-70b")
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=8, pp=1, sp=True, recompute="full", zero=1, micro_batch=1, global_batch=64)
    return model, cluster, plan


def _stack(fraction: float, overlap: bool = False):
    return derived_stack("megatron", {"memory": {"optimizer_cpu_fraction": fraction,
                                                 "optimizer_cpu_overlap": overlap}}, "test")


def test_the_node_cpus_memory_bandwidth_is_shared_by_its_gpus():
    # DGX H100: two Xeon Platinum 8480C, 8 x DDR5-4800 each; GB200 NVL72: one Grace (500 GB/s) per two GPUs
    assert load_cluster("dgx-h100").layout.host_memory_GBps == pytest.approx(2 * 307.2 / 8)
    assert load_cluster("gb200-nvl72").layout.host_memory_GBps == pytest.approx(250.0)
    assert load_cluster("hgx-h200").layout.host_memory_GBps == 0.0  # its template names no CPU


def test_the_cpu_share_of_the_states_leaves_the_device(case):
    model, cluster, plan = case
    base = estimate(model, cluster, plan, stack="megatron")
    for fraction in (0.25, 0.5, 1.0):
        e = estimate(model, cluster, plan, stack=_stack(fraction))
        assert e.memory_gib["optimizer_states"] == pytest.approx(
            base.memory_gib["optimizer_states"] * (1.0 - fraction), rel=1e-9)
        assert e.memory_gib["weights"] == pytest.approx(base.memory_gib["weights"])
        assert e.memory_gib["grads"] == pytest.approx(base.memory_gib["grads"])
        assert e.peak_memory_gib < base.peak_memory_gib


def test_the_cpu_part_sets_the_step_when_it_is_the_longer(case):
    model, cluster, plan = case
    base = estimate(model, cluster, plan, stack="megatron")
    whole = estimate(model, cluster, plan, stack=_stack(1.0))
    overlapped = estimate(model, cluster, plan, stack=_stack(1.0, overlap=True))
    # the rank's optimizer shard: the dense parameters of one tp rank over the dp 8 distributed optimizer
    shard = base.memory_gib["optimizer_states"] * (1 << 30) / 12.0  # 12 bytes: fp32 master + two moments
    layout = cluster.layout
    update = shard * CPU_ADAM_BYTES / (layout.host_memory_GBps * 1e9)
    copies = shard * CPU_COPY_BYTES / (layout.host_GBps * 1e9)
    # the term also holds the passes over the whole gradient buffer (grad_buffer_passes_per_step), the same in both
    assert whole.terms["optimizer"] - overlapped.terms["optimizer"] == pytest.approx(min(update, copies), rel=1e-6)
    assert update + copies < whole.terms["optimizer"] < update + copies + base.terms["optimizer"]
    assert whole.terms["optimizer"] > base.terms["optimizer"]
    assert whole.step_time_s - base.step_time_s == pytest.approx(whole.terms["optimizer"] - base.terms["optimizer"])


def test_the_megatron_flags_become_the_figures(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(RUN.format(extra="--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d"))
    imp = import_launch(path, None)
    assert imp.stack_overrides["memory"] == {"optimizer_cpu_fraction": 1.0, "optimizer_cpu_overlap": True}
    path.write_text(RUN.format(extra="--optimizer-cpu-offload --optimizer-offload-fraction 0.4"))
    assert import_launch(path, None).stack_overrides["memory"] == {"optimizer_cpu_fraction": 0.4,
                                                                   "optimizer_cpu_overlap": False}
    path.write_text(RUN.format(extra="--optimizer-offload-fraction 0.4"))
    imp = import_launch(path, None)
    assert "memory" not in imp.stack_overrides and any("without --optimizer-cpu-offload" in n for n in imp.notes)


@pytest.mark.parametrize("extra,message", [
    ("--optimizer-cpu-offload --optimizer-offload-fraction 1.5", "--optimizer-offload-fraction '1.5' is not a fraction"),
    ("--optimizer-cpu-offload --optimizer-offload-fraction nan", "--optimizer-offload-fraction 'nan' is not a fraction"),
    ("--optimizer-cpu-offload --offload-optimizer-states", "not both"),
])
def test_bad_offload_flags_are_one_line(tmp_path, capsys, extra, message):
    path = tmp_path / "run.sh"
    path.write_text(RUN.format(extra=extra))
    with pytest.raises(InputError, match=message):
        import_launch(path, None)
    assert main(["estimate", "--from", str(path), "--cluster", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.split("'")[0] in err


def test_a_node_without_cpu_memory_figures_refuses_the_cpu_part(tmp_path, capsys):
    path = tmp_path / "run.sh"
    path.write_text(RUN.format(extra="--optimizer-cpu-offload"))
    assert main(["estimate", "--from", str(path), "--cluster", "hgx-h200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory_GBps" in err
    assert main(["estimate", "--from", str(path), "--cluster", "dgx-h100", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "memory.optimizer_cpu_fraction = 1 of it on the CPU" in " ".join(out.split())


def test_memory_bandwidth_belongs_to_a_cpu_group(tmp_path):
    from tpsim.topology.spec import load_node_template

    node = tmp_path / "n.yaml"
    node.write_text("name: n\nsource: test\ndevices:\n  gpu: {kind: gpu, count: 2, memory_GBps: 10}\n"
                    "  cpu: {kind: cpu, count: 1}\nlinks:\n  - {a: gpu, b: cpu, link: pcie-gen5-x16}\n")
    with pytest.raises(InputError, match="memory_GBps is a CPU's memory bandwidth"):
        load_node_template(node)


def test_a_bridge_recipe_states_the_hybrid_optimizer_too(case, tmp_path):
    """cfg.optimizer.optimizer_cpu_offload / optimizer_offload_fraction / overlap_cpu_optimizer_d2h_h2d
    (Megatron-Core OptimizerConfig; its fraction defaults to 0.0)."""
    from tpsim.launch import export_context, export_plan

    model, cluster, plan = case
    ctx = export_context(model, cluster, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
    text = next(iter(export_plan("bridge", ctx).values()))
    recipe = tmp_path / "recipe.py"
    recipe.write_text(text + "\ncfg.optimizer.optimizer_cpu_offload = True\ncfg.optimizer.optimizer_offload_fraction = 0.75\n"
                      "cfg.optimizer.overlap_cpu_optimizer_d2h_h2d = True\n")
    imp = import_launch(recipe, None)
    assert imp.stack_overrides["memory"] == {"optimizer_cpu_fraction": 0.75, "optimizer_cpu_overlap": True}
    assert not any("fields not used" in n and "optimizer" in n for n in imp.notes)
    recipe.write_text(text + "\ncfg.optimizer.optimizer_cpu_offload = True\ncfg.optimizer.optimizer_offload_fraction = 2\n")
    with pytest.raises(InputError, match="optimizer_offload_fraction=2 is not a fraction"):
        import_launch(recipe, None)
