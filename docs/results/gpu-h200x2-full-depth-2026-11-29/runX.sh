#!/usr/bin/env bash
# Session 53, lease X (nvidia-h200-x2), from /tmp/repo. Cold machine, call 1 carries
# [".whl", ".gpujob/i_setup.sh", ".gpujob/setup.sh", ".gpujob/s53"]:  bash .gpujob/i_setup.sh s53/runX.sh
# then calls K=0..5 carrying [".ortgpuK"]:  mkdir -p /tmp/parts && cp .ortgpuK/* /tmp/parts/
# 1. issue 34: the 27B shape at full depth (62 layers) in 4 bits over two cards held to 16 GB each.
# 2. issue 32: the fp16 27B at full depth, measured (bench_shapes), through the engine and through wicore serve.
R=/tmp/s53-out; mkdir -p "$R"; exec > "$R/jobX.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning -e Loading; }
S=/tmp/shapes; P=/tmp/pipe; mkdir -p $S $P
M=$S/gemma3-27b-62-paged-wicore-block-random
python3 -c "
from pathlib import Path
from shape_exports import split_quant_export
split_quant_export('gemma3-27b', 62, 4, Path('$P'))" 2>&1 | f | tail -2 &
PI=$!
python3 -c "
from pathlib import Path
from shape_exports import random_export
random_export('gemma3-27b', 62, 'paged-wicore-block', Path('$M'))" 2>&1 | f | tail -2 &
PF=$!
for _ in $(seq 900); do
  [ -f /tmp/site/onnxruntime/__init__.py ] && break
  if [ -f /tmp/parts/WHEEL_NAME ] && [ "$(ls /tmp/parts/part.* 2>/dev/null | wc -l)" = 6 ]; then
    a=$(du -sb /tmp/parts | cut -f1); sleep 5; [ "$a" = "$(du -sb /tmp/parts | cut -f1)" ] && break
  fi
  sleep 2
done
. /tmp/repo/.gpujob/setup.sh
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
python3 -c "from wicore.kernels.library import library; print(library(True))" 2>&1 | tail -1
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader; nproc; free -g | head -2
wait $PI; echo "int4 split export done $(date -u +%H:%M:%S)"; du -sh $P/*
echo "=== 1. two cards, 62 layers, int4 ($(date -u +%H:%M:%S))"
timeout 560 python3 tools/bench_pipeline_gpu.py --layers 62 --streams 32,16 --kv-pool-gb 10 --card-gb 16 \
  --setups "one card;split, whole steps;split, groups + CUDA graphs" --work $P --json $R/pipe62.json > $R/pipe62.log 2>&1
echo "rc=$?"; f < $R/pipe62.log | tail -30
wait $PF; echo "fp16 export done $(date -u +%H:%M:%S)"; du -sh $M; df -h /tmp | tail -1
echo "=== 2. fp16 62 layers, graphs measured ($(date -u +%H:%M:%S))"
timeout 420 python3 tools/bench_shapes.py --shape gemma3-27b --layers 62 --random-weights --variants paged-wicore-block+graphs \
  --no-hf --batch 1,64,256 --context 512 --steps 20 --work $S --json $R/fp16-62.json > $R/fp16-62.log 2>&1
echo "rc=$?"; f < $R/fp16-62.log | tail -10
echo "=== 3. fp16 62 layers: engine and wicore serve ($(date -u +%H:%M:%S))"
xz -dc .gpujob/s53/tok.json.xz > $M/tokenizer.json && cp .gpujob/s53/tokenizer_config.json $M/
python3 - $M .gpujob/s53/tokinfo.json <<'PY'
import hashlib, json, sys
from pathlib import Path
m, info = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
d = json.loads((m / "wicore.json").read_text())
d["tokenizer"] = info
for f in info["files"]:
    d["files"][f] = hashlib.sha256((m / f).read_bytes()).hexdigest()
(m / "wicore.json").write_text(json.dumps(d, indent=1))
print("tokenizer added")
PY
ENG=(--devices cuda:0 --cuda-graphs on --max-num-seqs 256 --max-context 1024 --kv-pool-gb 72)
bt() { timeout 300 python3 -m wicore.cli bench throughput --model $M "${ENG[@]}" --num-prompts 256 --input-len 512 \
    --output-len 256 --json "$R/tp-$1.json" 2>&1 | f | tail -3; }
echo "--- engine ($(date -u +%H:%M:%S))"; bt before-serve
python3 -m wicore.cli serve --model $M "${ENG[@]}" --port 8123 > "$R/serve.log" 2>&1 &
SP=$!
for _ in $(seq 240); do curl -sf http://127.0.0.1:8123/v1/models > /dev/null && break; sleep 1; done
echo "serving $(date -u +%H:%M:%S)"
for c in 256 1; do
  n=256; [ $c = 1 ] && n=8
  timeout 300 python3 -m wicore.cli bench serve --base-url http://127.0.0.1:8123 --concurrency $c --num-prompts $n \
    --input-len 512 --output-len 256 --vocab-size 262144 --min-token-id 300 --processes 4 --json "$R/serve-$c.json" 2>&1 | tail -5
done
kill $SP; wait $SP 2>/dev/null
echo "--- engine again ($(date -u +%H:%M:%S))"; bt after-serve
echo "JOBX-DONE $(date -u +%H:%M:%S) UTC"
