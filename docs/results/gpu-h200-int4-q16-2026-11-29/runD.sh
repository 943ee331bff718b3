#!/usr/bin/env bash
# Session 51, lease D, from /tmp/repo (main with s51-proc32 and s51-gemv32 merged). Cold machine, call 1 carries
# [".whl", ".gpujob/i_setup.sh", ".gpujob/setup.sh", ".gpujob/s51"]:  bash .gpujob/i_setup.sh s51/runD.sh
# then calls K=0..5 carrying [".ortgpuK"];  poll: sleep N; tail -n 60 /tmp/s51-out/jobD.log
R=/tmp/s51-out; mkdir -p "$R"
exec > "$R/jobD.log" 2>&1
echo "start $(date -u +%H:%M:%S) UTC"
cd /tmp/repo
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
S=/tmp/shapes; mkdir -p $S
Q16=${Q16_VARIANT:-int4-paged-q16}
echo "=== 0. checkpoints (torch only) ($(date -u +%H:%M:%S))"
python3 -c "
from pathlib import Path
from shape_exports import make_checkpoints
make_checkpoints('gemma3-27b', (2, 8), Path('$S'))" 2>&1 | grep -v -e Writing -e Warning | tail -3
for _ in $(seq 900); do
  [ -f /tmp/site/onnxruntime/__init__.py ] && break
  if [ -f /tmp/parts/WHEEL_NAME ] && [ "$(ls /tmp/parts/part.* 2>/dev/null | wc -l)" = 6 ]; then
    a=$(du -sb /tmp/parts | cut -f1); sleep 5; [ "$a" = "$(du -sb /tmp/parts | cut -f1)" ] && break
  fi
  sleep 2
done
. /tmp/repo/.gpujob/setup.sh
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
python3 -c "import onnxruntime as o; print(o.__version__)"
python3 -c "from wicore.kernels.library import library; print(library(True))" > $R/lib.log 2>&1 &
LIB=$!
ex() {  # ex LAYERS VARIANT: the export bench_shapes would make
  python3 -c "
from pathlib import Path
from shape_exports import export
export(Path('$S/gemma3-27b-hf-$1'), '$2', Path('$S/gemma3-27b-$1-$2'))" 2>&1 | grep -v -e Writing -e Warning -e "W:onnx" | tail -2
}
echo "=== 1. exports, three at a time ($(date -u +%H:%M:%S))"
ex 8 paged-wicore & ex 2 int4-paged & ex 2 $Q16 & wait
ex 8 int4-paged & ex 8 $Q16 & wait
wait $LIB; tail -1 $R/lib.log
echo "exports done ($(date -u +%H:%M:%S))"; df -h /tmp | tail -1
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
echo "=== 2. int4 at one row: MatMulQ16's new GEMV against MatMulNBits ($(date -u +%H:%M:%S))"
timeout 400 python3 tools/bench_shapes.py --shape gemma3-27b --layers 2,8 --variants int4-paged+graphs,$Q16+graphs \
  --no-hf --batch 1,8,64 --context 512 --work $S --json $R/int4.json > $R/int4.log 2>&1; echo "rc=$?"
grep -v -e Warning -e "^Writing" -e "W:onnx" -e Loading $R/int4.log | tail -22
echo "=== 3. wicore serve, engine in its process or not ($(date -u +%H:%M:%S))"
timeout 560 bash tools/gpu_serve_engine_process.sh $M $R/proc > /dev/null 2>&1; echo "rc=$?"
tail -25 $R/proc/job.log
echo "JOBD-DONE $(date -u +%H:%M:%S) UTC"
