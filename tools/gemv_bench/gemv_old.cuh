// The GEMV of wicore.MatMulQ16 as branch s48-q32 left it (commit 7f23942, wicore/kernels/csrc/matmul_q16.cu),
// kept verbatim here as the baseline the benchmark times the new kernel against.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace old_gemv {

constexpr int kWarps = 4;        // Gemv: warps a block
constexpr int kWarpRows = 4;     // Gemv: weight rows a warp
constexpr float kMagic = 8388608.0f;  // 2^23: (0x4B000000 | c) as a float is 2^23 + c, exactly

// Eight weights (w[n, c .. c + 8)) from 32 bits of codes, each (code - zero point) * scale, exact in float32
// (without kScaled: code - zero point, the caller scales a block's sum).
template <int kBits, bool kScaled = true>
__device__ __forceinline__ void Dequant8(const uint32_t* words, float scale, float* w) {
  if constexpr (!kScaled) scale = 1.0f;
  if constexpr (kBits == 4) {  // element e of the word at bits 4e (low nibble first)
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e] = (__uint_as_float(0x4B000000u | ((words[0] >> (4 * e)) & 15u)) - (kMagic + 8.0f)) * scale;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      w[e] = (__uint_as_float(0x4B000000u | ((words[e / 4] >> (8 * (e % 4))) & 255u)) - (kMagic + 128.0f)) * scale;
    }
  }
}

// y[:m, rows] for m <= kM: warp w of the block takes weight rows (blockIdx.x * kWarps + w) * kWarpRows + r.
template <int kBits, int kM>
__global__ void __launch_bounds__(kWarps * 32) Gemv(const __half* __restrict__ x, const uint8_t* __restrict__ b,
                                                    const __half* __restrict__ scales, __half* __restrict__ y, int m,
                                                    int n, int k, int block_size) {
  constexpr int kPerLoad = 128 / kBits;          // weights in 16 bytes of codes
  constexpr int kWords = kBits == 4 ? 1 : 2;     // 32-bit words of codes for 8 weights
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kWarpRows;
  if (row0 >= n) return;
  const int64_t row_bytes = static_cast<int64_t>(k) * kBits / 8;
  const int loads = k / kPerLoad, blocks = k / block_size;
  // Up to 4 rows, each load's products are summed unscaled and the sum scaled once: one multiply a weight less
  // (the decode step's kernel is near its instruction limit at ~3 TB/s); above, the registers for the partial
  // sums are not there, and the weights are scaled as they are decoded.
  constexpr bool kFactor = kM <= 4;
  float acc[kM][kWarpRows] = {};
  for (int c = lane; c < loads; c += 32) {
    float part[kFactor ? kM : 1][kWarpRows] = {};
    uint4 codes[kWarpRows];
    float scale[kWarpRows];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {  // rows past n read row0's codes again and are not written
      const int row = row0 + r < n ? row0 + r : row0;
      codes[r] = __ldg(reinterpret_cast<const uint4*>(b + row * row_bytes) + c);
      scale[r] = __half2float(scales[static_cast<int64_t>(row) * blocks + c * kPerLoad / block_size]);
    }
#pragma unroll
    for (int g = 0; g < kPerLoad / 8; ++g) {  // 8 weights at a time
      float w[kWarpRows][8];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
        Dequant8<kBits, !kFactor>(reinterpret_cast<const uint32_t*>(&codes[r]) + g * kWords, scale[r], w[r]);
      }
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        if (i >= m) break;
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(i) * k + c * kPerLoad + g * 8));
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const float2 v = __half22float2(h[p]);
#pragma unroll
          for (int r = 0; r < kWarpRows; ++r) {
            float& sum = kFactor ? part[kFactor ? i : 0][r] : acc[i][r];
            sum = fmaf(v.y, w[r][2 * p + 1], fmaf(v.x, w[r][2 * p], sum));
          }
        }
      }
    }
    if constexpr (kFactor) {
#pragma unroll
      for (int i = 0; i < kM; ++i)
#pragma unroll
        for (int r = 0; r < kWarpRows; ++r) acc[i][r] = fmaf(part[i][r], scale[r], acc[i][r]);
    }
  }
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      float v = acc[i][r];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && i < m && row0 + r < n) y[static_cast<int64_t>(i) * n + row0 + r] = __float2half_rn(v);
    }
  }
}


template <int kBits, int kM>
inline void LaunchGemv(const __half* x, const uint8_t* b, const __half* scales, __half* y, int m, int n, int k,
                       int block_size, cudaStream_t stream) {
  const int rows_a_block = kWarps * kWarpRows;
  const dim3 grid(static_cast<unsigned>((n + rows_a_block - 1) / rows_a_block));
  Gemv<kBits, kM><<<grid, kWarps * 32, 0, stream>>>(x, b, scales, y, m, n, k, block_size);
}

}  // namespace old_gemv
