// What the attention kernels share (attention.cu: decode; attention_prefill.cu: prefill chunks and
// BlockAttentionQKV's prologue kernel): the block shape, which keys a query sees, where a key lies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

namespace wicore {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxKeys = 1024;  // keys of one split (its scores live in shared memory)

struct Visible {
  int64_t lo, hi;
};

// The row's tokens in the cache after the step: given (BlockAttention), or past + seq (BlockAttentionQKV).
__device__ inline int64_t ContextLen(const BlockAttentionCudaArgs& a, int64_t row) {
  return a.context_lens != nullptr ? a.context_lens[row] : a.past_seqlens[row] + a.seq;
}

__device__ inline Visible VisibleKeys(const BlockAttentionCudaArgs& a, int64_t token, int64_t first) {
  const int64_t row = token / a.seq, p = a.positions[token];
  int64_t lo = a.window > 0 ? p - a.window + 1 : 0;
  lo = lo > first ? lo : first;
  const int64_t len = ContextLen(a, row);
  int64_t hi = p + 1 < len ? p + 1 : len;
  const int64_t end = first + a.max_blocks * a.block_size;
  hi = hi < end ? hi : end;
  return {lo, hi};
}

// The pool row (block * block_size + offset) of logical key `key` of `row`.
__device__ inline int64_t Slot(const BlockAttentionCudaArgs& a, int64_t row, int64_t first, int64_t key) {
  const int64_t idx = key - first;
  return a.block_tables[row * a.max_blocks + idx / a.block_size] * a.block_size + idx % a.block_size;
}

__device__ inline void Load8(const uint16_t* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ inline float Half(uint16_t v) { return __half2float(__ushort_as_half(v)); }
__device__ inline uint16_t ToHalf(float v) { return __half_as_ushort(__float2half(v)); }

__device__ inline float Softcap(const BlockAttentionCudaArgs& a, float s) { return a.softcap > 0.0f ? a.softcap * tanhf(s / a.softcap) : s; }


// Prefill chunks (seq > 1), attention_prefill.cu: BlockAttentionQKV's prologue first where qkv is given
// (q into `workspace`, BlockAttentionCudaWorkspace's bytes), then one block a (token, query head).
int LaunchPrefill(const BlockAttentionCudaArgs& a, void* workspace, cudaStream_t stream);

}  // namespace wicore
