"""Reliability, checkpoint, restart, straggler and energy figures of a fleet (tpsim/data/reliability.yaml).

One loader, :func:`load_reliability`: a shipped fleet by name (``llama3-h100``, ``rsc1-a100``, ...) or a user
YAML file (``--reliability FILE``) whose keys override the shipped figures: ``fleet`` (the shipped fleet it
starts from), ``components`` (replace the fleet's list), ``checkpoint``, ``restart``, ``stragglers``,
``energy``, ``band`` (merged key by key). Every number is checked (one line naming the field, exit status 2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..limits import check_float

DATA = Path(__file__).resolve().parents[1] / "data" / "reliability.yaml"
PER = ("gpu", "node")
MODES = ("async", "sync")
USER_KEYS = ("fleet", "description", "source", "components", "checkpoint", "restart", "stragglers", "energy",
             "band")
SECTIONS = {
    "checkpoint": ("mode", "mode_source", "aggregate_write_GBps", "aggregate_read_GBps", "aggregate_source",
                   "node_write_GBps", "node_read_GBps", "node_source", "host_copy_GBps", "host_copy_source"),
    "restart": ("fixed_s", "source"),
    "stragglers": ("slow_rank_fraction", "slowdown", "source"),
    "energy": ("pue", "pue_source", "power_fraction", "power_fraction_source", "device_power_w",
               "device_power_source", "node_overhead_w_per_gpu", "node_overhead_source", "node_overhead_ratio"),
    "band": ("rate_low", "rate_high", "source"),
}
COMPONENT_KEYS = ("per", "events", "units", "hours", "planned", "source")
MAX_RATE_PER_HOUR = 1.0
"""failures per unit-hour: one per GPU or node every hour is beyond any fleet (bounds absurd inputs)."""


@dataclass(frozen=True, kw_only=True)
class Component:
    """Interruptions caused by one kind of component: ``rate_per_hour`` per GPU or per node."""

    name: str
    per: str
    """``gpu`` or ``node``: what the rate scales with."""
    rate_per_hour: float
    """interruptions per unit-hour (``events / (units x hours)`` of the source)."""
    planned: bool = False
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class Reliability:
    """Everything the whole-run model needs besides the plan and its estimate (units in the field docs)."""

    name: str
    components: tuple[Component, ...]
    checkpoint_mode: str
    """``async`` (training stalls for the host copy) or ``sync`` (for the whole write)."""
    aggregate_write_Bps: float
    aggregate_read_Bps: float
    node_write_Bps: float
    node_read_Bps: float
    host_copy_Bps: float
    restart_fixed_s: float
    """detection, rescheduling, process-group start and warm-up per restart (seconds; load time excluded)."""
    slow_rank_fraction: float
    slowdown: float
    pue: float
    power_fraction: float
    device_power_w: Mapping[str, float]
    node_overhead_w_per_gpu: Mapping[str, float]
    node_overhead_ratio: float
    rate_low: float
    rate_high: float
    sources: Mapping[str, str] = field(default_factory=dict)
    digest: str = ""
    """SHA-256 of the merged figures (cache keys)."""

    def rates(self, per: str) -> tuple[float, float]:
        """(all, unexpected-only) interruptions per hour of one ``per`` unit."""
        rows = [c for c in self.components if c.per == per]
        return sum(c.rate_per_hour for c in rows), sum(c.rate_per_hour for c in rows if not c.planned)

    def __str__(self) -> str:  # the cache key's text (json default=str)
        return f"Reliability({self.name}, {self.digest})"


def load_reliability(name_or_path: str | Path | None = None) -> Reliability:
    """The shipped default fleet (None), a shipped fleet by name, or a user override file."""
    shipped = _shipped()
    if name_or_path is None or (isinstance(name_or_path, str) and name_or_path in shipped["fleets"]):
        return _build(shipped, {"fleet": name_or_path or shipped["default_fleet"]}, "tpsim/data/reliability.yaml")
    path = Path(name_or_path)
    if path.suffix.lower() not in (".yaml", ".yml") and not path.exists():
        raise InputError(f"--reliability {name_or_path!s}: neither a shipped fleet "
                         f"({', '.join(shipped['fleets'])}) nor a YAML file")
    from ..safeyaml import read_yaml

    from ..schema import check
    from ..schemas import RELIABILITY

    user = read_yaml(path, "reliability file")
    if not isinstance(user, Mapping):
        raise InputError(f"{path}: a reliability file is a mapping of {', '.join(USER_KEYS)}")
    check(RELIABILITY, user, str(path))  # types and ranges before use (issue 26)
    return _build(shipped, user, str(path))


@lru_cache(maxsize=1)
def _shipped() -> dict[str, Any]:
    from ..safeyaml import load_data

    return load_data(DATA)


def _build(shipped: Mapping[str, Any], user: Mapping[str, Any], where: str) -> Reliability:
    unknown = sorted(set(user) - set(USER_KEYS), key=str)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(USER_KEYS)})")
    fleet_name = user.get("fleet", shipped["default_fleet"])
    if fleet_name not in shipped["fleets"]:
        raise InputError(f"{where}: fleet={fleet_name!r} is not a shipped fleet "
                         f"({', '.join(shipped['fleets'])})")
    fleet = shipped["fleets"][fleet_name]
    sections = {}
    for name, keys in SECTIONS.items():
        body = user.get(name, {})
        if not isinstance(body, Mapping):
            raise InputError(f"{where}: {name} must be a mapping of {', '.join(keys)}")
        bad = sorted(set(body) - set(keys), key=str)
        if bad:
            raise InputError(f"{where}: {name}.{bad[0]} is not a known key (known: {', '.join(keys)})")
        sections[name] = {**shipped["defaults"][name], **body}
    components = _components(user.get("components", fleet["components"]),
                             where if "components" in user else "tpsim/data/reliability.yaml")
    name = fleet_name if where.startswith("tpsim/data") else f"{fleet_name}+{Path(where).name}"
    merged = {"fleet": fleet_name, "components": [c.__dict__ for c in components], **sections}
    digest = hashlib.sha256(json.dumps(merged, sort_keys=True, default=str).encode()).hexdigest()
    return _reliability(name, components, sections, where, digest,
                        str(user.get("source", fleet.get("source", ""))).strip())


def _components(body: Any, where: str) -> tuple[Component, ...]:
    if not isinstance(body, Mapping) or not body:
        raise InputError(f"{where}: components must be a non-empty mapping of name -> "
                         f"{{{', '.join(COMPONENT_KEYS)}}}")
    out = []
    for name, c in body.items():
        at = f"{where}: components.{name}"
        if not isinstance(c, Mapping):
            raise InputError(f"{at} must be a mapping of {', '.join(COMPONENT_KEYS)}")
        bad = sorted(set(c) - set(COMPONENT_KEYS), key=str)
        if bad:
            raise InputError(f"{at}.{bad[0]} is not a known key (known: {', '.join(COMPONENT_KEYS)})")
        if c.get("per") not in PER:
            raise InputError(f"{at}.per={c.get('per')!r} must be one of {', '.join(PER)}")
        if not isinstance(c.get("source"), str) or not c["source"].strip():
            raise InputError(f"{at}.source is required: every rate names where it comes from")
        events = check_float("events", c.get("events"), at, minimum=0.0, inclusive=True, maximum=1e12)
        units = check_float("units", c.get("units"), at, maximum=1e12)
        hours = check_float("hours", c.get("hours"), at, maximum=1e9)
        rate = events / (units * hours)
        if rate > MAX_RATE_PER_HOUR:
            raise InputError(f"{at}: events/(units x hours) = {rate:g} per {c['per']}-hour is above "
                             f"{MAX_RATE_PER_HOUR:g} (one interruption per {c['per']} per hour)")
        planned = c.get("planned", False)
        if not isinstance(planned, bool):
            raise InputError(f"{at}.planned={planned!r} must be true or false")
        out.append(Component(name=str(name), per=c["per"], rate_per_hour=rate, planned=planned,
                             source=c["source"].strip()))
    return tuple(out)


def _reliability(name: str, components: tuple[Component, ...], s: Mapping[str, Mapping[str, Any]], where: str,
                 digest: str, fleet_source: str) -> Reliability:
    ck, rs, st, en, bd = (s[k] for k in ("checkpoint", "restart", "stragglers", "energy", "band"))
    if ck["mode"] not in MODES:
        raise InputError(f"{where}: checkpoint.mode={ck['mode']!r} must be one of {', '.join(MODES)}")
    gbps = {k: check_float(f"checkpoint.{k}", ck[k], where, maximum=1e9) * 1e9
            for k in ("aggregate_write_GBps", "aggregate_read_GBps", "node_write_GBps", "node_read_GBps",
                      "host_copy_GBps")}
    band_low = check_float("band.rate_low", bd["rate_low"], where, maximum=1.0, inclusive=True)
    band_high = check_float("band.rate_high", bd["rate_high"], where, minimum=1.0, inclusive=True, maximum=1e3)
    return Reliability(
        name=name, components=components, checkpoint_mode=ck["mode"],
        aggregate_write_Bps=gbps["aggregate_write_GBps"], aggregate_read_Bps=gbps["aggregate_read_GBps"],
        node_write_Bps=gbps["node_write_GBps"], node_read_Bps=gbps["node_read_GBps"],
        host_copy_Bps=gbps["host_copy_GBps"],
        restart_fixed_s=check_float("restart.fixed_s", rs["fixed_s"], where, inclusive=True, maximum=1e7),
        slow_rank_fraction=check_float("stragglers.slow_rank_fraction", st["slow_rank_fraction"], where,
                                       inclusive=True, maximum=1.0),
        slowdown=check_float("stragglers.slowdown", st["slowdown"], where, inclusive=True, maximum=100.0),
        pue=check_float("energy.pue", en["pue"], where, minimum=1.0, inclusive=True, maximum=10.0),
        power_fraction=check_float("energy.power_fraction", en["power_fraction"], where, maximum=2.0),
        device_power_w=_watts(en["device_power_w"], "energy.device_power_w", where),
        node_overhead_w_per_gpu=_watts(en["node_overhead_w_per_gpu"], "energy.node_overhead_w_per_gpu", where),
        node_overhead_ratio=check_float("energy.node_overhead_ratio", en["node_overhead_ratio"], where,
                                        inclusive=True, maximum=10.0),
        rate_low=band_low, rate_high=band_high, digest=digest,
        sources={"fleet": fleet_source, "checkpoint": f"{ck['aggregate_source']} {ck['node_source']}".strip(),
                 "restart": str(rs["source"]).strip(), "stragglers": str(st["source"]).strip(),
                 "energy": f"{en['pue_source']} {en['device_power_source']}".strip(),
                 "band": str(bd["source"]).strip()})


def _watts(body: Any, field_name: str, where: str) -> dict[str, float]:
    if not isinstance(body, Mapping):
        raise InputError(f"{where}: {field_name} must be a mapping of device name -> watts")
    return {str(k): check_float(f"{field_name}.{k}", v, where, maximum=1e5) for k, v in body.items()}
