"""Launch files checked by the frameworks themselves (issue 25), on sampled dense, mixture-of-experts and
long-context plans:

* Megatron-LM and Megatron-DeepSpeed ship their argument parsers in no package: an argparse parser is built from
  the table of each parser's argument names, types and choices read at a named commit
  (tests/data/megatron_lm_arguments_000c4ac2.tsv, tests/data/megatron_deepspeed_arguments.tsv, with DeepSpeed's
  own ``add_config_arguments`` when DeepSpeed is installed), and every exported command line must parse with it;
* DeepSpeed's ``DeepSpeedConfig`` accepts ``ds_config.json`` (and refuses a wrong batch), its launcher reads the
  hostfile;
* torchtitan's ``ConfigManager`` loads the TOML (torchtitan 0.2.2, the last release with TOML job configs);
* the Megatron-Bridge recipe's keywords and fields are fields of the installed megatron-bridge / megatron-core
  dataclasses (read from the packages' source), and, where ``megatron.bridge`` imports (it needs Transformer
  Engine: a GPU machine), the recipe builds its ``ConfigContainer``.

Each framework test skips with the reason when its package is not installed (``pip install -e '.[frameworks]'``;
docs/EXPORT.md says which versions).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from tpsim.launch import export_context, export_plan, export_violation, import_launch, resolve_model, resolve_plan
from tpsim.launch import megatron as megatron_launch
from tpsim.launch import write_files
from tpsim.model import load_model, with_overrides
from tpsim.plan import make_plan
from tpsim.topology import load_cluster

DATA = Path(__file__).resolve().parent / "data"


# ---- sampled plans: dense, mixture of experts, long context -----------------------------------------------------
def _case(name, gpus, seq=None, **fields):
    model = load_model(name)
    if seq:
        model = with_overrides(model, seq_len=seq)
    if name == "deepseek-v3":
        model = dataclasses.replace(model, mtp_layers=0)
    return pytest.param(model, gpus, fields, id=f"{name}-{gpus}-" + "-".join(f"{k}{v}" for k, v in fields.items()))


CASES = [
    _case("llama3-70b", 64, tp=8, pp=4, vpp=2, sp=True, zero=1, recompute="selective"),
    _case("llama3-70b", 64, tp=8, pp=1, sp=True, zero=3, recompute="full"),
    _case("llama3-70b", 64, tp=8, pp=4, sp=True, zero=1, tp_overlap=True, pp_first=19, pp_last=19),
    _case("gpt3-175b", 1024, tp=8, pp=16, sp=True, zero=1, recompute="selective", global_batch=1536),
    _case("llama3-8b", 16, tp=2, pp=1, sp=True, zero=2, dtype="fp8"),
    _case("mixtral-8x7b", 64, tp=1, pp=4, ep=8, zero=1),
    _case("deepseek-v3", 256, tp=1, pp=8, ep=32, zero=1, recompute="selective", global_batch=1024),
    _case("llama3-8b", 64, seq=131072, tp=1, sp=False, cp=8, zero=1, global_batch=64),
    _case("llama3-8b", 64, seq=131072, tp=1, sp=False, cp=8, cp_kind="a2a", zero=0, global_batch=64),
    _case("llama3-70b", 64, tp=8, pp=4, vpp=2, sp=True, zero=2, recompute="selective"),
    _case("llama3-70b", 64, tp=8, pp=1, sp=True, zero=3, tp_overlap=True),
    _case("llama3-70b", 64, tp=8, pp=2, sp=True, zero=1, recompute="full"),
    _case("llama3-8b", 16, tp=2, pp=1, sp=True, zero=3),
    _case("llama3-8b", 64, seq=131072, tp=1, sp=False, cp=8, zero=2, global_batch=64),
    _case("llama3-8b", 64, seq=131072, tp=1, sp=False, cp=8, cp_kind="a2a", zero=2, global_batch=64),
    _case("deepseek-v3", 256, tp=1, pp=1, ep=16, zero=3, recompute="selective", global_batch=1024),
    _case("llama3-70b", 64, tp=8, pp=4, vpp=2, sp=True, zero=2, schedule="zbv"),
    _case("llama3-70b", 64, tp=8, pp=4, vpp=2, sp=True, zero=2, schedule="interleaved-zb"),
    _case("llama3-70b", 64, tp=8, pp=4, sp=True, zero=2, schedule="gpipe"),
]
H100 = "dgx-h100"


def _exports(fmt, model, gpus, fields):
    """(plan, files) of the format for a case, or None when the format cannot run the plan (refused with a rule,
    checked elsewhere)."""
    fields = dict(fields)
    cluster = load_cluster(H100, gpus=gpus)
    plan = make_plan(model, gpus, global_batch=fields.pop("global_batch", 512), **fields)
    ctx = export_context(model, cluster, plan, model_ref=model.name, cluster_ref=H100)
    if export_violation(fmt, ctx):
        return None
    return plan, export_plan(fmt, ctx)


def _all(fmt):
    out = [(p.values, _exports(fmt, *p.values)) for p in CASES]
    return [(v, e) for v, e in out if e is not None]


# ---- argument tables -> argparse ---------------------------------------------------------------------------------
class Refused(Exception):
    pass


class TableParser(argparse.ArgumentParser):
    def error(self, message):  # type: ignore[override]
        raise Refused(message)


def moe_freq(text: str):
    """Megatron's --moe-layer-freq values: an integer, or a list expression of digits, brackets, + and *."""
    if text.isdigit():
        return int(text)
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise argparse.ArgumentTypeError(f"invalid pattern {text!r}")
    return text


