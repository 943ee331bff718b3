// MatMulQ on the CPU: float activations x block-quantized weights, with llama.cpp's arithmetic
// (activations rounded to int8 per block of 32, integer dot products, one float scale a block).
//
//   x [M, K] ──► per 32 columns: d = max|x| / 127, q = rint(x / d)  (int8, and the sums below)
//   y[m, n] = Σ_lanes ( Σ_blocks fma(float(p_lane), s[n, b] * d[b], .) ) + Σ_b fma(o[n, b], d * Σ_b q, .)
//
// p_lane is the exact integer dot product of 4 consecutive columns (a vpdpbusd lane: 8 lanes cover a
// block of 32); the lanes are summed in a fixed order at the end. The AVX-512 VNNI path and the
// portable scalar one follow exactly that order (the offsets too: OffsetScalar), so both give the same bits (tests/kernels/test_matmul_q.py).
// The weight codes are unsigned, code + zero point (8 for 4 bits, 128 for 8): vpdpbusd takes them
// as its u8 operand, and the accumulator starts at -zero_point * (the lane's sum of q), so p_lane is
// the signed codes' dot product with no further correction.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "kernels.h"

namespace wicore {
namespace {

constexpr int64_t kBlock = 32;  // activation block (columns), and the packing unit of the codes
constexpr int kLanes = 8;       // 4 columns a lane
constexpr int kGroup = 8;
// The decode kernels prefetch their weight stream this many bytes ahead: one thread's hardware prefetchers
// alone read a 178 MB Q8_0 head at ~6 GB/s here (a NumPy sum's rate), with this ~11 (docs/PERFORMANCE.md,
// issue 37, 2026-11-28 evening; 1024: ~8.5, 8192: as 4096).
constexpr int64_t kPrefetch = 4096;
constexpr int kResidualScale = 128;  // the residual's steps: d / 128 (MatMulQArgs::residual)       // 4-bit weight rows interleaved (kernels.h), and rows a pass

float Reduce(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// The lanes' starting values and the weight blocks' sums, from q and d.
void Sums(int64_t k, int zero_point, int64_t block_size, bool residual, QuantRow* row) {
  for (int64_t l = 0; l < k / 4; ++l) {
    const int8_t* ql = row->q.data() + 4 * l;
    row->lanes[l] = -zero_point * (ql[0] + ql[1] + ql[2] + ql[3]);
    if (residual) {
      const int8_t* rl = row->q2.data() + 4 * l;
      row->lanes2[l] = -zero_point * (rl[0] + rl[1] + rl[2] + rl[3]);
    }
  }
  for (int64_t b = 0; b < k / block_size; ++b) {
    int32_t s = 0;
    for (int64_t j = 0; j < block_size; ++j) {
      s += residual ? kResidualScale * row->q[b * block_size + j] + row->q2[b * block_size + j] : row->q[b * block_size + j];
    }
    row->sums[b] = row->d[b * block_size / kBlock] * static_cast<float>(s);
  }
}

void Resize(int64_t k, int64_t block_size, bool residual, QuantRow* row) {
  row->q.resize(k);
  row->q2.resize(residual ? k : 0);
  row->lanes2.resize(residual ? k / 4 : 0);
  row->d.resize(k / kBlock);
  row->lanes.resize(k / 4);
  row->sums.resize(k / block_size);
}

// d = max|x| / 127, q = x * (1 / d) rounded to nearest even (0 where d is 0).
void QuantizeScalar(const float* x, int64_t k, bool residual, QuantRow* row) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    row->d[b] = residual ? d / kResidualScale : d;
    int8_t* qb = row->q.data() + b * kBlock;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float r = std::nearbyint(xb[j] * id);
      qb[j] = static_cast<int8_t>(r);
      if (residual) {  // what rounding left, in steps of d / 128 (|.| <= 64, clamped for safety)
        const float r2 = std::nearbyint(std::fma(-r, d, xb[j]) * (id * kResidualScale));
        row->q2[b * kBlock + j] = static_cast<int8_t>(std::fmin(std::fmax(r2, -127.f), 127.f));
      }
    }
  }
}

// Where one weight row's data lies (the layouts of kernels.h): consecutive 32-column blocks of its
// codes `block_bytes` apart, consecutive weight blocks' scales and offsets `scale_stride` floats apart.
struct RowView {
  const uint8_t* codes;
  const float* scales;
  const float* offsets;  // or null
  int64_t block_bytes, scale_stride;
};

