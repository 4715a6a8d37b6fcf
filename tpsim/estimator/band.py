"""The error band of a prediction: low and high step time (and tokens/s, MFU) from the documented uncertainty of
its inputs (figures and sources: ``tpsim/data/band.yaml``; formula: docs/MODEL.md "Error band").

Relative standard deviations, combined in quadrature over the step-time breakdown:

* compute-like time ``C = compute + recompute + bubble``:
  ``sigma_C^2 = sigma_fit^2 + (1 - f)^2 (sigma_dev^2 + sigma_kernel^2) + (f sigma_profile)^2`` with
  ``sigma_fit`` the leave-one-row-out RMS of the SC21 fit of the in-situ fractions, ``sigma_dev`` the prior for
  transferring them to a device other than the fit's (0 on it), ``sigma_kernel^2 = ((1 - a) sigma_gemm)^2 +
  (a sigma_attention)^2`` the kernel data's error by provenance (GEMM anchored / transferred / roofline prior,
  attention by implementation and device, ``a`` the flash-attention share of the layer time), and ``f`` the share
  of compute time a measured kernel profile gives (its interpolation error replaces the model's);
* exposed communication: the collective model's error; the optimizer step: a prior;
* fixed costs: the span of the overhead term between the low and high ends of the stack's host-time prior
  (taken as a 90% range).

``half-width = z x sqrt((C sigma_C)^2 + (X sigma_X)^2 + (O sigma_O)^2 + sigma_overhead^2)``; ``low/high = step
-/+ half-width``; tokens/s and MFU follow (low throughput = high step time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclasses_field
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from ..hardware import DATA_DIR

MIN_LOW_FRACTION = 0.2
"""the low step time never falls below this fraction of the prediction (a band, not a sign change)."""


@dataclass(frozen=True, kw_only=True)
class BandData:
    """``tpsim/data/band.yaml``."""

    z: float
    fit_device: str
    device_transfer_sigma: float
    gemm_sigma: Mapping[str, float]
    attention_sigma: Mapping[str, float]
    profile_sigma: float
    exposed_comm_sigma: float
    optimizer_sigma: float
    residual: Mapping[str, float] = dataclasses_field(default_factory=dict)
    """``residual_bands`` (bands from the residuals of measured runs)."""
    runs_fit: Mapping[str, Any] = dataclasses_field(default_factory=dict)
    """``runs_fit`` (priors of ``calibrate --from-runs``, tpsim/runfit.py)."""


@lru_cache(maxsize=1)
def band_data() -> BandData:
    from ..safeyaml import load_data

    raw = load_data(DATA_DIR / "band.yaml")
    value = lambda k: float(raw[k]["value"])  # noqa: E731
    return BandData(z=value("z"), fit_device=str(raw["fit_device"]["value"]),
                    device_transfer_sigma=value("device_transfer_sigma"),
                    gemm_sigma={k: float(v) for k, v in raw["gemm_sigma"].items() if k != "source"},
                    attention_sigma={k: float(v) for k, v in raw["attention_sigma"].items() if k != "source"},
                    profile_sigma=value("profile_sigma"), exposed_comm_sigma=value("exposed_comm_sigma"),
                    optimizer_sigma=value("optimizer_sigma"),
                    residual={k: float(v) for k, v in raw["residual_bands"].items() if k not in ("source", "prior")},
                    runs_fit={k: v for k, v in raw["runs_fit"].items() if k not in ("source", "prior")})


@dataclass(frozen=True, kw_only=True)
class BandInputs:
    """The relative uncertainties of one context's inputs (per dtype where the kernel data differ)."""

    z: float
    fit_sigma: float
    device_sigma: float
    gemm_sigma: Mapping[str, float]
    """dtype -> GEMM kernel-data sigma (missing dtypes: the roofline prior)."""
    attention_sigma: float
    profile_sigma: float
    comm_sigma: float
    optimizer_sigma: float
    gemm_default: float

    def gemm(self, dtype: str) -> float:
        return self.gemm_sigma.get(dtype, self.gemm_default)


