// cublaslt_i8.h's GEMM: cuBLASLt's int8 x int8 -> int32 (IMMA tensor cores), opened with dlopen.
//
// Row-major C [rows, cols] = Xq [rows, k] · Wᵀ is, in cuBLAS's column-major terms, Cᵀ [cols, rows] = W · Xqᵀ
// with W [cols, k] row-major read as the column-major [k, cols] matrix transposed: "TN", the layout cuBLASLt's
// int8 kernels take (CUBLASLT_ORDER_COL, transa T, transb N; k and the leading dimensions multiples of 4).
//
//   A = W   int8 [k, cols] ld k, op T       B = Xq  int8 [k, rows] ld k, op N       C = int32 [cols, rows] ld ldc
//
// compute CUBLAS_COMPUTE_32I, alpha 1 and beta 0 as int32 on the host (read when the call is enqueued: a CUDA
// graph captures the launch). The descriptors and the heuristic's algorithm are made once per (rows, cols,
// alignment) and kept (a decode step's row counts are few; a prompt's chunks are at most 256 rows).
#include "cublaslt_i8.h"

#ifdef WICORE_CUBLASLT
#include <cublasLt.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#endif

namespace wicore {

#ifndef WICORE_CUBLASLT

bool CublasLtI8::Available(std::string* error) { return Create(error) != nullptr; }  // (never made: no header)

std::unique_ptr<CublasLtI8> CublasLtI8::Create(std::string* error) {
  *error = "this build of WiCore's kernels has no cuBLASLt: cublasLt.h was not found when it was compiled (a CUDA "
           "toolkit's include/, or pip install nvidia-cublas); export without --matmul-i8";
  return nullptr;
}

#else

namespace {

#define WICORE_STR2(x) #x
#define WICORE_STR(x) WICORE_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." WICORE_STR(CUBLAS_VER_MAJOR);

struct Api {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtGetStatusString) status_string;
};

// The process's one copy of the functions (dlopen returns ORT's handle where it loaded the same soname), or null
// and the reason.
const Api* LoadApi(std::string* error) {
  static std::string reason;
  static const Api* api = [] () -> const Api* {
    void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      reason = std::string("cannot load ") + kSoname + " (" + (why ? why : "?") + "): MatMulI8 needs the cuBLASLt of CUDA " +
               WICORE_STR(CUBLAS_VER_MAJOR) + " (the toolkit's lib64 or pip's nvidia-cublas on the loader's path)";
      return nullptr;
    }
    auto* a = new Api;
    bool ok = true;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (f == nullptr && ok) {
        ok = false;
        reason = std::string(kSoname) + " lacks " + name;
      }
    };
    sym(a->create, "cublasLtCreate");
    sym(a->destroy, "cublasLtDestroy");
    sym(a->desc_create, "cublasLtMatmulDescCreate");
    sym(a->desc_destroy, "cublasLtMatmulDescDestroy");
    sym(a->desc_set, "cublasLtMatmulDescSetAttribute");
    sym(a->layout_create, "cublasLtMatrixLayoutCreate");
    sym(a->layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(a->pref_create, "cublasLtMatmulPreferenceCreate");
    sym(a->pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(a->pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(a->heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a->matmul, "cublasLtMatmul");
    sym(a->status_string, "cublasLtGetStatusString");
    return ok ? a : nullptr;
  }();
  if (api == nullptr) *error = reason;
  return api;
}

// The largest power of two up to 256 that divides the address (the alignment the heuristic may assume).
uint32_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

class Impl final : public CublasLtI8 {
 public:
  Impl(const Api* api, cublasLtHandle_t handle) : api_(api), handle_(handle) {}

  ~Impl() override {
    for (auto& [key, plan] : plans_) {
      api_->layout_destroy(plan.a);
      api_->layout_destroy(plan.b);
      api_->layout_destroy(plan.c);
    }
    if (desc_ != nullptr) api_->desc_destroy(desc_);
    api_->destroy(handle_);
  }

  bool Gemm(const int8_t* w, const int8_t* xq, int32_t* c, int64_t rows, int64_t cols, int64_t k, int64_t ldc,
            void* workspace, void* stream, std::string* error) override {
    std::lock_guard<std::mutex> lock(mutex_);  // ORT may run one session from several threads
    const Plan* plan = Find(rows, cols, k, ldc, Alignment(w), Alignment(xq), Alignment(c), error);
    if (plan == nullptr) return false;
    const int32_t alpha = 1, beta = 0;
    return Ok(api_->matmul(handle_, desc_, &alpha, w, plan->a, xq, plan->b, &beta, c, plan->c, c, plan->c, &plan->algo,
                           workspace, kWorkspaceBytes, static_cast<cudaStream_t>(stream)),
              "cublasLtMatmul", error);
  }

 private:
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };

  bool Ok(cublasStatus_t s, const char* what, std::string* error) const {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    *error = std::string(what) + ": " + api_->status_string(s);
    return false;
  }

  const Plan* Find(int64_t rows, int64_t cols, int64_t k, int64_t ldc, uint32_t align_a, uint32_t align_b,
                   uint32_t align_c, std::string* error) {
    const auto key = std::make_tuple(rows, cols, k, ldc, align_a, align_b, align_c);
    auto it = plans_.find(key);
    if (it != plans_.end()) return &it->second;
    if (desc_ == nullptr) {
      const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
      const cudaDataType_t scale = CUDA_R_32I;
      if (!Ok(api_->desc_create(&desc_, CUBLAS_COMPUTE_32I, CUDA_R_32I), "cublasLtMatmulDescCreate", error) ||
          !Ok(api_->desc_set(desc_, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale, sizeof scale), "scale type", error) ||
          !Ok(api_->desc_set(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa", error) ||
          !Ok(api_->desc_set(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "transb", error)) {
        return nullptr;
      }
    }
    Plan plan;
    bool ok = Ok(api_->layout_create(&plan.a, CUDA_R_8I, k, cols, k), "layout A", error) &&
              Ok(api_->layout_create(&plan.b, CUDA_R_8I, k, rows, k), "layout B", error) &&
              Ok(api_->layout_create(&plan.c, CUDA_R_32I, cols, rows, ldc), "layout C", error);
    cublasLtMatmulPreference_t pref = nullptr;
    ok = ok && Ok(api_->pref_create(&pref), "preference", error);
    const size_t bytes = kWorkspaceBytes;
    ok = ok && Ok(api_->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes), "workspace", error) &&
         Ok(api_->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a), "align A", error) &&
         Ok(api_->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b), "align B", error) &&
         Ok(api_->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c), "align C", error) &&
         Ok(api_->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c), "align D", error);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok = ok && Ok(api_->heuristic(handle_, desc_, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found),
                  "cublasLtMatmulAlgoGetHeuristic", error);
    if (pref != nullptr) api_->pref_destroy(pref);
    if (ok && found == 0) {
      *error = "cuBLASLt has no int8 algorithm for " + std::to_string(rows) + " x " + std::to_string(cols) + " x " +
               std::to_string(k) + " (K and N must be multiples of 4)";
      ok = false;
    }
    if (!ok) {
      for (auto layout : {plan.a, plan.b, plan.c})
        if (layout != nullptr) api_->layout_destroy(layout);
      return nullptr;
    }
    plan.algo = result.algo;
    return &plans_.emplace(key, plan).first->second;
  }

  const Api* api_;
  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>, Plan> plans_;
  std::mutex mutex_;
};

}  // namespace

bool CublasLtI8::Available(std::string* error) { return LoadApi(error) != nullptr; }

std::unique_ptr<CublasLtI8> CublasLtI8::Create(std::string* error) {
  const Api* api = LoadApi(error);
  if (api == nullptr) return nullptr;
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t s = api->create(&handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    *error = std::string("cublasLtCreate: ") + api->status_string(s);
    return nullptr;
  }
  return std::make_unique<Impl>(api, handle);
}

#endif

}  // namespace wicore
