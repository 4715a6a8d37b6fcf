"""``tpsim validate``: the plan's real sharded layers through torch.distributed, against the prediction.

Torch is imported only by the rank side (:mod:`.block`, :mod:`.styles`, :mod:`.measure`, :mod:`.worker`),
which runs in the launched processes; this package's top level and the launcher side stay torch-free.

Public API: :class:`Case`, :class:`LaunchConfig`, :func:`launch`, :class:`RankFailure`, :class:`Options`,
:func:`validate`, :func:`matrix_cases`.
"""

from .case import Case
from .launch import LaunchConfig, RankFailure, launch
from .run import Options, matrix_cases, validate

__all__ = ["Case", "LaunchConfig", "RankFailure", "launch", "Options", "validate", "matrix_cases"]
