"""``tpsim trace`` on the meta device: op kinds, FLOPs against torch's FlopCounterMode, repeated blocks, saved
tensors, input errors, and the freshness of the committed test graphs (tests/data/opgraph/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tpsim.errors import InputError  # noqa: E402
from tpsim.opgraph.schema import load_opgraph  # noqa: E402
from tpsim.trace import trace_module, trace_spec  # noqa: E402
from tpsim.trace.spec import parse_input_shape, parse_kwargs  # noqa: E402

DATA = Path(__file__).parent / "data" / "opgraph"
FIXTURES = {  # name: (module spec, kwargs, input shapes): the tpsim trace commands of tests/data/opgraph/
    "tiny-gpt": ("tpsim.trace.zoo:gpt", dict(layers=2, hidden=64, heads=4, vocab=128, seq_len=16), ["2,16:int64"]),
    "tiny-resnet": ("tpsim.trace.zoo:resnet", dict(layers=(1, 1), width=8, classes=10), ["4,3,32,32"]),
    "tiny-unet": ("tpsim.trace.zoo:unet", dict(base=32, mults=(1, 2), blocks=1, heads=2), ["2,3,16,16", "2"]),
    "tiny-vit": ("tpsim.trace.zoo:vit", dict(image=32, patch=8, layers=2, hidden=64, heads=4, classes=10),
                 ["2,3,32,32"]),
}


def _trace(name: str):
    spec, kwargs, shapes = FIXTURES[name]
    return trace_spec(spec, [parse_input_shape(s) for s in shapes], kwargs, name=name)


def _without_provenance(d: dict) -> dict:
    d = dict(d)
    d["source"] = {k: v for k, v in d["source"].items() if k not in ("date", "torch_version", "tpsim_version")}
    return d


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_committed_graphs_are_what_trace_gives(name):
    committed = json.loads((DATA / f"{name}.ops.json").read_text())
    assert _without_provenance(_trace(name).to_dict()) == _without_provenance(committed)


def test_kinds_shapes_and_params_of_a_gpt():
    g = _trace("tiny-gpt")
    block = g.units[1]
    kinds = [op.kind for op in block.ops]
    assert kinds == ["norm", "linear", "attention", "copy", "linear", "dropout", "elementwise", "norm", "linear",
                     "activation", "linear", "dropout", "elementwise"]
    qkv = block.ops[1]
    assert qkv.attrs["in_features"] == 64 and qkv.attrs["out_features"] == 192 and qkv.attrs["tokens"] == 32
    assert qkv.params == ("blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias")
    attn = block.ops[2].attrs
    assert (attn["heads"], attn["seq_q"], attn["head_dim"], attn["causal"]) == (4, 16, 16, True)
    assert [t.src for t in block.ops[2].inputs] == [1, 1, 1]  # q, k, v are views of the qkv output
    assert g.tokens_per_sample == 16 and g.batch == 2
    # the output layer is the tied embedding
    assert g.units[2].ops[1].params == ("wte.weight",)


def _flop_counter_total(model: torch.nn.Module, inputs: list[torch.Tensor]) -> float:
    """FlopCounterMode with the math SDPA backend (its CPU flash kernel has no entry in the FLOP registry)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(*inputs)
    return float(counter.get_total_flops())


@pytest.mark.parametrize("name", ["tiny-resnet", "tiny-vit", "tiny-unet"])
def test_flops_equal_flop_counter_mode(name):
    """The graph's forward FLOPs (repeats expanded) equal FlopCounterMode's on a real CPU forward."""
    from tpsim.trace.spec import build_module
    spec, kwargs, shapes = FIXTURES[name]
    torch.manual_seed(0)
    model = build_module(spec, kwargs, device="cpu")
    inputs = [torch.randn(parse_input_shape(s).shape) for s in shapes]
    assert _trace(name).forward_flops() == pytest.approx(_flop_counter_total(model, inputs), rel=1e-9)


def test_resnet50_and_vit_l16_published_sizes():
    """ResNet-50: 25.6 M parameters, 4.1 G multiply-adds per 224x224 image (He et al. 2016, Table 1);
    ViT-L/16: 304 M parameters, 61.6 G multiply-adds (Dosovitskiy et al. 2021, Table 1 and 6)."""
    r = trace_spec("tpsim.trace.zoo:resnet50", [parse_input_shape("1,3,224,224")])
    assert r.total_params() == pytest.approx(25.56e6, rel=0.002)
    assert r.forward_flops() / 2 == pytest.approx(4.1e9, rel=0.01)
    assert [(u.name, u.repeat) for u in r.units if u.repeat > 1] == [("layer1.1", 2), ("layer2.1", 3),
                                                                       ("layer3.1", 5), ("layer4.1", 2)]
    v = trace_spec("tpsim.trace.zoo:vit_l16", [parse_input_shape("1,3,224,224")])
    assert v.total_params() == pytest.approx(304.3e6, rel=0.002)
    assert v.forward_flops() / 2 == pytest.approx(61.6e9, rel=0.01)
    assert [u.repeat for u in v.units] == [1, 24, 1]


