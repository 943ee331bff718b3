// Prefill chunks (seq > 1) on tensor cores: a block of query rows against tiles of keys, FlashAttention's
// online softmax, q·k and p·v as WMMA 16x16x16 products (float16 in, float32 sums).
//
//   grid (query tile, KV head, row) ── a tile: kRows = 16 x warps query rows of one row's chunk and one KV
//   head, query row r the pair (token r / G, query head r % G) of the G heads that share the KV head, so
//   each key tile is read once for all of them (GQA)
//     keys  the union of the tile's visible spans (VisibleKeys), kKeys a tile: their pool rows (Slot, the
//           next tile's looked up while this one computes), then K and V into shared memory (16-byte
//           loads, several in flight a thread; keys past the union or in a gap of it zero, never read)
//     S     a warp's 16 rows x kKeys: WMMA over the head dimension (q's fragments kept in registers where
//           D <= 128), into shared memory
//     P     two lanes a row: keys the row cannot see at -inf (window, causal, the row's own span),
//           softcap, the running max and sum; p = exp(s - max) as two float16 parts, p = hi + lo (~22 bits:
//           p·v then agrees with the decode kernel's float32 p·v to float32 rounding, not float16's)
//     O     WMMA accumulators in registers, rescaled a row at a time: which row each accumulator element
//           holds is read once, from a fragment loaded from a matrix of row numbers (the layout is the
//           device's, not the API's)
//   the end: O / sum into `out` (0 where the row saw no key, as the decode kernel).
//
// Against the decode kernel on prefill chunks (a block a token, every key read again for every token):
// K and V come from the pool once a tile of 64 query rows (32 at D = 256). Devices whose blocks cannot have
// the shared memory (FlashTilesFit) keep the decode kernel's path: on sm_75 (64 KB a block) that is D = 128
// only (89,856 bytes); D = 64 (65,280) and D = 256 (61,312) fit there and take the tiles (not run on one).
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
  // byte offsets, each a multiple of 128
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t{kRows} * kLdH * 2;
  static constexpr size_t kV = kK + size_t{kKeys} * kLdH * 2;
  static constexpr size_t kS = kV + size_t{kKeys} * kLdH * 2;
  static constexpr size_t kPHi = kS + size_t{kRows} * kLdS * 4;
  static constexpr size_t kPLo = kPHi + size_t{kRows} * kLdP * 2;
  static constexpr size_t kSlot = kPLo + size_t{kRows} * kLdP * 2;
  static constexpr size_t kSpan = kSlot + size_t{kKeys} * 8;   // lo, hi a row
  static constexpr size_t kAlpha = kSpan + size_t{kRows} * 16;  // a row's rescale factor, at the end 1 / sum
  static constexpr size_t kBytes = kAlpha + size_t{kRows} * 4;
  static_assert(kK % 128 == 0 && kV % 128 == 0 && kS % 128 == 0 && kPHi % 128 == 0 && kPLo % 128 == 0, "fragment alignment");
  static_assert(kKeys <= kThreads, "a thread a key's pool row");
};

