"""The planner: enumerate, validate, evaluate (vectorized) and rank sharding plans; Pareto fronts.

    from tpsim.search import SearchSpace, search
    result = search(model, cluster, global_batch=1536, space=SearchSpace(max_tp=8))
    result.top(5)          # [RankedPlan], best first
    result.to_json(10)     # the `tpsim plan --json` object
"""

from __future__ import annotations

from .pareto import pareto_front, pareto_front_max_y
from .planner import (DEFAULT_GPU_HOUR_PRICE, OBJECTIVES, RankedPlan, SearchResult, cost_gpu_counts, search)
from .space import SearchSpace, divisors, enumerate_plans, space_size
from .validity import REASONS, count_reasons, violations

__all__ = ["search", "SearchResult", "RankedPlan", "SearchSpace", "enumerate_plans", "space_size", "divisors",
           "violations", "count_reasons", "REASONS", "pareto_front", "pareto_front_max_y", "OBJECTIVES",
           "cost_gpu_counts", "DEFAULT_GPU_HOUR_PRICE"]
