// cuBLASLt's int8 GEMM for wicore.MatMulI8 (cublaslt_i8.cc), behind a small interface so that cublasLt.h stays
// out of the ops' sources: built with the header where library.py finds one (-DWICORE_CUBLASLT), else every
// call says so in one line. The library itself is opened at run time (dlopen of the header's soname,
// libcublasLt.so.<CUBLAS_VER_MAJOR>): where ONNX Runtime's CUDA EP already loaded it, that same copy; nothing is
// linked, so the kernel library loads (and its other ops run) on a machine without cuBLASLt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wicore {

class CublasLtI8 {
 public:
  // cuBLASLt's workspace a GEMM may use (the caller allocates it; the heuristic is asked for algorithms within it).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Whether cuBLASLt can be used here (built with its header, its library opened), without touching a device:
  // the kernel asks when ORT makes it, so a session that needs MatMulI8 fails as it is created, in one line.
  static bool Available(std::string* error);
  // A handle on the current device, or null and `error` set (no header at build, no library at run time).
  static std::unique_ptr<CublasLtI8> Create(std::string* error);
  virtual ~CublasLtI8() = default;

  // c [rows, ldc] int32, row-major = xq [rows, k] · w [cols, k]ᵀ (int8, both row-major; k and ldc multiples of 4,
  // pointers 16-byte aligned at least), enqueued on `stream`; the algorithm found once per (rows, cols, alignment)
  // and kept. Returns false and sets `error` where cuBLASLt refuses.
  virtual bool Gemm(const int8_t* w, const int8_t* xq, int32_t* c, int64_t rows, int64_t cols, int64_t k, int64_t ldc,
                    void* workspace, void* stream, std::string* error) = 0;
};

}  // namespace wicore
