#!/bin/bash
# usage: rounds3.sh N THREADS BLOCKS MODEL...   (WiCore and llama.cpp in one process, step_ab2.py; BLOCKS e.g. "10 1")
n=$1; th=$2; blocks=$3; shift 3
export PYTHONPATH=/work/llama-noamx/site:/work/wt-dec37:/work/wt-dec37/tools
for r in $(seq $n); do for b in $blocks; do for m in "$@"; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m block $b round $r: $(BLOCK=$b THREADS=$th timeout 300 /work/main/.venv/bin/python /work/cache-dec37/step_ab2.py /work/tiny37/tiny-$m.gguf wicore=/work/cache-dec37/x/$m 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done; done
