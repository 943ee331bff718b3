#!/usr/bin/env bash
# Session 55, lease U (nvidia-h200): bash .gpujob/i_setup.sh s55/runU.sh, then the six chunk calls.
# Issue 32: the tiles' pipelined K/V (cp.async) and register softmax: the op against the CPU op, racecheck and
# memcheck on the tiles' cases, the families' greedy tokens, prompts, then the end-to-end decision run.
R=/tmp/s55-out; mkdir -p "$R"; exec > "$R/jobU.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"; cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning -e "Loading weights"; }
S=/tmp/shapes; mkdir -p $S $S/results
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints, export
d = make_checkpoints('gemma3-27b', (8,), Path('$S'))[8]
import concurrent.futures as cf
with cf.ThreadPoolExecutor(2) as ex:
    list(ex.map(lambda v: export(d, v, Path('$S') / f'gemma3-27b-8-{v}'), ['paged-wicore', 'paged-wicore-block']))
" 2>&1 | f | tail -3 &
EP=$!
. /tmp/repo/.gpujob/wait_parts.sh
. /tmp/repo/.gpujob/setup.sh
echo "=== 1. the op against the CPU op ($(date -u +%H:%M:%S))"
timeout 300 python3 tools/check_attention_gpu.py --no-timing 2>&1 | f | tail -20; echo "rc=${PIPESTATUS[0]}"
timeout 200 python3 tools/check_attention_qkv_gpu.py --batches 64 --contexts 512 --windows 1024,0 --prefill 512,2048,4096 \
  --json $R/qkv.json 2>&1 | f | tail -24; echo "rc=${PIPESTATUS[0]}"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
for tool in racecheck memcheck; do
  echo "=== 2. $tool on the tiles' cases ($(date -u +%H:%M:%S))"
  timeout 200 $CS --tool $tool --kernel-name regex:TilesKernel --print-limit 5 python3 tools/check_attention_gpu.py \
    --no-timing --cases 10: 2>&1 | f | grep -v "^batch" | tail -8; echo "rc=${PIPESTATUS[0]}"
done
echo "=== 3. families ($(date -u +%H:%M:%S))"
timeout 200 python3 tools/check_families_gpu.py --families gemma3,gemma2,mistral-sliding \
  --exports fp16-paged-wicore,fp16-paged-wicore-block,fp16-paged-wicore-all --no-sampled --work /tmp/families \
  --json $R/families.json 2>&1 | f | grep -E "greedy|diff|failed|part"; echo "rc=${PIPESTATUS[0]}"
wait $EP; echo "exports $(date -u +%H:%M:%S)"
echo "=== 4. prefill ($(date -u +%H:%M:%S))"
timeout 300 python3 tools/bench_prefill.py --model-dir $S/gemma3-27b-8-paged-wicore-block --model-dir $S/gemma3-27b-8-paged-wicore \
  --devices cuda:0 --prompts 64 --input-len 512 --batched-tokens 2048,8192 --gpu-kernels \
  --json $R/prefill8.json > $R/prefill8.log 2>&1; echo "rc=$?"; grep -E "prompt tok/s|Tiles|Prologue|flash_fwd|QkNorm" $R/prefill8.log | cut -c1-140
echo "=== 5. end to end ($(date -u +%H:%M:%S))"
CHECK_TOKENS=0 ROUNDS=2 timeout 300 bash tools/gpu_block_attention_bench.sh $S 2>&1 | grep -E "===|Throughput" | cut -c1-170
cp -r $S/results $R/e2e
echo "JOBU-DONE $(date -u +%H:%M:%S) UTC"
