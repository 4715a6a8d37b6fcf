"""The estimation context: one model on one cluster with one compute model, calibration and training stack,
and every cache the estimator uses (docs/SCHEMAS.md, section 4).

Caches and their keys:

* **collective curves** (:meth:`EstimationContext.curve`, a :class:`CurveCache`): the :class:`CostCurve` of
  ``op`` over the groups of ``axes`` of a :class:`~tpsim.topology.placement.RankLayout`, with its lower
  envelope; key ``(layout, axes, op)``, for the context's collective model (contexts on one collective model
  share it). Curves come only from ``CollectiveModel.axis_curve`` (the estimator never builds rank groups).
* **layer costs** (:meth:`EstimationContext.layer_rows`): the layer source's costs per key row (tp, sp,
  micro-batch, recompute), computed once per row; key = the row, the batch's dtype and attention.
* **communication patterns** (:meth:`EstimationContext.pattern_store`, a :class:`PatternStore`): the partition
  and collective times of each distinct communication pattern, kept across batches (a search's chunks share
  most patterns); key = the pattern's row, the batch's dtype and attention; started again beyond
  :data:`MEMO_BYTES` of arrays.
* **stage results** (:meth:`EstimationContext.memo`): layer costs of a set of layer keys and other per-context
  figures; key = the stage name, the key rows' bytes and the batch's dtype and attention;
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
from typing import Any, Callable, Mapping

import numpy as np

from ..calibration import Calibration, ComputeCalibration
from ..errors import InputError
from ..compute.base import ComputeModel
from ..compute.fixed import LayerTraits, fixed_data, layer_kernel_counts
from ..compute.roofline import RooflineModel
from ..compute.scaled import ScaledCompute
from ..compute.training import achieved_hbm, training_compute
from ..model import ModelSpec
from ..stacks import StackProfile, load_stack
from .caches import (MEMO_BYTES, ContextCaches, CurveCache, Envelope, EnvelopeTable, PatternStore, RowStore,
                     array_bytes)
from .keys import take_rows
from .source import LayerSource, TransformerSource
from .band import BandInputs, band_inputs
from .stackterms import StackTerms, stack_terms

CONTEXTS = 32
"""contexts :func:`context_for` keeps."""


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
    stack: StackProfile
    """the training-stack profile (default ``megatron``)."""
    terms: StackTerms
    """the stack's figures as the stages read them."""
    fixed: "FixedCosts"
    """launches, host time, memory-bound bandwidth of the fixed-cost terms."""
    band: BandInputs
    """the relative uncertainties of the inputs (the error band, :mod:`tpsim.estimator.band`)."""
    flavor: str = "megatron"
    collectives: Any
    """the :class:`~tpsim.collectives.model.CollectiveModel` (with the calibration's link values)."""
    source: LayerSource
    """where layer costs come from."""
    host_overhead_s: float = 0.0
    """host time per layer and micro-batch (the calibration's ``host_overhead_per_layer_us``), seconds."""
    exposed_scale: Mapping[str, float] = field(default_factory=dict)
    """axis (``tp``, ``dp``) -> the calibration's factor on its exposed communication (``tp_exposed_scale``,
    ``dp_exposed_scale``: the achieved overlap; applied by :func:`tpsim.estimator.schedule.schedule`)."""
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
        profile = resolve_stack(stack)
        terms = stack_terms(profile)
        warnings = list(_profile_warnings(compute, device.name))
        if compute is None:
            effective, note = stack_compute(device, profile)
            if note:
                warnings.append(f"compute: {note}")
        else:
            effective = compute
        counts = getattr(source, "kernels_per_layer", None)
        per_kind = getattr(source, "kernels_per_unit", None)
        fixed = FixedCosts.of(model, terms, achieved_hbm(effective, device), counts() if counts else None,
                              per_kind() if per_kind else None)
        from ..compute.training import default_in_situ
        band = band_inputs(effective, device, default_in_situ().loo_rms_pct)
        host = 0.0
        exposed_scale: dict[str, float] = {}
        fit = cal.compute if cal is not None else None
        if fit is not None:
            reason = _not_applicable(fit, device.name, profile.name)
            if reason:
                name = cal.path.name if cal.path is not None else "(given)"
                if "runs_fit" in cal.provenance:  # a fit to measured runs is of one device and stack only
                    raise InputError(f"--calibration {cal.path or name}: {reason} (a calibration from runs "
                                     "applies to its own device and stack)")
                warnings.append(f"calibration {name}: compute section not applied ({reason})")
            else:
                if fit.scales_time:
                    effective = ScaledCompute.of_calibration(effective, fit)
                host = fit.host_overhead_per_layer_us * 1e-6
                exposed_scale = fit.exposed_scales
        return EstimationContext(model=model, cluster=cluster, compute=effective, given_compute=compute,
                                 roofline=roofline, calibration=cal, stack=profile, terms=terms, fixed=fixed,
                                 band=band,
                                 flavor=flavor,
                                 collectives=collectives,
                                 source=source or TransformerSource(
                                     model, flavor, terms.activation_storage,
                                     fp8_dispatch=terms.ep_fp8_dispatch, node_dedup=terms.ep_node_dedup,
                                     ep_overlap=terms.ep_a2a_overlap,
                                     fp8_cast=terms.fp8_cast_bytes, edges=terms.model_edges, kv_repeat=terms.gqa_kv_repeat,
                                     p2p_split=terms.pp_send_split, cp_ring=terms.cp_ring),
                                 host_overhead_s=host, exposed_scale=exposed_scale, warnings=tuple(warnings),
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

    def envelopes(self, op: str, axes: tuple[str, ...], layouts: list,
                  numbers: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(latency, sec_per_byte, name code) arrays (layouts x lines) of ``op`` over ``axes``: each layout's
        envelope, padded to one width (cached per (axes, op), a row per layout). ``numbers``: the layouts'
        :meth:`layout_number` (computed when not given)."""
        table = self.caches.curves.tables.setdefault((axes, op), EnvelopeTable())
        if numbers is None:
            numbers = np.fromiter((self.layout_number(layout) for layout in layouts), dtype=np.int64,
                                  count=len(layouts))
        rows = table.rows(np.asarray(numbers, dtype=np.int64), layouts,
                          lambda layout: self.curve(op, layout, axes))
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

    def layout_number(self, layout: Any) -> int:
        """The layout's number in the curve cache (assigned on first sight; the envelope tables' row key)."""
        ids = self.caches.curves.layout_ids
        number = ids.get(layout)
        if number is None:
            number = ids[layout] = len(ids)
        return number

    def plan_layouts(self, row: tuple[int, ...], build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any, int, int]:
        """(dense layout, expert layout, their numbers) of a (tp, cp, dp, pp, ep, expert tp, order) row, the
        layouts from ``build()`` on first sight."""
        cache = self.caches.curves.plan_layouts
        hit = cache.get(row)
        if hit is None:
            dense, expert = build()
            hit = cache[row] = (dense, expert, self.layout_number(dense), self.layout_number(expert))
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
        return take_rows(*self.kept_layer_rows(keys, dtype, attention))

    def kept_layer_rows(self, keys: np.ndarray, dtype: str, attention: str) -> tuple[Any, np.ndarray]:
        """(the layer costs of every key row the context keeps for ``dtype`` and ``attention``, the row of each
        of ``keys`` in them): the missing rows computed first, nothing gathered."""
        store = self.caches.layers.setdefault((dtype, attention), RowStore())
        fields = self.source.key_fields

        def build(missing: np.ndarray) -> Any:
            columns = {f: missing[:, j] for j, f in enumerate(fields)}
            return self.source.costs(self.compute, columns, dtype, attention)

        rows = store.rows(keys, build)
        return store.value, rows

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

    def constant(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()`` once per ``key`` for what depends on the context alone (no plan): kept for the
        context's life."""
        constants = self.caches.constants
        hit = constants.get(key)
        if hit is None:
            hit = constants[key] = build()
        return hit

    def pattern_store(self, dtype: str, attention: str) -> PatternStore:
        """The kept partition and communication results of the plans of one dtype and attention."""
        return self.caches.patterns.setdefault((dtype, attention), PatternStore())

    def check_stack(self, plan: Any) -> None:
        """Raise the stack's rule line if it cannot run ``plan`` (remembered per plan: estimate's hot path)."""
        checks = self.caches.stack_checks
        if plan not in checks:
            checks[plan] = self.stack.plan_violation(plan, self.model)
            if len(checks) > 4096:
                checks.popitem(last=False)
        problem = checks[plan]
        if problem:
            from ..errors import InputError
            raise InputError(f"stack {problem}")

    def clear_results(self) -> None:
        """Forget the stage results (the collective curves stay): what a benchmark of fresh plans needs."""
        self.caches.memo.clear()
        self.caches.memo_bytes = 0
        self.caches.patterns.clear()

    # ---- identity ----------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """SHA-256 of the inputs' contents: model, cluster (topology files, sizes, calibration it includes),
        compute model (profile points or roofline constants), calibration, stack and flavor."""
        payload = {"model": self.model.to_dict(), "cluster": self.cluster.fingerprint(),
                   "compute": _compute_fingerprint(self.given_compute, self.roofline, self.compute),
                   "calibration": None if self.calibration is None else self.calibration.fingerprint(),
                   "stack": self.stack.fingerprint(), "flavor": self.flavor, "source": self.source.describe()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def compute_source(self) -> str:
        """"kernel:<attention>", "roofline" or "profile:<file>" (reported in every estimate)."""
        return self.compute.source


@dataclass(frozen=True, kw_only=True)
class FixedCosts:
    """Fixed costs of one model under one stack (tpsim/compute/fixed.py, kernels/fixed.yaml): kernels a layer
    launches per micro-batch, the GPU gap per kernel, the host time per op, and the streaming bandwidth of the
    memory-bound fixed costs (optimizer step, gradient accumulation)."""

    kernels_fwd: float
    kernels_bwd: float
    kernels_rerun: float = -1.0
    """forward kernels full recomputation launches again (the checkpointed layers'; negative: ``kernels_fwd``,
    every layer's forward)."""
    gap_s: float
    """GPU-side gap per kernel (fixed.yaml launch.gpu_gap_us)."""
    host_s_per_op: float
    hbm: float
    """achieved streaming bytes/s."""
    kernels_by_kind: np.ndarray | None = None
    """(3, kinds) forward, backward and re-run kernels of one layer of each kind (a traced graph's units; None:
    every layer launches the mean layer's)."""

    @classmethod
    def of(cls, model: ModelSpec, terms: StackTerms, hbm: float,
           kernels: tuple[float, ...] | None = None, by_kind: np.ndarray | None = None) -> "FixedCosts":
        """``kernels``: (forward, backward[, forward re-run under full recomputation]) kernels per layer when
        the layer source counts them (a traced graph's ops); else the stack's count for the model's layer
        traits (full recomputation re-runs every layer's forward). ``by_kind``: (3, kinds) the same per layer
        kind (:attr:`kernels_by_kind`)."""
        if kernels is None:
            traits = LayerTraits.of(model, separate_qkv=terms.kernel_flavor == "eager")
            kernels = layer_kernel_counts(terms.kernel_flavor, traits)
        fwd, bwd = kernels[0], kernels[1]
        rerun = kernels[2] if len(kernels) > 2 else fwd
        return cls(kernels_fwd=fwd, kernels_bwd=bwd, kernels_rerun=rerun, gap_s=fixed_data().launch.gpu_gap_s,
                   host_s_per_op=terms.host_s_per_op, hbm=hbm,
                   kernels_by_kind=None if by_kind is None else np.asarray(by_kind, dtype=float))

    def __post_init__(self) -> None:
        if self.kernels_rerun < 0:
            object.__setattr__(self, "kernels_rerun", self.kernels_fwd)

    def layer(self, device_s: np.ndarray, forward_again: np.ndarray, host_s_per_op: float | None = None,
              by_kind: bool = False, kernels: np.ndarray | None = None) -> np.ndarray:
        """Seconds one layer adds per micro-batch beyond its kernels' execution ``device_s``: the GPU gap of
        every kernel (the forward's again where ``forward_again``: full recomputation) plus the host time the
        GPU waits for (issue time beyond the device time, :func:`tpsim.compute.fixed.exposed_host_time`).
        ``by_kind``: one layer of each kind, its own kernels (``device_s`` and ``forward_again`` (kinds, n));
        ``kernels``: :meth:`kernels` of the same arguments where already known."""
        if kernels is None:
            kernels = self.kernels(forward_again, by_kind)
        gaps = kernels * self.gap_s
        host = kernels * (self.host_s_per_op if host_s_per_op is None else host_s_per_op)
        return gaps + np.maximum(host - (device_s + gaps), 0.0)

    def kernels(self, forward_again: np.ndarray, by_kind: bool = False, forward_only: bool = False) -> np.ndarray:
        """Kernels one layer launches per micro-batch (the forward's again where ``forward_again``), or of them
        the forward's (``forward_only``); ``by_kind``: (kinds, n) one layer of each kind."""
        if by_kind:
            k = self.kernels_by_kind
            fwd, bwd, rerun = k[0][:, None], k[1][:, None], k[2][:, None]
        else:
            fwd, bwd, rerun = self.kernels_fwd, self.kernels_bwd, self.kernels_rerun
        if forward_only:
            return np.broadcast_to(fwd, np.shape(forward_again)) if by_kind else fwd
        return fwd + bwd + np.where(forward_again, rerun, 0.0)


def resolve_stack(stack: Any) -> StackProfile:
    """A :class:`StackProfile` from a profile, a name or path, or None (the default, megatron; resolved once
    per process: the hot path of ``estimate`` does not stat the file)."""
    if isinstance(stack, StackProfile):
        return stack
    if stack is None:
        global _DEFAULT_STACK
        if _DEFAULT_STACK is None:
            _DEFAULT_STACK = load_stack("megatron")
        return _DEFAULT_STACK
    return load_stack(stack)


_DEFAULT_STACK: StackProfile | None = None


def default_compute(device: Any, stack: StackProfile) -> tuple[ComputeModel, str]:
    """The default compute model for ``device`` under ``stack`` (its flash implementation on the device's
    architecture) and a note when part of it falls back to the roofline."""
    impl = stack_terms(stack).attention_kernel(getattr(device, "architecture", None))
    return training_compute(device, impl)


def stack_compute(device: Any, stack: StackProfile) -> tuple[ComputeModel, str]:
    """The compute model a context uses when none is given: :func:`default_compute`, with the stack's eager
    (unfused elementwise) kernels where its profile says so (tpsim/compute/eager.py)."""
    effective, note = default_compute(device, stack)
    if stack_terms(stack).kernel_flavor == "eager":
        from ..compute.eager import EagerKernels
        effective = EagerKernels(effective)
    return effective, note


_CONTEXTS: OrderedDict = OrderedDict()
"""identity key -> (context, calibration, stack): the entry holds its inputs, so their ids stay unique."""


def context_for(model: ModelSpec, cluster: Any, compute: ComputeModel | None = None,
                calibration: Calibration | None = None, stack: Any = None,
                flavor: str = "megatron") -> EstimationContext:
    """The context of these inputs, built once and remembered by their identity (see the module docstring).
    A new context on a cluster and calibration a remembered one uses shares its collective model and curve
    cache (a search over compute constants does not rebuild curves). ``stack``: a profile, name or path
    (None: megatron)."""
    stack = resolve_stack(stack)
    key = (id(model), id(cluster), id(compute), id(calibration), id(stack), flavor)
    hit = _CONTEXTS.get(key)
    if hit is not None:
        _CONTEXTS.move_to_end(key)
        return hit[0]
    shared = next((c.caches.curves for c, cal, _ in reversed(_CONTEXTS.values())
                   if c.cluster is cluster and (cal is calibration or _links_only_own(cal, calibration))), None)
    ctx = EstimationContext.build(model, cluster, compute, calibration, stack, flavor, curves=shared)
    _CONTEXTS[key] = (ctx, calibration, stack)
    if len(_CONTEXTS) > CONTEXTS:
        _CONTEXTS.popitem(last=False)
    return ctx


def _links_only_own(a: Calibration | None, b: Calibration | None) -> bool:
    """Both calibrations give the cluster's links the same values: both leave them as they are (none, or
    compute-only files), or both override the same link types with the same values (a runs fit evaluates
    many factor sets on one set of link efficiencies: one collective model and its curves serve them)."""
    over = lambda c: c.link_overrides() if c is not None else {}  # noqa: E731
    return over(a) == over(b)


def _collective_model(cluster: Any, calibration: Calibration | None, own: Calibration | None) -> Any:
    """The cluster's collective model, or one with a calibration's link values that the cluster lacks."""
    from ..collectives.model import CollectiveModel, get_collective_model

    if calibration is None or calibration is own or not calibration.link_overrides():
        return get_collective_model(cluster)  # a compute-only calibration leaves the links as they are
    return CollectiveModel(cluster, calibration=calibration.link_overrides())


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


def _compute_fingerprint(compute: ComputeModel | None, roofline: RooflineModel, effective: ComputeModel) -> str:
    profile = getattr(compute, "profile", None)
    fallback = getattr(compute, "fallback", None)
    if profile is not None:
        text = repr((profile.meta, profile.points, _model_text(fallback, roofline)))
    else:
        text = _model_text(effective, roofline)
    return hashlib.sha256(text.encode()).hexdigest()


def _model_text(model: ComputeModel | None, roofline: RooflineModel) -> str:
    """What identifies a model compute model: device, kind, in-situ constants (kernel model) or efficiency."""
    in_situ = getattr(model, "in_situ", None)
    if in_situ is not None:
        return repr((roofline.device, model.source, in_situ, getattr(model, "note", "")))
    return repr((roofline.device, getattr(model, "source", None), roofline.eff))
