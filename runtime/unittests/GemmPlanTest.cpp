//===- GemmPlanTest.cpp - The CUDA backend's GEMM plans on OpenBLAS -------===//
//
// The CUDA backend runs every row-major product as a column-major cuBLASLt
// call described by a GemmPlan (backends/cuda/GemmPlan.h). Here the same
// plans run through OpenBLAS's column-major sgemm, one batch entry at a
// time with the plan's strides, and must reproduce the CPU backend: the
// dense Gemm opcode in every transpose, and attention and its gradient
// assembled exactly as CudaBackend::attention(Grad) assembles them (chunks
// of heads, strided-batched plans around the row softmax), and the ring
// attention steps as CudaBackend::ringAttention(Grad)Step assemble them
// (chunk pairs, groups of heads, the row kernels of
// RingAttentionKernels.cu on the host), so the operand swap, leading
// dimensions, batch strides and pointer offsets are checked without a GPU.
//
//===----------------------------------------------------------------------===//

#include "backends/cuda/GemmPlan.h"

#include "tessera/rt/Backend.h"
#include "tessera/rt/math/Kernels.h"
#include "tessera/rt/math/SequenceLayout.h"

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

TEST_F(GemmPlanTest, OperandAlignment) {
  EXPECT_EQ(operandAlignment(0), 256u);
  EXPECT_EQ(operandAlignment(4096), 256u);
  EXPECT_EQ(operandAlignment(4096 + 128), 128u);
  EXPECT_EQ(operandAlignment(4096 + 96), 32u); // an expert's rows of 24 floats
  EXPECT_EQ(operandAlignment(4096 + 4), 4u);
  EXPECT_EQ(operandAlignment(2), 2u);
  // The leading dimension and the batch stride count too: every column of
  // every batch starts a kernel's loads.
  EXPECT_EQ(operandAlignment(4096, 4 * 1024), 256u);
  EXPECT_EQ(operandAlignment(4096, 4 * 37), 4u);       // ld 37 floats
  EXPECT_EQ(operandAlignment(4096, 4 * 3 * 64), 256u); // QKV rows of 3 x 64
  EXPECT_EQ(operandAlignment(4096, 2 * 24), 16u);      // bf16 ld 24
  EXPECT_EQ(operandAlignment(4096, 4 * 1024, 4 * 72), 32u); // stride 72
  EXPECT_EQ(operandAlignment(4096 + 64, 4 * 1024, 4 * 1024), 64u);
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

namespace {

// RingAttentionKernels.cu's row kernels, on the host.
void ringForwardRows(float *probs, float *m, float *l, float *o, int64_t count,
                     int64_t chunk, int64_t seq, int64_t q0, int64_t ldo,
                     int64_t D, bool diagonal) {
  for (int64_t z = 0; z < count; ++z)
    for (int64_t i = 0; i < chunk; ++i) {
      float *row = probs + (z * chunk + i) * chunk;
      const int64_t valid = diagonal ? i + 1 : chunk, r = z * seq + q0 + i;
      float mx = -INFINITY;
      for (int64_t j = 0; j < valid; ++j)
        mx = math::selectf(row[j] > mx, row[j], mx);
      const float old = m[r];
      mx = math::selectf(old > mx, old, mx);
      float sum = 0.0f;
      for (int64_t j = 0; j < chunk; ++j) {
        row[j] = j < valid ? math::expApprox(row[j] - mx) : 0.0f;
        sum += row[j];
      }
      const float alpha = old == -INFINITY ? 0.0f : math::expApprox(old - mx);
      for (int64_t j = 0; j < D; ++j)
        o[(q0 + i) * ldo + z * D + j] *= alpha;
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
    }
}

/// CudaBackend::ringAttentionStep on the host, `group` heads at a time.
void ringStep(const float *qkv, const float *kv, float *o, float *stats,
              float *lse, const math::RingAttentionDims &d, int64_t source,
              bool first, int64_t group) {
  const int64_t S = d.seq, total = d.batch * d.heads, D = d.headDim;
  const int64_t chunk = S / 2;
  float *m = stats, *l = stats + total * S;
  if (first) {
    std::fill(o, o + S * total * D, 0.0f);
    std::fill(m, m + total * S, -INFINITY);
    std::fill(l, l + total * S, 0.0f);
  }
  Vec probs(size_t(group * chunk * chunk));
  const float scale = float(1.0 / std::sqrt(double(D)));
  const math::RingChunkPairs pairs = math::ringChunkPairs(d, source);
  for (int64_t z0 = 0; z0 < total; z0 += group) {
    const int64_t count = std::min(group, total - z0);
    const RingAttentionPlans p =
        ringAttentionPlans(chunk, d.batch, d.heads, D, count);
    for (int i = 0; i < pairs.count; ++i) {
      const math::RingChunkPair &c = pairs.pair[i];
      const float *q = qkv + c.q0 * p.ld + z0 * p.qkvHeadStride;
      const float *k = kv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
      runRowMajor(p.scores, q, k, probs.data(), scale, 0.0f);
      ringForwardRows(probs.data(), m + z0 * S, l + z0 * S,
                      o + z0 * p.outHeadStride, count, chunk, S, c.q0, p.ldo,
                      D, c.diagonal);
      runRowMajor(p.context, probs.data(), k + D,
                  o + c.q0 * p.ldo + z0 * p.outHeadStride, 1.0f, 1.0f);
    }
  }
  if (!lse)
    return;
  for (int64_t z = 0; z < total; ++z)
    for (int64_t r = 0; r < S; ++r) {
      for (int64_t j = 0; j < D; ++j)
        o[r * total * D + z * D + j] *= 1.0f / l[z * S + r];
      lse[r * total + z] = m[z * S + r] + std::log(l[z * S + r]);
    }
}

/// CudaBackend::ringAttentionGradStep on the host.
void ringGradStep(const float *qkv, const float *o, const float *lse,
                  const float *dout, const float *kv, float *dkv, float *delta,
                  float *dqkv, const math::RingAttentionDims &d,
                  int64_t source, bool first, int64_t group) {
  const int64_t S = d.seq, total = d.batch * d.heads, D = d.headDim;
  const int64_t chunk = S / 2;
  if (first) {
    std::fill(dqkv, dqkv + S * total * 3 * D, 0.0f);
    for (int64_t z = 0; z < total; ++z)
      for (int64_t r = 0; r < S; ++r) {
        float sum = 0.0f;
        for (int64_t j = 0; j < D; ++j)
          sum += o[r * total * D + z * D + j] * dout[r * total * D + z * D + j];
        delta[z * S + r] = sum;
      }
  }
  Vec probs(size_t(group * chunk * chunk)), dprobs(probs.size());
  const float scale = float(1.0 / std::sqrt(double(D)));
  const math::RingChunkPairs pairs = math::ringChunkPairs(d, source);
  for (int64_t z0 = 0; z0 < total; z0 += group) {
    const int64_t count = std::min(group, total - z0);
    const RingAttentionPlans p =
        ringAttentionPlans(chunk, d.batch, d.heads, D, count);
    for (int i = 0; i < pairs.count; ++i) {
      const math::RingChunkPair &c = pairs.pair[i];
      const float *q = qkv + c.q0 * p.ld + z0 * p.qkvHeadStride;
      const float *k = kv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
      float *dk = dkv + c.k0 * p.ldkv + z0 * p.kvHeadStride;
      const float *dO = dout + c.q0 * p.ldo + z0 * p.outHeadStride;
      runRowMajor(p.scores, q, k, probs.data(), scale, 0.0f);
      for (int64_t x = 0; x < count * chunk * chunk; ++x) {
        const int64_t j = x % chunk, r = (x / chunk) % chunk,
                      z = x / (chunk * chunk);
        probs[size_t(x)] =
            !c.diagonal || j <= r
                ? math::expApprox(probs[size_t(x)] -
                                  lse[(c.q0 + r) * total + z0 + z])
                : 0.0f;
      }
      runRowMajor(p.gradV, probs.data(), dO, dk + D, 1.0f, 1.0f);
      runRowMajor(p.gradProbs, dO, k + D, dprobs.data(), 1.0f, 0.0f);
      for (int64_t x = 0; x < count * chunk * chunk; ++x) {
        const int64_t r = (x / chunk) % chunk, z = x / (chunk * chunk);
        dprobs[size_t(x)] = probs[size_t(x)] *
                            (dprobs[size_t(x)] - delta[(z0 + z) * S + c.q0 + r]);
      }
      runRowMajor(p.gradQ, dprobs.data(), k,
                  dqkv + c.q0 * p.ld + z0 * p.qkvHeadStride, scale, 1.0f);
      runRowMajor(p.gradK, dprobs.data(), q, dk, scale, 1.0f);
    }
  }
}

} // namespace

/// Whole rings (every step, each rank's view) through the ring plans
/// against the CPU backend's steps: the output, LSE, dQKV and each step's
/// dK/dV block.
TEST_F(GemmPlanTest, RingAttentionPlansMatchTheCpuBackend) {
  struct Shape {
    int64_t S, B, A, D, cp;
  };
  for (Shape sh : {Shape{2, 1, 1, 4, 2}, Shape{6, 2, 3, 5, 2},
                   Shape{8, 1, 2, 16, 3}})
    for (bool causal : {true, false})
      for (int64_t rank = 0; rank < sh.cp; ++rank)
        for (int64_t group : {int64_t(1), int64_t(2), sh.B * sh.A}) {
          math::RingAttentionDims d;
          d.seq = sh.S;
          d.batch = sh.B;
          d.heads = sh.A;
          d.headDim = sh.D;
          d.causal = causal;
          d.cpRank = rank;
          d.cpSize = sh.cp;
          const std::string what =
              "S=" + std::to_string(sh.S) + " cp=" + std::to_string(sh.cp) +
              " rank=" + std::to_string(rank) + " causal=" +
              std::to_string(causal) + " group=" + std::to_string(group);
          const int64_t total = sh.B * sh.A, n = sh.cp;
          Vec qkv = random(size_t(sh.S * total * 3 * sh.D));
          Vec dout = random(size_t(sh.S * total * sh.D));
          std::vector<Vec> kv(static_cast<size_t>(n));
          for (Vec &block : kv)
            block = random(size_t(d.kvBlock()));
          ASSERT_TRUE(cpu->ringPackKeysValues(qkv.data(), kv[size_t(rank)].data(),
                                              d)
                          .ok());
          // Forward: the blocks in ring order, rank's own first.
          Vec o(dout.size()), stats(size_t(2 * d.rowStats())),
              lse(size_t(d.rowStats()));
          Vec o2 = o, stats2 = stats, lse2 = lse;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t source = (rank - i + n) % n;
            const bool last = i + 1 == n;
            ASSERT_TRUE(cpu->ringAttentionStep(qkv.data(),
                                               kv[size_t(source)].data(),
                                               o.data(), stats.data(),
                                               last ? lse.data() : nullptr, d,
                                               source, i == 0)
                            .ok());
            ringStep(qkv.data(), kv[size_t(source)].data(), o2.data(),
                     stats2.data(), last ? lse2.data() : nullptr, d, source,
                     i == 0, group);
          }
          expectClose(o2, o, 2e-5f, "ring output " + what);
          expectClose(lse2, lse, 2e-5f, "ring LSE " + what);
          // Backward: each step's block gradient on its own.
          Vec dqkv(qkv.size()), delta(size_t(d.rowStats()));
          Vec dqkv2 = dqkv, delta2 = delta;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t source = (rank - i + n) % n;
            Vec dkv(size_t(d.kvBlock()), 0.0f), dkv2 = dkv;
            ASSERT_TRUE(cpu->ringAttentionGradStep(
                               qkv.data(), o.data(), lse.data(), dout.data(),
                               kv[size_t(source)].data(), dkv.data(),
                               delta.data(), dqkv.data(), d, source, i == 0)
                            .ok());
            ringGradStep(qkv.data(), o.data(), lse.data(), dout.data(),
                         kv[size_t(source)].data(), dkv2.data(), delta2.data(),
                         dqkv2.data(), d, source, i == 0, group);
            expectClose(dkv2, dkv, 5e-5f,
                        "ring dK/dV step " + std::to_string(i) + " " + what);
          }
          expectClose(delta2, delta, 2e-5f, "ring delta " + what);
          expectClose(dqkv2, dqkv, 5e-5f, "ring dQKV " + what);
        }
}
