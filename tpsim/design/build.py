"""A design as a cluster: node template, fabric and cluster files in the ``topologies/`` schema (written under
``<out>/clusters/``, loaded and checked by :func:`tpsim.topology.load_cluster` like any shipped cluster).

Designs that share a node template and a fabric share one cluster file (the GPU count is given at load time),
so one worker process keeps one loaded cluster and its collective curves for all of them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from ..hardware import get_device
from .sweep import NIC_GBPS

NVLINK = {   # architecture -> (link kind, switch chips, lanes per switch, in-switch reduction) for 8-GPU nodes
    "ampere": ("nvlink3", 6, [2], False),
    "hopper": ("nvlink4", 4, [5, 4, 4, 5], True),
    "blackwell": ("nvlink5", 2, [9], True),
}
"""HGX A100 (6 NVSwitch, 12 links per GPU), HGX/DGX H100 and H200 (4 NVSwitch with NVLS, 18 links split
5/4/4/5), DGX B200/B300 (2 NVLink5 switch chips, 18 links split 9/9): topologies/nodes/dgx-*.yaml."""
H800_LANES = [2]
"""H800: 8 NVLink4 links over the 4 switches (topologies/nodes/hgx-h800.yaml)."""
PCIE6_DEVICES = ("B300", "GB300")
"""Blackwell Ultra systems put their NICs behind ConnectX-8's PCIe Gen6 switch (topologies/nodes/dgx-b300.yaml)."""
TORUS_LINK = {"TPU-v4": "ici-v4", "TPU-v5p": "ici-v5p"}


