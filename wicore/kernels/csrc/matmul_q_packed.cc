// MatMulQ's narrow weight forms (wicore/graph/matmul_q.py packs them): 5- and 6-bit codes, and block scales
// and offsets in float16 or as a float16 a super-block times an int8 a block (MatMulQPacked). A decode step
// reads the GGUF's own widths; the kernels of matmul_q_cpu.cc and matmul_q_float.cc still see what they
// always did, made per task (64 weight rows, in this thread's buffers, which stay in cache):
//
//   narrow scales / offsets ──► float32, the task's rows, in MatMulQArgs' layout     (all but the one-row kernels
//                                                                                    that read them in place)
//   5- / 6-bit codes       ──► 8-bit codes (code + 128), the task's rows           (all but the VNNI and AVX2 rows
//                                                                                    at m == 1: DotRows, DotRowsAvx2
//                                                                                    unpack them)
//
// The values are exactly the wide forms' (kernels.h, MatMulQPacked), so every path keeps its bits
// (tests/kernels/test_matmul_q.py compares each narrow form with its wide one).
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "kernels.h"

namespace wicore {
namespace {

constexpr int64_t kBlock = 32;
constexpr int kGroup = 8;  // 4-bit rows interleaved (kernels.h)

#define WICORE_F16C __attribute__((target("avx2,fma,f16c")))

// A float16's value, exactly (no F16C: the scalar path runs on any x86-64).
float Half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// The scales' layout: which flat indices rows [begin, end) own, and each index's super-block.
struct Layout {
  bool grouped;  // 4 bits: [n / 8, blocks, 8], else [n, blocks]
  int64_t num_blocks, num_supers, blocks_per_super;

  int64_t First(int64_t row) const { return grouped ? (row / kGroup) * num_blocks * kGroup : row * num_blocks; }
  int64_t Last(int64_t row_end) const { return grouped ? (row_end + kGroup - 1) / kGroup * num_blocks * kGroup : row_end * num_blocks; }
  int64_t Super(int64_t i) const {
    if (!grouped) return (i / num_blocks) * num_supers + (i % num_blocks) / blocks_per_super;
    const int64_t g = i / (num_blocks * kGroup), b = (i / kGroup) % num_blocks;
    return (g * num_supers + b / blocks_per_super) * kGroup + i % kGroup;
  }
};

float ScaleAt(const MatMulQPacked& p, const Layout& l, int64_t i) {
  return p.scale_ints != nullptr ? Half(p.scales16[l.Super(i)]) * static_cast<float>(p.scale_ints[i]) : Half(p.scales16[i]);
}

float MinAt(const MatMulQPacked& p, const Layout& l, int64_t i) {
  return p.min_ints != nullptr ? Half(p.mins16[l.Super(i)]) * static_cast<float>(p.min_ints[i]) : Half(p.mins16[i]);
}

// out[i - lo] for i in [lo, hi) (whole rows, or whole groups of 8 rows): half(h[i]), or with ints
// half(h[super(i)]) * ints[i]; where `scales` is given, offset_scale * scales[i - lo] + that. Eight indices a
// step: one block's 8 rows (grouped: their supers 8 in a row too) or 8 blocks of a row (row-major, one super:
// blocks_per_super and the row's blocks multiples of 8), walked without divisions.
WICORE_F16C inline __m256 Eight(const uint16_t* h, const int8_t* ints, int64_t i, int64_t super, bool broadcast, float c,
                                const float* scales) {
  __m256 v;
  if (ints == nullptr) {
    v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
  } else {
    const __m256 t = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ints + i))));
    const __m256 s = broadcast ? _mm256_set1_ps(_cvtsh_ss(h[super])) : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + super)));
    v = _mm256_mul_ps(s, t);
  }
  return scales != nullptr ? _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c), _mm256_loadu_ps(scales)), v) : v;
}

