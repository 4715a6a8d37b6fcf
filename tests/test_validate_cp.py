"""Context/expert-parallel validation without a process group: the load-balanced layout, the ring's step
decomposition and merge (simulated rank by rank against plain causal attention), the attention formulas, the
expected collectives derived from tpsim.comm_plan, the cases' input checks and the prediction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tpsim.errors import InputError  # noqa: E402
from tpsim.model import PRESETS, with_overrides  # noqa: E402
from tpsim.validate.axis.case import AxisCase, metadata_comm, moe_layer_model, with_expert_ffn  # noqa: E402
from tpsim.validate.modules.cp_attention import (attend, attend_backward, attention_backward,  # noqa: E402
                                         attention_backward_math, attention_math, attention_with_lse, chunk_ids,
                                         merge_step, positions, shard_sequence, step_parts)

LLAMA = with_overrides(PRESETS["llama3-8b"], hidden=256, heads=4, kv_heads=2, ffn=512, seq_len=64, layers=1)
GPT = with_overrides(PRESETS["gpt3-1.3b"], hidden=256, heads=4, seq_len=64, layers=1)
MIXTRAL = with_expert_ffn(moe_layer_model(with_overrides(PRESETS["mixtral-8x7b"], hidden=128, heads=4, kv_heads=2,
                                                         ffn=256, seq_len=64, layers=1)), 96)


# ---- layout ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_each_rank_holds_chunks_r_and_2cp_minus_1_minus_r(cp):
    seq = 8 * cp
    held = [positions(seq, cp, r) for r in range(cp)]
    assert sorted(torch.cat(held).tolist()) == list(range(seq))  # a partition of the sequence
    c = seq // (2 * cp)
    for r, pos in enumerate(held):
        a, b = chunk_ids(cp, r)
        assert pos.tolist() == list(range(a * c, (a + 1) * c)) + list(range(b * c, (b + 1) * c))
    x = torch.arange(2 * seq).view(2, seq)
    assert torch.equal(shard_sequence(x, cp, cp - 1), x[:, held[cp - 1]])


def _blocks(cp: int, n: int, dk: int, dv: int, heads: int = 4, kv_heads: int = 4, dtype=torch.float64):
    gen = torch.Generator().manual_seed(cp)
    q = torch.randn(1, heads, n, dk, generator=gen, dtype=dtype)
    k = torch.randn(1, kv_heads, n, dk, generator=gen, dtype=dtype)
    return q, k, torch.randn(1, kv_heads, n, dv, generator=gen, dtype=dtype)


def _causal(q, k, v):
    """Plain causal attention (grouped-query heads repeated, key and value dims free: the math backend)."""
    rep = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                            is_causal=True)


@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("dk, dv, kv_heads", [(8, 8, 4), (12, 8, 2)], ids=["mha", "gqa-mla-dims"])
def test_ring_steps_merged_rank_by_rank_equal_causal_attention(cp, dk, dv, kv_heads):
    """Forward: every rank's cp steps (its own block causally, lower ranks' first chunks, the second query chunk
    on higher ranks' blocks), merged by log-sum-exp, give exactly its rows of causal attention; backward: each
    step's flash gradient with the merged output and lse, dK/dV summed at the block's home rank, give the
    gradients of causal attention. Also with grouped-query heads and value heads narrower than the keys (MLA)."""
    seq = 8 * cp
    q, k, v = _blocks(cp, seq, dk, dv, kv_heads=kv_heads)
    rep = q.shape[1] // k.shape[1]
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    ref = _causal(qf, kf, vf)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    pos = [positions(seq, cp, r) for r in range(cp)]
    local = lambda t, r: t[:, :, pos[r]]  # noqa: E731
    kv = [(local(k, r), local(v, r)) for r in range(cp)]
    half = seq // cp // 2
    outs, lses = [], []
    for r in range(cp):
        out = lse = None
        for step in range(cp):
            qs, ks, vs, rows, _cols, causal = step_parts(step, r, half, local(q, r), *kv[(r - step) % cp])
            o, l = attend(qs, ks, vs, causal, rep)
            if out is None:
                out, lse = o.clone(), l.clone()
            else:
                merge_step(out, lse, o, l, rows)
        torch.testing.assert_close(out, local(ref.detach(), r), rtol=0, atol=1e-12)
        outs.append(out)
        lses.append(lse)
    dk_ = [torch.zeros_like(kv[r][0]) for r in range(cp)]
    dv_ = [torch.zeros_like(kv[r][1]) for r in range(cp)]
    for r in range(cp):
        dq = torch.zeros_like(local(q, r))
        for step in range(cp):
            owner = (r - step) % cp
            qs, ks, vs, rows, cols, causal = step_parts(step, r, half, local(q, r), *kv[owner])
            g = attend_backward(local(dout, r)[:, :, rows], qs, ks, vs, outs[r][:, :, rows], lses[r][:, :, rows],
                                causal, rep)
            dq[:, :, rows] += g[0]
            dk_[owner][:, :, cols] += g[1]
            dv_[owner][:, :, cols] += g[2]
        torch.testing.assert_close(dq, local(qf.grad, r), rtol=0, atol=1e-12)
    for r in range(cp):
        torch.testing.assert_close(dk_[r], local(kf.grad, r), rtol=0, atol=1e-12)
        torch.testing.assert_close(dv_[r], local(vf.grad, r), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_written_out_attention_equals_the_flash_kernel(causal):
    """The formulas used off CPU equal the CPU flash kernel, forward (output, lse) and backward."""
    q, k, v = _blocks(2, 16, 8, 8)
    out, lse = attention_with_lse(q, k, v, causal)
    out_m, lse_m = attention_math(q, k, v, causal)
    torch.testing.assert_close(out_m, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse_m, lse, rtol=0, atol=1e-12)
    dout = torch.randn_like(out)
    for got, want in zip(attention_backward_math(dout, q, k, v, out, lse, causal),
                         attention_backward(dout, q, k, v, out, lse, causal)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ---- expected collectives ----------------------------------------------------------------------------------
def _kv_bytes(model, tokens):
    return tokens * model.num_kv_heads * 2 * model.head_dim * 4


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_ring_messages_per_rank(cp):
    """TransformerEngine's p2p schedule, one rank: forward cp - 1 K/V blocks; backward one K/V block, cp - 2
    of K/V with dK/dV, one dK/dV; each a send and a receive of the message."""
    model = with_overrides(LLAMA, seq_len=16 * cp)
    case = AxisCase(model=model, cp=cp, micro_batch=3)
    kv = _kv_bytes(model, 3 * 16)
    want = {"fwd": (cp - 1, (cp - 1) * kv), "bwd": (cp, 2 * kv + (cp - 2) * 2 * kv)}
    got = case.expected_comm()
    assert set(got) == {"cp"}
    for phase, (n, nbytes) in want.items():
        for op in ("send", "recv"):
            assert got["cp"][phase][op] == {"n": n, "bytes": nbytes}


def test_ulysses_all_to_alls_per_rank():
    """q, k, v and the output each way: the rank's tokens of all its heads (q and o: 4 heads, k and v: 2)."""
    case = AxisCase(model=LLAMA, cp=2, cp_kind="a2a", micro_batch=3)
    tokens = 3 * 64 // 2
    q, kv = tokens * 4 * 64 * 4, tokens * 2 * 64 * 4
    for phase in ("fwd", "bwd"):
        assert case.expected_comm()["cp"][phase] == {"all_to_all": {"n": 4, "bytes": 2 * q + 2 * kv}}


