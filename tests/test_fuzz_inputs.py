"""Issue 13 fuzz suite: generated CLI argument vectors, model config JSON, topology YAML and kernel-profile CSV.

Whatever the input, ``tpsim`` answers with exit status 0 or 2 (2: exactly one line on stderr), never an
exception out of :func:`tpsim.cli.main` (a traceback), within a bounded time (a SIGALRM watchdog turns a hang
into a failure) and bounded memory (tracemalloc peak). In-process for speed, plus a few runs in subprocesses
with an address-space limit. Derandomized (the same examples every run); the whole file runs in well under a
minute on one core.
"""

import json
import math
import resource
import signal
import subprocess
import sys
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.cli import main
from tpsim.topology import clear_cache

ROOT = Path(__file__).resolve().parents[1]
WATCHDOG_S = 30
"""no single example may run longer (a hang fails the test instead of stalling the suite)."""
MAX_PEAK_BYTES = 256 << 20
"""memory an example may allocate (tracemalloc peak; numpy arrays included)."""

FUZZ = settings(derandomize=True, deadline=None, max_examples=30, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ----------------------------------------------------------------------------------------------- values
HUGE_INT = 10 ** 400
HOSTILE_SCALARS = st.one_of(
    st.integers(min_value=-3, max_value=64), st.sampled_from([0, -1, 2**31, 2**63, 2**64 + 1, HUGE_INT]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e30, 0.5, -0.0, 8.0]),
    st.booleans(), st.none(), st.text(max_size=12), st.sampled_from(["8", "", "nan", "1e3", "0x10", "∞"]))
HOSTILE = st.recursive(HOSTILE_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=3)), max_leaves=6)
NUMBER_TEXT = st.one_of(
    st.integers(min_value=-5, max_value=70).map(str),
    st.sampled_from(["0", "-1", "1e3", "2.5", "nan", "inf", "-inf", "", " ", "0x10", "9" * 400, "1e30",
                     str(2**63), "١٢", "8_0", "+4", "1.5GiB", "4K", "64KiB", "9007199254740993"]))


@contextmanager
def bounded(what: str):
    """Fail (instead of hanging or swelling) when one example runs too long or allocates too much."""
    def alarm(signum, frame):
        raise TimeoutError(f"{what}: no answer in {WATCHDOG_S} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(WATCHDOG_S)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < MAX_PEAK_BYTES, f"{what}: allocated {peak / 2**20:.0f} MB"
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """One CLI call: status 0 or 2, and 2 means exactly one line on stderr; returns (status, stdout, stderr)."""
    clear_cache()
    with bounded(" ".join(argv)[:200]):
        code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("tpsim"), (argv, err)
    return code, out, err


# ----------------------------------------------------------------------------------------------- CLI vectors
VERBS = {
    "estimate": (["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100"],
                 ["--gpus", "--tp", "--pp", "--vpp", "--micro-batch", "--global-batch", "--layers", "--seq-len",
                  "--zero", "--order"]),
    "plan": (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--no-progress",
              "--no-cache", "--vpp", "1", "--zero", "1", "--recompute", "selective"],
             ["--tp", "--pp", "--micro-batch", "--global-batch", "--top", "--max-tp", "--mem-limit-gib",
              "--gpu-hour-price"]),
    "collective": (["collective", "--cluster", "dgx-a100"],
                   ["--gpus", "--bytes", "--ranks", "--op", "--algo", "--group", "--plan"]),
    "topo": (["topo", "show", "pcie-8gpu"], ["--gpus"]),
    "bench-collectives": (["bench-collectives", "--out", "/etc/hostname/x.csv"],
                          ["--nproc", "--iters", "--warmup", "--timeout", "--sizes"]),
    "profile": (["profile", "--out", "/etc/hostname/x.csv"], ["--threads", "--max-kernel-s", "--redo-noisy"]),
}


