"""``tpsim validate`` pieces that need no process group: cases, the DTensor rules of the cost model, the
report, the launcher's error handling, the CLI's input errors, shapes off the profile's grid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpsim.errors import InputError
from tpsim.model import PRESETS, with_overrides
from tpsim.tp_plan import count_by_kind, layer_collectives
from tpsim.validate.block.case import Case
from tpsim.validate.launch import LaunchConfig, first_error
from tpsim.validate.block.predict import Prediction, block_gemms, grid_hits
from tpsim.validate.block.report import layer_errors, summarize_case, write_atomic, write_csv
from tpsim.validate.run import matrix_cases
from tpsim.validate.block.scale import fit_case, memory_per_rank

GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=512, heads=8, seq_len=128)
LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=512, heads=8, kv_heads=2, ffn=1792, seq_len=128)


def test_dtensor_rules_per_layer():
    """What CommDebugMode counted on torch 2.13 (tests/test_validate_distributed.py checks it live)."""
    def counts(model, sp, fused):
        return count_by_kind(layer_collectives(model, 2, sp, flavor="dtensor", fused=fused))
    assert counts(GPT, False, False) == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 4}}
    assert counts(LLAMA, False, False) == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 5}}
    assert counts(LLAMA, False, True) == {"fwd": {"all_reduce": 2}, "bwd": {"all_reduce": 2}}
    both = {"all_gather": 2, "reduce_scatter": 2}
    for model in (GPT, LLAMA):  # no per-layer norm-gradient all-reduce: DTensor leaves them Partial
        assert counts(model, True, False) == {"fwd": both, "bwd": both}
    assert layer_collectives(GPT, 1, False, flavor="dtensor") == []


def test_case_bytes_follow_nccl_tests_convention():
    case = Case(model=GPT, tp=2, sp=True, micro_batch=3)
    act = 3 * 128 * 512 * 4
    assert case.expected_bytes() == {"fwd": {"all_gather": 2 * act, "reduce_scatter": 2 * act},
                                     "bwd": {"all_gather": 2 * act, "reduce_scatter": 2 * act}}
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=3), "tp=3 does not divide num_attention_heads=8"),
    (dict(tp=1, sp=True), "--sp needs tp > 1"),
    (dict(tp=2, micro_batch=0), "micro_batch=0"),
    (dict(tp=2, reps=-1), "reps=-1"),
])
def test_case_rejects_bad_input(kwargs, match):
    with pytest.raises(InputError, match=match):
        Case(model=GPT, **kwargs)


def test_kv_heads_replicated_only_when_they_divide_tp():
    Case(model=with_overrides(LLAMA, kv_heads=1), tp=2)  # replicated
    with pytest.raises(InputError, match="tp=4 does not divide num_kv_heads=6"):
        Case(model=with_overrides(LLAMA, heads=24, kv_heads=6, hidden=1536), tp=4)


def test_matrix_shapes_and_off_grid():
    cases = matrix_cases(GPT)
    assert len(cases) == 6 + 12  # tp=1 without sp; tp=2 with and without
    assert {c.model.hidden_size for c in cases} == {512, 1024, 2048}
    assert {c.model.seq_len for c in cases} == {128, 512}
    assert all(c.model.num_attention_heads * 64 == c.model.hidden_size for c in cases)
    # token counts 3 x 2^k are never powers of two nor 5 x 2^j: no GEMM of the block is a profile point
    for c in cases:
        tokens = c.tokens
        assert tokens & (tokens - 1) and (tokens % 5 or (tokens // 5) & (tokens // 5 - 1))
    profile = sorted(Path(__file__).resolve().parents[1].glob("profiles/cpu-*.csv"))
    if profile:
        assert all(grid_hits(c, profile[-1]) == [] for c in cases)


def test_block_gemms_cover_forward_and_backward():
    case = Case(model=LLAMA, tp=2, micro_batch=3)
    shapes = block_gemms(case)
    assert (384, 256, 512) in shapes      # wq forward: tokens x q/tp x h
    assert (256, 512, 384) in shapes      # wq weight gradient
    assert (384, 512, 896) in shapes      # w2 forward: tokens x h x f/tp
    assert len(shapes) == 3 * 7           # q, k, v, w1, w3, wo, w2


def test_scaling_shortens_sequence_then_batch():
    from tpsim.compute.roofline import RooflineModel
    from tpsim.hardware import get_device

    compute = RooflineModel(get_device("H100-SXM"))
    model = PRESETS["llama3-8b"]
    case = Case(model=model, tp=2, micro_batch=3)
    fitted = fit_case(case, 2, compute, budget_s=1e9, memory_bytes=32 * 2**30)
    assert fitted.model.hidden_size == 4096 and fitted.model.ffn_hidden_size == 14336
    assert fitted.model.seq_len < 8192 and "seq_len 8192->" in fitted.scaled
    assert memory_per_rank(fitted) <= 0.5 * 32 * 2**30 / 2
    assert fit_case(case, 2, compute, budget_s=1e9, memory_bytes=2**50) == case
    with pytest.raises(InputError, match="GiB per rank"):
        fit_case(Case(model=PRESETS["llama3-405b"], tp=2), 2, compute, 1e9, memory_bytes=2**30)


def _rank(case, fwd=0.01, bwd=0.02, counts=None, err=1e-6):
    return {"case": case.name, "numerics": {"output": err}, "numerics_ok": err <= 1e-4,
            "counts": counts if counts is not None else case.expected_counts(),
            "bytes": case.expected_bytes(), "fwd_s": fwd, "bwd_s": bwd, "fwd_all_s": [fwd], "bwd_all_s": [bwd],
            "fwd_wall_all_s": [fwd], "bwd_wall_all_s": [bwd], "fwd_delay_all_s": [0.0], "bwd_delay_all_s": [0.0],
            "comm_s": {"fwd:all_reduce": 0.001}, "comm_calls": [[("fwd:all_reduce", 0.001)]]}


def test_summary_errors_and_mismatch():
    case = Case(model=GPT, tp=2)
    pred = Prediction(fwd_s=0.012, bwd_s=0.018, comm_s={"fwd:all_reduce": 0.002},
                      counts=case.expected_counts(), compute_model="roofline", measured_compute_fraction=0)
    s = summarize_case(case, [_rank(case), _rank(case, fwd=0.015)], pred)
    phases = {p["name"]: p for p in s["phases"]}
    assert phases["fwd"]["measured_s"] == 0.015  # slowest rank
    assert phases["fwd"]["error_pct"] == pytest.approx(-20.0)
    assert phases["fwd+bwd"]["error_pct"] == pytest.approx(100 * (0.03 - 0.035) / 0.035)
    assert phases["fwd:all_reduce"]["error_pct"] == pytest.approx(100.0)
    assert s["numerics_ok"] and s["collectives_match"]
    bad = summarize_case(case, [_rank(case, counts={"fwd": {"all_reduce": 3}, "bwd": {}}), _rank(case)], pred)
    assert not bad["collectives_match"]
    assert not summarize_case(case, [_rank(case, err=1e-3)], pred)["numerics_ok"]
    errs = layer_errors([s, s])
    assert errs["cases"] == 2 and errs["worst_abs_error_pct"] == pytest.approx(abs(phases["fwd+bwd"]["error_pct"]))


def test_csv_written_atomically(tmp_path, monkeypatch):
    case = Case(model=GPT, tp=2)
    pred = Prediction(0.01, 0.02, {"fwd:all_reduce": 0.001}, case.expected_counts(), "roofline", 0.0)
    s = summarize_case(case, [_rank(case)], pred)
    path = tmp_path / "v.csv"
    write_csv(path, [s], "gloo")
    good = path.read_text()
    assert good.splitlines()[0].startswith("case,kind,model,family,tp,sp,pp,vpp,dp,zero")
    assert len(good.splitlines()) == 1 + len(s["phases"])

    def boom(*_a, **_k):
        raise KeyboardInterrupt
    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, b"half")
    assert path.read_text() == good and not list(tmp_path.glob(".*tmp"))


def test_first_error_prefers_the_cause(tmp_path):
    (tmp_path / "error-rank0.json").write_text(json.dumps(
        {"rank": 0, "time": 1.0, "type": "RuntimeError", "message": "Connection closed by peer [127.0.0.1]"}))
    (tmp_path / "error-rank1.json").write_text(json.dumps(
        {"rank": 1, "time": 2.0, "type": "ValueError", "message": "shape mismatch"}))
    assert first_error(tmp_path)["rank"] == 1
    (tmp_path / "error-rank1.json").unlink()
    assert first_error(tmp_path)["rank"] == 0
    assert first_error(tmp_path / "nothing") is None


def test_a_crash_in_teardown_keeps_the_gathered_results(tmp_path):
    """Rank 0 writes result.json only after gathering every rank's results; a rank that then dies in C++ static
    teardown (SIGABRT, seen on gloo) must not throw the measurements away, but a run without a result must fail."""
    from tpsim.validate.launch import RankFailure, _collect

    log = tmp_path / "launcher.log"
    log.write_text("terminate called without an active exception\nChildFailedError\n")
    with pytest.raises(RankFailure, match="status 1"):
        _collect(1, tmp_path, log, False)
    (tmp_path / "result.json").write_text(json.dumps({"meta": {"world": 2}, "ranks": [[], []]}))
    result = _collect(1, tmp_path, log, False)
    assert result["meta"] == {"world": 2, "launcher_status": 1}
    (tmp_path / "error-rank1.json").write_text(json.dumps(
        {"rank": 1, "time": 2.0, "type": "ValueError", "message": "shape mismatch"}))
    with pytest.raises(RankFailure, match="rank 1 failed: ValueError: shape mismatch"):
        _collect(1, tmp_path, log, False)


def test_launch_command_never_uses_a_fixed_port(tmp_path):
    cmd = LaunchConfig(nproc=2).command(tmp_path / "job.json")
    assert "--standalone" in cmd and not any("rdzv-endpoint" in c or "master-port" in c for c in cmd)
    multi = LaunchConfig(nproc=8, nnodes=2, rdzv_endpoint="node0:29400", timeout_s=45).command(tmp_path / "j")
    assert "--nnodes=2" in multi and "--rdzv-endpoint=node0:29400" in multi
    assert "--rdzv-conf=join_timeout=45" in multi
    with pytest.raises(InputError, match="--nnodes=2 needs --rdzv-endpoint"):
        LaunchConfig(nproc=8, nnodes=2)
    with pytest.raises(InputError, match="--backend='mpi'"):
        LaunchConfig(nproc=2, backend="mpi")


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "tp=3 does not divide num_attention_heads"),
    (["--tp", "2", "--nproc", "4"], "--nproc=4 x --nnodes=1 must equal tp x pp x dp = 2"),
    (["--model", "no-such-model"], "model='no-such-model'"),
    (["--tp", "1", "--sp"], "--sp needs tp > 1"),
])
def test_cli_bad_input_is_one_line_exit_2(args, message, capsys):
    """The first case in a real process (the exit status and no traceback end to end), the others through the
    CLI's main() in this process (the same parser and error handler, without a fresh interpreter each)."""
    if args == ["--tp", "3"]:
        proc = subprocess.run([sys.executable, "-m", "tpsim.cli", "validate", *args], capture_output=True,
                              text=True, timeout=60)
        code, err = proc.returncode, proc.stderr
    else:
        from tpsim.cli import main
        try:
            code = main(["validate", *args])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err


