"""``tpsim trace``: build a PyTorch model on the meta device, trace one forward pass, write its op graph.

Examples::

    tpsim trace tpsim.trace.zoo:vit_l16 --input-shape 1,3,224,224 --out vit-l16.ops.json
    tpsim trace tpsim.trace.zoo:gpt --kwarg layers=24 --kwarg hidden=2048 --kwarg heads=16 \\
        --input-shape 1,2048:int64 --out gpt-1.3b.ops.json
    tpsim trace my_models.py:build_unet --input-shape 8,3,64,64 --input-shape 8 --out unet.ops.json
    tpsim trace vit-l16.ops.json --show        # print a graph's units and derived TP plan
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import positive_int, real_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="trace a PyTorch model on the meta device into an op graph (*.ops.json)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module_spec", help="package.module:factory or path/to/file.py:callable (returns an nn.Module); "
                                       "or an existing *.ops.json with --show")
    p.add_argument("--input-shape", action="append", default=[], metavar="SHAPE[:DTYPE]",
                   help="one model input (repeat for several, in forward's order): dims separated by ',' or "
                        "'x', dim 0 = batch; dtype float32 (default), int64 (token ids), bfloat16, ...")
    p.add_argument("--kwarg", action="append", default=[], metavar="NAME=VALUE",
                   help="keyword argument of the factory (a Python literal), repeatable")
    p.add_argument("--name", help="model name in the graph (default: the factory's name)")
    p.add_argument("--tokens-per-sample", type=positive_int,
                   help="tokens per sample for tokens/s (default: the first input's non-batch size when it holds "
                        "integer token ids, else 1: samples/s)")
    p.add_argument("--out", help="output file (default: <name>.ops.json)")
    p.add_argument("--tp-plan", help="YAML of TP plan overrides shown with the derived plan")
    p.add_argument("--show", action="store_true", help="print the graph's units and its derived TP plan")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--timeout-s", type=real_arg("timeout_s"), default=None,
                   help="stop the model's code after this long (default 600: it runs in a child process)")
    p.add_argument("--memory-limit-gib", type=real_arg("mem_limit_gib"), default=None,
                   help="address-space limit of that child (default 8 GiB; the model is built on the meta device)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..opgraph.schema import is_opgraph_path, load_opgraph

    if is_opgraph_path(args.module_spec) and Path(args.module_spec).is_file():
        graph = load_opgraph(args.module_spec)
        print(describe(graph, args.tp_plan))
        return 0
    if not args.input_shape:
        raise InputError("--input-shape is required (one per model input, dim 0 = batch)")
    if args.tp_plan:  # read (and refused) before the trace, not only with --show
        from ..opgraph.tp import load_overrides

        load_overrides(args.tp_plan)
    from ..io import atomic_write_text, check_output_file
    from ..opgraph.schema import parse_opgraph
    from ..trace.child import DEFAULT_MEMORY_GIB, DEFAULT_TIMEOUT_S, trace_in_child
    from ..trace.spec import parse_input_shape, parse_kwargs

    parse_kwargs(args.kwarg)  # bad --kwarg and --input-shape values are refused before any code runs
    for s in args.input_shape:
        parse_input_shape(s)
    name = args.name if args.name is not None else args.module_spec.rpartition(":")[2].replace("_", "-")
    _check_name(name)
    out = Path(args.out or f"{name}.ops.json")
    if not out.name.endswith(".ops.json"):
        raise InputError(f"--out {out}: the file name must end in .ops.json (that is how --model recognises it)")
    check_output_file(out, "--out", force=args.force, create_parent=True)  # before the work (issue 26)
    text = trace_in_child(args.module_spec, list(args.input_shape), list(args.kwarg), name=args.name,
                          tokens_per_sample=args.tokens_per_sample,
                          timeout_s=args.timeout_s or DEFAULT_TIMEOUT_S,
                          memory_gib=args.memory_limit_gib or DEFAULT_MEMORY_GIB)
    graph = parse_opgraph(text, f"the graph traced from {args.module_spec}")
    check_output_file(out, "--out", force=args.force, create_parent=True)  # nothing appeared there meanwhile
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text, "--out", overwrite=args.force)  # a file that appeared meanwhile is kept
    print(describe(graph, args.tp_plan) if args.show else graph.summary())
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _check_name(name: str) -> None:
    """A graph name is one plain file-name component: it names the default output file."""
    from ..errors import InputError

    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name.startswith(".") \
            or len(name) > 128 or not name.isprintable():
        raise InputError(f"--name {name[:80]!r}: a graph name is a plain name (letters, digits, - _ .; no folder "
                         f"parts, not starting with '.'), at most 128 characters")


def _write(path: Path, text: str) -> None:
    import os

    from ..errors import InputError

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"--out {path}: cannot write ({exc.strerror})") from None


def describe(graph, tp_plan: str | None = None) -> str:  # noqa: ANN001
    """The graph's summary and its derived TP plan (op -> style, non-replicated ops)."""
    from ..opgraph.tp import PlanOverrides, derive_plan, load_overrides

    overrides = load_overrides(tp_plan) if tp_plan else PlanOverrides()
    plan = derive_plan(graph, overrides)
    lines = [graph.summary(), "TP plan (ops not listed are replicated):"]
    for name, style in plan.described(graph).items():
        lines.append(f"  {name:48s} {style}")
    return "\n".join(lines)
