#!/bin/bash
# usage: agree.sh MODEL EXPORT : agree.py's five modes for one model, records agree-MODEL-MODE.json here
cd "$(dirname "$0")/../../.." || exit 1
R=docs/results/cpu-prompt-precision-2026-11-29
for mode in ${MODES:-ours float int8 hf llama}; do
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $1 $mode"
  PYTHONPATH=/work/llama-noamx/site:.:tools /work/main/.venv/bin/python $R/agree.py "$1" $mode "$2" $R/agree-$1-$mode.json 2>&1 | grep -v "^llama_\|^load\|^print_info\|^gguf"
done
