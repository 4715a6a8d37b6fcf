"""Parsing is linear in the input's size (issue 26): time the bounded JSON reader on 10 MB documents of
hostile shapes and on growing sizes of each, and print the figures.

    python benchmarks/bench_parse.py [--mb 10] [--only SHAPE]

Shapes: deep nesting (at the depth limit, repeated, deep then wide), quote-heavy strings (escaped quotes, an
unterminated string, quote-heavy keys), long digit runs and big exponents, many small values, floats, strings,
objects, mixed containers, colons inside strings, one huge string, non-ASCII text, whitespace, many keys (and a
repeated one), many small objects with a repeated key, commas and brackets inside strings. Each is timed through
:func:`tpsim.boundedjson.loads` (what every JSON input goes through; refused documents count: the time to say
no is what a hostile input costs), and the ratio of the 10 MB time to the 1 MB time shows the growth (10 for
linear).
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from tpsim.boundedjson import loads
from tpsim.errors import InputError
from tpsim.limits import MAX_JSON_DEPTH


def _fill(size: int, item: str, head: str = "[", tail: str = "]", sep: str = ",") -> str:
    """``item`` repeated to ``size`` characters inside ``head`` ... ``tail``."""
    return head + sep.join([item] * max(1, (size - len(head) - len(tail)) // (len(item) + len(sep)))) + tail


def _scaled(make, size: int) -> str:
    """``make(n)`` with ``n`` chosen so that the text is about ``size`` characters (two tries: grows linearly)."""
    n = max(1, size // 20)
    n = max(1, int(n * size / len(make(n))))
    return make(n)


def shapes(size: int) -> dict[str, str]:
    unit = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    many_keys = _scaled(lambda n: json.dumps({f"k{i}": i for i in range(n)}), size)
    return {
        "nested at the depth limit": _fill(size, unit),
        "nested, under the value limit": _fill(size, "[" * 8 + "1" + "]" * 8, sep=",     "),
        "too deep": "[" * (size // 2) + "]" * (size // 2),
        "deep then wide": "[" * (MAX_JSON_DEPTH - 1) + _fill(size - 2 * MAX_JSON_DEPTH, "1") + "]" * (MAX_JSON_DEPTH - 1),
        "escaped quotes": json.dumps({"k": '\\"' * (size // 4)}),
        "unterminated string": '{"k": "' + '\\"' * (size // 2),
        "bare quotes outside strings": '\\"' * (size // 2),
        "quote-heavy keys": _fill(size, '{"\\"\\\\\\"": "\\"\\""}'),
        "long digit runs": "[" + "9" * (size - 2) + "]",
        "40-digit integers": _fill(size, "9" * 40),
        "big exponents": _fill(size, "1.5e300"),
        "many small values": _fill(size, "1"),
        "many floats": _fill(size, "1.25", sep=", "),
        "many short strings": _fill(size, '"ab"', sep=", "),
        "many small objects": _fill(size, '{"a": 1}'),
        "mixed objects and lists": _fill(size, '{"a": [1, {"b": 2.5}], "c": "x:y"}'),
        "colons inside strings": _scaled(lambda n: json.dumps({f"k{i}": "a:b" for i in range(n)}), size),
        "one huge string": json.dumps({"k": "a" * size}),
        "non-ASCII text": json.dumps({"k": "\u00e9\u4e2d" * (size // 5)}, ensure_ascii=False),
        "whitespace": "[" + " " * (size - 3) + "1]",
        "many keys": many_keys,
        "many keys, last repeated": many_keys[:-1] + ', "k0": 1}',
        "many small objects, last repeated": _fill(size, '{"a": 1}')[:-1] + ', {"a": 1, "a": 2}]',
        "commas and brackets in strings": _fill(size, '{"a": "x,[y]{", "b": [1]}'),
    }


def floor(text: str, repeat: int = 3) -> float:
    """Best CPU seconds of the C decoder alone (json.loads, garbage collection off as in the reader): the
    floor the bounds add to; -1 where it refuses the text."""
    best = float("inf")
    for _ in range(repeat):
        collecting = gc.isenabled()
        gc.disable()
        start = time.process_time()
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            return -1.0
        finally:
            if collecting:
                gc.enable()
        best = min(best, time.process_time() - start)
    return best


def timed(text: str, repeat: int = 3) -> tuple[float, float, str]:
    """Best of ``repeat`` runs of (wall seconds, CPU seconds): the machine is shared, the minimum is the reader's
    own time, and the CPU time of this process leaves out the time its neighbours took the core."""
    best = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            loads(text, "bench")
            outcome = "parsed"
        except InputError as exc:
            outcome = "refused: " + str(exc).split(": ", 1)[1][:60]
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return best, cpu, outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=float, default=10.0)
    p.add_argument("--only", default="", help="time only the shapes whose name contains this text")
    args = p.parse_args()
    big, small = int(args.mb * 2**20), int(args.mb * 2**20 / 10)
    small_shapes = shapes(small)
    print(f"{'shape':30s} {'MB':>6s} {'seconds':>8s} {'cpu s':>6s} {'json.loads':>10s} {'x vs 1/10 size':>14s}  outcome")
    worst = 0.0
    for name, text in shapes(big).items():
        if args.only not in name:
            continue
        t_big, cpu_big, outcome = timed(text)
        _, cpu_small, _ = timed(small_shapes[name])
        ratio = cpu_big / cpu_small if cpu_small > 0 else float("nan")
        base = floor(text)
        worst = max(worst, cpu_big)
        print(f"{name:30s} {len(text.encode()) / 2**20:6.1f} {t_big:8.3f} {cpu_big:6.3f} "
              f"{base if base >= 0 else float('nan'):10.3f} {ratio:14.1f}  {outcome}")
    print(f"slowest shape: {worst:.3f} CPU seconds")


if __name__ == "__main__":
    main()