def test_expert_parallel_messages_with_and_without_a_load():
    """Dispatch and combine each way, tokens x top-k x hidden x 4 B balanced; with a rank's load, the combine and
    the dispatch's gradient carry what its experts processed; the counts all-gather is the metadata."""
    case = AxisCase(model=MIXTRAL, ep=2, dp=2, micro_batch=2)
    copies = 2 * 64 * 2
    assert case.routed_copies == copies
    per_copy = 128 * 4
    balanced = case.expected_comm()["ep"]
    for phase in ("fwd", "bwd"):
        assert balanced[phase]["all_to_all"] == {"n": 2, "bytes": 2 * copies * per_copy}
    assert balanced["fwd"]["all_gather"] == {"n": 1, "bytes": 2 * 8 * 8}
    assert "all_gather" not in balanced["bwd"]
    loaded = case.expected_comm(load=copies + 10)["ep"]
    for phase in ("fwd", "bwd"):
        assert loaded[phase]["all_to_all"]["bytes"] == (2 * copies + 10) * per_copy
    assert [op.tensor for op in metadata_comm(case)] == ["expert counts"]
    assert metadata_comm(AxisCase(model=MIXTRAL, cp=2)) == []


def test_cp_and_ep_on_the_same_two_ranks():
    case = AxisCase(model=MIXTRAL, cp=2, ep=2)
    assert case.world == 2 and case.dp == 1 and case.kind == "cp+ep"
    assert set(case.expected_comm()) == {"cp", "ep"}
    assert case.coords(1) == {"cp": 1, "dp": 0, "ep": 1, "edp": 0}


