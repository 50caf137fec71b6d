//===- TransformerKernelsTest.cpp - transformer kernels of the cpu backend ===//
//
// Every transformer kernel against a naive double-precision reference, every
// gradient against central finite differences of the (double) forward, the
// vocabulary-parallel paths against the unsharded kernels, and the opcodes
// through the loader and executor (shape errors, vocab offsets, a one-layer
// transformer that trains).
//
//===----------------------------------------------------------------------===//

#include "TestArtifacts.h"

#include "tessera/rt/BF16.h"
#include "tessera/rt/Backend.h"
#include "tessera/rt/Executor.h"
#include "tessera/rt/math/SequenceLayout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <tuple>
#include <vector>

using namespace tessera::rt;
using namespace tessera::rt::test;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

class TransformerKernelsTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto b = BackendRegistry::global().create("cpu", {});
    ASSERT_TRUE(b.ok()) << b.status().toString();
    backend = std::move(*b);
  }
  Vec random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    Vec v(n);
    for (float &x : v)
      x = dist(gen);
    return v;
  }
  std::unique_ptr<Backend> backend;
  std::mt19937 gen{7};
};

DVec toDouble(const Vec &v) { return DVec(v.begin(), v.end()); }

void expectClose(const Vec &got, const DVec &ref, double tol,
                 const std::string &what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], tol * (1.0 + std::fabs(ref[i])))
        << what << " at " << i;
}

/// Central differences of scalar `f` with respect to every element of `x`
/// (or the elements listed in `which`), in double.
DVec finiteDifferences(const std::function<double(const DVec &)> &f, DVec x,
                       const std::vector<size_t> &which, double h = 1e-5) {
  DVec g(x.size(), 0.0);
  for (size_t i : which) {
    double old = x[i];
    x[i] = old + h;
    double fp = f(x);
    x[i] = old - h;
    double fm = f(x);
    x[i] = old;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}
std::vector<size_t> allIndices(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = i;
  return v;
}
double dot(const DVec &a, const Vec &w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * double(w[i]);
  return s;
}

//===----------------------------------------------------------------------===//
// Double-precision references
//===----------------------------------------------------------------------===//

DVec refLayerNorm(const DVec &x, const DVec &g, const DVec &b, int64_t rows,
                  int64_t cols, double eps) {
  DVec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j)
      mean += x[size_t(r * cols + j)];
    mean /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      double d = x[size_t(r * cols + j)] - mean;
      var += d * d;
    }
    var /= double(cols);
    for (int64_t j = 0; j < cols; ++j)
      y[size_t(r * cols + j)] = (x[size_t(r * cols + j)] - mean) /
                                    std::sqrt(var + eps) * g[size_t(j)] +
                                b[size_t(j)];
  }
  return y;
}

/// Megatron's RMSNorm: x / sqrt(mean(x^2) + eps) * g per row.
DVec refRMSNorm(const DVec &x, const DVec &g, int64_t rows, int64_t cols,
                double eps) {
  DVec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (int64_t j = 0; j < cols; ++j)
      sq += x[size_t(r * cols + j)] * x[size_t(r * cols + j)];
    double rstd = 1.0 / std::sqrt(sq / double(cols) + eps);
    for (int64_t j = 0; j < cols; ++j)
      y[size_t(r * cols + j)] = x[size_t(r * cols + j)] * rstd * g[size_t(j)];
  }
  return y;
}

/// QKV [S, B, A*3*D] -> O [S, B, A*D].
DVec refAttention(const DVec &qkv, int64_t S, int64_t B, int64_t A, int64_t D,
                  bool causal) {
  DVec o(size_t(S * B * A * D), 0.0);
  double scale = 1.0 / std::sqrt(double(D));
  auto at = [&](int64_t s, int64_t b, int64_t h, int64_t which, int64_t d) {
    return qkv[size_t(((s * B + b) * A + h) * 3 * D + which * D + d)];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < A; ++h)
      for (int64_t i = 0; i < S; ++i) {
        int64_t n = causal ? i + 1 : S;
        DVec sc(static_cast<size_t>(n));
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += at(i, b, h, 0, d) * at(j, b, h, 1, d);
          sc[size_t(j)] = s * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double sum = 0;
        for (double &v : sc)
          sum += (v = std::exp(v - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j)
            acc += sc[size_t(j)] / sum * at(j, b, h, 2, d);
          o[size_t(((i * B + b) * A + h) * D + d)] = acc;
        }
      }
  return o;
}

/// Mean cross-entropy over the rows whose label is not `ignore` (0 if none).
double refTokenMeanCE(const DVec &z, const std::vector<int32_t> &t,
                      int64_t rows, int64_t cols, int64_t ignore) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[size_t(r)] == ignore)
      continue;
    double mx = -1e300;
    for (int64_t j = 0; j < cols; ++j)
      mx = std::max(mx, z[size_t(r * cols + j)]);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j)
      s += std::exp(z[size_t(r * cols + j)] - mx);
    sum += std::log(s) + mx - z[size_t(r * cols + t[size_t(r)])];
    ++count;
  }
  return count ? sum / double(count) : 0.0;
}

} // namespace

//===----------------------------------------------------------------------===//
// LayerNorm
//===----------------------------------------------------------------------===//

