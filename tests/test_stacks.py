"""Training-stack profiles (tpsim/stacks.py, tpsim/data/stacks/*.yaml): loading, sources, the rules of each stack
on single plans, and the vectorized rule table against the one-plan path on whole plan spaces."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.model import load_model
from tpsim.plan import ORDERS, RECOMPUTE, Plan, PlanBatch, make_plan
from tpsim.search.space import SearchSpace, enumerate_plans
from tpsim.stacks import (RULES, SECTION_KEYS, STACK_NAMES, StackProfile, count_violations, load_stack,
                          profile_from_mapping)

STACKS_DIR = Path(__file__).resolve().parents[1] / "tpsim" / "data" / "stacks"
LLAMA70 = load_model("llama3-70b")


def plan(**kw) -> Plan:
    base = dict(tp=8, pp=4, sp=True, zero=1, recompute="selective", micro_batch=1)
    base.update(kw)
    return make_plan(LLAMA70, 64, global_batch=512, **base)


@pytest.mark.parametrize("name", STACK_NAMES)
def test_shipped_profiles_load_with_sources(name):
    s = load_stack(name)
    assert isinstance(s, StackProfile) and s.name == name and s.version and s.sources
    assert set(s.rules.sources) == {"zero", "ddp_only_pure_dp", "interleaving", "layers_divisible_by_stages",
                                    "sp", "cp", "ep", "recompute", "dtypes", "attention", "orders",
                                    "overlap_optional", "schedules"} | ({"uneven_split"} if s.rules.uneven_split else set()) \
        | ({"tp_overlap"} if "tp_overlap" in s.rules.sources else set())
    for section in SECTION_KEYS:
        for key, fig in getattr(s, section).items():
            assert fig.source, (name, section, key)
    # every stack offers the none/full recomputation flavors and names the choices it offers
    assert {"none", "full"} <= set(s.rules.recompute)
    assert set(s.rules.zero_names) == set(s.rules.zero_offered)
    assert s.figure("comm", "dp_reduction_timing") is not None
    assert load_stack(name) is s  # cached per file version


def test_unknown_stack_and_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(InputError, match="stack='colossal' is unknown"):
        load_stack("colossal")
    with pytest.raises(InputError, match="does not exist"):
        load_stack(tmp_path / "missing.yaml")
    raw = yaml.safe_load((STACKS_DIR / "megatron.yaml").read_text())
    no_source = copy.deepcopy(raw)
    del no_source["comm"]["grad_reduce_dtype"]["source"]
    with pytest.raises(InputError, match=r"comm\.grad_reduce_dtype: source is missing"):
        profile_from_mapping(no_source, "x.yaml")
    bad_rule = copy.deepcopy(raw)
    del bad_rule["rules"]["interleaving"]["source"]
    with pytest.raises(InputError, match=r"rules\.interleaving: source is missing"):
        profile_from_mapping(bad_rule, "x.yaml")
    typo = copy.deepcopy(raw)
    typo["memory"]["grad_bufer_dtype"] = {"value": "fp32", "source": "x"}
    with pytest.raises(InputError, match="unknown key 'grad_bufer_dtype'"):
        profile_from_mapping(typo, "x.yaml")
    bad_zero = copy.deepcopy(raw)
    bad_zero["rules"]["zero"]["offered"] = [0, 4]
    with pytest.raises(InputError, match="ZeRO stages 0-3"):
        profile_from_mapping(bad_zero, "x.yaml")
    bad_attn = copy.deepcopy(raw)
    bad_attn["compute"]["default_attention"]["value"] = {"sm90": "xformers"}
    with pytest.raises(InputError, match="default_attention"):
        profile_from_mapping(bad_attn, "x.yaml")
    path = tmp_path / "custom.yaml"
    custom = copy.deepcopy(raw)
    custom["name"] = "megatron-no-fsdp"
    custom["rules"]["zero"]["offered"] = [0, 1]
    custom["rules"]["zero"]["names"] = {0: "ddp", 1: "distributed optimizer"}
    path.write_text(yaml.safe_dump(custom))
    s = load_stack(path)
    assert s.name == "megatron-no-fsdp" and s.fingerprint() != load_stack("megatron").fingerprint()
    assert "zero=3 is not offered" in s.plan_violation(plan(pp=1, zero=3))


def test_megatron_rules():
    s = load_stack("megatron")
    assert s.plan_violation(plan(), LLAMA70) is None
    assert s.plan_violation(plan(vpp=4), LLAMA70) is None                    # 80 layers = 4 x 4 x 5
    assert s.plan_violation(plan(order="tp-pp-dp"), LLAMA70) is None         # --use-tp-pp-dp-mapping
    assert s.plan_violation(plan(pp=1, zero=3), LLAMA70) is None             # Megatron-FSDP
    assert "zero=2 with pp=4" in s.plan_violation(plan(zero=2), LLAMA70)
    assert "zero=3 with pp=4" in s.plan_violation(plan(zero=3), LLAMA70)
    assert "order=dp-tp-pp" in s.plan_violation(plan(order="dp-tp-pp"), LLAMA70)
    assert s.plan_violation(plan(pp=4, vpp=3), LLAMA70) is None             # --pipeline-model-parallel-layout
    tt = load_stack("torchtitan")
    assert "does not divide num_layers=80" in tt.plan_violation(plan(pp=4, vpp=3, zero=3), LLAMA70)
    assert tt.plan_violation(plan(pp=4, vpp=3, zero=3)) is None             # model rules only with a model
    assert s.plan_violation(plan(dtype="tf32"), LLAMA70).startswith("megatron (dtype)")
    assert s.recompute_name("selective").startswith("--recompute-granularity selective")
    with pytest.raises(InputError, match=r"stack megatron \(zero-with-pp\)"):
        s.check_plan(plan(zero=2), LLAMA70)


def test_torchtitan_rules():
    s = load_stack("torchtitan")
    assert s.plan_violation(plan(zero=3), LLAMA70) is None                   # FSDP2 + TP + PP
    assert s.plan_violation(plan(zero=2, vpp=2), LLAMA70) is None            # Interleaved1F1B
    assert "zero=1 is not offered" in s.plan_violation(plan(zero=1), LLAMA70)
    assert "DDP" in s.plan_violation(plan(zero=0), LLAMA70)                  # DDP only as 1-D parallelism
    assert s.plan_violation(plan(tp=1, pp=1, sp=False, zero=0), LLAMA70) is None
    assert "always runs with sequence parallelism" in s.plan_violation(plan(sp=False, zero=3), LLAMA70)
    assert "attention=unfused" in s.plan_violation(plan(zero=3, attention="unfused"), LLAMA70)
    assert "dtype=fp16" in s.plan_violation(plan(zero=3, dtype="fp16"), LLAMA70)
    assert "overlap=False" in s.plan_violation(plan(zero=3, overlap=False), LLAMA70)
    assert "per-op" not in s.recompute_name("full")
    assert 'selective_ac_option = "op"' in s.recompute_name("selective")


def test_deepspeed_rules():
    s = load_stack("deepspeed")
    assert s.plan_violation(plan(zero=1), LLAMA70) is None                   # pipeline engine with ZeRO-1
    assert s.plan_violation(plan(pp=1, zero=3), LLAMA70) is None
    for zero in (2, 3):
        assert f"zero={zero} with pp=4" in s.plan_violation(plan(zero=zero), LLAMA70)
    assert "interleaved" in s.plan_violation(plan(vpp=2), LLAMA70)
    assert "dtype=fp8" in s.plan_violation(plan(dtype="fp8"), LLAMA70)
    assert s.figure("comm", "zero3_prefetch_elements").value == 5e7
    assert s.figure("comm", "zero3_unit").value == "parameter"
    assert s.figure("comm", "dp_reduction_timing").value[2] == "per_microbatch"


def _space_batch(model, gpus, batch):
    return enumerate_plans(model, gpus, batch, SearchSpace()).plans


@pytest.mark.parametrize("name", STACK_NAMES)
def test_vectorized_rules_agree_with_one_plan_on_a_whole_space(name):
    """violation_codes over a whole plan space names the same first rule as plan_violation for each plan (a
    deterministic sample of 1500 rows, plus the first row of every rule that fires)."""
    s = load_stack(name)
    batch = _space_batch(LLAMA70, 64, 512)
    codes = s.violation_codes(batch, LLAMA70)
    assert codes.shape == (len(batch),) and np.array_equal(s.violations(batch, LLAMA70), codes > 0)
    counts = count_violations(codes)
    assert sum(counts.values()) == int((codes > 0).sum()) and 0 < sum(counts.values()) < len(batch)
    rows = set(np.random.default_rng(0).choice(len(batch), 1500, replace=False).tolist())
    rows |= {int(np.flatnonzero(codes == c)[0]) for c in np.unique(codes)}
    for i in sorted(rows):
        line = s.plan_violation(batch.plan(i), LLAMA70)
        if codes[i] == 0:
            assert line is None, (i, batch.plan(i))
        else:
            assert line.startswith(f"{name} ({RULES[codes[i] - 1].key}):"), (i, line)


def test_issue_14_plan_is_refused_by_megatron_and_deepspeed_only():
    """Issue 14: ZeRO-2 with pipeline stages for Llama-3 70B on 64 H100 is run by neither Megatron-Core nor
    DeepSpeed; torchtitan runs ZeRO-2-like FSDP2 with pp."""
    batch = _space_batch(LLAMA70, 64, 512)
    zero2_pp = (batch.zero == 2) & (batch.pp > 1)
    for name, refused in (("megatron", True), ("deepspeed", True)):
        assert load_stack(name).violations(batch, LLAMA70)[zero2_pp].all() == refused
    tt = load_stack("torchtitan")
    runnable = ~tt.violations(batch, LLAMA70)
    assert (runnable & zero2_pp).any()


order_st = st.sampled_from(ORDERS)


@settings(max_examples=150, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4, 5, 8]), vpp=st.sampled_from([1, 2, 3, 4]),
       sp=st.booleans(), zero=st.integers(0, 3), recompute=st.sampled_from(RECOMPUTE), order=order_st,
       overlap=st.booleans(), dtype=st.sampled_from(["bf16", "fp16", "fp8", "fp32", "tf32"]),
       attention=st.sampled_from(["flash", "unfused"]), name=st.sampled_from(STACK_NAMES))
def test_property_batch_and_single_plan_agree(tp, pp, vpp, sp, zero, recompute, order, overlap, dtype, attention,
                                              name):
    """For any plan (valid for tpsim or not), the batch of one and the single-plan path agree."""
    p = Plan(tp=tp, pp=pp, vpp=vpp, dp=64 // (tp * pp) if 64 % (tp * pp) == 0 else 1, sp=sp, zero=zero,
             recompute=recompute, order=order, overlap=overlap, dtype=dtype, attention=attention,
             global_batch=512)
    s = load_stack(name)
    code = int(s.violation_codes(PlanBatch.from_plans([p]), LLAMA70)[0])
    line = s.plan_violation(p, LLAMA70)
    assert (code == 0) == (line is None)
    if code:
        assert f"({RULES[code - 1].key})" in line


class _CpBatch:
    """A PlanBatch with the context/expert-parallel columns of docs/SCHEMAS.md section 1 (cp, cp_kind, ep)."""

    def __init__(self, base: PlanBatch, cp, cp_kind, ep):
        self.__dict__.update({k: getattr(base, k) for k in base.__dataclass_fields__})
        self.cp, self.cp_kind, self.ep = np.asarray(cp), np.asarray(cp_kind), np.asarray(ep)

    def __len__(self):
        return len(self.tp)


def test_context_and_expert_parallel_columns():
    """cp kinds per stack (ring = Megatron p2p / torchtitan ring attention; a2a = Megatron a2a / DeepSpeed
    Ulysses), the 2 x cp sequence rule and ep, on batches that carry the schema's cp/ep columns."""
    base = PlanBatch.from_plans([plan(tp=2, pp=1, zero=1)] * 4)
    b = _CpBatch(base, cp=[1, 2, 2, 1], cp_kind=[0, 0, 1, 0], ep=[1, 1, 1, 2])
    megatron = load_stack("megatron").violation_codes(b)
    assert list(megatron) == [0, 0, 0, 0]
    tt = load_stack("torchtitan").violation_codes(b)
    assert RULES[tt[2] - 1].key in ("zero", "cp")   # zero=1 is refused first; a2a is not offered either
    ds = load_stack("deepspeed").violation_codes(b)
    assert RULES[ds[1] - 1].key == "cp" and ds[2] == 0
    odd = load_model("llama3-8b")
    seq_odd = _CpBatch(base, cp=[3, 3, 3, 3], cp_kind=[0] * 4, ep=[1] * 4)
    assert odd.seq_len % 6 != 0
    assert RULES[load_stack("megatron").violation_codes(seq_odd, odd)[0] - 1].key == "cp-seq"


