"""Documented bounds on every user-supplied number (issue 13): anything outside is refused with one line
naming the field and the value, before any work or allocation.

The maxima are far above anything trained today (a 131,072-GPU cluster, a 1M-token context, a 256k
vocabulary) and far below what would overflow an int64 product or exhaust memory while building tables.
Change a bound here, with the reason, and every checker follows.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import InputError

LIMITS: dict[str, int] = {
    # model shape
    "num_layers": 4096,
    "hidden_size": 1 << 20,
    "num_attention_heads": 1 << 16,
    "num_kv_heads": 1 << 16,
    "head_dim": 1 << 14,
    "ffn_hidden_size": 1 << 22,
    "vocab_size": 1 << 24,
    "seq_len": 1 << 24,
    "max_positions": 1 << 26,
    "norms_per_layer": 8,
    "num_experts": 1 << 14,
    "experts_per_token": 1 << 10,
    "moe_ffn_hidden_size": 1 << 22,
    "num_shared_experts": 1 << 10,
    "shared_expert_ffn_hidden_size": 1 << 22,
    "first_dense_layers": 4096,
    "moe_layer_freq": 4096,
    "router_groups": 1 << 14,
    "router_group_topk": 1 << 14,
    "mtp_layers": 64,
    "q_lora_rank": 1 << 20,
    "kv_lora_rank": 1 << 20,
    "qk_nope_head_dim": 1 << 14,
    "qk_rope_head_dim": 1 << 14,
    "v_head_dim": 1 << 14,
    "sliding_window": 1 << 24,
    # plan and cluster
    "gpus": 1 << 20,
    "tp": 1 << 12,
    "cp": 1 << 12,
    "ep": 1 << 14,
    "pp": 1 << 12,
    "vpp": 1 << 10,
    "dp": 1 << 20,
    "micro_batch": 1 << 16,
    "global_batch": 1 << 26,
    # measurement and local runs
    "bytes": 1 << 50,
    "ranks": 1 << 10,
    "threads": 1 << 10,
    "nproc": 1 << 10,
}
"""field -> largest accepted value (inclusive); the smallest is 1 unless a checker says 0."""

MAX_GRAPH_NODES = 200_000
"""A full networkx graph is built only below this many vertices (``tpsim topo`` on irregular clusters);
larger clusters use the structural model."""
MAX_PLANS = 50_000_000
"""Plans a search may enumerate without an explicit flag."""
MAX_JSON_DEPTH = 64
"""Nesting depth of a JSON or YAML input."""
MAX_CONFIG_BYTES = 1 << 20
"""Size of a model config.json (published ones are 1-10 kB; the largest, with label maps, well under 100 kB)."""
MAX_YAML_NODES = 1_000_000
"""Scalar and collection nodes a YAML document may expand to (alias/anchor bombs)."""


def check_int(field: str, value: Any, where: str = "", minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int within ``[minimum, LIMITS[field]]``; strings, booleans, NaN, infinities and floats
    with a fractional part are refused. ``where`` prefixes the message (a file name or a flag)."""
    prefix = f"{where}: " if where else ""
    top = maximum if maximum is not None else LIMITS.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{prefix}{field}={value!r} must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise InputError(f"{prefix}{field}={value!r} must be an integer")
        value = int(value)
    if value < minimum:
        raise InputError(f"{prefix}{field}={value} must be >= {minimum}")
    if top is not None and value > top:
        raise InputError(f"{prefix}{field}={value} is above the supported maximum {top}")
    return int(value)
