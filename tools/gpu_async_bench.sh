#!/usr/bin/env bash
# --async-scheduling on one GPU: `wicore bench throughput` at 64 and 256 requests, flag off and on,
# interleaved, on a fp16 paged export with CUDA graphs at the Gemma 3 1B shape (26 layers, random
# weights from wicore.export.random_weights: no checkpoint, no torch). About 3 minutes on an H100
# with onnxruntime-gpu; the export (once, ~2.4 GB) is kept in WORK for the next run.
#
#   bash tools/gpu_async_bench.sh [WORK]        from the repository root; WORK default /tmp/async-bench
#   ROUNDS=2 bash tools/gpu_async_bench.sh      each size twice, the second round "on" first
#
# Prints each run's throughput line and its step breakdown (graphs against host ms a step), and
# writes WORK/results/{64,256}-{off,on}-R.json (the `--json` records of wicore bench throughput).
set -euo pipefail
WORK=${1:-/tmp/async-bench}
MODEL=$WORK/gemma3-1b-26l-fp16-paged
PYTHON=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-$PWD}
mkdir -p "$WORK/results"

if [ ! -f "$MODEL/wicore.json" ]; then
  "$PYTHON" - "$MODEL" <<'EOF'
import sys, time
from pathlib import Path

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.random_weights import RandomFloatSource
from wicore.model.config import DecoderConfig
from wicore.model.shapes import hf_config

start = time.perf_counter()
source = RandomFloatSource(DecoderConfig.from_hf({"model_type": "gemma3_text", **hf_config("gemma3-1b")}))
settings = ExportConfig(dtype="fp16", attention="paged", sampling_head="on", overwrite=True)
export_model(source, Path(sys.argv[1]), settings, progress=lambda _: None)
print(f"exported {sys.argv[1]} in {time.perf_counter() - start:.0f} s", flush=True)
EOF
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
git log --oneline -1 || true

# A machine's first process ran 2.5x slower than every later one (2026-11-28, docs/PERFORMANCE.md):
# one short throwaway run first, so that the first measured configuration is not the cold one.
"$PYTHON" -m wicore.cli bench throughput --model "$MODEL" --devices cuda:0 --cuda-graphs on --block-size 64 \
  --kv-pool-gb 8 --max-num-seqs 16 --num-prompts 16 --input-len 128 --output-len 16 > /dev/null 2>&1 || true

# 128 prompt + 128 generated tokens a request, greedy (the graph's argmax), blocks of 64 tokens
# (the paged attention's FlashAttention tile at head_dim 256), CUDA graphs on.
for round in $(seq 1 "${ROUNDS:-1}"); do
  order="off on"
  [ $((round % 2)) = 0 ] && order="on off"
  for n in 64 256; do
    for flag in $order; do
      extra=(--async-scheduling "$flag")
      echo "=== round $round, $n requests, --async-scheduling $flag ($(date -u +%H:%M:%S) UTC)"
      "$PYTHON" -m wicore.cli bench throughput --model "$MODEL" --devices cuda:0 --cuda-graphs on --block-size 64 \
        --kv-pool-gb 8 --max-num-seqs "$n" --num-prompts "$n" --input-len 128 --output-len 128 \
        --json "$WORK/results/$n-$flag-$round.json" "${extra[@]}" 2>&1 | grep -v "^Writing" | tail -2
    done
  done
done
