"""Typed, validated contents of the topology files (format: ``topologies/README.md``).

* ``topologies/links.yaml``: link kinds (type, bandwidth per lane per direction in GB/s, latency in us,
  efficiency, source).
* ``topologies/nodes/*.yaml``: node templates (device groups and links between them).
* ``topologies/fabrics/*.yaml``: how nodes are connected (``none``, ``fat_tree``, ``rail_optimized``, ``torus``).
* ``topologies/clusters/*.yaml``: a node template + a fabric + a device + defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..calibration import LINK_TYPES, Calibration
from ..calibration import load_calibration
from ..errors import InputError
from ..hardware import DeviceSpec, default_usable_memory_fraction, device_entry, device_from_mapping
from ..limits import LIMITS, show
from .files import check_keys, check_kind, fraction, non_negative, positive, read_yaml, resolve, topologies_dir

DEVICE_KINDS = ("gpu", "nvswitch", "pcie_switch", "cpu", "nic", "switch")
FABRIC_TYPES = ("none", "fat_tree", "rail_optimized", "torus")
PATTERNS = ("block", "all")
_SELECTOR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*(?:\[\s*(\d+)\s*(?:-\s*(\d+)\s*)?\])?\s*$")


@dataclass(frozen=True, kw_only=True)
class LinkKind:
    """One kind of physical link (per lane)."""

    name: str
    type: str
    """one of LINK_TYPES."""
    bw_GBps: float
    """bandwidth of one lane, per direction, GB/s (1e9 B/s)."""
    latency_us: float
    """latency of one traversal of this link, us."""
    efficiency: float | None
    """fraction of line rate achievable (0-1]; None: cluster default."""
    source: str


@dataclass(frozen=True, kw_only=True)
class DeviceGroup:
    name: str
    kind: str
    count: int
    """devices in the group; for a gpu group with ``count: any`` this is 0 until the cluster sets it."""
    sharp: bool = False
    """in-switch reduction (NVLink SHARP / IB SHARP)."""
    memory_GBps: float = 0.0
    """a CPU's memory bandwidth, GB/s (its DRAM's datasheet peak; 0: not given): what a CPU-side optimizer
    step streams at (Megatron-Core HybridDeviceOptimizer, ``memory.optimizer_cpu_fraction``)."""


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """Links between two device groups of a template (expanded by pattern)."""

    a: str
    a_range: tuple[int, int] | None
    b: str
    b_range: tuple[int, int] | None
    pattern: str
    kind: LinkKind
    lanes: tuple[int, ...]
    """lanes per edge; one value, or (pattern ``all``) one per device of ``b``."""
    bw_GBps: float | None = None
    latency_us: float | None = None
    efficiency: float | None = None
    where: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeTemplate:
    name: str
    path: Path
    devices: tuple[DeviceGroup, ...]
    links: tuple[LinkSpec, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def gpu_group(self) -> DeviceGroup:
        return next(g for g in self.devices if g.kind == "gpu")

    def group(self, name: str) -> DeviceGroup:
        return next(g for g in self.devices if g.name == name)


@dataclass(frozen=True, kw_only=True)
class FabricSpec:
    name: str
    path: Path | None
    type: str
    levels: int = 2
    radix: int = 0
    oversubscription: float = 1.0
    placement: str = "rail"
    """fat tree leaf assignment: ``rail`` (NIC k of consecutive nodes on one leaf) or ``node``."""
    pxn: bool = False
    """cross-rail traffic first moves over NVLink to the GPU on the destination's rail (NCCL >= 2.12)."""
    sharp: bool = False
    nic_link: LinkKind | None = None
    switch_link: LinkKind | None = None
    link: LinkKind | None = None
    dims: tuple[int, int, int] | None = None
    """torus dimensions in chips; None = chosen from the GPU count."""
    host_shape: tuple[int, int, int] = (1, 1, 1)
    wraparound: bool = True
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


CalibrationSpec = Calibration
"""A cluster's calibration is a :class:`tpsim.calibration.Calibration` (one loader for every calibration)."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    path: Path
    node: NodeTemplate
    fabric: FabricSpec
    device: str
    gpus: int
    gpus_per_node: int | None
    """None: the template's gpu count; set for templates with ``count: any``."""
    single_node: bool
    """``gpus_per_node: all``: one node holding every GPU."""
    default_efficiency: float
    calibration: CalibrationSpec | None
    raw: Mapping[str, Any] = field(repr=False)
    device_spec: DeviceSpec | None = None
    """a device defined inline in the cluster file (``device:`` as a mapping); None: ``device`` names an entry
    of tpsim/data/devices.yaml."""


