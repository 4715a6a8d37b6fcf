"""One node template expanded for a cluster: local devices, local links and routing inside the node.

Local device ids are ``<group><index>`` (``gpu3``, ``nvswitch0``); the cluster prefixes them with ``n<node>/``.
Routing inside a node (cached per pair of local devices, computed on the template's few dozen devices):

* GPU -> GPU over NVLink: through every NVSwitch both GPUs reach, in proportion to the source GPU's lanes to
  each switch (NCCL spreads channels over all NVLinks), or over a direct NVLink.
* otherwise the shortest paths through PCIe switches / CPUs (no GPU or NIC forwards traffic), split evenly;
  a path's share is proportional to its narrowest lane count.
* GPU -> NIC: the closest NIC (fewest hops, same PCIe switch first), as NCCL picks it; GPUs that share the
  same closest NICs take them in turn (DGX A100: GPU 2k -> NIC 2k, GPU 2k+1 -> NIC 2k+1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..errors import InputError
from ..limits import MAX_NODE_DEVICES, MAX_NODE_LINKS  # noqa: F401 (bounds of one node: tpsim/limits.py)
from .spec import CalibrationSpec, LinkSpec, NodeTemplate

Path_ = tuple[tuple[str, str], ...]
Route = tuple[tuple[float, Path_], ...]
_TRANSIT_KINDS = ("nvswitch", "pcie_switch", "cpu", "switch")


@dataclass(frozen=True)
class EdgeAttrs:
    """Attributes of one directed edge (the graph schema shared with the collective model)."""

    type: str
    bw_GBps: float
    """per direction, all lanes together, GB/s."""
    lanes: int
    latency_us: float
    efficiency: float

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "bw_GBps": self.bw_GBps, "lanes": self.lanes,
                "latency_us": self.latency_us, "efficiency": self.efficiency}


def link_attrs(kind, lanes: int, default_eff: float, calibration: CalibrationSpec | None,
               bw: float | None = None, latency: float | None = None, eff: float | None = None) -> EdgeAttrs:
    """Edge attributes: explicit value > calibration (per link type) > link kind > cluster default.

    ``bw`` and the link kind's bandwidth are per lane; a calibration's ``bw_GBps`` is the whole edge (all its
    lanes) per direction, as ``tpsim calibrate`` measures it (same convention as tpsim.collectives.fabric)."""
    cal = calibration.per_type.get(kind.type, {}) if calibration else {}
    if bw is not None:
        edge_bw = bw * lanes
    elif "bw_GBps" in cal:
        edge_bw = cal["bw_GBps"]
    else:
        edge_bw = kind.bw_GBps * lanes
    lat = latency if latency is not None else cal.get("latency_us", kind.latency_us)
    efficiency = eff if eff is not None else cal.get(
        "efficiency", kind.efficiency if kind.efficiency is not None else default_eff)
    return EdgeAttrs(type=kind.type, bw_GBps=edge_bw, lanes=lanes, latency_us=lat, efficiency=efficiency)



def _check_size(template: NodeTemplate, counts: dict[str, int]) -> None:
    """Refuse a node whose devices or expanded links exceed the bounds, from the counts alone."""
    devices = sum(counts.values())
    if devices > MAX_NODE_DEVICES:
        raise InputError(f"node {template.name}: {devices:,} devices in one node ({', '.join(f'{k} {v:,}' for k, v in counts.items())}) "
                         f"is above the supported {MAX_NODE_DEVICES:,} (is --gpus meant for a cluster of nodes?)")
    links = 0
    for spec in template.links:
        a = (spec.a_range[1] - spec.a_range[0] + 1) if spec.a_range else counts.get(spec.a, 0)
        b = (spec.b_range[1] - spec.b_range[0] + 1) if spec.b_range else counts.get(spec.b, 0)
        links += a * b if spec.pattern == "all" else max(a, b)
    if links > MAX_NODE_LINKS:
        raise InputError(f"node {template.name}: its link patterns expand to {links:,} links, above the supported "
                         f"{MAX_NODE_LINKS:,} per node")


class NodeLayout:
    """A node template instantiated with a GPU count, link attributes resolved. Routing results are cached."""

    def __init__(self, template: NodeTemplate, gpus: int, default_eff: float,
                 calibration: CalibrationSpec | None) -> None:
        self.template = template
        self.counts = {g.name: (gpus if g.kind == "gpu" else g.count) for g in template.devices}
        _check_size(template, self.counts)  # before building anything (issue 26)
        self.gpu_group = template.gpu_group.name
        self.nic_groups = [g.name for g in template.devices if g.kind == "nic"]
        self.devices: dict[str, dict[str, Any]] = {}
        for group in template.devices:
            for i in range(self.counts[group.name]):
                self.devices[f"{group.name}{i}"] = {
                    "kind": group.kind, "local_index": i if group.kind in ("gpu", "nic", "nvswitch") else -1,
                    "level": 0, "sharp": group.sharp}
        self.edges: dict[tuple[str, str], EdgeAttrs] = {}
        for spec in template.links:
            self._expand(spec, default_eff, calibration)
        self.adjacency: dict[str, list[str]] = {d: [] for d in self.devices}
        for u, v in self.edges:
            self.adjacency[u].append(v)
        self.nics = [d for d, a in self.devices.items() if a["kind"] == "nic"]
        self.has_nvlink = any(a.type == "nvlink" for a in self.edges.values())

    @property
    def num_gpus(self) -> int:
        return self.counts[self.gpu_group]

    @property
    def host_memory_GBps(self) -> float:
        """Host memory bandwidth per GPU (GB/s): the node's CPUs' memory bandwidth (``memory_GBps``, datasheet
        peak) shared evenly by its GPUs; 0 when the template gives none."""
        total = sum(g.memory_GBps * g.count for g in self.template.devices if g.kind == "cpu")
        return total / self.num_gpus if self.num_gpus else 0.0

    @property
    def host_GBps(self) -> float:
        """The first GPU's bandwidth to host memory (GB/s per direction, efficiency applied): the widest route
        of at most three links to a CPU (Grace's NVLink-C2C, or PCIe through a switch), its narrowest link; 0
        when the template has no CPU."""
        best = 0.0
        start = self.gpu(0)
        frontier = [(start, float("inf"), 0)]
        while frontier:
            node, width, hops = frontier.pop()
            for nxt in self.adjacency.get(node, ()):
                attrs = self.edges[(node, nxt)]
                w = min(width, attrs.bw_GBps * attrs.efficiency)
                kind = self.devices[nxt]["kind"]
                if kind == "cpu":
                    best = max(best, w)
                elif kind in ("pcie_switch", "nvswitch") and hops < 2:
                    frontier.append((nxt, w, hops + 1))
        return best

    def gpu(self, i: int) -> str:
        return f"{self.gpu_group}{i}"

    # ------------------------------------------------------------------------------------------ expansion
    def _indices(self, group: str, rng: tuple[int, int] | None, where: str) -> list[int]:
        count = self.counts[group]
        if rng is None:
            return list(range(count))
        if rng[1] >= count:
            raise InputError(f"{where}: {group}[{rng[0]}-{rng[1]}] is out of range ({group} has {count})")
        return list(range(rng[0], rng[1] + 1))

    def _expand(self, spec: LinkSpec, default_eff: float, calibration: CalibrationSpec | None) -> None:
        a_idx = self._indices(spec.a, spec.a_range, spec.where)
        b_idx = self._indices(spec.b, spec.b_range, spec.where)
        pairs: list[tuple[int, int, int]] = []
        if spec.pattern == "all":
            if len(spec.lanes) not in (1, len(b_idx)):
                raise InputError(f"{spec.where}: lanes has {len(spec.lanes)} values but {spec.b} has "
                                 f"{len(b_idx)} devices")
            for i in a_idx:
                for k, j in enumerate(b_idx):
                    pairs.append((i, j, spec.lanes[k if len(spec.lanes) > 1 else 0]))
        else:
            big, small = (a_idx, b_idx) if len(a_idx) >= len(b_idx) else (b_idx, a_idx)
            if len(big) % len(small):
                raise InputError(f"{spec.where}: pattern block needs one group size to divide the other "
                                 f"({spec.a}: {len(a_idx)}, {spec.b}: {len(b_idx)})")
            ratio = len(big) // len(small)
            for k, x in enumerate(big):
                y = small[k // ratio]
                pairs.append((x, y, spec.lanes[0]) if big is a_idx else (y, x, spec.lanes[0]))
        for i, j, lanes in pairs:
            u, v = f"{spec.a}{i}", f"{spec.b}{j}"
            if u == v:
                raise InputError(f"{spec.where}: links {u} to itself")
            if (u, v) in self.edges:
                raise InputError(f"{spec.where}: duplicate link {u} - {v}")
            attrs = link_attrs(spec.kind, lanes, default_eff, calibration, spec.bw_GBps, spec.latency_us,
                               spec.efficiency)
            self.edges[(u, v)] = attrs
            self.edges[(v, u)] = attrs

    # ------------------------------------------------------------------------------------------ checks
    def reachable_from(self, start: str) -> set[str]:
        """Devices reachable from ``start`` when GPUs and NICs do not forward traffic."""
        seen = {start}
        queue = deque([start])
        while queue:
            u = queue.popleft()
            if u != start and self.devices[u]["kind"] not in _TRANSIT_KINDS:
                continue
            for v in self.adjacency[u]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
        return seen

    def check(self, needs_intra: bool, needs_nic: bool) -> None:
        """Every GPU reaches every other GPU (``needs_intra``) and a NIC (``needs_nic``), else InputError.

        Linear in the node's size: the components of forwarding devices (switches, CPUs, PCIe switches) are
        found once, with the GPUs and NICs each touches; a GPU attached to a component that touches every GPU
        (and a NIC) passes without a search of its own (a per-GPU search was quadratic: 12 s at 2048 ranks)."""
        where = f"{self.template.path}"
        gpus = {self.gpu(i) for i in range(self.num_gpus)}
        comp_of: dict[str, int] = {}
        touches: list[set[str]] = []
        for dev, attrs in self.devices.items():
            if attrs["kind"] not in _TRANSIT_KINDS or dev in comp_of:
                continue
            comp = len(touches)
            touched: set[str] = set()
            comp_of[dev] = comp
            queue = deque([dev])
            while queue:
                u = queue.popleft()
                for v in self.adjacency[u]:
                    if self.devices[v]["kind"] in _TRANSIT_KINDS:
                        if v not in comp_of:
                            comp_of[v] = comp
                            queue.append(v)
                    else:
                        touched.add(v)
            touches.append(touched)
        covers = [gpus <= t for t in touches]
        has_nic = [any(n in t for n in self.nics) for t in touches]
        for i in range(self.num_gpus):
            gpu = self.gpu(i)
            comps = {comp_of[v] for v in self.adjacency[gpu] if v in comp_of}
            intra_ok = not needs_intra or any(covers[c] for c in comps)
            nic_ok = not needs_nic or any(has_nic[c] for c in comps) or any(v in self.nics for v in self.adjacency[gpu])
            if intra_ok and nic_ok:
                continue
            reach = self.reachable_from(gpu)
            if needs_intra:
                for j in range(self.num_gpus):
                    if self.gpu(j) not in reach:
                        raise InputError(f"{where}: devices.{self.gpu_group}: {self.gpu(i)} cannot reach "
                                         f"{self.gpu(j)} (no link path inside node {self.template.name})")
            if needs_nic and not any(n in reach for n in self.nics):
                raise InputError(f"{where}: devices.{self.gpu_group}: {self.gpu(i)} cannot reach any NIC "
                                 f"(needed to leave node {self.template.name})")

    # ------------------------------------------------------------------------------------------ routing
    def gpu_route(self, i: int, j: int) -> Route:
        """Weighted paths from local GPU i to local GPU j (empty for i == j)."""
        return _gpu_route(self, i, j)

    def nic_of(self, i: int) -> str:
        """Local id of the NIC local GPU i uses (closest; ties shared in turn)."""
        return _nic_assignment(self)[i]

    def to_nic(self, i: int) -> Route:
        return _shortest_route(self, self.gpu(i), self.nic_of(i))

    def from_nic(self, i: int) -> Route:
        return _shortest_route(self, self.nic_of(i), self.gpu(i))

    def gpus_on_rail(self, nic: str) -> list[int]:
        """Local GPUs whose NIC is ``nic``."""
        return [i for i, n in enumerate(_nic_assignment(self)) if n == nic]

    def nvlink_peers(self, i: int, j: int) -> bool:
        """GPUs i and j share an NVLink (direct or through an NVSwitch)."""
        a, b = self.gpu(i), self.gpu(j)
        if (a, b) in self.edges and self.edges[(a, b)].type == "nvlink":
            return True
        return any(self.edges[(a, s)].type == "nvlink" and (s, b) in self.edges
                   for s in self.adjacency[a] if self.devices[s]["kind"] == "nvswitch")


@lru_cache(maxsize=65536)
def _gpu_route(layout: NodeLayout, i: int, j: int) -> Route:
    if i == j:
        return ()
    a, b = layout.gpu(i), layout.gpu(j)
    direct = layout.edges.get((a, b))
    if direct is not None and direct.type == "nvlink":
        return ((1.0, ((a, b),)),)
    switches = [s for s in layout.adjacency[a] if layout.devices[s]["kind"] == "nvswitch"
                and layout.edges[(a, s)].type == "nvlink" and (s, b) in layout.edges]
    if switches:
        lanes = [layout.edges[(a, s)].lanes for s in switches]
        total = float(sum(lanes))
        return tuple((n / total, ((a, s), (s, b))) for s, n in zip(switches, lanes))
    return _shortest_route(layout, a, b)


@lru_cache(maxsize=65536)
def _shortest_route(layout: NodeLayout, src: str, dst: str) -> Route:
    """All fewest-hop paths whose intermediate devices are switches or CPUs; share by narrowest lanes."""
    dist = {src: 0}
    parents: dict[str, list[str]] = {src: []}
    frontier = [src]
    while frontier and dst not in dist:
        nxt: list[str] = []
        for u in frontier:
            if u != src and layout.devices[u]["kind"] not in _TRANSIT_KINDS:
                continue
            for v in layout.adjacency[u]:
                if v != dst and layout.devices[v]["kind"] not in _TRANSIT_KINDS:
                    continue   # a GPU or NIC that is not the destination forwards nothing: a dead end
                if v not in dist:
                    dist[v] = dist[u] + 1
                    parents[v] = [u]
                    nxt.append(v)
                elif dist[v] == dist[u] + 1:
                    parents[v].append(u)
        frontier = nxt
    if dst not in dist:
        raise InputError(f"{layout.template.path}: {src} cannot reach {dst} inside node {layout.template.name}")
    paths = _unwind(parents, src, dst)
    widths = [min(layout.edges[e].lanes for e in p) for p in paths]
    total = float(sum(widths))
    return tuple((w / total, p) for w, p in zip(widths, paths))


def _unwind(parents: Mapping[str, list[str]], src: str, dst: str) -> list[Path_]:
    if dst == src:
        return [()]
    out = []
    for p in parents[dst]:
        for head in _unwind(parents, src, p):
            out.append(head + ((p, dst),))
    return out


@lru_cache(maxsize=256)
def _nic_assignment(layout: NodeLayout) -> tuple[str, ...]:
    chosen: list[str] = []
    taken: dict[tuple[str, ...], int] = {}
    for i in range(layout.num_gpus):
        dist = _hops(layout, layout.gpu(i))
        reachable = [n for n in layout.nics if n in dist]
        if not reachable:
            chosen.append("")
            continue
        best = min(dist[n] for n in reachable)
        candidates = tuple(sorted((n for n in reachable if dist[n] == best),
                                  key=lambda n: layout.devices[n]["local_index"]))
        turn = taken.get(candidates, 0)
        taken[candidates] = turn + 1
        chosen.append(candidates[turn % len(candidates)])
    return tuple(chosen)


def _hops(layout: NodeLayout, src: str) -> dict[str, int]:
    dist = {src: 0}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        if u != src and layout.devices[u]["kind"] not in _TRANSIT_KINDS:
            continue
        for v in layout.adjacency[u]:
            if v not in dist and (layout.devices[v]["kind"] in _TRANSIT_KINDS or layout.devices[v]["kind"] == "nic"):
                dist[v] = dist[u] + 1   # only NICs are asked for; other end devices are dead ends
                queue.append(v)
    return dist