TEST_F(TransformerKernelsTest, LayerNormMatchesReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {1, 5},
                            {6, 7},
                            {12, 33},
                            {3, 100}}) {
    auto x = random(size_t(rows * cols), 2.0f);
    for (float &v : x)
      v += 3.0f; // non-zero mean
    auto g = random(static_cast<size_t>(cols)),
         b = random(static_cast<size_t>(cols));
    Vec y(x.size());
    ASSERT_TRUE(backend
                    ->layerNorm(x.data(), g.data(), b.data(), y.data(), rows,
                                cols, 1e-5f)
                    .ok());
    expectClose(
        y,
        refLayerNorm(toDouble(x), toDouble(g), toDouble(b), rows, cols, 1e-5),
        2e-5,
        "layer norm " + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

// The activation kernels load and store any float format (FloatIn,
// FloatOut): a 16-bit operand must give, bit for bit, what a Cast to f32
// before the f32 kernel and a Cast back after it give, which is what the
// compiler's fold of those casts into the kernel relies on. Sizes take the
// threaded paths and several of add's staged spans.
TEST_F(TransformerKernelsTest, AnyFormatOperandsEqualCastsAroundTheF32Kernel) {
  using Half = std::vector<uint16_t>;
  const int64_t rows = 300, cols = 130, n = rows * cols;
  for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16}) {
    SCOPED_TRACE(h == FloatFormat::BF16 ? "bf16" : "f16");
    auto narrow = [&](const Vec &v) {
      Half out(v.size());
      floatsToHalf(h, v.data(), out.data(), int64_t(v.size()));
      return out;
    };
    auto widen = [&](const Half &v) {
      Vec out(v.size());
      halfToFloats(h, v.data(), out.data(), int64_t(v.size()));
      return out;
    };
    auto in = [&](const Half &v) { return FloatIn(v.data(), h); };
    auto out = [&](Half &v) { return FloatOut(v.data(), h); };
    const Half x = narrow(random(size_t(n), 2.0f));
    const Half x2 = narrow(random(size_t(2 * n)));
    const Vec xw = widen(x), x2w = widen(x2);
    const Vec b = random(size_t(n)), bias = random(size_t(cols));
    const Vec g = random(size_t(cols)), dy = random(size_t(n));
    const size_t len = static_cast<size_t>(n);
    Vec ref(len), got(len);
    Half yh(len);

    // add: 16-bit A and C, f32 B; then 16-bit A and B, f32 C.
    ASSERT_TRUE(backend->add(xw.data(), b.data(), ref.data(), n).ok());
    ASSERT_TRUE(backend->add(in(x), b.data(), out(yh), n).ok());
    EXPECT_EQ(yh, narrow(ref)) << "add";
    const Half b16 = narrow(b);
    ASSERT_TRUE(backend->add(xw.data(), widen(b16).data(), ref.data(), n).ok());
    ASSERT_TRUE(backend->add(in(x), in(b16), got.data(), n).ok());
    EXPECT_EQ(got, ref) << "add, f32 result";
    // bias add, bias-GELU (both forms) and its backward.
    ASSERT_TRUE(backend->biasAdd(xw.data(), bias.data(), ref.data(), rows, cols).ok());
    ASSERT_TRUE(backend->biasAdd(in(x), bias.data(), out(yh), rows, cols).ok());
    EXPECT_EQ(yh, narrow(ref)) << "biasAdd";
    for (bool tanh : {false, true}) {
      ASSERT_TRUE(backend->biasGelu(xw.data(), bias.data(), ref.data(), rows,
                                    cols, tanh).ok());
      ASSERT_TRUE(backend->biasGelu(in(x), bias.data(), out(yh), rows, cols,
                                    tanh).ok());
      EXPECT_EQ(yh, narrow(ref)) << "biasGelu tanh " << tanh;
      Vec dbRef = random(size_t(cols)), dbGot = dbRef;
      ASSERT_TRUE(backend->biasGeluGrad(xw.data(), bias.data(), dy.data(),
                                        ref.data(), dbRef.data(), rows, cols,
                                        tanh, 1.0f).ok());
      ASSERT_TRUE(backend->biasGeluGrad(in(x), bias.data(), dy.data(),
                                        got.data(), dbGot.data(), rows, cols,
                                        tanh, 1.0f).ok());
      EXPECT_EQ(got, ref) << "biasGeluGrad dx tanh " << tanh;
      EXPECT_EQ(dbGot, dbRef) << "biasGeluGrad dbias tanh " << tanh;
    }
    // The norms and their backwards.
    ASSERT_TRUE(backend->layerNorm(xw.data(), g.data(), bias.data(), ref.data(),
                                   rows, cols, 1e-5f).ok());
    ASSERT_TRUE(backend->layerNorm(in(x), g.data(), bias.data(), out(yh), rows,
                                   cols, 1e-5f).ok());
    EXPECT_EQ(yh, narrow(ref)) << "layerNorm";
    ASSERT_TRUE(backend->rmsNorm(xw.data(), g.data(), ref.data(), rows, cols,
                                 1e-5f).ok());
    ASSERT_TRUE(backend->rmsNorm(in(x), g.data(), out(yh), rows, cols, 1e-5f).ok());
    EXPECT_EQ(yh, narrow(ref)) << "rmsNorm";
    // The fused residual add + norm: a 16-bit Y (the f32 sum S unchanged).
    Vec sRef(len), sGot(len);
    ASSERT_TRUE(backend->addLayerNorm(xw.data(), b.data(), g.data(), bias.data(),
                                      sRef.data(), ref.data(), rows, cols,
                                      1e-5f).ok());
    ASSERT_TRUE(backend->addLayerNorm(xw.data(), b.data(), g.data(), bias.data(),
                                      sGot.data(), out(yh), rows, cols,
                                      1e-5f).ok());
    EXPECT_EQ(yh, narrow(ref)) << "addLayerNorm";
    EXPECT_EQ(sGot, sRef) << "addLayerNorm sum";
    ASSERT_TRUE(backend->addRmsNorm(xw.data(), b.data(), g.data(), sRef.data(),
                                    ref.data(), rows, cols, 1e-5f).ok());
    ASSERT_TRUE(backend->addRmsNorm(xw.data(), b.data(), g.data(), sGot.data(),
                                    out(yh), rows, cols, 1e-5f).ok());
    EXPECT_EQ(yh, narrow(ref)) << "addRmsNorm";
    EXPECT_EQ(sGot, sRef) << "addRmsNorm sum";
    const size_t width = static_cast<size_t>(cols);
    Vec dgRef(width), dgGot(width), dbRef(width), dbGot(width);
    ASSERT_TRUE(backend->layerNormGrad(xw.data(), g.data(), dy.data(), ref.data(),
                                       dgRef.data(), dbRef.data(), rows, cols,
                                       1e-5f, 0.0f).ok());
    ASSERT_TRUE(backend->layerNormGrad(in(x), g.data(), dy.data(), got.data(),
                                       dgGot.data(), dbGot.data(), rows, cols,
                                       1e-5f, 0.0f).ok());
    EXPECT_EQ(got, ref) << "layerNormGrad dx";
    EXPECT_EQ(dgGot, dgRef) << "layerNormGrad dgamma";
    EXPECT_EQ(dbGot, dbRef) << "layerNormGrad dbeta";
    ASSERT_TRUE(backend->rmsNormGrad(xw.data(), g.data(), dy.data(), nullptr,
                                     ref.data(), dgRef.data(), rows, cols, 1e-5f,
                                     0.0f).ok());
    ASSERT_TRUE(backend->rmsNormGrad(in(x), g.data(), dy.data(), nullptr,
                                     got.data(), dgGot.data(), rows, cols,
                                     1e-5f, 0.0f).ok());
    EXPECT_EQ(got, ref) << "rmsNormGrad dx";
    EXPECT_EQ(dgGot, dgRef) << "rmsNormGrad dgamma";
    // SwiGLU over [rows, 2 cols] and its backward.
    ASSERT_TRUE(backend->swiglu(x2w.data(), ref.data(), rows, cols).ok());
    ASSERT_TRUE(backend->swiglu(in(x2), out(yh), rows, cols).ok());
    EXPECT_EQ(yh, narrow(ref)) << "swiglu";
    Vec dx2Ref(2 * len), dx2Got(2 * len);
    ASSERT_TRUE(backend->swigluGrad(x2w.data(), dy.data(), dx2Ref.data(), rows,
                                    cols).ok());
    ASSERT_TRUE(backend->swigluGrad(in(x2), dy.data(), dx2Got.data(), rows,
                                    cols).ok());
    EXPECT_EQ(dx2Got, dx2Ref) << "swigluGrad";
    // The loss statistics over 16-bit logits (rows of 130 classes, some
    // ignored) and their gradient into a 16-bit dZ, unsharded and as the
    // second of two vocabulary shards.
    std::vector<int32_t> t(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      t[size_t(r)] = r % 7 == 0 ? -100 : int32_t((r * 37) % (2 * cols));
    const size_t nrows = static_cast<size_t>(rows);
    Vec mRef(nrows), mGot(nrows), seRef(nrows), seGot(nrows), plRef(nrows),
        plGot(nrows), dl = random(nrows);
    ASSERT_TRUE(backend->logitsMax(xw.data(), mRef.data(), rows, cols).ok());
    ASSERT_TRUE(backend->logitsMax(in(x), mGot.data(), rows, cols).ok());
    EXPECT_EQ(mGot, mRef) << "logitsMax";
    ASSERT_TRUE(backend->crossEntropyStats(xw.data(), t.data(), mRef.data(),
                                           seRef.data(), plRef.data(), rows,
                                           cols, cols, 2 * cols, -100).ok());
    ASSERT_TRUE(backend->crossEntropyStats(in(x), t.data(), mRef.data(),
                                           seGot.data(), plGot.data(), rows,
                                           cols, cols, 2 * cols, -100).ok());
    EXPECT_EQ(seGot, seRef) << "crossEntropyStats se";
    EXPECT_EQ(plGot, plRef) << "crossEntropyStats pl";
    ASSERT_TRUE(backend->crossEntropyStatsGrad(xw.data(), t.data(), mRef.data(),
                                               seRef.data(), dl.data(),
                                               ref.data(), rows, cols, cols,
                                               2 * cols, -100).ok());
    ASSERT_TRUE(backend->crossEntropyStatsGrad(in(x), t.data(), mRef.data(),
                                               seRef.data(), dl.data(), out(yh),
                                               rows, cols, cols, 2 * cols,
                                               -100).ok());
    EXPECT_EQ(yh, narrow(ref)) << "crossEntropyStatsGrad";
    std::vector<int32_t> tl(nrows);
    for (size_t r = 0; r < nrows; ++r)
      tl[r] = t[r] < 0 ? t[r] : t[r] % int32_t(cols);
    ASSERT_TRUE(backend->logitsStats(xw.data(), tl.data(), mRef.data(),
                                     seRef.data(), plRef.data(), rows, cols,
                                     -100).ok());
    ASSERT_TRUE(backend->logitsStats(in(x), tl.data(), mGot.data(),
                                     seGot.data(), plGot.data(), rows, cols,
                                     -100).ok());
    EXPECT_EQ(mGot, mRef) << "logitsStats max";
    EXPECT_EQ(seGot, seRef) << "logitsStats se";
    EXPECT_EQ(plGot, plRef) << "logitsStats pl";
    // The lookup from a 16-bit table (rows of another shard are zeros) into
    // 16-bit and f32 rows, and the position add over [seq, batch, dim].
    const int64_t vocab = 40, shardOffset = 20, dim = cols;
    const Half table = narrow(random(size_t(vocab * dim)));
    std::vector<int32_t> ids(nrows);
    for (size_t r = 0; r < nrows; ++r)
      ids[r] = int32_t((r * 13) % size_t(2 * vocab));
    Vec eRef(nrows * width), eGot(nrows * width);
    Half eh(nrows * width);
    ASSERT_TRUE(backend->embedding(ids.data(), widen(table).data(), eRef.data(),
                                   rows, vocab, dim, shardOffset, 2 * vocab).ok());
    ASSERT_TRUE(backend->embedding(ids.data(), in(table), out(eh), rows, vocab,
                                   dim, shardOffset, 2 * vocab).ok());
    EXPECT_EQ(eh, narrow(eRef)) << "embedding";
    ASSERT_TRUE(backend->embedding(ids.data(), in(table), eGot.data(), rows,
                                   vocab, dim, shardOffset, 2 * vocab).ok());
    EXPECT_EQ(eGot, eRef) << "embedding, f32 rows";
    const int64_t seq = 30, batch = rows / seq;
    const Half pos = narrow(random(size_t(seq * dim)));
    ASSERT_TRUE(backend->addPositionEmbedding(xw.data(), widen(pos).data(),
                                              ref.data(), seq, batch, dim).ok());
    ASSERT_TRUE(backend->addPositionEmbedding(in(x), in(pos), out(yh), seq,
                                              batch, dim).ok());
    EXPECT_EQ(yh, narrow(ref)) << "addPositionEmbedding";
    Half inPlace = x;
    ASSERT_TRUE(backend->addPositionEmbedding(in(inPlace), in(pos),
                                              out(inPlace), seq, batch,
                                              dim).ok());
    EXPECT_EQ(inPlace, yh) << "addPositionEmbedding in place";
    // SwiGLU's dX into 16 bits.
    Half dx2h(2 * len);
    ASSERT_TRUE(backend->swigluGrad(in(x2), dy.data(), out(dx2h), rows,
                                    cols).ok());
    EXPECT_EQ(dx2h, narrow(dx2Ref)) << "swigluGrad, 16-bit dX";
    // Grouped-query attention's repeat (2 groups of 3 query heads, d 5:
    // 2 * 5 * 5 = 50 features in, 6 * 3 * 5 = 90 out) and its backward.
    const int64_t heads = 6, groups = 2, d = 5, inW = 50, outW = 90;
    const Half kv = narrow(random(size_t(rows * inW)));
    Vec kvRef(nrows * size_t(outW));
    Half kvh(nrows * size_t(outW));
    ASSERT_TRUE(backend->repeatKV(widen(kv).data(), kvRef.data(), rows, heads,
                                  groups, d).ok());
    ASSERT_TRUE(backend->repeatKV(in(kv), out(kvh), rows, heads, groups, d).ok());
    EXPECT_EQ(kvh, narrow(kvRef)) << "repeatKV";
    const Half dkv = narrow(random(nrows * size_t(outW)));
    Vec dkvRef(nrows * size_t(inW));
    Half dkvh(nrows * size_t(inW));
    ASSERT_TRUE(backend->repeatKVGrad(widen(dkv).data(), dkvRef.data(), rows,
                                      heads, groups, d).ok());
    ASSERT_TRUE(backend->repeatKVGrad(in(dkv), out(dkvh), rows, heads, groups,
                                      d).ok());
    EXPECT_EQ(dkvh, narrow(dkvRef)) << "repeatKVGrad";
    // Dropout over [seq, batch, dim].
    ASSERT_TRUE(backend->dropout(xw.data(), ref.data(), seq, batch, dim, 0,
                                 seq, 0, 7, 3, 0.25f).ok());
    ASSERT_TRUE(backend->dropout(in(x), out(yh), seq, batch, dim, 0, seq, 0, 7,
                                 3, 0.25f).ok());
    EXPECT_EQ(yh, narrow(ref)) << "dropout";
    // RoPE over [seq, batch, heads * 3 * d] (2 heads of d 5, 4 rotated
    // features: the fifth copied), apart and in place.
    const int64_t rHeads = 2, rD = 5, features = rHeads * 3 * rD;
    const int64_t rSeq = 10, rBatch = rows / 10 / 3;
    const int64_t rn = rSeq * rBatch * features;
    const Half q = narrow(random(size_t(rn)));
    Vec qRef(static_cast<size_t>(rn));
    Half qh(static_cast<size_t>(rn));
    for (bool inverse : {false, true}) {
      ASSERT_TRUE(backend->rotaryEmbedding(widen(q).data(), qRef.data(), rSeq,
                                           rBatch, features, rHeads, 4,
                                           10000.0f, 0.0f, 3, inverse).ok());
      ASSERT_TRUE(backend->rotaryEmbedding(in(q), out(qh), rSeq, rBatch,
                                           features, rHeads, 4, 10000.0f, 0.0f,
                                           3, inverse).ok());
      EXPECT_EQ(qh, narrow(qRef)) << "rotaryEmbedding inverse " << inverse;
      Half qIn = q;
      ASSERT_TRUE(backend->rotaryEmbedding(in(qIn), out(qIn), rSeq, rBatch,
                                           features, rHeads, 4, 10000.0f, 0.0f,
                                           3, inverse).ok());
      EXPECT_EQ(qIn, qh) << "rotaryEmbedding in place, inverse " << inverse;
    }
  }
}

TEST_F(TransformerKernelsTest, LayerNormGradVsFiniteDifferences) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 4}, {5, 7}, {4, 33}}) {
    const double eps = 1e-3;
    auto x = random(size_t(rows * cols)), g = random(static_cast<size_t>(cols)),
         b = random(static_cast<size_t>(cols)), w = random(size_t(rows * cols));
    // loss = sum(Y * W), so dY = W.
    auto loss = [&](const DVec &xx, const DVec &gg, const DVec &bb) {
      return dot(refLayerNorm(xx, gg, bb, rows, cols, eps), w);
    };
    DVec xd = toDouble(x), gd = toDouble(g), bd = toDouble(b);
    DVec fdx = finiteDifferences([&](const DVec &v) { return loss(v, gd, bd); },
                                 xd, allIndices(x.size()));
    DVec fdg = finiteDifferences([&](const DVec &v) { return loss(xd, v, bd); },
                                 gd, allIndices(g.size()));
    DVec fdb = finiteDifferences([&](const DVec &v) { return loss(xd, gd, v); },
                                 bd, allIndices(b.size()));
    Vec dx(x.size());
    // beta = 1 accumulates onto the old dgamma / dbeta.
    Vec dg0 = random(static_cast<size_t>(cols)),
        db0 = random(static_cast<size_t>(cols));
    for (float beta : {0.0f, 1.0f}) {
      Vec dg = dg0, db = db0;
      ASSERT_TRUE(backend
                      ->layerNormGrad(x.data(), g.data(), w.data(), dx.data(),
                                      dg.data(), db.data(), rows, cols,
                                      float(eps), beta)
                      .ok());
      DVec refg = fdg, refb = fdb;
      for (size_t j = 0; j < size_t(cols); ++j) {
        refg[j] += beta * dg0[j];
        refb[j] += beta * db0[j];
      }
      std::string shape = std::to_string(rows) + "x" + std::to_string(cols) +
                          " beta " + std::to_string(beta);
      expectClose(dx, fdx, 1e-4, "dX " + shape);
      expectClose(dg, refg, 1e-4, "dgamma " + shape);
      expectClose(db, refb, 1e-4, "dbeta " + shape);
    }
  }
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

TEST_F(TransformerKernelsTest, RMSNormMatchesReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {1, 5},
                            {6, 7},
                            {12, 33},
                            {3, 100}}) {
    auto x = random(size_t(rows * cols), 2.0f);
    for (float &v : x)
      v += 3.0f; // non-zero mean: RMSNorm does not subtract it
    auto g = random(static_cast<size_t>(cols));
    Vec y(x.size());
    ASSERT_TRUE(
        backend->rmsNorm(x.data(), g.data(), y.data(), rows, cols, 1e-6f).ok());
    std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    expectClose(y, refRMSNorm(toDouble(x), toDouble(g), rows, cols, 1e-6), 2e-5,
                "rms norm " + shape);
    // The fused form: the sum, and the norm of it bit for bit as rmsNorm's.
    auto a = random(x.size());
    Vec b(x.size()), s(x.size()), ys(x.size()), yn(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      b[i] = x[i] - a[i];
    ASSERT_TRUE(backend
                    ->addRmsNorm(a.data(), b.data(), g.data(), s.data(),
                                 ys.data(), rows, cols, 1e-6f)
                    .ok());
    ASSERT_TRUE(
        backend->rmsNorm(s.data(), g.data(), yn.data(), rows, cols, 1e-6f)
            .ok());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(s[i], a[i] + b[i]) << shape << " sum " << i;
      ASSERT_EQ(ys[i], yn[i]) << shape << " norm " << i;
    }
  }
}

/// SwiGLU in double: rows of [gate | up], silu(g) * u.
DVec refSwiGLU(const DVec &x, int64_t rows, int64_t n) {
  DVec y(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double g = x[size_t(r * 2 * n + j)], u = x[size_t(r * 2 * n + n + j)];
      y[size_t(r * n + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  return y;
}

TEST_F(TransformerKernelsTest, SwiGLUMatchesReferenceAndFiniteDifferences) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1},
                         {3, 5},
                         {7, 33},
                         {2, 100}}) {
    auto x = random(size_t(rows * 2 * n), 3.0f);
    // The sigmoid's tails: far negative and far positive gates.
    x[0] = -95.0f;
    if (n > 1)
      x[1] = 95.0f;
    std::string shape = std::to_string(rows) + "x" + std::to_string(n);
    Vec y(size_t(rows * n));
    ASSERT_TRUE(backend->swiglu(x.data(), y.data(), rows, n).ok());
    expectClose(y, refSwiGLU(toDouble(x), rows, n), 1e-6, "swiglu " + shape);

    // The gradient of sum(dy * swiglu(x)) by central differences.
    auto dy = random(size_t(rows * n));
    Vec dx(x.size());
    ASSERT_TRUE(
        backend->swigluGrad(x.data(), dy.data(), dx.data(), rows, n).ok());
    DVec ddy = toDouble(dy);
    auto loss = [&](const DVec &xs) {
      DVec ys = refSwiGLU(xs, rows, n);
      double s = 0;
      for (size_t i = 0; i < ys.size(); ++i)
        s += ys[i] * ddy[i];
      return s;
    };
    std::vector<size_t> all(x.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = i;
    expectClose(dx, finiteDifferences(loss, toDouble(x), all), 1e-5,
                "swigluGrad " + shape);
  }
}

TEST_F(TransformerKernelsTest, RepeatKVLayoutAndGradientSums) {
  // heads 6 in 2 groups of 3, head dim 4; and MHA's degenerate G = heads.
  for (auto [heads, groups] : {std::pair<int64_t, int64_t>{6, 2}, {4, 4}, {4, 1}}) {
    const int64_t rows = 5, d = 4, r = heads / groups;
    const int64_t in = groups * (r + 2) * d, out = heads * 3 * d;
    auto x = random(size_t(rows * in));
    Vec y(size_t(rows * out));
    ASSERT_TRUE(
        backend->repeatKV(x.data(), y.data(), rows, heads, groups, d).ok());
    // Head h of group g: q is the group's h-th query block, k and v the
    // group's (the layout of Megatron's linear_qkv per query group).
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t g = h / r, base = row * in + g * (r + 2) * d;
          const float *yh = y.data() + row * out + h * 3 * d;
          ASSERT_EQ(yh[j], x[size_t(base + (h % r) * d + j)]);
          ASSERT_EQ(yh[d + j], x[size_t(base + r * d + j)]);
          ASSERT_EQ(yh[2 * d + j], x[size_t(base + (r + 1) * d + j)]);
        }
    // The gradient is the adjoint: <dy, repeat(x)> = <repeatGrad(dy), x>.
    auto dy = random(size_t(rows * out));
    Vec dx(x.size());
    ASSERT_TRUE(backend->repeatKVGrad(dy.data(), dx.data(), rows, heads,
                                      groups, d)
                    .ok());
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < y.size(); ++i)
      lhs += double(dy[i]) * y[i];
    for (size_t i = 0; i < x.size(); ++i)
      rhs += double(dx[i]) * x[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::fabs(lhs)))
        << heads << " heads, " << groups << " groups";
    // Each group's dk: its heads' in head order, as float sums.
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t h = 0; h < r; ++h)
        sum = h == 0 ? dy[size_t((g * r + h) * 3 * d + d)]
                     : sum + dy[size_t((g * r + h) * 3 * d + d)];
      EXPECT_EQ(dx[size_t(g * (r + 2) * d + r * d)], sum);
    }
  }
}

