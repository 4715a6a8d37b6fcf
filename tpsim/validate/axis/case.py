"""A context- or expert-parallel block to run on ``cp x dp`` ranks and compare with the cost model (torch-free).

An :class:`AxisCase` is one transformer layer of the model (its own widths; a mixture-of-experts model's MoE
layer) run with tensor parallelism 1 on ``cp x dp`` ranks: the sequence split over cp ranks (ring or all-to-all
attention), the routed experts split over ``ep`` ranks (``ep`` divides ``cp x dp``: Megatron-Core's expert
layout re-factors the same ranks as ``ep x edp``), each dp replica with its own micro-batch. What it should
communicate per layer and micro-batch is :func:`tpsim.comm_plan.cp_collectives` and
:func:`tpsim.comm_plan.moe_collectives` for the same plan (fp32), expanded here to what a recorder sees on one
rank: a send/receive pair of the ring is one ``send`` and one ``recv`` of the message; plus the dispatcher's
metadata (the all-gather of the per-expert counts, which the cost model leaves out: :func:`metadata_comm`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...comm_plan import AxisOp, cp_collectives, moe_collectives
from ...errors import InputError
from ...model import ModelSpec
from ...plan import Plan, validate_plan
from ..block.case import CaseBase

CP_KINDS = ("ring", "a2a")
COUNT_BYTES = 8
"""bytes of one per-expert count (int64, Megatron-Core's ``routing_map.sum(dim=0).long()``)."""
MIN_LOCAL_EXPERTS = 2
"""routed experts per rank at least (the dispatcher's sort by local expert is part of what is checked)."""


@dataclass(frozen=True, kw_only=True)
class AxisCase(CaseBase):
    """One layer with context and/or expert parallelism on ``cp x dp`` ranks (module docstring)."""

    KIND = "axis"

    model: ModelSpec
    """the model as run (one layer: the MoE layer of an MoE model; ``seq_len`` of the run)."""
    cp: int = 1
    cp_kind: str = "ring"
    ep: int = 1
    dp: int = 1
    """replicas of the dense part (each with its own micro-batch); ep x edp = cp x dp."""
    fused: bool = False
    micro_batch: int = 1
    warmup: int = 2
    reps: int = 5
    seed: int = 0
    scaled: str = ""
    timed: bool = True
    """measure time too (False: numerics and communication only)."""

    def __post_init__(self) -> None:
        self._check_counts("cp", "ep", "dp", "micro_batch", "reps")
        if self.cp_kind not in CP_KINDS:
            raise InputError(f"cp_kind={self.cp_kind!r} is not one of {', '.join(CP_KINDS)}")
        if self.cp == 1 and self.ep == 1:
            raise InputError("a context/expert-parallel case needs cp > 1 or ep > 1 (cp=1, ep=1)")
        m = self.model
        if m.sliding_window and m.sliding_window < m.seq_len:
            raise InputError(f"sliding_window={m.sliding_window} < seq_len={m.seq_len}: tpsim validate runs full "
                             "causal attention (give --seq-len <= the window)")
        if m.is_moe and m.num_experts // self.ep < MIN_LOCAL_EXPERTS:
            raise InputError(f"ep={self.ep} leaves {m.num_experts // self.ep} routed expert(s) per rank "
                             f"(num_experts={m.num_experts}); validation runs at least {MIN_LOCAL_EXPERTS} per rank")
        if m.is_moe and m.capacity_factor:
            raise InputError(f"capacity_factor={m.capacity_factor}: tpsim validate runs dropless routing only")
        validate_plan(m, self.plan())

    # ---- shape of the run ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.cp * self.dp

    @property
    def tp(self) -> int:
        """Tensor parallelism of the run (always 1)."""
        return 1

    @property
    def tokens(self) -> int:
        """Tokens one rank holds per micro-batch: micro_batch x seq_len / cp."""
        return self.micro_batch * self.model.seq_len // self.cp

    @property
    def kind(self) -> str:
        return "+".join(k for k, on in (("cp", self.cp > 1), ("ep", self.ep > 1)) if on)

    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """Dense axes, outermost first (Megatron-Core order tp-cp-dp-pp with tp = pp = 1: cp innermost)."""
        return (("dp", self.dp), ("cp", self.cp))

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's place: dense (dp, cp) and expert (edp, ep) indices (ep innermost, as the expert
        rank generator puts it in cp's place)."""
        return {"cp": rank % self.cp, "dp": rank // self.cp, "ep": rank % self.ep, "edp": rank // self.ep}

    def plan(self) -> Plan:
        """The plan the prediction is for: tp 1, fp32 (what runs), flash attention, no recomputation."""
        return Plan(tp=1, cp=self.cp, cp_kind=self.cp_kind, ep=self.ep, etp=0, pp=1, vpp=1, dp=self.dp, sp=False,
                    zero=0, micro_batch=self.micro_batch, global_batch=self.micro_batch * self.dp, dtype="fp32",
                    recompute="none", attention="flash", overlap=True)

    @property
    def name(self) -> str:
        m = self.model
        parts = [m.name, f"cp{self.cp}{'-a2a' if self.cp_kind == 'a2a' else ''}" if self.cp > 1 else "",
                 f"ep{self.ep}" if self.ep > 1 else "", f"dp{self.dp}" if self.dp > 1 else "",
                 f"E{m.num_experts}k{m.experts_per_token}" if m.is_moe else "", "fused" if self.fused else "",
                 f"h{m.hidden_size}", f"s{m.seq_len}", f"b{self.micro_batch}"]
        return "-".join(p for p in parts if p)

    # ---- what it should communicate -------------------------------------------------------------------
    def cost_model_ops(self) -> list[AxisOp]:
        """The cost model's collectives of this layer per micro-batch (:mod:`tpsim.comm_plan`)."""
        return cp_collectives(self.model, self.plan()) + moe_collectives(self.model, self.plan())

    @property
    def routed_copies(self) -> int:
        """Token copies one rank routes per micro-batch (its tokens x top-k; 0 for a dense model)."""
        return self.tokens * self.model.experts_per_token if self.model.is_moe else 0

    def expected_comm(self, load: int | None = None) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """{axis: {phase: {op: {"n", "bytes"}}}} one rank issues per layer and micro-batch: the cost model's
        collectives (a ring exchange = one send and one recv of the message) and the dispatcher's metadata.

        ``load``: the token copies this rank's experts received. The cost model assumes balanced routing; a
        rank's dispatch sends exactly its own copies (balanced or not), but the combine sends back what its
        experts processed (and the dispatch's gradient likewise), so with ``load`` those two messages are sized
        by it (:func:`routed_bytes`); summed over the ep group they equal the balanced figures."""
        out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for op in routed_bytes(self, self.cost_model_ops(), load) + metadata_comm(self):
            kinds = ("send", "recv") if op.op == "send_recv" else (op.op,)
            for kind in kinds:
                d = out.setdefault(op.axis, {}).setdefault(op.phase, {}).setdefault(kind, {"n": 0, "bytes": 0.0})
                d["n"] += op.count
                d["bytes"] += op.count * op.nbytes
        return out


RETURNED = ("combine", "dispatch gradient")
"""the ep all-to-alls whose send buffer is what the rank's experts processed (the others send its own copies)."""


def routed_bytes(case: AxisCase, ops: list[AxisOp], load: int | None) -> list[AxisOp]:
    """``ops`` with the all-to-alls of :data:`RETURNED` sized by ``load`` copies instead of the balanced
    ``tokens x top-k`` (the bytes per copy, hidden x 4, unchanged); ``ops`` as they are without ``load``."""
    if load is None or not case.routed_copies:
        return list(ops)
    scale = load / case.routed_copies
    return [dataclasses.replace(op, nbytes=op.nbytes * scale) if op.axis == "ep" and op.tensor in RETURNED else op
            for op in ops]


def metadata_comm(case: AxisCase) -> list[AxisOp]:
    """Collectives the runtime issues that the cost model leaves out (they carry no activations): Megatron-Core's
    alltoall dispatcher all-gathers each rank's per-expert token counts over the ep group (``preprocess``:
    ``gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=tp_ep_group)``) in every forward,
    before the dispatch, to size the all-to-alls."""
    m = case.model
    if not m.is_moe or case.ep == 1:
        return []
    return [AxisOp("ep", "fwd", "all_gather", 1, float(case.ep * m.num_experts * COUNT_BYTES), "expert counts")]


def moe_layer_model(model: ModelSpec) -> ModelSpec:
    """The model with one layer, a mixture-of-experts one (dense first layers and dense-layer lists dropped):
    the layer a validation block runs."""
    if not model.is_moe:
        return dataclasses.replace(model, num_layers=1) if model.num_layers != 1 else model
    return dataclasses.replace(model, num_layers=1, first_dense_layers=0, moe_layer_freq=1, dense_layers=(),
                               full_attention_layers=(), mtp_layers=0)



def with_expert_ffn(model: ModelSpec, ffn: int) -> ModelSpec:
    """``model`` with routed experts of FFN size ``ffn`` and shared experts scaled alike (their ratio to the
    routed experts' size kept, at least 1)."""
    from ...limits import LIMITS, check_int

    ffn = check_int("--moe-ffn", ffn, minimum=1, maximum=LIMITS["moe_ffn_hidden_size"])
    shared = model.shared_expert_ffn_hidden_size
    if shared:
        shared = max(1, round(shared * ffn / model.moe_ffn_hidden_size))
    return dataclasses.replace(model, moe_ffn_hidden_size=ffn, shared_expert_ffn_hidden_size=shared)
