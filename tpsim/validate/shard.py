"""One TP shard of a model as a model of its own (torch-free): what a single device computes at tp = T.

``shard_model(llama3-8b, 4)`` has 32/4 query heads, max(8/4, 1) KV heads, FFN 14336/4, the same hidden size
and head dim: its tp = 1 block runs exactly the per-shard GEMMs, attention and norms of one rank of tp = 4
(without the collectives). The single-GPU validation uses it (``tpsim validate --shard-of T``).
"""

from __future__ import annotations

import dataclasses

from ..errors import InputError
from ..model import ModelSpec


def shard_model(model: ModelSpec, shards: int) -> ModelSpec:
    """The per-rank part of ``model`` at tp = ``shards`` (KV heads fewer than ``shards`` are replicated)."""
    if shards == 1:
        return model
    for what, size in (("num_attention_heads", model.num_attention_heads),
                       ("ffn_hidden_size", model.ffn_hidden_size)):
        if size % shards:
            raise InputError(f"--shard-of={shards} does not divide {what}={size}")
    kv = model.num_kv_heads
    if (kv >= shards and kv % shards) or (kv < shards and shards % kv):
        raise InputError(f"--shard-of={shards} and num_kv_heads={kv}: neither divides the other")
    return dataclasses.replace(model, name=f"{model.name}-shard1of{shards}",
                               num_attention_heads=model.num_attention_heads // shards,
                               num_kv_heads=max(kv // shards, 1), ffn_hidden_size=model.ffn_hidden_size // shards,
                               head_dim=model.head_dim)
