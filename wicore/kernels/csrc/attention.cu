// BlockAttention on CUDA (kernels.h): float16 q, pools and output, float32 arithmetic; the CPU op
// (attention_cpu.cc) is the reference and these kernels compute the same thing.
//
// Decode (one query token a row), flash-decoding:
//
//   grid (KV head x query-head chunk, token, split) ── each block: `keys_per_split` of the token's visible keys
//     prologue (BlockAttentionQKV) the block's G q heads and its KV head's k, v from the token's qkv row into
//              shared memory: normed, rotated, q scaled, k rounded to half as the pool keeps it; the block of
//              chunk 0 and split 0 writes k and v to the pools, and every block takes the token's own key
//              from shared memory, not from the pool (no block of this launch reads that slot: no race)
//     phase 0  the split's pool rows (slots) from the block tables into shared memory, all at once
//     phase 1  one key a group of D / 8 lanes (16-byte loads of K), U keys a group in flight
//              (kKeysInFlight), q·k for the chunk's G query heads at once (each K byte read once for
//              them: GQA), softcap, scores into shared memory
//     softmax  a warp per query head: max, exp, sum
//     phase 2  the same lane groups read V (16-byte loads, U in flight) and accumulate p·v in float32, then reduce
//   splits == 1: the block writes out / sum; else partial sums, maxima and sums to the workspace and
//   CombineKernel merges a head's splits (log-sum-exp weights).
//
// The splits come from the shapes only (the host never reads positions or lengths): enough blocks for
// kBlocksPerSm on every SM (a row's keys over many SMs where the batch is small: batch 1 at 4K of
// context), each split at least 64 keys and at most kMaxKeys. Rows with more tokens (prefill chunks) take
// tiles of query rows on tensor cores (attention_tiles.cu, after BlockAttentionQKV's prologue kernel,
// attention_prefill.cu). Where a block cannot have the tiles' shared memory (sm_75 at head dim 128), or with
// WICORE_PREFILL_ATTENTION=decode, they take this kernel, a block a token, where one split holds a token's
// keys, and longer spans PrefillKernel (attention_prefill.cu): one block a (token, query head), no split.
//
// Differences from the CPU op: the CPU op gives a key 80 or more below the top score weight 0, this
// one exp() of it (below 2e-35 of the top key's weight either way); the sums run in another order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention_common.cuh"

