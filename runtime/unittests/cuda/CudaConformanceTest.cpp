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
#include "tessera/rt/math/SequenceLayout.h"

#include <gtest/gtest.h>

#include <unistd.h>

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

enum class Kind { F32, I32, I64, BF16, F16 };

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
Arg outIds(const std::vector<int32_t> &v) { return arg(Kind::I32, v, true); }
Arg i64(const std::vector<int64_t> &v) { return arg(Kind::I64, v, false); }
Arg bf16(const std::vector<float> &v, bool output) {
  std::vector<uint16_t> h(v.size());
  floatsToBf16(v.data(), h.data(), int64_t(v.size()));
  return arg(Kind::BF16, h, output);
}
/// `v` rounded to a 16-bit format (BF16 or F16).
Arg half(FloatFormat format, const std::vector<float> &v, bool output) {
  std::vector<uint16_t> h(v.size());
  floatsToHalf(format, v.data(), h.data(), int64_t(v.size()));
  return arg(format == FloatFormat::F16 ? Kind::F16 : Kind::BF16, h, output);
}
/// `v` in any float format.
Arg floats(FloatFormat format, const std::vector<float> &v, bool output) {
  return format == FloatFormat::F32 ? arg(Kind::F32, v, output)
                                    : half(format, v, output);
}

using Call = std::function<Status(Backend &, std::vector<void *> &)>;

/// The spacing of the 16-bit `format` at the value with pattern `h`: the
/// distance to the next value away from zero.
double ulpAt(FloatFormat format, uint16_t h) {
  return std::fabs(double(halfToFloat(format, uint16_t(h + 1))) -
                   double(halfToFloat(format, h)));
}

