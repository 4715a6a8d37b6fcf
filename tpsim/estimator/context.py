"""The estimation context: one model on one cluster with one compute model, calibration and training stack,
and every cache the estimator uses (docs/SCHEMAS.md, section 4).

Caches and their keys:

* **collective curves** (:meth:`EstimationContext.curve`, a :class:`CurveCache`): the :class:`CostCurve` of
  ``op`` over the groups of ``axes`` of a :class:`~tpsim.topology.placement.RankLayout`, with its lower
  envelope; key ``(layout, axes, op)``, for the context's collective model (contexts on one collective model
  share it). Curves come only from ``CollectiveModel.axis_curve`` (the estimator never builds rank groups).
* **layer costs** (:meth:`EstimationContext.layer_rows`): the layer source's costs per key row (tp, sp,
  micro-batch, recompute), computed once per row; key = the row, the batch's dtype and attention.
* **stage results** (:meth:`EstimationContext.memo`): partition and collective times of a set of distinct
  communication patterns; key = the stage name, the key rows' bytes and the batch's dtype and attention;
  least recently used entries are dropped beyond :data:`MEMO_BYTES` of arrays.

Invalidation: a context never changes. Its inputs are immutable objects, and the loaders return a *new* object
when a file changed (``load_cluster`` compares the topology and calibration files' modification times;
``ProfileModel`` and ``Calibration`` are read once), so a changed topology file, calibration or profile is a
different context with empty caches. :func:`context_for` remembers the last :data:`CONTEXTS` contexts by the
identity of their inputs (it holds them, so an identity cannot be reused while remembered);
:meth:`EstimationContext.fingerprint` is the content key (SHA-256 of the inputs' fingerprints) for on-disk use.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..calibration import Calibration, ComputeCalibration
from ..compute.base import ArrayLike, ComputeModel
from ..compute.roofline import RooflineModel
from ..model import ModelSpec
from .caches import MEMO_BYTES, ContextCaches, CurveCache, Envelope, EnvelopeTable, RowStore, array_bytes
from .keys import take_rows
from .source import LayerSource, TransformerSource

CONTEXTS = 32
"""contexts :func:`context_for` keeps."""


class ScaledCompute(ComputeModel):
    """A compute model with a calibration's factors on its kernel times (``measured`` flags unchanged)."""

    def __init__(self, base: ComputeModel, fit: ComputeCalibration):
        self.base = base
        self.fit = fit
        self.source = base.source

    def gemm(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype: str,
             batch: ArrayLike = 1) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.gemm(m, n, k, dtype, batch)
        return t * self.fit.gemm_scale, measured

    def attention(self, batch_heads: ArrayLike, seq: ArrayLike, head_dim: ArrayLike, causal: bool,
                  dtype: str, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.attention(batch_heads, seq, head_dim, causal, dtype, backward)
        return t * self.fit.attention_scale, measured

    def memory(self, kernel: str, numel: ArrayLike, dtype: str,
               backward: bool) -> tuple[np.ndarray, np.ndarray]:
        t, measured = self.base.memory(kernel, numel, dtype, backward)
        return t * self.fit.memory_scale, measured

    def describe(self) -> str:
        return self.base.describe()


@dataclass(frozen=True, kw_only=True, eq=False)
class EstimationContext:
    """Everything fixed while plans vary. Build with :meth:`build` (or :func:`context_for`)."""

    model: ModelSpec
    cluster: Any
    """the :class:`~tpsim.topology.Cluster`."""
    compute: ComputeModel
    """the compute model the stages use (the given one, with the calibration's factors when they apply)."""
    given_compute: ComputeModel | None
    """the compute model as given (None: the device roofline)."""
    roofline: RooflineModel
    """the device roofline: optimizer step and the overlap penalty, whatever serves the kernels."""
    calibration: Calibration | None
    """the calibration in force (the cluster's ``calibration:`` unless one was given)."""
    stack: Any = None
    """the training-stack profile (issue 10); None: Megatron-Core behaviour."""
    flavor: str = "megatron"
    collectives: Any
    """the :class:`~tpsim.collectives.model.CollectiveModel` (with the calibration's link values)."""
    source: LayerSource
    """where layer costs come from."""
    host_overhead_s: float = 0.0
    """host time per layer and micro-batch (the calibration's ``host_overhead_per_layer_us``), seconds."""
    warnings: tuple[str, ...] = ()
    """what every estimate of this context should say (profile of another device, calibration not applied)."""
    caches: ContextCaches = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.caches is None:
            object.__setattr__(self, "caches", ContextCaches(curves=CurveCache(collectives=self.collectives)))
        if self.caches.curves.collectives is not self.collectives:
            raise ValueError("a context's curve cache belongs to another collective model")

    # ---- construction ----------------------------------------------------------------------------------
    @staticmethod
    def build(model: ModelSpec, cluster: Any, compute: ComputeModel | None = None,
              calibration: Calibration | None = None, stack: Any = None, flavor: str = "megatron",
              source: LayerSource | None = None, curves: CurveCache | None = None) -> "EstimationContext":
        """A context for ``model`` on ``cluster``. ``calibration`` defaults to the cluster's own (its file's
        ``calibration:`` key, or ``load_cluster(..., calibration=)``), whose link values the topology already
        holds; another calibration's link values are applied to a collective model of this context.
        ``curves``: a curve cache to share (its collective model is used)."""
        device = cluster.device
        own = getattr(getattr(cluster, "spec", None), "calibration", None)
        cal = calibration if calibration is not None else own
        collectives = curves.collectives if curves is not None else _collective_model(cluster, calibration, own)
        roofline = compute if isinstance(compute, RooflineModel) else RooflineModel(device)
        effective: ComputeModel = compute or roofline
        warnings = list(_profile_warnings(compute, device.name))
        host = 0.0
        fit = cal.compute if cal is not None else None
        if fit is not None:
            reason = _not_applicable(fit, device.name, _stack_name(stack))
            if reason:
                name = cal.path.name if cal.path is not None else "(given)"
                warnings.append(f"calibration {name}: compute section not applied ({reason})")
            else:
                if fit.scales_time:
                    effective = ScaledCompute(effective, fit)
                host = fit.host_overhead_per_layer_us * 1e-6
        return EstimationContext(model=model, cluster=cluster, compute=effective, given_compute=compute,
                                 roofline=roofline, calibration=cal, stack=stack, flavor=flavor,
                                 collectives=collectives, source=source or TransformerSource(model, flavor),
                                 host_overhead_s=host, warnings=tuple(warnings),
                                 caches=None if curves is None else ContextCaches(curves=curves))

    # ---- caches ------------------------------------------------------------------------------------------
    def curve(self, op: str, layout: Any, axes: tuple[str, ...]) -> Envelope:
        """The envelope of ``op`` over the groups of ``axes`` in ``layout`` (cached per (layout, axes, op))."""
        key = (layout, axes, op)
        cache = self.caches.curves
        hit = cache.curves.get(key)
        if hit is None:
            # the curve depends only on the groups of ranks (CollectiveModel.axis_curve): one per distinct set
            groups = np.asarray(layout.groups(axes), dtype=np.int64) if layout.size(*axes) > 1 else None
            digest = (None if groups is None
                      else (groups.shape, hashlib.blake2b(groups.tobytes(), digest_size=16).digest()))
            hit = cache.by_groups.get((digest, op))
            if hit is None:
                hit = cache.by_groups[(digest, op)] = Envelope.of(self.collectives.axis_curve(op, layout, axes),
                                                                  op, self._name_code)
            cache.curves[key] = hit
        return hit

    def envelopes(self, op: str, axes: tuple[str, ...], layouts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(latency, sec_per_byte, name code) arrays (layouts x lines) of ``op`` over ``axes``: each layout's
        envelope, padded to one width (cached per (axes, op), a row per layout)."""
        table = self.caches.curves.tables.setdefault((axes, op), EnvelopeTable())
        for layout in layouts:
            if layout not in table.index:
                table.add(layout, self.curve(op, layout, axes))
        rows = np.fromiter((table.index[layout] for layout in layouts), dtype=np.int64, count=len(layouts))
        return table.latency_s[rows], table.sec_per_byte[rows], table.codes[rows]

    def layout(self, order: str, **sizes: int) -> Any:
        """The :class:`~tpsim.topology.placement.RankLayout` of a plan's axis sizes and rank order (cached)."""
        key = (order, tuple(sorted(sizes.items())))
        layouts = self.caches.curves.layouts
        hit = layouts.get(key)
        if hit is None:
            from ..topology.placement import RankLayout
            hit = layouts[key] = RankLayout.from_order(order, **sizes)
        return hit

    def _name_code(self, text: str) -> int:
        names = self.caches.curves.names
        return names.setdefault(text, len(names))

    @property
    def name_table(self) -> tuple[str, ...]:
        """Every ``"op: algorithm"`` text the context's curves can name, indexed by code."""
        return tuple(self.caches.curves.names)

    def layer_rows(self, keys: np.ndarray, dtype: str, attention: str) -> Any:
        """The layer source's costs for the key rows (columns: the source's ``key_fields``), each row computed
        once per context."""
        store = self.caches.layers.setdefault((dtype, attention), RowStore())
        fields = self.source.key_fields

        def build(missing: np.ndarray) -> Any:
            columns = {f: missing[:, j] for j, f in enumerate(fields)}
            return self.source.costs(self.compute, columns, dtype, attention)

        rows = store.rows(keys, build)
        return take_rows(store.value, rows)

    def memo(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()`` once per ``key`` (least recently used entries beyond MEMO_BYTES are dropped)."""
        caches = self.caches
        hit = caches.memo.get(key)
        if hit is not None:
            caches.memo.move_to_end(key)
            return hit[0]
        value = build()
        size = array_bytes(value)
        caches.memo[key] = (value, size)
        caches.memo_bytes += size
        while caches.memo_bytes > MEMO_BYTES and len(caches.memo) > 1:
            _, (_, dropped) = caches.memo.popitem(last=False)
            caches.memo_bytes -= dropped
        return value

    def clear_results(self) -> None:
        """Forget the stage results (the collective curves stay): what a benchmark of fresh plans needs."""
        self.caches.memo.clear()
        self.caches.memo_bytes = 0

    # ---- identity ----------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """SHA-256 of the inputs' contents: model, cluster (topology files, sizes, calibration it includes),
        compute model (profile points or roofline constants), calibration, stack and flavor."""
        payload = {"model": self.model.to_dict(), "cluster": self.cluster.fingerprint(),
                   "compute": _compute_fingerprint(self.given_compute, self.roofline),
                   "calibration": None if self.calibration is None else self.calibration.fingerprint(),
                   "stack": _stack_name(self.stack), "flavor": self.flavor, "source": self.source.describe()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def compute_source(self) -> str:
        """"roofline" or "profile:<file>" (reported in every estimate)."""
        return self.compute.source


_CONTEXTS: OrderedDict = OrderedDict()
"""identity key -> (context, calibration, stack): the entry holds its inputs, so their ids stay unique."""


def context_for(model: ModelSpec, cluster: Any, compute: ComputeModel | None = None,
                calibration: Calibration | None = None, stack: Any = None,
                flavor: str = "megatron") -> EstimationContext:
    """The context of these inputs, built once and remembered by their identity (see the module docstring).
    A new context on a cluster and calibration a remembered one uses shares its collective model and curve
    cache (a search over compute constants does not rebuild curves)."""
    key = (id(model), id(cluster), id(compute), id(calibration), id(stack), flavor)
    hit = _CONTEXTS.get(key)
    if hit is not None:
        _CONTEXTS.move_to_end(key)
        return hit[0]
    shared = next((c.caches.curves for c, cal, _ in reversed(_CONTEXTS.values())
                   if c.cluster is cluster and cal is calibration), None)
    ctx = EstimationContext.build(model, cluster, compute, calibration, stack, flavor, curves=shared)
    _CONTEXTS[key] = (ctx, calibration, stack)
    if len(_CONTEXTS) > CONTEXTS:
        _CONTEXTS.popitem(last=False)
    return ctx


def _collective_model(cluster: Any, calibration: Calibration | None, own: Calibration | None) -> Any:
    """The cluster's collective model, or one with a calibration's link values that the cluster lacks."""
    from ..collectives.model import CollectiveModel, get_collective_model

    if calibration is None or calibration is own:
        return get_collective_model(cluster)
    return CollectiveModel(cluster, calibration=calibration.link_overrides())


def _stack_name(stack: Any) -> str:
    return "megatron" if stack is None else str(getattr(stack, "name", stack))


def _not_applicable(fit: ComputeCalibration, device: str, stack: str) -> str:
    if fit.device is not None and fit.device != device:
        return f"fitted on device {fit.device}, the cluster has {device}"
    if fit.stack is not None and fit.stack != stack:
        return f"fitted for stack {fit.stack}, the estimate is for {stack}"
    return ""


def _profile_warnings(compute: ComputeModel | None, device: str) -> tuple[str, ...]:
    profile = getattr(compute, "profile", None)
    if profile is None:
        return ()
    from ..compute.profile import profile_device_name, profile_matches_device
    if profile_matches_device(profile, device):
        return ()
    return (f"the kernel profile was measured on {profile_device_name(profile)}, not on the cluster's {device}: "
            f"compute times are that device's",)


def _compute_fingerprint(compute: ComputeModel | None, roofline: RooflineModel) -> str:
    profile = getattr(compute, "profile", None)
    if profile is not None:
        text = repr((profile.meta, profile.points, getattr(compute, "fallback", None) and roofline.eff))
    else:
        text = repr((roofline.device, roofline.eff))
    return hashlib.sha256(text.encode()).hexdigest()
