#!/bin/bash
# The CUDA checks as one run on a GPU machine (nothing is downloaded there; everything comes from the working
# tree): the tests marked `cuda`, the Triton kernels' timings (bench/gpu_kernels.py: decode bandwidth, prefill
# against SDPA), and the engine's throughput against HF generate on random 7B-geometry weights
# (bench/gpu_engine.py). Logs and JSON go to $OUT (default /tmp/gpu_check); the figures to $OUT/figures.md.
# Nothing here imports pydantic-settings, gguf or xgrammar (the engine is built from EngineConfig, not a profile),
# so the image's packages suffice: no wheels to carry.
#   bash bench/gpu_check.sh                 # about 5 minutes on an H200
#   ENGINE_LAYERS=8 bash bench/gpu_check.sh # fewer layers, if memory or time is short
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="-rs" -m cuda tests/kernels \
    tests/engine/test_cuda_graphs.py 2>&1 | tee "$OUT/cuda_tests.log"
tests=${PIPESTATUS[0]}
timeout 150 python3 bench/gpu_kernels.py --out "$OUT/gpu_kernels.json" 2>&1 | tee "$OUT/gpu_kernels.log"
kernels=${PIPESTATUS[0]}
timeout 240 python3 bench/gpu_engine.py --layers "${ENGINE_LAYERS:-32}" --out "$OUT/gpu_engine.json" 2>&1 \
    | tee "$OUT/gpu_engine.log"
engine=${PIPESTATUS[0]}
{
    echo "# GPU check $(date -u +%F) on $(cat "$OUT/gpu.txt")"
    echo; echo "cuda tests: $(tail -n 1 "$OUT/cuda_tests.log")"
    echo; echo "## Kernels"; grep -E '^\||copy bandwidth' "$OUT/gpu_kernels.log"
    echo; echo "## Engine vs HF generate"; grep -E '^\||layers of 7B' "$OUT/gpu_engine.log"
} > "$OUT/figures.md"
echo "cuda tests exit $tests, kernel bench exit $kernels, engine bench exit $engine; figures in $OUT/figures.md"
exit $(( tests || kernels || engine ))
