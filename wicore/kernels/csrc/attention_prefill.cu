// Prefill chunks on CUDA (attention_common.cuh): BlockAttentionQKV's prologue kernel, then the attention
// over spans of keys longer than one decode split holds.
#include "attention_common.cuh"

namespace wicore {
namespace {

// BlockAttentionQKV's prologue for prefill chunks (the decode kernel does its own, attention.cu): one block a
// (head, token) over the heads of q then k: normed with its weight, rotated at the token's position, q times
// the scale into q_out [tokens, num_heads, D], k and the head's v into the pools at slot_mapping.
__global__ void __launch_bounds__(kThreads) PrologueKernel(BlockAttentionCudaArgs a, uint16_t* __restrict__ q_out) {
  __shared__ float red[kWarps];
  const int64_t token = blockIdx.y, D = a.head_dim, H = D / 2;
  const int head = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool is_q = head < a.num_heads;
  const int kvh = is_q ? 0 : head - static_cast<int>(a.num_heads);
  const uint16_t* x = a.qkv + token * (a.num_heads + 2 * a.num_kv_heads) * D + head * D;
  const uint16_t* w = is_q ? a.q_norm : a.k_norm;
  float inv = 1.0f;
  if (w != nullptr) {
    float ss = 0.0f;
    for (int64_t d = tid; d < D; d += kThreads) ss += Half(x[d]) * Half(x[d]);
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int i = 0; i < kWarps; ++i) ss += red[i];
    inv = rsqrtf(ss / static_cast<float>(D) + a.epsilon);
  }
  const int64_t pos = a.positions[token], slot = a.slot_mapping[token];
  const int64_t kv_row = a.num_kv_heads * D;
  uint16_t* dst = is_q ? q_out + (token * a.num_heads + head) * D : const_cast<uint16_t*>(a.k_pool) + slot * kv_row + kvh * D;
  const float scale = is_q ? a.scale : 1.0f;
  for (int64_t d = tid; d < H; d += kThreads) {
    const float2 y = NormRotate(a, w, inv, pos, d, H, Half(x[d]), Half(x[d + H]));
    dst[d] = ToHalf(y.x * scale);
    dst[d + H] = ToHalf(y.y * scale);
  }
  if (!is_q) {  // the head's v as it is
    const uint16_t* v = x + a.num_kv_heads * D;
    uint16_t* v_dst = const_cast<uint16_t*>(a.v_pool) + slot * kv_row + kvh * D;
    for (int64_t d = tid; d < D; d += kThreads) v_dst[d] = v[d];
  }
}

// Prefill chunks (seq > 1) whose keys one decode split does not hold (past kMaxKeys: long full-attention
// rows), where the tensor-core tiles (attention_tiles.cu) cannot run: one block a (token, query head), every visible key's score in shared memory (up to kPrefillKeys;
// longer spans in passes with a running max and sum), a thread a dimension for p·v. Correct and simple,
// not fast (a 1,024-key window took ~16 us a token and layer on an H200, docs/PERFORMANCE.md).
constexpr int kPrefillKeys = 2048;

__global__ void __launch_bounds__(kThreads) PrefillKernel(BlockAttentionCudaArgs a) {
  __shared__ float scores[kPrefillKeys];
  __shared__ float red[kWarps];
  const int64_t token = blockIdx.y, row = token / a.seq;
  const int head = blockIdx.x, kvh = head / (a.num_heads / a.num_kv_heads);
  const int D = a.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t first = a.first_block != nullptr ? a.first_block[row] * a.block_size : 0;
  const Visible vis = VisibleKeys(a, token, first);
  const uint16_t* q = a.q + (token * a.num_heads + head) * D;
  const int64_t row_stride = static_cast<int64_t>(a.num_kv_heads) * D;
  float m = -INFINITY, l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // dimensions tid, tid + 128, ... (head_dim <= 512)
  for (int64_t base = vis.lo; base < vis.hi; base += kPrefillKeys) {
    const int n = static_cast<int>(vis.hi - base < kPrefillKeys ? vis.hi - base : kPrefillKeys);
    for (int j = warp; j < n; j += kWarps) {  // a warp a key
      const uint16_t* k = a.k_pool + Slot(a, row, first, base + j) * row_stride + kvh * D;
      float s = 0.0f;
      for (int d = lane; d < D; d += 32) s += Half(q[d]) * Half(k[d]);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) scores[j] = Softcap(a, s);
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = tid; j < n; j += kThreads) mx = fmaxf(mx, scores[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, red[w]);
    const float m_new = fmaxf(m, mx), rescale = m == -INFINITY ? 0.0f : __expf(m - m_new);
    __syncthreads();
    float part_l = 0.0f;
    for (int j = tid; j < n; j += kThreads) {
      const float p = __expf(scores[j] - m_new);
      scores[j] = p;
      part_l += p;
    }
    for (int o = 16; o > 0; o >>= 1) part_l += __shfl_xor_sync(0xffffffffu, part_l, o);
    if (lane == 0) red[warp] = part_l;
    __syncthreads();
    part_l = 0.0f;
    for (int w = 0; w < kWarps; ++w) part_l += red[w];
    l = l * rescale + part_l;
    for (int i = 0; i < 4; ++i) {
      const int d = tid + i * kThreads;
      if (d >= D) break;
      float total = acc[i] * rescale;
      for (int j = 0; j < n; ++j) total += scores[j] * Half(a.v_pool[Slot(a, row, first, base + j) * row_stride + kvh * D + d]);
      acc[i] = total;
    }
    m = m_new;
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int d = tid + i * kThreads;
    if (d >= D) break;
    a.out[(token * a.num_heads + head) * D + d] = ToHalf(l > 0.0f ? acc[i] / l : 0.0f);
  }
}

}  // namespace

const uint16_t* LaunchPrologue(const BlockAttentionCudaArgs& a, void* workspace, cudaStream_t stream) {
  auto* q = static_cast<uint16_t*>(workspace);
  const dim3 grid(static_cast<unsigned>(a.num_heads + a.num_kv_heads), static_cast<unsigned>(a.batch * a.seq));
  PrologueKernel<<<grid, kThreads, 0, stream>>>(a, q);
  return q;
}

int LaunchPrefill(const BlockAttentionCudaArgs& args, void* workspace, cudaStream_t stream) {
  BlockAttentionCudaArgs a = args;
  if (a.qkv != nullptr) a.q = LaunchPrologue(a, workspace, stream);
  const dim3 grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.batch * a.seq));
  PrefillKernel<<<grid, kThreads, 0, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace wicore