TEST_F(TransformerKernelsTest, QKNormMatchesReferenceAndFiniteDifferences) {
  // 6 heads in 2 groups of head dim 5: q heads, then k, then v per group.
  const int64_t rows = 3, heads = 6, groups = 2, d = 5, r = heads / groups;
  const int64_t per = r + 2, n = rows * groups * per * d;
  const float eps = 1e-6f;
  auto x = random(size_t(n), 2.0f);
  auto wq = random(size_t(d)), wk = random(size_t(d));
  // The reference: every vector of d features, q (slot < r), k or v.
  auto forward = [&](const DVec &xs, const DVec &q, const DVec &k) {
    DVec y(xs.size());
    for (int64_t v = 0; v < n / d; ++v) {
      const int64_t slot = v % per;
      double ss = 0;
      for (int64_t j = 0; j < d; ++j)
        ss += xs[size_t(v * d + j)] * xs[size_t(v * d + j)];
      const double rs = 1.0 / std::sqrt(ss / double(d) + eps);
      for (int64_t j = 0; j < d; ++j) {
        const double xv = xs[size_t(v * d + j)];
        y[size_t(v * d + j)] = slot == r + 1 ? xv
                               : slot < r    ? xv * rs * q[size_t(j)]
                                             : xv * rs * k[size_t(j)];
      }
    }
    return y;
  };
  Vec y(static_cast<size_t>(n));
  ASSERT_TRUE(backend
                  ->qkNorm(x.data(), wq.data(), wk.data(), y.data(), rows,
                           heads, groups, d, eps)
                  .ok());
  expectClose(y, forward(toDouble(x), toDouble(wq), toDouble(wk)), 2e-6,
              "qkNorm");

  auto dy = random(size_t(n));
  Vec dx(static_cast<size_t>(n)), dwq(static_cast<size_t>(d), 0.5f),
      dwk(static_cast<size_t>(d), 0.25f);
  Vec dwq0 = dwq, dwk0 = dwk;
  // beta 1: the weight gradients accumulate onto what the buffers hold.
  ASSERT_TRUE(backend
                  ->qkNormGrad(x.data(), wq.data(), wk.data(), dy.data(),
                               dx.data(), dwq.data(), dwk.data(), rows, heads,
                               groups, d, eps, 1.0f)
                  .ok());
  DVec ddy = toDouble(dy);
  auto loss = [&](const DVec &xs, const DVec &q, const DVec &k) {
    DVec ys = forward(xs, q, k);
    double s = 0;
    for (size_t i = 0; i < ys.size(); ++i)
      s += ys[i] * ddy[i];
    return s;
  };
  std::vector<size_t> all(static_cast<size_t>(n)),
      allW(static_cast<size_t>(d));
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  for (size_t i = 0; i < allW.size(); ++i)
    allW[i] = i;
  DVec dq = toDouble(wq), dk = toDouble(wk), dxs = toDouble(x);
  expectClose(dx,
              finiteDifferences([&](const DVec &xs) { return loss(xs, dq, dk); },
                                dxs, all),
              1e-5, "qkNormGrad dx");
  DVec fq = finiteDifferences([&](const DVec &q) { return loss(dxs, q, dk); },
                              dq, allW);
  DVec fk = finiteDifferences([&](const DVec &k) { return loss(dxs, dq, k); },
                              dk, allW);
  for (int64_t j = 0; j < d; ++j) {
    fq[size_t(j)] += dwq0[size_t(j)];
    fk[size_t(j)] += dwk0[size_t(j)];
  }
  expectClose(dwq, fq, 1e-5, "qkNormGrad dwq");
  expectClose(dwk, fk, 1e-5, "qkNormGrad dwk");
}

TEST_F(TransformerKernelsTest, RMSNormGradVsFiniteDifferences) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 4}, {5, 7}, {4, 33}}) {
    const double eps = 1e-3;
    auto x = random(size_t(rows * cols)), g = random(static_cast<size_t>(cols)),
         w = random(size_t(rows * cols)), dr = random(size_t(rows * cols));
    // loss = sum(Y * W), so dY = W.
    auto loss = [&](const DVec &xx, const DVec &gg) {
      return dot(refRMSNorm(xx, gg, rows, cols, eps), w);
    };
    DVec xd = toDouble(x), gd = toDouble(g);
    DVec fdx = finiteDifferences([&](const DVec &v) { return loss(v, gd); }, xd,
                                 allIndices(x.size()));
    DVec fdg = finiteDifferences([&](const DVec &v) { return loss(xd, v); }, gd,
                                 allIndices(g.size()));
    Vec dg0 = random(static_cast<size_t>(cols));
    for (float beta : {0.0f, 1.0f}) {
      // Without dR (nn.rms_norm_grad), and with it (the fused form: dX plus
      // the residual's gradient).
      for (bool withResidual : {false, true}) {
        Vec dx(x.size()), dg = dg0;
        ASSERT_TRUE(backend
                        ->rmsNormGrad(x.data(), g.data(), w.data(),
                                      withResidual ? dr.data() : nullptr,
                                      dx.data(), dg.data(), rows, cols,
                                      float(eps), beta)
                        .ok());
        DVec refx = fdx, refg = fdg;
        for (size_t i = 0; withResidual && i < x.size(); ++i)
          refx[i] += dr[i];
        for (size_t j = 0; j < size_t(cols); ++j)
          refg[j] += beta * dg0[j];
        std::string shape = std::to_string(rows) + "x" + std::to_string(cols) +
                            " beta " + std::to_string(beta) +
                            (withResidual ? " with dR" : "");
        expectClose(dx, refx, 1e-4, "dX " + shape);
        expectClose(dg, refg, 1e-4, "dgamma " + shape);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Rotary position embeddings
//===----------------------------------------------------------------------===//

/// RoPE of a fused QKV [seq, batch, heads * 3 * d] in double: rotate-half
/// over the first rot features of each q and k at positions pos0 + row.
DVec refRotary(const DVec &x, int64_t seq, int64_t batch, int64_t heads,
               int64_t d, int64_t rot, double base, int64_t pos0, double sign,
               double factor = 0) {
  DVec y = x;
  const int64_t f = heads * 3 * d, half = rot / 2;
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t w = 0; w < 2; ++w)
          for (int64_t i = 0; i < half; ++i) {
            double freq = std::pow(base, -2.0 * i / rot);
            if (factor != 0) {
              // Llama 3.1 (Hugging Face's _compute_llama3_parameters).
              double wavelen = 2 * M_PI / freq;
              if (wavelen > 8192)
                freq /= factor;
              else if (wavelen >= 2048) {
                double smooth = (8192 / wavelen - 1) / 3;
                freq = (1 - smooth) * freq / factor + smooth * freq;
              }
            }
            double a = double(pos0 + s) * freq;
            size_t o = size_t((s * batch + b) * f + h * 3 * d + w * d + i);
            double x1 = x[o], x2 = x[o + size_t(half)];
            y[o] = x1 * std::cos(a) - sign * x2 * std::sin(a);
            y[o + size_t(half)] = x2 * std::cos(a) + sign * x1 * std::sin(a);
          }
  return y;
}

TEST_F(TransformerKernelsTest, RotaryEmbeddingMatchesReference) {
  struct Case {
    int64_t seq, batch, heads, d, rot, pos0;
    float base, factor;
  };
  // The last two with Llama 3.1's scaling: at head dim 16 and base 1e4 the
  // wavelengths run from 2 pi to 2.0e4, so pairs fall in each of its three
  // bands (kept, interpolated, divided by the factor).
  for (Case c : {Case{5, 2, 2, 8, 8, 0, 10000.0f, 0.0f},
                 Case{7, 3, 4, 16, 8, 61, 500000.0f, 0.0f},
                 Case{3, 1, 1, 4, 2, 1000, 10000.0f, 0.0f},
                 Case{6, 2, 2, 16, 16, 3000, 10000.0f, 8.0f},
                 Case{4, 1, 1, 32, 32, 100, 500000.0f, 32.0f}}) {
    const int64_t n = c.seq * c.batch * c.heads * 3 * c.d;
    auto x = random(size_t(n));
    std::string shape = std::to_string(c.seq) + "x" + std::to_string(c.batch) +
                        " heads " + std::to_string(c.heads) + " d " +
                        std::to_string(c.d) + " rot " + std::to_string(c.rot) +
                        " from " + std::to_string(c.pos0) + " scaling " +
                        std::to_string(c.factor);
    for (bool inverse : {false, true}) {
      Vec y(x.size());
      ASSERT_TRUE(backend
                      ->rotaryEmbedding(x.data(), y.data(), c.seq, c.batch,
                                        c.heads * 3 * c.d, c.heads, c.rot,
                                        c.base, c.factor, c.pos0, inverse)
                      .ok());
      // The angle is pos x inv_freq in f32 (as Megatron's): the rounding of
      // inv_freq and of the product put it up to 2 x pos x 2^-24 radians
      // off the exact one, which moves a rotated pair by as much times its
      // norm (< 1.5 here).
      expectClose(y,
                  refRotary(toDouble(x), c.seq, c.batch, c.heads, c.d, c.rot,
                            c.base, c.pos0, inverse ? -1.0 : 1.0, c.factor),
                  1e-6 + 2e-7 * double(c.pos0 + c.seq),
                  "rope " + shape + (inverse ? " inverse" : ""));
    }
    // In place, and the inverse undoes it; values and the unrotated
    // features are untouched.
    Vec y = x;
    ASSERT_TRUE(backend
                    ->rotaryEmbedding(y.data(), y.data(), c.seq, c.batch,
                                      c.heads * 3 * c.d, c.heads, c.rot,
                                      c.base, c.factor, c.pos0, false)
                    .ok());
    for (int64_t i = 0; i < n; ++i) {
      int64_t inHead = i % (3 * c.d);
      if (inHead >= 2 * c.d || inHead % c.d >= c.rot)
        ASSERT_EQ(y[size_t(i)], x[size_t(i)]) << shape << " element " << i;
    }
    ASSERT_TRUE(backend
                    ->rotaryEmbedding(y.data(), y.data(), c.seq, c.batch,
                                      c.heads * 3 * c.d, c.heads, c.rot,
                                      c.base, c.factor, c.pos0, true)
                    .ok());
    expectClose(y, toDouble(x), 1e-5, "rope then inverse " + shape);
  }
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

TEST_F(TransformerKernelsTest, EmbeddingShardsSumToUnshardedLookup) {
  const int64_t V = 10, H = 7, rows = 12;
  auto table = random(size_t(V * H));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    ids[size_t(r)] = int32_t((r * 7 + 3) % V);
  Vec y(size_t(rows * H));
  ASSERT_TRUE(
      backend->embedding(ids.data(), table.data(), y.data(), rows, V, H, 0, V)
          .ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j)
      ASSERT_EQ(y[size_t(r * H + j)], table[size_t(ids[size_t(r)] * H + j)]);
  // Two shards of Vl = 5 rows: each looks up its own ids and zeros the
  // others; the sum (the tp all-reduce) is the full lookup.
  const int64_t Vl = V / 2;
  Vec sum(y.size(), 0.0f);
  for (int shard = 0; shard < 2; ++shard) {
    Vec part(y.size(), 123.0f); // overwritten, never read
    ASSERT_TRUE(backend
                    ->embedding(ids.data(), table.data() + shard * Vl * H,
                                part.data(), rows, Vl, H, shard * Vl, V)
                    .ok());
    for (int64_t r = 0; r < rows; ++r) {
      bool mine = ids[size_t(r)] / Vl == shard;
      for (int64_t j = 0; j < H; ++j) {
        if (!mine)
          ASSERT_EQ(part[size_t(r * H + j)], 0.0f);
        sum[size_t(r * H + j)] += part[size_t(r * H + j)];
      }
    }
  }
  EXPECT_EQ(sum, y);
}

TEST_F(TransformerKernelsTest, EmbeddingRejectsOutOfRangeIds) {
  const int64_t V = 257, H = 3, rows = 20;
  Vec table(size_t(V * H)), y(size_t(rows * H));
  std::vector<int32_t> ids(size_t(rows), 5);
  ids[17] = 300;
  Status st =
      backend->embedding(ids.data(), table.data(), y.data(), rows, V, H, 0, V);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  EXPECT_NE(st.message().find("vocabulary id 300 at row 17 is out of range "
                              "for vocabulary size 257"),
            std::string::npos)
      << st.message();
  ids[17] = -1;
  st = backend->embedding(ids.data(), table.data(), y.data(), rows, V, H, 0, V);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocabulary id -1 at row 17"), std::string::npos)
      << st.message();
  // An id of another shard is not an error, an id >= vocab_size is, even
  // when it would fall into this shard's (padded) rows.
  ids[17] = 256;
  EXPECT_TRUE(
      backend->embedding(ids.data(), table.data(), y.data(), rows, 128, H, 0, V)
          .ok());
  ids[17] = 257;
  EXPECT_FALSE(
      backend->embedding(ids.data(), table.data(), y.data(), rows, 260, H, 0, V)
          .ok());
}

TEST_F(TransformerKernelsTest, EmbeddingGradScatterAddsAndAccumulates) {
  const int64_t V = 9, H = 5, rows = 14;
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    ids[size_t(r)] = int32_t((r * r + 1) % V); // repeated ids
  auto dy = random(size_t(rows * H));
  auto old = random(size_t(V * H));
  for (float beta : {0.0f, 1.0f}) {
    DVec ref(old.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ref[i] = beta * old[i];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < H; ++j)
        ref[size_t(ids[size_t(r)] * H + j)] += dy[size_t(r * H + j)];
    Vec dt = old;
    ASSERT_TRUE(backend
                    ->embeddingGrad(ids.data(), dy.data(), dt.data(), rows, V,
                                    H, 0, beta)
                    .ok());
    expectClose(dt, ref, 1e-6, "unsharded beta " + std::to_string(beta));
    // Shards [0, 4) and [4, 8) + padding row 8 (a shard of 5 rows holding
    // ids 4..8): concatenated they equal the unsharded gradient.
    const int64_t Vl = 5;
    Vec padded(size_t(2 * Vl * H), 0.0f);
    std::copy(old.begin(), old.end(), padded.begin());
    Vec shards = padded;
    for (int shard = 0; shard < 2; ++shard)
      ASSERT_TRUE(backend
                      ->embeddingGrad(ids.data(), dy.data(),
                                      shards.data() + shard * Vl * H, rows, Vl,
                                      H, shard * Vl, beta)
                      .ok());
    shards.resize(size_t(V * H));
    expectClose(shards, ref, 1e-6, "sharded beta " + std::to_string(beta));
  }
}

TEST_F(TransformerKernelsTest, PositionEmbeddingAndGrad) {
  for (auto [S, B, H, P] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 3, 1},
        {1, 3, 5, 4},
        {6, 2, 7, 9}}) {
    auto x = random(size_t(S * B * H)), pos = random(size_t(P * H));
    Vec y(x.size());
    ASSERT_TRUE(
        backend->addPositionEmbedding(x.data(), pos.data(), y.data(), S, B, H)
            .ok());
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j)
          ASSERT_EQ(y[size_t((s * B + b) * H + j)],
                    x[size_t((s * B + b) * H + j)] + pos[size_t(s * H + j)]);
    // In place (Y aliases X).
    Vec inplace = x;
    ASSERT_TRUE(backend
                    ->addPositionEmbedding(inplace.data(), pos.data(),
                                           inplace.data(), S, B, H)
                    .ok());
    EXPECT_EQ(inplace, y);
    auto dy = random(x.size());
    auto old = random(pos.size());
    for (float beta : {0.0f, 1.0f}) {
      DVec ref(pos.size());
      for (size_t i = 0; i < ref.size(); ++i)
        ref[i] = beta * old[i]; // rows s >= S keep beta * dP
      for (int64_t s = 0; s < S; ++s)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < H; ++j)
            ref[size_t(s * H + j)] += dy[size_t((s * B + b) * H + j)];
      Vec dp = old;
      ASSERT_TRUE(
          backend->positionEmbeddingGrad(dy.data(), dp.data(), S, B, H, P, beta)
              .ok());
      expectClose(dp, ref, 1e-6, "dP beta " + std::to_string(beta));
    }
  }
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

