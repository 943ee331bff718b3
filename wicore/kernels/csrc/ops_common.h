// What the custom-op files share (ops.cc, ops_attention.cc, ops_matmul_q16.cc, ops_matmul_i8.cc): ONNX Runtime's C++ API (initialized by
// RegisterCustomOps in ops.cc), the element types and the argument checks.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime/onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include <string>
#include <vector>

namespace wicore::ops {

constexpr const char* kCuda = "CUDAExecutionProvider";

using Type = ONNXTensorElementDataType;
constexpr Type kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr Type kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr Type kI64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
constexpr Type kI32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

inline void Check(bool ok, const std::string& message) {
  if (!ok) ORT_CXX_API_THROW(message, ORT_INVALID_ARGUMENT);
}

inline int64_t LastDim(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape.back(); }

inline int64_t Rows(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

// BlockAttention and BlockAttentionQKV for the CPU EP, or the CUDA EP (ops_attention.cc), appended to `ops`.
void AddAttentionOps(std::vector<OrtCustomOp*>* ops, bool cuda);
// MatMulQ16 for the CPU EP, or the CUDA EP (ops_matmul_q16.cc), appended to `ops`.
void AddMatMulQ16Ops(std::vector<OrtCustomOp*>* ops, bool cuda);
// MatMulI8 for the CPU EP, or the CUDA EP (ops_matmul_i8.cc), appended to `ops`.
void AddMatMulI8Ops(std::vector<OrtCustomOp*>* ops, bool cuda);

// ArgMaxRows for the CPU EP (ops_greedy.cc), appended to `ops`.
void AddGreedyOps(std::vector<OrtCustomOp*>* ops);

}  // namespace wicore::ops
