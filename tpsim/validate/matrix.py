"""The validation matrices (torch-free): blocks (tp x sp x hidden x seq) and whole plans (every parallel axis)."""

from __future__ import annotations

from ..errors import InputError
from ..model import ModelSpec, with_overrides
from .block.case import Case
from .plan.case import PlanCase

MATRIX_TP = (1, 2)
MATRIX_SP = (False, True)
MATRIX_HIDDEN = (512, 1024, 2048)
MATRIX_SEQ = (128, 512)
MATRIX_HEAD_DIM = 64
"""head dim of the matrix's models (heads = hidden / 64)."""


def matrix_cases(base: ModelSpec, fused: bool = False, micro_batch: int = 3, reps: int = 5,
                 warmup: int = 2, tps: tuple[int, ...] = MATRIX_TP, hiddens: tuple[int, ...] = MATRIX_HIDDEN,
                 seqs: tuple[int, ...] = MATRIX_SEQ) -> list[Case]:
    """tp x sp x hidden x seq (sp only with tp > 1), heads = hidden / 64, GPT ffn = 4h, Llama ffn = 3.5h."""
    cases = []
    for tp in tps:
        for sp in MATRIX_SP:
            if sp and tp == 1:
                continue
            for h in hiddens:
                for s in seqs:
                    heads = h // MATRIX_HEAD_DIM
                    kv = min(base.num_kv_heads, heads) if base.num_kv_heads < base.num_attention_heads else heads
                    ffn = 4 * h if base.family == "gpt" else 7 * h // 2
                    model = with_overrides(base, hidden=h, heads=heads, kv_heads=kv, ffn=ffn, seq_len=s)
                    cases.append(Case(model=model, tp=tp, sp=sp, fused=fused, micro_batch=micro_batch,
                                      reps=reps, warmup=warmup))
    if not cases:
        raise InputError("the validation matrix is empty")
    return cases


PLAN_MATRIX = (
    dict(pp=2),
    dict(pp=2, vpp=2),
    dict(dp=2, zero=0),
    dict(dp=2, zero=1),
    dict(dp=2, zero=2),
    dict(dp=2, zero=3),
    dict(tp=2, sp=True, dp=2, zero=3),
    dict(tp=2, sp=True, pp=2),
)
"""whole-plan cases of the matrix: pipelining (1F1B, interleaved), data parallelism with each ZeRO stage, and
two 4-rank meshes (tp x dp with FSDP2, pp x tp; numerics and communication only on a 2-core machine)."""
PLAN_MATRIX_HIDDEN = 1024
PLAN_MATRIX_SEQ = 512
PLAN_MATRIX_LAYERS_PER_CHUNK = 2


def plan_matrix_cases(base: ModelSpec, fused: bool = False, micro_batch: int = 3, reps: int = 3,
                      warmup: int = 1, hidden: int = PLAN_MATRIX_HIDDEN, seq: int = PLAN_MATRIX_SEQ,
                      layers_per_chunk: int = PLAN_MATRIX_LAYERS_PER_CHUNK) -> list[PlanCase]:
    """The whole-plan cases of :data:`PLAN_MATRIX` for the model's family (heads = hidden / 64; 2 x pp
    micro-batches with pipelining, 2 without)."""
    heads = hidden // MATRIX_HEAD_DIM
    kv = min(base.num_kv_heads, heads) if base.num_kv_heads < base.num_attention_heads else heads
    ffn = 4 * hidden if base.family == "gpt" else 7 * hidden // 2
    cases = []
    for axes in PLAN_MATRIX:
        pp, vpp = axes.get("pp", 1), axes.get("vpp", 1)
        model = with_overrides(base, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq_len=seq,
                               layers=pp * vpp * layers_per_chunk)
        cases.append(PlanCase(model=model, fused=fused, micro_batch=micro_batch, microbatches=2 * pp if pp > 1 else 2,
                              reps=reps, warmup=warmup, **axes))
    return cases


AXIS_MATRIX = (
    dict(cp=2),
    dict(cp=2, cp_kind="a2a"),
    dict(ep=2, dp=2),
    dict(cp=2, ep=2),
)
"""context- and expert-parallel cases of the matrix on 2 ranks: ring and all-to-all attention of the model's
family, an MoE layer with its experts split over 2 ranks (dp 2 for the dense part), and both at once."""
AXIS_MATRIX_CP = dict(hidden=1024, seq=1024)
"""the dense cp cases: hidden 1024 (16 heads of 64), sequence 1024 (512 tokens per rank)."""
AXIS_MATRIX_MOE = dict(hidden=512, seq=512, experts=8, top_k=2, expert_ffn=1024)
"""the MoE cases: the model's own MoE shape if it has one (else Mixtral's, 8 experts top-2), hidden 512 (8 heads
of 64), sequence 512, expert FFN 1024."""


def axis_matrix_cases(base: ModelSpec, fused: bool = False, micro_batch: int = 3, reps: int = 5,
                      warmup: int = 2) -> list:
    """The cases of :data:`AXIS_MATRIX` (an MoE preset stands in for a dense model's ep cases)."""
    from .axis.case import AxisCase, moe_layer_model, with_expert_ffn
    from ..model import PRESETS

    def shaped(model: ModelSpec, hidden: int, seq: int) -> ModelSpec:
        heads = hidden // MATRIX_HEAD_DIM
        kv = min(model.num_kv_heads, heads) if model.num_kv_heads < model.num_attention_heads else heads
        ffn = 4 * hidden if model.family == "gpt" else 7 * hidden // 2
        return moe_layer_model(with_overrides(model, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq_len=seq,
                                              layers=1))
    dense = shaped(base, AXIS_MATRIX_CP["hidden"], AXIS_MATRIX_CP["seq"]) if not base.is_moe else None
    moe_base = base if base.is_moe else PRESETS["mixtral-8x7b"]
    k = AXIS_MATRIX_MOE
    moe = with_expert_ffn(shaped(moe_base, k["hidden"], k["seq"]), k["expert_ffn"])
    if not base.is_moe:
        moe = with_overrides(moe, experts=k["experts"], top_k=k["top_k"])
    cases = []
    for axes in AXIS_MATRIX:
        model = moe if axes.get("ep", 1) > 1 or dense is None else dense
        cases.append(AxisCase(model=model, fused=fused, micro_batch=micro_batch, reps=reps, warmup=warmup, **axes))
    return cases
