// MatMulQ16 on CUDA (kernels.h): float16 activations x 4- or 8-bit block-quantized weights in MatMulNBits'
// layout, read where they lie (no dequantized copy of the weight, no scratch).
//
//   m <= kMatMulQ16GemvRows   GEMV on tensor cores (matmul_q16_gemv.cuh): each 16-byte load of codes decoded
//                             to halves in registers (lop3), 16 weight rows x 16 k an MMA with x's up to 8 rows
//                             (two MMAs to 16 rows), k split across the warps of a block. Batch-1 decode is a
//                             read of the weights: ~13.5 GB for the 27B shape in 4 bits, so the step's floor is
//                             the weights over the memory rate (~2.8 ms at 4.8 TB/s).
//   above                     Tiled: 64 x 128 tiles of y up to 64 rows, 128 x 128 above; 8 warps of 2 x 2
//                             (4 x 2) WMMA fragments (16 x 16 x 16, float32 accumulators). The codes of a
//                             128-row x 32-column tile are dequantized into shared memory as halves (each
//                             weight rounded to half once), the next tile's codes and x loaded into registers
//                             while the current one multiplies. MatMulNBits' unfused path instead writes the
//                             whole weight in float16 and runs cuBLAS on it: 4.5 bytes of traffic a 4-bit
//                             weight more than this reads. Not yet timed against it (nor against the CUTLASS
//                             fpA_intB GEMM that tools/bench_shapes.py turns on): tools/check_matmul_q16_gpu.py.
//
// Both launch on the caller's stream, allocate nothing and never synchronize (a CUDA graph captures them).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "kernels.h"
#include "matmul_q16_gemv.cuh"

namespace wicore {
namespace {

constexpr float kMagic = 8388608.0f;  // 2^23: (0x4B000000 | c) as a float is 2^23 + c, exactly

// Eight weights (w[n, c .. c + 8)) from 32 bits of codes, each (code - zero point) * scale, exact in float32.
template <int kBits>
__device__ __forceinline__ void Dequant8(const uint32_t* words, float scale, float* w) {
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

constexpr int kTileN = 128, kTileK = 32, kPad = 8;  // kPad: halves that shift rows across banks
constexpr int kTiledThreads = 256;  // 8 warps: 2 along m x 4 along n, each (16 kFrags) x 32 of the tile

// What a thread loads of one k-tile: kFrags / 2 x 8 halves of x, and 16 weights of one weight row (8 or 16
// bytes of codes). The tile is 32 kFrags rows of x (64 or 128) by 128 weight rows.
template <int kFrags>
struct TileLoad {
  uint4 x[kFrags / 2];
  uint4 codes;
  float scale;
};

template <int kBits, int kFrags>
__device__ __forceinline__ TileLoad<kFrags> LoadTile(const __half* x, const uint8_t* b, const __half* scales, int m,
                                                     int n, int k, int block_size, int m0, int n0, int k0) {
  TileLoad<kFrags> t;
#pragma unroll
  for (int i = 0; i < kFrags / 2; ++i) {  // 64 rows x 4 loads of 8 halves, kFrags / 2 times
    const int xr = m0 + i * 64 + threadIdx.x / 4, xc = k0 + (threadIdx.x % 4) * 8;
    t.x[i] = xr < m ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(xr) * k + xc) : make_uint4(0, 0, 0, 0);
  }
  const int wr = n0 + threadIdx.x / 2, wc = k0 + (threadIdx.x % 2) * 16;  // 128 rows x 2 halves of 32 columns
  t.codes = make_uint4(0, 0, 0, 0);
  t.scale = 0.0f;
  if (wr < n) {
    const uint8_t* p = b + static_cast<int64_t>(wr) * k * kBits / 8 + static_cast<int64_t>(wc) * kBits / 8;
    if constexpr (kBits == 4) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      t.codes = make_uint4(v.x, v.y, 0, 0);
    } else {
      t.codes = __ldg(reinterpret_cast<const uint4*>(p));
    }
    t.scale = __half2float(scales[static_cast<int64_t>(wr) * (k / block_size) + wc / block_size]);
  }
  return t;
}

template <int kBits, int kFrags>
__device__ __forceinline__ void StoreTile(const TileLoad<kFrags>& t, __half* xs, __half* ws) {
#pragma unroll
  for (int i = 0; i < kFrags / 2; ++i) {
    *reinterpret_cast<uint4*>(xs + (i * 64 + threadIdx.x / 4) * (kTileK + kPad) + (threadIdx.x % 4) * 8) = t.x[i];
  }
  constexpr int kWords = kBits == 4 ? 1 : 2;
  __half* row = ws + (threadIdx.x / 2) * (kTileK + kPad) + (threadIdx.x % 2) * 16;
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    float w[8];
    Dequant8<kBits>(reinterpret_cast<const uint32_t*>(&t.codes) + g * kWords, t.scale, w);
    __half2 h[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) h[p] = __floats2half2_rn(w[2 * p], w[2 * p + 1]);
    *reinterpret_cast<uint4*>(row + g * 8) = *reinterpret_cast<const uint4*>(h);
  }
}

