"""``tpsim trace MODULE:FN`` runs the user's code here, in a child process with a time and a memory limit
(issue 26), never in the ``tpsim`` process itself.

The parent (:func:`trace_in_child`) writes the job (module spec, inputs, kwargs, name) to a JSON file, starts
``python -m tpsim.trace.child JOB RESULT`` in its own session with ``RLIMIT_AS`` set (the model is built on
the meta device: a real allocation of gigabytes means the user's code does something else) and
``PR_SET_PDEATHSIG`` (it dies with the parent), waits at most ``timeout_s`` and kills the whole session on a
timeout, an interrupt or any error. The child writes the graph (or one error line) to RESULT. Every way the
user's code can end is one line naming the module: an exception, ``sys.exit`` at import or in the factory
(even ``sys.exit(0)``: that is not a traced graph), ``os._exit``, a signal, running out of memory, a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import InputError

DEFAULT_TIMEOUT_S = 600.0
"""a traced forward on the meta device takes seconds (the 1.3B GPT: ~3 s); ten minutes means a hang."""
DEFAULT_MEMORY_GIB = 8.0
"""address space of the child: ``import torch`` maps ~0.7 GB; a meta-device model holds no tensor data."""


def _limits(memory_bytes: int) -> None:
    """``preexec_fn``: address-space limit, die with the parent."""
    import resource

    from ..procs import set_pdeathsig

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:  # under a lower limit already (ulimit -v): keep it; raising it fails
        memory_bytes = min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    set_pdeathsig(signal.SIGKILL)


def trace_in_child(spec: str, inputs: list[str], kwargs: list[str], *, name: str | None = None,
                   tokens_per_sample: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                   memory_gib: float = DEFAULT_MEMORY_GIB) -> str:
    """The op-graph JSON of ``spec`` traced in a bounded child (see the module doc); InputError otherwise."""
    what = f"module {spec[:200]!r}"
    with tempfile.TemporaryDirectory(prefix="tpsim-trace-") as folder:
        job, result = Path(folder) / "job.json", Path(folder) / "result.json"
        job.write_text(json.dumps({"spec": spec, "inputs": inputs, "kwargs": kwargs, "name": name,
                                   "tokens_per_sample": tokens_per_sample}))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2]),
                                                                      os.environ.get("PYTHONPATH", "")] if p))
        memory = int(memory_gib * 2**30)
        proc = subprocess.Popen([sys.executable, "-m", "tpsim.trace.child", str(job), str(result)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, preexec_fn=lambda: _limits(memory))
        try:
            try:
                output, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                raise InputError(f"trace {what}: no graph after {timeout_s:g} s (a loop at import or in forward?); "
                                 f"stopped (--timeout-s to allow longer)") from None
        finally:
            _kill(proc)
        tail = output.decode("utf-8", "replace").strip().splitlines()[-1:] if output else []
        said = f" (its last output: {tail[0][:160]!r})" if tail else ""
        reply = _reply(result)
        if reply is not None and "error" in reply:
            raise InputError(f"trace {what}: {reply['error']}")
        if proc.returncode != 0 or reply is None or "graph" not in reply:
            if proc.returncode is not None and proc.returncode < 0:
                sig = signal.Signals(-proc.returncode).name if -proc.returncode in signal.Signals._value2member_map_ \
                    else str(-proc.returncode)
                how = f"was killed by {sig}"
                if -proc.returncode in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT):
                    how += f" (over the {memory_gib:g} GiB memory limit? --memory-limit-gib to allow more)"
            else:
                how = f"exited with status {proc.returncode} before producing a graph (os._exit or a crash)"
            raise InputError(f"trace {what}: {how}{said}")
        return reply["graph"]


def _reply(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child's whole session (the user's code may have started processes of its own)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    else:
        try:  # the child exited; anything it left in its session goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _child(job_path: str, result_path: str) -> int:
    from ..procs import watch_parent

    watch_parent()
    job = json.loads(Path(job_path).read_text())

    def answer(**reply: Any) -> None:
        Path(result_path).write_text(json.dumps(reply))

    spec = job["spec"]
    try:
        from ..trace import trace_spec
        from ..trace.spec import parse_input_shape, parse_kwargs

        inputs = [parse_input_shape(s) for s in job["inputs"]]
        graph = trace_spec(spec, inputs, parse_kwargs(job["kwargs"]), name=job["name"],
                           tokens_per_sample=job["tokens_per_sample"])
        text = graph.to_json()
    except InputError as exc:
        answer(error=str(exc))
        return 3
    except SystemExit as exc:  # sys.exit() at import or in the factory: even status 0 is not a graph
        answer(error=f"called sys.exit({exc.code!r}) while being imported or traced; no graph")
        return 3
    except MemoryError:
        answer(error="ran out of memory (the memory limit; --memory-limit-gib to allow more)")
        return 3
    except BaseException as exc:  # the user's code: report it in one line
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        answer(error=f"failed: {type(exc).__name__}{': ' + first if first else ''}")
        return 3
    answer(graph=text)
    return 0


if __name__ == "__main__":
    start = time.monotonic()
    sys.exit(_child(sys.argv[1], sys.argv[2]))