# ----------------------------------------------------------------------------------------------- link kinds

def links_file() -> Path:
    return topologies_dir() / "links.yaml"


def load_link_kinds() -> dict[str, LinkKind]:
    """All link kinds of ``topologies/links.yaml``."""
    path = links_file()
    if not path.is_file():
        raise InputError(f"{path}: link kinds file does not exist (set TPSIM_TOPOLOGIES?)")
    data = read_yaml(path)
    check_keys(data, ("description", "link_kinds"), str(path), required=("link_kinds",))
    return {name: _link_kind(name, body, f"{path}: link_kinds.{name}")
            for name, body in (data["link_kinds"] or {}).items()}


def _link_kind(name: str, body: Any, where: str) -> LinkKind:
    check_keys(body, ("type", "bw_GBps", "latency_us", "efficiency", "source", "description"), where,
               required=("type", "bw_GBps", "latency_us", "source"))
    if body["type"] not in LINK_TYPES:
        raise InputError(f"{where}: type={body['type']!r} is not one of {', '.join(LINK_TYPES)}")
    eff = body.get("efficiency")
    return LinkKind(name=name, type=body["type"], bw_GBps=positive(body["bw_GBps"], where, "bw_GBps"),
                    latency_us=non_negative(body["latency_us"], where, "latency_us"),
                    efficiency=None if eff is None else fraction(eff, where, "efficiency"),
                    source=str(body["source"]))


def _kind(kinds: Mapping[str, LinkKind], name: Any, where: str, field_name: str) -> LinkKind:
    if name not in kinds:
        raise InputError(f"{where}: {field_name}={name!r} is not a link kind of {links_file()} "
                         f"(known: {', '.join(sorted(kinds))})")
    return kinds[name]


# ----------------------------------------------------------------------------------------------- node templates

def load_node_template(name_or_path: str, relative_to: Path | None = None) -> NodeTemplate:
    path = resolve("node", name_or_path, relative_to)
    data = read_yaml(path)
    where = str(path)
    check_kind(data, "node template", path)
    check_keys(data, ("name", "description", "source", "devices", "links", "note"), where,
               required=("devices", "links", "source"))
    devices = _device_groups(data["devices"], where)
    kinds = load_link_kinds()
    groups = {g.name: g for g in devices}
    if not isinstance(data["links"], list):
        raise InputError(f"{where}: links must be a list")
    links = tuple(_link_spec(i, body, groups, kinds, where) for i, body in enumerate(data["links"]))
    from ..schema import check
    from ..schemas import NODE

    check(NODE, data, where)  # the declared schema (issue 26), before the node is built
    return NodeTemplate(name=str(data.get("name", path.stem)), path=path, devices=devices, links=links,
                        raw=data)


def _device_groups(body: Any, where: str) -> tuple[DeviceGroup, ...]:
    if not isinstance(body, Mapping) or not body:
        raise InputError(f"{where}: devices must be a non-empty mapping name -> {{kind, count}}")
    groups = []
    for name, spec in body.items():
        w = f"{where}: devices.{name}"
        if not _SELECTOR.match(str(name)) or "[" in str(name):
            raise InputError(f"{w}: name must be letters, digits, '_' or '-'")
        check_keys(spec, ("kind", "count", "sharp", "memory_GBps", "source", "note"), w, required=("kind", "count"))
        if spec["kind"] not in DEVICE_KINDS:
            raise InputError(f"{w}: kind={spec['kind']!r} is not one of {', '.join(DEVICE_KINDS)}")
        if spec["count"] == "any" and spec["kind"] == "gpu":
            count = 0
        else:
            count = positive(spec["count"], w, "count", integer=True, maximum=LIMITS["node_devices"])
        memory_bw = 0.0
        if "memory_GBps" in spec:
            if spec["kind"] != "cpu":
                raise InputError(f"{w}: memory_GBps is a CPU's memory bandwidth (kind cpu), not a {spec['kind']}'s")
            memory_bw = positive(spec["memory_GBps"], w, "memory_GBps", maximum=1e5)
        groups.append(DeviceGroup(name=str(name), kind=spec["kind"], count=count, sharp=bool(spec.get("sharp")),
                                  memory_GBps=memory_bw))
    gpu_groups = [g for g in groups if g.kind == "gpu"]
    if len(gpu_groups) != 1:
        raise InputError(f"{where}: devices: need exactly one group of kind gpu, found {len(gpu_groups)}")
    return tuple(groups)


