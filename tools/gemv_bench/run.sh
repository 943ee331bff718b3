#!/usr/bin/env bash
# Build and run the GEMV benchmark (gemv_bench.cu) on a CUDA machine; the table goes to stdout and, where $OUT
# is set, to $OUT/gemv.txt. Run from the repository root: tools/gemv_bench/run.sh [variant]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="${GEMV_CSRC:-$here/../../wicore/kernels/csrc}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
"$nvcc" --version | tail -1 > "$out/nvcc.txt"
"$nvcc" -O3 -arch=sm_90 -std=c++17 -lineinfo -I"$here" -I"$csrc" -Xptxas -v "$here/gemv_bench.cu" -o "$out/gemv_bench" \
  2> "$out/ptxas.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv > "$out/gpu.txt" 2>&1 || true
"$out/gemv_bench" "$@" | tee "$out/gemv.txt"
rm -f "$out/gemv_bench"