RowView View(const MatMulQArgs& args, int64_t n) {
  const int64_t num_blocks = args.k / args.block_size;
  if (args.bits != 4) {  // 5 and 6 bits: codes of kernels.h's layout (DotScalar reads 4 and 8 bits only)
    const float* o = args.offsets != nullptr ? args.offsets + n * num_blocks : nullptr;
    const int64_t block_bytes = args.bits == 8 ? kBlock : 16 + 4 * (args.bits - 4);
    return {args.weight + n * (args.k / kBlock) * block_bytes, args.scales + n * num_blocks, o, block_bytes, 1};
  }
  const int64_t g = n / kGroup, r = n % kGroup;
  const int64_t first = g * num_blocks * kGroup + r;
  const float* o = args.offsets != nullptr ? args.offsets + first : nullptr;
  return {args.weight + g * (args.k / kBlock) * kGroup * 16 + r * 16, args.scales + first, o, kGroup * 16, kGroup};
}

// The offsets' term: fma over the weight blocks in order.
float OffsetScalar(const QuantRow& a, const RowView& w, int64_t num_blocks) {
  float off = 0.f;
  for (int64_t b = 0; b < num_blocks; ++b) off = std::fma(w.offsets[b * w.scale_stride], a.sums[b], off);
  return off;
}

float DotScalar(const QuantRow& a, const RowView& w, int bits, int64_t block_size, int64_t k) {
  float acc[kLanes] = {0.f};
  uint8_t u[kBlock];
  const int64_t per_block = kBlock / block_size;  // weight blocks in an activation block: 1 or 2
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const uint8_t* wb = w.codes + b * w.block_bytes;  // 4 bits: byte j holds column j low, j + 16 high
    for (int j = 0; j < kBlock; ++j) u[j] = bits == 8 ? wb[j] : j < 16 ? wb[j] & 0x0F : wb[j - 16] >> 4;
    const int8_t* q = a.q.data() + b * kBlock;
    for (int l = 0; l < kLanes; ++l) {
      int32_t p = a.lanes[b * kLanes + l];
      for (int j = 4 * l; j < 4 * l + 4; ++j) p += static_cast<int32_t>(u[j]) * q[j];
      if (!a.q2.empty()) {  // p * 128 + the residual's dot product
        p = p * kResidualScale + a.lanes2[b * kLanes + l];
        for (int j = 4 * l; j < 4 * l + 4; ++j) p += static_cast<int32_t>(u[j]) * a.q2[b * kBlock + j];
      }
      const float scale = w.scales[(b * per_block + l * per_block / kLanes) * w.scale_stride] * a.d[b];
      acc[l] = std::fma(static_cast<float>(p), scale, acc[l]);
    }
  }
  const float dot = Reduce(acc);
  return w.offsets == nullptr ? dot : dot + OffsetScalar(a, w, k / block_size);
}

#define WICORE_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

// QuantizeScalar's arithmetic, 8 columns at a time (max, one division, products and rounding are exact
// IEEE operations in any order).
WICORE_VNNI void QuantizeVnni(const float* x, int64_t k, bool residual, QuantRow* row) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.f;
    const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
    row->d[b] = residual ? d / kResidualScale : d;
    const __m256 dv = _mm256_set1_ps(d);
    const __m256 id2 = _mm256_mul_ps(id, _mm256_set1_ps(kResidualScale));
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(row->q.data() + b * kBlock + 8 * i), _mm256_cvtepi32_epi8(_mm256_cvtps_epi32(r)));
      if (residual) {
        __m256 r2 = _mm256_round_ps(_mm256_mul_ps(_mm256_fnmadd_ps(r, dv, v[i]), id2), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r2 = _mm256_min_ps(_mm256_max_ps(r2, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(row->q2.data() + b * kBlock + 8 * i), _mm256_cvtepi32_epi8(_mm256_cvtps_epi32(r2)));
      }
    }
  }
}

