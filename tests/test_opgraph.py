"""Op graphs without torch: the ``*.ops.json`` round trip and its validation, TP plan derivation for linear and
convolution pairs, the collectives of the derived layouts, overrides, and the op-graph estimator and CLI.

The graphs in tests/data/opgraph/ are ``tpsim trace`` outputs of the zoo models at tiny sizes (their freshness
is checked in tests/test_trace.py, which needs torch)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.model import PRESETS, with_overrides
from tpsim.opgraph.layout import CHANGES, unit_layout
from tpsim.opgraph.model import OpGraphModel, graph_violation, load_graph_model, make_graph_plan
from tpsim.opgraph.schema import load_opgraph, opgraph_from_dict, parse_opgraph
from tpsim.opgraph.tp import derive_plan, overrides_from_mapping, styles_at
from tpsim.tp_plan import count_by_kind, layer_collectives

DATA = Path(__file__).parent / "data" / "opgraph"
GRAPHS = ("tiny-gpt", "tiny-resnet", "tiny-unet", "tiny-vit")


def graph(name: str):
    return load_opgraph(DATA / f"{name}.ops.json")


def styles_by_name(g, tp: int = 2) -> dict[str, str]:
    styles, _ = styles_at(g, derive_plan(g), tp)
    return {op.name: styles[u][j] for u, unit in enumerate(g.units) for j, op in enumerate(unit.ops)}


# ---- format ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GRAPHS)
def test_round_trip(name):
    g = graph(name)
    again = parse_opgraph(g.to_json(), "again")
    assert again == g
    assert again.to_json() == g.to_json()


def test_repeated_blocks_and_totals():
    g = graph("tiny-gpt")
    assert [(u.kind, u.repeat) for u in g.units] == [("glue", 1), ("block", 2), ("glue", 1)]
    assert g.units[1].instances == ("blocks.0", "blocks.1")
    # parameters: tied embedding counted once; 2 blocks of 12 h^2 + 13 h; positions; final norm
    h, v, s = 64, 128, 16
    assert g.total_params() == v * h + s * h + 2 * (12 * h * h + 13 * h) + 2 * h


def _bad(mutate) -> str:
    data = json.loads((DATA / "tiny-resnet.ops.json").read_text())
    mutate(data)
    with pytest.raises(InputError) as exc:
        opgraph_from_dict(data, "bad.ops.json")
    message = str(exc.value)
    assert "\n" not in message and message.startswith("bad.ops.json: ")
    return message


def test_validation_names_the_field():
    assert "format" in _bad(lambda d: d.update(format="other"))
    assert "version" in _bad(lambda d: d.update(version=99))
    assert "units[1]" in _bad(lambda d: d["units"][1]["ops"][0].pop("kind"))
    assert "kind" in _bad(lambda d: d["units"][1]["ops"][0].update(kind="teleport"))
    assert "flops" in _bad(lambda d: d["units"][1]["ops"][0].update(flops=-1))
    assert "flops" in _bad(lambda d: d["units"][1]["ops"][0].update(flops=float("nan")))
    assert ".src" in _bad(lambda d: d["units"][1]["ops"][0]["inputs"][0].update(src=5))
    assert "params" in _bad(lambda d: d["units"][1]["ops"][0].update(params=["nope"]))
    assert "kernel" in _bad(lambda d: d["units"][1]["ops"][0]["attrs"].pop("kernel"))
    assert "shape" in _bad(lambda d: d["inputs"][0].update(shape=[4, -3]))
    assert "batch" in _bad(lambda d: d.update(batch=3))
    assert "repeat" in _bad(lambda d: d["units"][1].update(repeat=2))
    assert "groups" in _bad(lambda d: d["units"][1]["ops"][0]["attrs"].update(groups=3))


def test_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "x.ops.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_opgraph(bad)
    with pytest.raises(InputError, match="no such file"):
        load_opgraph(tmp_path / "missing.ops.json")
    deep = tmp_path / "deep.ops.json"
    deep.write_text("[" * 100 + "]" * 100)
    with pytest.raises(InputError, match="nested deeper"):
        load_opgraph(deep)


_FIELDS = st.sampled_from(["flops", "bytes", "kind", "fn", "name", "batched", "inputs", "output", "attrs", "saves"])
_VALUES = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=4),
                    st.lists(st.integers(-2, 3), max_size=3), st.booleans())


@settings(max_examples=60, deadline=None)
@given(unit=st.integers(0, 3), op=st.integers(0, 4), field=_FIELDS, value=_VALUES)
def test_any_corruption_is_an_input_error_or_valid(unit, op, field, value):
    data = json.loads((DATA / "tiny-resnet.ops.json").read_text())
    ops = data["units"][unit]["ops"]
    ops[op % len(ops)][field] = value
    try:
        opgraph_from_dict(data, "fuzz")
    except InputError as exc:
        assert "\n" not in str(exc)


# ---- TP derivation -------------------------------------------------------------------------------------------
def test_linear_pairs_megatron_style():
    s = styles_by_name(graph("tiny-gpt"))
    assert s["wte"] == "vocab" and s["wpe"] == "replicate"
    assert s["blocks.0.attn.qkv"] == "colwise" and s["blocks.0.attn.proj"] == "rowwise"
    assert s["blocks.0.attn:scaled_dot_product_attention"] == "sharded"
    assert s["blocks.0.mlp.fc1"] == "colwise" and s["blocks.0.mlp:gelu"] == "sharded"
    assert s["blocks.0.mlp.fc2"] == "rowwise"
    assert s["blocks.0.ln1"] == s["blocks.0.ln2"] == s["blocks.0:add"] == "replicate"
    assert s["lm_head"] == "colwise" and s["cross_entropy"] == "vocab_loss"


def test_conv_pairs_out_channel_then_in_channel():
    s = styles_by_name(graph("tiny-resnet"))
    for block in ("layer1.0", "layer2.0"):
        assert s[f"{block}.conv1"] == "colwise"          # output channels split
        assert s[f"{block}.bn1"] == "sharded"            # per-channel statistics on the shard
        assert s[f"{block}.conv2"] == "rowwise"          # input channels split, partial sum reduced
        assert s[f"{block}.conv3"] == "replicate"        # feeds the residual: no partner
        assert s[f"{block}.downsample.0"] == "replicate"
    assert s["conv1"] == "replicate"  # the stem feeds a max-pool into the residual stream


def test_unet_timestep_projection_joins_the_region():
    s = styles_by_name(graph("tiny-unet"))
    assert s["down.0.res.0.conv1"] == "colwise" and s["down.0.res.0.temb"] == "colwise"
    assert s["down.0.res.0.norm2"] == "sharded" and s["down.0.res.0.conv2"] == "rowwise"
    assert s["mid.attn.0.attn.qkv"] == "colwise" and s["mid.attn.0.attn.proj"] == "rowwise"


def test_regions_that_do_not_divide_fall_back_to_replicate():
    g = graph("tiny-resnet")
    styles, notes = styles_at(g, derive_plan(g), 16)  # layer1 width 8: 16 does not divide
    by_name = {op.name: styles[u][j] for u, unit in enumerate(g.units) for j, op in enumerate(unit.ops)}
    assert by_name["layer1.0.conv1"] == "replicate"
    assert by_name["layer2.0.conv1"] == "colwise"  # width 16 divides
    assert any("layer1.0.conv1" in n and "out_channels=8" in n for n in notes)


def test_overrides_pin_styles_and_conv_mode():
    g = graph("tiny-resnet")
    pinned = derive_plan(g, overrides_from_mapping({"ops": {"layer*.conv1": "replicate"}}))
    names = {op.name: pinned.styles[u][j] for u, unit in enumerate(g.units) for j, op in enumerate(unit.ops)}
    # conv1 pinned replicated: the next pair forms around it (conv2 colwise, conv3 rowwise)
    assert names["layer1.0.conv1"] == "replicate"
    assert names["layer1.0.conv2"] == "colwise" and names["layer1.0.conv3"] == "rowwise"
    spatial = derive_plan(g, overrides_from_mapping({"conv": "spatial"}))
    names = {op.name: spatial.styles[u][j] for u, unit in enumerate(g.units) for j, op in enumerate(unit.ops)}
    assert names["layer1.0.conv2"] == "spatial" and names["layer1.0.conv1"] == "spatial"
    assert names["conv1"] == "replicate"  # 7x7 stride 2 with padding: DTensor's halo conv does not run it
    with pytest.raises(InputError, match="matches no op"):
        derive_plan(g, overrides_from_mapping({"ops": {"nothing.here": "colwise"}}))
    with pytest.raises(InputError, match="conv="):
        overrides_from_mapping({"conv": "diagonal"})
    with pytest.raises(InputError, match="colwise needs a linear"):
        derive_plan(g, overrides_from_mapping({"ops": {"layer1.0.bn1": "colwise"}}))


# ---- collectives -------------------------------------------------------------------------------------------
def _counts(g, tp: int, sp: bool, flavor: str, unit: int) -> dict:
    styles, _ = styles_at(g, derive_plan(g), tp)
    out: dict[str, dict[str, int]] = {"fwd": {}, "bwd": {}}
    for c in unit_layout(g, unit, styles[unit], tp, sp, flavor).comms:
        out[c.phase][c.op] = out[c.phase].get(c.op, 0) + 1
    return out


@pytest.mark.parametrize("sp", [False, True])
def test_traced_gpt_block_collectives_equal_the_preset_plan(sp):
    """The derived layout of a traced GPT block issues what tpsim.tp_plan says Megatron issues (fused QKV)."""
    preset = with_overrides(PRESETS["gpt3-1.3b"], hidden=64, heads=4)
    expected = count_by_kind(layer_collectives(preset, 2, sp, "megatron"))
    assert _counts(graph("tiny-gpt"), 2, sp, "megatron", 1) == expected


def test_conv_pair_collectives():
    """Per bottleneck: one forward all-reduce after the rowwise conv, one backward all-reduce of the colwise
    conv's input gradient; nothing else (the rest is replicated)."""
    assert _counts(graph("tiny-resnet"), 2, False, "dtensor", 1) == {"fwd": {"all_reduce": 1},
                                                                    "bwd": {"all_reduce": 1}}


