"""Speed of tracing and of estimating traced models; prints the figures (median of repeats, this machine).

    python benchmarks/bench_trace.py

* ``tpsim trace`` in process (meta device): ResNet-50, ViT-L/16, a 96-layer GPT-3 175B;
* op-graph plan evaluations per second: a transformer-like graph (ViT-L/16, ``OpGraphSource``) and a
  heterogeneous one (ResNet-50, ``UnitSource``), both through the estimator's stages, on batches of plans
  enumerated by the planner.
"""

from __future__ import annotations

import statistics
import time
from functools import partial


def _median(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from tpsim.opgraph.estimate import estimate_graph_batch
    from tpsim.opgraph.model import OpGraphModel
    from tpsim.opgraph.tp import derive_plan
    from tpsim.search import SearchSpace
    from tpsim.search.space import enumerate_plans
    from tpsim.search.validity import violations
    from tpsim.topology import load_cluster
    from tpsim.trace import trace_spec
    from tpsim.trace.spec import parse_input_shape as shape

    cases = {
        "resnet50": ("tpsim.trace.zoo:resnet50", ["32,3,224,224"], {}),
        "vit-l16": ("tpsim.trace.zoo:vit_l16", ["1,3,224,224"], {}),
        "gpt3-175b": ("tpsim.trace.zoo:gpt", ["1,2048:int64"], dict(layers=96, hidden=12288, heads=96,
                                                                      vocab=51200, seq_len=2048)),
    }
    graphs = {}
    print("tpsim trace (meta device, in process), median of 3:")
    for name, (spec, inputs, kwargs) in cases.items():
        t = _median(lambda: graphs.__setitem__(name, trace_spec(spec, [shape(s) for s in inputs], kwargs)))
        g = graphs[name]
        print(f"  {name:10s} {t:6.2f} s  ({g.num_ops()} ops in {len(g.units)} units, "
              f"{g.total_params() / 1e6:,.0f} M parameters)")
    print("op-graph estimator, plan evaluations per second (batches of the planner's enumeration):")
    for name in ("vit-l16", "resnet50"):
        cluster = load_cluster("dgx-a100", gpus=64)
        model = OpGraphModel(graph=graphs[name], tp_plan=derive_plan(graphs[name])).with_gpus(64)
        space = SearchSpace(micro_batch=(8, 16, 32, 64))
        plans = enumerate_plans(model, 64, 4096, space).plans
        plans = plans.take(violations(model, plans, 64) == 0)
        estimate = partial(estimate_graph_batch, model, cluster)
        first = _median(lambda: estimate(plans), 1)
        warm = _median(lambda: estimate(plans))
        path = "OpGraphSource" if name == "vit-l16" else "UnitSource"
        print(f"  {name:10s} {len(plans):6d} plans: first {first:5.2f} s, then {warm:5.2f} s "
              f"= {len(plans) / warm:,.0f} plans/s ({path})")


if __name__ == "__main__":
    main()
