#!/usr/bin/env bash
# Session 51, lease E (short budget): int4 at batch 1 on MatMulQ16 with every layer's attention on BlockAttentionQKV.
R=/tmp/s51-out; mkdir -p "$R"; exec > "$R/jobE.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
make_checkpoints('gemma3-27b', (2, 8), Path('$S'))" 2>&1 | grep -v -e Writing -e Warning | tail -2
echo "checkpoints $(date -u +%H:%M:%S)"
ex() { python3 -c "
from pathlib import Path
from shape_exports import export
export(Path('$S/gemma3-27b-hf-$1'), '$2', Path('$S/gemma3-27b-$1-$2'))" 2>&1 | grep -v -e Writing -e Warning -e "W:onnx" | tail -2; }
ex 2 int4-paged-q16 & ex 8 int4-paged-q16 & ex 2 int4-paged-q16-all & ex 8 int4-paged-q16-all &
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
timeout 200 python3 tools/bench_shapes.py --shape gemma3-27b --layers 2,8 --variants int4-paged-q16+graphs,int4-paged-q16-all+graphs \
  --no-hf --batch 1 --context 512 --steps 30 --work $S --json $R/int4e.json > $R/int4e.log 2>&1; echo "rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/int4e.log | tail -12
echo "JOBE-DONE $(date -u +%H:%M:%S) UTC"
