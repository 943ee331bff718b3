#!/bin/bash
# gated.sh ROUNDS MODEL...: ab2.sh rounds with SPECS, each run started when the 1-minute load is below $MAXLOAD (1.5), or after 90 s
n=$1; shift
for r in $(seq $n); do for m in "$@"; do
  for i in $(seq 9); do awk -v m=${MAXLOAD:-1.5} '{exit !($1 < m)}' /proc/loadavg && break; sleep 10; done
  /work/cache-cpu37/scr/ab2.sh 1 $m | sed "s/round 1/round $r/"
done; done
