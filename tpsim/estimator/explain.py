"""Where each step-time term comes from (``Estimate.terms``, ``tpsim estimate --explain``; docs/SCHEMAS.md T6).

:func:`term_sources` names, once per estimation context and dtype, the figure behind each term: the kernel data
row and device figures of the compute model (with the in-situ fractions and the rows they were fitted on), the
stack profile's rule for the optimizer step, the host time and the data-parallel reduction, the pipeline
schedule's formula. The collective terms add, per plan, the algorithm the collective model chose
(:func:`plan_sources`)."""

from __future__ import annotations

from typing import Any, Mapping

TERM_NAMES = ("compute", "recompute", "bubble", "optimizer", "overhead", "tp_comm", "cp_comm", "ep_comm",
              "pp_comm", "dp_comm")
"""the step-time terms, in order (they sum to ``step_time_s``)."""
COMM_TERMS = {"tp_comm": "tp", "cp_comm": "cp", "ep_comm": "ep", "pp_comm": "pp", "dp_comm": "dp"}


def _figure(stack: Any, section: str, key: str) -> str:
    fig = stack.figure(section, key)
    if fig is None or fig.value is None:
        return f"{section}.{key} (not set)"
    unit = f" {fig.unit}" if getattr(fig, "unit", None) else ""
    return f"{section}.{key} = {fig.value}{unit}"


def _compute_source(ctx: Any, dtype: str) -> str:
    compute = ctx.compute
    device = ctx.cluster.device
    base = compute
    while base is not None and not hasattr(base, "in_situ") and getattr(base, "base", None) is not None:
        base = base.base
    prov = base.provenance() if base is not None and hasattr(base, "provenance") else {}
    parts = [f"{ctx.compute_source} on {device.name}"]
    gemm = prov.get(f"gemm.{dtype}")
    if gemm:
        parts.append(f"GEMM rate {gemm} (tpsim/data/kernels/gemm.yaml anchors)")
    if "clock" in prov:
        parts.append(f"devices.yaml {prov['clock']}")
    in_situ = getattr(base, "in_situ", None)
    if in_situ is not None:
        arch = getattr(device, "architecture", None)
        own = dict(in_situ.gemm_by_architecture).get(arch or "")
        where = (f"gemm_in_situ_fraction.by_architecture.{arch} = {own}" if own is not None
                 else f"gemm_in_situ_fraction = {in_situ.gemm_in_situ_fraction} (SC21 Table 1 fit)")
        parts.append(f"efficiency.yaml {where}, memory_in_situ_fraction = {in_situ.memory_in_situ_fraction}")
    attention = next((v for k, v in prov.items() if k.startswith("attention.") and k.endswith(f".{dtype}.fwd")), "")
    if attention:
        parts.append(f"attention {attention} (kernels/attention*.yaml)")
    if "memory" in prov:
        parts.append(f"memory-bound kernels at HBM {prov['memory']}")
    if ctx.compute is not base:
        parts.append(f"scaled by the calibration ({type(ctx.compute).__name__})")
    return "; ".join(parts)