def test_layout_change_table_is_dtensor_s():
    assert CHANGES[("P", "R")] == ("all_reduce", None)
    assert CHANGES[("P", "T")] == ("reduce_scatter", "all_gather")
    assert CHANGES[("T", "R")] == ("all_gather", "reduce_scatter")


def test_spatial_convolutions_exchange_halos():
    g = graph("tiny-resnet")
    plan = derive_plan(g, overrides_from_mapping({"conv": "spatial"}))
    styles, _ = styles_at(g, plan, 2)
    comms = unit_layout(g, 1, styles[1], 2, False, "megatron").comms
    halos = [c for c in comms if c.op == "send_recv"]
    assert {c.where for c in halos} == {"layer1.0.conv2"} and {c.phase for c in halos} == {"fwd", "bwd"}
    conv2 = next(op for op in g.units[1].ops if op.name == "layer1.0.conv2")
    n, c, h, _ = conv2.inputs[0].shape
    assert halos[0].numel == n * c * h * 1  # one border column (3x3 kernel) from each neighbour
    # batch norms on the split all-reduce their statistics
    assert any(c.op == "all_reduce" and c.dtype == "fp32" and c.where.endswith("bn2") for c in comms)


# ---- estimator ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GRAPHS)
def test_estimate_breakdown_sums_to_step_time(name):
    from tpsim.opgraph.estimate import estimate_graph
    from tpsim.topology import load_cluster

    model = load_graph_model(DATA / f"{name}.ops.json").with_gpus(8)
    cluster = load_cluster("dgx-a100", gpus=8)
    for kw in (dict(tp=1), dict(tp=2, micro_batch=2), dict(tp=2, sp=True, recompute="selective"),
               dict(tp=2, pp=2, zero=1, recompute="full"), dict(tp=1, pp=2, vpp=1, zero=3)):
        plan = make_graph_plan(model, 8, global_batch=32, **kw)
        e = estimate_graph(model, cluster, plan)
        b = e.breakdown
        total = b["compute"] + b["recompute"] + b["bubble"] + b["optimizer"] + b["exposed_comm"] + b.get("overhead", 0.0)
        assert e.step_time_s > 0 and np.isclose(total, e.step_time_s), (name, kw)
        assert e.peak_memory_gib > 0 and np.isfinite(e.mfu)
        if kw.get("tp", 1) == 1:
            assert b["tp_comm"] == 0


