"""Launch configs: export a plan as the files a framework runs, and read such files back (issue 14).

Formats (docs/EXPORT.md): ``megatron`` (Megatron-LM / Megatron-Core ``pretrain_gpt.py`` arguments),
``torchtitan`` (TOML job config), ``deepspeed`` (``ds_config.json`` + Megatron-DeepSpeed arguments) and
``nemo`` (NeMo 1.x Megatron GPT YAML) and ``bridge`` (a Megatron-Bridge / NeMo 2 recipe, Python). Each format runs on a training stack (:mod:`tpsim.stacks`); a plan the stack
cannot run is refused with the stack rule's line. Every format module has the same shape: ``export_files(ctx)
-> {file name: text}`` and an import function returning :class:`ImportedLaunch`.

Python API::

    ctx = export_context(model, cluster, plan, model_ref="llama3-70b", cluster_ref="dgx-h100")
    files = export_plan("megatron", ctx)            # {"megatron_args.sh": "..."}
    imp = import_launch("out/megatron_args.sh")     # ImportedLaunch (plan fields, model shape, notes)
    model, plan = resolve_model(imp), resolve_plan(imp, model, gpus=64)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..model import ModelSpec
from ..plan import Plan
from . import bridge, deepspeed, megatron, nemo, torchtitan
from .common import (ExportContext, ImportedLaunch, check_exportable, resolve_model, resolve_plan)

FORMATS = ("megatron", "torchtitan", "deepspeed", "nemo", "bridge")
FORMAT_STACK = {"megatron": "megatron", "nemo": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                "bridge": "megatron"}
"""the training stack whose rules decide what each format can run (NeMo 1.x and Megatron-Bridge run Megatron-Core)."""
_MODULES = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed, "nemo": nemo, "bridge": bridge}
MAX_FILE_BYTES = 1 << 20

__all__ = ["FORMATS", "FORMAT_STACK", "ExportContext", "ImportedLaunch", "export_context", "export_plan",
           "write_files", "import_launch", "resolve_model", "resolve_plan"]


def export_context(model: ModelSpec, cluster: Any, plan: Plan, *, model_ref: str, cluster_ref: str,
                   prediction: Mapping[str, Any] | None = None,
                   model_overrides: Mapping[str, int | None] | None = None) -> ExportContext:
    """The context of an export from a loaded cluster (its GPU count, GPUs per node and device name)."""
    overrides = {k: int(v) for k, v in (model_overrides or {}).items() if v is not None}
    return ExportContext(model=model, plan=plan, gpus=int(cluster.num_gpus), gpus_per_node=int(cluster.gpus_per_node),
                         model_ref=model_ref, cluster_ref=cluster_ref, model_overrides=overrides,
                         cluster_desc=f"{cluster.name}: {cluster.num_gpus} x {cluster.device.name}",
                         prediction=prediction)


def format_stack(fmt: str, stack: Any = None) -> Any:
    """The stack profile that decides what ``fmt`` can run (``stack`` overrides: a name, path or profile)."""
    from ..stacks import StackProfile, load_stack

    if fmt not in FORMATS:
        raise InputError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")
    if isinstance(stack, StackProfile):
        return stack
    return load_stack(stack or FORMAT_STACK[fmt])


def export_violation(fmt: str, ctx: ExportContext, stack: Any = None) -> str | None:
    """Why ``fmt`` cannot run the plan (the stack rule, or the format's own limit), or None."""
    try:
        check_exportable(ctx, format_stack(fmt, stack), fmt, _format_violation(fmt, ctx), _writes(fmt))
    except InputError as exc:
        return str(exc)
    return None


def _format_violation(fmt: str, ctx: ExportContext) -> str | None:
    check = getattr(_MODULES[fmt], "format_violation", None)
    return check(ctx) if check else None


def export_plan(fmt: str, ctx: ExportContext, stack: Any = None) -> dict[str, str]:
    """The files of ``fmt`` for the context's plan: {file name: text}. A plan the format's stack cannot run
    raises :class:`InputError` naming the rule."""
    check_exportable(ctx, format_stack(fmt, stack), fmt, _format_violation(fmt, ctx), _writes(fmt))
    return _MODULES[fmt].export_files(ctx)


def _writes(fmt: str) -> frozenset:
    """Model features (mixture of experts, MLA, multi-token prediction) the format's files state."""
    return frozenset(getattr(_MODULES[fmt], "MODEL_FEATURES", ()))


def write_files(files: Mapping[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write the files into ``out_dir`` (created), each atomically (tpsim.io); shell scripts are made
    executable. A folder that already holds one of these files is refused unless ``force`` (issue 13: an
    existing file is never replaced silently)."""
    from ..io import atomic_write_text, check_output_dir, make_output_dir

    out = make_output_dir(check_output_dir(out_dir, "--out", force=force, protected=tuple(files)), "--out")
    paths = []
    for name, text in files.items():
        path = out / name
        atomic_write_text(path, text, "--out")
        if name.endswith(".sh"):
            try:
                path.chmod(0o755)
            except OSError as exc:
                raise InputError(f"--out {path}: cannot make it executable ({exc.strerror})") from None
        paths.append(path)
    return paths


def detect_format(path: Path, text: str) -> str:
    """The format of a file: .toml torchtitan, .json DeepSpeed, .yaml/.yml NeMo, anything else a command line
    (Megatron-DeepSpeed when it has ``--deepspeed``)."""
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return "torchtitan"
    if suffix == ".json":
        return "deepspeed"
    if suffix in (".yaml", ".yml"):
        return "nemo"
    if suffix == ".py":
        return "bridge"
    return "deepspeed" if "--deepspeed" in text.replace("--deepspeed-", "") else "megatron"


def import_launch(path: str | Path, fmt: str | None = None) -> ImportedLaunch:
    """Read a launch file (or an export folder) back: plan fields, model shape, GPU count and notes."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = _export_file_in(p)
    from ..io import read_text  # a regular UTF-8 file of bounded size: never a FIFO or a device (issue 13)

    text = read_text(p, "--from", MAX_FILE_BYTES)
    fmt = fmt or detect_format(p, text)
    if fmt == "torchtitan":
        return torchtitan.import_text(p, text)
    if fmt == "nemo":
        return nemo.import_text(p, text)
    if fmt == "deepspeed":
        return deepspeed.import_json(p, text) if p.suffix.lower() == ".json" else deepspeed.import_script(p, text)
    if fmt == "megatron":
        return megatron.import_text(p, text)
    if fmt == "bridge":
        return bridge.import_text(p, text)
    raise InputError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")


def _export_file_in(folder: Path) -> Path:
    names = (megatron.FILENAME, torchtitan.FILENAME, deepspeed.SCRIPT, nemo.FILENAME, bridge.FILENAME)
    found = [folder / n for n in names if (folder / n).is_file()]
    if len(found) != 1:
        raise InputError(f"--from {folder}: expected one of {', '.join(names)} in the folder, found "
                         f"{len(found)}")
    return found[0]


def describe_import(imp: ImportedLaunch) -> str:
    """One line per note, for the user (what was approximated, ignored or unresolved)."""
    lines = [f"imported {imp.path} ({imp.format})"]
    lines += [f"  note: {n}" for n in imp.notes]
    figures = [f"{section}.{key}={value}" for section, body in imp.stack_overrides.items()
               for key, value in body.items()]
    if figures:
        lines.append(f"  stack: {imp.stack or FORMAT_STACK[imp.format]} with {', '.join(figures)} (from the file)")
    return "\n".join(lines)
