// WiCore's fused kernels: one declaration a kernel, for every backend that implements them
// (kernels_cpu.cc always; kernels.cu where CUDA's compiler is; a HIP port would add kernels.hip).
//
//   AddRMSNorm      (x f32 [rows, H], h f16 [rows, H], w f16 [H])            -> y f16, sum f32
//                   sum = x + h;                      y = rms(sum) * w
//   NormAddRMSNorm  (x f32, h f16, w_post f32 [H], w f16 [H])                -> y f16, sum f32
//                   sum = x + rms(h) * w_post;        y = rms(sum) * w         (Gemma's sandwich norms)
//   GeGLU / SwiGLU  (gate_up f16 [rows, 2I])                                 -> f16 [rows, I]
//                   out = act(gate_up[:, :I]) * gate_up[:, I:]   (gelu_tanh / silu, in float32)
//
//   MatMulQ         (x f32 [M, K], codes u8, scales f32 | null, offsets f32 | null, and the narrow forms of
//                   MatMulQPacked: scales16 f16, scale_ints i8, mins16 f16, min_ints i8, each | null)
//                   -> y f32 [M, N]: llama.cpp's arithmetic (matmul_q_cpu.cc): x in int8 blocks of 32,
//                   w[n, c] = scales[n, c / bs] * (code - zero point) + offsets[n, c / bs]; bits 4, 5, 6 or 8,
//                   bs 16 or 32 (matmul_q_packed.cc turns 5 and 6 bits and the narrow scales into the wide forms)
//
//   MatMulQ16       (x f16 [M, K], b u8 [N, K / bs, bs * bits / 8], scales f16 [N, K / bs])  -> y f16 [M, N]
//                   com.microsoft.MatMulNBits' inputs and layout without zero points (code + 2^(bits - 1), 4 bits
//                   low nibble first): y = x @ wᵀ, w[n, c] = (code - 2^(bits - 1)) * scale[n, c / bs], bits 4 or 8.
//                   CPU (the reference): w exact in float32, products summed in float32, one rounding to half.
//                   CUDA, both the GEMV (M <= kMatMulQ16GemvRows, matmul_q16_gemv.cuh) and the tiles above (both
//                   on tensor cores, matmul_q16.cu): w rounded to half once, as MatMulNBits' dequantization does,
//                   float32 sums of the products, one rounding to half
//
//   MatMulI8        (x f16 [M, K], w i8 [N, K], scales f32 [N])                 -> y f16 [M, N]
//                   per-output-channel symmetric int8 weights, w[n, c] = code * scales[n]; K a multiple of 16.
//                   M <= kMatMulI8GemvRows (weight-only): y = half(scales[n] * Σ_c float(x) code), float32 sums.
//                   M above (W8A8): each row of x to int8, amax = max |x|, q = clamp(rint(x * (127 / amax)), ±127)
//                   (round half to even), s = amax / 127 (a zero row: q = 0, s = 0); y = half((float(Σ q code) * s)
//                   * scales[n]), the sum exact in int32. CPU (matmul_i8_cpu.cc) and CUDA (GEMV: matmul_q16_gemv.cuh;
//                   above: matmul_i8.cu's quantize and epilogue around cuBLASLt's int8 GEMM) compute the same; above
//                   16 rows the same bits.
//
//   GatedActivation (gate_up f32 [rows, 2I]; attribute activation)             -> f32 [rows, I]   (CPU, attention_cpu.cc;
//                   not emitted by the exporter: measured no faster than ORT's Split + activation + Mul)
//                   as GeGLU / SwiGLU, float32 in and out
//   BlockAttention  (q f32 [b, s, nh * hd], k/v pools f32 [blocks, bs, kvh, hd], block_tables i64 [b, max_blocks],
//                   positions i64 [b, s], context_lens i64 [b], first_block i64 [b] | null)
//                   -> f32 [b, s, nh * hd]: grouped-query attention over the row's blocks where they lie, causal,
//                   in the context, in the window; q carries the scale; softcap where set (CPU, attention_cpu.cc;
//                   CUDA in float16 in and out, float32 inside: attention.cu)
//   BlockAttentionQKV (qkv [b, s, (nh + 2 kvh) * hd], k/v pools, block_tables, positions, slot_mapping i64 [b, s],
//                   past_seqlens i32 [b], cos / sin [max_position, hd / 2] | null, q_norm / k_norm [hd] | null;
//                   attributes scale, epsilon as well)
//                   -> out as BlockAttention, and the pools with the step's K/V written at slot_mapping (in place
//                   where the output is bound to the input): BlockAttention with its prologue inside. Per token q, k
//                   split from qkv; q, k RMSNormed per head with their weights (where given, in float32); rotate-half
//                   RoPE at the token's position (where the caches are given); q times scale; k, v written to the
//                   pools; context_lens = past_seqlens + s. (CPU: attention_qkv_cpu.cc; CUDA: attention.cu.)
//
// rms(v) = v / sqrt(mean(v^2) + epsilon), in float32. A half is passed as its 16 bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace wicore {

