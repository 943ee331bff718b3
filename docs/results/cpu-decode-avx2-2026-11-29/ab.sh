#!/bin/bash
# ab.sh ROUNDS MODEL... : step_ab6.py (2 threads) with NAME=LIB pairs from $LIBS ("name=lib name=lib"), llama.cpp in the same process
n=$1; shift
W=/work/wt-cpu37
for r in $(seq $n); do for m in "$@"; do
  specs=""; for p in $LIBS; do specs="$specs ${p%%=*}=/work/cache-cpu37/x/$m@${p#*=}"; done
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m round $r: $(WICORE_CACHE=/work/cache-cpu37/wc PYTHONPATH=$W:$W/tools THREADS=${T:-2} flock /tmp/bench54.lock timeout 300 /work/main/.venv/bin/python /work/cache-cpu37/scr/step_ab6.py /work/tiny37/tiny-$m.gguf $specs 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done
