"""Layer-cost sources: what one repeated layer (and the model's two edges) costs on one rank.

The estimator's first stage asks a :class:`LayerSource` for per-layer forward / backward / recompute times,
the collectives each layer runs per micro-batch (on which plan axes, how many bytes, behind which compute they
can hide), parameters and stored activation bytes per layer, and the edges: the embedding (first pipeline rank)
and the output layer with the loss (last pipeline rank). Everything after it (communication, pipeline schedule,
data parallelism, memory, totals) only sees these arrays, so another source (a traced op graph, issue 15) feeds
the same stages.

Arrays run over *layer keys*: the distinct rows of the plan fields in :attr:`LayerSource.key_fields`; the
estimator gathers them back to the plans.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..compute.base import ComputeModel
from ..compute.roofline import activation_bytes
from ..model import ModelSpec
from ..tp_plan import layer_collectives
from .flops import layer_forward_flops, model_flops_per_sequence
from .keys import take_rows
from .layer import edge_cost, layer_cost
from .memory import activation_bytes_per_layer, full_layer_activations, layer_params_local


@dataclass(frozen=True)
class Collective:
    """One collective a layer (or an edge) runs per micro-batch over the ranks that differ along ``axes``."""

    axes: tuple[str, ...]
    """plan axes of the group, e.g. ("tp",)."""
    op: str
    """all_reduce | all_gather | reduce_scatter | all_to_all | send_recv (nccl-tests byte convention)."""
    phase: str
    """"fwd" or "bwd"."""
    nbytes: np.ndarray
    """bytes per layer key; 0 where this key does not run it."""
    hide: np.ndarray | float = 0.0
    """seconds of compute it overlaps with (0: exposed), per layer key."""
    count: float = 1.0
    """times it runs per micro-batch."""


@dataclass(frozen=True)
class Edge:
    """One edge of the model (embedding on the first pipeline rank, or output layer + loss on the last)."""

    fwd: np.ndarray
    """forward compute per micro-batch, seconds."""
    bwd: np.ndarray
    """backward compute per micro-batch, seconds."""
    comm: tuple[Collective, ...]
    """collectives per micro-batch (exposed: nothing hides them)."""
    params: np.ndarray
    """parameters held by one rank."""
    shared_params: np.ndarray
    """of ``params``, those the other edge already holds when both sit on one rank (tied embeddings)."""
    buffer_bytes: np.ndarray
    """working buffers of one micro-batch (embedding output, fp32 logits), bytes."""



@dataclass(frozen=True)
class LayerCosts:
    """Per layer and micro-batch on one rank, arrays over layer keys (seconds, bytes, parameters)."""

    fwd: np.ndarray
    bwd: np.ndarray
    """backward compute without recomputation."""
    recompute: np.ndarray
    """extra forward compute during backward (selective: attention core; full: the whole forward)."""
    measured: np.ndarray
    """fraction of fwd + bwd time that came from a measured kernel profile."""
    comm: tuple[Collective, ...]
    """collectives of one layer per micro-batch (TP, and later CP / EP)."""
    params: np.ndarray
    """parameters of one layer held by one rank."""
    activations: np.ndarray
    """activation bytes one layer stores per micro-batch until its backward."""
    working: np.ndarray
    """bytes of one layer's activations rebuilt during backward (full recomputation), else 0."""
    boundary_bytes: np.ndarray
    """bytes one pipeline stage sends the next per micro-batch (and the gradient back)."""
    first: Edge
    last: Edge

    def take(self, index: np.ndarray, with_comm: bool = True) -> "LayerCosts":
        """The rows ``index`` (gather); ``with_comm=False`` leaves the collectives out (the stages after
        communication use their times, not their sizes)."""
        if with_comm:
            return take_rows(self, index)
        bare = dataclasses.replace(self, comm=(), first=dataclasses.replace(self.first, comm=()),
                                   last=dataclasses.replace(self.last, comm=()))
        return take_rows(bare, index)

    def for_plans(self, index: np.ndarray) -> "LayerCosts":
        """The rows ``index`` of what the per-plan stages (schedule, memory, totals) read; the parts only
        partition and communication use (collectives, boundary bytes, edge parameters) are None."""
        def edge(e: Edge) -> Edge:
            return Edge(fwd=e.fwd[index], bwd=e.bwd[index], comm=(), params=None, shared_params=None,
                        buffer_bytes=e.buffer_bytes[index])

        return LayerCosts(fwd=self.fwd[index], bwd=self.bwd[index], recompute=self.recompute[index],
                          measured=self.measured[index], comm=(), params=self.params[index],
                          activations=self.activations[index], working=self.working[index], boundary_bytes=None,
                          first=edge(self.first), last=edge(self.last))