enum class Activation { kGeluTanh, kSilu };

// `w_post` null: AddRMSNorm; else NormAddRMSNorm.
void ResidualRMSNormCpu(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum);
void GatedActivationCpu(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out);

struct MatMulQ16Args {
  const uint16_t* x;       // [m, k] halves
  const uint8_t* b;        // [n, k / block_size, block_size * bits / 8]
  const uint16_t* scales;  // [n, k / block_size] halves
  uint16_t* y;             // [m, n] halves
  int64_t m, n, k, block_size;
  int bits;                // 4 or 8; k and block_size multiples of 32 (a 16-byte load of codes lies in one block)
};
// Columns [n_begin, n_end) of y (weight rows).
void MatMulQ16Cpu(const MatMulQ16Args& args, int64_t n_begin, int64_t n_end);
constexpr int64_t kMatMulQ16GemvRows = 16;  // CUDA: up to this many rows the GEMV (reads the weights once), else tensor cores

struct MatMulI8Args {
  const uint16_t* x;     // [m, k] halves
  const int8_t* w;       // [n, k] codes
  const float* scales;   // [n]
  uint16_t* y;           // [m, n] halves
  int64_t m, n, k;       // k a multiple of 16
};
constexpr int64_t kMatMulI8GemvRows = 16;  // up to this many rows weight-only (a read of the weights), int8 x above
// Row r of x as int8 (kernels.h's MatMulI8 rounding): q[0, k) and its scale.
void MatMulI8QuantizeRowCpu(const uint16_t* x, int64_t k, int8_t* q, float* scale);
// Columns [n_begin, n_end) of y (weight rows); `xq` and `x_scales`: x's rows quantized (MatMulI8QuantizeRowCpu,
// m > kMatMulI8GemvRows only, else null).
void MatMulI8Cpu(const MatMulI8Args& args, const int8_t* xq, const float* x_scales, int64_t n_begin, int64_t n_end);

struct MatMulQArgs {
  const float* x;           // [m, k]
  // 8 bits: [n, k] code + 128, scales and offsets [n, k / block_size].
  // 4 bits: rows in groups of 8 (n padded to a multiple of 8), interleaved a block at a time:
  //   codes [n / 8, k / 32, 8, 16]: per row and 32 columns, column j in the low nibble, j + 16 in the high one (code + 8)
  //   scales and offsets [n / 8, k / block_size, 8]
  // 5 and 6 bits (h = bits - 4 high bits a code): [n, k / 32, 16 + 4h] code + zero_point, per row and 32 columns
  //   the 4-bit layout's 16 bytes of low nibbles, then 4h bytes: byte j holds column j + 4h i's high bits at
  //   bits h i .. h i + h - 1 (i < 8 / h); scales and offsets as 8 bits'
  const uint8_t* weight;
  const float* scales;
  const float* offsets;     // or null
  float* y;                 // [m, n]
  int64_t m, n, k, block_size;
  int bits;
  // With the residual, x is also rounded a second time: what the int8 codes left, in int8 steps of
  // d / 128 (~15-bit activations, two integer dot products a block): llama.cpp's int8 rounding flips
  // SmolLM2's greedy near-ties, this does not (docs/PERFORMANCE.md).
  bool residual;
  int zero_point;           // 5 and 6 bits: the stored code is code + zero_point (4 bits: 8, 8 bits: 128)
  // Where set (matmul_q_packed.cc, for the VNNI rows of 4-bit codes at m == 1), the narrow scales and offsets
  // are read in place and `scales` / `offsets` only say that they exist.
  const struct MatMulQPacked* packed = nullptr;
};

