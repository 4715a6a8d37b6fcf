"""Running a sweep's planning tasks: in this process (``jobs=1``), on a local process pool (``jobs=N``) or on a
Ray cluster (``engine="ray"``, the optional ``tpsim[ray]`` extra; nothing else imports ray).

Results stream into ``<out>/results.jsonl`` (one line per finished task, flushed as it arrives), so an
interrupted sweep resumes from its folder: the tasks already there are not run again, and a task is written
at most once (a retried task, or one that two attempts finished, counts once). A worker that dies is
replaced and its task retried (local pool: up to :data:`MAX_ATTEMPTS` rounds; Ray: ``max_retries``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..errors import InputError
from .evaluate import run_task

RESULTS = "results.jsonl"
MANIFEST = "sweep.json"
MAX_ATTEMPTS = 3
CRASH_ENV = "TPSIM_DESIGN_CRASH_ONCE"
"""fault injection for the tests: a folder; the first task a worker starts while no marker file is there
kills that worker (``os._exit``) once, so the retry path runs."""


def _task_entry(task: Mapping[str, Any]) -> dict[str, Any]:
    """Run one task in a worker; an input problem of the design (a cluster the topology rules refuse) is its
    row's ``why``, not the end of the sweep."""
    folder = os.environ.get(CRASH_ENV)
    if folder:
        marker = Path(folder) / "crashed"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            os._exit(1)
        except FileExistsError:
            pass
    try:
        return run_task(task)
    except InputError as exc:
        return {"task": task["id"], "evaluated": 0, "fits": False, "why": f"design not built: {exc}"}


class ResultStore:
    """``results.jsonl`` of an output folder: the finished tasks, appended one line at a time."""

    def __init__(self, folder: Path, task_ids: Iterable[str]):
        self.path = folder / RESULTS
        self.wanted = set(task_ids)
        self.results: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    res = json.loads(line)
                except json.JSONDecodeError:
                    continue   # the last line of an interrupted write
                tid = res.get("task") if isinstance(res, dict) else None
                if tid in self.wanted and tid not in self.results:
                    self.results[tid] = res
            # compact: only whole, wanted, first-seen lines stay, so that a cut last line cannot run into the
            # next appended one
            from ..io import atomic_write_text

            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                                 for r in self.results.values()), "design results")
        self._fh = None

    def add(self, res: Mapping[str, Any]) -> bool:
        """Record a finished task; False (nothing written) if it was already there."""
        tid = res["task"]
        if tid in self.results or tid not in self.wanted:
            return False
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(res, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.results[tid] = dict(res)
        return True

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def run_tasks(tasks: list[dict[str, Any]], store: ResultStore, *, jobs: int = 1, engine: str = "local",
              address: str | None = None, on_result: Callable[[Mapping[str, Any]], None] | None = None) -> None:
    """Run the tasks the store does not hold yet."""
    todo = [t for t in tasks if t["id"] not in store.results]
    if not todo:
        return

    def done(res: Mapping[str, Any]) -> None:
        if store.add(res) and on_result is not None:
            on_result(res)

    if engine == "ray":
        _run_ray(todo, jobs, address, done)
    elif engine == "local":
        if jobs <= 1:
            for t in todo:
                done(_task_entry(t))
        else:
            _run_pool(todo, jobs, done)
    else:
        raise InputError(f"--engine={engine!r} is not one of local, ray")


def _run_pool(todo: list[dict[str, Any]], jobs: int, done: Callable) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # forked workers inherit what the parent imported: import the planner and the estimator once here
    from ..estimator import core as _core  # noqa: F401
    from ..search import planner as _planner  # noqa: F401

    pending, attempt = todo, 0
    finished: set[str] = set()
    while pending:
        attempt += 1
        if attempt > MAX_ATTEMPTS:
            raise InputError(f"design: {len(pending)} task(s) lost their worker {MAX_ATTEMPTS} times "
                             f"(first: {pending[0]['id']}); the results so far are kept, rerun to resume")
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(pending)),
                                   mp_context=multiprocessing.get_context("fork"))
        try:
            futures = {pool.submit(_task_entry, t): t for t in pending}
            try:
                for f in as_completed(futures):
                    res = f.result()
                    finished.add(res["task"])
                    done(res)
                pending = []
            except BrokenProcessPool:
                pending = [t for t in pending if t["id"] not in finished]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(todo: list[dict[str, Any]], jobs: int, address: str | None, done: Callable) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs the ray package: pip install 'tpsim[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        env = {k: os.environ[k] for k in ("PYTHONPATH", "TPSIM_CACHE_DIR", CRASH_ENV) if k in os.environ}
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                                      runtime_env={"env_vars": env} if env else None)
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = max(1, jobs)
        try:
            ray.init(**kwargs)
        except Exception as exc:   # ConnectionError, RuntimeError ...: one line, exit 2
            raise InputError(f"--engine ray: cannot start or reach Ray ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS)(_task_entry)
        refs = {remote.remote(t): t for t in todo}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                task = refs.pop(ref)
                try:
                    res = ray.get(ref)
                except Exception as exc:   # the task failed MAX_ATTEMPTS times (worker died each time)
                    raise InputError(f"design: task {task['id']} failed on Ray after {MAX_ATTEMPTS} retries "
                                     f"({type(exc).__name__}); the results so far are kept, rerun to "
                                     f"resume") from None
                done(res)
    finally:
        if started_here:
            ray.shutdown()


class Progress:
    """Designs done, plans per second and the time left, on stderr (tqdm)."""

    def __init__(self, total_designs: int, already: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total_designs, initial=already, unit="design", desc="designs",
                        disable=not enabled, leave=False, dynamic_ncols=True)
        self.plans = 0
        self.started = time.perf_counter()

    def update(self, designs: int, plans: int) -> None:
        self.plans += plans
        rate = self.plans / max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{rate:,.0f} plans/s", refresh=False)
        self.bar.update(designs)

    def close(self) -> None:
        self.bar.close()
