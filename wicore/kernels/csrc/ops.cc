// WiCore's custom ops for ONNX Runtime: domain "wicore", version 1 (kernels.h says what each computes).
//
//   session_options.register_custom_ops_library(path)  ──►  RegisterCustomOps(options, api_base)
//       ──► one "wicore" domain: each op for the CPU EP, and (built with nvcc) for the CUDA EP
//
// Built against ONNX Runtime's C API version 29 (1.29 headers in ../include); later runtimes serve
// that version too (the API only appends). A CUDA kernel launches on the stream ONNX Runtime hands
// the node (KernelContext_GetGPUComputeStream): it allocates nothing, never synchronizes and
// copies nothing to the host, so a CUDA EP session can capture it in a CUDA graph.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "kernels.h"
#include "ops_common.h"

namespace {

using namespace wicore::ops;
constexpr const char* kDomain = "wicore";

// -- residual add + RMSNorm ---------------------------------------------------------------
struct ResidualNormKernel {
  ResidualNormKernel(const OrtKernelInfo* info, bool post_norm, bool cuda)
      : post_norm_(post_norm), cuda_(cuda), epsilon_(Ort::ConstKernelInfo(info).GetAttribute<float>("epsilon")) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto x = ctx.GetInput(0), h = ctx.GetInput(1);
    auto w = ctx.GetInput(post_norm_ ? 3 : 2);
    const auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t hidden = LastDim(shape), rows = Rows(shape);
    Check(h.GetTensorTypeAndShapeInfo().GetShape() == shape, "wicore residual norm: x and h differ in shape");
    Check(w.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(hidden),
          "wicore residual norm: the weight is not [hidden]");
    const float* w_post = nullptr;
    if (post_norm_) {
      auto wp = ctx.GetInput(2);
      Check(wp.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(hidden),
            "wicore residual norm: the post-norm weight is not [hidden]");
      w_post = wp.GetTensorData<float>();
    }
    auto y = ctx.GetOutput(0, shape);
    auto sum = ctx.GetOutput(1, shape);
    const auto* hp = reinterpret_cast<const uint16_t*>(h.GetTensorData<Ort::Float16_t>());
    const auto* wq = reinterpret_cast<const uint16_t*>(w.GetTensorData<Ort::Float16_t>());
    auto* yp = reinterpret_cast<uint16_t*>(y.GetTensorMutableData<Ort::Float16_t>());
    if (!cuda_) {
      wicore::ResidualRMSNormCpu(x.GetTensorData<float>(), hp, w_post, wq, epsilon_, rows, hidden, yp,
                                 sum.GetTensorMutableData<float>());
      return;
    }
#ifdef WICORE_CUDA
    const int err = wicore::ResidualRMSNormCuda(x.GetTensorData<float>(), hp, w_post, wq, epsilon_, rows, hidden, yp,
                                                sum.GetTensorMutableData<float>(), ctx.GetGPUComputeStream());
    Check(err == 0, std::string("wicore residual norm: ") + wicore::CudaErrorString(err));
#endif
  }

  bool post_norm_, cuda_;
  float epsilon_;
};

struct ResidualNormOp : Ort::CustomOpBase<ResidualNormOp, ResidualNormKernel> {
  ResidualNormOp(bool post_norm, bool cuda) : post_norm_(post_norm), cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new ResidualNormKernel(info, post_norm_, cuda_); }
  const char* GetName() const { return post_norm_ ? "NormAddRMSNorm" : "AddRMSNorm"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return post_norm_ ? 4 : 3; }
  Type GetInputType(size_t i) const {
    if (i == 0) return kF32;  // x: the residual stream
    if (i == 1) return kF16;  // h: the block's output
    return post_norm_ && i == 2 ? kF32 : kF16;  // the post-norm's weight, then the norm's (its output's type)
  }
  size_t GetOutputTypeCount() const { return 2; }
  Type GetOutputType(size_t i) const { return i == 0 ? kF16 : kF32; }  // y, sum

  bool post_norm_, cuda_;
};

