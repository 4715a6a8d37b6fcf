"""Probe every `tpsim` verb with bad inputs, as a careful and a hostile user would (issue 13).

    python benchmarks/probe_inputs.py                  # this checkout, 2 runs at a time
    python benchmarks/probe_inputs.py --root /tmp/main # another checkout of tpsim (e.g. `git archive main`)
    python benchmarks/probe_inputs.py --only yaml -v   # one category, with every outcome printed
    python benchmarks/probe_inputs.py --json out.json  # every outcome as JSON

Each case runs ``python -m tpsim.cli ARGS`` in a fresh folder (its working directory, with the case's files)
as a child process with a memory limit (``RLIMIT_AS``), a CPU-time limit and a wall-clock timeout, its own
session, and a marker in its environment so that any process it leaves behind is found afterwards (and
killed). Cases that interrupt a run send a signal after a delay. Each outcome is classified:

``clear``           what the user was promised: one line naming the problem and exit status 2 (or, for valid
                    edge cases, the right answer with status 0)
``traceback``       a Python traceback
``hang``            still running at the timeout
``memory``          peak RSS over the limit, or a MemoryError
``wrong-exit``      an exit status other than the promised one
``silently-wrong``  status 0 with a bad input accepted, or a wrong answer
``unclear``         status 2 but not one line, or the line does not name the field / value
``data-lost``       a file that existed or was being written is truncated, overwritten or missing
``process-left``    a child process still running after the verb ended

The figures in the report of issue 13 come from running this script on main and on the branch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("clear", "traceback", "hang", "memory", "wrong-exit", "silently-wrong", "unclear", "data-lost",
            "process-left", "code-run")
TORCH_VERBS = ("bench-collectives", "profile", "validate")
MEM_LIMIT = 600 << 20
"""peak RSS that counts as a memory blow-up for verbs that do not import torch (a run is ~90 MB)."""
TORCH_MEM_LIMIT = 1536 << 20
"""the same for the torch verbs (torch alone is ~220 MB; ranks are separate processes)."""
AS_LIMIT = 6 << 30
"""address-space limit of every child (torch maps ~1.6 GB at import): a runaway run fails, not the machine."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """What one case did."""

    status: int | None
    """exit status; negative: killed by that signal; None: timed out."""
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int
    """bytes (ru_maxrss of the child and its reaped descendants)."""
    left: tuple[str, ...]
    """command lines of processes still alive with the case's marker."""
    folder: Path
    signalled: bool = False
    """the case's signal was sent (the verb was still running at that time)."""


Check = Callable[[Run], "str | None"]
"""Extra check of a run: None if fine, else ``"<outcome>: <detail>"``."""


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    category: str
    argv: tuple[str, ...]
    """arguments after ``tpsim``; ``{d}`` is the case folder."""
    files: Mapping[str, object] = field(default_factory=dict)
    """relative path -> str/bytes content, or one of DIR, FIFO, UNREADABLE_DIR, READONLY_DIR."""
    expect: str = "refuse"
    """``refuse``: one line + status 2; ``ok``: status 0; ``any``: 0 or a clear refusal; ``help``: usage."""
    mention: tuple[str, ...] = ()
    """substrings (any of them, case-insensitive) the error line must contain."""
    check: Check | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    kill: tuple[int, float] | None = None
    """send this signal to the verb's process after this many seconds."""
    stdin: bytes | None = None
    requires: tuple[str, ...] = ()
    """flags the verb must offer (``tpsim VERB --help``): cases of features a checkout lacks are skipped."""

    @property
    def verb(self) -> str:
        return self.argv[0] if self.argv else ""


DIR, FIFO, UNREADABLE, READONLY_DIR = "<dir>", "<fifo>", "<unreadable>", "<readonly-dir>"
ROOT = os.geteuid() == 0
"""root reads and writes regardless of permission bits: an unreadable file is no test then (skipped), and a
read-only folder is replaced by one the kernel refuses even to root."""
ROOT_UNWRITABLE = "/sys/kernel"


# ----------------------------------------------------------------------------------------------- fixtures
def _read(rel: str) -> str:
    return (REPO / rel).read_text()


HF_LLAMA = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000,
            "max_position_embeddings": 2048}
CLUSTER = ("name: probe\nnode: dgx-a100\nfabric: selene-hdr-fat-tree\ndevice: A100-SXM4-80GB\ngpus: 16\n"
           "source: probe\n")
NODE = ("name: probe-node\nsource: probe\ndevices:\n  gpu: {kind: gpu, count: 8}\n  sw: {kind: nvswitch, count: 1}\n"
        "links:\n  - {a: gpu, b: sw, pattern: all, link: nvlink3, lanes: 12}\n")
CALIBRATION = "loopback: {efficiency: 0.5, latency_us: 50}\n"
BENCH_CSV = "backend,op,nranks,bytes,time_s\n" + "".join(
    f"gloo,all_reduce,2,{b},{t}\n" for b, t in ((4096, 3e-4), (65536, 6e-4), (1 << 20, 4e-3), (4 << 20, 1.5e-2)))
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
"""nine levels of ten aliases: 10^9 scalars once expanded."""


def _json(obj: object) -> str:
    return json.dumps(obj)


def _hf(**changes: object) -> str:
    cfg = dict(HF_LLAMA)
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return json.dumps(cfg)


_DROP = object()


def _profile_text() -> str:
    return _read("profiles/cpu-reference-1t.csv")


def _profile_with(edit: Callable[[list[str]], list[str]]) -> str:
    return "".join(edit(_profile_text().splitlines(keepends=True)))


def _first_row(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if not line.startswith("#")) + 1


def _replace_cell(column: str, value: str) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        i = _first_row(lines)
        header = lines[i - 1].rstrip("\n").split(",")
        cells = lines[i].rstrip("\n").split(",")
        cells[header.index(column)] = value
        lines[i] = ",".join(cells) + "\n"
        return lines
    return edit


# ----------------------------------------------------------------------------------------------- checks
def _stdout_has(text: str, outcome: str = "silently-wrong") -> Check:
    def check(run: Run) -> str | None:
        return None if text in run.stdout else f"{outcome}: output lacks {text!r}"
    return check


def _file_is(rel: str, content: str | bytes) -> Check:
    """The file must still hold exactly ``content`` (a report or README not overwritten)."""
    def check(run: Run) -> str | None:
        path = run.folder / rel
        data = path.read_bytes() if path.is_file() else None
        want = content.encode() if isinstance(content, str) else content
        return None if data == want else f"data-lost: {rel} was {'removed' if data is None else 'changed'}"
    return check


def _pngs_complete(rel_dir: str, temp_files: bool = False) -> Check:
    """Every PNG under the folder ends with its IEND chunk (no chart half-written by an interrupt), and (with
    ``temp_files``: after Ctrl-C, when cleanup can run) no temporary file is left behind."""
    def check(run: Run) -> str | None:
        folder = run.folder / rel_dir
        left = [p.name for p in folder.iterdir() if p.name.startswith(".")] if folder.is_dir() else []
        if temp_files and left:
            return f"data-lost: temporary file {left[0]} left behind"
        for png in folder.rglob("*.png") if folder.is_dir() else []:
            if not png.read_bytes().endswith(b"IEND\xaeB`\x82"):
                return f"data-lost: {png.name} is truncated"
        for svg in folder.rglob("*.svg") if folder.is_dir() else []:
            if not svg.read_bytes().rstrip().endswith(b"</svg>"):
                return f"data-lost: {svg.name} is truncated"
        readme = folder / "README.md"
        if readme.is_file() and not readme.read_text(errors="replace").rstrip().endswith("."):
            return "data-lost: README.md is truncated"
        return None
    return check


def _profile_rows_complete(rel: str) -> Check:
    """A profile killed while measuring keeps only whole rows (the next run resumes it)."""
    def check(run: Run) -> str | None:
        path = run.folder / rel
        if not path.is_file():
            return None
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            return f"data-lost: {rel} ends in a half-written row"
        return None
    return check


def _all(*checks: Check) -> Check:
    def check(run: Run) -> str | None:
        for c in checks:
            bad = c(run)
            if bad:
                return bad
        return None
    return check


def _no_measurement_lost(run: Run) -> str | None:
    """bench-collectives with a bad --out: refused before measuring (quickly), or the CSV saved somewhere
    the message names."""
    if run.status == 2 and run.seconds < 20:
        return None
    text = run.stdout + run.stderr
    if "backend,op,nranks" in run.stdout or ".csv" in text and "wrote" in text:
        return None
    return "data-lost: measurements neither refused before the run nor saved"


def _calibration_whole(run: Run) -> str | None:
    """An interrupted `calibrate --out` leaves no file or the whole new one (and no temporary file)."""
    path = run.folder / "cal.yaml"
    if any(p.name.startswith(".cal.yaml") for p in run.folder.iterdir()):
        return "data-lost: a temporary file is left behind"
    if not path.is_file() or path.read_text().rstrip().endswith("(tpsim.collectives.calibration)"):
        return None
    return "data-lost: cal.yaml is half-written"


def _cache_matches_uncached(run: Run) -> str | None:
    """The plan printed from a (tampered) cache equals what a fresh search prints."""
    ref = run.folder / "reference.txt"
    if not ref.is_file():
        return None
    want = [ln for ln in ref.read_text().splitlines() if not ln.startswith(("llama3-8b on", "gpt3"))]
    got = [ln for ln in run.stdout.splitlines() if not ln.startswith(("llama3-8b on", "gpt3"))]
    return None if want == got else "silently-wrong: a tampered cache entry changed the printed plans"


# ----------------------------------------------------------------------------------------------- cases
SMALL = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8")
"""a quick problem for plan and report."""
BAD_INTS = {"zero": "0", "negative": "-3", "fraction": "2.5", "word": "abc", "empty": "", "nan": "nan",
            "inf": "inf", "1e30": "1e30", "400-digit": "9" * 400}
SOME_BAD_INTS = {k: BAD_INTS[k] for k in ("zero", "nan", "1e30", "400-digit")}


def cli_number_cases() -> list[Case]:
    """Every numeric flag of every verb with values a careless or hostile user types."""
    cases = []
    full = {"estimate": ("--gpus", "--global-batch", "--micro-batch"),
            "plan": ("--top",),
            "collective": ("--gpus",)}
    some = {"estimate": ("--tp", "--pp", "--vpp", "--layers", "--hidden", "--seq-len"),
            "plan": ("--gpus", "--global-batch", "--tp", "--max-tp", "--micro-batch"),
            "report": ("--top", "--gpus"),
            "topo": ("--gpus",),
            "calibrate": ("--gpus",),
            "bench-collectives": ("--nproc", "--iters", "--warmup"),
            "profile": ("--threads",),
            "validate": ("--nproc", "--threads", "--tp", "--reps", "--micro-batch", "--warmup")}
    base = {"estimate": SMALL[:4], "plan": SMALL[:4], "report": SMALL[:4] + ("--out", "{d}/r"),
            "topo": ("show", "dgx-a100"), "collective": ("--cluster", "dgx-a100"),
            "calibrate": ("{d}/m.csv",), "bench-collectives": (), "profile": ("--grid", "tiny"),
            "validate": ("--model", "llama3-8b", "--layers", "1", "--hidden", "256", "--heads", "4",
                         "--kv-heads", "4", "--seq-len", "64", "--out-dir", "{d}/v")}
    files = {"calibrate": {"m.csv": BENCH_CSV}}
    for table, values in ((full, BAD_INTS), (some, SOME_BAD_INTS)):
        for verb, flags in table.items():
            for flag in flags:
                for label, value in values.items():
                    if label == "zero" and flag == "--warmup":
                        continue  # no warm-up is valid
                    cases.append(Case(name=f"{verb} {flag} {label}", category="cli-numbers",
                                      argv=(verb, *base[verb], flag, value), files=files.get(verb, {}),
                                      mention=(flag.lstrip("-"), flag.lstrip("-").replace("-", "_"))))
    for label, value in (("1e30", "1e30"), ("nan", "nan"), ("inf", "inf"), ("negative", "-1"), ("zero", "0")):
        cases.append(Case(name=f"plan --mem-limit-gib {label}", category="cli-numbers",
                          argv=("plan", *SMALL, "--mem-limit-gib", value), mention=("mem",)))
        cases.append(Case(name=f"plan --gpu-hour-price {label}", category="cli-numbers",
                          argv=("plan", *SMALL, "--objective", "cost", "--gpu-hour-price", value),
                          mention=("price",)))
    for flag in ("--timeout", "--run-timeout", "--budget"):
        for label, value in (("nan", "nan"), ("inf", "inf"), ("zero", "0")):
            cases.append(Case(name=f"validate {flag} {label}", category="cli-numbers",
                              argv=("validate", *base["validate"], flag, value), mention=(flag.lstrip("-"),)))
    for label, value in (("nan", "nan"), ("inf", "inf"), ("negative", "-5"), ("zero", "0")):
        cases.append(Case(name=f"bench-collectives --timeout {label}", category="cli-numbers",
                          argv=("bench-collectives", "--timeout", value), mention=("timeout",)))
        cases.append(Case(name=f"profile --max-kernel-s {label}", category="cli-numbers",
                          argv=("profile", "--grid", "tiny", "--max-kernel-s", value, "--out", "{d}/p.csv"),
                          mention=("max-kernel", "max_kernel")))
    for label, value in (("nan", "nan"), ("negative", "-1")):
        cases.append(Case(name=f"profile --redo-noisy {label}", category="cli-numbers",
                          argv=("profile", "--grid", "tiny", "--redo-noisy", value, "--out", "{d}/p.csv"),
                          mention=("redo-noisy", "redo_noisy")))
    return cases


def size_cases() -> list[Case]:
    """--bytes and --sizes: exact parsing, suffixes, range."""
    coll = ("collective", "--cluster", "dgx-a100", "--gpus", "8", "--json")
    cases = [
        Case(name="collective --bytes 2^53+1 exact", category="sizes", argv=(*coll, "--bytes", "9007199254740993"),
             expect="ok", check=_stdout_has('"bytes": 9007199254740993')),
        Case(name="collective --bytes 1.5GiB", category="sizes", argv=(*coll, "--bytes", "1.5GiB"), expect="ok",
             check=_stdout_has('"bytes": 1610612736')),
        Case(name="collective --bytes 64KiB", category="sizes", argv=(*coll, "--bytes", "64KiB"), expect="ok",
             check=_stdout_has('"bytes": 65536')),
    ]
    for label, value in (("1e30", "1e30"), ("nan", "nan"), ("inf", "inf"), ("zero", "0"), ("negative", "-4K"),
                         ("fractional byte", "4097.5"), ("unknown suffix", "12XB"), ("empty", ""),
                         ("400-digit", "9" * 400), ("above 2^60", str((1 << 60) + 1)), ("1e-3", "1e-3"),
                         ("0.4 bytes", "0.4"), ("spaces only", "   ")):
        cases.append(Case(name=f"collective --bytes {label}", category="sizes", argv=(*coll, "--bytes", value),
                          mention=("bytes",)))
    for label, value in (("1e30", "1e30"), ("zero", "0"), ("word", "big"), ("400-digit", "9" * 400)):
        cases.append(Case(name=f"bench-collectives --sizes {label}", category="sizes",
                          argv=("bench-collectives", "--sizes", value), mention=("sizes",)))
    return cases


