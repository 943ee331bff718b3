#!/bin/bash
# usage: rounds2.sh N THREADS MODEL...   (cur / halves / llama.cpp in one process, step_ab2.py)
n=$1; th=$2; shift 2
export PYTHONPATH=/work/llama-noamx/site:/work/wt-dec37:/work/wt-dec37/tools WICORE_BATCHES=2
for r in $(seq $n); do for m in "$@"; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m round $r: $(THREADS=$th timeout 300 /work/main/.venv/bin/python /work/cache-dec37/step_ab2.py /work/tiny37/tiny-$m.gguf cur=/work/cache-dec37/x/$m halves=/work/cache-dec37/x/$m@/work/cache-dec37/batch2/lib.so 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done
