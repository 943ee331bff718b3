cd /work/wt-prompt37
# ab1 / ab2 ran before the int8 GEMM became the default: their wicore-float line had no variable (the float default then)
export PYTHONPATH=/work/wt-prompt37:/work/wt-prompt37/tools
M=/work/cache-int/models/gemma-3-270m-q4_k_m-1041c72839da-ort-quant-wicore
T=${T:-1}
for r in ${ROUNDS:-1 2 3}; do
  uptime
  /work/main/.venv/bin/python docs/results/cpu-prefill-attention-2026-11-29/cpu_ab.py llama.cpp $T 4 2>/dev/null
  WICORE_MATMULQ_PROMPT=float /work/main/.venv/bin/python docs/results/cpu-prefill-attention-2026-11-29/cpu_ab.py wicore $T 4 $M wicore-float 2>/dev/null
  WICORE_MATMULQ_PROMPT=int8 /work/main/.venv/bin/python docs/results/cpu-prefill-attention-2026-11-29/cpu_ab.py wicore $T 4 $M wicore-int8 2>/dev/null
done
uptime
