//===- CudaConformanceTest.cpp - Every kernel, CUDA against CPU -----------===//
//
// Each Backend method runs on the CPU backend and on the CUDA backend with
// the same inputs; outputs must agree within 1e-5 relative in fp32 (the
// backends sum in different orders), exactly where the math is integer
// (dropout masks, copies, bf16 fills) and within a bf16 ulp for the bf16
// kernels. Needs a GPU: without one it prints why and exits 77, which ctest
// reports as Skipped (SKIP_RETURN_CODE), never as passed. Label "gpu".
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/BF16.h"
#include "tessera/rt/Backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace tessera::rt;

namespace {

std::unique_ptr<Backend> gpu, cpu;

enum class Kind { F32, I32, I64, BF16 };

/// One operand: its host bytes, element kind and whether it is compared
/// after the call.
struct Arg {
  Kind kind;
  std::vector<uint8_t> bytes;
  bool output;
};

template <typename T> Arg arg(Kind kind, const std::vector<T> &v, bool output) {
  Arg a{kind, std::vector<uint8_t>(v.size() * sizeof(T)), output};
  std::memcpy(a.bytes.data(), v.data(), a.bytes.size());
  return a;
}
Arg in(const std::vector<float> &v) { return arg(Kind::F32, v, false); }
Arg out(const std::vector<float> &v) { return arg(Kind::F32, v, true); }
Arg ids(const std::vector<int32_t> &v) { return arg(Kind::I32, v, false); }
Arg i64(const std::vector<int64_t> &v) { return arg(Kind::I64, v, false); }
Arg bf16(const std::vector<float> &v, bool output) {
  std::vector<uint16_t> h(v.size());
  floatsToBf16(v.data(), h.data(), int64_t(v.size()));
  return arg(Kind::BF16, h, output);
}

using Call = std::function<Status(Backend &, std::vector<void *> &)>;

/// Runs `call` on both backends and compares the outputs: |gpu - cpu| <=
/// tol * (1 + |cpu|) for f32, within one bf16 ulp for bf16 (exact when
/// tol == 0).
void compare(const std::string &what, std::vector<Arg> args, const Call &call,
             double tol = 1e-5) {
  SCOPED_TRACE(what);
  std::vector<Arg> host = args;
  std::vector<void *> cpuPtrs, gpuPtrs;
  for (Arg &a : host)
    cpuPtrs.push_back(a.bytes.data());
  for (Arg &a : args) {
    auto mem = gpu->allocate(int64_t(a.bytes.size()));
    ASSERT_TRUE(mem.ok()) << mem.status().toString();
    ASSERT_TRUE(
        gpu->copyToDevice(*mem, a.bytes.data(), int64_t(a.bytes.size())).ok());
    gpuPtrs.push_back(*mem);
  }
  Status cs = call(*cpu, cpuPtrs);
  ASSERT_TRUE(cs.ok()) << "cpu: " << cs.toString();
  Status gs = call(*gpu, gpuPtrs);
  if (gs.ok())
    gs = gpu->synchronize();
  ASSERT_TRUE(gs.ok()) << "cuda: " << gs.toString();
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].output)
      continue;
    std::vector<uint8_t> got(args[i].bytes.size());
    ASSERT_TRUE(
        gpu->copyToHost(got.data(), gpuPtrs[i], int64_t(got.size())).ok());
    const std::vector<uint8_t> &want = host[i].bytes;
    if (args[i].kind == Kind::F32) {
      size_t n = got.size() / 4;
      const float *g = reinterpret_cast<const float *>(got.data());
      const float *w = reinterpret_cast<const float *>(want.data());
      for (size_t j = 0; j < n; ++j) {
        if (std::isnan(w[j])) {
          ASSERT_TRUE(std::isnan(g[j])) << "operand " << i << " at " << j;
          continue;
        }
        ASSERT_NEAR(g[j], w[j], tol * (1.0 + std::fabs(w[j])))
            << "operand " << i << " at " << j;
      }
    } else if (args[i].kind == Kind::BF16) {
      size_t n = got.size() / 2;
      const uint16_t *g = reinterpret_cast<const uint16_t *>(got.data());
      const uint16_t *w = reinterpret_cast<const uint16_t *>(want.data());
      for (size_t j = 0; j < n; ++j)
        ASSERT_LE(std::abs(int(g[j]) - int(w[j])), tol == 0.0 ? 0 : 1)
            << "operand " << i << " at " << j;
    } else {
      ASSERT_EQ(got, want) << "operand " << i;
    }
  }
  for (void *p : gpuPtrs)
    gpu->deallocate(p);
}