def table_rows(*names: str) -> list[tuple[str, str, list[str]]]:
    rows = []
    for name in names:
        for line in (DATA / name).read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            cells = line.split("\t")
            rows.append((cells[0], cells[1], cells[2].split(",") if len(cells) > 2 else []))
    return rows


def table_parser(*names: str, deepspeed_own: bool = False) -> argparse.ArgumentParser:
    p = TableParser(allow_abbrev=False, conflict_handler="resolve", add_help=False)
    kinds = {"int": int, "float": float, "str": str, "moe_freq": moe_freq}
    for flag, kind, choices in table_rows(*names):
        if kind == "flag":
            p.add_argument(flag, action="store_true")
        elif kind == "list":
            p.add_argument(flag, nargs="+", type=str)
        elif kind == "choice":
            p.add_argument(flag, type=str, choices=choices)
        else:
            p.add_argument(flag, type=kinds[kind])
    if deepspeed_own:
        import deepspeed

        deepspeed.add_config_arguments(p)   # DeepSpeed's own --deepspeed / --deepspeed_config
    return p


def command_args(script: str) -> list[str]:
    """The arguments after the training script of an exported launch script (line continuations joined)."""
    body = script.split("pretrain_gpt.py", 1)[1].replace("\\\n", " ")
    return [w for w in shlex.split(body, comments=False) if w != "$@"]


