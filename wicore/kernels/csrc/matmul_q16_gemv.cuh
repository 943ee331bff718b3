// MatMulQ16's GEMV (m <= 16 rows of x) on tensor cores: mma.sync m16n8k16, the weights as A (16 weight rows a
// tile), x as B (up to 8 of its rows the MMA's 8 columns, two MMAs to 16; a row of x past m reads zeros and
// its column is not written), float32 accumulators. Included by matmul_q16.cu and by tools/gemv_bench (timed
// alone there).
//
// Why tensor cores at one row: a CUDA-core GEMV spends ~4 instructions a weight (extract, convert, scale,
// FMA) and, at 4 bits, the H200's ~4.8 TB/s brings ~9.6 G weights a second; the old kernel read int4 weights
// at 1.3-2.2 TB/s at one row and fell to 0.4-0.7 TB/s at 8 rows (an FMA a weight a row). Here a 32-bit word
// of codes becomes 8 halves with one shift, four lop3 and eight half2 ops (offset, scale), and one MMA does
// the 8 x 16 x 16 products (7/8 of them on padding at m = 1), so rows 1 to 8 cost nearly the same. Measured
// alone on an H200 (tools/gemv_bench, docs/PERFORMANCE.md): int4 1.6-2.9 TB/s at one row (qkv 2.1, o 1.6,
// gate|up 2.7, down 2.3, head 2.9), 1.4-2.6 at 8 rows; int8 2.3-4.0 at one row. Still bound by instruction
// issue at int4 (int8, under half the decoding a byte, reaches 4.0 TB/s on the head) and by latency on the
// small layers.
//
// Layout read in place (MatMulNBits'): row n of b is k * bits / 8 bytes, element c at byte c * bits / 8, 4-bit
// codes low nibble first; scales[n, c / block_size]. A lane's 16-byte load is one whole run of codes inside
// one block (32 4-bit or 16 8-bit codes), so every load is 128 bits wide and coalesced per quad of lanes:
//
//   warp: 16 weight rows (a tile) x one chunk of k = 4 loads a row (lane quad t = 0..3 takes load t)
//   lane (g = lane / 4, t = lane % 4): rows g and g + 8 of the tile, codes [chunk + t * per_load, + per_load)
//
// An MMA sums over k across the quad, and each lane's k lie in its own block: so the block's scale is folded
// into the weight (w = (code - zero point) * scale, rounded to half once, as MatMulNBits' dequantization and
// the tiled path above 16 rows do) and the products are summed in float32 by the MMA.
//
// Which k a lane's MMA slot holds is free as long as A and B agree: a word of 4-bit codes decodes (lop3 with
// 0x6400 halves, exact: code + 1024 fits a half's significand) to the pairs (e0, e4), (e1, e5), (e2, e6),
// (e3, e7), and x's 8 halves of the same k are permuted to the same pairs (__byte_perm) instead of moving the
// codes. 8-bit words: (e0, e2), (e1, e3).
//
// The chunks of k are dealt round-robin to kWarps warps of the block (split-K: a 5376-wide layer is only
// 336 tiles, ~2.5 a streaming multiprocessor), kUnroll chunks loaded before any is used (loads in flight),
// and the warps' partial sums added in shared memory. No scratch, no synchronization outside the block.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace wicore {
namespace gemv {

__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));  // (a & mask) | magic
  return r;
}

__device__ __forceinline__ uint32_t H2(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 AsH2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// One 32-bit word of codes -> its weights (code - zero point) * scale as half2 pairs (see the file's note).
template <int kBits>
__device__ __forceinline__ void Decode(uint32_t q, __half2 scale, uint32_t* pairs) {
  if constexpr (kBits == 4) {
    const __half2 bias = __float2half2_rn(1032.0f), sixteenth = __float2half2_rn(0.0625f), bias16 = __float2half2_rn(-72.0f);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t v = h == 0 ? q : q >> 8;
      const __half2 lo = __hsub2(AsH2(AndOr(v, 0x000F000Fu, 0x64006400u)), bias);            // e, 1024 + e
      const __half2 hi = __hfma2(AsH2(AndOr(v, 0x00F000F0u, 0x64006400u)), sixteenth, bias16);  // 1024 + 16e
      pairs[2 * h] = H2(__hmul2(lo, scale));
      pairs[2 * h + 1] = H2(__hmul2(hi, scale));
    }
  } else {
    const __half2 bias = __float2half2_rn(1152.0f);
    pairs[0] = H2(__hmul2(__hsub2(AsH2(__byte_perm(q, 0x64646464u, 0x4240)), bias), scale));
    pairs[1] = H2(__hmul2(__hsub2(AsH2(__byte_perm(q, 0x64646464u, 0x4341)), bias), scale));
  }
}

