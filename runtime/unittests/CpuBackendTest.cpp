//===- CpuBackendTest.cpp - cpu kernels vs naive references ---------------===//

#include "tessera/rt/BF16.h"
#include "tessera/rt/Backend.h"
#include "tessera/rt/math/Kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

using namespace tessera::rt;
using tessera::rt::math::floatBits;

namespace {

class CpuBackendTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto b = BackendRegistry::global().create("cpu", {});
    ASSERT_TRUE(b.ok()) << b.status().toString();
    backend = std::move(*b);
  }
  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v)
      x = dist(gen);
    return v;
  }
  std::unique_ptr<Backend> backend;
  std::mt19937 gen{42};
};

void expectNear(const std::vector<float> &a, const std::vector<float> &b,
                float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::fabs(b[i]))) << "at " << i;
}

} // namespace

TEST_F(CpuBackendTest, RegistryKnowsCpu) {
  EXPECT_TRUE(BackendRegistry::global().contains("cpu"));
  EXPECT_STREQ(backend->name(), "cpu");
  auto missing = BackendRegistry::global().create("no-such-backend", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(
      missing.status().message().find("unknown backend 'no-such-backend'"),
      std::string::npos);
}

TEST_F(CpuBackendTest, GemmAllTransposesAndBetas) {
  const int64_t m = 7, n = 5, k = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        auto a = random(size_t(m * k)), b = random(size_t(k * n));
        auto c = random(size_t(m * n));
        float alpha = 0.75f;
        std::vector<float> ref = c;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              float av = ta ? a[size_t(p * m + i)] : a[size_t(i * k + p)];
              float bv = tb ? b[size_t(j * k + p)] : b[size_t(p * n + j)];
              s += double(av) * bv;
            }
            ref[size_t(i * n + j)] = float(
                alpha * s + (beta == 0.0f ? 0.0 : beta * c[size_t(i * n + j)]));
          }
        ASSERT_TRUE(backend
                        ->gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta,
                               c.data())
                        .ok());
        SCOPED_TRACE(testing::Message()
                     << "ta=" << ta << " tb=" << tb << " beta=" << beta);
        expectNear(c, ref, 1e-5f);
      }
}

TEST_F(CpuBackendTest, GemmBf16IsTheF32GemmOfTheWidenedOperands) {
  // bf16 x bf16 -> f32: every product of two bf16 values is exact in f32,
  // so the bf16 GEMM is the f32 GEMM of the exactly widened operands, bit
  // for bit; shapes shrink and grow so the widening scratch is reused.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 9},
                         {64, 300, 200}, {3, 2, 4}, {128, 96, 384}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f}) {
          auto a32 = random(size_t(m * k)), b32 = random(size_t(k * n));
          std::vector<uint16_t> a(a32.size()), b(b32.size());
          for (size_t i = 0; i < a.size(); ++i) {
            a[i] = floatToBf16(a32[i]);
            a32[i] = bf16ToFloat(a[i]);
          }
          for (size_t i = 0; i < b.size(); ++i) {
            b[i] = floatToBf16(b32[i]);
            b32[i] = bf16ToFloat(b[i]);
          }
          auto c = random(size_t(m * n));
          std::vector<float> ref = c;
          ASSERT_TRUE(backend
                          ->gemm(ta, tb, m, n, k, 0.5f, a32.data(), b32.data(),
                                 beta, ref.data())
                          .ok());
          ASSERT_TRUE(backend
                          ->gemmHalf(FloatFormat::BF16, ta, tb, m, n, k, 0.5f,
                                     a.data(), b.data(), beta, c.data())
                          .ok());
          SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k="
                                          << k << " ta=" << ta << " tb=" << tb
                                          << " beta=" << beta);
          ASSERT_EQ(0, std::memcmp(c.data(), ref.data(), c.size() * 4));
        }
}

TEST_F(CpuBackendTest, GemmHalfIntoHalfEqualsF32GemmAndCast) {
  // A 16-bit C (a GEMM writing a bf16 or f16 activation) is the f32 C
  // rounded by the Cast kernel, bit for bit; the output scratch grows and
  // is reused as the shapes change. A 16-bit C takes A and B's format and
  // beta 0: there is nothing to accumulate into.
  for (FloatFormat fmt : {FloatFormat::BF16, FloatFormat::F16})
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 9},
                           {64, 300, 200}, {3, 2, 4}, {0, 3, 4}, {5, 3, 0}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          auto a32 = random(size_t(m * k)), b32 = random(size_t(k * n));
          std::vector<uint16_t> a(a32.size()), b(b32.size());
          floatsToHalf(fmt, a32.data(), a.data(), int64_t(a.size()));
          floatsToHalf(fmt, b32.data(), b.data(), int64_t(b.size()));
          std::vector<float> f32C(size_t(m * n));
          std::vector<uint16_t> want(f32C.size()), got(f32C.size(), 0x7fff);
          ASSERT_TRUE(backend
                          ->gemmHalf(fmt, ta, tb, m, n, k, 0.5f, a.data(),
                                     b.data(), 0.0f, f32C.data())
                          .ok());
          ASSERT_TRUE(backend
                          ->cast(f32C.data(), FloatFormat::F32, want.data(),
                                 fmt, m * n, 0.0f)
                          .ok());
          ASSERT_TRUE(backend
                          ->gemmHalf(fmt, ta, tb, m, n, k, 0.5f, a.data(),
                                     b.data(), 0.0f, FloatOut(got.data(), fmt))
                          .ok());
          SCOPED_TRACE(testing::Message()
                       << formatName(fmt) << " m=" << m << " n=" << n
                       << " k=" << k << " ta=" << ta << " tb=" << tb);
          ASSERT_EQ(got, want);
        }
  std::vector<uint16_t> a(4, 0x3f80), b(4, 0x3f80), c(4);
  Status accumulate = backend->gemmHalf(FloatFormat::BF16, false, false, 2, 2,
                                        2, 1.0f, a.data(), b.data(), 1.0f,
                                        FloatOut(c.data(), FloatFormat::BF16));
  EXPECT_FALSE(accumulate.ok());
  EXPECT_NE(accumulate.message().find("beta 0"), std::string::npos)
      << accumulate.toString();
  EXPECT_FALSE(backend
                   ->gemmHalf(FloatFormat::BF16, false, false, 2, 2, 2, 1.0f,
                              a.data(), b.data(), 0.0f,
                              FloatOut(c.data(), FloatFormat::F16))
                   .ok());
}

