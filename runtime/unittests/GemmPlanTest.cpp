//===- GemmPlanTest.cpp - The CUDA backend's GEMM plans on OpenBLAS -------===//
//
// The CUDA backend runs every row-major product as a column-major cuBLASLt
// call described by a GemmPlan (backends/cuda/GemmPlan.h). Here the same
// plans run through OpenBLAS's column-major sgemm, one batch entry at a
// time with the plan's strides, and must reproduce the CPU backend: the
// dense Gemm opcode in every transpose, and attention and its gradient
// assembled exactly as CudaBackend::attention(Grad) assembles them (chunks
// of heads, strided-batched plans around the row softmax), so the operand
// swap, leading dimensions and batch strides are checked without a GPU.
//
//===----------------------------------------------------------------------===//

#include "backends/cuda/GemmPlan.h"

#include "tessera/rt/Backend.h"
#include "tessera/rt/math/Kernels.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace tessera::rt;
using namespace tessera::rt::cuda;

namespace {

using Vec = std::vector<float>;

/// Runs column-major `plan` with OpenBLAS: colA and colB are the plan's
/// operands (the row-major B and A when swapOperands).
void runColumnMajor(const GemmPlan &p, const float *colA, const float *colB,
                    float *c, float alpha, float beta) {
  ASSERT_TRUE(isValidPlan(p));
  for (int64_t z = 0; z < p.batch; ++z)
    cblas_sgemm(CblasColMajor, p.transA ? CblasTrans : CblasNoTrans,
                p.transB ? CblasTrans : CblasNoTrans, int(p.m), int(p.n),
                int(p.k), alpha, colA + z * p.strideA, int(p.lda),
                colB + z * p.strideB, int(p.ldb), beta, c + z * p.strideC,
                int(p.ldc));
}

/// Row-major `g` on A, B, C through its column-major plan (as
/// CudaBackend::runRowMajor does).
void runRowMajor(const RowMajorGemm &g, const float *a, const float *b,
                 float *c, float alpha, float beta) {
  GemmPlan p = columnMajorPlan(g);
  ASSERT_TRUE(p.swapOperands);
  runColumnMajor(p, b, a, c, alpha, beta);
}

/// The softmax kernel of Kernels.cu, row by row on the host.
void softmaxRows(float *p, int64_t rows, int64_t cols, bool causal) {
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * cols;
    int64_t valid = causal ? r % cols + 1 : cols;
    float mx = -INFINITY;
    for (int64_t j = 0; j < valid; ++j)
      mx = math::selectf(pr[j] > mx, pr[j], mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < valid; ++j)
      sum += math::expApprox(pr[j] - mx);
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < cols; ++j)
      pr[j] = j < valid ? math::expApprox(pr[j] - mx) * inv : 0.0f;
  }
}

void softmaxGradRows(const float *p, float *dp, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float dot = 0.0f;
    for (int64_t j = 0; j < cols; ++j)
      dot += p[r * cols + j] * dp[r * cols + j];
    for (int64_t j = 0; j < cols; ++j)
      dp[r * cols + j] = p[r * cols + j] * (dp[r * cols + j] - dot);
  }
}

class GemmPlanTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto b = BackendRegistry::global().create("cpu", {});
    ASSERT_TRUE(b.ok()) << b.status().toString();
    cpu = std::move(*b);
  }
  Vec random(size_t n) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    Vec v(n);
    for (float &x : v)
      x = dist(gen);
    return v;
  }
  std::unique_ptr<Backend> cpu;
  std::mt19937 gen{5};
};

void expectClose(const Vec &got, const Vec &want, float tol,
                 const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i])))
        << what << " at " << i;
}

} // namespace

TEST_F(GemmPlanTest, DensePlansMatchTheCpuGemm) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{7, 5, 9}, Shape{1, 1, 1}, Shape{64, 3, 17},
                  Shape{2, 33, 1}, Shape{16, 16, 16}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 0.5f}) {
          Vec a = random(size_t(s.m * s.k)), b = random(size_t(s.k * s.n));
          Vec c0 = random(size_t(s.m * s.n)), c1 = c0;
          ASSERT_TRUE(cpu->gemm(ta, tb, s.m, s.n, s.k, 1.25f, a.data(),
                                b.data(), beta, c0.data())
                          .ok());
          RowMajorGemm g = denseRowMajorGemm(ta, tb, s.m, s.n, s.k);
          GemmPlan p = columnMajorPlan(g);
          // C^T = op(B)^T op(A)^T: m and n swap, the flags stay with their
          // matrices.
          EXPECT_EQ(p.m, s.n);
          EXPECT_EQ(p.n, s.m);
          EXPECT_EQ(p.transA, tb);
          EXPECT_EQ(p.transB, ta);
          EXPECT_EQ(p.ldc, s.n);
          runRowMajor(g, a.data(), b.data(), c1.data(), 1.25f, beta);
          expectClose(c1, c0, 1e-6f,
                      "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                          " k=" + std::to_string(s.k) + " ta=" +
                          std::to_string(ta) + " tb=" + std::to_string(tb));
        }
}

