"""Drawing of a cluster graph (matplotlib, imported here only): devices laid out by level.

Rows from top to bottom: core (3), spine (2), leaf (1) switches, then inside nodes NICs, PCIe switches and
CPUs, NVSwitches, GPUs. A big cluster is drawn with its first few nodes and the switches they use, and a note.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fabric import FatTree, Torus

if TYPE_CHECKING:
    from .cluster import Cluster

_ROW = {("switch", 4): -1, ("switch", 3): 0, ("switch", 2): 1, ("switch", 1): 2, ("nic", 0): 3, ("cpu", 0): 4,
        ("pcie_switch", 0): 5, ("nvswitch", 0): 6, ("gpu", 0): 7}
_COLOR = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie_switch": "#9467bd", "cpu": "#8c564b",
          "nic": "#ff7f0e", "switch": "#d62728"}
_EDGE_COLOR = {"nvlink": "#76b900", "pcie": "#9467bd", "ib": "#ff7f0e", "ethernet": "#ff7f0e",
               "ici": "#17becf", "loopback": "#7f7f7f", "cpu": "#8c564b"}


MAX_SWITCHES_PER_LEVEL = 48
"""switches drawn per fabric level (the first ones on the way up from the drawn nodes)."""


def draw_cluster(cluster: "Cluster", out: str | Path, max_nodes: int = 4, max_gpus_per_node: int = 16) -> str:
    """Write a PNG of (part of) the cluster graph to ``out``; returns the note describing what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torus = isinstance(cluster.fabric, Torus)
    shown_nodes = cluster.num_nodes if torus else min(cluster.num_nodes, max_nodes)
    keep = _kept_devices(cluster, shown_nodes, max_gpus_per_node)
    if torus:
        keep = {d: a for d, a in keep.items() if a["kind"] == "gpu"}
    pos = _torus_layout(cluster, keep) if torus else _layout(cluster, keep)
    if torus:
        planes = min(cluster.fabric.dims[2], 4)
        keep = {d: a for d, a in keep.items() if cluster.fabric.coord(a["rank"])[2] < planes}
        pos = {d: p for d, p in pos.items() if d in keep}
        size = (min(18.0, 3.0 * planes + 3), min(12.0, 2.0 + 0.8 * cluster.fabric.dims[1]))
    else:
        size = (max(8.0, 2.2 * shown_nodes + 4), 7.0)
    fig, ax = plt.subplots(figsize=size)
    for u, v, attrs in _kept_links(cluster, keep):
        if u in pos and v in pos and u < v and not (torus and _far(pos[u], pos[v])):
            ax.plot([pos[u][0], pos[v][0]], [pos[u][1], pos[v][1]], color=_EDGE_COLOR[attrs.type],
                    lw=0.4 + 0.15 * min(attrs.lanes, 6), alpha=0.5, zorder=1)
    for kind, color in _COLOR.items():
        pts = [pos[d] for d, a in keep.items() if a["kind"] == kind]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=60 if kind != "gpu" else 90, color=color, label=kind, zorder=2,
                       edgecolors="black", linewidths=0.4)
    note = _note(cluster, shown_nodes, max_gpus_per_node, keep)
    if torus:
        dims = cluster.fabric.dims
        note = (f"chips of the {'x'.join(map(str, dims))} torus, one X-Y plane per Z (first "
                f"{min(dims[2], 4)} of {dims[2]}); Z and wraparound links not drawn")
    nodes = f"{cluster.num_nodes} node" + ("" if cluster.num_nodes == 1 else "s")
    ax.set_title(f"{cluster.name}: {cluster.num_gpus} x {cluster.device.name}, {nodes} "
                 f"({cluster.node_template_name}), fabric {cluster.fabric_name}\n{note}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    ax.set_yticks([])
    ax.set_xticks([])
    fig.tight_layout()
    try:
        _save_atomic(fig, out)
    finally:
        plt.close(fig)
    return note


def _kept_devices(cluster: "Cluster", shown_nodes: int, max_gpus: int) -> dict[str, dict]:
    """The first nodes (in a big node the first GPUs and the same share of every other device group) and the
    switches their NICs reach going up; listed from the structure, not from the whole cluster."""
    share = min(1.0, max_gpus / cluster.gpus_per_node)
    keep: dict[str, dict] = {}
    gpn = cluster.gpus_per_node
    for node in range(shown_nodes):
        for local_id, attrs in cluster.layout.devices.items():
            group, index = _group_index(local_id)
            if index >= math.ceil(cluster.layout.counts[group] * share):
                continue
            out = dict(attrs, node_index=node)
            if attrs["kind"] == "gpu":   # -1: a spare GPU of a node the job uses part of (Cluster.devices)
                out["rank"] = node * gpn + attrs["local_index"] if attrs["local_index"] < gpn else -1
            keep[f"n{node}/{local_id}"] = out
    fabric = cluster.fabric
    if isinstance(fabric, FatTree):
        by_level: dict[int, list[tuple[str, dict]]] = {}
        for name, attrs in fabric.switches_near(_kept_leaves(cluster, keep)).items():
            by_level.setdefault(attrs["level"], []).append((name, attrs))
        for level, items in by_level.items():
            items.sort(key=lambda kv: [int(x) for x in re.findall(r"\d+", kv[0])])
            keep.update(items[:MAX_SWITCHES_PER_LEVEL])
    return keep


def _kept_leaves(cluster: "Cluster", keep: dict[str, dict]) -> set[int]:
    fabric = cluster.fabric
    leaves = set()
    for dev, attrs in keep.items():
        if attrs["kind"] == "nic":
            leaves.add(fabric.leaf_of(attrs["node_index"], attrs["local_index"]))
    return leaves


def _kept_links(cluster: "Cluster", keep: dict[str, dict]):
    """(u, v, attributes) of the directed links between kept devices."""
    nodes = sorted({a["node_index"] for a in keep.values() if a["node_index"] >= 0})
    for node in nodes:
        p = f"n{node}/"
        for (u, v), attrs in cluster.layout.edges.items():
            if p + u in keep and p + v in keep:
                yield p + u, p + v, attrs
    fabric = cluster.fabric
    if isinstance(fabric, FatTree):
        for dev, attrs in keep.items():
            if attrs["kind"] == "nic":
                leaf = f"leaf{fabric.leaf_of(attrs['node_index'], attrs['local_index'])}"
                yield dev, leaf, fabric.nic_attrs
                yield leaf, dev, fabric.nic_attrs
        kind, eff, cal = fabric._switch_link
        from .node import link_attrs
        for u, v, lanes in fabric.switch_links_above(_kept_leaves(cluster, keep)):
            if u in keep and v in keep:
                attrs = link_attrs(kind, lanes, eff, cal)
                yield u, v, attrs
                yield v, u, attrs
    elif isinstance(fabric, Torus):
        for u, v, attrs in fabric.edges():
            if u in keep and v in keep:
                yield u, v, attrs


def _group_index(local_id: str) -> tuple[str, int]:
    match = re.match(r"^(.*?)(\d+)$", local_id)
    assert match, local_id
    return match.group(1), int(match.group(2))


def _layout(cluster: "Cluster", keep: dict[str, dict]) -> dict[str, tuple[float, float]]:  # noqa: ARG001 (unused: kept for the callers)
    rows: dict[tuple[int, int], list[str]] = {}
    for dev, attrs in keep.items():
        row = _ROW.get((attrs["kind"], attrs["level"]), 7)
        rows.setdefault((row, attrs["node_index"]), []).append(dev)
    width = 10.0
    shown = max(1, len({a["node_index"] for a in keep.values() if a["node_index"] >= 0}))
    pos = {}
    for (row, node), devs in rows.items():
        if node < 0:
            lo, hi = 0.0, width * shown
        else:
            lo, hi = node * width + 0.5, (node + 1) * width - 0.5
        step = (hi - lo) / (len(devs) + 1)
        for i, dev in enumerate(devs):
            pos[dev] = (lo + step * (i + 1), -float(row))
    return pos


def _torus_layout(cluster: "Cluster", keep: dict[str, dict]) -> dict[str, tuple[float, float]]:
    torus = cluster.fabric
    pos = {}
    for dev, attrs in keep.items():
        x, y, z = torus.coord(attrs["rank"])
        pos[dev] = (z * (torus.dims[0] + 1.5) + x, -float(y))
    return pos


def _far(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Not neighbours in the drawing (a wraparound or a Z link)."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1]) > 1.01


def _note(cluster: "Cluster", shown_nodes: int, max_gpus: int, keep: dict[str, dict] | None = None) -> str:
    parts = []
    if shown_nodes < cluster.num_nodes:
        parts.append(f"showing {shown_nodes} of {cluster.num_nodes} nodes and the switches they use")
    if cluster.gpus_per_node > max_gpus:
        parts.append(f"{max_gpus} of {cluster.gpus_per_node} GPUs per node")
    if keep is not None and isinstance(cluster.fabric, FatTree):
        counts: dict[int, int] = {}
        for attrs in keep.values():
            if attrs["kind"] == "switch":
                counts[attrs["level"]] = counts.get(attrs["level"], 0) + 1
        if any(n >= MAX_SWITCHES_PER_LEVEL for n in counts.values()):
            parts.append(f"at most {MAX_SWITCHES_PER_LEVEL} switches per level")
    return "; ".join(parts) if parts else "all devices shown"


def _save_atomic(fig: Any, out: str | Path) -> None:
    """Render in memory, then replace ``out`` in one step (tpsim.io): no truncated drawing after Ctrl-C."""
    import io

    from ..io import atomic_write_bytes

    buf = io.BytesIO()
    fmt = Path(out).suffix.lstrip(".").lower() or "png"
    fig.savefig(buf, format=fmt, dpi=110)
    atomic_write_bytes(out, buf.getvalue(), "--out")