// kFrags: 16-row fragments a warp along m (2: 64-row tiles, for up to 64 rows; 4: 128-row tiles, each weight
// tile dequantized once for twice the rows, and 8 MMAs for every 6 fragment loads instead of 4 for 4).
template <int kBits, int kFrags>
__global__ void __launch_bounds__(kTiledThreads) Tiled(const __half* __restrict__ x, const uint8_t* __restrict__ b,
                                                       const __half* __restrict__ scales, __half* __restrict__ y, int m,
                                                       int n, int k, int block_size) {
  using namespace nvcuda;
  constexpr int kTileM = 32 * kFrags, kLd = kTileK + kPad;
  __shared__ __align__(32) __half xs[kTileM * kLd];  // x's tile, row-major
  __shared__ __align__(32) __half ws[kTileN * kLd];  // w's tile, i.e. wᵀ column-major
  __shared__ __align__(32) float staged[kTiledThreads / 32][16 * 16];  // a warp's fragment on its way to y
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = (warp / 4) * 16 * kFrags, wn = (warp % 4) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFrags][2];
#pragma unroll
  for (int i = 0; i < kFrags; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  TileLoad<kFrags> next = LoadTile<kBits, kFrags>(x, b, scales, m, n, k, block_size, m0, n0, 0);
  for (int k0 = 0; k0 < k; k0 += kTileK) {
    __syncthreads();  // the last tile's fragments are read
    StoreTile<kBits, kFrags>(next, xs, ws);
    __syncthreads();
    if (k0 + kTileK < k) next = LoadTile<kBits, kFrags>(x, b, scales, m, n, k, block_size, m0, n0, k0 + kTileK);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[kFrags];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < kFrags; ++i) wmma::load_matrix_sync(fa[i], xs + (wm + 16 * i) * kLd + kk, kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], ws + (wn + 16 * j) * kLd + kk, kLd);
#pragma unroll
      for (int i = 0; i < kFrags; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  float* mine = staged[warp];
#pragma unroll
  for (int i = 0; i < kFrags; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(mine, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = m0 + wm + 16 * i + e / 16, c = n0 + wn + 16 * j + e % 16;
        if (r < m && c < n) y[static_cast<int64_t>(r) * n + c] = __float2half_rn(mine[e]);
      }
      __syncwarp();  // read before the next fragment overwrites it
    }
  }
}

template <int kBits, int kFrags>
void LaunchTiled(const MatMulQ16Args& a, cudaStream_t stream) {
  const int64_t tile_m = 32 * kFrags;
  const dim3 grid(static_cast<unsigned>((a.n + kTileN - 1) / kTileN), static_cast<unsigned>((a.m + tile_m - 1) / tile_m));
  Tiled<kBits, kFrags><<<grid, kTiledThreads, 0, stream>>>(
      reinterpret_cast<const __half*>(a.x), a.b, reinterpret_cast<const __half*>(a.scales), reinterpret_cast<__half*>(a.y),
      static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k), static_cast<int>(a.block_size));
}

template <int kBits>
void Launch(const MatMulQ16Args& a, cudaStream_t stream) {
  const auto* x = reinterpret_cast<const __half*>(a.x);
  const auto* scales = reinterpret_cast<const __half*>(a.scales);
  auto* y = reinterpret_cast<__half*>(a.y);
  const int m = static_cast<int>(a.m), n = static_cast<int>(a.n), k = static_cast<int>(a.k), bs = static_cast<int>(a.block_size);
  // 16 weight rows a block, 8 warps splitting k, 2 chunks of loads in flight a warp: the fastest at one row
  // of those tools/gemv_bench timed on an H200 (docs/PERFORMANCE.md)
  if (a.m <= 8) return gemv::LaunchMmaGemv<kBits, 1, 8, 2, 1>(x, a.b, scales, y, m, n, k, bs, stream);
  if (a.m <= kMatMulQ16GemvRows) return gemv::LaunchMmaGemv<kBits, 1, 8, 2, 2>(x, a.b, scales, y, m, n, k, bs, stream);
  if (a.m <= 64) return LaunchTiled<kBits, 2>(a, stream);
  LaunchTiled<kBits, 4>(a, stream);
}

}  // namespace

int MatMulQ16Cuda(const MatMulQ16Args& args, void* stream) {
  if (args.m == 0 || args.n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  if (args.bits == 4) {
    Launch<4>(args, s);
  } else {
    Launch<8>(args, s);
  }
  return cudaGetLastError();
}

}  // namespace wicore
