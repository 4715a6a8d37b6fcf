"""Estimator: step time, throughput and memory per plan (torch-free; numpy over batches of plans)."""

from .block import BlockPrediction, predict_block
from .core import estimate, estimate_batch, model_flops_per_sequence
from .result import Estimate, EstimateBatch

__all__ = ["predict_block", "BlockPrediction", "estimate", "estimate_batch", "Estimate", "EstimateBatch", "model_flops_per_sequence"]