def parse_selector(text: Any, groups: Mapping[str, DeviceGroup], where: str) -> tuple[str, tuple[int, int] | None]:
    """``gpu`` -> (gpu, None); ``cpu[1]`` -> (cpu, (1, 1)); ``gpu[0-3]`` -> (gpu, (0, 3))."""
    match = _SELECTOR.match(str(text))
    if not match or match.group(1) not in groups:
        raise InputError(f"{where}: {text!r} does not name a device group (known: {', '.join(groups)})")
    name, lo, hi = match.group(1), match.group(2), match.group(3)
    if lo is None:
        return name, None
    lo_i, hi_i = int(lo), int(hi) if hi is not None else int(lo)
    count = groups[name].count
    if hi_i < lo_i or (count and hi_i >= count):
        raise InputError(f"{where}: {text!r} is out of range ({name} has {count} devices)")
    return name, (lo_i, hi_i)


def _link_spec(i: int, body: Any, groups: Mapping[str, DeviceGroup], kinds: Mapping[str, LinkKind],
               where: str) -> LinkSpec:
    w = f"{where}: links[{i}]"
    check_keys(body, ("a", "b", "link", "pattern", "lanes", "bw_GBps", "latency_us", "efficiency", "source",
                      "note"), w, required=("a", "b", "link"))
    a, a_range = parse_selector(body["a"], groups, w)
    b, b_range = parse_selector(body["b"], groups, w)
    w = f"{where}: links[{i}] ({body['a']} - {body['b']})"
    pattern = body.get("pattern", "block")
    if pattern not in PATTERNS:
        raise InputError(f"{w}: pattern={pattern!r} is not one of {', '.join(PATTERNS)}")
    lanes_raw = body.get("lanes", 1)
    lanes_list = lanes_raw if isinstance(lanes_raw, list) else [lanes_raw]
    if len(lanes_list) > LIMITS["node_devices"]:
        raise InputError(f"{w}: lanes lists {len(lanes_list)} values (at most {LIMITS['node_devices']})")
    lanes = tuple(positive(x, w, "lanes", integer=True) for x in lanes_list)
    if len(lanes) > 1 and pattern != "all":
        raise InputError(f"{w}: lanes={lanes_raw!r}: a list of lanes needs pattern: all (one per {b})")
    opt = {k: body.get(k) for k in ("bw_GBps", "latency_us", "efficiency")}
    return LinkSpec(a=a, a_range=a_range, b=b, b_range=b_range, pattern=pattern,
                    kind=_kind(kinds, body["link"], w, "link"), lanes=lanes,
                    bw_GBps=None if opt["bw_GBps"] is None else positive(opt["bw_GBps"], w, "bw_GBps"),
                    latency_us=None if opt["latency_us"] is None else non_negative(opt["latency_us"], w,
                                                                                    "latency_us"),
                    efficiency=None if opt["efficiency"] is None else fraction(opt["efficiency"], w, "efficiency"),
                    where=w)


# ----------------------------------------------------------------------------------------------- fabrics

_FABRIC_KEYS = {
    "none": (),
    "fat_tree": ("levels", "radix", "oversubscription", "placement", "pxn", "sharp", "nic_link", "switch_link"),
    "rail_optimized": ("levels", "radix", "oversubscription", "pxn", "sharp", "nic_link", "switch_link"),
    "torus": ("dims", "host_shape", "wraparound", "link"),
}
_COMMON_FABRIC_KEYS = ("name", "description", "type", "source", "note")


def load_fabric(body: Any, relative_to: Path | None, where: str) -> FabricSpec:
    """A fabric from a name/path, or ``{use: name, <overrides>}`` in a cluster file."""
    overrides: dict[str, Any] = {}
    if isinstance(body, Mapping):
        check_keys(body, ("use",) + tuple(sorted({k for v in _FABRIC_KEYS.values() for k in v})),
                   f"{where}: fabric", required=("use",))
        overrides = {k: v for k, v in body.items() if k != "use"}
        body = body["use"]
    path = resolve("fabric", body, relative_to)
    data = dict(read_yaml(path))
    check_kind(data, "fabric", path)
    ftype = data.get("type")
    if ftype not in FABRIC_TYPES:
        raise InputError(f"{path}: type={ftype!r} is not one of {', '.join(FABRIC_TYPES)}")
    check_keys(data, _COMMON_FABRIC_KEYS + _FABRIC_KEYS[ftype], str(path), required=("type", "source"))
    check_keys(overrides, _FABRIC_KEYS[ftype], f"{where}: fabric overrides for {ftype} {path.stem}")
    data.update(overrides)
    return _fabric_spec(data, path, where=f"{path}" if not overrides else f"{where}: fabric {path.stem}")


