#!/usr/bin/env bash
# Session 52, lease G: the 27B shape's fp16 step fitted to 62 layers on an H200, ORT's paged attention on every
# layer against WiCore's BlockAttention on the sliding layers (--block-attention sliding), batch 1 / 64 / 256.
R=/tmp/s52-out; mkdir -p "$R"; exec > "$R/jobG.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
make_checkpoints('gemma3-27b', (8, 2), Path('$S'))" 2>&1 | grep -v -e Writing -e Warning | tail -2
echo "checkpoints $(date -u +%H:%M:%S)"
for n in 8 2; do for v in paged-wicore paged-wicore-block; do python3 -c "
from pathlib import Path
from shape_exports import export
export(Path('$S/gemma3-27b-hf-$n'), '$v', Path('$S/gemma3-27b-$n-$v'))" 2>&1 | grep -v -e Writing -e Warning -e "W:onnx" | tail -2 &
done; done
for _ in $(seq 900); do
  [ -f /tmp/site/onnxruntime/__init__.py ] && break
  if [ -f /tmp/parts/WHEEL_NAME ] && [ "$(ls /tmp/parts/part.* 2>/dev/null | wc -l)" = 6 ]; then
    a=$(du -sb /tmp/parts | cut -f1); sleep 5; [ "$a" = "$(du -sb /tmp/parts | cut -f1)" ] && break
  fi
  sleep 2
done
. /tmp/repo/.gpujob/setup.sh
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
python3 -c "from wicore.kernels.library import library; print(library(True))" 2>&1 | tail -1
wait
echo "exports done $(date -u +%H:%M:%S)"
timeout 400 python3 tools/bench_shapes.py --shape gemma3-27b --layers 8,2 --variants paged-wicore+graphs,paged-wicore-block+graphs \
  --no-hf --batch 1,64,256 --context 512 --steps 10 --work $S --json $R/fp16-fit.json > $R/fp16-fit.log 2>&1; echo "rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/fp16-fit.log | tail -12
echo "JOBG-DONE $(date -u +%H:%M:%S) UTC"
