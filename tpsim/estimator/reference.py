"""Golden cases from published runs: the ten SC21 Megatron runs (Narayanan et al. 2021, Table 1).

Each row is re-simulated with every published input (vpp = ``model_chunks_per_gpu``, unfused attention, fp16,
full recomputation, ``ddp_impl=local`` = no DP overlap) on the ``selene`` cluster (DGX A100, 3-level HDR fat
tree) with the training stack the runs used (``tpsim/data/stacks/megatron-sc21.yaml``: Megatron-LM of early 2021,
no asynchronous TP communication, no gradient-accumulation fusion, fp16 gradient buffers), and the per-GPU
TFLOP/s is computed as the paper does: F / (step time x GPUs) with F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

``fit_constants`` fits the two in-situ fractions of the default compute model (``gemm_in_situ_fraction`` and
``memory_in_situ_fraction``, :mod:`tpsim.compute.training`) by least squares on the per-row errors;
``leave_one_out`` fits on nine rows and predicts the tenth.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..compute.kernel_model import KernelModel
from ..compute.memo import MemoCompute
from ..compute.training import FITTED, TrainingCompute, default_in_situ
from ..hardware import DATA_DIR
from ..model import ModelSpec
from ..plan import Plan

SC21_CSV = DATA_DIR / "reference" / "megatron_weak_scaling.csv"
SC21_CLUSTER = "selene"
SC21_STACK = DATA_DIR / "stacks" / "megatron-sc21.yaml"


@dataclass(frozen=True)
class Sc21Case:
    case_id: str
    model: ModelSpec
    plan: Plan
    gpus: int
    measured_tflops: float

    def paper_flops(self) -> float:
        """F = 96 B s l h^2 (1 + s/6h + V/16lh) per iteration (SC21 eq. 3)."""
        m, b = self.model, self.plan.global_batch
        s, l, h, v = m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
        return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


@lru_cache(maxsize=1)
def sc21_cases() -> tuple[Sc21Case, ...]:
    cases = []
    with open(SC21_CSV, newline="") as fh:
        for r in csv.DictReader(fh):
            i = lambda k: int(r[k])  # noqa: E731
            model = ModelSpec(name=r["case_id"], family="gpt", num_layers=i("num_layers"),
                              hidden_size=i("hidden_size"), num_attention_heads=i("num_attention_heads"),
                              num_kv_heads=i("num_attention_heads"), ffn_hidden_size=i("ffn_hidden_size"),
                              vocab_size=i("vocab_size"), seq_len=i("seq_length"), max_positions=i("seq_length"),
                              tie_embeddings=True)
            plan = Plan(tp=i("tp"), pp=i("pp"), vpp=int(r["model_chunks_per_gpu"] or 1), dp=i("dp"),
                        sp=False, recompute="full", zero=0, micro_batch=i("micro_batch_size"),
                        global_batch=i("global_batch_size"), dtype="fp16", attention="unfused",
                        overlap=r["ddp_impl"] != "local")
            cases.append(Sc21Case(r["case_id"], model, plan, i("num_gpus"), float(r["measured_tflops_per_gpu"])))
    return tuple(cases)


def sc21_stack():
    from ..stacks import load_stack

    return load_stack(SC21_STACK)


def sc21_estimate(case: Sc21Case, constants: dict[str, float] | None = None):
    """The estimate of one SC21 run (the shipped in-situ fractions, or ``constants``)."""
    from ..topology import load_cluster
    from .core import estimate

    cluster = load_cluster(SC21_CLUSTER, gpus=case.gpus)
    compute = None
    if constants:
        fit = default_in_situ().replace(**constants)
        compute = TrainingCompute(_kernel_model(cluster.device), fit)
    return estimate(case.model, cluster, case.plan, compute=compute, stack=sc21_stack())


_KERNEL_MODELS: dict[str, MemoCompute] = {}


def _kernel_model(device) -> MemoCompute:
    """One (memoized) kernel model per device name: the fit builds many compute models on it."""
    if device.name not in _KERNEL_MODELS:
        _KERNEL_MODELS[device.name] = MemoCompute(KernelModel(device, "unfused"))
    return _KERNEL_MODELS[device.name]


def predict_tflops(case: Sc21Case, constants: dict[str, float] | None = None) -> float:
    """Predicted per-GPU TFLOP/s of one SC21 run, counted as the paper counts it."""
    result = sc21_estimate(case, constants)
    return case.paper_flops() / (result.step_time_s * case.gpus) / 1e12


def errors_pct(cases, constants: dict[str, float] | None = None) -> np.ndarray:
    return np.array([100.0 * (predict_tflops(c, constants) - c.measured_tflops) / c.measured_tflops
                     for c in cases])


GRID = {"gemm_in_situ_fraction": np.linspace(0.80, 1.10, 5), "memory_in_situ_fraction": np.linspace(0.45, 0.85, 5)}
"""the grid the fit evaluates the estimator on (it must contain the optimum of every leave-one-out fit)."""


@dataclass(frozen=True)
class StepSurface:
    """Per row, the step time as a quadratic in (1 / gemm fraction, 1 / memory fraction), least squares over
    the estimator's values on :data:`GRID` (the compute terms are linear in these inverses; exposure and
    host-overlap terms bend it slightly). ``max_rel_residual``: the worst relative misfit at the grid points."""

    coefficients: np.ndarray
    """(rows, 6): c0 + c1 a + c2 b + c3 a^2 + c4 a b + c5 b^2."""
    max_rel_residual: float

    def step(self, gemm: np.ndarray, mem: np.ndarray) -> np.ndarray:
        """(rows, ...) step times at the fractions (arrays broadcast)."""
        return np.tensordot(self.coefficients, _features(1.0 / np.asarray(gemm), 1.0 / np.asarray(mem)), axes=1)


def _features(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    return np.stack([np.ones_like(a), a, b, a * a, a * b, b * b])


def step_surface(cases) -> StepSurface:
    """Evaluate the estimator on :data:`GRID` for every row (kernel times cached: only the in-situ division
    changes) and fit the per-row quadratics."""
    g, m = np.meshgrid(GRID[FITTED[0]], GRID[FITTED[1]], indexing="ij")
    steps = np.array([[sc21_estimate(c, {FITTED[0]: float(gi), FITTED[1]: float(mi)}).step_time_s
                       for gi, mi in zip(g.ravel(), m.ravel())] for c in cases])
    x = _features(1.0 / g.ravel(), 1.0 / m.ravel()).T
    coef = np.linalg.lstsq(x, steps.T, rcond=None)[0].T
    misfit = np.abs(coef @ x.T - steps) / steps
    return StepSurface(coefficients=coef, max_rel_residual=float(misfit.max()))


def _errors_on_surface(cases, surface: StepSurface, gemm: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """(rows, ...) percent errors of the per-GPU TFLOP/s on the surface."""
    steps = surface.step(gemm, mem)
    paper = np.array([c.paper_flops() / (c.gpus * 1e12) for c in cases])
    measured = np.array([c.measured_tflops for c in cases])
    shape = (-1,) + (1,) * (steps.ndim - 1)
    return 100.0 * (paper.reshape(shape) / steps / measured.reshape(shape) - 1.0)


def fit_constants(cases, surface: StepSurface | None = None) -> dict[str, float]:
    """Least-squares fit of the two in-situ fractions over ``cases`` (minimum of the summed squared per-row
    errors on the step surface: a dense grid search refined twice around its best point), rounded to 3
    decimals. ``surface`` (of these cases) saves the estimator runs."""
    surface = surface or step_surface(cases)
    lo = np.array([GRID[k][0] for k in FITTED])
    hi = np.array([GRID[k][-1] for k in FITTED])
    best = None
    for _ in range(3):
        gs, ms = (np.linspace(lo[i], hi[i], 121) for i in range(2))
        gg, mm = np.meshgrid(gs, ms, indexing="ij")
        cost = (_errors_on_surface(cases, surface, gg, mm) ** 2).sum(axis=0)
        i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
        best = np.array([gs[i], ms[j]])
        span = (hi - lo) / 20.0
        lo, hi = best - span, best + span
    return {k: round(float(v), 3) for k, v in zip(FITTED, best)}


def leave_one_out(cases, surface: StepSurface | None = None) -> list[tuple[str, dict[str, float], float]]:
    """(case, constants fitted on the other rows, error % on this row from the estimator) for every row;
    ``surface`` (of these cases) saves the estimator runs."""
    cases = tuple(cases)
    surface = surface or step_surface(cases)
    out = []
    for i, case in enumerate(cases):
        keep = [j for j in range(len(cases)) if j != i]
        rest = StepSurface(coefficients=surface.coefficients[keep], max_rel_residual=surface.max_rel_residual)
        constants = fit_constants(tuple(cases[j] for j in keep), rest)
        out.append((case.case_id, constants, float(errors_pct([case], constants)[0])))
    return out
