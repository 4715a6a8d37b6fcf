"""Issue 26: the fuzz suite generated from the declared schemas (tpsim/schemas.py).

For every registered format, hostile values are generated from each field's declaration (its kind, its
bounds from tpsim/limits.py, its choices) and put into a valid document of that format, which is written in
the format's own syntax and read by the format's real entry point. Whatever the document, the reader returns
a result or raises one :class:`InputError` line naming the file; it never raises anything else, hangs (a
SIGALRM watchdog) or allocates more than a bound (tracemalloc). And the reader never accepts what the schema
refuses: a field the schema rejects must make the reader fail naming that field.

Two passes per format: every field x every hostile value of its kind (deterministic), and hypothesis
combinations of several fields at once (derandomized, a bounded number of examples per format). A format
registered without an adapter here fails ``test_every_schema_has_an_adapter``: adding a schema adds its fuzzing.
Inputs these tests find are fixed and kept in tests/data/fuzz_corpus/.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
import signal
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpsim.errors import InputError
from tpsim.schema import Field, Schema, check, schemas, walk

ROOT = Path(__file__).resolve().parents[1]
WATCHDOG_S = 20
MAX_PEAK_BYTES = 128 << 20
COMBO_EXAMPLES = 40
"""hypothesis examples per format (several fields changed at once)."""


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("TPSIM_CACHE_DIR", "off")  # thousands of one-off documents: keep the parse cache clean


@contextmanager
def bounded(what: str, trace_memory: bool = True):
    """A watchdog (a hang fails the test) and, with ``trace_memory``, a tracemalloc bound on the peak (the
    single-field pass, thousands of cases, checks the process's peak RSS instead: tracemalloc halves speed)."""
    def alarm(signum, frame):
        raise TimeoutError(f"{what}: no answer in {WATCHDOG_S} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(WATCHDOG_S)
    if trace_memory:
        tracemalloc.start()
    try:
        yield
        if trace_memory:
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < MAX_PEAK_BYTES, f"{what}: allocated {peak / 2**20:.0f} MB"
    finally:
        if trace_memory:
            tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------------------------- hostile values
def hostile_values(spec: Field) -> list[Any]:
    """Values a field of this declaration must refuse (or, for ``any``, survive), derived from it."""
    common: list[Any] = [None, [], {}, "", "\x00", "x" * 5000]
    kind = spec.kind
    if kind == "int":
        low, high = spec.bounds()
        return common + [int(low) - 1, int(high) + 1, -1, 2**63, 10**30, 10**60, 1.5, math.nan, math.inf, True,
                         False, "8", "²", [1]]
    if kind == "float":
        low, high = spec.bounds()
        return common + [float(low) - 1.0, float(high) * 2 + 1, -1.0, math.nan, math.inf, -math.inf, 1e308, True,
                         "1.0", [1.0]]
    if kind == "bool":
        return common + ["true", "false", "yes", 1, 0, 2, [True]]
    if kind == "str":
        return [None, [], {}, 5, True, 1.5, "", "x" * ((spec.max_len or 4096) + 1)]
    if kind == "enum":
        return common + [True, False, 1, -1, 99, "none-of-these", [spec.choices[0]] if spec.choices else []]
    if kind == "list":
        return [None, 5, "x", True, {"a": 1}, [None], [math.nan], ["x" * 10], [[[]]]]
    if kind == "map":
        return [None, 5, "x", True, [1, 2], [], [{"a": 1}]]
    return common + [math.nan, -1, 10**30, True, [[[[]]]], {"k": {"k": {"k": None}}}]


def valid_values(spec: Field) -> st.SearchStrategy:
    kind = spec.kind
    if kind == "int":
        low, high = spec.bounds()
        return st.one_of(st.sampled_from([int(low), int(high)]), st.integers(int(low), min(int(high), int(low) + 64)))
    if kind == "float":
        low, high = spec.bounds()
        return st.floats(float(low), float(high), allow_nan=False, exclude_min=not spec.inclusive)
    if kind == "bool":
        return st.booleans()
    if kind == "enum":
        return st.sampled_from(spec.choices)
    if kind == "str":
        return st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
    return st.sampled_from(hostile_values(spec))


def any_value(spec: Field) -> st.SearchStrategy:
    options = [st.sampled_from(hostile_values(spec)), valid_values(spec)]
    if spec.also:
        options.append(st.sampled_from(spec.also))
    return st.one_of(*options)


# ----------------------------------------------------------------------------------------------- documents
def set_path(doc: Any, path: str, value: Any) -> Any:
    """``doc`` with the field at ``path`` (dots; ``[]``: the first list element) set to ``value``."""
    doc = copy.deepcopy(doc)
    parts = path.split(".")
    node = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        is_list = part.endswith("[]")
        key = part.removesuffix("[]")
        while key.endswith("[]"):
            key = key.removesuffix("[]")
        if not isinstance(node, dict):
            return doc
        if is_list:
            if not isinstance(node.get(key), list) or not node[key]:
                node[key] = [{}]
            if last:
                node[key][0] = value
                return doc
            if not isinstance(node[key][0], dict):
                node[key][0] = {}
            node = node[key][0]
        elif last:
            node[key] = value
        else:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
    return doc


def _toml_value(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        items = [_toml_value(x) for x in v]
        return "[" + ", ".join(x for x in items if x is not None) + "]"
    if isinstance(v, dict):
        items = [(k, _toml_value(x)) for k, x in v.items()]
        return "{" + ", ".join(f"{json.dumps(str(k))} = {x}" for k, x in items if x is not None) + "}"
    return json.dumps(str(v))


def _without_none(v: Any) -> Any:
    """What a TOML file holds of ``v`` (TOML has no null: the writer leaves such keys out)."""
    if isinstance(v, dict):
        return {k: _without_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_none(x) for x in v if x is not None]
    return v


def dump_toml(doc: dict) -> str:
    lines = []
    for key, value in doc.items():
        if not isinstance(value, dict):
            text = _toml_value(value)
            if text is not None:
                lines.append(f"{json.dumps(key)} = {text}")
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{json.dumps(key)}]")
            for k, v in value.items():
                text = _toml_value(v)
                if text is not None:
                    lines.append(f"{json.dumps(str(k))} = {text}")
    return "\n".join(lines) + "\n"


def dump_megatron(flags: dict) -> str:
    words = ["torchrun", "--nproc_per_node", "8", "pretrain_gpt.py"]
    for flag, value in flags.items():
        if value is None:
            words.append(flag)
            continue
        text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        words += [flag, shlex.quote(text) if text else "''"]
    return " ".join(words) + "\n"


def _launch(fmt: str) -> Callable[[Path], Any]:
    def read(path: Path) -> Any:
        from tpsim.launch import import_launch

        return import_launch(path, fmt)
    return read


def _load_yaml(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


@dataclass(frozen=True)
class Adapter:
    """How to fuzz one format: a valid document, how to write it, the file name, the reader."""

    base: Callable[[], Any]
    dump: Callable[[Any], str]
    name: str
    read: Callable[[Path], Any]
    typed: bool = True
    """the file keeps the values' types (JSON, YAML, TOML); False for text formats (a Megatron command line,
    CSV cells) whose reader types the text itself: "8" and 8 are the same there."""


def _stack_read(path: Path) -> Any:
    from tpsim.stacks import load_stack

    return load_stack(path)


def _calibration_read(path: Path) -> Any:
    from tpsim.calibration import load_calibration

    return load_calibration(path)


def _model_read(path: Path) -> Any:
    from tpsim.model import load_model

    return load_model(str(path))


def _graph_read(path: Path) -> Any:
    from tpsim.opgraph.schema import load_opgraph

    return load_opgraph(path)


def _yaml_dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=True)


ADAPTERS: dict[str, Adapter] = {
    "deepspeed": Adapter(lambda: {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                                  "gradient_accumulation_steps": 4,
                                  "zero_optimization": {"stage": 1, "overlap_comm": True}, "bf16": {"enabled": True}},
                         lambda d: json.dumps(d), "ds_config.json", _launch("deepspeed")),
    "nemo": Adapter(lambda: {"trainer": {"devices": 8, "num_nodes": 1, "precision": "bf16-mixed"},
                             "model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                       "micro_batch_size": 1, "global_batch_size": 32, "num_layers": 4,
                                       "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 4,
                                       "encoder_seq_length": 512, "max_position_embeddings": 512}},
                    _yaml_dump, "nemo.yaml", _launch("nemo")),
    "torchtitan": Adapter(lambda: {"parallelism": {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 1,
                                                   "data_parallel_shard_degree": 4},
                                   "training": {"local_batch_size": 2, "seq_len": 512},
                                   "model": {"name": "llama3", "flavor": "8B"},
                                   "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}},
                          dump_toml, "torchtitan.toml", _launch("torchtitan")),
    "megatron": Adapter(lambda: {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2,
                                 "--num-layers": 8, "--hidden-size": 256, "--num-attention-heads": 4,
                                 "--seq-length": 512, "--max-position-embeddings": 512, "--micro-batch-size": 1,
                                 "--global-batch-size": 16},
                        dump_megatron, "train.sh", _launch("megatron"), typed=False),
    "config.json": Adapter(lambda: {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
                                    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
                                    "vocab_size": 1000, "max_position_embeddings": 512},
                           lambda d: json.dumps(d), "config.json", _model_read),
    "ops.json": Adapter(lambda: json.loads((ROOT / "tests/data/opgraph/tiny-gpt.ops.json").read_text()),
                        lambda d: json.dumps(d), "g.ops.json", _graph_read),
    "stack": Adapter(lambda: _load_yaml("tpsim/data/stacks/megatron.yaml"), _yaml_dump, "stack.yaml", _stack_read),
    "calibration": Adapter(lambda: _load_yaml("tpsim/data/calibration/local-cpu.yaml"), _yaml_dump, "cal.yaml",
                           _calibration_read),
}
"""format -> adapter; every registered schema needs one."""


def _reliability_read(path: Path) -> Any:
    from tpsim.train import load_reliability

    return load_reliability(path)


def _cluster_read(path: Path) -> Any:
    from tpsim.topology.spec import load_cluster_spec

    return load_cluster_spec(str(path))


def _node_read(path: Path) -> Any:
    from tpsim.topology.spec import load_node_template

    return load_node_template(str(path))


_PROFILE_HEAD = "".join(line + "\n" for line in (ROOT / "profiles/cpu-reference-1t.csv").read_text().splitlines()
                        if line.startswith("#"))
_PROFILE_COLUMNS = ("kind", "op", "dtype", "pass", "m", "n", "k", "batch_heads", "seq", "head_dim", "numel",
                    "time_s", "reps", "spread_pct")


def _profile_dump(row: dict) -> str:
    cells = ["" if row.get(c) is None else str(row[c]) for c in _PROFILE_COLUMNS]
    return _PROFILE_HEAD + ",".join(_PROFILE_COLUMNS) + "\n" + ",".join(cells) + "\n"


def _profile_read(path: Path) -> Any:
    from tpsim.compute.profile import load_profile

    return load_profile(path)


ADAPTERS["cluster"] = Adapter(
    lambda: {"name": "probe", "node": "dgx-h100", "fabric": "ndr-rail-optimized", "device": "H100-SXM", "gpus": 16,
             "source": "fuzz"}, _yaml_dump, "cluster.yaml", _cluster_read)
ADAPTERS["node template"] = Adapter(lambda: _load_yaml("topologies/nodes/dgx-h100.yaml"), _yaml_dump, "node.yaml",
                                    _node_read)
ADAPTERS["profile"] = Adapter(
    lambda: {"kind": "gemm", "op": "mm", "dtype": "fp32", "pass": "fwd", "m": 64, "n": 64, "k": 64,
             "time_s": 1e-5, "reps": 5, "spread_pct": 1.0}, _profile_dump, "profile.csv", _profile_read, typed=False)
def _runs_dump(row: dict) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf)
    keys = list(row)
    writer.writerow(keys)
    writer.writerow(["" if row[k] is None else json.dumps(row[k]) if isinstance(row[k], (list, dict))
                     else str(row[k]) for k in keys])
    return buf.getvalue()


def _runs_read(path: Path) -> Any:
    from tpsim.runs import load_runs

    return load_runs(path)


ADAPTERS["runs"] = Adapter(
    lambda: {"run_id": "r1", "model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 8, "micro_batch": 1,
             "global_batch": 64, "step_time_s": 1.5, "source": "fuzz"}, _runs_dump, "runs.csv", _runs_read,
    typed=False)
ADAPTERS["reliability"] = Adapter(
    lambda: {"fleet": "llama3-h100", "checkpoint": {"mode": "async", "node_write_GBps": 10.0},
             "restart": {"fixed_s": 600.0, "source": "test"}, "stragglers": {"slowdown": 1.1, "source": "test"},
             "components": {"gpu": {"per": "gpu", "events": 100, "units": 16384, "hours": 1296, "source": "t"}}},
    _yaml_dump, "reliability.yaml", _reliability_read)


def _sweep_read(path: Path) -> Any:
    from tpsim.design.sweep import load_sweep

    return load_sweep(path)


ADAPTERS["sweep"] = Adapter(
    lambda: {"name": "fuzz", "axes": {"device": ["H100-SXM"], "gpus": [64, 128], "fabric": "rail_optimized"},
             "models": [{"model": "llama3-8b", "tokens": 1e12}], "family": {"model": "llama3-8b", "scale": [1, 2]},
             "stack": "megatron", "dtype": "bf16", "objective": "throughput", "skip_impossible": False},
    _yaml_dump, "sweep.yaml", _sweep_read)


def test_every_schema_has_an_adapter():
    missing = sorted(set(schemas()) - set(ADAPTERS))
    assert not missing, f"add a fuzz adapter for {missing} (a base document, a writer, a reader)"


def test_bases_are_accepted(tmp_path):
    for name, adapter in ADAPTERS.items():
        doc = adapter.base()
        if adapter.typed:
            check(schemas()[name], doc, name)
        path = tmp_path / adapter.name
        path.write_text(adapter.dump(doc))
        adapter.read(path)  # a valid document reads without error


def _refused(schema: Schema, doc: Any) -> str | None:
    try:
        check(schema, doc, "doc")
    except InputError as exc:
        return str(exc)
    return None


def _run(fmt: str, doc: Any, folder: Path, changed: list[str], trace_memory: bool = True) -> str | None:
    """Write and read ``doc``: the reader's one-line error, or None when it was accepted. Fails the test on
    anything else (another exception, several lines, a hang, a blow-up, a value the schema refuses accepted)."""
    adapter = ADAPTERS[fmt]
    try:
        text = adapter.dump(doc)
    except (ValueError, TypeError, OverflowError, yaml.YAMLError):
        return "unwritable"  # the format cannot hold this value (TOML has no null, ...): nothing to read
    path = folder / adapter.name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    what = f"{fmt} with {', '.join(changed)}"
    error = None
    with bounded(what, trace_memory):
        try:
            adapter.read(path)
        except InputError as exc:
            error = str(exc)
    if error is not None:
        assert "\n" not in error, (what, error)
        assert str(path) in error or path.name in error, (what, error)  # names the file
    if ADAPTERS[fmt].typed:
        schema_says = _refused(schemas()[fmt], _without_none(doc) if fmt == "torchtitan" else doc)
        if schema_says is not None:
            assert error is not None, f"{what}: accepted, but the schema refuses it ({schema_says})"
    return error


def distinct_fields(schema: Schema) -> list[tuple[str, Field]]:
    """Every (path, field) of ``schema``, a declaration repeated under the same name only once (the
    ``source`` of each of a stack's 40 figures is one declaration: tested at its first place)."""
    seen, out = set(), []
    for path, spec in walk(schema):
        leaf = path.rsplit(".", 1)[-1]
        mark = (leaf, spec.kind, spec.limit, spec.minimum, spec.maximum, spec.choices, spec.also, spec.max_len)
        if spec.kind in ("map", "list") or mark not in seen:
            seen.add(mark)
            out.append((path, spec))
    return out


def _single_field_cases() -> list[tuple[str, str, int]]:
    cases = []
    for fmt, schema in schemas().items():
        for path, spec in distinct_fields(schema):
            for i in range(len(hostile_values(spec))):
                cases.append((fmt, path, i))
    return cases


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
def test_every_field_with_every_hostile_value(fmt, tmp_path):
    """Deterministic: each field of the format's schema, each hostile value of its kind, alone."""
    schema = schemas()[fmt]
    adapter = ADAPTERS[fmt]
    base = adapter.base()
    runs = refused = 0
    rss_before = peak_rss_bytes()
    for path, spec in distinct_fields(schema):
        for value in hostile_values(spec):
            doc = set_path(base, path, value)
            error = _run(fmt, doc, tmp_path, [f"{path}={value!r:.40}"], trace_memory=False)
            runs += 1
            if error is None:
                continue
            refused += 1
            written = _without_none(doc) if fmt == "torchtitan" else doc
            if ADAPTERS[fmt].typed and _refused(schema, written) is not None and "[]" not in path:
                leaf = path.rsplit(".", 1)[-1]
                assert leaf in error, f"{fmt} {path}={value!r:.40}: the error does not name the field: {error}"
    grown = peak_rss_bytes() - rss_before
    assert grown < MAX_PEAK_BYTES, f"{fmt}: the process grew by {grown / 2**20:.0f} MB over the cases"
    assert runs > 0


_COMBO = settings(derandomize=True, deadline=None, max_examples=COMBO_EXAMPLES, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                         HealthCheck.data_too_large])


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
@_COMBO
@given(data=st.data())
def test_fuzz_several_fields_at_once(fmt, tmp_path, data):
    """Hypothesis: one to four fields of the format changed at once, each valid, hostile or an ``also``."""
    schema = schemas()[fmt]
    fields = list(walk(schema))
    picks = data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique_by=lambda f: f[0]))
    doc = ADAPTERS[fmt].base()
    changed = []
    for path, spec in picks:
        value = data.draw(any_value(spec), label=path)
        doc = set_path(doc, path, value)
        changed.append(f"{path}={value!r:.40}")
    _run(fmt, doc, tmp_path, changed)


def test_single_field_case_count():
    """The number of generated single-field cases (reported in the issue note): every field of every format."""
    cases = _single_field_cases()
    per_format = {fmt: sum(1 for c in cases if c[0] == fmt) for fmt in schemas()}
    assert all(n > 0 for n in per_format.values()), per_format
    print(f"\nschema fuzz: {len(cases)} single-field cases over {len(per_format)} formats: {per_format}; "
          f"{COMBO_EXAMPLES} combinations per format")
