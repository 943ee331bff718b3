// CUDA kernels of kernels.h. One thread block a row for the norms (the row's sum kept in shared
// memory between its two reductions); half2 pairs of a row across a 2D grid for the gated activations.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

namespace wicore {
namespace {

constexpr int kNormThreads = 256;

__device__ float BlockSum(float v, float* scratch) {  // scratch: 32 floats of shared memory
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by an earlier reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every thread holds the block's sum
}

// One block a row. x, sum, w_post as float4 and h, w as four halves (8 bytes) where the hidden
// size is a multiple of 4 (every model's); a scalar loop otherwise.
template <bool kVec>
__global__ void ResidualRMSNormKernel(const float* __restrict__ x, const __half* __restrict__ h,
                                      const float* __restrict__ w_post, const __half* __restrict__ w, float epsilon,
                                      int hidden, __half* __restrict__ y, float* __restrict__ sum) {
  extern __shared__ float row[];  // [hidden]: the row's sum
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  const int step = kVec ? 4 : 1;
  float inv_h = 1.0f;
  if (w_post != nullptr) {
    float ss = 0.0f;
    for (int i = threadIdx.x * step; i < hidden; i += blockDim.x * step) {
      if constexpr (kVec) {
        const uint2 raw = *reinterpret_cast<const uint2*>(h + base + i);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
        ss += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
      } else {
        const float v = __half2float(h[base + i]);
        ss += v * v;
      }
    }
    inv_h = rsqrtf(BlockSum(ss, scratch) / hidden + epsilon);
  }
  float ss = 0.0f;
  for (int i = threadIdx.x * step; i < hidden; i += blockDim.x * step) {
    if constexpr (kVec) {
      const uint2 raw = *reinterpret_cast<const uint2*>(h + base + i);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      float4 v = make_float4(a.x, a.y, b.x, b.y);
      if (w_post != nullptr) {
        const float4 p = *reinterpret_cast<const float4*>(w_post + i);
        v = make_float4(v.x * inv_h * p.x, v.y * inv_h * p.y, v.z * inv_h * p.z, v.w * inv_h * p.w);
      }
      const float4 r = *reinterpret_cast<const float4*>(x + base + i);
      const float4 s = make_float4(r.x + v.x, r.y + v.y, r.z + v.z, r.w + v.w);
      *reinterpret_cast<float4*>(row + i) = s;
      *reinterpret_cast<float4*>(sum + base + i) = s;
      ss += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
    } else {
      float v = __half2float(h[base + i]);
      v = w_post != nullptr ? v * inv_h * w_post[i] : v;
      const float s = x[base + i] + v;
      row[i] = s;
      sum[base + i] = s;
      ss += s * s;
    }
  }
  const float inv = rsqrtf(BlockSum(ss, scratch) / hidden + epsilon);
  for (int i = threadIdx.x * step; i < hidden; i += blockDim.x * step) {
    if constexpr (kVec) {
      const float4 s = *reinterpret_cast<const float4*>(row + i);
      const uint2 raw = *reinterpret_cast<const uint2*>(w + i);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      const __half2 lo = __floats2half2_rn(s.x * inv * a.x, s.y * inv * a.y);
      const __half2 hi = __floats2half2_rn(s.z * inv * b.x, s.w * inv * b.y);
      uint2 out;
      out.x = *reinterpret_cast<const unsigned*>(&lo);
      out.y = *reinterpret_cast<const unsigned*>(&hi);
      *reinterpret_cast<uint2*>(y + base + i) = out;
    } else {
      y[base + i] = __float2half(row[i] * inv * __half2float(w[i]));
    }
  }
}

__device__ float Activate(float v, Activation act) {
  if (act == Activation::kSilu) return v / (1.0f + __expf(-v));
  const float k = 0.7978845608028654f;  // sqrt(2 / pi): gelu's tanh approximation, as ONNX Runtime's FastGelu
  return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

// A 2D grid: blockIdx.y walks the rows (and strides past 65535), x the row's half2 pairs; no division.
__global__ void GatedActivationKernel(const __half2* __restrict__ gate_up, Activation act, int64_t rows, int64_t half_inter,
                                      __half2* __restrict__ out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= half_inter) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float2 g = __half22float2(gate_up[r * 2 * half_inter + j]);
    const float2 u = __half22float2(gate_up[r * 2 * half_inter + half_inter + j]);
    out[r * half_inter + j] = __floats2half2_rn(Activate(g.x, act) * u.x, Activate(g.y, act) * u.y);
  }
}

__global__ void GatedActivationOddKernel(const __half* __restrict__ gate_up, Activation act, int64_t rows, int64_t inter,
                                         __half* __restrict__ out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= inter) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float g = __half2float(gate_up[r * 2 * inter + j]), u = __half2float(gate_up[r * 2 * inter + inter + j]);
    out[r * inter + j] = __float2half(Activate(g, act) * u);
  }
}

}  // namespace

int ResidualRMSNormCuda(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum, void* stream) {
  if (rows == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(hidden) * sizeof(float);
  const bool vec = hidden % 4 == 0;
  auto kernel = vec ? ResidualRMSNormKernel<true> : ResidualRMSNormKernel<false>;
  if (shared > 48 * 1024) {  // beyond the default limit: raise it (no allocation, no sync)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  }
  kernel<<<static_cast<unsigned>(rows), kNormThreads, shared, static_cast<cudaStream_t>(stream)>>>(
      x, reinterpret_cast<const __half*>(h), w_post, reinterpret_cast<const __half*>(w), epsilon, static_cast<int>(hidden),
      reinterpret_cast<__half*>(y), sum);
  return static_cast<int>(cudaGetLastError());
}

int GatedActivationCuda(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out, void* stream) {
  if (rows == 0 || inter == 0) return cudaSuccess;
  const bool pairs = inter % 2 == 0;
  const int64_t width = pairs ? inter / 2 : inter;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((width + threads - 1) / threads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  auto s = static_cast<cudaStream_t>(stream);
  if (pairs) {
    GatedActivationKernel<<<grid, threads, 0, s>>>(reinterpret_cast<const __half2*>(gate_up), act, rows, width,
                                                   reinterpret_cast<__half2*>(out));
  } else {
    GatedActivationOddKernel<<<grid, threads, 0, s>>>(reinterpret_cast<const __half*>(gate_up), act, rows, inter,
                                                      reinterpret_cast<__half*>(out));
  }
  return static_cast<int>(cudaGetLastError());
}

const char* CudaErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int CudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
}

}  // namespace wicore