def band_inputs(compute: Any, device: Any, loo_rms_pct: float) -> BandInputs:
    """Uncertainties of the compute model serving a context on ``device``: the kernel model's provenance (through
    a profile's fallback), or the roofline's prior."""
    data = band_data()
    model = compute
    while getattr(model, "fallback", None) is not None and not hasattr(model, "in_situ"):
        model = model.fallback  # a profile: its fallback times what it has not measured
    provenance = model.provenance() if hasattr(model, "provenance") and hasattr(model, "in_situ") else {}
    gemm = {key.split(".", 1)[1]: data.gemm_sigma["anchored" if text.startswith("anchored") else "transferred"]
            for key, text in provenance.items() if key.startswith("gemm.")}
    impl = str(getattr(getattr(model, "base", None), "attention_impl", "other"))
    if "attention" in provenance:  # the roofline times attention
        impl = "other"
    arch = str(getattr(device, "architecture", "") or "")
    key = f"fa2_{arch}" if impl == "fa2" else impl
    attention = data.attention_sigma.get(key, data.attention_sigma["other"])
    on_fit_device = getattr(device, "name", "") == data.fit_device
    return BandInputs(z=data.z, fit_sigma=loo_rms_pct / 100.0,
                      device_sigma=0.0 if on_fit_device else data.device_transfer_sigma, gemm_sigma=gemm,
                      attention_sigma=attention, profile_sigma=data.profile_sigma,
                      comm_sigma=data.exposed_comm_sigma, optimizer_sigma=data.optimizer_sigma,
                      gemm_default=data.gemm_sigma["roofline"])


def step_band(inputs: BandInputs, dtype: str, *, step: np.ndarray, compute_like: np.ndarray,
              attention_share: np.ndarray, measured: np.ndarray, exposed_comm: np.ndarray,
              optimizer: np.ndarray, overhead_low: np.ndarray, overhead_high: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) step time, arrays over plans (see the module docstring)."""
    a = np.clip(attention_share, 0.0, 1.0)
    f = np.clip(measured, 0.0, 1.0)
    kernel2 = ((1.0 - a) * inputs.gemm(dtype)) ** 2 + (a * inputs.attention_sigma) ** 2
    sigma_c2 = inputs.fit_sigma ** 2 + (1.0 - f) ** 2 * (inputs.device_sigma ** 2 + kernel2) \
        + (f * inputs.profile_sigma) ** 2
    overhead_sigma = (overhead_high - overhead_low) / (2.0 * inputs.z)
    var = (compute_like ** 2 * sigma_c2 + (exposed_comm * inputs.comm_sigma) ** 2
           + (optimizer * inputs.optimizer_sigma) ** 2 + overhead_sigma ** 2)
    half = inputs.z * np.sqrt(var)
    return np.maximum(step - half, MIN_LOW_FRACTION * step), step + half


# ------------------------------------------------------------------------------ bands from measured residuals

@dataclass(frozen=True, kw_only=True)
class Residual:
    """One measured run's residual, ``error = log(measured / predicted)``, with the features that group it."""

    run_id: str
    device: str
    stack: str
    params: float
    gpus: int
    tp: int
    cp: int
    pp: int
    error: float
    dtype: str = ""
    recompute: str = ""
    seq_len: int = 0

    def features(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "device": self.device, "stack": self.stack, "params": self.params,
                "gpus": self.gpus, "tp": self.tp, "cp": self.cp, "pp": self.pp, "dtype": self.dtype,
                "recompute": self.recompute, "seq_len": self.seq_len}

    def distance(self, params: float, gpus: int, tp: int, cp: int, pp: int, dtype: str, recompute: str,
                 seq_len: int) -> float:
        """How far a plan is from this run: one per doubling of a parallel degree or the sequence, per factor
        ``size_ratio`` of parameters and 8 of GPUs, one per differing dtype or recomputation."""
        cfg = band_data().residual
        lg = lambda a, b: abs(math.log2(max(a, 1) / max(b, 1)))  # noqa: E731
        d = lg(self.params, params) / math.log2(cfg["size_ratio"]) + lg(self.gpus, gpus) / 3.0
        d += lg(self.tp, tp) + lg(self.cp, cp) + lg(self.pp, pp)
        if self.seq_len and seq_len:
            d += lg(self.seq_len, seq_len)
        d += float(bool(dtype) and bool(self.dtype) and dtype != self.dtype)
        d += float(bool(recompute) and bool(self.recompute) and recompute != self.recompute)
        return d