TEST_F(CpuBackendTest, BiasAddAndAdd) {
  auto x = random(12), b = random(4), y = std::vector<float>(12);
  ASSERT_TRUE(backend->biasAdd(x.data(), b.data(), y.data(), 3, 4).ok());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_FLOAT_EQ(y[size_t(i * 4 + j)],
                      x[size_t(i * 4 + j)] + b[size_t(j)]);
  auto c = std::vector<float>(12);
  ASSERT_TRUE(backend->add(x.data(), y.data(), c.data(), 12).ok());
  for (size_t i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ(c[i], x[i] + y[i]);
}

TEST_F(CpuBackendTest, GeluAndGradVsFiniteDifferences) {
  // Random inputs plus a dense sweep over [-8, 8] (both erf branches, the
  // |x| >= 4 saturation and the branch points at |x / sqrt 2| = 1 and 4).
  auto x = random(256, 2.0f);
  for (int i = -1600; i <= 1600; ++i)
    x.push_back(float(i) * 0.005f);
  for (float v : {0.0f, -0.0f, 1.41421356f, -1.41421356f, 5.65685425f,
                  -5.65685425f, 30.0f, -30.0f})
    x.push_back(v);
  const int64_t n = int64_t(x.size());
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  ASSERT_TRUE(backend->gelu(x.data(), y.data(), n, /*tanh=*/false).ok());
  auto f = [](double t) {
    return 0.5 * t * (1 + std::erf(t / std::sqrt(2.0)));
  };
  auto fprime = [](double t) {
    return 0.5 * (1 + std::erf(t / std::sqrt(2.0))) +
           t * std::exp(-0.5 * t * t) / std::sqrt(2 * M_PI);
  };
  for (size_t i = 0; i < size_t(n); ++i) {
    double v = x[i], ref = f(v);
    EXPECT_NEAR(y[i], ref, 2e-6 * (1 + std::fabs(ref))) << "x = " << v;
  }
  auto g = random(size_t(n));
  ASSERT_TRUE(
      backend->geluGrad(x.data(), g.data(), dx.data(), n, /*tanh=*/false).ok());
  for (size_t i = 0; i < size_t(n); ++i) {
    double v = x[i], ref = double(g[i]) * fprime(v);
    EXPECT_NEAR(dx[i], ref, 2e-6 * (1 + std::fabs(ref))) << "x = " << v;
    double h = 1e-3;
    double fd = (f(v + h) - f(v - h)) / (2 * h);
    EXPECT_NEAR(dx[i], g[i] * fd, 1e-4 * (1 + std::fabs(g[i] * fd)));
  }
}

TEST_F(CpuBackendTest, GeluTanhAndGradVsLibmAndFiniteDifferences) {
  // PyTorch's gelu(approximate='tanh') (GPT-2's gelu_new), over the same
  // sweep: the tanh saturation at |u| = 10 and both signs.
  auto x = random(256, 2.0f);
  for (int i = -1600; i <= 1600; ++i)
    x.push_back(float(i) * 0.005f);
  for (float v : {0.0f, -0.0f, 1e-4f, -1e-4f, 30.0f, -30.0f})
    x.push_back(v);
  const int64_t n = int64_t(x.size());
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  ASSERT_TRUE(backend->gelu(x.data(), y.data(), n, /*tanh=*/true).ok());
  const double k = std::sqrt(2.0 / M_PI);
  auto f = [&](double t) {
    return 0.5 * t * (1 + std::tanh(k * (t + 0.044715 * t * t * t)));
  };
  for (size_t i = 0; i < size_t(n); ++i) {
    double v = x[i], ref = f(v);
    EXPECT_NEAR(y[i], ref, 2e-6 * (1 + std::fabs(ref))) << "x = " << v;
  }
  auto g = random(size_t(n));
  ASSERT_TRUE(
      backend->geluGrad(x.data(), g.data(), dx.data(), n, /*tanh=*/true).ok());
  for (size_t i = 0; i < size_t(n); ++i) {
    double v = x[i], h = 1e-3;
    double fd = (f(v + h) - f(v - h)) / (2 * h);
    EXPECT_NEAR(dx[i], g[i] * fd, 1e-4 * (1 + std::fabs(g[i] * fd)))
        << "x = " << v;
  }
}

TEST_F(CpuBackendTest, GeluKernelsComputeTheSharedFormulasBits) {
  // The GELU kernels run an AVX-512, AVX2 or baseline clone picked by the
  // CPU; each must give the bits of the shared scalar formulas (this file is
  // built for the baseline x86-64, which has no fused multiply-add), so a
  // run is reproducible across machines. 1001 elements: whole vectors of
  // every width plus a tail.
  auto x = random(1001, 6.0f);
  auto g = random(1001);
  const int64_t n = int64_t(x.size());
  std::vector<float> y(x.size()), dx(x.size());
  for (bool tanh : {false, true}) {
    ASSERT_TRUE(backend->gelu(x.data(), y.data(), n, tanh).ok());
    ASSERT_TRUE(backend->geluGrad(x.data(), g.data(), dx.data(), n, tanh).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      float ry = tanh ? math::geluTanh(x[i]) : math::gelu(x[i]);
      float rdx = tanh ? math::geluTanhGrad(x[i], g[i])
                       : math::geluGrad(x[i], g[i]);
      ASSERT_EQ(floatBits(y[i]), floatBits(ry)) << "tanh " << tanh << " x " << x[i];
      ASSERT_EQ(floatBits(dx[i]), floatBits(rdx))
          << "tanh " << tanh << " x " << x[i];
    }
  }
}

TEST_F(CpuBackendTest, BiasGeluEqualsBiasAddThenGeluBitForBit) {
  // The fused kernels against the unfused sequence (BiasAdd, Gelu; GeluGrad
  // on the biased input, ReduceRows), both forms, overwriting and
  // accumulating the bias gradient, on 1 and 2 threads: rows x cols is
  // large enough to thread, and 37 columns leave a partial vector.
  const int64_t rows = 1200, cols = 37;
  auto x = random(size_t(rows * cols), 2.0f), b = random(size_t(cols));
  auto dy = random(size_t(rows * cols)), db0 = random(size_t(cols));
  for (int threads : {1, 2}) {
    BackendOptions options;
    options.numThreads = threads;
    auto be = BackendRegistry::global().create("cpu", options);
    ASSERT_TRUE(be.ok());
    for (bool tanh : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> z(x.size()), y(x.size()), yf(x.size());
        std::vector<float> dx(x.size()), dxf(x.size());
        std::vector<float> db = db0, dbf = db0;
        ASSERT_TRUE((*be)->biasAdd(x.data(), b.data(), z.data(), rows, cols).ok());
        ASSERT_TRUE((*be)->gelu(z.data(), y.data(), rows * cols, tanh).ok());
        ASSERT_TRUE(
            (*be)->geluGrad(z.data(), dy.data(), dx.data(), rows * cols, tanh).ok());
        ASSERT_TRUE(
            (*be)->reduceRows(dx.data(), db.data(), rows, cols, 1.0f, beta).ok());
        ASSERT_TRUE(
            (*be)->biasGelu(x.data(), b.data(), yf.data(), rows, cols, tanh).ok());
        ASSERT_TRUE((*be)->biasGeluGrad(x.data(), b.data(), dy.data(),
                                        dxf.data(), dbf.data(), rows, cols,
                                        tanh, beta)
                        .ok());
        std::string what = "threads " + std::to_string(threads) + " tanh " +
                           std::to_string(tanh) + " beta " +
                           std::to_string(beta);
        ASSERT_EQ(0, std::memcmp(y.data(), yf.data(), y.size() * 4)) << what;
        ASSERT_EQ(0, std::memcmp(dx.data(), dxf.data(), dx.size() * 4)) << what;
        ASSERT_EQ(0, std::memcmp(db.data(), dbf.data(), db.size() * 4)) << what;
      }
  }
}

TEST_F(CpuBackendTest, AttentionOnThreadsIsBitIdentical) {
  // With several threads the heads run on OpenMP threads (each head's GEMMs
  // on one BLAS thread): the same bits as one thread, for head counts that
  // split evenly and not, causal or not.
  struct Shape {
    int64_t S, B, A, D;
  };
  BackendOptions one, two;
  one.numThreads = 1;
  two.numThreads = 2;
  auto b1 = BackendRegistry::global().create("cpu", one);
  auto b2 = BackendRegistry::global().create("cpu", two);
  ASSERT_TRUE(b1.ok() && b2.ok());
  for (Shape s : {Shape{70, 3, 1, 16}, Shape{33, 2, 2, 8}, Shape{5, 1, 1, 4}})
    for (bool causal : {true, false}) {
      const size_t qkvN = size_t(s.S * s.B * s.A * 3 * s.D),
                   outN = size_t(s.S * s.B * s.A * s.D);
      auto qkv = random(qkvN), dout = random(outN);
      std::vector<float> o1(outN), o2(outN), d1(qkvN), d2(qkvN);
      for (auto &[be, o, d] :
           {std::tie(*b1, o1, d1), std::tie(*b2, o2, d2)}) {
        ASSERT_TRUE(
            be->attention(qkv.data(), o.data(), s.S, s.B, s.A, s.D, causal)
                .ok());
        ASSERT_TRUE(be->attentionGrad(qkv.data(), dout.data(), d.data(), s.S,
                                      s.B, s.A, s.D, causal)
                        .ok());
      }
      std::string what = "S " + std::to_string(s.S) + " heads " +
                         std::to_string(s.B * s.A) + " causal " +
                         std::to_string(causal);
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), outN * 4)) << what;
      EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), qkvN * 4)) << what;
      // Ring attention's steps (cp 2, rank 1 against its own block and
      // rank 0's) likewise.
      if (s.S % 2 != 0)
        continue;
      Backend::RingAttentionDims rd;
      rd.seq = s.S;
      rd.batch = s.B;
      rd.heads = s.A;
      rd.headDim = s.D;
      rd.causal = causal;
      rd.cpRank = 1;
      rd.cpSize = 2;
      auto other = random(size_t(rd.kvBlock()));
      std::vector<std::vector<float>> out(2);
      for (int t = 0; t < 2; ++t) {
        Backend &be = t == 0 ? **b1 : **b2;
        std::vector<float> own(size_t(rd.kvBlock())), o(outN),
            stats(size_t(2 * rd.rowStats())), lse(size_t(rd.rowStats())),
            delta(size_t(rd.rowStats())), dq(qkvN), dkv(size_t(rd.kvBlock()));
        ASSERT_TRUE(be.ringPackKeysValues(qkv.data(), own.data(), rd).ok());
        ASSERT_TRUE(be.ringAttentionStep(qkv.data(), own.data(), o.data(),
                                         stats.data(), nullptr, rd, 1, true)
                        .ok());
        ASSERT_TRUE(be.ringAttentionStep(qkv.data(), other.data(), o.data(),
                                         stats.data(), lse.data(), rd, 0,
                                         false)
                        .ok());
        ASSERT_TRUE(be.ringAttentionGradStep(qkv.data(), o.data(), lse.data(),
                                             dout.data(), other.data(),
                                             dkv.data(), delta.data(),
                                             dq.data(), rd, 0, true)
                        .ok());
        for (auto *v : {&o, &lse, &dq, &dkv})
          out[size_t(t)].insert(out[size_t(t)].end(), v->begin(), v->end());
      }
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(),
                               out[0].size() * 4))
          << "ring " << what;
    }
}

