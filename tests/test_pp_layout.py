"""Issue 19: a pipeline layout the split fields cannot express (Megatron-Core --pipeline-model-parallel-layout,
Megatron-Bridge pipeline_model_parallel_layout) is the plan's own ``pp_layout``: accepted, costed per stage with
exactly those chunks, exported back, and refused with one line where it is malformed."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.estimator import estimate
from tpsim.estimator.partition import layer_split
from tpsim.launch import export_context, export_plan, import_launch
from tpsim.launch.megatron import layout_chunks
from tpsim.model import load_model
from tpsim.plan import PlanBatch, layout_code, make_plan, parse_layout, plan_from_mapping, plan_violation
from tpsim.topology import load_cluster

# Megatron-LM's DeepSeek-V3 layout for pp 16 x vpp 2: three layers on the first chunk, the MTP and the loss on
# chunks of their own; no first/last-stage split reproduces it.
DSV3_LAYOUT = "Et*3|(tt|)*29m|L"
DSV3_RUN = """torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py \\
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 --num-virtual-stages-per-pipeline-rank 2 \\
  --pipeline-model-parallel-layout "{layout}" --expert-model-parallel-size 64 \\
  --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 8192 \\
  --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --seq-length 4096 \\
  --max-position-embeddings 4096 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 \\
  --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 256 --moe-router-topk 8 \\
  --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 --moe-layer-freq "([0]*3+[1]*58)" \\
  --moe-grouped-gemm --mtp-num-layers 1 --vocab-size 129280 --recompute-granularity full \\
  --recompute-method uniform --recompute-num-layers 1 \\
  --bf16 --overlap-grad-reduce --overlap-param-gather --swiglu --normalization RMSNorm \\
  --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope
"""


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama3-70b"), load_cluster("dgx-h100", gpus=64)


def _plan(model, **kw):
    fields = dict(tp=8, pp=4, vpp=1, sp=True, recompute="selective", zero=1, micro_batch=1, global_batch=64)
    fields.update(kw)
    return make_plan(model, 64, **fields)


def test_the_default_split_as_a_layout_costs_the_same(llama70):
    """A layout equal to the stack's own split changes nothing: the layout only replaces how chunks are chosen."""
    model, cluster = llama70
    for vpp in (1, 2, 5):
        base = _plan(model, vpp=vpp)
        same = dataclasses.replace(base, pp_layout=layer_split(model.num_layers, 4, vpp))
        a, b = estimate(model, cluster, base), estimate(model, cluster, same)
        assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
        assert b.peak_memory_gib == pytest.approx(a.peak_memory_gib, rel=1e-12)


def test_an_uneven_layout_is_costed_per_stage(llama70):
    """More layers on the first rank: that rank's memory sets the peak and its time the pace, as with the
    equivalent first-stage split (pp_first), which the same chunks must reproduce exactly."""
    model, cluster = llama70
    layout = (32, 16, 16, 16)
    uneven = dataclasses.replace(_plan(model), pp_layout=layout)
    even = estimate(model, cluster, _plan(model))
    got = estimate(model, cluster, uneven)
    first = estimate(model, cluster, _plan(model, pp_first=32))
    assert got.pipeline_split["layers_per_chunk"] == list(layout)
    assert got.step_time_s > even.step_time_s and got.peak_memory_gib > even.peak_memory_gib
    assert got.step_time_s == pytest.approx(first.step_time_s, rel=1e-12)
    assert got.peak_memory_gib == pytest.approx(first.peak_memory_gib, rel=1e-12)


@pytest.mark.parametrize("change,message", [
    (dict(pp_layout=(20, 20, 20)), "pp_layout has 3 chunks: pp=4 x vpp=1 needs 4"),
    (dict(pp_layout=(20, 20, 20, 21)), "holds 81 layers: the model has num_layers=80"),
    (dict(pp_layout=(20, 20, 20, 20), pp_first=20), "give it or the split fields, not both"),
])
def test_a_layout_that_does_not_fit_the_plan_is_named(llama70, change, message):
    model, _ = llama70
    plan = dataclasses.replace(_plan(model), **change)
    assert message in plan_violation(model, plan, 64)


