"""``tpsim plan --compare``: two or more plans of one search side by side, with the difference of every
breakdown and memory term against the first.

A plan is named by its **rank** in the ranking (``1`` or ``#1``: the ``rank`` column of the table) or by a
**plan string**: tokens separated by spaces or commas, each either the short form the table and the reports
print or ``field=value``:

=========================  ===========================================================================
short form                 ``field=value``
=========================  ===========================================================================
``tp8 pp4 v2 dp8``         ``tp=8 pp=4 vpp=2 dp=8`` (also ``cp=``, ``ep=`` once plans have those axes)
``sp`` / ``no-sp``         ``sp=on`` / ``sp=off``
``sel`` / ``full`` /       ``recompute=selective|full|none``
``no-recompute``
``z1``                     ``zero=1``
``mb2``                    ``micro_batch=2`` (or ``mb=2``)
``no-ovl`` / ``ovl``       ``overlap=off`` / ``overlap=on``
``dp-tp-pp``               ``order=dp-tp-pp``
``64g``                    ``gpus=64`` (with ``--objective cost``, which searches several GPU counts)
=========================  ===========================================================================

A plan string is a filter: the best-ranked evaluated plan with every field named is compared (so
``"tp4 pp2"`` means the best plan with tp = 4 and pp = 2). A string that names tp, pp, dp and the micro-batch,
as every label of the table and the reports does, is read as such a label: the fields a label leaves out mean
their defaults (no ``v`` = vpp 1, no ``sp`` = off, no ``sel``/``full`` = no recomputation, no ``z`` = ZeRO 0, no
``no-ovl`` = overlap on, no order = ``tp-dp-pp``), so a label copied from the table names exactly that plan.
Plans that do not fit are found too (after every fitting one). Nothing matching is an
:class:`~tpsim.errors.InputError` naming the string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..plan import ORDERS, RECOMPUTE, parse_order

NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_PLANS = len(NAMES)
"""at most this many plans side by side (A..Z)."""

_ALIASES = {"v": "vpp", "z": "zero", "mb": "micro_batch", "micro-batch": "micro_batch", "g": "gpus",
            "ovl": "overlap", "recomp": "recompute"}
_INT_FIELDS = ("tp", "pp", "vpp", "dp", "cp", "ep", "zero", "micro_batch", "gpus")
_SHORT = re.compile(r"^(tp|pp|vpp|v|dp|cp|ep|zero|z|mb)(\d+)$")
_BOOL = {"on": True, "yes": True, "true": True, "1": True, "y": True,
         "off": False, "no": False, "false": False, "0": False, "n": False}
_RECOMPUTE_SHORT = {"sel": "selective", "selective": "selective", "full": "full", "none": "none",
                    "no-recompute": "none"}
LABEL_FIELDS = ("tp", "pp", "dp", "micro_batch")
"""a plan string naming all of these is read as a full label (see the module docstring)."""
LABEL_DEFAULTS = (("vpp", 1), ("sp", 0), ("recompute", 0), ("zero", 0), ("overlap", 1), ("order", 0), ("cp", 1),
                  ("ep", 1))
"""what a label's omitted fields mean (coded as the search columns code them)."""


@dataclass(frozen=True)
class PlanRef:
    """What the user named: a rank, or plan fields (column name -> coded value, as in the search columns)."""

    text: str
    rank: int | None = None
    fields: tuple[tuple[str, int], ...] = ()
    defaults: tuple[tuple[str, int], ...] = ()
    """the omitted fields of a full label (applied where the search has that column)."""


def parse_ref(text: str) -> PlanRef:
    """A rank (``3``, ``#3``) or a plan string (see the module docstring) -> :class:`PlanRef`."""
    stripped = text.strip()
    if re.fullmatch(r"#?\d+", stripped):
        rank = int(stripped.lstrip("#"))
        if rank <= 0:
            raise InputError(f"--compare {text!r}: a rank is a positive integer (1 = the best plan)")
        return PlanRef(text=text, rank=rank)
    tokens = [t for t in re.split(r"[\s,]+", stripped) if t]
    if not tokens:
        raise InputError(f"--compare {text!r}: empty plan; give a rank (1) or a plan string ('tp8 pp4 z1')")
    fields: dict[str, int] = {}
    for token in tokens:
        name, value = _parse_token(token, text)
        if name in fields and fields[name] != value:
            raise InputError(f"--compare {text!r}: {name} is given twice with different values")
        fields[name] = value
    defaults = ()
    if all(name in fields for name in LABEL_FIELDS):
        defaults = tuple((name, value) for name, value in LABEL_DEFAULTS if name not in fields)
    return PlanRef(text=text, fields=tuple(fields.items()), defaults=defaults)


