#!/usr/bin/env bash
# Session 53, lease X, call Y (warm machine): the fp16 62-layer graphs at batches that fit one H200, and the
# two-card groups + CUDA graphs setup again with cuDNN's flash attention off (it failed on cuda:1 with it on).
R=/tmp/s53-out; exec > "$R/jobY.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
. /tmp/repo/.gpujob/setup.sh
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning -e Loading; }
echo "=== 2b. fp16 62 layers, graphs measured ($(date -u +%H:%M:%S))"
timeout 300 python3 tools/bench_shapes.py --shape gemma3-27b --layers 62 --random-weights --variants paged-wicore-block+graphs \
  --no-hf --batch 1,64,128 --context 512 --steps 20 --work /tmp/shapes --json $R/fp16-62.json > $R/fp16-62.log 2>&1
echo "rc=$?"; f < $R/fp16-62.log | tail -10
echo "=== 1b. two cards, cuDNN flash attention off ($(date -u +%H:%M:%S))"
ORT_ENABLE_CUDNN_FLASH_ATTENTION=0 timeout 420 python3 tools/bench_pipeline_gpu.py --layers 62 --streams 32,16 --kv-pool-gb 10 \
  --card-gb 16 --setups "split, groups + CUDA graphs;split, whole steps" --work /tmp/pipe --json $R/pipe62-nocudnn.json \
  > $R/pipe62-nocudnn.log 2>&1
echo "rc=$?"; f < $R/pipe62-nocudnn.log | grep -v "^\s*$" | cut -c1-300 | tail -16
echo "JOBY-DONE $(date -u +%H:%M:%S) UTC"
