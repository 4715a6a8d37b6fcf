#!/usr/bin/env bash
# Single-GPU validation on an H200 (issue 6): one rank's layer of Llama-3-8B at tp = 1, 2, 4, 8 (query/KV heads
# and FFN divided by tp, hidden 4096, head dim 128, sequence 8192, one sequence), run as a tp=1 block on one GPU
# in fp32 (the numerics check needs it), predicted with the newest non-CPU kernel profile in profiles/.
# Runs from the source tree (PYTHONPATH, no install). Writes reports/validation/h200-llama3-8b-shard-of-<T>.{csv,png,json}.
# Usage: bash reports/validation/h200_single_gpu.sh        (about 2-4 minutes on an H200)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
PROFILE="${PROFILE:-$(ls -t profiles/*.csv 2>/dev/null | grep -v '/cpu-' | head -1 || true)}"
profile_args=(--no-profile)
[ -n "$PROFILE" ] && profile_args=(--profile "$PROFILE")
for t in 1 2 4 8; do
  python -m tpsim.cli validate --backend nccl --nproc 1 --tp 1 --shard-of "$t" --model llama3-8b \
      --cluster hgx-h200 "${profile_args[@]}" --no-calibrate --micro-batch 1 --reps 10 --warmup 3 \
      --timeout 120 --budget 600 --name "h200-llama3-8b-shard-of-$t" --json \
      > "reports/validation/h200-llama3-8b-shard-of-$t.json" || echo "shard-of $t failed (exit $?)"
  python - "$t" <<'PY'
import json, sys
t = sys.argv[1]
r = json.load(open(f"reports/validation/h200-llama3-8b-shard-of-{t}.json"))
for p in r["phases"]:
    print(f"shard-of {t} {p['name']:<8} predicted {p['predicted_s']*1e3:9.3f} ms  measured {p['measured_s']*1e3:9.3f} ms"
          f"  {p['error_pct']:+6.1f}%")
PY
done