def _fabric_spec(data: Mapping[str, Any], path: Path, where: str) -> FabricSpec:
    ftype = data["type"]
    name = str(data.get("name", path.stem))
    if ftype == "none":
        return FabricSpec(name=name, path=path, type=ftype, raw=data)
    kinds = load_link_kinds()
    if ftype == "torus":
        dims = data.get("dims", "auto")
        if dims != "auto":
            if not isinstance(dims, list) or len(dims) != 3:
                raise InputError(f"{where}: dims={dims!r} must be 'auto' or a list of 3 sizes")
            dims = tuple(positive(d, where, "dims", integer=True, maximum=LIMITS["torus_dim"]) for d in dims)
        shape = data.get("host_shape", [1, 1, 1])
        if not isinstance(shape, list) or len(shape) != 3:
            raise InputError(f"{where}: host_shape={shape!r} must be a list of 3 sizes")
        return FabricSpec(name=name, path=path, type=ftype, link=_kind(kinds, data.get("link"), where, "link"),
                          dims=None if dims == "auto" else dims,
                          host_shape=tuple(positive(d, where, "host_shape", integer=True,
                                                    maximum=LIMITS["torus_dim"]) for d in shape),
                          wraparound=bool(data.get("wraparound", True)), raw=data)
    levels = positive(data.get("levels", 2), where, "levels", integer=True)
    if levels > 4:
        raise InputError(f"{where}: levels={levels} must be 1, 2, 3 or 4")
    radix = positive(data.get("radix"), where, "radix", integer=True, maximum=LIMITS["radix"])
    placement = "rail" if ftype == "rail_optimized" else data.get("placement", "node")
    if placement not in ("rail", "node"):
        raise InputError(f"{where}: placement={placement!r} is not one of rail, node")
    if radix < 2 or radix % 2:
        raise InputError(f"{where}: radix={radix} must be an even number >= 2")
    return FabricSpec(name=name, path=path, type=ftype, levels=levels, radix=radix,
                      oversubscription=positive(data.get("oversubscription", 1), where, "oversubscription"),
                      placement=placement, pxn=bool(data.get("pxn", ftype == "rail_optimized")),
                      sharp=bool(data.get("sharp", False)),
                      nic_link=_kind(kinds, data.get("nic_link"), where, "nic_link"),
                      switch_link=_kind(kinds, data.get("switch_link"), where, "switch_link"), raw=data)


# ----------------------------------------------------------------------------------------------- calibration

def cluster_calibration(ref: Any, relative_to: Path, where: str) -> CalibrationSpec:
    """A calibration YAML named by a cluster file (``where``) or ``--calibration``:
    :func:`tpsim.calibration.load_calibration`, relative paths also from the cluster file's folder."""
    try:
        return load_calibration(ref, relative_to)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


# ----------------------------------------------------------------------------------------------- clusters

_CLUSTER_KEYS = ("name", "description", "source", "note", "node", "fabric", "device", "gpus", "gpus_per_node",
                 "partial_nodes", "defaults", "calibration")


def job_gpus_per_node(total: int, gpn: int, partial: Any, where: str) -> int:
    """The GPUs of each node a job of ``total`` GPUs uses, on nodes of ``gpn``: all of them when ``total`` is a
    whole number of nodes; ``total`` when the job is smaller than one node (a job on part of a node, its first
    GPUs); else, where the cluster file sets ``partial_nodes: g`` (the GPUs of one unit of a node, a compute
    tray of an NVL72 rack), the largest multiple of ``g`` up to ``gpn`` that divides ``total``, the same on
    every node (128 GPUs of GB200 NVL72 racks: 2 racks of 64); otherwise an error naming both numbers."""
    g = None if partial is None else positive(partial, where, "partial_nodes", integer=True, maximum=gpn)
    if total % gpn == 0:
        return gpn
    if total < gpn:
        return total
    if g is not None:
        for k in range(gpn - gpn % g, 0, -g):
            if total % k == 0:
                return k
        raise InputError(f"{where}: gpus={total} cannot fill its nodes evenly in units of partial_nodes={g} GPUs "
                         f"(nodes of {gpn} GPUs)")
    raise InputError(f"{where}: gpus={total} is not a whole number of nodes of {gpn} GPUs ({total / gpn:g} nodes; "
                     f"a cluster file's gpus_per_node sets how many GPUs of each node a job uses)")


