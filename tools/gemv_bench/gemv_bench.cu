// MatMulQ16's GEMV alone, no ONNX Runtime: the Gemma-3-27B linear shapes at 1, 2, 4, 8 and 16 rows, 4- and 8-bit
// blocks of 32 in MatMulNBits' layout (wicore/graph/quant.py pack_codes), each kernel variant against a plain
// float32 reference kernel (max |y - ref| / max |ref|), timed as the median over replays of a CUDA graph of
// launches. Each launch reads another copy of the weights (copies enough for ~512 MB), so the L2 (50 MB on
// an H200) does not serve them: a decode step reads every layer's weights once. GB/s = (codes + scales) / time.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -I<csrc> gemv_bench.cu -o gemv_bench && ./gemv_bench   (tools/gemv_bench/run.sh)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_old.cuh"
#include "matmul_q16_gemv.cuh"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

constexpr int kBlockSize = 32;  // the exporter's default (QuantLinear.block_size)

struct Shape {
  const char* name;
  int n, k, per_layer;  // per_layer: times in a decode step's layer (0: once a step, the head; -1: not in it)
};
// Gemma-3-27B (wicore/model/shapes.py): hidden 5376, q 32 x 128, k/v 16 x 128, intermediate 21504, 62 layers,
// the tied head (int4 / int8 as the layers: QuantLinear.head) 262208 x 5376.
const Shape kShapes[] = {
    {"qkv", 4096 + 2048 + 2048, 5376, 1}, {"o", 5376, 4096, 1}, {"gate_up", 2 * 21504, 5376, 1},
    {"down", 5376, 21504, 1},             {"head", 262208, 5376, 0},
    {"tail", 72, 4128, -1},  // k % 128 != 0: a chunk's last loads past k (checked, not in the step)
};
constexpr int kLayers = 62;

using Launch = void (*)(const __half*, const uint8_t*, const __half*, __half*, int, int, int, int, cudaStream_t);

template <int kBits>
void Old(const __half* x, const uint8_t* b, const __half* s, __half* y, int m, int n, int k, int bs, cudaStream_t st) {
  if (m <= 1) return old_gemv::LaunchGemv<kBits, 1>(x, b, s, y, m, n, k, bs, st);
  if (m <= 2) return old_gemv::LaunchGemv<kBits, 2>(x, b, s, y, m, n, k, bs, st);
  if (m <= 4) return old_gemv::LaunchGemv<kBits, 4>(x, b, s, y, m, n, k, bs, st);
  if (m <= 8) return old_gemv::LaunchGemv<kBits, 8>(x, b, s, y, m, n, k, bs, st);
  old_gemv::LaunchGemv<kBits, 16>(x, b, s, y, m, n, k, bs, st);
}

// The tensor-core GEMV, its x tiles by m (one MMA column tile to 8 rows, two to 16).
template <int kBits, int kTiles, int kWarps, int kUnroll>
void Mma(const __half* x, const uint8_t* b, const __half* s, __half* y, int m, int n, int k, int bs, cudaStream_t st) {
  if (m <= 8) return wicore::gemv::LaunchMmaGemv<kBits, kTiles, kWarps, kUnroll, 1>(x, b, s, y, m, n, k, bs, st);
  wicore::gemv::LaunchMmaGemv<kBits, kTiles, kWarps, kUnroll, 2>(x, b, s, y, m, n, k, bs, st);
}

struct Variant {
  std::string name;
  Launch launch[2];  // 4 bits, 8 bits
};

// name: t tiles of 16 weight rows a block, w warps splitting k, u chunks loaded before any is used. "mma
// t1w8u2" is what MatMulQ16 runs (matmul_q16.cu); round 2 of docs/PERFORMANCE.md's run also timed a
// two-stage register pipeline and adjacent chunks a warp (commit 80cc309's header), both slower.
#define MMA(T, W, U, NAME) Variant{NAME, {&Mma<4, T, W, U>, &Mma<8, T, W, U>}}

std::vector<Variant> Variants() {
  return {
      Variant{"old", {&Old<4>, &Old<8>}},
      MMA(1, 8, 2, "mma t1w8u2"),
      MMA(1, 4, 2, "mma t1w4u2"),
      MMA(1, 16, 2, "mma t1w16u2"),
      MMA(1, 8, 4, "mma t1w8u4"),
      MMA(2, 4, 1, "mma t2w4u1"),
  };
}