// Sums (and with `tiled` Tiled) from QuantizeVnni's q, q2 and d, a 32-column block at a time: the same integers
// (exact in any order) and the same one product d * float(sum) a weight block.
WICORE_VNNI void SumsVnni(int64_t k, int zero_point, int64_t block_size, bool residual, bool tiled, QuantRow* row) {
  if (tiled) {
    row->a16.resize(k);
    row->starts.resize(k / 4);
  }
  const __m256i ones = _mm256_set1_epi8(1), zp = _mm256_set1_epi32(-zero_point);
  // a16's order within a block (QuantRow): lane l's columns 4l, 4l + 1, then (from 16 on) 4l + 2, 4l + 3
  const __m512i order = _mm512_set_epi16(31, 30, 27, 26, 23, 22, 19, 18, 15, 14, 11, 10, 7, 6, 3, 2,
                                         29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5, 4, 1, 0);  // from the last
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row->q.data() + b * kBlock));
    const __m256i raw = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);  // each lane's sum of 4 q
    const __m256i lanes = _mm256_mullo_epi32(raw, zp);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row->lanes.data() + b * kLanes), lanes);
    __m256i total = raw, start = lanes;
    __m512i a = _mm512_cvtepi8_epi16(q);
    if (residual) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row->q2.data() + b * kBlock));
      const __m256i raw2 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q2);
      const __m256i lanes2 = _mm256_mullo_epi32(raw2, zp);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row->lanes2.data() + b * kLanes), lanes2);
      total = _mm256_add_epi32(_mm256_slli_epi32(raw, 7), raw2);
      start = _mm256_add_epi32(_mm256_slli_epi32(lanes, 7), lanes2);
      a = _mm512_add_epi16(_mm512_slli_epi16(a, 7), _mm512_cvtepi8_epi16(q2));
    }
    if (tiled) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row->starts.data() + b * kLanes), start);
      _mm512_storeu_si512(row->a16.data() + b * kBlock, _mm512_permutexvar_epi16(order, a));
    }
    alignas(32) int32_t t[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), total);
    const float d = row->d[b];
    if (block_size == 16) {
      row->sums[2 * b] = d * static_cast<float>(t[0] + t[1] + t[2] + t[3]);
      row->sums[2 * b + 1] = d * static_cast<float>(t[4] + t[5] + t[6] + t[7]);
    } else {
      row->sums[b] = d * static_cast<float>(((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7])));
    }
  }
}

// Reduce's order in registers: (a0+a4, a1+a5, a2+a6, a3+a7), then (.0+.2, .1+.3), then their sum.
WICORE_VNNI inline float ReduceVec(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

#include "matmul_q_avx2_quant.inc"

#include "matmul_q_rows.inc"

#include "matmul_q_pairs.inc"

#include "matmul_q_group4.inc"

#include "matmul_q_avx2_rows.inc"

#include "matmul_q_avx2_rows4.inc"

template <int kPerBlock, bool kResidual>
WICORE_VNNI void RowsVnni(const MatMulQArgs& args, const std::vector<QuantRow>& rows, int64_t begin, int64_t end) {
  const int64_t k = args.k, num_blocks = k / args.block_size;
  float out[kGroup];
  for (int64_t i = 0; i < args.m; ++i) {
    float* y = args.y + i * args.n;
    if (args.bits == 4) {  // begin is a multiple of kGroup (MatMulQCpu)
      const MatMulQPacked* p = args.packed;
      for (int64_t n = begin; n < end; n += kGroup) {
        const int64_t g = n / kGroup;
        const GroupScales scales = p != nullptr ? GroupScales::Of(args.scales, p->scales16, p->scale_ints, p->blocks_per_super, g, num_blocks)
                                                : GroupScales::Of(args.scales, nullptr, nullptr, 0, g, num_blocks);
        const GroupScales offsets = p != nullptr && p->mins16 != nullptr
                                        ? GroupScales::Of(nullptr, p->mins16, p->min_ints, p->blocks_per_super, g, num_blocks)
                                        : GroupScales::Of(args.offsets, nullptr, nullptr, 0, g, num_blocks);
        const uint8_t* w = args.weight + n * (k / 2);
        const GroupScales* o = args.offsets != nullptr ? &offsets : nullptr;
        const float c = p != nullptr && p->mins16 != nullptr ? p->offset_scale : 0.f;
        const int form = o == nullptr ? -1 : o->Form();
        const int code = form < 0 ? 0 : form == 0 ? 1 : (form == 1 ? 2 : 4) + (c != 0.f ? 1 : 0);
        switch (scales.Form()) {
          case 0: Dot4GroupOf<kPerBlock, kResidual, 0>(code, rows[i], w, scales, o, c, k, out); break;
          case 1: Dot4GroupOf<kPerBlock, kResidual, 1>(code, rows[i], w, scales, o, c, k, out); break;
          default: Dot4GroupOf<kPerBlock, kResidual, 2>(code, rows[i], w, scales, o, c, k, out); break;
        }
        for (int r = 0; r < kGroup && n + r < end; ++r) y[n + r] = out[r];
      }
      continue;
    }
    // 8-, 5- and 6-bit rows: 4 a pass as 2 zmm pairs (DotPairs, independent chains; 4 pairs, 8 rows' pointers,
    // spilled and ran no faster), then a pair, then a row (DotRows); any split gives the same bits. The kernels
    // prefetch (kPrefetch), heads too.
    const int64_t row_bytes = args.bits == 8 ? k : (k / kBlock) * (16 + 4 * (args.bits - 4));
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(128 - args.zero_point));
    const MatMulQPacked* p = args.packed;
    const int64_t supers = p != nullptr && p->scale_ints != nullptr ? num_blocks / p->blocks_per_super : num_blocks;
    auto dot = [&](auto pairs_of, int64_t n0, float* o) {
      constexpr int kPairs = decltype(pairs_of)::value;  // 0: one row
      const uint8_t* w = args.weight + n0 * row_bytes;
      RowScales scales{args.scales + n0 * num_blocks, nullptr, nullptr, 0, supers};
      if (p != nullptr && p->scales16 != nullptr) {  // narrow, in place (MatMulQTask: no narrow offsets here)
        scales.f32 = nullptr;
        scales.half = p->scale_ints != nullptr ? p->scales16 + n0 * supers : p->scales16 + n0 * num_blocks;
        scales.ints = p->scale_ints != nullptr ? p->scale_ints + n0 * num_blocks : nullptr;
        scales.shift = p->scale_ints != nullptr ? __builtin_ctzll(static_cast<uint64_t>(p->blocks_per_super)) : 0;
      }
      auto at_width = [&](auto high_of) {  // the codes' high bits: 0 (8-bit codes), 1 (5-bit) or 2 (6-bit)
        constexpr int kHigh = decltype(high_of)::value;
        if constexpr (kPairs == 0) {
          DotRows<1, kPerBlock, kResidual, kHigh>(rows[i], w, row_bytes, scales, num_blocks, k, bias, o);
        } else {
          DotPairs<kPairs, kPerBlock, kResidual, kHigh>(rows[i], w, row_bytes, scales, num_blocks, k, bias, o);
        }
      };
      if (args.bits == 8) return at_width(std::integral_constant<int, 0>{});
      if (args.bits == 5) return at_width(std::integral_constant<int, 1>{});
      at_width(std::integral_constant<int, 2>{});
    };
    for (int64_t n = begin; n < end;) {
      const int64_t left = end - n;
      const int64_t rows_here = left >= 4 ? 4 : left >= 2 ? 2 : 1;
      if (rows_here == 4) {
        dot(std::integral_constant<int, 2>{}, n, out);
      } else if (rows_here == 2) {
        dot(std::integral_constant<int, 1>{}, n, out);
      } else {
        dot(std::integral_constant<int, 0>{}, n, out);
      }
      for (int64_t r = 0; r < rows_here; ++r) {
        y[n + r] = args.offsets == nullptr ? out[r] : out[r] + OffsetScalar(rows[i], View(args, n + r), num_blocks);
      }
      n += rows_here;
    }
  }
}

