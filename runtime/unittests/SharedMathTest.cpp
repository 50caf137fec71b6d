//===- SharedMathTest.cpp - The host/device math of the kernels -----------===//
//
// tessera/rt/math/*.h is compiled into the CPU backend and into the CUDA
// kernels. These tests pin it down where it must be exact (Philox, the
// dropout threshold, bf16 rounding, index arithmetic: bit-identical to the
// definitions the CPU always used) and check the float formulas against
// double-precision references, so a GPU run's math is known to be the CPU's
// before any GPU runs it. The bf16 conversions (BF16.h, also host/device)
// are pinned by CpuBackendTest's Bf16Test.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Backend.h"
#include "tessera/rt/Data.h"
#include "tessera/rt/Rng.h"
#include "tessera/rt/math/Kernels.h"
#include "tessera/rt/math/MoE.h"
#include "tessera/rt/math/Philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace tessera::rt;

TEST(SharedMathTest, PhiloxIsTheRngsGenerator) {
  // Random123's known answer, through the shared block function.
  math::Philox4 c = math::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(c.x[0], 0x6627e8d5u);
  EXPECT_EQ(c.x[3], 0x9b00dbd8u);
  // philoxBlock keys and counts exactly as PhiloxStream (weight init,
  // synthetic data), for indices across the 32-bit boundary.
  PhiloxStream stream(1234, "dropout.3");
  for (uint64_t index : {0ull, 1ull, 0xffffffffull, 0x100000000ull,
                         (1ull << 50) + 12345}) {
    math::Philox4 b = math::philoxBlock(1234, fnv1a64("dropout.3"), index);
    auto ref = stream.block(index);
    for (int w = 0; w < 4; ++w)
      EXPECT_EQ(b.x[w], ref[size_t(w)]) << index << " word " << w;
    EXPECT_EQ(math::philoxWord(1234, stream.nameHash(), index * 4 + 2),
              ref[2]);
  }
}

TEST(SharedMathTest, DropoutThresholdIsTheFloatComparisonExactly) {
  // keep <=> word * 2^-32 >= rate, for every rate's boundary words and a
  // spread of others: the integer threshold never disagrees.
  std::mt19937_64 gen(3);
  std::vector<float> rates = {0.0f, 1e-9f, 0.1f, 0.25f, 0.3f, 0.5f, 0.9f,
                              std::nextafter(1.0f, 0.0f)};
  for (int i = 0; i < 200; ++i)
    rates.push_back(std::uniform_real_distribution<float>(0.0f, 1.0f)(gen));
  for (float rate : rates) {
    uint64_t t = math::dropoutThreshold(rate);
    ASSERT_LE(t, 1ull << 32);
    std::vector<uint64_t> words = {0, 1, 0xffffffffull};
    for (int64_t d = -2; d <= 2; ++d)
      if (int64_t(t) + d >= 0 && int64_t(t) + d <= 0xffffffffll)
        words.push_back(uint64_t(int64_t(t) + d));
    for (int i = 0; i < 64; ++i)
      words.push_back(gen() & 0xffffffffull);
    for (uint64_t w : words) {
      bool reference = double(w) * (1.0 / 4294967296.0) >= double(rate);
      ASSERT_EQ(w >= t, reference) << "rate " << rate << " word " << w;
    }
  }
  EXPECT_EQ(math::dropoutThreshold(0.0f), 0u);
  EXPECT_EQ(math::dropoutThreshold(0.5f), 1ull << 31);
}