@dataclass(frozen=True)
class ResidualBand:
    low_factor: float
    """step_time_s_low / step_time_s."""
    high_factor: float
    basis: dict[str, Any]
    """``band_basis`` (docs/SCHEMAS.md T7): kind, runs, n, group."""


def t_quantile_95(dof: int) -> float:
    """Student-t 0.95 quantile (two-sided 90%) by the Cornish-Fisher expansion (within 1% for dof >= 3)."""
    z = 1.6448536269514722
    v = float(max(dof, 1))
    return z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v * v)


def residual_band(residuals: Sequence[Residual], *, device: str, stack: str, params: float, gpus: int, tp: int,
                  cp: int, pp: int, dtype: str = "", recompute: str = "", seq_len: int = 0,
                  kind: str = "residuals", exclude: str | None = None,
                  prior_sigma: float | None = None) -> ResidualBand:
    """The band of a prediction from the residuals of the runs closest to its plan (docs/MODEL.md "Error
    band"): the most specific group with at least ``min_runs`` residuals among same device, stack and model
    size -> same device and stack -> same stack -> same device -> every run; a 90% prediction interval of the
    group's log residuals (mean +- t s sqrt(1 + 1/n)), widened in quadrature by the extrapolation priors (a
    device or stack no run of the group has, each plan degree beyond the group's span); it always contains the
    prediction. ``exclude``: a run id left out (leave-one-out coverage)."""
    cfg = band_data().residual
    pool = [r for r in residuals if r.run_id != exclude]
    if not pool:
        return ResidualBand(1.0, 1.0, {"kind": "prior", "runs": [], "n": 0, "group": "no runs"})
    need = int(cfg["min_runs"])
    ratio = float(cfg["size_ratio"])
    same_size = lambda r: max(r.params, params) / max(min(r.params, params), 1.0) <= ratio  # noqa: E731
    levels = (
        ("same device, stack and model size", lambda r: r.device == device and r.stack == stack and same_size(r),
         False, False),
        ("same device and stack", lambda r: r.device == device and r.stack == stack, False, False),
        ("same stack, other devices", lambda r: r.stack == stack, True, False),
        ("same device, other stacks", lambda r: r.device == device, False, True),
        ("all runs", lambda _r: True, True, True),
    )
    for group, keep, new_device, new_stack in levels:
        chosen = [r for r in pool if keep(r)]
        if len(chosen) >= need or group == "all runs":
            break
    near = int(cfg["neighbours"])
    if len(chosen) > near:  # the runs nearest the plan (ties kept together)
        dist = [r.distance(params, gpus, tp, cp, pp, dtype, recompute, seq_len) for r in chosen]
        cut = sorted(dist)[near - 1]
        chosen = [r for r, d in zip(chosen, dist) if d <= cut + 1e-9]
        group += f", {len(chosen)} nearest"
    new_device = new_device and not any(r.device == device and r.stack == stack for r in pool)
    new_stack = new_stack and not any(r.stack == stack for r in pool)
    e = np.array([r.error for r in chosen])
    n = len(e)
    mean = float(e.mean())
    sd = float(e.std(ddof=1)) if n > 1 else abs(mean)
    dof = n - 1
    if prior_sigma is not None:
        # a calibration's runs: its fitted per-run error is a prior on the spread worth `calibrated_prior_dof`
        # residuals (few runs cannot claim a tiny band, nor does one odd run blow it up); with fewer than
        # three runs their mean is not a bias estimate (one run's leave-one-out is the uncalibrated error)
        nu = float(cfg["calibrated_prior_dof"])
        sd = math.sqrt((nu * prior_sigma ** 2 + max(n - 1, 0) * (sd ** 2 if n > 1 else 0.0)) / (nu + max(n - 1, 0)))
        dof = int(nu) + max(n - 1, 0)
        if n < 3:
            mean = 0.0
    extra2 = 0.0
    widened = []
    if new_device:
        extra2 += cfg["new_device_sigma"] ** 2
        widened.append(f"no runs on {device} with stack {stack}")
    if new_stack:
        extra2 += cfg["new_stack_sigma"] ** 2
        widened.append(f"no runs of stack {stack}")
    for name, value in (("tp", tp), ("cp", cp), ("pp", pp), ("gpus", gpus)):
        span = [getattr(r, name) for r in chosen]
        if value > max(span) or value < min(span):
            extra2 += cfg["outside_span_sigma"] ** 2
            widened.append(f"{name} {value} outside the runs' {min(span)}-{max(span)}")
    t = t_quantile_95(dof)
    half = math.sqrt((t * sd) ** 2 * (1.0 + 1.0 / n) + (1.6448536269514722 ** 2) * extra2)
    low = math.exp(min(0.0, mean - half))
    high = math.exp(max(0.0, mean + half))
    low = max(low, MIN_LOW_FRACTION)
    text = group + (f"; widened: {', '.join(widened)}" if widened else "")
    return ResidualBand(low, high, {"kind": kind, "runs": [r.run_id for r in chosen], "n": n, "group": text})


