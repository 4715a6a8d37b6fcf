"""A whole plan scaled down to run here: every axis of the plan on ``tp x pp x dp`` ranks (torch-free).

A :class:`PlanCase` is the plan's tensor, pipeline and data parallelism (ZeRO stage, schedule, micro-batches)
applied to a stack of transformer layers: the model's layer shapes (hidden, heads, FFN, sequence where they fit),
fewer layers (``layers_per_chunk`` per pipeline model chunk). The embedding and the output layer are left out:
the stack's input is a random activation and its loss ``sum(y * target) / numel`` is linear in the output, so
the gradients that flow back are exact and cheap; what is validated is the layers' sharding, the data-parallel
reductions, the pipeline schedule and the optimizer step. The rank mesh is built over the plan's axes by name
(:func:`PlanCase.mesh_axes`), innermost first as Megatron-Core's ``RankGenerator`` orders them, so that an axis
added later (cp, ep) is one more name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ...model import ModelSpec
from ...plan import Plan, parse_order
from ..block.case import Case, CaseBase

ZERO_RUNTIME = {0: "ddp", 1: "zero1", 2: "fsdp2-no-reshard", 3: "fsdp2"}
"""What runs for each ZeRO stage: DDP; a sharded optimizer of tpsim's own (reduce-scatter of the gradients,
Adam on the rank's shard, all-gather of the weights, as Megatron's distributed optimizer); FSDP2
``fully_shard`` per block with ``reshard_after_forward=False`` (ZeRO-2-like) or ``True`` (ZeRO-3)."""

TORCH_SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved-zb": "ScheduleInterleavedZeroBubble",
                   "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
"""tpsim pipeline schedules (tpsim/pipeline.py) validation runs, and the torch.distributed.pipelining class of each
(``1f1b`` with vpp > 1: ScheduleInterleaved1F1B); zb-h1 and dualpipe have no torch schedule."""


@dataclass(frozen=True, kw_only=True)
class PlanCase(CaseBase):
    """One plan to run on ``tp x pp x dp`` ranks (a scaled-down version of it: see the module docstring)."""

    KIND = "plan"

    model: ModelSpec
    """the model as run: ``num_layers = pp x vpp x layers_per_chunk``, ``seq_len`` of the run."""
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    """model chunks per pipeline rank (> 1: interleaved 1F1B)."""
    dp: int = 1
    zero: int = 0
    sp: bool = False
    fused: bool = False
    micro_batch: int = 1
    """sequences per micro-batch."""
    microbatches: int = 1
    """micro-batches per replica and step (the plan's global batch / (micro_batch x dp))."""
    order: str = "tp-dp-pp"
    """rank order, innermost first."""
    pp_schedule: str = "1f1b"
    """the plan's pipeline schedule (:data:`TORCH_SCHEDULES`); V-shaped ones (zbv, dualpipev) need vpp = 2."""
    warmup: int = 1
    """untimed steps before the timed ones."""
    reps: int = 3
    """timed steps; the median is reported."""
    seed: int = 0
    scaled: str = ""
    """what was reduced from the plan to run here ("" = nothing)."""
    timed: bool = True
    """measure time too (False: numerics and communication only, e.g. more ranks than CPU cores)."""

    def __post_init__(self) -> None:
        self._check_counts("tp", "pp", "vpp", "dp", "micro_batch", "microbatches", "reps")
        if self.zero not in ZERO_RUNTIME:
            raise InputError(f"zero={self.zero!r} is not one of 0, 1, 2, 3")
        if self.zero and self.dp == 1:
            raise InputError(f"--zero={self.zero} needs --dp > 1 (dp=1)")
        if self.vpp > 1 and self.pp == 1:
            raise InputError(f"--vpp={self.vpp} needs --pp > 1 (pp=1)")
        if self.pp_schedule not in TORCH_SCHEDULES:
            raise InputError(f"schedule={self.pp_schedule!r}: validation runs torch.distributed.pipelining's "
                             f"{', '.join(TORCH_SCHEDULES)} (no torch schedule for it)")
        if self.pp_schedule in ("zbv", "dualpipev") and self.vpp != 2:
            raise InputError(f"schedule={self.pp_schedule} needs vpp=2 (two model chunks per rank in a V; vpp={self.vpp})")
        if self.pp_schedule == "gpipe" and self.vpp != 1:
            raise InputError(f"schedule=gpipe needs vpp=1 (vpp={self.vpp})")
        if self.pp > 1 and self.microbatches < self.pp:
            raise InputError(f"micro-batches={self.microbatches} must be >= pp={self.pp} (torch's 1F1B schedules)")
        if self.vpp > 1 and self.pp_schedule in ("1f1b", "interleaved-zb") and self.microbatches % self.pp:
            raise InputError(f"interleaved 1F1B needs micro-batches={self.microbatches} divisible by pp={self.pp}")
        if self.model.num_layers % self.chunks:
            raise InputError(f"num_layers={self.model.num_layers} is not a multiple of pp x vpp = {self.chunks} "
                             "(the same number of layers per model chunk)")
        parse_order(self.order)
        self.block_case()  # the per-layer TP constraints (heads, FFN, KV heads, sequence under SP)

    # ---- shape of the run ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def chunks(self) -> int:
        """Pipeline stages in torch's sense: pp x vpp model chunks."""
        return self.pp * self.vpp

    @property
    def layers_per_chunk(self) -> int:
        return self.model.num_layers // self.chunks

    @property
    def layers_per_rank(self) -> int:
        return self.layers_per_chunk * self.vpp

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch."""
        return self.micro_batch * self.model.seq_len

    @property
    def runtime(self) -> str:
        """The data-parallel runtime of the ZeRO stage (:data:`ZERO_RUNTIME`); "none" without DP."""
        return ZERO_RUNTIME[self.zero] if self.dp > 1 else "none"

    @property
    def schedule(self) -> str:
        """The torch schedule that runs (``none`` without a pipeline)."""
        if self.pp == 1:
            return "none"
        if self.pp_schedule == "1f1b":
            return "1F1B" if self.vpp == 1 else "interleaved-1F1B"
        return TORCH_SCHEDULES[self.pp_schedule].removeprefix("Schedule")

    @property
    def v_shaped(self) -> bool:
        """Rank r holds stages r and 2 pp - 1 - r (torch's ``style="v"`` stage-to-rank mapping)."""
        return self.pp_schedule in ("zbv", "dualpipev")

    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """(axis, size) outermost first, the shape of ``init_device_mesh``; rank = tp_i + tp (dp_i + dp pp_i)
        for the default order (``tpsim.topology.placement.RankLayout``, innermost first, reversed)."""
        sizes = {"tp": self.tp, "dp": self.dp, "pp": self.pp}
        return tuple((axis, sizes[axis]) for axis in reversed(parse_order(self.order)))

    def stages_of(self, pp_rank: int) -> list[int]:
        """Stage indices (model chunks) of pipeline rank ``pp_rank``: r, r + pp, ... (Megatron and torch's
        interleaving: chunk i of rank r is stage i x pp + r)."""
        if self.v_shaped:
            return [pp_rank, 2 * self.pp - 1 - pp_rank]
        return [pp_rank + i * self.pp for i in range(self.vpp)]

    def rank_of_stage(self, stage: int) -> int:
        """Pipeline rank holding ``stage`` (the inverse of :meth:`stages_of`)."""
        if self.v_shaped:
            return stage if stage < self.pp else 2 * self.pp - 1 - stage
        return stage % self.pp

    def stage_layers(self, stage: int) -> range:
        """Global layer indices of one stage."""
        k = self.layers_per_chunk
        return range(stage * k, (stage + 1) * k)

    def block_case(self) -> Case:
        """The per-layer block of this plan as the block validation runs it (same TP, SP, fused, shapes)."""
        return Case(model=self.model, tp=self.tp, sp=self.sp, fused=self.fused, micro_batch=self.micro_batch,
                    reps=self.reps, warmup=self.warmup, seed=self.seed)

    def plan(self) -> Plan:
        """The plan the prediction is for: fp32 (what runs), flash attention, no recomputation."""
        gb = self.microbatches * self.micro_batch * self.dp
        return Plan(tp=self.tp, pp=self.pp, vpp=self.vpp, dp=self.dp, sp=self.sp, zero=self.zero,
                    micro_batch=self.micro_batch, global_batch=gb, dtype="fp32", recompute="none",
                    attention="flash", overlap=True, order=self.order, schedule=self.pp_schedule)

    @property
    def name(self) -> str:
        m = self.model
        axes = [f"tp{self.tp}", "sp" if self.sp else "", f"pp{self.pp}" if self.pp > 1 else "",
                f"v{self.vpp}" if self.vpp > 1 else "",
                self.pp_schedule if self.pp_schedule != "1f1b" and self.pp > 1 else "",
                f"dp{self.dp}" if self.dp > 1 else "",
                f"z{self.zero}" if self.dp > 1 else "", "fused" if self.fused else ""]
        parts = [m.name, *axes, f"L{m.num_layers}", f"h{m.hidden_size}", f"s{m.seq_len}", f"b{self.micro_batch}",
                 f"m{self.microbatches}"]
        return "-".join(p for p in parts if p)
