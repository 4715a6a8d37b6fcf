"""Estimator: step time, throughput and memory per plan (torch-free; numpy over batches of plans).

``estimate_batch`` runs typed stages (layer costs, partition, communication, schedule, memory, totals) over one
:class:`EstimationContext`; ``estimate`` is a batch of one.
"""

from .block import BlockPrediction, predict_block
from .context import EstimationContext, context_for
from .core import estimate, estimate_batch, model_flops_per_sequence, run_stages
from .result import Estimate, EstimateBatch
from .source import Collective, Edge, LayerCosts, LayerSource, TransformerSource

__all__ = ["predict_block", "BlockPrediction", "estimate", "estimate_batch", "run_stages", "Estimate",
           "EstimateBatch", "model_flops_per_sequence", "EstimationContext", "context_for", "LayerSource",
           "TransformerSource", "LayerCosts", "Collective", "Edge"]
