#!/usr/bin/env bash
# Session 55, lease T (nvidia-h200): bash .gpujob/i_setup.sh s55/runT.sh, then the six chunk calls.
# Issue 32: the tiles' unseen-key fix against the CPU op (NaN in every pool row no query sees), Gemma 3's greedy
# tokens on tiles / decode with the margin where they part, the 27B shape against HF float32 at 1,100 tokens with
# the tiles, then prompts against HF (sdpa, compiled).
R=/tmp/s55-out; mkdir -p "$R"; exec > "$R/jobT.log" 2>&1
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
timeout 300 python3 tools/check_attention_gpu.py --no-timing 2>&1 | f | tail -22; echo "rc=${PIPESTATUS[0]}"
for m in tiles decode; do
  echo "=== 2. families, prefill on $m ($(date -u +%H:%M:%S))"
  WICORE_PREFILL_ATTENTION=$m timeout 200 python3 tools/check_families_gpu.py --families gemma3,gemma2,mistral-sliding \
    --exports fp16-paged-wicore,fp16-paged-wicore-block,fp16-paged-wicore-all --no-sampled --work /tmp/families \
    --json $R/families-$m.json 2>&1 | f | grep -E "greedy|diff|failed|part"; echo "rc=${PIPESTATUS[0]}"
done
wait $EP; echo "exports $(date -u +%H:%M:%S)"; ls $S
echo "=== 3. 27B shape against HF float32, 1,100 tokens ($(date -u +%H:%M:%S))"
timeout 400 python3 tools/bench_shapes.py --layers 8 --variants paged-wicore,paged-wicore-block --batch 1 --steps 3 \
  --work $S --check --no-hf --json $R/check27b.json 2>&1 | f | grep -E "check|agree|Error|error" | tail -8; echo "rc=${PIPESTATUS[0]}"
echo "=== 4. prefill ($(date -u +%H:%M:%S))"
timeout 400 python3 tools/bench_prefill.py --model-dir $S/gemma3-27b-8-paged-wicore-block --model-dir $S/gemma3-27b-8-paged-wicore \
  --devices cuda:0 --prompts 64 --input-len 512 --batched-tokens 2048,8192 --gpu-kernels --hf $S/gemma3-27b-hf-8 --hf-compiled \
  --json $R/prefill8.json > $R/prefill8.log 2>&1; echo "rc=$?"; f < $R/prefill8.log | grep -v "^\s*0\.0" | tail -40
echo "JOBT-DONE $(date -u +%H:%M:%S) UTC"
