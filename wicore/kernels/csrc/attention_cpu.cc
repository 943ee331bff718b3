// CPU kernels of kernels.h for the float32 graphs (ort-quant --kernels wicore): the attention over the
// paged KV pools where they lie, and the gated activation.
//
// One task is one (row, KV head, up to 16 of the row's tokens): a decode token reads each key and value
// row once for its `groups` query heads; a prefill chunk gathers the keys its tokens see once (keys
// transposed, 8 a vector per query) and its values in rows.
//
//   logical block i of the row ── block_tables[row, i] ──► pool block ──► keys at positions
//   (first_block + i) * block_size + offset, visible to a query at position p when
//       key <= p,  key < context_len,  key > p - window (window > 0)
//
//   scores = q · k (q carries the attention scale), softcap * tanh(scores / softcap) where set,
//   softmax over the visible keys (float32, max subtracted), out = Σ probs v.
// A query that sees no key gets zeros; a key whose score is 80 or more below the top one gets weight 0
// (exp(-80) < 2e-35 of the top key's).
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "kernels.h"

namespace wicore {
namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums: vectorizable, a fixed order
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[d + u] * b[d + u];
  }
  for (; d < n; ++d) acc[d % 8] += a[d] * b[d];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

constexpr float kMinExponent = -80.0f;  // exp(-80) ~ 1.8e-35: weights below it are 0

void Axpy(float w, const float* v, float* out, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] += w * v[d];
}

#define WICORE_AVX2 __attribute__((target("avx2,fma")))

// n a multiple of 8: two 8-lane accumulators, summed in a fixed order.
WICORE_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  if (d < n) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  const __m256 sum = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of up to kQueries queries (q [nq][hd]) against keys [j_begin, j_end) (a multiple of 8 apart)
// of a transposed key buffer kt [hd][stride], into out [nq][stride] (the prefill path without AVX2).
constexpr int kQueries = 4;

void ScoresT(const float* q, int nq, const float* kt, int64_t stride, int64_t hd, int64_t j_begin, int64_t j_end, float* out) {
  for (int i = 0; i < nq; ++i) {
    for (int64_t j = j_begin; j < j_end; ++j) {
      float acc = 0.0f;
      for (int64_t d = 0; d < hd; ++d) acc += q[i * hd + d] * kt[d * stride + j];
      out[i * stride + j] = acc;
    }
  }
}

// out[hd] = scale Σ_j p[j] v_j, out zeros before; v_j = v + rows[j] (the pool's rows: decode) or, rows
// null, v + j * hd (a gathered copy: prefill).
void Context(const float* p, const float* v, const int64_t* rows, int64_t n, int64_t hd, float scale, float* out) {
  for (int64_t j = 0; j < n; ++j) Axpy(p[j] * scale, v + (rows != nullptr ? rows[j] : j * hd), out, hd);
}

// hd a multiple of 8: 64 columns at a time held in 8 accumulators over all n rows.
WICORE_AVX2 void ContextAvx2(const float* p, const float* v, const int64_t* rows, int64_t n, int64_t hd, float scale,
                             float* out) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t c = 0;
  for (; c + 64 <= hd; c += 64) {
    __m256 acc[8];  // registers: the loops over i unrolled
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m256 w = _mm256_set1_ps(p[j]);
      const float* row = v + (rows != nullptr ? rows[j] : j * hd) + c;
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * i), acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, _mm256_mul_ps(acc[i], vscale));
  }
  for (; c < hd; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (rows != nullptr ? rows[j] : j * hd) + c), acc);
    }
    _mm256_storeu_ps(out + c, _mm256_mul_ps(acc, vscale));
  }
}

struct VectorOps {
  float (*dot)(const float*, const float*, int64_t);
  void (*context)(const float*, const float*, const int64_t*, int64_t, int64_t, float, float*);
  bool avx2;
};

constexpr int64_t kChunk = 16;  // a task's tokens (prefill): they share one gathered copy of the keys and values

struct Keys {
  int64_t lo, hi;  // the logical key positions [lo, hi) a token sees
};

Keys Visible(const BlockAttentionArgs& a, int64_t token, int64_t first) {
  const int64_t row = token / a.seq, p = a.positions[token];
  const int64_t lo = std::max<int64_t>(first, a.window > 0 ? p - a.window + 1 : 0);
  const int64_t hi = std::min({p + 1, a.context_lens[row], first + a.max_blocks * a.block_size});
  return {lo, hi};
}

