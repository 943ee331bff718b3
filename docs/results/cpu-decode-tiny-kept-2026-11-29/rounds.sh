#!/bin/bash
# usage: rounds.sh N THREADS MODEL...   (before/after/llama.cpp interleaved in one process, ab_keep.py)
n=$1; th=$2; shift 2
for r in $(seq $n); do for m in "$@"; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $m round $r: $(THREADS=$th PYTHONPATH=/work/llama-noamx/site:/work/wt-decode37:/work/wt-decode37/tools timeout 200 /work/main/.venv/bin/python /work/cache-decode37/ab_keep.py /work/tiny37/tiny-$m.gguf before=/work/cache-decode37/x/$m:nokeep after=/work/cache-decode37/x/$m 2>&1 | grep -A1 threads | tr '\n' ' ')"
done; done
