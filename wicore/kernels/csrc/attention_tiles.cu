// Prefill chunks (seq > 1) on tensor cores: a block of query rows against tiles of keys, FlashAttention's
// online softmax, q·k and p·v as WMMA 16x16x16 products (float16 in, float32 sums).
//
//   grid (query tile, KV head, row) ── a tile: kRows = 16 x warps query rows of one row's chunk and one KV
//   head, query row r the pair (token r / G, query head r % G) of the G heads that share the KV head, so
//   each key tile is read once for all of them (GQA)
//     keys  the union of the tile's visible spans (VisibleKeys), kKeys a tile: their pool rows (Slot, a
//           thread a key, a tile ahead), K and V into shared memory by cp.async, pipelined: the next tile's K
//           loads while this one's P and P V compute, its V while its S does (keys past the union or in a
//           gap of it zero, never read)
//     S     a warp's 16 rows x kKeys: WMMA over the head dimension (q's fragments kept in registers where
//           D <= 128), into shared memory
//     P     two lanes a row, its scores in registers: keys the row cannot see at -inf (window, causal, the
//           row's own span; no mask where the lane's half lies inside it), softcap, the running max and sum;
//           p = exp(s - max) as two float16 parts, p = hi + lo (~22 bits: p·v then agrees with the decode
//           kernel's float32 p·v to float32 rounding, not float16's)
//     O     WMMA accumulators in registers, rescaled a row at a time: which row each accumulator element
//           holds is read once, from a fragment loaded from a matrix of row numbers (the layout is the
//           device's, not the API's)
//   the end: O / sum into `out` (0 where the row saw no key, as the decode kernel).
//
// Against the decode kernel on prefill chunks (a block a token, every key read again for every token):
// K and V come from the pool once a tile of 64 query rows (32 at D = 256). Devices whose blocks cannot have
// the shared memory (FlashTilesFit) keep the decode kernel's path: on sm_75 (64 KB a block) that is D = 128
// only (72,448 bytes); D = 64 (56,064) and D = 256 (61,312) fit there and take the tiles (not run on one).
// On sm_90 three blocks share an SM at D <= 128 (registers capped at 168 for it; a few bytes spill at D = 128).
#include <mma.h>

#include <cstdint>

#include "attention_common.cuh"

