"""``tpsim trace``: build any PyTorch model on the meta device, run one forward pass under interception and
write the torch-free op graph (``*.ops.json``, docs/OPGRAPH.md) that the estimator, planner and validator read.

This package (with :mod:`tpsim.validate` and :mod:`tpsim.profiler`) is where torch is imported; nothing in the
estimator or planner imports it.
"""

from .api import trace_module, trace_spec

__all__ = ["trace_module", "trace_spec"]
