// MatMulI8 (kernels.h) for the CPU EP (the reference arithmetic, so CI runs the graphs the GPU runs) and the CUDA
// EP. Inputs x f16 [..., K], w i8 [N, K], scales f32 [N]; attributes K and N. Output f16 [..., N].
// K must be a multiple of 16 (the GEMV's 16-byte loads; cuBLASLt's int8 kernels want K and the leading dimensions
// multiples of 4, 16 bytes best): the kernel refuses others when it is made, and the exporter keeps such layers on
// MatMulNBits (graph/matmul_i8.py can_run, which also asks N a multiple of 4: cuBLASLt's int8 "TN" output; an N
// it has no algorithm for fails the call with cuBLASLt's word).
//
// CUDA, above kMatMulI8GemvRows rows, in chunks that bound the scratch (one allocation from ORT's CUDA allocator,
// its arena: no cudaMalloc once warm, so a CUDA graph captures the step; freed after the launches, which the arena
// hands out again on this stream only):
//
//   for each chunk of <= 256 rows of x:   quantize ──► xq int8 [rows, K], x_scales [rows]
//     for each chunk of columns:          cuBLASLt int8 GEMM ──► acc int32 [rows, ldc] ──► epilogue ──► y[rows, cols]
//
// The columns of a chunk keep acc within kMaxAccBytes (64 MiB: 256 rows of gate|up's 43,008 are 44 MB in one
// chunk; the 262,144-row LM head's 256 rows four chunks, each weight row still read once a row chunk).
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cublaslt_i8.h"
#include "kernels.h"
#include "ops_common.h"