namespace wicore {
namespace {

using namespace nvcuda;

constexpr int kFrag = 16;
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, half, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, half, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, half, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// 16 bytes global -> shared (zeros where !valid): cp.async on sm_80 and later, in flight until WaitAsync; a
// plain load and store before (sm_75: the pipeline below then runs its copies synchronously).
__device__ inline void CopyAsync16(half* dst, const uint16_t* src, bool valid) {
#if __CUDA_ARCH__ >= 800
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
  *reinterpret_cast<uint4*>(dst) = valid ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ inline void CommitAsync() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Until at most `kPending` of this thread's latest commit groups are still in flight.
template <int kPending>
__device__ inline void WaitAsync() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

template <int D>
struct Tiles {
  static constexpr int kWarps = D > 128 ? 2 : 4;  // D = 256: 2 warps, its O accumulators take 128 registers
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;
  static constexpr int kKeys = D > 128 ? 32 : 64;
  static constexpr bool kQInRegisters = D <= 128;
  static constexpr int kLdH = D + 8;      // float16 rows of q, k, v (a multiple of 8; 32-byte fragment starts)
  static constexpr int kLdS = kKeys + 4;  // float32 scores
  static constexpr int kLdP = kKeys + 8;  // float16 probabilities
  // Blocks an SM: on sm_90, whose shared memory holds 3 at D = 128 and 64, D <= 128 asks the registers of 3 (168
  // a thread: a few bytes spill); elsewhere the shared memory allows fewer (sm_80 2, sm_86 / sm_89 1) and the
  // registers are not capped (none spill at D <= 128 there)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static constexpr int kMinBlocks = D > 128 ? 1 : 3;
#else
  static constexpr int kMinBlocks = 1;
#endif
  // byte offsets, each a multiple of 128; where q lives in registers, the scores take its place (q is read
  // into its fragments before the first score is written)
  static constexpr size_t kS = 0;
  static constexpr size_t kSBytes = size_t{kRows} * kLdS * 4;
  static constexpr size_t kQBytes = size_t{kRows} * kLdH * 2;
  static constexpr size_t kQ = kQInRegisters ? kS : kSBytes;
  static constexpr size_t kK = kQInRegisters ? (kSBytes > kQBytes ? kSBytes : kQBytes) : kQ + kQBytes;
  static constexpr size_t kV = kK + size_t{kKeys} * kLdH * 2;
  static constexpr size_t kPHi = kV + size_t{kKeys} * kLdH * 2;
  static constexpr size_t kPLo = kPHi + size_t{kRows} * kLdP * 2;
  static constexpr size_t kSlot = kPLo + size_t{kRows} * kLdP * 2;
  static constexpr size_t kSpan = kSlot + size_t{kKeys} * 8;   // lo, hi a row
  static constexpr size_t kAlpha = kSpan + size_t{kRows} * 16;  // a row's rescale factor, at the end 1 / sum
  static constexpr size_t kBytes = kAlpha + size_t{kRows} * 4;
  static_assert(kQ % 128 == 0 && kK % 128 == 0 && kV % 128 == 0 && kPHi % 128 == 0 && kPLo % 128 == 0, "fragment alignment");
  static_assert(kKeys <= kThreads, "a thread a key's pool row");
};

template <int D>
__global__ void __launch_bounds__(Tiles<D>::kThreads, Tiles<D>::kMinBlocks) TilesKernel(BlockAttentionCudaArgs a, int groups) {
  using T = Tiles<D>;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  half* sq = reinterpret_cast<half*>(smem + T::kQ);
  half* sk = reinterpret_cast<half*>(smem + T::kK);
  half* sv = reinterpret_cast<half*>(smem + T::kV);
  float* ss = reinterpret_cast<float*>(smem + T::kS);
  half* sp_hi = reinterpret_cast<half*>(smem + T::kPHi);
  half* sp_lo = reinterpret_cast<half*>(smem + T::kPLo);
  int64_t* slots = reinterpret_cast<int64_t*>(smem + T::kSlot);
  int64_t* span = reinterpret_cast<int64_t*>(smem + T::kSpan);
  float* alpha = reinterpret_cast<float*>(smem + T::kAlpha);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.y;
  const int64_t row = blockIdx.z, pair0 = static_cast<int64_t>(blockIdx.x) * T::kRows, pairs = a.seq * groups;
  const int64_t first = a.first_block != nullptr ? a.first_block[row] * a.block_size : 0;
  const int64_t row_stride = a.num_kv_heads * D;
  float* s_w = ss + warp * 16 * T::kLdS;
  float* alpha_w = alpha + warp * 16;

  // q rows and their spans (a row past the chunk's last pair: zeros, an empty span)
  for (int r = tid; r < T::kRows; r += T::kThreads) {
    const int64_t pair = pair0 + r;
    Visible vis{INT64_MAX, INT64_MIN};
    if (pair < pairs) vis = VisibleKeys(a, row * a.seq + pair / groups, first);
    span[2 * r] = vis.lo;
    span[2 * r + 1] = vis.hi;
  }
  for (int c = tid; c < T::kRows * kChunks; c += T::kThreads) {
    const int r = c / kChunks, part = c % kChunks;
    const int64_t pair = pair0 + r;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (pair < pairs) {
      const int64_t token = row * a.seq + pair / groups, head = static_cast<int64_t>(kvh) * groups + pair % groups;
      raw = *reinterpret_cast<const uint4*>(a.q + (token * a.num_heads + head) * D + part * 8);
    }
    *reinterpret_cast<uint4*>(sq + r * T::kLdH + part * 8) = raw;
  }
  __syncthreads();
  FragA q_frag[T::kQInRegisters ? D / kFrag : 1];
  if constexpr (T::kQInRegisters) {
#pragma unroll
    for (int k = 0; k < D / kFrag; ++k) wmma::load_matrix_sync(q_frag[k], sq + warp * 16 * T::kLdH + k * kFrag, T::kLdH);
    __syncthreads();  // every warp's q in registers: the scores may overwrite it
  }
  // which of the warp's 16 rows each accumulator element holds: a fragment of a matrix of row numbers
  for (int i = lane; i < kFrag * kFrag; i += 32) s_w[(i / kFrag) * T::kLdS + i % kFrag] = static_cast<float>(i / kFrag);
  __syncwarp();
  FragAcc rows_of;
  wmma::load_matrix_sync(rows_of, s_w, T::kLdS, wmma::mem_row_major);
  int row_of[FragAcc::num_elements];
#pragma unroll
  for (int i = 0; i < FragAcc::num_elements; ++i) row_of[i] = static_cast<int>(rows_of.x[i]);

  int64_t lo = INT64_MAX, hi = INT64_MIN;  // the tile's keys: the union of its rows' spans
  for (int r = 0; r < T::kRows; ++r) {
    if (span[2 * r] < span[2 * r + 1]) {
      lo = span[2 * r] < lo ? span[2 * r] : lo;
      hi = span[2 * r + 1] > hi ? span[2 * r + 1] : hi;
    }
  }
  FragAcc o[D / kFrag];
#pragma unroll
  for (int n = 0; n < D / kFrag; ++n) wmma::fill_fragment(o[n], 0.0f);

  // two lanes a row of the warp's 16: lane / 2 the row, lane % 2 which half of the key tile
  const int my = warp * 16 + lane / 2, half_keys = (lane % 2) * (T::kKeys / 2);
  const int64_t my_lo = span[2 * my], my_hi = span[2 * my + 1];
  float m = -INFINITY, l = 0.0f;
  // a key's pool row, -1 past the union or where none of the tile's rows sees it (a padding row at position 0
  // beside real rows spans keys no row reads, which may hold anything: p = 0 times a NaN there is NaN). The
  // union has a gap where some span starts past its lowest key with the key before it seen by no row.
  bool gap = false;
  if (tid < T::kRows && span[2 * tid] < span[2 * tid + 1] && span[2 * tid] > lo) {
    const int64_t before = span[2 * tid] - 1;
    gap = true;
    for (int r = 0; r < T::kRows && gap; ++r) gap = !(before >= span[2 * r] && before < span[2 * r + 1]);
  }
  const bool gaps = __syncthreads_or(gap) != 0;
  auto slot_of = [&](int64_t key) -> int64_t {
    if (key >= hi) return -1;
    if (gaps) {
      bool seen = false;
      for (int r = 0; r < T::kRows && !seen; ++r) seen = key >= span[2 * r] && key < span[2 * r + 1];
      if (!seen) return -1;
    }
    return Slot(a, row, first, key);
  };
  // K or V of the tile whose pool rows `slots` holds into shared memory, one commit group (cp.async: in flight
  // while the block computes; a row of slot -1 zero)
  auto issue = [&](half* dst, const uint16_t* pool) {
    for (int c = tid; c < T::kKeys * kChunks; c += T::kThreads) {
      const int64_t slot = slots[c / kChunks];
      const uint16_t* src = slot >= 0 ? pool + slot * row_stride + kvh * D + (c % kChunks) * 8 : pool;
      CopyAsync16(dst + (c / kChunks) * T::kLdH + (c % kChunks) * 8, src, slot >= 0);
    }
    CommitAsync();
  };

  // The pipeline, tile t's keys at `base`: K(t) ready when t starts and V(t) in flight; S = q K(t)^T; K(t + 1)
  // issued (every warp past S); P of t; V(t) awaited, O += P V(t); V(t + 1) issued (every warp past P V);
  // K(t + 1) awaited. `slots` holds tile t + 1's pool rows from t's start (each thread's looked up a tile ahead).
  if (lo < hi) {
    if (tid < T::kKeys) slots[tid] = slot_of(lo + tid);
    __syncthreads();
    issue(sk, a.k_pool);
    issue(sv, a.v_pool);
    WaitAsync<1>();
    __syncthreads();
  }
  int64_t next_slot = lo < hi && tid < T::kKeys ? slot_of(lo + T::kKeys + tid) : -1;  // lo < hi: no INT64_MAX + n
  const bool cap = a.softcap > 0.0f;
  for (int64_t base = lo; base < hi; base += T::kKeys) {
    const bool more = base + T::kKeys < hi;
    if (tid < T::kKeys) slots[tid] = next_slot;  // tile t's rows were issued before the last barrier
    if (tid < T::kKeys && more) next_slot = slot_of(base + 2 * T::kKeys + tid);

    // S = q k^T for the warp's 16 rows
#pragma unroll
    for (int n = 0; n < T::kKeys / kFrag; ++n) {
      FragAcc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / kFrag; ++kk) {
        FragBCol fb;
        wmma::load_matrix_sync(fb, sk + n * kFrag * T::kLdH + kk * kFrag, T::kLdH);
        if constexpr (T::kQInRegisters) {
          wmma::mma_sync(acc, q_frag[kk], fb, acc);
        } else {
          FragA fa;
          wmma::load_matrix_sync(fa, sq + warp * 16 * T::kLdH + kk * kFrag, T::kLdH);
          wmma::mma_sync(acc, fa, fb, acc);
        }
      }
      wmma::store_matrix_sync(s_w + n * kFrag, acc, T::kLdS, wmma::mem_row_major);
    }
    __syncthreads();  // every warp past K(t); the slots of t + 1 written
    if (more) issue(sk, a.k_pool);

    // P, the running max and sum: this lane's half of its row's keys, in registers
    constexpr int kHalf = T::kKeys / 2;
    const int64_t key0 = base + half_keys;
    const bool whole = key0 >= my_lo && key0 + kHalf <= my_hi;  // every key of the half seen (no mask)
    float x[kHalf];
    float tile_max = -INFINITY;
    const float4* s_row = reinterpret_cast<const float4*>(ss + my * T::kLdS + half_keys);
#pragma unroll
    for (int j = 0; j < kHalf / 4; ++j) {
      const float4 v4 = s_row[j];
      x[4 * j] = v4.x;
      x[4 * j + 1] = v4.y;
      x[4 * j + 2] = v4.z;
      x[4 * j + 3] = v4.w;
    }
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      if (cap) x[j] = Softcap(a, x[j]);
      if (!whole && !(key0 + j >= my_lo && key0 + j < my_hi)) x[j] = -INFINITY;
      tile_max = fmaxf(tile_max, x[j]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    float sum = 0.0f;
    __half2* hi_row = reinterpret_cast<__half2*>(sp_hi + my * T::kLdP + half_keys);
    __half2* lo_row = reinterpret_cast<__half2*>(sp_lo + my * T::kLdP + half_keys);
#pragma unroll
    for (int j = 0; j < kHalf; j += 2) {
      const float p0 = x[j] == -INFINITY ? 0.0f : __expf(x[j] - m_new);
      const float p1 = x[j + 1] == -INFINITY ? 0.0f : __expf(x[j + 1] - m_new);
      const __half2 ph = __floats2half2_rn(p0, p1);
      const float2 back = __half22float2(ph);
      hi_row[j / 2] = ph;
      lo_row[j / 2] = __floats2half2_rn(p0 - back.x, p1 - back.y);
      sum += p0 + p1;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float scale = m_new == -INFINITY ? 1.0f : __expf(m - m_new);  // m = -inf: O and l are still 0
    l = l * scale + sum;
    m = m_new;
    if (lane % 2 == 0) alpha_w[lane / 2] = scale;
    __syncwarp();

    // O = O * alpha + (P_hi + P_lo) V for the warp's 16 rows
    float row_scale[FragAcc::num_elements];
#pragma unroll
    for (int i = 0; i < FragAcc::num_elements; ++i) row_scale[i] = alpha_w[row_of[i]];
#pragma unroll
    for (int n = 0; n < D / kFrag; ++n) {
#pragma unroll
      for (int i = 0; i < FragAcc::num_elements; ++i) o[n].x[i] *= row_scale[i];
    }
    if (more) {
      WaitAsync<1>();  // V(t); K(t + 1) may still be in flight
    } else {
      WaitAsync<0>();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T::kKeys / kFrag; ++kk) {
      FragA p_hi, p_lo;
      wmma::load_matrix_sync(p_hi, sp_hi + warp * 16 * T::kLdP + kk * kFrag, T::kLdP);
      wmma::load_matrix_sync(p_lo, sp_lo + warp * 16 * T::kLdP + kk * kFrag, T::kLdP);
#pragma unroll
      for (int n = 0; n < D / kFrag; ++n) {
        FragBRow fb;
        wmma::load_matrix_sync(fb, sv + kk * kFrag * T::kLdH + n * kFrag, T::kLdH);
        wmma::mma_sync(o[n], p_hi, fb, o[n]);
        wmma::mma_sync(o[n], p_lo, fb, o[n]);
      }
    }
    __syncthreads();  // every warp past V(t)
    if (more) {
      issue(sv, a.v_pool);
      WaitAsync<1>();  // K(t + 1)
      __syncthreads();
    }
  }

  // out: O / sum, a fragment at a time through the warp's scores
  if (lane % 2 == 0) alpha_w[lane / 2] = l > 0.0f ? 1.0f / l : 0.0f;
  __syncwarp();
  float row_inv[FragAcc::num_elements];
#pragma unroll
  for (int i = 0; i < FragAcc::num_elements; ++i) row_inv[i] = alpha_w[row_of[i]];
  const int r = lane / 2, c = (lane % 2) * 8;  // this lane's 8 values of each 16 x 16 fragment
  const int64_t pair = pair0 + warp * 16 + r;
  uint16_t* dst = nullptr;
  if (pair < pairs) {
    const int64_t token = row * a.seq + pair / groups, head = static_cast<int64_t>(kvh) * groups + pair % groups;
    dst = a.out + (token * a.num_heads + head) * D;
  }
#pragma unroll
  for (int n = 0; n < D / kFrag; ++n) {
#pragma unroll
    for (int i = 0; i < FragAcc::num_elements; ++i) o[n].x[i] *= row_inv[i];
    wmma::store_matrix_sync(s_w, o[n], T::kLdS, wmma::mem_row_major);
    __syncwarp();
    if (dst != nullptr) {
      alignas(16) uint16_t packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = ToHalf(s_w[r * T::kLdS + c + e]);
      *reinterpret_cast<uint4*>(dst + n * kFrag + c) = *reinterpret_cast<const uint4*>(packed);
    }
    __syncwarp();
  }
}

template <int D>
bool Fits(int max_shared) {
  return Tiles<D>::kBytes <= static_cast<size_t>(max_shared);
}

template <int D>
int Launch(const BlockAttentionCudaArgs& a, cudaStream_t stream) {
  using T = Tiles<D>;
  const int groups = static_cast<int>(a.num_heads / a.num_kv_heads);
  cudaFuncSetAttribute(TilesKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(T::kBytes));
  const dim3 grid(static_cast<unsigned>((a.seq * groups + T::kRows - 1) / T::kRows), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.batch));
  TilesKernel<D><<<grid, T::kThreads, T::kBytes, stream>>>(a, groups);
  return static_cast<int>(cudaGetLastError());
}

int MaxSharedOptin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
  return bytes;
}

}  // namespace

bool FlashTilesFit(int64_t head_dim) {
  const int bytes = MaxSharedOptin();
  switch (head_dim) {
    case 64: return Fits<64>(bytes);
    case 128: return Fits<128>(bytes);
    case 256: return Fits<256>(bytes);
    default: return false;
  }
}

int LaunchFlashTiles(const BlockAttentionCudaArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64: return Launch<64>(a, stream);
    case 128: return Launch<128>(a, stream);
    default: return Launch<256>(a, stream);
  }
}

}  // namespace wicore
