// ArgMaxRows (CPU): each row's greedy token, the index of its first largest logit, as ONNX's ArgMax (axis -1,
// keepdims 0, select_last_index 0) gives it for logits without NaN. ONNX Runtime's ArgMax reads a 49,152-entry
// row at ~1.5 ns an entry (~75 us, 5% of a tiny model's decode step; docs/PERFORMANCE.md, issue 37); 16 lanes
// of AVX-512 compares take ~4 us.
#include <cstdint>
#include <limits>

#include <immintrin.h>

#include "ops_common.h"

namespace wicore::ops {
namespace {

int64_t FirstLargestScalar(const float* v, int64_t n, int64_t from, float best, int64_t at) {
  for (int64_t j = from; j < n; ++j) {
    if (v[j] > best) best = v[j], at = j;
  }
  return at;
}

// Lane l keeps the first largest of entries l, l + 16, ...; the row's first largest is the smallest index
// among the lanes that hold the largest value, then the tail goes on from it, strictly greater.
__attribute__((target("avx512f"))) int64_t FirstLargestAvx512(const float* v, int64_t n) {
  const int64_t whole = n / 16 * 16;
  if (whole == 0) return FirstLargestScalar(v, n, 0, -std::numeric_limits<float>::infinity(), 0);
  __m512 best = _mm512_loadu_ps(v);
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i index = at;
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t j = 16; j < whole; j += 16) {
    index = _mm512_add_epi32(index, step);
    const __m512 x = _mm512_loadu_ps(v + j);
    const __mmask16 greater = _mm512_cmp_ps_mask(x, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, x);
    at = _mm512_mask_mov_epi32(at, greater, index);
  }
  const float top = _mm512_reduce_max_ps(best);
  const __mmask16 holders = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
  const int32_t first = _mm512_mask_reduce_min_epi32(holders, at);
  return FirstLargestScalar(v, n, whole, top, holders != 0 ? first : 0);
}

// The same on AVX2 (no AVX-512): 4 vectors of 8 lanes, lane l of vector s keeping the first largest of the entries
// 32 i + 8 s + l (four independent compare-and-blend chains; one took ~4 cycles of latency a vector).
__attribute__((target("avx2"))) int64_t FirstLargestAvx2(const float* v, int64_t n) {
  const int64_t whole = n / 32 * 32;
  if (whole == 0) return FirstLargestScalar(v, n, 1, v[0], 0);
  __m256 best[4];
  __m256i at[4];
  for (int s = 0; s < 4; ++s) {
    best[s] = _mm256_loadu_ps(v + 8 * s);
    at[s] = _mm256_setr_epi32(8 * s, 8 * s + 1, 8 * s + 2, 8 * s + 3, 8 * s + 4, 8 * s + 5, 8 * s + 6, 8 * s + 7);
  }
  __m256i index[4] = {at[0], at[1], at[2], at[3]};
  const __m256i step = _mm256_set1_epi32(32);
  for (int64_t j = 32; j < whole; j += 32) {
    for (int s = 0; s < 4; ++s) {
      index[s] = _mm256_add_epi32(index[s], step);
      const __m256 x = _mm256_loadu_ps(v + j + 8 * s);
      const __m256 greater = _mm256_cmp_ps(x, best[s], _CMP_GT_OQ);
      best[s] = _mm256_blendv_ps(best[s], x, greater);
      at[s] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at[s]), _mm256_castsi256_ps(index[s]), greater));
    }
  }
  alignas(32) float values[32];
  alignas(32) int32_t indices[32];
  for (int s = 0; s < 4; ++s) {
    _mm256_store_ps(values + 8 * s, best[s]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(indices + 8 * s), at[s]);
  }
  float top = values[0];
  int32_t first = indices[0];
  for (int l = 1; l < 32; ++l) {  // the largest value, at the smallest index that holds it
    if (values[l] > top || (values[l] == top && indices[l] < first)) top = values[l], first = indices[l];
  }
  return FirstLargestScalar(v, n, whole, top, first);
}

struct ArgMaxRowsKernel {
  explicit ArgMaxRowsKernel(const OrtKernelInfo*)
      : avx512_(__builtin_cpu_supports("avx512f")), avx2_(__builtin_cpu_supports("avx2")) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    auto x = ctx.GetInput(0);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    Check(!shape.empty() && shape.back() > 0, "wicore ArgMaxRows: logits are [..., vocab], vocab > 0");
    const int64_t n = shape.back(), rows = Rows(shape);
    Check(n <= std::numeric_limits<int32_t>::max(), "wicore ArgMaxRows: rows of at most 2**31 - 1 entries");
    shape.pop_back();
    auto y = ctx.GetOutput(0, shape);
    const float* v = x.GetTensorData<float>();
    int64_t* out = y.GetTensorMutableData<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = v + r * n;
      out[r] = avx512_ ? FirstLargestAvx512(row, n) : avx2_ ? FirstLargestAvx2(row, n) : FirstLargestScalar(row, n, 1, row[0], 0);
    }
  }

  bool avx512_, avx2_;
};

struct ArgMaxRowsOp : Ort::CustomOpBase<ArgMaxRowsOp, ArgMaxRowsKernel> {
  void* CreateKernel(const OrtApi&, const OrtKernelInfo* info) const { return new ArgMaxRowsKernel(info); }
  const char* GetName() const { return "ArgMaxRows"; }
  const char* GetExecutionProviderType() const { return nullptr; }
  size_t GetInputTypeCount() const { return 1; }
  Type GetInputType(size_t) const { return kF32; }
  size_t GetOutputTypeCount() const { return 1; }
  Type GetOutputType(size_t) const { return kI64; }
};

}  // namespace

void AddGreedyOps(std::vector<OrtCustomOp*>* ops) { ops->push_back(new ArgMaxRowsOp()); }

}  // namespace wicore::ops
