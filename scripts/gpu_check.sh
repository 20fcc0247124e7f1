#!/usr/bin/env bash
# Training throughput of keras-attention's trainer on one GPU, one command:
#
#     scripts/gpu_check.sh                     # larger config, bf16 + XLA
#     scripts/gpu_check.sh --peak-tflops 989   # GPU not in the peak table
#     scripts/gpu_check.sh --smoke             # tiny dry run (CPU is fine)
#
# Trains reverse on 512-token sequences with an 8-layer, 16-head, 1024-wide
# model (batch 64, 300 steps) under mixed_bfloat16 and XLA, and prints: the
# device and config, the compile time of the first step, steady ms/step,
# steps/s and tokens/s, model TFLOP/s, model FLOPs utilization against the
# GPU's dense bf16 peak (--peak-tflops, else a table: H100/H200 SXM 989,
# A100 312, ...) and against a bf16 matmul measured in the same run, and the
# held-out accuracy. Any other flag is passed on (see
# `python scripts/gpu_check.py --help`). Expect a few minutes, most of it
# start-up and compilation.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
fi
exec python scripts/gpu_check.py "$@"