__global__ void Empty() {}

__device__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}
__global__ void FillBytes(uint8_t* p, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<uint8_t>(Hash(i, seed));
}
__global__ void FillHalves(__half* p, int64_t count, float lo, float hi, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2half_rn(lo + (hi - lo) * (Hash(i, seed) >> 8) * (1.0f / 16777216.0f));
}

// y[i, n] = sum_c x[i, c] * (code - 2^(bits-1)) * scale, w exact in float32, float32 sums in order of c.
__global__ void Reference(const __half* x, const uint8_t* b, const __half* scales, float* y, int m, int n, int k,
                          int bits) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  const uint8_t* codes = b + static_cast<int64_t>(row) * k * bits / 8;
  const float zero = static_cast<float>(1 << (bits - 1));
  for (int i = 0; i < m; ++i) {
    float acc = 0.0f;
    for (int c = 0; c < k; ++c) {
      const int code = bits == 8 ? codes[c] : (codes[c / 2] >> (4 * (c % 2))) & 15;
      const float w = (static_cast<float>(code) - zero) * __half2float(scales[static_cast<int64_t>(row) * (k / kBlockSize) + c / kBlockSize]);
      acc = fmaf(__half2float(x[static_cast<int64_t>(i) * k + c]), w, acc);
    }
    y[static_cast<int64_t>(i) * n + row] = acc;
  }
}

// us a launch of each of `batches` replays of `exec` (per_batch launches), sorted; two replays to warm up.
std::vector<float> Replay(cudaGraphExec_t exec, int per_batch, int batches, cudaStream_t st) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; ++i) CHECK(cudaGraphLaunch(exec, st));
  std::vector<float> times;
  for (int r = 0; r < batches; ++r) {
    CHECK(cudaEventRecord(e0, st));
    CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1000.0f / per_batch);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(times.begin(), times.end());
  return times;
}

struct Result {
  double us, gbs, err;
};