// The tiled kernel (matmul_q_tile.inc), for AVX-512 VNNI and for AVX2 + FMA.
#define WICORE_TILE_NS tile_vnni
#define WICORE_TILE_TARGET WICORE_VNNI
#define WICORE_TILE_DOT(acc, w, a) _mm256_dpwssd_epi32(acc, w, a)
#include "matmul_q_tile.inc"
#undef WICORE_TILE_NS
#undef WICORE_TILE_TARGET
#undef WICORE_TILE_DOT

#define WICORE_TILE_NS tile_avx2
#define WICORE_TILE_TARGET __attribute__((target("avx2,fma")))
#define WICORE_TILE_DOT(acc, w, a) _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
#include "matmul_q_tile.inc"
#undef WICORE_TILE_NS
#undef WICORE_TILE_TARGET
#undef WICORE_TILE_DOT

// QuantRow::a16 and starts from q, q2 and the lanes (kernels.h).
void Tiled(bool residual, QuantRow* row) {
  const int64_t k = static_cast<int64_t>(row->q.size());
  row->a16.resize(k);
  row->starts.resize(k / 4);
  for (int64_t l = 0; l < k / 4; ++l) {
    row->starts[l] = residual ? kResidualScale * row->lanes[l] + row->lanes2[l] : row->lanes[l];
    int16_t* half = row->a16.data() + (l / kLanes) * kBlock + 2 * (l % kLanes);
    for (int j = 0; j < 4; ++j) {
      const int64_t c = 4 * l + j;
      half[(j / 2) * 16 + j % 2] = static_cast<int16_t>(residual ? kResidualScale * row->q[c] + row->q2[c] : row->q[c]);
    }
  }
}

