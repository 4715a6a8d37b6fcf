"""The ``compute:`` section of a calibration file (docs/SCHEMAS.md section 7): written here, read by the one
loader :func:`tpsim.calibration.load_calibration` (torch-free).

``tpsim calibrate --from-validation`` writes it; ``tpsim validate --calibration FILE`` applies it (the kernel
profile's GEMM, attention and memory-bound times multiplied by their scales, and the host overhead added per
layer, split between forward and backward by ``host_overhead_fwd_share``). Link entries (``loopback``,
``nvlink``, ...) and ``gloo_ops`` in the same file are the collective model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from ..calibration import DEFAULT_FWD_SHARE, ComputeCalibration, load_calibration

__all__ = ["DEFAULT_FWD_SHARE", "ComputeCalibration", "read_compute_calibration", "write_calibration"]


def read_compute_calibration(path: str | Path) -> ComputeCalibration | None:
    """The ``compute:`` section of a calibration YAML (None if the file has none); other kinds of files are
    refused by the shared loader with one line naming them."""
    return load_calibration(path).compute


def write_calibration(path: Path, compute: ComputeCalibration, links: Mapping[str, Any] | None,
                      provenance: Mapping[str, Any]) -> None:
    """One calibration YAML: link entries (if any), the compute section, then provenance."""
    body: dict[str, Any] = dict(links or {})
    body["compute"] = compute.to_section()
    body.update(provenance)
    text = ("# Calibration written by `tpsim calibrate --from-validation` (docs/SCHEMAS.md section 7): use with\n"
            "# --calibration on estimate, plan and validate.\n" + yaml.safe_dump(body, sort_keys=False))
    from .block.report import write_atomic
    write_atomic(Path(path), text.encode())
