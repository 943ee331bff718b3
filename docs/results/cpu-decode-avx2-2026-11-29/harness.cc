// Ad-hoc: the AVX2 decode rows timed alone (one thread), N rows x K 256, Q6_K-like narrow scales, residual.
#include "matmul_q_cpu.cc"
#include <chrono>
#include <cstdio>
#include <random>
using namespace wicore;
__attribute__((target("avx2,fma,f16c"))) int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atol(argv[1]) : 16384, k = 256, reps = argc > 2 ? atol(argv[2]) : 200;
  const int bs = argc > 3 ? atoi(argv[3]) : 16;
  const int64_t nb = k / bs;
  std::mt19937 g(1);
  std::vector<uint8_t> codes(n * k);
  for (auto& c : codes) c = 96 + g() % 64;
  std::vector<uint16_t> halves(n);
  std::vector<int8_t> ints(n * nb);
  std::vector<float> f32(n * nb);
  for (int64_t r = 0; r < n; ++r) {
    halves[r] = _cvtss_sh(1e-4f * (1 + g() % 100), 0);
    for (int64_t b = 0; b < nb; ++b) { ints[r * nb + b] = static_cast<int8_t>(int(g() % 255) - 127); f32[r * nb + b] = _cvtsh_ss(halves[r]) * ints[r * nb + b]; }
  }
  std::vector<float> x(k), y(n), y2(n);
  for (auto& v : x) v = std::normal_distribution<float>(0, 1)(g);
  MatMulQArgs args{x.data(), codes.data(), f32.data(), nullptr, y.data(), 1, n, k, bs, 8, true, 128};
  std::vector<QuantRow> rows;
  MatMulQQuantize(args, MatMulQPath::kAvx2, &rows);
  MatMulQPacked packed{halves.data(), ints.data(), nullptr, nullptr, 0.f, nb};
  MatMulQArgs narrow = args;
  narrow.packed = &packed;
  auto time = [&](const char* name, auto f) {
    double best = 1e30;
    for (int t = 0; t < 5; ++t) {
      auto a = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < reps; ++i) f();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / reps;
      best = std::min(best, s);
    }
    printf("%-28s %8.1f us  %.2f ns a row\n", name, best * 1e6, best * 1e9 / n);
  };
  {
    double best = 1e30;
    for (int t = 0; t < 5; ++t) {
      auto a = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < 1000; ++i) MatMulQQuantize(args, MatMulQPath::kAvx2, &rows);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / 1000);
    }
    printf("quantize K %ld (avx2 path)   %8.2f us\n", (long)k, best * 1e6);
  }
  {  // the AVX2 quantization against the scalar one (then Tiled), on heavy-tailed rows with a zero block
    std::vector<float> xs(1024);
    for (int rep = 0; rep < 200; ++rep) {
      for (auto& v : xs) v = std::student_t_distribution<float>(2)(g) * (rep % 7 == 0 ? 1e-30f : 1.f);
      if (rep % 5 == 0) std::fill(xs.begin() + 32, xs.begin() + 64, 0.f);
      for (int res = 0; res < 2; ++res) for (int bsz : {16, 32}) for (int zp : {8, 128}) {
        QuantRow a, c;
        Resize(1024, bsz, res, &a); Resize(1024, bsz, res, &c);
        QuantizeAvx2(xs.data(), 1024, res, &a); SumsAvx2(1024, zp, bsz, res, &a);
        QuantizeScalar(xs.data(), 1024, res, &c); Sums(1024, zp, bsz, res, &c); Tiled(res, &c);
        if (a.q != c.q || a.q2 != c.q2 || a.lanes != c.lanes || a.lanes2 != c.lanes2 || a.a16 != c.a16 || a.starts != c.starts ||
            memcmp(a.d.data(), c.d.data(), a.d.size() * 4) || memcmp(a.sums.data(), c.sums.data(), a.sums.size() * 4)) {
          printf("QUANTIZE MISMATCH rep %d res %d bs %d zp %d\n", rep, res, bsz, zp); return 1;
        }
      }
    }
    printf("quantize avx2 == scalar\n");
  }
  time("tile f32 scales", [&] { tile_avx2::Rows(args, rows, 0, n); });
  y2 = y;
  time("rows narrow", [&] { (bs == 16 ? RowsAvx2<2> : RowsAvx2<1>)(narrow, rows[0], 0, n); });
  printf("same bits: %d\n", memcmp(y.data(), y2.data(), n * 4) == 0);
  time("rows f32", [&] { (bs == 16 ? RowsAvx2<2> : RowsAvx2<1>)(args, rows[0], 0, n); });
  printf("same bits: %d\n", memcmp(y.data(), y2.data(), n * 4) == 0);
}