@pytest.mark.parametrize("fields, match", [
    (dict(model=LLAMA), "cp > 1 or ep > 1"),
    (dict(model=LLAMA, ep=2, dp=2), "no experts"),
    (dict(model=MIXTRAL, ep=8, dp=8), "at least 2 per rank"),
    (dict(model=dataclasses.replace(MIXTRAL, capacity_factor=1.25), ep=2, dp=2), "dropless"),
    (dict(model=with_overrides(LLAMA, seq_len=66), cp=2), "multiple of 2 x cp"),
    (dict(model=with_overrides(LLAMA, kv_heads=1), cp=2, cp_kind="a2a"), "kv heads"),
    (dict(model=LLAMA, cp=2, cp_kind="zigzag"), "cp_kind"),
    (dict(model=moe_layer_model(PRESETS["deepseek-v3"]), cp=2, cp_kind="a2a"), "only with the ring"),
    (dict(model=MIXTRAL, ep=2), "does not divide tp x cp x dp"),
])
def test_bad_cases_are_refused_in_one_line(fields, match):
    with pytest.raises(InputError, match=match) as err:
        AxisCase(**fields)
    assert "\n" not in str(err.value)


def test_case_round_trips_through_json():
    import json
    case = AxisCase(model=MIXTRAL, cp=2, cp_kind="a2a", ep=2, micro_batch=2, reps=3)
    assert AxisCase.from_dict(json.loads(json.dumps(case.to_dict()))) == case


# ---- prediction --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def machine():
    from tpsim.compute.roofline import RooflineModel
    from tpsim.topology import load_cluster
    cluster = load_cluster("local-cpu", gpus=2)
    return cluster, RooflineModel(cluster.device)


def test_ring_exchanges_hide_behind_attention_all_to_alls_do_not(machine):
    from tpsim.validate.axis.predict import predict_axis
    model = with_overrides(LLAMA, hidden=1024, heads=16, kv_heads=4, seq_len=2048)
    ring = predict_axis(AxisCase(model=model, cp=2), *machine)
    a2a = predict_axis(AxisCase(model=model, cp=2, cp_kind="a2a"), *machine)
    assert ring.comm_s["fwd:cp:send_recv"] > 0 and ring.comm_s["bwd:cp:send_recv"] > 0
    assert ring.exposed_s["fwd"] <= ring.comm_s["fwd:cp:send_recv"]
    assert a2a.exposed_s["fwd"] == pytest.approx(a2a.comm_s["fwd:cp:all_to_all"])
    assert a2a.fwd_s == pytest.approx(a2a.fwd_compute_s + a2a.exposed_s["fwd"])