std::mt19937 gen(17);
std::vector<float> random(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(gen);
  return v;
}
std::vector<int32_t> labels(size_t n, int32_t classes, int32_t ignore = -1,
                            int everyNth = 0) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = everyNth && i % size_t(everyNth) == 0
               ? ignore
               : int32_t(gen() % uint32_t(classes));
  return v;
}

#define F(i) static_cast<float *>(p[i])
#define I(i) static_cast<const int32_t *>(p[i])
#define H(i) static_cast<uint16_t *>(p[i])

} // namespace

TEST(CudaConformanceTest, Gemm) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f})
        for (int64_t k : {int64_t(0), int64_t(1), int64_t(37)}) {
          const int64_t m = 33, n = 65;
          compare("gemm ta=" + std::to_string(ta) + " tb=" +
                      std::to_string(tb) + " beta=" + std::to_string(beta) +
                      " k=" + std::to_string(k),
                  {in(random(size_t(m * k))), in(random(size_t(k * n))),
                   out(random(size_t(m * n)))},
                  [&](Backend &b, std::vector<void *> &p) {
                    return b.gemm(ta, tb, m, n, k, 0.75f, F(0), F(1), beta,
                                  F(2));
                  });
        }
}

TEST(CudaConformanceTest, Elementwise) {
  const int64_t rows = 129, cols = 300, n = rows * cols;
  auto x = random(size_t(n), 3.0f), y = random(size_t(n)), bias = random(cols);
  compare("biasAdd", {in(x), in(bias), out(y)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.biasAdd(F(0), F(1), F(2), rows, cols);
          });
  compare("add", {in(x), in(y), out(y)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.add(F(0), F(1), F(2), n);
          });
  for (bool tanh : {false, true}) {
    compare(tanh ? "gelu(tanh)" : "gelu", {in(x), out(y)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.gelu(F(0), F(1), n, tanh);
            });
    compare(tanh ? "geluGrad(tanh)" : "geluGrad", {in(x), in(y), out(y)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.geluGrad(F(0), F(1), F(2), n, tanh);
            });
  }
  for (bool tanh : {false, true}) {
    std::string form = tanh ? "(tanh)" : "";
    compare("biasGelu" + form, {in(x), in(bias), out(y)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.biasGelu(F(0), F(1), F(2), rows, cols, tanh);
            });
    for (float beta : {0.0f, 1.0f})
      compare("biasGeluGrad" + form + " beta=" + std::to_string(beta),
              {in(x), in(bias), in(y), out(y), out(bias)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.biasGeluGrad(F(0), F(1), F(2), F(3), F(4), rows, cols,
                                      tanh, beta);
              });
  }
  compare("relu", {in(x), out(y)}, [&](Backend &b, std::vector<void *> &p) {
    return b.relu(F(0), F(1), n);
  });
  compare("reluGrad", {in(x), in(y), out(y)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.reluGrad(F(0), F(1), F(2), n);
          });
  for (float beta : {0.0f, 1.0f})
    compare("reduceRows beta=" + std::to_string(beta),
            {in(x), out(bias)}, [&](Backend &b, std::vector<void *> &p) {
              return b.reduceRows(F(0), F(1), rows, cols, 0.5f, beta);
            });
  compare("mean", {in(x), out({0.0f})},
          [&](Backend &b, std::vector<void *> &p) {
            return b.mean(F(0), F(1), n);
          });
  compare("meanGrad", {in({2.5f}), out(y)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.meanGrad(F(0), F(1), n);
          });
  compare("fill", {out(y)}, [&](Backend &b, std::vector<void *> &p) {
    return b.fill(F(0), -1.5f, n);
  }, 0.0);
  compare("scale", {in(x), out(y)}, [&](Backend &b, std::vector<void *> &p) {
    return b.scale(F(0), F(1), 0.3f, n);
  });
  compare("axpy", {in(x), out(y)}, [&](Backend &b, std::vector<void *> &p) {
    return b.axpy(-0.7f, F(0), F(1), n);
  });
  compare("copy", {in(x), out(y)}, [&](Backend &b, std::vector<void *> &p) {
    return b.copy(p[0], p[1], n * 4);
  }, 0.0);
  compare("copy overlapping", {out(x)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.copy(F(0), F(0) + 7, (n - 7) * 4);
          }, 0.0);
  compare("sgd", {out(y), in(x)}, [&](Backend &b, std::vector<void *> &p) {
    return b.sgd(F(0), F(1), n, 0.01f, 0.1f);
  });
}

