//===- CpuBackend.cpp - OpenBLAS + vectorised loops backend ---------------===//
//
// The reference "cpu" backend: GEMM through OpenBLAS cblas_sgemm (row-major),
// everything else as simple loops annotated for `-fopenmp-simd`.
//
//===----------------------------------------------------------------------===//

#include "backends/cpu/BlasCore.h"
#include "tessera/rt/BF16.h"
#include "tessera/rt/Backend.h"
#include "tessera/rt/Rng.h"
#include "tessera/rt/math/Kernels.h"
#include "tessera/rt/math/MoE.h"
#include "tessera/rt/math/Philox.h"
#include "tessera/rt/math/SequenceLayout.h"

#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <vector>

namespace tessera::rt {
namespace {

// The per-element math shared with the CUDA kernels (math/Kernels.h): exp
// and erf there are branch-free, so `#pragma omp simd` loops over them
// vectorise (std::exp and std::erf are scalar library calls without
// -ffast-math).
using math::erfApprox;
using math::expApprox;
using math::selectf;

/// max_j x[j] (-inf for n == 0; NaNs are skipped). 16 partial maxima so
/// that the loop vectorises (a `reduction(max)` over std::max does not
/// without -ffinite-math-only).
[[gnu::always_inline]] inline float rowMax(const float *x, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l)
    lanes[l] = -INFINITY;
  const int64_t full = n / kLanes * kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l)
      lanes[l] = selectf(x[j + l] > lanes[l], x[j + l], lanes[l]);
  }
  float mx = -INFINITY;
  for (int64_t j = full; j < n; ++j)
    mx = selectf(x[j] > mx, x[j], mx);
  for (int l = 0; l < kLanes; ++l)
    mx = selectf(lanes[l] > mx, lanes[l], mx);
  return mx;
}

/// Rows of attention scores processed per block: causal attention skips
/// the key blocks above the diagonal.
constexpr int64_t kAttentionBlock = 64;

/// C = alpha * op(A) op(B) + beta * C with explicit leading dimensions.
inline void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  float alpha, const float *a, int64_t lda, const float *b,
                  int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a,
              int(lda), b, int(ldb), beta, c, int(ldc));
}

/// Elementwise loops shorter than this run on one thread: below it the
/// fork/join costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

/// The kernels that load and store any float format (FloatIn, FloatOut;
/// the activation kernels under bf16 activations) stage on the CPU: a span
/// of a 16-bit operand is widened (exactly) into a buffer of the calling
/// thread before the f32 code runs on it, and a 16-bit result is computed
/// into one and rounded once to nearest even, as the Cast kernel rounds.
/// An f32 operand is used in place, so the f32 path is the one it was.
std::vector<float> &stagingBuffer(int k) {
  thread_local std::vector<float> buffers[3];
  return buffers[k];
}
const float *loadSpan(FloatIn in, int64_t offset, int64_t n, int k) {
  if (in.isF32())
    return in.f32() + offset;
  std::vector<float> &buf = stagingBuffer(k);
  if (int64_t(buf.size()) < n)
    buf.resize(size_t(n));
  halfToFloats(in.format, static_cast<const uint16_t *>(in.data) + offset,
               buf.data(), n);
  return buf.data();
}
float *storeSpan(FloatOut out, int64_t offset, int64_t n, int k) {
  if (out.isF32())
    return out.f32() + offset;
  std::vector<float> &buf = stagingBuffer(k);
  if (int64_t(buf.size()) < n)
    buf.resize(size_t(n));
  return buf.data();
}
/// Rounds what storeSpan handed out into a 16-bit `out` (f32: written).
void finishSpan(FloatOut out, int64_t offset, int64_t n, const float *computed) {
  if (!out.isF32())
    floatsToHalf(out.format, computed,
                 static_cast<uint16_t *>(out.data) + offset, n);
}
/// Elements per staged span of the elementwise kernels.
constexpr int64_t kStagingSpan = 4096;

// GELU and its gradient are the costliest elementwise kernels (an erf per
// element): they get AVX-512 and AVX2 clones, picked at load time on CPUs
// that have them (the build itself targets the baseline x86-64). The runtime
// is built with -ffp-contract=off, so no clone fuses a multiply-add and every
// clone computes the same bits as the baseline loop: a run is reproducible
// across machines. Only elementwise loops get clones; a vectorised reduction
// sums in an order that depends on the vector width.
#define TESSERA_SIMD_CLONES                                                    \
  __attribute__((target_clones("avx512f", "avx2", "default")))

TESSERA_SIMD_CLONES void geluSpan(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = math::gelu(x[i]);
}

TESSERA_SIMD_CLONES void geluGradSpan(const float *x, const float *dy,
                                      float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dx[i] = math::geluGrad(x[i], dy[i]);
}

TESSERA_SIMD_CLONES void geluTanhSpan(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = math::geluTanh(x[i]);
}

TESSERA_SIMD_CLONES void geluTanhGradSpan(const float *x, const float *dy,
                                          float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dx[i] = math::geluTanhGrad(x[i], dy[i]);
}

/// One row of SwiGLU (gate and up projections side by side) and of its
/// backward.
TESSERA_SIMD_CLONES void swigluRow(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    y[j] = math::swiglu(x[j], x[n + j]);
}
TESSERA_SIMD_CLONES void swigluGradRow(const float *x, const float *dy,
                                       float *dx, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    math::swigluGrad(x[j], x[n + j], dy[j], dx[j], dx[n + j]);
}

/// One row of the fused bias-GELU, y = gelu(x + b) over n columns, and of
/// its backward: dx = dy * gelu'(x + b) and the bias gradient's column sums
/// acc += dx (elementwise over the columns, so every clone adds the rows in
/// the same order as ReduceRows). Inlined into one cloned function per form
/// (clang's target_clones takes no templates).
[[gnu::always_inline]] inline void biasGeluRowOf(bool tanh, const float *x,
                                                 const float *b, float *y,
                                                 int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    y[j] = tanh ? math::geluTanh(x[j] + b[j]) : math::gelu(x[j] + b[j]);
}
[[gnu::always_inline]] inline void
biasGeluGradRowOf(bool tanh, const float *x, const float *b, const float *dy,
                  float *dx, float *acc, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    float d = tanh ? math::geluTanhGrad(x[j] + b[j], dy[j])
                   : math::geluGrad(x[j] + b[j], dy[j]);
    dx[j] = d;
    acc[j] += d;
  }
}
TESSERA_SIMD_CLONES void biasGeluRow(const float *x, const float *b, float *y,
                                     int64_t n) {
  biasGeluRowOf(false, x, b, y, n);
}
TESSERA_SIMD_CLONES void biasGeluTanhRow(const float *x, const float *b,
                                         float *y, int64_t n) {
  biasGeluRowOf(true, x, b, y, n);
}
TESSERA_SIMD_CLONES void biasGeluGradRow(const float *x, const float *b,
                                         const float *dy, float *dx,
                                         float *acc, int64_t n) {
  biasGeluGradRowOf(false, x, b, dy, dx, acc, n);
}
TESSERA_SIMD_CLONES void biasGeluTanhGradRow(const float *x, const float *b,
                                             const float *dy, float *dx,
                                             float *acc, int64_t n) {
  biasGeluGradRowOf(true, x, b, dy, dx, acc, n);
}

/// sum_j x[j] * y[j] over [0, n) (y == nullptr: sum_j x[j]) in a fixed
/// order: 16 partial sums, lane l taking elements l, l + 16, ..., then the
/// tail, then the lanes in order. Every vector width computes the same bits,
/// so the cloned kernels that inline it stay reproducible across CPUs.
[[gnu::always_inline]] inline float laneDot(const float *x, const float *y,
                                            int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  const int64_t full = n / kLanes * kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    if (y) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l)
        lanes[l] += x[j + l] * y[j + l];
    } else {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l)
        lanes[l] += x[j + l];
    }
  }
  float tail = 0.0f;
  for (int64_t j = full; j < n; ++j)
    tail += y ? x[j] * y[j] : x[j];
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l)
    sum += lanes[l];
  return sum + tail;
}

/// In place, each of `rows` rows of `n` attention scores (row i of query
/// position first + i) becomes its softmax (max-subtracted); with `causal`
/// the entries past the query's position are set to 0.
TESSERA_SIMD_CLONES void softmaxRows(float *p, int64_t rows, int64_t n,
                                     int64_t first, bool causal) {
  for (int64_t i = 0; i < rows; ++i) {
    float *row = p + i * n;
    const int64_t valid = causal ? std::min(n, first + i + 1) : n;
    const float mx = rowMax(row, valid);
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j)
      row[j] = expApprox(row[j] - mx);
    const float inv = 1.0f / laneDot(row, nullptr, valid);
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j)
      row[j] *= inv;
    for (int64_t j = valid; j < n; ++j)
      row[j] = 0.0f;
  }
}

/// The softmax backward in place: dS = P * (dP - rowsum(dP * P)) for
/// `rows` rows of `n`.
TESSERA_SIMD_CLONES void softmaxGradRows(const float *p, float *dp,
                                         int64_t rows, int64_t n) {
  for (int64_t i = 0; i < rows; ++i) {
    const float *pr = p + i * n;
    float *dr = dp + i * n;
    const float dot = laneDot(pr, dr, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      dr[j] = pr[j] * (dr[j] - dot);
  }
}

/// Runs `body(begin, end)` over [0, n) in one contiguous span per thread.
template <typename Body>
void parallelSpans(int threads, int64_t n, Body body) {
  if (threads <= 1 || n < kParallelMin) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    body(begin, end);
  }
}