def test_tables_cover_every_flag_the_exports_write_and_the_import_reads():
    lm = {r[0] for r in table_rows("megatron_lm_arguments_000c4ac2.tsv")}
    ds = {r[0] for r in table_rows("megatron_deepspeed_arguments.tsv")}
    known_elsewhere = {"--use-flash-attn-v2", "--zero-stage", "--ds-sequence-parallel-size", "--deepspeed",
                       "--deepspeed_config", "--deepspeed-config", "--no-pipeline-parallel",
                       "--deepspeed-activation-checkpointing", "--num-key-value-heads",
                       "--rotary-position-embeddings-theta", "--enable-zbh1-pipeline"}
    newer = set(megatron_launch.NEWER_FLAGS)  # read, but newer than the tables' pinned commit (documented there)
    assert not newer & lm
    assert megatron_launch.KNOWN_FLAGS - lm - ds <= {"--deepspeed-config"} | newer, \
        megatron_launch.KNOWN_FLAGS - lm - ds
    assert ds <= known_elsewhere | lm
    names = {line.strip() for line in (DATA / "megatron_args_000c4ac2.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert lm <= names, lm - names  # every typed row is a name read from the same commit


@pytest.mark.parametrize("model,gpus,fields", [p.values for p in CASES], ids=[p.id for p in CASES])
def test_megatron_lm_arguments_parse_with_the_parser_table(model, gpus, fields):
    got = _exports("megatron", model, gpus, fields)
    if got is None:
        pytest.skip("the Megatron stack refuses this plan (tested in test_export.py)")
    plan, files = got
    parser = table_parser("megatron_lm_arguments_000c4ac2.tsv")
    args = parser.parse_args(command_args(files["megatron_args.sh"]))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    assert args.micro_batch_size == plan.micro_batch and args.global_batch_size == plan.global_batch
    assert args.sequence_parallel == plan.sp and args.tp_comm_overlap == plan.tp_overlap
    assert (args.decoder_first_pipeline_num_layers or 0, args.decoder_last_pipeline_num_layers or 0) == \
        (plan.pp_first, plan.pp_last)
    assert (args.context_parallel_size or 1) == plan.cp
    assert (args.num_experts or 0) == model.num_experts
    assert (args.rotary_base or 0) == model.rotary_base
    with pytest.raises(Refused):   # the table parser refuses what Megatron's would
        parser.parse_args(command_args(files["megatron_args.sh"]) + ["--recompute-granularity", "some"])


@pytest.mark.parametrize("model,gpus,fields", [p.values for p in CASES], ids=[p.id for p in CASES])
def test_megatron_deepspeed_arguments_parse_with_the_parser_table(model, gpus, fields):
    got = _exports("deepspeed", model, gpus, fields)
    if got is None:
        pytest.skip("the DeepSpeed stack or Megatron-DeepSpeed refuses this plan (tested in test_export.py)")
    plan, files = got
    own = importlib.util.find_spec("deepspeed") is not None
    parser = table_parser("megatron_lm_arguments_000c4ac2.tsv", "megatron_deepspeed_arguments.tsv",
                          deepspeed_own=own)
    args = parser.parse_args(command_args(files["megatron_deepspeed_args.sh"]))
    assert args.deepspeed and args.deepspeed_config == "ds_config.json" and args.zero_stage == plan.zero
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    if model.num_kv_heads != model.num_attention_heads:
        assert args.num_key_value_heads == model.num_kv_heads   # Megatron-DeepSpeed's own GQA name
    if model.position == "rotary":
        assert args.use_rotary_position_embeddings and args.rotary_position_embeddings_theta == model.rotary_base
    assert (args.ds_sequence_parallel_size or 1) == plan.cp


# ---- every flag written is read back ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,script", [("megatron", "megatron_args.sh"), ("deepspeed", "megatron_deepspeed_args.sh")])
def test_the_import_reads_every_flag_it_writes(fmt, script, tmp_path):
    for (model, gpus, fields), (plan, files) in _all(fmt):
        flags = {a for a in command_args(files[script]) if a.startswith("--")}
        assert flags <= megatron_launch.KNOWN_FLAGS, sorted(flags - megatron_launch.KNOWN_FLAGS)
        out = tmp_path / f"{model.name}-{gpus}-{len(fields)}-{plan.short().replace(' ', '_')}"
        paths = write_files(files, out)
        imp = import_launch(next(p for p in paths if p.name == script))
        assert not any("flags not used by tpsim" in n for n in imp.notes), imp.notes
        assert resolve_plan(imp, resolve_model(imp), imp.gpus) == plan, plan.short()


def test_flags_the_import_does_not_model_are_listed(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --tp-comm-overlap "
                    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
                    "--max-position-embeddings 2048 --vocab-size 50257 --micro-batch-size 1 --global-batch-size 8 "
                    "--bf16 --use-fancy-kernels --lr 3e-4\n")
    imp = import_launch(path)
    assert imp.plan_fields["tp_overlap"] is True   # --tp-comm-overlap maps to the plan field (T1)
    listed = next(n for n in imp.notes if "not used by tpsim" in n)
    assert "--use-fancy-kernels" in listed and "--lr" in listed and "--tp-comm-overlap" not in listed


# ---- DeepSpeed itself -------------------------------------------------------------------------------------------
def _deepspeed():
    return pytest.importorskip("deepspeed", reason="DeepSpeed not installed (pip install -e '.[frameworks]')")


def test_deepspeed_config_class_accepts_ds_config(monkeypatch):
    _deepspeed()
    from deepspeed.runtime import config as ds_config_module
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)  # no process group in unit tests
    checked = 0
    for (model, gpus, fields), (plan, files) in _all("deepspeed"):
        config = json.loads(files["ds_config.json"])
        mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda dp=plan.dp: dp)   # Megatron's mpu
        c = DeepSpeedConfig(config, mpu=mpu)
        assert c.zero_optimization_stage == plan.zero and c.train_batch_size == plan.global_batch
        assert c.train_micro_batch_size_per_gpu == plan.micro_batch
        assert c.gradient_accumulation_steps == plan.num_microbatches
        assert c.bfloat16_config.enabled == (plan.dtype == "bf16") and c.zero_config.overlap_comm == plan.overlap
        with pytest.raises(AssertionError, match="train_batch_size"):   # DeepSpeed's own batch check bites
            DeepSpeedConfig(dict(config, train_batch_size=plan.global_batch + 1), mpu=mpu)
        checked += 1
    assert checked >= 4