// exp(x) of 8 lanes, x <= 0 (Cephes' expf: 2^n e^r, r in [-ln2/2, ln2/2], a degree-5 polynomial; ~1 ulp).
WICORE_AVX2 __m256 ExpAvx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The weights of s - top where above kMinExponent (else 0), in place; returns their sum (8 lanes, then the tail).
WICORE_AVX2 float ExpWeightsAvx2(float* s, int64_t n, float top) {
  const __m256 vtop = _mm256_set1_ps(top), floor = _mm256_set1_ps(kMinExponent);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), vtop);
    const __m256 w = _mm256_and_ps(ExpAvx2(x), _mm256_cmp_ps(x, floor, _CMP_GT_OQ));
    _mm256_storeu_ps(s + j, w);
    sum = _mm256_add_ps(sum, w);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (; j < n; ++j) {
    const float x = s[j] - top;
    s[j] = x > kMinExponent ? std::exp(x) : 0.0f;
    total += s[j];
  }
  return total;
}

float ExpWeights(float* s, int64_t n, float top) {
  float total = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j] - top;
    s[j] = x > kMinExponent ? std::exp(x) : 0.0f;  // no subnormal weights (slow, and below float32's 2^-126 anyway)
    total += s[j];
  }
  return total;
}

WICORE_AVX2 float MaxAvx2(const float* s, int64_t n) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float m = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// s[0, n) -> exp(softcap(s) - max) in place (the softmax before its division); returns 1 / their sum.
float SoftmaxWeights(const BlockAttentionArgs& a, bool avx2, float* s, int64_t n) {
  if (a.softcap > 0.0f) {
    for (int64_t j = 0; j < n; ++j) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
  }
  if (avx2) return 1.0f / ExpWeightsAvx2(s, n, MaxAvx2(s, n));
  return 1.0f / ExpWeights(s, n, *std::max_element(s, s + n));
}

struct Scratch {
  std::vector<float> scores, kt, v;
  std::vector<int64_t> rows;  // each key's offset into the pools
};

// The pool offsets of logical keys [lo, hi) of the row (KV head h's slice), a block at a time.
void KeyRows(const BlockAttentionArgs& a, int64_t row, int64_t first, int64_t h, Keys keys, std::vector<int64_t>* rows) {
  const int64_t bs = a.block_size, n = keys.hi - keys.lo, row_stride = a.num_kv_heads * a.head_dim;
  const int64_t* table = a.block_tables + row * a.max_blocks;
  rows->resize(static_cast<size_t>(n));
  for (int64_t key = keys.lo - first, j = 0; j < n;) {
    const int64_t offset = key % bs;
    const int64_t base = (table[key / bs] * bs + offset) * row_stride + h * a.head_dim;
    for (int64_t o = 0; o < bs - offset && j < n; ++o, ++j, ++key) (*rows)[j] = base + o * row_stride;
  }
}

// One token (decode): each key row read once for the group's query heads.
void TokenTask(const BlockAttentionArgs& a, const VectorOps& ops, int64_t token, int64_t h, int64_t first, Scratch* w) {
  const int64_t groups = a.num_heads / a.num_kv_heads, hd = a.head_dim;
  const Keys keys = Visible(a, token, first);
  if (keys.lo >= keys.hi) return;
  const int64_t n = keys.hi - keys.lo;
  const float* q = a.q + (token * a.num_heads + h * groups) * hd;
  float* out = a.out + (token * a.num_heads + h * groups) * hd;
  KeyRows(a, token / a.seq, first, h, keys, &w->rows);
  w->scores.resize(static_cast<size_t>(groups * n));
  for (int64_t j = 0; j < n; ++j) {
    const float* k = a.k_pool + w->rows[j];
    for (int64_t g = 0; g < groups; ++g) w->scores[g * n + j] = ops.dot(q + g * hd, k, hd);
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* p = w->scores.data() + g * n;
    ops.context(p, a.v_pool, w->rows.data(), n, hd, SoftmaxWeights(a, ops.avx2, p, n), out + g * hd);
  }
}

#include "attention_chunk_cpu.inc"

