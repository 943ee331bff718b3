// CUDA kernels of kernels.h. One thread block a row for the norms (the row's sum kept in shared
// memory between its two reductions); a flat grid of half2 pairs for the gated activations.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

namespace wicore {
namespace {

constexpr int kNormThreads = 512;

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

__global__ void ResidualRMSNormKernel(const float* __restrict__ x, const __half* __restrict__ h,
                                      const float* __restrict__ w_post, const __half* __restrict__ w, float epsilon,
                                      int hidden, __half* __restrict__ y, float* __restrict__ sum) {
  extern __shared__ float row[];  // [hidden]: the row's sum
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  float inv_h = 1.0f;
  if (w_post != nullptr) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float v = __half2float(h[base + i]);
      ss += v * v;
    }
    inv_h = rsqrtf(BlockSum(ss, scratch) / hidden + epsilon);
  }
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = __half2float(h[base + i]);
    v = w_post != nullptr ? v * inv_h * w_post[i] : v;
    const float s = x[base + i] + v;
    row[i] = s;
    sum[base + i] = s;
    ss += s * s;
  }
  const float inv = rsqrtf(BlockSum(ss, scratch) / hidden + epsilon);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    y[base + i] = __float2half(row[i] * inv * __half2float(w[i]));
  }
}

__device__ float Activate(float v, Activation act) {
  if (act == Activation::kSilu) return v / (1.0f + __expf(-v));
  const float k = 0.7978845608028654f;  // sqrt(2 / pi): gelu's tanh approximation, as ONNX Runtime's FastGelu
  return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

__global__ void GatedActivationKernel(const __half2* __restrict__ gate_up, Activation act, int64_t rows, int64_t half_inter,
                                      __half2* __restrict__ out) {
  const int64_t n = rows * half_inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / half_inter, j = i - r * half_inter;
    const float2 g = __half22float2(gate_up[r * 2 * half_inter + j]);
    const float2 u = __half22float2(gate_up[r * 2 * half_inter + half_inter + j]);
    out[i] = __floats2half2_rn(Activate(g.x, act) * u.x, Activate(g.y, act) * u.y);
  }
}

__global__ void GatedActivationOddKernel(const __half* __restrict__ gate_up, Activation act, int64_t rows, int64_t inter,
                                         __half* __restrict__ out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, j = i - r * inter;
    const float g = __half2float(gate_up[r * 2 * inter + j]), u = __half2float(gate_up[r * 2 * inter + inter + j]);
    out[i] = __float2half(Activate(g, act) * u);
  }
}

}  // namespace

int ResidualRMSNormCuda(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum, void* stream) {
  if (rows == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(hidden) * sizeof(float);
  if (shared > 48 * 1024) {  // beyond the default limit: raise it once (no allocation, no sync)
    cudaFuncSetAttribute(ResidualRMSNormKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  }
  ResidualRMSNormKernel<<<static_cast<unsigned>(rows), kNormThreads, shared, static_cast<cudaStream_t>(stream)>>>(
      x, reinterpret_cast<const __half*>(h), w_post, reinterpret_cast<const __half*>(w), epsilon, static_cast<int>(hidden),
      reinterpret_cast<__half*>(y), sum);
  return static_cast<int>(cudaGetLastError());
}

int GatedActivationCuda(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out, void* stream) {
  const int64_t pairs = inter % 2 == 0 ? rows * inter / 2 : rows * inter;
  if (pairs == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (pairs + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  auto s = static_cast<cudaStream_t>(stream);
  if (inter % 2 == 0) {
    GatedActivationKernel<<<grid, threads, 0, s>>>(reinterpret_cast<const __half2*>(gate_up), act, rows, inter / 2,
                                                   reinterpret_cast<__half2*>(out));
  } else {
    GatedActivationOddKernel<<<grid, threads, 0, s>>>(reinterpret_cast<const __half*>(gate_up), act, rows, inter,
                                                      reinterpret_cast<__half*>(out));
  }
  return static_cast<int>(cudaGetLastError());
}

const char* CudaErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace wicore
