#!/bin/bash
# tiny.sh ROUNDS: ab.sh on the tiny GGUFs (/work/tiny37), llama.cpp in the same process, this branch's final library:
#  Q4_K_M: the head's 8-bit codes (x8: main's exporter) against this branch's export (x6: 6-bit codes, wide_codes),
#          read narrow (:narrow, what AVX2 runs) and widened at load (:widen, what AVX-512 VNNI runs)
#  Q8_0:   this branch's export under the library before the 4-bit rows (tiles) and with them (rows4)
D=$(cd "$(dirname "$0")" && pwd)
OLD=/work/cache-cpu55/kernels/72811edffd82ea9563a4/libwicore_kernels.so
NEW=/work/cache-cpu55/kernels/103bdadf019b8b436019/libwicore_kernels.so
X=/work/cache-cpu55
for r in $(seq $1); do
  SPECS="h8=$X/x8/MODEL@$NEW h6=$X/x6/MODEL@$NEW:narrow h6w=$X/x6/MODEL@$NEW:widen tiles=$X/x6/MODEL@$OLD" $D/ab.sh 1 llama-Q4_K_M qwen2-Q4_K_M | sed "s/round 1/round $r/"
  SPECS="tiles=$X/x6/MODEL@$OLD rows4=$X/x6/MODEL@$NEW" $D/ab.sh 1 llama-Q8_0 qwen2-Q8_0 | sed "s/round 1/round $r/"
done