// MatMulQ's scales and offsets where the graph stores them narrower than float32 (matmul_q.py chooses the
// narrowest form that gives every value exactly):
//   scale[i]  = scale_ints ? half(scales16[super(i)]) * scale_ints[i] : half(scales16[i])
//   offset[i] = offset_scale * scale[i] + (min_ints ? half(mins16[super(i)]) * min_ints[i] : half(mins16[i]))
//               (offset_scale 0: the second term alone, a -0.0 kept; offset_scale a power of two, so its product is exact)
// in float32, i a weight block in MatMulQArgs' layout of the scales, super(i) its super-block (blocks_per_super
// blocks of a row) in the same layout. Every product is exact (11 x 8 bits); the offsets' sum rounds once,
// as the export's own float32 offsets did. A null scales16 / mins16: MatMulQArgs' float32 scales / offsets.
struct MatMulQPacked {
  const uint16_t* scales16;
  const int8_t* scale_ints;
  const uint16_t* mins16;
  const int8_t* min_ints;
  float offset_scale;
  int64_t blocks_per_super;
};

// One row of activations in int8 blocks of 32.
struct QuantRow {
  std::vector<int8_t> q;       // [k]
  std::vector<int8_t> q2;      // [k] with the residual, else empty: round((x - q d) * 128 / d)
  std::vector<int32_t> lanes2; // [k / 4] as lanes, for q2
  std::vector<float> d;        // [k / 32]: the blocks' scales (with the residual: d / 128, q2's step)
  std::vector<int32_t> lanes;  // [k / 4]: -zero_point * (sum of each 4 q), the dot products' starting values
  std::vector<float> sums;     // [k / block_size]: d * (sum of q (128 q + q2) over each weight block), for the offsets
  // The tiled paths' copy (matmul_q_tile.inc): a = 128 q + q2 (or q) as int16, per 32 columns two halves of 16,
  // lane l's columns 4l, 4l + 1 then 4l + 2, 4l + 3; starts = 128 lanes + lanes2 (or lanes).
  std::vector<int16_t> a16;    // [k / 32, 2, 16], or empty where no tiled path runs
  std::vector<int32_t> starts; // [k / 4]
};

// Which code computes MatMulQ's int8 arithmetic (all give the same bits): AVX-512 VNNI, AVX2 + FMA, or portable
// C++. On kVnni and kAvx2 a prompt of kMatMulQFloatRows rows or more takes the float path instead (MatMulQFloatRuns).
enum class MatMulQPath { kScalar, kAvx2, kVnni };

struct BlockAttentionArgs {
  const float* q;             // [batch * seq, num_heads, head_dim]
  const float* k_pool;        // [num_blocks, block_size, num_kv_heads, head_dim]
  const float* v_pool;
  const int64_t* block_tables;  // [batch, max_blocks], each in [0, num_blocks)
  const int64_t* positions;   // [batch * seq]
  const int64_t* context_lens;  // [batch]
  const int64_t* first_block;   // [batch]: the logical block block_tables start at (sliding layers), or null: 0
  float* out;                 // [batch * seq, num_heads, head_dim]
  int64_t batch, seq, num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t window;             // keys within `window` positions of the query, or 0: no window
  float softcap;              // softcap * tanh(score / softcap), or 0: none
  bool avx2;                  // the AVX2 + FMA path (where head_dim is a multiple of 8), else the scalar one
  bool avx512;                // with avx2: a prefill chunk's scores and sums on zmm (the same bits)
};

