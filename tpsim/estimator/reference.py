"""Golden cases from published runs: the ten SC21 Megatron runs (Narayanan et al. 2021, Table 1).

Each row is re-simulated with every published input (vpp = ``model_chunks_per_gpu``, unfused attention, fp16,
full recomputation, ``ddp_impl=local`` = no DP overlap) on the ``selene`` cluster (DGX A100, 3-level HDR fat
tree), and the per-GPU TFLOP/s is computed as the paper does: F / (step time x GPUs) with
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

``fit_constants`` fits the two fitted constants of the roofline (``gemm_peak_fraction`` and
``elementwise_bandwidth_fraction``) by least squares on the per-row errors; ``leave_one_out`` fits on nine
rows and predicts the tenth.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..compute.roofline import RooflineModel, default_efficiency
from ..hardware import DATA_DIR
from ..model import ModelSpec
from ..plan import Plan

SC21_CSV = DATA_DIR / "reference" / "megatron_weak_scaling.csv"
SC21_CLUSTER = "selene"


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


FITTED = ("gemm_peak_fraction", "elementwise_fraction")


def predict_tflops(case: Sc21Case, constants: dict[str, float] | None = None) -> float:
    """Predicted per-GPU TFLOP/s of one SC21 run, counted as the paper counts it."""
    from ..topology import load_cluster
    from .core import estimate

    cluster = load_cluster(SC21_CLUSTER, gpus=case.gpus)
    eff = default_efficiency().replace(**(constants or {}))
    result = estimate(case.model, cluster, case.plan, compute=RooflineModel(cluster.device, eff))
    return case.paper_flops() / (result.step_time_s * case.gpus) / 1e12


def errors_pct(cases, constants: dict[str, float] | None = None) -> np.ndarray:
    return np.array([100.0 * (predict_tflops(c, constants) - c.measured_tflops) / c.measured_tflops
                     for c in cases])


def fit_constants(cases, iterations: int = 8) -> dict[str, float]:
    """Least-squares fit of the fitted constants over ``cases``: Gauss-Newton with finite-difference
    Jacobian on the vector of per-row errors (smooth in both constants), from the shipped values."""
    eff = default_efficiency()
    x = np.array([getattr(eff, name) for name in FITTED])
    lo, hi = np.array([0.3, 0.2]), np.array([0.98, 0.98])

    def residuals(v: np.ndarray) -> np.ndarray:
        return errors_pct(cases, dict(zip(FITTED, v)))

    r = residuals(x)
    for _ in range(iterations):
        step = 1e-3
        jac = np.stack([(residuals(x + step * e) - r) / step for e in np.eye(len(x))], axis=1)
        delta = np.linalg.lstsq(jac, -r, rcond=None)[0]
        for scale in (1.0, 0.5, 0.25, 0.1):
            cand = np.clip(x + scale * delta, lo, hi)
            rc = residuals(cand)
            if float(rc @ rc) <= float(r @ r):
                break
        else:
            break
        converged = np.max(np.abs(cand - x)) < 5e-4
        x, r = cand, rc
        if converged:
            break
    return {k: round(float(v), 3) for k, v in zip(FITTED, x)}


def leave_one_out(cases) -> list[tuple[str, dict[str, float], float]]:
    """(case, constants fitted on the other rows, error % on this row) for every row."""
    out = []
    for i, case in enumerate(cases):
        rest = cases[:i] + cases[i + 1:]
        constants = fit_constants(rest)
        out.append((case.case_id, constants, float(errors_pct([case], constants)[0])))
    return out
