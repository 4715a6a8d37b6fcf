"""Parsing is linear in the input's size (issue 26): time the bounded JSON reader on 10 MB documents of
hostile shapes and on growing sizes of each, and print the figures.

    python benchmarks/bench_parse.py [--mb 10]

Shapes: deep nesting (at the depth limit, repeated), quote-heavy strings (escaped quotes, an unterminated
string), long digit runs, many small values, one huge string, many keys. Each is timed through
:func:`tpsim.boundedjson.loads` (what every JSON input goes through; refused documents count: the time to say
no is what a hostile input costs), and the ratio of the 10 MB time to the 1 MB time shows the growth (10 for
linear).
"""

from __future__ import annotations

import argparse
import json
import time

from tpsim.boundedjson import loads
from tpsim.errors import InputError
from tpsim.limits import MAX_JSON_DEPTH


def shapes(size: int) -> dict[str, str]:
    unit = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    return {
        "nested at the depth limit": "[" + ",".join([unit] * (size // (len(unit) + 1))) + "]",
        "too deep": "[" * (size // 2) + "]" * (size // 2),
        "escaped quotes": json.dumps({"k": '\\"' * (size // 4)}),
        "unterminated string": '{"k": "' + '\\"' * (size // 2),
        "bare quotes outside strings": '\\"' * (size // 2),
        "long digit runs": "[" + "9" * (size - 2) + "]",
        "many small values": "[" + ",".join(["1"] * (size // 2)) + "]",
        "one huge string": json.dumps({"k": "a" * size}),
        "many keys": json.dumps({f"k{i}": i for i in range(size // 16)}),
    }


def timed(text: str, repeat: int = 3) -> tuple[float, str]:
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
    args = p.parse_args()
    big, small = int(args.mb * 2**20), int(args.mb * 2**20 / 10)
    small_shapes = shapes(small)
    print(f"{'shape':30s} {'MB':>6s} {'seconds':>8s} {'cpu s':>6s} {'x vs 1/10 size':>14s}  outcome")
    for name, text in shapes(big).items():
        t_big, cpu_big, outcome = timed(text)
        _, cpu_small, _ = timed(small_shapes[name])
        ratio = cpu_big / cpu_small if cpu_small > 0 else float("nan")
        print(f"{name:30s} {len(text) / 2**20:6.1f} {t_big:8.3f} {cpu_big:6.3f} {ratio:14.1f}  {outcome}")


if __name__ == "__main__":
    main()
