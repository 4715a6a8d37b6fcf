#!/usr/bin/env python3
"""Fail when a commit since BASE changes the golden snapshot and code under tpsim/ together.

A regeneration of tests/data/estimator_golden.json must be its own commit (the figures it moves are then the
effect of the code before it, not of code in the same commit): ``python .ci/golden_commits.py BASE``. Merge
commits are left out (their own diff is the merge). Needs the history from BASE on (a full clone); with BASE
missing it says so and exits 2.
"""

from __future__ import annotations

import subprocess
import sys

GOLDEN = "tests/data/estimator_golden.json"
CODE = "tpsim/"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: golden_commits.py BASE", file=sys.stderr)
        return 2
    base = argv[0]
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"],
                      capture_output=True).returncode:
        print(f"golden_commits: base {base} is not in this clone's history (fetch the full history)",
              file=sys.stderr)
        return 2
    bad = []
    for commit in git("rev-list", "--no-merges", f"{base}..HEAD").split():
        files = git("diff-tree", "--no-commit-id", "--name-only", "-r", commit).split("\n")
        if GOLDEN in files and any(f.startswith(CODE) for f in files):
            bad.append(commit)
    for commit in bad:
        print(f"golden_commits: {git('log', '-1', '--format=%h %s', commit).strip()}: changes {GOLDEN} and "
              f"code under {CODE} (regenerate the snapshot in a commit of its own)", file=sys.stderr)
    if not bad:
        print(f"golden_commits: no commit since {base} changes the snapshot with code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