template <int D>
__global__ void __launch_bounds__(Tiles<D>::kThreads) TilesKernel(BlockAttentionCudaArgs a, int groups) {
  using T = Tiles<D>;
  constexpr int kChunks = D / 8, kInFlight = 4;
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
  // which of the warp's 16 rows each accumulator element holds: a fragment of a matrix of row numbers
  for (int i = lane; i < kFrag * kFrag; i += 32) s_w[(i / kFrag) * T::kLdS + i % kFrag] = static_cast<float>(i / kFrag);
  __syncwarp();
  FragAcc rows_of;
  wmma::load_matrix_sync(rows_of, s_w, T::kLdS, wmma::mem_row_major);
  int row_of[FragAcc::num_elements];
#pragma unroll
  for (int i = 0; i < FragAcc::num_elements; ++i) row_of[i] = static_cast<int>(rows_of.x[i]);
  __syncthreads();

  int64_t lo = INT64_MAX, hi = INT64_MIN;  // the tile's keys: the union of its rows' spans
  for (int r = 0; r < T::kRows; ++r) {
    if (span[2 * r] < span[2 * r + 1]) {
      lo = span[2 * r] < lo ? span[2 * r] : lo;
      hi = span[2 * r + 1] > hi ? span[2 * r + 1] : hi;
    }
  }
  FragA q_frag[T::kQInRegisters ? D / kFrag : 1];
  if constexpr (T::kQInRegisters) {
#pragma unroll
    for (int k = 0; k < D / kFrag; ++k) wmma::load_matrix_sync(q_frag[k], sq + warp * 16 * T::kLdH + k * kFrag, T::kLdH);
  }
  FragAcc o[D / kFrag];
#pragma unroll
  for (int n = 0; n < D / kFrag; ++n) wmma::fill_fragment(o[n], 0.0f);

  // two lanes a row of the warp's 16: lane / 2 the row, lane % 2 which half of the key tile
  const int my = warp * 16 + lane / 2, half_keys = (lane % 2) * (T::kKeys / 2);
  const int64_t my_lo = span[2 * my], my_hi = span[2 * my + 1];
  float m = -INFINITY, l = 0.0f;
  // a key's pool row, -1 past the union or where none of the tile's rows sees it (a padding row at position 0
  // beside real rows spans keys no row reads, which may hold anything: p = 0 times a NaN there is NaN)
  auto slot_of = [&](int64_t key) -> int64_t {
    if (key >= hi) return -1;
    for (int r = 0; r < T::kRows; ++r) {
      if (key >= span[2 * r] && key < span[2 * r + 1]) return Slot(a, row, first, key);
    }
    return -1;
  };
  if (tid < T::kKeys && lo < hi) slots[tid] = slot_of(lo + tid);
  __syncthreads();

  for (int64_t base = lo; base < hi; base += T::kKeys) {
    for (int c0 = tid; c0 < T::kKeys * kChunks; c0 += T::kThreads * kInFlight) {
      uint4 k[kInFlight], v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int c = c0 + u * T::kThreads;
        const int64_t slot = c < T::kKeys * kChunks ? slots[c / kChunks] : -1;
        k[u] = v[u] = make_uint4(0, 0, 0, 0);
        if (slot >= 0) {
          const int64_t at = slot * row_stride + kvh * D + (c % kChunks) * 8;
          k[u] = *reinterpret_cast<const uint4*>(a.k_pool + at);
          v[u] = *reinterpret_cast<const uint4*>(a.v_pool + at);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int c = c0 + u * T::kThreads;
        if (c < T::kKeys * kChunks) {
          *reinterpret_cast<uint4*>(sk + (c / kChunks) * T::kLdH + (c % kChunks) * 8) = k[u];
          *reinterpret_cast<uint4*>(sv + (c / kChunks) * T::kLdH + (c % kChunks) * 8) = v[u];
        }
      }
    }
    __syncthreads();
    const int64_t next = base + T::kKeys;  // the next tile's pool rows, read while this one computes
    if (tid < T::kKeys && next < hi) slots[tid] = slot_of(next + tid);

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
    __syncwarp();

    // P, the running max and sum: this lane's half of its row's keys
    const float* s_row = ss + my * T::kLdS + half_keys;
    float tile_max = -INFINITY;
    for (int j = 0; j < T::kKeys / 2; ++j) {
      const int64_t key = base + half_keys + j;
      if (key >= my_lo && key < my_hi) tile_max = fmaxf(tile_max, Softcap(a, s_row[j]));
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    float sum = 0.0f;
    half* hi_row = sp_hi + my * T::kLdP + half_keys;
    half* lo_row = sp_lo + my * T::kLdP + half_keys;
    for (int j = 0; j < T::kKeys / 2; ++j) {
      const int64_t key = base + half_keys + j;
      float p = 0.0f;
      if (key >= my_lo && key < my_hi) p = __expf(Softcap(a, s_row[j]) - m_new);
      const half ph = __float2half(p);
      hi_row[j] = ph;
      lo_row[j] = __float2half(p - __half2float(ph));
      sum += p;
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
    __syncthreads();  // K, V and the next tile's slots
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