namespace {
struct AttnShape {
  int64_t S, B, A, D;
};
const AttnShape kAttnShapes[] = {{1, 1, 1, 4},  {1, 3, 2, 3},  {5, 2, 3, 7},
                                 {9, 3, 1, 16}, {70, 2, 2, 5}, {130, 1, 1, 3}};
} // namespace

TEST_F(TransformerKernelsTest, AttentionMatchesReference) {
  for (const AttnShape &sh : kAttnShapes)
    for (bool causal : {true, false}) {
      auto qkv = random(size_t(sh.S * sh.B * sh.A * 3 * sh.D), 1.5f);
      Vec o(size_t(sh.S * sh.B * sh.A * sh.D), 99.0f);
      ASSERT_TRUE(
          backend
              ->attention(qkv.data(), o.data(), sh.S, sh.B, sh.A, sh.D, causal)
              .ok());
      expectClose(
          o, refAttention(toDouble(qkv), sh.S, sh.B, sh.A, sh.D, causal), 2e-5,
          "S=" + std::to_string(sh.S) + " B=" + std::to_string(sh.B) +
              " A=" + std::to_string(sh.A) + " D=" + std::to_string(sh.D) +
              " causal=" + std::to_string(causal));
    }
}

TEST_F(TransformerKernelsTest, AttentionCausalMaskIgnoresTheFuture) {
  const int64_t S = 6, B = 2, A = 2, D = 3;
  auto qkv = random(size_t(S * B * A * 3 * D));
  Vec o(size_t(S * B * A * D)), o2 = o;
  ASSERT_TRUE(backend->attention(qkv.data(), o.data(), S, B, A, D, true).ok());
  auto changed = qkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < A * 3 * D; ++f)
      changed[size_t(((S - 1) * B + b) * A * 3 * D + f)] += 5.0f;
  ASSERT_TRUE(
      backend->attention(changed.data(), o2.data(), S, B, A, D, true).ok());
  for (size_t i = 0; i < size_t((S - 1) * B * A * D); ++i)
    ASSERT_EQ(o[i], o2[i]) << "position " << i / size_t(B * A * D);
}

TEST_F(TransformerKernelsTest, AttentionGradVsFiniteDifferences) {
  for (const AttnShape &sh : kAttnShapes)
    for (bool causal : {true, false}) {
      size_t n = size_t(sh.S * sh.B * sh.A * 3 * sh.D);
      auto qkv = random(n);
      auto w = random(size_t(sh.S * sh.B * sh.A * sh.D));
      Vec dqkv(n, 77.0f);
      ASSERT_TRUE(backend
                      ->attentionGrad(qkv.data(), w.data(), dqkv.data(), sh.S,
                                      sh.B, sh.A, sh.D, causal)
                      .ok());
      // Checks all elements of the small shapes, 150 of the large ones.
      std::vector<size_t> which = allIndices(n);
      if (n > 400) {
        std::shuffle(which.begin(), which.end(), gen);
        which.resize(150);
      }
      DVec fd = finiteDifferences(
          [&](const DVec &v) {
            return dot(refAttention(v, sh.S, sh.B, sh.A, sh.D, causal), w);
          },
          toDouble(qkv), which);
      std::string what =
          "S=" + std::to_string(sh.S) + " B=" + std::to_string(sh.B) +
          " A=" + std::to_string(sh.A) + " D=" + std::to_string(sh.D) +
          " causal=" + std::to_string(causal);
      for (size_t i : which)
        ASSERT_NEAR(dqkv[i], fd[i], 2e-4 * (1 + std::fabs(fd[i])))
            << what << " element " << i;
    }
}

//===----------------------------------------------------------------------===//
// Vocabulary-parallel cross-entropy and token mean
//===----------------------------------------------------------------------===//

namespace {
/// Runs LogitsMax, CrossEntropyStats, CrossEntropyFromStats and TokenMean
/// (and the backward) on `shards` column blocks of Z, combining the per-shard
/// m (max), se and pl (sum) as the tp all-reduces would. Returns the loss;
/// dz gets the concatenated gradient of the loss.
float shardedCE(Backend &be, const Vec &z, const std::vector<int32_t> &t,
                int64_t rows, int64_t cols, int shards, int64_t ignore, Vec &dz,
                Status &status) {
  const int64_t Vl = cols / shards;
  std::vector<Vec> zs(static_cast<size_t>(shards));
  for (int s = 0; s < shards; ++s) {
    zs[size_t(s)].resize(size_t(rows * Vl));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < Vl; ++j)
        zs[size_t(s)][size_t(r * Vl + j)] = z[size_t(r * cols + s * Vl + j)];
  }
  Vec m(size_t(rows), -INFINITY), se(size_t(rows), 0.0f),
      pl(size_t(rows), 0.0f), l(static_cast<size_t>(rows)),
      part(static_cast<size_t>(rows)), se1(static_cast<size_t>(rows)),
      pl1(static_cast<size_t>(rows));
  auto check = [&](Status st) {
    if (status.ok() && !st.ok())
      status = st;
  };
  for (int s = 0; s < shards; ++s) {
    check(be.logitsMax(zs[size_t(s)].data(), part.data(), rows, Vl));
    for (int64_t r = 0; r < rows; ++r)
      m[size_t(r)] = std::max(m[size_t(r)], part[size_t(r)]);
  }
  for (int s = 0; s < shards; ++s) {
    check(be.crossEntropyStats(zs[size_t(s)].data(), t.data(), m.data(),
                               se1.data(), pl1.data(), rows, Vl, s * Vl, cols,
                               ignore));
    for (int64_t r = 0; r < rows; ++r) {
      se[size_t(r)] += se1[size_t(r)];
      pl[size_t(r)] += pl1[size_t(r)];
    }
  }
  check(be.crossEntropyFromStats(se.data(), pl.data(), m.data(), t.data(),
                                 l.data(), rows, ignore));
  float loss = 0.0f, dloss = 1.0f;
  check(be.tokenMean(l.data(), t.data(), &loss, rows, ignore, nullptr));
  Vec dl(static_cast<size_t>(rows));
  check(be.tokenMeanGrad(&dloss, t.data(), dl.data(), rows, ignore, nullptr));
  dz.assign(size_t(rows * cols), 0.0f);
  Vec dzs(size_t(rows * Vl));
  for (int s = 0; s < shards; ++s) {
    check(be.crossEntropyStatsGrad(zs[size_t(s)].data(), t.data(), m.data(),
                                   se.data(), dl.data(), dzs.data(), rows, Vl,
                                   s * Vl, cols, ignore));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < Vl; ++j)
        dz[size_t(r * cols + s * Vl + j)] = dzs[size_t(r * Vl + j)];
  }
  return loss;
}
} // namespace

TEST_F(TransformerKernelsTest, CrossEntropyStatsMatchReferenceAndShard) {
  const int64_t rows = 7, cols = 12, ignore = -100;
  auto z = random(size_t(rows * cols), 3.0f);
  z[5] = 60.0f; // large logit: the global max keeps exp finite
  std::vector<int32_t> t = {3, 0, 11, -100, 6, 5, 7};
  DVec zd = toDouble(z);
  double ref = refTokenMeanCE(zd, t, rows, cols, ignore);
  DVec fd = finiteDifferences(
      [&](const DVec &v) { return refTokenMeanCE(v, t, rows, cols, ignore); },
      zd, allIndices(z.size()), 1e-4);
  Vec dz1, dz2, dz3;
  Status st;
  float l1 = shardedCE(*backend, z, t, rows, cols, 1, ignore, dz1, st);
  float l2 = shardedCE(*backend, z, t, rows, cols, 2, ignore, dz2, st);
  float l3 = shardedCE(*backend, z, t, rows, cols, 3, ignore, dz3, st);
  ASSERT_TRUE(st.ok()) << st.toString();
  EXPECT_NEAR(l1, ref, 1e-5 * (1 + ref));
  EXPECT_NEAR(l2, l1, 1e-5 * (1 + ref));
  EXPECT_NEAR(l3, l1, 1e-5 * (1 + ref));
  expectClose(dz1, fd, 1e-4, "dZ unsharded");
  expectClose(dz2, toDouble(dz1), 1e-6, "dZ two shards");
  expectClose(dz3, toDouble(dz1), 1e-6, "dZ three shards");
  // The ignored row has no loss and no gradient.
  for (int64_t j = 0; j < cols; ++j)
    EXPECT_EQ(dz2[size_t(3 * cols + j)], 0.0f);
  // Same as the old single-kernel CrossEntropy when nothing is ignored.
  std::vector<int32_t> all = {3, 0, 11, 1, 6, 5, 7};
  Vec lossOld(static_cast<size_t>(rows));
  ASSERT_TRUE(
      backend->crossEntropy(z.data(), all.data(), lossOld.data(), rows, cols)
          .ok());
  double meanOld = 0;
  for (float v : lossOld)
    meanOld += v / double(rows);
  Vec dzAll;
  float lAll = shardedCE(*backend, z, all, rows, cols, 2, ignore, dzAll, st);
  ASSERT_TRUE(st.ok());
  EXPECT_NEAR(lAll, meanOld, 1e-5 * (1 + meanOld));
}

TEST_F(TransformerKernelsTest, CrossEntropyStatsHandleIgnoreIndexAndLabels) {
  const int64_t rows = 3, cols = 4;
  auto z = random(size_t(rows * cols));
  Vec m(static_cast<size_t>(rows)), se(static_cast<size_t>(rows)),
      pl(size_t(rows), 5.0f), l(static_cast<size_t>(rows));
  ASSERT_TRUE(backend->logitsMax(z.data(), m.data(), rows, cols).ok());
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(m[size_t(r)], *std::max_element(z.begin() + r * cols,
                                              z.begin() + (r + 1) * cols));
  // A non-default ignore_index, labels of another shard (pl = 0).
  std::vector<int32_t> t = {7, 1, 6};
  ASSERT_TRUE(backend
                  ->crossEntropyStats(z.data(), t.data(), m.data(), se.data(),
                                      pl.data(), rows, cols, 4, 8, 1)
                  .ok());
  EXPECT_EQ(pl[0], z[size_t(0 * cols + 3)]);
  EXPECT_EQ(pl[1], 0.0f); // ignored
  EXPECT_EQ(pl[2], z[size_t(2 * cols + 2)]);
  ASSERT_TRUE(backend
                  ->crossEntropyFromStats(se.data(), pl.data(), m.data(),
                                          t.data(), l.data(), rows, 1)
                  .ok());
  EXPECT_EQ(l[1], 0.0f);
  // Labels outside [0, classes) that are not ignore_index are errors.
  std::vector<int32_t> bad = {7, 8, 6};
  Status st =
      backend->crossEntropyStats(z.data(), bad.data(), m.data(), se.data(),
                                 pl.data(), rows, cols, 4, 8, -100);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("label 8 at row 1"), std::string::npos)
      << st.message();
  // Token mean over no valid row is 0 with a zero gradient.
  std::vector<int32_t> none = {-100, -100, -100};
  float y = 3.0f, dy = 1.0f;
  ASSERT_TRUE(backend->tokenMean(l.data(), none.data(), &y, rows, -100, nullptr).ok());
  EXPECT_EQ(y, 0.0f);
  Vec dl(size_t(rows), 9.0f);
  ASSERT_TRUE(
      backend->tokenMeanGrad(&dy, none.data(), dl.data(), rows, -100, nullptr).ok());
  for (float v : dl)
    EXPECT_EQ(v, 0.0f);
  std::vector<int32_t> some = {-100, 2, 3};
  Vec lv = {100.0f, 1.0f, 2.0f};
  ASSERT_TRUE(backend->tokenMean(lv.data(), some.data(), &y, rows, -100, nullptr).ok());
  EXPECT_FLOAT_EQ(y, 1.5f);
  dy = 3.0f;
  ASSERT_TRUE(
      backend->tokenMeanGrad(&dy, some.data(), dl.data(), rows, -100, nullptr).ok());
  EXPECT_EQ(dl, (Vec{0.0f, 1.5f, 1.5f}));
}

