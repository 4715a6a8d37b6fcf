"""NCCL's cost-model constants, read from ``tpsim/data/nccl_tuning_constants.csv`` and ``nccl_model.yaml``.

NCCL (src/graph/tuning.cc) models a collective as ``latency + bytes / algBw`` with
``latency = baseLat[algo][proto] + steps * hwLat[hw][algo][proto]`` where ``hw`` is NVLINK, PCI or NET.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

from ..errors import InputError
from ..hardware import DATA_DIR
from ..safeyaml import load_data

PROTOCOLS = ("LL", "LL128", "Simple")
HW_CLASSES = ("NVLINK", "PCI", "NET")


@dataclass(frozen=True, kw_only=True)
class ArchCaps:
    """Per-architecture caps of NCCL's model, GB/s, each indexed [1 node, 2 nodes, >2 nodes]."""

    ll_max_bw: tuple[float, float, float]
    ring_ll128_per_channel: tuple[float, float, float]
    tree_ll128_per_channel: tuple[float, float, float]
    tree_per_channel: tuple[float, float, float]
    nvls_efficiency: float
    """fraction of NVLink bandwidth NVLS reaches (0 = the GPU has no NVLS)."""


@dataclass(frozen=True, kw_only=True)
class ProtocolFactors:
    """NCCL's protocol bandwidth factors and latency refinements (``nccl_model.yaml``: protocol_factors,
    latency_factors; tuning.cc ncclTopoTuneModel). Dimensionless."""

    ring_ll_allreduce: float
    ring_ll_other: float
    ring_ll_multinode: float
    ring_ll128_ppn_ge_2: float
    ring_ll128_ppn_lt_2: float
    tree: float
    """every tree protocol: busBw x this, before the per-channel cap."""
    tree_ll: float
    tree_ll128_single_node: float
    tree_ll128_multinode: float
    p2p_ll: float
    p2p_simple: float
    ll_intra_multinode: float
    """LL intra-node hwLat multiplier when the communicator spans nodes."""
    ring_allreduce_plateau: float
    """ring/Simple all-reduce latency multiplier across nodes."""


@dataclass(frozen=True, kw_only=True)
class NcclConstants:
    version: str
    base_lat_us: Mapping[tuple[str, str], float]
    """(algorithm, protocol) -> us."""
    hw_lat_us: Mapping[tuple[str, str, str], float]
    """(hw class, algorithm, protocol) -> us per step."""
    arch: Mapping[str, ArchCaps]
    device_arch: Mapping[str, str]
    default_arch: str
    max_channels: int
    pcie_channels: int
    pipeline_overhead_us: float
    """fitted per-chunk overhead of a pipelined step (nccl_model.yaml)."""
    launch_us: float
    """host launch time per GPU of a single-process nccl-tests run (nccl_model.yaml)."""
    nvlink_lane_GBps: Mapping[str, float]
    """arch -> GB/s NCCL assumes per NVLink lane and direction (topo.h)."""
    link_efficiency: Mapping[str, float]
    """link type -> fraction of line rate NCCL reaches."""
    factors: ProtocolFactors
    bus_factors: Mapping[str, tuple[float, float]]
    """op -> (a, b): nccl-tests busbw = algbw x (a n + b) / n."""

    def bus(self, op: str, n: int) -> float:
        """nccl-tests bus factor of ``op`` on ``n`` ranks (busbw / algbw); also the bytes a ring hop carries
        per byte of buffer for the ring collectives."""
        a, b = self.bus_factors[op]
        return (a * n + b) / n

    def base(self, algo: str, proto: str) -> float:
        return self.base_lat_us.get((algo, proto), 0.0)

    def hw(self, hw: str, algo: str, proto: str) -> float:
        return self.hw_lat_us.get((hw, algo, proto), 0.0)

    def arch_of(self, device: str) -> str:
        """The NCCL constant row of ``device``: the table's entry, else the device's own architecture family
        (devices.yaml ``architecture``: B300, GB200, GB300 read the blackwell row, H800 the hopper row) when
        NCCL has a row for it, else ``default_arch``."""
        if device in self.device_arch:
            return self.device_arch[device]
        try:
            from ..hardware import get_device
            family = get_device(device).architecture
        except InputError:
            family = None
        return family if family in self.arch else self.default_arch

    def caps(self, device: str) -> ArchCaps:
        return self.arch[self.arch_of(device)]


