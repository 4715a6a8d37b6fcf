"""A progress bar: tqdm where installed, else a line on stderr every 10% (GPU machines may lack tqdm)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


class _Lines:
    """Minimal stand-in for tqdm: ``update(n)``, a line per tenth of the total."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.count = 0
        self.next_report = 0.1

    def update(self, n: int = 1) -> None:
        self.count += n
        if self.enabled and self.total and self.count / self.total >= self.next_report - 1e-9:
            print(f"{self.desc}: {self.count}/{self.total} points", file=sys.stderr, flush=True)
            self.next_report = min(1.0, (int(self.count * 10 / self.total) + 1) / 10)


@contextmanager
def make_progress(total: int, desc: str, enabled: bool = True) -> Iterator[object]:
    try:
        from tqdm import tqdm
    except ImportError:
        yield _Lines(total, desc, enabled)
        return
    bar = tqdm(total=total, desc=desc, unit="pt", disable=not enabled, file=sys.stderr, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