def test_package_top_level_is_torch_free():
    code = "import sys, tpsim.validate, tpsim.cli.validate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_overhead_twin_keeps_the_configuration():
    from tpsim.validate.overhead import measured_overhead, overhead_case, with_overhead

    case = Case(model=LLAMA, tp=2, sp=True, fused=True, micro_batch=3)
    twin = overhead_case(case)
    assert (twin.tp, twin.sp, twin.fused, twin.model.family) == (2, True, True, "llama")
    assert twin.model.num_kv_heads < twin.model.num_attention_heads  # still GQA
    assert twin.model.hidden_size == 128 and twin.model.seq_len == 16 and twin.micro_batch == 1
    assert twin.expected_counts() == case.expected_counts()
    assert twin.name != case.name
    pred = Prediction(0.001, 0.002, {}, twin.expected_counts(), "roofline", 0.0)
    ranks = [dict(_rank(twin, fwd=0.005, bwd=0.004))]
    over = measured_overhead(ranks, pred)
    assert over == pytest.approx({"fwd": 0.004, "bwd": 0.002})
    assert with_overhead(pred, over).fwd_s == pytest.approx(0.005)
    assert measured_overhead([_rank(twin, fwd=0.0005, bwd=0.0005)], pred) == {"fwd": 0.0, "bwd": 0.0}