def test_the_layout_survives_batches_json_and_the_runs_csv(llama70, tmp_path):
    model, cluster = llama70
    plan = dataclasses.replace(_plan(model), pp_layout=(17, 21, 21, 21))
    batch = PlanBatch.from_plans([plan, _plan(model)])
    assert batch.plan(0) == plan and batch.plan(1).pp_layout == ()
    assert int(batch.pp_layout[0]) == layout_code((17, 21, 21, 21)) != 0 and int(batch.pp_layout[1]) == 0
    import json
    assert plan_from_mapping(json.loads(json.dumps(plan.to_dict()))) == plan
    from tpsim.runs import load_runs
    runs = tmp_path / "runs.csv"
    with runs.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "model", "cluster", "gpus", "tp", "pp", "sp", "recompute", "zero", "global_batch",
                    "pp_layout", "step_time_s"])
        w.writerow(["a", "llama3-70b", "dgx-h100", 64, 8, 4, "true", "selective", 1, 64, "17,21,21,21", 5.0])
        w.writerow(["b", "llama3-70b", "dgx-h100", 64, 8, 4, "true", "selective", 1, 64, "Et*17|(t*21|)*2t*21L",
                    5.1])
    got = load_runs(runs)
    assert got[0].plan.pp_layout == got[1].plan.pp_layout == (17, 21, 21, 21)
    with runs.open("a", newline="") as fh:
        csv.writer(fh).writerow(["c", "llama3-70b", "dgx-h100", 64, 8, 4, "true", "selective", 1, 64, "17;21",
                                 5.0])
    with pytest.raises(InputError, match=r"row 4.*pp_layout"):
        load_runs(runs)


def test_parse_layout_reads_counts_and_megatron_strings():
    assert parse_layout("3, 2,2") == (3, 2, 2)
    assert parse_layout(DSV3_LAYOUT) == (3,) + (2,) * 29 + (0, 0)
    for bad in ("", "3,-1", "x", "E|t|(", "3,,2", " , ", "t|t|t"):
        with pytest.raises(InputError, match="pp_layout"):
            parse_layout(bad)


