#!/usr/bin/env bash
# Session 51, lease A, from /tmp/repo. Cold machine, call 1 carries
# [".whl", ".gpujob/i_setup.sh", ".gpujob/setup.sh", ".gpujob/s51", ".gpujob/gemv"]:  bash .gpujob/i_setup.sh s51/runA.sh
# then calls K=0..5 carrying [".ortgpuK"]:  mkdir -p /tmp/parts && cp .ortgpuK/* /tmp/parts/
# then poll:  sleep N; tail -n 60 /tmp/s51-out/jobA.log
R=/tmp/s51-out
mkdir -p "$R"
exec > "$R/jobA.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
if [ -f .gpujob/gemv/run.sh ]; then
  echo "=== 0. GEMV harness (no onnxruntime) ($(date -u +%H:%M:%S))"
  mkdir -p $R/gemv; (cd /tmp/repo && OUT=$R/gemv timeout 300 bash .gpujob/gemv/run.sh > $R/gemv/run.log 2>&1; echo "gemv rc=$?" >> $R/gemv/run.log)
  tail -40 $R/gemv/run.log
fi
for _ in $(seq 900); do
  [ -f /tmp/site/onnxruntime/__init__.py ] && break
  if [ -f /tmp/parts/WHEEL_NAME ] && [ "$(ls /tmp/parts/part.* 2>/dev/null | wc -l)" = 6 ]; then
    a=$(du -sb /tmp/parts | cut -f1); sleep 5; [ "$a" = "$(du -sb /tmp/parts | cut -f1)" ] && break
  fi
  sleep 2
done
. /tmp/repo/.gpujob/setup.sh
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
python3 -c "import onnxruntime as o, wicore; print(o.__version__, o.get_available_providers(), wicore.__file__)"
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning; }
S=/tmp/shapes; mkdir -p $S
echo "=== 1. cuDNN paged SDPA off: its cost (27B shape, 8 layers, fp16 paged-wicore) ($(date -u +%H:%M:%S))"
BS=(python3 tools/bench_shapes.py --shape gemma3-27b --layers 8 --variants paged-wicore+graphs --no-hf --batch 1,64,256 --context 512 --work $S)
for r in 1 2; do
  for v in on off; do
    echo "--- cuDNN $v, round $r ($(date -u +%H:%M:%S))"
    if [ $v = off ]; then env ORT_ENABLE_CUDNN_FLASH_ATTENTION=0 timeout 300 "${BS[@]}" --json $R/cudnn-$v-$r.json > $R/cudnn-$v-$r.log 2>&1
    else timeout 300 "${BS[@]}" --json $R/cudnn-$v-$r.json > $R/cudnn-$v-$r.log 2>&1; fi
    echo "rc=$?"; f < $R/cudnn-$v-$r.log | tail -6
  done
done
echo "=== 2. CUDA per kernel, Gemma 3 1B shape, 8 layers, portable+paged (issue 34) ($(date -u +%H:%M:%S))"
timeout 300 python3 tools/check_webgpu_flavour.py --devices cuda:0 --layers 8 --work /tmp/wf --flavours portable+paged --export-only 2>&1 | f | tail -3
W=/tmp/wf/gemma3-1b-8l-fp16-portable+paged
timeout 300 python3 tools/profile_step.py --model-dir $W --devices cuda:0 --batch 1,8 --gpu-kernels --json $R/kernels-cuda-1b.json > $R/kernels-cuda-1b.log 2>&1; echo "rc=$?"
f < $R/kernels-cuda-1b.log | tail -60
echo "=== 3. wicore serve at 256 streams on main, against the engine ($(date -u +%H:%M:%S))"
M=$S/gemma3-27b-8-paged-wicore
xz -dc .gpujob/s51/tok.json.xz > $M/tokenizer.json && cp .gpujob/s51/tokenizer_config.json $M/
python3 - $M .gpujob/s51/tokinfo.json <<'PY'
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
ENG=(--devices cuda:0 --cuda-graphs on --max-num-seqs 256 --max-context 1024 --kv-pool-gb 24)
bt() { timeout 150 python3 -m wicore.cli bench throughput --model $M "${ENG[@]}" --num-prompts 256 --input-len 512 \
    --output-len 256 --json "$R/tp-$1.json" 2>&1 | f | tail -2; }
echo "--- engine ($(date -u +%H:%M:%S))"; bt before-serve
python3 -m wicore.cli serve --model $M "${ENG[@]}" --port 8123 > "$R/serve.log" 2>&1 &
SP=$!
for _ in $(seq 120); do curl -sf http://127.0.0.1:8123/v1/models > /dev/null && break; sleep 1; done
for c in 256 64 1; do
  n=256; [ $c = 1 ] && n=16
  timeout 200 python3 -m wicore.cli bench serve --base-url http://127.0.0.1:8123 --concurrency $c --num-prompts $n \
    --input-len 512 --output-len 256 --vocab-size 262144 --min-token-id 300 --processes 4 --json "$R/serve-$c.json" 2>&1 | tail -6
done
kill $SP; wait $SP 2>/dev/null
echo "--- engine again ($(date -u +%H:%M:%S))"; bt after-serve
echo "JOBA-DONE $(date -u +%H:%M:%S) UTC"