TEST(CudaConformanceTest, MixedPrecision) {
  const int64_t n = 4099;
  auto x = random(size_t(n), 10.0f), y = random(size_t(n));
  for (bool xb : {false, true})
    for (bool yb : {false, true})
      for (float beta : {0.0f, 1.0f})
        compare("cast x=" + std::to_string(xb) + " y=" + std::to_string(yb) +
                    " beta=" + std::to_string(beta),
                {xb ? bf16(x, false) : in(x), yb ? bf16(y, true) : out(y)},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.cast(p[0], xb ? FloatFormat::BF16 : FloatFormat::F32,
                                p[1], yb ? FloatFormat::BF16 : FloatFormat::F32,
                                n, beta);
                },
                0.0);
  compare("fillBf16", {bf16(y, true)}, [&](Backend &b, std::vector<void *> &p) {
    return b.fillBf16(H(0), 0.3f, n);
  }, 0.0);
  compare("scaleBf16", {bf16(x, false), bf16(y, true)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.scaleBf16(H(0), H(1), 0.125f, n);
          }, 0.0);
  compare("axpyBf16", {bf16(x, false), bf16(y, true)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.axpyBf16(-0.5f, H(0), H(1), n);
          }); // one ulp: the GPU may fuse the multiply-add before rounding
}

TEST(CudaConformanceTest, Adam) {
  const int64_t n = 10000;
  for (int64_t step : {int64_t(1), int64_t(7)}) {
    AdamParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    compare("adam step " + std::to_string(step),
            {out(random(n)), in(random(n)), out(random(n, 0.1f)),
             out(random(n, 0.0f)), i64({step})},
            [&](Backend &b, std::vector<void *> &p) {
              return b.adam(F(0), F(1), F(2), F(3), n,
                            static_cast<const int64_t *>(p[4]), hp);
            });
  }
}

