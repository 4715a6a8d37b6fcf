"""The prediction side of a validation run (torch-free): the estimator's :func:`predict_block` for the same
block on the machine it runs on (``local-cpu`` or a GPU node), with that device's kernel profile and the
collective calibration measured just before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ...errors import InputError
from .case import Case

REPO_ROOT = Path(__file__).resolve().parents[3]
PROFILES_DIR = REPO_ROOT / "profiles"


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds per layer and micro-batch on one rank."""

    fwd_s: float
    bwd_s: float
    comm_s: dict[str, float]
    """{"fwd:all_reduce": seconds, ...}: total per (phase, op)."""
    counts: dict[str, dict[str, int]]
    compute_model: str
    measured_compute_fraction: float


def find_profile(device_type: str = "cpu") -> Path | None:
    """The newest shipped profile of this device type, if any: ``profiles/cpu-*.csv`` for CPU, any other
    ``profiles/*.csv`` (``h200-*.csv``, ...) for GPU."""
    found = [p for p in PROFILES_DIR.glob("*.csv") if p.name.startswith("cpu-") == (device_type == "cpu")]
    found.sort(key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def compute_model(cluster: Any, profile: Path | None):  # noqa: ANN201 - ComputeModel
    """``ProfileModel(profile, fallback=RooflineModel(device))`` if a profile is given, else the roofline."""
    from ...compute.roofline import RooflineModel
    roofline = RooflineModel(cluster.device)
    if profile is None:
        return roofline
    from ...compute.profile import ProfileModel
    return ProfileModel(profile, fallback=roofline)


def calibrated_cluster_file(cluster: str, calibration: Path, out_dir: Path) -> Path:
    """A copy of cluster file ``cluster`` whose ``calibration:`` key names ``calibration`` (written in
    ``out_dir``; node templates and fabrics are still found by name in the topologies folder)."""
    from ...topology.files import read_yaml, resolve
    data = dict(read_yaml(resolve("cluster", cluster)))
    data["calibration"] = str(Path(calibration).resolve())
    data["source"] = f"{data.get('source', '')} Calibrated by {calibration}".strip()
    path = out_dir / f"{data.get('name', 'cluster')}-calibrated.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_local_cluster(name: str, nproc: int, calibration: Path | None, out_dir: Path):  # noqa: ANN201
    """The cluster the ranks ran on, with the collective calibration if one was measured."""
    from ...topology import load_cluster
    source = name if calibration is None else calibrated_cluster_file(name, calibration, out_dir)
    try:
        return load_cluster(source, gpus=nproc)
    except InputError as exc:
        if "whole number of nodes" not in str(exc):
            raise
        # fewer ranks than one node holds (one GPU of an 8-GPU node): the node, ranks 0..nproc-1 of it
        return load_cluster(source)


def predict_case(case: Case, cluster: Any, compute: Any) -> Prediction:
    """:func:`tpsim.estimator.predict_block` for the case's block, plan and flavor ``dtensor``."""
    from ...estimator.block import predict_block
    pred = predict_block(case.model, cluster, case.plan(), compute=compute, flavor="dtensor", fused=case.fused)
    comm: dict[str, float] = {}
    for phase, op, _module, _nbytes, t in pred.comm:
        comm[f"{phase}:{op}"] = comm.get(f"{phase}:{op}", 0.0) + float(t)
    return Prediction(fwd_s=float(pred.fwd_s), bwd_s=float(pred.bwd_s), comm_s=comm, counts=pred.counts,
                      compute_model=str(pred.compute_model),
                      measured_compute_fraction=float(pred.measured_compute_fraction))


def grid_hits(case: Case, profile: Path | None) -> list[tuple[int, int, int]]:
    """GEMM shapes (m, n, k) of the block, forward and backward, that are exact points of the profile's grid
    (a validation shape there would be a look-up, not a prediction)."""
    if profile is None:
        return []
    try:
        import pandas as pd
    except ImportError:  # a bare GPU machine: the check is informational
        return []
    try:
        rows = pd.read_csv(profile, comment="#")
    except (OSError, ValueError) as exc:
        raise InputError(f"{profile}: cannot read the profile ({exc})") from None
    gemm = rows[(rows["kind"] == "gemm") & (rows["dtype"] == "fp32")]
    points = set(zip(gemm["m"].astype(int), gemm["n"].astype(int), gemm["k"].astype(int)))
    return [s for s in block_gemms(case) if s in points]


def block_gemms(case: Case) -> list[tuple[int, int, int]]:
    """(m, n, k) of the block's linear layers on one rank, forward, data gradient and weight gradient."""
    m, tp, T = case.model, case.tp, case.tokens
    kv = max(m.num_kv_heads // tp, 1) * m.head_dim
    q = m.q_size // tp
    f = m.ffn_hidden_size // tp
    h = m.hidden_size
    widths = [q + 2 * kv] if case.fused else [q, kv, kv]
    widths += [2 * f] if (case.fused and m.gated) else ([f, f] if m.gated else [f])
    linears = [(n, h) for n in widths] + [(h, q), (h, f)]  # (out, in)
    shapes = []
    for n, k in linears:
        shapes += [(T, n, k), (T, k, n), (n, k, T)]  # forward, input gradient, weight gradient
    return shapes
