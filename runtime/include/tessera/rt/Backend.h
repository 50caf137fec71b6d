//===- Backend.h - Compute backend interface --------------------*- C++ -*-===//
//
// The math of every compute opcode on raw device pointers. The executor
// resolves TensorRefs to pointers and sizes and calls one of these per
// instruction. Backends are created by name from the BackendRegistry; "cpu"
// is built in, others (e.g. "cuda") may be loaded from shared libraries that
// export `tesseraRegisterBackends`.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKEND_H
#define TESSERA_RT_BACKEND_H

#include "tessera/rt/Status.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::rt {

/// Hyper-parameters of one Adam/AdamW update.
struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.0f;
};

/// Options passed to a backend factory.
struct BackendOptions {
  /// Threads for BLAS-like libraries; 0 leaves the library default.
  int numThreads = 0;
};

/// Compute backend. All tensors are dense row-major f32 unless noted; `n` is
/// an element count; matrices are [rows, cols].
class Backend {
public:
  virtual ~Backend();
  virtual const char *name() const = 0;

  /// Allocates `bytes` of zeroed device memory aligned to at least 64 bytes.
  virtual StatusOr<void *> allocate(int64_t bytes) = 0;
  virtual void deallocate(void *ptr) = 0;
  /// Host <-> device copies (identity memcpy on the cpu).
  virtual Status copyToDevice(void *dst, const void *src, int64_t bytes) = 0;
  virtual Status copyToHost(void *dst, const void *src, int64_t bytes) = 0;
  /// Blocks until all queued work is done.
  virtual Status synchronize() { return Status(); }

  /// C[m, n] = alpha * op(A) @ op(B) + beta * C with op(A) [m, k],
  /// op(B) [k, n]; A is stored [m, k] (or [k, m] if transA), B [k, n] (or
  /// [n, k] if transB).
  virtual Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, const float *b, float beta,
                      float *c) = 0;
  /// Y[i, j] = X[i, j] + bias[j]; Y may alias X.
  virtual Status biasAdd(const float *x, const float *bias, float *y,
                         int64_t rows, int64_t cols) = 0;
  virtual Status add(const float *a, const float *b, float *c, int64_t n) = 0;
  /// Y = 0.5 x (1 + erf(x / sqrt 2)).
  virtual Status gelu(const float *x, float *y, int64_t n) = 0;
  /// dX = dY * (Phi(x) + x phi(x)).
  virtual Status geluGrad(const float *x, const float *dy, float *dx,
                          int64_t n) = 0;
  virtual Status relu(const float *x, float *y, int64_t n) = 0;
  virtual Status reluGrad(const float *x, const float *dy, float *dx,
                          int64_t n) = 0;
  /// Y[j] = alpha * sum_i X[i, j] + beta * Y[j].
  virtual Status reduceRows(const float *x, float *y, int64_t rows,
                            int64_t cols, float alpha, float beta) = 0;
  /// L[i] = logsumexp(Z[i, :]) - Z[i, t[i]] (max-subtracted).
  virtual Status crossEntropy(const float *z, const int32_t *t, float *loss,
                              int64_t rows, int64_t cols) = 0;
  /// dZ[i, :] = dL[i] * (softmax(Z[i, :]) - onehot(t[i])).
  virtual Status crossEntropyGrad(const float *z, const int32_t *t,
                                  const float *dl, float *dz, int64_t rows,
                                  int64_t cols) = 0;
  /// y[0] = mean(X).
  virtual Status mean(const float *x, float *y, int64_t n) = 0;
  /// dX[:] = dy[0] / n.
  virtual Status meanGrad(const float *dy, float *dx, int64_t n) = 0;
  virtual Status fill(float *y, float value, int64_t n) = 0;
  /// Y = alpha * X.
  virtual Status scale(const float *x, float *y, float alpha, int64_t n) = 0;
  /// Byte copy (any dtype); regions may overlap.
  virtual Status copy(const void *x, void *y, int64_t bytes) = 0;
  /// Y += alpha * X.
  virtual Status axpy(float alpha, const float *x, float *y, int64_t n) = 0;
  /// AdamW step t (1-based) with bias correction 1 - beta^t and decoupled
  /// weight decay: p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p).
  virtual Status adam(float *p, const float *g, float *m, float *v, int64_t n,
                      int64_t step, const AdamParams &params) = 0;
  /// p -= lr * (g + weightDecay * p).
  virtual Status sgd(float *p, const float *g, int64_t n, float lr,
                     float weightDecay) = 0;
};

using BackendFactory =
    std::function<StatusOr<std::unique_ptr<Backend>>(const BackendOptions &)>;

/// Name -> factory map. `global()` always contains "cpu".
class BackendRegistry {
public:
  static BackendRegistry &global();

  void registerBackend(const std::string &name, BackendFactory factory);
  bool contains(const std::string &name) const;
  std::vector<std::string> names() const;

  /// Creates backend `name`. If it is not registered, tries to load the
  /// plugin "libTesseraBackend_<name>.so" (dlopen search path, then the
  /// directory of the running executable and its ../lib) first.
  StatusOr<std::unique_ptr<Backend>> create(const std::string &name,
                                            const BackendOptions &options);

  /// dlopens `path` and calls its
  /// `extern "C" void tesseraRegisterBackends(tessera::rt::BackendRegistry *)`.
  Status loadPlugin(const std::string &path);

private:
  mutable std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
};

/// Plugin entry point type.
extern "C" {
typedef void (*TesseraRegisterBackendsFn)(BackendRegistry *registry);
}

/// Registers the built-in "cpu" backend (done by BackendRegistry::global()).
void registerCpuBackend(BackendRegistry &registry);

} // namespace tessera::rt

#endif // TESSERA_RT_BACKEND_H