def test_shard_model_is_one_rank_of_tp():
    from tpsim.validate.shard import shard_model

    base = PRESETS["llama3-8b"]
    for t in (2, 4, 8):
        m = shard_model(base, t)
        assert (m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size) == (32 // t, max(8 // t, 1), 14336 // t)
        assert m.head_dim == 128 and m.hidden_size == 4096
        # its tp=1 GEMMs are the per-rank GEMMs of tp=t
        assert sorted(block_gemms(Case(model=m, tp=1))) == sorted(block_gemms(Case(model=base, tp=t)))
    assert shard_model(base, 1) is base
    with pytest.raises(InputError, match="--shard-of=3 does not divide num_attention_heads=32"):
        shard_model(base, 3)


def test_step_check_sees_optimizer_errors_not_rounding():
    """The Adam-update check of whole-plan runs: a norm weight of 1.0 with tiny gradients (1e-5) moves by less than the
    weight's own rounding allows to be read exactly; that (and the slope lr/eps times the gradient's difference)
    is not the optimizer's error, but a missing average over dp (the update of 2 x the gradient) or a stale shard is."""
    torch = pytest.importorskip("torch")
    from tpsim.validate.plan.run import STEP_RTOL, _step_err
    from tpsim.validate.plan.stack import ADAM_EPS, ADAM_LR

    gen = torch.Generator().manual_seed(0)
    weight = torch.ones(1024)
    grad = 1e-5 * torch.randn(1024, generator=gen)

    def update(g: torch.Tensor) -> torch.Tensor:  # first Adam step, read back as a difference of fp32 weights
        return (weight - ADAM_LR * g / (g.abs() + ADAM_EPS)) - weight

    ref = update(grad)
    exact = update(grad.double()).float()  # the same update without the weight's rounding
    assert (exact - ref).abs().max() / ref.abs().max() > STEP_RTOL  # what the old check called a failure
    assert _step_err(ref, exact, weight, grad, grad) < 1e-6
    noisy = grad * (1 + 1e-6 * torch.randn(1024, generator=gen))  # rounding-level gradient difference
    assert _step_err(update(noisy), ref, weight, noisy, grad) < 1e-6
    assert _step_err(update(2 * grad), ref, weight, grad, grad) > 10 * STEP_RTOL  # dp average missing
    stale = ref.clone()
    stale[:512] = 0.0  # half of the parameter never updated (a shard not written back)
    assert _step_err(stale, ref, weight, grad, grad) > 10 * STEP_RTOL
