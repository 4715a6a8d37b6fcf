"""``tpsim topo show|check|draw CLUSTER``: summary, validation and drawing of a cluster topology."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "topo", help="show, check or draw a cluster topology (topologies/clusters/*.yaml)",
        description="Summary (devices, links by type, per-GPU injection and bisection bandwidth), strict check "
                    "(exit 2 on a bad file) or a PNG drawing of a cluster topology. CLUSTER is a file stem in "
                    "topologies/clusters (see `tpsim topo list`) or a path to a cluster YAML.")
    parser.add_argument("action", choices=("show", "check", "draw", "list"), help="what to do")
    parser.add_argument("cluster", nargs="?", help="cluster name or path to a cluster YAML")
    parser.add_argument("--gpus", type=int, default=None, help="number of GPUs (default: the file's gpus)")
    parser.add_argument("--out", default=None, help="PNG file for draw (default: <cluster>.png)")
    parser.add_argument("--json", action="store_true", help="show: print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..topology import list_clusters, load_cluster

    if args.action == "list":
        print("\n".join(list_clusters()))
        return 0
    if not args.cluster:
        raise InputError(f"CLUSTER is required for topo {args.action} (known: {', '.join(list_clusters())})")
    cluster = load_cluster(args.cluster, gpus=args.gpus)
    if args.action == "check":
        how = cluster.check()
        print(f"OK {cluster.name}: {cluster.num_gpus} GPUs, {_plural(cluster.num_nodes, 'node')}, "
              f"{cluster.graph_size()[1] // 2} links; {how}")
        return 0
    if args.action == "draw":
        from ..topology.draw import draw_cluster

        out = args.out or f"{cluster.name}.png"
        note = draw_cluster(cluster, out)
        print(f"wrote {out} ({note})")
        return 0
    summary = _summary(cluster)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_format(summary))
    return 0


def _summary(cluster) -> dict:
    from ..topology.analysis import device_counts, link_summary

    return {"cluster": cluster.name, "device": cluster.device.name, "gpus": cluster.num_gpus,
            "gpus_per_node": cluster.gpus_per_node, "nodes": cluster.num_nodes,
            "node_template": cluster.node_template_name, "fabric": cluster.fabric_name,
            "devices": device_counts(cluster), "links": link_summary(cluster),
            "injection_GBps_per_gpu": cluster.injection_bandwidth(),
            "bisection_GBps": cluster.bisection_bandwidth(), "fingerprint": cluster.fingerprint()[:16]}


def _format(s: dict) -> str:
    lines = [f"{s['cluster']}: {s['gpus']} x {s['device']} = {_plural(s['nodes'], 'node')} x {s['gpus_per_node']} "
             f"({s['node_template']}), fabric {s['fabric']}",
             "devices: " + ", ".join(f"{k} {v}" for k, v in s["devices"].items()),
             "links (physical, per direction):",
             f"  {'type':<9} {'count':>7} {'GB/s':>8} {'lanes':>5} {'lat us':>7} {'eff':>5} {'total GB/s':>11}"]
    for link in s["links"]:
        lines.append(f"  {link['type']:<9} {link['count']:>7} {link['bw_GBps']:>8g} {link['lanes']:>5} "
                     f"{link['latency_us']:>7g} {link['efficiency']:>5g} {link['total_GBps']:>11g}")
    inj = s["injection_GBps_per_gpu"]
    lines.append(f"injection per GPU (GB/s per direction): NVLink {inj['nvlink']:g}, PCIe {inj['pcie']:g}, "
                 f"network {inj['network']:g}")
    lines.append(f"bisection bandwidth (first half of ranks -> second half): {s['bisection_GBps']:g} GB/s")
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
