"""Issue 19: a Megatron launch file's stack figures (recomputed modules, optimizer dtypes, fp8 parameters, the
expert all-to-all overlap, DeepEP, forced balance) are read into the stack the estimate runs, so a published
recipe that only fits with them is accepted (tpsim/launch/megatron.py stack_overrides, tpsim/stacks.py
derived_stack)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.launch import import_launch
from tpsim.model import load_model
from tpsim.plan import make_plan
from tpsim.stacks import derived_stack, load_stack
from tpsim.topology import load_cluster

# DeepSeek-V3 on 1024 H100: the plan and flags of Megatron-MoE-ModelZoo best_practice/DeepSeekV3 (run.sh, "best
# config on 1024 H100 GPUs with 4096 sequence lengths": PP 8, VPP 4, TP 2, EP 64, GBS 8192, fp8; readme.md "Key
# Configurations": DeepEP, fine-grained recomputation of mla_up_proj and mlp, FP8 primary weights, BF16 optimizer
# states, EP A2A overlap, the flexible PP layout). Shape flags as Megatron-Bridge's DeepSeek-V3 provider.
DSV3_H100 = """torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py \\
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 4 \\
  --pipeline-model-parallel-layout "Et|(tt|)*30mL" --expert-model-parallel-size 64 \\
  --use-distributed-optimizer --sequence-parallel --micro-batch-size 1 --global-batch-size 8192 \\
  --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --seq-length 4096 \\
  --max-position-embeddings 4096 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 \\
  --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 256 --moe-router-topk 8 \\
  --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 --moe-layer-freq "([0]*3+[1]*58)" \\
  --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-grouped-gemm --mtp-num-layers 1 --vocab-size 129280 \\
  --bf16 --fp8-format e4m3 {extra} --overlap-grad-reduce --overlap-param-gather --swiglu --normalization RMSNorm \\
  --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope
