//===- CublasLtGemm.h - cuBLASLt descriptors of a GemmPlan ------*- C++ -*-===//
//
// Turns a column-major GemmPlan (GemmPlan.h) into the cuBLASLt matmul and
// matrix-layout descriptors that run it: fp32 operands and accumulation
// (CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when TF32 is
// allowed), or bf16 A and B with f32 C and accumulation (CUBLAS_COMPUTE_32F)
// for a plan with 16-bit inputs; transposes on the matmul descriptor, strided
// batches on the layouts. Creating descriptors needs neither a device nor a handle, so the
// CPU tests check them against their plans.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_CUBLASLTGEMM_H
#define TESSERA_RT_BACKENDS_CUDA_CUBLASLTGEMM_H

#include "GemmPlan.h"

#include "tessera/rt/Status.h"

#include <cublasLt.h>

#include <utility>

namespace tessera::rt::cuda {

/// "<what>: <cuBLAS status name>" for a failed call, OK otherwise.
Status cublasStatus(cublasStatus_t status, const char *what);

/// The descriptors of one plan (owned; destroyed with the object).
class LtGemmDescriptors {
public:
  LtGemmDescriptors() = default;
  LtGemmDescriptors(const LtGemmDescriptors &) = delete;
  LtGemmDescriptors &operator=(const LtGemmDescriptors &) = delete;
  LtGemmDescriptors(LtGemmDescriptors &&other) noexcept { *this = std::move(other); }
  LtGemmDescriptors &operator=(LtGemmDescriptors &&other) noexcept;
  ~LtGemmDescriptors();

  /// Builds the descriptors of `plan` (which must satisfy isValidPlan).
  static StatusOr<LtGemmDescriptors> create(const GemmPlan &plan,
                                            bool allowTf32);

  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

private:
  void reset();
};

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_CUBLASLTGEMM_H
