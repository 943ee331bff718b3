// WiCore's fused kernels: one declaration a kernel, for every backend that implements them
// (kernels_cpu.cc always; kernels.cu where CUDA's compiler is; a HIP port would add kernels.hip).
//
//   AddRMSNorm      (x f32 [rows, H], h f16 [rows, H], w f16 [H])            -> y f16, sum f32
//                   sum = x + h;                      y = rms(sum) * w
//   NormAddRMSNorm  (x f32, h f16, w_post f32 [H], w f16 [H])                -> y f16, sum f32
//                   sum = x + rms(h) * w_post;        y = rms(sum) * w         (Gemma's sandwich norms)
//   GeGLU / SwiGLU  (gate_up f16 [rows, 2I])                                 -> f16 [rows, I]
//                   out = act(gate_up[:, :I]) * gate_up[:, I:]   (gelu_tanh / silu, in float32)
//
// rms(v) = v / sqrt(mean(v^2) + epsilon), in float32. A half is passed as its 16 bits.
#pragma once

#include <cstdint>

namespace wicore {

enum class Activation { kGeluTanh, kSilu };

// `w_post` null: AddRMSNorm; else NormAddRMSNorm.
void ResidualRMSNormCpu(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum);
void GatedActivationCpu(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out);

#ifdef WICORE_CUDA
// Launched on `stream` (ORT's compute stream for the node); no allocation, no synchronization.
// Returns cudaSuccess or the launch's error code.
int ResidualRMSNormCuda(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum, void* stream);
int GatedActivationCuda(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out, void* stream);
const char* CudaErrorString(int code);
#endif

}  // namespace wicore
