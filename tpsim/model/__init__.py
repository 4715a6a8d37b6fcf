"""Model specification: decoder-only transformers, dense or mixtures of experts (torch-free).

A :class:`ModelSpec` comes from a built-in preset (:data:`PRESETS`), from a Hugging Face ``config.json``
(:func:`from_hf_config`, :func:`load_model`), and may be changed by overrides (:func:`with_overrides`).

Layout: ``spec`` (the dataclass), ``checks`` (field validation), ``counting`` (parameters and FLOPs),
``presets``, ``hf`` and ``hf_keys`` (config.json types and the key table), ``files`` (reading a config file),
``overrides``, ``describe`` (summary; :func:`unmodelled_features`).
"""

from __future__ import annotations

from .counting import FlopCount
from .describe import approximations, require_modelled, summary, unmodelled_features
from .files import load_model, parse_json_object, read_json_object
from .overrides import OVERRIDES, with_overrides
from .presets import PRESETS, get_preset
from .spec import ACTIVATIONS, ATTENTION_KINDS, FAMILIES, LayerKind, ModelSpec

__all__ = ["ACTIVATIONS", "ATTENTION_KINDS", "FAMILIES", "HF_TYPES", "OVERRIDES", "PRESETS", "FlopCount", "LayerKind",
           "ModelSpec", "approximations", "from_hf_config", "get_preset", "load_model", "parse_json_object",
           "read_json_object", "require_modelled", "summary", "unmodelled_features", "with_overrides"]


def __getattr__(name: str):
    """``HF_TYPES`` and ``from_hf_config`` from :mod:`tpsim.model.hf`, imported on first use (a preset needs no
    config.json reader: ``tpsim plan --model gpt3-175b`` starts without compiling it)."""
    if name in ("HF_TYPES", "from_hf_config"):
        from . import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
