//===- CublasLtPlanTest.cpp - cuBLASLt descriptors from GEMM plans --------===//
//
// cuBLASLt builds matmul and layout descriptors without a device: every
// descriptor the CUDA backend would run is built here from its plan and read
// back (operations, rows, columns, leading dimensions, batch count and
// strides, compute type), on machines with no GPU.
//
//===----------------------------------------------------------------------===//

#include "backends/cuda/CublasLtGemm.h"

#include <gtest/gtest.h>

using namespace tessera::rt;
using namespace tessera::rt::cuda;

namespace {

template <typename T>
T layoutAttribute(cublasLtMatrixLayout_t layout,
                  cublasLtMatrixLayoutAttribute_t attr) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, attr, &value,
                                             sizeof(value), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(value));
  return value;
}

template <typename T>
T matmulAttribute(cublasLtMatmulDesc_t desc,
                  cublasLtMatmulDescAttributes_t attr) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, attr, &value, sizeof(value),
                                           &written),
            CUBLAS_STATUS_SUCCESS);
  return value;
}

/// The layout holds `rows` x `cols` elements of `type` with leading
/// dimension `ld`, and `batch` matrices `stride` apart.
void expectLayout(cublasLtMatrixLayout_t layout, int64_t rows, int64_t cols,
                  int64_t ld, int64_t batch, int64_t stride,
                  const char *which, cudaDataType_t type = CUDA_R_32F) {
  SCOPED_TRACE(which);
  EXPECT_EQ(layoutAttribute<uint32_t>(layout, CUBLASLT_MATRIX_LAYOUT_TYPE),
            uint32_t(type));
  EXPECT_EQ(layoutAttribute<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_ROWS),
            uint64_t(rows));
  EXPECT_EQ(layoutAttribute<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_COLS),
            uint64_t(cols));
  EXPECT_EQ(layoutAttribute<int64_t>(layout, CUBLASLT_MATRIX_LAYOUT_LD), ld);
  EXPECT_EQ(
      layoutAttribute<int32_t>(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT),
      int32_t(batch));
  if (batch > 1)
    EXPECT_EQ(layoutAttribute<int64_t>(
                  layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET),
              stride);
}

void expectDescriptorsOf(const GemmPlan &p, bool tf32) {
  auto d = LtGemmDescriptors::create(p, tf32);
  ASSERT_TRUE(d.ok()) << d.status().toString();
  // bf16 operands accumulate in plain f32: TF32 rounds f32 inputs only.
  EXPECT_EQ(matmulAttribute<int32_t>(d->matmul,
                                     CUBLASLT_MATMUL_DESC_COMPUTE_TYPE),
            int32_t(tf32 && !p.halfInputs() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F));
  EXPECT_EQ(matmulAttribute<int32_t>(d->matmul,
                                     CUBLASLT_MATMUL_DESC_SCALE_TYPE),
            int32_t(CUDA_R_32F));
  EXPECT_EQ(matmulAttribute<int32_t>(d->matmul, CUBLASLT_MATMUL_DESC_TRANSA),
            int32_t(p.transA ? CUBLAS_OP_T : CUBLAS_OP_N));
  EXPECT_EQ(matmulAttribute<int32_t>(d->matmul, CUBLASLT_MATMUL_DESC_TRANSB),
            int32_t(p.transB ? CUBLAS_OP_T : CUBLAS_OP_N));
  const cudaDataType_t inputs = p.inputs == FloatFormat::BF16 ? CUDA_R_16BF
                                : p.inputs == FloatFormat::F16 ? CUDA_R_16F
                                                               : CUDA_R_32F;
  expectLayout(d->a, p.rowsA(), p.colsA(), p.lda, p.batch, p.strideA, "A",
               inputs);
  expectLayout(d->b, p.rowsB(), p.colsB(), p.ldb, p.batch, p.strideB, "B",
               inputs);
  expectLayout(d->c, p.m, p.n, p.ldc, p.batch, p.strideC, "C");
}

} // namespace

TEST(CublasLtPlanTest, DenseGemmDescriptors) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool tf32 : {false, true})
        expectDescriptorsOf(
            columnMajorPlan(denseRowMajorGemm(ta, tb, 7, 5, 9)), tf32);
}

TEST(CublasLtPlanTest, Bf16GemmDescriptors) {
  // Mixed precision's GEMMs: bf16 (--bf16) or f16 (--fp16) A and B, f32
  // C, f32 accumulation.
  for (FloatFormat half : {FloatFormat::BF16, FloatFormat::F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool tf32 : {false, true}) {
          GemmPlan p = columnMajorPlan(denseRowMajorGemm(ta, tb, 7, 5, 9));
          p.inputs = half;
          expectDescriptorsOf(p, tf32);
        }
}

TEST(CublasLtPlanTest, AttentionDescriptorsAreStridedBatched) {
  AttentionPlans a = attentionPlans(/*seq=*/128, /*batch=*/4, /*heads=*/8,
                                    /*headDim=*/64, /*count=*/16);
  for (const RowMajorGemm *g : {&a.scores, &a.context, &a.gradV, &a.gradProbs,
                                &a.gradQ, &a.gradK}) {
    GemmPlan p = columnMajorPlan(*g);
    EXPECT_EQ(p.batch, 16);
    expectDescriptorsOf(p, false);
  }
}

TEST(CublasLtPlanTest, RingAttentionDescriptorsAreStridedBatched) {
  RingAttentionPlans r = ringAttentionPlans(/*chunk=*/512, /*batch=*/2,
                                            /*heads=*/16, /*headDim=*/128,
                                            /*count=*/8);
  for (const RowMajorGemm *g : {&r.scores, &r.context, &r.gradV,
                                &r.gradProbs, &r.gradQ, &r.gradK}) {
    GemmPlan p = columnMajorPlan(*g);
    EXPECT_EQ(p.batch, 8);
    EXPECT_TRUE(isValidPlan(p));
    expectDescriptorsOf(p, false);
  }
}

TEST(CublasLtPlanTest, MalformedPlanIsAnError) {
  GemmPlan p = columnMajorPlan(denseRowMajorGemm(false, false, 4, 3, 2));
  p.ldc = 1;
  auto d = LtGemmDescriptors::create(p, false);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("malformed GEMM plan"),
            std::string::npos);
}
