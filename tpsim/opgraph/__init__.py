"""Traced op graphs (``*.ops.json``, docs/OPGRAPH.md): format, TP plan derivation, costs and estimates.

torch-free: ``tpsim trace`` (:mod:`tpsim.trace`) writes the graphs; everything here reads them.
"""

from .schema import OpGraph, is_opgraph_path, load_opgraph, parse_opgraph

__all__ = ["OpGraph", "load_opgraph", "parse_opgraph", "is_opgraph_path"]