TEST_F(CpuBackendTest, LogitsStatsEqualsMaxThenStatsBitForBit) {
  // One pass per row gives LogitsMax's max and CrossEntropyStats' sum and
  // label logit exactly, ignored rows included, on 1 and 2 threads; a label
  // out of range is an error naming it.
  const int64_t rows = 300, cols = 257;
  auto z = random(size_t(rows * cols), 4.0f);
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    t[size_t(r)] = r % 7 == 0 ? -100 : int32_t((r * 37) % cols);
  for (int threads : {1, 2}) {
    BackendOptions options;
    options.numThreads = threads;
    auto be = BackendRegistry::global().create("cpu", options);
    ASSERT_TRUE(be.ok());
    const size_t n = static_cast<size_t>(rows);
    std::vector<float> m(n), se(n), pl(n), mf(n), sef(n), plf(n);
    ASSERT_TRUE((*be)->logitsMax(z.data(), m.data(), rows, cols).ok());
    ASSERT_TRUE((*be)->crossEntropyStats(z.data(), t.data(), m.data(),
                                         se.data(), pl.data(), rows, cols, 0,
                                         cols, -100)
                    .ok());
    ASSERT_TRUE((*be)->logitsStats(z.data(), t.data(), mf.data(), sef.data(),
                                   plf.data(), rows, cols, -100)
                    .ok());
    EXPECT_EQ(0, std::memcmp(m.data(), mf.data(), m.size() * 4));
    EXPECT_EQ(0, std::memcmp(se.data(), sef.data(), se.size() * 4));
    EXPECT_EQ(0, std::memcmp(pl.data(), plf.data(), pl.size() * 4));
  }
  t[5] = int32_t(cols);
  const size_t n = static_cast<size_t>(rows);
  std::vector<float> m(n), se(n), pl(n);
  Status st = backend->logitsStats(z.data(), t.data(), m.data(), se.data(),
                                   pl.data(), rows, cols, -100);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("label 257 at row 5"), std::string::npos)
      << st.message();
}

