// Do two threads on this VM's two vCPUs run ALU work at full speed each (two cores) or shared (hyperthreads)?
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long iters = 20000000;
static void* work(void* arg) {
  __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, b = _mm512_set1_epi32(3), c = _mm512_set1_epi32(5);
  double t = now();
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_dpbusd_epi32(a0, b, c); a1 = _mm512_dpbusd_epi32(a1, b, c); a2 = _mm512_dpbusd_epi32(a2, b, c); a3 = _mm512_dpbusd_epi32(a3, b, c);
    a4 = _mm512_dpbusd_epi32(a4, b, c); a5 = _mm512_dpbusd_epi32(a5, b, c); a6 = _mm512_dpbusd_epi32(a6, b, c); a7 = _mm512_dpbusd_epi32(a7, b, c);
  }
  *(double*)arg = now() - t;
  volatile int s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)), _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))));
  (void)s; return 0;
}
static char* buf; static long bytes = 16l << 20;
static void* stream(void* arg) {
  double t = now(); __m512i acc = _mm512_setzero_si512();
  for (int r = 0; r < 50; ++r) for (long i = 0; i < bytes; i += 64) acc = _mm512_add_epi32(acc, _mm512_load_si512(buf + i));
  *(double*)arg = now() - t; volatile int s = _mm512_reduce_add_epi32(acc); (void)s; return 0;
}
int main(int argc, char** argv) {
  buf = aligned_alloc(64, bytes * 2); for (long i = 0; i < bytes * 2; ++i) buf[i] = i;
  void* (*f)(void*) = argc > 1 ? stream : work;
  for (int rep = 0; rep < 3; ++rep) {
    double one, two[2]; pthread_t th[2];
    f(&one);
    pthread_create(&th[0], 0, f, &two[0]); pthread_create(&th[1], 0, f, &two[1]); pthread_join(th[0], 0); pthread_join(th[1], 0);
    printf("%s alone %.3f s, two at once %.3f / %.3f s\n", argc > 1 ? "stream 16 MiB x50" : "vpdpbusd", one, two[0], two[1]);
  }
}
