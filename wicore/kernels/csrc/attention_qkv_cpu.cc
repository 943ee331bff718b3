// BlockAttentionQKV's prologue on the CPU (kernels.h), float32: what the graph ops before BlockAttention
// did (Split, the per-head q / k RMSNorms, RotaryEmbedding, q times the scale, ScatterND of k and v).
//
//   qkv row of a token: [ q heads (nh x hd) | k heads (kvh x hd) | v heads (kvh x hd) ]
//     q head: rms(x) * q_norm, rotated at the token's position, times scale  ──► q [token, nh, hd]
//     k head: rms(x) * k_norm, rotated                                       ──► k_pool[slot]
//     v head: as it is                                                       ──► v_pool[slot]
//
// rms(x) = x / sqrt(mean(x^2) + epsilon); rotate-half RoPE: for d < hd / 2, with c = cos[pos, d] and
// s = sin[pos, d], x[d] -> x[d] c - x[d + hd/2] s and x[d + hd/2] -> x[d + hd/2] c + x[d] s.
#include <cmath>
#include <vector>

#include "kernels.h"

namespace wicore {
namespace {

// One head of hd values, normed (weight not null) and rotated (cos not null), times `scale`, into out.
void Head(const float* x, const float* weight, const float* cos, const float* sin, int64_t hd, float epsilon, float scale,
          float* out) {
  float inv = 1.0f;
  if (weight != nullptr) {
    float ss = 0.0f;
    for (int64_t d = 0; d < hd; ++d) ss += x[d] * x[d];
    inv = 1.0f / std::sqrt(ss / static_cast<float>(hd) + epsilon);
  }
  std::vector<float> y(static_cast<size_t>(hd));
  for (int64_t d = 0; d < hd; ++d) y[d] = weight != nullptr ? x[d] * inv * weight[d] : x[d];
  const int64_t half = hd / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float a = y[d], b = y[d + half];
    const float c = cos != nullptr ? cos[d] : 1.0f, s = cos != nullptr ? sin[d] : 0.0f;
    out[d] = (a * c - b * s) * scale;
    out[d + half] = (b * c + a * s) * scale;
  }
}

}  // namespace

void BlockAttentionQKVPrologueCpu(const QKVPrologueArgs& a, float* q, float* k_pool, float* v_pool) {
  const int64_t hd = a.head_dim, half = hd / 2, width = (a.num_heads + 2 * a.num_kv_heads) * hd;
  const int64_t kv_row = a.num_kv_heads * hd;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* row = a.qkv + t * width;
    const float* cos = a.cos != nullptr ? a.cos + a.positions[t] * half : nullptr;
    const float* sin = a.cos != nullptr ? a.sin + a.positions[t] * half : nullptr;
    for (int64_t h = 0; h < a.num_heads; ++h) {
      Head(row + h * hd, a.q_norm, cos, sin, hd, a.epsilon, a.scale, q + (t * a.num_heads + h) * hd);
    }
    const float* k = row + a.num_heads * hd;
    const float* v = k + kv_row;
    float* k_out = k_pool + a.slot_mapping[t] * kv_row;
    float* v_out = v_pool + a.slot_mapping[t] * kv_row;
    for (int64_t h = 0; h < a.num_kv_heads; ++h) Head(k + h * hd, a.k_norm, cos, sin, hd, a.epsilon, 1.0f, k_out + h * hd);
    for (int64_t i = 0; i < kv_row; ++i) v_out[i] = v[i];
  }
}

}  // namespace wicore