PRIOR_BASIS = {"kind": "prior", "runs": [], "n": 0,
               "group": "input uncertainties propagated (tpsim/data/band.yaml)"}
"""``band_basis`` of a band from the input uncertainties (no residuals applied)."""


def apply_band(result: Any, band: ResidualBand) -> Any:
    """The estimate with ``band`` as its error band (step time, tokens/s and MFU low/high) and basis."""
    import dataclasses

    step = result.step_time_s
    low, high = step * band.low_factor, step * band.high_factor
    return dataclasses.replace(result, step_time_s_low=low, step_time_s_high=high,
                               tokens_per_s_low=result.tokens_per_s * step / high,
                               tokens_per_s_high=result.tokens_per_s * step / low,
                               mfu_low=result.mfu * step / high, mfu_high=result.mfu * step / low,
                               band_basis=band.basis)


# ------------------------------------------------------------------- calibrated bands: distance in plan space

@dataclass(frozen=True)
class Variogram:
    """How far apart two runs' residuals are as their plans are apart: ``gamma(d) = nugget + slope d`` is half
    the mean squared difference of the log residuals of two runs of one device and stack at distance ``d``
    (:meth:`Residual.distance`), fitted by least squares over every such pair of the shipped runs."""

    nugget: float
    slope: float
    pairs: int
    groups: Mapping[tuple[str, str], tuple[float, ...]] = dataclasses_field(default_factory=dict)
    """(device, stack) -> that group's own (nugget, slope, sill), fitted on its own pairs: groups scatter
    differently, and a pooled fit reads a scattered group's distance dependence into every group's band."""
    sill: float = math.inf
    """the most ``gamma`` reaches: two runs far apart differ as two independent residuals (the group's far
    pairs' mean half squared difference), not more the farther they are."""
    typical: tuple[tuple[float, ...], ...] = ()
    """the groups' own (nugget, slope, sill): where given, ``gamma(d)`` is their median at ``d``, the variogram
    of a typical group (what a device and stack the runs lack is given: :func:`fit_variogram`)."""

    def gamma(self, d: float) -> float:
        """Between two different runs (a run with itself: 0; a new plan is never the same measurement)."""
        return float(self.gammas(np.array([d], dtype=float))[0])

    def gammas(self, d: np.ndarray) -> np.ndarray:
        """:meth:`gamma` at each of the distances ``d`` (an array of any shape)."""
        if self.typical:
            t = np.array(self.typical, dtype=float)
            n, s, c = (t[:, i].reshape((-1,) + (1,) * d.ndim) for i in range(3))
            return np.median(np.minimum(n + s * d, np.maximum(c, n)), axis=0)
        return np.minimum(self.nugget + self.slope * d, max(self.sill, self.nugget))

    def for_group(self, device: str, stack: str) -> "Variogram":
        """The variogram of runs of ``device`` and ``stack``: its group's own where the shipped runs have
        enough of the group, else the pooled one."""
        own = self.groups.get((device, stack))
        if own is None:
            return self
        return Variogram(own[0], own[1], self.pairs, sill=own[2] if len(own) > 2 else math.inf)


