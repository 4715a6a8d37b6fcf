"""Reading a model: a preset name, or a Hugging Face ``config.json`` read defensively (issue 13).

A config file must be a regular file of at most :data:`tpsim.limits.MAX_CONFIG_BYTES`, UTF-8 text, JSON nested
at most :data:`tpsim.limits.MAX_JSON_DEPTH` deep, without NaN/Infinity (not JSON) or repeated keys (which JSON
readers resolve differently), and one JSON object. Anything else is one line naming the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..limits import MAX_CONFIG_BYTES
from .presets import PRESETS, get_preset
from .spec import ModelSpec


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name or the path of a Hugging Face ``config.json`` (or of a folder holding one)."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InputError(f"model={name_or_path!r} must be a preset name or a config.json path")
    if name_or_path.lower() in PRESETS:
        return PRESETS[name_or_path.lower()]
    if name_or_path.endswith(".ops.json"):  # the op graph sits above this layer: tpsim.load_model reads it
        raise InputError(f"model {name_or_path} is a traced op graph: read it with tpsim.load_model or "
                         "tpsim.opgraph.model.load_graph_model (the CLI takes it as --model)")
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        if path.suffix == ".json" or "/" in name_or_path:
            raise InputError(f"model file {path} does not exist")
        return get_preset(name_or_path)
    cfg = read_json_object(path)
    stem = path.parent.name if path.name == "config.json" else path.stem
    from .hf import from_hf_config

    return from_hf_config(cfg, name=stem or "hf-model", source=str(path))


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, checked as the module docstring says."""
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; a config.json is a few kB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    return parse_json_object(text, str(path))


def parse_json_object(text: str, source: str) -> dict[str, Any]:
    """Parse ``text`` as one JSON object: bounded and linear (:mod:`tpsim.boundedjson`: depth, values and
    digits measured before decoding; finite numbers, no repeated keys)."""
    from ..boundedjson import loads

    value = loads(text, source)
    if not isinstance(value, dict):
        raise InputError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value
