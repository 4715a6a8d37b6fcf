"""Calibration from measured runs (``tpsim calibrate --from-runs``) and the residuals the error bands use.

**What is fitted.** A few bounded, named factors for one (device, stack), chosen by how many runs are given
(:func:`factors_for`): one run or two fit one overall ``compute_scale`` (every kernel time); three or more fit
``gemm_scale`` (GEMM and fused-attention kernels), ``memory_scale`` (memory-bound kernels) and
``host_overhead_per_layer_us`` (host time per layer and micro-batch the kernels do not hide) and the achieved
overlap of TP and DP communication, ``tp_exposed_scale`` and ``dp_exposed_scale`` (factors on the exposed part
of those collectives, capped at their whole time: tpsim/estimator/schedule.py); ten or more add a separate
``attention_scale``. They are the ``compute:`` factors of a calibration file
(:class:`tpsim.calibration.ComputeCalibration`) and act through the estimator's scaled-compute path, so every verb
that takes ``--calibration`` applies them the same way. Six runs or more that span node counts also fit the link
efficiency of each fabric level (``intra_link_scale``: NVLink inside a node, ``inter_link_scale``: the network;
:data:`LINK_FACTORS`), factors on the efficiency the collective model gives those links, written as the file's
link-type entries (``nvlink: {efficiency}``, ``ib: {efficiency}``) that every verb's collective model reads.

**How.** A Bayesian linear-Gaussian fit (equivalently, ridge-regularized least squares): the step time of each
run is linearized in the factors by forward differences of the estimator around the prior means (and re-linearized
once around the solution when few runs allow it), relative residuals ``(predicted - measured) / measured`` carry a
per-run model error ``sigma`` (a priori :func:`model_sigma`, the pooled within-(device, stack) scatter of the
shipped runs' residuals; pooled with the runs' own scatter when they outnumber the factors), and each factor has a
Gaussian prior from the shipped data (band.yaml ``runs_fit``) so that few runs cannot drive it to nonsense; the
maximum a-posteriori values are clipped to their bounds (an active-set pass), and each factor's uncertainty is
its posterior standard deviation. Leave-one-out: the fit without run i predicts run i.

**Guard.** The full set competes with the set without the link levels and, with 3-9 runs, with
``compute_scale`` plus the TP / DP overlap factors and with one ``compute_scale``, and all of them with no factor
(the uncalibrated model): the one of largest Bayesian evidence (:func:`log_evidence`: the runs' residuals under
each set's prior, against a per-run scatter whose prior is the shipped runs', :func:`model_sigma`) is kept, so a
few runs that happen to agree on a bias smaller than the scatter the shipped families show are not taken as one;
the chosen factors are then blended with their priors by the weight that minimizes the mean leave-one-out
|error|, at most the share of the runs' common residual that carries over to the group's other plans where the
shipped runs have the device and stack (:func:`transfer_weight`); weight 0 is the uncalibrated model, so on the user's runs the calibration is never worse than
uncalibrated out of sample (:func:`fit_runs`). With 3-9 runs each factor is first shrunk toward its prior by
the share of its prior variance the runs remove (:meth:`_SetFit.shrunk`), and a blend under which one of the runs,
left out, is predicted worse than uncalibrated is refused. All of it is decided from the given runs only.

**Residuals for bands.** :func:`shipped_residuals` predicts every run of ``tpsim/data/runs/`` (development set and
SC21 Table 1) with the current, uncalibrated estimator: computed at run time and cached on disk under a hash of the
code and data (they move when the physics does; never written into the repository). A band reads the errors of
the few runs nearest its plan only: :func:`shipped_pool` predicts a run when its error is first read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from dataclasses import field as dataclasses_field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .calibration import Calibration, ComputeCalibration
from .errors import InputError
from .estimator.band import Residual, band_data

if TYPE_CHECKING:  # tpsim.runs (the CSV reader) is imported where runs are read: a cold band does not read them
    from .runs import Run

FIT_KIND = "runs_fit"
"""the top-level key that marks a calibration written by ``calibrate --from-runs``."""


@dataclass(frozen=True)
class Factor:
    name: str
    prior: float
    sigma: float
    low: float
    high: float
    step: float
    """forward-difference step of the linearization."""
    source: str


def factor_table(device: str, stack: str = "",
                 links: Mapping[str, tuple[str, float]] | None = None) -> dict[str, Factor]:
    """The factors and their priors (tpsim/data/band.yaml: the kernel-data and device-transfer sigmas, and the
    ``runs_fit`` priors); on the device and stack of the shipped fit (SC21, megatron-sc21) the GEMM prior is the
    anchored one, elsewhere the in-situ fractions are transferred. ``links``: the fabric levels of the runs'
    cluster (:func:`link_levels`), whose efficiency factors are bounded above by the line rate."""
    from .estimator.reference import sc21_stack

    b = band_data()
    rf = b.runs_fit
    on_fit = device == b.fit_device and stack == sc21_stack().name
    gemm = math.hypot(0.0 if on_fit else b.device_transfer_sigma,
                      b.gemm_sigma["anchored" if on_fit else "transferred"])
    attention = b.attention_sigma.get("other", 0.25)
    memory = float(rf["memory_scale_sigma"])
    overall = math.sqrt(gemm ** 2 + (0.3 * memory) ** 2)
    host = float(rf["host_overhead_sigma_us"])
    exposed = float(rf["exposed_scale_sigma"])
    return {
        "compute_scale": Factor("compute_scale", 1.0, overall, *rf["scale_bounds"], 0.1,
                                "GEMM prior combined with 30% of the memory-bound prior (their time shares)"),
        "gemm_scale": Factor("gemm_scale", 1.0, gemm, *rf["scale_bounds"], 0.1,
                             "band.yaml device_transfer_sigma and gemm_sigma"),
        "attention_scale": Factor("attention_scale", 1.0, attention, *rf["scale_bounds"], 0.1,
                                  "band.yaml attention_sigma.other"),
        "memory_scale": Factor("memory_scale", 1.0, memory, *rf["scale_bounds"], 0.1,
                               "band.yaml runs_fit.memory_scale_sigma"),
        "host_overhead_per_layer_us": Factor("host_overhead_per_layer_us", 0.0, host, 0.0,
                                             float(rf["host_overhead_max_us"]), 50.0,
                                             "band.yaml runs_fit.host_overhead_sigma_us"),
        **{name: Factor(name, 1.0, exposed, *rf["exposed_scale_bounds"], 0.1,
                        "band.yaml runs_fit.exposed_scale_sigma (collective model and stack overlap shares)")
           for name in EXPOSED_FACTORS},
        **{LINK_FACTORS[level]: Factor(
            LINK_FACTORS[level], 1.0, float(rf["link_scale_sigma"]), float(rf["link_scale_bounds"][0]),
            min(float(rf["link_scale_bounds"][1]), 1.0 / eff), 0.1,
            f"band.yaml runs_fit.link_scale_sigma (collective model vs nccl-tests); on {kind} links of nominal "
            f"efficiency {eff:.3f}, at most the line rate")
           for level, (kind, eff) in (links or {}).items()},
    }


EXPOSED_FACTORS = ("tp_exposed_scale", "dp_exposed_scale")
"""the achieved overlap of TP / DP communication: factors on their exposed time (tpsim.calibration)."""


LINK_FACTORS = {"intra": "intra_link_scale", "inter": "inter_link_scale"}
"""fabric level -> the factor on its links' efficiency (the achieved bus bandwidth of NVLink inside a node, of
the network between nodes): written as the calibration's link-type entries, so every verb's collective model
uses them (tpsim.calibration per_type)."""


def factors_for(n: int, levels: Sequence[str] = ()) -> tuple[str, ...]:
    """Which factors ``n`` runs fit (module docstring); ``levels``: the fabric levels the runs exercise
    (:func:`runs_link_levels`), fitted with at least ``runs_fit.link_min_runs`` runs."""
    if n < 3:
        return ("compute_scale",)
    links = tuple(LINK_FACTORS[lv] for lv in LINK_FACTORS if lv in levels) \
        if n >= int(band_data().runs_fit["link_min_runs"]) else ()
    if n < 10:
        return ("gemm_scale", "memory_scale", "host_overhead_per_layer_us") + EXPOSED_FACTORS + links
    return ("gemm_scale", "attention_scale", "memory_scale", "host_overhead_per_layer_us") + EXPOSED_FACTORS \
        + links


def link_levels(cluster: Any) -> dict[str, tuple[str, float]]:
    """The fabric levels of ``cluster`` whose efficiency a runs fit can scale: ``intra`` (the node's GPU links:
    NVLink, else PCIe) and ``inter`` (the network's NIC link type, on a fat-tree or rail fabric), each with its
    link type and the efficiency the collective model gives it today (bandwidth it reaches / line rate: the
    topology's efficiency under NCCL's caps, tpsim/data/nccl_model.yaml, or a calibration's). A level whose
    links do not agree on it (mixed lane counts under the NVLink cap) is left out."""
    from .collectives.links import GB
    from .collectives.model import get_collective_model
    from .topology.node import link_attrs

    rules = get_collective_model(cluster).router.rules
    out: dict[str, tuple[str, float]] = {}
    edges = list(getattr(getattr(cluster, "layout", None), "edges", {}).values())
    kinds = {a.type for a in edges}
    intra = "nvlink" if "nvlink" in kinds else ("pcie" if "pcie" in kinds else None)
    if intra is not None:
        effs = {round(rules.capacity(a.type, float(a.bw_GBps), float(a.efficiency or 1.0), int(a.lanes or 1))
                      / GB / float(a.bw_GBps), 4) for a in edges if a.type == intra and a.bw_GBps}
        if len(effs) == 1:
            out["intra"] = (intra, effs.pop())
    spec = getattr(cluster, "spec", None)
    nic = getattr(getattr(spec, "fabric", None), "nic_link", None)
    if nic is not None and getattr(cluster, "num_nodes", 1) > 1:
        a = link_attrs(nic, 1, spec.default_efficiency, spec.calibration)
        if a.type != intra and a.bw_GBps:
            out["inter"] = (a.type, round(rules.capacity(a.type, float(a.bw_GBps), float(a.efficiency or 1.0),
                                                        int(a.lanes or 1)) / GB / float(a.bw_GBps), 4))
    return out


_LEVELS: dict = {}


def _link_levels_of(cluster: Any) -> dict[str, tuple[str, float]]:
    """:func:`link_levels` of a fit's cluster, remembered (the fit asks once per evaluation)."""
    hit = _LEVELS.get(id(cluster))
    if hit is None or hit[0] is not cluster:
        if len(_LEVELS) > 256:
            _LEVELS.clear()
        hit = _LEVELS[id(cluster)] = (cluster, link_levels(cluster))
    return hit[1]


def runs_link_levels(runs: Sequence[Run]) -> dict[str, tuple[str, float]]:
    """The fabric levels (:func:`link_levels`) a set of runs can identify: those the runs' clusters that have
    them give one link type and efficiency; the intra-node level when some run communicates inside a node, the
    inter-node level when the runs span more than one node count and some run spans nodes."""
    seen: dict[str, set] = {}
    nodes = set()
    for r in runs:
        c = _cluster(r)
        for level, value in _link_levels_of(c).items():  # a one-node run has no inter-node level
            seen.setdefault(level, set()).add(value)
        nodes.add(-(-int(r.gpus) // max(int(getattr(c, "gpus_per_node", 1) or 1), 1)))
    common = {level: next(iter(v)) for level, v in seen.items() if len(v) == 1}
    if "inter" in common and (len(nodes) < 2 or max(nodes) < 2):
        del common["inter"]
    if "intra" in common and not any(r.gpus > 1 for r in runs):
        del common["intra"]
    return common


def compute_calibration(values: Mapping[str, float], device: str | None = None,
                        stack: str | None = None, **extra: Any) -> ComputeCalibration:
    """The calibration ``compute`` section of fitted factor values (``compute_scale`` sets all three kernel
    factors; ``gemm_scale`` without ``attention_scale`` sets both)."""
    from .limits import check_float

    if not isinstance(values, Mapping):
        raise InputError(f"values={type(values).__name__} must be a mapping of factor names to numbers")
    known = ("compute_scale", "gemm_scale", "attention_scale", "memory_scale", "host_overhead_per_layer_us",
             *EXPOSED_FACTORS)
    for name, value in values.items():
        if name not in known:
            raise InputError(f"values: unknown factor {str(name)[:60]!r} (known: {', '.join(known)})")
        host = name == "host_overhead_per_layer_us"  # finite; a fit's step may graze its bound 0
        # an exposed-communication factor may sit at its bound 0 (fully hidden; the calibration file's rule)
        check_float(name, value, "values", minimum=-1e6 if host else 0.0, maximum=1e6 if host else 100.0,
                    inclusive=name in EXPOSED_FACTORS)
    c = values.get("compute_scale")
    gemm = values.get("gemm_scale", c if c is not None else 1.0)
    attention = values.get("attention_scale", gemm)
    memory = values.get("memory_scale", c if c is not None else 1.0)
    return ComputeCalibration(gemm_scale=float(gemm), attention_scale=float(attention), memory_scale=float(memory),
                              host_overhead_per_layer_us=float(values.get("host_overhead_per_layer_us", 0.0)),
                              **{k: float(values[k]) for k in EXPOSED_FACTORS if k in values},
                              device=device, stack=stack, **extra)


def fit_calibration(values: Mapping[str, float], cluster: Any = None,
                    links: Mapping[str, tuple[str, float]] | None = None) -> Calibration:
    """The calibration of fitted factor ``values``: the kernel and overlap factors as its ``compute`` section
    (:func:`compute_calibration`), the link-level factors (:data:`LINK_FACTORS`) as link-type efficiencies,
    ``nominal x factor`` (at most 1), of ``links`` (default: ``cluster``'s :func:`link_levels`). One object per
    distinct input (the estimator remembers contexts by identity)."""
    # a factor at 1 leaves its links as they are (the cluster's own collective model and curves, shared)
    lv = tuple(sorted((level, name) for level, name in LINK_FACTORS.items() if values.get(name, 1.0) != 1.0))
    if lv and links is None:
        links = _link_levels_of(cluster)
    per_type = {}
    for level, name in lv:
        if level in (links or {}):
            kind, eff = links[level]
            per_type[kind] = {"efficiency": min(1.0, eff * float(values[name]))}
    key = (tuple(sorted((k, float(v)) for k, v in values.items())), tuple(sorted(
        (k, v["efficiency"]) for k, v in per_type.items())))
    hit = _CALIBRATIONS.get(key)
    if hit is None:
        if len(_CALIBRATIONS) > 256:
            _CALIBRATIONS.clear()
        kernel = {k: v for k, v in values.items() if k not in LINK_FACTORS.values()}
        hit = _CALIBRATIONS[key] = Calibration(compute=compute_calibration(kernel), per_type=per_type)
    return hit


_CALIBRATIONS: dict = {}


def predict(run: Run, values: Mapping[str, float] | None = None, calibration: Calibration | None = None,
            *, memo: bool = False):
    """The estimate of a run (uncalibrated, with fitted factor ``values``, or with a calibration); ``memo``:
    through the fit's memoized kernel times (the same figures, computed once per shape)."""
    from .estimator import estimate

    cal = calibration
    cluster = _cluster(run) if memo else run.load_cluster()
    if values is not None:
        cal = fit_calibration(values, cluster)
    compute = _fit_compute(run) if memo else None
    if getattr(run.model, "family", "") == "opgraph":  # a traced graph, as `tpsim estimate --model X.ops.json`
        from .opgraph.estimate import estimate_graph
        from .stacks import load_stack

        return estimate_graph(run.model, cluster, run.plan, compute=compute, stack=load_stack(run.stack),
                              calibration=cal)
    return estimate(run.model, cluster, run.plan, stack=run.stack, calibration=cal, compute=compute)


_CLUSTERS: dict = {}


def _cluster(run: Run) -> Any:
    """The run's cluster, loaded once per fit process (``load_cluster`` checks its files' stamps each call)."""
    key = (run.cluster, run.gpus)
    hit = _CLUSTERS.get(key)
    if hit is None:
        hit = _CLUSTERS[key] = run.load_cluster()
    return hit


def _steps(runs: Sequence[Run], values: Mapping[str, float]) -> np.ndarray:
    """Step times of ``runs`` under factor ``values``: one calibration and one estimator context per (model,
    cluster, stack), its runs' plans estimated as one batch (the same figures as :func:`predict` one by one)."""
    from .estimator import context_for
    from .estimator.core import run_stages
    from .plan import PlanBatch
    from .runs import stack_key

    out = np.empty(len(runs))
    groups: dict = {}
    for i, r in enumerate(runs):
        if getattr(r.model, "family", "") == "opgraph":  # a traced graph: its own estimator, one by one
            out[i] = predict(r, calibration=fit_calibration(values, _cluster(r)), memo=True).step_time_s
            continue
        groups.setdefault((id(r.model), r.cluster, r.gpus, stack_key(r.stack)), []).append(i)
    for idx in groups.values():
        first = runs[idx[0]]
        cal = fit_calibration(values, _cluster(first))
        ctx = context_for(first.model, _cluster(first), _fit_compute(first), cal, first.stack)
        plans = [runs[i].plan for i in idx]
        for plan in dict.fromkeys(plans):
            ctx.check_stack(plan)
        out[idx] = run_stages(ctx, PlanBatch.from_plans(plans)).step_time_s
    return out


@dataclass(frozen=True)
class FactorFit:
    name: str
    value: float
    uncertainty: float
    prior: float
    prior_sigma: float
    bounds: tuple[float, float]
    at_bound: bool
    source: str


@dataclass(frozen=True)
class RunResult:
    run_id: str
    measured_s: float
    uncalibrated_s: float
    calibrated_s: float
    loo_error: float
    """relative error of the fit without this run on this run."""
    residual: Residual


@dataclass(frozen=True)
class RunsFit:
    device: str
    stack: str
    factors: tuple[FactorFit, ...]
    runs: tuple[RunResult, ...]
    sigma: float
    """per-run relative model error used by the fit (prior or residual scatter)."""
    warnings: tuple[str, ...]
    seconds: float
    runs_file: str = ""
    blend: float = 1.0
    """the guard's weight of the fitted factors against their priors (0: the uncalibrated model)."""
    links: Mapping[str, tuple[str, float]] = dataclasses_field(default_factory=dict)
    """fabric level -> (link type, nominal efficiency) of the fitted link-level factors (:func:`link_levels`)."""
    method: str = ("Bayesian linear-Gaussian (ridge-regularized least squares on relative step-time residuals, "
                   "Gaussian priors from tpsim/data/band.yaml, bounded by an active-set pass)")

    @property
    def values(self) -> dict[str, float]:
        return {f.name: f.value for f in self.factors}

    def link_entries(self) -> dict[str, dict[str, Any]]:
        """The calibration file's link-type entries of the fitted link levels (``nominal x factor``, at most
        1), with where they come from."""
        values = self.values
        out = {}
        for level, (kind, eff) in self.links.items():
            name = LINK_FACTORS[level]
            out[kind] = {"efficiency": round(min(1.0, eff * float(values[name])), 6),
                         "source": f"tpsim calibrate --from-runs: {name} {values[name]:.4f} x nominal "
                                   f"efficiency {eff:.4f} ({level}-node level)"}
        return out

    def compute_section(self) -> ComputeCalibration:
        loo = np.array([abs(r.loo_error) for r in self.runs])
        kernel = {k: v for k, v in self.values.items() if k not in LINK_FACTORS.values()}
        return compute_calibration(kernel, self.device, self.stack,
                                   leave_one_out={"median_rel": round(float(np.median(loo)), 4),
                                                  "max_rel": round(float(loo.max()), 4), "runs": len(loo)},
                                   source="tpsim calibrate --from-runs")

    def to_yaml_dict(self) -> dict[str, Any]:
        from . import __version__

        section = self.compute_section().to_section()
        section["source"] = "tpsim calibrate --from-runs"
        return {
            **self.link_entries(),
            "compute": section,
            FIT_KIND: {
                "tpsim_version": __version__,
                "runs_file": self.runs_file,
                "device": self.device,
                "stack": self.stack,
                "method": self.method,
                "sigma": round(self.sigma, 5),
                "blend": self.blend,
                "factors": {f.name: {"value": round(f.value, 6), "uncertainty": round(f.uncertainty, 6),
                                     "prior": f.prior, "prior_sigma": round(f.prior_sigma, 6),
                                     "bounds": [f.bounds[0], f.bounds[1]], "at_bound": f.at_bound,
                                     "prior_source": f.source} for f in self.factors},
                "runs": [{"run_id": r.run_id, "measured_s": round(r.measured_s, 6),
                          "uncalibrated_s": round(r.uncalibrated_s, 6), "calibrated_s": round(r.calibrated_s, 6),
                          "loo_error": round(r.loo_error, 6), **r.residual.features()} for r in self.runs],
                "warnings": list(self.warnings),
            },
        }


def _solve(a: np.ndarray, b: np.ndarray, sigma: float, prior_sigma: np.ndarray, lo: np.ndarray,
           hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MAP of b ~ a d (noise sigma), d ~ N(0, prior_sigma^2), d in [lo, hi]: (d, posterior covariance, at_bound)."""
    k = a.shape[1]
    free = np.ones(k, dtype=bool)
    d = np.zeros(k)
    for _ in range(k + 1):
        d = np.clip(d, lo, hi)
        fixed = ~free
        rhs = b - a[:, fixed] @ d[fixed]
        af = a[:, free]
        h = af.T @ af / sigma ** 2 + np.diag(1.0 / prior_sigma[free] ** 2)
        d[free] = np.linalg.solve(h, af.T @ rhs / sigma ** 2)
        out = free & ((d < lo) | (d > hi))
        if not out.any():
            break
        free &= ~out
    at_bound = ~free | (d <= lo) | (d >= hi)
    d = np.clip(d, lo, hi)
    h_all = a.T @ a / sigma ** 2 + np.diag(1.0 / prior_sigma ** 2)
    return d, np.linalg.inv(h_all), at_bound


def _linearize(runs: Sequence[Run], table: Mapping[str, Factor], names: Sequence[str],
               at: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(step times at ``at``, Jacobian d step / d factor) by forward differences of the estimator."""
    s0 = _steps(runs, at)
    jac = np.empty((len(runs), len(names)))
    for j, name in enumerate(names):
        f = table[name]
        moved = dict(at)
        step = f.step if at[name] + f.step <= f.high else -f.step
        moved[name] = at[name] + step
        jac[:, j] = (_steps(runs, moved) - s0) / step
    return s0, jac


MAX_RUN_SPEEDUP = 10.0
"""a run measured more than this factor faster than the uncalibrated model is refused before the fit: the kernel
factors' bounds (band.yaml runs_fit: kernels at most 2.5x faster than the model) cannot explain it, it is a unit
or plan error, and its relative residual swamps the fit (a singular system, a sigma no calibration reader takes).
A slower run is fitted: its residual is at most -100% and the priors hold the factors (tests/test_runfit.py)."""

BLEND_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
"""the weights of the fitted factors against their priors the guard chooses among (0: uncalibrated)."""


@dataclass
class _SetFit:
    """One candidate factor set fitted to the runs (internal to :func:`fit_runs`)."""

    names: tuple[str, ...]
    theta: np.ndarray
    cov: np.ndarray
    bound: np.ndarray
    sigma: float
    s_at: np.ndarray
    jac: np.ndarray
    center: np.ndarray
    loo_theta: list
    """the factors fitted without run i (None where no run is left)."""

    def shrunk(self, p0: np.ndarray, prior_sigma: np.ndarray) -> _SetFit:
        """The set with each factor's offset from its prior (and each leave-one-out refit's) shrunk by the share
        of its prior variance the runs remove, ``1 - posterior variance / prior variance``: a factor the runs
        barely inform (an overlap factor of plans that expose little TP / DP time, one of several that move the
        runs alike) keeps its prior, one they pin down is taken whole (:func:`fit_runs`)."""
        r = np.clip(1.0 - np.diag(self.cov) / prior_sigma ** 2, 0.0, 1.0)
        return dataclasses.replace(self, theta=p0 + r * (self.theta - p0),
                                   loo_theta=[None if t is None else p0 + r * (t - p0) for t in self.loo_theta])

    def loo_errors(self, w: float, p0: np.ndarray, uncal: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Leave-one-out relative errors with the factors blended ``w`` of the way from the priors."""
        out = (uncal - y) / y
        if w == 0.0:
            return out
        for i, t_i in enumerate(self.loo_theta):
            if t_i is not None:
                out[i] = (self.s_at[i] + self.jac[i] @ (p0 + w * (t_i - p0) - self.center) - y[i]) / y[i]
        return out


def _fit_set(runs: Sequence[Run], names: tuple[str, ...], table: Mapping[str, Factor], y: np.ndarray,
             relinearize: bool, base: tuple[np.ndarray, np.ndarray] | None = None) -> _SetFit:
    """The MAP fit of one factor set with its leave-one-out refits (module docstring)."""
    prior = {n: table[n].prior for n in names}
    p0 = np.array([prior[n] for n in names])
    prior_sigma = np.array([table[n].sigma for n in names])
    lo = np.array([table[n].low for n in names])
    hi = np.array([table[n].high for n in names])
    s_at, jac = base if base is not None else _linearize(runs, table, names, prior)
    at = dict(prior)

    def solve(rows: np.ndarray, s_lin: np.ndarray, jac: np.ndarray, at: Mapping[str, float], sigma: float,
              ps: np.ndarray = prior_sigma):
        a = jac[rows] / y[rows, None]
        center = np.array([at[n] for n in names])
        # prior on the factor: d = theta - at, theta ~ N(p0, s): shift the prior mean into the data term
        b = (y[rows] - s_lin[rows]) / y[rows]
        shift = p0 - center
        # solve for e = d - shift with prior N(0, s): b - a shift = a e
        e, cov, bound = _solve(a, b - a @ shift, sigma, ps, lo - p0, hi - p0)
        return center + shift + e, cov, bound

    every = np.arange(len(runs))
    sigma = model_sigma()
    theta, cov, bound = solve(every, s_at, jac, at, sigma)
    if relinearize:
        at = {n: float(v) for n, v in zip(names, theta)}
        s_at, jac = _linearize(runs, table, names, at)
        theta, cov, bound = solve(every, s_at, jac, at, sigma)
    center = np.array([at[n] for n in names])
    dof = len(runs) - len(names)
    if dof > 0:
        # the per-run error the factors cannot remove: the scatter of a nearly unregularized fit (priors 10x
        # wider), so that a common bias the factors do explain is not mistaken for noise
        t_free, _, _ = solve(every, s_at, jac, at, sigma, prior_sigma * 10.0)
        rel = (s_at + jac @ (t_free - center) - y) / y
        # pooled with the prior per-run error (worth calibrated_prior_dof runs): consistent runs tighten it,
        # runs that disagree widen it; never below the measurement repeatability
        nu = float(band_data().residual["calibrated_prior_dof"])
        pooled = math.sqrt((nu * sigma ** 2 + float(rel @ rel)) / (nu + dof))
        sigma = max(float(band_data().runs_fit["run_sigma"]), pooled)
        theta, cov, bound = solve(every, s_at, jac, at, sigma)
    loo_theta: list = []
    for i in range(len(runs)):
        keep = np.array([j for j in range(len(runs)) if j != i], dtype=int)
        loo_theta.append(solve(keep, s_at, jac, at, sigma)[0] if len(keep) else None)
    return _SetFit(names, theta, cov, bound, sigma, s_at, jac, center, loo_theta)


def fit_runs(runs: Sequence[Run], *, runs_file: str = "", relinearize: bool | None = None,
             guard: bool = True, links: bool = True, drop_outlier: bool = True) -> RunsFit:
    """Fit the factors of :func:`factors_for` to ``runs`` (all of one device and stack: a run of another is one
    InputError naming its row). ``relinearize``: one more linearization around the solution (default: when at
    most 30 runs).

    ``guard`` (default): the candidate sets (the full one, without its link levels, and with 3-9 runs
    ``compute_scale`` with the TP / DP overlap factors and one ``compute_scale``) and no factor at all compete by
    their :func:`log_evidence` on the runs (what the runs identify; no factor: the uncalibrated model, factors
    at their priors, ``w = 0``); the chosen factors are then blended with their priors, ``prior + w (fitted - prior)``, ``w`` in :data:`BLEND_GRID` minimizing the mean
    leave-one-out |error|, at most :func:`transfer_weight` (what the shipped runs of the device and stack say
    carries over from ``n`` runs to other plans); ``w = 0`` is the uncalibrated model, so on the user's runs the calibration's
    leave-one-out error is never worse than uncalibrated (with one run nothing is left out: ``w = 1``). With 3-9
    runs the candidates' factors are shrunk by their posterior spread (:meth:`_SetFit.shrunk`) and a ``w`` under
    which some run's leave-one-out |error| exceeds its uncalibrated |error| is refused.
    ``guard=False``: the full set, unblended (the plain Bayesian fit). ``links=False``: no link-level factors
    (a benchmark's comparison). ``drop_outlier`` (with the guard and 3-9 runs): a run the full set fitted to the
    others predicts more than ``runs_fit.outlier_rel`` off and 3x the median leave-one-out |error| is left out
    of the fit (:func:`_without_outlier`); the refit leaves out no other."""
    started = time.perf_counter()
    if not runs:
        raise InputError("no runs to fit")
    from .runs import Run, runs_device_stack

    if isinstance(runs, (str, bytes)) or not all(isinstance(r, Run) for r in runs):
        bad = next((r for r in runs if not isinstance(r, Run)), runs)
        raise InputError(f"runs: {type(bad).__name__} is not a Run (tpsim.runs.load_runs(path))")
    device, stack = runs_device_stack(list(runs))
    links = runs_link_levels(runs) if links else {}
    table = factor_table(device, stack, links)
    rf = band_data().runs_fit
    y = np.array([r.measured for r in runs])
    if relinearize is None:
        relinearize = len(runs) <= 30
    names = factors_for(len(runs), tuple(links))
    links = {lv: v for lv, v in links.items() if LINK_FACTORS[lv] in names}
    base = _linearize(runs, table, names, {n: table[n].prior for n in names})
    uncal = base[0]
    for r, u in zip(runs, uncal):  # before the fit: a run 1e9x faster made its normal equations singular
        if r.measured * MAX_RUN_SPEEDUP < u:
            step = "" if r.measured_as == "step_time_s" else f" (a step time of {r.measured:.4g} s)"
            raise InputError(f"run {r.run_id}{f' (row {r.row})' if r.row else ''}: {r.measured_as}={r.measured_value:g}"
                             f"{step} is more than {MAX_RUN_SPEEDUP:g}x faster than the model's {u:.4g} s step (a "
                             "unit or plan error the bounded factors cannot explain)")
    candidates = [_fit_set(runs, names, table, y, relinearize, base)]
    if guard and links:  # the same without the link levels (what the runs identify, chosen below; on the
        # first linearization: its relinearization would cost as many estimator passes as the full set's)
        keep = [j for j, n in enumerate(names) if n not in LINK_FACTORS.values()]
        candidates.append(_fit_set(runs, tuple(names[j] for j in keep), table, y, False,
                                   (uncal, base[1][:, keep])))
    if guard and 3 <= len(runs) < 10:
        # one overall kernel factor with the achieved TP / DP overlap: what a family whose plans differ in
        # exposed communication (tp 1-8, dp 2-96) identifies before it separates GEMM, memory-bound and host time
        cols = [j for j, n in enumerate(names) if n in EXPOSED_FACTORS]
        candidates.append(_fit_set(runs, ("compute_scale",) + tuple(names[j] for j in cols), table, y, False,
                                   (uncal, np.c_[_compute_scale_column(base[1], names), base[1][:, cols]])))
        candidates.append(_fit_set(runs, ("compute_scale",), table, y, relinearize,
                                   (uncal, _compute_scale_column(base[1], names))))
    evidence = None
    if guard:
        # which set the runs identify, and whether they ask for a calibration at all: the Bayesian evidence of
        # each set against the uncalibrated model (no factor), on the first linearization (Occam: a factor is
        # kept only when the runs' differences from the model need it beyond the per-run scatter the shipped
        # runs of this device and stack show, not when a few runs happen to agree)
        run_sigma = model_sigma(device, stack)
        b = (y - uncal) / y
        cols = {n: base[1][:, j] for j, n in enumerate(names)}
        cols["compute_scale"] = _compute_scale_column(base[1], names)[:, 0]
        evidence = [log_evidence(np.c_[[cols[n] for n in c.names]].T / y[:, None], b,
                                 np.array([table[n].sigma for n in c.names]), run_sigma) for c in candidates]
        none = log_evidence(np.zeros((len(runs), 0)), b, np.zeros(0), run_sigma)
        top = int(np.argmax(evidence))
        order = [candidates[top]] if evidence[top] > none else []
    else:
        order = candidates
    best = None
    caps = []
    few = guard and 3 <= len(runs) < 10  # the sets compete; each factor shrunk, each run a check (docstring)
    if few:
        order = [c.shrunk(np.array([table[n].prior for n in c.names]), np.array([table[n].sigma for n in c.names]))
                 for c in order]
        if drop_outlier:
            full = candidates[0].shrunk(np.array([table[n].prior for n in candidates[0].names]),
                                        np.array([table[n].sigma for n in candidates[0].names]))
            loo1 = np.abs(full.loo_errors(1.0, np.array([table[n].prior for n in full.names]), uncal, y))
            worst = int(np.argmax(loo1))
            if loo1[worst] > float(rf["outlier_rel"]) and loo1[worst] > 3.0 * float(np.median(loo1)):
                return _without_outlier(runs, worst, uncal, started, runs_file=runs_file, relinearize=relinearize,
                                        links=bool(links))
    uncal_err = np.abs((uncal - y) / y)
    for cand in order:
        p0 = np.array([table[n].prior for n in cand.names])
        cap = transfer_weight(device, stack, cand.loo_errors(1.0, p0, uncal, y),
                              float(np.mean(np.log(y / uncal)))) if guard else 1.0
        caps.append(cap)
        for w in (BLEND_GRID[::-1] if guard and len(runs) >= 2 else (1.0,)):
            if w == 0.0 and cand is not order[0]:
                continue
            w = min(w, cap)
            loo_w = np.abs(cand.loo_errors(w, p0, uncal, y))
            if few and w > 0.0 and np.any(loo_w > uncal_err + 1e-9):
                continue  # a blend that predicts one of the runs, left out, worse than uncalibrated is refused
            score = float(np.mean(loo_w))
            # ties: the fuller fit (more factors, then the larger weight)
            if best is None or score < best[0] - 1e-12:
                best = (score, cand, w)
    if best is None:  # the evidence prefers no factor: the uncalibrated model
        best = (0.0, candidates[0], 0.0)
    _, chosen, w = best
    cap = next((c for o, c in zip(order, caps) if o is chosen), 1.0)
    names = chosen.names
    p0 = np.array([table[n].prior for n in names])
    prior_sigma = np.array([table[n].sigma for n in names])
    theta = p0 + w * (chosen.theta - p0)
    sd = w * np.sqrt(np.diag(chosen.cov)) + (1.0 - w) * prior_sigma
    sigma = chosen.sigma
    linear = chosen.s_at + chosen.jac @ (theta - chosen.center)
    loo = chosen.loo_errors(w, p0, uncal, y)
    factors = tuple(FactorFit(n, float(theta[j]), float(sd[j]), table[n].prior, table[n].sigma,
                              (table[n].low, table[n].high), bool(chosen.bound[j]) and w == 1.0, table[n].source)
                    for j, n in enumerate(names))
    results = tuple(RunResult(r.run_id, float(y[i]), float(uncal[i]), float(linear[i]), float(loo[i]),
                              residual_of(r, float(linear[i])))
                    for i, r in enumerate(runs))
    warnings = _warnings(runs, loo, factors)
    full = candidates[0].names
    if evidence is not None and not order:
        warnings.append(f"guard: the runs' differences from the uncalibrated model are within the per-run scatter "
                        f"of the shipped runs of {device} / {stack} ({100 * run_sigma:.1f}%): no factor is fitted "
                        f"(log evidence of {', '.join(candidates[top].names)}: {evidence[top] - none:+.2f} "
                        "against none)")
    elif names != full:
        warnings.append(f"{len(runs)} runs do not identify {', '.join(full)} separately (their leave-one-out "
                        f"errors are smaller with {', '.join(names)}): {', '.join(names)} "
                        f"{'is' if len(names) == 1 else 'are'} fitted")
    if w < 1.0 and (evidence is None or order):
        uncal_loo = float(np.median(np.abs((uncal - y) / y)))
        warnings.append(f"guard: the fitted factors are taken {100 * w:.0f}% of the way from their priors ("
                        + (f"at most {100 * cap:.0f}%: the share of a run's residual its device and stack's shipped "
                           f"runs show carrying over to their other plans; " if w >= cap - 1e-12 and cap < 1.0 else
                           "the leave-one-out error is smallest there; ")
                        + f"uncalibrated median |error| {100 * uncal_loo:.1f}%)"
                        + ("; the calibration is the uncalibrated model" if w == 0.0 else ""))
    for i, r in enumerate(runs):
        err = (linear[i] - y[i]) / y[i]
        if abs(err) > float(rf["outlier_rel"]):
            warnings.append(f"run {r.run_id} (row {r.row}): the fitted factors leave it at {100 * err:+.1f}% (the "
                            "priors keep them from explaining it: check its plan and measurement)")
    for f in factors:
        if abs(f.value - f.prior) > 3.0 * f.prior_sigma:
            warnings.append(f"factor {f.name} = {f.value:.3g} is more than 3 prior sigmas from {f.prior:g} "
                            "(a physics gap the factor absorbs, or a wrong plan)")
    return RunsFit(device=device, stack=stack, factors=factors, runs=results, sigma=sigma,
                   warnings=tuple(warnings), seconds=time.perf_counter() - started, runs_file=runs_file,
                   blend=w, links={lv: v for lv, v in links.items() if LINK_FACTORS[lv] in names})


def _without_outlier(runs: Sequence[Run], worst: int, uncal: np.ndarray, started: float, **kw: Any) -> RunsFit:
    """The fit of ``runs`` without run ``worst`` (one the others' full-set fit predicts far off: a feature the
    factors do not represent, or a wrong plan or measurement), reported with every run: the left-out run's
    leave-one-out error is the refit's prediction of it."""
    rest = [r for i, r in enumerate(runs) if i != worst]
    sub = fit_runs(rest, drop_outlier=False, **kw)
    out = runs[worst]
    pred = float(_steps([out], sub.values)[0]) if sub.values else float(uncal[worst])
    y = out.measured
    loo = (pred - y) / y
    results = list(sub.runs)
    results.insert(worst, RunResult(out.run_id, float(y), float(uncal[worst]), pred, loo, residual_of(out, pred)))
    warnings = [f"run {out.run_id} (row {out.row}) is left out of the fit: the other runs' fit predicts it "
                f"{100 * loo:+.1f}% off (more than {100 * float(band_data().runs_fit['outlier_rel']):.0f}% and 3x "
                "the others' leave-one-out errors): a feature the factors do not represent, or a wrong plan or "
                "measurement"] + list(sub.warnings)
    return dataclasses.replace(sub, runs=tuple(results), warnings=tuple(warnings),
                               seconds=time.perf_counter() - started)


def transfer_weight(device: str, stack: str, loo: np.ndarray, common: float) -> float:
    """How much of the runs' common residual carries over to another plan of their device and stack: the
    weight of the best linear predictor of a plan's residual from the mean of ``n`` runs, ``n rho / (1 + (n - 1)
    rho)``, ``rho`` the share of a run's residual variance that runs share. Variance components (posterior
    means, the shipped runs' values worth ``residual_bands.calibrated_prior_dof`` runs): each run's own,
    the nugget of the group's variogram (:func:`shipped_variogram`) pooled with the fit's leave-one-out errors
    ``loo``; the shared, the group's mean squared residual less its nugget pooled with the runs' ``common``
    (their mean log residual) squared less its noise. Runs that agree with the fit (small leave-one-out errors,
    a large common residual) are taken nearly whole; three runs of a group whose residuals are mostly each
    run's own (H100 Megatron-Core: nugget 0.011 of 0.015) are taken part of the way. 1 where the shipped runs
    have no variogram of the group (a family they lack)."""
    own = shipped_variogram().groups.get((device, stack))
    n = len(loo)
    e = np.array([r.error for r in shipped_residuals() if (r.device, r.stack) == (device, stack)])
    if own is None or n < 1 or not len(e):
        return 1.0
    nu = float(band_data().residual["calibrated_prior_dof"])
    nugget = float(own[0])
    own2 = (nu * nugget + float(np.sum(np.square(loo)))) / (nu + n)
    shared = max(float(np.mean(e ** 2)) - nugget, 0.0)
    shared2 = (nu * shared + n * max(common ** 2 - own2 / n, 0.0)) / (nu + n)
    if shared2 + own2 <= 0:
        return 1.0
    rho = shared2 / (shared2 + own2)
    return float(n * rho / (1.0 + (n - 1) * rho))


def log_evidence(a: np.ndarray, b: np.ndarray, prior_sigma: np.ndarray, sigma: float | None = None,
                 dof: float | None = None) -> float:
    """Log marginal likelihood (up to a constant of the runs alone) of relative residuals ``b = a d + noise``
    with factor offsets ``d ~ N(0, diag(prior_sigma^2))`` and per-run noise of unknown scale whose prior is
    ``sigma`` (default :func:`model_sigma`) worth ``dof`` runs (default band.yaml
    ``residual_bands.calibrated_prior_dof``): the multivariate Student-t of scale matrix ``sigma^2 I + a S
    a^T``. ``a`` with no column: the model without factors (the uncalibrated one)."""
    s = model_sigma() if sigma is None else float(sigma)
    nu = float(band_data().residual["calibrated_prior_dof"]) if dof is None else float(dof)
    n = len(b)
    cov = s * s * np.eye(n) + (a * prior_sigma ** 2) @ a.T
    _, logdet = np.linalg.slogdet(cov)
    q = float(b @ np.linalg.solve(cov, b))
    return float(-0.5 * logdet - 0.5 * (nu + n) * math.log1p(q / nu))


def _compute_scale_column(jac: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """d step / d compute_scale from the per-kernel columns (compute_scale moves every kernel factor at once;
    the host overhead is not a kernel time)."""
    cols = [j for j, n in enumerate(names) if n in ("gemm_scale", "attention_scale", "memory_scale")]
    return jac[:, cols].sum(axis=1, keepdims=True)


def _warnings(runs: Sequence[Run], loo: np.ndarray, factors: Sequence[FactorFit]) -> list[str]:
    rf = band_data().runs_fit
    out = []
    mags = np.abs(loo)
    median = float(np.median(mags))
    for r, e in zip(runs, loo):
        if abs(e) > float(rf["outlier_rel"]) and abs(e) > 3.0 * median:
            out.append(f"run {r.run_id} (row {r.row}) disagrees with the others: leave-one-out error "
                       f"{100 * e:+.1f}% (median |error| {100 * median:.1f}%); check its plan and measurement")
    if len(runs) >= 3:
        feats = np.array([_span_features(r) for r in runs])
        labels = ("parameters", "gpus", "tp", "cp", "pp", "sequence")
        for i, r in enumerate(runs):
            others = np.delete(feats, i, axis=0)
            outside = []
            for j, label in enumerate(labels):
                lo_, hi_ = others[:, j].min(), others[:, j].max()
                if feats[i, j] < lo_ * 0.999 or feats[i, j] > hi_ * 1.001:
                    outside.append(f"{label} {_fmt(feats[i, j])} (others {_fmt(lo_)}-{_fmt(hi_)})")
            if outside:
                out.append(f"run {r.run_id} (row {r.row}) is outside the other runs' span: {', '.join(outside)}; "
                           "its leave-one-out error extrapolates")
    for f in factors:
        if f.at_bound:
            side = "lower" if f.value <= f.bounds[0] else "upper"
            out.append(f"factor {f.name} stopped at its {side} bound {f.value:g} (the runs ask for "
                       f"{'less' if side == 'lower' else 'more'} than the bounds allow)")
    if len(runs) < 3:
        out.append(f"{len(runs)} run(s): only compute_scale is fitted (3 or more runs fit the GEMM, memory-bound "
                   "and host-overhead factors and the TP / DP overlap)")
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x < 1e4 else f"{x:.3e}"


def _span_features(r: Run) -> tuple[float, ...]:
    return (float(r.model.total_params()), float(r.gpus), float(r.plan.tp), float(r.plan.cp), float(r.plan.pp),
            float(r.model.seq_len))


def residual_of(run: Run, predicted: float) -> Residual:
    """The band residual of a run: log(measured / predicted) with the features that group it."""
    from .runs import stack_name

    return Residual(run_id=run.run_id, device=run.device, stack=stack_name(run.stack),
                    params=float(run.model.total_params()), gpus=run.gpus, tp=run.plan.tp, cp=run.plan.cp,
                    pp=run.plan.pp, error=math.log(run.measured / predicted), dtype=run.plan.dtype,
                    recompute=run.plan.recompute, seq_len=int(run.model.seq_len))


# ------------------------------------------------------------------------------------------- shipped residuals

SHIPPED_FILE = Path(__file__).resolve().parent / "data" / "runs" / "shipped_residuals.json"
"""every shipped run's residual features and error under the code it was written with (its ``code_hash``): a
cold ``tpsim plan`` reads the band's errors from it instead of predicting the runs (issue 21). Regenerated by
``python tests/test_shipped_residuals.py --write``; that test fails when the file is not what the current code
computes. A file of other code (another hash) is ignored."""
_NOT_KEYED = ("validate", "profiler", "bench", "cli", "report", "search", "__pycache__", SHIPPED_FILE.name)
"""packages (and the shipped residuals themselves) that cannot change an uncalibrated prediction of a run."""
_HASH: list = []


def code_hash() -> str:
    """The hash of the code an uncalibrated run prediction depends on (once per process)."""
    from .parsecache import package_hash

    if not _HASH:
        _HASH[:] = [package_hash(_NOT_KEYED)]
    return _HASH[0]


def _cache_path() -> Path | None:
    from .parsecache import cache_dir

    folder = cache_dir()
    if folder is None:
        return None
    return folder.parent / "residuals" / f"{code_hash()[:32]}.json"


def _checked(data: Any) -> tuple[list, dict[int, float]]:
    """The features and errors of a residuals document (KeyError / TypeError / ValueError when malformed)."""
    features = [dict(f) for f in data["features"]]
    errors = {int(k): float(v) for k, v in data["errors"].items()}
    for f in features:  # every field present
        for name in _ShippedResidual.__slots__[2:]:
            f[name]
    return features, errors


def _read_shipped() -> tuple[list, dict[int, float]] | None:
    """The shipped file's features and errors when it was written by this code and holds every run's error."""
    try:
        data = json.loads(SHIPPED_FILE.read_text())
        if data.get("code_hash") != code_hash():
            return None
        features, errors = _checked(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return (features, errors) if set(errors) == set(range(len(features))) else None


def shipped_residuals_document() -> dict:
    """What :data:`SHIPPED_FILE` holds for the current code: every shipped run predicted now (no cache)."""
    pool = _ShippedPool(use_cache=False)
    for i in range(len(pool.items)):
        pool.error(i)
    return {"code_hash": code_hash(), "features": pool.features,
            "errors": {str(k): v for k, v in sorted(pool.errors.items())}}


class _ShippedResidual:
    """One shipped run's residual whose ``error`` (one uncalibrated prediction of the run) is computed when first
    read: a plan's band needs the errors of the few runs nearest the plan only (:func:`residual_band`), so a
    cold ``tpsim plan`` predicts those runs, not all of them. Features as :class:`Residual` (its ``distance``)."""

    __slots__ = ("pool", "index", "run_id", "device", "stack", "params", "gpus", "tp", "cp", "pp", "dtype",
                 "recompute", "seq_len")
    distance = Residual.distance
    features = Residual.features

    def __init__(self, pool: "_ShippedPool", index: int, features: Mapping[str, Any]):
        self.pool, self.index = pool, index
        for name in self.__slots__[2:]:
            setattr(self, name, features[name])

    @property
    def error(self) -> float:
        return self.pool.error(self.index)

    def residual(self) -> Residual:
        return Residual(**self.features(), error=self.error)


class _ShippedPool:
    """The shipped runs' residual features and the errors known so far, in this process and on disk (one JSON
    file under the code hash, :func:`_cache_path`; rewritten as errors are added)."""

    def __init__(self, use_cache: bool):
        self.path = _cache_path() if use_cache else None
        self.runs: list[Run] | None = None
        features: list | None = None
        self.errors: dict[int, float] = {}
        if self.path is not None and self.path.is_file():
            try:
                features, self.errors = _checked(json.loads(self.path.read_text()))
            except (OSError, ValueError, TypeError, KeyError, AttributeError):  # a malformed file is ignored
                features, self.errors = None, {}
        if features is None and use_cache:
            shipped = _read_shipped()
            if shipped is not None:
                features, self.errors = shipped
        if features is None:
            features = [residual_of(r, r.measured).features() for r in self._runs()]
            self._save(features)
        self.features = features
        self.items = tuple(_ShippedResidual(self, i, f) for i, f in enumerate(features))

    def _runs(self) -> list[Run]:
        if self.runs is None:
            from .runs import shipped_runs

            self.runs = list(shipped_runs())
        return self.runs

    def error(self, index: int) -> float:
        hit = self.errors.get(index)
        if hit is None:
            run = self._runs()[index]
            hit = self.errors[index] = residual_of(run, predict(run).step_time_s).error
            self._save(self.features)
        return hit

    def _save(self, features: list) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"features": features,
                                       "errors": {str(k): v for k, v in sorted(self.errors.items())}}))
            os.replace(tmp, self.path)
        except OSError:
            pass


_POOL: list = []
"""the shipped runs' :class:`_ShippedPool` of this process (the code does not change while it runs)."""


def shipped_pool() -> tuple[_ShippedResidual, ...]:
    """The shipped runs' residuals with each error computed when first read (what a band of one plan needs);
    cached on disk under the code hash like :func:`shipped_residuals`."""
    if not _POOL:
        _POOL[:] = [_ShippedPool(use_cache=True)]
    return _POOL[0].items


def shipped_residuals(use_cache: bool = True) -> tuple[Residual, ...]:
    """Residuals of every shipped run (development set and SC21) under the current uncalibrated estimator;
    cached on disk under the code hash (``TPSIM_CACHE_DIR=off`` disables the cache)."""
    items = shipped_pool() if use_cache else _ShippedPool(use_cache=False).items
    return tuple(r.residual() for r in items)


_SIGMA: dict = {}


def model_sigma(device: str | None = None, stack: str | None = None) -> float:
    """The per-run relative error a fit of factors cannot remove, a priori: the pooled within-(device, stack)
    standard deviation of the shipped runs' residuals under the current estimator (what one overall factor per
    device and stack leaves), never below band.yaml ``runs_fit.run_sigma`` (measurement repeatability).

    With ``device`` and ``stack`` whose group the shipped runs hold (at least band.yaml
    ``residual_bands.min_runs`` runs): that group's own within-group scatter, pooled with the value above as a
    prior worth ``residual_bands.calibrated_prior_dof`` runs: families scatter differently, and a bias that
    stands out of a tight family's scatter is one, while the same bias in a scattered family is not
    (``benchmarks/band_coverage.py --spread`` prints each group's)."""
    key = (device, stack) if device is not None and stack is not None else None
    if key in _SIGMA:
        return _SIGMA[key]
    groups: dict = {}
    for r in shipped_residuals():
        groups.setdefault((r.device, r.stack), []).append(r.error)
    floor = float(band_data().runs_fit["run_sigma"])
    if None not in _SIGMA:
        ss = sum(float(((np.array(v) - np.mean(v)) ** 2).sum()) for v in groups.values())
        dof = sum(len(v) - 1 for v in groups.values())
        _SIGMA[None] = max(floor, math.sqrt(ss / dof) if dof > 0 else 0.0)
    value = _SIGMA[None]
    own = groups.get(key) if key is not None else None
    if own is not None and len(own) >= int(band_data().residual["min_runs"]):
        nu = float(band_data().residual["calibrated_prior_dof"])
        e = np.array(own)
        value = max(floor, math.sqrt((nu * value ** 2 + float(((e - e.mean()) ** 2).sum())) / (nu + len(e) - 1)))
    _SIGMA[key] = value
    return value


def calibrated_sigma(calibration: Calibration | None) -> float | None:
    """The per-run error a runs-fit calibration was fitted with (None for other calibrations)."""
    data = calibration.provenance.get(FIT_KIND) if calibration is not None else None
    if not isinstance(data, Mapping):
        return None
    try:
        value = float(data.get("sigma", band_data().runs_fit["run_sigma"]))
    except (TypeError, ValueError):
        raise InputError(f"{calibration.path}: {FIT_KIND}.sigma must be a number") from None
    if not (math.isfinite(value) and 0 < value < 10):
        raise InputError(f"{calibration.path}: {FIT_KIND}.sigma={value!r} must be a positive number")
    return value


def calibrated_blend(calibration: Calibration | None) -> float | None:
    """The guard's blend weight a runs-fit calibration was written with (0: every factor at its prior, the
    uncalibrated model; None for other calibrations; a file without it: 1, the plain fit)."""
    data = calibration.provenance.get(FIT_KIND) if calibration is not None else None
    if not isinstance(data, Mapping):
        return None
    try:
        value = float(data.get("blend", 1.0))
    except (TypeError, ValueError):
        raise InputError(f"{calibration.path}: {FIT_KIND}.blend must be a number") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InputError(f"{calibration.path}: {FIT_KIND}.blend={value!r} must be between 0 and 1")
    return value


def calibrated_residuals(calibration: Calibration | None) -> tuple[Residual, ...] | None:
    """The leave-one-out residuals a runs-fit calibration carries (None for another kind of calibration)."""
    if calibration is None:
        return None
    data = calibration.provenance.get(FIT_KIND)
    if not isinstance(data, Mapping):
        return None
    calibrated_sigma(calibration)  # checked here, with the runs
    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{calibration.path}: {FIT_KIND}.runs must list the fitted runs (it is empty or not a list)")
    out = []
    for r in entries:
        try:
            # the run's leave-one-out error as a log residual: measured / predicted = 1 / (1 + loo)
            out.append(Residual(run_id=str(r["run_id"]), device=str(r["device"]), stack=str(r["stack"]),
                                params=float(r["params"]), gpus=int(r["gpus"]), tp=int(r["tp"]), cp=int(r["cp"]),
                                pp=int(r["pp"]), error=-math.log1p(float(r["loo_error"])),
                                dtype=str(r.get("dtype", "")), recompute=str(r.get("recompute", "")),
                                seq_len=int(r.get("seq_len", 0))))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{calibration.path}: {FIT_KIND}.runs: an entry lacks run_id, device, stack, params, "
                             "gpus, tp, cp, pp or loo_error") from None
    return tuple(out)


_VARIOGRAM: list = []


def shipped_variogram():
    """The :class:`tpsim.estimator.band.Variogram` of the shipped runs' residuals (computed once per process)."""
    from .estimator.band import fit_variogram

    if not _VARIOGRAM:
        _VARIOGRAM[:] = [fit_variogram(shipped_residuals())]
    return _VARIOGRAM[0]


def plan_band(residuals: Sequence[Residual] | None, *, model: Any, cluster: Any, plan: Any, stack: str,
              calibration: Calibration | None = None, exclude: str | None = None, variogram: Any = None):
    """The residual band of one plan: the runs of a runs-fit ``calibration`` (their leave-one-out residuals and
    distances from the plan, :func:`tpsim.estimator.band.calibrated_band`, kind ``calibrated``), else
    ``residuals`` (default: the shipped runs, kind ``residuals``). ``variogram``: in place of the shipped
    runs' (a benchmark leaving a group out)."""
    from .estimator.band import calibrated_band, residual_band

    own = calibrated_residuals(calibration)
    if own:
        return calibrated_band(own, variogram or shipped_variogram(), params=float(model.total_params()),
                               gpus=int(cluster.num_gpus), tp=plan.tp, cp=plan.cp, pp=plan.pp, dtype=plan.dtype,
                               recompute=plan.recompute, seq_len=int(model.seq_len), exclude=exclude,
                               corrected=calibrated_blend(calibration) != 0.0)
    pool = residuals if residuals is not None else shipped_pool()
    return residual_band(pool, device=cluster.device.name, stack=stack, params=float(model.total_params()),
                         gpus=int(cluster.num_gpus), tp=plan.tp, cp=plan.cp, pp=plan.pp, dtype=plan.dtype,
                         recompute=plan.recompute, seq_len=int(model.seq_len), kind="residuals", exclude=exclude)


def banded(result: Any, model: Any, cluster: Any, calibration: Calibration | None = None) -> Any:
    """The estimate with its band from residuals (docs/MODEL.md "Error band"): the calibration in force is
    the cluster's (``--calibration``) unless given."""
    from .estimator.band import apply_band

    cal = calibration if calibration is not None else getattr(getattr(cluster, "spec", None), "calibration", None)
    return apply_band(result, plan_band(None, model=model, cluster=cluster, plan=result.plan, stack=result.stack,
                                        calibration=cal))


def band_plan_dicts(plans: Sequence[dict], model: Any, cluster: Any, stack: str) -> None:
    """Replace the band of ``tpsim plan --json`` plan objects (``Estimate.to_dict`` keys) by the residual band,
    in place, with its ``band_basis``: the calibration in force is the cluster's (``--calibration``)."""
    cal = getattr(getattr(cluster, "spec", None), "calibration", None)
    from types import SimpleNamespace

    for d in plans:
        p = d.get("plan") or {}
        plan = SimpleNamespace(tp=int(p.get("tp", d.get("tp", 1))), cp=int(p.get("cp", d.get("cp", 1))),
                               pp=int(p.get("pp", d.get("pp", 1))), dtype=str(p.get("dtype", "")),
                               recompute=str(p.get("recompute", d.get("recompute", ""))))
        gpus = int(d.get("gpus") or cluster.num_gpus)
        sized = SimpleNamespace(device=cluster.device, num_gpus=gpus)
        b = plan_band(None, model=model, cluster=sized, plan=plan, stack=stack, calibration=cal)
        step = d.get("step_time_s")
        if not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
            continue
        lo, hi = step * b.low_factor, step * b.high_factor
        d["step_time_s_low"], d["step_time_s_high"] = lo, hi
        for key in ("tokens_per_s", "mfu"):
            if isinstance(d.get(key), (int, float)):
                d[f"{key}_low"], d[f"{key}_high"] = d[key] * step / hi, d[key] * step / lo
        d["band_basis"] = b.basis


_COMPUTE: dict = {}


def _fit_compute(run: Run) -> Any:
    """One memoized default compute model per (device, stack) for the fit's evaluations."""
    from .compute.memo import MemoCompute
    from .estimator.context import stack_compute
    from .stacks import load_stack

    cluster = _cluster(run)
    profile = load_stack(run.stack)
    key = (cluster.device.name, profile.name, id(profile))
    hit = _COMPUTE.get(key)
    if hit is None:
        hit = _COMPUTE[key] = MemoCompute(stack_compute(cluster.device, profile)[0])
    return hit
