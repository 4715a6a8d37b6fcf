"""The ``compute:`` section of a calibration file (docs/SCHEMAS.md section 7), read and written (torch-free).

``tpsim calibrate --from-validation`` writes it; ``tpsim validate --calibration FILE`` applies it (the kernel
profile's GEMM, attention and memory-bound times multiplied by their scales, and the host overhead added per
layer). Until the shared loader ``tpsim.calibration.load_calibration`` exists on this branch, this module is
the reader of the section, and follows the schema: keys ``gemm_scale``, ``attention_scale``, ``memory_scale``,
``host_overhead_per_layer_us``, ``device``, ``stack`` and the leave-one-out error ``loo_error``; anything else
is provenance (``host_overhead_fwd_share``, the forward's part of the host overhead, is one this reader uses
when present). Link entries (``loopback``, ``nvlink``, ...) and ``gloo_ops`` in the same file are the collective
model's (``tpsim.collectives.calibration.load_calibration`` reads them and ignores ``compute``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import InputError

SCALE_KEYS = ("gemm_scale", "attention_scale", "memory_scale")
CLUSTER_KEYS = ("nodes", "node", "fabric", "gpus_per_node", "devices")
"""keys of a cluster or node file: such a file given as a calibration is refused."""
DEFAULT_FWD_SHARE = 1.0 / 3.0
"""forward part of the host overhead when a file does not say (backward dispatches about twice the ops)."""


@dataclass(frozen=True, kw_only=True)
class ComputeCalibration:
    """Compute factors fitted from validation runs for one device and stack."""

    gemm_scale: float = 1.0
    attention_scale: float = 1.0
    memory_scale: float = 1.0
    host_overhead_per_layer_us: float = 0.0
    """framework (host) time per layer and micro-batch, forward + backward, microseconds."""
    host_overhead_fwd_share: float = DEFAULT_FWD_SHARE
    device: str = ""
    stack: str = ""
    loo_error: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def overhead_s(self) -> dict[str, float]:
        """Host overhead per layer and micro-batch, seconds, split into forward and backward."""
        total = self.host_overhead_per_layer_us * 1e-6
        return {"fwd": total * self.host_overhead_fwd_share, "bwd": total * (1.0 - self.host_overhead_fwd_share)}

    def to_section(self) -> dict[str, Any]:
        return {"device": self.device, "stack": self.stack, **{k: round(getattr(self, k), 6) for k in SCALE_KEYS},
                "host_overhead_per_layer_us": round(self.host_overhead_per_layer_us, 3),
                "host_overhead_fwd_share": round(self.host_overhead_fwd_share, 4), "loo_error": dict(self.loo_error)}


def _number(path: Path, key: str, value: Any, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise InputError(f"{path}: compute.{key}={value!r} must be a {'positive' if positive else 'non-negative'} "
                         "finite number")
    return float(value)


def read_compute_calibration(path: str | Path) -> ComputeCalibration | None:
    """The ``compute:`` section of a calibration YAML (None if the file has none)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--calibration={str(path)!r}: file not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: a calibration file is a mapping (link types, gloo_ops, compute)")
    cluster_keys = [k for k in CLUSTER_KEYS if k in data]
    if cluster_keys:
        raise InputError(f"{p}: this is a cluster or node file (key {cluster_keys[0]!r}), not a calibration")
    section = data.get("compute")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise InputError(f"{p}: compute must be a mapping with {', '.join(SCALE_KEYS)}, host_overhead_per_layer_us")
    values = {k: _number(p, k, section[k], positive=True) for k in SCALE_KEYS if k in section}
    if "host_overhead_per_layer_us" in section:
        values["host_overhead_per_layer_us"] = _number(p, "host_overhead_per_layer_us",
                                                       section["host_overhead_per_layer_us"], positive=False)
    if "host_overhead_fwd_share" in section:
        share = _number(p, "host_overhead_fwd_share", section["host_overhead_fwd_share"], positive=False)
        if share > 1:
            raise InputError(f"{p}: compute.host_overhead_fwd_share={share} must be between 0 and 1")
        values["host_overhead_fwd_share"] = share
    loo = section.get("loo_error") or {}
    return ComputeCalibration(**values, device=str(section.get("device", "")), stack=str(section.get("stack", "")),
                              loo_error=loo if isinstance(loo, dict) else {}, source=str(p))


def write_calibration(path: Path, compute: ComputeCalibration, links: Mapping[str, Any] | None,
                      provenance: Mapping[str, Any]) -> None:
    """One calibration YAML: link entries (if any), the compute section, then provenance."""
    body: dict[str, Any] = dict(links or {})
    body["compute"] = compute.to_section()
    body.update(provenance)
    text = ("# Calibration written by `tpsim calibrate --from-validation` (docs/SCHEMAS.md section 7): use with\n"
            "# --calibration on estimate, plan and validate.\n" + yaml.safe_dump(body, sort_keys=False))
    from .report import write_atomic
    write_atomic(Path(path), text.encode())