namespace wicore::ops {
namespace {

constexpr int64_t kRowChunk = 256;
constexpr int64_t kMaxAccBytes = int64_t{64} << 20;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct MatMulI8Kernel {
  MatMulI8Kernel(const OrtKernelInfo* info, bool cuda) : cuda_(cuda) {
    Ort::ConstKernelInfo i(info);
    k_ = i.GetAttribute<int64_t>("K");
    n_ = i.GetAttribute<int64_t>("N");
    Check(k_ > 0 && k_ % 16 == 0, "wicore MatMulI8: K must be a positive multiple of 16");
#ifdef WICORE_CUDA
    std::string error;
    Check(!cuda_ || wicore::CublasLtI8::Available(&error), "wicore MatMulI8 (CUDA): " + error);
#endif
  }

  struct Work {
    const wicore::MatMulI8Args* args;
    const int8_t* xq;
    const float* x_scales;
    int64_t chunk;
  };

  static void Run(void* data, size_t i) {
    const auto* w = static_cast<const Work*>(data);
    const int64_t begin = static_cast<int64_t>(i) * w->chunk;
    wicore::MatMulI8Cpu(*w->args, w->xq, w->x_scales, begin, std::min(begin + w->chunk, w->args->n));
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto x = ctx.GetInput(0), w = ctx.GetInput(1), scales = ctx.GetInput(2);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    Check(!shape.empty() && shape.back() == k_, "wicore MatMulI8: x is not [..., K]");
    Check(w.GetTensorTypeAndShapeInfo().GetShape() == std::vector<int64_t>{n_, k_}, "wicore MatMulI8: w is not [N, K]");
    Check(scales.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(n_),
          "wicore MatMulI8: the scales are not [N]");
    const int64_t m = Rows(shape);
    shape.back() = n_;
    auto y = ctx.GetOutput(0, shape);
    const wicore::MatMulI8Args args{reinterpret_cast<const uint16_t*>(x.GetTensorData<Ort::Float16_t>()),
                                    w.GetTensorData<int8_t>(), scales.GetTensorData<float>(),
                                    reinterpret_cast<uint16_t*>(y.GetTensorMutableData<Ort::Float16_t>()), m, n_, k_};
    if (m == 0 || n_ == 0) return;
    if (!cuda_) return RunCpu(ctx, args);
#ifdef WICORE_CUDA
    if (m <= wicore::kMatMulI8GemvRows) {
      const int err = wicore::MatMulI8GemvCuda(args, ctx.GetGPUComputeStream());
      Check(err == 0, std::string("wicore MatMulI8: ") + wicore::CudaErrorString(err));
      return;
    }
    RunCuda(ctx, args, x.GetTensorMemoryInfo().GetDeviceId());
#endif
  }

  void RunCpu(Ort::KernelContext& ctx, const wicore::MatMulI8Args& args) const {
    thread_local std::vector<int8_t> xq;  // a step's calls allocate nothing once warm
    thread_local std::vector<float> x_scales;
    const bool quantized = args.m > wicore::kMatMulI8GemvRows;
    if (quantized) {
      xq.resize(static_cast<size_t>(args.m * args.k));
      x_scales.resize(static_cast<size_t>(args.m));
      for (int64_t r = 0; r < args.m; ++r) wicore::MatMulI8QuantizeRowCpu(args.x + r * args.k, args.k, &xq[r * args.k], &x_scales[r]);
    }
    constexpr int64_t kChunk = 64;  // weight rows a task
    Work work{&args, quantized ? xq.data() : nullptr, quantized ? x_scales.data() : nullptr, kChunk};
    ctx.ParallelFor(&Run, static_cast<size_t>((args.n + kChunk - 1) / kChunk), 0, &work);
  }

#ifdef WICORE_CUDA
  void RunCuda(Ort::KernelContext& ctx, const wicore::MatMulI8Args& a, int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (gemm_ == nullptr) {  // the first call (ORT's warm-up, never a capture): the handle on this device
        std::string error;
        gemm_ = wicore::CublasLtI8::Create(&error);
        Check(gemm_ != nullptr, "wicore MatMulI8: " + error);
      }
    }
    const int64_t rows = std::min(a.m, kRowChunk);
    const int64_t cols = std::min(a.n, std::max<int64_t>(64, kMaxAccBytes / (rows * 4) / 64 * 64));
    const int64_t ldc = RoundUp(cols, 4);
    const size_t xq_bytes = RoundUp(rows * a.k, 256), scale_bytes = RoundUp(rows * 4, 256);
    const size_t acc_bytes = RoundUp(rows * ldc * 4, 256);
    const size_t bytes = xq_bytes + scale_bytes + acc_bytes + wicore::CublasLtI8::kWorkspaceBytes;
    Ort::MemoryInfo info("Cuda", OrtArenaAllocator, device, OrtMemTypeDefault);
    Ort::Allocator allocator = ctx.GetAllocator(*info);
    auto* base = static_cast<char*>(allocator.Alloc(bytes));
    auto* xq = reinterpret_cast<int8_t*>(base);
    auto* x_scales = reinterpret_cast<float*>(base + xq_bytes);
    auto* acc = reinterpret_cast<int32_t*>(base + xq_bytes + scale_bytes);
    void* workspace = base + xq_bytes + scale_bytes + acc_bytes;
    void* stream = ctx.GetGPUComputeStream();
    std::string error;
    int err = 0;
    for (int64_t r0 = 0; r0 < a.m && err == 0 && error.empty(); r0 += rows) {
      const int64_t mr = std::min(rows, a.m - r0);
      err = wicore::MatMulI8QuantizeCuda(a.x + r0 * a.k, mr, a.k, xq, x_scales, stream);
      for (int64_t n0 = 0; n0 < a.n && err == 0; n0 += cols) {
        const int64_t nc = std::min(cols, a.n - n0);
        if (!gemm_->Gemm(a.w + n0 * a.k, xq, acc, mr, nc, a.k, ldc, workspace, stream, &error)) break;
        err = wicore::MatMulI8EpilogueCuda(acc, ldc, x_scales, a.scales + n0, mr, nc, a.y + r0 * a.n + n0, a.n, stream);
      }
    }
    allocator.Free(base);  // the arena hands it out again on this stream only after the kernels
    Check(error.empty(), "wicore MatMulI8: " + error);
    Check(err == 0, std::string("wicore MatMulI8: ") + wicore::CudaErrorString(err));
  }

  std::mutex mutex_;
  std::unique_ptr<wicore::CublasLtI8> gemm_;
#endif

  bool cuda_;
  int64_t k_ = 0, n_ = 0;
};

struct MatMulI8Op : Ort::CustomOpBase<MatMulI8Op, MatMulI8Kernel> {
  explicit MatMulI8Op(bool cuda) : cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new MatMulI8Kernel(info, cuda_); }
  const char* GetName() const { return "MatMulI8"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return 3; }
  Type GetInputType(size_t i) const {
    return i == 0 ? kF16 : i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : kF32;
  }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kF16; }

  bool cuda_;
};

}  // namespace

void AddMatMulI8Ops(std::vector<OrtCustomOp*>* ops, bool cuda) { ops->push_back(new MatMulI8Op(cuda)); }

}  // namespace wicore::ops
