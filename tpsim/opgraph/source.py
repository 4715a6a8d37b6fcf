"""A traced op graph as the estimator's layer-cost source (:class:`tpsim.estimator.source.LayerSource`).

For graphs shaped like a transformer (one repeated block; the units before it and after it are glue),
:class:`OpGraphSource`: the repeated layer is the block unit, the first edge the glue before it (embedding,
patch projection) and the last edge the glue after it (final norm, output layer, loss): the estimator's own
partition, communication, schedule, memory and totals stages then run on it exactly as on a preset. Any other
graph (ResNets, U-Nets: blocks of different shapes), :class:`UnitSource`: every block instance and glue unit is
a layer and every unit a layer kind, so the partition cuts the layers into the contiguous chunks that balance
their costs and each pipeline rank holds exactly its own units' compute, parameters and activations. Costs per
key row (tp, sp,
micro-batch, recompute) come from :class:`tpsim.opgraph.cost.GraphCosts`; the collectives from the unit
layouts (:mod:`tpsim.opgraph.layout`), each in a fixed slot so that rows computed at different times line up
(the slots are the union, over every TP degree pattern of region fallbacks and both sp values, of the
collectives the layouts issue).
"""

from __future__ import annotations

import numpy as np

from ..compute.base import ComputeModel
from ..compute.roofline import activation_bytes
from ..estimator.keys import distinct
from ..estimator.source import Collective, Edge, LayerCosts, LayerSource
from .cost import GraphCosts, UnitCost, forward_flops
from .layout import Comm as UnitComm
from .layout import unit_layout
from .schema import OpGraph
from .tp import TPPlan, styles_at

MAX_TP = 4096
"""largest TP degree whose region pattern the slots cover (tpsim.limits: tp)."""


def transformer_like(graph: OpGraph) -> int | None:
    """Index of the one repeated unit when every other unit is glue, else None."""
    repeated = [i for i, u in enumerate(graph.units) if u.repeat > 1]
    if len(repeated) != 1:
        return None
    others = [u for i, u in enumerate(graph.units) if i != repeated[0]]
    return repeated[0] if all(u.kind == "glue" for u in others) else None


def _slot(c: UnitComm, k: int) -> tuple:
    return (c.where, c.op, c.phase, c.overlap, c.dtype, c.batched, c.hide, k)


def _slots_of(comms: tuple[UnitComm, ...]) -> dict[tuple, UnitComm]:
    seen: dict[tuple, int] = {}
    out = {}
    for c in comms:
        base = _slot(c, 0)[:-1]
        k = seen.get(base, 0)
        seen[base] = k + 1
        out[base + (k,)] = c
    return out


