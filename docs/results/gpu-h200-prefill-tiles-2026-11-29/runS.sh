#!/usr/bin/env bash
# Session 54, lease S (nvidia-h200): Gemma 3's greedy tokens with the prefill on tiles and on the decode kernel
# (WICORE_PREFILL_ATTENTION), then the prefill-heavy end-to-end case on both exports.
R=/tmp/s54-out; mkdir -p "$R"; exec > "$R/jobS.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"; cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning -e "Loading weights"; }
S=/tmp/shapes; mkdir -p $S/results
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
for m in tiles decode; do
  echo "=== families, prefill on $m ($(date -u +%H:%M:%S))"
  WICORE_PREFILL_ATTENTION=$m timeout 120 python3 tools/check_families_gpu.py --families gemma3,gemma2 \
    --exports fp16-paged-wicore,fp16-paged-wicore-block --no-sampled --work /tmp/families --json $R/families-$m.json 2>&1 \
    | f | grep -E "greedy|diff|failed"
done
wait $EP; echo "exports $(date -u +%H:%M:%S)"
for v in paged-wicore paged-wicore-block paged-wicore paged-wicore-block; do
  echo "=== 64 x (4096 + 32), $v ($(date -u +%H:%M:%S))"
  timeout 150 python3 -m wicore.cli bench throughput --model $S/gemma3-27b-8-$v --devices cuda:0 --cuda-graphs on \
    --num-prompts 64 --max-num-seqs 64 --input-len 4096 --output-len 32 --max-context 4128 --kv-pool-gb 24 \
    --json $R/e2e-$v.json 2>&1 | f | tail -2
done
echo "JOBS-DONE $(date -u +%H:%M:%S) UTC"
