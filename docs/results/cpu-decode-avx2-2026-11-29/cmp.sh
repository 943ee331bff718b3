#!/bin/bash
# cmp.sh ROUNDS N NAME...: each variant's harness in turn, ROUNDS times; min of 'rows narrow' per variant
r=$1; n=$2; shift 2
for i in $(seq $r); do for v in "$@"; do echo "$v $(flock /tmp/bench54.lock /work/cache-cpu37/h/bin-$v $n 100 | grep 'rows narrow' | awk '{print $3}')"; done; done | sort -k1,1 -k2n | awk '{if($1!=p){print; p=$1}}'