def _naming(where: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, its InputError prefixed with the cluster file that names the missing node, fabric,
    device or calibration (the fuzz suite found lines that did not say which file, issue 26)."""
    try:
        return fn(*args)
    except InputError as exc:
        if where in str(exc):
            raise
        raise InputError(f"{where}: {exc}") from None


def load_cluster_spec(name_or_path: str, gpus: int | None = None,
                      calibration: str | Path | None = None) -> ClusterSpec:
    """The validated cluster file; ``gpus`` and ``calibration`` (a calibration file) override the file's."""
    path = resolve("cluster", name_or_path)
    data = read_yaml(path)
    where = str(path)
    check_kind(data, "cluster", path)
    check_keys(data, _CLUSTER_KEYS, where, required=("node", "fabric", "device", "gpus", "source"))
    if not isinstance(data["node"], str) or not data["node"].strip():
        raise InputError(f"{where}: node={show(data['node'])} must be a name")
    if not (isinstance(data["fabric"], str) and data["fabric"].strip()) and not isinstance(data["fabric"], Mapping):
        raise InputError(f"{where}: fabric={show(data['fabric'])} must be a name or {{use: name, <overrides>}}")
    node = _naming(where, load_node_template, data["node"], path.parent)
    fabric = _naming(where, load_fabric, data["fabric"], path.parent, where)
    defaults = data.get("defaults") or {}
    check_keys(defaults, ("efficiency",), f"{where}: defaults")
    eff = fraction(defaults.get("efficiency", 1.0), f"{where}: defaults", "efficiency")
    total = positive(data["gpus"], where, "gpus", integer=True)
    if gpus is not None:
        total = positive(gpus, "--gpus", "gpus", integer=True)
    gpn_raw = data.get("gpus_per_node")
    single = gpn_raw == "all"
    template_gpus = node.gpu_group.count
    if single:
        gpn = total
    elif gpn_raw is None:
        if template_gpus == 0:
            raise InputError(f"{where}: gpus_per_node is required: node {node.name} has gpu count 'any'")
        gpn = template_gpus
    else:
        gpn = positive(gpn_raw, where, "gpus_per_node", integer=True, maximum=LIMITS["gpus"])
    if template_gpus and gpn > template_gpus:
        raise InputError(f"{where}: gpus_per_node={gpn} but node {node.name} has {template_gpus} GPUs")
    gpn = job_gpus_per_node(total, gpn, data.get("partial_nodes"), where)
    cal_spec = None
    if calibration is not None:
        cal_spec = cluster_calibration(calibration, Path.cwd(), "calibration")
    elif data.get("calibration") is not None:
        cal_spec = _naming(where, cluster_calibration, data["calibration"], path.parent, where)
    device_name, device_spec = _naming(where, cluster_device, data["device"], where)
    from ..schema import check
    from ..schemas import CLUSTER

    check(CLUSTER, data, where)  # the declared schema (issue 26), before any graph or table is built
    return ClusterSpec(name=str(data.get("name", path.stem)), path=path, node=node, fabric=fabric,
                       device=device_name, gpus=total, gpus_per_node=gpn, single_node=single,
                       default_efficiency=eff, calibration=cal_spec, raw=data, device_spec=device_spec)


def cluster_device(body: Any, where: str) -> tuple[str, DeviceSpec | None]:
    """A cluster file's ``device:``: a name in tpsim/data/devices.yaml, or an inline device (a mapping with
    ``name``, the keys of a devices.yaml entry and ``source``; with ``base: <entry>`` the entry's figures are
    the defaults and the mapping overrides them). Parsed by :func:`tpsim.hardware.device_from_mapping`."""
    if isinstance(body, str):
        return body, None
    if not isinstance(body, Mapping):
        raise InputError(f"{where}: device must be a device name or a mapping (name, peak_tflops, hbm_TBps, "
                         f"memory_bytes, compute_units, source), got {body!r}")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{where}: device: name={name!r}: an inline device needs a name")
    fields = {k: v for k, v in body.items() if k not in ("name", "base")}
    if "base" in body:
        base = body["base"]
        try:
            merged = dict(device_entry(str(base)))
        except InputError as exc:
            raise InputError(f"{where}: device {name}: base: {exc}") from None
        if isinstance(fields.get("peak_tflops"), Mapping):
            fields["peak_tflops"] = {**merged.get("peak_tflops", {}), **fields["peak_tflops"]}
        if "source" not in fields:
            raise InputError(f"{where}: device {name}: an inline device overriding {base} needs its own source")
        merged.update(fields)
        fields = merged
    return name, device_from_mapping(name, fields, where, default_usable_memory_fraction())
