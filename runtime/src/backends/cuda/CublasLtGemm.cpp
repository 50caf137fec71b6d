//===- CublasLtGemm.cpp - cuBLASLt descriptors of a GemmPlan --------------===//

#include "CublasLtGemm.h"

#include <cstdint>

namespace tessera::rt::cuda {

Status cublasStatus(cublasStatus_t status, const char *what) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return Status();
  return internalError(what, ": ", cublasLtGetStatusString(status));
}

LtGemmDescriptors &
LtGemmDescriptors::operator=(LtGemmDescriptors &&other) noexcept {
  if (this != &other) {
    reset();
    matmul = other.matmul;
    a = other.a;
    b = other.b;
    c = other.c;
    other.matmul = nullptr;
    other.a = other.b = other.c = nullptr;
  }
  return *this;
}

LtGemmDescriptors::~LtGemmDescriptors() { reset(); }

void LtGemmDescriptors::reset() {
  if (matmul)
    cublasLtMatmulDescDestroy(matmul);
  for (cublasLtMatrixLayout_t layout : {a, b, c})
    if (layout)
      cublasLtMatrixLayoutDestroy(layout);
  matmul = nullptr;
  a = b = c = nullptr;
}

/// A column-major layout of `type` elements, `rows` x `cols` with leading
/// dimension `ld`, and `batch` matrices `stride` elements apart.
static StatusOr<cublasLtMatrixLayout_t>
makeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
           int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  TESSERA_RETURN_IF_ERROR(cublasStatus(
      cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows),
                                 uint64_t(cols), ld),
      "cublasLtMatrixLayoutCreate"));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    Status st = cublasStatus(
        cublasLtMatrixLayoutSetAttribute(layout,
                                         CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                         &count, sizeof(count)),
        "setting CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT");
    if (st.ok())
      st = cublasStatus(cublasLtMatrixLayoutSetAttribute(
                            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            &stride, sizeof(stride)),
                        "setting CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET");
    if (!st.ok()) {
      cublasLtMatrixLayoutDestroy(layout);
      return st;
    }
  }
  return layout;
}

StatusOr<LtGemmDescriptors> LtGemmDescriptors::create(const GemmPlan &plan,
                                                      bool allowTf32) {
  if (!isValidPlan(plan))
    return invalidArgument("malformed GEMM plan m=", plan.m, " n=", plan.n,
                           " k=", plan.k, " lda=", plan.lda, " ldb=", plan.ldb,
                           " ldc=", plan.ldc, " batch=", plan.batch);
  if (plan.batch > INT32_MAX)
    return unimplemented("GEMM batch ", plan.batch, " exceeds cuBLASLt's int32");
  LtGemmDescriptors d;
  // bf16 x bf16 and f16 x f16 accumulate in f32 (TF32 is about rounding
  // f32 inputs, so it does not apply); alpha and beta are f32 either way.
  auto dataType = [](FloatFormat f) {
    return f == FloatFormat::BF16  ? CUDA_R_16BF
           : f == FloatFormat::F16 ? CUDA_R_16F
                                   : CUDA_R_32F;
  };
  const cudaDataType_t inputs = dataType(plan.inputs);
  if (plan.output != FloatFormat::F32 && plan.output != plan.inputs)
    return invalidArgument("a GEMM's 16-bit C must have A and B's format");
  TESSERA_RETURN_IF_ERROR(cublasStatus(
      cublasLtMatmulDescCreate(&d.matmul,
                               allowTf32 && !plan.halfInputs()
                                   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                   : CUBLAS_COMPUTE_32F,
                               CUDA_R_32F),
      "cublasLtMatmulDescCreate"));
  cublasOperation_t ta = plan.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = plan.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  TESSERA_RETURN_IF_ERROR(cublasStatus(
      cublasLtMatmulDescSetAttribute(d.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                     sizeof(ta)),
      "setting CUBLASLT_MATMUL_DESC_TRANSA"));
  TESSERA_RETURN_IF_ERROR(cublasStatus(
      cublasLtMatmulDescSetAttribute(d.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                     sizeof(tb)),
      "setting CUBLASLT_MATMUL_DESC_TRANSB"));
  TESSERA_ASSIGN_OR_RETURN(d.a,
                           makeLayout(inputs, plan.rowsA(), plan.colsA(),
                                      plan.lda, plan.batch, plan.strideA));
  TESSERA_ASSIGN_OR_RETURN(d.b,
                           makeLayout(inputs, plan.rowsB(), plan.colsB(),
                                      plan.ldb, plan.batch, plan.strideB));
  TESSERA_ASSIGN_OR_RETURN(d.c, makeLayout(dataType(plan.output), plan.m, plan.n,
                                           plan.ldc, plan.batch, plan.strideC));
  return StatusOr<LtGemmDescriptors>(std::move(d));
}

} // namespace tessera::rt::cuda
