// The attention ops over the paged KV pools (kernels.h): BlockAttention (q given) and BlockAttentionQKV
// (the packed projection given: the q / k norms, RoPE, the scale and the K/V write inside the op).
//
// CPU: float32, block ids and slots checked against the pool. CUDA (attention.cu): float16, the tables
// and slots stay on the device unread by the host (an id outside the pool is the caller's error, as for
// ORT's PagedAttention).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels.h"
#include "ops_common.h"

namespace wicore::ops {
namespace {

// What both ops share: the attributes, the shapes and the run of the attention itself.
struct AttentionBase {
  AttentionBase(const OrtKernelInfo* info, bool cuda, const char* name) : cuda_(cuda), name_(name) {
    Ort::ConstKernelInfo k(info);
    num_heads_ = k.GetAttribute<int64_t>("num_heads");
    num_kv_heads_ = k.GetAttribute<int64_t>("num_kv_heads");
    window_ = k.GetAttribute<int64_t>("window");
    softcap_ = k.GetAttribute<float>("softcap");
    avx2_ = wicore::BlockAttentionHasAvx2() && std::getenv("WICORE_ATTENTION_SCALAR") == nullptr;
    avx512_ = avx2_ && wicore::BlockAttentionHasAvx512() && std::getenv("WICORE_ATTENTION_AVX2") == nullptr;
    Check(num_kv_heads_ > 0 && num_heads_ % num_kv_heads_ == 0, Say("num_heads must be a multiple of num_kv_heads"));
    Check(window_ >= 0 && softcap_ >= 0.0f, Say("window and softcap must not be negative"));
  }

  std::string Say(const std::string& what) const { return std::string("wicore ") + name_ + ": " + what; }

  struct Dims {
    int64_t batch, seq, head_dim, num_blocks, block_size, max_blocks;
  };

  // positions [batch, seq], pools [blocks, block_size, num_kv_heads, head_dim] alike, tables [batch, max_blocks].
  Dims Shapes(const Ort::ConstValue& positions, const Ort::ConstValue& k, const Ort::ConstValue& v,
              const Ort::ConstValue& tables) const {
    const auto pshape = positions.GetTensorTypeAndShapeInfo().GetShape();
    const auto kshape = k.GetTensorTypeAndShapeInfo().GetShape();
    const auto tshape = tables.GetTensorTypeAndShapeInfo().GetShape();
    Check(pshape.size() == 2, Say("positions are [batch, seq]"));
    Check(kshape.size() == 4 && kshape[2] == num_kv_heads_ && v.GetTensorTypeAndShapeInfo().GetShape() == kshape,
          Say("the pools are not [blocks, block_size, num_kv_heads, head_dim] alike"));
    Check(tshape.size() == 2 && tshape[0] == pshape[0], Say("block_tables are not [batch, max_blocks]"));
    return {pshape[0], pshape[1], kshape[3], kshape[0], kshape[1], tshape[1]};
  }

  void CheckRange(const int64_t* ids, int64_t n, int64_t limit, const char* message) const {
    for (int64_t i = 0; i < n; ++i) Check(ids[i] >= 0 && ids[i] < limit, Say(message));
  }

  struct Work {
    const wicore::BlockAttentionArgs* args;
    int64_t chunk, num_tasks;
  };

  static void Run(void* data, size_t i) {
    const auto* w = static_cast<const Work*>(data);
    const int64_t begin = static_cast<int64_t>(i) * w->chunk;
    wicore::BlockAttentionCpu(*w->args, begin, std::min(begin + w->chunk, w->num_tasks));
  }