/// Runs `call` on both backends and compares the outputs: |gpu - cpu| <=
/// tol * (1 + |cpu|) for f32 (or <= bounds[j] for element j of every f32
/// output, when `bounds` is given), within one bf16 ulp for bf16 (exact
/// when tol == 0). With `bounds`, a 16-bit output is an f32 result within
/// bounds[j] on each side rounded once: the widened values may differ by
/// bounds[j] plus half an ulp of each.
void compare(const std::string &what, std::vector<Arg> args, const Call &call,
             double tol = 1e-5, const std::vector<double> &bounds = {}) {
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
        ASSERT_NEAR(g[j], w[j],
                    bounds.empty() ? tol * (1.0 + std::fabs(w[j])) : bounds[j])
            << "operand " << i << " at " << j;
      }
    } else if (args[i].kind == Kind::BF16 || args[i].kind == Kind::F16) {
      size_t n = got.size() / 2;
      const uint16_t *g = reinterpret_cast<const uint16_t *>(got.data());
      const uint16_t *w = reinterpret_cast<const uint16_t *>(want.data());
      const FloatFormat f =
          args[i].kind == Kind::F16 ? FloatFormat::F16 : FloatFormat::BF16;
      for (size_t j = 0; j < n; ++j) {
        if (!bounds.empty()) {
          ASSERT_LE(std::fabs(double(halfToFloat(f, g[j])) -
                              double(halfToFloat(f, w[j]))),
                    bounds[j] + ulpAt(f, g[j]) / 2 + ulpAt(f, w[j]) / 2)
              << "operand " << i << " at " << j;
          continue;
        }
        ASSERT_LE(std::abs(int(g[j]) - int(w[j])), tol == 0.0 ? 0 : 1)
            << "operand " << i << " at " << j;
      }
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

TEST(CudaConformanceTest, GemmBf16) {
  // bf16 A and B, f32 C and accumulation: exact products, so CUDA and CPU
  // differ only in the order of their f32 sums (cuBLASLt with TF32 off).
  // Any order of summing k exact products p_i errs by at most
  // gamma_k * sum |p_i| (gamma_k = k u / (1 - k u), u = 2^-24), and scaling
  // by alpha and adding beta C round twice more; the two backends' results
  // differ by at most twice that. The bound follows sum |a_i b_i|, not
  // |result|: entries whose products cancel get the slack their sum needs.
  const double u = std::ldexp(1.0, -24);
  const float alpha = 0.75f;
  // bf16 (--bf16) and f16 (--fp16) operands: both have exact products.
  for (FloatFormat fmt : {FloatFormat::BF16, FloatFormat::F16})
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f})
        for (int64_t k : {int64_t(0), int64_t(1), int64_t(37), int64_t(512)}) {
          const int64_t m = 33, n = 65;
          std::vector<float> a = random(size_t(m * k)),
                             b = random(size_t(k * n)),
                             c = random(size_t(m * n));
          // The values the GEMM sees: a and b rounded to the format.
          std::vector<uint16_t> ha(a.size()), hb(b.size());
          floatsToHalf(fmt, a.data(), ha.data(), int64_t(a.size()));
          floatsToHalf(fmt, b.data(), hb.data(), int64_t(b.size()));
          std::vector<float> ra(a.size()), rb(b.size());
          halfToFloats(fmt, ha.data(), ra.data(), int64_t(a.size()));
          halfToFloats(fmt, hb.data(), rb.data(), int64_t(b.size()));
          const double gamma = double(k) * u / (1.0 - double(k) * u);
          std::vector<double> bounds(size_t(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0.0;
              for (int64_t l = 0; l < k; ++l)
                s += std::fabs(double(ra[size_t(ta ? l * m + i : i * k + l)]) *
                               double(rb[size_t(tb ? j * k + l : l * n + j)]));
              const double cij = std::fabs(double(beta) * c[size_t(i * n + j)]);
              // Each backend: the sum, alpha times it, plus beta C.
              const double one = (gamma * s + 2 * u * s) * alpha +
                                 2 * u * (alpha * s + cij);
              bounds[size_t(i * n + j)] = 2 * one + 1e-30;
            }
          compare(std::string("gemmHalf ") + formatName(fmt) + " ta=" +
                      std::to_string(ta) + " tb=" +
                      std::to_string(tb) + " beta=" + std::to_string(beta) +
                      " k=" + std::to_string(k),
                  {half(fmt, a, false), half(fmt, b, false), out(c)},
                  [&](Backend &be, std::vector<void *> &p) {
                    return be.gemmHalf(fmt, ta, tb, m, n, k, alpha, H(0), H(1),
                                       beta, F(2));
                  },
                  0.0, bounds);
          // C in the operands' format (a GEMM writing a 16-bit
          // activation): the same f32 result, rounded once.
          if (beta == 0.0f)
            compare(std::string("gemmHalf ") + formatName(fmt) + " into " +
                        formatName(fmt) + " C ta=" + std::to_string(ta) +
                        " tb=" + std::to_string(tb) + " k=" + std::to_string(k),
                    {half(fmt, a, false), half(fmt, b, false),
                     half(fmt, c, true)},
                    [&](Backend &be, std::vector<void *> &p) {
                      return be.gemmHalf(fmt, ta, tb, m, n, k, alpha, H(0),
                                         H(1), 0.0f, FloatOut(p[2], fmt));
                    },
                    0.0, bounds);
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
  // A padded vocabulary's columns: a shard whose tail is padding, one that
  // is all padding, in place.
  for (int64_t offset : {int64_t(0), int64_t(200), int64_t(400)})
    compare("maskColumns offset=" + std::to_string(offset), {in(x), out(y)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.maskColumns(F(0), F(1), rows, cols, offset, 457,
                                   -3.0e38f);
            },
            0.0);
  compare("maskColumns in place", {out(x)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.maskColumns(F(0), F(0), rows, cols, 0, 100, 0.0f);
          },
          0.0);
  compare("sgd", {out(y), in(x)}, [&](Backend &b, std::vector<void *> &p) {
    return b.sgd(F(0), F(1), n, 0.01f, 0.1f);
  });
  compare("sgdMomentum", {out(y), in(x), out(random(size_t(n)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.sgdMomentum(F(0), F(1), F(2), n, 0.01f, 0.1f, 0.9f);
          });
}

TEST(CudaConformanceTest, MixedPrecision) {
  const int64_t n = 4099;
  auto x = random(size_t(n), 10.0f), y = random(size_t(n));
  const FloatFormat formats[] = {FloatFormat::F32, FloatFormat::BF16,
                                 FloatFormat::F16};
  for (FloatFormat xf : formats)
    for (FloatFormat yf : formats)
      for (float beta : {0.0f, 1.0f})
        compare(std::string("cast x=") + formatName(xf) + " y=" +
                    formatName(yf) + " beta=" + std::to_string(beta),
                {floats(xf, x, false), floats(yf, y, true)},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.cast(p[0], xf, p[1], yf, n, beta);
                },
                0.0);
  for (FloatFormat hf : {FloatFormat::BF16, FloatFormat::F16}) {
  const std::string name = formatName(hf);
  compare("fillHalf " + name, {half(hf, y, true)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.fillHalf(hf, H(0), 0.3f, n);
          }, 0.0);
  compare("scaleHalf " + name, {half(hf, x, false), half(hf, y, true)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.scaleHalf(hf, H(0), H(1), 0.125f, n);
          }, 0.0);
  compare("axpyHalf " + name, {half(hf, x, false), half(hf, y, true)},
          [&](Backend &b, std::vector<void *> &p) {
            return b.axpyHalf(hf, -0.5f, H(0), H(1), n);
          }); // one ulp: the GPU may fuse the multiply-add before rounding
  }
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

// Gradient clipping: the device's two-stage f64 sum of squares (many
// blocks for the larger lengths) against the CPU's, f32 and bf16,
// accumulating; the norm and coefficient (binding, not, off, NaN); the
// scaling by a device scalar, in place.
TEST(CudaConformanceTest, GradientClipping) {
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(1) << 20 | 3}) {
    auto x = random(size_t(n));
    for (bool accumulate : {false, true}) {
      std::string tag = " n=" + std::to_string(n) +
                        (accumulate ? " accumulate" : "");
      compare("sumSquares" + tag, {in(x), out({2.5f})},
              [&](Backend &b, std::vector<void *> &p) {
                return b.sumSquares(p[0], FloatFormat::F32, n, F(1),
                                    accumulate);
              },
              2e-7);
      compare("sumSquares bf16" + tag, {bf16(x, false), out({2.5f})},
              [&](Backend &b, std::vector<void *> &p) {
                return b.sumSquares(p[0], FloatFormat::BF16, n, F(1),
                                    accumulate);
              },
              2e-7);
    }
  }
  // fp16 also unscales: inverse loss scale 2^-10 on squares of gradients
  // scaled by 2^10.
  for (float inv : {1.0f, 1.0f / 1024.0f})
    for (auto [maxNorm, sumsq] : {std::pair{1.0f, 25.0f}, {10.0f, 25.0f},
                                  {0.0f, 25.0f}, {1.0f, std::nanf("")}})
      compare("clipGradNorm max_norm=" + std::to_string(maxNorm) +
                  " sumsq=" + std::to_string(sumsq) +
                  " inv_scale=" + std::to_string(inv),
              {in({sumsq / (inv * inv)}), out({0.0f}), out({0.0f})},
              [&, maxNorm = maxNorm](Backend &b, std::vector<void *> &p) {
                return b.clipGradNorm(F(0), F(1), F(2), maxNorm, inv);
              },
              0.0);
  for (int64_t n : {int64_t(1000), int64_t(1) << 20 | 3})
    compare("sumSquares f16 n=" + std::to_string(n),
            {half(FloatFormat::F16, random(size_t(n)), false), out({0.0f})},
            [&](Backend &b, std::vector<void *> &p) {
              return b.sumSquares(p[0], FloatFormat::F16, n, F(1), false);
            },
            2e-7);
  const int64_t n = 100003;
  compare("scaleBy", {out(random(size_t(n))), in({0.375f})},
          [&](Backend &b, std::vector<void *> &p) {
            return b.scaleBy(F(0), F(1), F(0), n);
          },
          0.0);
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

TEST(CudaConformanceTest, RMSNorm) {
  for (int64_t cols : {int64_t(5), int64_t(256), int64_t(1600)}) {
    const int64_t rows = 67;
    auto x = random(size_t(rows * cols), 2.0f);
    compare("rmsNorm cols=" + std::to_string(cols),
            {in(x), in(random(cols)), out(random(size_t(rows * cols)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.rmsNorm(F(0), F(1), F(2), rows, cols, 1e-6f);
            });
    compare("addRmsNorm cols=" + std::to_string(cols),
            {in(x), in(random(size_t(rows * cols))), in(random(cols)),
             out(random(size_t(rows * cols))),
             out(random(size_t(rows * cols)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.addRmsNorm(F(0), F(1), F(2), F(3), F(4), rows, cols,
                                  1e-6f);
            });
    for (float beta : {0.0f, 1.0f}) {
      compare("rmsNormGrad cols=" + std::to_string(cols),
              {in(x), in(random(cols)), in(random(size_t(rows * cols))),
               out(random(size_t(rows * cols))), out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rmsNormGrad(F(0), F(1), F(2), nullptr, F(3), F(4),
                                     rows, cols, 1e-6f, beta);
              },
              2e-5);
      compare("addRmsNormGrad cols=" + std::to_string(cols),
              {in(x), in(random(cols)), in(random(size_t(rows * cols))),
               in(random(size_t(rows * cols))),
               out(random(size_t(rows * cols))), out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rmsNormGrad(F(0), F(1), F(2), F(3), F(4), F(5), rows,
                                     cols, 1e-6f, beta);
              },
              2e-5);
    }
  }
}

TEST(CudaConformanceTest, SwiGLU) {
  // Gates far out in both tails (sigmoid's saturation) and a row width
  // that is no multiple of a warp.
  for (int64_t n : {int64_t(5), int64_t(1376)}) {
    const int64_t rows = 67;
    auto x = random(size_t(rows * 2 * n), 4.0f);
    compare("swiglu n=" + std::to_string(n),
            {in(x), out(random(size_t(rows * n)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.swiglu(F(0), F(1), rows, n);
            });
    compare("swigluGrad n=" + std::to_string(n),
            {in(x), in(random(size_t(rows * n))),
             out(random(size_t(rows * 2 * n)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.swigluGrad(F(0), F(1), F(2), rows, n);
            });
  }
}

// The activation kernels with 16-bit operands (FloatIn, FloatOut: what
// the compiler's folded casts leave to them): the same math from the
// exactly widened values, so results within an ulp of the 16-bit format
// (f32 ones within the f32 kernels' bounds).
TEST(CudaConformanceTest, AnyFormatActivationKernels) {
  const int64_t rows = 67;
  for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16}) {
    const std::string fmt = formatName(h);
    for (int64_t cols : {int64_t(5), int64_t(1600)}) {
      const std::string shape = fmt + " cols=" + std::to_string(cols);
      const size_t n = size_t(rows * cols);
      auto x = random(n, 2.0f);
      // The lookup (ids of another shard give zeros) and the position add.
      const int64_t vocab = 50;
      std::vector<int32_t> tokens(static_cast<size_t>(rows));
      for (size_t r = 0; r < tokens.size(); ++r)
        tokens[r] = int32_t((r * 13) % size_t(2 * vocab));
      compare("embedding " + shape,
              {ids(tokens), floats(h, random(size_t(vocab * cols)), false),
               floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.embedding(I(0), FloatIn(p[1], h), FloatOut(p[2], h),
                                   rows, vocab, cols, vocab, 2 * vocab);
              }, 0.0);
      compare("embedding, f32 rows " + shape,
              {ids(tokens), floats(h, random(size_t(vocab * cols)), false),
               out(random(n))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.embedding(I(0), FloatIn(p[1], h), F(2), rows, vocab,
                                   cols, 0, 2 * vocab);
              }, 0.0);
      compare("addPositionEmbedding " + shape,
              {floats(h, x, false), floats(h, random(size_t(rows * cols)), false),
               floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.addPositionEmbedding(FloatIn(p[0], h),
                                              FloatIn(p[1], h),
                                              FloatOut(p[2], h), rows, 1, cols);
              });
      compare("add " + shape,
              {floats(h, x, false), in(random(n)), floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.add(FloatIn(p[0], h), F(1), FloatOut(p[2], h),
                             int64_t(n));
              });
      compare("add, f32 result " + shape,
              {floats(h, x, false), floats(h, random(n), false), out(random(n))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.add(FloatIn(p[0], h), FloatIn(p[1], h), F(2),
                             int64_t(n));
              });
      compare("biasAdd " + shape,
              {floats(h, x, false), in(random(cols)), floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.biasAdd(FloatIn(p[0], h), F(1), FloatOut(p[2], h),
                                 rows, cols);
              });
      for (bool tanh : {false, true}) {
        compare("biasGelu " + shape,
                {floats(h, x, false), in(random(cols)),
                 floats(h, random(n), true)},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.biasGelu(FloatIn(p[0], h), F(1), FloatOut(p[2], h),
                                    rows, cols, tanh);
                });
        compare("biasGeluGrad " + shape,
                {floats(h, x, false), in(random(cols)), in(random(n)),
                 out(random(n)), out(random(cols))},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.biasGeluGrad(FloatIn(p[0], h), F(1), F(2), F(3),
                                        F(4), rows, cols, tanh, 1.0f);
                },
                2e-5);
      }
      compare("layerNorm " + shape,
              {floats(h, x, false), in(random(cols)), in(random(cols)),
               floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.layerNorm(FloatIn(p[0], h), F(1), F(2),
                                   FloatOut(p[3], h), rows, cols, 1e-5f);
              });
      compare("layerNormGrad " + shape,
              {floats(h, x, false), in(random(cols)), in(random(n)),
               out(random(n)), out(random(cols)), out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.layerNormGrad(FloatIn(p[0], h), F(1), F(2), F(3), F(4),
                                       F(5), rows, cols, 1e-5f, 0.0f);
              },
              2e-5);
      compare("rmsNorm " + shape,
              {floats(h, x, false), in(random(cols)), floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rmsNorm(FloatIn(p[0], h), F(1), FloatOut(p[2], h),
                                 rows, cols, 1e-6f);
              });
      compare("addLayerNorm " + shape,
              {in(x), in(random(n)), in(random(cols)), in(random(cols)),
               out(random(n)), floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.addLayerNorm(F(0), F(1), F(2), F(3), F(4),
                                      FloatOut(p[5], h), rows, cols, 1e-5f);
              });
      compare("addRmsNorm " + shape,
              {in(x), in(random(n)), in(random(cols)), out(random(n)),
               floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.addRmsNorm(F(0), F(1), F(2), F(3), FloatOut(p[4], h),
                                    rows, cols, 1e-6f);
              });
      compare("rmsNormGrad " + shape,
              {floats(h, x, false), in(random(cols)), in(random(n)),
               out(random(n)), out(random(cols))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rmsNormGrad(FloatIn(p[0], h), F(1), F(2), nullptr,
                                     F(3), F(4), rows, cols, 1e-6f, 0.0f);
              },
              2e-5);
      auto x2 = random(2 * n, 4.0f);
      compare("swiglu " + shape,
              {floats(h, x2, false), floats(h, random(n), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.swiglu(FloatIn(p[0], h), FloatOut(p[1], h), rows,
                                cols);
              });
      compare("swigluGrad " + shape,
              {floats(h, x2, false), in(random(n)), out(random(2 * n))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.swigluGrad(FloatIn(p[0], h), F(1), F(2), rows, cols);
              });
      compare("swigluGrad, 16-bit dX " + shape,
              {floats(h, random(size_t(2 * rows * cols)), false),
               in(random(size_t(rows * cols))),
               floats(h, random(size_t(2 * rows * cols)), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.swigluGrad(FloatIn(p[0], h), F(1), FloatOut(p[2], h),
                                    rows, cols);
              });
    }
  }
}

TEST(CudaConformanceTest, RepeatKV) {
  // Llama 3's 8 query heads per group at head dim 128, and MHA's G = heads.
  for (auto [heads, groups] :
       {std::pair<int64_t, int64_t>{32, 4}, {6, 6}}) {
    const int64_t rows = 37, d = 128;
    const int64_t nIn = rows * groups * (heads / groups + 2) * d;
    const int64_t nOut = rows * heads * 3 * d;
    std::string shape = std::to_string(heads) + "/" + std::to_string(groups);
    compare("repeatKV " + shape, {in(random(size_t(nIn))), out(random(size_t(nOut)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.repeatKV(F(0), F(1), rows, heads, groups, d);
            });
    compare("repeatKVGrad " + shape,
            {in(random(size_t(nOut))), out(random(size_t(nIn)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.repeatKVGrad(F(0), F(1), rows, heads, groups, d);
            });
    // 16-bit rows (bf16 activations): the copy is exact, the sums of dk
    // and dv rounded once.
    for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16}) {
      compare("repeatKV " + shape + " " + formatName(h),
              {floats(h, random(size_t(nIn)), false),
               floats(h, random(size_t(nOut)), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.repeatKV(FloatIn(p[0], h), FloatOut(p[1], h), rows,
                                  heads, groups, d);
              }, 0.0);
      compare("repeatKVGrad " + shape + " " + formatName(h),
              {floats(h, random(size_t(nOut)), false),
               floats(h, random(size_t(nIn)), true)},
              [&](Backend &b, std::vector<void *> &p) {
                return b.repeatKVGrad(FloatIn(p[0], h), FloatOut(p[1], h),
                                      rows, heads, groups, d);
              });
    }
  }
}

TEST(CudaConformanceTest, QKNorm) {
  // Qwen 3's 4 query heads per group at head dim 128.
  const int64_t rows = 37, heads = 16, groups = 4, d = 128;
  const int64_t n = rows * groups * (heads / groups + 2) * d;
  auto x = random(size_t(n), 2.0f);
  compare("qkNorm", {in(x), in(random(d)), in(random(d)), out(random(size_t(n)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.qkNorm(F(0), F(1), F(2), F(3), rows, heads, groups, d,
                            1e-6f);
          });
  for (float beta : {0.0f, 1.0f})
    compare("qkNormGrad beta=" + std::to_string(int(beta)),
            {in(x), in(random(d)), in(random(d)), in(random(size_t(n))),
             out(random(size_t(n))), out(random(d)), out(random(d))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.qkNormGrad(F(0), F(1), F(2), F(3), F(4), F(5), F(6),
                                  rows, heads, groups, d, 1e-6f, beta);
            },
            2e-5);
}

TEST(CudaConformanceTest, RotaryEmbedding) {
  // Llama's head dim 128 at positions past 4096 (the angle's f32 product
  // and sincosf against the CPU's cosf/sinf) with Llama 3.1's scaling,
  // half rotated, and in place.
  const int64_t seq = 9, batch = 3, heads = 4, d = 128;
  const int64_t features = heads * 3 * d, n = seq * batch * features;
  for (int64_t rot : {int64_t(128), int64_t(64)})
    for (bool inverse : {false, true}) {
      std::string name = "rotaryEmbedding rot=" + std::to_string(rot) +
                         (inverse ? " inverse" : "");
      compare(name, {in(random(size_t(n))), out(random(size_t(n)))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rotaryEmbedding(F(0), F(1), seq, batch, features,
                                         heads, rot, 500000.0f, 8.0f, 4093,
                                         inverse);
              },
              2e-5);
      compare(name + " in place", {out(random(size_t(n)))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.rotaryEmbedding(F(0), F(0), seq, batch, features,
                                         heads, rot, 10000.0f, 0.0f, 0,
                                         inverse);
              },
              2e-5);
      // 16-bit rows (bf16 activations), apart and in place: each side's
      // f32 result within the f32 bound above of the other's, then
      // rounded once (the bound taken at the CPU's f32 result).
      for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16}) {
        auto x = random(size_t(n));
        std::vector<uint16_t> xh(x.size());
        std::vector<float> xw(x.size()), w32(x.size());
        floatsToHalf(h, x.data(), xh.data(), n);
        halfToFloats(h, xh.data(), xw.data(), n);
        ASSERT_TRUE(cpu->rotaryEmbedding(xw.data(), w32.data(), seq, batch,
                                         features, heads, rot, 500000.0f,
                                         8.0f, 4093, inverse)
                        .ok());
        std::vector<double> bounds(x.size());
        for (size_t j = 0; j < bounds.size(); ++j)
          bounds[j] = 2e-5 * (1.0 + std::fabs(double(w32[j])));
        compare(name + " " + formatName(h),
                {floats(h, x, false), floats(h, random(size_t(n)), true)},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.rotaryEmbedding(FloatIn(p[0], h), FloatOut(p[1], h),
                                           seq, batch, features, heads, rot,
                                           500000.0f, 8.0f, 4093, inverse);
                },
                0.0, bounds);
        compare(name + " " + formatName(h) + " in place",
                {floats(h, x, true)},
                [&](Backend &b, std::vector<void *> &p) {
                  return b.rotaryEmbedding(FloatIn(p[0], h), FloatOut(p[0], h),
                                           seq, batch, features, heads, rot,
                                           500000.0f, 8.0f, 4093, inverse);
                },
                0.0, bounds);
      }
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
  // The statistics over 16-bit logits (a GEMM's bf16 output) and the
  // gradient into a 16-bit dZ: the same math on the widened values; dZ
  // within one ulp of the format.
  for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16}) {
    const std::string fmt = formatName(h);
    std::vector<uint16_t> zh(z.size());
    std::vector<float> zw(z.size()), mh(rows, -INFINITY);
    floatsToHalf(h, z.data(), zh.data(), int64_t(z.size()));
    halfToFloats(h, zh.data(), zw.data(), int64_t(z.size()));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        mh[size_t(r)] = std::max(mh[size_t(r)], zw[size_t(r * cols + j)]);
    compare("logitsMax " + fmt, {floats(h, z, false), out(random(rows))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.logitsMax(FloatIn(p[0], h), F(1), rows, cols);
            }, 0.0);
    compare("logitsStats " + fmt,
            {floats(h, z, false), ids(ti), out(random(rows)),
             out(random(rows)), out(random(rows))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.logitsStats(FloatIn(p[0], h), I(1), F(2), F(3), F(4),
                                   rows, cols, -100);
            });
    compare("crossEntropyStats " + fmt,
            {floats(h, z, false), ids(tv), in(mh), out(random(rows)),
             out(random(rows))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.crossEntropyStats(FloatIn(p[0], h), I(1), F(2), F(3),
                                         F(4), rows, cols, 1000, 2000, -100);
            });
    compare("crossEntropyStatsGrad " + fmt,
            {floats(h, z, false), ids(tv), in(mh), in(se), in(random(rows)),
             floats(h, random(size_t(rows * cols)), true)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.crossEntropyStatsGrad(FloatIn(p[0], h), I(1), F(2), F(3),
                                             F(4), FloatOut(p[5], h), rows,
                                             cols, 1000, 2000, -100);
            });
  }
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
  // 16-bit rows: the same masks, the kept values scaled in f32 and rounded
  // once (the scale 1 / (1 - rate) is exact for these rates, so equal).
  for (FloatFormat h : {FloatFormat::BF16, FloatFormat::F16})
    compare(std::string("dropout ") + formatName(h),
            {floats(h, x, false), floats(h, random(x.size()), true)},
            [&](Backend &b, std::vector<void *> &p) {
              return b.dropout(FloatIn(p[0], h), FloatOut(p[1], h), seq, batch,
                               hidden, 32, 64, 1000, 1234, 3, 0.5f);
            },
            0.0);
}

// Mixture of experts: routing from random logits (computed on the CPU for
// the kernels that take indices), every kernel in both directions, with
// dropped choices (index -1) from the capacity drop.
TEST(CudaConformanceTest, MixtureOfExperts) {
  const int64_t tokens = 37, experts = 6, k = 2, features = 24, ffn = 16;
  const int64_t n = tokens * k;
  auto logits = random(size_t(tokens * experts));
  std::vector<float> probs(static_cast<size_t>(n));
  std::vector<int32_t> indices(static_cast<size_t>(n));
  ASSERT_TRUE(cpu->moeRouter(logits.data(), probs.data(), indices.data(),
                             tokens, experts, k)
                  .ok());
  compare("moeRouter", {in(logits), out(random(size_t(n))),
                        outIds(std::vector<int32_t>(size_t(n), 0))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeRouter(F(0), F(1), static_cast<int32_t *>(p[2]),
                               tokens, experts, k);
          });
  compare("moeRouterGrad", {in(probs), ids(indices), in(random(size_t(n))),
                            out(random(size_t(tokens * experts)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeRouterGrad(F(0), I(1), F(2), F(3), tokens, experts, k);
          });
  std::vector<float> all = {30, 5, 12, 0, 20, 7};
  for (bool over : {false, true}) {
    std::vector<Arg> lossArgs = {in(logits), ids(indices), in(all),
                                 out({0.0f})};
    compare(std::string("moeAuxLoss over=") + (over ? "1" : "0"), lossArgs,
            [&](Backend &b, std::vector<void *> &p) {
              return b.moeAuxLoss(F(0), I(1), over ? F(2) : nullptr, F(3),
                                  tokens, experts, k, 0.01f);
            });
    compare(std::string("moeAuxLossGrad over=") + (over ? "1" : "0"),
            {in(logits), ids(indices), in(all), in({1.5f}),
             out(random(size_t(tokens * experts)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.moeAuxLossGrad(F(0), I(1), over ? F(2) : nullptr, F(3),
                                      F(4), tokens, experts, k, 0.01f);
            });
  }
  for (bool byPosition : {false, true})
    compare(std::string("moeCapacityDrop byPosition=") +
                (byPosition ? "1" : "0"),
            {in(probs), ids(indices), out(random(size_t(n))),
             outIds(std::vector<int32_t>(size_t(n), 0))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.moeCapacityDrop(F(0), I(1), F(2),
                                       static_cast<int32_t *>(p[3]), tokens,
                                       k, experts, 9, byPosition);
            },
            0.0);
  // The kernels below see dropped choices too.
  std::vector<float> kept(static_cast<size_t>(n));
  std::vector<int32_t> keptIndices(static_cast<size_t>(n));
  ASSERT_TRUE(cpu->moeCapacityDrop(probs.data(), indices.data(), kept.data(),
                                   keptIndices.data(), tokens, k, experts, 9,
                                   false)
                  .ok());
  compare("moeCapacityDropGrad",
          {in(random(size_t(n))), ids(keptIndices), out(random(size_t(n)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeCapacityDropGrad(F(0), I(1), F(2), n);
          },
          0.0);
  compare("moeTokenCounts", {ids(keptIndices), out(random(size_t(experts)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeTokenCounts(I(0), F(1), n, experts);
          },
          0.0);
  auto x = random(size_t(tokens * features));
  compare("moeDispatch",
          {in(x), ids(keptIndices), out(random(size_t(n * features))),
           outIds(std::vector<int32_t>(size_t(experts), -5))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeDispatch(F(0), I(1), F(2), static_cast<int32_t *>(p[3]),
                                 tokens, k, experts, features);
          },
          0.0);
  compare("moeDispatchGrad",
          {in(random(size_t(n * features))), ids(keptIndices),
           out(random(size_t(tokens * features)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeDispatchGrad(F(0), I(1), F(2), tokens, k, experts,
                                     features);
          });
  std::vector<float> rows(size_t(n * features));
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  ASSERT_TRUE(cpu->moeDispatch(x.data(), keptIndices.data(), rows.data(),
                               counts.data(), tokens, k, experts, features)
                  .ok());
  auto w = random(size_t(experts * ffn * features), 0.2f);
  for (FloatFormat format : {FloatFormat::F32, FloatFormat::BF16}) {
    const bool b16 = format == FloatFormat::BF16;
    auto input = [&](const std::vector<float> &v) {
      return b16 ? bf16(v, false) : in(v);
    };
    const std::string suffix = b16 ? " bf16" : "";
    compare("groupedLinear" + suffix,
            {input(rows), ids(counts), input(w), out(random(size_t(n * ffn)))},
            [&](Backend &b, std::vector<void *> &p) {
              return b.groupedLinear(format, p[0], I(1), p[2], F(3), n,
                                     features, ffn, experts);
            });
    for (float beta : {0.0f, 1.0f})
      compare("groupedLinearGrad beta=" + std::to_string(beta) + suffix,
              {input(rows), ids(counts), input(w),
               input(random(size_t(n * ffn))),
               out(random(size_t(n * features))), out(random(w.size()))},
              [&](Backend &b, std::vector<void *> &p) {
                return b.groupedLinearGrad(format, p[0], I(1), p[2], p[3],
                                           F(4), F(5), n, features, ffn,
                                           experts, beta);
              });
  }
  compare("moeCombine",
          {in(rows), in(kept), ids(keptIndices),
           out(random(size_t(tokens * features)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeCombine(F(0), F(1), I(2), F(3), tokens, k, experts,
                                features);
          });
  compare("moeCombineGrad",
          {in(rows), in(kept), ids(keptIndices),
           in(random(size_t(tokens * features))),
           out(random(size_t(n * features))), out(random(size_t(n)))},
          [&](Backend &b, std::vector<void *> &p) {
            return b.moeCombineGrad(F(0), F(1), I(2), F(3), F(4), F(5), tokens,
                                    k, experts, features);
          });
}

TEST(CudaConformanceTest, OutOfRangeExpertIsReportedAtSynchronize) {
  std::vector<int32_t> indices = {0, 1, 9, 2};
  std::vector<float> counts(4);
  void *dIdx = *gpu->allocate(16), *dCounts = *gpu->allocate(16);
  ASSERT_TRUE(gpu->copyToDevice(dIdx, indices.data(), 16).ok());
  ASSERT_TRUE(gpu->moeTokenCounts(static_cast<int32_t *>(dIdx),
                                  static_cast<float *>(dCounts), 4, 4)
                  .ok());
  Status st = gpu->synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.getCode(), StatusCode::OutOfRange);
  EXPECT_NE(st.message().find("expert index 9 of routing choice 2 is out of "
                              "range for 4 experts"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(gpu->synchronize().ok()) << "the error is reported once";
  gpu->deallocate(dIdx);
  gpu->deallocate(dCounts);
}

// Ring attention: every step of a ring from each rank's view, the blocks'
// K/V random (as received from the other ranks), forward and backward.
TEST(CudaConformanceTest, RingAttention) {
  struct Shape {
    int64_t S, B, A, D, cp;
  };
  for (Shape sh : {Shape{8, 2, 3, 16, 2}, Shape{130, 1, 2, 64, 3}})
    for (bool causal : {true, false})
      for (int64_t rank = 0; rank < sh.cp; ++rank) {
        math::RingAttentionDims d;
        d.seq = sh.S;
        d.batch = sh.B;
        d.heads = sh.A;
        d.headDim = sh.D;
        d.causal = causal;
        d.cpRank = rank;
        d.cpSize = sh.cp;
        const std::string what = "S=" + std::to_string(sh.S) + " rank=" +
                                 std::to_string(rank) + " causal=" +
                                 std::to_string(causal);
        const size_t qkvN = size_t(sh.S * sh.B * sh.A * 3 * sh.D),
                     outN = size_t(sh.S * sh.B * sh.A * sh.D);
        auto qkv = random(qkvN), dout = random(outN);
        std::vector<std::vector<float>> kv;
        for (int64_t i = 0; i < sh.cp; ++i)
          kv.push_back(random(size_t(d.kvBlock())));
        // The whole ring in one call per backend: pack, every step, and the
        // backward's steps with a dK/dV block each.
        std::vector<Arg> args = {in(qkv), in(dout)};
        for (auto &block : kv)
          args.push_back(in(block));
        args.push_back(out(random(outN)));                  // O
        args.push_back(out(random(size_t(2 * d.rowStats())))); // stats
        args.push_back(out(random(size_t(d.rowStats()))));  // LSE
        args.push_back(out(random(qkvN)));                  // dQKV
        args.push_back(out(random(size_t(d.rowStats()))));  // delta
        args.push_back(out(random(size_t(d.kvBlock()))));   // own K/V
        for (int64_t i = 0; i < sh.cp; ++i)
          args.push_back(out(std::vector<float>(size_t(d.kvBlock()), 0.0f)));
        const int64_t n = sh.cp, blocks = 2;
        compare("ring attention " + what, args,
                [&](Backend &b, std::vector<void *> &p) -> Status {
                  const int64_t o = blocks + n;
                  float *own = F(o + 5);
                  TESSERA_RETURN_IF_ERROR(b.ringPackKeysValues(F(0), own, d));
                  auto block = [&](int64_t source) {
                    return source == rank ? own : F(blocks + source);
                  };
                  for (int64_t i = 0; i < n; ++i) {
                    const int64_t source = (rank - i + n) % n;
                    TESSERA_RETURN_IF_ERROR(b.ringAttentionStep(
                        F(0), block(source), F(o), F(o + 1),
                        i + 1 == n ? F(o + 2) : nullptr, d, source, i == 0));
                  }
                  for (int64_t i = 0; i < n; ++i) {
                    const int64_t source = (rank - i + n) % n;
                    TESSERA_RETURN_IF_ERROR(b.ringAttentionGradStep(
                        F(0), F(o), F(o + 2), F(1), block(source),
                        F(o + 6 + i), F(o + 4), F(o + 3), d, source, i == 0));
                  }
                  return Status();
                },
                5e-5);
      }
}

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests needs no GPU (scripts/gpu-check.sh runs each test in
  // a process of its own).
  if (GTEST_FLAG_GET(list_tests))
    return RUN_ALL_TESTS();
  auto g = BackendRegistry::global().create("cuda", {});
  if (!g.ok()) {
    // No GPU is a skip; a GPU the backend cannot use (an old driver, a
    // missing library, cublasLtCreate failing) is a failure.
    for (const char *node : {"/dev/nvidiactl", "/dev/nvidia0"})
      if (access(node, F_OK) == 0) {
        std::printf("FAILED: %s exists but the cuda backend did not start: "
                    "%s\n",
                    node, g.status().message().c_str());
        return 1;
      }
    std::printf("SKIPPED: no GPU for the cuda backend: %s\n",
                g.status().message().c_str());
    return 77;
  }
  gpu = std::move(*g);
  std::printf("cuda backend: %s\n", gpu->kernelLibraries().c_str());
  cpu = std::move(*BackendRegistry::global().create("cpu", {}));
  int rc = RUN_ALL_TESTS();
  gpu.reset();
  return rc;
}
