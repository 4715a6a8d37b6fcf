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
        # a node may hold more GPUs than the job uses of it (gpus_per_node below the template's count, e.g. 64
        # of an NVL72 rack's 72): the layout is the whole template, ranks fill its first gpus_per_node GPUs
        self.layout = NodeLayout(spec.node, spec.node.gpu_group.count or self.gpus_per_node,
                                 spec.default_efficiency, spec.calibration)
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
        self._fingerprint: str | None = None

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
        return _chain(*self.route_segments(a, b)) if a != b else ()

    def route_segments(self, a: int, b: int) -> list[Route]:
        """The independent parts of the route from rank ``a`` to rank ``b``, in order (GPU to proxy GPU, to
        the NIC, through the fabric, NIC to GPU); ``paths`` is their product. Each part's fractions sum to 1,
        so a link's share of the flow is its own part's fraction."""
        self._check_rank(a)
        self._check_rank(b)
        if a == b:
            return []
        if isinstance(self.fabric, Torus):
            return [self.fabric.route(a, b)]
        gpn = self.gpus_per_node
        na, ia, nb, ib = a // gpn, a % gpn, b // gpn, b % gpn
        if na == nb:
            return [_prefix(self.layout.gpu_route(ia, ib), na)]
        assert isinstance(self.fabric, FatTree)
        nic_b = self.layout.nic_of(ib)
        proxy = self._proxy(ia, nic_b)
        nic_a = self.layout.nic_of(proxy)
        rail = lambda nic: self.layout.devices[nic]["local_index"]
        segments = [_prefix(self.layout.gpu_route(ia, proxy), na) if proxy != ia else (),
                    _prefix(self.layout.to_nic(proxy), na),
                    self.fabric.route(na, rail(nic_a), nb, rail(nic_b)),
                    _prefix(self.layout.from_nic(ib), nb)]
        return [s for s in segments if s]

    def _proxy(self, local: int, dst_nic: str) -> int:
        """PXN (NCCL >= 2.12): the local GPU on the destination's rail, reached over NVLink, else ``local``."""
        if not (self.spec.fabric.pxn and self.layout.has_nvlink) or self.layout.nic_of(local) == dst_nic:
            return local
        for other in self.layout.gpus_on_rail(dst_nic):
            if other < self.gpus_per_node and self.layout.nvlink_peers(local, other):
                return other
        return local

    # ------------------------------------------------------------------------------------------ graph
    def devices(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(id, attributes) of every device, in the graph schema."""
        gpn = self.gpus_per_node
        for node in range(self.num_nodes):
            for local_id, attrs in self.layout.devices.items():
                out = dict(attrs, node_index=node)
                if attrs["kind"] == "gpu":   # rank -1: a GPU of the node the job does not use (spare)
                    out["rank"] = node * gpn + attrs["local_index"] if attrs["local_index"] < gpn else -1
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

    def graph_size(self) -> tuple[int, int]:
        """(devices, directed edges) of the full graph, counted from the structure without building it."""
        layout = self.layout
        vertices = self.num_nodes * len(layout.devices)
        edges = self.num_nodes * len(layout.edges)
        if isinstance(self.fabric, FatTree):
            vertices += self.fabric.num_switches()
            edges += 2 * self.num_nodes * self.fabric.rails + 2 * self.fabric.num_switch_links()
        elif isinstance(self.fabric, Torus):
            edges += 2 * self.fabric.num_links()
        return vertices, edges

    def check_graph_size(self, what: str = "build its full graph") -> None:
        """InputError (one line) when the full graph would exceed ``tpsim.limits.MAX_GRAPH_NODES`` devices."""
        from ..limits import MAX_GRAPH_NODES

        vertices, _ = self.graph_size()
        if vertices > MAX_GRAPH_NODES:
            raise InputError(f"cluster {self.name} with {self.num_gpus} GPUs has {vertices} devices, above "
                             f"MAX_GRAPH_NODES={MAX_GRAPH_NODES} (tpsim/limits.py): too large to {what}; the "
                             f"collective model, `tpsim topo show` and `topo check` use its structure instead")

    @cached_property
    def edge_table(self) -> dict[tuple[str, str], EdgeAttrs]:
        """(u, v) -> attributes of every directed edge (no networkx needed; refused above
        ``MAX_GRAPH_NODES`` devices, see :meth:`check_graph_size`)."""
        from .progress import progress

        self.check_graph_size("list every link")
        table: dict[tuple[str, str], EdgeAttrs] = {}
        _, total = self.graph_size()
        with progress(total, f"{self.name}: links", "link", quick=total < 200_000) as bar:
            for i, (u, v, attrs) in enumerate(self.links()):
                if (u, v) in table:
                    raise InputError(f"{self.spec.path}: duplicate link {u} -> {v}")
                table[(u, v)] = attrs
                if i % 4096 == 4095:
                    bar.update(4096)
        return table

    def link(self, u: str, v: str) -> dict[str, Any]:
        """Attributes of the directed edge u -> v (same keys as the graph's edges)."""
        return self.link_attrs(u, v).as_dict()

    def link_attrs(self, u: str, v: str) -> EdgeAttrs:
        """Attributes of the directed edge u -> v, found from the device names and the structure (no edge
        table, any cluster size); InputError when there is no such edge."""
        found = None
        nu, _, lu = u.partition("/") if u.startswith("n") and "/" in u else ("", "", u)
        nv, _, lv = v.partition("/") if v.startswith("n") and "/" in v else ("", "", v)
        if nu and nu == nv and _node_index(nu, self.num_nodes) is not None:
            found = self.layout.edges.get((lu, lv))
        if found is None and isinstance(self.fabric, Torus) and nu and nv:
            if _node_index(nu, self.num_nodes) is not None and _node_index(nv, self.num_nodes) is not None:
                found = self.fabric.link(u, v)
        elif found is None and isinstance(self.fabric, FatTree):
            if all(x.startswith(("leaf", "spine", "agg", "core")) or _node_index(x.partition("/")[0], self.num_nodes)
                   is not None for x in (u, v)):
                found = self.fabric.switch_link(u, v)
        if found is None:
            raise InputError(f"{self.name}: no link {u} -> {v}")
        return found

    @cached_property
    def graph(self):
        """The networkx DiGraph (built on first use; refused above ``MAX_GRAPH_NODES`` devices: the
        collective model and the summaries work on the structure)."""
        import networkx as nx

        self.check_graph_size()
        graph = nx.DiGraph(name=self.name)
        graph.add_nodes_from(self.devices())
        graph.add_edges_from((u, v, a.as_dict()) for (u, v), a in self.edge_table.items())
        return graph

    # ------------------------------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """SHA-256 of the resolved inputs (cluster, node template, fabric, link kinds, calibration, sizes);
        computed once (the inputs of a loaded cluster do not change: an edited file loads a new cluster).
        Its cost does not depend on the number of GPUs."""
        if self._fingerprint is None:
            self._fingerprint = self._fingerprint_uncached()
        return self._fingerprint

    def _fingerprint_uncached(self) -> str:
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

    def check(self) -> str:
        """Every GPU reaches every other GPU and every route uses existing links: on the full graph, or on
        the structure above ``MAX_GRAPH_NODES`` devices. Returns how it was checked."""
        from .analysis import check_cluster
        return check_cluster(self)


def _node_index(prefix: str, num_nodes: int) -> int | None:
    """``"n12"`` -> 12 when it names a node of the cluster, else None."""
    digits = prefix[1:]
    if not prefix.startswith("n") or not digits.isdigit():
        return None
    node = int(digits)
    return node if node < num_nodes else None


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