  void RunCpu(Ort::KernelContext& ctx, const wicore::BlockAttentionArgs& args) const {
    const int64_t num_tasks = wicore::BlockAttentionTasks(args);
    if (num_tasks == 0) return;
    const int64_t chunk = std::max<int64_t>(1, num_tasks / 64);
    Work work{&args, chunk, num_tasks};
    ctx.ParallelFor(&Run, static_cast<size_t>((num_tasks + chunk - 1) / chunk), 0, &work);
  }

#ifdef WICORE_CUDA
  // The float16 kernels on ORT's stream; split-KV partials (and BlockAttentionQKV's prefill q) in a workspace
  // from ORT's CUDA allocator (its arena: no cudaMalloc once warm, so a CUDA graph captures the launch).
  void RunCuda(Ort::KernelContext& ctx, wicore::BlockAttentionCudaArgs args, int device) {
    Check(wicore::BlockAttentionCudaSupports(args.head_dim), Say("(CUDA) head_dim must be 64, 128 or 256"));
    if (sm_count_ == 0) sm_count_ = wicore::CudaSmCount();
    const size_t bytes = wicore::BlockAttentionCudaWorkspace(args, sm_count_);
    void* workspace = nullptr;
    Ort::Allocator allocator{nullptr};
    if (bytes > 0) {
      Ort::MemoryInfo cuda("Cuda", OrtArenaAllocator, device, OrtMemTypeDefault);
      allocator = ctx.GetAllocator(*cuda);
      workspace = allocator.Alloc(bytes);
      if (!checked_) {
        Check(wicore::CudaIsDevicePointer(workspace), Say("ORT's CUDA allocator gave no device memory"));
        checked_ = true;
      }
    }
    const int err = wicore::BlockAttentionCuda(args, sm_count_, workspace, ctx.GetGPUComputeStream());
    if (workspace != nullptr) allocator.Free(workspace);  // the arena hands it out again on this stream only after the kernels
    Check(err == 0, Say(wicore::CudaErrorString(err)));
  }
#endif

  static const uint16_t* Half(const Ort::ConstValue& t) {
    return t == nullptr ? nullptr : reinterpret_cast<const uint16_t*>(t.GetTensorData<Ort::Float16_t>());
  }
  static uint16_t* Half(Ort::UnownedValue& t) { return reinterpret_cast<uint16_t*>(t.GetTensorMutableData<Ort::Float16_t>()); }

  bool cuda_, checked_ = false;
  const char* name_;
  int sm_count_ = 0;
  int64_t num_heads_, num_kv_heads_, window_;
  float softcap_;
  bool avx2_, avx512_;
};

// -- BlockAttention: q normed, rotated and scaled before it, the K/V written ------------------------
struct BlockAttentionKernel : AttentionBase {
  BlockAttentionKernel(const OrtKernelInfo* info, bool cuda) : AttentionBase(info, cuda, "BlockAttention") {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto q = ctx.GetInput(0), k = ctx.GetInput(1), v = ctx.GetInput(2), tables = ctx.GetInput(3);
    auto positions = ctx.GetInput(4), lens = ctx.GetInput(5), first = ctx.GetInput(6);
    const Dims d = Shapes(positions, k, v, tables);
    Check(q.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(d.batch * d.seq * num_heads_ * d.head_dim),
          Say("q is not [batch, seq, num_heads * head_dim]"));
    Check(lens.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(d.batch), Say("context_lens are not [batch]"));
    const int64_t* fp = nullptr;
    if (first != nullptr) {
      Check(first.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(d.batch), Say("first_block is not [batch]"));
      fp = first.GetTensorData<int64_t>();
    }
    const int64_t* tp = tables.GetTensorData<int64_t>();
    auto out = ctx.GetOutput(0, {d.batch, d.seq, num_heads_ * d.head_dim});
    if (cuda_) {
#ifdef WICORE_CUDA
      const wicore::BlockAttentionCudaArgs args{Half(q), Half(k), Half(v), tp, positions.GetTensorData<int64_t>(),
                                                lens.GetTensorData<int64_t>(), fp, Half(out), d.batch, d.seq, num_heads_,
                                                num_kv_heads_, d.head_dim, d.block_size, d.max_blocks, window_, softcap_};
      RunCuda(ctx, args, q.GetTensorMemoryInfo().GetDeviceId());
#endif
      return;
    }
    CheckRange(tp, d.batch * d.max_blocks, d.num_blocks, "a block table names a block outside the pool");
    const wicore::BlockAttentionArgs args{q.GetTensorData<float>(), k.GetTensorData<float>(), v.GetTensorData<float>(), tp,
                                          positions.GetTensorData<int64_t>(), lens.GetTensorData<int64_t>(), fp,
                                          out.GetTensorMutableData<float>(), d.batch, d.seq, num_heads_, num_kv_heads_,
                                          d.head_dim, d.block_size, d.max_blocks, window_, softcap_, avx2_, avx512_};
    RunCpu(ctx, args);
  }
};

struct BlockAttentionOp : Ort::CustomOpBase<BlockAttentionOp, BlockAttentionKernel> {
  explicit BlockAttentionOp(bool cuda) : cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new BlockAttentionKernel(info, cuda_); }
  const char* GetName() const { return "BlockAttention"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return 7; }
  Type GetInputType(size_t i) const { return i < 3 ? (cuda_ ? kF16 : kF32) : kI64; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 6 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return cuda_ ? kF16 : kF32; }