"""
RECIPE_FLAGS = ("--fp8-param-gather --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 "
                "--recompute-granularity selective --recompute-modules mla_up_proj mlp "
                "--overlap-moe-expert-parallel-comm --delay-wgrad-compute --moe-token-dispatcher-type flex "
                "--moe-enable-deepep --moe-router-force-load-balancing")


def _write(tmp_path, extra: str, name: str = "run.sh"):
    path = tmp_path / name
    path.write_text(DSV3_H100.format(extra=extra))
    return path


def test_the_flags_become_stack_figures_and_the_model_balance(tmp_path):
    imp = import_launch(_write(tmp_path, RECIPE_FLAGS), None)
    assert imp.stack_overrides == {
        "memory": {"selective_recompute_modules": ["mla_up_proj", "mlp"], "optimizer_state_dtype": "bf16",
                   "fp8_weights_kept": True},
        "comm": {"param_gather_dtype": "fp8", "ep_a2a_overlap": True, "ep_node_dedup": True}}
    assert imp.model_shape["moe_balance"] == "forced"
    plain = import_launch(_write(tmp_path, "", "plain.sh"), None)
    assert plain.stack_overrides == {} and "moe_balance" not in plain.model_shape


def test_what_tpsim_does_not_model_is_said(tmp_path):
    imp = import_launch(_write(tmp_path, "--recompute-granularity selective --recompute-modules shared_experts layernorm "
                                         "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                                         "--exp-avg-sq-dtype fp32"), None)
    assert imp.stack_overrides["memory"] == {"selective_recompute_modules": ["layernorm"],
                                             "optimizer_state_dtype": "fp32"}
    assert any("--recompute-modules shared_experts: not modelled" in n for n in imp.notes)
    assert any("differ (bf16 / fp32)" in n for n in imp.notes)
    # dtypes without the precision-aware optimizer: Megatron refuses them; tpsim says so and keeps fp32
    imp = import_launch(_write(tmp_path, "--exp-avg-dtype bf16", "b.sh"), None)
    assert imp.stack_overrides == {} and any("without --use-precision-aware-optimizer" in n for n in imp.notes)


def test_a_bad_dtype_is_one_line_naming_the_flag(tmp_path, capsys):
    path = _write(tmp_path, "--use-precision-aware-optimizer --exp-avg-dtype int4")
    with pytest.raises(InputError, match=r"--exp-avg-dtype 'int4' is not one of fp32, bf16, fp16, fp8"):
        import_launch(path, None)
    assert main(["estimate", "--from", str(path), "--cluster", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--exp-avg-dtype 'int4'" in err


def test_derived_stack_keeps_the_name_and_validates_the_values():
    stack = derived_stack("megatron", {"memory": {"optimizer_state_dtype": "bf16"}}, "launch file x.sh")
    base = load_stack("megatron")
    assert stack.name == base.name and stack.fingerprint() != base.fingerprint()
    assert "memory.optimizer_state_dtype=bf16 (launch file x.sh)" in stack.version
    assert stack.memory["optimizer_state_dtype"].value == "bf16"
    assert stack.memory["optimizer_state_dtype"].source == "launch file x.sh"
    assert derived_stack(base, {}, "nothing") is base
    with pytest.raises(InputError, match="section='rules'"):
        derived_stack("megatron", {"rules": {"sp": True}}, "x")
    bad = derived_stack("megatron", {"memory": {"optimizer_state_dtype": "int4"}}, "x")
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    with pytest.raises(InputError, match="memory.optimizer_state_dtype"):
        estimate(model, cluster, make_plan(model, 8, tp=8), stack=bad)


def test_the_published_deepseek_v3_recipe_fits_only_with_its_flags(tmp_path, capsys):
    """The recipe (Megatron-MoE-ModelZoo, 1024 H100): with its flags it fits with a plausible margin; the same
    plan with Megatron's defaults (16-bit weights, fp32 moments, core_attn recomputation) does not."""
    import json

    code = main(["estimate", "--from", str(_write(tmp_path, RECIPE_FLAGS)), "--cluster", "dgx-h100", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert "stack: megatron with memory.selective_recompute_modules=['mla_up_proj', 'mlp']" in err
    assert data["plan"]["tp"] == 2 and data["plan"]["pp"] == 8 and data["plan"]["vpp"] == 4
    usable = data["peak_memory_gib"] + data["memory_headroom_gib"]
    assert data["fits"] and 0.6 <= data["peak_memory_gib"] / usable <= 0.97, data["memory_gib"]
    assert data["stack"] == "megatron"  # the residual groups and bands are the stack's
    code = main(["estimate", "--from", str(_write(tmp_path, "", "plain.sh")), "--cluster", "dgx-h100", "--json"])
    plain = json.loads(capsys.readouterr().out)
    assert code == 0 and not plain["fits"]
    assert plain["memory_gib"]["weights"] > 1.8 * data["memory_gib"]["weights"]          # fp8 primary weights
    assert plain["memory_gib"]["optimizer_states"] > data["memory_gib"]["optimizer_states"]  # bf16 moments


def test_the_expert_all_to_all_overlap_hides_exposed_expert_communication():
    model = dataclasses.replace(load_model("mixtral-8x7b"), num_layers=4)
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=1, pp=1, ep=8, zero=1, micro_batch=1, global_batch=64, recompute="selective")
    base = estimate(model, cluster, plan, stack="megatron")
    over = estimate(model, cluster, plan, stack=derived_stack("megatron", {"comm": {"ep_a2a_overlap": True}}, "t"))
    assert base.breakdown["ep_comm"] > 0
    assert over.breakdown["ep_comm"] == pytest.approx(base.breakdown["ep_comm"])  # the same all-to-alls ...
    assert over.terms["ep_comm"] < base.terms["ep_comm"]       # ... partly under the other micro-batch
    assert over.step_time_s < base.step_time_s
    assert over.breakdown["compute"] == pytest.approx(base.breakdown["compute"])


def test_recomputing_a_dense_mlp_trades_memory_for_its_forward():
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    plan = make_plan(model, 8, tp=8, sp=True, recompute="selective", micro_batch=1, global_batch=8)
    base = estimate(model, cluster, plan, stack="megatron")
    mlp = estimate(model, cluster, plan,
                   stack=derived_stack("megatron", {"memory": {"selective_recompute_modules": ["core_attn", "mlp"]}},
                                       "t"))
    assert mlp.memory_gib["activations"] < base.memory_gib["activations"]
    assert mlp.breakdown["recompute"] > base.breakdown["recompute"]
    # the MLP's forward is at most the layer's forward: recompute stays below full recomputation's
    full = estimate(model, cluster, dataclasses.replace(plan, recompute="full"), stack="megatron")
    assert mlp.breakdown["recompute"] < full.breakdown["recompute"]
    assert np.isfinite(mlp.step_time_s)


def test_a_bridge_recipe_carries_the_same_figures(tmp_path):
    """A Megatron-Bridge recipe (the provider's keywords) gives the same stack figures as the command line."""
    from tpsim.launch import export_context, export_plan

    model = load_model("mixtral-8x7b")
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=1, pp=4, ep=8, zero=1, micro_batch=1, global_batch=64, recompute="selective")
    ctx = export_context(model, cluster, plan, model_ref="mixtral-8x7b", cluster_ref="dgx-h100")
    text = next(iter(export_plan("bridge", ctx).values()))
    assert "recompute_modules=['core_attn']" in text
    text = text.replace("recompute_modules=['core_attn']",
                        'recompute_modules=["moe_act", "shared_experts"], overlap_moe_expert_parallel_comm=True, '
                        'moe_enable_deepep=True, moe_router_force_load_balancing=True')
    path = tmp_path / "recipe.py"
    path.write_text(text)
    imp = import_launch(path, None)
    assert imp.stack_overrides == {"memory": {"selective_recompute_modules": ["moe_act"]},
                                   "comm": {"ep_a2a_overlap": True, "ep_node_dedup": True}}
    assert any("recompute_modules shared_experts: not modelled" in n for n in imp.notes)
    assert not any("fields not used" in n and "moe_enable_deepep" in n for n in imp.notes)