// -- gated activations ----------------------------------------------------------------------
// A gated activation's [..., I] output for its [..., 2I] gate|up input; `rows` and `inter` set.
Ort::UnownedValue GatedOutput(Ort::KernelContext& ctx, const Ort::ConstValue& in, const std::string& op, int64_t* rows,
                              int64_t* inter) {
  auto shape = in.GetTensorTypeAndShapeInfo().GetShape();
  Check(!shape.empty() && shape.back() % 2 == 0, op + ": the last dimension is not gate|up");
  *inter = shape.back() / 2;
  *rows = Rows(shape);
  shape.back() = *inter;
  return ctx.GetOutput(0, shape);
}

struct GatedKernel {
  GatedKernel(wicore::Activation act, bool cuda) : act_(act), cuda_(cuda) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto in = ctx.GetInput(0);
    int64_t rows = 0, inter = 0;
    auto out = GatedOutput(ctx, in, "wicore gated activation", &rows, &inter);
    const auto* ip = reinterpret_cast<const uint16_t*>(in.GetTensorData<Ort::Float16_t>());
    auto* op = reinterpret_cast<uint16_t*>(out.GetTensorMutableData<Ort::Float16_t>());
    if (!cuda_) {
      wicore::GatedActivationCpu(ip, act_, rows, inter, op);
      return;
    }
#ifdef WICORE_CUDA
    const int err = wicore::GatedActivationCuda(ip, act_, rows, inter, op, ctx.GetGPUComputeStream());
    Check(err == 0, std::string("wicore gated activation: ") + wicore::CudaErrorString(err));
#endif
  }

  wicore::Activation act_;
  bool cuda_;
};

struct GatedOp : Ort::CustomOpBase<GatedOp, GatedKernel> {
  GatedOp(wicore::Activation act, bool cuda) : act_(act), cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo*) const { return new GatedKernel(act_, cuda_); }
  const char* GetName() const { return act_ == wicore::Activation::kSilu ? "SwiGLU" : "GeGLU"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return 1; }
  Type GetInputType(size_t) const { return kF16; }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kF16; }

  wicore::Activation act_;
  bool cuda_;
};