// Tokens [t_begin, t_end) of a row (prefill): the keys any of them sees gathered once, transposed (kt
// [hd][stride]) and the values in rows, then 8 keys a vector per query.
void ChunkTask(const BlockAttentionArgs& a, const VectorOps& ops, int64_t t_begin, int64_t t_end, int64_t h, int64_t first,
               Scratch* w) {
  const int64_t groups = a.num_heads / a.num_kv_heads, hd = a.head_dim;
  Keys all{INT64_MAX, INT64_MIN};
  for (int64_t t = t_begin; t < t_end; ++t) {
    const Keys k = Visible(a, t, first);
    if (k.lo < k.hi) all = {std::min(all.lo, k.lo), std::max(all.hi, k.hi)};
  }
  if (all.lo >= all.hi) return;
  const int64_t n = all.hi - all.lo, stride = (n + 7) / 8 * 8;
  KeyRows(a, t_begin / a.seq, first, h, all, &w->rows);
  w->kt.assign(static_cast<size_t>(hd * stride), 0.0f);
  w->v.resize(static_cast<size_t>(n * hd));
  for (int64_t j = 0; j < n; ++j) {
    const float* k = a.k_pool + w->rows[j];
    for (int64_t d = 0; d < hd; ++d) w->kt[d * stride + j] = k[d];
    std::copy(a.v_pool + w->rows[j], a.v_pool + w->rows[j] + hd, w->v.data() + j * hd);
  }
  if (ops.avx2) return ChunkQueriesAvx2(a, t_begin, t_end, h, first, all, stride, w);
  w->scores.resize(static_cast<size_t>(kQueries * stride));
  for (int64_t t = t_begin; t < t_end; ++t) {
    const Keys k = Visible(a, t, first);
    if (k.lo >= k.hi) continue;
    const int64_t lo = k.lo - all.lo, hi = k.hi - all.lo;
    const int64_t j_begin = lo / 8 * 8, j_end = std::min(stride, (hi + 7) / 8 * 8);
    for (int64_t g0 = 0; g0 < groups; g0 += kQueries) {  // the token's query heads share the keys it sees
      const int nq = static_cast<int>(std::min<int64_t>(kQueries, groups - g0));
      const float* q = a.q + (t * a.num_heads + h * groups + g0) * hd;
      ScoresT(q, nq, w->kt.data(), stride, hd, j_begin, j_end, w->scores.data());
      for (int i = 0; i < nq; ++i) {
        float* s = w->scores.data() + i * stride + lo;
        const float inv = SoftmaxWeights(a, ops.avx2, s, hi - lo);
        ops.context(s, w->v.data() + lo * hd, nullptr, hi - lo, hd, inv, a.out + (t * a.num_heads + h * groups + g0 + i) * hd);
      }
    }
  }
}

}  // namespace

bool BlockAttentionHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

bool BlockAttentionHasAvx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"); }

int64_t BlockAttentionTasks(const BlockAttentionArgs& a) { return a.batch * ((a.seq + kChunk - 1) / kChunk) * a.num_kv_heads; }

void BlockAttentionCpu(const BlockAttentionArgs& a, int64_t task_begin, int64_t task_end) {
  const bool avx2 = a.avx2 && a.head_dim % 8 == 0;
  const VectorOps ops = avx2 ? VectorOps{&DotAvx2, &ContextAvx2, true}
                              : VectorOps{&Dot, &Context, false};
  const int64_t groups = a.num_heads / a.num_kv_heads, hd = a.head_dim;
  const int64_t chunks = (a.seq + kChunk - 1) / kChunk;
  Scratch scratch;
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t h = task % a.num_kv_heads, chunk = task / a.num_kv_heads % chunks, row = task / (a.num_kv_heads * chunks);
    const int64_t t_begin = row * a.seq + chunk * kChunk, t_end = std::min(t_begin + kChunk, (row + 1) * a.seq);
    for (int64_t t = t_begin; t < t_end; ++t) {
      float* out = a.out + (t * a.num_heads + h * groups) * hd;
      std::fill(out, out + groups * hd, 0.0f);
    }
    const int64_t first = a.first_block != nullptr ? a.first_block[row] * a.block_size : 0;  // the table's first key
    if (t_end - t_begin == 1) {
      TokenTask(a, ops, t_begin, h, first, &scratch);
    } else {
      ChunkTask(a, ops, t_begin, t_end, h, first, &scratch);
    }
  }
}

namespace {
float Clamp80(float z) { return std::min(80.0f, std::max(-80.0f, z)); }
}  // namespace

void GatedActivationF32Cpu(const float* gate_up, Activation act, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * inter;
    const float* up = gate + inter;
    float* o = out + r * inter;
    // exp's argument clamped to [-80, 80]: no subnormal result (slow), and the result the same to float32's
    // precision (1 + e^-80 is 1; v / (1 + e^80) is below 2e-35 |v| either way)
    if (act == Activation::kSilu) {
      for (int64_t j = 0; j < inter; ++j) o[j] = gate[j] / (1.0f + std::exp(Clamp80(-gate[j]))) * up[j];
    } else {
      // 0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)), u = k (v + 0.044715 v^3): one exp, ~5x faster than tanh
      const float k2 = 2.0f * 0.7978845608028654f;
      for (int64_t j = 0; j < inter; ++j) {
        const float v = gate[j];
        o[j] = v / (1.0f + std::exp(Clamp80(-k2 * (v + 0.044715f * v * v * v)))) * up[j];
      }
    }
  }
}

}  // namespace wicore
