#!/bin/bash
# usage: rounds6.sh N MODEL...   step_ab6.py at 2 threads: this branch's engine with the steady decode step (steady)
# and without (full, EngineConfig(steady_decode=False)), and llama.cpp (no AMX), in one process a model and round
n=$1; shift
W=${W:-/work/wt-host37}
for r in $(seq $n); do for m in "$@"; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m round $r: $(PYTHONPATH=/work/llama-noamx/site:$W:$W/tools THREADS=2 flock /tmp/bench53.lock timeout 300 /work/main/.venv/bin/python /work/cache-host37/scr/step_ab6.py /work/tiny37/tiny-$m.gguf steady=/work/cache-host37/x/$m full=/work/cache-host37/x/$m:nosteady 2>&1 | grep -v n_ctx | tail -2 | tr '\n' ' ')"
done; done
