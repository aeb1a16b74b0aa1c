#!/bin/bash
# The CUDA checks as one run on a GPU machine (nothing is downloaded there): the tests marked `cuda`, then the
# Triton decode kernel's timings (bench/gpu_kernels.py). Logs and JSON go to $OUT (default /tmp/gpu_check).
#   bash bench/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -o addopts="-rs" -m cuda tests/kernels 2>&1 | tee "$OUT/cuda_tests.log"
tests=${PIPESTATUS[0]}
PYTHONUNBUFFERED=1 python3 bench/gpu_kernels.py --out "$OUT/gpu_kernels.json" 2>&1 | tee "$OUT/gpu_kernels.log"
bench=${PIPESTATUS[0]}
echo "cuda tests exit $tests, kernel bench exit $bench"
exit $(( tests || bench ))