Result Measure(const Variant& v, int bits, const Shape& s, int m, const std::vector<uint8_t*>& b,
               const std::vector<__half*>& sc, const __half* x, __half* y, const float* ref, cudaStream_t st) {
  const Launch launch = v.launch[bits == 4 ? 0 : 1];
  CHECK(cudaMemset(y, 0xFF, sizeof(__half) * m * static_cast<size_t>(s.n)));  // NaN where nothing is written
  launch(x, b[0], sc[0], y, m, s.n, s.k, kBlockSize, st);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(st));
  std::vector<__half> got(static_cast<size_t>(m) * s.n);
  std::vector<float> want(got.size());
  CHECK(cudaMemcpy(got.data(), y, got.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(want.data(), ref, want.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double top = 0.0, worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    top = std::max(top, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(__half2float(got[i])) - want[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  const int copies = static_cast<int>(b.size());
  const int per_batch = std::max(10, copies), batches = 25;
  // a batch of launches, each on the next copy of the weights, captured once and replayed (the engine
  // replays its steps from CUDA graphs too)
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_batch; ++i) launch(x, b[i % copies], sc[i % copies], y, m, s.n, s.k, kBlockSize, st);
  CHECK(cudaStreamEndCapture(st, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<float> times = Replay(exec, per_batch, batches, st);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  const double us = times[times.size() / 2];
  const double bytes = static_cast<double>(s.n) * s.k * bits / 8 + static_cast<double>(s.n) * (s.k / kBlockSize) * 2;
  return {us, bytes / us / 1e3, worst / top};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";  // a variant's name to time alone
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int mem_clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  std::printf("# device %s, %d SMs, L2 %d MB, memory bus %d bits\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, bus_bits);
  std::printf("# block %d, median of 25 replays of a CUDA graph of >= 10 launches; GB/s = (codes + scales) / time\n",
              kBlockSize);
  std::printf("%-8s %4s %4s %-14s %10s %9s %10s\n", "shape", "bits", "rows", "variant", "us", "GB/s", "max_err");
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  {  // the floor: an empty kernel's launches replayed from a graph
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; ++i) Empty<<<132, 128, 0, st>>>();
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<float> t = Replay(exec, 20, 25, st);
    std::printf("# an empty kernel's launch in a graph: %.2f us (median)\n", t[t.size() / 2]);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  const std::vector<Variant> variants = Variants();
  const int rows_list[] = {1, 2, 4, 8, 16};
  constexpr int kRowCounts = 5;
  // step[bits][rows][variant]: the shapes' times summed as a 62-layer step
  std::vector<double> step(2 * kRowCounts * variants.size(), 0.0);
  for (int bits : {4, 8}) {
    for (const Shape& s : kShapes) {
      const size_t wbytes = static_cast<size_t>(s.n) * s.k * bits / 8, sbytes = static_cast<size_t>(s.n) * (s.k / kBlockSize);
      const int copies = static_cast<int>(std::min<size_t>(64, std::max<size_t>(1, (512u << 20) / wbytes)));
      std::vector<uint8_t*> b(copies);
      std::vector<__half*> sc(copies);
      for (int c = 0; c < copies; ++c) {
        CHECK(cudaMalloc(&b[c], wbytes));
        CHECK(cudaMalloc(&sc[c], sbytes * sizeof(__half)));
        if (c == 0) {
          FillBytes<<<1024, 256, 0, st>>>(b[0], static_cast<int64_t>(wbytes), 1u + bits);
          FillHalves<<<1024, 256, 0, st>>>(sc[0], static_cast<int64_t>(sbytes), 0.002f, 0.02f, 7u);
        } else {
          CHECK(cudaMemcpyAsync(b[c], b[0], wbytes, cudaMemcpyDeviceToDevice, st));
          CHECK(cudaMemcpyAsync(sc[c], sc[0], sbytes * sizeof(__half), cudaMemcpyDeviceToDevice, st));
        }
      }
      __half *x, *y;
      float* ref;
      CHECK(cudaMalloc(&x, sizeof(__half) * 16 * static_cast<size_t>(s.k)));
      CHECK(cudaMalloc(&y, sizeof(__half) * 16 * static_cast<size_t>(s.n)));
      CHECK(cudaMalloc(&ref, sizeof(float) * 16 * static_cast<size_t>(s.n)));
      FillHalves<<<256, 256, 0, st>>>(x, 16 * static_cast<int64_t>(s.k), -1.0f, 1.0f, 11u);
      for (int ri = 0; ri < kRowCounts; ++ri) {
        const int m = rows_list[ri];
        Reference<<<(s.n + 127) / 128, 128, 0, st>>>(x, b[0], sc[0], ref, m, s.n, s.k, bits);
        CHECK(cudaStreamSynchronize(st));
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          if (!only.empty() && variants[vi].name != only && variants[vi].name != "old") continue;
          const Result r = Measure(variants[vi], bits, s, m, b, sc, x, y, ref, st);
          std::printf("%-8s %4d %4d %-14s %10.2f %9.1f %10.2e\n", s.name, bits, m, variants[vi].name.c_str(), r.us, r.gbs,
                      r.err);
          std::fflush(stdout);
          if (s.per_layer >= 0)
            step[((bits == 4 ? 0 : 1) * kRowCounts + ri) * variants.size() + vi] += r.us * (s.per_layer ? s.per_layer * kLayers : 1);
        }
      }
      for (int c = 0; c < copies; ++c) {
        CHECK(cudaFree(b[c]));
        CHECK(cudaFree(sc[c]));
      }
      CHECK(cudaFree(x));
      CHECK(cudaFree(y));
      CHECK(cudaFree(ref));
    }
  }
  std::printf("\n# the linear layers of a 62-layer step (qkv + o + gate_up + down each layer, the head once), ms\n");
  std::printf("%-14s %4s %8s %8s %8s %8s %8s\n", "variant", "bits", "rows 1", "rows 2", "rows 4", "rows 8", "rows 16");
  for (int bi = 0; bi < 2; ++bi) {
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      if (step[(bi * kRowCounts) * variants.size() + vi] == 0.0) continue;
      std::printf("%-14s %4d", variants[vi].name.c_str(), bi == 0 ? 4 : 8);
      for (int ri = 0; ri < kRowCounts; ++ri) std::printf(" %8.2f", step[(bi * kRowCounts + ri) * variants.size() + vi] / 1e3);
      std::printf("\n");
    }
  }
  return 0;
}