def test_deepspeed_launcher_reads_the_hostfile(tmp_path):
    _deepspeed()
    from deepspeed.launcher.runner import fetch_hostfile

    (model, gpus, fields), (plan, files) = _all("deepspeed")[0]
    assert gpus > 8 and "hostfile" in files
    path = write_files(files, tmp_path)[-1]
    pool = fetch_hostfile(str(path))
    assert len(pool) == gpus // 8 and set(pool.values()) == {8}
    assert '--hostfile "$HOSTFILE"' in files["megatron_deepspeed_args.sh"]


# ---- torchtitan itself ------------------------------------------------------------------------------------------
def _torchtitan_config_manager():
    """torchtitan's ConfigManager from the installed package. torchtitan/__init__.py imports its Float8 and MoE
    kernels (triton: GPU builds only), so the config package is loaded without running that __init__; the
    config manager and JobConfig are torchtitan's own code."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        pytest.skip("torchtitan not installed (pip install -e '.[frameworks]')")
    from importlib import metadata

    version = metadata.version("torchtitan")
    if "torchtitan" not in sys.modules:
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)  # type: ignore[attr-defined]
        package.__spec__ = spec
        sys.modules["torchtitan"] = package
    from torchtitan.config import manager

    if not hasattr(manager.ConfigManager, "_maybe_load_toml"):
        pytest.skip(f"torchtitan {version} has no TOML job configs (0.2.x does)")
    return manager.ConfigManager


def test_torchtitan_config_manager_loads_the_toml(tmp_path):
    ConfigManager = _torchtitan_config_manager()
    checked = 0
    for (model, gpus, fields), (plan, files) in _all("torchtitan"):
        path = write_files(files, tmp_path / f"c{checked}")[0]
        c = ConfigManager().parse_args(["--job.config_file", str(path)])
        par = c.parallelism
        assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == \
            (plan.tp, plan.pp, plan.cp)
        assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == plan.dp
        assert c.training.global_batch_size == plan.global_batch and c.training.seq_len == model.seq_len
        assert par.enable_async_tensor_parallel == plan.tp_overlap
        if plan.pp > 1:
            assert par.pipeline_parallel_schedule == {"zbv": "ZBVZeroBubble", "interleaved-zb": "InterleavedZeroBubble",
                                                      "gpipe": "GPipe"}.get(
                plan.schedule, "Interleaved1F1B" if plan.vpp > 1 else "1F1B")
        imp = import_launch(path)
        assert resolve_plan(imp, resolve_model(imp), imp.gpus) == plan, plan.short()   # round trip, T1 included
        checked += 1
    assert checked >= 7
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("tensor_parallel_degree", "tensor_parallel_degre"))
    with pytest.raises(ValueError, match="Invalid field names"):   # torchtitan refuses keys it does not define
        ConfigManager().parse_args(["--job.config_file", str(bad)])


# ---- Megatron-Bridge --------------------------------------------------------------------------------------------
def _megatron_source() -> Path:
    spec = importlib.util.find_spec("megatron")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    root = next((r for r in roots if (r / "bridge" / "models" / "gpt_provider.py").is_file()
                 and (r / "core" / "transformer" / "transformer_config.py").is_file()), None)
    if root is None:
        pytest.skip("megatron-bridge / megatron-core not installed (pip install --no-deps megatron-core==0.16.1 "
                    "megatron-bridge==0.3.1)")
    return root


def _class_fields(path: Path, name: str) -> set[str]:
    """Annotated fields and properties of class ``name`` in a source file (the package is not imported)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            out = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            out |= {s.name for s in node.body if isinstance(s, ast.FunctionDef)
                    and any(getattr(d, "id", "") == "property" for d in s.decorator_list)}
            return out
    raise AssertionError(f"{name} not in {path}")


