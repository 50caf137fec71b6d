//===- CpuBackend.cpp - OpenBLAS + vectorised loops backend ---------------===//
//
// The reference "cpu" backend: GEMM through OpenBLAS cblas_sgemm (row-major),
// everything else as simple loops annotated for `-fopenmp-simd`.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Backend.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tessera::rt {
namespace {

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const BackendOptions &options) {
    if (options.numThreads > 0)
      openblas_set_num_threads(options.numThreads);
  }

  const char *name() const override { return "cpu"; }

  StatusOr<void *> allocate(int64_t bytes) override {
    size_t size = size_t(std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
    void *ptr = std::aligned_alloc(64, size);
    if (!ptr)
      return unavailable("cannot allocate ", bytes, " bytes");
    std::memset(ptr, 0, size);
    return ptr;
  }
  void deallocate(void *ptr) override { std::free(ptr); }
  Status copyToDevice(void *dst, const void *src, int64_t bytes) override {
    std::memmove(dst, src, size_t(bytes));
    return Status();
  }
  Status copyToHost(void *dst, const void *src, int64_t bytes) override {
    std::memmove(dst, src, size_t(bytes));
    return Status();
  }

  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              float alpha, const float *a, const float *b, float beta,
              float *c) override {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
      return unimplemented("gemm dimensions exceed 32-bit BLAS ints");
    if (m == 0 || n == 0)
      return Status();
    if (k == 0) {
      // BLAS may not touch C when k == 0; define it as C = beta * C.
      for (int64_t i = 0; i < m * n; ++i)
        c[i] = beta == 0.0f ? 0.0f : beta * c[i];
      return Status();
    }
    int lda = int(transA ? m : k);
    int ldb = int(transB ? k : n);
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
                alpha, a, lda, b, ldb, beta, c, int(n));
    return Status();
  }

  Status biasAdd(const float *x, const float *bias, float *y, int64_t rows,
                 int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i) {
      const float *xr = x + i * cols;
      float *yr = y + i * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        yr[j] = xr[j] + bias[j];
    }
    return Status();
  }

  Status add(const float *a, const float *b, float *c, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      c[i] = a[i] + b[i];
    return Status();
  }

  Status gelu(const float *x, float *y, int64_t n) override {
    constexpr float kInvSqrt2 = 0.70710678118654752440f;
    for (int64_t i = 0; i < n; ++i)
      y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
    return Status();
  }

  Status geluGrad(const float *x, const float *dy, float *dx,
                  int64_t n) override {
    constexpr float kInvSqrt2 = 0.70710678118654752440f;
    constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
    for (int64_t i = 0; i < n; ++i) {
      float v = x[i];
      float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
    return Status();
  }

  Status relu(const float *x, float *y, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return Status();
  }

  Status reluGrad(const float *x, const float *dy, float *dx,
                  int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return Status();
  }

  Status reduceRows(const float *x, float *y, int64_t rows, int64_t cols,
                    float alpha, float beta) override {
    // Column sums accumulated row by row (contiguous, vectorisable).
    float *acc = static_cast<float *>(std::calloc(size_t(cols) + 1, 4));
    if (!acc)
      return unavailable("out of memory in reduceRows");
    for (int64_t i = 0; i < rows; ++i) {
      const float *xr = x + i * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        acc[j] += xr[j];
    }
    if (beta == 0.0f) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        y[j] = alpha * acc[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        y[j] = alpha * acc[j] + beta * y[j];
    }
    std::free(acc);
    return Status();
  }

  Status crossEntropy(const float *z, const int32_t *t, float *loss,
                      int64_t rows, int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i) {
      if (t[i] < 0 || t[i] >= cols)
        return outOfRange("label ", t[i], " of row ", i, " is outside [0, ",
                          cols, ")");
      const float *zr = z + i * cols;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < cols; ++j)
        mx = std::max(mx, zr[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j)
        sum += std::exp(zr[j] - mx);
      loss[i] = std::log(sum) + mx - zr[t[i]];
    }
    return Status();
  }

  Status crossEntropyGrad(const float *z, const int32_t *t, const float *dl,
                          float *dz, int64_t rows, int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i) {
      if (t[i] < 0 || t[i] >= cols)
        return outOfRange("label ", t[i], " of row ", i, " is outside [0, ",
                          cols, ")");
      const float *zr = z + i * cols;
      float *dr = dz + i * cols;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < cols; ++j)
        mx = std::max(mx, zr[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < cols; ++j) {
        float e = std::exp(zr[j] - mx);
        dr[j] = e;
        sum += e;
      }
      float s = dl[i] / sum;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dr[j] *= s;
      dr[t[i]] -= dl[i];
    }
    return Status();
  }

  Status mean(const float *x, float *y, int64_t n) override {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i)
      sum += x[i];
    y[0] = n ? float(sum / double(n)) : 0.0f;
    return Status();
  }

  Status meanGrad(const float *dy, float *dx, int64_t n) override {
    float v = n ? dy[0] / float(n) : 0.0f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      dx[i] = v;
    return Status();
  }

  Status fill(float *y, float value, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = value;
    return Status();
  }

  Status scale(const float *x, float *y, float alpha, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = alpha * x[i];
    return Status();
  }

  Status copy(const void *x, void *y, int64_t bytes) override {
    if (x != y)
      std::memmove(y, x, size_t(bytes));
    return Status();
  }

  Status axpy(float alpha, const float *x, float *y, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] += alpha * x[i];
    return Status();
  }

  Status adam(float *p, const float *g, float *m, float *v, int64_t n,
              int64_t step, const AdamParams &hp) override {
    if (step < 1)
      return invalidArgument("Adam iteration must be >= 1, got ", step);
    const float b1 = hp.beta1, b2 = hp.beta2;
    const float c1 = float(1.0 / (1.0 - std::pow(double(b1), double(step))));
    const float c2 = float(1.0 / (1.0 - std::pow(double(b2), double(step))));
    const float lr = hp.lr, eps = hp.eps, wd = hp.weightDecay;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float gi = g[i];
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float mhat = mi * c1;
      float vhat = vi * c2;
      p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
    }
    return Status();
  }

  Status sgd(float *p, const float *g, int64_t n, float lr,
             float weightDecay) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      p[i] -= lr * (g[i] + weightDecay * p[i]);
    return Status();
  }
};

} // namespace

void registerCpuBackend(BackendRegistry &registry) {
  registry.registerBackend(
      "cpu",
      [](const BackendOptions &options) -> StatusOr<std::unique_ptr<Backend>> {
        return std::unique_ptr<Backend>(new CpuBackend(options));
      });
}

} // namespace tessera::rt
