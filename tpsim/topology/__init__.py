"""Cluster topologies: YAML files (``topologies/``) -> :class:`Cluster` (networkx graph + routing).

``load_cluster(name_or_path, gpus=None)`` is cached on the resolved files (paths + modification times) and
the GPU count, so the same object comes back for the same inputs (caches keyed on it keep working).
"""

from __future__ import annotations

import os
from pathlib import Path

from .cluster import Cluster
from .files import _read_cached, available, resolve, topologies_dir
from .spec import ClusterSpec, links_file, load_cluster_spec

__all__ = ["Cluster", "clear_cache", "load_cluster", "list_clusters", "topologies_dir"]


def load_cluster(name_or_path: str | os.PathLike[str], gpus: int | None = None,
                 calibration: str | os.PathLike[str] | None = None) -> Cluster:
    """Load a cluster by file stem (``topologies/clusters/<name>.yaml``) or path; ``gpus`` defaults to the
    file's ``gpus``; ``calibration`` (a file written by ``tpsim calibrate``) replaces the file's
    ``calibration:``. Raises :class:`~tpsim.errors.InputError` on a bad file or a GPU count that is not a
    whole number of nodes. The same inputs (files unchanged) give the same object."""
    from ..errors import InputError
    from ..limits import check_int

    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise InputError(f"cluster={name_or_path!r:.60} must be a cluster name or a path (tpsim topo list)")
    if gpus is not None:
        gpus = check_int("gpus", gpus)  # numpy integers are integers; bools, strings, 2^40 refused (issue 26)
    if calibration is not None and not isinstance(calibration, (str, os.PathLike)):
        raise InputError(f"calibration={type(calibration).__name__} must be a path to a calibration YAML")
    path = resolve("cluster", name_or_path)
    cal = None if calibration is None else str(Path(calibration).expanduser().resolve())
    key = (str(path), gpus, str(topologies_dir()), cal)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == _stamp(hit[1].spec):
        return hit[1]
    cluster = Cluster(load_cluster_spec(str(path), gpus, cal))
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (_stamp(cluster.spec), cluster)
    if gpus is None:   # load_cluster(name) and load_cluster(name, gpus=<the file's gpus>) are one object
        full = (key[0], cluster.num_gpus, key[2], key[3])
        if full in _CACHE and _CACHE[full][0] == _CACHE[key][0]:
            cluster = _CACHE[full][1]
            _CACHE[key] = (_CACHE[key][0], cluster)
        else:
            _CACHE[full] = _CACHE[key]
    return cluster


def list_clusters() -> list[str]:
    """Names of the clusters shipped in the topologies folder."""
    return available("cluster")


def clear_cache() -> None:
    """Forget loaded clusters and parsed files (tests; files edited within one clock tick)."""
    _CACHE.clear()
    _read_cached.cache_clear()


_CACHE_SIZE = 64
_CACHE: dict[tuple, tuple[tuple, Cluster]] = {}


def _stamp(spec: ClusterSpec) -> tuple[int, ...]:
    """Modification times of every file the cluster was built from."""
    files = [spec.path, spec.node.path, links_file()]
    if spec.fabric.path is not None:
        files.append(spec.fabric.path)
    if spec.calibration is not None:
        files.append(spec.calibration.path)
    try:
        return tuple(x for f in files for x in (f.stat().st_mtime_ns, f.stat().st_size))
    except OSError:
        return ()