def cli_arg_cases() -> list[Case]:
    """Choices, strings and combinations."""
    c = []
    add = lambda name, argv, mention=(), **kw: c.append(Case(name=name, category="cli-args", argv=argv,  # noqa
                                                              mention=mention, **kw))
    add("no verb", (), expect="help")
    add("unknown verb", ("estimat",), ("estimat", "invalid choice"))
    add("unknown flag", ("estimate", "--tpp", "8"), ("--tpp",))
    add("flag without value", ("estimate", "--tp"), ("--tp",))
    add("estimate --order bogus", ("estimate", *SMALL, "--order", "tp-xx-pp"), ("order",))
    add("estimate --order repeated axis", ("estimate", *SMALL, "--order", "tp-tp-pp"), ("order",))
    add("estimate --order empty", ("estimate", *SMALL, "--order", ""), ("order",))
    add("estimate --model empty", ("estimate", "--model", ""), ("model",))
    add("estimate --cluster empty", ("estimate", "--model", "llama3-8b", "--cluster", ""), ("cluster",))
    add("estimate --model unknown", ("estimate", "--model", "gpt5"), ("gpt5",))
    add("estimate --cluster unknown", ("estimate", "--cluster", "dgx-z900"), ("dgx-z900",))
    add("estimate --cluster 100 kB name", ("estimate", "--cluster", "x" * 100_000), ("cluster",))
    add("estimate --model unicode", ("estimate", "--model", "модель\u202e"), ("model",))
    add("estimate tp exceeds gpus", ("estimate", *SMALL, "--tp", "16"), ("tp",))
    add("estimate tp not dividing heads", ("estimate", *SMALL, "--tp", "3"), ("tp",))
    add("estimate micro-batch above global", ("estimate", *SMALL, "--micro-batch", "64", "--global-batch", "8"),
        ("micro", "batch"))
    add("estimate sp without tp", ("estimate", *SMALL, "--tp", "1", "--sp"), expect="any")
    add("estimate gpus not whole nodes", ("estimate", "--model", "llama3-8b", "--cluster", "dgx-a100", "--gpus", "12"),
        ("gpus",))
    add("collective --ranks out of range", ("collective", "--gpus", "8", "--ranks", "0-8"), ("ranks",))
    add("collective --ranks backwards", ("collective", "--gpus", "8", "--ranks", "5-2"), ("ranks",))
    add("collective --ranks garbage", ("collective", "--gpus", "8", "--ranks", "a,b"), ("ranks",))
    add("collective --ranks duplicate", ("collective", "--gpus", "8", "--ranks", "1,1"), ("ranks",))
    add("collective --ranks single rank", ("collective", "--gpus", "8", "--ranks", "3"), ("ranks", "rank"))
    add("collective --ranks empty", ("collective", "--gpus", "8", "--ranks", ""), ("ranks",))
    add("collective --ranks negative", ("collective", "--gpus", "8", "--ranks", "-1-3"), ("ranks",))
    add("collective --ranks 400-digit", ("collective", "--gpus", "8", "--ranks", "9" * 400), ("ranks",))
    add("collective --plan garbage", ("collective", "--group", "tp", "--plan", "tp=x"), ("plan",))
    add("collective --plan 400-digit", ("collective", "--group", "tp", "--plan", "tp=" + "9" * 400), ("plan", "tp"))
    add("collective --plan not dividing", ("collective", "--gpus", "8", "--group", "tp", "--plan", "tp=3"), ("plan",))
    add("collective --group without --plan", ("collective", "--group", "tp"), ("plan",))
    add("collective --algo unknown", ("collective", "--gpus", "8", "--algo", "warp"), ("algo", "warp"))
    add("collective --algo empty", ("collective", "--gpus", "8", "--algo", ","), ("algo",))
    add("topo without cluster", ("topo", "show"), ("cluster",))
    add("topo check unknown", ("topo", "check", "nope"), ("nope",))
    add("profile --kinds unknown", ("profile", "--grid", "tiny", "--kinds", "conv"), ("kinds",))
    add("profile --kinds empty", ("profile", "--grid", "tiny", "--kinds", ","), ("kinds",))
    add("profile --dtype unknown", ("profile", "--grid", "tiny", "--dtype", "int4", "--out", "{d}/p.csv"),
        ("dtype",))
    add("profile --device cuda without GPU", ("profile", "--device", "cuda", "--grid", "tiny", "--out", "{d}/p.csv"),
        ("cuda",), timeout=60)
    add("profile --quick with --grid full", ("profile", "--quick", "--grid", "full"), ("quick", "grid"))
    add("profile --json without --check", ("profile", "--json"), ("check",))
    add("bench-collectives --ops unknown", ("bench-collectives", "--ops", "all_reduce", "gather_all"), ("ops", "gather_all"))
    add("bench-collectives --nproc 1", ("bench-collectives", "--nproc", "1"), ("nproc",))
    add("bench-collectives --nproc 1000", ("bench-collectives", "--nproc", "1000"), ("nproc",), timeout=60)
    add("bench-collectives nccl without GPU", ("bench-collectives", "--backend", "nccl"), ("nccl",), timeout=60)
    add("validate nccl without GPU", ("validate", "--backend", "nccl", "--out-dir", "{d}/v"), ("nccl",), timeout=60)
    add("validate --nproc x nnodes != tp", ("validate", "--tp", "2", "--nproc", "3", "--out-dir", "{d}/v"),
        ("nproc",))
    add("validate --shard-of with tp 2", ("validate", "--shard-of", "2", "--tp", "2", "--out-dir", "{d}/v"),
        ("shard",))
    add("validate --rdzv-endpoint garbage", ("validate", "--nnodes", "2", "--tp", "2", "--nproc", "1",
                                             "--rdzv-endpoint", "::::", "--out-dir", "{d}/v", "--run-timeout", "20",
                                             "--timeout", "5"), ("rdzv", "endpoint", "nnodes"), timeout=60)
    add("validate --name with slash", ("validate", "--name", "../../etc/x", "--model", "llama3-8b", "--layers", "1",
                                       "--hidden", "256", "--heads", "4", "--kv-heads", "4", "--seq-len", "64", "--tp", "1",
                                       "--out-dir", "{d}/v", "--no-calibrate", "--no-overhead"),
        ("name",), timeout=120)
    add("calibrate --stat unknown", ("calibrate", "{d}/m.csv", "--stat", "p99"), ("stat",),
        files={"m.csv": BENCH_CSV})
    add("calibrate --cluster unknown", ("calibrate", "{d}/m.csv", "--cluster", "nope"), ("nope",),
        files={"m.csv": BENCH_CSV})
    add("report without --out", ("report", *SMALL), ("--out",))
    add("plan --no-pp with --pp", ("plan", *SMALL, "--no-pp", "--pp", "2"), ("pp",))
    add("plan --objective unknown", ("plan", *SMALL, "--objective", "speed"), ("objective",))
    return c


def empty_result_cases() -> list[Case]:
    """Constraints that leave no plan: status 2 and the constraint that removed them."""
    c = []
    add = lambda name, argv, mention: c.append(Case(name=name, category="empty-results", argv=argv,  # noqa
                                                    mention=mention))
    add("plan --tp 7 on 8 GPUs", ("plan", *SMALL, "--tp", "7"), ("7",))
    add("plan --tp 16 on 8 GPUs", ("plan", *SMALL, "--tp", "16"), ("16",))
    add("plan --pp 3 on 8 GPUs", ("plan", *SMALL, "--pp", "3"), ("3",))
    add("plan --tp 3 (heads 32)", ("plan", *SMALL, "--tp", "3"), ("3",))
    add("plan --pp 64 (layers 32)", ("plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--pp", "64"),
        ("64", "layers"))
    add("plan --micro-batch above batch", ("plan", *SMALL, "--micro-batch", "1024", "--global-batch", "8"),
        ("micro",))
    add("plan --mem-limit-gib tiny", ("plan", *SMALL, "--mem-limit-gib", "0.01"), ("mem",))
    add("plan --vpp 5 without pp", ("plan", *SMALL, "--vpp", "5", "--no-pp"), ("vpp",))
    add("plan --global-batch 3 --tp 1 --pp 1 --cp 1", ("plan", *SMALL, "--global-batch", "3", "--tp", "1", "--pp", "1",
                                                     "--cp", "1"), ("batch", "dp"))  # cp 8 x dp 1 would be valid
    add("plan cost --tp 7", ("plan", *SMALL, "--objective", "cost", "--tp", "7"), ("7",))
    add("plan memory 405b on 8 GPUs", ("plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8",
                                       "--recompute", "none", "--zero", "0"), ("memory", "fit", "GiB"))
    c.append(Case(name="report --tp 7", category="empty-results", argv=("report", *SMALL, "--tp", "7", "--out",
                                                                         "{d}/r"), mention=("7",), timeout=150))
    add("plan --max-tp 3 --tp 4", ("plan", *SMALL, "--max-tp", "3", "--tp", "4"), ("tp",))
    return c


def file_cases() -> list[Case]:
    """Every file argument given something that is not the right file."""
    c = []
    kinds = {
        "missing": ({}, "missing.x"),
        "directory": ({"d1": DIR}, "d1"),
        "empty": ({"e.x": ""}, "e.x"),
        "binary": ({"b.x": bytes(range(256)) * 64}, "b.x"),
        "fifo": ({"pipe.x": FIFO}, "pipe.x"),
        "dev-zero": ({}, "/dev/zero"),
        "unreadable": ({"u.x": UNREADABLE}, "u.x"),
        "not-utf8": ({"l.x": "gpus: 8\nname: caf\xe9\n".encode("latin-1")}, "l.x"),
    }
    uses = {
        "estimate --model": lambda f: ("estimate", "--model", f),
        "estimate --cluster": lambda f: ("estimate", "--model", "llama3-8b", "--cluster", f),
        "estimate --profile": lambda f: ("estimate", *SMALL, "--profile", f),
        "topo show": lambda f: ("topo", "show", f),
        "collective --calibration": lambda f: ("collective", "--gpus", "8", "--calibration", f),
        "calibrate": lambda f: ("calibrate", f),
        "profile --check": lambda f: ("profile", "--check", f),
    }
    for use, make in uses.items():
        for kind, (files, name) in kinds.items():
            if kind == "not-utf8" and use in ("estimate --profile", "profile --check", "calibrate"):
                continue
            path = name if name.startswith("/") else "{d}/" + name
            f = {k.replace(".x", ".yaml" if "cluster" in use or "topo" in use or "calibration" in use
                           else ".json" if "model" in use else ".csv"): v for k, v in files.items()}
            p = path.replace(".x", ".yaml" if "cluster" in use or "topo" in use or "calibration" in use
                             else ".json" if "model" in use else ".csv")
            last = p.rsplit("/", 1)[-1]
            c.append(Case(name=f"{use} {kind}", category="files", argv=make(p), files=f,
                          mention=(last, "file"), timeout=20))
    # wrong kinds of file
    wrong = [
        ("cluster given a node template", ("estimate", "--model", "llama3-8b", "--cluster", "{d}/n.yaml"),
         {"n.yaml": NODE}, ("node",)),
        ("cluster given a calibration", ("topo", "show", "{d}/c.yaml"), {"c.yaml": CALIBRATION},
         ("calibration",)),
        ("cluster given a fabric", ("topo", "show", str(REPO / "topologies/fabrics/hdr-fat-tree.yaml")), {},
         ("fabric",)),
        ("cluster given links.yaml", ("topo", "show", str(REPO / "topologies/links.yaml")), {}, ("link",)),
        ("calibration given a cluster", ("collective", "--gpus", "8", "--calibration",
                                         str(REPO / "topologies/clusters/dgx-a100.yaml")), {}, ("cluster",)),
        ("estimate --calibration-like cluster via collective", ("collective", "--cluster", "{d}/c.yaml"),
         {"c.yaml": CALIBRATION}, ("calibration",)),
        ("model given a cluster yaml", ("estimate", "--model", str(REPO / "topologies/clusters/dgx-a100.yaml")),
         {}, ("json", "model")),
        ("model given a profile", ("estimate", "--model", "{d}/p.json"), {"p.json": "kind,op\n"}, ("json",)),
        ("profile given a cluster", ("estimate", *SMALL, "--profile", str(REPO / "topologies/clusters/dgx-a100.yaml")),
         {}, ("profile",)),
        ("profile given a bench CSV", ("profile", "--check", "{d}/m.csv"), {"m.csv": BENCH_CSV}, ("profile",)),
        ("calibrate given a profile", ("calibrate", str(REPO / "profiles/cpu-reference-1t.csv")), {},
         ("measure", "column", "collective")),
        ("calibrate given a cluster yaml", ("calibrate", str(REPO / "topologies/clusters/dgx-a100.yaml")), {},
         ("measure", "collective", "nccl")),
    ]
    for name, argv, files, mention in wrong:
        c.append(Case(name=name, category="files", argv=argv, files=files, mention=mention))
    c.append(Case(name="TPSIM_TOPOLOGIES missing", category="files", argv=("topo", "show", "dgx-a100"),
                  env={"TPSIM_TOPOLOGIES": "/nonexistent/topologies"}, mention=("topolog", "dgx-a100")))
    c.append(Case(name="TPSIM_TOPOLOGIES is a file", category="files", argv=("estimate",),
                  env={"TPSIM_TOPOLOGIES": "/etc/hostname"}, mention=("topolog", "link", "cluster")))
    return c


def model_config_cases() -> list[Case]:
    """A handful of bad HF configs (the full model-config layer is another part of issue 13)."""
    c = []
    bad = {"layers string": _hf(num_hidden_layers="32"), "layers float": _hf(num_hidden_layers=32.5),
           "layers bool": _hf(num_hidden_layers=True), "layers 1e30": _hf(num_hidden_layers=1e30),
           "heads zero": _hf(num_attention_heads=0), "kv heads zero": _hf(num_key_value_heads=0),
           "kv not dividing": _hf(num_key_value_heads=3), "hidden list": _hf(hidden_size=[1024]),
           "vocab negative": _hf(vocab_size=-5), "missing hidden": _hf(hidden_size=_DROP),
           "NaN literal": _hf().replace("2816", "NaN"), "Infinity literal": _hf().replace("2816", "Infinity"),
           "400-digit": _hf().replace("32000", "9" * 400), "tie string": _hf(tie_word_embeddings="false"),
           "top-level list": "[1, 2, 3]", "deep nesting": "[" * 100_000 + "]" * 100_000,
           "not json": "hidden_size = 1024", "utf-16": _hf().encode("utf-16")}
    for name, text in bad.items():
        c.append(Case(name=f"config {name}", category="model-config", argv=("estimate", "--model", "{d}/config.json"),
                      files={"config.json": text}, mention=("config.json", "model ")))
    return c


