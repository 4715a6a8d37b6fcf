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

from .. import pipeline
from ..comm_plan import a2a_bytes, kv_block_bytes
from ..compute.base import ComputeModel
from ..compute.roofline import activation_bytes
from ..hardware import is_low_precision
from ..model import LayerKind, ModelSpec
from ..tp_plan import layer_collectives
from .flops import DEFAULT_FLOPS_CONVENTION, layer_forward_flops, model_flops_per_sequence_as
from .keys import gather, sorted_values, take_rows
from .layer import edge_cost, layer_cost
from .stackterms import ActivationStorage
from .memory import (activation_bytes_per_layer, full_layer_activations, layer_expert_params_local,
                     layer_params_local)


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
    """seconds of compute it overlaps with (0: exposed), per layer key (all ``count`` runs together)."""
    count: np.ndarray | float = 1.0
    """times it runs per micro-batch (per layer key, or one number)."""


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
    expert_params: np.ndarray | float = 0.0
    """of ``params``, routed experts' (the multi-token-prediction modules' MoE layers on the last rank)."""
    high_precision_params: np.ndarray | float = 0.0
    """of ``params``, those no low-precision GEMM reads: the embedding, the output head, the final norm (they
    keep no fp8 weight cast; DeepSeek-V3 report section 3.3: "the embedding module, the output head, ...
    normalization operators" stay in BF16/FP32; Megatron-Core's embedding and output layer are not TE
    modules; torchtitan's float8 converter skips ``output``). In :meth:`LayerCosts.for_plans` less the
    ``shared_params`` (a tied head is the embedding: counted once where both edges share a rank)."""



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
    attention: np.ndarray | None = None
    """flash-attention kernel seconds within ``fwd + bwd`` (None: none; the error band weighs the attention
    kernel data by it)."""
    expert_params: np.ndarray | None = None
    """of ``params``, the routed experts' (their gradients reduce over the expert data-parallel group); None:
    none (a dense model)."""
    params_by_kind: np.ndarray | None = None
    """(kinds, n) parameters of one layer of each :attr:`TransformerSource.kinds` entry (the partition counts
    each pipeline rank's layers of each kind); None: every layer holds ``params``."""
    expert_by_kind: np.ndarray | None = None
    """(kinds, n) the routed experts' share of ``params_by_kind``."""
    compute_by_kind: np.ndarray | None = None
    """(kinds, n) forward + backward seconds of one layer of each kind (the slowest pipeline rank is the one
    whose own layers take longest)."""
    recompute_by_kind: np.ndarray | None = None
    """(kinds, n) recomputation seconds of one layer of each kind."""
    activations_by_kind: np.ndarray | None = None
    """(kinds, n) activation bytes one layer of each kind stores per micro-batch (the memory stage counts each
    pipeline rank's layers of each kind: a rank of MoE layers stores more than one of dense layers)."""
    boundary_by_kind: np.ndarray | None = None
    """(kinds, n) bytes a pipeline boundary before a layer of each kind sends (with the partition's ``cuts``:
    the largest of the plan's boundaries replaces ``boundary_bytes``)."""
    gathered_params: np.ndarray | None = None
    """parameters of the largest layer (ZeRO-3's gather buffers hold two such layers; None: every layer holds
    ``params``)."""
    grad_sync_params: np.ndarray | None = None
    """parameters per layer whose gradients are all-reduced over TP once per step (replicated parameters used
    on a token / position split; None: the model's rule, :func:`tpsim.estimator.comm.tp_summed_grad_params`)."""
    grad_sync_by_kind: np.ndarray | None = None
    """(kinds, n) ``grad_sync_params`` of one layer of each kind (with ``comm_by_kind``)."""
    comm_by_kind: tuple[tuple[Collective, ...], ...] | None = None
    """per layer kind, the collectives one layer of that kind runs per micro-batch (layers of different costs:
    each pipeline rank is charged its own layers' collectives and ZeRO-3 gathers, the schedule's
    :meth:`~tpsim.estimator.partition.Ranks.layer_sum`); None: every layer runs ``comm``."""
    fwd_by_kind: np.ndarray | None = None
    """(kinds, n) forward seconds of one layer of each kind (of ``compute_by_kind``; set with ``comm_by_kind``:
    the windows its collectives hide behind)."""
    rerun_by_kind: np.ndarray | None = None
    """(kinds, n) bool: under full recomputation the layers of this kind re-run their forward and its
    collectives (checkpointed; set with ``comm_by_kind``; None: every layer)."""

    def take(self, index: np.ndarray, with_comm: bool = True) -> "LayerCosts":
        """The rows ``index`` (gather); ``with_comm=False`` leaves the collectives out (the stages after
        communication use their times, not their sizes)."""
        if with_comm:
            return take_rows(self, index)
        bare = dataclasses.replace(self, comm=(), comm_by_kind=None, first=dataclasses.replace(self.first, comm=()),
                                   last=dataclasses.replace(self.last, comm=()))
        return take_rows(bare, index)

    def for_plans(self, index: np.ndarray) -> "LayerCosts":
        """The rows ``index`` of what the per-plan stages (schedule, memory, totals) read; the parts only
        partition and communication use (collectives, boundary bytes, edge parameters) are None."""
        def along(x: np.ndarray | float, shape: tuple[int, ...]) -> np.ndarray:
            a = np.asarray(x, dtype=float)  # a number or an array over the key rows, at the rows ``index``
            return gather(a if a.shape == shape else np.broadcast_to(a, shape), index, 0)

        def edge(e: Edge) -> Edge:
            hp = along(e.high_precision_params, e.fwd.shape) - along(e.shared_params, e.fwd.shape)
            params = None if e.params is None else along(e.params, e.fwd.shape)
            return Edge(fwd=gather(e.fwd, index, 0), bwd=gather(e.bwd, index, 0), comm=(), params=params,
                        shared_params=None, buffer_bytes=gather(e.buffer_bytes, index, 0), high_precision_params=hp)

        def rows(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else gather(a, index, 0)

        return LayerCosts(fwd=rows(self.fwd), bwd=rows(self.bwd), recompute=rows(self.recompute),
                          measured=rows(self.measured), comm=(), params=rows(self.params),
                          activations=rows(self.activations), working=rows(self.working), boundary_bytes=None,
                          first=edge(self.first), last=edge(self.last), attention=rows(self.attention),
                          gathered_params=rows(self.gathered_params), expert_params=rows(self.expert_params),
                          **{f: (None if getattr(self, f) is None else gather(getattr(self, f), index, 1))
                             for f in ("compute_by_kind", "recompute_by_kind", "activations_by_kind",
                                       "fwd_by_kind", "rerun_by_kind", "params_by_kind")})


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
    flops_convention: str = "full"
    """how :meth:`model_flops_per_sequence` counts (one of :data:`tpsim.estimator.flops.FLOPS_CONVENTIONS`):
    traced graphs count at torch's FlopCounterMode convention, ``full``."""

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
    with Megatron tensor parallelism; its TP collectives come from :func:`tpsim.tp_plan.layer_collectives`,
    its context- and expert-parallel ones from :mod:`tpsim.comm_plan`.

    A model whose layers differ (mixture-of-experts and dense layers, sliding-window and full attention) is
    costed per layer kind (:meth:`tpsim.model.ModelSpec.layer_counts`): the layer arrays are the mean over the
    model's layers (times, collectives with their counts, activations), and the parameters of each kind are
    kept apart so each pipeline rank holds exactly its layers' parameters (:attr:`kind_of_layer`)."""

    def __init__(self, model: ModelSpec, flavor: str = "megatron", storage: ActivationStorage | None = None,
                 fp8_dispatch: bool = False, node_dedup: bool = False, ep_overlap: bool = False,
                 fp8_cast: tuple[float, ...] = (0.0, 0.0), edges: bool = True, p2p_split: bool = True,
                 kv_repeat: bool = False, cp_ring=None):
        from .stackterms import RingExchange
        self.model = model
        self.cp_ring = cp_ring or RingExchange()
        """how ring context parallelism exchanges K/V and dK/dV (StackTerms.cp_ring)."""
        self.edges = edges
        self.p2p_split = p2p_split
        """a pipeline stage sends its 1/tp slice of the activation (StackTerms.pp_send_split)."""
        """the runtime runs the embedding, output layer and loss (StackTerms.model_edges; False: layers alone)."""
        self.fp8_cast = fp8_cast
        self.kv_repeat = kv_repeat
        """GQA's K/V repeated to the query heads in HBM (StackTerms.gqa_kv_repeat)."""
        """bytes per element of the fp8 casts of each linear's input and output gradient (StackTerms)."""
        self.flavor = flavor
        self.storage = storage or ActivationStorage()
        """the stack's selective-recomputation modules and fp8 activation caching."""
        self.fp8_dispatch = fp8_dispatch
        """fp8 plans dispatch in fp8 (StackTerms.ep_fp8_dispatch)."""
        self.node_dedup = node_dedup
        """a token crosses the network once per destination node (StackTerms.ep_node_dedup)."""
        self._moe_recomputed = "moe" in self.storage.recompute_modules and not self.storage.per_op_sac
        """selective recomputation runs a MoE layer's forward again (its all-to-alls too)."""
        self.ep_overlap = ep_overlap
        """every schedule pairs micro-batches for the expert all-to-alls (StackTerms.ep_a2a_overlap)."""
        self.num_layers = model.num_layers
        self.tokens_per_sequence = model.seq_len
        # the pipeline schedule matters to a layer's cost where it pairs chunks (DualPipe: the expert all-to-alls
        # of one chunk hide behind the other's computation, tpsim.pipeline.paired)
        moe = ("ep", "etp", "schedule") if model.is_moe else ()
        self.key_fields = ("tp", "sp", "micro_batch", "recompute", "cp", "cp_kind") + moe
        # a MoE layer recomputed by the ``moe`` module runs its all-to-alls again (moe_layer_collectives(
        # recomputed=)): its traffic depends on the recomputation
        self.comm_fields = ("tp", "sp", "micro_batch", "cp", "cp_kind") + moe + (("recompute",) if moe else ())
        self.param_fields = ("tp",) + moe
        counts = model.layer_counts()
        self.kinds: tuple[LayerKind, ...] = tuple(counts)
        """the distinct layer kinds, in order of first appearance."""
        self.weights = tuple(counts[k] / model.num_layers for k in self.kinds)
        """each kind's share of the layers."""
        index = {k: i for i, k in enumerate(self.kinds)}
        self.kind_of_layer = np.array([index[k] for k in model.layer_kinds()], dtype=np.int64)
        """kind index of every layer, in order (the pipeline partition counts them per rank)."""
        # the TP collectives of one layer, with and without sequence parallelism (tp only changes the group)
        self._tp_ops = {sp: layer_collectives(model, 2, sp, flavor) for sp in (False, True)}

    flops_convention = DEFAULT_FLOPS_CONVENTION

    def model_flops_per_sequence(self) -> float:
        return model_flops_per_sequence_as(self.model, self.flops_convention)

    def recompute_flops_per_sequence(self, recompute: np.ndarray) -> np.ndarray:
        """Full recomputation repeats the layers' forward; selective the attention-score matmuls (``core_attn``)
        and MLA's up-projection GEMMs (``mla_up_proj``) as the stack's recompute modules say. Under the causal
        convention the recomputed score matmuls count the keys the mask keeps, as the model FLOPs do."""
        m = self.model
        layer, scores = layer_forward_flops(m)
        if self.flops_convention == "causal" and scores > 0:
            full = m.flops_per_token(causal=False).attention_scores
            kept = m.flops_per_token(causal=True).attention_scores / full if full > 0 else 1.0
            layer, scores = layer - scores * (1.0 - kept), scores * kept
        modules = self.storage.recompute_modules
        selective = scores if "core_attn" in modules else 0.0
        if self.storage.per_op_sac and m.attention_kind != "mla":
            from .memory import _per_op_width, per_op_matmuls, per_op_saved
            one = np.ones(1, dtype=np.int64)
            h, f = float(m.hidden_size), float(m.ffn_hidden_size)
            inputs = {"wo": m.num_attention_heads * float(m.head_dim), "w2": f, "fc2": f}
            selective = sum(2.0 * m.seq_len * inputs.get(n, h) * float(_per_op_width(m, n, one)[0])
                            for n in per_op_matmuls(m) if n not in per_op_saved(m))
        if "mla_up_proj" in modules and m.attention_kind == "mla":
            heads = m.num_attention_heads
            up = (m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
                  + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim))
            selective = selective + 2.0 * m.seq_len * up
        return np.where(recompute == 2, layer, np.where(recompute == 1, selective, 0.0)) * m.num_layers

    def costs(self, compute: ComputeModel, keys: dict[str, np.ndarray], dtype: str,
              attention: str) -> LayerCosts:
        model = self.model
        tp, sp, mb, rc, cp, cp_kind = (keys[k] for k in self.key_fields[:6])
        ep, etp = (keys["ep"], keys["etp"]) if model.is_moe else (None, None)
        sp = sp.astype(bool)
        act_bytes = activation_bytes(dtype)
        axes = dict(tp=tp, sp=sp, micro_batch=mb, cp=cp, ep=ep, etp=etp, act_bytes=act_bytes,
                    paired=(pipeline.paired(keys["schedule"]) | self.ep_overlap) if model.is_moe else False)
        kinds = [self._kind_costs(compute, kind, rc, cp_kind, dtype, attention, axes) for kind in self.kinds]
        mean = _mean_layer(kinds, self.weights)
        T = mb * float(model.seq_len) / cp
        act = np.where(tp > 1, T * model.hidden_size * act_bytes, 0.0)  # one activation, bytes
        first, last = self._edges(compute, tp, sp, mb, cp, dtype, act, act_bytes, kinds)
        # Megatron's scatter/gather optimization (or SP): a stage sends its 1/tp slice of the activation; a stack
        # without it (StackTerms.pp_send_split) sends the whole activation from every TP rank unless SP shards it
        boundary = T * model.hidden_size * act_bytes / (tp if self.p2p_split else np.where(sp, tp, 1))
        many = len(kinds) > 1
        return LayerCosts(fwd=mean.fwd, bwd=mean.bwd, recompute=mean.recompute, measured=mean.measured,
                          comm=mean.comm, params=mean.params, activations=mean.activations, working=mean.working,
                          boundary_bytes=boundary, first=first, last=last,
                          expert_params=mean.expert_params if model.is_moe else None,
                          params_by_kind=np.stack([k.params for k in kinds]) if many else None,
                          expert_by_kind=np.stack([k.expert_params for k in kinds]) if many else None,
                          activations_by_kind=np.stack([k.activations for k in kinds]) if many else None,
                          compute_by_kind=np.stack([k.fwd + k.bwd for k in kinds]) if many else None,
                          recompute_by_kind=np.stack([k.recompute for k in kinds]) if many else None,
                          attention=np.broadcast_to(np.asarray(mean.attention, dtype=float), tp.shape))

    def _kind_costs(self, compute: ComputeModel, kind: LayerKind, rc: np.ndarray, cp_kind: np.ndarray,
                    dtype: str, attention: str, axes: dict) -> "_KindCosts":
        """One layer of ``kind``: compute, collectives, parameters, activations."""
        model = self.model
        tp, sp, mb, cp, ep, etp = (axes[k] for k in ("tp", "sp", "micro_batch", "cp", "ep", "etp"))
        lc = layer_cost(model, compute, tp=tp, sp=sp, micro_batch=mb, recompute=rc, dtype=dtype,
                        attention=attention, cp=cp, cp_kind=cp_kind, ep=ep, etp=etp, kind=kind,
                        recompute_modules=self.storage.recompute_modules, per_op=self.storage.per_op_sac,
                        fp8_cast=self.fp8_cast, kv_repeat=self.kv_repeat, cp_grad_bytes=self.cp_ring.grad_bytes)
        linear_bytes, attn_out_bytes = self.storage.cache_bytes(dtype, axes["act_bytes"])
        mem_kw = dict(tp=tp, sp=sp, micro_batch=mb, recompute=rc, attention=attention, act_bytes=axes["act_bytes"],
                      cp=cp, kind=kind, ep=ep, etp=etp, modules=self.storage.recompute_modules,
                      linear_bytes=linear_bytes, attn_out_bytes=attn_out_bytes, per_op=self.storage.per_op_sac,
                      attn_out_shared=self.storage.attention_output_shared)
        # the layer rebuilt in backward: full recomputation, and per-op selective (its unsaved tensors)
        rebuilt = (rc == 2) | ((rc == 1) & self.storage.per_op_sac)
        working = np.where(rebuilt, full_layer_activations(model, **mem_kw), 0.0)
        working = working + ring_working_bytes(model, axes, cp_kind, self.cp_ring, self.kv_repeat)
        tp_ops = self._tp_collectives(lc, kind, axes, rc)
        cp_ops = cp_layer_collectives(model, lc, axes, cp_kind, ring=self.cp_ring, kv_repeat=self.kv_repeat)
        comm = [c for c, _ in tp_ops] + cp_ops
        # what makes two kinds' collectives the same: attention-block TP ops never differ, MLP-block ones only
        # between kinds with the same MLP; ring exchanges hide behind attention (same window), the rest are
        # exposed and sized by the attention or the experts alone
        tags = [("tp", who, kind.moe if who[1] == "feed_forward" else None) for _, who in tp_ops]
        tags += [("cp", i, kind.window if c.op in ("send_recv", "all_gather") else None)
                 for i, c in enumerate(cp_ops)]
        if kind.moe:
            pairs = axes["paired"]
            ep_ops = moe_layer_collectives(model, axes, paired=(np.where(pairs, lc.fwd, 0.0), np.where(pairs, lc.bwd, 0.0))
                                           if np.any(pairs) else None,
                                           fp8_dispatch=self.fp8_dispatch and is_low_precision(dtype),
                                           node_dedup=self.node_dedup,
                                           recomputed=(rc == 1) & self._moe_recomputed)
            comm += ep_ops
            tags += [("ep", i) for i in range(len(ep_ops))]
            working = working + _dispatch_buffers(model, axes)
        return _KindCosts(fwd=lc.fwd, bwd=lc.bwd, recompute=lc.recompute, measured=lc.measured, comm=tuple(comm),
                          params=layer_params_local(model, tp, kind, ep, etp),
                          expert_params=layer_expert_params_local(model, tp, kind, ep, etp),
                          activations=activation_bytes_per_layer(model, **mem_kw), working=working,
                          tags=tuple(tags), attention=lc.attention)

    def _tp_collectives(self, lc, kind: LayerKind, axes: dict,
                        rc: np.ndarray | None = None) -> list[tuple[Collective, tuple]]:
        """The block's TP collectives, each with what identifies it (sp, block, module, phase, op, overlap); a
        mixture-of-experts layer without shared experts has no dense MLP, so no feed-forward ones.

        torchtitan's per-op selective checkpointing (``recompute=selective`` with ``per_op_sac``) saves the
        reduce-scatters' outputs but not the all-gathers' (torchtitan/models/llama3/parallelize.py
        ``_save_list``: mm, SDPA, ``_c10d_functional.reduce_scatter_tensor``, max): the recomputed matmuls of
        a block (every second one, among them wk and w3) need the all-gathered norm output again, so each
        block's forward all-gather runs once more in backward (exposed: the recomputed forward sits on the
        backward's critical path)."""
        model, tp, sp = self.model, axes["tp"], axes["sp"]
        T = axes["micro_batch"] * float(model.seq_len) / axes["cp"]
        act = np.where(tp > 1, T * model.hidden_size * axes["act_bytes"], 0.0)
        keep_mlp = not kind.moe or model.num_shared_experts > 0
        comm = []
        for sp_value, ops in self._tp_ops.items():
            mask = sp == sp_value
            for c in ops:
                block = c.module.split(".")[0]
                if block == "feed_forward" and not keep_mlp:
                    continue
                nbytes = act if c.activation else np.full(len(tp), float(c.numel * 4))
                hide = {"wgrad": lc.wgrad, "dgrad": lc.dgrad}.get(c.overlap, {}).get(block, 0.0)
                comm.append((Collective(axes=("tp",), op=c.op, phase=c.phase, nbytes=np.where(mask, nbytes, 0.0),
                                        hide=np.broadcast_to(np.asarray(hide, dtype=float), tp.shape)),
                             (sp_value, block, c.module, c.phase, c.op, c.overlap)))
                if self.storage.per_op_sac and rc is not None and c.phase == "fwd" and c.op == "all_gather":
                    again = np.where(mask & (np.asarray(rc) == 1), nbytes, 0.0)
                    comm.append((Collective(axes=("tp",), op=c.op, phase="bwd", nbytes=again, hide=0.0),
                                 (sp_value, block, c.module, "recompute", c.op, c.overlap)))
        return comm

    def _edges(self, compute: ComputeModel, tp: np.ndarray, sp: np.ndarray, mb: np.ndarray, cp: np.ndarray,
               dtype: str, act: np.ndarray, act_bytes: int, kinds: list) -> tuple[Edge, Edge]:
        """Vocab-parallel embedding (first rank) and output layer + vocab-parallel cross-entropy (last rank):
        Megatron-Core ``VocabParallelEmbedding`` reduces its partial output over TP (reduce-scatter with SP),
        the output layer gathers the sequence-parallel input and the loss all-reduces max, sum-exp and the
        target logit (fp32 per token); backward reduces the input gradient. With context parallelism each rank
        embeds and scores its b s / cp tokens. Multi-token prediction modules (DeepSeek-V3) sit on the last
        rank: :func:`_mtp_edge`."""
        model = self.model
        ec = edge_cost(model, compute, tp=tp, sp=sp, micro_batch=mb, dtype=dtype, cp=cp)
        T = mb * float(model.seq_len) / cp
        h = float(model.hidden_size)
        tp_vals = sorted_values(tp)
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
                     buffer_bytes=np.where(sp, T * h * act_bytes / tp, T * h * act_bytes),
                     high_precision_params=emb_local + pos)
        last = Edge(fwd=ec.last_fwd, bwd=ec.last_bwd,
                    comm=(c("all_gather", "fwd", np.where(sp, act, 0.0)), c("all_reduce", "fwd", small, 3.0),
                          c("reduce_scatter", "bwd", np.where(sp, act, 0.0)),
                          c("all_reduce", "bwd", np.where(sp, 0.0, act))),
                    params=emb_local + final_norm, shared_params=tied,
                    buffer_bytes=self.storage.logits_bytes * T * emb_local / h,  # the rank's vocabulary shard
                    high_precision_params=emb_local + final_norm)
        if model.mtp_layers:
            last = _mtp_edge(model, compute, last, ec, kinds[self.kind_of_layer[-1]], tp=tp, T=T, dtype=dtype, emb_local=emb_local)
        if not self.edges:  # a stack of layers alone (StackTerms.model_edges): no edge compute, traffic or state
            first, last = (Edge(fwd=zero, bwd=zero, comm=(), params=zero, shared_params=zero, buffer_bytes=zero)
                           for _ in range(2))
        return first, last


