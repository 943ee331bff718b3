// MatMulQ16 (kernels.h) for the CPU EP (the reference arithmetic, so CI runs the CUDA flavour's quantized
// graphs) and the CUDA EP (matmul_q16.cu): com.microsoft.MatMulNBits' first three inputs and its attributes
// K, N, bits and block_size, so an export switches between the two by the op's name and domain.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels.h"
#include "ops_common.h"

namespace wicore::ops {
namespace {

struct MatMulQ16Kernel {
  MatMulQ16Kernel(const OrtKernelInfo* info, bool cuda) : cuda_(cuda) {
    Ort::ConstKernelInfo i(info);
    k_ = i.GetAttribute<int64_t>("K");
    n_ = i.GetAttribute<int64_t>("N");
    bits_ = i.GetAttribute<int64_t>("bits");
    block_size_ = i.GetAttribute<int64_t>("block_size");
    Check(bits_ == 4 || bits_ == 8, "wicore MatMulQ16: bits must be 4 or 8");
    Check(block_size_ >= 32 && block_size_ % 32 == 0 && k_ % block_size_ == 0,
          "wicore MatMulQ16: block_size must be a multiple of 32 that divides K");
  }

  struct Work {
    const wicore::MatMulQ16Args* args;
    int64_t chunk;
  };

  static void Run(void* data, size_t i) {
    const auto* w = static_cast<const Work*>(data);
    const int64_t begin = static_cast<int64_t>(i) * w->chunk;
    wicore::MatMulQ16Cpu(*w->args, begin, std::min(begin + w->chunk, w->args->n));
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto x = ctx.GetInput(0), b = ctx.GetInput(1), scales = ctx.GetInput(2);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    Check(!shape.empty() && shape.back() == k_, "wicore MatMulQ16: x is not [..., K]");
    Check(b.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(n_ * k_ * bits_ / 8),
          "wicore MatMulQ16: B is not [N, K / block_size, block_size * bits / 8]");
    Check(scales.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(n_ * (k_ / block_size_)),
          "wicore MatMulQ16: the scales are not [N, K / block_size]");
    const int64_t m = Rows(shape);
    shape.back() = n_;
    auto y = ctx.GetOutput(0, shape);
    const wicore::MatMulQ16Args args{reinterpret_cast<const uint16_t*>(x.GetTensorData<Ort::Float16_t>()),
                                     b.GetTensorData<uint8_t>(),
                                     reinterpret_cast<const uint16_t*>(scales.GetTensorData<Ort::Float16_t>()),
                                     reinterpret_cast<uint16_t*>(y.GetTensorMutableData<Ort::Float16_t>()),
                                     m, n_, k_, block_size_, static_cast<int>(bits_)};
    if (m == 0 || n_ == 0) return;
    if (!cuda_) {
      constexpr int64_t kChunk = 64;  // weight rows a task
      Work work{&args, kChunk};
      ctx.ParallelFor(&Run, static_cast<size_t>((n_ + kChunk - 1) / kChunk), 0, &work);
      return;
    }
#ifdef WICORE_CUDA
    const int err = wicore::MatMulQ16Cuda(args, ctx.GetGPUComputeStream());
    Check(err == 0, std::string("wicore MatMulQ16: ") + wicore::CudaErrorString(err));
#endif
  }

  bool cuda_;
  int64_t k_ = 0, n_ = 0, bits_ = 0, block_size_ = 0;
};

struct MatMulQ16Op : Ort::CustomOpBase<MatMulQ16Op, MatMulQ16Kernel> {
  explicit MatMulQ16Op(bool cuda) : cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new MatMulQ16Kernel(info, cuda_); }
  const char* GetName() const { return "MatMulQ16"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return 3; }
  Type GetInputType(size_t i) const { return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : kF16; }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kF16; }

  bool cuda_;
};

}  // namespace

void AddMatMulQ16Ops(std::vector<OrtCustomOp*>* ops, bool cuda) { ops->push_back(new MatMulQ16Op(cuda)); }

}  // namespace wicore::ops