def yaml_cases() -> list[Case]:
    """Cluster, node-template and calibration YAML from a hostile author."""
    c = []
    cluster = lambda text: {"c.yaml": text}  # noqa
    show = ("topo", "show", "{d}/c.yaml")
    items = {
        "billion laughs": BILLION_LAUGHS,
        "billion laughs in a cluster key": CLUSTER + "note: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"n{i}: &n{i} [{', '.join(['*' + ('a' if i == 0 else f'n{i - 1}')] * 10)}]\n" for i in range(8)),
        "deep nesting": "a: " + "[" * 50_000 + "]" * 50_000 + "\n",
        "deep mapping": "".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v\n",
        "unhashable key": "? [a, b]\n: 1\n" + CLUSTER,
        "unhashable mapping key": CLUSTER + "? {x: 1}\n: 2\n",
        "python tag": CLUSTER.replace("gpus: 16", "gpus: !!python/object/apply:os.system [echo]"),
        "gpus 400-digit": CLUSTER.replace("gpus: 16", "gpus: " + "8" * 400),
        "gpus 1e12": CLUSTER.replace("gpus: 16", "gpus: 1000000000000"),
        "gpus nan": CLUSTER.replace("gpus: 16", "gpus: .nan"),
        "gpus inf": CLUSTER.replace("gpus: 16", "gpus: .inf"),
        "gpus float": CLUSTER.replace("gpus: 16", "gpus: 16.5"),
        "gpus string": CLUSTER.replace("gpus: 16", "gpus: sixteen"),
        "gpus bool": CLUSTER.replace("gpus: 16", "gpus: true"),
        "gpus negative": CLUSTER.replace("gpus: 16", "gpus: -16"),
        "gpus list": CLUSTER.replace("gpus: 16", "gpus: [16]"),
        "duplicate key": CLUSTER + "gpus: 32\n",
        "top-level list": "- 1\n- 2\n",
        "top-level scalar": "hello\n",
        "empty document": "",
        "two documents": CLUSTER + "---\n" + CLUSTER,
        "tab indentation": "name: x\n\tgpus: 8\n",
        "merge of a list": "base: &b [1, 2]\nother:\n  <<: *b\n" + CLUSTER,
        "node is a number": CLUSTER.replace("node: dgx-a100", "node: 42"),
        "node is a mapping": CLUSTER.replace("node: dgx-a100", "node: {a: 1}"),
        "fabric is a list": CLUSTER.replace("fabric: selene-hdr-fat-tree", "fabric: [1]"),
        "device unknown": CLUSTER.replace("A100-SXM4-80GB", "Z100"),
        "device is a list": CLUSTER.replace("device: A100-SXM4-80GB", "device: [A100]"),
        "defaults efficiency nan": CLUSTER + "defaults: {efficiency: .nan}\n",
        "defaults is a list": CLUSTER + "defaults: [1]\n",
        "calibration bomb": CLUSTER + "calibration: cal.yaml\n",
        "huge file": CLUSTER + "note: '" + "x" * (64 << 20) + "'\n",
        "control characters": CLUSTER + "note: \"\\x00\\x07\"\n",
        "gpus_per_node 1e9": CLUSTER.replace("node: dgx-a100", "node: n.yaml") + "gpus_per_node: 1000000000\n",
    }
    extra = {"calibration bomb": {"cal.yaml": BILLION_LAUGHS}, "gpus_per_node 1e9": {"n.yaml": NODE.replace(
        "count: 8", "count: any")}}
    for name, text in items.items():
        files = dict(cluster(text), **extra.get(name, {}))
        c.append(Case(name=f"cluster yaml {name}", category="yaml", argv=show, files=files,
                      mention=("c.yaml", "cal.yaml"), timeout=30,
                      expect="any" if name == "control characters" else "refuse"))  # a note may hold them
    node_items = {
        "count 1e9": NODE.replace("count: 8", "count: 1000000000"),
        "nvswitch count 1e7": NODE.replace("count: 1}", "count: 10000000}"),
        "count string": NODE.replace("count: 8", "count: eight"),
        "lanes 1e12": NODE.replace("lanes: 12", "lanes: 1000000000000"),
        "lanes list wrong length": NODE.replace("lanes: 12", "lanes: [1, 2]"),
        "selector out of range": NODE.replace("a: gpu,", "a: 'gpu[3-99]',"),
        "selector 400-digit": NODE.replace("a: gpu,", "a: 'gpu[" + "9" * 400 + "]',"),
        "link unknown": NODE.replace("nvlink3", "warp-drive"),
        "links is a mapping": NODE.split("links:")[0] + "links: {a: 1}\n",
        "device name with brackets": NODE.replace("sw: {", "'s[w]': {"),
        "billion laughs": NODE + BILLION_LAUGHS.replace("a:", "za:", 1).replace("*a", "*za").replace("&a", "&za"),
    }
    for name, text in node_items.items():
        c.append(Case(name=f"node yaml {name}", category="yaml", argv=show,
                      files={"c.yaml": CLUSTER.replace("node: dgx-a100", "node: n.yaml"), "n.yaml": text},
                      mention=("n.yaml", "c.yaml")))
    fabric = ("name: f\ntype: fat_tree\nlevels: 2\nradix: 40\nnic_link: hdr-ib\nswitch_link: hdr-ib\n"
              "source: probe\n")
    for name, text in {"radix 1e9": fabric.replace("radix: 40", "radix: 1000000000"),
                       "radix 2": fabric.replace("radix: 40", "radix: 2"),
                       "levels 0": fabric.replace("levels: 2", "levels: 0"),
                       "oversubscription nan": fabric + "oversubscription: .nan\n",
                       "torus dims huge": "name: t\ntype: torus\ndims: [100000, 100000, 100000]\nlink: ici-v4\n"
                                          "source: probe\n",
                       "torus dims strings": "name: t\ntype: torus\ndims: [a, b, c]\nlink: ici-v4\nsource: p\n"}.items():
        cl = CLUSTER.replace("fabric: selene-hdr-fat-tree", "fabric: f.yaml")
        if "torus" in name:
            cl = cl.replace("node: dgx-a100", "node: tpu-v4-host").replace("A100-SXM4-80GB", "TPU-v4").replace(
                "gpus: 16", "gpus: 64")
        c.append(Case(name=f"fabric yaml {name}", category="yaml", argv=show,
                      files={"c.yaml": cl, "f.yaml": text}, mention=("f.yaml", "c.yaml")))
    cal_items = {"efficiency 7": "loopback: {efficiency: 7}\n", "efficiency nan": "loopback: {efficiency: .nan}\n",
                 "latency string": "loopback: {latency_us: fast}\n", "link is a list": "loopback: [1, 2]\n",
                 "billion laughs": BILLION_LAUGHS, "top-level list": "- 1\n",
                 "gloo_ops garbage": "gloo_ops: 7\n", "unhashable key": "? [1]\n: 2\n"}
    for name, text in cal_items.items():
        c.append(Case(name=f"calibration yaml {name}", category="yaml",
                      argv=("collective", "--cluster", "local-cpu", "--calibration", "{d}/cal.yaml"),
                      files={"cal.yaml": text}, mention=("cal.yaml",)))
    return c