TEST(SharedMathTest, IndexArithmetic) {
  // The global sample is DataLayout's (Megatron's sampler order).
  DataLayout l;
  l.globalBatch = 48;
  l.microBatch = 4;
  l.dpSize = 3;
  l.dpIndex = 2;
  for (int64_t it : {1, 2, 7})
    for (int64_t mb = 0; mb < 4; ++mb)
      for (int64_t col = 0; col < 4; ++col)
        EXPECT_EQ(globalSampleIndex(l, it, mb, col),
                  (it - 1) * 48 + mb * 4 * 3 + 2 * 4 + col);
  // Dropout counters: consecutive features, then positions, then samples.
  EXPECT_EQ(math::dropoutCounter(0, 16, 0, 8, 5), 5u);
  EXPECT_EQ(math::dropoutCounter(0, 16, 3, 8, 5), 3u * 8 + 5);
  EXPECT_EQ(math::dropoutCounter(2, 16, 3, 8, 5), (2u * 16 + 3) * 8 + 5);
  // QKV and attention output offsets: [seq, batch, heads, {q,k,v}, D].
  const int64_t B = 3, H = 2, D = 4;
  int64_t expected = 0;
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t part = 0; part < 3; ++part)
          for (int64_t d = 0; d < D; ++d)
            ASSERT_EQ(math::qkvOffset(s, b, h, part, d, B, H, D), expected++);
  expected = 0;
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(math::attentionOutOffset(s, b, h, d, B, H, D), expected++);
  // Vocabulary shards.
  EXPECT_EQ(math::shardColumn(10, 8, 4), 2);
  EXPECT_EQ(math::shardColumn(7, 8, 4), -1);
  EXPECT_EQ(math::shardColumn(12, 8, 4), -1);
  EXPECT_TRUE(math::labelInRange(-100, 10, -100));
  EXPECT_FALSE(math::labelInRange(-1, 10, -100));
  EXPECT_FALSE(math::labelInRange(10, 10, -100));
}

TEST(SharedMathTest, ExpErfAndGeluAgainstLibm) {
  for (double x = -20.0; x <= 20.0; x += 0.01) {
    float xf = float(x);
    double e = std::exp(double(xf));
    ASSERT_NEAR(math::expApprox(xf), e, 2e-7 * e + 1e-37) << x;
    ASSERT_NEAR(math::erfApprox(xf), std::erf(double(xf)), 2e-7) << x;
    double g = 0.5 * xf * (1.0 + std::erf(xf / std::sqrt(2.0)));
    ASSERT_NEAR(math::gelu(xf), g, 1e-6 * (1.0 + std::fabs(g))) << x;
    double pdf = std::exp(-0.5 * xf * xf) / std::sqrt(2.0 * M_PI);
    double cdf = 0.5 * (1.0 + std::erf(xf / std::sqrt(2.0)));
    ASSERT_NEAR(math::geluGrad(xf, 1.5f), 1.5 * (cdf + xf * pdf), 2e-6) << x;
    ASSERT_NEAR(math::tanhApprox(xf), std::tanh(double(xf)), 2e-7) << x;
    double u = std::sqrt(2.0 / M_PI) * (xf + 0.044715 * xf * xf * xf);
    double gt = 0.5 * xf * (1.0 + std::tanh(u));
    ASSERT_NEAR(math::geluTanh(xf), gt, 1e-6 * (1.0 + std::fabs(gt))) << x;
    double t = std::tanh(u);
    double dgt = 0.5 * (1.0 + t) + 0.5 * xf * (1.0 - t * t) * std::sqrt(2.0 / M_PI) *
                                       (1.0 + 3.0 * 0.044715 * xf * xf);
    ASSERT_NEAR(math::geluTanhGrad(xf, 1.5f), 1.5 * dgt,
                2e-6 * (1.0 + std::fabs(dgt))) << x;
  }
  EXPECT_EQ(math::expApprox(-100.0f), 0.0f);
  EXPECT_EQ(math::expApprox(-INFINITY), 0.0f);
  EXPECT_EQ(math::reluGrad(-1.0f, 3.0f), 0.0f);
  EXPECT_EQ(math::reluGrad(2.0f, 3.0f), 3.0f);
  EXPECT_EQ(math::reluGrad(NAN, 3.0f), 0.0f);
}

TEST(SharedMathTest, AdamAndSgdUpdates) {
  const float b1 = 0.9f, b2 = 0.95f, lr = 3e-4f, eps = 1e-8f, wd = 0.1f;
  float p = 0.5f, m = 0.0f, v = 0.0f;
  double rp = 0.5, rm = 0.0, rv = 0.0;
  for (int64_t step = 1; step <= 20; ++step) {
    float g = float(std::sin(double(step)));
    float c1 = math::adamBiasCorrection(b1, step);
    float c2 = math::adamBiasCorrection(b2, step);
    EXPECT_FLOAT_EQ(c1, float(1.0 / (1.0 - std::pow(0.9f, double(step)))));
    math::adamUpdate(p, g, m, v, b1, b2, c1, c2, lr, eps, wd);
    rm = b1 * rm + (1 - b1) * double(g);
    rv = b2 * rv + (1 - b2) * double(g) * g;
    double mhat = rm / (1 - std::pow(double(b1), double(step)));
    double vhat = rv / (1 - std::pow(double(b2), double(step)));
    rp -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp);
    ASSERT_NEAR(p, rp, 1e-6) << step;
  }
  float q = 1.0f;
  math::sgdUpdate(q, 0.5f, 0.1f, 0.01f);
  EXPECT_FLOAT_EQ(q, 1.0f - 0.1f * (0.5f + 0.01f));
}