@dataclass(frozen=True)
class _KindCosts:
    """One layer of one kind (arrays over layer keys)."""

    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray
    measured: np.ndarray
    comm: tuple[Collective, ...]
    params: np.ndarray
    expert_params: np.ndarray
    activations: np.ndarray
    working: np.ndarray
    tags: tuple = ()
    """one per collective: equal tags across kinds mean the same message hidden the same way."""
    attention: np.ndarray | float = 0.0
    """flash-attention kernel seconds within ``fwd + bwd``."""


def _mean_layer(kinds: list[_KindCosts], weights: tuple[float, ...]) -> _KindCosts:
    """The model's mean layer: times, parameters and activations weighted by each kind's share of the layers,
    collectives with their counts (and hidden seconds) scaled by it; the working set of the largest kind.
    One kind: the kind itself."""
    if len(kinds) == 1:
        return kinds[0]
    mean = lambda name: sum(w * getattr(k, name) for k, w in zip(kinds, weights))  # noqa: E731
    comm = _merged([dataclasses.replace(c, count=c.count * w, hide=c.hide * w)
                    for k, w in zip(kinds, weights) for c in k.comm], [t for k in kinds for t in k.tags])
    total = mean("fwd") + mean("bwd")
    measured = sum(w * k.measured * (k.fwd + k.bwd) for k, w in zip(kinds, weights)) / np.where(total > 0, total, 1)
    return _KindCosts(fwd=mean("fwd"), bwd=mean("bwd"), recompute=mean("recompute"), measured=measured, comm=comm,
                      params=mean("params"), expert_params=mean("expert_params"), activations=mean("activations"),
                      working=np.max(np.stack([k.working for k in kinds]), axis=0), attention=mean("attention"))


