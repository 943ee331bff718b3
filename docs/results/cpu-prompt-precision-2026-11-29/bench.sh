#!/bin/bash
# usage: bench.sh ROUNDS : per round, per model, the export as made now (`attr`: Gemma 3's layers on int8
# prompts, SmolLM2's on float) and the other precision through WICORE_MATMULQ_PROMPT (Gemma: float, as graphs
# exported before the attribute; SmolLM2: int8), each in tools/bench_generate.py against llama.cpp without AMX
# (its repacked layouts on), 2 threads, 512 prompt tokens, 32 new, median of 3; records here
cd "$(dirname "$0")/../../.." || exit 1
R=docs/results/cpu-prompt-precision-2026-11-29
X=/work/cache-prompt37/x
for r in $(seq "$1"); do
  for m in ${MODELS:-gemma smollm2}; do
    if [ $m = gemma ]; then args="--model-dir $X/g270w"; other=float; else args="--model-dir $X/smolw2 --gguf /work/cache-int/gguf/smollm2-135m-instruct.gguf"; other=int8; fi
    for mode in attr $other; do
      echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $m $mode round $r"
      env $([ $mode != attr ] && echo WICORE_MATMULQ_PROMPT=$mode) PYTHONPATH=/work/llama-noamx/site:.:tools \
        /work/main/.venv/bin/python tools/bench_generate.py $args --engines wicore,llama.cpp --threads 2 \
        --prompt-tokens 512 --new-tokens 32 --repeats 3 --json $R/bg${TAG:-}-$m-$mode-$r.json 2>&1 | grep "^|"
    done
  done
done
echo "== $(date -u +%H:%M:%S) end, load $(cut -d' ' -f1-3 /proc/loadavg)"