// -- quantized matmul (CPU) ----------------------------------------------------------------
// An attribute that graphs exported before it existed leave out.
template <typename T>
T AttributeOr(const OrtKernelInfo* info, const char* name, T fallback) {
  try {
    return Ort::ConstKernelInfo(info).template GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

// Whether a prompt's step (rows of 32+ tokens: Compute) takes the int8 GEMM (matmul_q_int8.cc) or the float one (matmul_q_float.cc):
// the node's `prompt_precision` ("int8" | "float"), which the exporter sets per tensor (int8 for a decoder
// layer's projections, float for the LM head: wicore/graph/quant.py says why); a graph exported before the
// attribute existed has float, as then. WICORE_MATMULQ_PROMPT=int8|float overrides every node (experiments).
bool IsInt8Prompt(const OrtKernelInfo* info) {
  const char* env = std::getenv("WICORE_MATMULQ_PROMPT");
  const std::string asked = env != nullptr && *env != '\0' ? std::string(env)
                                                            : AttributeOr<std::string>(info, "prompt_precision", "float");
  Check(asked == "int8" || asked == "float",
        "wicore MatMulQ: prompt_precision (or WICORE_MATMULQ_PROMPT) must be int8 or float, not " + asked);
  return asked == "int8";
}

// Inputs: x, codes, then the scales and offsets in float32 (2, 3) or narrow (4-7: kernels.h's MatMulQPacked),
// each optional; one form of the scales is required, the offsets in either form are optional.
struct MatMulQKernel {
  explicit MatMulQKernel(const OrtKernelInfo* info)
      : bits_(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("bits")),
        block_size_(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("block_size")),
        n_(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("N")),
        residual_(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("residual") != 0),
        zero_point_(AttributeOr<int64_t>(info, "zero_point", bits_ == 4 ? 8 : 128)),
        blocks_per_super_(AttributeOr<int64_t>(info, "blocks_per_super", 0)),
        offset_scale_(AttributeOr<float>(info, "offset_scale", 0.f)),
        path_(wicore::MatMulQPathFor(std::getenv("WICORE_MATMULQ_PATH"))),  // "scalar": portable int8, prompts too; "avx2": AVX2 anywhere
        is_int8_prompt_(IsInt8Prompt(info)) {
    Check(bits_ == 4 || bits_ == 5 || bits_ == 6 || bits_ == 8, "wicore MatMulQ: bits must be 4, 5, 6 or 8");
    Check(block_size_ == 16 || block_size_ == 32, "wicore MatMulQ: block_size must be 16 or 32");
    Check(bits_ == 4 || bits_ == 8 || (zero_point_ >= 0 && zero_point_ < (int64_t{1} << bits_)),
          "wicore MatMulQ: zero_point must be a code of `bits` bits");
  }

  struct Work {
    const wicore::MatMulQArgs* args;
    const wicore::MatMulQPacked* packed;
    const std::vector<wicore::QuantRow>* rows;  // null: the float prompt path (MatMulQFloatCpu)
    const wicore::MatMulQInt8Rows* int8;        // non-null: the int8 prompt path (MatMulQInt8Cpu)
    int64_t chunk;
    wicore::MatMulQPath path;
  };

  struct Quantize {
    static constexpr int64_t kRows = 16;
    const wicore::MatMulQArgs* args;
    wicore::MatMulQInt8Rows* out;
    static void Run(void* data, size_t i) {
      const auto* q = static_cast<const Quantize*>(data);
      const int64_t begin = static_cast<int64_t>(i) * kRows;
      wicore::MatMulQInt8Quantize(*q->args, begin, std::min(begin + kRows, q->args->m), q->out);
    }
  };

  static void Run(void* data, size_t i) {
    const auto* w = static_cast<const Work*>(data);
    const int64_t begin = static_cast<int64_t>(i) * w->chunk;
    const int64_t end = std::min(begin + w->chunk, w->args->n);
    wicore::MatMulQTask(*w->args, *w->packed, w->rows, begin, end, w->path, w->int8);
  }

  // Input i's data, or null where the graph gives none; checked to hold `count` elements.
  template <typename T>
  static const T* Optional(Ort::KernelContext& ctx, size_t i, size_t count, const char* what) {
    if (ctx.GetInputCount() <= i) return nullptr;
    auto v = ctx.GetInput(i);
    if (v == nullptr) return nullptr;
    Check(v.GetTensorTypeAndShapeInfo().GetElementCount() == count, std::string("wicore MatMulQ: ") + what);
    return v.GetTensorData<T>();
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto x = ctx.GetInput(0), codes = ctx.GetInput(1);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    Check(!shape.empty(), "wicore MatMulQ: x is [..., K]");
    const int64_t k = shape.back(), n = n_, m = Rows(shape);
    Check(k % 32 == 0, "wicore MatMulQ: K must be a multiple of 32");
    const int64_t stored = bits_ == 4 ? (n + 7) / 8 * 8 : n;  // 4 bits: rows in groups of 8 (kernels.h)
    Check(codes.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(stored * k * bits_ / 8),
          "wicore MatMulQ: the codes are not N rows of K * bits / 8 bytes");
    const size_t num_blocks = static_cast<size_t>(stored * (k / block_size_));
    const bool supers = blocks_per_super_ > 0;
    Check(!supers || ((k / block_size_) % blocks_per_super_ == 0 && (blocks_per_super_ & (blocks_per_super_ - 1)) == 0),
          "wicore MatMulQ: blocks_per_super must be a power of two that divides K / block_size");
    const size_t num_supers = supers ? num_blocks / blocks_per_super_ : num_blocks;
    const float* scales = Optional<float>(ctx, 2, num_blocks, "the scales are not [N, K / block_size]");
    const float* offsets = Optional<float>(ctx, 3, num_blocks, "the offsets are not [N, K / block_size]");
    const auto* scale_ints = Optional<int8_t>(ctx, 5, num_blocks, "the scale ints are not [N, K / block_size]");
    const auto* min_ints = Optional<int8_t>(ctx, 7, num_blocks, "the min ints are not [N, K / block_size]");
    const wicore::MatMulQPacked packed{
        Optional<uint16_t>(ctx, 4, scale_ints != nullptr ? num_supers : num_blocks, "the float16 scales do not match the blocks"),
        scale_ints,
        Optional<uint16_t>(ctx, 6, min_ints != nullptr ? num_supers : num_blocks, "the float16 mins do not match the blocks"),
        min_ints, offset_scale_, blocks_per_super_};
    Check((scales != nullptr) != (packed.scales16 != nullptr), "wicore MatMulQ: give the scales once, float32 or float16");
    Check(offsets == nullptr || packed.mins16 == nullptr, "wicore MatMulQ: give the offsets once, float32 or float16");
    Check((scale_ints == nullptr || packed.scales16 != nullptr) && (min_ints == nullptr || packed.mins16 != nullptr) &&
              (!(scale_ints != nullptr || min_ints != nullptr) || supers),
          "wicore MatMulQ: ints need their float16 super-block scales and blocks_per_super");
    shape.back() = n;
    auto y = ctx.GetOutput(0, shape);
    if (m == 0 || n == 0) return;
    // Where the narrow forms stand in, the kernels read their float32 values from per-task buffers (scales /
    // offsets then non-null only as a sign that they exist).
    const float* has_offsets = offsets != nullptr ? offsets : packed.mins16 != nullptr ? reinterpret_cast<const float*>(packed.mins16) : nullptr;
    const wicore::MatMulQArgs args{x.GetTensorData<float>(), codes.GetTensorData<uint8_t>(),
                                   scales != nullptr ? scales : reinterpret_cast<const float*>(packed.scales16),
                                   has_offsets, y.GetTensorMutableData<float>(), m, n, k, block_size_, static_cast<int>(bits_),
                                   residual_, static_cast<int>(zero_point_)};
    // int8 only where a row of the batch holds 32+ tokens, a prompt chunk: the engine's batches are [rows, seq]
    // (wicore/executor/batch.py), so a decode step of 32+ streams ([rows, 1]) and a speculative step's few tokens
    // a row keep the float GEMM and its accuracy; decode rows padded into a prompt's step take what it takes
    const bool is_prompt = shape.size() < 3 || shape[shape.size() - 2] >= wicore::kMatMulQFloatRows;
    const bool is_int8 = wicore::MatMulQInt8Runs(args, path_, is_int8_prompt_ && is_prompt);
    const bool is_float = is_int8 || wicore::MatMulQFloatRuns(args, path_);  // a prompt: no QuantRow rows
    // The quantized rows, in this thread's buffers: a decode step's ~100 MatMulQ calls allocate nothing (the tasks
    // read them only during this call)
    thread_local std::vector<wicore::QuantRow> rows;
    thread_local wicore::MatMulQInt8Rows int8;
    if (!is_float) wicore::MatMulQQuantize(wicore::MatMulQQuantizeArgs(args), path_, &rows);
    if (is_int8) {  // x's rows in tasks of 16: at K = 2048 one thread's pass cost as much as a tenth of the GEMM
      wicore::MatMulQInt8Resize(args, &int8);
      Quantize quantize{&args, &int8};
      ctx.ParallelFor(&Quantize::Run, static_cast<size_t>((m + Quantize::kRows - 1) / Quantize::kRows), 0, &quantize);
    }
    constexpr int64_t kChunk = 64;  // weight rows a task (a multiple of the 4-bit groups of 8)
    Work work{&args, &packed, is_float ? nullptr : &rows, is_int8 ? &int8 : nullptr, kChunk, path_};
    const int64_t tasks = (n + kChunk - 1) / kChunk;
    ctx.ParallelFor(&Run, static_cast<size_t>(tasks), 0, &work);
  }

  int64_t bits_, block_size_, n_;
  bool residual_;
  int64_t zero_point_, blocks_per_super_;
  float offset_scale_;
  wicore::MatMulQPath path_;
  bool is_int8_prompt_;
};

struct MatMulQOp : Ort::CustomOpBase<MatMulQOp, MatMulQKernel> {
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new MatMulQKernel(info); }
  const char* GetName() const { return "MatMulQ"; }
  const char* GetExecutionProviderType() const { return nullptr; }
  size_t GetInputTypeCount() const { return 8; }
  Type GetInputType(size_t i) const {
    switch (i) {
      case 1: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
      case 4: case 6: return kF16;
      case 5: case 7: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
      default: return kF32;
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kF32; }
};

// -- float32 gated activation (CPU) ---------------------------------------------------------
struct GatedF32Kernel {
  explicit GatedF32Kernel(const OrtKernelInfo* info) {
    const auto name = Ort::ConstKernelInfo(info).GetAttribute<std::string>("activation");
    Check(name == "silu" || name == "gelu_tanh", "wicore GatedActivation: activation must be silu or gelu_tanh");
    act_ = name == "silu" ? wicore::Activation::kSilu : wicore::Activation::kGeluTanh;
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto in = ctx.GetInput(0);
    int64_t rows = 0, inter = 0;
    auto out = GatedOutput(ctx, in, "wicore GatedActivation", &rows, &inter);
    wicore::GatedActivationF32Cpu(in.GetTensorData<float>(), act_, rows, inter, out.GetTensorMutableData<float>());
  }

  wicore::Activation act_;
};

struct GatedF32Op : Ort::CustomOpBase<GatedF32Op, GatedF32Kernel> {
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new GatedF32Kernel(info); }
  const char* GetName() const { return "GatedActivation"; }
  const char* GetExecutionProviderType() const { return nullptr; }
  size_t GetInputTypeCount() const { return 1; }
  Type GetInputType(size_t) const { return kF32; }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kF32; }
};