def _parse_token(token: str, text: str) -> tuple[str, int]:
    """One token -> (column name, coded value)."""
    low = token.lower()
    if "=" in low:
        key, _, value = low.partition("=")
        key = _ALIASES.get(key, key).replace("-", "_")
        return key, _coded(key, value, text)
    if m := _SHORT.match(low):
        return _ALIASES.get(m.group(1), m.group(1)), int(m.group(2))
    if m := re.fullmatch(r"(\d+)g", low):
        return "gpus", int(m.group(1))
    if low in ("sp", "no-sp"):
        return "sp", int(low == "sp")
    if low in _RECOMPUTE_SHORT:
        return "recompute", RECOMPUTE.index(_RECOMPUTE_SHORT[low])
    if low in ("ovl", "no-ovl"):
        return "overlap", int(low == "ovl")
    if "-" in low:
        return "order", _coded("order", low, text)
    raise InputError(f"--compare {text!r}: unknown token {token!r} (use e.g. tp8 pp4 v2 dp8 sp sel z1 mb2 "
                     f"no-ovl tp-dp-pp, or field=value)")


def _coded(key: str, value: str, text: str) -> int:
    """``field=value`` -> the value as the search columns code it."""
    if key in _INT_FIELDS:
        smallest = 0 if key == "zero" else 1
        if not value.isdigit() or int(value) < smallest:
            what = "a ZeRO stage (0-3)" if key == "zero" else "a positive integer"
            raise InputError(f"--compare {text!r}: {key}={value!r} must be {what}")
        return int(value)
    if key in ("sp", "overlap"):
        if value not in _BOOL:
            raise InputError(f"--compare {text!r}: {key}={value!r} must be on or off")
        return int(_BOOL[value])
    if key == "recompute":
        full = _RECOMPUTE_SHORT.get(value)
        if full is None:
            raise InputError(f"--compare {text!r}: recompute={value!r} is not one of {', '.join(RECOMPUTE)}")
        return RECOMPUTE.index(full)
    if key == "order":
        try:
            return ORDERS.index("-".join(parse_order(value)))
        except (InputError, ValueError):
            raise InputError(f"--compare {text!r}: order={value!r} is not one of {', '.join(ORDERS)}") from None
    raise InputError(f"--compare {text!r}: unknown field {key!r} (fields: tp pp vpp dp cp ep sp recompute zero "
                     f"micro_batch overlap order gpus)")


# ---------------------------------------------------------------------------------------------------------
def resolve(result: Any, ref: PlanRef) -> int:
    """The row (index into ``result.columns``) that ``ref`` names."""
    if ref.rank is not None:
        if ref.rank > len(result):
            raise InputError(f"--compare {ref.text!r}: rank {ref.rank} is beyond the {len(result)} ranked plans")
        return int(result.ranking[ref.rank - 1])
    c = result.columns
    match = np.ones(c["tp"].size, dtype=bool)
    for name, value in ref.fields:
        if name not in c:
            raise InputError(f"--compare {ref.text!r}: the plans of this search have no {name} axis")
        column = np.asarray(c[name]).astype(np.int64)
        if not (column == value).any():
            seen = " ".join(str(v) for v in np.unique(column)[:12])
            raise InputError(f"--compare {ref.text!r}: no evaluated plan has {_shown(name, value)} "
                             f"(values evaluated: {seen}; see --why)")
        match &= column == value
    named = list(ref.fields)
    for name, value in ref.defaults:
        if name in c:
            match &= np.asarray(c[name]).astype(np.int64) == value
            named.append((name, value))
    rows = np.flatnonzero(match)
    if not rows.size:
        raise InputError(f"--compare {ref.text!r}: no evaluated plan has all of "
                         + ", ".join(_shown(n, v) for n, v in named) + " (see --why)")
    return int(rows[np.argmin(_preference(result)[rows])])


def _shown(name: str, value: int) -> str:
    if name == "recompute":
        return f"recompute={RECOMPUTE[value]}"
    if name == "order":
        return f"order={ORDERS[value]}"
    if name in ("sp", "overlap"):
        return f"{name}={'on' if value else 'off'}"
    return f"{name}={value}"


