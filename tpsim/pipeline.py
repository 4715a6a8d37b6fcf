"""Pipeline schedules: one registry entry per name of :data:`tpsim.plan.SCHEDULES` (docs/SCHEMAS.md T1), pure
functions over plan-batch arrays. Every path that times a pipeline (the estimator's schedule and memory stages,
traced op graphs, validation) reads the bubble, the exposed pipeline sends, the micro-batches in flight and the
parameter copies from here; a plan batch carries each plan's schedule as its index in ``SCHEDULES``.

Notation (DeepSeek-V3 report, Table 2): ``t`` = F + B is one micro-batch's forward and full backward on the
slowest rank (with recomputation, exposed collectives and fixed costs), B its backward part, W the weight-
gradient part of B (:data:`WEIGHT_GRAD_SHARE_OF_BACKWARD`); F&B a forward and a backward chunk of two micro-batches
run together (their sum: they share the GPU, their communication hides behind each other). Zero-bubble
schedules split B into the input gradient (B - W) and the deferred weight gradient W that fills the bubble.

==================  ==========================================  ==========  ===========  =================
schedule            bubble per step                             chunks      copies       in flight (rank r)
==================  ==========================================  ==========  ===========  =================
``1f1b``            (pp - 1)(F + B) / vpp                        vpp         1            Megatron's count
``gpipe``           (pp - 1)(F + B)                              1           1            m
``zb-h1``           (pp - 1)(F + B - 2W)                         1           1            pp - r
``interleaved-zb``  (pp - 1)(F + B - 2W) / vpp                   vpp         1            as interleaved 1F1B
``zbv``             (pp - 1)(F + B - 3W) / 2                     2 (a V)     1            pp
``dualpipe``        (pp / 2 - 1)(F&B + B - 3W)                   1           2 (mirror)   1F1B's + 1
``dualpipev``       (pp - 1)(F&B + B - 3W) / 2                   2 (a V)     1            pp + 1/2
==================  ==========================================  ==========  ===========  =================

Sources: Narayanan et al. 2021 (1F1B and interleaving, sections 2.2 and 3.3); Huang et al. 2019 (GPipe); Qi et
al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241): ZB-H1 (table 1, (p - 1)(T_F + T_B -
T_W) with T_B the input-gradient part, peak memory that of 1F1B) and ZB-V (section 6: two chunks per rank in a V,
(p - 1)(T_F + T_B - 2T_W) in chunk times, peak memory p M_B on every rank), torch.distributed.pipelining
``ScheduleZBVZeroBubble`` and ``ScheduleInterleavedZeroBubble`` (the interleaved 1F1B warm-up with the backward
split, ``enable_zero_bubble``); DeepSeek-V3 report section 3.2.1, Table 2 (DualPipe: two parameter copies,
PP + 1 micro-batches of activations) and github.com/deepseek-ai/DualPipe (DualPipeV, the "cut-in-half"
V-shaped DualPipe: PP stages on PP / 2 ranks, one copy). Exposed pipeline sends: every activation and gradient
send of 1F1B-family schedules waits on the critical path (2 (m vpp + pp - 1) of them); DualPipe's pairing
hides each send behind the paired chunk's computation, leaving the fill and the drain (2 (pp - 1)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zbv", "interleaved-zb", "dualpipe", "dualpipev")
"""pipeline schedule names (PlanBatch code = index; docs/SCHEMAS.md "Third wave", re-exported as
``tpsim.plan.SCHEDULES``): ``1f1b`` is 1F1B, interleaved when vpp > 1 (Megatron-LM's rule); ``gpipe``
all-forward-all-backward; ``zb-h1`` zero-bubble H1 (Qi et al. 2024); ``zbv`` the V-shaped zero-bubble schedule
(two chunks per rank, torch ``ScheduleZBVZeroBubble``); ``interleaved-zb`` torch ``ScheduleInterleavedZeroBubble``;
``dualpipe`` / ``dualpipev`` DeepSeek-V3's."""

WEIGHT_GRAD_SHARE_OF_BACKWARD = 0.5
"""W / B: the weight-gradient part of a layer's backward. Each linear layer's backward is two GEMMs of the
forward's FLOPs, one for the input gradient and one for the weight gradient (the attention core's backward has
no weight gradient: it lowers the share a little, which this leaves out)."""


@dataclass(frozen=True)
class PipelineSchedule:
    """One pipeline schedule: its rules as numbers and the formulas below, keyed by ``name``."""

    name: str
    title: str
    """what the stacks call it (torchtitan ``pipeline_parallel_schedule`` where it has one)."""
    chunks: int
    """model chunks per rank the schedule needs (vpp); 0: any vpp (1F1B and interleaved zero-bubble)."""
    bubble_slots: str
    """which bubble formula: ``1f1b``, ``zb`` (ZB-H1 and its interleaving), ``zbv``, ``dualpipe``,
    ``dualpipev``."""
    copies: int
    """parameter copies per rank (DualPipe: 2, rank r also holds stage pp - 1 - r)."""
    paired: bool
    """forward and backward chunks of two micro-batches run together: their collectives (expert all-to-alls,
    pipeline sends) hide behind each other's computation."""
    weight_split: bool
    """the backward is split into input and weight gradients (B / W), W deferred into the bubble."""
    min_microbatches_per_stage: int
    """micro-batches the schedule needs per pipeline rank (m >= this x pp; 0: no minimum)."""
    even_pp: bool
    """pp must be even (DualPipe feeds both ends with half the ranks each)."""
    extra_in_flight: float
    """micro-batches (whole stages) in flight beyond the schedule's base count on every rank with pp > 1."""
    source: str


REGISTRY: dict[str, PipelineSchedule] = {s.name: s for s in (
    PipelineSchedule("1f1b", "1F1B (Interleaved1F1B with vpp > 1)", 0, "1f1b", 1, False, False, 0, False, 0.0,
                     "Narayanan et al. 2021 sections 2.2, 3.3; Megatron-LM schedules.py"),
    PipelineSchedule("gpipe", "GPipe", 1, "1f1b", 1, False, False, 0, False, 0.0,
                     "Huang et al. 2019; torch ScheduleGPipe (all forwards, then all backwards)"),
    PipelineSchedule("zb-h1", "ZB-H1 (ZB1P)", 1, "zb", 1, False, True, 1, False, 0.0,
                     "Qi et al. 2024 table 1; DeepSeek-V3 report table 2 (ZB1P)"),
    PipelineSchedule("zbv", "ZBVZeroBubble", 2, "zbv", 1, False, True, 1, False, 0.0,
                     "Qi et al. 2024 section 6 (ZB-V); torch ScheduleZBVZeroBubble"),
    PipelineSchedule("interleaved-zb", "InterleavedZeroBubble", 0, "zb", 1, False, True, 1, False, 0.0,
                     "torch ScheduleInterleavedZeroBubble (interleaved 1F1B with the backward split)"),
    PipelineSchedule("dualpipe", "DualPipe", 1, "dualpipe", 2, True, True, 2, True, 1.0,
                     "DeepSeek-V3 report section 3.2.1, table 2; github.com/deepseek-ai/DualPipe"),
    PipelineSchedule("dualpipev", "DualPipeV", 2, "dualpipev", 1, True, True, 2, False, 0.5,
                     "github.com/deepseek-ai/DualPipe (DualPipeV: PP stages on PP / 2 ranks, a V per rank)"),
)}
assert tuple(REGISTRY) == SCHEDULES, "one registry entry per SCHEDULES name, in its order"
ENTRIES: tuple[PipelineSchedule, ...] = tuple(REGISTRY.values())

_COPIES = np.array([s.copies for s in ENTRIES], dtype=float)
_PAIRED = np.array([s.paired for s in ENTRIES], dtype=bool)
_EXTRA = np.array([s.extra_in_flight for s in ENTRIES], dtype=float)
REQUIRED_CHUNKS = np.array([s.chunks for s in ENTRIES], dtype=np.int64)
"""vpp each schedule needs (0: any), indexed by schedule code (the plan rules read it)."""
MIN_MICROBATCHES_PER_STAGE = np.array([s.min_microbatches_per_stage for s in ENTRIES], dtype=np.int64)
EVEN_PP = np.array([s.even_pp for s in ENTRIES], dtype=bool)
INTERLEAVED = np.array([s.name in ("1f1b", "interleaved-zb") for s in ENTRIES], dtype=bool)
"""schedules whose vpp > 1 is Megatron / torch interleaving (micro-batches in rounds of pp)."""


def code(schedule) -> np.ndarray | int:
    """Schedule codes of a plan's name (an int) or a batch's column (returned as is)."""
    return SCHEDULES.index(schedule) if isinstance(schedule, str) else schedule


def codes_of(schedule, n: int) -> np.ndarray:
    """(n,) int codes: a batch's column, or a single name / code broadcast (None: 1f1b)."""
    if schedule is None:
        return np.zeros(n, dtype=np.int64)
    c = code(schedule)
    if type(c) is np.ndarray and c.dtype == np.int64 and c.shape == (n,):  # a batch's column as it is
        return c
    return np.broadcast_to(np.asarray(c, dtype=np.int64), (n,))


def mirrored(schedule: np.ndarray) -> np.ndarray:
    """(n,) bool: rank r also holds stage pp - 1 - r (two parameter copies)."""
    return _COPIES[schedule] > 1


def paired(schedule: np.ndarray) -> np.ndarray:
    """(n,) bool: forward and backward chunks of two micro-batches run together."""
    return _PAIRED[schedule]


def _present(schedule: np.ndarray) -> list[int]:
    if type(schedule) is np.ndarray and schedule.size == 1:  # one plan (``estimate``): its own code
        return [int(schedule.reshape(-1)[0])]
    return np.flatnonzero(np.bincount(np.ravel(schedule), minlength=len(ENTRIES))).tolist()


def _by_schedule(schedule: np.ndarray, formula) -> np.ndarray:
    """``formula(entry)`` of each plan's own schedule (only the schedules present are evaluated)."""
    present = _present(schedule)
    out = formula(ENTRIES[present[0]])
    for c in present[1:]:
        out = np.where(schedule == c, formula(ENTRIES[c]), out)
    return out


def bubble(schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, t_stage: np.ndarray,
           backward_fraction: np.ndarray | float) -> np.ndarray:
    """Pipeline fill and drain per step (seconds) on the slowest rank: the table of the module docstring, with
    ``t_stage`` = F + B per micro-batch, B = ``backward_fraction`` x t and W = B x
    :data:`WEIGHT_GRAD_SHARE_OF_BACKWARD`."""
    b = backward_fraction * t_stage
    w = WEIGHT_GRAD_SHARE_OF_BACKWARD * b

    def one(s: PipelineSchedule) -> np.ndarray:
        if s.bubble_slots == "1f1b":
            return (pp - 1) / vpp * t_stage
        if s.bubble_slots == "zb":
            return (pp - 1) / vpp * np.maximum(t_stage - 2.0 * w, 0.0)
        if s.bubble_slots == "zbv":
            return (pp - 1) * np.maximum(t_stage - 3.0 * w, 0.0) / 2.0
        if s.bubble_slots == "dualpipe":
            return np.maximum(pp / 2.0 - 1.0, 0.0) * np.maximum(t_stage + b - 3.0 * w, 0.0)
        return (pp - 1) * np.maximum(t_stage + b - 3.0 * w, 0.0) / 2.0  # dualpipev

    return _by_schedule(schedule, one)


def pipeline_sends(schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
                   p2p: np.ndarray, overlap_interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) pipeline point-to-point time per step: an activation forward and a gradient backward
    per chunk and micro-batch plus the fill and drain; schedules that pair chunks leave only the fill and the
    drain exposed, and so do interleaved plans (vpp > 1) of a stack that overlaps their sends with the next
    chunk's compute (``overlap_interleaved``: Megatron-LM's ``--overlap-p2p-communication``)."""
    total = 2.0 * (m * vpp + pp - 1) * p2p
    hidden = paired(schedule) | (overlap_interleaved & (np.asarray(vpp) > 1))
    exposed = np.where(hidden, 2.0 * (pp - 1) * p2p, total)
    return total, exposed


def in_flight(schedule: np.ndarray, position_rank: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
              m: np.ndarray) -> np.ndarray:
    """Micro-batches (in whole-stage units of the rank's layers) whose activations pipeline rank r holds at
    the schedule's peak, never more than the micro-batches: 1F1B pp - r, or (2 (pp - r - 1) + (vpp - 1) pp +
    1) / vpp chunks' worth interleaved (Megatron's warm-up count; Korthikanti et al. 2022 section 4.2.3 for
    r = 0; torch's interleaved schedules use the same warm-up); GPipe every micro-batch; ZB-V pp on every rank;
    DualPipe 1F1B's count plus one, DualPipeV pp + 1/2 (PP + 1 chunk activations of half a stage each)."""
    plain = pp - position_rank

    def one(s: PipelineSchedule) -> np.ndarray:
        if s.name == "gpipe":  # every micro-batch's forward before the first backward (with a pipeline)
            base = np.where(pp > 1, m, plain).astype(float)
        elif s.name in ("zbv", "dualpipev"):
            base = np.broadcast_to(pp, np.shape(plain)).astype(float)
        elif s.chunks == 0:
            interleaved = (2 * (plain - 1) + (vpp - 1) * pp + 1) / vpp
            base = np.where(vpp > 1, interleaved, plain)
        else:
            base = plain
        # no extra micro-batch: nothing to add (the counts stay exact integers either way)
        return base + np.where(pp > 1, s.extra_in_flight, 0.0) if s.extra_in_flight else base

    return np.minimum(_by_schedule(schedule, one), m).astype(float, copy=False)


