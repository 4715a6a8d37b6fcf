#!/usr/bin/env bash
# GPU validation on an H200 node (issues 6 and 12), one short script; records predicted vs measured in
# reports/validation/h200-*.json and prints one line per phase.
#  1. single GPU, per-shard shapes: one rank's layer of Llama-3-8B at tp = 1, 2, 4, 8 (query/KV heads and FFN
#     divided by tp, hidden 4096, head dim 128, sequence 8192, one sequence) as a tp=1 block, fp32;
#  2. single GPU, the whole-plan path: a 4-layer Llama-3-8B-shaped stack, 4 micro-batches, the optimizer step
#     (--whole with every axis of size 1: the step, optimizer and overhead terms on a GPU);
#  2a. full-size layers: Llama-3-8B at its own widths and sequence 8192, as many layers as fit (--fill-layers);
#  2b. the same under torchrun (tpsim validate joining the launch, issue 22), with the step's terms and per-rank
#     steps printed for every whole-plan report;
#  3. one GPU per rank, one axis at a time, if the node has >= 2 GPUs: tp 2 (SP), pp 2 (1F1B), dp 2 (ZeRO-3,
#     FSDP2), NCCL; skipped (and said so) on a single-GPU machine.
# Predicted with the newest non-CPU kernel profile in profiles/ (or the roofline if none), the H200 node topology.
# Runs from the source tree (PYTHONPATH, no install; matplotlib and pandas optional). About 5-8 minutes.
# Usage: bash reports/validation/h200_single_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=reports/validation
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
PROFILE="${PROFILE:-$(ls -t profiles/*.csv 2>/dev/null | grep -v '/cpu-' | head -1 || true)}"
profile_args=(--no-profile)
[ -n "$PROFILE" ] && profile_args=(--profile "$PROFILE")
common=(--backend nccl --cluster hgx-h200 "${profile_args[@]}" --timeout 120 --budget 600 --json)

show() {  # print predicted vs measured of one report
  python - "$1" <<'PY'
import json, sys
path = sys.argv[1]
try:
    r = json.load(open(path))
except (OSError, ValueError) as exc:
    print(f"{path}: no report ({exc})"); sys.exit(0)
for s in r.get("cases", []):
    check = s.get("profile_check") or {}
    print(f"{s['case']}: numerics {s['numerics_ok']}, collectives {s['collectives_match']}, profile check "
          f"{check.get('action')} (median drift {check.get('median_drift')})")
    for p in s["phases"]:
        if p["predicted_s"] is None:
            continue
        err = "" if p["error_pct"] is None else f"{p['error_pct']:+6.1f}%"
        print(f"  {p['name']:<20} predicted {p['predicted_s']*1e3:10.3f} ms  measured {p['measured_s']*1e3:10.3f} ms  {err}")
    for n, t in (s.get("terms") or {}).items():  # issue 22: the step's terms side by side
        pred = "-" if t["predicted_s"] is None else f"{t['predicted_s']*1e3:10.3f} ms"
        print(f"  term {n:<15} predicted {pred:>13}  measured {t['measured_s']*1e3:10.3f} ms")
    pr = s.get("per_rank")
    if pr:
        print(f"  slowest rank {pr['slowest']['rank']} on {pr['slowest']['host']}; step median "
              f"{pr['step_median_s']*1e3:.2f} ms over {pr['steps']} steps, spread {pr['step_spread_pct']:.1f}%")
PY
}

run() {  # name, then tpsim validate arguments
  local name=$1; shift
  python -m tpsim.cli validate "$@" "${common[@]}" --name "$name" > "$OUT/$name.json" || echo "$name failed (exit $?)"
  show "$OUT/$name.json"
}

# 1. per-shard shapes on one GPU
for t in 1 2 4 8; do
  run "h200-llama3-8b-shard-of-$t" --nproc 1 --tp 1 --shard-of "$t" --model llama3-8b --no-calibrate \
      --micro-batch 1 --reps 10 --warmup 3
done

# 2. the whole-plan path on one GPU
run h200-llama3-8b-whole-1gpu --nproc 1 --tp 1 --whole --model llama3-8b --layers 4 --seq-len 4096 \
    --micro-batch 1 --microbatches 4 --no-calibrate --reps 5 --warmup 2

# 2a. full-size layers (issue 22): Llama-3-8B's own widths and sequence, as many of its layers as fit the GPU
run h200-llama3-8b-full-size-1gpu --nproc 1 --tp 1 --fill-layers --model llama3-8b --micro-batch 1 \
    --microbatches 2 --no-calibrate --reps 5 --warmup 2

# 2b. the same whole-plan path under torchrun (issue 22: tpsim validate joins the launch; NCCL, 1 rank)
python -m torch.distributed.run --standalone --nproc-per-node=1 --max-restarts=0 -m tpsim.validate.worker \
    --validate --nproc 1 --tp 1 --whole --model llama3-8b --layers 4 --seq-len 4096 --micro-batch 1 \
    --microbatches 4 --no-calibrate --reps 5 --warmup 2 "${common[@]}" --name h200-llama3-8b-whole-1gpu-torchrun \
    > "$OUT/h200-llama3-8b-whole-1gpu-torchrun.json" || echo "torchrun joined run failed (exit $?)"
show "$OUT/h200-llama3-8b-whole-1gpu-torchrun.json"

# 3. one GPU per rank, one axis at a time
if [ "$GPUS" -ge 2 ]; then
  run h200-llama3-8b-tp2-sp --tp 2 --sp --whole --model llama3-8b --layers 2 --seq-len 4096 --micro-batch 1 \
      --microbatches 2 --reps 5 --warmup 2
  run h200-llama3-8b-pp2 --tp 1 --pp 2 --model llama3-8b --layers 4 --seq-len 4096 --micro-batch 1 \
      --microbatches 4 --reps 5 --warmup 2
  run h200-llama3-8b-dp2-z3 --tp 1 --dp 2 --zero 3 --model llama3-8b --layers 2 --seq-len 4096 --micro-batch 1 \
      --microbatches 2 --reps 5 --warmup 2
else
  echo "1 GPU on this machine: the 1-GPU-per-axis checks (tp 2, pp 2, dp 2) need 2 GPUs and were skipped"
fi
