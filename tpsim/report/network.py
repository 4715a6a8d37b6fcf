"""What-if clusters: the same cluster with its network (inter-node) links scaled, for the bandwidth heat map.

The topology package loads clusters from files and has no bandwidth override, so a variant is built from the
loaded cluster's :class:`~tpsim.topology.spec.ClusterSpec`: the fabric's network link kinds (``nic_link``,
``switch_link``, torus ``link``, those of type :data:`tpsim.topology.analysis.NETWORK_TYPES`) get their
per-lane bandwidth multiplied, and so does a calibration override of those link types if the cluster has one
(it would take precedence). The fabric's ``raw`` mapping gains a ``what_if_bandwidth_scale`` key so that the
cluster's :meth:`fingerprint` (the key of the collective-model cache) differs from the original's. The
result is checked: the per-GPU network injection bandwidth must come out scaled by exactly the factor.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from ..errors import InputError


def inter_node_bandwidth_GBps(cluster: Any) -> float:
    """Per-GPU network injection bandwidth of the cluster, GB/s per direction."""
    return float(cluster.injection_bandwidth()["network"])


def _scaled_kind(kind: Any, scale: float, network: tuple[str, ...]) -> Any:
    if kind is None or kind.type not in network:
        return kind
    return dataclasses.replace(kind, bw_GBps=kind.bw_GBps * scale)


def _scaled_calibration(calibration: Any, scale: float, network: tuple[str, ...]) -> Any:
    if calibration is None:
        return None
    per_type = {t: (dict(v, bw_GBps=v["bw_GBps"] * scale) if t in network and "bw_GBps" in v else dict(v))
                for t, v in calibration.per_type.items()}
    return dataclasses.replace(calibration, per_type=per_type)


@lru_cache(maxsize=32)
def _variant(cluster: Any, scale: float) -> Any:
    from ..topology.analysis import NETWORK_TYPES
    from ..topology.cluster import Cluster

    spec = cluster.spec
    fabric = spec.fabric
    raw = dict(fabric.raw)
    raw["what_if_bandwidth_scale"] = scale
    fabric = dataclasses.replace(
        fabric, nic_link=_scaled_kind(fabric.nic_link, scale, NETWORK_TYPES),
        switch_link=_scaled_kind(fabric.switch_link, scale, NETWORK_TYPES),
        link=_scaled_kind(fabric.link, scale, NETWORK_TYPES), raw=raw)
    variant = Cluster(dataclasses.replace(spec, fabric=fabric,
                                          calibration=_scaled_calibration(spec.calibration, scale, NETWORK_TYPES)))
    base = inter_node_bandwidth_GBps(cluster)
    got = inter_node_bandwidth_GBps(variant)
    if base <= 0 or abs(got - base * scale) > 1e-6 * base * scale:
        raise InputError(f"cluster {cluster.name}: cannot scale its network bandwidth by {scale:g} "
                         f"(injection {base:g} GB/s -> {got:g} GB/s); the bandwidth heat map needs a network fabric")
    return variant


def scale_inter_node_bandwidth(cluster: Any, scale: float) -> Any:
    """The cluster with every network link ``scale`` times as fast (the cluster itself for scale 1)."""
    if not scale > 0:
        raise InputError(f"bandwidth scale={scale!r} must be positive")
    if scale == 1.0:
        return cluster
    return _variant(cluster, float(scale))
