"""What a link delivers to the collective model: capacity (bytes/s) and latency (s) of one directed edge.

One rule for both routers (the full graph of :mod:`tpsim.collectives.fabric` and the structural model of
:mod:`tpsim.collectives.structure`), so that both see the same numbers for the same edge:

``capacity = bw_GBps x efficiency``, capped at what NCCL reaches on the link type (``nccl_model.yaml``:
``nccl_nvlink_lane_GBps`` per lane, ``nccl_link_efficiency`` of the line rate) unless a calibration names
the type; a calibration's ``bw_GBps`` / ``efficiency`` / ``latency_us`` replace the edge's own values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..units import GB, US


@dataclass(frozen=True, kw_only=True)
class LinkRules:
    """Per link type: calibration overrides and NCCL caps."""

    calibrated: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """link type -> overrides ``{efficiency, latency_us, bw_GBps}``; a type listed here (even with no
    overrides) is calibrated, so the NCCL caps do not apply to it."""
    lane_limit_GBps: Mapping[str, float] = field(default_factory=dict)
    """link type -> GB/s NCCL reaches per lane (NVLink by architecture)."""
    efficiency_limit: Mapping[str, float] = field(default_factory=dict)
    """link type -> fraction of the line rate NCCL reaches."""

    def capacity(self, kind: str, bw_GBps: float, efficiency: float, lanes: int) -> float:
        """Bytes/s of one directed edge of type ``kind`` (``bw_GBps``: all lanes, per direction)."""
        over = self.calibrated.get(kind, {})
        bw = float(over.get("bw_GBps", bw_GBps))
        cap = bw * float(over.get("efficiency", efficiency))
        if kind not in self.calibrated:
            if kind in self.lane_limit_GBps:
                cap = min(cap, self.lane_limit_GBps[kind] * float(lanes or 1))
            if kind in self.efficiency_limit:
                cap = min(cap, bw * self.efficiency_limit[kind])
        return cap * GB

    def latency(self, kind: str, latency_us: float) -> float:
        """Seconds of one traversal."""
        return float(self.calibrated.get(kind, {}).get("latency_us", latency_us)) * US

    def of(self, attrs: Mapping[str, Any] | Any) -> tuple[float, float]:
        """(capacity bytes/s, latency s) of an edge given as a graph attribute dict or an ``EdgeAttrs``."""
        if type(attrs) is dict:
            kind, bw, eff, lanes, lat = (attrs["type"], attrs["bw_GBps"], attrs.get("efficiency", 1.0),
                                         attrs.get("lanes", 1), attrs.get("latency_us", 0.0))
        else:
            kind, bw, eff, lanes, lat = attrs.type, attrs.bw_GBps, attrs.efficiency, attrs.lanes, attrs.latency_us
        return (self.capacity(kind, float(bw), float(eff or 1.0), int(lanes or 1)),
                self.latency(kind, float(lat or 0.0)))


@dataclass(frozen=True)
class RouteInfo:
    """The directed edges of one route (rank to rank), each with the fraction of the flow it carries."""

    types: tuple[str, ...]
    fraction: np.ndarray
    latency_s: np.ndarray
    """seconds per traversal of each edge (calibrated)."""
    capacity: np.ndarray
    """bytes/s of each edge (calibrated, NCCL caps)."""
    bw_GBps: np.ndarray
    """the edge's own bandwidth (all lanes, per direction) from the topology."""

    @property
    def mean_latency_s(self) -> float:
        """Mean path latency: sum over edges of fraction x latency."""
        return float(np.dot(self.latency_s, self.fraction)) if len(self.fraction) else 0.0

    def type_set(self) -> set[str]:
        return set(self.types)


@dataclass(frozen=True)
class FastLinks:
    """A GPU's NVLink / ICI links (NCCL's intra-node channels and NVLS)."""

    lanes: int
    """lanes over all of them (0: the GPU has none, so NCCL uses PCIe)."""
    up_capacity: float
    """bytes/s of the GPU -> peer/switch edges together."""
    down_capacity: float
    """bytes/s of the reverse edges together."""
    nvls_switches: bool
    """every one of them ends on an NVSwitch with in-switch reduction (``sharp``)."""


class RouteQueries:
    """Convenience queries every router offers on top of ``route(src, dst) -> RouteInfo``."""

    def route(self, src: int, dst: int) -> RouteInfo:  # pragma: no cover - implemented by the routers
        raise NotImplementedError

    def route_types(self, src: int, dst: int) -> set[str]:
        """Link types on the route from rank ``src`` to rank ``dst``."""
        return self.route(src, dst).type_set()

    def route_latency(self, src: int, dst: int) -> float:
        """Seconds along the route (mean over its paths, by fraction)."""
        return self.route(src, dst).mean_latency_s