def test_a_megatron_layout_is_imported_costed_and_exported_back(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(DSV3_RUN.format(layout=DSV3_LAYOUT))
    imp = import_launch(path, None)
    chunks = layout_chunks(DSV3_LAYOUT)
    assert imp.plan_fields["pp_layout"] == chunks and imp.plan_fields["vpp"] == 2
    assert not any("layer split is tpsim's own" in n for n in imp.notes)
    from tpsim.launch import resolve_model, resolve_plan
    model = resolve_model(imp, load_model("deepseek-v3"))
    plan = resolve_plan(imp, model, 1024)
    assert plan.pp_layout == chunks
    cluster = load_cluster("dgx-h100", gpus=1024)
    e = estimate(model, cluster, plan, stack="megatron")
    assert e.pipeline_split["layers_per_chunk"] == list(chunks)
    assert e.pipeline_split["layers_per_rank"][0] == 5 and e.pipeline_split["layers_per_rank"][-1] == 2
    ctx = export_context(model, cluster, plan, model_ref=str(path), cluster_ref="dgx-h100")
    text = export_plan("megatron", ctx)["megatron_args.sh"]
    exported = text.split("--pipeline-model-parallel-layout ")[1].split()[0].strip("'\"")
    assert layout_chunks(exported) == chunks and exported.endswith("mL")
    # a command-line pipeline shape replaces the file's layout instead of clashing with it
    assert resolve_plan(imp, model, 1024, overrides={"pp": 8, "vpp": 1}).pp_layout == ()



def test_megatron_bridge_writes_the_layout_and_reads_it_back(llama70, tmp_path):
    model, cluster = llama70
    layout = (9, 11, 10, 10, 10, 10, 10, 10)
    plan = dataclasses.replace(_plan(model, vpp=2), pp_layout=layout)
    ctx = export_context(model, cluster, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
    bridge = next(iter(export_plan("bridge", ctx).values()))
    assert "pipeline_model_parallel_layout=" in bridge
    recipe = tmp_path / "recipe.py"
    recipe.write_text(bridge)
    back = import_launch(recipe, None)
    assert back.plan_fields["pp_layout"] == layout and back.plan_fields["vpp"] == 2
    assert not any("fields not used" in n and "pipeline_model_parallel_layout" in n for n in back.notes)


@pytest.mark.parametrize("change", [dict(pp_layout=(9, 11, 10, 10, 10, 10, 10, 10)), dict(pp_first=4),
                                    dict(pp_embedding=True, pp_loss=True)])
def test_torchtitan_writes_the_split_as_module_lists_and_reads_it_back(llama70, tmp_path, change):
    """torchtitan's parallelism.module_fqns_per_model_part: one module list per model chunk (pipeline_llm uses
    it instead of its own split); the import reads the chunks back to the same split."""
    model, cluster = llama70
    plan = dataclasses.replace(_plan(model, vpp=2, zero=2), **change)
    ctx = export_context(model, cluster, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
    text = export_plan("torchtitan", ctx)["torchtitan.toml"]
    assert "module_fqns_per_model_part" in text and "pipeline_parallel_layers_per_stage" not in text
    path = tmp_path / "torchtitan.toml"
    path.write_text(text)
    imp = import_launch(path, None)
    from tpsim.launch import resolve_model, resolve_plan
    back = resolve_plan(imp, resolve_model(imp, model), 64)
    want = estimate(model, cluster, plan, stack="torchtitan").pipeline_split["layers_per_chunk"]
    assert estimate(model, cluster, back, stack="torchtitan").pipeline_split["layers_per_chunk"] == want
    assert back.vpp == 2


@pytest.mark.parametrize("parts,message", [
    ([["tok_embeddings", "layers.1"], ["layers.0", "norm", "output"]], "once each, in order"),
    ([["layers.0"], ["tok_embeddings", "layers.1", "norm", "output"]], "tok_embeddings must be on the first"),
    ([["tok_embeddings", "layers.0", "norm"], ["layers.1", "output"]], "norm must be on the last"),
    ([["tok_embeddings", "layers.0", "mlp"], ["layers.1", "norm", "output"]], "'mlp' is not tok_embeddings"),
])
def test_a_bad_module_list_is_one_line(tmp_path, parts, message):
    import json
    path = tmp_path / "torchtitan.toml"
    path.write_text("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"1F1B\"\n"
                    f"module_fqns_per_model_part = {json.dumps(parts)}\n")
    with pytest.raises(InputError, match=f"module_fqns_per_model_part.*{message}"):
        import_launch(path, None)


def test_formats_without_a_layout_key_refuse_it_with_one_line(llama70):
    model, cluster = llama70
    for fmt, zero in (("nemo", 1), ("deepspeed", 1)):
        plan = dataclasses.replace(_plan(model, zero=zero), pp_layout=(17, 21, 21, 21))
        ctx = export_context(model, cluster, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
        with pytest.raises(InputError, match=r"pp_layout[/=:]"):
            export_plan(fmt, ctx)


def test_the_command_line_takes_a_layout_and_refuses_a_bad_one(capsys):
    common = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp",
              "4", "--global-batch", "64", "--json"]
    assert main(common + ["--pp-layout", "17,21,21,21"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["pp_layout"] == [17, 21, 21, 21]
    assert main(common + ["--pp-layout", "17,21,21"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pp_layout has 3 chunks" in err
    assert main(common + ["--pp-layout", "t|t|x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pp-layout" in err
    # a stack that splits its own way refuses any layout
    assert main(common[:-1] + ["--pp-layout", "17,21,21,21", "--stack", "deepspeed"]) == 2
    assert "pp_layout: the stack splits the layers its own way" in capsys.readouterr().err
