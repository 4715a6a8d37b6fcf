"""What one validation run executes: a block shape, a TP degree and the measurement settings (torch-free).

A :class:`Case` travels to the ranks as JSON (``to_dict`` / ``from_dict``), so the launcher, the ranks and
the prediction all read one description.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

from ...errors import InputError
from ...model import ModelSpec
from ...plan import Plan, make_plan
from ...tp_plan import CommOp, count_by_kind, layer_collectives

FP32_BYTES = 4
"""the validation runs in fp32 (numerics are checked to 1e-4), 4 bytes per element."""

C = TypeVar("C", bound="CaseBase")


class CaseBase:
    """What every validation case (:class:`Case`, ``PlanCase``, ``AxisCase``: frozen dataclasses with a
    ``model`` and ``warmup``) shares: the checks of its counts and its JSON form."""

    KIND = ""
    """``kind`` of the JSON form, which the ranks dispatch on ("": a block :class:`Case`, which has none)."""

    def _check_counts(self, *names: str) -> None:
        """Each of ``names`` a positive integer, and ``warmup`` >= 0."""
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"{name}={value!r} must be a positive integer")
        if self.warmup < 0:
            raise InputError(f"warmup={self.warmup} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        m = dataclasses.asdict(self.model)
        m["default_plan"] = dict(self.model.default_plan)
        d["model"] = m
        if self.KIND:
            d["kind"] = self.KIND
        return d

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        fields = dict(data)
        if cls.KIND:
            fields.pop("kind", None)
        fields["model"] = ModelSpec(**fields["model"])
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class Case(CaseBase):
    """One block configuration to run on ``tp`` ranks and compare with the prediction."""

    model: ModelSpec
    """the model as run (seq_len is the sequence length of the run; see ``scaled``)."""
    tp: int
    sp: bool = False
    fused: bool = False
    """fused q/k/v (and gate/up) Linear layers instead of separate ones."""
    micro_batch: int = 1
    """sequences per micro-batch."""
    warmup: int = 2
    """untimed iterations before the timed ones."""
    reps: int = 5
    """timed iterations; the median is reported."""
    seed: int = 0
    scaled: str = ""
    """what was reduced from the model's own shapes to fit this machine ("" = the model's own shapes)."""

    def __post_init__(self) -> None:
        self._check_counts("tp", "micro_batch", "reps")
        if self.sp and self.tp == 1:
            raise InputError("--sp needs tp > 1 (tp=1)")
        for what, size in (("num_attention_heads", self.model.num_attention_heads),
                           ("ffn_hidden_size", self.model.ffn_hidden_size)):
            if size % self.tp:
                raise InputError(f"tp={self.tp} does not divide {what}={size}")
        if self.model.num_kv_heads < self.tp and self.tp % self.model.num_kv_heads:
            raise InputError(f"num_kv_heads={self.model.num_kv_heads} does not divide tp={self.tp} "
                             "(KV heads are replicated over the TP group)")
        if self.model.num_kv_heads >= self.tp and self.model.num_kv_heads % self.tp:
            raise InputError(f"tp={self.tp} does not divide num_kv_heads={self.model.num_kv_heads}")
        if self.sp and self.model.seq_len % self.tp:
            raise InputError(f"tp={self.tp} does not divide seq_len={self.model.seq_len} (sequence parallelism)")

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch: micro_batch x seq_len."""
        return self.micro_batch * self.model.seq_len

    @property
    def name(self) -> str:
        m = self.model
        parts = [m.name, f"tp{self.tp}", "sp" if self.sp else "", "fused" if self.fused else "",
                 f"h{m.hidden_size}", f"s{m.seq_len}", f"b{self.micro_batch}"]
        return "-".join(p for p in parts if p)

    def plan(self) -> Plan:
        """The plan the estimator predicts for: this TP degree, one replica, fp32, no recomputation."""
        return make_plan(self.model, self.tp, tp=self.tp, pp=1, vpp=1, sp=self.sp, zero=0, recompute="none",
                         micro_batch=self.micro_batch, global_batch=self.micro_batch, dtype="fp32",
                         attention="flash", overlap=True)

    def expected_collectives(self) -> list[CommOp]:
        """What the torch-free cost model says DTensor issues for this block (flavor "dtensor")."""
        return layer_collectives(self.model, self.tp, self.sp, flavor="dtensor", fused=self.fused)

    def expected_counts(self) -> dict[str, dict[str, int]]:
        return count_by_kind(self.expected_collectives())

    def expected_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes per (phase, op), nccl-tests convention (full tensor), fp32."""
        out: dict[str, dict[str, int]] = {"fwd": {}, "bwd": {}}
        for c in self.expected_collectives():
            numel = self.tokens * self.model.hidden_size if c.activation else c.numel
            out[c.phase][c.op] = out[c.phase].get(c.op, 0) + numel * FP32_BYTES
        return out
