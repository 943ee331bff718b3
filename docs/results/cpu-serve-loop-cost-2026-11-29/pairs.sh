#!/bin/bash
# usage: pairs.sh N OUT -- N pairs of the real engine at 256 streams, base and change alternating (order flipped each pair)
for r in $(seq $1); do order="base change"; [ $((r % 2)) = 0 ] && order="change base"
  for t in $order; do SKIP_ALONE=1 KINDS=real LEVELS=256 /tmp/s256/ab.sh $t /work/wt-serve256$([ $t = base ] && echo -base) $2 2>&1 | grep -v kill; done
done
