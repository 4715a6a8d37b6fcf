"""One ``torch.distributed`` launch per rank count for the suite's rule checks (a test-only helper).

Every launch costs the launcher's and each rank's torch import (about 3 s and 6 s of CPU each: four to six
process-seconds per rank count on 2 cores) before the first case runs. The modules whose checks need the
ranks' results only -- no failure injected, no timing asserted, no CLI -- register their cases here when they
are imported (:func:`register`); the first test that asks for a rank count's results (the ``shared_ranks``
fixture of ``tests/conftest.py``) launches every case registered for it in one job, and every later test reads
the same result. Running one module alone launches only that module's cases, as before.

The worker runs each case by its ``kind`` (block, axis, plan) in the job's order, on meshes of the case's own
axes, so a case's numerics and collectives do not depend on which other cases share the job. The shared job
runs with ``--trace-terms`` (profiled steps on the stages' first ranks): it changes only the timed plan cases,
the only ones that read it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

_REGISTERED: dict[int, list[Any]] = {}
_OUTCOME: dict[int, dict[str, Any] | BaseException] = {}

RUN_TIMEOUT_S = {2: 360.0, 4: 260.0}
"""wall-clock limit of the shared launch per rank count (the sum of the limits the modules had for their own)."""
PG_TIMEOUT_S = {2: 30.0, 4: 60.0}
"""process-group timeout: 4 ranks on 2 cores wait longer for each other."""
TEST_TIMEOUT_S = 420
"""pytest-timeout of a test that reads a shared launch: whichever runs first pays for the whole launch."""


def register(nproc: int, cases: list[Any]) -> list[Any]:
    """Add ``cases`` to the shared launch of ``nproc`` ranks (once per case name); returns ``cases``."""
    if nproc in _OUTCOME:
        raise RuntimeError(f"the {nproc}-rank launch has already run; register cases at import time")
    have = {c.name for c in _REGISTERED.setdefault(nproc, [])}
    for case in cases:
        if case.name not in have:
            _REGISTERED[nproc].append(case)
            have.add(case.name)
    return cases


def results(nproc: int, workdir: Callable[[], Path]) -> dict[str, Any]:
    """{"per_case": {case name: [rank results]}, "result": rank 0's result.json, "trace_dir": Path}
    of the shared ``nproc``-rank launch, launched on first use in the folder ``workdir()`` makes (a failed launch fails every test
    that reads it, with the same error, and is not started again)."""
    if nproc not in _OUTCOME:
        from tpsim.validate import LaunchConfig, launch

        cases = _REGISTERED.get(nproc)
        if not cases:
            raise RuntimeError(f"no case registered for {nproc} ranks")
        work = workdir()
        traces = work / "traces"
        try:
            result = launch(cases, LaunchConfig(nproc=nproc, timeout_s=PG_TIMEOUT_S[nproc],
                                                run_timeout_s=RUN_TIMEOUT_S[nproc], trace_terms=True,
                                                trace_dir=str(traces)), work / "run")
        except BaseException as exc:  # noqa: BLE001 (kept and raised again for every reader)
            _OUTCOME[nproc] = exc
            raise
        per_case: dict[str, list[dict]] = {}
        for rank_results in result["ranks"]:
            for r in rank_results:
                per_case.setdefault(r["case"], []).append(r)
        _OUTCOME[nproc] = {"per_case": per_case, "result": result, "trace_dir": traces,
                           "cases": [c.name for c in cases]}
    outcome = _OUTCOME[nproc]
    if isinstance(outcome, BaseException):
        raise RuntimeError(f"the shared {nproc}-rank launch failed: {outcome}") from outcome
    return outcome