  bool cuda_;
};

// -- BlockAttentionQKV: the prologue inside ------------------------------------------------------
// Inputs: qkv, k_pool, v_pool, block_tables, positions, slot_mapping, past_seqlens, cos_cache | -, sin_cache | -,
// q_norm | -, k_norm | -; outputs: the attention, k_pool_out, v_pool_out. Bound to the input pools (the
// runtime's IO binding) the outputs are written in place; else the pools are copied to them first.
struct BlockAttentionQKVKernel : AttentionBase {
  BlockAttentionQKVKernel(const OrtKernelInfo* info, bool cuda) : AttentionBase(info, cuda, "BlockAttentionQKV") {
    Ort::ConstKernelInfo k(info);
    scale_ = k.GetAttribute<float>("scale");
    epsilon_ = k.GetAttribute<float>("epsilon");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto qkv = ctx.GetInput(0), k = ctx.GetInput(1), v = ctx.GetInput(2), tables = ctx.GetInput(3);
    auto positions = ctx.GetInput(4), slots = ctx.GetInput(5), past = ctx.GetInput(6);
    auto cos = ctx.GetInput(7), sin = ctx.GetInput(8), q_norm = ctx.GetInput(9), k_norm = ctx.GetInput(10);
    const Dims d = Shapes(positions, k, v, tables);
    const int64_t tokens = d.batch * d.seq, hd = d.head_dim;
    Check(qkv.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(tokens * (num_heads_ + 2 * num_kv_heads_) * hd),
          Say("qkv is not [batch, seq, (num_heads + 2 num_kv_heads) * head_dim]"));
    Check(slots.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(tokens), Say("slot_mapping is not [batch, seq]"));
    Check(past.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(d.batch), Say("past_seqlens are not [batch]"));
    Check((cos == nullptr) == (sin == nullptr), Say("give both RoPE caches or neither"));
    int64_t max_position = 0;
    if (cos != nullptr) {
      const auto cshape = cos.GetTensorTypeAndShapeInfo().GetShape();
      Check(cshape.size() == 2 && cshape[1] == hd / 2 && sin.GetTensorTypeAndShapeInfo().GetShape() == cshape,
            Say("the RoPE caches are not [max_position, head_dim / 2] alike"));
      max_position = cshape[0];
    }
    Check((q_norm == nullptr) == (k_norm == nullptr), Say("give both norm weights or neither"));
    if (q_norm != nullptr) {
      Check(q_norm.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(hd) &&
                k_norm.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(hd),
            Say("the norm weights are not [head_dim]"));
    }
    const std::vector<int64_t> pool_shape{d.num_blocks, d.block_size, num_kv_heads_, hd};
    auto out = ctx.GetOutput(0, {d.batch, d.seq, num_heads_ * hd});
    auto k_out = ctx.GetOutput(1, pool_shape), v_out = ctx.GetOutput(2, pool_shape);
    const size_t pool_bytes = static_cast<size_t>(d.num_blocks * d.block_size * num_kv_heads_ * hd) * (cuda_ ? 2 : 4);
    const int64_t* tp = tables.GetTensorData<int64_t>();
    const int64_t* pp = positions.GetTensorData<int64_t>();
    const int64_t* sp = slots.GetTensorData<int64_t>();
    const int32_t* past_p = past.GetTensorData<int32_t>();
    if (cuda_) {
#ifdef WICORE_CUDA
      void* stream = ctx.GetGPUComputeStream();
      for (auto [src, dst] : {std::pair{k.GetTensorRawData(), k_out.GetTensorMutableRawData()},
                              std::pair{v.GetTensorRawData(), v_out.GetTensorMutableRawData()}}) {
        if (src == dst) continue;
        if (!warned_) {  // correct, but a copy of the whole pool a layer and step: say it once
          std::fprintf(stderr, "%s\n", Say("the pools are not bound in place (key_cache_out to key_cache): copying them").c_str());
          warned_ = true;
        }
        Check(wicore::CudaCopyAsync(dst, src, pool_bytes, stream) == 0, Say("copying a pool failed"));
      }
      wicore::BlockAttentionCudaArgs args{nullptr, Half(k_out), Half(v_out), tp, pp, nullptr, nullptr, Half(out), d.batch,
                                          d.seq, num_heads_, num_kv_heads_, hd, d.block_size, d.max_blocks, window_, softcap_};
      args.qkv = Half(qkv);
      args.slot_mapping = sp;
      args.past_seqlens = past_p;
      args.cos = Half(cos);
      args.sin = Half(sin);
      args.q_norm = Half(q_norm);
      args.k_norm = Half(k_norm);
      args.scale = scale_;
      args.epsilon = epsilon_;
      RunCuda(ctx, args, qkv.GetTensorMemoryInfo().GetDeviceId());
#endif
      return;
    }
    CheckRange(tp, d.batch * d.max_blocks, d.num_blocks, "a block table names a block outside the pool");
    CheckRange(sp, tokens, d.num_blocks * d.block_size, "slot_mapping names a slot outside the pool");
    if (cos != nullptr) CheckRange(pp, tokens, max_position, "a position is past the RoPE caches");
    float* kp = k_out.GetTensorMutableData<float>();
    float* vp = v_out.GetTensorMutableData<float>();
    if (k.GetTensorRawData() != kp) std::memcpy(kp, k.GetTensorRawData(), pool_bytes);
    if (v.GetTensorRawData() != vp) std::memcpy(vp, v.GetTensorRawData(), pool_bytes);
    const auto data = [](const Ort::ConstValue& t) { return t == nullptr ? nullptr : t.GetTensorData<float>(); };
    std::vector<float> q(static_cast<size_t>(tokens * num_heads_ * hd));
    const wicore::QKVPrologueArgs pro{qkv.GetTensorData<float>(), pp, sp, data(cos), data(sin), data(q_norm), data(k_norm),
                                      tokens, num_heads_, num_kv_heads_, hd, scale_, epsilon_};
    wicore::BlockAttentionQKVPrologueCpu(pro, q.data(), kp, vp);
    std::vector<int64_t> lens(static_cast<size_t>(d.batch));
    for (int64_t r = 0; r < d.batch; ++r) lens[r] = past_p[r] + d.seq;
    const wicore::BlockAttentionArgs args{q.data(), kp, vp, tp, pp, lens.data(), nullptr, out.GetTensorMutableData<float>(),
                                          d.batch, d.seq, num_heads_, num_kv_heads_, hd, d.block_size, d.max_blocks,
                                          window_, softcap_, avx2_, avx512_};
    RunCpu(ctx, args);
  }

  float scale_, epsilon_;
  bool warned_ = false;
};

struct BlockAttentionQKVOp : Ort::CustomOpBase<BlockAttentionQKVOp, BlockAttentionQKVKernel> {
  explicit BlockAttentionQKVOp(bool cuda) : cuda_(cuda) {}
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new BlockAttentionQKVKernel(info, cuda_); }
  const char* GetName() const { return "BlockAttentionQKV"; }
  const char* GetExecutionProviderType() const { return cuda_ ? kCuda : nullptr; }
  size_t GetInputTypeCount() const { return 11; }
  Type GetInputType(size_t i) const {
    if (i >= 3 && i <= 5) return kI64;
    return i == 6 ? kI32 : (cuda_ ? kF16 : kF32);
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= 7 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  Type GetOutputType(size_t) const { return cuda_ ? kF16 : kF32; }

  bool cuda_;
};

}  // namespace

void AddAttentionOps(std::vector<OrtCustomOp*>* ops, bool cuda) {
  ops->push_back(new BlockAttentionOp(cuda));
  ops->push_back(new BlockAttentionQKVOp(cuda));
}

}  // namespace wicore::ops