def fit_variogram(residuals: Sequence[Residual]) -> Variogram:
    """The :class:`Variogram` of ``residuals`` (pairs of the same device and stack); with fewer than 10 pairs a
    flat one at the pooled variance, never below half band.yaml ``runs_fit.run_sigma`` squared.

    Its groups with enough pairs have their own (:meth:`Variogram.for_group`); another device or stack (one the
    runs lack) gets the median of the groups' own at each distance when two or more groups have one: a new
    group is one more group, not one more set of pairs (the line through every pair weighs each group by its
    pairs, so the two most scattered groups, 91 and 55 of 345 pairs, set a new group's band), else the line
    through every pair."""
    floor = 0.5 * float(band_data().runs_fit["run_sigma"]) ** 2
    d, g, which = [], [], []
    for i, a in enumerate(residuals):
        for b in residuals[i + 1:]:
            if a.device == b.device and a.stack == b.stack:
                d.append(a.distance(b.params, b.gpus, b.tp, b.cp, b.pp, b.dtype, b.recompute, b.seq_len))
                g.append(0.5 * (a.error - b.error) ** 2)
                which.append((a.device, a.stack))
    if len(d) < 10:
        e = np.array([r.error for r in residuals]) if residuals else np.zeros(1)
        return Variogram(max(float(e.var()), floor), 0.0, len(d))
    a_ = np.c_[np.ones(len(d)), np.array(d)]
    nugget, slope = np.linalg.lstsq(a_, np.array(g), rcond=None)[0]
    # a group of at least GROUP_PAIRS pairs has its own (nugget, slope): groups scatter differently (a stack
    # whose overheads the model misses scatters more than SC21, and more the farther its plans are apart)
    groups: dict = {}
    g_all, d_all = np.array(g), np.array(d)
    for key in dict.fromkeys(which):
        idx = np.array([i for i, k in enumerate(which) if k == key])
        if len(idx) >= GROUP_PAIRS:
            dg, gg = d_all[idx], g_all[idx]
            # the rise over the near three quarters of the pairs, levelling off at the far half's mean (a
            # line through every pair is pulled flat, or negative, by far pairs that differ no more than
            # independent residuals do, and hides how much closer runs agree)
            near = dg <= np.quantile(dg, 0.75)
            sill = float(np.mean(gg[dg >= np.median(dg)]))
            n_g, s_g = np.linalg.lstsq(a_[idx][near], gg[near], rcond=None)[0] if near.sum() >= 3 else (0, -1)
            if s_g < 0:  # no distance dependence: the group's mean half squared difference
                n_g, s_g, sill = float(np.mean(gg)), 0.0, math.inf
            groups[key] = (max(float(n_g), floor), float(s_g), max(sill, floor))
    typical = tuple(groups.values()) if len(groups) >= 2 else ()
    return Variogram(max(float(nugget), floor), max(float(slope), 0.0), len(d), groups, typical=typical)


GROUP_PAIRS = 10
"""the fewest same-group run pairs (5 runs) that give a device and stack a variogram of its own."""


