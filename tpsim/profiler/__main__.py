"""``python -m tpsim.profiler ...`` = ``tpsim profile ...``, without loading the other verbs (for a GPU
machine's bare Python: ``PYTHONPATH=. python -m tpsim.profiler --device cuda``)."""

import argparse
import sys

from ..cli import profile as verb
from ..errors import TpsimError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpsim.profiler")
    verb.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["profile", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except TpsimError as exc:
        print(f"tpsim profile: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # every finished point is already in the file
        print("tpsim profile: interrupted (rerun with the same --out to resume)", file=sys.stderr)
        return 130


sys.exit(main())