TEST_F(CpuBackendTest, AddLayerNormEqualsAddThenLayerNormBitForBit) {
  // The fused residual add + layer norm and its backward against add then
  // layerNorm, and layerNormGrad then add, on 1 and 2 threads.
  const int64_t rows = 300, cols = 130;
  const size_t n = static_cast<size_t>(rows * cols), c = size_t(cols);
  auto a = random(n, 2.0f), b = random(n), g = random(c), be = random(c);
  auto dy = random(n), dr = random(n), dg0 = random(c), db0 = random(c);
  for (int threads : {1, 2}) {
    BackendOptions options;
    options.numThreads = threads;
    auto bk = BackendRegistry::global().create("cpu", options);
    ASSERT_TRUE(bk.ok());
    std::vector<float> s(n), y(n), sf(n), yf(n);
    ASSERT_TRUE((*bk)->add(a.data(), b.data(), s.data(), int64_t(n)).ok());
    ASSERT_TRUE((*bk)->layerNorm(s.data(), g.data(), be.data(), y.data(), rows,
                                 cols, 1e-5f)
                    .ok());
    ASSERT_TRUE((*bk)->addLayerNorm(a.data(), b.data(), g.data(), be.data(),
                                    sf.data(), yf.data(), rows, cols, 1e-5f)
                    .ok());
    EXPECT_EQ(0, std::memcmp(s.data(), sf.data(), n * 4));
    EXPECT_EQ(0, std::memcmp(y.data(), yf.data(), n * 4));
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> dx(n), dsum(n), dxf(n);
      std::vector<float> dg = dg0, db = db0, dgf = dg0, dbf = db0;
      ASSERT_TRUE((*bk)->layerNormGrad(s.data(), g.data(), dy.data(), dx.data(),
                                       dg.data(), db.data(), rows, cols, 1e-5f,
                                       beta)
                      .ok());
      ASSERT_TRUE(
          (*bk)->add(dx.data(), dr.data(), dsum.data(), int64_t(n)).ok());
      ASSERT_TRUE((*bk)->addLayerNormGrad(s.data(), g.data(), dy.data(),
                                          dr.data(), dxf.data(), dgf.data(),
                                          dbf.data(), rows, cols, 1e-5f, beta)
                      .ok());
      EXPECT_EQ(0, std::memcmp(dsum.data(), dxf.data(), n * 4)) << beta;
      EXPECT_EQ(0, std::memcmp(dg.data(), dgf.data(), c * 4)) << beta;
      EXPECT_EQ(0, std::memcmp(db.data(), dbf.data(), c * 4)) << beta;
    }
  }
}

TEST_F(CpuBackendTest, ReluAndGrad) {
  auto x = random(32), dy = random(32);
  std::vector<float> y(32), dx(32);
  ASSERT_TRUE(backend->relu(x.data(), y.data(), 32).ok());
  ASSERT_TRUE(backend->reluGrad(x.data(), dy.data(), dx.data(), 32).ok());
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f);
    EXPECT_EQ(dx[i], x[i] > 0 ? dy[i] : 0.0f);
  }
}

TEST_F(CpuBackendTest, ReduceRows) {
  const int64_t rows = 13, cols = 6;
  auto x = random(size_t(rows * cols));
  for (float beta : {0.0f, 1.0f}) {
    auto y = random(size_t(cols));
    auto ref = y;
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t i = 0; i < rows; ++i)
        s += x[size_t(i * cols + j)];
      ref[size_t(j)] = float(0.5 * s + beta * y[size_t(j)]);
    }
    ASSERT_TRUE(
        backend->reduceRows(x.data(), y.data(), rows, cols, 0.5f, beta).ok());
    expectNear(y, ref, 1e-5f);
  }
}

TEST_F(CpuBackendTest, CrossEntropyAndGradVsFiniteDifferences) {
  const int64_t rows = 5, cols = 7;
  auto z = random(size_t(rows * cols), 3.0f);
  z[0] = 80.0f; // large logit: max subtraction keeps it finite
  std::vector<int32_t> t = {0, 3, 6, 1, 2};
  std::vector<float> loss(static_cast<size_t>(rows));
  ASSERT_TRUE(
      backend->crossEntropy(z.data(), t.data(), loss.data(), rows, cols).ok());
  auto naive = [&](const std::vector<float> &zz, int64_t i) {
    double mx = -1e30;
    for (int64_t j = 0; j < cols; ++j)
      mx = std::max(mx, double(zz[size_t(i * cols + j)]));
    double s = 0;
    for (int64_t j = 0; j < cols; ++j)
      s += std::exp(zz[size_t(i * cols + j)] - mx);
    return std::log(s) + mx - zz[size_t(i * cols + t[size_t(i)])];
  };
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_TRUE(std::isfinite(loss[size_t(i)]));
    EXPECT_NEAR(loss[size_t(i)], naive(z, i), 1e-4);
  }
  auto dl = random(size_t(rows));
  std::vector<float> dz(static_cast<size_t>(rows * cols));
  ASSERT_TRUE(backend
                  ->crossEntropyGrad(z.data(), t.data(), dl.data(), dz.data(),
                                     rows, cols)
                  .ok());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      auto zp = z, zm = z;
      double h = 1e-2;
      zp[size_t(i * cols + j)] += float(h);
      zm[size_t(i * cols + j)] -= float(h);
      double fd = (naive(zp, i) - naive(zm, i)) / (2 * h) * dl[size_t(i)];
      EXPECT_NEAR(dz[size_t(i * cols + j)], fd, 2e-3) << i << "," << j;
    }
  std::vector<int32_t> bad = {0, 3, 7, 1, 2};
  Status st =
      backend->crossEntropy(z.data(), bad.data(), loss.data(), rows, cols);
  EXPECT_FALSE(st.ok());
}