def test_a_nemo_config_runs_nemos_optimizer_with_its_dtype(tmp_path, capsys):
    """A NeMo 1.x config with optim.name distributed_fused_adam runs the nemo stack (NeMo's own distributed
    optimizer); with optim.dtype bf16 (the Nemotron-4 340B launcher recipe) bf16 moments and no master copy, as
    the development set's nemo-optim-bf16 stack. mcore_distributed_optim stays Megatron-Core's."""
    import json

    from tests.test_import import NEMO_YAML

    path = tmp_path / "llama3_8b.yaml"
    path.write_text(NEMO_YAML)
    imp = import_launch(path)
    assert imp.stack == "nemo" and imp.stack_overrides == {}
    path.write_text(NEMO_YAML.replace("    name: distributed_fused_adam\n",
                                      "    name: distributed_fused_adam\n    dtype: bf16\n"))
    imp = import_launch(path)
    assert imp.stack == "nemo"
    assert imp.stack_overrides == {"memory": {"main_params_dtype": "none", "optimizer_state_dtype": "bf16"}}
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--cluster", "dgx-h100", "--json"]) == 0
    out, err = capsys.readouterr()
    bf16 = json.loads(out)
    assert bf16["stack"] == "nemo" and "stack: nemo with memory.main_params_dtype=none" in err
    path.write_text(NEMO_YAML)
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--cluster", "dgx-h100", "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert fp32["stack"] == "nemo"
    assert bf16["memory_gib"]["optimizer_states"] < 0.7 * fp32["memory_gib"]["optimizer_states"]
    path.write_text(NEMO_YAML.replace("name: distributed_fused_adam", "name: mcore_distributed_optim"))
    assert import_launch(path).stack is None