def describe(name: str) -> str:
    """One line for ``--why`` and docs: the schedule's title and source."""
    s = REGISTRY[name]
    return f"{s.name}: {s.title} ({s.source})"


# ---- Megatron-Core pipeline layout strings (--pipeline-model-parallel-layout) --------------------------------
LAYOUT_MAX_SYMBOLS = 1 << 20
"""Symbols a pipeline layout may unroll to (a stage per ``|``, a layer per ``t``): far above any model
(LIMITS: 4096 layers, pp x vpp stages), far below what multiplies out to gigabytes (``(t*10^6)*2000``)."""


def layout_stages(text: str) -> tuple[int, int]:
    """(stages, decoder layers) of a layout string, counted as Megatron's parse_str_to_list unrolls it
    (``x*N`` repeats a symbol, ``(...)*N`` a group, groups nest) without unrolling it: each group's counts
    are multiplied, and a layout of more than :data:`LAYOUT_MAX_SYMBOLS` symbols is refused (ValueError)."""
    text = text.replace(",", "")
    if len(text) > 4096 or set(text) - set("ELtm|()*0123456789 "):
        raise ValueError(text[:40])
    text = text.replace(" ", "")
    # a stack of [pipes, layers, symbols] per open group; a closed group or a symbol is the "last" item
    stack: list[list[int]] = [[0, 0, 0]]
    last: tuple[int, int, int] | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            stack.append([0, 0, 0])
            last = None
            i += 1
        elif c == ")":
            if len(stack) == 1:
                raise ValueError("unbalanced )")
            group = stack.pop()
            last = (group[0], group[1], group[2])
            _add(stack[-1], last)
            i += 1
        elif c == "*":
            j = i + 1
            while j < len(text) and text[j].isascii() and text[j].isdigit():
                j += 1
            if last is None or j == i + 1 or j - i - 1 > 7:
                raise ValueError("bad repeat")
            times = int(text[i + 1:j])
            _add(stack[-1], tuple(-v for v in last))  # replace one copy by `times` copies
            last = (last[0] * times, last[1] * times, last[2] * times)
            _add(stack[-1], last)
            last = None
            i = j
        elif c in "ELtm|":
            last = (int(c == "|"), int(c == "t"), 1)
            _add(stack[-1], last)
            i += 1
        else:
            raise ValueError(c)
        if stack[-1][2] > LAYOUT_MAX_SYMBOLS:
            raise ValueError("too long")
    if len(stack) != 1:
        raise ValueError("unbalanced (")
    return stack[0][0] + 1, stack[0][1]


def layout_chunks(text: str) -> tuple[int, ...]:
    """Decoder layers of each stage of a layout string in model order (``t`` counted, ``E``, ``m``, ``L``
    not), unrolled as Megatron's parse_str_to_list does; the layout is checked by :func:`layout_stages` first
    (its size is bounded)."""
    layout_stages(text)
    body = text.replace(",", "").replace(" ", "")

    def expand(i: int) -> tuple[str, int]:  # the unrolled text from i to the matching ")" (or the end)
        out: list[str] = []
        while i < len(body) and body[i] != ")":
            if body[i] == "(":
                inner, i = expand(i + 1)
                item = inner
                i += 1  # the ")"
            else:
                item, i = body[i], i + 1
            if i < len(body) and body[i] == "*":
                j = i + 1
                while j < len(body) and body[j].isdigit():
                    j += 1
                item, i = item * int(body[i + 1:j]), j
            out.append(item)
        return "".join(out), i

    unrolled, _ = expand(0)
    return tuple(stage.count("t") for stage in unrolled.split("|"))


def _add(acc: list[int], item: tuple[int, ...]) -> None:
    for k in range(3):
        acc[k] += item[k]