//===----------------------------------------------------------------------===//
// Mixed precision: f32 <-> bf16/f16 conversions (BF16.h), one span per thread.
//===----------------------------------------------------------------------===//

/// Y[i] = convert(X[i]) or, with Accumulate, convert(X[i] + beta * Y[i]),
/// over [begin, end). Elementwise, so Y may be X when the formats agree.
template <FloatFormat X, FloatFormat Y, bool Accumulate>
void castSpan(const void *x, void *y, int64_t begin, int64_t end, float beta) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float v = loadFloat<X>(x, i);
    if constexpr (Accumulate)
      v += beta * loadFloat<Y>(y, i);
    storeFloat<Y>(y, i, v);
  }
}

using CastSpanFn = void (*)(const void *, void *, int64_t, int64_t, float);

template <FloatFormat X, FloatFormat Y>
CastSpanFn castSpanFor(bool accumulate) {
  return accumulate ? castSpan<X, Y, true> : castSpan<X, Y, false>;
}
template <FloatFormat X> CastSpanFn castSpanFor(FloatFormat y, bool accumulate) {
  switch (y) {
  case FloatFormat::F32: return castSpanFor<X, FloatFormat::F32>(accumulate);
  case FloatFormat::BF16: return castSpanFor<X, FloatFormat::BF16>(accumulate);
  case FloatFormat::F16: return castSpanFor<X, FloatFormat::F16>(accumulate);
  }
  return nullptr;
}

/// The span kernel of one (X format, Y format, accumulate) combination.
CastSpanFn castSpanFor(FloatFormat x, FloatFormat y, bool accumulate) {
  switch (x) {
  case FloatFormat::F32: return castSpanFor<FloatFormat::F32>(y, accumulate);
  case FloatFormat::BF16: return castSpanFor<FloatFormat::BF16>(y, accumulate);
  case FloatFormat::F16: return castSpanFor<FloatFormat::F16>(y, accumulate);
  }
  return nullptr;
}

// f16 arrays on x86 CPUs with F16C (every AVX2 one): the conversion
// instructions, chosen at run time (the build targets baseline x86-64).
// They round as BF16.h does (to nearest even, overflow to infinity,
// subnormals kept), so results are the same bits but for NaN payloads.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) void
f16ToFloatsF16c(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i *>(in + i))));
  for (; i < n; ++i)
    out[i] = f16ToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void
floatsToF16F16c(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                     _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i)
    out[i] = floatToF16(in[i]);
}

// F16C with AVX, and the OS saving the YMM registers (XCR0 bits 1 and 2).
// From CPUID itself: clang before 15 has no "f16c" for
// __builtin_cpu_supports (the fuzzers' clang-14 build).
bool hasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
      return false;
    const unsigned f16c = 1u << 29, avx = 1u << 28, osxsave = 1u << 27;
    if ((c & (f16c | avx | osxsave)) != (f16c | avx | osxsave))
      return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
  }();
  return has;
}
#else
bool hasF16c() { return false; }
void f16ToFloatsF16c(const uint16_t *in, float *out, int64_t n) {
  f16ToFloats(in, out, n);
}
void floatsToF16F16c(const float *in, uint16_t *out, int64_t n) {
  floatsToF16(in, out, n);
}
#endif

/// Widens n 16-bit values of `format` (F16C for f16 where the CPU has it).
void widenHalf(FloatFormat format, const uint16_t *in, float *out, int64_t n) {
  if (format == FloatFormat::F16 && hasF16c())
    f16ToFloatsF16c(in, out, n);
  else
    halfToFloats(format, in, out, n);
}

/// y[i] = half(f(x[i])) over [begin, end) for the 16-bit format H.
template <FloatFormat H, typename F>
void halfMap(const uint16_t *x, uint16_t *y, int64_t begin, int64_t end, F f) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i)
    storeFloat<H>(y, i, f(loadFloat<H>(x, i), i));
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const BackendOptions &options) {
    if (options.numThreads > 0) {
      openblas_set_num_threads(options.numThreads);
      threads = options.numThreads;
    }
  }

private:
  /// Threads for the elementwise kernels (the same as the BLAS threads).
  int threads = 1;
  /// The widened operands of the 16-bit GEMMs (widenedInputs), grown to the
  /// largest set seen.
  std::vector<float> gemmInputs;
  /// The f32 product of a 16-bit GEMM whose C is 16-bit, before it is
  /// rounded into C; grown to the largest seen, 64-byte aligned like the
  /// arena's buffers so that sgemm sees the same layout as an f32 C.
  struct AlignedFree {
    void operator()(float *p) const { std::free(p); }
  };
  std::unique_ptr<float[], AlignedFree> gemmOutput;
  int64_t gemmOutputFloats = 0;

