"""Probe (issue 19, NeMo 24.07 FP8 rows): would the per-model userbuffers configs explain the nemo rows' optimism?

    python benchmarks/nemo_userbuffers_probe.py

The nemo stack (tpsim/data/stacks/nemo.yaml) states no ``comm.tp_overlap_comm_sms``, so the hidden part of its
pipelined TP collectives pays the generic ``overlap_compute_penalty`` (efficiency.yaml, 0.15). This script
predicts the nemo development rows with tp > 1 three ways and prints their errors (positive: tpsim predicts
more throughput than measured):

  shipped   the nemo stack as shipped (generic penalty);
  te-dflt   megatron.yaml's figure (Transformer Engine initialize_ub defaults: 1 SM ring exchange, 16 bulk /
            pipeline);
  own-cfg   the SMs of the row's own tuned config, where Megatron-Bridge 0.3.1 ships one for the row's
            (fp8, h100, hidden, tp, mbs, seq): megatron/bridge/training/comm_overlap.py
            userbuffers_fp8_h100_h6144_tp2_mbs2_seqlen2048 (GPT3-20B), userbuffers_fp8_h100_h12288_tp4_mbs1_seqlen2048
            (GPT3-175B at mbs 1), userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192 (LLAMA3-70B). Mapped to tpsim's
            collectives by equal bytes: fwd all_gather = mean(qkv_fprop, fc1_fprop), fwd reduce_scatter =
            mean(proj_fprop, fc2_fprop), bwd all_gather = mean(proj_dgrad, fc2_dgrad, qkv_dgrad, fc1_dgrad), bwd
            reduce_scatter = mean(qkv_wgrad, fc1_wgrad); ring exchanges hold 1 SM (RingExchangeOverlapCfg default).

Only the SM share is probed (not the exposed share of a ring-exchange reduce-scatter, 1/tp instead of the
pipelined 1/num_splits). Nothing here is fitted; nothing under tpsim/ is changed.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy_runs as A  # noqa: E402

TE_DEFAULT = {"fwd": {"all_gather": 1, "reduce_scatter": 16}, "bwd": {"all_gather": 8.5, "reduce_scatter": 16}}
OWN_CONFIG = {  # run id -> SMs from the row's Megatron-Bridge config (see the docstring)
    "nemo2407_GPT3-20B_64gpu": {"fwd": {"all_gather": 1, "reduce_scatter": 20},
                                "bwd": {"all_gather": 3.5, "reduce_scatter": 16}},
    "nemo2407_GPT3-175B_128gpu": {"fwd": {"all_gather": 1, "reduce_scatter": 1},
                                  "bwd": {"all_gather": 2, "reduce_scatter": 4}},
    "nemo2407_LLAMA3-70B_64gpu": {"fwd": {"all_gather": 1, "reduce_scatter": 1},
                                  "bwd": {"all_gather": 2, "reduce_scatter": 14}},
}


def _nemo_with(sms: dict):
    from tpsim.stacks import load_stack

    text = (A.ROOT / "tpsim" / "data" / "stacks" / "nemo.yaml").read_text(encoding="utf-8")
    marker = "\n  dp_sync_per_chunk:"
    assert marker in text
    text = text.replace(marker, f"\n  tp_overlap_comm_sms:\n    value: {sms!r}\n    source: probe{marker}", 1)
    folder = Path(tempfile.mkdtemp(prefix="tpsim-ub-"))
    (folder / "nemo.yaml").write_text(text, encoding="utf-8")
    return load_stack(folder / "nemo.yaml")


def main() -> None:
    te = _nemo_with(TE_DEFAULT)
    print(f"{'run':34s} {'shipped':>8s} {'te-dflt':>8s} {'own-cfg':>8s}")
    for row in A.development_rows():
        if not row.run_id.startswith("nemo2407") or row.plan.tp == 1:
            continue
        errs = [A.error_pct(row.measured_s, A.predict(row)[0]),
                A.error_pct(row.measured_s, A.predict(dataclasses.replace(row, stack=te))[0])]
        own = OWN_CONFIG.get(row.run_id)
        if own is not None:
            errs.append(A.error_pct(row.measured_s, A.predict(dataclasses.replace(row, stack=_nemo_with(own)))[0]))
        print(f"{row.run_id:34s} " + " ".join(f"{e:+7.1f}%" for e in errs))


if __name__ == "__main__":
    main()
