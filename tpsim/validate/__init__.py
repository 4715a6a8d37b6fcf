"""``tpsim validate``: the plan's real sharded layers through torch.distributed, against the prediction.

Torch is imported only by the rank side (:mod:`.modules` the layers, :mod:`.block.measure`, :mod:`.plan.run`,
:mod:`.plan.stack`, :mod:`.axis.run`, :mod:`.traced.worker`, :mod:`.worker`), which runs in the launched processes;
this package's top level and the launcher side stay torch-free.

Folders: :mod:`.block` (one block at a TP degree, and what every case shares), :mod:`.axis` (context- and
expert-parallel blocks), :mod:`.plan` (whole plans), :mod:`.traced` (traced models), :mod:`.modules` (torch-side
layers). Top level: :mod:`.run` end to end, :mod:`.launch` and :mod:`.worker` (launcher and rank entry),
:mod:`.matrix`, :mod:`.top` (``plan --validate-top``), :mod:`.overhead`, :mod:`.drift`, :mod:`.learn`,
:mod:`.calfile`, :mod:`.shard`.

Public API: :class:`Case`, :class:`LaunchConfig`, :func:`launch`, :class:`RankFailure`, :class:`Options`,
:func:`validate`, :func:`matrix_cases`.
"""

from .block.case import Case
from .launch import LaunchConfig, RankFailure, launch
from .run import Options, matrix_cases, validate

__all__ = ["Case", "LaunchConfig", "RankFailure", "launch", "Options", "validate", "matrix_cases"]
