"""Cluster topologies: YAML files (``topologies/``) -> :class:`Cluster` (networkx graph + routing).

``load_cluster(name_or_path, gpus=None)`` is cached on the resolved files (path + modification time) and the
GPU count, so the same object comes back for the same inputs (caches keyed on it keep working).
"""

from __future__ import annotations

import os
from functools import lru_cache

from .cluster import Cluster
from .files import available, resolve, topologies_dir
from .spec import load_cluster_spec

__all__ = ["Cluster", "load_cluster", "list_clusters", "topologies_dir"]


def load_cluster(name_or_path: str | os.PathLike[str], gpus: int | None = None) -> Cluster:
    """Load a cluster by file stem (``topologies/clusters/<name>.yaml``) or path; ``gpus`` defaults to the
    file's ``gpus``. Raises :class:`~tpsim.errors.InputError` on a bad file or a GPU count that is not a
    whole number of nodes."""
    path = resolve("cluster", name_or_path)
    return _load(str(path), gpus, _stamp(path), str(topologies_dir()))


def list_clusters() -> list[str]:
    """Names of the clusters shipped in the topologies folder."""
    return available("cluster")


def _stamp(path) -> tuple[int, ...]:
    """Modification times of the topology tree (any edited file invalidates the cache)."""
    root = topologies_dir()
    stamps = [path.stat().st_mtime_ns]
    for sub in ("", "nodes", "fabrics"):
        folder = root / sub
        if folder.is_dir():
            stamps.append(folder.stat().st_mtime_ns)
            stamps.extend(p.stat().st_mtime_ns for p in folder.glob("*.yaml"))
    return tuple(stamps)


@lru_cache(maxsize=64)
def _load(path: str, gpus: int | None, stamp: tuple[int, ...], root: str) -> Cluster:
    return Cluster(load_cluster_spec(path, gpus))