class _GraphSource(LayerSource):
    """What both traced-graph sources share: FLOPs and tokens, the collective slots, the cost source."""

    key_fields = ("tp", "sp", "micro_batch", "recompute")
    comm_fields = ("tp", "sp", "micro_batch")
    param_fields = ("tp",)

    def __init__(self, graph: OpGraph, plan: TPPlan, flavor: str = "megatron", conv_times=None) -> None:
        self.graph, self.plan, self.flavor = graph, plan, flavor
        self._conv_times = conv_times
        self._costs: dict[int, GraphCosts] = {}
        reps = self._representative_tps()
        self.slots = {u: self._union_slots(u, reps) for u in range(len(graph.units))}

    def describe(self) -> str:
        return f"{type(self).__name__}({self.graph.name}, {self.flavor})"

    # ---- FLOPs and tokens (totals) ----------------------------------------------------------------------
    @property
    def tokens_per_sequence(self) -> int:
        """Tokens per sample (sequence models) or 1 (images: throughput is samples/s)."""
        return self.graph.tokens_per_sample

    def model_flops_per_sequence(self) -> float:
        """3 x the forward matmul FLOPs of one sample (linear, convolution, batched matmul, attention)."""
        return 3.0 * forward_flops(self.graph)[0]

    def recompute_flops_per_sequence(self, recompute: np.ndarray) -> np.ndarray:
        """Full: the blocks' forward again; selective: the attention core's."""
        blocks = forward_flops(self.graph, blocks_only=True)[0]
        core = forward_flops(self.graph)[1]
        rc = np.asarray(recompute)
        return np.where(rc == 2, blocks, np.where(rc == 1, core, 0.0))

    # ---- slots ------------------------------------------------------------------------------------------
    def _representative_tps(self) -> list[int]:
        """One TP degree per distinct pattern of region fallbacks (2 .. MAX_TP): a region is kept at the degrees
        dividing the gcd of its split dims, a vocabulary-parallel embedding up to its row count."""
        import math

        from .tp import split_dims

        gcds = [math.gcd(*(size for _, _, size in split_dims(self.graph.units[r.unit], r))) or 1
                for r in self.plan.regions]
        emb = [op.attrs["num_embeddings"] for u in self.graph.units for op in u.ops if op.kind == "embedding"]
        candidates = {t for g in gcds for t in range(2, min(g, MAX_TP) + 1) if g % t == 0}
        candidates |= {min(n + 1, MAX_TP) for n in emb} | {min(n, MAX_TP) for n in emb}
        candidates.add(next((t for t in range(2, MAX_TP + 1) if all(g % t for g in gcds)), MAX_TP))
        seen: dict[tuple, int] = {}
        for tp in sorted(t for t in candidates if t >= 2):
            pattern = tuple(g % tp == 0 for g in gcds) + tuple(n >= tp for n in emb)
            seen.setdefault(pattern, tp)
        return sorted(seen.values())

    def _union_slots(self, u: int, tps: list[int]) -> list[tuple]:
        slots: dict[tuple, None] = {}
        for tp in tps:
            styles = styles_at(self.graph, self.plan, tp)[0][u]
            for sp in (False, True):
                slots.update(dict.fromkeys(_slots_of(unit_layout(self.graph, u, styles, tp, sp, self.flavor).comms)))
        return list(slots)

    # ---- costs ------------------------------------------------------------------------------------------
    def _graph_costs(self, compute: ComputeModel) -> GraphCosts:
        key = id(compute)
        if key not in self._costs:
            self._costs = {key: GraphCosts(self.graph, self.plan, compute, self.flavor, self._conv_times)}
        return self._costs[key]

    def _fill(self, u: int, comms: tuple[UnitComm, ...], cost: UnitCost, mb: float, act_b: int,
              nbytes: np.ndarray, hide: np.ndarray, at: int = 0) -> None:
        """One row's collective bytes and hiding compute (``cost`` at its micro-batch index ``at``)."""
        index = {s: k for k, s in enumerate(self.slots[u])}
        scale = mb / self.graph.batch
        for slot, c in _slots_of(comms).items():
            k = index[slot]
            nbytes[k] = c.numel * (scale if c.batched else 1.0) * (act_b if c.dtype == "act" else 4.0)
            if c.overlap and self.flavor == "megatron":
                source = cost.wgrad if c.overlap == "wgrad" else cost.dgrad
                hide[k] = sum(float(np.asarray(source[j])[at]) for j in c.hide if j in source)

    def _collectives(self, u: int, nbytes: dict, hide: dict, count: float = 1.0) -> tuple[Collective, ...]:
        """Unit ``u``'s collectives (``hide``: the compute one run overlaps), ``count`` runs per layer."""
        return tuple(Collective(axes=("tp",), op=s[1], phase=s[2], nbytes=nbytes[u][k],
                                hide=hide[u][k] * count if count != 1.0 else hide[u][k], count=count)
                     for k, s in enumerate(self.slots[u]))

    def _tensors(self, units: list[int], per: list[float] | None = None) -> float:
        """Parameter tensors of ``units`` (times ``per`` each; a tensor used by several units counted with its
        first user)."""
        first = _first_users(self.graph)
        total = 0.0
        for i, u in enumerate(units):
            own = {p for op in self.graph.units[u].ops for p in op.params if first[p] == u}
            total += len(own) * (1.0 if per is None else per[i])
        return total


