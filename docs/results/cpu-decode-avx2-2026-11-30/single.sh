#!/bin/bash
# single.sh ROUNDS: one WiCore engine a process with llama.cpp (ab.sh), alternating processes: the tiny Q4_K_M GGUFs'
# head in 8-bit codes (x8, main's exporter) and in 6-bit ones read narrow (x6:narrow), this branch's final library
D=$(cd "$(dirname "$0")" && pwd)
NEW=/work/cache-cpu55/kernels/103bdadf019b8b436019/libwicore_kernels.so
X=/work/cache-cpu55
for r in $(seq $1); do for m in llama-Q4_K_M qwen2-Q4_K_M; do
  SPECS="h8=$X/x8/MODEL@$NEW" $D/ab.sh 1 $m | sed "s/round 1/round $r/"
  SPECS="h6=$X/x6/MODEL@$NEW:narrow" $D/ab.sh 1 $m | sed "s/round 1/round $r/"
done; done