def _kriging_var(vg: Variogram, to_plan: np.ndarray, among: np.ndarray) -> float:
    """Variance of (the plan's residual - the mean of the runs'): ``2 mean_k gamma(d_0k) - mean_jk
    gamma(d_jk)`` (the ordinary-kriging variance of equal weights), from the variogram's values at the plan's
    distances to the runs (``to_plan``) and at the runs' distances among them (``among``, a run with itself
    not counted)."""
    n = len(to_plan)
    cross = 2.0 * float(np.sum(to_plan)) / n
    within = float(among.sum() - np.trace(among)) / (n * n)
    return max(cross - within, vg.nugget * 1e-3)


def calibrated_band(residuals: Sequence[Residual], vg: Variogram, *, params: float, gpus: int, tp: int, cp: int,
                    pp: int, dtype: str = "", recompute: str = "", seq_len: int = 0,
                    exclude: str | None = None, corrected: bool = True) -> ResidualBand:
    """The band of a prediction calibrated on ``residuals`` (the calibration's runs, ``error`` their
    leave-one-out residuals): the variance the shipped runs' :class:`Variogram` gives for a plan at its
    distances from the runs (narrow next to them, wide far away), scaled by how well that variance predicted the
    runs' own leave-one-out errors (pooled with a prior worth ``calibrated_prior_dof`` runs), a 90% t interval
    on those degrees of freedom: few runs do not claim a tight band.

    ``corrected=False``: the calibration applies no correction (its guard kept no factor), so the prediction's
    error is the plan's own residual, not the plan's residual less the runs' mean: the variance is the
    variogram's at the plan's farthest run (at most the group's sill), scaled by the runs' own mean squared
    errors against it (pooled with the same prior)."""
    cfg = band_data().residual
    pool = [r for r in residuals if r.run_id != exclude]
    if not pool:
        return ResidualBand(1.0, 1.0, {"kind": "calibrated", "runs": [], "n": 0, "group": "no runs"})
    feats = lambda r: (r.params, r.gpus, r.tp, r.cp, r.pp, r.dtype, r.recompute, r.seq_len)  # noqa: E731
    vg = vg.for_group(pool[0].device, pool[0].stack)  # a calibration is of one device and stack
    n = len(pool)
    among = np.array([[a.distance(*feats(b)) for b in pool] for a in pool])
    nu = float(cfg["calibrated_prior_dof"])
    ratio_ss, used = nu, 0
    g_among = vg.gammas(among)
    if corrected and n >= 2:  # each run's leave-one-out error against the variance the others predict for it
        for i, r in enumerate(pool):
            rest = [j for j in range(n) if j != i]
            v = _kriging_var(vg, g_among[i, rest], g_among[np.ix_(rest, rest)])
            ratio_ss += r.error ** 2 / v
            used += 1
    to_plan = [r.distance(params, gpus, tp, cp, pp, dtype, recompute, seq_len) for r in pool]
    if corrected:
        base = _kriging_var(vg, vg.gammas(np.array(to_plan)), g_among)
    else:  # the runs' own errors (uncorrected, as the plan's) against the plan's residual variance
        base = max(vg.gamma(d) for d in to_plan)
        ratio_ss, used = nu + sum(r.error ** 2 for r in pool) / base, n
    scale2 = ratio_ss / (nu + used)
    var = scale2 * base
    half = t_quantile_95(int(nu) + used) * math.sqrt(var)
    low = max(math.exp(-half), MIN_LOW_FRACTION)
    nearest = min(to_plan)
    group = (f"calibration runs, nearest at distance {nearest:.1f} (variogram of {vg.pairs} shipped run pairs, "
             f"spread x{math.sqrt(scale2):.2f} from the runs' leave-one-out errors"
             + ("; no factor fitted: the plan's own residual" if not corrected else "") + ")")
    return ResidualBand(low, math.exp(half), {"kind": "calibrated", "runs": [r.run_id for r in pool], "n": n,
                                               "group": group})