// The ops live as long as the process: a session holds pointers to them.
std::vector<OrtCustomOp*>* MakeOps() {
  auto* ops = new std::vector<OrtCustomOp*>;
  std::vector<bool> eps{false};
#ifdef WICORE_CUDA
  eps.push_back(true);
#endif
  for (bool cuda : eps) {
    ops->push_back(new ResidualNormOp(false, cuda));
    ops->push_back(new ResidualNormOp(true, cuda));
    ops->push_back(new GatedOp(wicore::Activation::kGeluTanh, cuda));
    ops->push_back(new GatedOp(wicore::Activation::kSilu, cuda));
    wicore::ops::AddAttentionOps(ops, cuda);
    wicore::ops::AddMatMulQ16Ops(ops, cuda);
    wicore::ops::AddMatMulI8Ops(ops, cuda);
  }
  ops->push_back(new MatMulQOp());  // CPU only
  ops->push_back(new GatedF32Op());
  wicore::ops::AddGreedyOps(ops);  // CPU only
  return ops;
}

}  // namespace

extern "C" {

// Whether this build has the CUDA kernels (wicore.kernels checks it before a CUDA session uses them).
__attribute__((visibility("default"))) int WicoreHasCuda() {
#ifdef WICORE_CUDA
  return 1;
#else
  return 0;
#endif
}

// Whether MatMulQ's fast path (AVX-512 VNNI) runs on this CPU (wicore.kernels: the CPU export's default).
__attribute__((visibility("default"))) int WicoreHasVnni() { return wicore::MatMulQHasVnni() ? 1 : 0; }

// Whether MatMulQ's steps of 32+ rows take its float GEMM on this CPU (matmul_q_float.cc: AVX-512 or AVX2; the
// portable path keeps the int8 arithmetic); WICORE_MATMULQ_PATH as the kernels read it.
__attribute__((visibility("default"))) int WicoreFloatPrompts() {
  return wicore::MatMulQPathFor(std::getenv("WICORE_MATMULQ_PATH")) != wicore::MatMulQPath::kScalar ? 1 : 0;
}

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    return nullptr;  // an ONNX Runtime older than the headers: nothing registered, the session names the op it lacks
  }
  Ort::InitApi(api);
  static std::vector<OrtCustomOp*>* ops = MakeOps();
  static std::once_flag once;
  static OrtCustomOpDomain* domain = nullptr;
  OrtStatus* status = nullptr;
  std::call_once(once, [&] {
    status = api->CreateCustomOpDomain(kDomain, &domain);
    for (size_t i = 0; status == nullptr && i < ops->size(); ++i) status = api->CustomOpDomain_Add(domain, (*ops)[i]);
  });
  if (status != nullptr) return status;
  return api->AddCustomOpDomain(options, domain);
}

}  // extern "C"
