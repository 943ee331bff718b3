// MatMulQ's prompt path on AVX-512 and AVX2: float activations against the weight dequantized to float32, a
// register-blocked GEMM (the default CPU export's arithmetic, not the int8 one of matmul_q_cpu.cc).
//
//   per task (weight rows [n_begin, n_end), at most 64):
//     panel[p][k][W] = fma(s[n, k / bs], code - zero_point, o[n, k / bs])   (once: K x 64 floats, in L2)
//     for each tile of R activation rows x W weight rows (2 vectors a row, 2 R accumulators):
//       for k in 0 .. K-1:  acc[i][h] = fma(broadcast x[i, k], panel[k][h-th vector], acc[i][h])
//   AVX-512: W = 32, R = 8 (16 of 32 zmm); AVX2: W = 16, R = 6 (12 of 16 ymm, the 2 panel loads and a broadcast)
//
// Each output is one float32 fma chain over k in order, so |y - x·w| <= K u Σ_k |x_k w_k| / (1 - K u)
// against the float64 product with the float32 weights w above (tests/kernels/test_matmul_q.py), on either
// path. At 512 rows this is ~2x the int8 tiles: one fma a (row, column) where those need two integer dot
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

// Where weight row n lies: its scales' first index and the step from one weight block to the next, its block 0.
struct RowCodes {
  int64_t first, stride;
  const uint8_t* codes;
};

RowCodes RowOf(const MatMulQArgs& args, int64_t n) {
  const int64_t k = args.k, num_blocks = k / args.block_size;
  if (args.bits == 8) return {n * num_blocks, 1, args.weight + n * k};
  return {(n / kGroup) * num_blocks * kGroup + n % kGroup, kGroup,
          args.weight + (n / kGroup) * (k / kBlock) * kGroup * 16 + (n % kGroup) * 16};
}

// Columns 0-15 and 16-31 of the row's 32-column block b, one code a byte (kernels.h's 4-bit groups: byte j of a
// row's 16 holds column j in its low nibble and j + 16 in its high one).
void BlockCodes(const MatMulQArgs& args, const RowCodes& row, int64_t b, __m128i c[2]) {
  if (args.bits == 8) {
    c[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + b * kBlock));
    c[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + b * kBlock + 16));
    return;
  }
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + b * kGroup * 16));
  c[0] = _mm_and_si128(v, low);
  c[1] = _mm_and_si128(_mm_srli_epi16(v, 4), low);
}

// The panel of weight rows [n, n + num_rows) into panel[k][kPanel]: a 32-column block of every row at a
// time (the 4 KB it writes stays in L1), 16 columns a zmm (they lie in one weight block, of 16 or 32),
// scattered down the row's column of the panel.
WICORE_AVX512 void Dequantize(const MatMulQArgs& args, int64_t n0, int64_t num_rows, float* panel) {
  const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(kPanel));
  const __m512i zero_point = _mm512_set1_epi32(args.bits == 8 ? 128 : 8);
  const int64_t per = kBlock / args.block_size;  // weight blocks a 32-column block: 1 or 2
  RowCodes rows[kPanel];
  for (int64_t r = 0; r < num_rows; ++r) rows[r] = RowOf(args, n0 + r);
  for (int64_t b = 0; b < args.k / kBlock; ++b) for (int64_t r = 0; r < num_rows; ++r) {
    float* out = panel + r;
    __m128i c[2];
    BlockCodes(args, rows[r], b, c);
    for (int h = 0; h < 2; ++h) {
      const int64_t at = rows[r].first + (b * per + (per == 2 ? h : 0)) * rows[r].stride;  // these 16 columns' weight block
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

#define WICORE_AVX2 __attribute__((target("avx2,fma")))

namespace avx2 {

constexpr int64_t kPanel = 16;    // weight rows a panel: two ymm
constexpr int64_t kTileRows = 6;  // activation rows a tile: 12 accumulators

// As the AVX-512 Dequantize, 8 columns a ymm stored down the panel one float at a time (no scatter in AVX2;
// once a task, against K x 16 fmas a row of x after it).
WICORE_AVX2 void Dequantize(const MatMulQArgs& args, int64_t n0, int64_t num_rows, float* panel) {
  const __m256i zero_point = _mm256_set1_epi32(args.bits == 8 ? 128 : 8);
  const int64_t per = kBlock / args.block_size;
  alignas(32) float out[8];
  for (int64_t r = 0; r < num_rows; ++r) {
    const RowCodes row = RowOf(args, n0 + r);
    for (int64_t b = 0; b < args.k / kBlock; ++b) {
      __m128i c[2];
      BlockCodes(args, row, b, c);
      for (int g = 0; g < 4; ++g) {  // 8 columns: 16 * (g / 2) + 8 * (g % 2)
        const int h = g / 2;
        const int64_t at = row.first + (b * per + (per == 2 ? h : 0)) * row.stride;  // these columns' weight block
        const __m128i eight = g % 2 == 0 ? c[h] : _mm_srli_si128(c[h], 8);
        const __m256 u = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(eight), zero_point));
        const __m256 o = args.offsets != nullptr ? _mm256_set1_ps(args.offsets[at]) : _mm256_setzero_ps();
        _mm256_store_ps(out, _mm256_fmadd_ps(_mm256_set1_ps(args.scales[at]), u, o));
        float* dst = panel + (b * kBlock + 8 * g) * kPanel + r;
        for (int j = 0; j < 8; ++j) dst[j * kPanel] = out[j];
      }
    }
  }
}

template <int kRows>
WICORE_AVX2 void Tile(const float* x, int64_t k, const float* panel, int num_out, float* y, int64_t ldy) {
  __m256 acc[kRows][2];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    const __m256 w0 = _mm256_loadu_ps(panel + c * kPanel);
    const __m256 w1 = _mm256_loadu_ps(panel + c * kPanel + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 xi = _mm256_broadcast_ss(x + i * k + c);
      acc[i][0] = _mm256_fmadd_ps(xi, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xi, w1, acc[i][1]);
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(num_out), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(num_out - 8), lane);
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) {
    _mm256_maskstore_ps(y + i * ldy, m0, acc[i][0]);
    _mm256_maskstore_ps(y + i * ldy + 8, m1, acc[i][1]);
  }
}