def test_repeated_blocks_need_identical_ops():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            block = lambda n: torch.nn.Sequential(torch.nn.Linear(8, n), torch.nn.ReLU())  # noqa: E731
            self.layers = torch.nn.ModuleList([block(8) for _ in range(3)] + [block(4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.sum()

    with torch.device("meta"):
        net = Net()
    g = trace_module(net, [parse_input_shape("2,8")])
    assert [(u.name, u.repeat) for u in g.units] == [("layers.0", 3), ("layers.3", 1), ("sum", 1)]


def test_saved_tensors_of_a_gpt_block():
    """Per token, in elements of the hidden size h: LN inputs and outputs 4 h, the QKV output 3 h, the attention
    output and its contiguous copy 2 h, the MLP's 4 h twice; fp32 LN statistics and log-sum-exp; two
    1-byte dropout masks (Korthikanti et al. 2022 count 34 s b h bytes for these in 16 bits, plus the copy)."""
    g = _trace("tiny-gpt")
    block = g.units[1]
    tokens, h = 32, 64
    act = sum(s.numel for s in block.saved if s.dtype == "act")
    assert act == tokens * h * (4 + 3 + 2 + 8)
    assert sum(s.numel for s in block.saved if s.dtype == "bool") == 2 * tokens * h
    assert block.input_numel == tokens * h + tokens  # the residual stream and the token ids (loss targets)


def test_input_errors_are_one_line():
    with pytest.raises(InputError, match="expected package.module:factory"):
        trace_spec("no_colon_here", [parse_input_shape("1,2")])
    with pytest.raises(InputError, match="cannot import"):
        trace_spec("no.such.module:f", [parse_input_shape("1,2")])
    with pytest.raises(InputError, match="has no callable"):
        trace_spec("tpsim.trace.zoo:nothing", [parse_input_shape("1,2")])
    with pytest.raises(InputError, match="forward pass failed"):
        trace_spec("tpsim.trace.zoo:resnet50", [parse_input_shape("1,5,224,224")])
    with pytest.raises(InputError, match="building the model failed"):
        trace_spec("tpsim.trace.zoo:gpt", [parse_input_shape("1,8:int64")], {"hidden": "wide"})
    for bad in ("0,3", "1,x", "1,2:complex", ""):
        with pytest.raises(InputError):
            parse_input_shape(bad)
    with pytest.raises(InputError, match="NAME=VALUE"):
        parse_kwargs(["=3"])


def test_cli_trace_writes_and_refuses_to_overwrite(tmp_path, capsys):
    from tpsim.cli import main

    out = tmp_path / "m.ops.json"
    args = ["trace", "tpsim.trace.zoo:resnet", "--kwarg", "layers=(1,)", "--kwarg", "width=8",
            "--input-shape", "2,3,32,32", "--out", str(out)]
    assert main(args) == 0
    assert load_opgraph(out).name == "resnet"
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "exists" in err and err.count("\n") == 1
    assert main(args[:-2] + ["--out", str(tmp_path / "m.json")]) == 2
    assert ".ops.json" in capsys.readouterr().err
    assert main(["trace", "tpsim.trace.zoo:resnet", "--out", str(tmp_path / "n.ops.json")]) == 2
    assert "--input-shape is required" in capsys.readouterr().err


def test_conv_profiler_tiny_grid_round_trip(tmp_path):
    """python -m tpsim.profiler.conv on the tiny grid: rows for 1x1 and 3x3 convolutions, forward, data and
    weight gradients, keyed by their implicit-GEMM dims; resumable; read back by the op-graph cost model."""
    from tpsim.opgraph.convprofile import load_conv_profile
    from tpsim.profiler.conv import PASSES, conv_grid, run

    out = tmp_path / "conv-cpu-tiny.csv"
    points, _, _ = conv_grid("tiny")
    assert run(out, "tiny", log=lambda s: None) == 3 * len(points)
    assert run(out, "tiny", log=lambda s: None) == 0  # nothing left to measure
    prof = load_conv_profile(out)
    assert set(prof.tables) == {(f"conv2d_k{k}", "fp32", p) for k in (1, 3) for p in PASSES}
    m, n, k = points[-1].dims("wgrad")
    t, measured = prof.tables[(f"conv2d_k{points[-1].kernel}", "fp32", "wgrad")].lookup((m, n, k))
    assert t > 0 and bool(measured)