//===----------------------------------------------------------------------===//
// Through the loader and the executor
//===----------------------------------------------------------------------===//

namespace {

using K = fb::BufferKind;
using O = fb::Opcode;

InstrDesc op(O code, std::vector<RefDesc> operands, const std::string &loc,
             std::vector<int64_t> iattrs = {}, std::vector<float> fattrs = {},
             float beta = 0.0f) {
  InstrDesc in = instr(code, std::move(operands), loc);
  in.iattrs = std::move(iattrs);
  in.fattrs = std::move(fattrs);
  in.beta = beta;
  return in;
}

ArtifactDesc singleRank() {
  ArtifactDesc a;
  a.mesh = {{"tp", 1}, {"cp", 1}, {"dp", 1}};
  a.groups = {{"tp", {0}}, {"cp", {0}}, {"dp", {0}}, {"ep", {0}}};
  return a;
}

StatusOr<std::shared_ptr<const LoadedArtifact>>
load(const ArtifactDesc &desc, const std::string &name = "mem.tsr") {
  return LoadedArtifact::loadFromMemory(buildFile(buildPayload(desc)), name);
}

std::unique_ptr<Executor> makeExecutor(const ArtifactDesc &desc, int rank = 0,
                                       uint64_t seed = 1234) {
  auto loaded = load(desc);
  EXPECT_TRUE(loaded.ok()) << loaded.status().toString();
  if (!loaded.ok())
    return nullptr;
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  auto backend = BackendRegistry::global().create("cpu", {});
  ExecutorOptions options;
  options.seed = seed;
  auto ex = Executor::create(*loaded, std::move(*backend), CommunicatorSet(),
                             rank, options);
  EXPECT_TRUE(ex.ok()) << ex.status().toString();
  if (!ex.ok())
    return nullptr;
  Status st = (*ex)->initializeParameters();
  EXPECT_TRUE(st.ok()) << st.toString();
  return std::move(*ex);
}

/// A program of one Embedding: ids [S, B] -> Y [S, B, H] from T [Vl, H].
ArtifactDesc embeddingProgram(int64_t S, int64_t B, int64_t Vl, int64_t H,
                              int64_t vocab, const std::string &group = "") {
  ArtifactDesc a = singleRank();
  ProgramDesc p;
  int t = p.add("wte", K::Param, {Vl, H}, fb::DType::F32, fb::InitKind::Normal,
                1.0f);
  int ids = p.add("tokens", K::Input, {S, B}, fb::DType::I32);
  int y = p.add("y", K::Input, {S, B, H});
  InstrDesc e =
      op(O::Embedding, {p.ref(ids), p.ref(t), p.ref(y)}, "gpt.wte", {vocab});
  e.group = group;
  p.function("microbatch").push_back(e);
  a.programs.push_back(p);
  return a;
}

} // namespace

TEST(TransformerExecutorTest, OutOfRangeTokenIdFailsWithLocAndRow) {
  auto ex = embeddingProgram(10, 2, 257, 4, 257);
  auto e = makeExecutor(ex);
  ASSERT_TRUE(e);
  std::vector<int32_t> ids(20, 1);
  ids[17] = 300;
  ASSERT_TRUE(e->writeBuffer("tokens", ids.data(), 80).ok());
  Status st = e->runFunction("microbatch");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  for (const char *needle :
       {"vocabulary id 300 at row 17 is out of range for vocabulary size 257",
        "Embedding at gpt.wte", "function 'microbatch'", "mem.tsr"})
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  ids[17] = 256;
  ASSERT_TRUE(e->writeBuffer("tokens", ids.data(), 80).ok());
  EXPECT_TRUE(e->runFunction("microbatch").ok());
}

TEST(TransformerExecutorTest, VocabOffsetComesFromTheRankInItsGroup) {
  // world 2 = tp 2; the "tp" group is not a collective here, so no
  // communicator is needed; rank 1 holds ids [4, 8).
  const int64_t S = 3, B = 2, Vl = 4, H = 2;
  ArtifactDesc a = embeddingProgram(S, B, Vl, H, 7, "tp");
  a.worldSize = 2;
  a.mesh = {{"tp", 2}};
  a.groups = {{"tp", {0, 1}}};
  auto loaded = load(a);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_TRUE(Executor::validate(**loaded).ok());
  EXPECT_TRUE(collectiveGroupKinds(*(*loaded)->root()).empty());
  std::vector<int32_t> ids = {0, 3, 4, 6, 5, 1};
  for (int rank : {0, 1}) {
    auto ex = Executor::create(
        *loaded, std::move(*BackendRegistry::global().create("cpu", {})),
        CommunicatorSet(), rank);
    ASSERT_TRUE(ex.ok()) << ex.status().toString();
    Vec table(size_t(Vl * H));
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = float(100 * rank + int(i));
    ASSERT_TRUE((*ex)->writeBuffer("wte", table.data(), 4 * Vl * H).ok());
    ASSERT_TRUE((*ex)->writeBuffer("tokens", ids.data(), 4 * S * B).ok());
    ASSERT_TRUE((*ex)->runFunction("microbatch").ok());
    Vec y = *(*ex)->readFloatBuffer("y");
    for (size_t r = 0; r < ids.size(); ++r) {
      int64_t local = ids[r] - rank * Vl;
      for (int64_t j = 0; j < H; ++j)
        EXPECT_EQ(y[r * size_t(H) + size_t(j)],
                  local >= 0 && local < Vl ? table[size_t(local * H + j)]
                                           : 0.0f)
            << "rank " << rank << " row " << r;
    }
  }
  // vocab_size 9 > 2 shards x 4 rows.
  ArtifactDesc big = a;
  big.programs[0].function("microbatch")[0].iattrs = {9};
  auto bigLoaded = load(big);
  ASSERT_TRUE(bigLoaded.ok());
  Status st = Executor::validate(**bigLoaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocab_size 9 exceeds"), std::string::npos)
      << st.message();
}

TEST(TransformerExecutorTest, LoaderAndDecoderRejectBadInstructions) {
  struct Case {
    std::function<void(ProgramDesc &, std::vector<InstrDesc> &)> build;
    const char *needle;
    bool atLoad; // rejected by the loader (else by Executor::validate)
  };
  auto f32 = [](ProgramDesc &p, std::vector<int64_t> shape) {
    return p.scratch(std::move(shape));
  };
  auto i32 = [](ProgramDesc &p, std::vector<int64_t> shape) {
    return p.scratch(std::move(shape), fb::DType::I32);
  };
  // RingAttention [QKV, W, O, LSE] of `seq` rows, 2 heads of 6 values, over
  // "cp" (unless `group` is empty).
  auto ring = [&](ProgramDesc &p, int64_t seq, int64_t workspace,
                  const char *loc, std::vector<int64_t> iattrs,
                  const char *group = "cp") {
    InstrDesc r = op(O::RingAttention,
                     {f32(p, {seq, 2, 36}), f32(p, {workspace}),
                      f32(p, {seq, 2, 12}), f32(p, {seq, 2, 2})},
                     loc, std::move(iattrs));
    r.group = group;
    return r;
  };
  std::vector<Case> cases = {
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Attention, {f32(p, {4, 2, 36}), f32(p, {4, 2, 12})},
                        "attn.bad-heads", {5, 1}));
       },
       "not divisible by 3 * num_heads (5)", false},
      // SwiGLU: [rows, 2n] in, [rows, n] out.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::SwiGLU, {f32(p, {4, 7}), f32(p, {4, 3})},
                        "swiglu.odd"));
       },
       "SwiGLU input F32[4, 7] must be [rows, 2n]", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::SwiGLUGrad,
                        {f32(p, {4, 8}), f32(p, {4, 4}), f32(p, {4, 6})},
                        "swiglu.dx"));
       },
       "must have the same number of elements", false},
      // Grouped QKV: 4 heads in 2 groups of head dim 2 are 16 features.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::RepeatKV, {f32(p, {3, 16}), f32(p, {3, 24})},
                        "repeat.groups", {4, 3}));
       },
       "num_heads 4 must be a positive multiple of num_query_groups 3", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::RepeatKV, {f32(p, {3, 15}), f32(p, {3, 24})},
                        "repeat.features", {4, 2}));
       },
       "grouped qkv F32[3, 15] must be [rows, 2 x (2 + 2) x head_dim]", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::RepeatKVGrad, {f32(p, {3, 20}), f32(p, {3, 16})},
                        "repeat.head-major", {4, 2}));
       },
       "head-major F32[3, 20] must be [rows, 4 x 3 x head_dim 2]", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::QKNorm,
                        {f32(p, {3, 16}), f32(p, {3}), f32(p, {2}),
                         f32(p, {3, 16})},
                        "qknorm.weight", {4, 2}, {1e-6f}));
       },
       "operand 1 F32[3] must hold head_dim = 2 weights", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::QKNorm,
                        {f32(p, {3, 16}), f32(p, {2}), f32(p, {2}),
                         f32(p, {3, 16})},
                        "qknorm.eps", {4, 2}));
       },
       "QKNorm expects 1 fattrs, got 0", true},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Attention, {f32(p, {4, 2, 36}), f32(p, {4, 2, 10})},
                        "attn.bad-out", {2, 1}));
       },
       "must be [S, B, 3 * 10]", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Attention, {f32(p, {4, 2, 36}), f32(p, {4, 2, 12})},
                        "attn.iattrs", {2}));
       },
       "Attention expects 2 iattrs, got 1", true},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(
             O::LayerNorm,
             {f32(p, {3, 2, 8}), f32(p, {7}), f32(p, {8}), f32(p, {3, 2, 8})},
             "ln.gamma", {}, {1e-5f}));
       },
       "gamma (operand 1) F32[7] must have 8 elements", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(
             op(O::LayerNorm,
                {f32(p, {3, 8}), f32(p, {8}), f32(p, {8}), f32(p, {3, 8})},
                "ln.eps"));
       },
       "LayerNorm expects 1 fattrs, got 0", true},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Embedding,
                        {i32(p, {3, 2}), f32(p, {10, 4}), f32(p, {3, 3, 4})},
                        "emb.rows", {10}));
       },
       "must have one id per row", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Embedding,
                        {f32(p, {3, 2}), f32(p, {10, 4}), f32(p, {3, 2, 4})},
                        "emb.dtype", {10}));
       },
       "Embedding operand 0 (ids) must be I32, got F32[3, 2]", true},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::Embedding,
                        {i32(p, {3, 2}), f32(p, {10, 5}), f32(p, {3, 2, 4})},
                        "emb.hidden", {10}));
       },
       "must have the same last dimension", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc e = op(O::Embedding,
                          {i32(p, {3, 2}), f32(p, {10, 4}), f32(p, {3, 2, 4})},
                          "emb.group", {10});
         e.group = "vocab";
         f.push_back(e);
       },
       "group kind 'vocab' but the artifact has no rank groups", true},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::CrossEntropyStats,
                        {f32(p, {6, 10}), i32(p, {6}), f32(p, {6}), f32(p, {5}),
                         f32(p, {6})},
                        "ce.stats", {-100}));
       },
       "se (operand 3) F32[5] must have 6 elements", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::AddPositionEmbedding,
                        {f32(p, {6, 2, 4}), f32(p, {5, 4}), f32(p, {6, 2, 4})},
                        "wpe.rows"));
       },
       "at least 6 rows", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::TokenMean, {f32(p, {6}), i32(p, {6}), f32(p, {2})},
                        "token.mean", {-100}));
       },
       "y (operand 2) F32[2] must have 1 elements", false},
      // The all-to-all reads its input while it writes its output.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         RefDesc x = f32(p, {4, 8});
         InstrDesc a = op(O::AllToAll, {x, x}, "a2a.overlap");
         a.group = "dp";
         f.push_back(a);
       },
       "all-to-all input F32[4, 8] and output overlap", false},
      // Expert parallelism.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc d = op(O::ExpertDispatch,
                          {f32(p, {8, 4}), i32(p, {4}), f32(p, {8, 4}),
                           i32(p, {4}), i32(p, {1, 4}), f32(p, {16})},
                          "experts.workspace", {4, 1});
         d.group = "ep";
         f.push_back(d);
       },
       "workspace F32[16] holds fewer than 32 elements", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc d = op(O::ExpertCombine,
                          {f32(p, {8, 4}), i32(p, {1, 4}), i32(p, {3}),
                           f32(p, {8, 4}), f32(p, {32})},
                          "experts.counts", {4, 1});
         d.group = "ep";
         f.push_back(d);
       },
       "must hold one count per expert", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc d = op(O::ExpertCombine,
                          {f32(p, {8, 4}), i32(p, {1, 4}), i32(p, {4}),
                           f32(p, {8, 4}), f32(p, {64})},
                          "experts.etp", {4, 2});
         d.group = "ep";
         f.push_back(d);
       },
       "etp 2 does not divide the 1 ranks of group 'ep'", false},
      // bf16 rows (bf16 activations) move in one dtype throughout.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc d = op(O::ExpertDispatch,
                          {p.scratch({8, 4}, fb::DType::BF16), i32(p, {4}),
                           f32(p, {8, 4}), i32(p, {4}), i32(p, {1, 4}),
                           f32(p, {32})},
                          "experts.dtype", {4, 1});
         d.group = "ep";
         f.push_back(d);
       },
       "ExpertDispatch operands rows BF16[8, 4] and R F32[8, 4] must be both "
       "F32 or both BF16",
       true},
      // The load-balancing loss over split tokens takes one count per
      // expert.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::MoEAuxLossOver,
                        {f32(p, {4, 3}), i32(p, {4, 2}), f32(p, {2}),
                         f32(p, {})},
                        "aux.over", {}, {0.01f}));
       },
       "counts F32[2] must hold one for each of 3 experts", false},
      // Context parallelism.
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(op(O::TokenMeanOver,
                        {f32(p, {6}), i32(p, {6}), f32(p, {2}), f32(p, {})},
                        "token.mean.over", {-100}));
       },
       "n (operand 2) F32[2] must have 1 elements", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc d = op(O::Dropout, {f32(p, {4, 2, 8}), f32(p, {4, 2, 8})},
                          "dropout.group", {0}, {0.1f});
         d.group = "dp";
         f.push_back(d);
       },
       "'tp-cp', not 'dp'", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(ring(p, 4, 100, "ring.workspace", {2, 1, 0}));
       },
       "holds fewer than the 416 floats ring attention needs", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(ring(p, 3, 1000, "ring.odd", {2, 1, 0}));
       },
       "ring attention needs an even local sequence", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         InstrDesc r = op(O::RingAttentionGrad,
                          {f32(p, {4, 2, 36}), f32(p, {4, 2, 12}),
                           f32(p, {4, 2, 3}), f32(p, {4, 2, 12}),
                           f32(p, {1000}), f32(p, {4, 2, 36})},
                          "ring.lse", {2, 1, 0});
         r.group = "cp";
         f.push_back(r);
       },
       "LSE F32[4, 2, 3] must be [4, 2, 2]", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(ring(p, 4, 1000, "ring.kvformat", {2, 1, 3}));
       },
       "kv_format 3 is not a float format (0 F32, 1 BF16, 2 F16)", false},
      {[&](ProgramDesc &p, std::vector<InstrDesc> &f) {
         f.push_back(ring(p, 4, 1000, "ring.nogroup", {2, 1, 0}, ""));
       },
       "collective RingAttention without a group", true},
  };
  for (const Case &c : cases) {
    ArtifactDesc a = singleRank();
    ProgramDesc p;
    std::vector<InstrDesc> fn;
    c.build(p, fn);
    p.function("microbatch") = fn;
    a.programs.push_back(p);
    std::string loc = fn[0].loc;
    auto loaded = load(a);
    Status st = loaded.ok() ? Executor::validate(**loaded) : loaded.status();
    ASSERT_FALSE(st.ok()) << loc;
    EXPECT_EQ(!loaded.ok(), c.atLoad) << loc << ": " << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos)
        << loc << ": " << st.message();
    EXPECT_NE(st.message().find(loc), std::string::npos) << st.message();
  }
}

