"""Build tpsim/data/runs/development.csv and sc21.csv (docs/RUNS.md schema) from the published measurements.

    python benchmarks/convert_runs.py [--shared ../shared/data] [--check]

Reads ``runs/*.csv`` of the shared data folder (the development set, each row with its source) and
``tpsim/data/reference/megatron_weak_scaling.csv`` (SC21 Table 1), and writes one runs row per published run:
the model as a preset plus overrides, a shipped cluster, the stack, every plan field, the measurement as the
source gives it (the loader converts it to a step time), its source, and in ``notes`` what the conversion chose
where the source leaves a field open. ``--check`` compares with the shipped files instead of writing (exit 1
when they differ). Nothing here is fitted or tuned: it is a transcription with documented choices.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tpsim" / "data" / "runs"
sys.path.insert(0, str(ROOT))

from tpsim.runs import COLUMNS  # noqa: E402

H100_TT = ("dgx-h100 stands in for the lower-TDP (500 W) 95/96 GB HBM2e H100 SXM of Grand Teton (until "
           "tpsim/data/devices.yaml has H100-SXM-96GB; this script then writes clusters/grand-teton-h100.yaml)")
H100_96 = ("clusters/grand-teton-h100.yaml: the DGX H100 node and NDR rail-optimized fabric (400 Gb/s per GPU, as "
           "published) with the lower-TDP 95/96 GB HBM2e H100-SXM-96GB device")


def _have_device(name: str) -> bool:
    from tpsim.hardware import device_names

    return name in device_names()


GRAND_TETON = """name: grand-teton-h100
description: >-
  Meta Grand Teton hosts as torchtitan's H100 runs used them: 8 lower-TDP (500 W) H100 SXM with 95/96 GB HBM2e,
  NVLink + NVSwitch in the host, a backend RDMA network of 400 Gb/s per GPU
node: dgx-h100
fabric: ndr-rail-optimized
device: H100-SXM-96GB
gpus: 128
source: >-
  pytorch/torchtitan docs/performance.md and Liang et al. 2024 (arXiv:2410.06511): H100 SXM 95/96 GB HBM2e at
  500 W, NVLink/NVSwitch within the host, 400 Gb/s per GPU RDMA backend; the DGX H100 node and rail-optimized NDR
  fabric stand in for the host and network (same link rates).