TEST_F(CpuBackendTest, MeanAndMeanGrad) {
  auto x = random(100);
  float y = 0;
  ASSERT_TRUE(backend->mean(x.data(), &y, 100).ok());
  double s = 0;
  for (float v : x)
    s += v;
  EXPECT_NEAR(y, s / 100, 1e-6);
  float dy = 3.0f;
  std::vector<float> dx(100);
  ASSERT_TRUE(backend->meanGrad(&dy, dx.data(), 100).ok());
  for (float v : dx)
    EXPECT_FLOAT_EQ(v, 0.03f);
}

TEST_F(CpuBackendTest, FillScaleCopyAxpy) {
  std::vector<float> y(10);
  ASSERT_TRUE(backend->fill(y.data(), 2.5f, 10).ok());
  for (float v : y)
    EXPECT_EQ(v, 2.5f);
  auto x = random(10);
  ASSERT_TRUE(backend->scale(x.data(), y.data(), -2.0f, 10).ok());
  for (size_t i = 0; i < 10; ++i)
    EXPECT_EQ(y[i], -2.0f * x[i]);
  std::vector<float> c(10);
  ASSERT_TRUE(backend->copy(x.data(), c.data(), 40).ok());
  EXPECT_EQ(c, x);
  ASSERT_TRUE(backend->axpy(0.5f, x.data(), c.data(), 10).ok());
  for (size_t i = 0; i < 10; ++i)
    EXPECT_FLOAT_EQ(c[i], 1.5f * x[i]);
}

TEST_F(CpuBackendTest, AdamMatchesNaiveScalarImplementation) {
  const int64_t n = 37;
  auto p = random(size_t(n)), m = std::vector<float>(size_t(n), 0.0f);
  auto v = m;
  auto rp = p;
  std::vector<double> rm(size_t(n), 0.0), rv(size_t(n), 0.0);
  AdamParams hp{1e-2f, 0.9f, 0.99f, 1e-6f, 0.1f};
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = random(size_t(n));
    ASSERT_TRUE(
        backend->adam(p.data(), g.data(), m.data(), v.data(), n, &step, hp)
            .ok());
    for (size_t i = 0; i < size_t(n); ++i) {
      rm[i] = hp.beta1 * rm[i] + (1 - hp.beta1) * g[i];
      rv[i] = hp.beta2 * rv[i] + (1 - hp.beta2) * double(g[i]) * g[i];
      double mhat = rm[i] / (1 - std::pow(double(hp.beta1), double(step)));
      double vhat = rv[i] / (1 - std::pow(double(hp.beta2), double(step)));
      rp[i] = float(rp[i] - hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) +
                                     hp.weightDecay * rp[i]));
    }
  }
  expectNear(p, rp, 1e-5f);
  const int64_t zero = 0;
  EXPECT_FALSE(
      backend->adam(p.data(), p.data(), m.data(), v.data(), n, &zero, hp).ok());
}

TEST_F(CpuBackendTest, Sgd) {
  auto p = random(20), g = random(20);
  auto ref = p;
  for (size_t i = 0; i < 20; ++i)
    ref[i] = ref[i] - 0.1f * (g[i] + 0.01f * ref[i]);
  ASSERT_TRUE(backend->sgd(p.data(), g.data(), 20, 0.1f, 0.01f).ok());
  expectNear(p, ref, 1e-6f);
}

