cd /work/wt-prompt37
export PYTHONPATH=/work/wt-prompt37
G=/work/cache-int/models/gemma-3-270m-q4_k_m-1041c72839da-ort-quant-wicore
S=/work/cache-int/models/smollm2-135m-instruct-ort-quant-wicore
SG=/work/cache-int/gguf/smollm2-135m-instruct.gguf
B="/work/main/.venv/bin/python tools/bench_generate.py --engines wicore,llama.cpp --threads 2 --prompt-tokens 512 --new-tokens 16 --repeats 3"
for mode in ${MODES:-int8 float}; do
  echo "== gemma $mode $(date -u +%H:%M:%S) $(uptime)"
  WICORE_MATMULQ_PROMPT=$mode $B --model-dir $G --json /tmp/p37/bg-gemma-$mode.json 2>&1 | grep -v "^llama_\|loading\|holds"
  echo "== smollm2 $mode $(date -u +%H:%M:%S) $(uptime)"
  WICORE_MATMULQ_PROMPT=$mode $B --model-dir $S --gguf $SG --json /tmp/p37/bg-smollm2-$mode.json 2>&1 | grep -v "^llama_\|loading\|holds"
done
echo "== end $(date -u +%H:%M:%S) $(uptime)"