class LayerSource(ABC):
    """Where layer costs come from. ``key_fields`` names the plan fields the costs depend on (PlanBatch
    columns); :meth:`costs` gets one array per field (the distinct rows) plus the batch's dtype and attention."""

    key_fields: tuple[str, ...] = ("tp", "sp", "micro_batch", "recompute")
    comm_fields: tuple[str, ...] = ("tp", "sp", "micro_batch")
    """the key fields the collectives, edges and boundary bytes depend on (not recomputation)."""
    param_fields: tuple[str, ...] = ("tp",)
    """the key fields the parameters per layer and per edge depend on."""
    num_layers: int
    """repeated layers (split over pipeline stages)."""
    tokens_per_sequence: int
    """tokens one sample (sequence) of the global batch holds (throughput counts them)."""

    @abstractmethod
    def model_flops_per_sequence(self) -> float:
        """Model FLOPs of one sample, forward and backward (MFU counts them)."""

    @abstractmethod
    def recompute_flops_per_sequence(self, recompute: np.ndarray) -> np.ndarray:
        """FLOPs recomputation adds per sample (recompute coded 0 none / 1 selective / 2 full; HFU adds them)."""

    @abstractmethod
    def costs(self, compute: ComputeModel, keys: dict[str, np.ndarray], dtype: str,
              attention: str) -> LayerCosts:
        """Costs of one layer and of the edges for every key row."""

    def describe(self) -> str:
        return type(self).__name__


