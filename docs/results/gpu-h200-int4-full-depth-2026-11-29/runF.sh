#!/usr/bin/env bash
# Session 52, lease F: the 27B shape's int4 step at full depth (62 layers, random blocks, no fit):
# MatMulNBits against MatMulQ16 (and MatMulQ16 with every layer's attention on BlockAttentionQKV).
R=/tmp/s52-out; mkdir -p "$R"; exec > "$R/jobF.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
ex() { python3 -c "
from pathlib import Path
from shape_exports import random_export
random_export('gemma3-27b', 62, '$1', Path('$S/gemma3-27b-62-$1-random'))" 2>&1 | grep -v -e Writing -e Warning -e "W:onnx" | tail -2; }
ex int4-paged & ex int4-paged-q16 & ex int4-paged-q16-all &
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
echo "exports done $(date -u +%H:%M:%S)"; du -sh $S/*; df -h /tmp | tail -1
timeout 420 python3 tools/bench_shapes.py --shape gemma3-27b --layers 62 --random-weights \
  --variants int4-paged+graphs,int4-paged-q16+graphs,int4-paged-q16-all+graphs \
  --no-hf --batch 1,8,64 --context 512 --steps 30 --work $S --json $R/int4-62.json > $R/int4-62.log 2>&1; echo "rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/int4-62.log | tail -14
echo "JOBF-DONE $(date -u +%H:%M:%S) UTC"