def _merged(comm: list[Collective], tags: list[tuple]) -> tuple[Collective, ...]:
    """Collectives of several layer kinds with the same tag (the same message, hidden behind the same compute,
    by construction: see :meth:`TransformerSource._kind_costs`) as one entry with the summed count and hidden
    seconds: the exposed time max(0, count x time - hide) adds up exactly. The merge depends only on the
    kinds, so every key row of the source has the same collectives."""
    out: list[Collective] = []
    where: dict[tuple, int] = {}
    for c, tag in zip(comm, tags):
        i = where.get(tag)
        if i is None:
            where[tag] = len(out)
            out.append(c)
        else:
            m = out[i]
            out[i] = dataclasses.replace(m, count=m.count + c.count, hide=m.hide + c.hide)
    return tuple(out)


def cp_layer_collectives(model: ModelSpec, lc, axes: dict, cp_kind: np.ndarray, ring=None,
                         kv_repeat: bool = False) -> list[Collective]:
    """Context-parallel collectives of one layer (:mod:`tpsim.comm_plan`, docs/MODEL.md CP): the ring's K/V and
    dK/dV exchanges as the stack runs them (``ring``, :class:`~tpsim.estimator.stackterms.RingExchange`), or
    the four exposed all-to-alls of Ulysses each way; zero bytes where cp = 1 or the other kind is used.

    The K/V block is what the attention kernel receives: with ``kv_repeat`` (torchtitan's repeat_kv before
    SDPA) it carries the query heads. The dK/dV messages carry ``ring.grad_bytes`` per element.
    Per-step exchange (TE p2p): forward ``cp - 1`` sends, each hidden behind one later step (exposed =
    max(0, exchange - step) per step); backward the first step sends K/V, the last dK/dV, the middle ones
    both. All-gather (torch ALL_GATHER): one all-gather of the ``cp`` blocks per pass, hidden only behind the
    first (local) step; in backward the dK/dV go round the ring, step i's send hidden behind step i + 1 and
    the last one awaited after the loop (exposed). A stack whose exchanges are awaited where they are issued
    (``ring.overlapped`` False: torch.compile) hides none of them."""
    from .stackterms import RingExchange
    ring = ring or RingExchange()
    tp, cp, mb, act_bytes = axes["tp"], axes["cp"], axes["micro_batch"], axes["act_bytes"]
    cpf = cp.astype(float)
    a2a = (cp > 1) & (cp_kind == 1)
    kv = ring_kv_bytes(model, axes, cp_kind, kv_repeat)
    dkv = kv if ring.grad_bytes is None else kv * (ring.grad_bytes / act_bytes)
    steps = np.maximum(cpf - 1.0, 1.0)
    per_step_f, per_step_b = lc.ring_fwd / steps, lc.ring_bwd / steps
    if ring.allgather:
        ops = [Collective(("cp",), "all_gather", "fwd", cpf * kv, lc.ring_first_fwd, 1.0),
               Collective(("cp",), "all_gather", "bwd", cpf * kv, lc.ring_first_bwd, 1.0),
               Collective(("cp",), "send_recv", "bwd", dkv, per_step_b * (cpf - 1.0), cpf - 1.0),
               Collective(("cp",), "send_recv", "bwd", dkv, 0.0, 1.0)]
    else:
        middle = np.maximum(cpf - 2.0, 0.0)
        ops = [Collective(("cp",), "send_recv", "fwd", kv, per_step_f * (cpf - 1.0), cpf - 1.0),
               Collective(("cp",), "send_recv", "bwd", kv, per_step_b, 1.0),
               Collective(("cp",), "send_recv", "bwd", dkv, per_step_b, 1.0),
               Collective(("cp",), "send_recv", "bwd", np.where(middle > 0, kv + dkv, 0.0), per_step_b * middle,
                          middle)]
    if not ring.overlapped:  # each awaited where it is issued (torch.compile): nothing hides
        ops = [dataclasses.replace(c, hide=0.0) for c in ops]
    sizes = a2a_bytes(model, tp=tp, cp=cp, micro_batch=mb, act_bytes=act_bytes)
    for phase in ("fwd", "bwd"):  # q and o (and k and v) move the same bytes: all-to-all needs dqk == dv (no MLA)
        ops.append(Collective(("cp",), "all_to_all", phase, np.where(a2a, sizes["q"], 0.0), 0.0, 2.0))
        ops.append(Collective(("cp",), "all_to_all", phase, np.where(a2a, sizes["k"], 0.0), 0.0, 2.0))
    return ops