__device__ __forceinline__ void Mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800  // Turing has the k8 shape only: two of them, (a0, a1, b0) then (a2, a3, b1)
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a2), "r"(a3), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// x's halves for one word of codes, as the pairs Decode makes: 8 halves (4 bits) or 4 (8 bits) at `x`.
template <int kBits>
__device__ __forceinline__ void XPairs(const __half* x, uint32_t* p) {
  if constexpr (kBits == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x));
    p[0] = __byte_perm(v.x, v.z, 0x5410);
    p[1] = __byte_perm(v.x, v.z, 0x7632);
    p[2] = __byte_perm(v.y, v.w, 0x5410);
    p[3] = __byte_perm(v.y, v.w, 0x7632);
  } else {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(x));
    p[0] = __byte_perm(v.x, v.y, 0x5410);
    p[1] = __byte_perm(v.x, v.y, 0x7632);
  }
}

// wicore.MatMulI8's signed int8 codes (kPerRow below): a word's four codes as two half2 pairs, exactly, no scale
// (the row's scale multiplies its sum). XOR 0x80 per byte makes code + 128, which the 0x64 exponent bytes turn
// into the halves 1024 + code + 128; (e0, e2), (e1, e3) as Decode<8>.
__device__ __forceinline__ void DecodeSigned8(uint32_t q, uint32_t* pairs) {
  const __half2 bias = __float2half2_rn(1152.0f);
  q ^= 0x80808080u;
  pairs[0] = H2(__hsub2(AsH2(__byte_perm(q, 0x64646464u, 0x4240)), bias));
  pairs[1] = H2(__hsub2(AsH2(__byte_perm(q, 0x64646464u, 0x4341)), bias));
}

// The codes and scales of kUnroll chunks (a lane's two rows of each tile), loaded before any is used.
template <int kUnroll, int kTiles>
struct Stage {
  uint4 codes[kUnroll][kTiles][2];
  __half scale[kUnroll][kTiles][2];
};

// y[:m, tile rows] for m <= 8 * kXTiles (x's rows in kXTiles MMA tiles of 8 columns, each A fragment decoded
// once for all); a block: kTiles tiles of 16 weight rows, kWarps warps splitting k, chunks dealt round-robin
// (warp w: chunks w, w + kWarps, ...). k a multiple of 32: a chunk's loads past k (k % (4 * per_load) != 0)
// read nothing and add zeros. block_shift: log2(block_size) where it is a power of two (a shift instead of
// a division a chunk), else -1.
//
// kPerRow (wicore.MatMulI8, kBits 8): b holds signed int8 codes [n, k], one float scale a weight row in
// row_scales (scales unused), applied to the row's float32 sum: y = row_scale * Σ x code.
//
// Tried on an H200 and dropped (docs/PERFORMANCE.md): the next chunks' loads issued before this one's MMAs
// (a two-stage register pipeline), a warp's chunks adjacent instead of dealt, 2 tiles a block, 2 or 16 warps:
// each slower at one row than 8 warps, 1 tile, 2 chunks a stage.
template <int kBits, int kTiles, int kWarps, int kUnroll, int kXTiles, bool kPerRow = false>
__global__ void __launch_bounds__(kWarps * 32) MmaGemv(const __half* __restrict__ x, const uint8_t* __restrict__ b,
                                                       const __half* __restrict__ scales, __half* __restrict__ y,
                                                       int m, int n, int k, int block_size, int block_shift,
                                                       const float* __restrict__ row_scales) {
  constexpr int kPerLoad = 128 / kBits, kChunk = 4 * kPerLoad;  // codes a 16-byte load, a chunk of k
  constexpr int kWordPairs = 16 / kBits;                         // half2 pairs a 32-bit word decodes to
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16 * kTiles;
  const int64_t row_bytes = static_cast<int64_t>(k) * kBits / 8;
  const int chunks = (k + kChunk - 1) / kChunk, blocks = k / block_size;
  const int count = warp < chunks ? (chunks - warp + kWarps - 1) / kWarps : 0;  // this warp's chunks
  auto chunk = [&](int it, int u) { return it * kUnroll + u < count ? warp + (it * kUnroll + u) * kWarps : -1; };
  const uint8_t* rows[kTiles][2];
  const __half* srows[kTiles][2];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(n0 + 16 * i + g + 8 * h, n - 1);  // rows past n read the last row, not written
      rows[i][h] = b + r * row_bytes;
      srows[i][h] = kPerRow ? nullptr : scales + static_cast<int64_t>(r) * blocks;
    }
  }
  auto load = [&](int it, Stage<kUnroll, kTiles>& st) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = chunk(it, u), kx = c * kChunk + t * kPerLoad;
      const int blk = block_shift >= 0 ? kx >> block_shift : kx / block_size;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (c >= 0 && kx < k) {
            st.codes[u][i][h] = __ldg(reinterpret_cast<const uint4*>(rows[i][h] + kx * kBits / 8));
            st.scale[u][i][h] = kPerRow ? __float2half(1.0f) : srows[i][h][blk];
          } else {
            st.codes[u][i][h] = make_uint4(0, 0, 0, 0);
            st.scale[u][i][h] = __float2half(0.0f);
          }
        }
      }
    }
  };
  float acc[kTiles][kXTiles][4] = {};
  auto compute = [&](int it, const Stage<kUnroll, kTiles>& st) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = chunk(it, u), kx = c * kChunk + t * kPerLoad;
      if (c < 0) break;
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // the load's 32-bit words
        uint32_t xp[kXTiles][kWordPairs] = {};