@st.composite
def argv_vectors(draw):
    verb = draw(st.sampled_from(sorted(VERBS)))
    base, flags = VERBS[verb]
    argv = list(base)
    for flag in draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3, unique=True)):
        argv += [flag, draw(NUMBER_TEXT)]
    return argv


@FUZZ
@given(argv=argv_vectors())
def test_fuzz_cli_arguments(capsys, argv):
    run_cli(argv, capsys)


# ----------------------------------------------------------------------------------------------- config JSON
HF_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "max_position_embeddings", "tie_word_embeddings", "head_dim", "model_type")
BASE_CONFIG = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000,
               "max_position_embeddings": 2048}


def _json_text(cfg) -> str:
    # NaN/Infinity literals and 400-digit numbers are what hostile files hold; json.dumps writes them
    return json.dumps(cfg, allow_nan=True)


@st.composite
def config_texts(draw):
    kind = draw(st.sampled_from(["edit", "edit", "edit", "raw", "nest"]))
    if kind == "raw":
        return draw(st.one_of(st.text(max_size=40), st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
    if kind == "nest":
        depth = draw(st.sampled_from([10, 100, 5000, 200_000]))
        return '{"a": ' + "[" * depth + "]" * depth + "}"
    cfg = dict(BASE_CONFIG)
    for key in draw(st.lists(st.sampled_from(HF_KEYS), min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()):
            cfg[key] = draw(HOSTILE)
        else:
            cfg.pop(key, None)
    return _json_text(cfg)


@FUZZ
@given(text=config_texts())
def test_fuzz_model_config(capsys, tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text, errors="surrogatepass")
    run_cli(["estimate", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8", "--tp", "1",
             "--global-batch", "8"], capsys)


# ----------------------------------------------------------------------------------------------- topology YAML
CLUSTER = {"name": "fuzz", "node": "pcie-8gpu", "fabric": "none", "device": "A100-SXM4-80GB", "gpus": 8,
           "source": "fuzz"}
CLUSTER_KEYS = ("node", "fabric", "device", "gpus", "gpus_per_node", "defaults", "calibration", "name", "extra")
SAFE_GPU_COUNTS = st.sampled_from([8, 16, 0, -8, 7, 12, 1.5, 8.0, "16", True, None, HUGE_INT, 2**21, 1e12,
                                   math.nan, math.inf, [8], {"a": 1}])
YAML_FRAGMENTS = st.sampled_from([
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)),
    "? [a, b]\n: 1\n", "? {x: 1}\n: 2\n", "a: &a [1, *a]\n", "a: *nowhere\n", "x: !!python/object/apply:os.system [id]\n",
    "gpus: 8\ngpus: 16\n", "---\na: 1\n---\nb: 2\n", "\tgpus: 8\n", "<<: [1, 2]\n", "a: " + "[" * 3000 + "]" * 3000,
    "- 1\n- 2\n", "", "just a string\n", "gpus: .nan\n", "gpus: 0x10\n", "node: {use: x}\n", "fabric: 7\n",
])


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, allow_unicode=True)


@st.composite
def cluster_files(draw):
    if draw(st.integers(0, 3)) == 0:
        return draw(YAML_FRAGMENTS) + draw(st.sampled_from(["", _yaml(CLUSTER)]))
    data = dict(CLUSTER)
    for key in draw(st.lists(st.sampled_from(CLUSTER_KEYS), min_size=1, max_size=3, unique=True)):
        if key in ("gpus", "gpus_per_node"):
            value = draw(SAFE_GPU_COUNTS)
        elif key == "node":
            value = draw(st.one_of(st.sampled_from(["pcie-8gpu", "dgx-a100", "nope", "../x.yaml", ""]), HOSTILE))
        else:
            value = draw(HOSTILE)
        if draw(st.booleans()):
            data[key] = value
        else:
            data.pop(key, None)
    try:
        return _yaml(data)
    except (ValueError, TypeError, OverflowError):
        return str(data)


