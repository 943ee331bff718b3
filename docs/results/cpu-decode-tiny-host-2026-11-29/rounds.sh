#!/bin/bash
# usage: rounds.sh N MODEL...   step_ab2.py (pauses, turns) at 2 threads: base (HEAD before this branch) and new exports are the same files;
# the code differs by PYTHONPATH, so each round runs one process per code version, alternating, each with llama.cpp beside it
n=$1; shift
for r in $(seq $n); do for m in "$@"; do for v in ${VERSIONS:-new}; do
  if [ $v = base ]; then P=/work/cache-small37/base:/work/cache-small37/base/tools; else P=/work/wt-small37:/work/wt-small37/tools; fi
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m $v round $r: $(PYTHONPATH=/work/llama-noamx/site:$P THREADS=2 timeout 300 /work/main/.venv/bin/python /work/cache-small37/scr/step_ab2.py /work/tiny37/tiny-$m.gguf $v=/work/cache-small37/x/$m 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done; done