class TransformerSource(LayerSource):
    """A preset / Hugging Face decoder block (:mod:`tpsim.estimator.layer`, :mod:`tpsim.estimator.memory`)
    with Megatron tensor parallelism; its TP collectives come from :func:`tpsim.tp_plan.layer_collectives`."""

    def __init__(self, model: ModelSpec, flavor: str = "megatron"):
        self.model = model
        self.flavor = flavor
        self.num_layers = model.num_layers
        self.tokens_per_sequence = model.seq_len
        # the TP collectives of one layer, with and without sequence parallelism (tp only changes the group)
        self._tp_ops = {sp: layer_collectives(model, 2, sp, flavor) for sp in (False, True)}

    def model_flops_per_sequence(self) -> float:
        return model_flops_per_sequence(self.model)

    def recompute_flops_per_sequence(self, recompute: np.ndarray) -> np.ndarray:
        """Full recomputation repeats the layers' forward, selective the attention-score matmuls."""
        layer, scores = layer_forward_flops(self.model)
        return np.where(recompute == 2, layer, np.where(recompute == 1, scores, 0.0)) * self.model.num_layers

    def costs(self, compute: ComputeModel, keys: dict[str, np.ndarray], dtype: str,
              attention: str) -> LayerCosts:
        model = self.model
        tp, sp, mb, rc = (keys[k] for k in self.key_fields)
        sp = sp.astype(bool)
        act_bytes = activation_bytes(dtype)
        lc = layer_cost(model, compute, tp=tp, sp=sp, micro_batch=mb, recompute=rc, dtype=dtype,
                        attention=attention)
        mem_kw = dict(tp=tp, sp=sp, micro_batch=mb, recompute=rc, attention=attention, act_bytes=act_bytes)
        working = np.where(rc == 2, full_layer_activations(model, **mem_kw), 0.0)
        T = mb * float(model.seq_len)
        act = np.where(tp > 1, T * model.hidden_size * act_bytes, 0.0)  # one activation, bytes
        comm = []
        for sp_value, ops in self._tp_ops.items():
            mask = sp == sp_value
            for c in ops:
                nbytes = act if c.activation else np.full(len(tp), float(c.numel * 4))
                hide = {"wgrad": lc.wgrad, "dgrad": lc.dgrad}.get(c.overlap, {}).get(c.module.split(".")[0], 0.0)
                comm.append(Collective(axes=("tp",), op=c.op, phase=c.phase, nbytes=np.where(mask, nbytes, 0.0),
                                       hide=np.broadcast_to(np.asarray(hide, dtype=float), tp.shape)))
        first, last = self._edges(compute, tp, sp, mb, dtype, act, act_bytes)
        # Megatron's scatter/gather optimization (or SP): a stage sends its 1/tp slice of the activation
        boundary = T * model.hidden_size * act_bytes / tp
        return LayerCosts(fwd=lc.fwd, bwd=lc.bwd, recompute=lc.recompute, measured=lc.measured, comm=tuple(comm),
                          params=layer_params_local(model, tp),
                          activations=activation_bytes_per_layer(model, **mem_kw), working=working,
                          boundary_bytes=boundary, first=first, last=last)

    def _edges(self, compute: ComputeModel, tp: np.ndarray, sp: np.ndarray, mb: np.ndarray, dtype: str,
               act: np.ndarray, act_bytes: int) -> tuple[Edge, Edge]:
        """Vocab-parallel embedding (first rank) and output layer + vocab-parallel cross-entropy (last rank):
        Megatron-Core ``VocabParallelEmbedding`` reduces its partial output over TP (reduce-scatter with SP),
        the output layer gathers the sequence-parallel input and the loss all-reduces max, sum-exp and the
        target logit (fp32 per token); backward reduces the input gradient."""
        model = self.model
        ec = edge_cost(model, compute, tp=tp, sp=sp, micro_batch=mb, dtype=dtype)
        T = mb * float(model.seq_len)
        h = float(model.hidden_size)
        tp_vals = np.unique(tp)
        emb_local = np.array([model.padded_vocab(int(t)) * h / t for t in tp_vals])[np.searchsorted(tp_vals, tp)]
        pos = model.max_positions * h if model.position == "learned" else 0.0
        final_norm = h * (2 if model.norm == "layernorm" else 1)
        small = np.where(tp > 1, T * 4.0, 0.0)
        zero = np.zeros(len(tp))
        tied = emb_local if model.tie_embeddings else zero
        c = lambda op, phase, nbytes, count=1.0: Collective(("tp",), op, phase, nbytes, 0.0, count)  # noqa: E731
        first = Edge(fwd=ec.first_fwd, bwd=ec.first_bwd,
                     comm=(c("reduce_scatter", "fwd", np.where(sp, act, 0.0)),
                           c("all_reduce", "fwd", np.where(sp, 0.0, act))),
                     params=emb_local + pos, shared_params=zero,
                     buffer_bytes=np.where(sp, T * h * act_bytes / tp, T * h * act_bytes))
        last = Edge(fwd=ec.last_fwd, bwd=ec.last_bwd,
                    comm=(c("all_gather", "fwd", np.where(sp, act, 0.0)), c("all_reduce", "fwd", small, 3.0),
                          c("reduce_scatter", "bwd", np.where(sp, act, 0.0)),
                          c("all_reduce", "bwd", np.where(sp, 0.0, act))),
                    params=emb_local + final_norm, shared_params=tied,
                    buffer_bytes=4.0 * T * emb_local / h)  # fp32 logits of the rank's vocabulary shard
        return first, last
