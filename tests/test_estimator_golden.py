"""Golden snapshot of the estimator: every output field of ~50 varied plans and of one batch, to 1e-9 relative.

``tests/data/estimator_golden.json`` was first written before the estimator's rewrite into stages (issue 9),
which reproduced it; issue 10 regenerated it for the kernel model as default compute, the fixed-cost terms and
the training-stack profiles. Each case runs under the ``megatron`` stack when that stack runs its plan, else
under ``tests/data/permissive-stack.yaml`` (megatron with every rank order and ZeRO-2/3 with pp), or under the
stack the case names. Regenerate only for a deliberate change of the physics, in its own commit that says why
and changes no code under tpsim/ (``.ci/run`` checks it):

    python tests/test_estimator_golden.py --diff    # what moved, per case and field
    python tests/test_estimator_golden.py --write   # the same, then the file rewritten
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parent / "data" / "estimator_golden.json"
REPO = Path(__file__).resolve().parents[1]
CPU_PROFILE = REPO / "profiles" / "cpu-reference-1t.csv"
PERMISSIVE = Path(__file__).resolve().parent / "data" / "permissive-stack.yaml"
RTOL = 1e-9

# (case id, model preset, model overrides, cluster, gpus, plan fields, compute ("roofline" | "profile"))
CASES: tuple[tuple[str, str, dict, str, int, dict, str], ...] = (
    ("gpt175-default", "gpt3-175b", {}, "dgx-a100", 1024, {}, "roofline"),
    ("gpt175-v2-z0-noovl", "gpt3-175b", {}, "dgx-a100", 1024,
     dict(tp=8, pp=16, vpp=2, sp=True, recompute="full", zero=0, overlap=False), "roofline"),
    ("gpt175-tp4-pp32-unfused", "gpt3-175b", {}, "dgx-a100", 512,
     dict(tp=4, pp=32, sp=False, recompute="full", attention="unfused", micro_batch=2, global_batch=512),
     "roofline"),
    ("gpt175-z3-order", "gpt3-175b", {"layers": 16}, "dgx-a100", 128,
     dict(tp=8, pp=2, zero=3, sp=True, recompute="selective", order="tp-pp-dp", global_batch=128), "roofline"),
    ("gpt175-tp16-crossnode", "gpt3-175b", {"layers": 16}, "dgx-a100", 64,
     dict(tp=16, pp=1, global_batch=64), "roofline"),
    ("gpt175-dp-tp-pp", "gpt3-175b", {"layers": 24}, "dgx-a100", 256,
     dict(tp=8, pp=4, order="dp-tp-pp", sp=True, zero=1, global_batch=256), "roofline"),
    ("gpt175-pp-dp-tp", "gpt3-175b", {"layers": 24}, "dgx-a100", 256,
     dict(tp=4, pp=8, order="pp-dp-tp", zero=2, micro_batch=2, global_batch=256), "roofline"),
    ("gpt175-fp16-h100", "gpt3-175b", {}, "dgx-h100", 256,
     dict(tp=8, pp=8, vpp=3, sp=True, recompute="selective", dtype="fp16", global_batch=512), "roofline"),
    ("gpt175-fp8-h100", "gpt3-175b", {}, "dgx-h100", 256,
     dict(tp=8, pp=16, sp=True, recompute="none", dtype="fp8", global_batch=256), "roofline"),
    ("gpt175-nofit", "gpt3-175b", {}, "dgx-a100", 64, dict(tp=8, pp=1, global_batch=64), "roofline"),
    ("mt1-default", "megatron-1t", {}, "selene", 3072, {}, "roofline"),
    ("mt1-sp-v2", "megatron-1t", {}, "selene", 1024,
     dict(tp=8, pp=32, vpp=2, sp=True, recompute="selective", zero=1, global_batch=1024), "roofline"),
    ("gpt13-default", "gpt3-1.3b", {}, "dgx-a100", 8, {}, "roofline"),
    ("gpt13-z2-mb8", "gpt3-1.3b", {}, "dgx-a100", 64,
     dict(tp=1, pp=1, zero=2, micro_batch=8, global_batch=512), "roofline"),
    ("gpt13-z3-noovl", "gpt3-1.3b", {}, "dgx-a100", 64,
     dict(tp=2, pp=1, zero=3, overlap=False, global_batch=128), "roofline"),
    ("gpt13-pp4-v3", "gpt3-1.3b", {}, "dgx-a100", 32,
     dict(tp=2, pp=4, vpp=3, sp=True, global_batch=128), "roofline"),
    ("gpt13-pp3-extra", "gpt3-1.3b", {"layers": 23}, "dgx-a100", 24,
     dict(tp=1, pp=3, micro_batch=2, global_batch=96), "roofline"),
    ("gpt13-pp2", "gpt3-1.3b", {}, "dgx-a100", 16,
     dict(tp=2, pp=2, recompute="full", global_batch=64), "roofline"),
    ("gpt13-fp32", "gpt3-1.3b", {"seq_len": 1024}, "dgx-a100", 8,
     dict(tp=2, pp=1, dtype="fp32", global_batch=32), "roofline"),
    ("gpt13-tf32", "gpt3-1.3b", {"seq_len": 1024}, "dgx-a100", 8,
     dict(tp=4, pp=1, sp=True, dtype="tf32", zero=1, global_batch=32), "roofline"),
    ("gpt13-pcie", "gpt3-1.3b", {}, "pcie-8gpu", 8, dict(tp=2, pp=1, sp=True, global_batch=64), "roofline"),
    ("gpt13-pcie-tp8", "gpt3-1.3b", {}, "pcie-8gpu", 8, dict(tp=8, pp=1, global_batch=64), "roofline"),
    ("gpt13-pcie-16", "gpt3-1.3b", {}, "pcie-8gpu", 16, dict(tp=4, pp=2, zero=1, global_batch=64), "roofline"),
    ("gpt13-tpu", "gpt3-1.3b", {}, "tpu-v4", 64, dict(tp=4, pp=2, sp=True, global_batch=128), "roofline"),
    ("gpt13-tpu-dp", "gpt3-1.3b", {}, "tpu-v4", 64, dict(tp=1, pp=1, zero=1, micro_batch=2, global_batch=128), "roofline"),
    ("gpt13-tpu-order", "gpt3-1.3b", {}, "tpu-v4", 64,
     dict(tp=8, pp=1, order="dp-tp-pp", global_batch=64), "roofline"),
    ("l8-default", "llama3-8b", {}, "dgx-h100", 64, {}, "roofline"),
    ("l8-tp1-z3", "llama3-8b", {}, "dgx-h100", 64, dict(tp=1, pp=1, sp=False, zero=3, global_batch=256), "roofline"),
    ("l8-tp4-pp2-full", "llama3-8b", {}, "dgx-h100", 64,
     dict(tp=4, pp=2, recompute="full", micro_batch=2, global_batch=256), "roofline"),
    ("l8-unfused", "llama3-8b", {"seq_len": 2048}, "dgx-h100", 16,
     dict(tp=2, pp=1, attention="unfused", global_batch=64), "roofline"),
    ("l8-fp8", "llama3-8b", {}, "hgx-h200", 16, dict(tp=2, pp=2, sp=True, dtype="fp8", global_batch=64),
     "roofline"),
    ("l8-h200-order", "llama3-8b", {}, "hgx-h200", 64,
     dict(tp=2, pp=4, order="pp-tp-dp", zero=1, global_batch=128), "roofline"),
    ("l8-gb200", "llama3-8b", {}, "gb200-nvl72", 72,
     dict(tp=4, pp=2, sp=True, zero=1, global_batch=144), "roofline"),
    ("l8-gb200-tp8", "llama3-8b", {}, "gb200-nvl72", 144,
     dict(tp=8, pp=1, sp=True, global_batch=144), "roofline"),
    ("l70-default", "llama3-70b", {}, "dgx-h100", 64, {}, "roofline"),
    ("l70-v4", "llama3-70b", {}, "dgx-h100", 128,
     dict(tp=8, pp=4, vpp=4, sp=True, zero=1, recompute="selective", global_batch=512), "roofline"),
    ("l70-tp16", "llama3-70b", {}, "dgx-h100", 64,
     dict(tp=16, pp=4, sp=True, zero=0, recompute="full", global_batch=64), "roofline"),
    ("l70-a100-z3", "llama3-70b", {}, "dgx-a100", 128,
     dict(tp=8, pp=1, zero=3, sp=True, recompute="full", global_batch=128), "roofline"),
    ("l70-h200", "llama3-70b", {}, "hgx-h200", 64,
     dict(tp=4, pp=4, sp=True, zero=1, recompute="selective", micro_batch=2, global_batch=256), "roofline"),
    ("l70-gb200", "llama3-70b", {}, "gb200-nvl72", 144,
     dict(tp=8, pp=2, sp=True, zero=1, global_batch=144), "roofline"),
    ("l405-small", "llama3-405b", {"layers": 32}, "dgx-h100", 256,
     dict(tp=8, pp=8, vpp=2, sp=True, zero=1, recompute="full", global_batch=256), "roofline"),
    ("l405-default-1k", "llama3-405b", {}, "dgx-h100", 1024,
     dict(tp=8, pp=16, vpp=4, sp=True, zero=1, recompute="full", global_batch=512), "roofline"),
    ("gqa-odd", "llama3-8b", {"layers": 7, "kv_heads": 2, "heads": 16, "hidden": 2048, "ffn": 5632,
                               "vocab": 32000, "seq_len": 1024}, "dgx-h100", 32,
     dict(tp=8, pp=2, sp=True, global_batch=64), "roofline"),
    ("cpu-roofline", "llama3-8b", {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn": 1024,
                                    "vocab": 1000, "seq_len": 128}, "local-cpu", 2,
     dict(tp=2, pp=1, sp=True, zero=0, dtype="fp32", global_batch=4), "roofline"),
    ("cpu-profile", "llama3-8b", {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn": 1024,
                                   "vocab": 1000, "seq_len": 128}, "local-cpu", 2,
     dict(tp=2, pp=1, sp=True, zero=0, dtype="fp32", global_batch=4), "profile"),
    ("cpu-profile-gpt", "gpt3-1.3b", {"layers": 2, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 1000,
                                       "seq_len": 256}, "local-cpu", 2,
     dict(tp=2, pp=1, dtype="fp32", attention="unfused", micro_batch=1, global_batch=2), "profile"),
    ("cpu-profile-pp", "gpt3-1.3b", {"layers": 2, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 1000,
                                      "seq_len": 256}, "local-cpu", 4,
     dict(tp=1, pp=2, dtype="fp32", zero=1, global_batch=8), "profile"),
    ("h100-profile-warn", "llama3-8b", {"layers": 4}, "dgx-h100", 16,
     dict(tp=2, pp=1, sp=True, dtype="fp32", global_batch=16), "profile"),
    ("gpt175-selene-sc21ish", "gpt3-175b", {}, "selene", 384,
     dict(tp=8, pp=8, sp=False, recompute="full", attention="unfused", dtype="fp16", overlap=False,
          global_batch=192), "roofline"),
    ("gpt13-big-mb", "gpt3-1.3b", {}, "dgx-h100", 32,
     dict(tp=1, pp=4, vpp=2, micro_batch=4, global_batch=512), "roofline"),
    # training stacks (issue 10): FSDP2 per block with pp, DeepSpeed ZeRO-2/3 per parameter
    ("l8-torchtitan-z3-pp", "llama3-8b", {}, "dgx-h100", 64,
     dict(tp=2, pp=2, sp=True, zero=3, global_batch=256), "roofline", "torchtitan"),
    ("l8-torchtitan-z2-pp", "llama3-8b", {}, "dgx-h100", 64,
     dict(tp=2, pp=2, sp=True, zero=2, global_batch=256), "roofline", "torchtitan"),
    ("l8-torchtitan-fsdp", "llama3-8b", {}, "dgx-h100", 64,
     dict(tp=1, pp=1, sp=False, zero=3, global_batch=256), "roofline", "torchtitan"),
    ("gpt13-deepspeed-z3", "gpt3-1.3b", {}, "dgx-a100", 64,
     dict(tp=1, pp=1, zero=3, global_batch=256), "roofline", "deepspeed"),
    ("gpt13-deepspeed-z2", "gpt3-1.3b", {}, "dgx-a100", 64,
     dict(tp=1, pp=1, zero=2, micro_batch=2, global_batch=512), "roofline", "deepspeed"),
)

# one batch through estimate_batch (every array field), over a small search space of a 32-GPU H100 cluster
BATCH_CASE = ("llama3-8b", {"layers": 8}, "dgx-h100", 32, 128)
ARRAY_FIELDS = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                "peak_memory_gib", "fits", "compute_s", "recompute_s", "bubble_s", "optimizer_s",
                "exposed_comm_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "mem_weights_gib", "mem_grads_gib",
                "mem_optimizer_states_gib", "mem_activations_gib", "mem_other_gib", "measured_compute_fraction")
def _problem(case):
    from tpsim.compute.profile import ProfileModel
    from tpsim.estimator.context import default_compute
    from tpsim.model import load_model, with_overrides
    from tpsim.plan import make_plan
    from tpsim.stacks import load_stack
    from tpsim.topology import load_cluster

    _cid, preset, overrides, cluster_name, gpus, fields, compute = case[:7]
    model = with_overrides(load_model(preset), **{("seq_len" if k == "seq_len" else k): v
                                                  for k, v in overrides.items()})
    cluster = load_cluster(cluster_name, gpus=gpus)
    plan = make_plan(model, gpus, **fields)
    if len(case) > 7:
        stack = load_stack(case[7])
    else:
        stack = load_stack("megatron")
        if stack.plan_violation(plan, model):
            stack = load_stack(PERMISSIVE)
    cm = (ProfileModel(CPU_PROFILE, fallback=default_compute(cluster.device, stack)[0]) if compute == "profile"
          else None)
    return model, cluster, plan, cm, stack


def _batch_problem():
    from tpsim.model import load_model, with_overrides
    from tpsim.search import SearchSpace, enumerate_plans, violations
    from tpsim.topology import load_cluster

    preset, overrides, cluster_name, gpus, gbs = BATCH_CASE
    model = with_overrides(load_model(preset), **overrides)
    cluster = load_cluster(cluster_name, gpus=gpus)
    # cp=1: the snapshot predates context parallelism (dense plans; cp > 1 plans are tested in test_estimator_cpep)
    space = SearchSpace(vpp=(1, 2), micro_batch=(1, 2), cp=(1,), order=("tp-dp-pp", "dp-tp-pp", "pp-tp-dp"))
    enum = enumerate_plans(model, gpus, gbs, space)
    plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, gpus) == 0)[::17])  # ~270 varied plans
    return model, cluster, plans


def produce() -> dict[str, Any]:
    """Every field of every case, as the current estimator gives it."""
    from tpsim.estimator import estimate, estimate_batch

    out: dict[str, Any] = {"cases": {}, "batch": {}}
    for case in CASES:
        model, cluster, plan, cm, stack = _problem(case)
        out["cases"][case[0]] = estimate(model, cluster, plan, compute=cm, stack=stack).to_dict()
    model, cluster, plans = _batch_problem()
    batch = estimate_batch(model, cluster, plans)
    out["batch"] = {name: np.asarray(getattr(batch, name)).astype(float).tolist() for name in ARRAY_FIELDS}
    return out


def _compare(expected: Any, got: Any, where: str, problems: list[str]) -> None:
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            problems.append(f"{where}: expected a mapping, got {got!r}")
            return
        for key, value in expected.items():
            if key not in got:
                problems.append(f"{where}.{key}: missing")
            else:
                _compare(value, got[key], f"{where}.{key}", problems)
        return
    if isinstance(expected, list):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            problems.append(f"{where}: expected {len(expected)} items, got {got!r}")
            return
        for i, (e, g) in enumerate(zip(expected, got)):
            _compare(e, g, f"{where}[{i}]", problems)
        return
    if isinstance(expected, float) and not isinstance(expected, bool):
        ok = (math.isnan(expected) and math.isnan(got)) or math.isclose(got, expected, rel_tol=RTOL, abs_tol=0.0)
        if not ok:
            problems.append(f"{where}: expected {expected!r}, got {got!r}")
        return
    if expected != got:
        problems.append(f"{where}: expected {expected!r}, got {got!r}")


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def _json(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_single_plan_matches_the_snapshot(golden, case):
    from tpsim.estimator import estimate

    model, cluster, plan, cm, stack = _problem(case)
    got = _json(estimate(model, cluster, plan, compute=cm, stack=stack).to_dict())
    expected = golden["cases"][case[0]]
    problems: list[str] = []
    _compare(expected, got, case[0], problems)
    assert not problems, "\n".join(problems[:20])


def test_moved_names_each_case_and_field():
    old = {"cases": {"a": {"step_time_s": 1.0, "plan": {"tp": 8}}, "gone": {}}, "batch": {}}
    new = {"cases": {"a": {"step_time_s": 1.5, "plan": {"tp": 8}, "terms": {}}}, "batch": {}}
    assert moved(old, new) == ["cases.a.step_time_s: 1.0 -> 1.5 (+50%)", "cases.a.terms: added", "cases.gone: removed"]
    assert moved(new, new) == []


def test_batch_matches_the_snapshot(golden):
    from tpsim.estimator import estimate_batch

    model, cluster, plans = _batch_problem()
    batch = estimate_batch(model, cluster, plans)
    problems: list[str] = []
    for name in ARRAY_FIELDS:
        _compare(golden["batch"][name], np.asarray(getattr(batch, name)).astype(float).tolist(), name, problems)
    assert len(plans) > 64  # a batch above the old 64-plan switch
    assert not problems, "\n".join(problems[:20])


def moved(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two snapshots, one line per case (or batch array) and field, with both values and
    the relative change; new and removed fields and cases too."""
    lines: list[str] = []
    for section in ("cases", "batch"):
        a, b = old.get(section, {}), new.get(section, {})
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                lines.append(f"{section}.{name}: {'added' if name in b else 'removed'}")
                continue
            problems: list[str] = []
            _compare(a[name], b[name], f"{section}.{name}", problems)
            extra = set(b[name]) - set(a[name]) if isinstance(b[name], dict) and isinstance(a[name], dict) else ()
            lines += [_with_change(p) for p in problems] + [f"{section}.{name}.{k}: added" for k in sorted(extra)]
    return lines


def _with_change(problem: str) -> str:
    """``where: expected X, got Y`` as ``where: X -> Y (+z%)`` where both are numbers."""
    where, _, rest = problem.partition(": expected ")
    old, sep, new = rest.partition(", got ")
    try:
        a, b = float(old), float(new)
    except ValueError:
        return problem
    pct = f" ({100 * (b / a - 1):+.4g}%)" if a not in (0.0,) and math.isfinite(a) and math.isfinite(b) else ""
    return f"{where}: {old} -> {new}{pct}" if sep else problem


if __name__ == "__main__":
    # regenerate: python tests/test_estimator_golden.py --write (prints what moved, per case and field, then
    # writes); --diff prints only. Commit a regeneration alone, with no code under tpsim/ (.ci/run checks it).
    if sys.argv[1:] not in (["--write"], ["--diff"]):
        sys.exit(__doc__)
    fresh = _json(produce())
    previous = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    changes = moved(previous, fresh)
    print("\n".join(changes) if changes else "nothing moved")
    print(f"{len(changes)} field(s) moved")
    if sys.argv[1] == "--write":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