def ring_kv_bytes(model: ModelSpec, axes: dict, cp_kind: np.ndarray, kv_repeat: bool = False) -> np.ndarray:
    """One rank's K/V block as the ring moves it (activation dtype), 0 where the plan runs no ring: the K and V
    the attention kernel receives, with ``kv_repeat`` (torchtitan's repeat_kv before SDPA) the query heads'."""
    from .layer import kv_heads_seen
    tp, cp = axes["tp"], axes["cp"]
    rings = (cp > 1) & (cp_kind == 0)
    kv = np.where(rings, kv_block_bytes(model, tp=tp, cp=cp, micro_batch=axes["micro_batch"],
                                        act_bytes=axes["act_bytes"]), 0.0)
    if kv_repeat:  # the repeated K/V: as many heads as the queries
        kv = kv * kv_heads_seen(model, tp, True) / kv_heads_seen(model, tp, False)
    return kv


def ring_working_bytes(model: ModelSpec, axes: dict, cp_kind: np.ndarray, ring=None,
                       kv_repeat: bool = False) -> np.ndarray:
    """Transient bytes of one layer's ring attention backward on one rank (its peak: the backward holds more
    than the forward), beside the layer's own activations; 0 where the plan runs no ring.

    * the K/V blocks received: all ``cp`` of them with the all-gather rotation (torch
      ``_AllGatherRotater._aggregated_buffer``, the backward's ``kv_rotater`` gathers again), two with the
      per-step exchange (TE ``AttnFuncWithCPAndKVP2P.backward``: ``p2p_comm_buffers[i % 2]`` sent,
      ``[(i + 1) % 2]`` received);
    * the query-gradient accumulator (``grad_bytes`` per element; torch ``grad_query = torch.zeros_like(query,
      dtype=accum_dtype)``);
    * the dK/dV in flight: torch keeps the accumulator, the next message (``torch.cat([grad_key.flatten(),
      grad_value.flatten()])``) and the one received (``dkv_rotater``'s ``permute_tensor`` output): three;
      TE accumulates into the received buffer and sends the other: two (``p2p_comm_buffers[.][1]``);
    * the step's 16-bit gradients out of the attention kernel (``grad_query_``, ``grad_key_``, ``grad_value_``).
    """
    from ..comm_plan import head_dims, local_shapes, cp_tokens
    from .stackterms import RingExchange
    ring = ring or RingExchange()
    act = axes["act_bytes"]
    kv = ring_kv_bytes(model, axes, cp_kind, kv_repeat)
    gb = act if ring.grad_bytes is None else ring.grad_bytes
    q = np.where(kv > 0, cp_tokens(model, axes["cp"], axes["micro_batch"])
                 * local_shapes(model, axes["tp"]).q_heads * head_dims(model)[0], 0.0)  # query elements
    received = (np.asarray(axes["cp"], dtype=float) if ring.allgather else 2.0) * kv
    messages = (3.0 if ring.allgather else 2.0) * kv / act * gb
    return received + q * gb + messages + (q * act + kv)