TEST(SharedMathTest, LayerNormAndCrossEntropyRowFormulas) {
  // One row through the formulas against double references.
  const std::vector<float> x = {0.3f, -1.2f, 2.5f, 0.0f, 0.7f};
  const std::vector<float> gamma = {1.0f, 0.5f, -2.0f, 1.5f, 0.25f};
  const std::vector<float> dy = {0.1f, -0.4f, 0.3f, 0.9f, -0.2f};
  const float beta = 0.05f, eps = 1e-5f;
  const int64_t n = int64_t(x.size());
  double mean = 0, var = 0;
  for (float v : x)
    mean += v;
  mean /= double(n);
  for (float v : x)
    var += (v - mean) * (v - mean);
  float sumSq = float(var);
  var /= double(n);
  double rstd = 1.0 / std::sqrt(var + eps);
  float frstd = math::layerNormRstd(sumSq, n, eps);
  EXPECT_NEAR(frstd, rstd, 1e-6 * rstd);
  double mg = 0, mgx = 0;
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_NEAR(math::layerNormOut(x[size_t(j)], float(mean), frstd,
                                   gamma[size_t(j)], beta),
                (x[size_t(j)] - mean) * rstd * gamma[size_t(j)] + beta, 1e-5);
    mg += dy[size_t(j)] * gamma[size_t(j)];
    mgx += dy[size_t(j)] * gamma[size_t(j)] * (x[size_t(j)] - mean) * rstd;
  }
  mg /= double(n);
  mgx /= double(n);
  for (int64_t j = 0; j < n; ++j) {
    double xhat = (x[size_t(j)] - mean) * rstd;
    double ref = rstd * (dy[size_t(j)] * gamma[size_t(j)] - mg - xhat * mgx);
    EXPECT_NEAR(math::layerNormGradX(float(xhat), dy[size_t(j)],
                                     gamma[size_t(j)], frstd, float(mg),
                                     float(mgx)),
                ref, 1e-5 * (1 + std::fabs(ref)));
  }
  // Cross-entropy of logits z with label 2.
  const std::vector<float> z = {1.0f, -0.5f, 2.0f, 0.25f};
  double mx = 2.0, se = 0;
  for (float v : z)
    se += std::exp(v - mx);
  double loss = std::log(se) + mx - z[2];
  EXPECT_NEAR(math::crossEntropyLoss(float(se), float(mx), z[2]), loss, 1e-6);
  const float dl = 0.75f;
  for (size_t j = 0; j < z.size(); ++j) {
    double ref = dl * (std::exp(z[j] - mx) / se - (j == 2 ? 1.0 : 0.0));
    EXPECT_NEAR(math::crossEntropyGrad(z[j], float(mx), float(dl / se), j == 2,
                                       dl),
                ref, 1e-6);
  }
}

// Expert capacity: the definition the CUDA kernel evaluates (moeCapacityKeeps,
// O(n) per choice) keeps exactly the choices the CPU backend keeps by
// sorting each expert's choices, for both policies, with ties in
// probability and choices dropped before (index -1).
TEST(SharedMathTest, ExpertCapacityIsTheCpuBackendsDrop) {
  auto cpu = BackendRegistry::global().create("cpu", {});
  ASSERT_TRUE(cpu.ok());
  std::mt19937 gen(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t tokens = 1 + gen() % 60, k = 1 + gen() % 3,
                  experts = 1 + gen() % 6, n = tokens * k;
    const int64_t capacity = int64_t(gen() % 8) - 1;
    std::vector<float> probs(static_cast<size_t>(n));
    std::vector<int32_t> indices(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) {
      // Few distinct values, so ties are common.
      probs[size_t(c)] = float(gen() % 5) * 0.25f;
      indices[size_t(c)] =
          gen() % 7 == 0 ? -1 : int32_t(gen() % uint32_t(experts));
    }
    for (bool byPosition : {false, true}) {
      std::vector<float> keptProbs(static_cast<size_t>(n));
      std::vector<int32_t> keptIndices(static_cast<size_t>(n));
      ASSERT_TRUE((*cpu)
                      ->moeCapacityDrop(probs.data(), indices.data(),
                                        keptProbs.data(), keptIndices.data(),
                                        tokens, k, experts, capacity,
                                        byPosition)
                      .ok());
      for (int64_t c = 0; c < n; ++c) {
        const bool keeps = math::moeCapacityKeeps(
            probs.data(), indices.data(), n, c, capacity, byPosition);
        const int32_t e = indices[size_t(c)];
        EXPECT_EQ(keptIndices[size_t(c)], keeps ? e : -1)
            << "trial " << trial << " choice " << c;
        EXPECT_EQ(keptProbs[size_t(c)],
                  keeps || e < 0 ? probs[size_t(c)] : 0.0f);
      }
    }
  }
}

