#!/bin/bash
# ab.sh ROUNDS MODEL... : step_ab6.py (T threads, 2) on /work/tiny37/tiny-MODEL.gguf with SPECS (a template, MODEL
# replaced by each model: "NAME=DIR@LIB ..."), llama.cpp in the same process; each run holds /tmp/bench55.lock and
# starts once the 1-minute load is below MAXLOAD (1.5), or after 60 s
D=$(cd "$(dirname "$0")" && pwd)
W=/work/wt-cpu55
n=$1; shift
for r in $(seq $n); do for m in "$@"; do
  for i in $(seq 6); do awk -v m=${MAXLOAD:-1.5} '{exit !($1 < m)}' /proc/loadavg && break; sleep 10; done
  specs="${SPECS//MODEL/$m}"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m round $r: $(WICORE_CACHE=/work/cache-cpu55/wc PYTHONPATH=$W:$W/tools THREADS=${T:-2} flock /tmp/bench55.lock timeout 300 /work/main/.venv/bin/python $D/step_ab6.py ${GGUF:-/work/tiny37/tiny-$m.gguf} $specs 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done | sed 's/block 10 drop 2 gap 0.02 extra_buffers True//'