class OpGraphSource(_GraphSource):
    """Layer costs of a transformer-like traced graph (see the module docstring)."""

    def __init__(self, graph: OpGraph, plan: TPPlan, flavor: str = "megatron", conv_times=None) -> None:
        block = transformer_like(graph)
        if block is None:
            raise ValueError(f"{graph.name}: not one repeated block with glue around it")
        super().__init__(graph, plan, flavor, conv_times)
        self.block = block
        self.num_layers = graph.units[block].repeat
        self.before = list(range(block))
        self.after = list(range(block + 1, len(graph.units)))
        self.tensors_per_layer = self._tensors([block])
        """parameter tensors of one block (the optimizer's multi-tensor launches)."""

    def costs(self, compute: ComputeModel, keys: dict[str, np.ndarray], dtype: str, attention: str) -> LayerCosts:  # noqa: ARG002 (a fixed signature)
        gc = self._graph_costs(compute)
        tp, sp, mb, rc = (np.asarray(keys[k]) for k in self.key_fields)
        n = len(tp)
        act_b = activation_bytes(dtype)
        fields = {k: np.zeros(n) for k in ("fwd", "bwd", "rsel", "measured", "act0", "act1", "act2", "params",
                                           "boundary", "gred")}
        edges = {side: {k: np.zeros(n) for k in ("fwd", "bwd", "params", "shared", "buffer")}
                 for side in ("first", "last")}
        slot_bytes = {u: np.zeros((len(s), n)) for u, s in self.slots.items()}
        slot_hide = {u: np.zeros((len(s), n)) for u, s in self.slots.items()}
        for i in range(n):
            t, s, b = int(tp[i]), bool(sp[i]), float(mb[i])
            statics, _ = gc.static(t, s)
            costs = {u: gc.unit_cost(u, t, s, np.array([b]), dtype) for u in range(len(self.graph.units))}
            c = costs[self.block]
            fields["fwd"][i], fields["bwd"][i] = c.fwd[0], c.bwd[0]
            fields["rsel"][i], fields["measured"][i] = c.recompute_selective[0], c.measured[0]
            for r in (0, 1, 2):
                fields[f"act{r}"][i] = c.activation_bytes[r][0]
            fields["params"][i] = statics[self.block].params
            fields["gred"][i] = statics[self.block].grad_reduce_params
            fields["boundary"][i] = c.input_bytes[0] * (t if s else 1) / t  # the 1/tp slice (scatter/gather)
            for side, units in (("first", self.before), ("last", self.after)):
                e = edges[side]
                e["fwd"][i] = sum(float(costs[u].fwd[0]) for u in units)
                e["bwd"][i] = sum(float(costs[u].bwd[0]) for u in units)
                e["params"][i] = _params(statics, units)
                e["buffer"][i] = sum(float(costs[u].activation_bytes[0][0]) for u in units)
            edges["last"]["shared"][i] = _shared(statics, self.before, self.after)
            if t > 1:
                for u in range(len(self.graph.units)):
                    self._fill(u, statics[u].layout.comms, costs[u], b, act_b, slot_bytes[u][:, i],
                               slot_hide[u][:, i])
        full = rc == 2
        recompute = np.where(full, fields["fwd"], np.where(rc == 1, fields["rsel"], 0.0))
        total = fields["fwd"] + fields["bwd"]
        measured = np.where(total > 0, fields["measured"] / np.where(total > 0, total, 1.0), 0.0)
        act = np.where(full, fields["act2"], np.where(rc == 1, fields["act1"], fields["act0"]))
        layer_comm = self._collectives(self.block, slot_bytes, slot_hide)
        first = self._edge(edges["first"], self.before, slot_bytes, slot_hide, shared=np.zeros(n))
        last = self._edge(edges["last"], self.after, slot_bytes, slot_hide, shared=edges["last"]["shared"])
        return LayerCosts(fwd=fields["fwd"], bwd=fields["bwd"], recompute=recompute, measured=measured,
                          comm=layer_comm, params=fields["params"], activations=act,
                          working=np.where(full, fields["act0"], 0.0), boundary_bytes=fields["boundary"],
                          first=first, last=last, grad_sync_params=fields["gred"])

    def _edge(self, e: dict, units: list[int], nbytes: dict, hide: dict, shared: np.ndarray) -> Edge:
        comm = tuple(c for u in units for c in self._collectives(u, nbytes, hide))
        # edges: nothing hides their collectives in the estimator's stages
        comm = tuple(Collective(axes=c.axes, op=c.op, phase=c.phase, nbytes=c.nbytes) for c in comm)
        return Edge(fwd=e["fwd"], bwd=e["bwd"], comm=comm, params=e["params"], shared_params=shared,
                    buffer_bytes=e["buffer"])


