// MatMulQ's int8 prompt GEMM on AVX-512 VNNI (a node's prompt_precision "int8", ops.cc): x rounded to int8
// per 32 columns (llama.cpp's Q8 activations, no residual) against the codes, vpdpbusd 4 multiply-adds a lane.
//
//   per task (weight rows [n_begin, n_end), at most 64), per panel of 32 weight rows (once, in L2):
//     codes[k / 4][32][4] u8 (code + zero point), scales[k / bs][32], offsets'[k / bs][32] = o - zero_point * s
//   per tile of kRows activation rows x 32 weight rows, per weight block b (bs columns):
//     p = Σ_quads vpdpbusd(codes, q)                      (exact int32)
//     acc = fma(float(p), s[b] * d[row, b], acc);  acc = fma(o'[b], d * Σ q over b, acc)
//
// So y = Σ_b s d (Σ code q) + Σ_b (o - zp s) d Σ q: the int8 path's value, each block's terms rounded once
// (bounded against float64 from q and d in tests/kernels/test_matmul_q.py). On a Cascade Lake vpdpbusd zmm
// issues on one port, the fma on two: 64 against 32 multiply-adds a cycle at best; less for 16-column blocks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "kernels.h"

namespace wicore {
namespace {

#define WICORE_VNNI_GEMM __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))

constexpr int64_t kPanel = 32;    // weight rows a panel: two zmm of 16 rows x 4 codes
constexpr int64_t kTileRows = 4;  // activation rows a tile: 8 int32 and 8 float accumulators
constexpr int64_t kBlock = 32;
constexpr int kGroup = 8;

struct Panel {
  std::vector<uint8_t> codes;  // [k / 4][kPanel][4]
  std::vector<float> scales, offsets;  // [k / bs][kPanel]
};

// Row n's 32 codes of block b (code + zero point), from kernels.h's layouts of 4 and 8 bits.
WICORE_VNNI_GEMM void Codes(const MatMulQArgs& args, int64_t n, int64_t b, uint8_t* out) {
  if (args.bits == 8) {
    std::memcpy(out, args.weight + n * args.k + b * kBlock, kBlock);
    return;
  }
  const uint8_t* w = args.weight + (n / kGroup) * (args.k / kBlock) * kGroup * 16 + (n % kGroup) * 16 + b * kGroup * 16;
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w)), low = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_and_si128(v, low));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_and_si128(_mm_srli_epi16(v, 4), low));
}

// A block's 32 x 32 codes row by row, then its quads (4 codes, one dword) down the panel's rows.
WICORE_VNNI_GEMM void Pack(const MatMulQArgs& args, int64_t n0, int64_t num_rows, Panel* panel) {
  const int64_t k = args.k, num_blocks = k / args.block_size;
  const int zero_point = args.bits == 8 ? 128 : 8;
  panel->codes.resize(k * kPanel);
  panel->scales.assign(num_blocks * kPanel, 0.f);
  panel->offsets.assign(num_blocks * kPanel, 0.f);
  alignas(64) uint32_t rows[kPanel][kBlock / 4];
  std::memset(rows, 0, sizeof(rows));  // a part panel's missing rows: code 0, scale 0
  const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(kBlock / 4));
  for (int64_t b = 0; b < k / kBlock; ++b) {
    for (int64_t r = 0; r < num_rows; ++r) Codes(args, n0 + r, b, reinterpret_cast<uint8_t*>(rows[r]));
    uint32_t* out = reinterpret_cast<uint32_t*>(panel->codes.data()) + b * (kBlock / 4) * kPanel;
    for (int l = 0; l < kBlock / 4; ++l) {
      const int* base = reinterpret_cast<const int*>(&rows[0][l]);
      _mm512_storeu_si512(out + l * kPanel, _mm512_i32gather_epi32(down, base, 4));
      _mm512_storeu_si512(out + l * kPanel + 16, _mm512_i32gather_epi32(down, base + 16 * (kBlock / 4), 4));
    }
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t n = n0 + r;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t at = args.bits == 8 ? n * num_blocks + b : (n / kGroup) * num_blocks * kGroup + b * kGroup + n % kGroup;
      const float s = args.scales[at], o = args.offsets != nullptr ? args.offsets[at] : 0.f;
      panel->scales[b * kPanel + r] = s;
      panel->offsets[b * kPanel + r] = std::fma(-static_cast<float>(zero_point), s, o);
    }
  }
}