def test_stacks_module_imports_nothing_above_the_plan():
    """stacks sits between plan and estimator (the estimator will read profiles): no estimator, search,
    report or cli imports, no torch or matplotlib."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "tpsim" / "stacks.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    assert not names & {"estimator", "search", "report", "cli", "launch", "torch", "matplotlib"}, names


def test_torchtitan_compile_profile_differs_only_in_kernels():
    """torchtitan-compile.yaml is torchtitan.yaml with training.compile: fused kernels (and the float8 casts
    fused with their amax: 3 / 4 / 3 B instead of 5 / 10 / 5), async TP offered (it needs compile) and the ring's exchanges awaited at issue, every other figure the same (the two files are kept in step by hand; this catches a figure
    changed in one of them only)."""
    from tpsim.stacks import stack_path
    from tpsim.topology.files import read_yaml

    eager, compiled = (dict(read_yaml(stack_path(n))) for n in ("torchtitan", "torchtitan-compile"))
    assert eager["compute"]["kernels"]["value"] == "eager"
    assert compiled["compute"]["kernels"]["value"] == "fused"
    assert eager["rules"]["tp_overlap"]["value"] is False and compiled["rules"]["tp_overlap"]["value"] is True
    assert eager["compute"]["fp8_cast_bytes_per_element"]["value"] == {"forward": 5, "backward": 10,
                                                                        "backward_input": 5}
    assert compiled["compute"]["fp8_cast_bytes_per_element"]["value"] == {"forward": 3, "backward": 4,
                                                                           "backward_input": 3}
    # compiled, the ring attention's exchanges are traced and awaited where they are issued
    assert eager["comm"]["cp_exchange_overlap"]["value"] is True
    assert compiled["comm"]["cp_exchange_overlap"]["value"] is False
    for data in (eager, compiled):
        data["compute"] = {k: v for k, v in data["compute"].items() if k not in ("kernels",
                                                                                   "fp8_cast_bytes_per_element")}
        for section in ("rules", "comm"):
            data[section] = {k: v for k, v in data[section].items() if k not in ("tp_overlap",
                                                                                  "cp_exchange_overlap")}
        for key in ("name", "description"):
            data.pop(key)
    assert eager == compiled
    assert load_stack("torchtitan-compile").name == "torchtitan-compile"


def test_eager_torchtitan_refuses_tp_overlap():
    """Async TP needs torch.compile (torchtitan parallelize.py raises "Async TP requires torch.compile"): the eager
    profile refuses a tp_overlap plan with tp > 1 in one line naming the rule; the compile profile and
    megatron run it; tp = 1 has no TP collective to overlap and is not refused."""
    overlapped = make_plan(LLAMA70, 64, global_batch=64, tp=8, sp=True, zero=3, micro_batch=1, tp_overlap=True)
    with pytest.raises(InputError, match=r"torchtitan \(tp-overlap\): tp_overlap=True with tp=8"):
        load_stack("torchtitan").check_plan(overlapped)
    assert load_stack("torchtitan-compile").plan_violation(overlapped) is None
    assert load_stack("megatron").rules.tp_overlap
    one = make_plan(LLAMA70, 64, global_batch=64, tp=1, sp=False, zero=3, micro_batch=1, tp_overlap=True)
    assert load_stack("torchtitan").plan_violation(one) is None