WICORE_F16C void ConvertF16c(const uint16_t* h, const int8_t* ints, const Layout& l, float c, const float* scales, int64_t lo,
                             int64_t hi, float* out) {
  const int64_t nb = l.num_blocks, ns = l.num_supers, bps = l.blocks_per_super;
  if (ints == nullptr) {  // contiguous halves
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) _mm256_storeu_ps(out + i - lo, Eight(h, nullptr, i, 0, false, c, scales ? scales + i - lo : nullptr));
    for (; i < hi; ++i) out[i - lo] = scales != nullptr ? c * scales[i - lo] + _cvtsh_ss(h[i]) : _cvtsh_ss(h[i]);
    return;
  }
  if (l.grouped) {  // [groups, nb, 8]: supers [groups, ns, 8]
    for (int64_t g = lo / (nb * kGroup); g < hi / (nb * kGroup); ++g) {
      for (int64_t b0 = 0, super = g * ns; b0 < nb; b0 += bps, ++super) {
        for (int64_t b = b0; b < b0 + bps; ++b) {
          const int64_t i = (g * nb + b) * kGroup;
          _mm256_storeu_ps(out + i - lo, Eight(h, ints, i, super * kGroup, false, c, scales ? scales + i - lo : nullptr));
        }
      }
    }
    return;
  }
  for (int64_t n = lo / nb; n < hi / nb; ++n) {  // [n, nb]: supers [n, ns]
    int64_t b = 0;
    if (bps % 8 == 0 && nb % 8 == 0) {
      for (int64_t super = n * ns; b < nb; ++super) {
        for (const int64_t stop = b + bps; b < stop; b += 8) {
          const int64_t i = n * nb + b;
          _mm256_storeu_ps(out + i - lo, Eight(h, ints, i, super, true, c, scales ? scales + i - lo : nullptr));
        }
      }
    }
    for (; b < nb; ++b) {
      const int64_t i = n * nb + b;
      const float v = _cvtsh_ss(h[n * ns + b / bps]) * static_cast<float>(ints[i]);
      out[i - lo] = scales != nullptr ? c * scales[i - lo] + v : v;
    }
  }
}

// ConvertF16c's values, portably.
void ConvertScalar(const MatMulQPacked& p, const Layout& l, bool offsets, const float* scales, int64_t lo, int64_t hi, float* out) {
  for (int64_t i = lo; i < hi; ++i) {
    out[i - lo] = !offsets ? ScaleAt(p, l, i) : p.offset_scale != 0.f ? p.offset_scale * scales[i - lo] + MinAt(p, l, i) : MinAt(p, l, i);
  }
}

// 5 or 6 bits -> code + 128, one row's 32-column block (kernels.h's layout).
void Expand56Scalar(const uint8_t* c, int high, int bias, uint8_t* out) {
  for (int j = 0; j < kBlock; ++j) {
    const int low = j < 16 ? c[j] & 0x0F : c[j - 16] >> 4;
    const int bytes = 4 * high;  // byte j % bytes, field j / bytes
    const int hi = (c[16 + j % bytes] >> (high * (j / bytes))) & ((1 << high) - 1);
    out[j] = static_cast<uint8_t>(low + (hi << 4) + bias);
  }
}

WICORE_F16C void Expand56Avx2(const uint8_t* c, int high, int bias_value, uint8_t* out) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(bias_value));
  __m256i hi;
  if (high == 1) {
    int32_t word;
    std::memcpy(&word, c + 16, 4);
    hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), _mm256_set1_epi8(1));
  } else {
    int64_t word;
    std::memcpy(&word, c + 16, 8);
    hi = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(word), _mm256_setr_epi64x(0, 2, 4, 6)), _mm256_set1_epi8(3));
  }
  const __m256i u = _mm256_add_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(hi, 4)), bias);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), u);
}

void Expand56(const MatMulQArgs& args, int64_t begin, int64_t end, bool simd, uint8_t* out) {
  const int high = args.bits - 4;
  const int64_t block_bytes = 16 + 4 * high, blocks = args.k / kBlock;
  const int bias = 128 - args.zero_point;
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* row = args.weight + n * blocks * block_bytes;
    uint8_t* dst = out + (n - begin) * args.k;
    if (simd) {
      for (int64_t bl = 0; bl < blocks; ++bl) Expand56Avx2(row + bl * block_bytes, high, bias, dst + bl * kBlock);
    } else {
      for (int64_t bl = 0; bl < blocks; ++bl) Expand56Scalar(row + bl * block_bytes, high, bias, dst + bl * kBlock);
    }
  }
}

