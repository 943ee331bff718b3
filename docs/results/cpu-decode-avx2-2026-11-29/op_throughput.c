#include <stdio.h>
#include <time.h>
#define N 100000000L
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define BENCH(name, ins) { double t=now(); for(long i=0;i<N;i++){ __asm__ volatile( \
  ins " %%ymm8, %%ymm0, %%ymm0\n" ins " %%ymm8, %%ymm1, %%ymm1\n" ins " %%ymm8, %%ymm2, %%ymm2\n" ins " %%ymm8, %%ymm3, %%ymm3\n" \
  ins " %%ymm8, %%ymm4, %%ymm4\n" ins " %%ymm8, %%ymm5, %%ymm5\n" ins " %%ymm8, %%ymm6, %%ymm6\n" ins " %%ymm8, %%ymm7, %%ymm7\n" \
  ins " %%ymm8, %%ymm9, %%ymm9\n" ins " %%ymm8, %%ymm10, %%ymm10\n" ins " %%ymm8, %%ymm11, %%ymm11\n" ins " %%ymm8, %%ymm12, %%ymm12\n" \
  ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm9","xmm10","xmm11","xmm12");} \
  double s=now()-t; printf("%-14s %.2f cycles per instruction (12 chains, 3.1 GHz)\n", name, s/N*3.1e9/12); }
int main(){
  __asm__ volatile("vpxor %%ymm8,%%ymm8,%%ymm8":::"xmm8");
  BENCH("vpaddd", "vpaddd"); BENCH("vpmaddwd", "vpmaddwd"); BENCH("vpshufb", "vpshufb"); BENCH("vpmaddubsw", "vpmaddubsw");
  BENCH("vfmadd231ps", "vfmadd231ps"); BENCH("vmulps", "vmulps"); BENCH("vpermps", "vpermps"); BENCH("vaddps", "vaddps");
  { double t=now(); for(long i=0;i<N;i++){ __asm__ volatile(
   "vcvtdq2ps %%ymm0,%%ymm0\n vcvtdq2ps %%ymm1,%%ymm1\n vcvtdq2ps %%ymm2,%%ymm2\n vcvtdq2ps %%ymm3,%%ymm3\n vcvtdq2ps %%ymm4,%%ymm4\n vcvtdq2ps %%ymm5,%%ymm5\n"
   "vcvtdq2ps %%ymm6,%%ymm6\n vcvtdq2ps %%ymm7,%%ymm7\n vcvtdq2ps %%ymm9,%%ymm9\n vcvtdq2ps %%ymm10,%%ymm10\n vcvtdq2ps %%ymm11,%%ymm11\n vcvtdq2ps %%ymm12,%%ymm12\n"
   ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm9","xmm10","xmm11","xmm12");} double s=now()-t; printf("%-14s %.2f cycles\n","vcvtdq2ps",s/N*3.1e9/12);}
  { double t=now(); for(long i=0;i<N;i++){ __asm__ volatile(
   "vpermilps $0x55,%%ymm0,%%ymm0\n vpermilps $0x55,%%ymm1,%%ymm1\n vpermilps $0x55,%%ymm2,%%ymm2\n vpermilps $0x55,%%ymm3,%%ymm3\n vpermilps $0x55,%%ymm4,%%ymm4\n vpermilps $0x55,%%ymm5,%%ymm5\n"
   "vpermilps $0x55,%%ymm6,%%ymm6\n vpermilps $0x55,%%ymm7,%%ymm7\n vpermilps $0x55,%%ymm9,%%ymm9\n vpermilps $0x55,%%ymm10,%%ymm10\n vpermilps $0x55,%%ymm11,%%ymm11\n vpermilps $0x55,%%ymm12,%%ymm12\n"
   ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm9","xmm10","xmm11","xmm12");} double s=now()-t; printf("%-14s %.2f cycles\n","vpermilps",s/N*3.1e9/12);}
}
