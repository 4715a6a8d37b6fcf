"""A cluster: nodes of one template on one fabric, its networkx graph and structure-aware routing.

Graph schema (shared with :mod:`tpsim.collectives`):

* node ids are strings: ``n<node>/<group><i>`` inside node ``<node>`` (``n3/gpu5``, ``n3/nvswitch0``),
  ``leaf<i>``, ``spine<i>`` / ``spine<pod>.<j>``, ``core<j>.<c>`` for fabric switches;
  attributes ``kind`` (gpu, nvswitch, pcie_switch, cpu, nic, switch), ``node_index`` (-1 for fabric switches),
  ``local_index`` (gpu/nic/nvswitch index in the node, else -1), ``level`` (0 in a node, 1 leaf, 2 spine,
  3 core), ``sharp`` (in-switch reduction), ``rank`` (GPUs only).
* each physical link is two directed edges with ``type``, ``bw_GBps`` (per direction, all lanes),
  ``lanes``, ``latency_us``, ``efficiency``.

Rank r sits on node r // gpus_per_node, local GPU r % gpus_per_node. Routing (:meth:`Cluster.paths`) never
searches the big graph: it combines cached routes inside a node template with the fabric's own routes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from functools import cached_property
from typing import Any, Iterator

from ..errors import InputError
from ..hardware import DeviceSpec, get_device
from .fabric import FatTree, Torus, check_fabric_fits
from .node import EdgeAttrs, NodeLayout, Route
from .spec import ClusterSpec

Paths = list[tuple[float, tuple[tuple[str, str], ...]]]


class Cluster:
    """A loaded cluster (read-only). Build with :func:`tpsim.topology.load_cluster`."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.name = spec.name
        try:
            self.device: DeviceSpec = spec.device_spec or get_device(spec.device)
        except InputError as exc:
            raise InputError(f"{spec.path}: {exc}") from None
        self.gpus_per_node: int = spec.gpus_per_node
        self.num_gpus: int = spec.gpus
        self.num_nodes: int = spec.gpus // spec.gpus_per_node
        self.node_template_name: str = spec.node.name
        self.fabric_name: str = spec.fabric.name
        self.layout = NodeLayout(spec.node, self.gpus_per_node, spec.default_efficiency, spec.calibration)
        fabric = spec.fabric
        check_fabric_fits(fabric, self.layout, self.num_nodes, spec.path)
        torus = fabric.type == "torus"
        self.layout.check(needs_intra=not torus,
                          needs_nic=self.num_nodes > 1 and fabric.type in ("fat_tree", "rail_optimized"))
        self.fabric: FatTree | Torus | None = None
        if torus:
            self.fabric = Torus(fabric, self.num_gpus, self.gpus_per_node, self.layout.gpu_group,
                                spec.default_efficiency, spec.calibration)
        elif fabric.type in ("fat_tree", "rail_optimized") and self.num_nodes > 1:
            self.fabric = FatTree(fabric, self.num_nodes, len(self.layout.nics), self.layout.nic_groups[0],
                                  spec.default_efficiency, spec.calibration)
        self._paths: dict[tuple[int, int], tuple] = {}

    def __repr__(self) -> str:
        return (f"Cluster({self.name!r}, {self.num_gpus} x {self.device.name}, {self.num_nodes} nodes of "
                f"{self.node_template_name}, fabric {self.fabric_name})")

    # ------------------------------------------------------------------------------------------ ranks
    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, (int,)) or isinstance(rank, bool) or not 0 <= rank < self.num_gpus:
            raise InputError(f"rank={rank!r} is out of range for {self.name} with {self.num_gpus} GPUs")

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def gpu_id(self, rank: int) -> str:
        """Graph node id of the GPU holding ``rank``."""
        self._check_rank(rank)
        return f"n{rank // self.gpus_per_node}/{self.layout.gpu(rank % self.gpus_per_node)}"

    def nic_id(self, rank: int) -> str | None:
        """Graph node id of the NIC the GPU of ``rank`` uses (None without NICs)."""
        self._check_rank(rank)
        nic = self.layout.nic_of(rank % self.gpus_per_node) if self.layout.nics else ""
        return f"n{rank // self.gpus_per_node}/{nic}" if nic else None

    def rail(self, rank: int) -> int:
        """Local index of the NIC of ``rank`` (its rail); -1 without NICs."""
        nic = self.nic_id(rank)
        return -1 if nic is None else self.layout.devices[nic.split("/", 1)[1]]["local_index"]

    # ------------------------------------------------------------------------------------------ routing
    def paths(self, src_rank: int, dst_rank: int) -> Paths:
        """Weighted paths (fractions summing to 1) of directed edges from one rank's GPU to another's."""
        key = (src_rank, dst_rank)
        cached = self._paths.get(key)
        if cached is None:
            self._check_rank(src_rank)
            self._check_rank(dst_rank)
            cached = self._route(src_rank, dst_rank)
            self._paths[key] = cached
        return list(cached)

    def _route(self, a: int, b: int) -> tuple:
        if a == b:
            return ()
        if isinstance(self.fabric, Torus):
            return self.fabric.route(a, b)
        gpn = self.gpus_per_node
        na, ia, nb, ib = a // gpn, a % gpn, b // gpn, b % gpn
        if na == nb:
            return _prefix(self.layout.gpu_route(ia, ib), na)
        assert isinstance(self.fabric, FatTree)
        nic_b = self.layout.nic_of(ib)
        proxy = self._proxy(ia, nic_b)
        nic_a = self.layout.nic_of(proxy)
        rail = lambda nic: self.layout.devices[nic]["local_index"]
        segments = [_prefix(self.layout.gpu_route(ia, proxy), na) if proxy != ia else (),
                    _prefix(self.layout.to_nic(proxy), na),
                    self.fabric.route(na, rail(nic_a), nb, rail(nic_b)),
                    _prefix(self.layout.from_nic(ib), nb)]
        return _chain(*segments)

    def _proxy(self, local: int, dst_nic: str) -> int:
        """PXN (NCCL >= 2.12): the local GPU on the destination's rail, reached over NVLink, else ``local``."""
        if not (self.spec.fabric.pxn and self.layout.has_nvlink) or self.layout.nic_of(local) == dst_nic:
            return local
        for other in self.layout.gpus_on_rail(dst_nic):
            if self.layout.nvlink_peers(local, other):
                return other
        return local

    # ------------------------------------------------------------------------------------------ graph
    def devices(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(id, attributes) of every device, in the graph schema."""
        gpn = self.gpus_per_node
        for node in range(self.num_nodes):
            for local_id, attrs in self.layout.devices.items():
                out = dict(attrs, node_index=node)
                if attrs["kind"] == "gpu":
                    out["rank"] = node * gpn + attrs["local_index"]
                yield f"n{node}/{local_id}", out
        if isinstance(self.fabric, FatTree):
            yield from self.fabric.switches().items()

    def links(self) -> Iterator[tuple[str, str, EdgeAttrs]]:
        """Every directed edge with its attributes."""
        for node in range(self.num_nodes):
            prefix = f"n{node}/"
            for (u, v), attrs in self.layout.edges.items():
                yield prefix + u, prefix + v, attrs
        if self.fabric is not None:
            yield from self.fabric.edges()

    @cached_property
    def edge_table(self) -> dict[tuple[str, str], EdgeAttrs]:
        """(u, v) -> attributes of every directed edge (no networkx needed)."""
        table: dict[tuple[str, str], EdgeAttrs] = {}
        for u, v, attrs in self.links():
            if (u, v) in table:
                raise InputError(f"{self.spec.path}: duplicate link {u} -> {v}")
            table[(u, v)] = attrs
        return table

    def link(self, u: str, v: str) -> dict[str, Any]:
        """Attributes of the directed edge u -> v (same keys as the graph's edges)."""
        try:
            return self.edge_table[(u, v)].as_dict()
        except KeyError:
            raise InputError(f"{self.name}: no link {u} -> {v}") from None

    @cached_property
    def graph(self):
        """The networkx DiGraph (built on first use)."""
        import networkx as nx

        graph = nx.DiGraph(name=self.name)
        graph.add_nodes_from(self.devices())
        graph.add_edges_from((u, v, a.as_dict()) for (u, v), a in self.edge_table.items())
        return graph

    # ------------------------------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """SHA-256 of the resolved inputs (cluster, node template, fabric, link kinds, calibration, sizes)."""
        spec = self.spec
        from .spec import load_link_kinds, links_file
        from .files import read_yaml
        load_link_kinds()
        payload = {"cluster": spec.raw, "node": spec.node.raw, "fabric": spec.fabric.raw,
                   "links": read_yaml(links_file()), "gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                   "calibration": None if spec.calibration is None else
                   {"per_type": spec.calibration.per_type, "provenance": spec.calibration.provenance}}
        text = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    # ------------------------------------------------------------------------------------------ summaries
    def injection_bandwidth(self) -> dict[str, float]:
        """Per-GPU bandwidth per direction, GB/s: ``nvlink`` (sum of a GPU's NVLinks), ``pcie`` (its PCIe
        links), ``network`` (its share of the node's NIC links, or a chip's torus links)."""
        from .analysis import injection_bandwidth
        return injection_bandwidth(self)

    def bisection_bandwidth(self) -> float:
        """GB/s per direction across the cut between the first and second half of the ranks (max flow)."""
        from .analysis import bisection_bandwidth
        return bisection_bandwidth(self)

    def check(self) -> None:
        """Full check on the graph: every GPU reaches every other one and every route uses existing links."""
        from .analysis import check_cluster
        check_cluster(self)


def _prefix(route: Route, node: int) -> Route:
    p = f"n{node}/"
    return tuple((f, tuple((p + u, p + v) for u, v in path)) for f, path in route)


def _chain(*segments: Route) -> Route:
    """Concatenate independent route segments: fractions multiply, paths concatenate."""
    parts = [s for s in segments if s]
    out = []
    for combo in itertools.product(*parts):
        frac = 1.0
        path: tuple = ()
        for f, p in combo:
            frac *= f
            path += p
        out.append((frac, path))
    return tuple(out)
