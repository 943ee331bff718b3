#!/usr/bin/env bash
# Session 52, helper i8: wicore.MatMulI8 (W8A8 on cuBLASLt above 16 rows, weight-only GEMV below) on an H200.
# Needs onnxruntime-gpu under /tmp/site, the repo at /tmp/repo (branch s52-i8), torch, a CUDA 13 toolkit (nvcc, cublasLt.h).
#   (0) in the background: the random 27B checkpoint (8 layers) and the three exports (CPU, while the build runs)
#   (1) the kernel library (nvcc), then tools/check_matmul_i8_gpu.py at rows 1,64,256: bits against the NumPy
#       reference, us against MatMulNBits fpA_intB and fp16 MatMul (~1-2 min)
#   (2) tools/bench_shapes.py: paged-wicore, int8-paged-wicore, int8-paged-i8 (+graphs) at batch 1,64,256 with --check
# Everything under /tmp/s52-out: i8.log (this), check_i8.{log,json}, bench_i8.{log,json}.
R=/tmp/s52-out; mkdir -p "$R"; exec > "$R/i8.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
V=paged-wicore,int8-paged-wicore,int8-paged-i8
(
  python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
make_checkpoints('gemma3-27b', (8, 2), Path('$S'))" 2>&1 | grep -v -e Writing -e Warning | tail -2
  echo "checkpoint $(date -u +%H:%M:%S)"
  for n in 8 2; do for v in ${V//,/ }; do
    python3 -c "
from pathlib import Path
from shape_exports import export
export(Path('$S/gemma3-27b-hf-$n'), '$v', Path('$S/gemma3-27b-$n-$v'))" 2>&1 | grep -v -e Writing -e Warning -e "W:onnx" | tail -2 &
  done; done
  wait
  echo "exports done $(date -u +%H:%M:%S)"
) > "$R/exports_i8.log" 2>&1 &
EXPORTS=$!
# cuBLASLt: where the build finds its header (else a search), and the library the loader would open
H=$(python3 -c "
from wicore.kernels.library import find_compiler, find_cublaslt_include
c = find_compiler(True); print(c and find_cublaslt_include(c.path.parent.parent) or '')")
if [ -z "$H" ]; then
  H=$(find /usr/local /opt /tmp/site /usr/lib -name cublasLt.h 2>/dev/null | head -1)
  [ -n "$H" ] && export WICORE_CUBLASLT_INCLUDE=$(dirname "$H") && echo "WICORE_CUBLASLT_INCLUDE=$WICORE_CUBLASLT_INCLUDE"
fi
python3 -c "
from wicore.kernels.library import find_compiler, find_cublaslt_include
c = find_compiler(True); print('nvcc', c and c.path, 'cublasLt.h in', c and find_cublaslt_include(c.path.parent.parent))"
ldconfig -p 2>/dev/null | grep -m2 libcublasLt.so
python3 -c "from wicore.kernels.library import library; print(library(True))" 2>&1 | tail -2
echo "library $(date -u +%H:%M:%S)"
timeout 300 python3 tools/check_matmul_i8_gpu.py --rows 1,64,256 --repeats 50 --json $R/check_i8.json > $R/check_i8.log 2>&1
echo "check rc=$? $(date -u +%H:%M:%S)"
grep -v -e Warning -e "W:onnx" $R/check_i8.log | tail -24
wait $EXPORTS
cat $R/exports_i8.log
timeout 570 python3 tools/bench_shapes.py --shape gemma3-27b --layers 8,2 --variants ${V//,/+graphs,}+graphs --no-hf \
  --batch 1,64,256 --context 512 --steps 10 --check --check-tokens 1100 --work $S --json $R/bench_i8.json > $R/bench_i8.log 2>&1
echo "bench rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/bench_i8.log | tail -30
echo "I8-DONE $(date -u +%H:%M:%S) UTC"
