#!/bin/bash
# usage: round.sh R OUT -- one round: the engine alone, then base and change (order flipped each round), real and stand-in
R=$1; OUT=$2
order="base change"; [ $((R % 2)) = 0 ] && order="change base"
echo "round $R $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $OUT.alone
SKIP_ALONE= KINDS=none /tmp/s256/ab.sh alone$R /work/wt-serve256 $OUT
for t in $order; do W=/work/wt-serve256; [ $t = base ] && W=/work/wt-serve256-base
  SKIP_ALONE=1 LEVELS="256 64" /tmp/s256/ab.sh $t /work/wt-serve256$([ $t = base ] && echo -base) $OUT 2>&1 | grep -v kill
done
