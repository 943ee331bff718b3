#!/bin/bash
# usage: rounds4.sh N THREADS KIND MODEL...   KIND: fused | halves | inline | nospin | aa  (step_ab2.py with the gap and the turns)
n=$1; th=$2; kind=$3; shift 3
export PYTHONPATH=/work/llama-noamx/site:/work/wt-dec37:/work/wt-dec37/tools WICORE_BATCHES=2 WICORE_MIN_PARALLEL=1048576
X=/work/cache-dec37/x
for r in $(seq $n); do for m in "$@"; do
  case $kind in
    fused) specs="main=$X/$m fused=$X/$m-fused" ;;
    halves) specs="main=$X/$m halves=$X/$m@/work/cache-dec37/batch2/lib.so" ;;
    inline) specs="main=$X/$m inline=$X/$m@/work/cache-dec37/inline/lib.so" ;;
    nospin) specs="main=$X/$m nospin=$X/$m:nospin" ;;
    aa) specs="first=$X/$m second=$X/$m" ;;
    new) specs="main=$X/$m new=$X/$m-new" ;;
  esac
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m $kind round $r: $(THREADS=$th timeout 300 /work/main/.venv/bin/python /work/cache-dec37/step_ab2.py /work/tiny37/tiny-$m.gguf $specs 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done
