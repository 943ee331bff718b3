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

// Eight float16 values of one 16-byte load as floats.
__device__ inline void Unpack8(const uint4& raw, float* out) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ inline void Load8(const uint16_t* p, float* out) { Unpack8(*reinterpret_cast<const uint4*>(p), out); }

__device__ inline float Half(uint16_t v) { return __half2float(__ushort_as_half(v)); }
__device__ inline uint16_t ToHalf(float v) { return __half_as_ushort(__float2half(v)); }

__device__ inline float Softcap(const BlockAttentionCudaArgs& a, float s) { return a.softcap > 0.0f ? a.softcap * tanhf(s / a.softcap) : s; }

// BlockAttentionQKV's prologue for the pair (d, d + h) of one head's dimensions, h = head_dim / 2 (both
// prologues use it: the decode kernel's, attention.cu, and the prefill chunks' PrologueKernel,
// attention_prefill.cu, so they cannot drift apart): times the head's 1 / rms `inv` and the norm weight
// `w` (null: none), then rotated at position `pos` by the op's cos / sin caches (null: no RoPE).
__device__ inline float2 NormRotate(const BlockAttentionCudaArgs& a, const uint16_t* w, float inv, int64_t pos, int64_t d,
                                    int64_t h, float x1, float x2) {
  x1 *= inv;
  x2 *= inv;
  if (w != nullptr) {
    x1 *= Half(w[d]);
    x2 *= Half(w[d + h]);
  }
  if (a.cos == nullptr) return make_float2(x1, x2);
  const float c = Half(a.cos[pos * h + d]), s = Half(a.sin[pos * h + d]);
  return make_float2(x1 * c - x2 * s, x2 * c + x1 * s);
}


// Prefill chunks (seq > 1), attention_prefill.cu. BlockAttentionQKV's prologue kernel (qkv given): the tokens'
// q normed, rotated and scaled into `workspace` (BlockAttentionCudaWorkspace's bytes; returned), their k and v
// into the pools. LaunchPrefill: that prologue where qkv is given, then one block a (token, query head) over
// any span of keys (where the tiles below cannot run; attention.cu takes chunks whose keys one split holds to
// its decode kernel instead).
const uint16_t* LaunchPrologue(const BlockAttentionCudaArgs& a, void* workspace, cudaStream_t stream);
int LaunchPrefill(const BlockAttentionCudaArgs& a, void* workspace, cudaStream_t stream);

// Prefill chunks on tensor cores (attention_tiles.cu): q ready in a.q (BlockAttentionQKV: after LaunchPrologue),
// any span of keys. FlashTilesFit: whether this device gives a block the shared memory the head dim's tiles take.
bool FlashTilesFit(int64_t head_dim);
int LaunchFlashTiles(const BlockAttentionCudaArgs& a, cudaStream_t stream);

}  // namespace wicore