class UnitSource(_GraphSource):
    """Layer costs of any traced graph: every block instance and glue unit a layer, every unit a layer kind
    (the partition holds each pipeline rank's own units: ``kind_of_layer``, the ``*_by_kind`` arrays), the
    layers cut into contiguous chunks that balance their forward + backward time at tp = 1 and micro-batch 1
    (:meth:`layer_weights`). Full recomputation checkpoints the blocks; the glue (stem, pooling, classifier,
    loss) keeps its activations and is not run twice, nor are its collectives (``rerun_by_kind``; torchtitan
    ``apply_ac`` wraps only ``model.layers``' blocks in ``checkpoint_wrapper``). Each kind's collectives and
    ZeRO-3 gathers are its own (``comm_by_kind``: a pipeline rank pays its units'); the layer arrays are the means
    over the layers (fixed costs per layer); a stage boundary sends the activations live there (skip
    connections included), split over the TP ranks: the largest of the plan's boundaries (``boundary_by_kind``
    with the partition's ``cuts``). No edges: the glue is layers."""

    def __init__(self, graph: OpGraph, plan: TPPlan, flavor: str = "megatron", conv_times=None) -> None:
        super().__init__(graph, plan, flavor, conv_times)
        repeats = [u.repeat for u in graph.units]
        self.num_layers = int(sum(repeats))
        self.kind_of_layer = np.repeat(np.arange(len(repeats)), repeats)
        self._share = np.array(repeats, dtype=float) / self.num_layers
        self.kind_share = self._share
        """(kinds,) each unit's share of the layers (the mean layer's weights)."""
        self._block = np.array([u.kind == "block" for u in graph.units])
        self._first_user = _first_users(graph)
        self._weights: dict[tuple, tuple[float, ...]] = {}
        self.tensors_per_layer = self._tensors(list(range(len(repeats))), list(self._share))
        """parameter tensors of the mean layer (the optimizer's multi-tensor launches)."""
        self.edge_tensors = 0.0
        """no edges: the glue's tensors are its layers'."""
        owned = [(u, self.graph.params[name]) for name, u in self._first_user.items()]
        self.tensor_numels = np.array([float(np.prod(shape)) for _, shape in owned])
        """elements of every parameter tensor (unsplit; per-parameter ZeRO-3 fetches each one, its hooks)."""
        self.tensor_kinds = np.array([u for u, _ in owned], dtype=np.int64)
        """the unit (layer kind) holding each of :attr:`tensor_numels` (a shared tensor: its first user)."""

    def kernels_per_layer(self) -> tuple[float, float, float]:
        """(forward, backward, forward re-run under full recomputation) kernels of the mean layer (the units'
        :meth:`kernels_per_unit` weighted by their repeats)."""
        mean = self.kernels_per_unit() @ self._share
        return float(mean[0]), float(mean[1]), float(mean[2])

    def kernels_per_unit(self) -> np.ndarray:
        """(3, units) forward, backward and re-run kernels of one instance of each unit (a layer kind): one per op
        forward; in backward two per weight op whose input needs a gradient (data and weight gradients), one per
        other op that needs a gradient; full recomputation re-runs the blocks' forward only."""
        from .cost import grad_flags
        from .schema import WEIGHT_KINDS

        out = np.zeros((3, len(self.graph.units)))
        for u, unit in enumerate(self.graph.units):
            out[0, u] = len(unit.ops)
            out[2, u] = len(unit.ops) if self._block[u] else 0.0
            flags = grad_flags(unit, u)
            out[1, u] = sum(2.0 if op.kind in WEIGHT_KINDS and op.params else 1.0
                            for j, op in enumerate(unit.ops) if flags[j])
        return out

    def layer_weights(self, compute: ComputeModel, dtype: str) -> tuple[float, ...]:
        """Forward + backward seconds of every layer at tp = 1, micro-batch 1 (what the pipeline split balances)."""
        key = (id(compute), dtype)
        if key not in self._weights:
            gc = self._graph_costs(compute)
            one = np.ones(1)
            unit = [float((c.fwd + c.bwd)[0]) for c in (gc.unit_cost(u, 1, False, one, dtype)
                                                        for u in range(len(self.graph.units)))]
            self._weights = {key: tuple(unit[k] for k in self.kind_of_layer)}
        return self._weights[key]

    def costs(self, compute: ComputeModel, keys: dict[str, np.ndarray], dtype: str, attention: str) -> LayerCosts:  # noqa: ARG002 (a fixed signature)
        gc = self._graph_costs(compute)
        tp, sp, mb, rc = (np.asarray(keys[k]) for k in self.key_fields)
        n, n_units = len(tp), len(self.graph.units)
        act_b = activation_bytes(dtype)
        z = lambda: np.zeros((n_units, n))  # noqa: E731
        fwd, bwd, rsel, meas, params, gred, inb = z(), z(), z(), z(), z(), z(), z()
        act = {r: z() for r in (0, 1, 2)}
        slot_bytes = {u: np.zeros((len(s), n)) for u, s in self.slots.items()}
        slot_hide = {u: np.zeros((len(s), n)) for u, s in self.slots.items()}
        pairs = distinct(tp, sp)  # per (tp, sp): every unit once, over the rows' micro-batches at once
        for p, (t, s) in enumerate(pairs.rows.tolist()):
            rows = np.flatnonzero(pairs.inverse == p)
            mbs, at = np.unique(mb[rows].astype(float), return_inverse=True)
            statics, _ = gc.static(t, bool(s))
            for u in range(n_units):
                c = gc.unit_cost(u, t, bool(s), mbs, dtype)
                take = lambda a: np.asarray(a, dtype=float)[at]  # noqa: E731 - the rows' micro-batches
                fwd[u, rows], bwd[u, rows] = take(c.fwd), take(c.bwd)
                rsel[u, rows], meas[u, rows] = take(c.recompute_selective), take(c.measured)
                for r in (0, 1, 2):
                    act[r][u, rows] = take(c.activation_bytes[r])
                inb[u, rows] = take(c.input_bytes) * (t if s else 1) / t  # the 1/tp slice (scatter/gather)
                # a parameter used by several units (tied weights) is held with its first user
                params[u, rows] = sum(v for name, v in statics[u].param_local.items() if self._first_user[name] == u)
                gred[u, rows] = statics[u].grad_reduce_params
                if t > 1:
                    for k, i in enumerate(rows):
                        self._fill(u, statics[u].layout.comms, c, float(mb[i]), act_b, slot_bytes[u][:, i],
                                   slot_hide[u][:, i], int(at[k]))
        full = (rc == 2)[None, :] & self._block[:, None]
        rec_u = np.where(full, fwd, np.where(rc == 1, rsel, 0.0))
        act_u = np.where(full, act[2], np.where(rc == 1, act[1], act[0]))
        w = self._share[:, None]
        mean = lambda a: (w * a).sum(axis=0)  # noqa: E731 - per layer, over the model's layers
        total = fwd + bwd
        measured = np.where(mean(total) > 0, mean(meas) / np.where(mean(total) > 0, mean(total), 1.0), 0.0)
        # full recomputation rebuilds one block's activations at a time: the largest block's
        working = np.where(rc == 2, np.where(self._block[:, None], act[0], 0.0).max(axis=0), 0.0)
        comm = tuple(c for u in range(n_units)
                     for c in self._collectives(u, slot_bytes, slot_hide, count=float(self._share[u])))
        none = Edge(fwd=np.zeros(n), bwd=np.zeros(n), comm=(), params=np.zeros(n), shared_params=np.zeros(n),
                    buffer_bytes=np.zeros(n))
        return LayerCosts(fwd=mean(fwd), bwd=mean(bwd), recompute=mean(rec_u), measured=measured, comm=comm,
                          params=mean(params), activations=mean(act_u), working=working,
                          boundary_bytes=inb[1:].max(axis=0) if n_units > 1 else np.zeros(n),
                          first=none, last=none, expert_params=None, params_by_kind=params,
                          expert_by_kind=np.zeros((n_units, n)), compute_by_kind=total, recompute_by_kind=rec_u,
                          activations_by_kind=act_u, grad_sync_params=mean(gred), gathered_params=params.max(axis=0),
                          boundary_by_kind=inb, fwd_by_kind=fwd, grad_sync_by_kind=gred,
                          comm_by_kind=tuple(self._collectives(u, slot_bytes, slot_hide) for u in range(n_units)),
                          rerun_by_kind=np.repeat(self._block[:, None], n, axis=1))


def _first_users(graph: OpGraph) -> dict[str, int]:
    """Parameter name -> the first unit that uses it."""
    out: dict[str, int] = {}
    for u, unit in enumerate(graph.units):
        for op in unit.ops:
            for name in op.params:
                out.setdefault(name, u)
    return out


def _params(statics: list, units: list[int]) -> float:
    """Parameters one rank holds for these units (a tensor used by two of them once)."""
    seen: dict[str, float] = {}
    for u in units:
        for name, numel in statics[u].param_local.items():
            seen.setdefault(name, numel)
    return sum(seen.values())


def _shared(statics: list, before: list[int], after: list[int]) -> float:
    """Parameters of the glue after the block that the glue before it holds too (tied embeddings)."""
    first = {name for u in before for name in statics[u].param_local}
    seen: dict[str, float] = {}
    for u in after:
        for name, numel in statics[u].param_local.items():
            if name in first:
                seen.setdefault(name, numel)
    return sum(seen.values())
