"""The ``tpsim`` command. Each verb lives in its own module ``tpsim/cli/<verb>.py`` exposing
``register(subparsers)``; heavy imports (torch, matplotlib, networkx graphs) happen inside the verb's
``run`` so that ``tpsim estimate`` and ``tpsim plan`` start fast.

Bad input (:class:`tpsim.errors.TpsimError`) becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import TpsimError

# verb modules, in the order `tpsim --help` lists them
VERB_MODULES = ("estimate", "plan", "report", "model", "export", "topo", "collective", "bench_collectives",
                "calibrate", "profile", "validate", "trace")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``tpsim estimate: error: argument --tp: 0 must be a positive integer``) and
    exit status 2, like every other input error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tpsim",
        description="Tensor-parallelism performance simulator and parallelism planner for LLM training.")
    parser.add_argument("--version", action="version", version=f"tpsim {_version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from .. import __version__
    return __version__




def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..topology.progress import set_enabled
    set_enabled(not getattr(args, "json", False))   # progress bars stay off stdout's JSON neighbours too
    try:
        result = args.func(args)
    except TpsimError as exc:
        print(f"tpsim {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tpsim {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