// torch.optim.SGD(momentum=0.9, weight_decay=0.01), dampening 0: the first
// step's buffer is the decayed gradient itself, later ones accumulate.
TEST_F(CpuBackendTest, SgdMomentumMatchesTorchsRule) {
  const int64_t n = 21;
  auto p = random(size_t(n));
  std::vector<float> b(size_t(n), 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rb(size_t(n), 0.0);
  for (int step = 1; step <= 4; ++step) {
    auto g = random(size_t(n));
    ASSERT_TRUE(
        backend->sgdMomentum(p.data(), g.data(), b.data(), n, 0.1f, 0.01f, 0.9f)
            .ok());
    for (size_t i = 0; i < size_t(n); ++i) {
      double d = g[i] + 0.01 * rp[i];
      rb[i] = step == 1 ? d : 0.9 * rb[i] + d;
      rp[i] -= 0.1 * rb[i];
    }
  }
  for (size_t i = 0; i < size_t(n); ++i) {
    EXPECT_NEAR(p[i], rp[i], 1e-5 * (1 + std::fabs(rp[i]))) << i;
    EXPECT_NEAR(b[i], rb[i], 1e-5 * (1 + std::fabs(rb[i]))) << i;
  }
}

// Gradient clipping's kernels: the sum of squares (in f64, rounded once:
// within one f32 rounding of the exact sum, every length's tail included,
// f32 and bf16 storage, accumulating), the norm and coefficient, the
// scaling.
TEST_F(CpuBackendTest, SumSquaresClipGradNormScaleBy) {
  for (int64_t n : {1, 7, 8, 9, 37, 1000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto x = random(size_t(n));
    long double exact = 0;
    for (float v : x)
      exact += (long double)v * v;
    float y = 5.0f;
    ASSERT_TRUE(backend->sumSquares(x.data(), FloatFormat::F32, n, &y, false)
                    .ok());
    EXPECT_NEAR(y, double(exact), double(exact) * 6e-8);
    ASSERT_TRUE(
        backend->sumSquares(x.data(), FloatFormat::F32, n, &y, true).ok());
    EXPECT_NEAR(y, 2.0 * double(exact), 2.0 * double(exact) * 1.2e-7);
    std::vector<uint16_t> h(static_cast<size_t>(n));
    floatsToBf16(x.data(), h.data(), n);
    long double exact16 = 0;
    for (uint16_t b : h)
      exact16 += (long double)bf16ToFloat(b) * bf16ToFloat(b);
    ASSERT_TRUE(
        backend->sumSquares(h.data(), FloatFormat::BF16, n, &y, false).ok());
    EXPECT_NEAR(y, double(exact16), double(exact16) * 6e-8);
  }
  // Norm 5 (3-4-5): clipped to 1 by 1 / (5 + 1e-6); not clipped under 10;
  // max_norm 0 is off; a NaN norm leaves the gradients as they are.
  for (auto [maxNorm, sumsq, coeff] :
       {std::tuple{1.0f, 25.0f, 1.0f / (5.0f + 1e-6f)},
        {10.0f, 25.0f, 1.0f},
        {0.0f, 25.0f, 1.0f},
        {1.0f, std::nanf(""), 1.0f}}) {
    float norm = 0, c = 0;
    ASSERT_TRUE(backend->clipGradNorm(&sumsq, &norm, &c, maxNorm, 1.0f).ok());
    if (std::isnan(sumsq))
      EXPECT_TRUE(std::isnan(norm));
    else
      EXPECT_EQ(norm, 5.0f);
    EXPECT_EQ(c, coeff) << "max_norm " << maxNorm;
    // fp16: the squares of gradients scaled by 2^10; the norm and the
    // coefficient come out unscaled exactly (powers of two), the
    // coefficient carrying the unscaling.
    float scaledSq = sumsq * 1048576.0f, norm16 = 0, c16 = 0;
    ASSERT_TRUE(backend
                    ->clipGradNorm(&scaledSq, &norm16, &c16, maxNorm,
                                   1.0f / 1024.0f)
                    .ok());
    if (std::isnan(sumsq)) {
      EXPECT_TRUE(std::isnan(norm16));
    } else {
      EXPECT_EQ(norm16, 5.0f);
      EXPECT_EQ(c16, coeff / 1024.0f) << "max_norm " << maxNorm;
    }
  }
  auto x = random(19);
  std::vector<float> y(19);
  const float s = 0.375f;
  ASSERT_TRUE(backend->scaleBy(x.data(), &s, y.data(), 19).ok());
  for (size_t i = 0; i < 19; ++i)
    EXPECT_EQ(y[i], x[i] * s);
  ASSERT_TRUE(backend->scaleBy(x.data(), &s, x.data(), 19).ok()); // in place
  EXPECT_EQ(x, y);
}

//===----------------------------------------------------------------------===//
// bf16 (mixed precision)
//===----------------------------------------------------------------------===//

namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

/// Round to nearest even by definition: the two bf16 neighbours of f (its
/// truncation and the next magnitude up, "2^128" past the largest finite
/// one), the nearer one, on a tie the one with an even last bit. NaN: any
/// NaN with f's sign.
uint16_t referenceBf16(float f) {
  uint32_t bits = bitsOf(f);
  if (std::isnan(f))
    return uint16_t((bits >> 16) | 0x7fc0);
  uint16_t lo = uint16_t(bits >> 16), hi = uint16_t(lo + 1);
  if ((bits & 0xffff) == 0 || std::isinf(f))
    return lo;
  double x = std::fabs(double(f));
  double vlo = std::fabs(double(floatOf(uint32_t(lo) << 16)));
  double vhi = (hi & 0x7f80) == 0x7f80
                   ? std::ldexp(1.0, 128)
                   : std::fabs(double(floatOf(uint32_t(hi) << 16)));
  if (x - vlo < vhi - x)
    return lo;
  if (x - vlo > vhi - x)
    return hi;
  return (lo & 1) ? hi : lo;
}

std::vector<uint16_t> toBf16(const std::vector<float> &v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    h[i] = referenceBf16(v[i]);
  return h;
}
std::vector<float> widen(const std::vector<uint16_t> &h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    f[i] = floatOf(uint32_t(h[i]) << 16);
  return f;
}

} // namespace

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(floatToBf16(0.0f), 0x0000);
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7: down to 1.
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(floatToBf16(-(1.0f + std::ldexp(1.0f, -8))), 0xbf80);
  EXPECT_EQ(floatToBf16(-(1.0f + 3 * std::ldexp(1.0f, -8))), 0xbf82);
  // Just above the tie rounds up, just below down.
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            0x3f81);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8) - std::ldexp(1.0f, -20)),
            0x3f80);
  // A carry into the exponent: the largest value below 2 rounds to 2.
  EXPECT_EQ(floatToBf16(floatOf(0x3fffffff)), 0x4000);
  // Overflow past the largest bf16 (and its half ulp) is infinity.
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(floatToBf16(floatOf(0x7f7f7fff)), 0x7f7f); // below the tie
  EXPECT_EQ(floatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(floatToBf16(-INFINITY), 0xff80);
  // Subnormals round like any other value.
  EXPECT_EQ(floatToBf16(floatOf(0x00008000)), 0x0000); // tie to even 0
  EXPECT_EQ(floatToBf16(floatOf(0x00018000)), 0x0002); // tie to even 2
  EXPECT_EQ(floatToBf16(floatOf(0x00008001)), 0x0001);
}

TEST(Bf16Test, NanStaysQuietNan) {
  // A NaN whose payload is only in the low half would round to infinity.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u,
                        0xffc01234u, 0x7fffffffu}) {
    uint16_t h = floatToBf16(floatOf(bits));
    EXPECT_TRUE(std::isnan(bf16ToFloat(h))) << std::hex << bits;
    EXPECT_TRUE(h & 0x0040) << "quiet bit, " << std::hex << bits;
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000)
        << "sign, " << std::hex << bits;
  }
}

TEST(Bf16Test, WideningIsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16ToFloat(uint16_t(h));
    EXPECT_EQ(bitsOf(f), h << 16);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(f))));
    else
      ASSERT_EQ(floatToBf16(f), h) << std::hex << h;
  }
}

TEST(Bf16Test, MatchesReferenceOnRandomBits) {
  std::mt19937 gen(7);
  std::vector<float> v(1 << 20);
  for (float &x : v)
    x = floatOf(uint32_t(gen()));
  std::vector<uint16_t> out(v.size());
  floatsToBf16(v.data(), out.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t ref = referenceBf16(v[i]);
    if (std::isnan(v[i]))
      ASSERT_TRUE(std::isnan(bf16ToFloat(out[i])));
    else
      ASSERT_EQ(out[i], ref) << std::hex << bitsOf(v[i]);
    ASSERT_EQ(floatToBf16(v[i]), out[i]);
  }
}