namespace wicore {
namespace {

// Shared memory of the decode prologue: q [G][D], k [D], v [D], the heads' 1 / rms [G + 1].
template <int D, int G>
constexpr int kPrologueFloats = G * D + 2 * D + G + 1;

// BlockAttentionQKV's prologue for one decode block (the module comment): into fq [G][D], fk, fv (consecutive).
template <int D, int G>
__device__ void Prologue(const BlockAttentionCudaArgs& a, int64_t token, int kvh, int head0, bool writes, float* fq) {
  constexpr int H = D / 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float *fk = fq + G * D, *fv = fk + D, *inv = fv + D;
  const uint16_t* row = a.qkv + token * (a.num_heads + 2 * a.num_kv_heads) * D;
  for (int i = tid; i < (G + 2) * D; i += kThreads) {
    const int h = i / D;
    const int64_t col = h < G ? head0 + h : h == G ? a.num_heads + kvh : a.num_heads + a.num_kv_heads + kvh;
    fq[i] = Half(row[col * D + i % D]);
  }
  __syncthreads();
  for (int h = warp; h <= G; h += kWarps) {
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) ss += fq[h * D + d] * fq[h * D + d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) inv[h] = a.q_norm != nullptr ? rsqrtf(ss / D + a.epsilon) : 1.0f;
  }
  __syncthreads();
  const int64_t pos = a.positions[token];
  for (int i = tid; i < (G + 1) * H; i += kThreads) {  // a thread a pair (d, d + D / 2) of one head
    const int h = i / H, d = i % H;
    float* x = fq + h * D;
    const float2 y = NormRotate(a, h < G ? a.q_norm : a.k_norm, inv[h], pos, d, H, x[d], x[d + H]);
    if (h < G) {
      x[d] = y.x * a.scale;
      x[d + H] = y.y * a.scale;
    } else {  // the key as the pool keeps it
      x[d] = Half(ToHalf(y.x));
      x[d + H] = Half(ToHalf(y.y));
    }
  }
  __syncthreads();
  if (writes) {
    const int64_t at = a.slot_mapping[token] * a.num_kv_heads * D + kvh * D;
    for (int d = tid; d < D; d += kThreads) {
      const_cast<uint16_t*>(a.k_pool)[at + d] = ToHalf(fk[d]);
      const_cast<uint16_t*>(a.v_pool)[at + d] = ToHalf(fv[d]);
    }
  }
}

// Keys a lane group has in flight: each lane issues U 16-byte loads before it uses any. With one at a
// time (and the block tables read between them) the kernel read K/V at 2.6-2.7 TB/s on an H200, latency
// bound at ~36 resident warps an SM (docs/PERFORMANCE.md); U keys multiply the bytes in flight by U. The
// raw loads cost 4 U registers beside q [G][8] (phase 1) or the accumulators [G][8] (phase 2).
template <int G>
constexpr int kKeysInFlight = G <= 4 ? 4 : 2;

// Slots of keys past the split's end (the loads skip them); the token's own key is -1 (kFused: shared memory).
constexpr int64_t kNoKey = -2;

// D: head_dim; G: query heads a block (a divisor of the group size). T = D / 8 lanes hold one key row.
// kFused: BlockAttentionQKV (the prologue first; q, the new k and v from shared memory).
template <int D, int G, bool kFused>
__global__ void __launch_bounds__(kThreads) DecodeKernel(BlockAttentionCudaArgs a, int chunks, int splits, int keys_per_split,
                                                         float* __restrict__ part, float* __restrict__ part_ml) {
  constexpr int T = D / 8, KG = kThreads / T, U = kKeysInFlight<G>;
  extern __shared__ float smem[];
  float* scores = smem;                                          // [G][keys_per_split], later the warps' sums [kWarps][G][D]
  const int region = max(G * keys_per_split, kWarps * G * D);
  int64_t* slots = reinterpret_cast<int64_t*>(smem + (region + 1) / 2 * 2);  // [keys_per_split]
  float* stats = reinterpret_cast<float*>(slots + keys_per_split);         // m [G], l [G]
  float* fq = stats + 2 * G;                                               // kFused: kPrologueFloats

  const int64_t token = blockIdx.y, row = token / a.seq;
  const int kvh = blockIdx.x / chunks, head0 = kvh * (a.num_heads / a.num_kv_heads) + (blockIdx.x % chunks) * G;
  const int split = blockIdx.z;
  const int64_t first = a.first_block != nullptr ? a.first_block[row] * a.block_size : 0;
  const Visible vis = VisibleKeys(a, token, first);
  const int64_t begin = vis.lo + static_cast<int64_t>(split) * keys_per_split;
  const int64_t end_all = vis.hi, end = begin + keys_per_split < end_all ? begin + keys_per_split : end_all;
  const int n = end > begin ? static_cast<int>(end - begin) : 0;
  const int tid = threadIdx.x, sub = tid % T, kg = tid / T, lane = tid & 31, warp = tid >> 5;
  const int64_t own = a.positions[token];  // kFused: the key of this step's token, in shared memory
  const bool writes = blockIdx.x % chunks == 0 && split == 0;  // kFused: this block writes the token's k and v
  // phase 0: the split's pool rows, every table entry read once, all in flight together
  for (int j = tid; j < n; j += kThreads) slots[j] = kFused && begin + j == own ? -1 : Slot(a, row, first, begin + j);
  if constexpr (kFused) {
    if (n > 0 || writes) Prologue<D, G>(a, token, kvh, head0, writes, fq);  // its first barrier publishes the slots
  }

  if (n == 0) {  // nothing visible in this split
    if (splits > 1) {
      if (tid < G) {
        const int64_t h = token * a.num_heads + head0 + tid;
        part_ml[(h * splits + split) * 2] = -INFINITY;
        part_ml[(h * splits + split) * 2 + 1] = 0.0f;
      }
    } else {
      for (int i = tid; i < G * D; i += kThreads) a.out[(token * a.num_heads + head0) * D + i] = ToHalf(0.0f);
    }
    return;
  }
  if constexpr (!kFused) __syncthreads();  // the slots

  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if constexpr (kFused) {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = fq[g * D + sub * 8 + e];
    } else {
      Load8(a.q + (token * a.num_heads + head0 + g) * D + sub * 8, q[g]);
    }
  }
  const int64_t row_stride = static_cast<int64_t>(a.num_kv_heads) * D;
  const int64_t column = kvh * D + sub * 8;  // this lane's 8 dimensions of its KV head in a pool row