// The CUDA backend's row map and expert capacity sort the choices once by
// moeChoiceSortKey (a stable radix sort over bits [32 or 0, end)); the
// steps after the sort, mirrored here, must give the definitions: each
// expert's rows in token order after the experts before it, and
// moeCapacityKeeps for both policies, with ties, zeros of both signs,
// subnormals and choices routed nowhere (-1, or out of range).
TEST(SharedMathTest, ChoiceSortKeysGiveTheRowMapAndTheCapacity) {
  std::mt19937 gen(11);
  const float values[] = {0.0f, -0.0f, 1e-40f, 1e-30f, 0.25f, 0.5f, 0.75f,
                          1.0f, 0.5f + 1e-7f};
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 1 + gen() % 200, experts = 1 + gen() % 9;
    const int64_t capacity = int64_t(gen() % 10) - 1;
    std::vector<float> probs(static_cast<size_t>(n));
    std::vector<int32_t> indices(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) {
      probs[size_t(c)] = values[gen() % (sizeof(values) / sizeof(float))];
      const uint32_t r = gen() % 12;
      indices[size_t(c)] = r == 0   ? -1
                           : r == 1 ? int32_t(experts + gen() % 3)
                                    : int32_t(gen() % uint32_t(experts));
    }
    const int endBit = math::moeSortKeyEndBit(experts);
    ASSERT_LE(endBit, 64);
    for (bool byPosition : {false, true}) {
      std::vector<uint64_t> keys(static_cast<size_t>(n));
      std::vector<int32_t> order(static_cast<size_t>(n));
      for (int64_t c = 0; c < n; ++c) {
        keys[size_t(c)] = math::moeChoiceSortKey(
            probs[size_t(c)], indices[size_t(c)], experts, byPosition);
        ASSERT_LT(keys[size_t(c)] >> endBit, 1u) << "key past the sorted bits";
        order[size_t(c)] = int32_t(c);
      }
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return keys[size_t(a)] < keys[size_t(b)];
      });
      // The kernels: each expert's first sorted position, then each
      // position's rank within its expert.
      std::vector<int64_t> start(static_cast<size_t>(experts + 1), -1);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t e = math::moeSortKeyExpert(keys[size_t(order[size_t(i)])]);
        if (i == 0 ||
            e != math::moeSortKeyExpert(keys[size_t(order[size_t(i - 1)])]))
          start[size_t(e)] = i;
      }
      std::vector<int32_t> rowOf(static_cast<size_t>(n), -2);
      std::vector<bool> keeps(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t c = order[size_t(i)];
        const int64_t e = math::moeSortKeyExpert(keys[size_t(c)]);
        rowOf[size_t(c)] = e < experts ? int32_t(i) : -1;
        keeps[size_t(c)] = e < experts && i - start[size_t(e)] < capacity;
      }
      for (int64_t c = 0; c < n; ++c) {
        SCOPED_TRACE(testing::Message() << "trial " << trial << " choice " << c
                                        << " byPosition " << byPosition);
        const int32_t e = indices[size_t(c)];
        const bool routed = e >= 0 && e < experts;
        if (byPosition) {
          // The row map: the rows of the experts before e, then e's
          // choices before c in token order.
          int64_t row = 0;
          for (int64_t o = 0; o < n; ++o) {
            const int32_t eo = indices[size_t(o)];
            row += eo >= 0 && eo < experts && (eo < e || (eo == e && o < c));
          }
          EXPECT_EQ(rowOf[size_t(c)], routed ? row : -1);
        }
        // Out-of-range indices are errors for the kernels; the definition
        // is only about valid ones.
        if (e < experts)
          EXPECT_EQ(bool(keeps[size_t(c)]),
                    math::moeCapacityKeeps(probs.data(), indices.data(), n, c,
                                           capacity, byPosition));
      }
    }
  }
}
