"""Estimator: step time, throughput and memory per plan (torch-free; numpy over batches of plans)."""

from .core import estimate, estimate_batch, model_flops_per_sequence
from .result import Estimate, EstimateBatch

__all__ = ["estimate", "estimate_batch", "Estimate", "EstimateBatch", "model_flops_per_sequence"]
