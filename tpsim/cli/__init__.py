"""The ``tpsim`` command. Each verb lives in its own module ``tpsim/cli/<verb>.py`` exposing
``register(subparsers)``; heavy imports (torch, matplotlib, networkx graphs) happen inside the verb's
``run`` so that ``tpsim estimate`` and ``tpsim plan`` start fast.

Bad input (:class:`tpsim.errors.TpsimError`) becomes one line on stderr and exit status 2; so do file-system
errors nobody checked for (an ``OSError``: the line names the file) and running out of memory. SIGTERM and
SIGHUP end a verb like Ctrl-C does (``finally`` blocks run: temporary files are removed, child processes
reaped), with exit status 128 + the signal number.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from ..errors import Terminated, TpsimError  # noqa: F401 (Terminated: importable here, as before)

MAX_MESSAGE = 600
"""characters of an error line; a longer message (a huge value echoed back) keeps its start and end."""

# verb modules, in the order `tpsim --help` lists them
VERB_MODULES = ("estimate", "train_time", "plan", "report", "model", "export", "topo", "collective", "bench_collectives",
                "calibrate", "profile", "validate", "trace", "design")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``tpsim estimate: error: argument --tp: 0 must be a positive integer``) and
    exit status 2, like every other input error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message: str) -> str:
    """The message on one line (newlines and control characters escaped), at most :data:`MAX_MESSAGE` long."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(message))
    if len(text) > MAX_MESSAGE:
        text = f"{text[:MAX_MESSAGE - 160]} ...({len(text)} characters)... {text[-120:]}"
    return text


def _on_signal(signum: int, frame: object) -> None:  # noqa: ARG001 (a fixed signature)
    raise Terminated(signum)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``tpsim`` parser. Given the command line, it registers only the verb that line runs (when its first
    word names a verb), so that ``tpsim estimate`` imports no other verb's module; otherwise (``tpsim --help``,
    no verb, a misspelt verb) it registers every verb."""
    parser = OneLineParser(
        prog="tpsim",
        description="Tensor-parallelism performance simulator and parallelism planner for LLM training.")
    parser.add_argument("--version", action="version", version=f"tpsim {_version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in _verb_modules(argv):
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        module.register(sub)
    for verb_parser in sub.choices.values():  # every verb bounds its work before it starts (tpsim/work.py)
        if "--allow-large-work" not in verb_parser._option_string_actions:
            verb_parser.add_argument("--allow-large-work", action="store_true",
                                     help="run even when the inputs ask for more work than the soft bounds of "
                                          "tpsim/limits.py WORK_LIMITS (hard bounds still apply)")
    return parser


def _verb_modules(argv: list[str] | None) -> tuple[str, ...]:
    """The module of the verb the command line starts with (verb ``bench-collectives``: module
    ``bench_collectives``), or every verb module (``tpsim --help estimate`` lists every verb, as before)."""
    word = argv[0] if argv else None
    named = tuple(m for m in VERB_MODULES if m.replace("_", "-") == word)
    return named or VERB_MODULES


def _version() -> str:
    from .. import __version__
    return __version__




def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (status 2, one line already printed), --help or --version (0)
        return exc.code if isinstance(exc.code, int) else 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = list(argv)  # the command line as given (tpsim validate --print-launch repeats it)
    from ..topology.progress import set_enabled
    set_enabled(not getattr(args, "json", False))   # progress bars stay off stdout's JSON neighbours too
    previous = _install_signal_handlers()
    try:
        from ..work import check_work

        check_work(args.verb, args)  # the verb's work estimated from its inputs, refused above the bounds
        result = args.func(args)
    except TpsimError as exc:
        return _fail(args.verb, str(exc))
    except Terminated as exc:
        print(f"tpsim {args.verb}: terminated by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"tpsim {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file-system failure no check foresaw: still one line naming the file
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(args.verb, f"{where}{exc.strerror or exc}")
    except MemoryError:
        return _fail(args.verb, "out of memory (the input asks for more than this machine has)")
    finally:
        _restore_signal_handlers(previous)
    return int(result or 0)


def _fail(verb: str, message: str) -> int:
    print(f"tpsim {verb}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _install_signal_handlers() -> dict[int, object]:
    """SIGTERM/SIGHUP -> :class:`Terminated` (main thread only; a no-op elsewhere, e.g. under a test runner's
    worker thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, _on_signal)
    return previous


def _restore_signal_handlers(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
