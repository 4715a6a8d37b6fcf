"""The .ci/run checks beside the test suite: a golden-snapshot commit carries no code under tpsim/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "golden_commits.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


def _check(repo: Path, base: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), base], cwd=repo, capture_output=True, text=True, timeout=60)


def test_golden_commit_with_code_is_refused(tmp_path):
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, {"tpsim/a.py": "x = 1\n", "tests/data/estimator_golden.json": "{}\n"}, "base")
    base = _git(tmp_path, "rev-parse", "HEAD").strip()
    _commit(tmp_path, {"tpsim/a.py": "x = 2\n"}, "code")
    _commit(tmp_path, {"tests/data/estimator_golden.json": "{\"a\": 1}\n"}, "golden alone")
    ok = _check(tmp_path, base)
    assert ok.returncode == 0 and "no commit" in ok.stdout
    _commit(tmp_path, {"tpsim/a.py": "x = 3\n", "tests/data/estimator_golden.json": "{\"a\": 2}\n"}, "both")
    bad = _check(tmp_path, base)
    assert bad.returncode == 1 and "both: changes tests/data/estimator_golden.json and code" in bad.stderr
    missing = _check(tmp_path, "0" * 40)
    assert missing.returncode == 2 and "not in this clone's history" in missing.stderr
