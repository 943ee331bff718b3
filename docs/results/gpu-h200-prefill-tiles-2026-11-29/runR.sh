#!/usr/bin/env bash
# Session 54, lease R (nvidia-h200): bash .gpujob/i_setup.sh s54/runQ.sh, then the six chunk calls.
# Issue 32: BlockAttention's prefill chunks on tensor-core tiles (attention_tiles.cu): correct against the CPU op,
# then prompt throughput and the end-to-end decision run for --block-attention auto.
R=/tmp/s54-out; mkdir -p "$R"; exec > "$R/jobR.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"; cd /tmp/repo; git log --oneline -1 2>/dev/null
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
timeout 300 python3 tools/check_attention_qkv_gpu.py --batches 64 --contexts 512 --windows 1024,0 --prefill 512,2048,4096 \
  --json $R/qkv.json 2>&1 | f | tail -24; echo "rc=${PIPESTATUS[0]}"
wait $EP; echo "exports $(date -u +%H:%M:%S)"; ls $S
echo "=== 2. prefill ($(date -u +%H:%M:%S))"
timeout 400 python3 tools/bench_prefill.py --model-dir $S/gemma3-27b-8-paged-wicore-block --model-dir $S/gemma3-27b-8-paged-wicore \
  --devices cuda:0 --prompts 64 --input-len 512 --batched-tokens 2048,8192 --gpu-kernels --hf $S/gemma3-27b-hf-8 --hf-compiled \
  --json $R/prefill8.json > $R/prefill8.log 2>&1; echo "rc=$?"; f < $R/prefill8.log | grep -v "^\s*0\.0" | tail -44
echo "=== 3. families ($(date -u +%H:%M:%S))"
timeout 200 python3 tools/check_families_gpu.py --families gemma3,gemma2,mistral-sliding,phi3-longrope \
  --exports fp16-paged-wicore,fp16-paged-wicore-block,fp16-paged-wicore-all --no-sampled --work /tmp/families \
  --json $R/families.json 2>&1 | f | tail -30; echo "rc=${PIPESTATUS[0]}"
cp /tmp/families/*.json $R/ 2>/dev/null
echo "=== 4. end to end ($(date -u +%H:%M:%S))"
timeout 560 bash tools/gpu_block_attention_bench.sh $S > $R/e2e.log 2>&1; f < $R/e2e.log | tail -40
cp $S/results/*.json $R/ 2>/dev/null
echo "JOBR-DONE $(date -u +%H:%M:%S) UTC"