TEST_F(GemmPlanTest, MalformedPlansAreRejected) {
  GemmPlan p = columnMajorPlan(denseRowMajorGemm(false, false, 4, 3, 2));
  EXPECT_TRUE(isValidPlan(p));
  GemmPlan bad = p;
  bad.lda = 1; // fewer than the stored rows
  EXPECT_FALSE(isValidPlan(bad));
  bad = p;
  bad.batch = 0;
  EXPECT_FALSE(isValidPlan(bad));
  bad = p;
  bad.k = 0;
  EXPECT_FALSE(isValidPlan(bad));
}

TEST_F(GemmPlanTest, AttentionChunksFitTheirScratch) {
  EXPECT_EQ(attentionChunk(128, 64, 1, int64_t(128) * 128 * 4 * 10), 10);
  EXPECT_EQ(attentionChunk(128, 4, 1, int64_t(1) << 30), 4);
  EXPECT_EQ(attentionChunk(4096, 64, 2, 1024), 1); // at least one head
}

/// Attention forward and backward through the strided-batched plans, in
/// chunks of `chunk` heads, against the CPU backend.
TEST_F(GemmPlanTest, AttentionPlansMatchTheCpuBackend) {
  struct Shape {
    int64_t S, B, A, D;
  };
  for (Shape sh : {Shape{1, 1, 1, 4}, Shape{5, 2, 3, 7}, Shape{9, 3, 1, 16},
                   Shape{70, 2, 2, 5}})
    for (bool causal : {true, false})
      for (int64_t chunk : {int64_t(1), int64_t(2), sh.B * sh.A}) {
        const int64_t S = sh.S, B = sh.B, A = sh.A, D = sh.D;
        const int64_t total = B * A;
        std::string what = "S=" + std::to_string(S) + " B=" +
                           std::to_string(B) + " A=" + std::to_string(A) +
                           " D=" + std::to_string(D) + " causal=" +
                           std::to_string(causal) + " chunk=" +
                           std::to_string(chunk);
        Vec qkv = random(size_t(S * B * A * 3 * D));
        Vec dout = random(size_t(S * B * A * D));
        Vec want(dout.size()), wantGrad(qkv.size());
        ASSERT_TRUE(cpu->attention(qkv.data(), want.data(), S, B, A, D, causal)
                        .ok());
        ASSERT_TRUE(cpu->attentionGrad(qkv.data(), dout.data(),
                                       wantGrad.data(), S, B, A, D, causal)
                        .ok());

        const float scale = float(1.0 / std::sqrt(double(D)));
        Vec out(dout.size(), NAN), dqkv(qkv.size(), NAN);
        Vec probs(size_t(chunk * S * S)), dprobs(probs.size());
        for (int64_t z0 = 0; z0 < total; z0 += chunk) {
          const int64_t count = std::min(chunk, total - z0);
          AttentionPlans p = attentionPlans(S, B, A, D, count);
          const float *base = qkv.data() + z0 * p.qkvHeadStride;
          float *dbase = dqkv.data() + z0 * p.qkvHeadStride;
          const float *dO = dout.data() + z0 * p.outHeadStride;
          // Forward: as CudaBackend::attention.
          runRowMajor(p.scores, base + p.qOffset, base + p.kOffset,
                      probs.data(), scale, 0.0f);
          softmaxRows(probs.data(), count * S, S, causal);
          runRowMajor(p.context, probs.data(), base + p.vOffset,
                      out.data() + z0 * p.outHeadStride, 1.0f, 0.0f);
          // Backward: as CudaBackend::attentionGrad.
          runRowMajor(p.gradV, probs.data(), dO, dbase + p.vOffset, 1.0f,
                      0.0f);
          runRowMajor(p.gradProbs, dO, base + p.vOffset, dprobs.data(), 1.0f,
                      0.0f);
          softmaxGradRows(probs.data(), dprobs.data(), count * S, S);
          runRowMajor(p.gradQ, dprobs.data(), base + p.kOffset,
                      dbase + p.qOffset, scale, 0.0f);
          runRowMajor(p.gradK, dprobs.data(), base + p.qOffset,
                      dbase + p.kOffset, scale, 0.0f);
        }
        expectClose(out, want, 2e-5f, "attention " + what);
        expectClose(dqkv, wantGrad, 5e-5f, "attention gradient " + what);
      }
}
