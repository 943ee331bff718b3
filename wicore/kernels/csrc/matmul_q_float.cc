// MatMulQ's prompt path on AVX-512: float activations against the weight dequantized to float32, a
// register-blocked GEMM (the default CPU export's arithmetic, not the int8 one of matmul_q_cpu.cc).
//
//   per task (weight rows [n_begin, n_end), at most 64):
//     panel[p][k][32] = fma(s[n, k / bs], code - zero_point, o[n, k / bs])   (once: K x 64 floats, in L2)
//     for each tile of kRows activation rows x 32 weight rows (2 zmm a row, 2 * kRows accumulators):
//       for k in 0 .. K-1:  acc[i][h] = fma(broadcast x[i, k], panel[k][16h .. 16h + 15], acc[i][h])
//
// Each output is one float32 fma chain over k in order, so |y - x·w| <= K u Σ_k |x_k w_k| / (1 - K u)
// against the float64 product with the float32 weights w above (tests/kernels/test_matmul_q.py). At
// 512 rows this is ~2x the int8 tiles: one fma a (row, column) where those need two integer dot
// products, a conversion, a multiply and an fma a 32-column block; the dequantization is once per task.
#include <algorithm>
#include <cmath>
#include <vector>

#include <immintrin.h>

#include "kernels.h"

namespace wicore {
namespace {

#define WICORE_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw")))

constexpr int64_t kPanel = 32;     // weight rows a panel: two zmm
constexpr int64_t kTileRows = 8;   // activation rows a tile: 16 accumulators, 2 panel loads, broadcasts
constexpr int64_t kBlock = 32;     // the codes' packing unit (kernels.h)
constexpr int kGroup = 8;          // 4-bit weight rows interleaved

// The panel of weight rows [n, n + num_rows) into panel[k][kPanel]: a 32-column block of every row at a
// time (the 4 KB it writes stays in L1), 16 columns a zmm (they lie in one weight block, of 16 or 32),
// scattered down the row's column of the panel.
WICORE_AVX512 void Dequantize(const MatMulQArgs& args, int64_t n0, int64_t num_rows, float* panel) {
  const int64_t k = args.k, num_blocks = k / args.block_size;
  const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(kPanel));
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m512i zero_point = _mm512_set1_epi32(args.bits == 8 ? 128 : 8);
  const int64_t per = kBlock / args.block_size;  // weight blocks a 32-column block: 1 or 2
  int64_t firsts[kPanel], strides[kPanel];  // where each row's scales start, and from one weight block to the next
  const uint8_t* codes[kPanel];  // each row's block 0
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t n = n0 + r;
    const bool is_eight = args.bits == 8;
    firsts[r] = is_eight ? n * num_blocks : (n / kGroup) * num_blocks * kGroup + n % kGroup;
    strides[r] = is_eight ? 1 : kGroup;
    codes[r] = is_eight ? args.weight + n * k : args.weight + (n / kGroup) * (k / kBlock) * kGroup * 16 + (n % kGroup) * 16;
  }
  for (int64_t b = 0; b < k / kBlock; ++b) for (int64_t r = 0; r < num_rows; ++r) {
    float* out = panel + r;
    __m128i c[2];  // columns 0-15 and 16-31 of this block, one code a byte
    if (args.bits == 8) {
      const uint8_t* w = codes[r] + b * kBlock;
      c[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
      c[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16));
    } else {  // kernels.h's groups: byte j of a row's 16 holds column j (low nibble) and j + 16 (high)
      const uint8_t* w = codes[r] + b * kGroup * 16;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
      c[0] = _mm_and_si128(v, low);
      c[1] = _mm_and_si128(_mm_srli_epi16(v, 4), low);
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t at = firsts[r] + (b * per + (per == 2 ? h : 0)) * strides[r];  // these 16 columns' weight block
      const __m512 u = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(c[h]), zero_point));
      const __m512 o = args.offsets != nullptr ? _mm512_set1_ps(args.offsets[at]) : _mm512_setzero_ps();
      _mm512_i32scatter_ps(out + (b * kBlock + 16 * h) * kPanel, down, _mm512_fmadd_ps(_mm512_set1_ps(args.scales[at]), u, o), 4);
    }
  }
}

template <int kRows>
WICORE_AVX512 void Tile(const float* x, int64_t k, const float* panel, int num_out, float* y, int64_t ldy) {
  __m512 acc[kRows][2];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    const __m512 w0 = _mm512_loadu_ps(panel + c * kPanel);
    const __m512 w1 = _mm512_loadu_ps(panel + c * kPanel + 16);
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const __m512 xi = _mm512_set1_ps(x[i * k + c]);
      acc[i][0] = _mm512_fmadd_ps(xi, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xi, w1, acc[i][1]);
    }
  }
  const __mmask16 m0 = static_cast<__mmask16>((1u << std::min(num_out, 16)) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(num_out > 16 ? (1u << (num_out - 16)) - 1 : 0);
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

WICORE_AVX512 void Rows(const float* x, int64_t num_rows, int64_t k, const float* panel, int num_out, float* y, int64_t ldy) {
  switch (num_rows) {
    case 1: return Tile<1>(x, k, panel, num_out, y, ldy);
    case 2: return Tile<2>(x, k, panel, num_out, y, ldy);
    case 3: return Tile<3>(x, k, panel, num_out, y, ldy);
    case 4: return Tile<4>(x, k, panel, num_out, y, ldy);
    case 5: return Tile<5>(x, k, panel, num_out, y, ldy);
    case 6: return Tile<6>(x, k, panel, num_out, y, ldy);
    case 7: return Tile<7>(x, k, panel, num_out, y, ldy);
    default: return Tile<8>(x, k, panel, num_out, y, ldy);
  }
}

}  // namespace

bool MatMulQFloatRuns(const MatMulQArgs& args, MatMulQPath path) {
  return path == MatMulQPath::kVnni && args.m >= kMatMulQFloatRows;
}

void MatMulQFloatCpu(const MatMulQArgs& args, int64_t row_begin, int64_t row_end) {
  const int64_t k = args.k, num_panels = (row_end - row_begin + kPanel - 1) / kPanel;
  thread_local std::vector<float> panels;  // this task's weight rows, dequantized
  if (panels.size() < static_cast<size_t>(num_panels * k * kPanel)) panels.resize(num_panels * k * kPanel);  // a part panel's
  // missing rows hold whatever: their columns are never stored
  for (int64_t p = 0; p < num_panels; ++p) {
    const int64_t n = row_begin + p * kPanel;
    Dequantize(args, n, std::min(kPanel, row_end - n), panels.data() + p * k * kPanel);
  }
  constexpr int64_t kChunkRows = 64;  // activation rows against all panels while they stay in cache
  for (int64_t i0 = 0; i0 < args.m; i0 += kChunkRows) {
    for (int64_t p = 0; p < num_panels; ++p) {
      const int64_t n = row_begin + p * kPanel;
      const int num_out = static_cast<int>(std::min(kPanel, row_end - n));
      for (int64_t i = i0; i < std::min(i0 + kChunkRows, args.m); i += kTileRows) {
        Rows(args.x + i * k, std::min(kTileRows, args.m - i), k, panels.data() + p * k * kPanel, num_out, args.y + i * args.n + n,
             args.n);
      }
    }
  }
}

}  // namespace wicore