// IEEE half (--fp16): the host/device conversions of BF16.h.
TEST(F16Test, KnownValues) {
  EXPECT_EQ(floatToF16(1.0f), 0x3c00);
  EXPECT_EQ(floatToF16(-2.0f), 0xc000);
  EXPECT_EQ(floatToF16(0.0f), 0x0000);
  EXPECT_EQ(floatToF16(-0.0f), 0x8000);
  EXPECT_EQ(floatToF16(65504.0f), 0x7bff); // the largest finite
  EXPECT_EQ(floatToF16(65519.996f), 0x7bff);
  EXPECT_EQ(floatToF16(65520.0f), 0x7c00); // rounds up: infinity
  EXPECT_EQ(floatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(floatToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -14)), 0x0400); // smallest normal
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -24)), 0x0001); // smallest subnormal
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -25)), 0x0000); // tie: to even (0)
  EXPECT_EQ(floatToF16(std::ldexp(3.0f, -25)), 0x0002); // tie: to even (2)
  EXPECT_EQ(floatToF16(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(floatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00); // tie, even
  EXPECT_EQ(floatToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  uint16_t nan = floatToF16(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7e00, 0x7e00);
  EXPECT_EQ(nan & 0x8000, 0x8000);
  EXPECT_EQ(f16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(f16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16ToFloat(0x83ff), -std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(f16ToFloat(0xfc00)) && f16ToFloat(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(f16ToFloat(0x7c01)));
}

TEST(F16Test, WideningIsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16ToFloat(uint16_t(h));
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (e == 0x1f) {
      EXPECT_TRUE(m ? std::isnan(f) : std::isinf(f)) << std::hex << h;
      if (m)
        EXPECT_TRUE(std::isnan(f16ToFloat(floatToF16(f))));
      else
        ASSERT_EQ(floatToF16(f), h);
      continue;
    }
    const float want = e == 0 ? sign * std::ldexp(float(m), -24)
                              : sign * std::ldexp(float(m | 0x400), int(e) - 25);
    ASSERT_EQ(bitsOf(f), bitsOf(want)) << std::hex << h;
    ASSERT_EQ(floatToF16(f), h) << std::hex << h;
  }
}

TEST(F16Test, MatchesTheCompilersHalfOnRandomBits) {
#ifdef __FLT16_MANT_DIG__
  std::mt19937 gen(11);
  std::vector<float> v(1 << 20);
  for (size_t i = 0; i < v.size(); ++i) {
    // Half of them random bits, half in and around f16's range.
    v[i] = i % 2 ? floatOf(uint32_t(gen()))
                 : std::ldexp(float(gen() % 0x1000000) / 16777216.0f,
                              int(gen() % 48) - 30) *
                       (gen() % 2 ? 1.0f : -1.0f);
  }
  std::vector<uint16_t> out(v.size());
  floatsToF16(v.data(), out.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    _Float16 ref = static_cast<_Float16>(v[i]);
    uint16_t refBits;
    std::memcpy(&refBits, &ref, 2);
    if (std::isnan(v[i]))
      ASSERT_TRUE(std::isnan(f16ToFloat(out[i])));
    else
      ASSERT_EQ(out[i], refBits) << std::hex << bitsOf(v[i]);
    ASSERT_EQ(floatToF16(v[i]), out[i]);
  }
#else
  GTEST_SKIP() << "the compiler has no _Float16";
#endif
}

TEST_F(CpuBackendTest, F16CastsGemmAndSums) {
  // f32 -> f16 -> f32 through Cast is the reference rounding; the f16 GEMM
  // is the f32 GEMM of the widened operands, as for bf16.
  const int64_t n = 40001;
  std::vector<float> x = random(size_t(n), 300.0f);
  x[0] = 1e6f; // overflows to infinity
  std::vector<uint16_t> h(static_cast<size_t>(n));
  ASSERT_TRUE(backend
                  ->cast(x.data(), FloatFormat::F32, h.data(), FloatFormat::F16,
                         n, 0.0f)
                  .ok());
  std::vector<float> back(static_cast<size_t>(n));
  ASSERT_TRUE(backend
                  ->cast(h.data(), FloatFormat::F16, back.data(),
                         FloatFormat::F32, n, 0.0f)
                  .ok());
  EXPECT_TRUE(std::isinf(back[0]));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[size_t(i)], floatToF16(x[size_t(i)]));
    ASSERT_EQ(back[size_t(i)], f16ToFloat(h[size_t(i)]));
  }
  // Every f16 pattern widens as f16ToFloat does, and back (the CPU's F16C
  // instructions where it has them, else BF16.h): NaN stays NaN.
  std::vector<uint16_t> all(0x10000), again(0x10000);
  for (uint32_t i = 0; i < 0x10000; ++i)
    all[i] = uint16_t(i);
  std::vector<float> wide(0x10000);
  ASSERT_TRUE(backend
                  ->cast(all.data(), FloatFormat::F16, wide.data(),
                         FloatFormat::F32, 0x10000, 0.0f)
                  .ok());
  ASSERT_TRUE(backend
                  ->cast(wide.data(), FloatFormat::F32, again.data(),
                         FloatFormat::F16, 0x10000, 0.0f)
                  .ok());
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const float want = f16ToFloat(uint16_t(i));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(wide[i])) << std::hex << i;
      ASSERT_TRUE(std::isnan(f16ToFloat(again[i]))) << std::hex << i;
    } else {
      ASSERT_EQ(bitsOf(wide[i]), bitsOf(want)) << std::hex << i;
      ASSERT_EQ(again[i], uint16_t(i)) << std::hex << i;
    }
  }
  // bf16 <-> f16 directly: through f32, one rounding.
  std::vector<uint16_t> b(static_cast<size_t>(n));
  ASSERT_TRUE(backend
                  ->cast(h.data(), FloatFormat::F16, b.data(), FloatFormat::BF16,
                         n, 0.0f)
                  .ok());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(b[size_t(i)], floatToBf16(back[size_t(i)]));
  const int64_t m = 7, k = 33, c = 5;
  std::vector<float> a32 = random(size_t(m * k)), b32 = random(size_t(k * c));
  std::vector<uint16_t> ah(a32.size()), bh(b32.size());
  floatsToF16(a32.data(), ah.data(), int64_t(a32.size()));
  floatsToF16(b32.data(), bh.data(), int64_t(b32.size()));
  f16ToFloats(ah.data(), a32.data(), int64_t(a32.size()));
  f16ToFloats(bh.data(), b32.data(), int64_t(b32.size()));
  std::vector<float> ref(static_cast<size_t>(m * c)), got(ref.size());
  // B given [c, k] (transposed).
  std::vector<uint16_t> bt(static_cast<size_t>(c * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < c; ++j)
      bt[size_t(j * k + i)] = bh[size_t(i * c + j)];
  std::vector<float> b32t(bt.size());
  f16ToFloats(bt.data(), b32t.data(), c * k);
  ASSERT_TRUE(backend
                  ->gemm(false, true, m, c, k, 1.0f, a32.data(), b32t.data(),
                         0.0f, ref.data())
                  .ok());
  ASSERT_TRUE(backend
                  ->gemmHalf(FloatFormat::F16, false, true, m, c, k, 1.0f,
                             ah.data(), bt.data(), 0.0f, got.data())
                  .ok());
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4));
  // f16 fill, scale and axpy round once.
  std::vector<uint16_t> y(static_cast<size_t>(n));
  ASSERT_TRUE(backend->fillHalf(FloatFormat::F16, y.data(), 0.1f, n).ok());
  EXPECT_EQ(y[17], floatToF16(0.1f));
  ASSERT_TRUE(
      backend->scaleHalf(FloatFormat::F16, h.data(), y.data(), 0.5f, n).ok());
  EXPECT_EQ(y[3], floatToF16(0.5f * f16ToFloat(h[3])));
  std::vector<uint16_t> acc = y;
  ASSERT_TRUE(
      backend->axpyHalf(FloatFormat::F16, 2.0f, h.data(), acc.data(), n).ok());
  EXPECT_EQ(acc[5], floatToF16(f16ToFloat(y[5]) + 2.0f * f16ToFloat(h[5])));
  float sum = 0;
  ASSERT_TRUE(
      backend->sumSquares(h.data() + 1, FloatFormat::F16, 3, &sum, false).ok());
  double want = 0;
  for (int i = 1; i <= 3; ++i)
    want += double(f16ToFloat(h[size_t(i)])) * f16ToFloat(h[size_t(i)]);
  EXPECT_EQ(sum, float(want));
}

