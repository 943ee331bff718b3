#!/usr/bin/env bash
# Session 55, lease V (nvidia-h200): bash .gpujob/i_setup.sh s55/runV.sh, then the six chunk calls.
# Issue 32: the tiles kernel, three builds side by side: A (a2ae98b: cp.async pipeline, 2 blocks an SM),
# B (the tree: q's shared memory reused for the scores, 3 blocks an SM), C (B with p in one float16 part, as
# FlashAttention). Kernel time per layer (check_attention_qkv_gpu.py --prefill), B's correctness, then
# end to end with B.
R=/tmp/s55-out; mkdir -p "$R"; exec > "$R/jobV.log" 2>&1
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
for v in A C; do
  rm -rf /tmp/repo$v && mkdir /tmp/repo$v && cp -a /tmp/repo/wicore /tmp/repo/tools /tmp/repo$v/
  cp .gpujob/s55/tiles_$v.cu /tmp/repo$v/wicore/kernels/csrc/attention_tiles.cu
done
BP=""
for v in A B C; do
  src=/tmp/repo$v; cache=/tmp/wc-$v; [ $v = B ] && { src=/tmp/repo; cache=/tmp/wc-cache; }
  (PYTHONPATH=$src WICORE_CACHE=$cache python3 -c "from wicore.kernels.library import library; print(library(True))" 2>&1 | tail -1 > /tmp/lib$v.txt) &
  BP="$BP $!"
done
wait $BP
. /tmp/repo/.gpujob/wait_parts.sh
. /tmp/repo/.gpujob/setup.sh
LA=$(cat /tmp/libA.txt); LB=$(cat /tmp/libB.txt); LC=$(cat /tmp/libC.txt)
echo "libs A $LA B $LB C $LC ($(date -u +%H:%M:%S))"
for round in 1 2; do
  for v in A B C; do
    eval lib=\$L$v
    echo "=== round $round, $v ($(date -u +%H:%M:%S))"
    timeout 100 python3 tools/check_attention_qkv_gpu.py --library $lib --batches 64 --contexts 512 --windows 1024 \
      --prefill 2048,4096 --json $R/qkv-$v-$round.json 2>&1 | f | grep -E "worst|prefill|BlockAttentionQKV  "
  done
done
echo "=== B against the CPU op ($(date -u +%H:%M:%S))"
timeout 200 python3 tools/check_attention_gpu.py --no-timing --library $LB 2>&1 | f | tail -3; echo "rc=${PIPESTATUS[0]}"
echo "=== families ($(date -u +%H:%M:%S))"
timeout 200 python3 tools/check_families_gpu.py --families gemma3,gemma2,mistral-sliding \
  --exports fp16-paged-wicore,fp16-paged-wicore-block --no-sampled --work /tmp/families \
  --json $R/families.json 2>&1 | f | grep -E "greedy|failed|part"; echo "rc=${PIPESTATUS[0]}"
wait $EP; echo "exports $(date -u +%H:%M:%S)"
python3 -m wicore.cli bench throughput --model $S/gemma3-27b-8-paged-wicore --devices cuda:0 --cuda-graphs on \
  --num-prompts 16 --max-num-seqs 16 --input-len 512 --output-len 16 --max-context 1024 --kv-pool-gb 8 > /dev/null 2>&1
for c in "64 4096 32 paged-wicore" "64 4096 32 paged-wicore-block" "256 512 256 paged-wicore-block" "256 512 256 paged-wicore" \
         "64 4096 32 paged-wicore-block" "64 4096 32 paged-wicore"; do
  read -r n i o v <<< "$c"
  echo "=== $n x ($i + $o), $v ($(date -u +%H:%M:%S))"
  timeout 100 python3 -m wicore.cli bench throughput --model $S/gemma3-27b-8-$v --devices cuda:0 --cuda-graphs on \
    --num-prompts $n --max-num-seqs $n --input-len $i --output-len $o --max-context $((i + o)) --kv-pool-gb 24 \
    --json $R/e2e-$n-$i-$v-$(date +%s).json 2>&1 | grep Throughput | cut -c1-150
done
echo "JOBV-DONE $(date -u +%H:%M:%S) UTC"