  // phase 1: scores, U keys a lane group at a time (key j0 + u * KG + kg: the warp's lane groups on neighbours)
  for (int j0 = 0; j0 < n; j0 += U * KG) {  // every lane the same trips: the shuffles need the whole warp
    int64_t slot[U];
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * KG + kg;
      slot[u] = j < n ? slots[j] : kNoKey;
      raw[u] = slot[u] >= 0 ? *reinterpret_cast<const uint4*>(a.k_pool + slot[u] * row_stride + column) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * KG + kg;
      float k[8];
      if (kFused && slot[u] == -1) {
#pragma unroll
        for (int e = 0; e < 8; ++e) k[e] = fq[G * D + sub * 8 + e];
      } else {
        Unpack8(raw[u], k);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += q[g][e] * k[e];
#pragma unroll
        for (int o = T / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (sub == 0 && j < n) scores[g * keys_per_split + j] = Softcap(a, s);
      }
    }
  }
  __syncthreads();

  // softmax: a warp a query head
  for (int g = warp; g < G; g += kWarps) {
    float* s = scores + g * keys_per_split;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = __expf(s[j] - m);
      s[j] = p;
      l += p;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      stats[g] = m;
      stats[G + g] = l;
    }
  }
  __syncthreads();

  // phase 2: p·v, U keys a lane group at a time as in phase 1
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  for (int j0 = 0; j0 < n; j0 += U * KG) {
    int64_t slot[U];
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * KG + kg;
      slot[u] = j < n ? slots[j] : kNoKey;
      raw[u] = slot[u] >= 0 ? *reinterpret_cast<const uint4*>(a.v_pool + slot[u] * row_stride + column) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * KG + kg;
      if (slot[u] == kNoKey) continue;
      float v[8];
      if (kFused && slot[u] == -1) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = fq[(G + 1) * D + sub * 8 + e];
      } else {
        Unpack8(raw[u], v);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = scores[g * keys_per_split + j];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * v[e];
      }
    }
  }
  // the warp's key groups, then the warps
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
#pragma unroll
      for (int o = T; o < 32; o <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
  }
  __syncthreads();  // the scores are read: their memory takes the warps' sums
  float* sums = scores;
  if (lane < T) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sums[(warp * G + g) * D + sub * 8 + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w * G * D + i];
    const int g = i / D;
    const int64_t h = token * a.num_heads + head0 + g;
    if (splits == 1) {
      a.out[h * D + i % D] = ToHalf(total / stats[G + g]);
    } else {
      part[(h * splits + split) * D + i % D] = total;
      if (i % D == 0) {
        part_ml[(h * splits + split) * 2] = stats[g];
        part_ml[(h * splits + split) * 2 + 1] = stats[G + g];
      }
    }
  }
}

// The block's (kThreads) maximum or sum of one value a thread, in every thread (`red`: kWarps floats).
template <bool kMax>
__device__ float BlockReduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (int i = 1; i < kWarps; ++i) v = kMax ? fmaxf(v, red[i]) : v + red[i];
  __syncthreads();  // red may be written again
  return v;
}