TEST_F(CpuBackendTest, CastAllPairsWithAndWithoutBeta) {
  using FF = FloatFormat;
  for (int threads : {1, 2}) {
    BackendOptions bo;
    bo.numThreads = threads;
    auto be = std::move(*BackendRegistry::global().create("cpu", bo));
    // Large enough for the threaded path; odd so spans are uneven.
    for (int64_t n : {int64_t(37), int64_t(70001)}) {
      std::vector<float> xf = random(size_t(n), 3.0f), yf = random(size_t(n));
      std::vector<uint16_t> xh = toBf16(xf), yh = toBf16(yf);
      for (bool xb : {false, true})
        for (bool yb : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(testing::Message()
                         << "x " << (xb ? "bf16" : "f32") << " y "
                         << (yb ? "bf16" : "f32") << " beta " << beta << " n "
                         << n << " threads " << threads);
            std::vector<float> x = xb ? widen(xh) : xf;
            std::vector<float> y0 = yb ? widen(yh) : yf;
            std::vector<float> expect(static_cast<size_t>(n));
            for (size_t i = 0; i < expect.size(); ++i)
              expect[i] = beta == 0.0f ? x[i] : x[i] + beta * y0[i];
            std::vector<float> outF = yf;
            std::vector<uint16_t> outH = yh;
            void *yp = yb ? static_cast<void *>(outH.data())
                          : static_cast<void *>(outF.data());
            const void *xp = xb ? static_cast<const void *>(xh.data())
                                : static_cast<const void *>(xf.data());
            ASSERT_TRUE(be->cast(xp, xb ? FF::BF16 : FF::F32, yp,
                                 yb ? FF::BF16 : FF::F32, n, beta)
                            .ok());
            if (yb)
              EXPECT_EQ(outH, toBf16(expect));
            else
              EXPECT_EQ(outF, expect);
          }
    }
  }
}

TEST_F(CpuBackendTest, CastBetaZeroDoesNotReadY) {
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> y(3, 0x7fc0); // NaN
  ASSERT_TRUE(backend
                  ->cast(x.data(), FloatFormat::F32, y.data(),
                         FloatFormat::BF16, 3, 0.0f)
                  .ok());
  EXPECT_EQ(y, (std::vector<uint16_t>{0x3fc0, 0xc000, 0x4050}));
  // In place, same format, accumulating: Y = Y + Y.
  std::vector<uint16_t> z = {0x3f80, 0x4000};
  ASSERT_TRUE(backend
                  ->cast(z.data(), FloatFormat::BF16, z.data(),
                         FloatFormat::BF16, 2, 1.0f)
                  .ok());
  EXPECT_EQ(z, (std::vector<uint16_t>{0x4000, 0x4080}));
}

TEST_F(CpuBackendTest, Bf16FillScaleAxpy) {
  const int64_t n = 50001;
  BackendOptions bo;
  bo.numThreads = 2;
  auto be = std::move(*BackendRegistry::global().create("cpu", bo));
  std::vector<uint16_t> y(static_cast<size_t>(n), 0);
  ASSERT_TRUE(be->fillHalf(FloatFormat::BF16, y.data(), 0.1f, n).ok());
  for (uint16_t h : y)
    ASSERT_EQ(h, referenceBf16(0.1f));
  std::vector<uint16_t> x = toBf16(random(size_t(n), 2.0f));
  std::vector<uint16_t> s(static_cast<size_t>(n));
  ASSERT_TRUE(be->scaleHalf(FloatFormat::BF16, x.data(), s.data(), 0.3f, n).ok());
  std::vector<float> xs = widen(x), expect(static_cast<size_t>(n));
  for (size_t i = 0; i < expect.size(); ++i)
    expect[i] = 0.3f * xs[i];
  EXPECT_EQ(s, toBf16(expect));
  // In place (averaging a gradient over dp).
  std::vector<uint16_t> inPlace = x;
  ASSERT_TRUE(be->scaleHalf(FloatFormat::BF16, inPlace.data(), inPlace.data(),
                            0.3f, n)
                  .ok());
  EXPECT_EQ(inPlace, s);
  std::vector<uint16_t> acc = toBf16(random(size_t(n)));
  std::vector<float> accF = widen(acc);
  ASSERT_TRUE(be->axpyHalf(FloatFormat::BF16, -0.5f, x.data(), acc.data(), n).ok());
  for (size_t i = 0; i < expect.size(); ++i)
    expect[i] = accF[i] + -0.5f * xs[i];
  EXPECT_EQ(acc, toBf16(expect));
}
