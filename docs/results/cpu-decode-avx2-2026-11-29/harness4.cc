// Ad-hoc: MatMulQTask for 4-bit Q4_K-like weights (narrow scales and mins, grouped), one row, one thread.
#include "matmul_q_cpu.cc"
#include <chrono>
#include <cstdio>
#include <random>
using namespace wicore;
__attribute__((target("avx2,fma,f16c"))) int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atol(argv[1]) : 1024, k = argc > 2 ? atol(argv[2]) : 256, reps = 2000;
  const int64_t nb = k / 32, ns = k / 256;
  std::mt19937 g(1);
  std::vector<uint8_t> codes(n * k / 2);
  for (auto& c : codes) c = g();
  std::vector<uint16_t> s16(n * ns), m16(n * ns);
  std::vector<int8_t> si(n * nb), mi(n * nb);
  for (auto& h : s16) h = _cvtss_sh(1e-4f * (1 + g() % 100), 0);
  for (auto& h : m16) h = _cvtss_sh(-1e-4f * (1 + g() % 100), 0);
  for (auto& v : si) v = g() % 64;
  for (auto& v : mi) v = g() % 64;
  std::vector<float> x(k), y(n), y2(n), fs(n * nb), fo(n * nb);
  for (auto& v : x) v = std::normal_distribution<float>(0, 1)(g);
  MatMulQArgs args{x.data(), codes.data(), fs.data(), fo.data(), y.data(), 1, n, k, 32, 4, true, 8};
  MatMulQPacked packed{s16.data(), si.data(), m16.data(), mi.data(), 8.f, 8};
  std::vector<QuantRow> rows;
  MatMulQQuantize(args, MatMulQPath::kAvx2, &rows);
  double best = 1e30;
  for (int t = 0; t < 5; ++t) {
    auto a = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < reps; ++i) for (int64_t b = 0; b < n; b += 64) MatMulQTask(args, packed, &rows, b, std::min(b + 64, n), MatMulQPath::kAvx2, nullptr);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / reps);
  }
  printf("4-bit task path N %ld K %ld: %.2f us, %.2f ns a row\n", (long)n, (long)k, best * 1e6, best * 1e9 / n);
  y2 = y;
  MatMulQTask(args, packed, &rows, 0, n, MatMulQPath::kScalar, nullptr);
  printf("scalar == avx2: %d\n", memcmp(y.data(), y2.data(), n * 4) == 0);
}