TEST(CudaConformanceTest, LayerNorm) {
  for (int64_t cols : {int64_t(5), int64_t(256), int64_t(1600)}) {
    const int64_t rows = 67;
    auto x = random(size_t(rows * cols), 2.0f);
    compare("layerNorm cols=" + std::to_string(cols),
            {in(x), in(random(cols)), in(random(cols)),
             out(random(size_t(rows * cols)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.layerNorm(F(0), F(1), F(2), F(3), rows, cols, 1e-5f);
            });
    for (float beta : {0.0f, 1.0f})
      compare("layerNormGrad cols=" + std::to_string(cols),
              {in(x), in(random(cols)), in(random(size_t(rows * cols))),
               out(random(size_t(rows * cols))), out(random(cols)),
               out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.layerNormGrad(F(0), F(1), F(2), F(3), F(4), F(5), rows,
                                       cols, 1e-5f, beta);
              },
              2e-5);
    compare("addLayerNorm cols=" + std::to_string(cols),
            {in(x), in(random(size_t(rows * cols))), in(random(cols)),
             in(random(cols)), out(random(size_t(rows * cols))),
             out(random(size_t(rows * cols)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.addLayerNorm(F(0), F(1), F(2), F(3), F(4), F(5), rows,
                                    cols, 1e-5f);
            });
    for (float beta : {0.0f, 1.0f})
      compare("addLayerNormGrad cols=" + std::to_string(cols),
              {in(x), in(random(cols)), in(random(size_t(rows * cols))),
               in(random(size_t(rows * cols))),
               out(random(size_t(rows * cols))), out(random(cols)),
               out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.addLayerNormGrad(F(0), F(1), F(2), F(3), F(4), F(5),
                                          F(6), rows, cols, 1e-5f, beta);
              },
              2e-5);
  }
}

TEST(CudaConformanceTest, Embeddings) {
  const int64_t rows = 96, dim = 40, vocab = 50, localVocab = 25;
  auto t = labels(rows, int32_t(vocab));
  for (int64_t offset : {int64_t(0), int64_t(25)}) {
    compare("embedding offset " + std::to_string(offset),
            {ids(t), in(random(size_t(localVocab * dim))),
             out(random(size_t(rows * dim)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.embedding(I(0), F(1), F(2), rows, localVocab, dim,
                                 offset, vocab);
            },
            0.0);
    for (float beta : {0.0f, 1.0f})
      compare("embeddingGrad offset " + std::to_string(offset),
              {ids(t), in(random(size_t(rows * dim))),
               out(random(size_t(localVocab * dim)))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.embeddingGrad(I(0), F(1), F(2), rows, localVocab, dim,
                                       offset, beta);
              });
  }
  const int64_t seq = 12, batch = 8, posRows = 16;
  compare("addPositionEmbedding",
          {in(random(size_t(seq * batch * dim))),
           in(random(size_t(posRows * dim))),
           out(random(size_t(seq * batch * dim)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.addPositionEmbedding(F(0), F(1), F(2), seq, batch, dim);
          });
  compare("positionEmbeddingGrad",
          {in(random(size_t(seq * batch * dim))),
           out(random(size_t(posRows * dim)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.positionEmbeddingGrad(F(0), F(1), seq, batch, dim, posRows,
                                           1.0f);
          });
}

TEST(CudaConformanceTest, OutOfRangeIdIsReportedAtSynchronize) {
  const int64_t rows = 4, dim = 8, vocab = 10;
  std::vector<int32_t> t = {1, 2, 77, 3};
  auto table = random(size_t(vocab * dim));
  void *dIds = *gpu->allocate(16), *dTable = *gpu->allocate(vocab * dim * 4),
       *dOut = *gpu->allocate(rows * dim * 4);
  ASSERT_TRUE(gpu->copyToDevice(dIds, t.data(), 16).ok());
  ASSERT_TRUE(gpu->copyToDevice(dTable, table.data(), vocab * dim * 4).ok());
  // The launch succeeds; the error is the device's, at the next sync.
  ASSERT_TRUE(gpu->embedding(static_cast<const int32_t *>(dIds),
                             static_cast<const float *>(dTable),
                             static_cast<float *>(dOut), rows, vocab, dim, 0,
                             vocab)
                  .ok());
  Status st = gpu->synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  EXPECT_NE(st.message().find("vocabulary id 77 at row 2"), std::string::npos)
      << st.message();
  EXPECT_TRUE(gpu->synchronize().ok()) << "the error is reported once";
  for (void *p : {dIds, dTable, dOut})
    gpu->deallocate(p);
}

TEST(CudaConformanceTest, Attention) {
  struct Shape {
    int64_t S, B, A, D;
  };
  for (Shape s : {Shape{1, 1, 1, 4}, Shape{17, 2, 3, 8}, Shape{130, 2, 2, 64}})
    for (bool causal : {false, true}) {
      const size_t qkvN = size_t(s.S * s.B * s.A * 3 * s.D),
                   outN = size_t(s.S * s.B * s.A * s.D);
      auto qkv = random(qkvN);
      std::string what = "S=" + std::to_string(s.S) + " causal=" +
                         std::to_string(causal);
      compare("attention " + what, {in(qkv), out(random(outN))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.attention(F(0), F(1), s.S, s.B, s.A, s.D, causal);
              });
      compare("attentionGrad " + what,
              {in(qkv), in(random(outN)), out(random(qkvN))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.attentionGrad(F(0), F(1), F(2), s.S, s.B, s.A, s.D,
                                       causal);
              },
              3e-5);
    }
}

TEST(CudaConformanceTest, CrossEntropy) {
  const int64_t rows = 70, cols = 1000;
  auto z = random(size_t(rows * cols), 3.0f);
  auto t = labels(rows, int32_t(cols));
  compare("crossEntropy", {in(z), ids(t), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.crossEntropy(F(0), I(1), F(2), rows, cols);
          });
  compare("crossEntropyGrad",
          {in(z), ids(t), in(random(rows)), out(random(size_t(rows * cols)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.crossEntropyGrad(F(0), I(1), F(2), F(3), rows, cols);
          });
  compare("logitsMax", {in(z), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.logitsMax(F(0), F(1), rows, cols);
          }, 0.0);
  auto ti = labels(rows, int32_t(cols), -100, 7);
  compare("logitsStats",
          {in(z), ids(ti), out(random(rows)), out(random(rows)),
           out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.logitsStats(F(0), I(1), F(2), F(3), F(4), rows, cols,
                                 -100);
          });
  // A vocabulary shard [1000, 2000) of 2000 classes, with ignored rows.
  auto tv = labels(rows, 2000, -100, 7);
  std::vector<float> m(rows);
  for (int64_t r = 0; r < rows; ++r) {
    m[size_t(r)] = -INFINITY;
    for (int64_t j = 0; j < cols; ++j)
      m[size_t(r)] = std::max(m[size_t(r)], z[size_t(r * cols + j)]);
  }
  compare("crossEntropyStats",
          {in(z), ids(tv), in(m), out(random(rows)), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.crossEntropyStats(F(0), I(1), F(2), F(3), F(4), rows, cols,
                                       1000, 2000, -100);
          });
  std::vector<float> se(rows, 3.5f), pl = random(rows);
  compare("crossEntropyFromStats",
          {in(se), in(pl), in(m), ids(tv), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.crossEntropyFromStats(F(0), F(1), F(2), I(3), F(4), rows,
                                           -100);
          });
  compare("crossEntropyStatsGrad",
          {in(z), ids(tv), in(m), in(se), in(random(rows)),
           out(random(size_t(rows * cols)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.crossEntropyStatsGrad(F(0), I(1), F(2), F(3), F(4), F(5),
                                           rows, cols, 1000, 2000, -100);
          });
  compare("tokenMean", {in(random(rows)), ids(tv), out({0.0f})},
          [&](Backend &b, std::vector<void *> &p) {
            return b.tokenMean(F(0), I(1), F(2), rows, -100, nullptr);
          });
  compare("tokenMeanGrad", {in({1.5f}), ids(tv), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.tokenMeanGrad(F(0), I(1), F(2), rows, -100, nullptr);
          });
  // Context parallelism: the count of the whole sequence as a device scalar.
  compare("tokenCount", {ids(tv), out({0.0f})},
          [&](Backend &b, std::vector<void *> &p) {
            return b.tokenCount(I(0), F(1), rows, -100);
          });
  compare("tokenMeanOver", {in(random(rows)), ids(tv), in({37.0f}), out({0.0f})},
          [&](Backend &b, std::vector<void *> &p) {
            return b.tokenMean(F(0), I(1), F(3), rows, -100, F(2));
          });
  compare("tokenMeanOverGrad",
          {in({1.5f}), ids(tv), in({37.0f}), out(random(rows))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.tokenMeanGrad(F(0), I(1), F(3), rows, -100, F(2));
          });
}

TEST(CudaConformanceTest, DropoutMasksAreBitIdentical) {
  const int64_t seq = 16, batch = 4, hidden = 96;
  auto x = random(size_t(seq * batch * hidden));
  for (float rate : {0.1f, 0.5f})
    compare("dropout rate " + std::to_string(rate),
            {in(x), out(random(x.size()))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.dropout(F(0), F(1), seq, batch, hidden, 32, 64, 1000,
                               1234, 3, rate);
            },
            0.0);
}

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto g = BackendRegistry::global().create("cuda", {});
  if (!g.ok()) {
    std::printf("SKIPPED: no GPU for the cuda backend: %s\n",
                g.status().message().c_str());
    return 77;
  }
  gpu = std::move(*g);
  cpu = std::move(*BackendRegistry::global().create("cpu", {}));
  int rc = RUN_ALL_TESTS();
  gpu.reset();
  return rc;
}