@FUZZ
@given(text=cluster_files())
def test_fuzz_topology_yaml(capsys, tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    run_cli(["topo", "show", str(path)], capsys)


@st.composite
def node_files(draw):
    devices = {"gpu": {"kind": "gpu", "count": draw(st.one_of(st.sampled_from([8, 4]), SAFE_GPU_COUNTS))},
               "sw": {"kind": draw(st.sampled_from(["nvswitch", "switch", "gpu", "warp"])),
                      "count": draw(st.one_of(st.integers(1, 4), SAFE_GPU_COUNTS))}}
    link = {"a": draw(st.sampled_from(["gpu", "gpu[0-3]", "gpu[7-99]", "sw", "nope[1]", "gpu[" + "9" * 50 + "]"])),
            "b": "sw", "link": draw(st.sampled_from(["nvlink3", "warp"])),
            "lanes": draw(st.one_of(st.integers(1, 12), SAFE_GPU_COUNTS)),
            "pattern": draw(st.sampled_from(["all", "block", "weird"]))}
    return _yaml({"name": "n", "source": "fuzz", "devices": devices, "links": [link]})


@FUZZ
@given(text=node_files())
def test_fuzz_node_templates(capsys, tmp_path, text):
    (tmp_path / "n.yaml").write_text(text)
    (tmp_path / "c.yaml").write_text(_yaml(dict(CLUSTER, node="n.yaml", gpus_per_node=8)))
    run_cli(["topo", "show", str(tmp_path / "c.yaml")], capsys)


# ----------------------------------------------------------------------------------------------- profile CSV
PROFILE_LINES = (ROOT / "profiles" / "cpu-reference-1t.csv").read_text().splitlines(keepends=True)
HEADER_END = next(i for i, line in enumerate(PROFILE_LINES) if not line.startswith("#")) + 1
SMALL_PROFILE = PROFILE_LINES[:HEADER_END] + PROFILE_LINES[HEADER_END:HEADER_END + 120]
CELLS = st.sampled_from(["", "nan", "inf", "-1", "0", "1e30", "9" * 400, "x", "gemm", "conv", "fp8", "bwd",
                         "1.5", "١", "\x00", "1e-300"])


@st.composite
def profile_texts(draw):
    lines = list(SMALL_PROFILE)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["cell", "cell", "truncate", "drop", "insert", "header"]))
        i = draw(st.integers(0, len(lines) - 1))
        if action == "cell" and not lines[i].startswith("#"):
            cells = lines[i].rstrip("\n").split(",")
            cells[draw(st.integers(0, len(cells) - 1))] = draw(CELLS)
            lines[i] = ",".join(cells) + "\n"
        elif action == "truncate":
            text = "".join(lines)
            return text[: draw(st.integers(0, len(text)))]
        elif action == "drop":
            del lines[i]
        elif action == "insert":
            lines.insert(i, draw(st.text(max_size=30)) + "\n")
        elif action == "header" and lines[i].startswith("#"):
            lines[i] = "# " + draw(st.sampled_from(["format_version", "threads", "device"])) + ": " + draw(CELLS) + "\n"
    return "".join(lines)


@settings(FUZZ, max_examples=20)
@given(text=profile_texts())
def test_fuzz_profile_csv(capsys, tmp_path, text):
    path = tmp_path / "p.csv"
    path.write_text(text, errors="surrogatepass")
    run_cli(["profile", "--check", str(path)], capsys)


# ----------------------------------------------------------------------------------------------- subprocesses
SUBPROCESS = settings(derandomize=True, deadline=None, max_examples=4, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SUBPROCESS
@given(text=st.one_of(cluster_files(), YAML_FRAGMENTS))
def test_fuzz_yaml_end_to_end_with_a_memory_limit(tmp_path, text):
    """The real process, with its address space capped at 2 GiB: no traceback, status 0 or 2, no hang."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    limit = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
             "from tpsim.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", limit, "topo", "show", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert usage < 1 << 21  # KiB: no child of this test grew past 2 GiB


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("TPSIM_CACHE_DIR", "off")