//===----------------------------------------------------------------------===//
// A one-layer transformer language model
//===----------------------------------------------------------------------===//

namespace {

constexpr int64_t kS = 6, kB = 2, kH = 8, kA = 2, kV = 11, kP = 8;
constexpr int64_t kIgnore = -100;

/// Embedding + learned positions, pre-LN attention block with residual,
/// final LayerNorm and an LM head tied to the embedding, vocab-parallel
/// cross-entropy (over a one-rank "tp" group) averaged over tokens, trained
/// with Adam.
ArtifactDesc tinyTransformer(float lr) {
  ArtifactDesc a = singleRank();
  a.lr = lr;
  ProgramDesc p;
  const auto N = fb::InitKind::Normal;
  const auto F = fb::DType::F32;
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    fb::InitKind init;
    float scale;
  };
  std::vector<Param> params = {{"wte", {kV, kH}, N, 0.2f},
                               {"wpe", {kP, kH}, N, 0.1f},
                               {"ln1.g", {kH}, fb::InitKind::Ones, 0},
                               {"ln1.b", {kH}, fb::InitKind::Zeros, 0},
                               {"qkv.w", {kH, 3 * kH}, N, 0.3f},
                               {"proj.w", {kH, kH}, N, 0.3f},
                               {"ln2.g", {kH}, fb::InitKind::Ones, 0},
                               {"ln2.b", {kH}, fb::InitKind::Zeros, 0}};
  std::map<std::string, int> P, G;
  std::vector<std::tuple<int, int, int, int>> adam;
  for (const Param &q : params)
    P[q.name] = p.add(q.name, K::Param, q.shape, F, q.init, q.scale);
  for (const Param &q : params)
    G[q.name] = p.add("grad:" + q.name, K::Grad, q.shape, F,
                      fb::InitKind::Zeros, 0.0f, P[q.name]);
  for (const Param &q : params) {
    int m = p.add("adam.m:" + q.name, K::OptState, q.shape, F,
                  fb::InitKind::Zeros, 0.0f, P[q.name]);
    int v = p.add("adam.v:" + q.name, K::OptState, q.shape, F,
                  fb::InitKind::Zeros, 0.0f, P[q.name]);
    adam.push_back({P[q.name], G[q.name], m, v});
  }
  int it = p.add("iteration", K::Iteration, {}, fb::DType::I64);
  int loss = p.add("loss", K::Loss, {});
  int tokens = p.add("tokens", K::Input, {kS, kB}, fb::DType::I32);
  int labels = p.add("labels", K::Input, {kS, kB}, fb::DType::I32);
  p.lossBuffer = loss;
  p.iterationBuffer = it;
  // No InputSpecs: the test writes the token buffers itself.
  auto r = [&](const std::string &name) { return p.ref(P[name]); };
  auto g = [&](const std::string &name) { return p.ref(G[name]); };
  RefDesc ids = p.ref(tokens), tgt = p.ref(labels);
  RefDesc e = p.scratch({kS, kB, kH}), x0 = p.scratch({kS, kB, kH}),
          h1 = p.scratch({kS, kB, kH}), qkv = p.scratch({kS, kB, 3 * kH}),
          ctx = p.scratch({kS, kB, kH}), att = p.scratch({kS, kB, kH}),
          x1 = p.scratch({kS, kB, kH}), h2 = p.scratch({kS, kB, kH}),
          z = p.scratch({kS, kB, kV}), m = p.scratch({kS, kB}),
          se = p.scratch({kS, kB}), pl = p.scratch({kS, kB}),
          l = p.scratch({kS, kB}), dloss = p.scratch({}),
          dl = p.scratch({kS, kB}), dz = p.scratch({kS, kB, kV}),
          dh2 = p.scratch({kS, kB, kH}), dx1 = p.scratch({kS, kB, kH}),
          dctx = p.scratch({kS, kB, kH}), dqkv = p.scratch({kS, kB, 3 * kH}),
          dh1 = p.scratch({kS, kB, kH}), dx0ln = p.scratch({kS, kB, kH}),
          dx0 = p.scratch({kS, kB, kH});
  const std::vector<float> eps = {1e-5f};
  auto &f = p.function("microbatch");
  auto gemm = [&](RefDesc A, RefDesc B, RefDesc C, bool ta, bool tb, float beta,
                  const std::string &loc) {
    InstrDesc in = op(O::Gemm, {A, B, C}, loc);
    in.transA = ta;
    in.transB = tb;
    in.beta = beta;
    return in;
  };
  InstrDesc emb = op(O::Embedding, {ids, r("wte"), e}, "wte", {kV});
  emb.group = "tp";
  f.push_back(emb);
  f.push_back(op(O::AddPositionEmbedding, {e, r("wpe"), x0}, "wpe"));
  f.push_back(
      op(O::LayerNorm, {x0, r("ln1.g"), r("ln1.b"), h1}, "ln1", {}, eps));
  f.push_back(gemm(h1, r("qkv.w"), qkv, false, false, 0.0f, "qkv"));
  f.push_back(op(O::Attention, {qkv, ctx}, "attn", {kA, 1}));
  f.push_back(gemm(ctx, r("proj.w"), att, false, false, 0.0f, "proj"));
  f.push_back(op(O::Add, {x0, att, x1}, "residual"));
  f.push_back(
      op(O::LayerNorm, {x1, r("ln2.g"), r("ln2.b"), h2}, "ln2", {}, eps));
  f.push_back(gemm(h2, r("wte"), z, false, true, 0.0f, "lm_head"));
  f.push_back(op(O::LogitsMax, {z, m}, "ce.max"));
  // (an AllReduce Max / Sum over tp would follow each of these with tp > 1)
  InstrDesc stats =
      op(O::CrossEntropyStats, {z, tgt, m, se, pl}, "ce.stats", {kIgnore});
  stats.group = "tp";
  f.push_back(stats);
  f.push_back(
      op(O::CrossEntropyFromStats, {se, pl, m, tgt, l}, "ce.loss", {kIgnore}));
  f.push_back(op(O::TokenMean, {l, tgt, p.ref(loss)}, "ce.mean", {kIgnore}));
  // Backward.
  f.push_back(op(O::Fill, {dloss}, "seed", {}, {1.0f}));
  f.push_back(
      op(O::TokenMeanGrad, {dloss, tgt, dl}, "ce.mean.grad", {kIgnore}));
  InstrDesc statsGrad = op(O::CrossEntropyStatsGrad, {z, tgt, m, se, dl, dz},
                           "ce.grad", {kIgnore});
  statsGrad.group = "tp";
  f.push_back(statsGrad);
  f.push_back(gemm(dz, r("wte"), dh2, false, false, 0.0f, "lm_head.dx"));
  f.push_back(gemm(dz, h2, g("wte"), true, false, 1.0f, "lm_head.dw"));
  f.push_back(op(O::LayerNormGrad,
                 {x1, r("ln2.g"), dh2, dx1, g("ln2.g"), g("ln2.b")}, "ln2.grad",
                 {}, eps, 1.0f));
  f.push_back(gemm(dx1, r("proj.w"), dctx, false, true, 0.0f, "proj.dx"));
  f.push_back(gemm(ctx, dx1, g("proj.w"), true, false, 1.0f, "proj.dw"));
  f.push_back(op(O::AttentionGrad, {qkv, dctx, dqkv}, "attn.grad", {kA, 1}));
  f.push_back(gemm(dqkv, r("qkv.w"), dh1, false, true, 0.0f, "qkv.dx"));
  f.push_back(gemm(h1, dqkv, g("qkv.w"), true, false, 1.0f, "qkv.dw"));
  f.push_back(op(O::LayerNormGrad,
                 {x0, r("ln1.g"), dh1, dx0ln, g("ln1.g"), g("ln1.b")},
                 "ln1.grad", {}, eps, 1.0f));
  f.push_back(op(O::Add, {dx1, dx0ln, dx0}, "residual.grad"));
  f.push_back(
      op(O::PositionEmbeddingGrad, {dx0, g("wpe")}, "wpe.grad", {}, {}, 1.0f));
  InstrDesc embGrad =
      op(O::EmbeddingGrad, {ids, dx0, g("wte")}, "wte.grad", {}, {}, 1.0f);
  embGrad.group = "tp";
  f.push_back(embGrad);

  auto &step = p.function("step");
  for (auto [pp, gg, mm, vv] : adam)
    step.push_back(op(O::Adam,
                      {p.ref(pp), p.ref(gg), p.ref(mm), p.ref(vv), p.ref(it)},
                      "adam", {}, {lr, 0.9f, 0.999f, 1e-8f, 0.0f}));
  for (auto [pp, gg, mm, vv] : adam)
    step.push_back(op(O::Fill, {p.ref(gg)}, "zero-grad", {}, {0.0f}));
  a.programs.push_back(std::move(p));
  return a;
}

void writeTokens(Executor &ex) {
  // A fixed sequence per batch column; labels are the next tokens, with one
  // ignored position.
  std::vector<int32_t> tokens(size_t(kS * kB)), labels(tokens.size());
  for (int64_t s = 0; s < kS; ++s)
    for (int64_t b = 0; b < kB; ++b) {
      auto tok = [&](int64_t i) { return int32_t((3 * i + 5 * b + 1) % kV); };
      tokens[size_t(s * kB + b)] = tok(s);
      labels[size_t(s * kB + b)] = tok(s + 1);
    }
  labels[size_t(2 * kB + 1)] = int32_t(kIgnore);
  ASSERT_TRUE(
      ex.writeBuffer("tokens", tokens.data(), int64_t(tokens.size() * 4)).ok());
  ASSERT_TRUE(
      ex.writeBuffer("labels", labels.data(), int64_t(labels.size() * 4)).ok());
}

} // namespace

TEST(TransformerExecutorTest, TinyTransformerLossDecreases) {
  auto ex = makeExecutor(tinyTransformer(0.02f));
  ASSERT_TRUE(ex);
  writeTokens(*ex);
  std::vector<double> losses;
  for (int it = 1; it <= 20; ++it) {
    auto loss = ex->runIteration(it);
    ASSERT_TRUE(loss.ok()) << loss.status().toString();
    ASSERT_TRUE(std::isfinite(*loss));
    losses.push_back(*loss);
  }
  // Starts near log(V) and learns the fixed sequences.
  EXPECT_NEAR(losses[0], std::log(double(kV)), 1.0);
  std::string curve;
  for (double l : losses)
    curve += " " + std::to_string(l);
  EXPECT_LT(losses[19], 0.5 * losses[0]) << curve;
  for (int i = 1; i < 20; ++i)
    EXPECT_LT(losses[size_t(i)], losses[0]) << "iteration " << i + 1;
}