template <int kRows, int kQuads>
WICORE_VNNI_GEMM void Tile(const MatMulQInt8Rows& x, int64_t i0, int64_t k, int64_t block_size, const Panel& panel, int64_t b0,
                           int64_t b1, int num_out, float* y, int64_t ldy) {
  const int64_t num_blocks = k / block_size;
  const int8_t* q[kRows];
  const float* d[kRows];
  const float* sums[kRows];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    q[i] = x.q.data() + (i0 + i) * x.stride;
    d[i] = x.d.data() + (i0 + i) * (k / kBlock);
    sums[i] = x.sums.data() + (i0 + i) * num_blocks;
  }
  const __mmask16 m0 = static_cast<__mmask16>((1u << std::min(num_out, 16)) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(num_out > 16 ? (1u << (num_out - 16)) - 1 : 0);
  __m512 acc[kRows][2];  // the fma chain goes on from the blocks before b0 (y): the same bits whatever the split
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    acc[i][0] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, y + i * ldy);
    acc[i][1] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, y + i * ldy + 16);
  }
  const uint8_t* codes = panel.codes.data();
  for (int64_t b = b0; b < b1; ++b) {
    __m512i p[kRows][2];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) p[i][0] = p[i][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int l = 0; l < kQuads; ++l) {
      const int64_t quad = b * kQuads + l;
      const __m512i w0 = _mm512_loadu_si512(codes + quad * kPanel * 4);
      const __m512i w1 = _mm512_loadu_si512(codes + quad * kPanel * 4 + 64);
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        int32_t four;
        std::memcpy(&four, q[i] + quad * 4, 4);
        const __m512i a = _mm512_set1_epi32(four);
        p[i][0] = _mm512_dpbusd_epi32(p[i][0], w0, a);
        p[i][1] = _mm512_dpbusd_epi32(p[i][1], w1, a);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(panel.scales.data() + b * kPanel), s1 = _mm512_loadu_ps(panel.scales.data() + b * kPanel + 16);
    const __m512 o0 = _mm512_loadu_ps(panel.offsets.data() + b * kPanel), o1 = _mm512_loadu_ps(panel.offsets.data() + b * kPanel + 16);
    const int64_t a_block = b * block_size / kBlock;
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const __m512 di = _mm512_set1_ps(d[i][a_block]), si = _mm512_set1_ps(sums[i][b]);
      acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[i][0]), _mm512_mul_ps(s0, di), acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[i][1]), _mm512_mul_ps(s1, di), acc[i][1]);
      acc[i][0] = _mm512_fmadd_ps(o0, si, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(o1, si, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

template <int kQuads>
void Rows(const MatMulQInt8Rows& x, int64_t i0, int64_t num_rows, int64_t k, int64_t bs, const Panel& panel, int64_t b0, int64_t b1,
          int num_out, float* y, int64_t ldy) {
  switch (num_rows) {
    case 1: return Tile<1, kQuads>(x, i0, k, bs, panel, b0, b1, num_out, y, ldy);
    case 2: return Tile<2, kQuads>(x, i0, k, bs, panel, b0, b1, num_out, y, ldy);
    case 3: return Tile<3, kQuads>(x, i0, k, bs, panel, b0, b1, num_out, y, ldy);
    default: return Tile<4, kQuads>(x, i0, k, bs, panel, b0, b1, num_out, y, ldy);
  }
}

}  // namespace

bool MatMulQInt8Runs(const MatMulQArgs& args, MatMulQPath path, bool is_int8_prompt) {
  return is_int8_prompt && path == MatMulQPath::kVnni && args.m >= kMatMulQFloatRows;
}

void MatMulQInt8Resize(const MatMulQArgs& args, MatMulQInt8Rows* out) {
  out->stride = args.k + 64;
  out->q.resize(args.m * out->stride);
  out->d.resize(args.m * (args.k / kBlock));
  out->sums.resize(args.m * (args.k / args.block_size));
}

// llama.cpp's rounding (QuantizeScalar's in matmul_q_cpu.cc: d = max|x| / 127, q = x * (1 / d) rounded to
// nearest even), 32 columns a zmm pair, and d * Σ q a weight block (the integer sum is exact in any order).
WICORE_VNNI_GEMM void MatMulQInt8Quantize(const MatMulQArgs& args, int64_t row_begin, int64_t row_end, MatMulQInt8Rows* out) {
  const int64_t k = args.k, per = kBlock / args.block_size;
  for (int64_t i = row_begin; i < row_end; ++i) {
    for (int64_t b = 0; b < k / kBlock; ++b) {
      const float* xb = args.x + i * k + b * kBlock;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.f;
      const __m512 id = _mm512_set1_ps(d != 0.f ? 1.f / d : 0.f);
      out->d[i * (k / kBlock) + b] = d;
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
      int8_t* qb = out->q.data() + i * out->stride + b * kBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(q1));
      float* sums = out->sums.data() + i * (k / args.block_size) + b * per;
      if (per == 2) {
        sums[0] = d * static_cast<float>(_mm512_reduce_add_epi32(q0));
        sums[1] = d * static_cast<float>(_mm512_reduce_add_epi32(q1));
      } else {
        sums[0] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
      }
    }
  }
}