def moe_layer_collectives(model: ModelSpec, axes: dict, paired: tuple[np.ndarray, np.ndarray] | None = None,
                          fp8_dispatch: bool = False, node_dedup: bool = False,
                          recomputed: np.ndarray | None = None) -> list[Collective]:
    """Expert-parallel collectives of one mixture-of-experts layer on the busiest rank (its routed copies,
    load imbalance included): dispatch and combine all-to-alls over ep (2 forward, 2 backward) and, with expert
    tensor parallelism, the all-gather / reduce-scatter of the received copies over etp. Exposed, unless the
    schedule pairs chunks (``paired`` = this layer's (forward, backward) compute; DualPipe, DeepSeek-V3 report
    section 3.2.1): then a forward chunk's all-to-alls run beside another micro-batch's backward chunk of the
    layer and hide behind its computation, and a backward chunk's behind the forward's.

    ``fp8_dispatch``: of the two all-to-alls of each phase, the one towards the experts moves fp8 (1 byte per
    element), the other 16-bit activations (DeepSeek-V3 report section 3.3.2: dispatch in FP8, combine in BF16;
    in backward the gradients before the down-projections in FP8). ``node_dedup`` with group-limited routing
    (``router_group_topk`` of ``router_groups`` groups, one per node): a token's ``experts_per_token`` copies
    cross the network to at most ``router_group_topk`` nodes, once each, and are forwarded to the experts inside
    the node over NVLink (report section 3.2.2): the all-to-all moves ``router_group_topk / experts_per_token``
    of the copies (the NVLink forwarding is left out)."""
    from .moe import expert_shape
    tp, sp, cp, ep, etp = (axes[k] for k in ("tp", "sp", "cp", "ep", "etp"))
    etp_eff = np.where(etp == 0, tp, etp)
    T = axes["micro_batch"] * float(model.seq_len) / cp
    shape = expert_shape(model, tokens_total=T, tp=tp, sp=sp, ep=ep, etp=etp_eff)
    per_copy = model.hidden_size * axes["act_bytes"]
    sent = per_copy * ((1.0 + axes["act_bytes"]) / (2.0 * axes["act_bytes"]) if fp8_dispatch else 1.0)
    if node_dedup and model.router_group_topk > 0 and model.experts_per_token > 0:
        sent = sent * min(1.0, model.router_group_topk / model.experts_per_token)
    a2a = np.where(ep > 1, shape.copies / etp_eff * sent, 0.0)  # the busiest rank's share
    gathered = np.where(etp_eff > 1, shape.copies * per_copy, 0.0)
    out = []
    for phase in ("fwd", "bwd"):
        hide = 0.0 if paired is None else paired[1] if phase == "fwd" else paired[0]
        out += [Collective(("ep",), "all_to_all", phase, a2a, hide, 2.0),
                Collective(("etp",), "all_gather", phase, gathered, 0.0, 1.0),
                Collective(("etp",), "reduce_scatter", phase, gathered, 0.0, 1.0)]
    if recomputed is not None:  # always listed (zero bytes where not recomputed): one layout for every chunk
        # the MoE forward run again in backward by selective recomputation's ``moe`` module: its dispatch and
        # combine, and the etp gather / scatter, once more, beside the backward's (full recomputation re-runs
        # every forward collective in the schedule: schedule.layer_exposed)
        hide = 0.0 if paired is None else paired[0]
        out += [Collective(("ep",), "all_to_all", "bwd", np.where(recomputed, a2a, 0.0), hide, 2.0),
                Collective(("etp",), "all_gather", "bwd", np.where(recomputed, gathered, 0.0), 0.0, 1.0),
                Collective(("etp",), "reduce_scatter", "bwd", np.where(recomputed, gathered, 0.0), 0.0, 1.0)]
    return out