WICORE_AVX2 void Rows(const float* x, int64_t num_rows, int64_t k, const float* panel, int num_out, float* y, int64_t ldy) {
  switch (num_rows) {
    case 1: return Tile<1>(x, k, panel, num_out, y, ldy);
    case 2: return Tile<2>(x, k, panel, num_out, y, ldy);
    case 3: return Tile<3>(x, k, panel, num_out, y, ldy);
    case 4: return Tile<4>(x, k, panel, num_out, y, ldy);
    case 5: return Tile<5>(x, k, panel, num_out, y, ldy);
    default: return Tile<6>(x, k, panel, num_out, y, ldy);
  }
}

}  // namespace avx2

// The task's weight rows dequantized a panel of `panel_rows` at a time, then every activation row against them,
// 64 rows at a time while the panels stay in cache.
template <typename DequantizeFn, typename RowsFn>
void FloatTask(const MatMulQArgs& args, int64_t row_begin, int64_t row_end, int64_t panel_rows, int64_t tile_rows,
               DequantizeFn dequantize, RowsFn rows) {
  const int64_t k = args.k, num_panels = (row_end - row_begin + panel_rows - 1) / panel_rows;
  thread_local std::vector<float> panels;  // this task's weight rows, dequantized
  if (panels.size() < static_cast<size_t>(num_panels * k * panel_rows)) panels.resize(num_panels * k * panel_rows);
  // a part panel's missing rows hold whatever: their columns are never stored
  for (int64_t p = 0; p < num_panels; ++p) {
    const int64_t n = row_begin + p * panel_rows;
    dequantize(args, n, std::min(panel_rows, row_end - n), panels.data() + p * k * panel_rows);
  }
  // ~64 rows, whole tiles: a tile that ran past its chunk (AVX2's 6 into 64) recomputed the next chunk's first rows
  const int64_t chunk_rows = 64 / tile_rows * tile_rows;
  for (int64_t i0 = 0; i0 < args.m; i0 += chunk_rows) {
    const int64_t i_end = std::min(i0 + chunk_rows, args.m);
    for (int64_t p = 0; p < num_panels; ++p) {
      const int64_t n = row_begin + p * panel_rows;
      const int num_out = static_cast<int>(std::min(panel_rows, row_end - n));
      for (int64_t i = i0; i < i_end; i += tile_rows) {
        rows(args.x + i * k, std::min(tile_rows, i_end - i), k, panels.data() + p * k * panel_rows, num_out,
             args.y + i * args.n + n, args.n);
      }
    }
  }
}

}  // namespace

bool MatMulQFloatRuns(const MatMulQArgs& args, MatMulQPath path) {
  return path != MatMulQPath::kScalar && args.m >= kMatMulQFloatRows;
}

void MatMulQFloatCpu(const MatMulQArgs& args, int64_t row_begin, int64_t row_end, MatMulQPath path) {
  if (path == MatMulQPath::kAvx2) return FloatTask(args, row_begin, row_end, avx2::kPanel, avx2::kTileRows, avx2::Dequantize, avx2::Rows);
  FloatTask(args, row_begin, row_end, kPanel, kTileRows, Dequantize, Rows);
}

}  // namespace wicore