#pragma unroll
        for (int j = 0; j < kXTiles; ++j) {
          if (g + 8 * j < m && kx < k) XPairs<kBits>(x + static_cast<int64_t>(g + 8 * j) * k + kx + w * (32 / kBits), xp[j]);
        }
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          uint32_t lo[kWordPairs], hi[kWordPairs];  // rows g, g + 8
          if constexpr (kPerRow) {
            DecodeSigned8(reinterpret_cast<const uint32_t*>(&st.codes[u][i][0])[w], lo);
            DecodeSigned8(reinterpret_cast<const uint32_t*>(&st.codes[u][i][1])[w], hi);
          } else {
            Decode<kBits>(reinterpret_cast<const uint32_t*>(&st.codes[u][i][0])[w], __half2half2(st.scale[u][i][0]), lo);
            Decode<kBits>(reinterpret_cast<const uint32_t*>(&st.codes[u][i][1])[w], __half2half2(st.scale[u][i][1]), hi);
          }
#pragma unroll
          for (int s = 0; s < kWordPairs; s += 2)
#pragma unroll
            for (int j = 0; j < kXTiles; ++j) Mma(acc[i][j], lo[s], hi[s], lo[s + 1], hi[s + 1], xp[j][s], xp[j][s + 1]);
        }
      }
    }
  };
  for (int it = 0; it * kUnroll < count; ++it) {
    Stage<kUnroll, kTiles> st;
    load(it, st);
    compute(it, st);
  }
  // acc[i][j]: c0, c1 weight row g of tile i, x rows 8j + 2t, + 1; c2, c3 the same for weight row g + 8
  __shared__ float partial[kWarps][kTiles * kXTiles * 4][32];
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int j = 0; j < kXTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][(i * kXTiles + j) * 4 + e][lane] = acc[i][j][e];
  __syncthreads();
  for (int v = threadIdx.x; v < kTiles * kXTiles * 4 * 32; v += kWarps * 32) {
    const int i = v / (kXTiles * 128), j = (v / 128) % kXTiles, e = (v / 32) % 4, l = v % 32;
    const int row = n0 + 16 * i + l / 4 + 8 * (e / 2), col = 8 * j + 2 * (l % 4) + e % 2;
    if (col >= m || row >= n) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][v / 32][l];
    if constexpr (kPerRow) sum *= row_scales[row];
    y[static_cast<int64_t>(col) * n + row] = __float2half_rn(sum);
  }
}

inline int BlockShift(int block_size) {
  for (int s = 0; s < 31; ++s)
    if ((1 << s) == block_size) return s;
  return -1;
}

template <int kBits, int kTiles, int kWarps, int kUnroll, int kXTiles = 1>
inline void LaunchMmaGemv(const __half* x, const uint8_t* b, const __half* scales, __half* y, int m, int n, int k,
                          int block_size, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + 16 * kTiles - 1) / (16 * kTiles)));
  MmaGemv<kBits, kTiles, kWarps, kUnroll, kXTiles>
      <<<grid, kWarps * 32, 0, stream>>>(x, b, scales, y, m, n, k, block_size, BlockShift(block_size), nullptr);
}

// wicore.MatMulI8's GEMV: signed int8 codes b [n, k] (k a multiple of 16), a float scale a weight row.
template <int kTiles, int kWarps, int kUnroll, int kXTiles = 1>
inline void LaunchMmaGemvPerRow(const __half* x, const int8_t* b, const float* row_scales, __half* y, int m, int n, int k,
                                cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + 16 * kTiles - 1) / (16 * kTiles)));
  MmaGemv<8, kTiles, kWarps, kUnroll, kXTiles, true><<<grid, kWarps * 32, 0, stream>>>(
      x, reinterpret_cast<const uint8_t*>(b), nullptr, y, m, n, k, k, BlockShift(k), row_scales);
}

}  // namespace gemv
}  // namespace wicore
