#!/usr/bin/env bash
# Kernel profile of this machine's GPU, from the source tree, with no install step:
#     bash benchmarks/gpu_profile.sh
# Runs `PYTHONPATH=. python -m tpsim.cli profile --device cuda` (or `python -m tpsim.profiler` where another
# verb cannot load on this Python) and writes
#     profiles/<gpu>-kernels.csv              the profile (resumable: rerun the script to finish a cut run)
#     profiles/<gpu>-kernels-check.json       its leave-one-out interpolation error (`--check --json`)
#     profiles/<gpu>-kernels-roofline.txt     the device roofline's predicted / measured times (needs PyYAML)
# and copies them to $OUT when that folder exists (the device runner's output folder).
# Environment: PYTHON (default python3), GRID (full | quick; default full), LIMIT_S (wall-clock cap of the
# measurement, default 420 s: the file keeps every finished point), PROFILE_OUT (profile path),
# ROOFLINE_DEVICE (device-table name for the comparison; default: derived from the GPU name, e.g. H200),
# DEVICE (cuda; `DEVICE=cpu GRID=tiny PROFILE_OUT=/tmp/x.csv` rehearses the script on a machine without GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! $PY -c "import torch, numpy" 2>/dev/null; then
    echo "gpu_profile: this Python has no torch or numpy" >&2; exit 1
fi
if ! $PY -c "import yaml" 2>/dev/null; then
    # tpsim reads device tables with PyYAML; measuring does not need them: a stub lets the package import.
    shim=$(mktemp -d)
    printf 'def safe_load(*args, **kwargs):\n    raise ImportError("PyYAML is not installed")\n' > "$shim/yaml.py"
    export PYTHONPATH="$PYTHONPATH:$shim"
    no_yaml=1
fi
device_type=${DEVICE:-cuda}
if [ "$device_type" = cuda ]; then
    gpu=$($PY -c "import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))" \
          2>/dev/null) || { echo "gpu_profile: torch sees no CUDA device" >&2; exit 1; }
else
    gpu="cpu rehearsal"
fi
slug=$(echo "$gpu" | tr 'A-Z' 'a-z' | sed -e 's/nvidia//' -e 's/[^a-z0-9][^a-z0-9]*/-/g' -e 's/^-//' -e 's/-$//')
out=${PROFILE_OUT:-profiles/${slug:-gpu}-kernels.csv}
base=${out%.csv}
if $PY -c "import tpsim.cli as c; c.build_parser()" >/dev/null 2>&1; then
    cli=("$PY" -m tpsim.cli profile)
else
    cli=("$PY" -m tpsim.profiler)
fi
echo "gpu_profile: $gpu -> $out (${cli[*]}, torch $($PY -c 'import torch; print(torch.__version__)'))"

timeout --signal=INT --kill-after=30 "${LIMIT_S:-420}" "${cli[@]}" --device "$device_type" --grid "${GRID:-full}" \
    --out "$out" --no-progress
rc=$?
[ $rc -ne 0 ] && echo "gpu_profile: measurement ended with status $rc (finished points are kept; rerun to resume)"

"${cli[@]}" --check "$out" --json > "$base-check.json" && cat "$base-check.json" | head -c 400 && echo
device=${ROOFLINE_DEVICE:-$(echo "$gpu" | grep -o -E 'H200|H100|A100|B200' | head -1)}
if [ -z "${no_yaml:-}" ] && [ -n "$device" ]; then
    "${cli[@]}" --check "$out" --roofline "$device" > "$base-roofline.txt" && grep -E "^  gemm +mm" "$base-roofline.txt"
fi
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$out" "$base"-check.json "$OUT"/ 2>/dev/null
    [ -f "$base-roofline.txt" ] && cp "$base-roofline.txt" "$OUT"/
fi
exit $rc