void MatMulQInt8Cpu(const MatMulQArgs& args, const MatMulQInt8Rows& x, int64_t row_begin, int64_t row_end) {
  const int64_t k = args.k, num_panels = (row_end - row_begin + kPanel - 1) / kPanel;
  thread_local std::vector<Panel> panels;
  if (panels.size() < static_cast<size_t>(num_panels)) panels.resize(num_panels);
  for (int64_t p = 0; p < num_panels; ++p) {
    const int64_t n = row_begin + p * kPanel;
    Pack(args, n, std::min(kPanel, row_end - n), &panels[p]);
  }
  constexpr int64_t kChunkRows = 64;  // activation rows against all panels while they stay in cache
  // columns a pass over a chunk's tiles: the panel's 16 KB of them stay in L1 (K = 2048's 64 KB did not:
  // 0.9x the float path at Gemma's down_proj before)
  constexpr int64_t kChunkColumns = 256;
  const int64_t blocks_a_pass = kChunkColumns / args.block_size, num_blocks = k / args.block_size;
  for (int64_t i0 = 0; i0 < args.m; i0 += kChunkRows) {
    for (int64_t p = 0; p < num_panels; ++p) {
      const int64_t n = row_begin + p * kPanel;
      const int num_out = static_cast<int>(std::min(kPanel, row_end - n));
      for (int64_t b0 = 0; b0 < num_blocks; b0 += blocks_a_pass) {
        const int64_t b1 = std::min(b0 + blocks_a_pass, num_blocks);
        for (int64_t i = i0; i < std::min(i0 + kChunkRows, args.m); i += kTileRows) {
          const int64_t rows = std::min(kTileRows, args.m - i);
          float* y = args.y + i * args.n + n;
          if (args.block_size == 16) {
            Rows<4>(x, i, rows, k, args.block_size, panels[p], b0, b1, num_out, y, args.n);
          } else {
            Rows<8>(x, i, rows, k, args.block_size, panels[p], b0, b1, num_out, y, args.n);
          }
        }
      }
    }
  }
}

}  // namespace wicore
