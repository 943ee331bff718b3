#!/bin/bash
# build.sh NAME [INC]: a copy of the worktree's csrc (INC replacing matmul_q_avx2_rows.inc) and the harness on it
set -e
d=/work/cache-cpu37/h/$1; rm -rf $d; cp -r /work/wt-cpu37/wicore/kernels/csrc $d
[ -n "$2" ] && cp $2 $d/matmul_q_avx2_rows.inc
g++ -O2 -std=c++17 -I/work/wt-cpu37/wicore/kernels/include -I$d -o /work/cache-cpu37/h/bin-$1 -x c++ - <<< "$(sed "s|#include \"matmul_q_cpu.cc\"|#include \"$d/matmul_q_cpu.cc\"|" /work/cache-cpu37/h/harness.cc)"
