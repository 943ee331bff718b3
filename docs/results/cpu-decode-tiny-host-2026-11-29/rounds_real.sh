#!/bin/bash
# usage: rounds_real.sh N NAME...   step_ab2.py at 2 threads on the realistic-shape GGUFs and their exports (STEPS env)
n=$1; shift
for r in $(seq $n); do for m in "$@"; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m steps ${STEPS:-100} round $r: $(PYTHONPATH=/work/llama-noamx/site:/work/wt-small37:/work/wt-small37/tools THREADS=2 STEPS=${STEPS:-100} timeout 400 /work/main/.venv/bin/python /work/cache-small37/scr/step_ab2.py /work/cache-small37/real/$m.gguf wicore=/work/cache-small37/real/$m-wicore 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done