def _preference(result: Any) -> np.ndarray:
    """A sort key over all rows: ranked rows in rank order, each twin right after the row that stands for it,
    then every other evaluated row (plans that do not fit) by step time."""
    c = result.columns
    n = c["tp"].size
    key = np.full(n, np.inf)
    key[result.ranking] = np.arange(result.ranking.size, dtype=float)
    twin_of = c.get("twin_of")
    if twin_of is not None:
        twins = np.flatnonzero((twin_of != np.arange(n)) & np.isfinite(key[twin_of]))
        key[twins] = key[twin_of[twins]] + 0.5
    rest = np.flatnonzero(~np.isfinite(key))
    key[rest[np.argsort(c["step_time_s"][rest], kind="stable")]] = n + np.arange(rest.size)
    return key


def rank_of(result: Any, row: int) -> tuple[int | None, bool]:
    """(rank of the row, or of the ranked row it is a twin of; whether it is that row itself)."""
    where = np.flatnonzero(result.ranking == row)
    if where.size:
        return int(where[0]) + 1, True
    twin_of = result.columns.get("twin_of")
    if twin_of is not None:
        where = np.flatnonzero(result.ranking == twin_of[row])
        if where.size:
            return int(where[0]) + 1, False
    return None, False


# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compared:
    """One plan of a comparison: its letter, what the user gave, its row, rank and estimate dict."""

    name: str
    ref: str
    row: int
    rank: int | None
    twin: bool
    label: str
    estimate: Mapping[str, Any]


def compare(result: Any, refs: Sequence[str]) -> list[Compared]:
    """Resolve two or more plan references (ranks or plan strings) of one search."""
    if len(refs) < 2:
        raise InputError(f"--compare needs at least two plans (ranks or plan strings), got {len(refs)}")
    if len(refs) > MAX_PLANS:
        raise InputError(f"--compare takes at most {MAX_PLANS} plans, got {len(refs)}")
    out = []
    for name, text in zip(NAMES, refs):
        row = resolve(result, parse_ref(text))
        rank, itself = rank_of(result, row)
        out.append(Compared(name=name, ref=text, row=row, rank=rank, twin=rank is not None and not itself,
                            label=result.label(row), estimate=result.estimate_dict(row)))
    return out


