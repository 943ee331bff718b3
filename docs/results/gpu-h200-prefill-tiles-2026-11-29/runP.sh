#!/usr/bin/env bash
# Session 54, lease P (nvidia-h200), from /tmp/repo: bash .gpujob/i_setup.sh s54/runP.sh, then the six chunk calls.
# Issue 32: where the 27B shape's prefill goes (8 layers, fp16), against HF transformers on the same checkpoint;
# then `wicore serve` at 256 streams against `wicore bench throughput` at 8 layers (the server's cheaper loop).
R=/tmp/s54-out; mkdir -p "$R"; exec > "$R/jobP.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
f() { grep -v -e "W:onnx" -e "^Writing" -e Warning -e Loading; }
S=/tmp/shapes; mkdir -p $S
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
print(make_checkpoints('gemma3-27b', (8,), Path('$S')))" 2>&1 | f | tail -2
echo "checkpoint $(date -u +%H:%M:%S)"
for v in paged-wicore-block paged-wicore; do
  python3 -c "
from pathlib import Path
from shape_exports import export
export(Path('$S/gemma3-27b-hf-8'), '$v', Path('$S/g27-8-$v'))" 2>&1 | f | tail -2 &
done
. /tmp/repo/.gpujob/wait_parts.sh
. /tmp/repo/.gpujob/setup.sh
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader; nproc
wait; echo "exports done $(date -u +%H:%M:%S)"; du -sh $S/*
B=$S/g27-8-paged-wicore-block; O=$S/g27-8-paged-wicore
echo "=== 1. prefill, 8 layers ($(date -u +%H:%M:%S))"
timeout 500 python3 tools/bench_prefill.py --model-dir $B --model-dir $O --devices cuda:0 --prompts 64 --input-len 512 \
  --batched-tokens 2048,8192 --gpu-kernels --hf $S/gemma3-27b-hf-8 --hf-compiled --json $R/prefill8.json > $R/prefill8.log 2>&1
echo "rc=$?"; f < $R/prefill8.log | tail -60
echo "=== 2. engine and server at 256 streams, 8 layers ($(date -u +%H:%M:%S))"
xz -dc .gpujob/s54/tok.json.xz > $B/tokenizer.json && cp .gpujob/s54/tokenizer_config.json $B/
python3 - $B .gpujob/s54/tokinfo.json <<'PY'
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
ENG=(--devices cuda:0 --cuda-graphs on --max-num-seqs 256 --max-context 1024 --kv-pool-gb 40)
bt() { timeout 240 python3 -m wicore.cli bench throughput --model $B "${ENG[@]}" --num-prompts 256 --input-len 512 \
    --output-len 256 --json "$R/tp-$1.json" 2>&1 | f | tail -3; }
echo "--- engine ($(date -u +%H:%M:%S))"; bt before-serve
python3 -m wicore.cli serve --model $B "${ENG[@]}" --port 8123 > "$R/serve.log" 2>&1 &
SP=$!
for _ in $(seq 240); do curl -sf http://127.0.0.1:8123/v1/models > /dev/null && break; sleep 1; done
echo "serving $(date -u +%H:%M:%S)"
for c in 256 64; do
  timeout 240 python3 -m wicore.cli bench serve --base-url http://127.0.0.1:8123 --concurrency $c --num-prompts 256 \
    --input-len 512 --output-len 256 --vocab-size 262144 --min-token-id 300 --processes 4 --json "$R/serve-$c.json" 2>&1 | tail -6
done
kill $SP; wait $SP 2>/dev/null
echo "--- engine again ($(date -u +%H:%M:%S))"; bt after-serve
echo "JOBP-DONE $(date -u +%H:%M:%S) UTC"