def _dispatch_buffers(model: ModelSpec, axes: dict) -> np.ndarray:
    from .moe import dispatch_buffer_bytes, expert_shape
    tp, etp = axes["tp"], axes["etp"]
    T = axes["micro_batch"] * float(model.seq_len) / axes["cp"]
    shape = expert_shape(model, tokens_total=T, tp=tp, sp=axes["sp"], ep=axes["ep"],
                         etp=np.where(etp == 0, tp, etp))
    return dispatch_buffer_bytes(model, shape, axes["act_bytes"] / 2.0)


def _mtp_edge(model: ModelSpec, compute: ComputeModel, last: Edge, ec, kind: "_KindCosts", *, tp: np.ndarray,
              T: np.ndarray, dtype: str, emb_local: np.ndarray) -> Edge:
    """Multi-token prediction (DeepSeek-V3 report section 2.2, Megatron-Core ``MultiTokenPredictionBlock``) on
    the last pipeline rank, per module: two RMSNorms and the projection of [embedding; hidden] (2h -> h,
    column-parallel), one transformer layer like the model's last one (its compute, collectives as exposed,
    parameters, routed experts and activations), and the shared output head again (logits GEMM and
    cross-entropy; the head's weights are the model's). The modules embed the shifted tokens, so the last rank
    holds a copy of the input embedding (Megatron-Core ``GPTModel``: ``if self.pre_process or
    self.mtp_process: self.embedding = LanguageModelEmbedding(...)``), which is the first rank's when both are
    one rank (pp = 1) or the output layer's with tied embeddings. Not counted in model FLOPs (MFU counts the
    main model, as DeepSeek's report)."""
    from .layer import _Acc, _linear
    k = float(model.mtp_layers)
    h = float(model.hidden_size)
    acc_f, acc_b = _Acc(tp.size), _Acc(tp.size)
    _linear(acc_f, acc_b, compute, T, h / tp, 2 * h, dtype)
    fwd = k * (acc_f.t + kind.fwd + ec.last_fwd)
    bwd = k * (acc_b.t + kind.bwd + ec.last_bwd)
    comm = last.comm + tuple(dataclasses.replace(c, count=c.count * k, hide=0.0) for c in kind.comm)
    params = k * (kind.params + 2 * h * h / tp + 2 * h)
    embedding = np.zeros(tp.shape) if model.tie_embeddings else emb_local
    buffers = k * (kind.activations + T * h * 2.0 + 4.0 * T * emb_local / h)
    return Edge(fwd=last.fwd + fwd, bwd=last.bwd + bwd, comm=comm, params=last.params + params + embedding,
                shared_params=last.shared_params + embedding, buffer_bytes=last.buffer_bytes + buffers,
                expert_params=k * kind.expert_params,
                high_precision_params=last.high_precision_params + embedding + k * 2 * h)
