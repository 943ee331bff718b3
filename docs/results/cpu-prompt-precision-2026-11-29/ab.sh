#!/bin/bash
# usage: [T=threads] [ROUNDS="1 2 3"] ab.sh : Gemma 3 270M's 512-token prompt, one engine a process, process CPU s
# (and wall), min / median of 4 after a warm-up: llama.cpp without AMX, WiCore's export as made now (its layers'
# prompt_precision int8), the same export on the float GEMM (WICORE_MATMULQ_PROMPT=float: graphs exported before
# the attribute). cpu_ab.py: docs/results/cpu-prefill-attention-2026-11-29/.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONPATH=/work/llama-noamx/site:$PWD:$PWD/tools
M=/work/cache-prompt37/x/g270w
AB=docs/results/cpu-prefill-attention-2026-11-29/cpu_ab.py
T=${T:-1}
for r in ${ROUNDS:-1 2 3}; do
  echo "round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /work/main/.venv/bin/python $AB llama.cpp $T 4 2>/dev/null
  /work/main/.venv/bin/python $AB wicore $T 4 $M wicore-attr 2>/dev/null
  WICORE_MATMULQ_PROMPT=float /work/main/.venv/bin/python $AB wicore $T 4 $M wicore-float 2>/dev/null
done
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