// BlockAttentionQKV's prologue (attention_qkv_cpu.cc): q [b * s, nh, hd] normed, rotated and scaled, k and v
// written into the pools (which already hold the input's blocks).
struct QKVPrologueArgs {
  const float* qkv;           // [batch * seq, (num_heads + 2 num_kv_heads) * head_dim]
  const int64_t* positions;   // [batch * seq]
  const int64_t* slot_mapping;  // [batch * seq]: block * block_size + offset, each in the pool
  const float* cos;           // [max_position, head_dim / 2] or null: no rotation
  const float* sin;
  const float* q_norm;        // [head_dim] or null: no q / k norm
  const float* k_norm;
  int64_t tokens, num_heads, num_kv_heads, head_dim;
  float scale, epsilon;
};
void BlockAttentionQKVPrologueCpu(const QKVPrologueArgs& args, float* q, float* k_pool, float* v_pool);

bool BlockAttentionHasAvx2();
bool BlockAttentionHasAvx512();
// Tasks [task_begin, task_end) of BlockAttentionTasks: (row, KV head, a chunk of the row's tokens).
int64_t BlockAttentionTasks(const BlockAttentionArgs& args);
void BlockAttentionCpu(const BlockAttentionArgs& args, int64_t task_begin, int64_t task_end);
void GatedActivationF32Cpu(const float* gate_up, Activation act, int64_t rows, int64_t inter, float* out);

bool MatMulQHasVnni();  // AVX-512 VNNI (with VL) here: MatMulQCpu's fast path
// The fastest path this CPU runs, or a slower one where `force` names it ("scalar", "avx2"; null: none).
MatMulQPath MatMulQPathFor(const char* force);
// x's rows quantized into `rows` (resized to M; a caller that keeps it between calls keeps its vectors' memory).
void MatMulQQuantize(const MatMulQArgs& args, MatMulQPath path, std::vector<QuantRow>* rows);
// Rows [row_begin, row_end) of y's columns (weight rows), from the quantized x (any split gives the same bits;
// row_begin a multiple of 8).
void MatMulQCpu(const MatMulQArgs& args, const std::vector<QuantRow>& rows, int64_t row_begin, int64_t row_end,
                MatMulQPath path);
// The prompt path (matmul_q_float.cc): from kMatMulQFloatRows rows on the AVX-512 (kVnni) and AVX2 paths, x in
// float32 against the weight dequantized to float32 (not the int8 path's bits; no MatMulQQuantize). Rows as
// MatMulQCpu. On AVX2 the int8 tiles ran prompts at ~0.55x MLAS's float GEMM (SmolLM2, docs/PERFORMANCE.md).
// 32, not 16: SmolLM2's decode steps of 16 rows took 1.16x ORT's MatMulNBits' CPU time on the float path and
// 0.89x on the int8 tiles (docs/PERFORMANCE.md, 2026-11-28 23:00 UTC); at 32 rows the float path is level.
constexpr int64_t kMatMulQFloatRows = 32;
bool MatMulQFloatRuns(const MatMulQArgs& args, MatMulQPath path);
void MatMulQFloatCpu(const MatMulQArgs& args, int64_t row_begin, int64_t row_end, MatMulQPath path);
// The int8 prompt path (matmul_q_int8.cc), where the node asks for it (its prompt_precision "int8", or
// WICORE_MATMULQ_PROMPT=int8: ops.cc) in place of the float one: x rounded to int8 per 32 columns without the residual (q [m, k], d [m, k / 32], d * Σ q a
// weight block [m, k / block_size]), vpdpbusd on the codes. Rows as MatMulQCpu; 4 and 8 bits (MatMulQTask
// widens 5 and 6).
struct MatMulQInt8Rows {
  std::vector<int8_t> q;  // rows `stride` apart: K + 64, so that a tile's rows do not share L1 sets at K = 2048
  int64_t stride = 0;
  std::vector<float> d, sums;
};
bool MatMulQInt8Runs(const MatMulQArgs& args, MatMulQPath path, bool is_int8_prompt);
void MatMulQInt8Resize(const MatMulQArgs& args, MatMulQInt8Rows* out);  // then rows of x in any split:
void MatMulQInt8Quantize(const MatMulQArgs& args, int64_t row_begin, int64_t row_end, MatMulQInt8Rows* out);
void MatMulQInt8Cpu(const MatMulQArgs& args, const MatMulQInt8Rows& x, int64_t row_begin, int64_t row_end);
// Any stored width (matmul_q_packed.cc): the arguments MatMulQQuantize takes (5 and 6 bits quantize x as 8 bits
// do), and rows [row_begin, row_end) by MatMulQCpu (rows non-null) or MatMulQFloatCpu (null), after turning
// the task's narrow scales into float32 and, except where the VNNI rows read them (m == 1), 5- and 6-bit
// codes into 8-bit ones.
MatMulQArgs MatMulQQuantizeArgs(const MatMulQArgs& args);
void MatMulQTask(const MatMulQArgs& args, const MatMulQPacked& packed, const std::vector<QuantRow>* rows,
                 int64_t row_begin, int64_t row_end, MatMulQPath path, const MatMulQInt8Rows* int8 = nullptr);