SCALARS = (("step_time_s", "step time (s)"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"),
           ("model_tflops_per_gpu", "model TFLOP/s per GPU"), ("peak_memory_gib", "peak memory (GiB)"))
"""top-level figures compared (estimate JSON keys, display names)."""
PLAN_ROWS = ("gpus", "tp", "cp", "pp", "vpp", "dp", "ep", "sp", "recompute", "zero", "micro_batch", "overlap",
             "order")


def _terms(plans: Sequence[Compared], key: str) -> list[str]:
    """The union of the keys of ``estimate[key]`` over the plans, in first-seen order."""
    names: list[str] = []
    for p in plans:
        names += [k for k in p.estimate.get(key, {}) if k not in names]
    return names


def _summing(plans: Sequence[Compared]) -> tuple[list[str], list[str]]:
    """Breakdown terms that add up to the step time, and the communication totals (partly hidden)."""
    terms = _terms(plans, "breakdown")
    totals = [t for t in terms if t.endswith("_comm") and t != "exposed_comm"]
    return [t for t in terms if t not in totals], totals


def _value(p: Compared, key: str, sub: str | None = None) -> float:
    v = p.estimate.get(key, {}).get(sub) if sub else p.estimate.get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def comparison_json(plans: Sequence[Compared]) -> dict[str, Any]:
    """The ``compare`` object of ``tpsim plan --compare ... --json``: each plan (name, ref, rank, twin, label,
    the ``tpsim estimate --json`` object) and, for every plan after the first, its difference from the first
    (later minus first) for the top-level figures, every breakdown term and every memory term."""
    first = plans[0]
    summing, totals = _summing(plans)
    diffs = []
    for p in plans[1:]:
        d: dict[str, Any] = {"name": p.name, "against": first.name}
        d.update({k: _value(p, k) - _value(first, k) for k, _ in SCALARS})
        d["breakdown"] = {t: _value(p, "breakdown", t) - _value(first, "breakdown", t) for t in summing + totals}
        d["memory_gib"] = {t: _value(p, "memory_gib", t) - _value(first, "memory_gib", t)
                           for t in _terms(plans, "memory_gib")}
        diffs.append(d)
    return _json_safe({"plans": [{"name": p.name, "ref": p.ref, "rank": p.rank, "twin": p.twin, "label": p.label,
                                  "estimate": dict(p.estimate)} for p in plans],
                       "differences": diffs})


def _json_safe(obj: Any) -> Any:
    """NaN and infinities (a term only one plan has) become None: strict JSON."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _plan_field(p: Compared, name: str) -> str:
    plan = p.estimate.get("plan", {})
    if name == "gpus":
        value = p.estimate.get("cluster", {}).get("gpus")
    else:
        value = plan.get(name)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "y" if value else "-"
    return str(value)


def _num(v: float, kind: str) -> str:
    if not np.isfinite(v):
        return "-"
    if kind == "mfu":
        return f"{100 * v:.1f}%"
    if kind == "tokens_per_s":
        return f"{v:,.0f}"
    if kind == "model_tflops_per_gpu":
        return f"{v:.1f}"
    if kind.endswith("gib") or kind == "memory":
        return f"{v:.2f}"
    return f"{v:.3f}"


def _delta(a: float, b: float, kind: str, relative: bool = False) -> str:
    if not (np.isfinite(a) and np.isfinite(b)):
        return "-"
    d = b - a
    if d == 0:
        return "0"
    if kind == "mfu":
        text = f"{100 * d:+.1f} pt"
    elif kind == "tokens_per_s":
        text = f"{d:+,.0f}"
    elif kind == "model_tflops_per_gpu":
        text = f"{d:+.1f}"
    elif kind.endswith("gib") or kind == "memory":
        text = f"{d:+.2f}"
    else:
        text = f"{d:+.3f}"
    if relative and a:
        text += f" ({100 * d / a:+.1f}%)"
    return text


def format_comparison(plans: Sequence[Compared]) -> str:
    """The side-by-side text: a legend (letter, rank, label), then one row per plan field, figure, breakdown
    term and memory term, with a column per plan and, after each later plan, its difference from A."""
    first = plans[0]
    legend = []
    for p in plans:
        where = (f"#{p.rank}" if p.rank and not p.twin else f"twin of #{p.rank}" if p.rank
                 else "not ranked (does not fit)")
        legend.append(f"{p.name}  {p.ref!r}: {p.label}  [{where}]")
    head = [""] + [p.name if k == 0 else c for k, p in enumerate(plans) for c in
                   ((p.name,) if k == 0 else (p.name, f"{p.name}-{first.name}"))]
    rows: list[list[str]] = []

    def add(name: str, values: list[str], deltas: list[str]) -> None:
        row = [name, values[0]]
        for v, d in zip(values[1:], deltas):
            row += [v, d]
        rows.append(row)

    for name in PLAN_ROWS:
        values = [_plan_field(p, name) for p in plans]
        if not any(values) or (name in ("cp", "ep") and set(values) <= {"1", ""}):
            continue
        add(name, values, ["" if v == values[0] else "differs" for v in values[1:]])
    rows.append([])
    for key, title in SCALARS:
        a = _value(first, key)
        add(title, [_num(_value(p, key), key) for p in plans],
            [_delta(a, _value(p, key), key, relative=key != "mfu") for p in plans[1:]])
        band = (f"{key}_low", f"{key}_high")
        if key == "step_time_s" and all(b in p.estimate for p in plans for b in band):
            add("  error band", [f"{_num(_value(p, band[0]), key)}-{_num(_value(p, band[1]), key)}" for p in plans],
                ["" for _ in plans[1:]])
    summing, totals = _summing(plans)
    for title, key, terms, kind in (("breakdown (s; these add up to the step time)", "breakdown", summing, "s"),
                                    ("communication totals (s; partly hidden)", "breakdown", totals, "s"),
                                    ("memory per GPU (GiB)", "memory_gib", _terms(plans, "memory_gib"), "memory")):
        if not terms:
            continue
        rows.append([])
        rows.append([title])
        for t in terms:
            a = _value(first, key, t)
            add(f"  {t}", [_num(_value(p, key, t), kind) for p in plans],
                [_delta(a, _value(p, key, t), kind) for p in plans[1:]])
    return "\n".join(legend + [""] + _align(head, rows))


def _align(head: list[str], rows: list[list[str]]) -> list[str]:
    """Fixed-width columns: the first left-aligned, the others right-aligned; a lone cell is a heading."""
    full = [r for r in rows if len(r) == len(head)]
    widths = [max(len(str(r[k])) for r in [head] + full) for k in range(len(head))]

    def line(r: list[str]) -> str:
        if len(r) != len(head):
            return " ".join(r)
        return "  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]).rstrip()

    return [line(head)] + [line(r) for r in rows]


__all__ = ["PlanRef", "parse_ref", "resolve", "compare", "Compared", "comparison_json", "format_comparison",
           "MAX_PLANS"]
