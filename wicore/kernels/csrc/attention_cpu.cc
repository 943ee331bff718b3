// CPU kernels of kernels.h for the float32 graphs (ort-quant --kernels wicore): the attention over the
// paged KV pools where they lie, and the gated activation.
//
// One task is one (row, token, KV head): its `groups` query heads share each key and value row read.
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

WICORE_AVX2 void AxpyAvx2(float w, const float* v, float* out, int64_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  for (int64_t d = 0; d < n; d += 8) _mm256_storeu_ps(out + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
}

struct VectorOps {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float*, float*, int64_t);
};

}  // namespace

bool BlockAttentionHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

void BlockAttentionCpu(const BlockAttentionArgs& a, int64_t task_begin, int64_t task_end) {
  const bool avx2 = a.avx2 && a.head_dim % 8 == 0;
  const VectorOps ops = avx2 ? VectorOps{&DotAvx2, &AxpyAvx2} : VectorOps{&Dot, &Axpy};
  const int64_t groups = a.num_heads / a.num_kv_heads, hd = a.head_dim, bs = a.block_size;
  const int64_t row_stride = a.num_kv_heads * hd;  // one token of a pool block
  std::vector<float> scores;
  std::vector<int64_t> rows;  // each visible key's offset into the pools
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t h = task % a.num_kv_heads, token = task / a.num_kv_heads;  // token = row * seq + t
    const int64_t row = token / a.seq;
    const int64_t p = a.positions[token];
    const int64_t first = a.first_block != nullptr ? a.first_block[row] * bs : 0;  // the table's first key
    int64_t lo = std::max<int64_t>(first, a.window > 0 ? p - a.window + 1 : 0);
    const int64_t hi = std::min({p + 1, a.context_lens[row], first + a.max_blocks * bs});  // keys [lo, hi)
    const float* q = a.q + (token * a.num_heads + h * groups) * hd;
    float* out = a.out + (token * a.num_heads + h * groups) * hd;
    std::fill(out, out + groups * hd, 0.0f);
    if (lo >= hi) continue;
    const int64_t n = hi - lo;
    scores.assign(static_cast<size_t>(groups * n), 0.0f);
    rows.resize(static_cast<size_t>(n));
    const int64_t* table = a.block_tables + row * a.max_blocks;
    for (int64_t key = lo - first, j = 0; j < n;) {  // each key's pool row (h's slice), a block at a time
      const int64_t offset = key % bs;
      const int64_t base = (table[key / bs] * bs + offset) * row_stride + h * hd;
      for (int64_t o = 0; o < bs - offset && j < n; ++o, ++j, ++key) rows[j] = base + o * row_stride;
    }
    for (int64_t j = 0; j < n; ++j) {  // scores [groups, n]
      const float* k = a.k_pool + rows[j];
      for (int64_t g = 0; g < groups; ++g) {
        float s = ops.dot(q + g * hd, k, hd);
        if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
        scores[g * n + j] = s;
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      float* s = scores.data() + g * n;
      const float top = *std::max_element(s, s + n);
      float total = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float x = s[j] - top;
        s[j] = x > kMinExponent ? std::exp(x) : 0.0f;  // no subnormal weights (slow, and below float32's 2^-126 anyway)
        total += s[j];
      }
      const float inv = 1.0f / total;
      for (int64_t j = 0; j < n; ++j) s[j] *= inv;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* v = a.v_pool + rows[j];
      for (int64_t g = 0; g < groups; ++g) ops.axpy(scores[g * n + j], v, out + g * hd, hd);
    }
  }
}

void GatedActivationF32Cpu(const float* gate_up, Activation act, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * inter;
    const float* up = gate + inter;
    float* o = out + r * inter;
    if (act == Activation::kSilu) {
      for (int64_t j = 0; j < inter; ++j) o[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
    } else {
      const float k = 0.7978845608028654f;
      for (int64_t j = 0; j < inter; ++j) {
        const float v = gate[j];
        o[j] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v))) * up[j];
      }
    }
  }
}

}  // namespace wicore