def term_sources(ctx: Any, dtype: str) -> dict[str, str]:
    """Per term, what it was computed from (the part that is the same for every plan of the context)."""
    stack = ctx.stack
    name = f"stack {stack.name}"
    compute = _compute_source(ctx, dtype)
    terms = ctx.terms
    return {
        "compute": f"layer GEMMs, attention and memory-bound kernels per micro-batch x micro-batches: {compute}",
        "recompute": f"the forward work recomputation repeats ({name} rules.recompute, memory."
                     f"selective_recompute_modules {sorted(terms.activation_storage.recompute_modules)}): {compute}",
        "bubble": "pipeline fill and drain of the plan's schedule (tpsim/pipeline.py registry)",
        "optimizer": f"optimizer step over the rank's parameter shard: {name} "
                     f"{_figure(stack, 'compute', 'optimizer_bytes_per_param')} at the achieved HBM bandwidth"
                     + (f", plus {_figure(stack, 'compute', 'grad_buffer_passes_per_step')} (whole buffer, "
                        "not the shard)" if terms.grad_buffer_passes else "")
                     + (", plus the once-per-step quantized weight copies (tpsim.estimator.schedule."
                        "weight_cast_seconds)" if terms.weight_cache_bytes(dtype) else "")
                     + (f"; memory.optimizer_cpu_fraction = {terms.optimizer_cpu_fraction:g} of it on the CPU beside "
                        f"the GPU part: tpsim.estimator.schedule.CPU_ADAM_BYTES per parameter at "
                        f"{ctx.cluster.layout.host_memory_GBps:.1f} GB/s per GPU (the node's CPU memory_GBps, "
                        f"datasheet peak) and its copies at {ctx.cluster.layout.host_GBps:.1f} GB/s over the host "
                        f"link{' beside it' if terms.optimizer_cpu_overlap else ' after it'}"
                        if terms.optimizer_cpu_fraction else ""),
        "overhead": f"host time not hidden by the kernels: {name} {_figure(stack, 'compute', 'host_us_per_op')}, "
                    "launch gaps of tpsim/data/kernels/fixed.yaml"
                    + (f", ZeRO-3 fetches {_figure(stack, 'comm', 'host_us_per_collective')}"
                       if terms.zero3_per_parameter else ""),
        "tp_comm": f"exposed TP collectives (collective model on {ctx.cluster.name}); {name} "
                   f"{_figure(stack, 'comm', 'tp_backward_overlap')}; plan tp_overlap: "
                   f"tpsim.estimator.comm.tp_overlap_exposed over {_figure(stack, 'comm', 'tp_overlap_phases')}, "
                   f"{_figure(stack, 'comm', 'tp_overlap_exposed_share')}"
                   + (f", the SMs its communication kernels take from the GEMMs "
                      f"{_figure(stack, 'comm', 'tp_overlap_comm_sms')}" if terms.tp_overlap_comm_sms else ""),
        "cp_comm": f"exposed context-parallel exchanges (collective model on {ctx.cluster.name}, ring steps hidden "
                   "behind attention)",
        "ep_comm": f"exposed expert-parallel all-to-alls (collective model on {ctx.cluster.name})"
                   + "".join(f"; {name} {_figure(stack, 'comm', key)}"
                             for key in ("ep_a2a_overlap", "ep_node_dedup", "ep_dispatch_dtype")
                             if stack.figure("comm", key) is not None),
        "pp_comm": f"pipeline send/receive per chunk and micro-batch (collective model on {ctx.cluster.name})",
        "dp_comm": f"exposed data-parallel reduction and ZeRO gathers (collective model on {ctx.cluster.name}); "
                   f"{name} {_figure(stack, 'comm', 'dp_reduction_timing')}, "
                   f"{_figure(stack, 'comm', 'grad_reduce_dtype')}; hidden behind the last micro-batch's backward "
                   "and the first's forward, chunk by chunk and past the last bucket "
                   "(tpsim.estimator.schedule.chunked_exposure)"
                   + (f", {_figure(stack, 'comm', 'dp_sync_per_chunk')}" if terms.dp_sync_per_chunk else "")
                   + (f", {_figure(stack, 'comm', 'dp_bucket_elements')}"
                      if terms.dp_bucket_elements is not None else "")
                   + (f", {_figure(stack, 'comm', 'zero3_overlap_fraction')}"
                      if terms.zero3_overlap_fraction is not None else ""),
    }


def plan_sources(base: Mapping[str, str], collectives: Mapping[str, str], schedule: str = "") -> dict[str, str]:
    """``base`` with the algorithm each communication axis uses for this plan and its pipeline schedule."""
    out = dict(base)
    if schedule and "bubble" in out:
        from ..pipeline import describe

        out["bubble"] = f"{out['bubble']}: {describe(schedule)}"
    for term, axis in COMM_TERMS.items():
        algo = collectives.get(axis)
        if algo and term in out:
            out[term] = f"{out[term]}; {axis}: {algo}"
    return out