def profile_csv_cases() -> list[Case]:
    """Kernel-profile CSVs cut, edited or made up."""
    c = []
    text = _profile_text()
    items = {
        "truncated mid-row": text[: len(text) // 2],
        "header only": "".join(ln for ln in text.splitlines(keepends=True) if ln.startswith("#")),
        "no header": "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("#")),
        "time nan": _profile_with(_replace_cell("time_s", "nan")),
        "time negative": _profile_with(_replace_cell("time_s", "-1e-5")),
        "time zero": _profile_with(_replace_cell("time_s", "0")),
        "time inf": _profile_with(_replace_cell("time_s", "inf")),
        "dim 400-digit": _profile_with(_replace_cell("m", "9" * 400)),
        "dim 1e30": _profile_with(_replace_cell("m", "1e30")),
        "dim zero": _profile_with(_replace_cell("m", "0")),
        "unknown kind": _profile_with(_replace_cell("kind", "conv")),
        "unknown dtype": _profile_with(_replace_cell("dtype", "int3")),
        "extra column": _profile_with(lambda ls: [ls[i] if i != _first_row(ls) else ls[i].rstrip("\n") + ",9\n"
                                                  for i in range(len(ls))]),
        "format_version 99": text.replace("# format_version: 1", "# format_version: 99"),
        "threads word": text.replace("# threads: 1", "# threads: many"),
        "binary tail": text + "\x00\x01\x02garbage\n",
        "duplicate rows": text + "".join(text.splitlines(keepends=True)[_first_row(text.splitlines()):][:3]),
    }
    for name, body in items.items():
        c.append(Case(name=f"profile csv {name}", category="profile-csv",
                      argv=("estimate", *SMALL, "--profile", "{d}/p.csv"), files={"p.csv": body},
                      mention=("p.csv",), expect="any" if name == "duplicate rows" else "refuse"))
        if name in ("truncated mid-row", "time nan", "dim 400-digit", "binary tail"):
            c.append(Case(name=f"profile --check {name}", category="profile-csv",
                          argv=("profile", "--check", "{d}/p.csv"), files={"p.csv": body}, mention=("p.csv",)))
    return c


def measurement_cases() -> list[Case]:
    """Collective measurement files given to `tpsim calibrate`."""
    c = []
    head = "backend,op,nranks,bytes,time_s\n"
    items = {
        "nranks 1e9": head + "gloo,all_reduce,1000000000,4096,0.001\ngloo,all_reduce,1000000000,8192,0.002\n",
        "nranks 400-digit": head + f"gloo,all_reduce,{'9' * 400},4096,0.001\n",
        "bytes 1e30": head + "gloo,all_reduce,2,1e30,0.001\n",
        "bytes nan": head + "gloo,all_reduce,2,nan,0.001\n",
        "time nan": head + "gloo,all_reduce,2,4096,nan\n",
        "time inf": head + "gloo,all_reduce,2,4096,inf\n",
        "time negative": head + "gloo,all_reduce,2,4096,-1\n",
        "op unknown": head + "gloo,gather,2,4096,0.001\n",
        "missing column": "backend,op,nranks,bytes\ngloo,all_reduce,2,4096\n",
        "short row": head + "gloo,all_reduce\n",
        "header only": head,
        "nccl-tests garbage": "#  Rank  0\n#  Rank  1\nall_reduce_perf\n" + "x 2 y 4 z 6 7 8 9 10 11 12 13\n",
        "nccl-tests 1 rank": "# all_reduce_perf\n#  Rank  0 Group 0\n    1024 256 float sum -1 10.0 0.1 0.1 0 10 0.1 0.1 0\n",
        "nccl-tests 1e6 ranks": "# all_reduce_perf\n" + "#  Rank  0\n" * 1_000_000
                                + "    1024 256 float sum -1 10.0 0.1 0.1 0 10 0.1 0.1 0\n",
    }
    for name, body in items.items():
        c.append(Case(name=f"measurements {name}", category="measurements", argv=("calibrate", "{d}/m.csv"),
                      files={"m.csv": body}, mention=("m.csv", "nranks", "gpus")))
    return c


def resource_cases() -> list[Case]:
    """Inputs that would build huge tables, graphs, rank lists or search spaces."""
    c = []
    add = lambda name, argv, mention=(), expect="refuse", timeout=40.0, **kw: c.append(Case(  # noqa
        name=name, category="resources", argv=argv, mention=mention, expect=expect, timeout=timeout, **kw))
    add("collective --ranks 0-1e11", ("collective", "--gpus", "8", "--ranks", "0-99999999999"), ("ranks",))
    add("collective --ranks 0-1e7 on 8 GPUs", ("collective", "--gpus", "8", "--ranks", "0-9999999"), ("ranks",))
    add("collective --gpus 2^21", ("collective", "--gpus", str(1 << 21)), ("gpus",))
    add("estimate --gpus 2^21", ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", str(1 << 21)),
        ("gpus",))
    add("estimate --gpus 2^20 (at the limit)", ("estimate", "--model", "llama3-405b", "--cluster", "dgx-h100",
                                                "--gpus", str(1 << 20)), ("gpus", "graph", "pods", "batch"), expect="any",
        timeout=60)
    add("topo show --gpus 2^20", ("topo", "show", "dgx-h100", "--gpus", str(1 << 20)), ("gpus", "graph", "pods"),
        expect="any", timeout=60)
    add("topo draw --gpus 2^20", ("topo", "draw", "dgx-h100", "--gpus", str(1 << 20), "--out", "{d}/x.png"),
        ("gpus", "graph", "pods", "draw"), expect="any", timeout=60)
    add("topo check --gpus 65536", ("topo", "check", "dgx-h100", "--gpus", "65536"), ("gpus", "graph", "large"),
        expect="any", timeout=60)
    add("plan --gpus 2^20", ("plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", str(1 << 20),
                             "--global-batch", "4096"), ("gpus", "graph", "pods", "plans"), expect="any", timeout=60)
    add("plan 1000 micro-batch sizes x 64 tp", ("plan", *SMALL, "--micro-batch", *map(str, range(1, 1001)),
                                                "--tp", *map(str, range(1, 65))), ("plans", "space", "micro"),
        expect="any", timeout=60)
    add("plan huge space (cost objective, 2^20 GPUs)", ("plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                                          "--gpus", str(1 << 20), "--objective", "cost"),
        ("gpus", "plans", "space", "graph", "pods"), expect="any", timeout=60)
    add("collective --sweep on 2^16 GPUs", ("collective", "--cluster", "dgx-h100", "--gpus", "65536", "--sweep"),
        ("gpus", "graph", "large"), expect="any", timeout=60)
    add("validate --nproc 1024", ("validate", "--tp", "1024", "--nproc", "1024", "--out-dir", "{d}/v"),
        ("nproc", "tp", "ranks", "cores"), timeout=60)
    add("bench-collectives --iters 1e9", ("bench-collectives", "--iters", "1000000000"), ("iters",), timeout=60)
    add("bench-collectives --sizes 1PiB", ("bench-collectives", "--sizes", "1024T"), ("sizes", "memory"), timeout=60)
    add("profile --threads 100000", ("profile", "--grid", "tiny", "--threads", "100000", "--out", "{d}/p.csv"),
        ("threads",), timeout=60)
    add("estimate --seq-len 2^24 --micro-batch 65536", ("estimate", *SMALL, "--seq-len", str(1 << 24),
                                                        "--micro-batch", "65536", "--global-batch", "65536"),
        ("seq", "memory", "micro"), expect="any")
    return c


def output_cases() -> list[Case]:
    """Destinations that cannot be written, or that hold something that must not be overwritten."""
    c = []
    old_readme = "# my notes\nkeep me.\n"
    add = lambda name, argv, mention=(), **kw: c.append(Case(name=name, category="outputs", argv=argv,  # noqa
                                                              mention=mention, **kw))
    rep = ("report", *SMALL, "--tp", "8", "--global-batch", "64")
    slow = 150.0  # a report runs five searches: ~25 s on a busy 2-core machine
    add("report --out is a file", (*rep, "--out", "{d}/f"), ("f", "out"), files={"f": "x"}, check=_file_is("f", "x"),
        timeout=slow)
    add("report --out missing parent", (*rep, "--out", "{d}/no/such/r"), ("out", "no"), expect="any", timeout=slow)
    add("report --out unwritable", (*rep, "--out", "{d}/ro/r"), ("ro", "out", "kernel"), files={"ro": READONLY_DIR},
        timeout=slow)
    add("report --out empty", (*rep, "--out", ""), ("out",), timeout=slow)
    add("report over an existing README", (*rep, "--out", "{d}/r"), ("README", "force"),
        files={"r/README.md": old_readme}, check=_file_is("r/README.md", old_readme), timeout=slow)
    add("report --out /dev/full", (*rep, "--out", "/dev/full"), ("out", "full"), timeout=slow)
    add("plan --csv to a directory", ("plan", *SMALL, "--csv", "{d}/dir"), ("csv",), files={"dir": DIR})
    add("plan --csv missing parent", ("plan", *SMALL, "--csv", "{d}/no/x.csv"), ("csv",))
    add("plan --csv unwritable", ("plan", *SMALL, "--csv", "{d}/ro/x.csv"), ("csv",), files={"ro": READONLY_DIR})
    add("plan --csv /dev/full", ("plan", *SMALL, "--csv", "/dev/full"), ("csv",))
    add("plan --csv empty", ("plan", *SMALL, "--csv", ""), ("csv",))
    add("topo draw --out directory", ("topo", "draw", "dgx-a100", "--gpus", "16", "--out", "{d}/dir"), ("out",),
        files={"dir": DIR}, timeout=60)
    add("topo draw --out missing parent", ("topo", "draw", "dgx-a100", "--gpus", "16", "--out", "{d}/no/x.png"),
        ("out",), timeout=60)
    add("topo draw --out unwritable", ("topo", "draw", "dgx-a100", "--gpus", "16", "--out", "{d}/ro/x.png"),
        ("out",), files={"ro": READONLY_DIR}, timeout=60)
    add("topo draw --out unknown format", ("topo", "draw", "dgx-a100", "--gpus", "16", "--out", "{d}/x.docx"),
        ("out", "docx", "format"), timeout=60)
    add("topo draw over an existing file", ("topo", "draw", "dgx-a100", "--gpus", "16", "--out", "{d}/mine.png"),
        ("force", "exists"), files={"mine.png": "precious"}, check=_file_is("mine.png", "precious"), timeout=60)
    add("calibrate --out directory", ("calibrate", "{d}/m.csv", "--out", "{d}/dir"), ("out",),
        files={"m.csv": BENCH_CSV, "dir": DIR}, timeout=60)
    add("calibrate --out unwritable", ("calibrate", "{d}/m.csv", "--out", "{d}/ro/c.yaml"), ("out",),
        files={"m.csv": BENCH_CSV, "ro": READONLY_DIR}, timeout=60)
    add("calibrate --out /dev/full", ("calibrate", "{d}/m.csv", "--out", "/dev/full"), ("out",),
        files={"m.csv": BENCH_CSV}, timeout=60)
    add("calibrate --out over its own input", ("calibrate", "{d}/m.csv", "--out", "{d}/m.csv"), ("out", "m.csv"),
        files={"m.csv": BENCH_CSV}, check=_file_is("m.csv", BENCH_CSV), timeout=60)
    for where, files in (("directory", {"dir": DIR}), ("missing parent", {}), ("unwritable", {"ro": READONLY_DIR})):
        out = {"directory": "{d}/dir", "missing parent": "{d}/no/x.csv", "unwritable": "{d}/ro/x.csv"}[where]
        add(f"bench-collectives --out {where}", ("bench-collectives", "--sizes", "4K", "--iters", "2", "--ops",
                                                "all_reduce", "--out", out),
            ("out",), files=files, check=_no_measurement_lost, timeout=90)
        add(f"profile --out {where}", ("profile", "--grid", "tiny", "--kinds", "memory", "--no-progress", "--out",
                                       out), ("out", "kernel"), files=files, timeout=90,
            expect="any" if where == "missing parent" else "refuse")  # profile creates its folder
    add("profile --out is a foreign file", ("profile", "--grid", "tiny", "--kinds", "memory", "--out", "{d}/x.csv"),
        ("x.csv",), files={"x.csv": "a,b\n1,2\n"}, check=_file_is("x.csv", "a,b\n1,2\n"), timeout=60)
    add("profile --out /dev/full", ("profile", "--grid", "tiny", "--kinds", "memory", "--out", "/dev/full"),
        ("out", "full"), timeout=60)
    add("validate --out-dir is a file", ("validate", "--out-dir", "{d}/f"), ("out-dir", "f"), files={"f": "x"},
        timeout=150)
    add("validate --out-dir unwritable", ("validate", "--out-dir", "{d}/ro/v"), ("out-dir", "ro", "kernel"),
        files={"ro": READONLY_DIR}, timeout=150)
    return c


def interrupt_cases() -> list[Case]:
    """Ctrl-C and kill in the middle of writing."""
    c = []
    rep = ("report", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "64", "--out", "{d}/r")
    for delay in (6.0, 12.0, 18.0, 21.0, 24.0, 27.0, 30.0, 34.0, 38.0, 44.0):  # the charts come after ~18 s
        c.append(Case(name=f"report SIGINT after {delay:g}s", category="interrupts", argv=rep,
                      kill=(signal.SIGINT, delay), check=_pngs_complete("r", temp_files=True), expect="any",
                      timeout=150))
    for delay in (20.0, 30.0):
        c.append(Case(name=f"report SIGKILL after {delay:g}s", category="interrupts", argv=rep,
                      kill=(signal.SIGKILL, delay), check=_pngs_complete("r"), expect="any", timeout=150))
    for sig, delay in ((signal.SIGINT, 12.0), (signal.SIGKILL, 12.0), (signal.SIGTERM, 15.0)):
        c.append(Case(name=f"profile {signal.Signals(sig).name} after {delay:g}s", category="interrupts",
                      argv=("profile", "--grid", "quick", "--no-progress", "--out", "{d}/p.csv"), kill=(sig, delay),
                      check=_profile_rows_complete("p.csv"), expect="any", timeout=90))
    for delay in (1.0, 2.0, 3.0, 4.0):
        c.append(Case(name=f"calibrate SIGINT after {delay:g}s", category="interrupts",
                      argv=("calibrate", "{d}/m.csv", "--out", "{d}/cal.yaml"), files={"m.csv": BENCH_CSV},
                      kill=(signal.SIGINT, delay), expect="any", timeout=60, check=_calibration_whole))
    return c


def cache_cases() -> list[Case]:
    """The planner's on-disk cache, damaged between two runs."""
    c = []
    argv = ("plan", *SMALL, "--global-batch", "64", "--no-progress")
    for damage in ("truncate-npz", "garbage-json", "edit-json", "edit-npz", "swap-entries", "foreign-files",
                   "cache-dir-is-file", "cache-dir-unwritable", "empty-files"):
        c.append(Case(name=f"cache {damage}", category="caches", argv=argv, expect="ok",
                      env={"PROBE_CACHE_DAMAGE": damage}, check=_cache_matches_uncached, timeout=60))
    return c


def process_cases() -> list[Case]:
    """Verbs that start processes, killed by every kind of signal: nothing may be left running."""
    c = []
    bench = ("bench-collectives", "--nproc", "2", "--sizes", "4K", "1M", "4M", "--iters", "200", "--timeout", "60")
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        c.append(Case(name=f"bench-collectives {signal.Signals(sig).name}", category="processes", argv=bench,
                      kill=(sig, 8.0), expect="any", timeout=90))
    val = ("validate", "--model", "llama3-8b", "--layers", "1", "--hidden", "512", "--heads", "8", "--kv-heads", "4",
           "--seq-len", "128", "--tp", "2", "--reps", "50", "--out-dir", "{d}/v", "--no-calibrate", "--timeout", "60")
    for sig in (signal.SIGKILL, signal.SIGTERM):
        c.append(Case(name=f"validate {signal.Signals(sig).name}", category="processes", argv=val,
                      kill=(sig, 12.0), expect="any", timeout=90))
    c.append(Case(name="profile SIGKILL (children)", category="processes",
                  argv=("profile", "--grid", "quick", "--no-progress", "--out", "{d}/p.csv"),
                  kill=(signal.SIGKILL, 8.0), expect="any", timeout=60))
    c.append(Case(name="calibrate SIGKILL", category="processes", argv=("calibrate", "{d}/m.csv"),
                  files={"m.csv": BENCH_CSV}, kill=(signal.SIGKILL, 1.0), expect="any", timeout=60))
    return c


def launch_cases() -> list[Case]:
    """Launch configs (export, estimate --from), stack profiles and model show: later verbs, skipped on a
    checkout without them."""
    c = []
    exp = ("export", "--format", "megatron", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
           "--tp", "8", "--zero", "0", "--no-predict")
    add = lambda name, argv, mention=(), requires=("--format",), **kw: c.append(Case(  # noqa: E731
        name=name, category="launch", argv=argv, mention=mention, requires=requires, **kw))
    add("export --out is a file", (*exp, "--out", "{d}/f"), ("out",), files={"f": "x"})
    add("export --out unwritable", (*exp, "--out", "{d}/ro/e"), ("out", "kernel"), files={"ro": READONLY_DIR})
    add("export --out empty", (*exp, "--out", ""), ("out",))
    add("export over existing launch files", (*exp, "--out", "{d}/e"), ("force", "megatron_args"),
        files={"e/megatron_args.sh": "#!/bin/bash\n# mine\n"}, check=_file_is("e/megatron_args.sh",
                                                                              "#!/bin/bash\n# mine\n"))
    add("export --format bogus", (*exp[:1], "--format", "slurm", *exp[3:], "--out", "{d}/e"), ("format",))
    for name, files, path in (("bomb", {"s.yaml": BILLION_LAUGHS}, "{d}/s.yaml"),
                              ("cluster file", {}, str(REPO / "topologies/clusters/dgx-a100.yaml")),
                              ("missing", {}, "{d}/none.yaml"), ("directory", {"sd": DIR}, "{d}/sd"),
                              ("binary", {"b.yaml": bytes(range(256)) * 8}, "{d}/b.yaml")):
        add(f"export --stack {name}", (*exp, "--stack", path, "--out", "{d}/e"), ("stack", "s.yaml", "b.yaml",
                                                                                  "none.yaml", "sd", "cluster"),
            files=files, requires=("--stack",))
    est = ("estimate", "--gpus", "8", "--cluster", "dgx-h100")
    for name, files, path in (("fifo", {"f.sh": FIFO}, "{d}/f.sh"), ("missing", {}, "{d}/none.sh"),
                              ("binary", {"b.sh": bytes(range(256)) * 8}, "{d}/b.sh"),
                              ("garbage", {"g.sh": "torchrun pretrain_gpt.py --tensor-model-parallel-size x\n"},
                               "{d}/g.sh"),
                              ("tp 400 digits", {"t.sh": "torchrun pretrain_gpt.py --tensor-model-parallel-size "
                                                         + "9" * 400 + "\n"}, "{d}/t.sh"),
                              ("deepspeed deep json", {"d.json": "[" * 100_000 + "]" * 100_000}, "{d}/d.json"),
                              ("nemo bomb", {"n.yaml": BILLION_LAUGHS}, "{d}/n.yaml"),
                              ("torchtitan binary toml", {"t.toml": b"\xff\xfe[job]\x00"}, "{d}/t.toml")):
        add(f"estimate --from {name}", (*est, "--from", path), ("from", "f.sh", "none.sh", "b.sh", "g.sh", "t.sh",
                                                                "d.json", "n.yaml", "t.toml", "tensor"),
            files=files, requires=("--from",), timeout=20)
    for name, argv, files in (("binary config", ("model", "show", "{d}/config.json"),
                               {"config.json": bytes(range(256))}),
                              ("fifo config", ("model", "show", "{d}/config.json"), {"config.json": FIFO}),
                              ("--layers 400 digits", ("model", "show", "llama3-8b", "--layers", "9" * 400), {})):
        add(f"model show {name}", argv, ("config.json", "layers"), files=files, requires=("show",), timeout=20)
    return c


def fresh_cases() -> list[Case]:
    """Issue 26's classes, probed afresh (wave 5, not from the issue's examples): every input format, the
    work a verb is asked for, code from data, caches, paths and outputs. Category names start with ``26-``."""
    c = []
    add = lambda cat, name, argv, mention=(), expect="refuse", timeout=40.0, **kw: c.append(Case(  # noqa: E731
        name=name, category=f"26-{cat}", argv=argv, mention=mention, expect=expect, timeout=timeout, **kw))
    est = ("estimate", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8", "--global-batch", "64",
           "--micro-batch", "1")
    # config.json: shapes a JSON parser or a checker can be slow or wrong on
    cfg = lambda **kw: {"config.json": _hf(**kw)}  # noqa: E731
    for name, files, mention, expect in (
            ("quote-heavy 900 kB string", {"config.json": _hf(note='\\"' * 300_000)}, ("config.json",), "any"),
            ("50k keys", {"config.json": json.dumps({**HF_LLAMA, **{f"k{i}": i for i in range(50_000)}})},
             ("config.json",), "any"),
            ("depth 63 under a key", {"config.json": _hf(extra=json.loads("[" * 62 + "]" * 62))}, ("config.json",),
             "any"),
            ("depth 65 under a key", {"config.json": _hf().replace('"max_position', '"x": ' + "[" * 65 + "]" * 65
                                                                   + ', "max_position')}, ("depth", "nest"), "refuse"),
            ("1e400 hidden", {"config.json": _hf().replace("1024", "1e400", 1)}, ("hidden", "config.json"), "refuse"),
            ("41-digit vocab", {"config.json": _hf(vocab_size=10 ** 40)}, ("vocab", "digits"), "refuse"),
            ("layers 9999999", cfg(num_hidden_layers=9_999_999), ("layers",), "refuse"),
            ("model_type list", cfg(model_type=["llama"]), ("model_type",), "refuse"),
            ("rope factor NaN", {"config.json": _hf(rope_scaling={"type": "linear", "factor": 1.0}).replace(
                '"factor": 1.0', '"factor": NaN')}, ("NaN", "config.json"), "refuse"),
            ("BOM first", {"config.json": "\ufeff" + _hf()}, ("config.json",), "any"),
            ("lone surrogate", {"config.json": _hf(name="\\ud800")}, ("config.json",), "any"),
            ("torch_dtype 5", cfg(torch_dtype=5), ("torch_dtype", "dtype"), "refuse"),
            ("hidden 4096.0", cfg(hidden_size=1024.0), (), "any"),
            ("hidden -0", {"config.json": _hf().replace('"hidden_size": 1024', '"hidden_size": -0')},
             ("hidden",), "refuse"),
            ("intermediate 1e30", cfg(intermediate_size=1e30), ("intermediate", "ffn"), "refuse"),
            ("2 MB of whitespace", {"config.json": _hf() + " " * (2 << 20)}, ("config.json",), "refuse"),
            ("empty file", {"config.json": ""}, ("config.json",), "refuse"),
            ("null top level", {"config.json": "null"}, ("config.json",), "refuse"),
    ):
        for verb in (("estimate", "--model", "{d}/config.json", *est[1:]), ("model", "show", "{d}/config.json")):
            add("config", f"{verb[0]} config {name}", verb, mention, expect, files=files)
    # ops.json
    graph = json.loads(_read("tests/data/opgraph/tiny-gpt.ops.json"))

    def g(edit: Callable[[dict], None]) -> dict:
        doc = json.loads(json.dumps(graph))
        edit(doc)
        return {"g.ops.json": json.dumps(doc)}

    def op0(key: str, value: object) -> Callable[[dict], None]:
        def edit(doc: dict) -> None:
            doc["units"][0]["ops"][0][key] = value
        return edit

    def attr0(key: str, value: object) -> Callable[[dict], None]:
        def edit(doc: dict) -> None:  # the first linear (units[1].ops[1]: blocks.0.attn.qkv)
            doc["units"][1]["ops"][1].setdefault("attrs", {})[key] = value
        return edit
    plan_g = ("estimate", "--model", "{d}/g.ops.json", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "1",
              "--global-batch", "8", "--micro-batch", "1")
    for name, edit in (("flops 1e308", op0("flops", 1e308)), ("flops -1", op0("flops", -1)),
                       ("flops string", op0("flops", "1e9")), ("in_features 1e30", attr0("in_features", 10 ** 30)),
                       ("in_features 0", attr0("in_features", 0)), ("kind list", op0("kind", ["linear"])),
                       ("units empty", lambda d: d.__setitem__("units", [])),
                       ("repeat 1e18", lambda d: d["units"][0].__setitem__("repeat", 10 ** 18)),
                       ("batch 0", lambda d: d.__setitem__("batch", 0)),
                       ("batch 2^62", lambda d: d.__setitem__("batch", 1 << 62)),
                       ("format wrong", lambda d: d.__setitem__("format", "onnx")),
                       ("params negative dim", lambda d: d["params"].__setitem__("wte.weight", [-128, 64])),
                       ("inputs shape strings", lambda d: d["inputs"][0].__setitem__("shape", ["2", "16"]))):
        add("ops", f"ops.json {name}", plan_g, ("g.ops.json",), files=g(edit))
    add("ops", "ops.json 70 MB sparse", plan_g, ("g.ops.json", "MB", "bytes", "size"),
        files={"g.ops.json": b" " * (70 << 20)})
    add("ops", "ops.json is a FIFO", plan_g, ("g.ops.json",), files={"g.ops.json": FIFO})
    add("code", "ops.json module_spec with plan", ("plan", "--model", "{d}/g.ops.json", "--cluster", "dgx-h100",
                                                   "--gpus", "8", "--global-batch", "8"), expect="any",
        files={**g(lambda d: d.setdefault("source", {}).__setitem__("module_spec", "{d}/evil.py:f")),
               "evil.py": "open(__file__ + '.ran', 'w').write('x')\ndef f(): pass\n"},
        check=lambda run: "code-run: the module named inside the graph ran" if (run.folder / "evil.py.ran").exists()
        else None)
    # stack YAML
    stack = _read("tpsim/data/stacks/megatron.yaml")
    for name, old, new in (("optimizer bytes -42", "value: 42", "value: -42"),
                           ("optimizer bytes .nan", "value: 42", "value: .nan"),
                           ("optimizer bytes list", "value: 42", "value: [42]"),
                           ("optimizer bytes string", "value: 42", "value: '42'"),
                           ("host us 1e9", "value: 10\n    range: [5, 20]", "value: 1e9\n    range: [5, 20]"),
                           ("host us true", "value: 10\n    range: [5, 20]", "value: true\n    range: [5, 20]"),
                           ("reserve 7", "value: 0.03", "value: 7.0"),
                           ("name list", "name: megatron", "name: [megatron]"),
                           ("unknown top key", "name: megatron", "name: megatron\ncolour: red")):
        add("stack", f"stack {name}", (*est[:1], "--model", "llama3-8b", *est[1:], "--stack", "{d}/s.yaml"),
            ("s.yaml",), files={"s.yaml": stack.replace(old, new, 1)})
    # calibration YAML (estimate --calibration) and cluster YAML
    for name, text in (("efficiency 1.5", "nvlink: {efficiency: 1.5}\n"),
                       ("latency -1", "nvlink: {latency_us: -1}\n"), ("bw 0", "ib: {bw_GBps: 0}\n"),
                       ("gemm scale 1e9", "compute: {gemm_scale: 1.0e9}\n"),
                       ("gemm scale string", "compute: {gemm_scale: fast}\n"),
                       ("link list", "nvlink: [1, 2]\n"), ("empty", ""), ("bomb", BILLION_LAUGHS)):
        add("calibration", f"calibration {name}", (*est[:1], "--model", "llama3-8b", *est[1:], "--calibration",
                                                   "{d}/cal.yaml"), ("cal.yaml",), files={"cal.yaml": text})
    for name, text in (("gpus_per_node 0", CLUSTER + "gpus_per_node: 0\n"),
                       ("gpus 2^63", CLUSTER.replace("gpus: 16", f"gpus: {1 << 63}")),
                       ("node escapes", CLUSTER.replace("node: dgx-a100", "node: ../../../../etc/passwd")),
                       ("node is /dev/zero", CLUSTER.replace("node: dgx-a100", "node: /dev/zero")),
                       ("fabric radix -1", CLUSTER.replace("fabric: selene-hdr-fat-tree",
                                                           "fabric: {use: selene-hdr-fat-tree, radix: -1}")),
                       ("device inline NaN", CLUSTER.replace("device: A100-SXM4-80GB",
                                                             "device: {name: X, peak_flops: {bf16: .nan}}")),
                       ("defaults efficiency 2", CLUSTER + "defaults: {efficiency: 2}\n"),
                       ("calibration inline list", CLUSTER + "calibration: [1, 2]\n")):
        add("cluster", f"cluster {name}", ("topo", "show", "{d}/c.yaml"), ("c.yaml", "node", "passwd", "zero"),
            files={"c.yaml": text})
    # profile CSV and runs CSV
    for name, edit in (("time negative", _replace_cell("time_s", "-1e-5")),
                       ("m superscript", _replace_cell("m", "\u00b2")),
                       ("m 5000 digits", _replace_cell("m", "9" * 5000)),
                       ("spread nan", _replace_cell("spread_pct", "nan")),
                       ("dtype empty", _replace_cell("dtype", "")),
                       ("pass sideways", _replace_cell("pass", "sideways"))):
        add("profile", f"profile {name}", (*est[:1], "--model", "llama3-8b", *est[1:], "--profile", "{d}/p.csv"),
            ("p.csv",), files={"p.csv": _profile_with(edit)})
    runs_head = "run_id,model,cluster,gpus,tp,micro_batch,global_batch,step_time_s,source\n"
    for name, row in (("gpus 0", "r1,llama3-8b,dgx-h100,0,8,1,64,1.5,s"), ("tp 8.0", "r1,llama3-8b,dgx-h100,8,8.0,1,64,1.5,s"),
                      ("step inf", "r1,llama3-8b,dgx-h100,8,8,1,64,inf,s"),
                      ("step -1", "r1,llama3-8b,dgx-h100,8,8,1,64,-1,s"),
                      ("tp superscript", "r1,llama3-8b,dgx-h100,8,\u00b2,1,64,1.5,s"),
                      ("quote bomb", 'r1,"' + '""' * 200_000 + '",dgx-h100,8,8,1,64,1.5,s')):
        add("runs", f"runs {name}", ("report", "--runs", "{d}/runs.csv", "--out", "{d}/r"), ("runs.csv",),
            files={"runs.csv": runs_head + row + "\n"}, requires=("--runs",))
    # launch files: estimate --from
    frm = lambda fname: ("estimate", "--from", "{d}/" + fname, "--cluster", "dgx-h100", "--gpus", "8")  # noqa: E731
    mega = "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 " \
           "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 16 "
    for name, tail in (("tp 0x10", "--tensor-model-parallel-size 0x10"), ("tp arabic digit", "--tensor-model-parallel-size \u0661"),
                       ("tp fullwidth", "--tensor-model-parallel-size \uff18"),
                       ("shell 2**62*4", "--global-batch-size $((2**62*4))"),
                       ("layers ${X:-99999999}", "--num-layers ${X:-99999999}"),
                       ("seq 1e5", "--seq-length 1e5"), ("flag without value", "--tensor-model-parallel-size"),
                       ("layout multiplies out", "--pipeline-model-parallel-layout 'E|(t|)*1000000000,L'"),
                       ("layout nested", "--pipeline-model-parallel-layout '" + "(" * 5000 + "t" + ")*2" * 5000 + "'"),
                       ("backslash continuation forever", "\\\n" * 100_000)):
        add("megatron", f"megatron {name}", frm("train.sh"), ("train.sh",), files={"train.sh": mega + tail + "\n"},
            requires=("--from",))
    titan = ("[parallelism]\ntensor_parallel_degree = 2\npipeline_parallel_degree = {pp}\n"
             "data_parallel_shard_degree = 4\n[training]\nlocal_batch_size = 2\nseq_len = {seq}\n{extra}"
             "[model]\nname = \"llama3\"\nflavor = \"8B\"\n")
    for name, kw in (("seq inf", {"seq": "inf"}), ("seq nan", {"seq": "nan"}), ("seq 1.5", {"seq": "1.5"}),
                     ("tp -1", {"extra": "", "pp": "1", "seq": "512"}),
                     ("pp 2 microbatch 0", {"pp": "2", "extra": "[parallelism.extra]\npipeline_parallel_microbatch_size = 0\n"}),
                     ("datetime seq", {"seq": "1979-05-27T07:32:00Z"}),
                     ("deep tables", {"extra": "".join(f"[{'.'.join(['a'] * (i + 1))}]\n" for i in range(300))})):
        text = titan.format(**{"pp": "1", "seq": "512", "extra": "", **kw})
        if name == "tp -1":
            text = text.replace("tensor_parallel_degree = 2", "tensor_parallel_degree = -1")
        add("torchtitan", f"torchtitan {name}", frm("t.toml"), ("t.toml",), files={"t.toml": text},
            requires=("--from",))
    ds = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
          "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}
    for name, doc in (("stage '3'", {**ds, "zero_optimization": {"stage": "3"}}),
                      ("stage 4", {**ds, "zero_optimization": {"stage": 4}}),
                      ("zero list", {**ds, "zero_optimization": [1]}),
                      ("bf16 enabled 1", {**ds, "bf16": {"enabled": 1}}),
                      ("batch 1e400", None), ("micro 0", {**ds, "train_micro_batch_size_per_gpu": 0}),
                      ("batch not product", {**ds, "train_batch_size": 65}),
                      ("all auto", {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})):
        text = json.dumps(doc) if doc is not None else json.dumps(ds).replace("64", "1e400", 1)
        add("deepspeed", f"deepspeed {name}", (*frm("ds.json"), "--model", "llama3-8b"), ("ds.json",),
            files={"ds.json": text}, requires=("--from",), expect="any" if name in ("all auto",) else "refuse")
    nemo = ("trainer: {devices: 8, num_nodes: 1, precision: bf16-mixed}\nmodel: {tensor_model_parallel_size: 2, "
            "pipeline_model_parallel_size: 1, micro_batch_size: 1, global_batch_size: 32, num_layers: 4, "
            "hidden_size: 256, ffn_hidden_size: 1024, num_attention_heads: 4, encoder_seq_length: 512, "
            "max_position_embeddings: 512EXTRA}\n")
    for name, extra, old, new in (("devices -1", "", "devices: 8", "devices: -1"),
                                  ("num_nodes 0", "", "num_nodes: 1", "num_nodes: 0"),
                                  ("precision 16.5", "", "precision: bf16-mixed", "precision: 16.5"),
                                  ("sp string", ", sequence_parallel: 'true'", "", ""),
                                  ("interpolation cycle", ", a: '${.b}', b: '${.a}', num_layers_x: '${.a}'", "", ""),
                                  ("interpolation to nothing", "", "num_layers: 4", "num_layers: '${.nope}'"),
                                  ("model list", "", "model: {", "model: [{")):
        text = nemo.replace("EXTRA", extra)
        if old:
            text = text.replace(old, new, 1)
        if name == "model list":
            text = text.rstrip("\n") + "]\n"
        add("nemo", f"nemo {name}", frm("n.yaml"), ("n.yaml",), files={"n.yaml": text}, requires=("--from",))
    # sweep files
    sw = "axes:\n  device: [H100-SXM]\n  gpus: [64]\nmodels: [llama3-8b]\n"
    for name, text in (("factor near 1", sw.replace("gpus: [64]", "gpus: {from: 8, to: 1.0e300, factor: 1.0000001}")),
                       ("step tiny", sw.replace("gpus: [64]", "gpus: {from: 8, to: 64, step: 1.0e-300}")),
                       ("65 models", sw.replace("models: [llama3-8b]", "models: [" + ", ".join(["llama3-8b"] * 65) + "]")),
                       ("tokens text", sw.replace("models: [llama3-8b]", "models: [{model: llama3-8b, tokens: lots}]")),
                       ("stack /dev/zero", sw + "stack: /dev/zero\n"), ("dtype list", sw + "dtype: [bf16]\n"),
                       ("skip 'yes'", sw + "skip_impossible: 'yes'\n"),
                       ("family scale 0", sw + "family: {model: llama3-8b, scale: [0]}\n"),
                       ("gpus 2^40", sw.replace("gpus: [64]", f"gpus: [{1 << 40}]")),
                       ("axes list", "axes: [device, gpus]\nmodels: [llama3-8b]\n"),
                       ("bomb", BILLION_LAUGHS)):
        add("sweep", f"sweep {name}", ("design", "{d}/s.yaml", "--out", "{d}/o"), ("s.yaml",), files={"s.yaml": text},
            requires=("--allow-large-sweep",))
    # values that mean nothing
    add("values", "--ep 2 on a dense model", ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus",
                                              "16", "--tp", "8", "--global-batch", "64", "--ep", "2"), ("ep",))
    add("values", "profile --dtype ''", ("profile", "--dtype", "", "--out", "{d}/p.csv"), ("dtype",))
    add("values", "--gpus fullwidth", ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus",
                                       "\uff18"), ("gpus",))
    add("values", "--tokens 1e17", ("train-time", "--model", "llama3-8b", *est[1:], "--tokens", "1e17"), ("tokens",))
    add("values", "--mem-limit-gib nan", ("plan", *SMALL, "--global-batch", "64", "--mem-limit-gib", "nan"),
        ("mem-limit",))
    add("values", "--gpu-hour-price -0", ("plan", *SMALL, "--global-batch", "64", "--gpu-hour-price", "-0"),
        ("price",))
    add("values", "--scaling-span 0", ("report", *SMALL, "--scaling-span", "0", "--out", "{d}/r"), ("span",))
    add("values", "--scaling-span 2^20", ("report", *SMALL, "--scaling-span", str(1 << 20), "--out", "{d}/r"),
        ("span", "searches"))
    add("values", "trace --input-shape arabic", ("trace", "tpsim.trace.zoo:vit_l16", "--input-shape", "\u0661,3,8,8",
                                                 "--out", "{d}/t.ops.json"), ("input-shape",))
    # work bounded before it starts
    add("work", "validate --tp 2048", ("validate", "--hidden", "128", "--heads", "4", "--tp", "2048"),
        ("ranks",))
    add("work", "validate --tp 64 --dp 16 on this machine", ("validate", "--hidden", "128", "--heads", "64",
                                                             "--tp", "64", "--dp", "16"), ("ranks", "memory"))
    add("work", "calibrate 300 MB sparse", ("calibrate", "{d}/m.csv"), ("bytes", "m.csv", "MB"),
        files={"m.csv": b"\0" * (300 << 20)})
    add("work", "profile 8x fp32", ("profile", *(["--dtype", "fp32"] * 8), "--out", "{d}/p.csv"), ("kernel",))
    add("work", "plan --gpus 8192 local-cpu", ("plan", "--model", "gpt3-1.3b", "--cluster", "local-cpu", "--gpus",
                                               "8192", "--global-batch", "8192"), ("node", "GPU"))
    add("work", "collective --sweep local-cpu 2048", ("collective", "--cluster", "local-cpu", "--gpus", "2048",
                                                      "--sweep"), ("node", "GPU"))
    add("work", "design 3e4 designs", ("design", "{d}/s.yaml", "--out", "{d}/o"), ("designs", "allow-large"),
        files={"s.yaml": sw.replace("gpus: [64]", "gpus: {from: 8, to: 80000, step: 8}\n  gpu_hour_price: [1, 2, 3]")},
        requires=("--allow-large-sweep",))
    add("work", "design 1e4 planning tasks", ("design", "{d}/s.yaml", "--out", "{d}/o"), ("tasks", "allow-large"),
        files={"s.yaml": sw.replace("gpus: [64]", "gpus: {from: 8, to: 80000, step: 8}")},
        requires=("--allow-large-sweep",))
    # paths and outputs
    add("paths", "trace --name a/b", ("trace", "tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--name",
                                      "a/b"), ("name",))
    add("paths", "trace --name ''", ("trace", "tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--name",
                                     ""), ("name",))
    add("paths", "trace --name newline", ("trace", "tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224",
                                          "--name", "a\nb"), ("name",))
    add("paths", "plan --csv a folder", ("plan", *SMALL, "--global-batch", "64", "--csv", "{d}/f"), ("csv", "f"),
        files={"f": DIR})
    add("paths", "plan --csv /dev/full", ("plan", *SMALL, "--global-batch", "64", "--csv", "/dev/full"),
        ("csv", "full", "space", "device"), expect="any")
    add("paths", "report --out under a file", ("report", *SMALL, "--out", "{d}/f/r"), ("out", "f"),
        files={"f": "x"})
    # caches
    for damage in ("fifo-entry", "symlink-zero", "dir-entry", "meta-drop-field", "huge-sparse", "symlink-out"):
        add("cache", f"cache {damage}", ("plan", *SMALL, "--global-batch", "64", "--no-progress"), expect="ok",
            env={"PROBE_CACHE_DAMAGE": damage}, check=_cache_matches_uncached, timeout=60)
    add("cache", "TPSIM_CACHE_DIR=/dev/null", ("plan", *SMALL, "--global-batch", "64", "--no-progress"),
        expect="ok", env={"TPSIM_CACHE_DIR": "/dev/null"})
    add("cache", "TPSIM_CACHE_DIR is a FIFO", ("plan", *SMALL, "--global-batch", "64", "--no-progress"),
        expect="ok", env={"TPSIM_CACHE_DIR": "{d}/fifo"}, files={"fifo": FIFO})
    return c