TEST(TransformerExecutorTest, TinyTransformerGradientsMatchFiniteDifferences) {
  auto ex = makeExecutor(tinyTransformer(0.0f));
  ASSERT_TRUE(ex);
  writeTokens(*ex);
  ASSERT_TRUE(ex->runFunction("microbatch").ok());
  const std::vector<std::string> names = {"wte",   "wpe",    "ln1.g", "ln1.b",
                                          "qkv.w", "proj.w", "ln2.g", "ln2.b"};
  // Read every gradient before the finite differences run the microbatch
  // again (which accumulates into the grads).
  std::map<std::string, Vec> grads;
  for (const std::string &name : names)
    grads[name] = *ex->readFloatBuffer("grad:" + name);
  std::mt19937 gen(3);
  for (const std::string &name : names) {
    const Vec &grad = grads[name];
    auto w = *ex->readFloatBuffer(name);
    auto lossAt = [&](const Vec &weights) {
      EXPECT_TRUE(
          ex->writeBuffer(name, weights.data(), int64_t(weights.size() * 4))
              .ok());
      EXPECT_TRUE(ex->runFunction("microbatch").ok());
      return double((*ex->readFloatBuffer("loss"))[0]);
    };
    for (int trial = 0; trial < 8; ++trial) {
      size_t i = size_t(gen()) % w.size();
      if (name == "wpe")
        i %= size_t(kS * kH); // rows >= S get no gradient
      auto wp = w, wm = w;
      wp[i] += 1e-2f;
      wm[i] -= 1e-2f;
      double fd = (lossAt(wp) - lossAt(wm)) / 2e-2;
      EXPECT_NEAR(grad[i], fd, 3e-3 + 2e-2 * std::fabs(fd))
          << name << " element " << i;
    }
    lossAt(w);
    // Rows of the position table past S have zero gradient.
    if (name == "wpe")
      for (size_t i = size_t(kS * kH); i < grad.size(); ++i)
        EXPECT_EQ(grad[i], 0.0f);
  }
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

TEST_F(TransformerKernelsTest, DropoutRateScaleAndDeterminism) {
  const int64_t S = 32, B = 4, H = 96;
  const float rate = 0.25f;
  std::vector<float> x(S * B * H, 1.0f), y(x.size()), y2(x.size());
  const int64_t first = 10; // samples 10..13
  ASSERT_TRUE(backend->dropout(x.data(), y.data(), S, B, H, 0, S,
                               first, 7, 3, rate).ok());
  ASSERT_TRUE(backend->dropout(x.data(), y2.data(), S, B, H, 0, S,
                               first, 7, 3, rate).ok());
  EXPECT_EQ(y, y2) << "masks must depend on position and seed only";
  int64_t dropped = 0;
  for (float v : y) {
    if (v == 0.0f)
      ++dropped;
    else
      EXPECT_FLOAT_EQ(v, 1.0f / (1.0f - rate));
  }
  double fraction = double(dropped) / double(y.size());
  EXPECT_NEAR(fraction, rate, 0.02);
  // Another stream or seed gives another mask.
  ASSERT_TRUE(backend->dropout(x.data(), y2.data(), S, B, H, 0, S,
                               first, 7, 4, rate).ok());
  EXPECT_NE(y, y2);
  EXPECT_FALSE(backend->dropout(x.data(), y2.data(), S, B, H, 0, S,
                                first, 7, 3, 1.0f).ok());
}

TEST_F(TransformerKernelsTest, DropoutShardsMatchTheFullSequence) {
  // Two sequence shards with their offsets drop exactly what the full
  // sequence drops (sequence parallelism), and the batch split over data
  // parallel ranks too (masks follow the global sample index).
  const int64_t S = 16, B = 4, H = 8;
  std::vector<float> x(S * B * H);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(i % 13) - 6.0f;
  const int64_t first = 100; // samples 100..103
  std::vector<float> full(x.size());
  ASSERT_TRUE(backend->dropout(x.data(), full.data(), S, B, H, 0, S,
                               first, 1, 0, 0.5f).ok());
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<float> part(x.size() / 2);
    const float *xs = x.data() + shard * (S / 2) * B * H;
    ASSERT_TRUE(backend->dropout(xs, part.data(), S / 2, B, H, shard * (S / 2),
                                 S, first, 1, 0, 0.5f).ok());
    for (size_t i = 0; i < part.size(); ++i)
      EXPECT_EQ(part[i], full[shard * part.size() + i]);
  }
  // Batch columns 2..3 alone (a dp rank holding samples 102, 103).
  std::vector<float> xb(S * 2 * H), yb(S * 2 * H);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < H; ++h)
        xb[(s * 2 + b) * H + h] = x[(s * B + b + 2) * H + h];
  ASSERT_TRUE(backend->dropout(xb.data(), yb.data(), S, 2, H, 0, S,
                               first + 2, 1, 0, 0.5f).ok());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < H; ++h)
        EXPECT_EQ(yb[(s * 2 + b) * H + h], full[(s * B + b + 2) * H + h]);
}

//===----------------------------------------------------------------------===//
// Ring attention (context parallelism), its ring simulated in one process
//===----------------------------------------------------------------------===//

namespace {

/// Rows of the global [S, B, F] tensor `x` at cp rank `rank`'s positions.
Vec cpShare(const Vec &x, int64_t S, int64_t rowFloats, int64_t rank,
            int64_t cp) {
  const int64_t L = S / cp;
  Vec out(size_t(L * rowFloats));
  for (int64_t r = 0; r < L; ++r) {
    int64_t g = tessera::rt::math::cpGlobalPosition(r, L, rank, cp);
    std::copy_n(x.begin() + g * rowFloats, rowFloats,
                out.begin() + r * rowFloats);
  }
  return out;
}

} // namespace

// Every cp rank's queries against every rank's K/V block, in ring order,
// give the rows of whole-sequence attention at the rank's positions; the
// backward's blocks, each accumulated by every rank, give its gradient.
TEST_F(TransformerKernelsTest, RingAttentionMatchesWholeSequenceAttention) {
  struct Shape {
    int64_t S, B, A, D, cp;
  };
  for (Shape sh : {Shape{8, 2, 2, 3, 1}, Shape{8, 1, 3, 4, 2},
                   Shape{12, 2, 1, 5, 3}, Shape{16, 2, 2, 4, 4},
                   Shape{280, 1, 1, 3, 2}})
    for (bool causal : {true, false}) {
      std::string what = "S=" + std::to_string(sh.S) +
                         " cp=" + std::to_string(sh.cp) +
                         " causal=" + std::to_string(causal);
      const int64_t F = sh.A * sh.D, n = sh.cp, L = sh.S / n;
      auto qkv = random(size_t(sh.S * sh.B * 3 * F), 1.5f);
      auto dout = random(size_t(sh.S * sh.B * F));
      Vec o(size_t(sh.S * sh.B * F)), dqkv(qkv.size());
      ASSERT_TRUE(backend
                      ->attention(qkv.data(), o.data(), sh.S, sh.B, sh.A, sh.D,
                                  causal)
                      .ok());
      ASSERT_TRUE(backend
                      ->attentionGrad(qkv.data(), dout.data(), dqkv.data(),
                                      sh.S, sh.B, sh.A, sh.D, causal)
                      .ok());
      Backend::RingAttentionDims d;
      d.seq = L;
      d.batch = sh.B;
      d.heads = sh.A;
      d.headDim = sh.D;
      d.causal = causal;
      d.cpSize = n;
      std::vector<Vec> q(n), kv(n), dkv(n), out(n), lse(n), dq(n), dO(n);
      for (int64_t r = 0; r < n; ++r) {
        q[r] = cpShare(qkv, sh.S, sh.B * 3 * F, r, n);
        dO[r] = cpShare(dout, sh.S, sh.B * F, r, n);
        kv[r].assign(size_t(d.kvBlock()), 0.0f);
        dkv[r].assign(size_t(d.kvBlock()), 0.0f);
        d.cpRank = r;
        ASSERT_TRUE(backend->ringPackKeysValues(q[r].data(), kv[r].data(), d)
                        .ok());
      }
      for (int64_t r = 0; r < n; ++r) {
        d.cpRank = r;
        out[r].assign(size_t(L * sh.B * F), 0.0f);
        lse[r].assign(size_t(d.rowStats()), 0.0f);
        Vec stats(size_t(2 * d.rowStats()));
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(backend
                          ->ringAttentionStep(q[r].data(), kv[(r - i + n) % n].data(),
                                              out[r].data(), stats.data(),
                                              i + 1 == n ? lse[r].data() : nullptr,
                                              d, (r - i + n) % n, i == 0)
                          .ok());
        Vec want = cpShare(o, sh.S, sh.B * F, r, n);
        expectClose(out[r], toDouble(want), 2e-5, what + " O rank " + std::to_string(r));
      }
      for (int64_t r = 0; r < n; ++r) {
        d.cpRank = r;
        dq[r].assign(q[r].size(), 7.0f);
        Vec delta(size_t(d.rowStats()));
        for (int64_t i = 0; i < n; ++i) {
          int64_t j = (r - i + n) % n;
          ASSERT_TRUE(backend
                          ->ringAttentionGradStep(q[r].data(), out[r].data(),
                                                  lse[r].data(), dO[r].data(),
                                                  kv[j].data(), dkv[j].data(),
                                                  delta.data(), dq[r].data(), d,
                                                  j, i == 0)
                          .ok());
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        d.cpRank = r;
        ASSERT_TRUE(
            backend->ringUnpackKeyValueGrads(dkv[r].data(), dq[r].data(), d)
                .ok());
        Vec want = cpShare(dqkv, sh.S, sh.B * 3 * F, r, n);
        expectClose(dq[r], toDouble(want), 1e-4,
                    what + " dQKV rank " + std::to_string(r));
      }
    }
}

// Each rank's two chunks hold the positions of Megatron's load-balanced
// layout; a sequence-parallel shard of them is at most two runs.
TEST(SequenceLayoutTest, LoadBalancedChunksAndTheirRuns) {
  using tessera::rt::math::cpGlobalPosition;
  using tessera::rt::math::sequencePieces;
  // S = 16, cp = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 1 and 2.
  std::vector<int64_t> rank0, rank1;
  for (int64_t x = 0; x < 8; ++x) {
    rank0.push_back(cpGlobalPosition(x, 8, 0, 2));
    rank1.push_back(cpGlobalPosition(x, 8, 1, 2));
  }
  EXPECT_EQ(rank0, (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(rank1, (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Every position is held once, over cp = 1..5.
  for (int64_t cp = 1; cp <= 5; ++cp) {
    const int64_t S = 4 * cp * 3, L = S / cp;
    std::vector<int> seen(size_t(S), 0);
    for (int64_t r = 0; r < cp; ++r)
      for (int64_t x = 0; x < L; ++x)
        ++seen[size_t(cpGlobalPosition(x, L, r, cp))];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), S) << "cp " << cp;
  }
  // Whole share: two runs (one without cp).
  auto p = sequencePieces(8, 0, 8, 1, 2);
  ASSERT_EQ(p.count, 2);
  EXPECT_EQ(p.piece[0].globalBegin, 4);
  EXPECT_EQ(p.piece[0].rows, 4);
  EXPECT_EQ(p.piece[1].localBegin, 4);
  EXPECT_EQ(p.piece[1].globalBegin, 8);
  EXPECT_EQ(p.piece[1].rows, 4);
  p = sequencePieces(8, 0, 8, 0, 1);
  ASSERT_EQ(p.count, 1);
  EXPECT_EQ(p.piece[0].rows, 8);
  // tp = 4 shards of 2 rows: shard 2 starts rank 0's second chunk.
  p = sequencePieces(2, 4, 8, 0, 2);
  ASSERT_EQ(p.count, 1);
  EXPECT_EQ(p.piece[0].globalBegin, 12);
  // tp = 3 over a share of 6 (chunks of 3): shard 1 = rows 2..3 straddles.
  p = sequencePieces(2, 2, 6, 1, 2);
  ASSERT_EQ(p.count, 2);
  EXPECT_EQ(p.piece[0].globalBegin, 3 + 2);
  EXPECT_EQ(p.piece[0].rows, 1);
  EXPECT_EQ(p.piece[1].localBegin, 1);
  EXPECT_EQ(p.piece[1].globalBegin, 6);
  EXPECT_EQ(p.piece[1].rows, 1);
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

// The router picks the k largest logits (ties to the lower expert) and
// softmaxes them; its backward is that softmax's.
TEST_F(TransformerKernelsTest, MoERouterTopKSoftmaxAndGrad) {
  const int64_t T = 5, E = 4, K = 2;
  Vec logits = random(size_t(T * E));
  // Token 0: a tie between experts 1 and 3 for the top.
  logits[0] = 0.1f, logits[1] = 2.0f, logits[2] = -1.0f, logits[3] = 2.0f;
  Vec probs(size_t(T * K));
  std::vector<int32_t> idx(size_t(T * K));
  ASSERT_TRUE(backend->moeRouter(logits.data(), probs.data(), idx.data(), T, E, K).ok());
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return logits[size_t(t * E + a)] > logits[size_t(t * E + b)];
    });
    double z = 0;
    for (int j = 0; j < K; ++j)
      z += std::exp(double(logits[size_t(t * E + order[size_t(j)])]));
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(idx[size_t(t * K + j)], order[size_t(j)]) << "token " << t;
      EXPECT_NEAR(probs[size_t(t * K + j)],
                  std::exp(double(logits[size_t(t * E + order[size_t(j)])])) / z,
                  1e-6);
    }
  }
  // Backward against finite differences of sum(w * probs), routing fixed.
  Vec w = random(size_t(T * K)), dl(size_t(T * E));
  ASSERT_TRUE(backend->moeRouterGrad(probs.data(), idx.data(), w.data(),
                                     dl.data(), T, E, K)
                  .ok());
  auto f = [&](const DVec &l) {
    double out = 0;
    for (int64_t t = 0; t < T; ++t) {
      double z = 0;
      for (int64_t j = 0; j < K; ++j)
        z += std::exp(l[size_t(t * E + idx[size_t(t * K + j)])]);
      for (int64_t j = 0; j < K; ++j)
        out += w[size_t(t * K + j)] *
               std::exp(l[size_t(t * E + idx[size_t(t * K + j)])]) / z;
    }
    return out;
  };
  expectClose(dl, finiteDifferences(f, toDouble(logits), allIndices(logits.size())),
              1e-4, "router grad");
  // An expert index out of range is an error naming it.
  idx[3] = 9;
  Status st = backend->moeRouterGrad(probs.data(), idx.data(), w.data(),
                                     dl.data(), T, E, K);
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  EXPECT_NE(st.message().find("expert index 9"), std::string::npos)
      << st.message();
}