public:

  const char *name() const override { return "cpu"; }
  std::string kernelLibraries() const override {
    return cpu::blasDescription();
  }

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

  /// The f32 operands of a GEMM given in `format`: f32 ones as they are,
  /// 16-bit ones (pointer, elements) widened exactly into gemmInputs, which
  /// the returned pointers then point into until the next call.
  std::vector<const float *>
  widenedInputs(FloatFormat format,
                std::initializer_list<std::pair<const void *, int64_t>> ops) {
    std::vector<const float *> f32;
    if (format == FloatFormat::F32) {
      for (auto [p, n] : ops)
        f32.push_back(static_cast<const float *>(p));
      return f32;
    }
    int64_t total = 0;
    for (auto [p, n] : ops)
      total += n;
    if (size_t(total) > gemmInputs.size())
      gemmInputs.resize(size_t(total));
    float *next = gemmInputs.data();
    for (auto [p, n] : ops) {
      const auto *h = static_cast<const uint16_t *>(p);
      float *wide = next;
      parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
        widenHalf(format, h + begin, wide + begin, end - begin);
      });
      f32.push_back(wide);
      next += n;
    }
    return f32;
  }

  /// 16-bit A and B widened (exactly) into f32 scratch, then the f32 GEMM:
  /// each product of two bf16 (8-bit significand) or f16 (11-bit) values
  /// is exact in f32 and the sums are sgemm's, which is a 16-bit x 16-bit
  /// -> f32 GEMM. A 16-bit C receives sgemm's f32 result through the Cast
  /// kernel, so it equals an f32 C followed by a Cast bit for bit.
  Status gemmHalf(FloatFormat half, bool transA, bool transB, int64_t m,
                  int64_t n, int64_t k, float alpha, const uint16_t *a,
                  const uint16_t *b, float beta, FloatOut c) override {
    if (half == FloatFormat::F32)
      return invalidArgument("gemmHalf takes a 16-bit format");
    if (!c.isF32() && (c.format != half || beta != 0.0f))
      return invalidArgument(
          "gemmHalf: a 16-bit C must have A and B's format and beta 0, got ",
          formatName(c.format), " C with ", formatName(half),
          " A and B and beta ", beta);
    std::vector<const float *> f32 =
        widenedInputs(half, {{a, m * k}, {b, k * n}});
    if (c.isF32())
      return gemm(transA, transB, m, n, k, alpha, f32[0], f32[1], beta,
                  c.f32());
    if (m * n > gemmOutputFloats) {
      size_t bytes = size_t(m * n * 4 + 63) / 64 * 64;
      gemmOutput.reset(static_cast<float *>(std::aligned_alloc(64, bytes)));
      gemmOutputFloats = gemmOutput ? m * n : 0;
      if (!gemmOutput)
        return unavailable("gemmHalf: cannot allocate ", bytes,
                           " bytes for the f32 product");
    }
    TESSERA_RETURN_IF_ERROR(gemm(transA, transB, m, n, k, alpha, f32[0],
                                 f32[1], 0.0f, gemmOutput.get()));
    return cast(gemmOutput.get(), FloatFormat::F32, c.data, c.format, m * n,
                0.0f);
  }

  Status biasAdd(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                 int64_t cols) override {
    for (int64_t i = 0; i < rows; ++i) {
      const float *xr = loadSpan(x, i * cols, cols, 0);
      float *yr = storeSpan(y, i * cols, cols, 1);
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        yr[j] = xr[j] + bias[j];
      finishSpan(y, i * cols, cols, yr);
    }
    return Status();
  }

  Status add(FloatIn a, FloatIn b, FloatOut c, int64_t n) override {
    for (int64_t i0 = 0; i0 < n; i0 += kStagingSpan) {
      const int64_t m = std::min(kStagingSpan, n - i0);
      const float *ar = loadSpan(a, i0, m, 0), *br = loadSpan(b, i0, m, 1);
      float *cr = storeSpan(c, i0, m, 2);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i)
        cr[i] = ar[i] + br[i];
      finishSpan(c, i0, m, cr);
    }
    return Status();
  }

  Status gelu(const float *x, float *y, int64_t n, bool tanh) override {
    parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
      (tanh ? geluTanhSpan : geluSpan)(x + begin, y + begin, end - begin);
    });
    return Status();
  }

  Status geluGrad(const float *x, const float *dy, float *dx, int64_t n,
                  bool tanh) override {
    parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
      (tanh ? geluTanhGradSpan : geluGradSpan)(x + begin, dy + begin,
                                               dx + begin, end - begin);
    });
    return Status();
  }

  Status swiglu(FloatIn x, FloatOut y, int64_t rows, int64_t n) override {
#pragma omp parallel for num_threads(threads) if (rows * n >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      float *yr = storeSpan(y, r * n, n, 1);
      swigluRow(loadSpan(x, r * 2 * n, 2 * n, 0), yr, n);
      finishSpan(y, r * n, n, yr);
    }
    return Status();
  }

  Status swigluGrad(FloatIn x, const float *dy, FloatOut dx, int64_t rows,
                    int64_t n) override {
#pragma omp parallel for num_threads(threads) if (rows * n >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      float *dr = storeSpan(dx, r * 2 * n, 2 * n, 1);
      swigluGradRow(loadSpan(x, r * 2 * n, 2 * n, 0), dy + r * n, dr, n);
      finishSpan(dx, r * 2 * n, 2 * n, dr);
    }
    return Status();
  }

  Status repeatKV(FloatIn x, FloatOut y, int64_t rows, int64_t heads,
                  int64_t groups, int64_t headDim) override {
    const int64_t r = heads / groups, D = headDim;
    const int64_t in = groups * (r + 2) * D, out = heads * 3 * D;
    // A row at a time, in the f32 staging of a 16-bit X or Y (a copy
    // either way: widening is exact, and a widened value narrows back to
    // itself).
    const size_t bytes = size_t(D) * sizeof(float);
#pragma omp parallel for num_threads(threads) if (rows * out >= kParallelMin)
    for (int64_t row = 0; row < rows; ++row) {
      const float *xr = loadSpan(x, row * in, in, 0);
      float *yr = storeSpan(y, row * out, out, 1);
      for (int64_t g = 0; g < groups; ++g) {
        const float *src = xr + g * (r + 2) * D;
        for (int64_t h = 0; h < r; ++h) {
          float *dst = yr + (g * r + h) * 3 * D;
          std::memcpy(dst, src + h * D, bytes);
          std::memcpy(dst + D, src + r * D, bytes);
          std::memcpy(dst + 2 * D, src + (r + 1) * D, bytes);
        }
      }
      finishSpan(y, row * out, out, yr);
    }
    return Status();
  }

  Status repeatKVGrad(FloatIn dy, FloatOut dx, int64_t rows, int64_t heads,
                      int64_t groups, int64_t headDim) override {
    const int64_t r = heads / groups, D = headDim;
    const int64_t in = groups * (r + 2) * D, out = heads * 3 * D;
#pragma omp parallel for num_threads(threads) if (rows * out >= kParallelMin)
    for (int64_t row = 0; row < rows; ++row) {
      // A row of dY and of dX (staged when 16-bit: dX rounded once from
      // its f32 sums).
      const float *dyr = loadSpan(dy, row * out, out, 0);
      float *dxr = storeSpan(dx, row * in, in, 1);
      for (int64_t g = 0; g < groups; ++g) {
        float *dst = dxr + g * (r + 2) * D;
        float *dk = dst + r * D, *dv = dst + (r + 1) * D;
        for (int64_t h = 0; h < r; ++h) {
          const float *src = dyr + (g * r + h) * 3 * D;
          std::memcpy(dst + h * D, src, size_t(D) * sizeof(float));
          // Heads in order: the same sums whatever the thread count.
          if (h == 0) {
            std::memcpy(dk, src + D, size_t(D) * sizeof(float));
            std::memcpy(dv, src + 2 * D, size_t(D) * sizeof(float));
            continue;
          }
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) {
            dk[j] += src[D + j];
            dv[j] += src[2 * D + j];
          }
        }
      }
      finishSpan(dx, row * in, in, dxr);
    }
    return Status();
  }

  Status biasGelu(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                  int64_t cols, bool tanh) override {
    auto row = tanh ? biasGeluTanhRow : biasGeluRow;
#pragma omp parallel for num_threads(threads) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      float *yr = storeSpan(y, r * cols, cols, 1);
      row(loadSpan(x, r * cols, cols, 0), bias, yr, cols);
      finishSpan(y, r * cols, cols, yr);
    }
    return Status();
  }

  Status biasGeluGrad(FloatIn x, const float *bias, const float *dy,
                      float *dx, float *dbias, int64_t rows, int64_t cols,
                      bool tanh, float beta) override {
    float *acc = static_cast<float *>(std::calloc(size_t(cols) + 1, 4));
    if (!acc)
      return unavailable("out of memory in biasGeluGrad");
    auto row = tanh ? biasGeluTanhGradRow : biasGeluGradRow;
    // Threads take column blocks (multiples of 16) over all rows, so each
    // column's sum runs over the rows in order whatever the thread count.
    const int64_t blocks = (cols + 15) / 16;
    const int nt =
        rows * cols >= kParallelMin ? int(std::min<int64_t>(threads, blocks)) : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      int64_t c0 = std::min(cols, blocks * t / n * 16);
      int64_t c1 = std::min(cols, blocks * (t + 1) / n * 16);
      for (int64_t r = 0; r < rows && c0 < c1; ++r)
        row(loadSpan(x, r * cols + c0, c1 - c0, 0), bias + c0,
            dy + r * cols + c0, dx + r * cols + c0, acc + c0, c1 - c0);
    }
    if (beta == 0.0f) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dbias[j] = acc[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dbias[j] = acc[j] + beta * dbias[j];
    }
    std::free(acc);
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
      dx[i] = math::reluGrad(x[i], dy[i]);
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
      float mx = rowMax(zr, cols);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j)
        sum += expApprox(zr[j] - mx);
      loss[i] = math::crossEntropyLoss(sum, mx, zr[t[i]]);
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
      float mx = rowMax(zr, cols);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) {
        float e = expApprox(zr[j] - mx);
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

  Status cast(const void *x, FloatFormat xFormat, void *y, FloatFormat yFormat,
              int64_t n, float beta) override {
    // A same-format cast without accumulation is a copy (exact, no
    // rounding of NaN payloads either).
    if (xFormat == yFormat && beta == 0.0f) {
      if (x != y)
        std::memmove(y, x, size_t(n * formatBytes(xFormat)));
      return Status();
    }
    // f32 <-> f16 without accumulation (mixed precision's casts of GEMM
    // operands and parameters): F16C where the CPU has it.
    if (beta == 0.0f && hasF16c() &&
        ((xFormat == FloatFormat::F32 && yFormat == FloatFormat::F16) ||
         (xFormat == FloatFormat::F16 && yFormat == FloatFormat::F32))) {
      parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
        if (xFormat == FloatFormat::F32)
          floatsToF16F16c(static_cast<const float *>(x) + begin,
                          static_cast<uint16_t *>(y) + begin, end - begin);
        else
          f16ToFloatsF16c(static_cast<const uint16_t *>(x) + begin,
                          static_cast<float *>(y) + begin, end - begin);
      });
      return Status();
    }
    CastSpanFn span = castSpanFor(xFormat, yFormat, beta != 0.0f);
    parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
      span(x, y, begin, end, beta);
    });
    return Status();
  }

  Status maskColumns(const float *x, float *y, int64_t rows, int64_t cols,
                     int64_t colOffset, int64_t valid, float fill) override {
    // The first `keep` columns of every row are real.
    const int64_t keep = std::clamp<int64_t>(valid - colOffset, 0, cols);
    parallelSpans(threads, rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (xr != yr)
          std::memmove(yr, xr, size_t(keep) * 4);
        for (int64_t j = keep; j < cols; ++j)
          yr[j] = fill;
      }
    });
    return Status();
  }

  Status fillHalf(FloatFormat half, uint16_t *y, float value,
                  int64_t n) override {
    uint16_t h = floatToHalf(half, value);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = h;
    return Status();
  }

  /// y[i] = half(f(float(x[i]), i)) in spans, for either 16-bit format.
  template <typename F>
  Status halfElementwise(FloatFormat half, const uint16_t *x, uint16_t *y,
                         int64_t n, F f) {
    parallelSpans(threads, n, [&](int64_t begin, int64_t end) {
      if (half == FloatFormat::F16)
        halfMap<FloatFormat::F16>(x, y, begin, end, f);
      else
        halfMap<FloatFormat::BF16>(x, y, begin, end, f);
    });
    return Status();
  }

  Status scaleHalf(FloatFormat half, const uint16_t *x, uint16_t *y,
                   float alpha, int64_t n) override {
    return halfElementwise(half, x, y, n,
                           [=](float v, int64_t) { return alpha * v; });
  }

  Status axpyHalf(FloatFormat half, float alpha, const uint16_t *x,
                  uint16_t *y, int64_t n) override {
    // Y's element read before the span writes it (y[i] only).
    return halfElementwise(half, x, y, n, [=](float v, int64_t i) {
      return halfToFloat(half, y[i]) + alpha * v;
    });
  }

  Status adam(float *p, const float *g, float *m, float *v, int64_t n,
              const int64_t *iteration, const AdamParams &hp) override {
    const int64_t step = *iteration;
    if (step < 1)
      return invalidArgument("Adam iteration must be >= 1, got ", step);
    const float b1 = hp.beta1, b2 = hp.beta2;
    const float c1 = math::adamBiasCorrection(b1, step);
    const float c2 = math::adamBiasCorrection(b2, step);
    const float lr = hp.lr, eps = hp.eps, wd = hp.weightDecay;
#pragma omp parallel for simd num_threads(threads) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      math::adamUpdate(p[i], g[i], m[i], v[i], b1, b2, c1, c2, lr, eps, wd);
    return Status();
  }

  Status sgd(float *p, const float *g, int64_t n, float lr,
             float weightDecay) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      math::sgdUpdate(p[i], g[i], lr, weightDecay);
    return Status();
  }

  Status sgdMomentum(float *p, const float *g, float *b, int64_t n, float lr,
                     float weightDecay, float momentum) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      math::sgdMomentumUpdate(p[i], g[i], b[i], lr, weightDecay, momentum);
    return Status();
  }

  Status sumSquares(const void *x, FloatFormat format, int64_t n, float *y,
                    bool accumulate) override {
    // In f64, in eight interleaved partial sums added in a fixed order: the
    // same sum on every CPU and thread count (no reassociation), and loops
    // the compiler vectorises (AVX2 or AVX-512 lanes hold the partials).
    constexpr int kLanes = 8;
    double part[kLanes] = {};
    const int64_t body = n / kLanes * kLanes;
    if (format != FloatFormat::F32) {
      const uint16_t *h = static_cast<const uint16_t *>(x);
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
          double v = halfToFloat(format, h[i + j]);
          part[j] += v * v;
        }
      for (int64_t i = body; i < n; ++i) {
        double v = halfToFloat(format, h[i]);
        part[i - body] += v * v;
      }
    } else {
      const float *f = static_cast<const float *>(x);
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; ++j)
          part[j] += double(f[i + j]) * double(f[i + j]);
      for (int64_t i = body; i < n; ++i)
        part[i - body] += double(f[i]) * double(f[i]);
    }
    double sum = 0.0;
    for (double v : part)
      sum += v;
    y[0] = accumulate ? float(double(y[0]) + sum) : float(sum);
    return Status();
  }

  Status clipGradNorm(const float *sumsq, float *norm, float *coeff,
                      float maxNorm, float invScale) override {
    norm[0] = float(std::sqrt(double(sumsq[0]))) * invScale;
    coeff[0] = math::clipCoefficient(norm[0], maxNorm) * invScale;
    return Status();
  }

  Status scaleBy(const float *x, const float *s, float *y, int64_t n) override {
    const float alpha = s[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = x[i] * alpha;
    return Status();
  }

  //===--------------------------------------------------------------------===//
  // Transformer kernels
  //===--------------------------------------------------------------------===//

  /// Row mean and 1 / sqrt(var + eps) (two passes, biased variance); for
  /// RMS (RMSNorm) the mean is 0 and rstd = 1 / sqrt(mean(x^2) + eps).
  template <bool RMS>
  static void rowStats(const float *xr, int64_t cols, float eps, float &mean,
                       float &rstd) {
    mean = 0.0f;
    if (!RMS) {
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j)
        sum += xr[j];
      mean = sum / float(cols);
    }
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < cols; ++j) {
      float d = xr[j] - mean;
      sq += d * d;
    }
    rstd = math::layerNormRstd(sq, cols, eps);
  }

  /// out = beta * out with beta == 0 writing zeros (no NaN propagation).
  static void scaleOrZero(float *out, int64_t n, float beta) {
    if (beta == 0.0f) {
      std::memset(out, 0, size_t(n) * 4);
    } else if (beta != 1.0f) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i)
        out[i] *= beta;
    }
  }

  /// The layer norm (RMS false) or RMS norm (RMS true: no mean, no bias) of
  /// each row of A, or of S = A + B (written) when B is given.
  template <bool RMS>
  Status norm(FloatIn a, const float *b, const float *gamma,
              const float *bias, float *s, FloatOut y, int64_t rows,
              int64_t cols, float eps) {
    if (cols == 0)
      return Status();
#pragma omp parallel for num_threads(threads) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = loadSpan(a, r * cols, cols, 0);
      if (b) {
        const float *br = b + r * cols;
        float *sr = s + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j)
          sr[j] = xr[j] + br[j];
        xr = sr;
      }
      float *yr = storeSpan(y, r * cols, cols, 1);
      float mean, rstd;
      rowStats<RMS>(xr, cols, eps, mean, rstd);
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        yr[j] = math::layerNormOut(xr[j], mean, rstd, gamma[j],
                                   RMS ? 0.0f : bias[j]);
      finishSpan(y, r * cols, cols, yr);
    }
    return Status();
  }

  Status layerNorm(FloatIn x, const float *gamma, const float *bias,
                   FloatOut y, int64_t rows, int64_t cols, float eps) override {
    return norm<false>(x, nullptr, gamma, bias, nullptr, y, rows, cols, eps);
  }

  Status addLayerNorm(const float *a, const float *b, const float *gamma,
                      const float *bias, float *s, FloatOut y, int64_t rows,
                      int64_t cols, float eps) override {
    return norm<false>(a, b, gamma, bias, s, y, rows, cols, eps);
  }

  Status rmsNorm(FloatIn x, const float *gamma, FloatOut y, int64_t rows,
                 int64_t cols, float eps) override {
    return norm<true>(x, nullptr, gamma, nullptr, nullptr, y, rows, cols, eps);
  }

  Status addRmsNorm(const float *a, const float *b, const float *gamma,
                    float *s, FloatOut y, int64_t rows, int64_t cols,
                    float eps) override {
    return norm<true>(a, b, gamma, nullptr, s, y, rows, cols, eps);
  }

  Status layerNormGrad(FloatIn x, const float *gamma, const float *dy,
                       float *dx, float *dgamma, float *dbias, int64_t rows,
                       int64_t cols, float eps, float beta) override {
    return normGrad<false>(x, gamma, dy, nullptr, dx, dgamma, dbias, rows,
                           cols, eps, beta);
  }

  Status addLayerNormGrad(const float *x, const float *gamma, const float *dy,
                          const float *dr, float *dx, float *dgamma,
                          float *dbias, int64_t rows, int64_t cols, float eps,
                          float beta) override {
    return normGrad<false>(x, gamma, dy, dr, dx, dgamma, dbias, rows, cols,
                           eps, beta);
  }

  Status rmsNormGrad(FloatIn x, const float *gamma, const float *dy,
                     const float *dr, float *dx, float *dgamma, int64_t rows,
                     int64_t cols, float eps, float beta) override {
    return normGrad<true>(x, gamma, dy, dr, dx, dgamma, nullptr, rows, cols,
                          eps, beta);
  }

  /// The layer-norm backward (RMSNorm's: the mean and mean(dy * gamma)
  /// terms 0, no bias), plus dR (when given) in dX.
  template <bool RMS>
  Status normGrad(FloatIn x, const float *gamma, const float *dy,
                  const float *dr, float *dx, float *dgamma, float *dbias,
                  int64_t rows, int64_t cols, float eps, float beta) {
    scaleOrZero(dgamma, cols, beta);
    if (!RMS)
      scaleOrZero(dbias, cols, beta);
    if (cols == 0)
      return Status();
    const float invN = 1.0f / float(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = loadSpan(x, r * cols, cols, 0);
      const float *dyr = dy + r * cols;
      float *dxr = dx + r * cols;
      float mean, rstd;
      rowStats<RMS>(xr, cols, eps, mean, rstd);
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < cols; ++j) {
        float xhat = (xr[j] - mean) * rstd;
        float g = dyr[j] * gamma[j];
        sg += g;
        sgx += g * xhat;
        dgamma[j] += dyr[j] * xhat;
        if (!RMS)
          dbias[j] += dyr[j];
      }
      float mg = RMS ? 0.0f : sg * invN, mgx = sgx * invN;
      const float *drr = dr ? dr + r * cols : nullptr;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        float xhat = (xr[j] - mean) * rstd;
        float d = math::layerNormGradX(xhat, dyr[j], gamma[j], rstd, mg, mgx);
        dxr[j] = drr ? d + drr[j] : d;
      }
    }
    return Status();
  }

  Status qkNorm(const float *x, const float *wq, const float *wk, float *y,
                int64_t rows, int64_t heads, int64_t groups, int64_t headDim,
                float eps) override {
    const int64_t r = heads / groups, d = headDim;
    const int64_t vectors = rows * groups * (r + 2);
#pragma omp parallel for num_threads(threads) if (vectors * d >= kParallelMin)
    for (int64_t v = 0; v < vectors; ++v) {
      const int64_t c = v % (r + 2);
      const float *xr = x + v * d;
      float *yr = y + v * d;
      if (c == r + 1) {
        std::memcpy(yr, xr, size_t(d) * sizeof(float));
        continue;
      }
      const float *w = c < r ? wq : wk;
      float mean, rstd;
      rowStats<true>(xr, d, eps, mean, rstd);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j)
        yr[j] = math::layerNormOut(xr[j], 0.0f, rstd, w[j], 0.0f);
    }
    return Status();
  }

  Status qkNormGrad(const float *x, const float *wq, const float *wk,
                    const float *dy, float *dx, float *dwq, float *dwk,
                    int64_t rows, int64_t heads, int64_t groups,
                    int64_t headDim, float eps, float beta) override {
    const int64_t r = heads / groups, d = headDim;
    const int64_t vectors = rows * groups * (r + 2);
    scaleOrZero(dwq, d, beta);
    scaleOrZero(dwk, d, beta);
    // Heads one by one in order, as normGrad's rows: the weight gradients'
    // sums do not depend on the thread count.
    const float invN = 1.0f / float(d);
    for (int64_t v = 0; v < vectors; ++v) {
      const int64_t c = v % (r + 2);
      const float *xr = x + v * d, *dyr = dy + v * d;
      float *dxr = dx + v * d;
      if (c == r + 1) {
        std::memcpy(dxr, dyr, size_t(d) * sizeof(float));
        continue;
      }
      const float *w = c < r ? wq : wk;
      float *dw = c < r ? dwq : dwk;
      float mean, rstd;
      rowStats<true>(xr, d, eps, mean, rstd);
      float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
      for (int64_t j = 0; j < d; ++j) {
        float xhat = xr[j] * rstd;
        sgx += dyr[j] * w[j] * xhat;
        dw[j] += dyr[j] * xhat;
      }
      const float mgx = sgx * invN;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j)
        dxr[j] = math::layerNormGradX(xr[j] * rstd, dyr[j], w[j], rstd, 0.0f,
                                      mgx);
    }
    return Status();
  }

  Status rotaryEmbedding(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                         int64_t features, int64_t heads, int64_t rotDim,
                         float base, float scalingFactor, int64_t posBegin,
                         bool inverse) override {
    const int64_t d = features / (3 * heads), half = rotDim / 2;
    // The angles of the rows: cos then sin (negated for the inverse).
    std::vector<float> cs(size_t(seq * 2 * half));
    for (int64_t r = 0; r < seq; ++r)
      for (int64_t i = 0; i < half; ++i) {
        float a = math::ropeAngle(posBegin + r, i, rotDim, base, scalingFactor);
        cs[size_t(r * 2 * half + i)] = cosf(a);
        cs[size_t(r * 2 * half + half + i)] = inverse ? -sinf(a) : sinf(a);
      }
#pragma omp parallel for num_threads(threads) if (seq * batch * features >= kParallelMin)
    for (int64_t r = 0; r < seq; ++r) {
      const float *c = cs.data() + r * 2 * half, *s = c + half;
      for (int64_t b = 0; b < batch; ++b) {
        // A 16-bit row is staged (a copy in place reads it before writing).
        const int64_t at = (r * batch + b) * features;
        const float *xr = loadSpan(x, at, features, 0);
        float *yr = storeSpan(y, at, features, 1);
        if (xr != yr)
          std::memcpy(yr, xr, size_t(features) * 4);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t which = 0; which < 2; ++which) { // q, then k
            const float *xs = xr + h * 3 * d + which * d;
            float *ys = yr + h * 3 * d + which * d;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
              float y1, y2;
              math::ropeRotate(xs[i], xs[i + half], c[i], s[i], y1, y2);
              ys[i] = y1;
              ys[i + half] = y2;
            }
          }
        finishSpan(y, at, features, yr);
      }
    }
    return Status();
  }

  Status embedding(const int32_t *ids, FloatIn table, FloatOut y,
                   int64_t rows, int64_t localVocab, int64_t dim,
                   int64_t vocabOffset, int64_t vocabSize) override {
    for (int64_t r = 0; r < rows; ++r)
      if (ids[r] < 0 || ids[r] >= vocabSize)
        return outOfRange("vocabulary id ", ids[r], " at row ", r,
                          " is out of range for vocabulary size ", vocabSize);
    const int64_t rowBytes = dim * formatBytes(y.format);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t local = int64_t(ids[r]) - vocabOffset;
      if (local < 0 || local >= localVocab) {
        // Zero bits are +0 in every format.
        std::memset(y.at(r * dim).data, 0, size_t(rowBytes));
      } else if (table.format == y.format) {
        std::memcpy(y.at(r * dim).data, table.at(local * dim).data,
                    size_t(rowBytes));
      } else {
        // A widened row is exact; a narrowed one rounds as a Cast would.
        float *yr = storeSpan(y, r * dim, dim, 1);
        const float *tr = loadSpan(table, local * dim, dim, 0);
        std::memcpy(yr, tr, size_t(dim) * 4);
        finishSpan(y, r * dim, dim, yr);
      }
    }
    return Status();
  }

  Status embeddingGrad(const int32_t *ids, const float *dy, float *dtable,
                       int64_t rows, int64_t localVocab, int64_t dim,
                       int64_t vocabOffset, float beta) override {
    scaleOrZero(dtable, localVocab * dim, beta);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t local = int64_t(ids[r]) - vocabOffset;
      if (local < 0 || local >= localVocab)
        continue;
      const float *dyr = dy + r * dim;
      float *dt = dtable + local * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j)
        dt[j] += dyr[j];
    }
    return Status();
  }

  Status addPositionEmbedding(FloatIn x, FloatIn pos, FloatOut y,
                              int64_t seq, int64_t batch,
                              int64_t dim) override {
    for (int64_t s = 0; s < seq; ++s) {
      const float *pr = loadSpan(pos, s * dim, dim, 0);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = (s * batch + b) * dim;
        const float *xr = loadSpan(x, row, dim, 1);
        float *yr = storeSpan(y, row, dim, 2);
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j)
          yr[j] = xr[j] + pr[j];
        finishSpan(y, row, dim, yr);
      }
    }
    return Status();
  }

  Status positionEmbeddingGrad(const float *dy, float *dpos, int64_t seq,
                               int64_t batch, int64_t dim, int64_t posRows,
                               float beta) override {
    scaleOrZero(dpos, posRows * dim, beta);
    for (int64_t s = 0; s < std::min(seq, posRows); ++s) {
      float *dp = dpos + s * dim;
      for (int64_t b = 0; b < batch; ++b) {
        const float *dyr = dy + (s * batch + b) * dim;
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j)
          dp[j] += dyr[j];
      }
    }
    return Status();
  }

  static Status checkAttentionDims(int64_t seq, int64_t batch, int64_t heads,
                                   int64_t headDim) {
    if (seq * batch * 3 * heads * headDim > INT_MAX ||
        seq * kAttentionBlock > INT_MAX)
      return unimplemented("attention dimensions exceed 32-bit BLAS ints");
    return Status();
  }

  /// Runs body(begin, end) over the `count` (batch, head) pairs of an
  /// attention: with several threads, one contiguous range per OpenMP
  /// thread, OpenBLAS on one thread meanwhile (its GEMMs per head are too
  /// small to split); each head's arithmetic is the same either way.
  template <typename Body> void forEachHead(int64_t count, Body body) {
    if (threads <= 1 || count < 2) {
      body(int64_t(0), count);
      return;
    }
    openblas_set_num_threads(1);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      body(count * t / nt, count * (t + 1) / nt);
    }
    openblas_set_num_threads(threads);
  }

  /// Probabilities of query rows [i0, i0 + rows) against keys [0, kEnd)
  /// into p [rows, kEnd].
  static void attentionProbs(const float *q, const float *k, int64_t ld,
                             int64_t i0, int64_t rows, int64_t kEnd,
                             int64_t headDim, float scale, bool causal,
                             float *p) {
    sgemm(false, true, rows, kEnd, headDim, scale, q + i0 * ld, ld, k, ld, 0.0f,
          p, kEnd);
    softmaxRows(p, rows, kEnd, i0, causal);
  }

  Status attention(const float *qkv, float *out, int64_t seq, int64_t batch,
                   int64_t heads, int64_t headDim, bool causal) override {
    TESSERA_RETURN_IF_ERROR(checkAttentionDims(seq, batch, heads, headDim));
    if (seq == 0 || batch == 0 || heads == 0 || headDim == 0)
      return Status();
    const int64_t ld = batch * 3 * heads * headDim;
    const int64_t ldo = batch * heads * headDim;
    const float scale = float(1.0 / std::sqrt(double(headDim)));
    const int64_t block = std::min(seq, kAttentionBlock);
    forEachHead(batch * heads, [&](int64_t bh0, int64_t bh1) {
      std::vector<float> probs(size_t(block * seq));
      for (int64_t bh = bh0; bh < bh1; ++bh) {
        const float *q = qkv + bh * 3 * headDim;
        const float *k = q + headDim, *v = q + 2 * headDim;
        float *o = out + bh * headDim;
        for (int64_t i0 = 0; i0 < seq; i0 += block) {
          int64_t rows = std::min(block, seq - i0);
          int64_t kEnd = causal ? i0 + rows : seq;
          attentionProbs(q, k, ld, i0, rows, kEnd, headDim, scale, causal,
                         probs.data());
          sgemm(false, false, rows, headDim, kEnd, 1.0f, probs.data(), kEnd, v,
                ld, 0.0f, o + i0 * ldo, ldo);
        }
      }
    });
    return Status();
  }

  Status attentionGrad(const float *qkv, const float *dout, float *dqkv,
                       int64_t seq, int64_t batch, int64_t heads,
                       int64_t headDim, bool causal) override {
    TESSERA_RETURN_IF_ERROR(checkAttentionDims(seq, batch, heads, headDim));
    const int64_t ld = batch * 3 * heads * headDim;
    const int64_t ldo = batch * heads * headDim;
    std::memset(dqkv, 0, size_t(seq * ld) * 4);
    if (seq == 0 || batch == 0 || heads == 0 || headDim == 0)
      return Status();
    const float scale = float(1.0 / std::sqrt(double(headDim)));
    const int64_t block = std::min(seq, kAttentionBlock);
    forEachHead(batch * heads, [&](int64_t bh0, int64_t bh1) {
      std::vector<float> probs(size_t(block * seq)), dprobs(size_t(block * seq));
      float *p = probs.data(), *dp = dprobs.data();
      for (int64_t bh = bh0; bh < bh1; ++bh) {
        const int64_t off = bh * 3 * headDim;
        const float *q = qkv + off, *k = q + headDim, *v = q + 2 * headDim;
        float *dq = dqkv + off, *dk = dq + headDim, *dv = dq + 2 * headDim;
        const float *dO = dout + bh * headDim;
        for (int64_t i0 = 0; i0 < seq; i0 += block) {
          int64_t rows = std::min(block, seq - i0);
          int64_t kEnd = causal ? i0 + rows : seq;
          const float *dOb = dO + i0 * ldo;
          attentionProbs(q, k, ld, i0, rows, kEnd, headDim, scale, causal, p);
          // dV[0:kEnd] += P^T dO
          sgemm(true, false, kEnd, headDim, rows, 1.0f, p, kEnd, dOb, ldo, 1.0f,
                dv, ld);
          // dP = dO V^T
          sgemm(false, true, rows, kEnd, headDim, 1.0f, dOb, ldo, v, ld, 0.0f,
                dp, kEnd);
          // dS = P * (dP - rowsum(dP * P)), in place in dp.
          softmaxGradRows(p, dp, rows, kEnd);
          // dQ = dS K / sqrt(D); dK[0:kEnd] += dS^T Q / sqrt(D)
          sgemm(false, false, rows, headDim, kEnd, scale, dp, kEnd, k, ld, 0.0f,
                dq + i0 * ld, ld);
          sgemm(true, false, kEnd, headDim, rows, scale, dp, kEnd, q + i0 * ld,
                ld, 1.0f, dk, ld);
        }
      }
    });
    return Status();
  }

  //===--------------------------------------------------------------------===//
  // Ring attention (context parallelism). Per (batch, head) and per pair of
  // a local query chunk and a key chunk of the block: skipped when the keys
  // all follow the queries (causal), masked on the diagonal chunk, full
  // otherwise; query rows in blocks of kAttentionBlock.
  //===--------------------------------------------------------------------===//

  /// Calls body(qBegin, kBegin, diagonal) for each query chunk and key
  /// chunk (local row offsets) that is not wholly masked.
  template <typename Body>
  static void forEachChunkPair(const RingAttentionDims &d, int64_t source,
                               Body body) {
    const math::RingChunkPairs pairs = math::ringChunkPairs(d, source);
    for (int i = 0; i < pairs.count; ++i)
      body(pairs.pair[i].q0, pairs.pair[i].k0, pairs.pair[i].diagonal);
  }

  static Status checkRingDims(const RingAttentionDims &d) {
    TESSERA_RETURN_IF_ERROR(checkRingAttentionDims(d));
    return checkAttentionDims(d.seq, d.batch, d.heads, d.headDim);
  }

  Status ringPackKeysValues(const float *qkv, float *kv,
                            const RingAttentionDims &d) override {
    const int64_t D = d.headDim, groups = d.seq * d.batch * d.heads;
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(kv + g * 2 * D, qkv + g * 3 * D + D, size_t(2 * D) * 4);
    return Status();
  }

  Status ringUnpackKeyValueGrads(const float *dkv, float *dqkv,
                                 const RingAttentionDims &d) override {
    const int64_t D = d.headDim, groups = d.seq * d.batch * d.heads;
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(dqkv + g * 3 * D + D, dkv + g * 2 * D, size_t(2 * D) * 4);
    return Status();
  }

  Status ringAttentionStep(const float *qkv, const float *kv, float *o,
                           float *stats, float *lse, const RingAttentionDims &d,
                           int64_t source, bool first) override {
    TESSERA_RETURN_IF_ERROR(checkRingDims(d));
    const int64_t S = d.seq, B = d.batch, H = d.heads, D = d.headDim;
    const int64_t ld = B * H * 3 * D, ldkv = B * H * 2 * D, ldo = B * H * D;
    float *mAll = stats, *lAll = stats + B * H * S;
    if (first) {
      std::fill(o, o + S * ldo, 0.0f);
      std::fill(mAll, mAll + B * H * S, -INFINITY);
      std::fill(lAll, lAll + B * H * S, 0.0f);
    }
    const float scale = float(1.0 / std::sqrt(double(D)));
    const int64_t chunk = S / 2, block = std::min(chunk, kAttentionBlock);
    forEachHead(B * H, [&](int64_t bh0, int64_t bh1) {
      std::vector<float> sc(size_t(std::max<int64_t>(1, block * chunk)));
      for (int64_t bh = bh0; bh < bh1; ++bh) {
        const float *q = qkv + bh * 3 * D;
        const float *k = kv + bh * 2 * D, *v = k + D;
        float *ob = o + bh * D, *m = mAll + bh * S, *l = lAll + bh * S;
        forEachChunkPair(d, source, [&](int64_t q0, int64_t k0, bool diag) {
          for (int64_t i0 = 0; i0 < chunk; i0 += block) {
            const int64_t rows = std::min(block, chunk - i0);
            const int64_t kEnd = diag ? i0 + rows : chunk;
            float *p = sc.data();
            sgemm(false, true, rows, kEnd, D, scale, q + (q0 + i0) * ld, ld,
                  k + k0 * ldkv, ldkv, 0.0f, p, kEnd);
            for (int64_t i = 0; i < rows; ++i) {
              float *row = p + i * kEnd;
              const int64_t r = q0 + i0 + i;
              const int64_t valid = diag ? i0 + i + 1 : kEnd;
              const float mx = std::max(m[r], rowMax(row, valid));
              for (int64_t j = 0; j < valid; ++j)
                row[j] = expApprox(row[j] - mx);
              for (int64_t j = valid; j < kEnd; ++j)
                row[j] = 0.0f;
              const float alpha =
                  m[r] == -INFINITY ? 0.0f : expApprox(m[r] - mx);
              l[r] = l[r] * alpha + laneDot(row, nullptr, valid);
              m[r] = mx;
              float *orow = ob + r * ldo;
              for (int64_t j = 0; j < D; ++j)
                orow[j] *= alpha;
            }
            sgemm(false, false, rows, D, kEnd, 1.0f, p, kEnd, v + k0 * ldkv,
                  ldkv, 1.0f, ob + (q0 + i0) * ldo, ldo);
          }
        });
        if (!lse)
          continue;
        for (int64_t r = 0; r < S; ++r) {
          const float inv = 1.0f / l[r];
          float *orow = ob + r * ldo;
          for (int64_t j = 0; j < D; ++j)
            orow[j] *= inv;
          lse[r * B * H + bh] = m[r] + std::log(l[r]);
        }
      }
    });
    return Status();
  }

  Status ringAttentionGradStep(const float *qkv, const float *o,
                               const float *lse, const float *dout,
                               const float *kv, float *dkv, float *delta,
                               float *dqkv, const RingAttentionDims &d,
                               int64_t source, bool first) override {
    TESSERA_RETURN_IF_ERROR(checkRingDims(d));
    const int64_t S = d.seq, B = d.batch, H = d.heads, D = d.headDim;
    const int64_t ld = B * H * 3 * D, ldkv = B * H * 2 * D, ldo = B * H * D;
    if (first) {
      std::fill(dqkv, dqkv + S * ld, 0.0f);
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t r = 0; r < S; ++r)
          delta[bh * S + r] =
              laneDot(o + r * ldo + bh * D, dout + r * ldo + bh * D, D);
    }
    const float scale = float(1.0 / std::sqrt(double(D)));
    const int64_t chunk = S / 2, block = std::min(chunk, kAttentionBlock);
    const size_t tile = size_t(std::max<int64_t>(1, block * chunk));
    forEachHead(B * H, [&](int64_t bh0, int64_t bh1) {
      std::vector<float> probs(tile), dprobs(tile);
      for (int64_t bh = bh0; bh < bh1; ++bh) {
        const float *q = qkv + bh * 3 * D;
        float *dq = dqkv + bh * 3 * D;
        const float *k = kv + bh * 2 * D, *v = k + D;
        float *dk = dkv + bh * 2 * D, *dv = dk + D;
        const float *dO = dout + bh * D;
        const float *dl = delta + bh * S;
        forEachChunkPair(d, source, [&](int64_t q0, int64_t k0, bool diag) {
          for (int64_t i0 = 0; i0 < chunk; i0 += block) {
            const int64_t rows = std::min(block, chunk - i0);
            const int64_t kEnd = diag ? i0 + rows : chunk;
            const int64_t r0 = q0 + i0;
            float *p = probs.data(), *dp = dprobs.data();
            sgemm(false, true, rows, kEnd, D, scale, q + r0 * ld, ld,
                  k + k0 * ldkv, ldkv, 0.0f, p, kEnd);
            for (int64_t i = 0; i < rows; ++i) {
              float *row = p + i * kEnd;
              const float rowLse = lse[(r0 + i) * B * H + bh];
              const int64_t valid = diag ? i0 + i + 1 : kEnd;
              for (int64_t j = 0; j < valid; ++j)
                row[j] = expApprox(row[j] - rowLse);
              for (int64_t j = valid; j < kEnd; ++j)
                row[j] = 0.0f;
            }
            // dV += P^T dO; dP = dO V^T.
            sgemm(true, false, kEnd, D, rows, 1.0f, p, kEnd, dO + r0 * ldo, ldo,
                  1.0f, dv + k0 * ldkv, ldkv);
            sgemm(false, true, rows, kEnd, D, 1.0f, dO + r0 * ldo, ldo,
                  v + k0 * ldkv, ldkv, 0.0f, dp, kEnd);
            // dS = P * (dP - rowsum(dO * O)).
            for (int64_t i = 0; i < rows; ++i) {
              const float di = dl[r0 + i];
              float *dr = dp + i * kEnd;
              const float *pr = p + i * kEnd;
              for (int64_t j = 0; j < kEnd; ++j)
                dr[j] = pr[j] * (dr[j] - di);
            }
            // dQ += dS K / sqrt(D); dK += dS^T Q / sqrt(D).
            sgemm(false, false, rows, D, kEnd, scale, dp, kEnd, k + k0 * ldkv,
                  ldkv, 1.0f, dq + r0 * ld, ld);
            sgemm(true, false, kEnd, D, rows, scale, dp, kEnd, q + r0 * ld, ld,
                  1.0f, dk + k0 * ldkv, ldkv);
          }
        });
      }
    });
    return Status();
  }

  //===--------------------------------------------------------------------===//
  // Mixture of experts
  //===--------------------------------------------------------------------===//

  /// The row of each routing choice (t, j) in expert order (expert-major,
  /// token order within an expert: a stable counting sort), and the counts.
  static Status moeRows(const int32_t *indices, int64_t choices,
                        int64_t experts, std::vector<int64_t> &rowOf,
                        std::vector<int64_t> &counts) {
    counts.assign(size_t(experts), 0);
    for (int64_t n = 0; n < choices; ++n) {
      const int32_t e = indices[n];
      if (e < -1 || e >= experts)
        return outOfRange("expert index ", e, " of routing choice ", n,
                          " is out of range for ", experts, " experts");
      if (e >= 0)
        ++counts[size_t(e)];
    }
    std::vector<int64_t> next(size_t(experts), 0);
    for (int64_t e = 1; e < experts; ++e)
      next[size_t(e)] = next[size_t(e - 1)] + counts[size_t(e - 1)];
    // A dropped choice (index -1, expert capacity) has no row.
    rowOf.resize(size_t(choices));
    for (int64_t n = 0; n < choices; ++n)
      rowOf[size_t(n)] = indices[n] < 0 ? -1 : next[size_t(indices[n])]++;
    return Status();
  }

  Status moeRouter(const float *logits, float *probs, int32_t *indices,
                   int64_t tokens, int64_t experts, int64_t k) override {
    if (k < 1 || k > experts)
      return invalidArgument("router topk ", k, " is not in [1, ", experts,
                             "]");
    for (int64_t t = 0; t < tokens; ++t)
      math::moeTopK(logits + t * experts, experts, k, probs + t * k,
                    indices + t * k);
    return Status();
  }

  Status moeRouterGrad(const float *probs, const int32_t *indices,
                       const float *dprobs, float *dlogits, int64_t tokens,
                       int64_t experts, int64_t k) override {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (indices[t * k + j] < 0 || indices[t * k + j] >= experts)
          return outOfRange("expert index ", indices[t * k + j],
                            " of token ", t, " is out of range for ", experts,
                            " experts");
    for (int64_t t = 0; t < tokens; ++t)
      math::moeTopKGrad(probs + t * k, indices + t * k, dprobs + t * k, experts,
                        k, dlogits + t * experts);
    return Status();
  }

  /// Per-expert token counts and the softmax over all experts per token.
  static Status moeAuxTerms(const float *logits, const int32_t *indices,
                            int64_t tokens, int64_t experts, int64_t k,
                            std::vector<double> &counts, std::vector<float> &softmax) {
    counts.assign(size_t(experts), 0.0);
    for (int64_t n = 0; n < tokens * k; ++n) {
      if (indices[n] < 0 || indices[n] >= experts)
        return outOfRange("expert index ", indices[n], " of routing choice ",
                          n, " is out of range for ", experts, " experts");
      counts[size_t(indices[n])] += 1.0;
    }
    softmax.assign(logits, logits + tokens * experts);
    softmaxRows(softmax.data(), tokens, experts, 0, false);
    return Status();
  }

  /// The counts and token count the loss uses: this rank's (counted from
  /// the choices), or all ranks' (`all`, with T = sum / k).
  static double auxTerms(const float *all, int64_t tokens, int64_t experts,
                         int64_t k, std::vector<double> &counts) {
    if (!all)
      return double(tokens);
    double sum = 0.0;
    for (int64_t e = 0; e < experts; ++e)
      sum += counts[size_t(e)] = double(all[e]);
    return sum / double(k);
  }

  Status moeAuxLoss(const float *logits, const int32_t *indices,
                    const float *allCounts, float *y, int64_t tokens,
                    int64_t experts, int64_t k, float coeff) override {
    std::vector<double> counts;
    std::vector<float> p;
    TESSERA_RETURN_IF_ERROR(
        moeAuxTerms(logits, indices, tokens, experts, k, counts, p));
    const double total = auxTerms(allCounts, tokens, experts, k, counts);
    double sum = 0.0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t e = 0; e < experts; ++e)
        sum += double(p[size_t(t * experts + e)]) * counts[size_t(e)];
    y[0] = total > 0 ? float(sum * math::moeAuxScale(coeff, experts, k, total))
                     : 0.0f;
    return Status();
  }

  Status moeAuxLossGrad(const float *logits, const int32_t *indices,
                        const float *allCounts, const float *dy,
                        float *dlogits, int64_t tokens, int64_t experts,
                        int64_t k, float coeff) override {
    std::vector<double> counts;
    std::vector<float> p;
    TESSERA_RETURN_IF_ERROR(
        moeAuxTerms(logits, indices, tokens, experts, k, counts, p));
    const double total = auxTerms(allCounts, tokens, experts, k, counts);
    const float scale =
        total > 0
            ? dy[0] * float(math::moeAuxScale(coeff, experts, k, total))
            : 0.0f;
    // d/dlogits of sum_e p[t, e] g_e (g_e = scale count_e): the softmax
    // backward p (g - p . g).
    for (int64_t t = 0; t < tokens; ++t) {
      const float *pt = p.data() + t * experts;
      float dot = 0.0f;
      for (int64_t e = 0; e < experts; ++e)
        dot += pt[e] * float(counts[size_t(e)]) * scale;
      for (int64_t e = 0; e < experts; ++e)
        dlogits[t * experts + e] =
            pt[e] * (float(counts[size_t(e)]) * scale - dot);
    }
    return Status();
  }

  Status moeTokenCounts(const int32_t *indices, float *counts, int64_t choices,
                        int64_t experts) override {
    std::fill(counts, counts + experts, 0.0f);
    for (int64_t n = 0; n < choices; ++n) {
      if (indices[n] == -1) // dropped
        continue;
      if (indices[n] < 0 || indices[n] >= experts)
        return outOfRange("expert index ", indices[n], " of routing choice ",
                          n, " is out of range for ", experts, " experts");
      counts[indices[n]] += 1.0f;
    }
    return Status();
  }

  Status moeDispatch(const float *x, const int32_t *indices, float *rows,
                     int32_t *counts, int64_t tokens, int64_t k,
                     int64_t experts, int64_t features) override {
    std::vector<int64_t> rowOf, n;
    TESSERA_RETURN_IF_ERROR(moeRows(indices, tokens * k, experts, rowOf, n));
    int64_t kept = 0;
    for (int64_t e = 0; e < experts; ++e) {
      counts[e] = int32_t(n[size_t(e)]);
      kept += n[size_t(e)];
    }
    for (int64_t c = 0; c < tokens * k; ++c)
      if (rowOf[size_t(c)] >= 0)
        std::memcpy(rows + rowOf[size_t(c)] * features, x + (c / k) * features,
                    size_t(features) * 4);
    // The rows of dropped choices (past the kept ones) are zero.
    std::fill(rows + kept * features, rows + tokens * k * features, 0.0f);
    return Status();
  }

  Status moeDispatchGrad(const float *drows, const int32_t *indices, float *dx,
                         int64_t tokens, int64_t k, int64_t experts,
                         int64_t features) override {
    std::vector<int64_t> rowOf, n;
    TESSERA_RETURN_IF_ERROR(moeRows(indices, tokens * k, experts, rowOf, n));
    for (int64_t t = 0; t < tokens; ++t) {
      float *d = dx + t * features;
      std::fill(d, d + features, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (rowOf[size_t(t * k + j)] < 0)
          continue;
        const float *r = drows + rowOf[size_t(t * k + j)] * features;
        for (int64_t f = 0; f < features; ++f)
          d[f] += r[f];
      }
    }
    return Status();
  }

  Status moeCapacityDrop(const float *probs, const int32_t *indices,
                         float *keptProbs, int32_t *keptIndices, int64_t tokens,
                         int64_t k, int64_t experts, int64_t capacity,
                         bool byPosition) override {
    std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(experts));
    for (int64_t c = 0; c < tokens * k; ++c) {
      const int32_t e = indices[c];
      if (e < -1 || e >= experts)
        return outOfRange("expert index ", e, " of routing choice ", c,
                          " is out of range for ", experts, " experts");
      keptProbs[c] = probs[c];
      keptIndices[c] = e;
      if (e >= 0)
        chosen[size_t(e)].push_back(c);
    }
    for (std::vector<int64_t> &list : chosen) {
      if (int64_t(list.size()) <= capacity)
        continue;
      // Token order already; by probability, the highest first, ties to the
      // earlier token.
      if (!byPosition)
        std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
          return probs[a] > probs[b];
        });
      for (size_t i = size_t(std::max<int64_t>(capacity, 0)); i < list.size();
           ++i) {
        keptProbs[list[i]] = 0.0f;
        keptIndices[list[i]] = -1;
      }
    }
    return Status();
  }

  Status moeCapacityDropGrad(const float *dkept, const int32_t *keptIndices,
                             float *dprobs, int64_t n) override {
    for (int64_t c = 0; c < n; ++c)
      dprobs[c] = keptIndices[c] >= 0 ? dkept[c] : 0.0f;
    return Status();
  }

  Status groupedLinear(FloatFormat inputs, const void *xIn,
                       const int32_t *counts, const void *wIn, float *y,
                       int64_t rows, int64_t in, int64_t out,
                       int64_t experts) override {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> off,
                             expertGroupOffsets(counts, experts, rows));
    // 16-bit rows and weights widened exactly, as in gemmHalf.
    std::vector<const float *> f32 =
        widenedInputs(inputs, {{xIn, rows * in}, {wIn, experts * out * in}});
    const float *x = f32[0], *w = f32[1];
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
      if (n > 0)
        sgemm(false, true, n, out, in, 1.0f, x + r0 * in, in,
              w + e * out * in, in, 0.0f, y + r0 * out, out);
    }
    std::fill(y + off.back() * out, y + rows * out, 0.0f);
    return Status();
  }

  Status groupedLinearGrad(FloatFormat inputs, const void *xIn,
                           const int32_t *counts, const void *wIn,
                           const void *dyIn, float *dx, float *dw,
                           int64_t rows, int64_t in, int64_t out,
                           int64_t experts, float beta) override {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> off,
                             expertGroupOffsets(counts, experts, rows));
    std::vector<const float *> f32 =
        widenedInputs(inputs, {{xIn, rows * in},
                               {wIn, experts * out * in},
                               {dyIn, rows * out}});
    const float *x = f32[0], *w = f32[1], *dy = f32[2];
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
      float *dwe = dw + e * out * in;
      if (n == 0) {
        scaleOrZero(dwe, out * in, beta);
        continue;
      }
      sgemm(false, false, n, in, out, 1.0f, dy + r0 * out, out,
            w + e * out * in, in, 0.0f, dx + r0 * in, in);
      sgemm(true, false, out, in, n, 1.0f, dy + r0 * out, out, x + r0 * in,
            in, beta, dwe, in);
    }
    std::fill(dx + off.back() * in, dx + rows * in, 0.0f);
    return Status();
  }

  Status moeCombine(const float *rows, const float *probs,
                    const int32_t *indices, float *y, int64_t tokens, int64_t k,
                    int64_t experts, int64_t features) override {
    std::vector<int64_t> rowOf, n;
    TESSERA_RETURN_IF_ERROR(moeRows(indices, tokens * k, experts, rowOf, n));
    for (int64_t t = 0; t < tokens; ++t) {
      float *yt = y + t * features;
      std::fill(yt, yt + features, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (rowOf[size_t(t * k + j)] < 0)
          continue;
        const float p = probs[t * k + j];
        const float *r = rows + rowOf[size_t(t * k + j)] * features;
        for (int64_t f = 0; f < features; ++f)
          yt[f] += p * r[f];
      }
    }
    return Status();
  }

  Status moeCombineGrad(const float *rows, const float *probs,
                        const int32_t *indices, const float *dy, float *drows,
                        float *dprobs, int64_t tokens, int64_t k,
                        int64_t experts, int64_t features) override {
    std::vector<int64_t> rowOf, n;
    TESSERA_RETURN_IF_ERROR(moeRows(indices, tokens * k, experts, rowOf, n));
    const int64_t kept = std::accumulate(n.begin(), n.end(), int64_t(0));
    std::fill(drows + kept * features, drows + tokens * k * features, 0.0f);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = rowOf[size_t(t * k + j)];
        if (row < 0) {
          dprobs[t * k + j] = 0.0f;
          continue;
        }
        const float p = probs[t * k + j];
        const float *d = dy + t * features;
        float *dr = drows + row * features;
        for (int64_t f = 0; f < features; ++f)
          dr[f] = p * d[f];
        dprobs[t * k + j] = laneDot(rows + row * features, d, features);
      }
    return Status();
  }

  // The loss statistics load 16-bit logits row by row into the staging
  // buffer (exact), so they equal a Cast to f32 and the f32 kernel.
  Status logitsMax(FloatIn z, float *m, int64_t rows,
                   int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float *zr = loadSpan(z, r * cols, cols, 0);
      float mx = rowMax(zr, cols);
      m[r] = mx;
    }
    return Status();
  }

  static Status checkLabel(int32_t label, int64_t row, int64_t numClasses,
                           int64_t ignoreIndex) {
    if (label != ignoreIndex && (label < 0 || label >= numClasses))
      return outOfRange("label ", label, " at row ", row,
                        " is out of range for ", numClasses,
                        " classes (ignore_index ", ignoreIndex, ")");
    return Status();
  }

  Status crossEntropyStats(FloatIn z, const int32_t *t, const float *m,
                           float *se, float *pl, int64_t rows, int64_t cols,
                           int64_t vocabOffset, int64_t numClasses,
                           int64_t ignoreIndex) override {
    for (int64_t r = 0; r < rows; ++r) {
      TESSERA_RETURN_IF_ERROR(checkLabel(t[r], r, numClasses, ignoreIndex));
      const float *zr = loadSpan(z, r * cols, cols, 0);
      const float mr = m[r];
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j)
        sum += expApprox(zr[j] - mr);
      se[r] = sum;
      int64_t local = int64_t(t[r]) - vocabOffset;
      pl[r] =
          t[r] != ignoreIndex && local >= 0 && local < cols ? zr[local] : 0.0f;
    }
    return Status();
  }

  Status logitsStats(FloatIn z, const int32_t *t, float *m, float *se,
                     float *pl, int64_t rows, int64_t cols,
                     int64_t ignoreIndex) override {
    for (int64_t r = 0; r < rows; ++r)
      TESSERA_RETURN_IF_ERROR(checkLabel(t[r], r, cols, ignoreIndex));
    // Rows on threads: each row's max and sum are computed as logitsMax and
    // crossEntropyStats compute them, while the row is in cache.
#pragma omp parallel for num_threads(threads) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float *zr = loadSpan(z, r * cols, cols, 0);
      const float mr = rowMax(zr, cols);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j)
        sum += expApprox(zr[j] - mr);
      m[r] = mr;
      se[r] = sum;
      pl[r] = t[r] != ignoreIndex ? zr[t[r]] : 0.0f;
    }
    return Status();
  }

  Status crossEntropyFromStats(const float *se, const float *pl, const float *m,
                               const int32_t *t, float *loss, int64_t rows,
                               int64_t ignoreIndex) override {
    for (int64_t r = 0; r < rows; ++r)
      loss[r] = t[r] == ignoreIndex ? 0.0f
                                    : math::crossEntropyLoss(se[r], m[r], pl[r]);
    return Status();
  }

  Status crossEntropyStatsGrad(FloatIn z, const int32_t *t, const float *m,
                               const float *se, const float *dl, FloatOut dz,
                               int64_t rows, int64_t cols, int64_t vocabOffset,
                               int64_t numClasses,
                               int64_t ignoreIndex) override {
    for (int64_t r = 0; r < rows; ++r) {
      TESSERA_RETURN_IF_ERROR(checkLabel(t[r], r, numClasses, ignoreIndex));
      if (t[r] == ignoreIndex) {
        // Zero bits are +0 in every format.
        std::memset(dz.at(r * cols).data, 0,
                    size_t(cols * formatBytes(dz.format)));
        continue;
      }
      const float *zr = loadSpan(z, r * cols, cols, 0);
      float *dr = storeSpan(dz, r * cols, cols, 1);
      const float mr = m[r], s = dl[r] / se[r];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dr[j] = expApprox(zr[j] - mr) * s;
      int64_t local = int64_t(t[r]) - vocabOffset;
      if (local >= 0 && local < cols)
        dr[local] -= dl[r];
      finishSpan(dz, r * cols, cols, dr);
    }
    return Status();
  }

  Status tokenMean(const float *loss, const int32_t *t, float *y, int64_t rows,
                   int64_t ignoreIndex, const float *count) override {
    double sum = 0.0;
    int64_t valid = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (t[r] != ignoreIndex) {
        sum += double(loss[r]);
        ++valid;
      }
    const double n = count ? double(count[0]) : double(valid);
    y[0] = n != 0.0 ? float(sum / n) : 0.0f;
    return Status();
  }

  Status tokenCount(const int32_t *t, float *n, int64_t rows,
                    int64_t ignoreIndex) override {
    int64_t valid = 0;
    for (int64_t r = 0; r < rows; ++r)
      valid += t[r] != ignoreIndex;
    n[0] = float(valid);
    return Status();
  }

  Status dropout(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                 int64_t hidden, int64_t seqOffset, int64_t seqTotal,
                 int64_t firstSample, uint64_t seed, int64_t stream,
                 float rate) override {
    if (rate < 0.0f || rate >= 1.0f)
      return invalidArgument("dropout rate must be in [0, 1), got ", rate);
    const uint64_t hash = fnv1a64("dropout." + std::to_string(stream));
    const float scale = 1.0f / (1.0f - rate);
    const uint64_t threshold = math::dropoutThreshold(rate);
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t at = (s * batch + b) * hidden;
        const float *xr = loadSpan(x, at, hidden, 0);
        float *yr = storeSpan(y, at, hidden, 1);
        for (int64_t h = 0; h < hidden; ++h) {
          uint64_t counter = math::dropoutCounter(firstSample + b, seqTotal,
                                                  s + seqOffset, hidden, h);
          bool keep = math::philoxWord(seed, hash, counter) >= threshold;
          yr[h] = keep ? xr[h] * scale : 0.0f;
        }
        finishSpan(y, at, hidden, yr);
      }
    return Status();
  }

  Status tokenMeanGrad(const float *dy, const int32_t *t, float *dl,
                       int64_t rows, int64_t ignoreIndex,
                       const float *count) override {
    int64_t valid = 0;
    for (int64_t r = 0; r < rows; ++r)
      valid += t[r] != ignoreIndex;
    const float n = count ? count[0] : float(valid);
    const float v = n != 0.0f ? dy[0] / n : 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      dl[r] = t[r] != ignoreIndex ? v : 0.0f;
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