@pytest.mark.parametrize("extra,compiled", [
    ("[training]\ncompile = true\n", True),
    ("[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n", True),
    ("[compile]\nenable = true\ncomponents = [\"loss\"]\n", False),
    ("", False),
])
def test_a_compiled_torchtitan_job_runs_the_compile_stack(tmp_path, capsys, extra, compiled):
    """torchtitan's training.compile (later [compile] enable with components) decides eager or compiled kernels:
    the import runs the torchtitan-compile stack for a compiled model."""
    import json

    text = ("[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = 8\n"
            "[activation_checkpoint]\nmode = \"selective\"\n")
    if extra.startswith("[training]"):
        text += "[training]\nlocal_batch_size = 1\nseq_len = 8192\ncompile = true\n"
    else:
        text += "[training]\nlocal_batch_size = 1\nseq_len = 8192\n" + extra
    path = tmp_path / "job.toml"
    path.write_text(text)
    imp = import_launch(path)
    assert imp.stack == ("torchtitan-compile" if compiled else None)
    assert not any("tables not used" in n and "[compile]" in n for n in imp.notes)
    assert main(["estimate", "--from", str(path), "--cluster", "dgx-h100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == ("torchtitan-compile" if compiled else "torchtitan")


def test_calibrating_from_a_log_runs_the_launch_files_stack_figures(tmp_path, capsys):
    """`calibrate --log LOG LAUNCH`: the run is predicted on the launch file's stack with its figures (its
    recomputed modules and optimizer dtypes), the fit still names the stack megatron."""
    import argparse

    from tpsim.cli.calibrate import _log_run
    from tests.test_runfit import MEGATRON_LOG

    out = tmp_path / "mg"
    assert main(["export", "--format", "megatron", "--out", str(out), "--model", "llama3-8b", "--cluster",
                 "dgx-h100", "--gpus", "16", "--tp", "2", "--zero", "1", "--sp", "--global-batch", "64",
                 "--recompute", "selective", "--no-predict"]) == 0
    capsys.readouterr()
    script = out / "megatron_args.sh"
    text = script.read_text()
    assert "--recompute-granularity selective" in text
    script.write_text(text.replace("--recompute-granularity selective",
                                   "--recompute-granularity selective --recompute-modules core_attn mlp "
                                   "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"))
    log = tmp_path / "train.log"
    log.write_text(MEGATRON_LOG)
    args = argparse.Namespace(cluster="dgx-h100", gpus=None, stack=None)
    run = _log_run(args, str(log), str(script), 1)
    assert run.stack.name == "megatron"
    assert run.stack.memory["selective_recompute_modules"].value == ["core_attn", "mlp"]
    from tpsim.runfit import predict

    plain = dataclasses.replace(run, stack="megatron")
    assert predict(run).step_time_s > predict(plain).step_time_s  # the MLP forward runs again
    assert main(["calibrate", "--log", str(log), str(script)]) == 0
    assert "stack megatron" in capsys.readouterr().out


def test_recomputing_a_moe_layer_runs_its_all_to_alls_again():
    """The moe module (a MoE layer checkpointed whole) drops the experts' activations and runs the layer's
    forward again in backward, its dispatch and combine too; full recomputation repeats them as well."""
    model = dataclasses.replace(load_model("mixtral-8x7b"), num_layers=4)
    cluster = load_cluster("dgx-h100", gpus=64)
    plan = make_plan(model, 64, tp=1, pp=1, ep=8, zero=1, micro_batch=1, global_batch=64, recompute="selective")
    base = estimate(model, cluster, plan, stack="megatron")
    moe = estimate(model, cluster, plan,
                   stack=derived_stack("megatron", {"memory": {"selective_recompute_modules": ["core_attn", "moe"]}},
                                       "t"))
    assert moe.memory_gib["activations"] < 0.5 * base.memory_gib["activations"]
    assert moe.breakdown["recompute"] > base.breakdown["recompute"]
    assert moe.breakdown["ep_comm"] == pytest.approx(1.5 * base.breakdown["ep_comm"])  # 2 + 2 + 2 all-to-alls
    full = estimate(model, cluster, dataclasses.replace(plan, recompute="full"), stack="megatron")
    assert full.breakdown["ep_comm"] == pytest.approx(moe.breakdown["ep_comm"])


def test_offloaded_optimizer_states_leave_the_device_between_steps():
    """memory.optimizer_state_offload (Megatron-Core --offload-optimizer-states): the peak holds the larger of the
    activations and the states (on the device for the step only), and each step moves the states over the GPU's
    host link: PCIe on a DGX H100, NVLink-C2C on GB200 (7x faster, tpsim/data links)."""
    model = load_model("llama3-70b")
    plan = make_plan(model, 64, tp=4, pp=4, vpp=5, sp=True, zero=1, micro_batch=1, global_batch=128,
                     recompute="selective")
    offload = derived_stack("megatron", {"memory": {"optimizer_state_offload": True}}, "t")
    extra = {}
    for name in ("dgx-h100", "gb200-nvl72"):
        cluster = load_cluster(name, gpus=64)
        base, off = estimate(model, cluster, plan, stack="megatron"), estimate(model, cluster, plan, stack=offload)
        states = base.memory_gib["optimizer_states"]
        assert off.memory_gib["optimizer_states"] == pytest.approx(max(0.0, states - off.memory_gib["activations"]))
        assert off.peak_memory_gib < base.peak_memory_gib - 0.9 * min(states, base.memory_gib["activations"])
        assert sum(v for k, v in off.memory_gib.items()) == pytest.approx(off.peak_memory_gib)
        extra[name] = off.breakdown["optimizer"] - base.breakdown["optimizer"]
        assert extra[name] > 0
        # the rank's states (master copy and moments) once over the link, both directions at once
        assert extra[name] == pytest.approx(states * 2**30 / (cluster.layout.host_GBps * 1e9), rel=0.05)
    assert extra["dgx-h100"] > 5 * extra["gb200-nvl72"]


def test_the_gb200_deepseek_v3_recipe_fits_with_its_offloaded_states(tmp_path, capsys):
    """Megatron-MoE-ModelZoo best_practice/DeepSeekV3/run_gb200.sh: 256 GB200, tp 1 pp 8 vpp 4 ep 32, MXFP8,
    --recompute-modules mlp, --offload-optimizer-states, forced balance: it fits only with the offload."""
    import json

    text = (DSV3_H100.format(extra="--fp8-recipe mxfp8 --recompute-granularity selective --recompute-modules mlp "
                                   "--moe-router-force-load-balancing OFFLOAD")
            .replace("--nproc_per_node 8 --nnodes 128", "--nproc_per_node 4 --nnodes 64")
            .replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1")
            .replace("--expert-model-parallel-size 64", "--expert-model-parallel-size 32"))
    fits = {}
    for flag in ("--offload-optimizer-states", ""):
        path = tmp_path / f"gb200{len(flag)}.sh"
        path.write_text(text.replace("OFFLOAD", flag))
        assert main(["estimate", "--from", str(path), "--cluster", "gb200-nvl72", "--json"]) == 0
        out, err = capsys.readouterr()
        data = json.loads(out)
        assert data["plan"]["tp"] == 1 and data["plan"]["vpp"] == 4 and data["cluster"]["gpus"] == 256
        fits[bool(flag)] = data["fits"]
        if flag:
            assert "memory.optimizer_state_offload=True" in err and data["memory_gib"]["optimizer_states"] == 0
    assert fits == {True: True, False: False}


@pytest.mark.parametrize("layout,pp,fields", [
    ("Et|(tt|)*30mL", 8, {"pp_embedding": True, "pp_loss": True}),     # the ModelZoo H100 DeepSeek-V3 layout
    ("Et*4|(tttt|)*14tmL", 4, None),                                    # its GB200 layout: no split flag gives it
])
def test_a_pipeline_layout_becomes_the_split_that_reproduces_it(layout, pp, fields):
    """--pipeline-model-parallel-layout: the plan's split fields whose pipeline split is exactly the layout's
    (embedding and loss counted as layers, first / last stage layers), else the plan's own pp_layout
    (tests/test_pp_layout.py)."""
    from tpsim.estimator.partition import layer_split
    from tpsim.launch.megatron import layout_chunks, split_of_layout

    chunks = layout_chunks(layout)
    assert sum(chunks) == 61 and len(chunks) % pp == 0
    got = split_of_layout(chunks, pp)
    assert got == fields
    if fields is not None:
        assert layer_split(61, pp, len(chunks) // pp, embedding=True, loss=True) == chunks
    assert layout_chunks("E|t*3|(t|)*2tL") == (0, 3, 1, 1, 1)  # E|ttt|t|t|tL