def _node(values: Mapping[str, Any]) -> dict[str, Any]:
    device = get_device(values["device"])
    arch, domain = device.architecture, int(values["nvlink_domain"])
    if arch == "tpu":
        return {"name": "tpu-host-4", "description": "TPU host with 4 chips (2x2x1 block of the 3D torus)",
                "source": "as topologies/nodes/tpu-v4-host.yaml (Google Cloud TPU documentation: 4 chips per host)",
                "devices": {"gpu": {"kind": "gpu", "count": 4}, "cpu": {"kind": "cpu", "count": 1}},
                "links": [{"a": "gpu", "b": "cpu", "link": "pcie-gen3-x16"}]}
    nics = int(domain * values["nics_per_gpu"])
    pcie_link = "pcie-gen6-x16" if device.name in PCIE6_DEVICES else "pcie-gen5-x16"
    if domain == 8:
        link, switches, lanes, sharp = NVLINK[arch]
        if device.name == "H800":
            lanes = H800_LANES
        links = [{"a": "gpu", "b": "nvswitch", "pattern": "all", "link": link,
                  "lanes": lanes if len(lanes) > 1 else lanes[0]},
                 {"a": "gpu", "b": "pcie", "link": pcie_link}, {"a": "nic", "b": "pcie", "link": pcie_link},
                 {"a": "pcie", "b": "cpu", "link": "pcie-gen5-x16"}, {"a": "cpu[0]", "b": "cpu[1]", "link": "intel-upi"}]
        devices = {"gpu": {"kind": "gpu", "count": 8}, "nvswitch": {"kind": "nvswitch", "count": switches,
                                                                   "sharp": sharp},
                   "pcie": {"kind": "pcie_switch", "count": 4}, "cpu": {"kind": "cpu", "count": 2},
                   "nic": {"kind": "nic", "count": nics}}
        source = ("8-GPU node as the shipped templates (topologies/nodes/dgx-h100.yaml, dgx-b200.yaml, "
                  "dgx-a100.yaml): NVSwitch layout of the architecture, 4 PCIe switches")
    else:   # NVL36 / NVL72 rack: 18 NVSwitch chips, one NVLink5 link from every GPU to each (gb200-nvl72.yaml)
        devices = {"gpu": {"kind": "gpu", "count": domain}, "nvswitch": {"kind": "nvswitch", "count": 18,
                                                                        "sharp": True},
                   "pcie": {"kind": "pcie_switch", "count": domain // 2},
                   "cpu": {"kind": "cpu", "count": domain // 2}, "nic": {"kind": "nic", "count": nics}}
        links = [{"a": "gpu", "b": "nvswitch", "pattern": "all", "link": "nvlink5", "lanes": 1},
                 {"a": "gpu", "b": "pcie", "link": pcie_link}, {"a": "nic", "b": "pcie", "link": pcie_link},
                 {"a": "pcie", "b": "cpu", "link": "pcie-gen5-x16"}, {"a": "gpu", "b": "cpu", "link": "grace-c2c"}]
        source = (f"NVL{domain} rack as topologies/nodes/gb200-nvl72.yaml: {domain} GPUs on 18 NVSwitch chips, "
                  f"one Grace CPU per 2 GPUs")
    name = f"{device.name.lower()}-nvl{domain}-{nics}nic"
    return {"name": name, "description": f"design node: {domain} x {device.name}, {nics} NICs",
            "source": source, "devices": devices, "links": links}


def _fabric(values: Mapping[str, Any]) -> dict[str, Any]:
    device = get_device(values["device"])
    if device.architecture == "tpu":
        return {"name": f"torus-{device.name.lower()}", "type": "torus", "dims": "auto", "host_shape": [2, 2, 1],
                "wraparound": True, "link": TORUS_LINK.get(device.name, "ici-v4"),
                "source": "as topologies/fabrics/tpu-v4-torus.yaml with the chip's ICI link"}
    nic, switch, radix = NIC_GBPS[int(values["nic_gbps"])]
    kind, over = values["fabric"], float(values["oversubscription"])
    body = {"name": f"{kind}-{values['nic_gbps']}g-o{over:g}", "type": kind, "levels": 4, "radix": radix,
            "oversubscription": over, "pxn": True, "nic_link": nic, "switch_link": switch,
            "source": (f"design fabric: {kind} of {values['nic_gbps']} Gb/s NICs on radix-{radix} switches "
                       f"(topologies/links.yaml {nic}, {switch}), leaf oversubscription {over:g}:1")}
    if kind == "fat_tree":
        body["placement"] = "node"
    return body


def cluster_files(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The node template, fabric and cluster mappings of a design (the cluster names the other two by path)."""
    node, fabric = _node(values), _fabric(values)
    digest = hashlib.sha1(json.dumps([node, fabric, values["device"]], sort_keys=True).encode()).hexdigest()[:10]
    cluster = {"name": f"design-{digest}", "node": f"node-{digest}.yaml", "fabric": f"fabric-{digest}.yaml",
               "device": values["device"], "gpus": int(values["gpus"]),
               "source": "tpsim design: built from the sweep's axes (tpsim/design/build.py)"}
    return {"node": node, "fabric": fabric, "cluster": cluster, "digest": digest}


def write_cluster(values: Mapping[str, Any], folder: Path) -> Path:
    """Write the design's files under ``folder`` (atomically; identical content when two workers race) and
    return the cluster file's path."""
    import yaml

    from ..io import atomic_write_text

    files = cluster_files(values)
    digest = files["digest"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"cluster-{digest}.yaml"
    if not path.exists():
        for kind in ("node", "fabric"):
            atomic_write_text(folder / f"{kind}-{digest}.yaml", yaml.safe_dump(files[kind], sort_keys=False),
                              "design cluster")
        atomic_write_text(path, yaml.safe_dump(files["cluster"], sort_keys=False), "design cluster")
    return path


def load_design_cluster(values: Mapping[str, Any], folder: Path):
    """The design's :class:`~tpsim.topology.Cluster` (checked by the topology rules)."""
    from ..topology import load_cluster

    return load_cluster(str(write_cluster(values, folder)), gpus=int(values["gpus"]))
