#!/bin/bash
d=${1:-/work/wt-cpu37/wicore/kernels/csrc}
g++ -O2 -std=c++17 -I/work/wt-cpu37/wicore/kernels/include -I$d -o /work/cache-cpu37/h/bin4${2} -x c++ - $d/matmul_q_packed.cc $d/matmul_q_float.cc $d/matmul_q_int8.cc <<< "$(sed "s|#include \"matmul_q_cpu.cc\"|#include \"$d/matmul_q_cpu.cc\"|" /work/cache-cpu37/h/harness4.cc)"