#ifdef WICORE_CUDA
// Launched on `stream` (ORT's compute stream for the node); no allocation, no synchronization.
// Returns cudaSuccess or the launch's error code.
int ResidualRMSNormCuda(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum, void* stream);
int GatedActivationCuda(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out, void* stream);
const char* CudaErrorString(int code);
int MatMulQ16Cuda(const MatMulQ16Args& args, void* stream);  // every pointer on the device (matmul_q16.cu)
// MatMulI8 (matmul_i8.cu): the GEMV (m <= kMatMulI8GemvRows); rows of x to int8 (q [rows, k], scales [rows]);
// the epilogue y[r, c] = half((float(acc[r * ldc + c]) * x_scales[r]) * scales[c]) for c < cols, y's rows ldy apart.
int MatMulI8GemvCuda(const MatMulI8Args& args, void* stream);
int MatMulI8QuantizeCuda(const uint16_t* x, int64_t rows, int64_t k, int8_t* q, float* x_scales, void* stream);
int MatMulI8EpilogueCuda(const int32_t* acc, int64_t ldc, const float* x_scales, const float* scales, int64_t rows,
                         int64_t cols, uint16_t* y, int64_t ldy, void* stream);
int CudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream);  // device to device, on `stream`

// BlockAttention in float16 (attention.cu): q [batch * seq, num_heads, head_dim], pools and out as
// BlockAttentionArgs, every pointer on the device, a half as its 16 bits; the same semantics.
struct BlockAttentionCudaArgs {
  const uint16_t* q;  // BlockAttentionQKV: the workspace's q (prefill chunks), unused in decode
  const uint16_t* k_pool;
  const uint16_t* v_pool;
  const int64_t* block_tables;
  const int64_t* positions;
  const int64_t* context_lens;
  const int64_t* first_block;  // or null
  uint16_t* out;
  int64_t batch, seq, num_heads, num_kv_heads, head_dim, block_size, max_blocks, window;
  float softcap;
  // BlockAttentionQKV (qkv not null): the prologue's inputs (QKVPrologueArgs, in float16); the pools are
  // written (k_pool, v_pool point to the op's outputs) and context_lens is null (past_seqlens + seq).
  const uint16_t* qkv = nullptr;
  const int64_t* slot_mapping = nullptr;
  const int32_t* past_seqlens = nullptr;
  const uint16_t* cos = nullptr;
  const uint16_t* sin = nullptr;
  const uint16_t* q_norm = nullptr;
  const uint16_t* k_norm = nullptr;
  float scale = 1.0f, epsilon = 0.0f;
};
bool BlockAttentionCudaSupports(int64_t head_dim);  // 64, 128 or 256
int CudaSmCount();  // the current device's SMs (the split-KV plan fills them)
bool CudaIsDevicePointer(const void* p);
// Bytes of device workspace BlockAttentionCuda needs (0: none; then `workspace` may be null); BlockAttentionQKV's
// prefill chunks also keep their q there.
size_t BlockAttentionCudaWorkspace(const BlockAttentionCudaArgs& args, int sm_count);
int BlockAttentionCuda(const BlockAttentionCudaArgs& args, int sm_count, void* workspace, void* stream);
#endif

}  // namespace wicore