// Megatron's switch_load_balancing_loss_func and its gradient.
TEST_F(TransformerKernelsTest, MoEAuxLossMatchesReferenceAndGrad) {
  const int64_t T = 6, E = 3, K = 2;
  const float coeff = 0.1f;
  Vec logits = random(size_t(T * E));
  std::vector<int32_t> idx = {0, 1, 2, 1, 1, 0, 2, 0, 1, 2, 0, 1};
  auto loss = [&](const DVec &l) {
    std::vector<double> counts(size_t(E), 0.0), colsum(size_t(E), 0.0);
    for (int32_t e : idx)
      counts[size_t(e)] += 1;
    for (int64_t t = 0; t < T; ++t) {
      double z = 0;
      for (int64_t e = 0; e < E; ++e)
        z += std::exp(l[size_t(t * E + e)]);
      for (int64_t e = 0; e < E; ++e)
        colsum[size_t(e)] += std::exp(l[size_t(t * E + e)]) / z;
    }
    double s = 0;
    for (int64_t e = 0; e < E; ++e)
      s += colsum[size_t(e)] * counts[size_t(e)];
    return s * coeff * E / double(K * T * T);
  };
  float y = 0;
  ASSERT_TRUE(backend->moeAuxLoss(logits.data(), idx.data(), nullptr, &y, T, E,
                                  K, coeff)
                  .ok());
  EXPECT_NEAR(y, loss(toDouble(logits)), 1e-6);
  const float dy = 0.5f;
  Vec dl(size_t(T * E));
  ASSERT_TRUE(backend->moeAuxLossGrad(logits.data(), idx.data(), nullptr, &dy,
                                      dl.data(), T, E, K, coeff)
                  .ok());
  auto half = [&](const DVec &l) { return 0.5 * loss(l); };
  expectClose(dl, finiteDifferences(half, toDouble(logits), allIndices(logits.size())),
              1e-4, "aux loss grad");

  // Tokens split over two ranks (sequence or context parallelism): each
  // half's share with the all-reduced counts; the shares add up to the
  // loss, and the gradients, taken half by half, to its gradient.
  const int64_t H = T / 2;
  Vec all(static_cast<size_t>(E), 0.0f), part(static_cast<size_t>(E));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(backend->moeTokenCounts(idx.data() + r * H * K, part.data(),
                                        H * K, E)
                    .ok());
    for (int64_t e = 0; e < E; ++e)
      all[size_t(e)] += part[size_t(e)];
  }
  EXPECT_EQ(all, (Vec{4.0f, 5.0f, 3.0f}));
  float shares = 0;
  Vec dsplit(size_t(T * E));
  for (int r = 0; r < 2; ++r) {
    float share = 0;
    ASSERT_TRUE(backend->moeAuxLoss(logits.data() + r * H * E,
                                    idx.data() + r * H * K, all.data(), &share,
                                    H, E, K, coeff)
                    .ok());
    shares += share;
    ASSERT_TRUE(backend->moeAuxLossGrad(logits.data() + r * H * E,
                                        idx.data() + r * H * K, all.data(),
                                        &dy, dsplit.data() + r * H * E, H, E,
                                        K, coeff)
                    .ok());
  }
  EXPECT_NEAR(shares, y, 1e-6);
  for (size_t i = 0; i < dl.size(); ++i)
    EXPECT_NEAR(dsplit[i], dl[i], 1e-7) << "element " << i;
  // A dropped choice (-1) counts for no expert; any other index outside
  // the experts is an error naming it.
  std::vector<int32_t> dropped = {0, -1, 2, 2};
  ASSERT_TRUE(backend->moeTokenCounts(dropped.data(), part.data(), 4, E).ok());
  EXPECT_EQ(part, (Vec{1.0f, 0.0f, 2.0f}));
  dropped[1] = 3;
  Status st = backend->moeTokenCounts(dropped.data(), part.data(), 4, E);
  EXPECT_NE(st.message().find("expert index 3"), std::string::npos)
      << st.message();
}

// Tokens permuted expert-major (token order within an expert), one GEMM
// per expert, unpermuted with the router's weights; and the backwards.
TEST_F(TransformerKernelsTest, MoEDispatchGroupedLinearCombine) {
  const int64_t T = 4, K = 2, E = 3, H = 5, F = 6;
  std::vector<int32_t> idx = {2, 0, 0, 1, 2, 1, 0, 2}; // expert 1: tokens 1, 2
  Vec x = random(size_t(T * H)), rows(size_t(T * K * H));
  std::vector<int32_t> counts(static_cast<size_t>(E));
  ASSERT_TRUE(backend->moeDispatch(x.data(), idx.data(), rows.data(),
                                   counts.data(), T, K, E, H)
                  .ok());
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 2, 3}));
  // Expert-major rows: expert 0 <- tokens 0, 1, 3; 1 <- 1, 2; 2 <- 0, 2, 3.
  const int64_t tokenOfRow[] = {0, 1, 3, 1, 2, 0, 2, 3};
  for (int64_t r = 0; r < T * K; ++r)
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(rows[size_t(r * H + h)], x[size_t(tokenOfRow[r] * H + h)])
          << "row " << r;
  // Grouped GEMM against one GEMM per expert.
  Vec w = random(size_t(E * F * H)), y(size_t(T * K * F), 9.0f);
  ASSERT_TRUE(backend->groupedLinear(FloatFormat::F32, rows.data(),
                                     counts.data(), w.data(), y.data(), T * K,
                                     H, F, E)
                  .ok());
  const int64_t expertOfRow[] = {0, 0, 0, 1, 1, 2, 2, 2};
  DVec want(y.size());
  for (int64_t r = 0; r < T * K; ++r)
    for (int64_t o = 0; o < F; ++o)
      for (int64_t i = 0; i < H; ++i)
        want[size_t(r * F + o)] += double(rows[size_t(r * H + i)]) *
                                   w[size_t((expertOfRow[r] * F + o) * H + i)];
  expectClose(y, want, 1e-5, "grouped linear");
  // Its backward: dX per expert and dW accumulated with beta 1.
  Vec dy = random(y.size()), dx(rows.size()), dw(w.size(), 1.0f);
  ASSERT_TRUE(backend->groupedLinearGrad(FloatFormat::F32, rows.data(),
                                         counts.data(), w.data(), dy.data(),
                                         dx.data(), dw.data(), T * K, H, F, E,
                                         1.0f)
                  .ok());
  DVec wantDx(dx.size()), wantDw(dw.size(), 1.0);
  for (int64_t r = 0; r < T * K; ++r)
    for (int64_t o = 0; o < F; ++o)
      for (int64_t i = 0; i < H; ++i) {
        size_t wi = size_t((expertOfRow[r] * F + o) * H + i);
        wantDx[size_t(r * H + i)] += double(dy[size_t(r * F + o)]) * w[wi];
        wantDw[wi] += double(dy[size_t(r * F + o)]) * rows[size_t(r * H + i)];
      }
  expectClose(dx, wantDx, 1e-5, "grouped linear dX");
  expectClose(dw, wantDw, 1e-5, "grouped linear dW");
  // bf16 rows, weights and dY (mixed precision's GEMMs): bit for bit the
  // f32 kernels on the exactly widened values.
  {
    auto narrow = [](const Vec &v, Vec &widened) {
      std::vector<uint16_t> h(v.size());
      floatsToBf16(v.data(), h.data(), int64_t(v.size()));
      widened.resize(v.size());
      bf16ToFloats(h.data(), widened.data(), int64_t(v.size()));
      return h;
    };
    Vec rows32, w32, dy32;
    auto rows16 = narrow(rows, rows32), w16 = narrow(w, w32),
         dy16 = narrow(dy, dy32);
    Vec y32(y.size()), y16(y.size(), 7.0f);
    ASSERT_TRUE(backend->groupedLinear(FloatFormat::F32, rows32.data(),
                                       counts.data(), w32.data(), y32.data(),
                                       T * K, H, F, E)
                    .ok());
    ASSERT_TRUE(backend->groupedLinear(FloatFormat::BF16, rows16.data(),
                                       counts.data(), w16.data(), y16.data(),
                                       T * K, H, F, E)
                    .ok());
    EXPECT_EQ(y16, y32);
    Vec dx32(dx.size()), dw32(dw.size(), 0.5f), dx16(dx.size(), 3.0f),
        dw16(dw.size(), 0.5f);
    ASSERT_TRUE(backend->groupedLinearGrad(FloatFormat::F32, rows32.data(),
                                           counts.data(), w32.data(),
                                           dy32.data(), dx32.data(),
                                           dw32.data(), T * K, H, F, E, 1.0f)
                    .ok());
    ASSERT_TRUE(backend->groupedLinearGrad(FloatFormat::BF16, rows16.data(),
                                           counts.data(), w16.data(),
                                           dy16.data(), dx16.data(),
                                           dw16.data(), T * K, H, F, E, 1.0f)
                    .ok());
    EXPECT_EQ(dx16, dx32);
    EXPECT_EQ(dw16, dw32);
  }
  // Combine: weighted sum of each token's rows; and its backward.
  Vec probs = random(size_t(T * K)), out(size_t(T * F));
  Vec expertOut = random(size_t(T * K * H));
  ASSERT_TRUE(backend->moeCombine(expertOut.data(), probs.data(), idx.data(),
                                  out.data(), T, K, E, H)
                  .ok());
  const int64_t rowOfChoice[] = {5, 0, 1, 3, 6, 4, 2, 7};
  DVec wantOut(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      for (int64_t h = 0; h < H; ++h)
        wantOut[size_t(t * H + h)] +=
            double(probs[size_t(t * K + j)]) *
            expertOut[size_t(rowOfChoice[t * K + j] * H + h)];
  out.resize(size_t(T * H));
  expectClose(out, wantOut, 1e-6, "combine");
  Vec dout = random(size_t(T * H)), drows(expertOut.size()), dprobs(probs.size());
  ASSERT_TRUE(backend->moeCombineGrad(expertOut.data(), probs.data(),
                                      idx.data(), dout.data(), drows.data(),
                                      dprobs.data(), T, K, E, H)
                  .ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      double dot = 0;
      for (int64_t h = 0; h < H; ++h) {
        size_t r = size_t(rowOfChoice[t * K + j] * H + h);
        dot += double(expertOut[r]) * dout[size_t(t * H + h)];
        EXPECT_NEAR(drows[r], probs[size_t(t * K + j)] * dout[size_t(t * H + h)], 1e-6);
      }
      EXPECT_NEAR(dprobs[size_t(t * K + j)], dot, 1e-5);
    }
  // The permutation's backward sums each token's rows.
  Vec dxTok(size_t(T * H));
  ASSERT_TRUE(backend->moeDispatchGrad(drows.data(), idx.data(), dxTok.data(),
                                       T, K, E, H)
                  .ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(dxTok[size_t(t * H + h)],
                  double(drows[size_t(rowOfChoice[t * K] * H + h)]) +
                      drows[size_t(rowOfChoice[t * K + 1] * H + h)],
                  1e-6);
  // Counts that overflow the rows are an error.
  std::vector<int32_t> bad = {5, 2, 3};
  Status st = backend->groupedLinear(FloatFormat::F32, rows.data(), bad.data(),
                                     w.data(), y.data(), T * K, H, F, E);
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  EXPECT_NE(st.message().find("add up to 10, more than the 8 rows"),
            std::string::npos)
      << st.message();
}

// Expert capacity: each expert keeps its `capacity` most probable choices
// (ties to the earlier token), or its first ones; a dropped choice has
// index -1 and probability 0, no row in the permutation, and adds nothing
// in the combine.
TEST_F(TransformerKernelsTest, MoECapacityDropsPastEachExpertsCapacity) {
  const int64_t T = 4, K = 2, E = 2, H = 3;
  // Expert 0 is chosen by tokens 0, 1, 2, 3 (probs 0.2, 0.9, 0.5, 0.9),
  // expert 1 by 0, 1, 2 and 3 too.
  std::vector<int32_t> idx = {0, 1, 0, 1, 1, 0, 1, 0};
  Vec probs = {0.2f, 0.8f, 0.9f, 0.1f, 0.5f, 0.5f, 0.6f, 0.9f};
  Vec kp(probs.size());
  std::vector<int32_t> ki(idx.size());
  ASSERT_TRUE(backend->moeCapacityDrop(probs.data(), idx.data(), kp.data(),
                                       ki.data(), T, K, E, 2, false)
                  .ok());
  // Expert 0 keeps tokens 1 and 3 (0.9 each) and drops 0 (0.2) and 2
  // (0.5); expert 1 keeps 0 (0.8) and 3 (0.6) and drops 1 (0.1) and 2 (0.5).
  EXPECT_EQ(ki, (std::vector<int32_t>{-1, 1, 0, -1, -1, -1, 1, 0}));
  EXPECT_EQ(kp[0], 0.0f);
  EXPECT_EQ(kp[1], 0.8f);
  ASSERT_TRUE(backend->moeCapacityDrop(probs.data(), idx.data(), kp.data(),
                                       ki.data(), T, K, E, 2, true)
                  .ok());
  // By position: each expert keeps tokens 0 and 1.
  EXPECT_EQ(ki, (std::vector<int32_t>{0, 1, 0, 1, -1, -1, -1, -1}));
  // Dispatch and combine skip the dropped choices; their rows are zero.
  Vec x = random(size_t(T * H)), rows(size_t(T * K * H), 5.0f);
  std::vector<int32_t> counts(static_cast<size_t>(E));
  ASSERT_TRUE(backend->moeDispatch(x.data(), ki.data(), rows.data(),
                                   counts.data(), T, K, E, H)
                  .ok());
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 2}));
  for (size_t i = size_t(4 * H); i < rows.size(); ++i)
    EXPECT_EQ(rows[i], 0.0f);
  Vec out(size_t(T * H));
  ASSERT_TRUE(backend->moeCombine(rows.data(), kp.data(), ki.data(),
                                  out.data(), T, K, E, H)
                  .ok());
  for (int64_t h = 0; h < H; ++h)
    EXPECT_EQ(out[size_t(2 * H + h)], 0.0f) << "token 2 lost both choices";
  // The backward passes the kept choices' gradient and zeroes the others'.
  Vec dkept = {1, 2, 3, 4, 5, 6, 7, 8}, dprobs(dkept.size(), 9.0f);
  ASSERT_TRUE(backend->moeCapacityDropGrad(dkept.data(), ki.data(),
                                           dprobs.data(), T * K)
                  .ok());
  EXPECT_EQ(dprobs, (Vec{1, 2, 3, 4, 0, 0, 0, 0}));
}