@settings(max_examples=15, deadline=None)
@given(extra=st.integers(min_value=0, max_value=256))
def test_more_routed_copies_never_predict_less_time(machine, extra):
    from tpsim.validate.axis.predict import predict_axis
    case = AxisCase(model=MIXTRAL, ep=2, dp=2, micro_batch=2)
    base = predict_axis(case, *machine, load=case.routed_copies)
    more = predict_axis(case, *machine, load=case.routed_copies + extra)
    assert more.fwd_s >= base.fwd_s and more.bwd_s >= base.bwd_s
    assert more.imbalance["run"] == pytest.approx(1 + extra / case.routed_copies)
    assert base.imbalance["estimator"] > 1.0  # the trained-router factor of tpsim/data/moe.yaml, reported beside


def test_prediction_without_a_load_is_the_estimators(machine):
    """Without a measured load the layer's compute is the estimator's layer_cost (its imbalance factor)."""
    from tpsim.estimator.layer import layer_cost
    from tpsim.model import LayerKind
    from tpsim.validate.axis.predict import predict_axis
    case = AxisCase(model=MIXTRAL, ep=2, dp=2, micro_batch=2)
    pred = predict_axis(case, *machine)
    a = lambda x: np.asarray([x])  # noqa: E731
    lc = layer_cost(MIXTRAL, machine[1], tp=a(1), sp=a(False), micro_batch=a(2), recompute=a(0), dtype="fp32",
                    attention="flash", fused=False, cp=a(1), cp_kind=a(0), ep=a(2), etp=a(0),
                    kind=LayerKind(moe=True, window=0))
    assert pred.fwd_compute_s == pytest.approx(float(lc.fwd[0]))
    assert pred.bwd_compute_s == pytest.approx(float(lc.bwd[0]))


def test_validate_top_skips_plans_the_whole_plan_run_cannot_execute():
    """--validate-top picks among plans without cp/ep (those are checked per layer), keeping their search ranks."""
    from tpsim.plan import Plan
    from tpsim.validate.top import pick_plans
    ranking = [Plan(cp=2, global_batch=4), Plan(dp=2, global_batch=4), Plan(ep=2, dp=2, global_batch=4),
               Plan(pp=2, global_batch=4), Plan(dp=2, zero=1, global_batch=4)]
    picks = pick_plans(ranking, 2, contrast=1)
    assert [(p.search_rank, p.role) for p in picks] == [(2, "top"), (4, "top"), (5, "contrast")]


# ---- matrix ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["llama3-8b", "gpt3-1.3b", "mixtral-8x7b"])
def test_matrix_has_ring_ulysses_and_expert_entries_on_two_ranks(preset):
    """--matrix axes: cp 2 ring, cp 2 a2a, ep 2 (dp 2) and cp 2 x ep 2, each on 2 ranks and each expecting the
    collectives of its axes (a dense model's ep entries on an MoE layer of 8 experts top-2)."""
    from tpsim.validate.matrix import AXIS_MATRIX_CP, AXIS_MATRIX_MOE, axis_matrix_cases
    base = PRESETS[preset]
    cases = axis_matrix_cases(base)
    assert [(c.cp, c.cp_kind, c.ep, c.dp) for c in cases] == [(2, "ring", 1, 1), (2, "a2a", 1, 1), (1, "ring", 2, 2),
                                                             (2, "ring", 2, 1)]
    assert all(c.world == 2 for c in cases)
    assert [set(c.expected_comm()) for c in cases] == [{"cp"}, {"cp"}, {"ep"}, {"cp", "ep"}]
    for c in cases[2:]:
        assert c.model.is_moe and c.model.hidden_size == AXIS_MATRIX_MOE["hidden"]
        assert c.model.num_experts // c.ep >= 2
        if not base.is_moe:
            assert (c.model.num_experts, c.model.experts_per_token) == (AXIS_MATRIX_MOE["experts"],
                                                                          AXIS_MATRIX_MOE["top_k"])
    for c in cases[:2]:
        assert c.model.is_moe == base.is_moe
        if not base.is_moe:
            assert (c.model.hidden_size, c.model.seq_len) == (AXIS_MATRIX_CP["hidden"], AXIS_MATRIX_CP["seq"])
