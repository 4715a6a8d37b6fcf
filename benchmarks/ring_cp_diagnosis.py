"""Ring attention at cp >= 4: where the torchtitan Table 5 rows' time goes (issue 19 diagnosis, no fit).

    python benchmarks/ring_cp_diagnosis.py

Rows: the development set's ``tt_paper_t5_*`` (torchtitan paper Table 5 = torchtitan docs/performance.md Table 2:
Llama 3.1 8B on 8 H100-96GB at 500 W, FSDP over dp_shard x cp = 8, full AC, float8, compile, local batch 1,
sequence 32k x cp). Every rank holds 32k tokens in every row, so the rows differ only by the ``cp - 1`` ring
steps of each layer (each the same shape: 32k queries on 16k keys or 16k queries on 32k keys) and by the K/V
exchanges; the GEMMs, the loss and the first (local, causal 32k) attention step are the same in all four.

Prints, from the estimator as shipped:

1. measured vs predicted step time and the predicted exposed cp exchange time;
2. the cost of one ring step per layer, measured and predicted: (T(cp) - T(1)) / ((cp - 1) x layers);
3. tpsim's kernel time of one ring step (forward + recomputed forward + backward, the compute model's
   flash-attention figures at the n/2 block) and what is left of the measured step cost;
4. the cp bytes one layer moves (K/V all-gathered three times: forward, recomputed forward, backward's own
   kv_rotater; cp fp32 dK/dV sends) and the bandwidth at which exposing them would account for the measured
   time, beside the collective model's NVLink and cross-host (400 Gb/s NIC) rates for the same collectives;
5. predicted vs measured peak memory and the headroom left to the largest ring buffer (the gathered K/V);
6. the load balancing as torch runs it: which block shape each rank computes at each ring step, and what the
   rows would cost without load balancing (the slowest rank computing cp - 1 whole n x n blocks);
7. an upper bound of the memory traffic torch's ring code adds per ring step (fp32 merges, partial updates,
   accumulators, the dK/dV concatenation) at the device's HBM rate, beside the measured excess per step.

The code read (issue 19, w15-ring): the runs' versions are torch 1963fc8 (2024-12-23) and torchtitan 9dec370
(2024-12-26) (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, "Versions and Dates"). No copy of
torch/distributed/tensor/experimental/_attention.py at 1963fc8 was found. Two copies were read: the older side of a
merge conflict in ROCm/pytorch (``_templated_ring_attention(mesh: DeviceMesh, ...)``, ``_ring_rotate``, separate
``_sdpa_backward_handler``, the 2.6-era layout) and pytorch/pytorch at 0123248a. Their ring algorithm is the
same: ``_ContextParallelOptions`` convert_to_f32 = True, enable_load_balance = True, rotate_method = ALL_GATHER.
``_is_causal_behavior`` is IS_CAUSAL at step 0 and NOT_IS_CAUSAL at every later step when load balancing is on.
The ``elif i <= rank`` / ``else`` branches of ``_templated_ring_attention`` and its backward give every later step
half a block: all queries on the first key chunk, or the second query chunk on all keys. ``_SDPAMerger`` and
``_partial_update`` do elementwise work only. The backward's dK/dV go round by ``_AllToAllRotater``
(``ft_c.permute_tensor``) at every step. Section 6 shows that the half-block shapes cannot make cp 4 and 8 cost
more per step than cp 2, and section 7 that the elementwise work is more than ten times too small. What is left
is section 4's figure (the same bytes at ~39 GB/s from cp 4 on and at NVLink rate at cp 2), and no source
explains it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PREFIX = "tt_paper_t5_"


def main() -> int:
    from accuracy_runs import development_rows, error_pct
    from tpsim.collectives.model import get_collective_model
    from tpsim.estimator import estimate
    from tpsim.estimator.context import resolve_stack, stack_compute
    from tpsim.estimator.stackterms import stack_terms
    from tpsim.precision import activation_bytes
    from tpsim.runs import DEVELOPMENT_CSV, load_runs
    from tpsim.topology import load_cluster

    rows = sorted((r for r in development_rows() if r.run_id.startswith(PREFIX)), key=lambda r: r.plan.cp)
    if not rows:
        print(f"no {PREFIX}* rows in the development set")
        return 1
    runs = {run.run_id: run for run in load_runs(DEVELOPMENT_CSV, check_stack=False)
            if run.run_id.startswith(PREFIX)}
    model = rows[0].model
    layers = model.num_layers
    est = {r.plan.cp: estimate(r.model, r.cluster, r.plan, stack=r.stack) for r in rows}
    meas = {r.plan.cp: r.measured_s for r in rows}
    base = rows[0]
    assert base.plan.cp == 1, "the cp 1 row is the baseline"

    print("1. step time (s)        measured  predicted   error   exposed cp comm")
    for r in rows:
        e = est[r.plan.cp]
        print(f"   cp {r.plan.cp}                  {r.measured_s:8.3f}  {e.step_time_s:9.3f}  "
              f"{error_pct(r.measured_s, e.step_time_s):+6.1f}%   {e.breakdown['cp_comm']:.3f}")

    print("\n2. one ring step per layer (ms): (T(cp) - T(1)) / ((cp - 1) x layers)")
    print("   cp   measured  predicted   measured from the previous row")
    prev = None
    for r in rows[1:]:
        cp = r.plan.cp
        m = (meas[cp] - meas[1]) / ((cp - 1) * layers) * 1e3
        p = (est[cp].step_time_s - est[1].step_time_s) / ((cp - 1) * layers) * 1e3
        step = "" if prev is None else \
            f"{(meas[cp] - meas[prev]) / ((cp - prev) * layers) * 1e3:8.1f}  (cp {prev} -> {cp})"
        print(f"   {cp:<3d}  {m:8.1f}  {p:9.1f}   {step}")
        prev = cp

    stack = resolve_stack(base.stack)
    terms = stack_terms(stack)
    compute, _ = stack_compute(base.cluster.device, stack)
    d = float(model.head_dim)
    bh = np.array([float(model.num_attention_heads) * base.plan.micro_batch])
    n = float(model.seq_len)  # the cp 1 row's sequence: every rank's tokens in every row
    dtype = base.plan.dtype
    half = np.array([n / 2.0])
    fwd = float(compute.attention(2.0 * bh, half, d, False, dtype, False)[0][0])
    bwd = float(compute.attention(2.0 * bh, half, d, False, dtype, True)[0][0])
    kernel_ms = (2.0 * fwd + bwd) * 1e3  # forward, recomputed forward (full AC), backward
    print(f"\n3. tpsim's flash kernels of one ring step ({compute.source.split(';')[0]}): "
          f"forward {fwd * 1e3:.1f} + recomputed forward {fwd * 1e3:.1f} + backward {bwd * 1e3:.1f} "
          f"= {kernel_ms:.1f} ms per layer")
    for r in rows[1:]:
        cp = r.plan.cp
        m = (meas[cp] - meas[1]) / ((cp - 1) * layers) * 1e3
        print(f"   cp {cp}: measured step {m:.1f} ms = kernels x {m / kernel_ms:.2f}")

    print("\n4. cp bytes per layer and the bandwidth that would make their exposure the measured time")
    print("   cp   GiB/layer   predicted exposed ms/layer   +excess ms/layer   -> GB/s needed   "
          "model NVLink GB/s   model cross-host GB/s")
    cm = get_collective_model(base.cluster)
    # the same hosts and network with more of them: the cross-host rate of the same collectives
    wide = load_cluster(runs[base.run_id].cluster, gpus=base.cluster.gpus_per_node * 8)
    cm_wide = get_collective_model(wide)
    per_node = base.cluster.gpus_per_node
    for r in rows[1:]:
        cp = r.plan.cp
        kv = _kv_bytes(r, terms)
        grad = terms.cp_ring.grad_bytes
        dkv = kv if grad is None else kv * grad / activation_bytes(r.plan.dtype)
        moved = 3.0 * (cp - 1) * kv + cp * dkv  # received per rank: three all-gathers, cp dK/dV sends
        exposed = est[cp].breakdown["cp_comm"] / layers
        excess = (meas[cp] - est[cp].step_time_s) / layers
        need = moved / (exposed + excess) / 1e9 if exposed + excess > 0 else None

        def rate(model_, groups):
            ag = model_.run("all_gather", cp * kv, [groups]).time_s
            sr = model_.run("send_recv", dkv, [groups[:2]]).time_s
            return moved / (3.0 * ag + cp * sr) / 1e9

        inside = list(range(cp))
        across = [i * per_node for i in range(cp)]
        need_s = f"{need:14.1f}" if need is not None else "  none (faster)"
        print(f"   {cp:<3d}  {moved / 2**30:9.2f}   {exposed * 1e3:26.1f}   {excess * 1e3:16.1f}   "
              f"{need_s}   {rate(cm, inside):17.1f}   {rate(cm_wide, across):21.1f}")

    print("\n5. memory per GPU (GiB)  measured  predicted   headroom to HBM   gathered K/V buffer")
    cap = base.cluster.device.memory_bytes / 2**30
    memory = {k: run.peak_memory_gib for k, run in runs.items() if run.peak_memory_gib is not None}
    for r in rows:
        cp = r.plan.cp
        e = est[cp]
        kv = _kv_bytes(r, terms) if cp > 1 else 0.0
        measured_mem = memory.get(r.run_id, float("nan"))
        print(f"   cp {cp}                 {measured_mem:8.1f}  {e.peak_memory_gib:9.2f}   "
              f"{cap - measured_mem:15.1f}   {cp * kv / 2**30:19.2f}")
    _load_balance(rows, meas, compute, bh, n, d, dtype, layers, kernel_ms)
    _elementwise_bound(rows, meas, model, base, layers)
    return 0


def _load_balance(rows, meas, compute, bh, n, d, dtype, layers, kernel_ms) -> None:
    """Section 6: the block each rank computes per ring step (torch's round-robin load balancing)."""
    # _templated_ring_attention, load balancing on: step i > 0 of rank r computes all n queries on the first n/2
    # keys received ("elif i <= rank": shape A) or the second n/2 queries on all n keys ("else": shape B).
    print("\n6. load balancing (torch _cp_options.enable_load_balance = True, round-robin 2 cp chunks)")
    print("   cp   ranks with shape A / B at ring step i = 1 .. cp-1      steps with both shapes")
    for r in rows[1:]:
        cp = r.plan.cp
        per_step = [(sum(1 for rank in range(cp) if i <= rank), sum(1 for rank in range(cp) if i > rank))
                    for i in range(1, cp)]
        both = sum(1 for a, b in per_step if a and b)
        shapes = " ".join(f"{a}/{b}" for a, b in per_step)
        print(f"   {cp:<3d}  {shapes:<50s}  {both} of {cp - 1}")
    print("   Every step has a rank on each shape (rank 0 always B, rank cp-1 always A), so a backward that")
    print("   waits each step for the dK/dV of its neighbour pays max(A, B) per step at cp 2 as at cp 4 and 8.")
    # without load balancing (_SequentialSharder, SKIP for later ranks' keys): rank cp-1 computes cp-1 whole
    # non-causal n x n blocks and the dK/dV exchange makes every step wait for it
    full = np.array([n])
    ffwd = float(compute.attention(bh, full, d, False, dtype, False)[0][0])
    fbwd = float(compute.attention(bh, full, d, False, dtype, True)[0][0])
    full_ms = (2.0 * ffwd + fbwd) * 1e3
    print(f"   Without load balancing a step costs one whole n x n block: {full_ms:.1f} ms per layer "
          f"(x{full_ms / kernel_ms:.2f} the half block)")
    for r in rows[1:]:
        cp = r.plan.cp
        m = (meas[cp] - meas[1]) / ((cp - 1) * layers) * 1e3
        print(f"   cp {cp}: measured step {m:.1f} ms = whole block x {m / full_ms:.2f}")
    print("   cp 2 costs half a whole block per step, so that row is load balanced. At cp 4 and 8 a step costs")
    print("   0.77 of a whole block, between the half and the whole. The code's balancing rule is the same at every")
    print("   cp, so it cannot leave cp 2 balanced and cp 4 and 8 not.")


def _elementwise_bound(rows, meas, model, base, layers) -> None:
    """Section 7: an upper bound of the bytes torch's ring code streams per ring step (compiled)."""
    dev = base.cluster.device
    rate = dev.hbm_bandwidth * dev.hbm_achieved_fraction
    elems = float(model.num_attention_heads * model.head_dim) * model.seq_len * base.plan.micro_batch
    # per element of the n x heads x d output (= of q, and of K/V, which carry the query heads):
    # forward (x2, recomputed under full AC): merge read fp32 4 + bf16 2, write fp32 4; the partial update's
    # torch.cat over the whole accumulator read 4 + write 4 -> 18 B.
    # backward: grad_query accumulate 10 + its partial-update cat 8; grad_key and grad_value the same (36);
    # torch.cat of both into next_grad_kv read 4 + write 4 each (16); contiguous() of the chunked out and
    # grad_out (bf16 half blocks, 4) -> 74 B.
    per_elem = 2 * 18 + 74
    ms = per_elem * elems / rate * 1e3
    step2 = (meas[2] - meas[1]) / layers * 1e3
    print(f"\n7. elementwise bytes of one ring step (upper bound {per_elem} B x {elems / 1e6:.0f} M elements) at "
          f"{rate / 1e12:.2f} TB/s: {ms:.1f} ms per layer")
    for r in rows[1:]:
        cp = r.plan.cp
        if cp == 2:
            continue
        m = (meas[cp] - meas[1]) / ((cp - 1) * layers) * 1e3
        print(f"   cp {cp}: measured step {m:.1f} ms - cp 2 step {step2:.1f} ms = {m - step2:.1f} ms per step, "
              f"{(m - step2) / ms:.0f}x the bound")


def _kv_bytes(row, terms) -> float:
    """One rank's K/V block as the ring moves it (tpsim.estimator.source.ring_kv_bytes, the estimator's rule)."""
    from tpsim.estimator.source import ring_kv_bytes
    from tpsim.precision import activation_bytes

    axes = {"tp": np.array([row.plan.tp]), "cp": np.array([row.plan.cp]),
            "micro_batch": np.array([row.plan.micro_batch]), "act_bytes": activation_bytes(row.plan.dtype)}
    return float(ring_kv_bytes(row.model, axes, np.array([0]), terms.gqa_kv_repeat)[0])


if __name__ == "__main__":
    raise SystemExit(main())