def _defines(path: Path, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.parse(path.read_text()).body)


def test_bridge_recipe_uses_fields_of_the_installed_megatron_bridge():
    root = _megatron_source()
    b, c = root / "bridge", root / "core"
    provider = (_class_fields(b / "models" / "gpt_provider.py", "GPTModelProvider")
                | _class_fields(c / "transformer" / "transformer_config.py", "TransformerConfig")
                | _class_fields(c / "model_parallel_config.py", "ModelParallelConfig"))
    cfg = b / "training" / "config.py"
    sections = {
        "train": _class_fields(cfg, "TrainingConfig"),
        "dataset": _class_fields(cfg, "GPTDatasetConfig"),
        "ddp": _class_fields(cfg, "DistributedDataParallelConfig")
        | _class_fields(c / "distributed" / "distributed_data_parallel_config.py", "DistributedDataParallelConfig"),
        "optimizer": _class_fields(cfg, "OptimizerConfig")
        | _class_fields(c / "optimizer" / "optimizer_config.py", "OptimizerConfig")}
    recipes = {n.name for n in ast.parse((b / "training" / "mixed_precision.py").read_text()).body
               if isinstance(n, ast.FunctionDef) and any(getattr(d, "id", "") == "register" for d in n.decorator_list)}
    assert _defines(b / "recipes" / "common.py", "_pretrain_common")
    assert _defines(b / "training" / "pretrain.py", "pretrain") and _defines(b / "training" / "gpt_step.py",
                                                                              "forward_step")
    assert "ConfigContainer" in _class_fields(cfg, "ConfigContainer") or "mixed_precision" in _class_fields(
        cfg, "ConfigContainer")
    checked = 0
    from tpsim.launch.bridge import read_recipe

    for (model, gpus, fields), (plan, files) in _all("bridge"):
        text = files["megatron_bridge_recipe.py"]
        compile(text, "recipe", "exec")
        kwargs, config, _ = read_recipe(Path("recipe.py"), text)
        assert set(kwargs) <= provider, set(kwargs) - provider
        for path, value in config.items():
            if path == ("mixed_precision",):
                assert value is None or value in recipes, value
            else:
                assert path[1] in sections[path[0]], path
        checked += 1
    assert checked >= 5


def test_bridge_recipe_builds_its_config_container(tmp_path):
    try:
        import megatron.bridge  # noqa: F401
    except Exception as exc:  # Transformer Engine (a CUDA build) is imported at package import
        pytest.skip(f"megatron.bridge does not import here ({type(exc).__name__}: {str(exc)[:80]})")
    from megatron.bridge.training.config import ConfigContainer

    for i, ((model, gpus, fields), (plan, files)) in enumerate(_all("bridge")):
        path = write_files(files, tmp_path / f"r{i}")[0]
        spec = importlib.util.spec_from_file_location(f"recipe{i}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cfg = module.pretrain_config()
        assert isinstance(cfg, ConfigContainer)
        assert cfg.model.tensor_model_parallel_size == plan.tp and cfg.train.global_batch_size == plan.global_batch


def test_bridge_round_trip_is_exact(tmp_path):
    checked = 0
    for (model, gpus, fields), (plan, files) in _all("bridge"):
        path = write_files(files, tmp_path / f"b{checked}")[0]
        imp = import_launch(path)
        assert resolve_model(imp) == model
        assert resolve_plan(imp, resolve_model(imp), imp.gpus) == plan, plan.short()
        checked += 1
    assert checked >= 5
