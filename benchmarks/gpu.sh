#!/usr/bin/env bash
# The benchmark table on CUDA and the GPU-marked tests, for a machine with a CUDA device.
# Usage: bash benchmarks/gpu.sh [extra arguments for benchmarks/run.py, e.g. --quick]
# Budget: under 8 minutes in all (each step has its own timeout). Results:
# results/gpu_step.json (one ascent step on BERT-base's shape: per-iteration ratio, kernel
# launches per step, peak memory; eager, torch.compile and CUDA graphs),
# results/benchmarks_cuda.json (table, ratios, details) and the pytest summary on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("benchmarks/gpu.sh: no CUDA device visible to torch " + torch.__version__)
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

mkdir -p results
status=0
timeout 180 python benchmarks/gpu_step.py --device cuda --json results/gpu_step.json \
    || status=$?
timeout 210 python benchmarks/run.py --device cuda --json results/benchmarks_cuda.json "$@" \
    || status=$?
timeout 75 python -m pytest -m gpu -q -p no:cacheprovider || status=$?
exit "$status"
