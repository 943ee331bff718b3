#!/usr/bin/env bash
# `--block-attention` end to end on one GPU: the 27B shape (8 layers: 7 sliding, 1 full; random fp16
# weights, WiCore's kernels, paged, CUDA graphs) exported with the sliding layers on ORT's
# PagedAttention (`paged-wicore`: what `auto` gives while paged_block.AUTO_KINDS is empty) and on
# WiCore's BlockAttentionQKV (`paged-wicore-block`: `--block-attention sliding`), then `wicore bench
# throughput`, prefill and decode together, each configuration a fresh process, the two alternating:
#
#   64 requests of 512 + 256 tokens, 256 of 512 + 256 (decode-heavy), 64 of 4,096 + 32 (prefill-heavy)
#
# First the exports' check (tools/bench_shapes.py --check): prompt logits of a --check-tokens prompt
# (4,100 tokens: chunked prefill past the 1,024-token window on both kernels) against HF float32, and
# greedy / sampled / top-k / top-p tokens of four prompts (5-1,030 tokens), the block export's against
# the other's. This decides paged_block.AUTO_KINDS: {True} where the block export is at least as fast
# in every case with the same tokens. About 8 minutes on an H200 (two ~9 GB exports, kept in WORK).
#
#   bash tools/gpu_block_attention_bench.sh [WORK]     from the repository root; WORK default /tmp/shapes
#   ROUNDS=2 CHECK_TOKENS=0 bash tools/gpu_block_attention_bench.sh    each case twice, the second round
#                                                                       block first; no check (exports made)
#
# Writes WORK/results/check.json (bench_shapes' record) and WORK/results/{case}-{variant}-R.json.
set -euo pipefail
WORK=${1:-/tmp/shapes}
PYTHON=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-$PWD}:$PWD/tools
VARIANTS=(paged-wicore paged-wicore-block)
mkdir -p "$WORK/results"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c "import onnxruntime as o; print('onnxruntime', o.__version__)"
git log --oneline -1 2>/dev/null || true

# Both exports (made here if missing), a batch-1 step time each, and with CHECK_TOKENS > 0 the check.
check=()
[ "${CHECK_TOKENS:-4100}" != 0 ] && check=(--check --check-tokens "${CHECK_TOKENS:-4100}")
echo "=== exports and check ($(date -u +%H:%M:%S) UTC)"
"$PYTHON" tools/bench_shapes.py --shape gemma3-27b --layers 8 --variants paged-wicore+graphs,paged-wicore-block+graphs \
  --no-hf --batch 1 --steps 3 --context 512 --work "$WORK" --json "$WORK/results/check.json" "${check[@]}" 2>&1 \
  | grep -v -e "^Writing" -e Warning || echo "bench_shapes: rc $? (the throughput runs go on where the exports exist)"

# A machine's first engine ran slower than every later one (docs/PERFORMANCE.md): one throwaway run first.
"$PYTHON" -m wicore.cli bench throughput --model "$WORK/gemma3-27b-8-paged-wicore" --devices cuda:0 --cuda-graphs on \
  --num-prompts 16 --max-num-seqs 16 --input-len 512 --output-len 16 --max-context 1024 --kv-pool-gb 8 > /dev/null 2>&1 || true

for round in $(seq 1 "${ROUNDS:-1}"); do
  order=("${VARIANTS[@]}")
  [ $((round % 2)) = 0 ] && order=("${VARIANTS[1]}" "${VARIANTS[0]}")
  for case in "64 512 256" "256 512 256" "64 4096 32"; do
    read -r n input output <<< "$case"
    for variant in "${order[@]}"; do
      echo "=== round $round, $n x ($input + $output), $variant ($(date -u +%H:%M:%S) UTC)"
      "$PYTHON" -m wicore.cli bench throughput --model "$WORK/gemma3-27b-8-$variant" --devices cuda:0 --cuda-graphs on \
        --num-prompts "$n" --max-num-seqs "$n" --input-len "$input" --output-len "$output" \
        --max-context $((input + output)) --kv-pool-gb 24 \
        --json "$WORK/results/$n-$input-$output-$variant-$round.json" 2>&1 | grep -v "^Writing" | tail -2 || echo "rc $?"
    done
  done
done