// One block (kThreads) a (token, query head): the splits' partial sums weighted by exp(m_s - M) / L. The
// weights first, the splits spread over the threads, into shared memory [splits]; then a thread a
// dimension sums the splits with independent loads (one split after another, each load waiting on the
// last one's sums, took 17.9 us over 64 splits at batch 1, 4K of context, on an H200).
__global__ void __launch_bounds__(kThreads) CombineKernel(const float* __restrict__ part, const float* __restrict__ part_ml,
                                                          int splits, int head_dim, uint16_t* __restrict__ out) {
  extern __shared__ float weight[];  // [splits]: exp(m_s - M) of the splits that saw keys, 0 for the empty ones
  __shared__ float red[kWarps];
  const int64_t h = blockIdx.x;
  const float* ml = part_ml + h * splits * 2;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kThreads) m = fmaxf(m, ml[2 * s]);
  m = BlockReduce<true>(m, red);
  float l = 0.0f;
  for (int s = threadIdx.x; s < splits; s += kThreads) {
    const float w = ml[2 * s + 1] > 0.0f ? __expf(ml[2 * s] - m) : 0.0f;  // an empty split wrote no partial sums
    weight[s] = w;
    l += ml[2 * s + 1] * w;
  }
  l = BlockReduce<false>(l, red);  // its barrier publishes the weights
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float w = weight[s];
      if (w > 0.0f) total += part[(h * splits + s) * head_dim + d] * w;
    }
    out[h * head_dim + d] = ToHalf(l > 0.0f ? total / l : 0.0f);
  }
}

// Blocks the split-KV plan aims at an SM: about what one SM holds at once (7-9 blocks of 128 threads
// by registers), so that at batch 1 every SM has several blocks' loads in flight (2 left batch 1 at 4K
// of context 3.9x slower than cuDNN's kernel, docs/PERFORMANCE.md).
constexpr int64_t kBlocksPerSm = 8;

struct Plan {
  int chunk;           // query heads a block
  int splits, keys_per_split;
};

Plan MakePlan(const BlockAttentionCudaArgs& a, int sm_count) {
  const int groups = static_cast<int>(a.num_heads / a.num_kv_heads);
  int chunk = 8;
  while (groups % chunk != 0) chunk /= 2;
  int64_t keys = a.max_blocks * a.block_size;
  if (a.window > 0 && a.window < keys) keys = a.window;
  keys = std::max<int64_t>(keys, 1);
  const int64_t blocks = a.batch * a.seq * a.num_kv_heads * (groups / chunk);
  int64_t splits = (kBlocksPerSm * static_cast<int64_t>(sm_count) + blocks - 1) / blocks;
  splits = std::min<int64_t>(splits, (keys + 63) / 64);                 // at least 64 keys a split
  splits = std::max<int64_t>(splits, (keys + kMaxKeys - 1) / kMaxKeys);  // at most kMaxKeys
  splits = std::max<int64_t>(splits, 1);
  int64_t per = (keys + splits - 1) / splits;
  per = (per + 31) / 32 * 32;
  splits = (keys + per - 1) / per;
  return {chunk, static_cast<int>(splits), static_cast<int>(per)};
}