"""
MCORE_RECIPE = ("plan fields the README leaves open: sequence parallel with tp > 1 (the stated --tp-comm-overlap "
                "requires it) and the distributed optimizer (zero 1; the stated --overlap-param-gather requires "
                "it); micro-batch 1, selective recomputation and no interleaving are assumptions, tpsim's "
                "gpt3-175b preset plan (Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh states "
                "micro-batch 1 but no recomputation; the fastest plan under the stated fields instead moves "
                "this family's errors both ways and its Hopper refit to 0.808: not adopted)")
NEMO_RECIPE = ("NeMo 24.07 performance recipes: sequence parallel and TP-communication overlap with tp > 1, "
               "distributed optimizer (zero 1), no activation recomputation; shape from the NeMo launcher config "
               "of the model (not in the table)")


def _shape(model: str, **kw) -> dict:
    return {"model": model, **{k: str(v) for k, v in kw.items()}}


# NeMo model names -> preset and overrides (NeMo launcher conf/training/<family>/<size>.yaml shapes)
NEMO_MODELS = {
    "GPT3-5B": _shape("gpt3-175b", layers=24, hidden=4096, heads=32, vocab=50257, seq_len=2048),
    "GPT3-20B": _shape("gpt3-175b", layers=44, hidden=6144, heads=48, vocab=50257, seq_len=2048),
    "GPT3-175B": _shape("gpt3-175b", seq_len=2048),
    "LLAMA2-7B": _shape("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000,
                        seq_len=4096),
    "LLAMA2-13B": _shape("llama3-8b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000,
                         seq_len=4096),
    "LLAMA2-70B": _shape("llama3-70b", vocab=32000, seq_len=4096),
    "LLAMA3-8B": _shape("llama3-8b", seq_len=8192),
    "LLAMA3-70B": _shape("llama3-70b", seq_len=8192),
    # Nemotron-4: the nemotron4-340b preset (squared-ReLU MLP costed as the one-projection GeLU MLP, no biases,
    # half rotary, untied embeddings, no dropout: the launcher's conf/training/nemotron/*.yaml), resized
    "Nemotron-8B": _shape("nemotron4-340b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=16384,
                          vocab=256000, seq_len=4096),
    "Nemotron-22B": _shape("nemotron4-340b", layers=40, hidden=6144, heads=48, kv_heads=48, ffn=24576,
                           vocab=256000, seq_len=4096),
    "Nemotron-340B": _shape("nemotron4-340b"),
}


def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _dtype(text: str) -> str:
    t = text.lower()
    if "fp8" in t or "float8" in t:
        return "fp8"
    if "fp16" in t:
        return "fp16"
    return "bf16"


def megatron_core(rows: list[dict]) -> list[dict]:
    out = []
    weak = {r["case_id"]: r for r in rows}
    for r in rows:
        notes = [MCORE_RECIPE, "dgx-h100 for 'H100' (SXM5 80 GB likely, not stated)",
                 "model: GPT with ffn = 4h and the README's vocabulary 131072 (untied embeddings in the source; "
                 "the gpt3 preset ties them: memory only)",
                 "measurement: the published TFLOP/s per GPU under Megatron's num_floating_point_operations "
                 "(flops_convention megatron)"]
        tp, pp = r["tp"], r["pp"]
        tflops = r["measured_tflops_per_gpu"]
        if not tp:  # strong-scaling end points: no plan, no TFLOP/s published
            twin = weak["meg_h100_weak_177B"]
            tp, pp = twin["tp"], twin["pp"]
            tflops = f"{float(r['reported_mfu_pct']) / 100 * float(r['peak_tflops_per_gpu_assumed']):.1f}"
            notes.append(f"strong-scaling end point: tp/pp not published; the weak-scaling 177B row's tp {tp} pp "
                         f"{pp} is chosen (same model); TFLOP/s = published MFU {r['reported_mfu_pct']}% x 989")
        gpus = int(r["num_gpus"])
        out.append(dict(
            run_id=r["case_id"], model="gpt3-175b", layers=r["num_layers"], hidden=r["hidden_size"],
            heads=r["num_attention_heads"], vocab=r["vocab_size"], seq_len=r["seq_length"], cluster="dgx-h100",
            gpus=str(gpus), stack="megatron", tp=tp, pp=pp, vpp="1", sp="true" if int(tp) > 1 else "false",
            zero="1", recompute="selective", micro_batch="1", global_batch=r["global_batch_size"], dtype="bf16",
            tp_overlap="true" if int(tp) > 1 else "false", overlap="true",
            model_tflops_per_gpu=tflops, flops_convention="megatron", source=r["source"],
            notes="; ".join(notes) + ". Source notes: " + r["notes"]))
    return out


# NeMo recipes whose optimizer runs in bf16 (launcher conf/training/<family>/<model>.yaml ``optim.dtype: bf16``):
# MegatronGPTModel.setup_optimization passes it to DistributedFusedAdam as the optimizer-state dtype and, with
# bf16 parameters, sets store_params false without remainders (NeMo nlp/models/language_modeling/megatron_gpt_model.py
# "elif optim_dtype == model_dtype: store_params = False"). The other recipes keep fp32 states (no optim.dtype).
NEMO_BF16_OPTIMIZER = {"Nemotron-340B": "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/"
                                        "nemotron_340b.yaml (optim: distributed_fused_adam, dtype bf16)"}
NEMO_BF16_STACK = "stacks/nemo-optim-bf16.yaml"
"""the runs' stack profile for those recipes (relative to the runs file), generated from tpsim's nemo.yaml."""


def nemo_bf16_optimizer_profile() -> str:
    """tpsim/data/stacks/nemo.yaml with the optimizer of ``optim.dtype: bf16``: bf16 Adam moments and no master
    copy (the bf16 parameters are updated in place). Same stack and name (its other rules and figures are nemo's);
    only the recipe's optimizer differs."""
    text = (ROOT / "tpsim" / "data" / "stacks" / "nemo.yaml").read_text(encoding="utf-8")
    old_master = text[text.index("  main_params_dtype:\n"):text.index("  optimizer_state_dtype:\n")]
    old_state = text[text.index("  optimizer_state_dtype:\n"):text.index("  fp8_weights_kept:\n")]
    master = ("  main_params_dtype:\n    value: none\n    source: >-\n"
              "      optim.dtype bf16 equals the model dtype: MegatronGPTModel.setup_optimization sets store_params\n"
              "      false and no param remainders, so DistributedFusedAdam updates the bf16 parameters in place (no\n"
              "      master copy).\n")
    state = ("  optimizer_state_dtype:\n    value: bf16\n    source: >-\n"
             "      optim.dtype bf16 is DistributedFusedAdam's optimizer-state dtype (apex distributed_fused_adam.py:\n"
             "      dtype, datatype for optimizer state): both Adam moments in bf16.\n")
    text = text.replace(old_master, master).replace(old_state, state)
    head = ("# Generated by benchmarks/convert_runs.py from tpsim/data/stacks/nemo.yaml (do not edit): the NeMo 24.07\n"
            "# recipes that set optim.dtype bf16 (" + "; ".join(NEMO_BF16_OPTIMIZER.values()) + "):\n"
            "# memory.main_params_dtype none and memory.optimizer_state_dtype bf16; everything else is nemo's.\n")
    return head + text


def nemo(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        shape = NEMO_MODELS[r["model"]]
        stack = NEMO_BF16_STACK if r["model"] in NEMO_BF16_OPTIMIZER else "nemo"
        optim = (f"; the recipe sets optim.dtype bf16 ({NEMO_BF16_OPTIMIZER[r['model']]}): stack {NEMO_BF16_STACK}, "
                 "nemo with bf16 Adam moments and no master copy" if stack != "nemo" else "")
        tp = int(r["tp"])
        vpp = int(r["vp"] or 1)
        out.append(dict(
            run_id=r["case_id"], **shape, cluster="dgx-h100", gpus=r["num_gpus"], stack=stack, tp=r["tp"],
            cp=r["cp"], pp=r["pp"], vpp=str(vpp), sp="true" if tp > 1 else "false", zero="1", recompute="none",
            micro_batch=r["micro_batch_size"], global_batch=r["global_batch_size"], dtype="fp8",
            tp_overlap="true" if tp > 1 else "false", overlap="true", dp=r["dp"],
            tokens_per_s_per_gpu=r["measured_tokens_per_s_per_gpu"],
            model_tflops_per_gpu=r["measured_model_tflops_per_gpu"], flops_convention="megatron",
            source=r["source"],
            notes=(f"{NEMO_RECIPE}; measurement: tokens/s per GPU (the model TFLOP/s column is kept: "
                   f"it equals tokens/s under the megatron FLOP convention to 0.1%, which checks the shapes); NeMo 24.07 on Megatron-Core with NeMo's distributed optimizer: stack nemo{optim}. Source notes: {r['notes']}")))
    return out


def mpt(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        h100 = r["gpu_type"].startswith("H100")
        strategy = r["fsdp_sharding_strategy"]
        zero = {"FULL_SHARD": "3", "SHARD_GRAD_OP": "2"}[strategy]
        recompute = "full" if r["activation_checkpointing"] == "True" else "none"
        cluster = "dgx-h100" if h100 else "clusters/dgx-a100-40gb.yaml"
        notes = [f"PyTorch FSDP {strategy} -> zero {zero}; activation_checkpointing {r['activation_checkpointing']} "
                 f"-> recompute {recompute}",
                 "stack llm-foundry (Composer FSDP1, MPT's fused cross-entropy; torchtitan's PyTorch rules otherwise)",
                 "model: the GPT preset with MPT's shape (MPT has no biases and ALiBi: small differences)",
                 "measurement: tokens/s (the table's samples/s is rounded)"]
        notes.append("dgx-h100 (H100 80 GB as published)" if h100 else
                     "A100 40 GB nodes with 1600 Gb/s RoCE per node: the DGX A100 node and HDR fat tree "
                     "(8 x 200 Gb/s) with the A100-SXM4-40GB device (clusters/dgx-a100-40gb.yaml)")
        out.append(dict(
            run_id=r["case_id"], model="gpt3-175b", layers=r["num_layers"], hidden=r["hidden_size"],
            heads=r["num_attention_heads"], ffn=r["ffn_hidden_size"], vocab=r["vocab_size"],
            seq_len=r["seq_length"], cluster=cluster, gpus=r["num_gpus"], stack="llm-foundry", tp="1", pp="1",
            zero=zero, recompute=recompute, micro_batch=r["micro_batch_size"],
            global_batch=r["global_batch_size"], dtype="bf16", overlap="true", dp=r["dp"],
            tokens_per_s=r["measured_tokens_per_s"], source=r["source"],
            notes="; ".join(notes) + ". Source notes: " + r["notes"]))
    return out


def torchtitan(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        h100 = r["gpu_type"].startswith("H100")
        tp, cp = int(r["tp"]), int(r["cp"] or 1)
        fsdp = int(r["dp_shard_fsdp"])
        ac = r["activation_checkpointing"]
        recompute = "full" if ac.startswith("full") else ("none" if ac == "none" else "selective")
        gbs = r["global_batch_size"] or str(fsdp * int(r["local_batch_size"]))
        is_l2 = "Llama 2" in r["model"]
        if "70B" in r["model"]:
            shape = _shape("llama3-70b", vocab=32000 if is_l2 else 128256, seq_len=r["seq_length"])
        elif "13B" in r["model"]:
            shape = _shape("llama3-8b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000,
                           seq_len=r["seq_length"])
        else:
            shape = _shape("llama3-8b", seq_len=r["seq_length"])
        notes = [f"FSDP2 (reshard after forward, torchtitan's default without pp) -> zero 3; AC {ac!r} -> "
                 f"recompute {recompute} (per-layer SAC checkpoints every 2nd layer, per-op SAC saves the "
                 "matmuls: both are tpsim's selective, the closest in time)" if recompute == "selective" else
                 f"FSDP2 -> zero 3; AC {ac!r} -> recompute {recompute}",
                 f"torch.compile {r['torch_compile']} -> stack "
                 f"{'torchtitan-compile (fused kernels)' if r['torch_compile'] == 'yes' else 'torchtitan (eager)'}",
                 H100_TT if h100 else "dgx-a100 for the A100 80 GB (node and network not described)"]
        if not r["global_batch_size"]:
            notes.append(f"global batch not printed: local batch {r['local_batch_size']} x FSDP degree {fsdp} "
                         f"= {gbs}")
        if tp > 1:
            notes.append("TP with sequence parallel (torchtitan always shards the norms)")
        if h100 and _have_device("H100-SXM-96GB"):
            notes[-1] = H100_96
            cluster = "clusters/grand-teton-h100.yaml"
        else:
            cluster = "dgx-h100" if h100 else "dgx-a100"
        out.append(dict(
            run_id=r["case_id"], **shape, cluster=cluster, gpus=r["num_gpus"],
            stack="torchtitan-compile" if r["torch_compile"] == "yes" else "torchtitan", tp=str(tp), cp=str(cp),
            cp_kind="ring", pp=r["pp"] or "1",
            sp="true" if tp > 1 else "false", zero="3", recompute=recompute,
            micro_batch=r["local_batch_size"], global_batch=gbs, dtype=_dtype(r["precision"]),
            tp_overlap="true" if r["async_tp"] == "yes" else "false", overlap="true",
            tokens_per_s_per_gpu=r["measured_tokens_per_s_per_gpu"],
            peak_memory_gib=r["measured_peak_memory_gib"], source=r["source"],
            notes="; ".join(notes) + ". Source notes: " + r["notes"]))
    return out


def _sc21_step(r: dict) -> float:
    """SC21 eq. 3 (96 B s l h^2 (1 + s/6h + V/16lh), recomputation counted) / (GPUs x TFLOP/s)."""
    b, s, l, h, v = (float(r[k]) for k in ("global_batch_size", "seq_length", "num_layers", "hidden_size",
                                           "vocab_size"))
    flops = 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return flops / (float(r["num_gpus"]) * float(r["measured_tflops_per_gpu"]) * 1e12)


SC21_NOTE = ("step_time_s = SC21 eq. 3 FLOPs (96 B s l h^2 (1 + s/6h + V/16lh), which counts the recomputation) / "
             "(GPUs x published TFLOP/s): no FLOPS_CONVENTIONS entry counts recomputation, so the step time is "
             "written (computed, not published; TFLOP/s rounded to an integer: ~0.4%)")


def deepspeed(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        out.append(dict(
            run_id=r["case_id"], model="gpt3-175b", layers=r["num_layers"], hidden=r["hidden_size"],
            heads=r["num_attention_heads"], vocab=r["vocab_size"], seq_len=r["seq_length"], cluster="selene",
            gpus=r["num_gpus"], stack="deepspeed-2021", tp="1", pp="1", zero="3", recompute="full",
            micro_batch=r["micro_batch_size"], global_batch=r["global_batch_size"], dtype="fp16",
            attention="unfused", overlap="true", dp=r["dp"], step_time_s=f"{_sc21_step(r):.4f}",
            source=r["source"],
            notes=(f"{SC21_NOTE}; DeepSpeed of 2021 inside Megatron: stack deepspeed-2021 (T9); unfused attention as "
                   f"SC21 Table 1. Source notes: {r['notes']}")))
    return out


def sc21(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        out.append(dict(
            run_id=r["case_id"], model="gpt3-175b", layers=r["num_layers"], hidden=r["hidden_size"],
            heads=r["num_attention_heads"], ffn=r["ffn_hidden_size"], vocab=r["vocab_size"],
            seq_len=r["seq_length"], cluster="selene", gpus=r["num_gpus"],
            stack="megatron-sc21", tp=r["tp"], pp=r["pp"], vpp=r["model_chunks_per_gpu"] or "1", sp="false",
            zero="0", recompute="full", micro_batch=r["micro_batch_size"], global_batch=r["global_batch_size"],
            dtype="fp16", attention="unfused", overlap="false" if r["ddp_impl"] == "local" else "true",
            dp=r["dp"], step_time_s=f"{_sc21_step(r):.4f}", source=f"{r['source']}; {r['source_config']}",
            notes=(f"{SC21_NOTE}; plan as tpsim/estimator/reference.py re-simulates it (fp16, full recomputation, "
                   f"unfused attention, ddp_impl {r['ddp_impl']}). Source notes: {r['notes']}")))
    return out


def _write(rows: list[dict]) -> str:
    buf = io.StringIO()
    used = [c for c in COLUMNS if any(r.get(c) for r in rows)]
    w = csv.DictWriter(buf, fieldnames=used, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in used})
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent.parent / "shared" / "data"),
                    help="the shared data folder (holding runs/)")
    ap.add_argument("--check", action="store_true", help="compare with the shipped files, write nothing")
    args = ap.parse_args()
    shared = Path(args.shared)
    if not (shared / "runs").is_dir():
        shared = Path("/work/shared/data")
    runs = shared / "runs"
    dev = (megatron_core(_read(runs / "megatron_core_h100.csv")) + nemo(_read(runs / "nemo_h100_fp8.csv"))
           + mpt(_read(runs / "mpt_llmfoundry_fsdp.csv")) + torchtitan(_read(runs / "torchtitan_fsdp2.csv"))
           + deepspeed(_read(runs / "deepspeed_zero3_sc21.csv")))
    ref = sc21(_read(ROOT / "tpsim" / "data" / "reference" / "megatron_weak_scaling.csv"))
    header = ("# tpsim runs file (docs/RUNS.md), written by benchmarks/convert_runs.py from {what}; each row's "
              "source and the conversion's choices are in its source and notes cells\n")
    files = {OUT / "development.csv": header.format(what="the published development set (shared data/runs)")
             + _write(dev),
             OUT / "sc21.csv": header.format(what="SC21 Table 1 (tpsim/data/reference/megatron_weak_scaling.csv)")
             + _write(ref)}
    files[OUT / NEMO_BF16_STACK] = nemo_bf16_optimizer_profile()
    if _have_device("H100-SXM-96GB"):
        files[OUT / "clusters" / "grand-teton-h100.yaml"] = GRAND_TETON
    status = 0
    for path, text in files.items():
        if args.check:
            same = path.exists() and path.read_text(encoding="utf-8") == text
            print(f"{path.relative_to(ROOT)}: {'up to date' if same else 'DIFFERS'}")
            status |= 0 if same else 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
