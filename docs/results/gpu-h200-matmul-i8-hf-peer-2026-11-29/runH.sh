#!/usr/bin/env bash
# Session 52, lease H: int8 on MatMulI8 and fp16 against HF transformers (bf16 sdpa) in the same run, 8 layers.
R=/tmp/s52-out; mkdir -p "$R"; exec > "$R/jobH.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
make_checkpoints('gemma3-27b', (8,), Path('$S'))" 2>&1 | grep -v -e Writing -e Warning | tail -2
echo "checkpoints $(date -u +%H:%M:%S)"
for n in 8; do for v in paged-wicore int8-paged-i8; do python3 -c "
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
timeout 330 python3 tools/bench_shapes.py --shape gemma3-27b --layers 8 --variants paged-wicore+graphs,int8-paged-i8+graphs \
  --batch 1,64,256 --context 512 --steps 10 --work $S --json $R/hf-peer.json > $R/hf-peer.log 2>&1; echo "rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/hf-peer.log | tail -14
echo "JOBH-DONE $(date -u +%H:%M:%S) UTC"