template <int D, int G>
int LaunchDecode(const BlockAttentionCudaArgs& a, const Plan& plan, void* workspace, cudaStream_t stream) {
  const int chunks = static_cast<int>(a.num_heads / a.num_kv_heads) / G;
  const int region = std::max(G * plan.keys_per_split, kWarps * G * D);
  const bool fused = a.qkv != nullptr;
  const size_t shared = static_cast<size_t>((region + 1) / 2 * 2) * sizeof(float) +
                        static_cast<size_t>(plan.keys_per_split) * sizeof(int64_t) +
                        (2 * G + (fused ? kPrologueFloats<D, G> : 0)) * sizeof(float);
  auto kernel = fused ? DecodeKernel<D, G, true> : DecodeKernel<D, G, false>;
  if (shared > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  const dim3 grid(static_cast<unsigned>(a.num_kv_heads * chunks), static_cast<unsigned>(a.batch * a.seq),
                  static_cast<unsigned>(plan.splits));
  float* part = static_cast<float*>(workspace);
  float* part_ml = part == nullptr ? nullptr : part + a.batch * a.seq * a.num_heads * plan.splits * D;
  kernel<<<grid, kThreads, shared, stream>>>(a, chunks, plan.splits, plan.keys_per_split, part, part_ml);
  if (plan.splits > 1) {
    CombineKernel<<<static_cast<unsigned>(a.batch * a.seq * a.num_heads), kThreads, plan.splits * sizeof(float), stream>>>(
        part, part_ml, plan.splits, D, a.out);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int D>
int DispatchGroups(const BlockAttentionCudaArgs& a, const Plan& plan, void* workspace, cudaStream_t stream) {
  switch (plan.chunk) {
    case 8: return LaunchDecode<D, 8>(a, plan, workspace, stream);
    case 4: return LaunchDecode<D, 4>(a, plan, workspace, stream);
    case 2: return LaunchDecode<D, 2>(a, plan, workspace, stream);
    default: return LaunchDecode<D, 1>(a, plan, workspace, stream);
  }
}

// WICORE_PREFILL_ATTENTION=decode: prefill chunks on the decode kernel's path, as before the tiles (an A/B of
// the two on the same export; read once).
bool PrefillOnTiles() {
  static const bool tiles = [] {
    const char* v = std::getenv("WICORE_PREFILL_ATTENTION");
    return v == nullptr || std::string(v) != "decode";
  }();
  return tiles;
}

}  // namespace

bool BlockAttentionCudaSupports(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

size_t BlockAttentionCudaWorkspace(const BlockAttentionCudaArgs& a, int sm_count) {
  if (a.batch == 0) return 0;
  if (a.seq != 1) return a.qkv != nullptr ? static_cast<size_t>(a.batch * a.seq * a.num_heads * a.head_dim) * sizeof(uint16_t) : 0;
  const Plan plan = MakePlan(a, sm_count);
  if (plan.splits == 1) return 0;
  const size_t heads = static_cast<size_t>(a.batch * a.num_heads) * plan.splits;
  return heads * (static_cast<size_t>(a.head_dim) + 2) * sizeof(float);
}

int BlockAttentionCuda(const BlockAttentionCudaArgs& args, int sm_count, void* workspace, void* stream) {
  if (args.batch == 0 || args.seq == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  const Plan plan = MakePlan(args, sm_count);
  // Prefill chunks (seq > 1): BlockAttentionQKV's prologue kernel first, q into the workspace, k and v into the
  // pools (a kernel's own prologue would race: a block reads keys that other tokens' blocks write); then the
  // tiles, or else the decode kernel, a block a (token, KV head), where one split holds a token's keys (no
  // partial sums to keep for every token: windows and contexts up to kMaxKeys), and PrefillKernel past that.
  BlockAttentionCudaArgs a = args;
  if (a.seq > 1) {
    // tiles of queries on tensor cores (attention_tiles.cu); else, where a block cannot have their shared memory
    // (sm_75 at head dim 128) or WICORE_PREFILL_ATTENTION=decode, the decode kernel or PrefillKernel
    const bool tiles = PrefillOnTiles() && FlashTilesFit(a.head_dim);
    if (!tiles && plan.splits > 1) return LaunchPrefill(a, workspace, s);
    if (a.qkv != nullptr) {
      a.q = LaunchPrologue(a, workspace, s);
      a.qkv = nullptr;  // the kernels below without a prologue; context_lens stays null: past_seqlens + seq
    }
    if (tiles) return LaunchFlashTiles(a, s);
  }
  switch (a.head_dim) {
    case 64: return DispatchGroups<64>(a, plan, workspace, s);
    case 128: return DispatchGroups<128>(a, plan, workspace, s);
    default: return DispatchGroups<256>(a, plan, workspace, s);
  }
}

bool CudaIsDevicePointer(const void* p) {
  cudaPointerAttributes attr{};
  return cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeDevice;
}

int CudaSmCount() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  return std::max(count, 1);
}

}  // namespace wicore