// Whether the tiles (matmul_q_tile.inc) run, which need QuantRow's int16 copy. On VNNI: 8-bit codes a prompt
// at a time (1.2-1.4x the row kernels at 512 rows); 4-bit ones stay on Dot4Group, which unpacks 8 rows'
// codes from one pointer and beat these ymm tiles (0.8x) on a Cascade Lake.
bool Tiles(const MatMulQArgs& args, MatMulQPath path) {
  return path == MatMulQPath::kAvx2 || (path == MatMulQPath::kVnni && args.m > 1);
}

}  // namespace

bool MatMulQHasVnni() { return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"); }

MatMulQPath MatMulQPathFor(const char* force) {
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string forced = force != nullptr ? force : "";
  if (forced == "scalar" || !avx2) return MatMulQPath::kScalar;
  if (forced == "avx2" || !MatMulQHasVnni()) return MatMulQPath::kAvx2;
  return MatMulQPath::kVnni;
}

void MatMulQQuantize(const MatMulQArgs& args, MatMulQPath path, std::vector<QuantRow>* out) {
  std::vector<QuantRow>& rows = *out;
  rows.resize(args.m);
  // the tiles' int16 copy, and the VNNI decode rows' for 4-bit codes with the residual (Dot4GroupPairs)
  const bool tiled = Tiles(args, path) || (path == MatMulQPath::kVnni && args.residual && args.bits == 4);
  const int zero_point = args.bits == 8 ? 128 : 8;
  for (int64_t i = 0; i < args.m; ++i) {
    Resize(args.k, args.block_size, args.residual, &rows[i]);
    if (path == MatMulQPath::kVnni) {
      QuantizeVnni(args.x + i * args.k, args.k, args.residual, &rows[i]);
      SumsVnni(args.k, zero_point, args.block_size, args.residual, tiled, &rows[i]);
      continue;
    }
    if (path == MatMulQPath::kAvx2) {  // always tiled (Tiles)
      QuantizeAvx2(args.x + i * args.k, args.k, args.residual, &rows[i]);
      SumsAvx2(args.k, zero_point, args.block_size, args.residual, &rows[i]);
      continue;
    }
    QuantizeScalar(args.x + i * args.k, args.k, args.residual, &rows[i]);
    Sums(args.k, zero_point, args.block_size, args.residual, &rows[i]);
    if (tiled) Tiled(args.residual, &rows[i]);
  }
}

void MatMulQCpu(const MatMulQArgs& args, const std::vector<QuantRow>& rows, int64_t row_begin, int64_t row_end,
                MatMulQPath path) {
  if (path == MatMulQPath::kVnni && Tiles(args, path) && args.bits == 4) {
    return (args.block_size == 16 ? Rows4Vnni<2> : Rows4Vnni<1>)(args, rows, row_begin, row_end);
  }
  if (path == MatMulQPath::kAvx2 && args.m == 1 && args.bits != 4) {  // a decode step's rows (matmul_q_avx2_rows.inc)
    return (args.block_size == 16 ? RowsAvx2<2> : RowsAvx2<1>)(args, rows[0], row_begin, row_end);
  }
  if (path == MatMulQPath::kAvx2 && args.m == 1) {  // 4 bits: a group of 8 rows a pass (matmul_q_avx2_rows4.inc)
    return (args.block_size == 16 ? Rows4Avx2<2> : Rows4Avx2<1>)(args, rows[0], row_begin, row_end);
  }
  if (args.bits == 5 || args.bits == 6) {  // only the VNNI and AVX2 rows read them (matmul_q_packed.cc widens them elsewhere)
    if (path != MatMulQPath::kVnni || Tiles(args, path)) std::abort();
  }
  if (path == MatMulQPath::kVnni && Tiles(args, path)) return tile_vnni::Rows(args, rows, row_begin, row_end);
  if (path == MatMulQPath::kAvx2) return tile_avx2::Rows(args, rows, row_begin, row_end);
  if (path == MatMulQPath::kVnni) {
    if (args.residual) {
      (args.block_size == 16 ? RowsVnni<2, true> : RowsVnni<1, true>)(args, rows, row_begin, row_end);
    } else {
      (args.block_size == 16 ? RowsVnni<2, false> : RowsVnni<1, false>)(args, rows, row_begin, row_end);
    }
    return;
  }
  for (int64_t n = row_begin; n < row_end; ++n) {
    const RowView w = View(args, n);
    for (int64_t i = 0; i < args.m; ++i) args.y[i * args.n + n] = DotScalar(rows[i], w, args.bits, args.block_size, args.k);
  }
}

}  // namespace wicore
