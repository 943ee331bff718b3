// MatMulI8 on CUDA (kernels.h): int8 weights [n, k] with a float scale per output channel.
//
//   m <= kMatMulI8GemvRows   weight-only GEMV on tensor cores: MatMulQ16's (matmul_q16_gemv.cuh, kPerRow), the
//                            codes decoded exactly to halves, x in float16, float32 sums, the row's scale last
//   above                    W8A8 (ops_matmul_i8.cc drives it): x's rows to int8 (MatMulI8QuantizeCuda), cuBLASLt's
//                            int8 x int8 -> int32 GEMM (cublaslt_i8.cc), then MatMulI8EpilogueCuda to float16
//
// Every kernel launches on the caller's stream, allocates nothing and never synchronizes (a CUDA graph captures
// them). The rounding is the CPU kernel's (kernels_cpu.cc) to the bit: an IEEE division (nvcc's default
// -prec-div=true), one multiply, round half to even; the epilogue's two multiplies in the same order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "matmul_q16_gemv.cuh"

namespace wicore {
namespace {

constexpr int kQuantThreads = 256;

// One block a row: the row's |x| maximum (a block reduction), then its codes; the row (at most ~43 KB of halves
// at the 27B shape) is read twice, the second time from L1/L2.
__global__ void __launch_bounds__(kQuantThreads) QuantizeRows(const __half* __restrict__ x, int k, int8_t* __restrict__ q,
                                                              float* __restrict__ x_scales) {
  const int64_t row = blockIdx.x;
  const __half2* xr = reinterpret_cast<const __half2*>(x + row * k);  // k even (a multiple of 16)
  float amax = 0.0f;
  for (int i = threadIdx.x; i < k / 2; i += kQuantThreads) {
    const float2 v = __half22float2(xr[i]);
    amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
  }
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  __shared__ float warps[kQuantThreads / 32];
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = warps[0];
#pragma unroll
  for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, warps[w]);
  const float inv = amax == 0.0f ? 0.0f : 127.0f / amax;
  char2* qr = reinterpret_cast<char2*>(q + row * k);
  for (int i = threadIdx.x; i < k / 2; i += kQuantThreads) {
    const float2 v = __half22float2(xr[i]);
    const int a = __float2int_rn(v.x * inv), b = __float2int_rn(v.y * inv);
    qr[i] = make_char2(static_cast<signed char>(max(-127, min(127, a))), static_cast<signed char>(max(-127, min(127, b))));
  }
  if (threadIdx.x == 0) x_scales[row] = amax / 127.0f;
}

// y[r, c] for c < cols: four columns a thread where the rows allow 16-byte reads (ldc, ldy, cols multiples of 4),
// else one.
template <int kVec>
__global__ void Epilogue(const int32_t* __restrict__ acc, int64_t ldc, const float* __restrict__ x_scales,
                         const float* __restrict__ scales, int rows, int cols, __half* __restrict__ y, int64_t ldy) {
  const int per_row = cols / kVec;
  const int64_t total = static_cast<int64_t>(rows) * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / per_row), c = static_cast<int>(i % per_row) * kVec;
    const float s = x_scales[r];
    if constexpr (kVec == 4) {
      const int4 a = *reinterpret_cast<const int4*>(acc + r * ldc + c);
      const float4 w = *reinterpret_cast<const float4*>(scales + c);
      __half2 out[2] = {__floats2half2_rn(__int2float_rn(a.x) * s * w.x, __int2float_rn(a.y) * s * w.y),
                        __floats2half2_rn(__int2float_rn(a.z) * s * w.z, __int2float_rn(a.w) * s * w.w)};
      *reinterpret_cast<uint2*>(y + r * ldy + c) = *reinterpret_cast<const uint2*>(out);
    } else {
      y[r * ldy + c] = __float2half_rn(__int2float_rn(acc[r * ldc + c]) * s * scales[c]);
    }
  }
}

}  // namespace

int MatMulI8GemvCuda(const MatMulI8Args& a, void* stream) {
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* x = reinterpret_cast<const __half*>(a.x);
  auto* y = reinterpret_cast<__half*>(a.y);
  const int m = static_cast<int>(a.m), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  // MatMulQ16's configurations (8 warps splitting k, 2 chunks of loads in flight a warp; a second MMA tile of x
  // from 9 rows): its int8 GEMV read 2.3-4.0 TB/s at one row on an H200 (docs/PERFORMANCE.md)
  if (m <= 8) {
    gemv::LaunchMmaGemvPerRow<1, 8, 2, 1>(x, a.w, a.scales, y, m, n, k, s);
  } else {
    gemv::LaunchMmaGemvPerRow<1, 8, 2, 2>(x, a.w, a.scales, y, m, n, k, s);
  }
  return cudaGetLastError();
}

int MatMulI8QuantizeCuda(const uint16_t* x, int64_t rows, int64_t k, int8_t* q, float* x_scales, void* stream) {
  if (rows == 0) return cudaSuccess;
  QuantizeRows<<<static_cast<unsigned>(rows), kQuantThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __half*>(x), static_cast<int>(k), q, x_scales);
  return cudaGetLastError();
}

int MatMulI8EpilogueCuda(const int32_t* acc, int64_t ldc, const float* x_scales, const float* scales, int64_t rows,
                         int64_t cols, uint16_t* y, int64_t ldy, void* stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  auto* yh = reinterpret_cast<__half*>(y);
  const bool vec = ldc % 4 == 0 && ldy % 4 == 0 && cols % 4 == 0 && reinterpret_cast<uintptr_t>(scales) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 8 == 0;
  const int64_t threads = rows * (vec ? cols / 4 : cols);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((threads + 255) / 256, 8192));
  if (vec) {
    Epilogue<4><<<blocks, 256, 0, s>>>(acc, ldc, x_scales, scales, static_cast<int>(rows), static_cast<int>(cols), yh, ldy);
  } else {
    Epilogue<1><<<blocks, 256, 0, s>>>(acc, ldc, x_scales, scales, static_cast<int>(rows), static_cast<int>(cols), yh, ldy);
  }
  return cudaGetLastError();
}

}  // namespace wicore
