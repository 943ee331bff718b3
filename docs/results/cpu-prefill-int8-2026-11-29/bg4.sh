cd /work/wt-prompt37
export PYTHONPATH=/work/wt-prompt37
G=/work/cache-int/models/gemma-3-270m-q4_k_m-1041c72839da-ort-quant-wicore
S=/work/cache-int/models/smollm2-135m-instruct-ort-quant-wicore
SG=/work/cache-int/gguf/smollm2-135m-instruct.gguf
B="/work/main/.venv/bin/python tools/bench_generate.py --engines wicore,llama.cpp --threads 2 --prompt-tokens 512 --new-tokens 16 --repeats 3"
echo "== gemma float $(date -u +%H:%M:%S) $(uptime)"
WICORE_MATMULQ_PROMPT=float $B --model-dir $G --json /tmp/p37/bg4-gemma-float.json 2>&1 | grep -v "^llama_\|loading\|holds"
echo "== smollm2 int8 $(date -u +%H:%M:%S) $(uptime)"
$B --model-dir $S --gguf $SG --json /tmp/p37/bg4-smollm2-int8.json 2>&1 | grep -v "^llama_\|loading\|holds"
echo "== end $(date -u +%H:%M:%S) $(uptime)"