struct Scratch {
  std::vector<float> scales, offsets;
  std::vector<uint8_t> codes;
};

}  // namespace

MatMulQArgs MatMulQQuantizeArgs(const MatMulQArgs& args) {
  MatMulQArgs out = args;
  if (args.bits == 5 || args.bits == 6) out.bits = 8;  // the rows' lanes start at -128 x their sums, as 8 bits'
  return out;
}

void MatMulQTask(const MatMulQArgs& args, const MatMulQPacked& packed, const std::vector<QuantRow>* rows, int64_t row_begin,
                 int64_t row_end, MatMulQPath path, const MatMulQInt8Rows* int8) {
  thread_local Scratch scratch;
  MatMulQArgs task = args;
  const Layout layout{args.bits == 4, args.k / args.block_size,
                      packed.blocks_per_super > 0 ? args.k / args.block_size / packed.blocks_per_super : 0,
                      packed.blocks_per_super > 0 ? packed.blocks_per_super : 1};
  const int64_t lo = layout.First(row_begin), hi = layout.Last(row_end);
  const bool simd = path != MatMulQPath::kScalar;
  // The VNNI rows (matmul_q_cpu.cc) read narrow scales in place: Dot4Group scales and offsets, DotRows scales
  // (where the offsets are not narrow too)
  const bool native = rows != nullptr && path == MatMulQPath::kVnni && args.m == 1;
  // and the AVX2 decode rows (matmul_q_avx2_rows.inc) 8-, 5- and 6-bit codes' narrow scales, and unpack 5 / 6 bits
  const bool avx2_rows = rows != nullptr && path == MatMulQPath::kAvx2 && args.m == 1 && args.bits != 4;
  const bool in_place = (native && (args.bits == 4 ? packed.scales16 != nullptr || packed.mins16 != nullptr
                                                   : packed.scales16 != nullptr && packed.mins16 == nullptr)) ||
                        (avx2_rows && packed.scales16 != nullptr && packed.mins16 == nullptr);
  if (in_place) {
    task.packed = &packed;
    return MatMulQCpu(task, *rows, row_begin, row_end, path);
  }
  // The kernels index the scales and codes by the whole tensor's rows: each view starts `lo` (or the task's
  // first row) before this task's buffer, and only the task's own part is read.
  if (packed.scales16 != nullptr) {
    scratch.scales.resize(hi - lo);
    if (simd) {
      ConvertF16c(packed.scales16, packed.scale_ints, layout, 0.f, nullptr, lo, hi, scratch.scales.data());
    } else {
      ConvertScalar(packed, layout, false, nullptr, lo, hi, scratch.scales.data());
    }
    task.scales = scratch.scales.data() - lo;
  }
  if (packed.mins16 != nullptr) {
    scratch.offsets.resize(hi - lo);
    const float* scales = task.scales + lo;
    if (simd) {
      ConvertF16c(packed.mins16, packed.min_ints, layout, packed.offset_scale, packed.offset_scale != 0.f ? scales : nullptr, lo,
                  hi, scratch.offsets.data());
    } else {
      ConvertScalar(packed, layout, true, scales, lo, hi, scratch.offsets.data());
    }
    task.offsets = scratch.offsets.data() - lo;
  }
  if ((args.bits == 5 || args.bits == 6) && !native && !avx2_rows) {  // else DotRows / DotRowsAvx2 unpack them
    scratch.codes.resize((row_end - row_begin) * args.k);
    Expand56(args, row_begin, row_end, simd, scratch.codes.data());
    task.weight = scratch.codes.data() - row_begin * args.k;
    task.bits = 8;
  }
  if (int8 != nullptr) return MatMulQInt8Cpu(task, *int8, row_begin, row_end);
  if (rows == nullptr) return MatMulQFloatCpu(task, row_begin, row_end, path);
  MatMulQCpu(task, *rows, row_begin, row_end, path);
}

}  // namespace wicore