API_PRELUDE = """\
import sys
import numpy as np
import tpsim
from tpsim.errors import TpsimError
def _m():
    return tpsim.load_model("llama3-8b")
def _c(n=8):
    return tpsim.load_cluster("dgx-h100", gpus=n)
def wrong(msg):
    print("WRONG: " + str(msg)[:200])
    sys.exit(3)
try:
{body}
except TpsimError as exc:
    print("tpsim api: error: " + (str(exc).splitlines() or [""])[0], file=sys.stderr)
    sys.exit(2)
"""
"""what every API case runs in a fresh interpreter: a TpsimError is the promised one line and status 2; any
other exception is a traceback; a result the case finds wrong prints WRONG and exits 3 (wrong-exit)."""


def api_argv(code: str) -> tuple[str, ...]:
    return ("--api", code)


def wave6_cases() -> list[Case]:
    """Issue 26, probed afresh a third time (wave 6): the Python API (None, numpy scalars, bools where ints
    belong, wrong types, huge values for every public function) and new hostile inputs for every format and
    verb (design, train-time, plan --objective, report --runs, calibrate --from-runs/--log, export --format all,
    trace). Category names start with ``26w6-``."""
    c: list[Case] = []
    add = lambda cat, name, argv, mention=(), expect="refuse", timeout=40.0, **kw: c.append(Case(  # noqa: E731
        name=name, category=f"26w6-{cat}", argv=argv, mention=mention, expect=expect, timeout=timeout, **kw))
    # ---- the Python API: each call in a fresh interpreter (API_PRELUDE)
    api = lambda name, body, mention=(), expect="refuse": add(  # noqa: E731
        "api", name, api_argv(body), mention, expect)
    for name, call, mention in (
            ("make_plan gpus None", "tpsim.make_plan(_m(), None)", ("gpus",)),
            ("make_plan gpus True", "tpsim.make_plan(_m(), True)", ("gpus",)),
            ("make_plan gpus 8.0", "tpsim.make_plan(_m(), 8.0)", ("gpus",)),
            ("make_plan gpus np.float64", "tpsim.make_plan(_m(), np.float64(8))", ("gpus",)),
            ("make_plan gpus '8'", "tpsim.make_plan(_m(), '8')", ("gpus",)),
            ("make_plan gpus 2^70", "tpsim.make_plan(_m(), 2**70)", ("gpus",)),
            ("make_plan gpus -8", "tpsim.make_plan(_m(), -8)", ("gpus",)),
            ("make_plan gpus 0", "tpsim.make_plan(_m(), 0)", ("gpus",)),
            ("make_plan tp True", "tpsim.make_plan(_m(), 8, tp=True)", ("tp",)),
            ("make_plan tp np.float32", "tpsim.make_plan(_m(), 8, tp=np.float32(2))", ("tp",)),
            ("make_plan tp 3 of 8", "tpsim.make_plan(_m(), 8, tp=3)", ("tp",)),
            ("make_plan pp 2^40", "tpsim.make_plan(_m(), 8, pp=2**40)", ("pp",)),
            ("make_plan micro_batch 0", "tpsim.make_plan(_m(), 8, micro_batch=0)", ("micro",)),
            ("make_plan micro_batch np.bool_", "tpsim.make_plan(_m(), 8, micro_batch=np.bool_(True))", ("micro",)),
            ("make_plan global_batch np 2^62", "tpsim.make_plan(_m(), 8, global_batch=np.int64(2**62))",
             ("global_batch",)),
            ("make_plan unknown keyword", "tpsim.make_plan(_m(), 8, tensor_parallel=2)", ("tensor_parallel",)),
            ("make_plan model str", "tpsim.make_plan('llama3-8b', 8)", ("model",)),
            ("make_plan zero 7", "tpsim.make_plan(_m(), 8, zero=7)", ("zero",)),
            ("make_plan recompute 5", "tpsim.make_plan(_m(), 8, recompute=5)", ("recompute",)),
            ("make_plan dtype None-ish", "tpsim.make_plan(_m(), 8, dtype='bf17')", ("dtype",)),
            ("load_model None", "tpsim.load_model(None)", ("model", "None")),
            ("load_model 5", "tpsim.load_model(5)", ("model", "5")),
            ("load_model ''", "tpsim.load_model('')", ("model",)),
            ("load_model 10k chars", "tpsim.load_model('x' * 10000)", ("model",)),
            ("load_model bytes", "tpsim.load_model(b'llama3-8b')", ("model",)),
            ("load_model /dev/zero", "tpsim.load_model('/dev/zero')", ("zero", "model")),
            ("load_model missing ops.json", "tpsim.load_model('/nonexistent/x.ops.json')", ("x.ops.json",)),
            ("load_model NUL", "tpsim.load_model('llama\\x003-8b')", ("model",)),
            ("load_cluster None", "tpsim.load_cluster(None)", ("cluster", "None")),
            ("load_cluster 5", "tpsim.load_cluster(5)", ("cluster", "5")),
            ("load_cluster gpus True", "tpsim.load_cluster('dgx-h100', gpus=True)", ("gpus",)),
            ("load_cluster gpus 8.0", "tpsim.load_cluster('dgx-h100', gpus=8.0)", ("gpus",)),
            ("load_cluster gpus '16'", "tpsim.load_cluster('dgx-h100', gpus='16')", ("gpus",)),
            ("load_cluster gpus 2^40", "tpsim.load_cluster('dgx-h100', gpus=2**40)", ("gpus",)),
            ("load_cluster gpus -1", "tpsim.load_cluster('dgx-h100', gpus=-1)", ("gpus",)),
            ("load_cluster gpus np.float64", "tpsim.load_cluster('dgx-h100', gpus=np.float64(16))", ("gpus",)),
            ("estimate plan str", "tpsim.estimate(_m(), _c(), 'tp2')", ("plan",)),
            ("estimate plan of 16 GPUs on 8", "tpsim.estimate(_m(), _c(8), tpsim.make_plan(_m(), 16, tp=8))",
             ("gpu", "16", "8")),
            ("estimate compute=5", "tpsim.estimate(_m(), _c(), tpsim.make_plan(_m(), 8, tp=8), compute=5)",
             ("compute",)),
            ("estimate stack=5", "tpsim.estimate(_m(), _c(), tpsim.make_plan(_m(), 8, tp=8), stack=5)", ("stack",)),
            ("estimate stack unknown", "tpsim.estimate(_m(), _c(), tpsim.make_plan(_m(), 8, tp=8), stack='nope')",
             ("stack", "nope")),
            ("estimate calibration=[]", "tpsim.estimate(_m(), _c(), tpsim.make_plan(_m(), 8, tp=8), calibration=[])",
             ("calibration",)),
            ("estimate_batch list", "tpsim.estimate_batch(_m(), _c(), [tpsim.make_plan(_m(), 8, tp=8)])",
             ("plans",)),
            ("estimate_batch None", "tpsim.estimate_batch(_m(), _c(), None)", ("plans",)),
            ("estimate model dict", "tpsim.estimate({'hidden': 4096}, _c(), tpsim.make_plan(_m(), 8))", ("model",)),
            ("with_overrides layers True", "tpsim.with_overrides(_m(), num_layers=True)", ("layers",)),
            ("with_overrides hidden 2^70", "tpsim.with_overrides(_m(), hidden=2**70)", ("hidden",)),
            ("with_overrides hidden np.float64", "tpsim.with_overrides(_m(), hidden=np.float64(4096))", ("hidden",)),
            ("search batch None", "from tpsim.search import search\nsearch(_m(), _c(), None)", ("batch",)),
            ("search batch True", "from tpsim.search import search\nsearch(_m(), _c(), True)", ("batch",)),
            ("search batch 2^70", "from tpsim.search import search\nsearch(_m(), _c(), 2**70)", ("batch",)),
            ("search batch '64'", "from tpsim.search import search\nsearch(_m(), _c(), '64')", ("batch",)),
            ("search objective nope", "from tpsim.search import search\nsearch(_m(), _c(), 64, objective='nope')",
             ("objective", "nope")),
            ("search mem_limit nan", "from tpsim.search import search\nsearch(_m(), _c(), 64, mem_limit_gib=float('nan'))",
             ("mem",)),
            ("search price -1", "from tpsim.search import search\nsearch(_m(), _c(), 64, gpu_hour_price=-1.0)",
             ("price",)),
            ("search space=5", "from tpsim.search import search\nsearch(_m(), _c(), 64, space=5)", ("space",)),
            ("search clusters None", "from tpsim.search import search\nsearch(_m(), None, 64)", ("cluster",)),
            ("search tokens -1", "from tpsim.search import search\nsearch(_m(), _c(), 64, tokens=-1.0)", ("tokens",)),
            ("SearchSpace tp (0,)", "from tpsim.search import SearchSpace\nSearchSpace(tp=(0,))", ("tp",)),
            ("SearchSpace tp '2'", "from tpsim.search import SearchSpace\nSearchSpace(tp='2')", ("tp",)),
            ("SearchSpace vpp 2^40", "from tpsim.search import SearchSpace\nSearchSpace(vpp=(2**40,))", ("vpp",)),
            ("SearchSpace micro_batch (True,)", "from tpsim.search import SearchSpace\nSearchSpace(micro_batch=(True,))",
             ("micro",)),
            ("fit_runs None", "from tpsim.runfit import fit_runs\nfit_runs(None)", ("runs",)),
            ("fit_runs []", "from tpsim.runfit import fit_runs\nfit_runs([])", ("runs",)),
            ("fit_runs [1, 2]", "from tpsim.runfit import fit_runs\nfit_runs([1, 2])", ("run",)),
            ("compute_calibration nan", "from tpsim.runfit import compute_calibration\n"
                                        "compute_calibration({'gemm_scale': float('nan')})", ("gemm_scale",)),
            ("compute_calibration None", "from tpsim.runfit import compute_calibration\ncompute_calibration(None)",
             ("values",)),
            ("compute_calibration unknown", "from tpsim.runfit import compute_calibration\n"
                                            "compute_calibration({'warp_drive': 1.0})", ("warp_drive",)),
            ("load_calibration None", "from tpsim.calibration import load_calibration\nload_calibration(None)",
             ("calibration",)),
            ("load_calibration /dev/zero", "from tpsim.calibration import load_calibration\n"
                                           "load_calibration('/dev/zero')", ("zero",)),
    ):
        lenient = name.endswith(("8.0", "np.float64", "vpp 2^40"))  # an integral float is the integer (a right result)
        api(name, "    " + call.replace("\n", "\n    "), mention, expect="any" if lenient else "refuse")
    for name, body in (
            ("make_plan numpy ints", "p = tpsim.make_plan(_m(), np.int64(8), tp=np.int32(2))\n"
                                     "if p.tp != 2 or type(p.tp) is not int: wrong(p)"),
            ("load_cluster numpy gpus", "c = tpsim.load_cluster('dgx-h100', gpus=np.int64(16))\n"
                                        "if c.num_gpus != 16: wrong(c.num_gpus)"),
            ("estimate finite", "e = tpsim.estimate(_m(), _c(), tpsim.make_plan(_m(), 8, tp=8))\n"
                                "import math\nif not (0 < e.step_time_s < 1e6): wrong(e.step_time_s)"),
            ("estimate_batch matches estimate", "from tpsim.plan import PlanBatch\np = tpsim.make_plan(_m(), 8, tp=8)\n"
             "b = tpsim.estimate_batch(_m(), _c(), PlanBatch.from_plans([p]))\ne = tpsim.estimate(_m(), _c(), p)\n"
             "import numpy\nv = float(numpy.asarray(b.step_time_s).ravel()[0])\n"
             "if abs(v - e.step_time_s) > 1e-6 * e.step_time_s: wrong((v, e.step_time_s))"),
    ):
        api(name, "    " + body.replace("\n", "\n    "), expect="ok")
    # ---- config.json, new shapes
    est = ("--cluster", "dgx-h100", "--gpus", "8", "--tp", "8", "--global-batch", "64", "--micro-batch", "1")
    for name, text, mention in (
            ("hidden true", _hf(hidden_size=True), ("hidden",)),
            ("hidden '1024'", _hf(hidden_size="1024"), ("hidden",)),
            ("heads 0", _hf(num_attention_heads=0), ("heads",)),
            ("heads do not divide", _hf(num_attention_heads=7), ("heads",)),
            ("kv heads above heads", _hf(num_key_value_heads=16), ("kv", "heads")),
            ("vocab -1", _hf(vocab_size=-1), ("vocab",)),
            ("positions 2^62", _hf(max_position_embeddings=1 << 62), ("position",)),
            ("rope_scaling list", _hf(rope_scaling=[1, 2]), ("rope",)),
            ("layers 1.5", _hf(num_hidden_layers=1.5), ("layers",)),
            ("tie 'yes'", _hf(tie_word_embeddings="yes"), ("tie",)),
            ("dtype float128", _hf(torch_dtype="float128"), ("dtype",)),
            ("model_type ''", _hf(model_type=""), ("model_type",)),
            ("nested duplicate key", _hf(rope_scaling={"type": "linear", "factor": 2.0}).replace(
                '"factor": 2.0', '"factor": 2.0, "factor": 4.0'), ("factor", "twice")),
            ("trailing garbage", _hf() + "garbage", ("config.json",)),
            ("two documents", _hf() + _hf(), ("config.json",)),
            ("top-level array", "[" + _hf() + "]", ("config.json",)),
            ("3 MB", json.dumps({**HF_LLAMA, "pad": "x" * (3 << 20)}), ("config.json", "MB", "bytes")),
            ("100k-element list", _hf(architectures=["LlamaForCausalLM"] * 100_000), ("config.json",)),
            ("key with NUL", _hf(**{"a\u0000b": 1}), ("config.json",)),
            ("hidden 1e3 float", _hf().replace('"hidden_size": 1024', '"hidden_size": 1.024e3'), ("hidden",)),
    ):
        add("config", f"model show config {name}", ("model", "show", "{d}/config.json"), mention,
            expect="any" if name in ("100k-element list", "key with NUL", "hidden 1e3 float", "dtype float128")
            else "refuse",
            files={"config.json": text})
    add("config", "estimate config UTF-16", ("estimate", "--model", "{d}/config.json", *est), ("config.json",),
        files={"config.json": _hf().encode("utf-16")})
    add("config", "estimate config latin-1", ("estimate", "--model", "{d}/config.json", *est), ("config.json",),
        files={"config.json": _hf(name="caf\u00e9").encode("latin-1")})
    add("config", "estimate config 600 kB of many keys", ("estimate", "--model", "{d}/config.json", *est),
        ("config.json",), expect="any",
        files={"config.json": json.dumps({**HF_LLAMA, **{f"x{i}": i for i in range(40_000)}})})
    # ---- ops.json
    graph = json.loads(_read("tests/data/opgraph/tiny-gpt.ops.json"))

    def gtext(edit: Callable[[dict], None]) -> str:
        doc = json.loads(json.dumps(graph))
        edit(doc)
        return json.dumps(doc)
    plan_g = ("estimate", "--model", "{d}/g.ops.json", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "1",
              "--global-batch", "8", "--micro-batch", "1")
    for name, edit in (
            ("dtype int3", lambda d: d["units"][0]["ops"][0].__setitem__("dtype", "int3")),
            ("ops a dict", lambda d: d["units"][0].__setitem__("ops", {"a": 1})),
            ("repeat -1", lambda d: d["units"][0].__setitem__("repeat", -1)),
            ("repeat '2'", lambda d: d["units"][0].__setitem__("repeat", "2")),
            ("repeat true", lambda d: d["units"][0].__setitem__("repeat", True)),
            ("units missing", lambda d: d.pop("units")),
            ("units a string", lambda d: d.__setitem__("units", "all")),
            ("attrs a list", lambda d: d["units"][1]["ops"][1].__setitem__("attrs", [1, 2])),
            ("bytes nan-like string", lambda d: d["units"][0]["ops"][0].__setitem__("bytes", "NaN")),
            ("flops true", lambda d: d["units"][0]["ops"][0].__setitem__("flops", True)),
            ("op name 200 kB", lambda d: d["units"][0]["ops"][0].__setitem__("name", "n" * 200_000)),
            ("top level list", lambda d: d.clear()),
    ):
        text = gtext(edit) if name != "top level list" else "[" + gtext(lambda d: None) + "]"
        add("ops", f"ops.json {name}", plan_g, ("g.ops.json",), files={"g.ops.json": text},
            expect="any" if name in ("op name 200 kB", "dtype int3") else "refuse")  # an op's extra key: ignored
    add("ops", "ops.json 6k units (21 MB)", plan_g, ("g.ops.json", "units", "nodes"), expect="any",
        files={"g.ops.json": gtext(lambda d: d.__setitem__("units", d["units"] * 2_000))}, timeout=60)
    add("ops", "validate ops.json without --module-spec", ("validate", "--model", "{d}/g.ops.json", "--tp", "2"),
        ("module-spec", "module_spec"), files={"g.ops.json": gtext(
            lambda d: d.setdefault("source", {}).__setitem__("module_spec", "os:system"))})
    # ---- stack, calibration and cluster YAML
    stack = _read("tpsim/data/stacks/megatron.yaml")
    est_m = ("estimate", "--model", "llama3-8b", *est)
    for name, text in (
            ("duplicate key", stack.replace("name: megatron", "name: megatron\nname: other", 1)),
            ("tab indentation", stack.replace("\n  ", "\n\t", 3)),
            ("python object tag", stack.replace("name: megatron", "name: !!python/object/apply:os.system [id]", 1)),
            ("date value", stack.replace("value: 42", "value: 2024-01-01", 1)),
            ("name null", stack.replace("name: megatron", "name: null", 1)),
            ("merge key", "base: &b {value: 1}\n" + stack.replace("value: 42", "<<: *b", 1)),
            ("octal 0o17", stack.replace("value: 42", "value: 0o17", 1)),
            ("value .inf", stack.replace("value: 42", "value: .inf", 1)),
            ("5 MB", stack + "#" * (5 << 20) + "\n"),
            ("binary", "\x00\x01\x02" * 100),
    ):
        add("stack", f"stack {name}", (*est_m, "--stack", "{d}/s.yaml"), ("s.yaml",), files={"s.yaml": text},
            expect="any" if name in ("merge key", "octal 0o17") else "refuse")
    for name, text in (
            ("python name tag", "nvlink: !!python/name:os.system {}\n"),
            ("efficiency '.5'", "nvlink: {efficiency: '.5'}\n"), ("efficiency -0.5", "nvlink: {efficiency: -0.5}\n"),
            ("100 deep", "a: " + "[" * 100 + "]" * 100 + "\n"),
            ("10k keys", "".join(f"k{i}: {{efficiency: 0.5}}\n" for i in range(10_000))),
            ("latency huge", "nvlink: {latency_us: 1.0e300}\n"), ("top list", "- 1\n- 2\n"),
            ("unknown link", "warp: {efficiency: 0.5}\n"),
    ):
        add("calibration", f"calibration {name}", (*est_m, "--calibration", "{d}/cal.yaml"), ("cal.yaml",),
            files={"cal.yaml": text})
    for name, text in (
            ("gpus 1.5", CLUSTER.replace("gpus: 16", "gpus: 1.5")), ("gpus '16'", CLUSTER.replace("gpus: 16", "gpus: '16'")),
            ("gpus true", CLUSTER.replace("gpus: 16", "gpus: true")), ("device empty", CLUSTER.replace(
                "device: A100-SXM4-80GB", "device: ''")), ("node null", CLUSTER.replace("node: dgx-a100", "node: null")),
            ("fabric nested list", CLUSTER.replace("fabric: selene-hdr-fat-tree", "fabric: [[a]]")),
            ("node a folder", CLUSTER.replace("node: dgx-a100", "node: sub")),
            ("unknown key", CLUSTER + "colour: red\n"), ("5 MB", CLUSTER + "#" * (5 << 20) + "\n"),
            ("gpus_per_node 2^40", CLUSTER + f"gpus_per_node: {1 << 40}\n"),
    ):
        for verb in (("topo", "show", "{d}/c.yaml"), ("estimate", "--model", "llama3-8b", "--cluster", "{d}/c.yaml",
                                                      "--tp", "8", "--global-batch", "64")):
            add("cluster", f"{verb[0]} cluster {name}", verb, ("c.yaml", "sub", "node"), files={"c.yaml": text,
                                                                                              "sub": DIR})
    # ---- profile CSV
    prof = _profile_text()
    lines = prof.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))  # the column header
    meta, head, rows = lines[:at], lines[at], lines[at + 1:]
    prof_body = "\n".join(lines[at:]) + "\n"
    with_meta = lambda body: "\n".join(meta) + "\n" + body  # noqa: E731
    for name, text in (("header only", with_meta(head + "\n")), ("CRLF", prof.replace("\n", "\r\n")),
                       ("BOM", "\ufeff" + prof), ("NUL byte", with_meta(prof_body.replace(",", "\x00,", 1))),
                       ("duplicate header", with_meta(head + "," + head.split(",")[0] + "\n" + "\n".join(rows) + "\n")),
                       ("missing column", with_meta("\n".join(",".join(r.split(",")[1:]) for r in [head, *rows]) + "\n")),
                       ("semicolons", with_meta(prof_body.replace(",", ";"))),
                       ("100k columns", with_meta(head + "," + ",".join(f"c{i}" for i in range(100_000)) + "\n"
                                                  + "\n".join(rows) + "\n")),
                       ("quote unterminated", with_meta(prof_body.replace(",", ',"', 1)))):
        add("profile", f"profile {name}", (*est_m, "--profile", "{d}/p.csv"), ("p.csv",), files={"p.csv": text},
            expect="any" if name in ("CRLF", "BOM") else "refuse")
    # ---- runs CSV: report --runs and calibrate --from-runs
    runs_head = "run_id,model,cluster,gpus,tp,micro_batch,global_batch,step_time_s,source\n"
    good = "r1,llama3-8b,dgx-h100,8,8,1,64,1.5,s\n"
    for name, text in (("header only", runs_head), ("duplicate run_id", runs_head + good + good),
                       ("tp 0", runs_head + good.replace(",8,8,", ",8,0,")),
                       ("gpus not a multiple of tp", runs_head + good.replace(",8,8,", ",12,8,")),
                       ("global batch 2^70", runs_head + good.replace(",64,", f",{1 << 70},")),
                       ("step 0", runs_head + good.replace(",1.5,", ",0,")),
                       ("unterminated quote", runs_head + good.replace("r1", '"r1')),
                       ("binary", "\x00" * 4096), ("model unknown", runs_head + good.replace("llama3-8b", "nope-1b")),
                       ("cluster /dev/zero", runs_head + good.replace("dgx-h100", "/dev/zero"))):
        add("runs", f"report --runs {name}", ("report", "--runs", "{d}/runs.csv", "--out", "{d}/r"),
            ("runs.csv", "nope", "zero"), files={"runs.csv": text}, requires=("--runs",),
            expect="any" if name == "duplicate run_id" else "refuse")
        add("runs", f"calibrate --from-runs {name}", ("calibrate", "--from-runs", "{d}/runs.csv", "--out",
                                                     "{d}/cal.yaml"), ("runs.csv", "nope", "zero", "run"),
            files={"runs.csv": text}, requires=("--from-runs",), expect="any" if name == "duplicate run_id" else "refuse")
    # ---- calibrate --log LOG LAUNCH
    launch = ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
              "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 1024 "
              "--tensor-model-parallel-size 2 --vocab-size 32000\n")
    for name, log, launch_text in (("log empty", "", launch), ("log binary", "\x00\xff" * 1000, launch),
                                   ("log 2 MB one line", "x" * (2 << 20), launch),
                                   ("launch tp 0", "iteration 1/ 10 | elapsed time per iteration (ms): 1500.0\n",
                                    launch.replace("size 2", "size 0")),
                                   ("log elapsed nan", "iteration 1/ 10 | elapsed time per iteration (ms): nan\n",
                                    launch),
                                   ("log elapsed -5", "iteration 1/ 10 | elapsed time per iteration (ms): -5\n",
                                    launch)):
        add("calibrate-log", f"calibrate --log {name}", ("calibrate", "--log", "{d}/train.log", "{d}/train.sh",
                                                          "--out", "{d}/cal.yaml"), ("train.log", "train.sh", "tensor"),
            files={"train.log": log, "train.sh": launch_text}, requires=("--log",))
    add("calibrate-log", "calibrate --log a FIFO", ("calibrate", "--log", "{d}/train.log", "{d}/train.sh"),
        ("train.log",), files={"train.log": FIFO, "train.sh": launch}, requires=("--log",))
    add("calibrate-log", "calibrate --log launch missing", ("calibrate", "--log", "{d}/train.log", "{d}/nope.sh"),
        ("nope.sh",), files={"train.log": "x\n"}, requires=("--log",))
    # ---- design sweeps
    sw = "axes:\n  device: [H100-SXM]\n  gpus: [64]\nmodels: [llama3-8b]\n"
    for name, text in (("gpus strings", sw.replace("gpus: [64]", "gpus: ['64']")), ("axes empty", "axes: {}\nmodels: [llama3-8b]\n"),
                       ("models empty", sw.replace("models: [llama3-8b]", "models: []")),
                       ("unknown axis", sw + "  warp: [1]\n".replace("  warp", "  warp") if False else sw.replace(
                           "axes:\n", "axes:\n  warp: [1]\n")),
                       ("device unknown", sw.replace("H100-SXM", "H900")),
                       ("price negative", sw.replace("gpus: [64]", "gpus: [64]\n  gpu_hour_price: [-1]")),
                       ("tokens 0", sw.replace("models: [llama3-8b]", "models: [{model: llama3-8b, tokens: 0}]")),
                       ("nvlink_domain 0", sw.replace("gpus: [64]", "gpus: [64]\n  nvlink_domain: [0]")),
                       ("name 1 MB", "name: " + "n" * (1 << 20) + "\n" + sw),
                       ("range backwards", sw.replace("gpus: [64]", "gpus: {from: 64, to: 8, step: 8}")),
                       ("gpus bool", sw.replace("gpus: [64]", "gpus: [true]")),
                       ("models a mapping", sw.replace("models: [llama3-8b]", "models: {a: 1}"))):
        add("sweep", f"design {name}", ("design", "{d}/s.yaml", "--out", "{d}/o"), ("s.yaml",), files={"s.yaml": text},
            requires=("--allow-large-sweep",), expect="any" if name == "name 1 MB" else "refuse")
    # ---- train-time and plan --objective
    tt = ("train-time", "--model", "llama3-8b", *est)
    for name, extra, mention in (("--tokens 0", ("--tokens", "0"), ("tokens",)),
                                 ("--tokens -1", ("--tokens", "-1"), ("tokens",)),
                                 ("--tokens nan", ("--tokens", "nan"), ("tokens",)),
                                 ("--tokens 1e400", ("--tokens", "1e400"), ("tokens",)),
                                 ("--reliability /dev/zero", ("--tokens", "1e12", "--reliability", "/dev/zero"),
                                  ("reliability", "zero")),
                                 ("--reliability a folder", ("--tokens", "1e12", "--reliability", "{d}"),
                                  ("reliability", "folder", "directory"))):
        add("train-time", f"train-time {name}", (*tt, *extra), mention)
    for name, text in (("events -1", "components:\n  gpu: {per: gpu, events: -1, units: 10, hours: 100, source: s}\n"),
                       ("per rack", "components:\n  gpu: {per: rack, events: 1, units: 10, hours: 100, source: s}\n"),
                       ("pue 0.5", "energy: {pue: 0.5}\n"), ("mode maybe", "checkpoint: {mode: maybe}\n"),
                       ("unknown key", "colour: red\n"), ("bomb", BILLION_LAUGHS)):
        add("train-time", f"train-time --reliability {name}", (*tt, "--tokens", "1e12", "--reliability", "{d}/r.yaml"),
            ("r.yaml",), files={"r.yaml": text})
    pl = ("plan", *SMALL, "--global-batch", "64")
    for name, extra, mention in (("--objective time-to-train without tokens", ("--objective", "time-to-train"),
                                  ("tokens",)),
                                 ("--objective nope", ("--objective", "nope"), ("objective",)),
                                 ("--objective energy --tokens -5", ("--objective", "energy", "--tokens", "-5"),
                                  ("tokens",)),
                                 ("--top 0", ("--top", "0"), ("top",)), ("--top 2^40", ("--top", str(1 << 40)), ("top",)),
                                 ("--micro-batch 0", ("--micro-batch", "0"), ("micro",)),
                                 ("--pp 2^40", ("--pp", str(1 << 40)), ("pp",)),
                                 ("huge space", ("--full-space", "--gpus", "65536", "--model", "mixtral-8x7b",
                                                 "--micro-batch", *map(str, range(1, 41))), ("allow-large", "plans"))):
        add("plan", f"plan {name}", (*pl, *extra), mention)
    # ---- export --format all: all or nothing
    ex = ("export", "--format", "all", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8",
          "--global-batch", "64", "--micro-batch", "1")
    nothing = lambda run: "data-lost: files written before the refusal" if (run.folder / "o").is_dir() and any(  # noqa: E731
        p.is_file() for p in (run.folder / "o").rglob("*") if p.name != "keep") else None
    add("export", "export all --out is a file", (*ex, "--out", "{d}/o"), ("out", "o"), files={"o": "x"})
    add("export", "export all --out under a file", (*ex, "--out", "{d}/f/o"), ("out", "f"), files={"f": "x"})
    add("export", "export all --out holds files", (*ex, "--out", "{d}/o"), ("out", "force", "exists"),
        files={"o/keep": "precious"}, check=_file_is("o/keep", "precious"), expect="any")  # new files beside it
    add("export", "export all --tp 3", (*ex[:-6], "--tp", "3", "--global-batch", "64", "--micro-batch", "1",
                                        "--out", "{d}/o"), ("tp",), check=nothing)
    add("export", "export all --out /dev/full", (*ex, "--out", "/dev/full"), ("out", "full", "folder", "directory"))
    add("export", "export all --out read-only", (*ex, "--out", "{d}/ro/o"), ("out", "ro", "permission", "writ"),
        files={"ro": READONLY_DIR})
    add("export", "export all ok", (*ex, "--out", "{d}/o"), expect="ok")
    # ---- trace
    tr = ("trace",)
    for name, argv, files, mention in (
            ("module missing", ("nope_module_x:f", "--input-shape", "1,4"), {}, ("nope_module_x",)),
            ("fn missing", ("mod:nope", "--input-shape", "1,4"), {"mod.py": "x = 1\n"}, ("nope", "mod")),
            ("syntax error", ("mod:f", "--input-shape", "1,4"), {"mod.py": "def f(:\n"}, ("mod",)),
            ("sys.exit(3) at import", ("mod:f", "--input-shape", "1,4"), {"mod.py": "import sys\nsys.exit(3)\n"},
             ("mod", "exit")),
            ("raises at import", ("mod:f", "--input-shape", "1,4"), {"mod.py": "raise RuntimeError('boom')\n"},
             ("mod", "boom")),
            ("input-shape 0", ("tpsim.trace.zoo:vit_l16", "--input-shape", "0,3,224,224"), {}, ("input-shape", "shape")),
            ("input-shape 2^40", ("tpsim.trace.zoo:vit_l16", "--input-shape", f"{1 << 40},3,224,224"), {},
             ("input", "element")),
            ("input-shape 9 dims", ("tpsim.trace.zoo:vit_l16", "--input-shape", ",".join(["1"] * 9)), {},
             ("input-shape", "shape", "dim")),
            ("input-shape bad dtype", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224:int3"), {},
             ("dtype", "int3")),
            ("kwarg junk", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--kwarg", "=="), {},
             ("kwarg",)),
            ("timeout 0", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--timeout-s", "0"), {},
             ("timeout",)),
            ("timeout nan", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--timeout-s", "nan"), {},
             ("timeout",)),
            ("memory 0", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--memory-limit-gib", "0"), {},
             ("memory",)),
            ("out in missing folder", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--out",
                                       "{d}/no/such/t.ops.json"), {}, ("out", "no")),
            ("tp-plan /dev/zero", ("tpsim.trace.zoo:vit_l16", "--input-shape", "1,3,224,224", "--tp-plan",
                                   "/dev/zero"), {}, ("tp-plan", "zero")),
            ("spec with spaces", ("a b:c", "--input-shape", "1,4"), {}, ("a b", "module")),
    ):
        argv = tuple(a.replace("mod:", "{d}/mod.py:") for a in argv)
        add("trace", f"trace {name}", (*tr, *argv), mention, files=files, timeout=90,
            expect="any" if name == "out in missing folder" else "refuse")  # its folders are made
    # ---- topo / collective values
    for name, extra, mention in (("--bytes 0", ("--bytes", "0"), ("bytes",)), ("--bytes -1", ("--bytes", "-1"), ("bytes",)),
                                 ("--bytes 1e30", ("--bytes", "1e30"), ("bytes",)),
                                 ("--bytes 2^61", ("--bytes", str(1 << 61)), ("bytes",)),
                                 ("--bytes 1.5", ("--bytes", "1.5"), ("bytes",)),
                                 ("--bytes 10XB", ("--bytes", "10XB"), ("bytes",))):
        add("collective", f"collective {name}", ("collective", "--cluster", "dgx-h100", "--gpus", "8", "--op",
                                                  "all_reduce", *extra), mention)
    add("collective", "collective --op nope", ("collective", "--cluster", "dgx-h100", "--gpus", "8", "--op", "nope",
                                               "--bytes", "1MiB"), ("op",))
    add("collective", "collective --gpus 1", ("collective", "--cluster", "dgx-h100", "--gpus", "1", "--op",
                                              "all_reduce", "--bytes", "1MiB"), ("gpus",), expect="any")
    return c