def nodes_index(num_nodes: int) -> int:
    """Column of the per-arch tables: 0 for one node, 1 for two, 2 for more (tuning.cc ``index2``)."""
    return 0 if num_nodes <= 1 else 1 if num_nodes == 2 else 2


@lru_cache(maxsize=4)
def nccl_constants(version: str | None = None) -> NcclConstants:
    """Constants of one NCCL version of the CSV (default: ``nccl_version`` of nccl_model.yaml)."""
    raw = load_data(DATA_DIR / "nccl_model.yaml")
    version = version or os.environ.get("TPSIM_NCCL_VERSION") or str(raw["nccl_version"])
    base, hw = _latency_tables(version)
    arch = {name: ArchCaps(ll_max_bw=tuple(a["llMaxBw"]), ring_ll128_per_channel=tuple(a["perChMaxRingLL128Bw"]),
                           tree_ll128_per_channel=tuple(a["perChMaxTreeLL128Bw"]),
                           tree_per_channel=tuple(a["perChMaxTreeBw"]), nvls_efficiency=float(a["nvlsEfficiency"]))
            for name, a in raw["arch"].items()}
    return NcclConstants(version=version, base_lat_us=base, hw_lat_us=hw, arch=arch,
                         device_arch=dict(raw["device_arch"]), default_arch=str(raw["default_arch"]),
                         max_channels=int(raw["max_channels"]), pcie_channels=int(raw["pcie_channels"]),
                         pipeline_overhead_us=float(raw["pipeline_chunk_overhead_us"]),
                         launch_us=float(raw["nccl_tests_launch_us"]),
                         nvlink_lane_GBps={k: float(v) for k, v in raw["nccl_nvlink_lane_GBps"].items()},
                         link_efficiency={k: float(v) for k, v in raw["nccl_link_efficiency"].items()},
                         factors=_factors(raw), bus_factors={op: (float(a), float(b))
                                                             for op, (a, b) in raw["bus_factors"].items()})


def _factors(raw: Mapping) -> ProtocolFactors:
    ring, tree, p2p = (raw["protocol_factors"][k] for k in ("ring", "tree", "p2p"))
    lat = raw["latency_factors"]
    return ProtocolFactors(
        ring_ll_allreduce=float(ring["LL"]["allreduce"]), ring_ll_other=float(ring["LL"]["other"]),
        ring_ll_multinode=float(ring["LL"]["multinode"]), ring_ll128_ppn_ge_2=float(ring["LL128"]["ppn_ge_2"]),
        ring_ll128_ppn_lt_2=float(ring["LL128"]["ppn_lt_2"]), tree=float(tree["all"]), tree_ll=float(tree["LL"]),
        tree_ll128_single_node=float(tree["LL128"]["single_node"]),
        tree_ll128_multinode=float(tree["LL128"]["multinode"]), p2p_ll=float(p2p["LL"]),
        p2p_simple=float(p2p["Simple"]), ll_intra_multinode=float(lat["ll_intra_multinode"]),
        ring_allreduce_plateau=float(lat["ring_allreduce_plateau"]))


def _latency_tables(version: str) -> tuple[dict, dict]:
    base: dict[tuple[str, str], float] = {}
    hw: dict[tuple[str, str, str], float] = {}
    with open(DATA_DIR / "nccl_tuning_constants.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["nccl_version"] != version:
                continue
            key = (row["algorithm"], row["protocol"])
            if row["table"] == "baseLatencies":
                base[key] = float(row["value_us"])
            else:
                hw[(row["hw"],) + key] = float(row["value_us"])
    if not base:
        raise InputError(f"TPSIM_NCCL_VERSION={version!r} is not in nccl_tuning_constants.csv "
                         "(known: 2.18.5-1, 2.30.7-1)")
    return base, hw