def test_tp_shards_parameters_and_compute():
    from tpsim.opgraph.estimate import estimate_graph
    from tpsim.topology import load_cluster

    model = load_graph_model(DATA / "tiny-gpt.ops.json").with_gpus(8)
    cluster = load_cluster("dgx-a100", gpus=8)
    one = estimate_graph(model, cluster, make_graph_plan(model, 8, tp=1, global_batch=8))
    two = estimate_graph(model, cluster, make_graph_plan(model, 8, tp=2, global_batch=8))
    assert two.memory_gib["weights"] < one.memory_gib["weights"]
    assert two.breakdown["tp_comm"] > 0


def test_plan_rules_for_graphs():
    model = OpGraphModel(graph=graph("tiny-gpt"), tp_plan=derive_plan(graph("tiny-gpt")))
    from tpsim.plan import Plan
    assert "exceeds the 4 layers" in graph_violation(model, Plan(tp=1, pp=4, vpp=2, dp=2, global_batch=8), 8)
    assert graph_violation(model, Plan(tp=2, pp=2, dp=2, global_batch=8), 8) is None
    assert "needs tp > 1" in graph_violation(model, Plan(tp=1, dp=8, sp=True, global_batch=8), 8)


def _tpsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpsim.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_estimate_and_plan_on_a_graph():
    path = str(DATA / "tiny-resnet.ops.json")
    out = _tpsim("estimate", "--model", path, "--cluster", "dgx-a100", "--gpus", "8", "--tp", "2", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["model"] == "tiny-resnet" and d["opgraph"]["tp_plan"]["layer1.0.conv1"] == "colwise"
    out = _tpsim("plan", "--model", path, "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "64",
                 "--top", "3", "--no-progress", "--json")
    assert out.returncode == 0, out.stderr
    plans = json.loads(out.stdout)["plans"]
    assert len(plans) == 3 and plans[0]["step_time_s"] <= plans[1]["step_time_s"]


def test_cli_bad_graph_is_one_line(tmp_path):
    data = json.loads((DATA / "tiny-gpt.ops.json").read_text())
    data["units"][0]["ops"][0]["flops"] = "many"
    bad = tmp_path / "bad.ops.json"
    bad.write_text(json.dumps(data))
    out = _tpsim("estimate", "--model", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "flops" in out.stderr
    out = _tpsim("estimate", "--model", str(DATA / "tiny-gpt.ops.json"), "--layers", "4")
    assert out.returncode == 2 and "--layers" in out.stderr


def test_opgraph_and_its_estimator_import_no_torch():
    code = ("import sys, tpsim.opgraph, tpsim.opgraph.estimate, tpsim.opgraph.tp, tpsim.cli.graph\n"
            "print(','.join(m for m in ('torch', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    out = _tpsim("estimate", "--model", str(DATA / "tiny-vit.ops.json"), "--gpus", "8", "--tp", "2")
    assert out.returncode == 0


# ---- validation planning and the conv profile (torch-free parts) --------------------------------------------
def test_validate_maps_styles_to_modules_and_refuses_the_rest():
    from tpsim.validate.traced.run import TracedCase, expected_collectives, module_styles, recorded_factory

    model = load_graph_model(DATA / "tiny-resnet.ops.json")
    modules, loss_parallel, loss_inputs = module_styles(model, 2)
    assert modules["layer1.0.conv1"] == "colwise" and modules["layer1.0.bn1"] == "sharded"
    assert modules["layer1.0.conv2"] == "rowwise" and "layer1.0:relu" not in modules
    assert loss_parallel and loss_inputs == ["fc"]
    counts, nbytes = expected_collectives(model, 2)
    assert counts == {"fwd": {"all_reduce": 5}, "bwd": {"all_reduce": 3}}
    gpt = load_graph_model(DATA / "tiny-gpt.ops.json")
    modules, _, _ = module_styles(gpt, 2)
    assert modules["blocks.1.attn.qkv"] == "colwise" and modules["wte"] == "vocab"  # every instance
    spatial = load_graph_model(DATA / "tiny-resnet.ops.json")
    spatial = OpGraphModel(graph=spatial.graph, tp_plan=derive_plan(spatial.graph,
                                                                    overrides_from_mapping({"conv": "spatial"})))
    with pytest.raises(InputError, match="spatial is not run by tpsim validate"):
        module_styles(spatial, 2)
    with pytest.raises(InputError, match="give --module-spec .*traced from 'tpsim.trace.zoo:resnet'"):
        TracedCase(model=model, tp=2).spec()  # issue 26: the graph's own module_spec is data, never run
    recorded = recorded_factory(model)
    assert recorded == ("tpsim.trace.zoo:resnet", {"layers": (1, 1), "width": 8, "classes": 10})
    assert TracedCase(model=model, tp=2, module_spec=recorded[0], kwargs=recorded[1]).spec() == recorded


def test_validate_cli_refuses_block_options_for_graphs(capsys):
    from tpsim.cli import main

    assert main(["validate", "--model", str(DATA / "tiny-gpt.ops.json"), "--tp", "2", "--sp"]) == 2
    assert "sequence parallelism" in capsys.readouterr().err


def test_conv_profile_interpolates_measured_points(tmp_path):
    from tpsim.opgraph.convprofile import load_conv_profile

    prof = load_conv_profile(Path(__file__).parents[1] / "profiles" / "conv-cpu-1t.csv")
    g = graph("tiny-resnet")
    conv2 = next(op for op in g.units[1].ops if op.name == "layer1.0.conv2")  # 3x3
    t, measured = prof.lookup(conv2, "fwd", "fp32", 2 * 28 * 28, 128, 128 * 9)
    assert t > 0 and bool(measured)
    t2, _ = prof.lookup(conv2, "fwd", "fp32", 2 * 28 * 28, 256, 256 * 9)
    assert t2 > t  # more work, more time
    stem = next(op for op in g.units[0].ops if op.name == "conv1")  # 7x7: no table
    assert prof.lookup(stem, "fwd", "fp32", 100, 8, 147) is None
    bad = tmp_path / "bad.csv"
    bad.write_text("# x\nkind,op\n")
    with pytest.raises(InputError, match="columns"):
        load_conv_profile(bad)


def test_heterogeneous_graphs_run_the_estimators_stages_unit_by_unit():
    """A ResNet (blocks of different shapes) is a UnitSource of the estimator's stages: without pipelining the
    step's compute is the sum of its units' (each instance once per micro-batch), the stack's fixed costs and
    process memory apply as for a preset, and a pipeline split balances the units' times."""
    from tpsim.compute.roofline import RooflineModel
    from tpsim.opgraph.cost import GraphCosts
    from tpsim.opgraph.estimate import estimate_graph, graph_context
    from tpsim.opgraph.source import UnitSource
    from tpsim.topology import load_cluster

    model = load_graph_model(DATA / "tiny-resnet.ops.json").with_gpus(8)
    cluster = load_cluster("dgx-a100", gpus=8)
    roof = RooflineModel(cluster.device)
    assert isinstance(graph_context(model, cluster, roof).source, UnitSource)
    plan = make_graph_plan(model, 8, global_batch=32, tp=1, micro_batch=2)
    e = estimate_graph(model, cluster, plan, compute=roof)
    costs = GraphCosts(model.graph, model.tp_plan, roof)
    per_mb = sum(u.repeat * float((c.fwd + c.bwd)[0]) for u, c in
                 zip(model.graph.units, (costs.unit_cost(i, 1, False, np.array([2.0]), "bf16")
                                         for i in range(len(model.graph.units)))))
    m = 32 // (2 * plan.dp)
    assert e.breakdown["compute"] == pytest.approx(m * per_mb, rel=1e-9)
    assert e.breakdown["overhead"] > 0 and e.memory_gib["cuda_context"] > 0
    piped = estimate_graph(model, cluster, make_graph_plan(model, 8, global_batch=32, tp=1, pp=2), compute=roof)
    split = piped.pipeline_split["layers_per_rank"]
    assert sum(split) == model.num_layers and len(split) == 2