def all_cases() -> list[Case]:
    cases = _all_cases()
    return [c for c in cases if not (ROOT and UNREADABLE in c.files.values())]


def _all_cases() -> list[Case]:
    return (cli_number_cases() + size_cases() + cli_arg_cases() + empty_result_cases() + file_cases()
            + model_config_cases() + yaml_cases() + profile_csv_cases() + measurement_cases() + resource_cases()
            + output_cases() + interrupt_cases() + cache_cases() + process_cases() + launch_cases() + fresh_cases()
            + wave6_cases())


# ----------------------------------------------------------------------------------------------- running
def _prepare(case: Case, folder: Path, root: Path, env: dict[str, str]) -> None:
    for rel, content in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == DIR:
            path.mkdir()
        elif content == FIFO:
            os.mkfifo(path)
        elif content == UNREADABLE:
            path.write_text("gpus: 8\n")
            path.chmod(0)
        elif content == READONLY_DIR:
            if not ROOT:
                path.mkdir()
                path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(str(content))
    damage = case.env.get("PROBE_CACHE_DAMAGE")
    if damage:
        _prepare_cache(case, folder, root, env, damage)


def _prepare_cache(case: Case, folder: Path, root: Path, env: dict[str, str], damage: str) -> None:
    """Fill the case's cache with one run, write the uncached output as the reference, then damage it."""
    cache = folder / "cache"
    env["TPSIM_CACHE_DIR"] = str(cache)
    argv = [sys.executable, "-m", "tpsim.cli", *case.argv]
    ref = subprocess.run(argv + ["--no-cache"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    (folder / "reference.txt").write_text(ref.stdout)
    subprocess.run(argv, cwd=folder, env=env, capture_output=True, timeout=120)
    entries = sorted(cache.rglob("*.npz")) + sorted(cache.rglob("*.json"))
    npz = [p for p in entries if p.suffix == ".npz"]
    meta = [p for p in entries if p.suffix == ".json"]
    if damage == "truncate-npz" and npz:
        data = npz[0].read_bytes()
        npz[0].write_bytes(data[: len(data) // 2])
    elif damage == "garbage-json" and meta:
        meta[0].write_bytes(b"\x00\xff{not json")
    elif damage == "edit-json" and meta:
        obj = json.loads(meta[0].read_text())
        for key in ("enumerated", "evaluated"):
            if key in obj:
                obj[key] = 7
        meta[0].write_text(json.dumps(obj))
    elif damage == "edit-npz" and npz:
        import numpy as np
        with np.load(npz[0]) as data:
            cols = {k: data[k] for k in data.files}
        for k, v in cols.items():
            if v.dtype.kind == "f":
                cols[k] = v * 0.5
        np.savez(npz[0], **cols)
    elif damage == "swap-entries" and npz:
        # the entry of another search (tp 2 only) copied over this search's entry
        subprocess.run(argv + ["--tp", "2"], cwd=folder, env=env, capture_output=True, timeout=120)
        other = sorted(p for p in cache.rglob("*.npz") if p != npz[0])
        if other:
            shutil.copy(other[0], npz[0])
            shutil.copy(other[0].with_suffix(".json"), npz[0].with_suffix(".json"))
    elif damage == "foreign-files":
        (cache / "plans").mkdir(parents=True, exist_ok=True)
        (cache / "plans" / "zzzz.json").write_text("[]")
        (cache / "plans" / "notes.txt").write_text("mine")
        (cache / "plans" / "sub.json").mkdir()
    elif damage == "cache-dir-is-file":
        shutil.rmtree(cache, ignore_errors=True)
        cache.write_text("not a folder")
    elif damage == "cache-dir-unwritable":
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    elif damage == "empty-files":
        for p in entries:
            p.write_bytes(b"")
    elif damage == "fifo-entry" and npz:
        npz[0].unlink()
        os.mkfifo(npz[0])
    elif damage == "symlink-zero" and npz:
        npz[0].unlink()
        npz[0].symlink_to("/dev/zero")
    elif damage == "symlink-out" and meta:
        outside = folder / "outside.json"
        outside.write_bytes(meta[0].read_bytes())
        meta[0].unlink()
        meta[0].symlink_to(outside)
    elif damage == "dir-entry" and npz:
        npz[0].unlink()
        npz[0].mkdir()
    elif damage == "meta-drop-field" and meta:
        obj = json.loads(meta[0].read_text())
        if isinstance(obj, dict) and obj:
            obj.pop(sorted(obj)[0])
        meta[0].write_text(json.dumps(obj))
    elif damage == "huge-sparse" and npz:
        with open(npz[0], "r+b") as f:
            f.truncate(10 << 30)


def _limits(torch: bool) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (300, 300))
        os.setsid()
        # a probe started in the background inherits SIGINT ignored, and Python then keeps ignoring it:
        # restore the default so that the child installs its KeyboardInterrupt handler as under a terminal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return apply


def _tagged(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of every readable process whose environment holds the marker."""
    found = []
    needle = f"TPSIM_PROBE_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(entry.name), cmd.strip()))
        except OSError:
            continue
    return found


def _substitute(arg: str, case: Case, folder: Path) -> str:
    if ROOT:
        for rel, content in case.files.items():
            if content == READONLY_DIR:
                arg = arg.replace("{d}/" + rel, ROOT_UNWRITABLE)
    return arg.replace("{d}", str(folder))


def run_case(case: Case, root: Path) -> tuple[str, str, Run]:
    folder = Path(tempfile.mkdtemp(prefix="tpsim-probe-"))
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPSIM_", "PYTEST"))}
    env.update(PYTHONPATH=str(root), TPSIM_PROBE_TAG=tag, TPSIM_CACHE_DIR=str(folder / "cache"),
               XDG_CACHE_HOME=str(folder / "xdg"), OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    env.update({k: _substitute(v, case, folder) for k, v in case.env.items() if not k.startswith("PROBE_")})
    try:
        _prepare(case, folder, root, env)
        if case.argv[:1] == ("--api",):  # a Python API case: its code in a fresh interpreter
            argv = [sys.executable, "-c", API_PRELUDE.format(body=_substitute(case.argv[1], case, folder))]
        else:
            argv = [sys.executable, "-m", "tpsim.cli", *(_substitute(a, case, folder) for a in case.argv)]
        torch = case.verb in TORCH_VERBS
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, preexec_fn=_limits(torch))
        out, err, status, rusage, signalled = _communicate(proc, case)
        seconds = time.monotonic() - start
        time.sleep(1.0 if torch or case.kill else 0.1)
        left = _tagged(tag)
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        run = Run(status=status, stdout=out, stderr=err, seconds=seconds,
                  peak_rss=rusage.ru_maxrss * 1024 if rusage else 0, left=tuple(cmd for _, cmd in left),
                  folder=folder, signalled=signalled)
        outcome, detail = classify(case, run)
        return outcome, detail, run
    finally:
        for p in [folder, *folder.rglob("*")]:
            try:
                if p.is_dir() and not p.is_symlink():
                    p.chmod(stat.S_IRWXU)
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)


def _communicate(proc: subprocess.Popen, case: Case):
    """Wait for the child (sending the case's signal on time); (stdout, stderr, status, rusage)."""
    import threading

    chunks: dict[str, list[bytes]] = {"out": [], "err": []}

    def pump(stream, key: str) -> None:
        total = 0
        for block in iter(lambda: stream.read(65536), b""):
            if total < (4 << 20):
                chunks[key].append(block)
            total += len(block)

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + case.timeout
    kill_at = time.monotonic() + case.kill[1] if case.kill else None
    status, rusage, signalled = None, None, False
    while True:
        pid, raw, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status = os.waitstatus_to_exitcode(raw)
            rusage = ru
            proc.returncode = status
            break
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            os.kill(proc.pid, case.kill[0])
            kill_at, signalled = None, True
        if now >= deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            pid, raw, ru = os.wait4(proc.pid, 0)
            rusage = ru
            proc.returncode = -9
            status = None
            break
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=5)
    decode = lambda k: b"".join(chunks[k]).decode(errors="replace")  # noqa: E731
    return decode("out"), decode("err"), status, rusage, signalled


def classify(case: Case, run: Run) -> tuple[str, str]:
    err = run.stderr
    limit = TORCH_MEM_LIMIT if case.verb in TORCH_VERBS else MEM_LIMIT
    if run.status is None:
        return "hang", f"no answer in {case.timeout:g} s"
    killed_by_kernel = run.status in (-9, 137) and not run.signalled  # the OOM killer, or RLIMIT_CPU
    if run.peak_rss > limit or (killed_by_kernel and run.peak_rss > limit // 2) or (
            "MemoryError" in err and "Traceback" in err):
        return "memory", f"peak RSS {run.peak_rss / 2**20:.0f} MB"
    if "Traceback (most recent call last)" in err + run.stdout:
        last = [ln for ln in err.splitlines() if ln.strip()][-1:] or [""]
        return "traceback", last[0][:160]
    if run.left:
        return "process-left", f"{len(run.left)} left: {run.left[0][:120]}"
    if case.check is not None:
        bad = case.check(run)
        if bad:
            outcome, _, detail = bad.partition(": ")
            return outcome, detail
    if case.kill and run.signalled:
        return "clear", f"status {run.status}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    if case.expect == "help":
        helped = "usage:" in (run.stdout + err).lower() and run.status in (0, 2)
        return ("clear", "usage shown") if helped else ("wrong-exit", f"status {run.status}")
    if case.expect == "ok" or (case.expect == "any" and run.status == 0):
        if run.status == 0:
            return "clear", "status 0"
        return "wrong-exit", f"status {run.status}: {(errors or lines or [''])[0][:160]}"
    if run.status == 0:
        return "silently-wrong", "accepted (status 0): " + (run.stdout.strip().splitlines() or [""])[-1][:120]
    if run.status != 2:
        return "wrong-exit", f"status {run.status}: {(errors or lines or [''])[0][:160]}"
    if len(errors) != 1 or len(lines) > 3:
        return "unclear", f"{len(lines)} stderr lines: {(lines or [''])[0][:160]}"
    if case.mention and not any(m.lower() in errors[0].lower() for m in case.mention):
        return "unclear", f"line does not name {case.mention[0]!r}: {errors[0][:160]}"
    return "clear", errors[0][:160]


# ----------------------------------------------------------------------------------------------- report
def summarize(results: Sequence[tuple[Case, str, str, Run]]) -> str:
    cats = sorted({c.category for c, *_ in results}, key=lambda x: [c.category for c, *_ in results].index(x))
    width = max(len(c) for c in cats + ["category"])
    head = f"{'category':<{width}} {'cases':>5} " + " ".join(f"{o:>{max(len(o), 5)}}" for o in OUTCOMES)
    lines = [head]
    total: Counter = Counter()
    for cat in cats + ["all"]:
        counts = Counter(o for c, o, *_ in results if c.category == cat or cat == "all")
        n = sum(counts.values())
        lines.append(f"{cat:<{width}} {n:>5} " + " ".join(f"{counts[o]:>{max(len(o), 5)}}" for o in OUTCOMES))
        if cat == "all":
            total = counts
    n = sum(total.values())
    lines.append(f"\n{total['clear']} of {n} cases clear ({100 * total['clear'] / max(n, 1):.1f}%)")
    return "\n".join(lines)


def _supported(root: Path, cases: Sequence[Case]) -> Callable[[Case], bool]:
    """Whether the checkout offers every flag a case requires (from ``tpsim VERB --help``)."""
    helps: dict[str, str] = {}
    env = dict(os.environ, PYTHONPATH=str(root))
    for verb in {c.verb for c in cases if c.requires}:
        proc = subprocess.run([sys.executable, "-m", "tpsim.cli", verb, "--help"], env=env, capture_output=True,
                              text=True, timeout=120, cwd=tempfile.gettempdir())  # not a folder holding tpsim/
        helps[verb] = proc.stdout if proc.returncode == 0 else ""
    return lambda c: all(flag in helps.get(c.verb, "") for flag in c.requires)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO, help="tpsim source tree to probe (default: this checkout)")
    ap.add_argument("--only", action="append", default=[], help="only cases whose category or name has this text")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--json", type=Path, help="write every outcome to this JSON file")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every outcome, not only the failures")
    args = ap.parse_args(argv)
    cases = [c for c in all_cases() if not args.only or any(o in c.category or o in c.name for o in args.only)]
    supported = _supported(args.root.resolve(), cases)
    skipped = [c for c in cases if not supported(c)]
    cases = [c for c in cases if supported(c)]
    if skipped:
        print(f"skipping {len(skipped)} cases of features this checkout lacks", file=sys.stderr)
    if args.list:
        for c in cases:
            print(f"{c.category:<14} {c.name}")
        print(f"{len(cases)} cases")
        return 0
    root = args.root.resolve()
    print(f"probing {root} with {len(cases)} cases ({args.jobs} at a time)", file=sys.stderr)
    results: list[tuple[Case, str, str, Run]] = []
    # slow cases (signals, torch verbs) first so that the pool stays busy
    order = sorted(cases, key=lambda c: (c.kill is None, c.verb not in TORCH_VERBS))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_case, c, root): c for c in order}
        for done, fut in enumerate(futures, 1):
            case = futures[fut]
            outcome, detail, run = fut.result()
            results.append((case, outcome, detail, run))
            if args.verbose or outcome != "clear":
                print(f"[{done:3d}/{len(cases)}] {outcome:<14} {case.category:<13} {case.name}: {detail} "
                      f"({run.seconds:.1f} s, {run.peak_rss / 2**20:.0f} MB)", file=sys.stderr)
    results.sort(key=lambda r: cases.index(r[0]))
    print(summarize(results))
    if args.json:
        args.json.write_text(json.dumps([
            {"category": c.category, "name": c.name, "argv": list(c.argv), "outcome": o, "detail": d,
             "status": r.status, "seconds": round(r.seconds, 2), "peak_rss_mb": round(r.peak_rss / 2**20),
             "stderr_tail": r.stderr[-600:]} for c, o, d, r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
