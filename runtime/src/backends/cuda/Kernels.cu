//===- Kernels.cu - CUDA kernels of the compute opcodes -------------------===//
//
// One kernel (or two) per Backend method that is not a GEMM. The math of
// each element or row comes from tessera/rt/math/*.h, which the CPU backend
// uses too; what is written here is only the parallel decomposition:
//   - elementwise kernels: grid-stride loops over the elements;
//   - row kernels (layer norm, softmax, cross-entropy): one block per row,
//     warp-shuffle reductions;
//   - column reductions (bias and layer-norm parameter gradients): blocks of
//     32 columns by 8 row lanes;
//   - the embedding gradient: a scatter-add with atomics (its sums are in no
//     fixed order, the one result that is not bitwise reproducible).
// Errors that depend on data go to the DeviceError record (DeviceError.h).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "DeviceCommon.cuh"

#include "tessera/rt/BF16.h"
#include "tessera/rt/math/Kernels.h"
#include "tessera/rt/math/Philox.h"

#include <algorithm>

namespace tessera::rt::cuda {
namespace {

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

// The kernels of the activations take their activation operands as
// Floats<F> accessors (DeviceCommon.cuh): any FloatFormat, computed in f32.
template <class X, class Y>
__global__ void biasAddKernel(X x, const float *bias, Y y, int64_t n,
                              int64_t cols) {
  TESSERA_GRID_LOOP(i, n) { y.store(i, x[i] + bias[i % cols]); }
}
template <class A, class B, class C>
__global__ void addKernel(A a, B b, C c, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { c.store(i, a[i] + b[i]); }
}
__global__ void geluKernel(const float *x, float *y, int64_t n, bool tanh) {
  if (tanh) {
    TESSERA_GRID_LOOP(i, n) { y[i] = math::geluTanh(x[i]); }
  } else {
    TESSERA_GRID_LOOP(i, n) { y[i] = math::gelu(x[i]); }
  }
}
__global__ void geluGradKernel(const float *x, const float *dy, float *dx,
                               int64_t n, bool tanh) {
  if (tanh) {
    TESSERA_GRID_LOOP(i, n) { dx[i] = math::geluTanhGrad(x[i], dy[i]); }
  } else {
    TESSERA_GRID_LOOP(i, n) { dx[i] = math::geluGrad(x[i], dy[i]); }
  }
}
template <class X, class Y>
__global__ void biasGeluKernel(X x, const float *bias, Y y, int64_t n,
                               int64_t cols, bool tanh) {
  if (tanh) {
    TESSERA_GRID_LOOP(i, n) { y.store(i, math::geluTanh(x[i] + bias[i % cols])); }
  } else {
    TESSERA_GRID_LOOP(i, n) { y.store(i, math::gelu(x[i] + bias[i % cols])); }
  }
}
// Element i of the [rows, n] result: row i / n, column i % n.
template <class X, class Y>
__global__ void swigluKernel(X x, Y y, int64_t total, int64_t n) {
  TESSERA_GRID_LOOP(i, total) {
    const X row = x + (i / n) * 2 * n;
    int64_t j = i % n;
    y.store(i, math::swiglu(row[j], row[n + j]));
  }
}
template <class X, class DX>
__global__ void swigluGradKernel(X x, const float *dy, DX dx, int64_t total,
                                 int64_t n) {
  TESSERA_GRID_LOOP(i, total) {
    int64_t r = i / n, j = i % n;
    const X row = x + r * 2 * n;
    float dgate, dup;
    math::swigluGrad(row[j], row[n + j], dy[i], dgate, dup);
    dx.store(r * 2 * n + j, dgate);
    dx.store(r * 2 * n + n + j, dup);
  }
}
// One thread per element of the head-major y [rows, heads, 3, d]: a copy
// from the grouped x [rows, groups, heads/groups + 2, d].
template <class X, class Y>
__global__ void repeatKVKernel(X x, Y y, int64_t total, int64_t heads,
                               int64_t groups, int64_t d) {
  const int64_t r = heads / groups;
  TESSERA_GRID_LOOP(i, total) {
    const int64_t j = i % d, part = (i / d) % 3, head = (i / (3 * d)) % heads;
    const int64_t row = i / (3 * d * heads);
    const int64_t g = head / r, slot = part == 0 ? head % r : r + part - 1;
    y.store(i, x[(row * groups + g) * (r + 2) * d + slot * d + j]);
  }
}
// One thread per element of the grouped dx: a query's gradient copied, a
// key's or value's summed over the group's heads in head order.
template <class DY, class DX>
__global__ void repeatKVGradKernel(DY dy, DX dx, int64_t total, int64_t heads,
                                   int64_t groups, int64_t d) {
  const int64_t r = heads / groups;
  TESSERA_GRID_LOOP(i, total) {
    const int64_t j = i % d, slot = (i / d) % (r + 2);
    const int64_t g = (i / ((r + 2) * d)) % groups;
    const int64_t row = i / ((r + 2) * d * groups);
    const DY base = dy + row * heads * 3 * d;
    if (slot < r) {
      dx.store(i, base[((g * r + slot) * 3) * d + j]);
    } else {
      const int64_t part = slot - r + 1;
      float sum = 0.0f;
      for (int64_t h = 0; h < r; ++h)
        sum += base[((g * r + h) * 3 + part) * d + j];
      dx.store(i, sum);
    }
  }
}
// QK-norm: one thread per head vector of d features (q, k or v); the
// weight gradients one thread per (q or k, feature), over the vectors in
// order.
__device__ float qkRstd(const float *xr, int64_t d, float eps) {
  float sq = 0.0f;
  for (int64_t j = 0; j < d; ++j)
    sq += xr[j] * xr[j];
  return math::layerNormRstd(sq, d, eps);
}
__global__ void qkNormKernel(const float *x, const float *wq, const float *wk,
                             float *y, int64_t vectors, int64_t per,
                             int64_t d, float eps) {
  TESSERA_GRID_LOOP(v, vectors) {
    const int64_t c = v % per;
    const float *xr = x + v * d;
    float *yr = y + v * d;
    if (c == per - 1) {
      for (int64_t j = 0; j < d; ++j)
        yr[j] = xr[j];
      continue;
    }
    const float *w = c < per - 2 ? wq : wk;
    const float rstd = qkRstd(xr, d, eps);
    for (int64_t j = 0; j < d; ++j)
      yr[j] = math::layerNormOut(xr[j], 0.0f, rstd, w[j], 0.0f);
  }
}
__global__ void qkNormGradXKernel(const float *x, const float *wq,
                                  const float *wk, const float *dy, float *dx,
                                  int64_t vectors, int64_t per, int64_t d,
                                  float eps) {
  TESSERA_GRID_LOOP(v, vectors) {
    const int64_t c = v % per;
    const float *xr = x + v * d, *dyr = dy + v * d;
    float *dxr = dx + v * d;
    if (c == per - 1) {
      for (int64_t j = 0; j < d; ++j)
        dxr[j] = dyr[j];
      continue;
    }
    const float *w = c < per - 2 ? wq : wk;
    const float rstd = qkRstd(xr, d, eps);
    float sgx = 0.0f;
    for (int64_t j = 0; j < d; ++j)
      sgx += dyr[j] * w[j] * xr[j] * rstd;
    const float mgx = sgx / float(d);
    for (int64_t j = 0; j < d; ++j)
      dxr[j] = math::layerNormGradX(xr[j] * rstd, dyr[j], w[j], rstd, 0.0f,
                                    mgx);
  }
}
__global__ void qkNormGradWKernel(const float *x, const float *dy, float *dwq,
                                  float *dwk, int64_t vectors, int64_t per,
                                  int64_t d, float eps, float beta) {
  TESSERA_GRID_LOOP(i, 2 * d) {
    const bool key = i >= d;
    const int64_t j = i % d;
    float acc = 0.0f;
    for (int64_t v = 0; v < vectors; ++v) {
      const int64_t c = v % per;
      if (c == per - 1 || (c == per - 2) != key)
        continue;
      const float *xr = x + v * d;
      acc += dy[v * d + j] * xr[j] * qkRstd(xr, d, eps);
    }
    float *dw = key ? dwk : dwq;
    dw[j] = beta == 0.0f ? acc : beta * dw[j] + acc;
  }
}
__global__ void reluKernel(const float *x, float *y, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}
__global__ void reluGradKernel(const float *x, const float *dy, float *dx,
                               int64_t n) {
  TESSERA_GRID_LOOP(i, n) { dx[i] = math::reluGrad(x[i], dy[i]); }
}
__global__ void meanGradKernel(const float *dy, float *dx, int64_t n) {
  const float v = dy[0] / float(n);
  TESSERA_GRID_LOOP(i, n) { dx[i] = v; }
}
__global__ void fillKernel(float *y, float value, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] = value; }
}
__global__ void scaleKernel(const float *x, float *y, float alpha,
                            int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] = alpha * x[i]; }
}
__global__ void axpyKernel(float alpha, const float *x, float *y, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] += alpha * x[i]; }
}
__global__ void maskColumnsKernel(const float *x, float *y, int64_t cols,
                                  int64_t keep, float fill, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] = i % cols < keep ? x[i] : fill; }
}
__global__ void fillHalfKernel(uint16_t *y, uint16_t value, int64_t n) {
  TESSERA_GRID_LOOP(i, n) { y[i] = value; }
}
template <FloatFormat H>
__global__ void scaleHalfKernel(const uint16_t *x, uint16_t *y, float alpha,
                                int64_t n) {
  TESSERA_GRID_LOOP(i, n) { storeFloat<H>(y, i, alpha * loadFloat<H>(x, i)); }
}
template <FloatFormat H>
__global__ void axpyHalfKernel(float alpha, const uint16_t *x, uint16_t *y,
                               int64_t n) {
  TESSERA_GRID_LOOP(i, n) {
    storeFloat<H>(y, i, loadFloat<H>(y, i) + alpha * loadFloat<H>(x, i));
  }
}

/// Y = convert(X (+ beta Y)): the sum in f32, one rounding to a 16-bit Y.
template <FloatFormat X, FloatFormat Y, bool Accumulate>
__global__ void castKernel(const void *x, void *y, int64_t n, float beta) {
  TESSERA_GRID_LOOP(i, n) {
    float v = loadFloat<X>(x, i);
    if constexpr (Accumulate)
      v += beta * loadFloat<Y>(y, i);
    storeFloat<Y>(y, i, v);
  }
}

//===----------------------------------------------------------------------===//
// Optimizers: one kernel per bucket (Megatron's multi-tensor apply over the
// distributed optimizer's contiguous buffers).
//===----------------------------------------------------------------------===//

__global__ void adamKernel(float *p, const float *g, float *m, float *v,
                           int64_t n, const int64_t *iteration, float lr,
                           float beta1, float beta2, float eps,
                           float weightDecay, DeviceError *err) {
  __shared__ float c1, c2;
  __shared__ bool bad;
  if (threadIdx.x == 0) {
    const int64_t step = *iteration;
    bad = step < 1;
    if (bad) {
      if (blockIdx.x == 0)
        recordError(err, kAdamIteration, step, 0, 0, 0);
    } else {
      c1 = math::adamBiasCorrection(beta1, step);
      c2 = math::adamBiasCorrection(beta2, step);
    }
  }
  __syncthreads();
  if (bad)
    return;
  TESSERA_GRID_LOOP(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    math::adamUpdate(pi, g[i], mi, vi, beta1, beta2, c1, c2, lr, eps,
                     weightDecay);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void sgdKernel(float *p, const float *g, int64_t n, float lr,
                          float weightDecay) {
  TESSERA_GRID_LOOP(i, n) {
    float pi = p[i];
    math::sgdUpdate(pi, g[i], lr, weightDecay);
    p[i] = pi;
  }
}

__global__ void sgdMomentumKernel(float *p, const float *g, float *b,
                                  int64_t n, float lr, float weightDecay,
                                  float momentum) {
  TESSERA_GRID_LOOP(i, n) {
    float pi = p[i], bi = b[i];
    math::sgdMomentumUpdate(pi, g[i], bi, lr, weightDecay, momentum);
    p[i] = pi;
    b[i] = bi;
  }
}

//===----------------------------------------------------------------------===//
// Gradient clipping: a sum of squares in f64 over a fixed grid (so the same
// sum on every run of the same size: kSumBlocks partials, each a fixed
// stride of the elements, then one block summing the partials in order),
// the norm and coefficient, and the scaling by a device scalar.
//===----------------------------------------------------------------------===//

template <FloatFormat F>
__global__ void sumSquaresPartialKernel(const void *x, int64_t n,
                                        double *partial) {
  double sum = 0.0;
  TESSERA_GRID_LOOP(i, n) {
    double v = double(loadFloat<F>(x, i));
    sum += v * v;
  }
  sum = blockSumD(sum);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = sum;
}

__global__ void sumSquaresFinalKernel(const double *partial, int blocks,
                                      float *y, bool accumulate) {
  double sum = 0.0;
  for (int b = int(threadIdx.x); b < blocks; b += kThreads)
    sum += partial[b];
  sum = blockSumD(sum);
  if (threadIdx.x == 0)
    y[0] = accumulate ? float(double(y[0]) + sum) : float(sum);
}

__global__ void clipGradNormKernel(const float *sumsq, float *norm,
                                   float *coeff, float maxNorm,
                                   float invScale) {
  float n = float(sqrt(double(sumsq[0]))) * invScale;
  norm[0] = n;
  coeff[0] = math::clipCoefficient(n, maxNorm) * invScale;
}

__global__ void scaleByKernel(const float *x, const float *s, float *y,
                              int64_t n) {
  const float alpha = s[0];
  TESSERA_GRID_LOOP(i, n) { y[i] = x[i] * alpha; }
}

//===----------------------------------------------------------------------===//
// Column reductions: block (32 columns, 8 row lanes), each lane summing
// every 8th row, then the lanes summed in shared memory.
//===----------------------------------------------------------------------===//

constexpr int kColumns = 32, kRowLanes = 8;

/// out[j] = alpha * sum_r x[r, j] + beta * out[j] (beta == 0: not read).
__global__ void reduceRowsKernel(const float *x, float *y, int64_t rows,
                                 int64_t cols, float alpha, float beta) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t j = int64_t(blockIdx.x) * kColumns + threadIdx.x;
  float acc = 0.0f;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes)
      acc += x[r * cols + j];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float sum = 0.0f;
    for (int l = 0; l < kRowLanes; ++l)
      sum += partial[l][threadIdx.x];
    y[j] = beta == 0.0f ? alpha * sum : alpha * sum + beta * y[j];
  }
}

/// The fused bias-GELU backward over the same blocks: each thread writes
/// dx = dy * gelu'(x + b) for its rows and sums them; the lanes' sums give
/// dbias = sum + beta * dbias (beta == 0: not read).
template <class X>
__global__ void biasGeluGradKernel(X x, const float *bias,
                                   const float *dy, float *dx, float *dbias,
                                   int64_t rows, int64_t cols, bool tanh,
                                   float beta) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t j = int64_t(blockIdx.x) * kColumns + threadIdx.x;
  float acc = 0.0f;
  if (j < cols) {
    const float b = bias[j];
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const int64_t i = r * cols + j;
      float d = tanh ? math::geluTanhGrad(x[i] + b, dy[i])
                     : math::geluGrad(x[i] + b, dy[i]);
      dx[i] = d;
      acc += d;
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float sum = 0.0f;
    for (int l = 0; l < kRowLanes; ++l)
      sum += partial[l][threadIdx.x];
    dbias[j] = beta == 0.0f ? sum : sum + beta * dbias[j];
  }
}

//===----------------------------------------------------------------------===//
// Row kernels: one block per row.
//===----------------------------------------------------------------------===//

/// The max of row `zr` (NaNs skipped) and the sum of exp(z - max) over it,
/// in every thread of the block.
template <class Row>
__device__ void rowMaxAndSumExp(Row zr, int64_t cols, float &mx, float &sum) {
  mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    mx = MaxOp()(mx, zr[j]);
  mx = blockMax(mx);
  sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sum += math::expApprox(zr[j] - mx);
  sum = blockSum(sum);
}

__global__ void crossEntropyKernel(const float *z, const int32_t *t,
                                   float *loss, int64_t cols,
                                   DeviceError *err) {
  const int64_t row = blockIdx.x;
  const int32_t label = t[row];
  if (label < 0 || label >= cols) {
    if (threadIdx.x == 0) {
      recordError(err, kLabel, label, row, cols, 0);
      loss[row] = 0.0f;
    }
    return;
  }
  const float *zr = z + row * cols;
  float mx, sum;
  rowMaxAndSumExp(zr, cols, mx, sum);
  if (threadIdx.x == 0)
    loss[row] = math::crossEntropyLoss(sum, mx, zr[label]);
}

__global__ void crossEntropyGradKernel(const float *z, const int32_t *t,
                                       const float *dl, float *dz,
                                       int64_t cols, DeviceError *err) {
  const int64_t row = blockIdx.x;
  const int32_t label = t[row];
  float *dr = dz + row * cols;
  if (label < 0 || label >= cols) {
    if (threadIdx.x == 0)
      recordError(err, kLabel, label, row, cols, 0);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dr[j] = 0.0f;
    return;
  }
  const float *zr = z + row * cols;
  float mx, sum;
  rowMaxAndSumExp(zr, cols, mx, sum);
  const float scale = dl[row] / sum;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dr[j] = math::crossEntropyGrad(zr[j], mx, scale, j == label, dl[row]);
}

/// The mean and 1 / sqrt(var + eps) of row `xr` (two passes, biased
/// variance, as the CPU's rowStats), in every thread of the block; for RMS
/// (RMSNorm) the mean is 0 and rstd = 1 / sqrt(mean(x^2) + eps).
template <bool RMS, class X>
__device__ void rowMeanRstd(X xr, int64_t cols, float eps, float &mean,
                            float &rstd) {
  mean = 0.0f;
  if (!RMS) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      sum += xr[j];
    mean = blockSum(sum) / float(cols);
  }
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float d = xr[j] - mean;
    sq += d * d;
  }
  rstd = math::layerNormRstd(blockSum(sq), cols, eps);
}

/// LayerNorm (RMS false) or RMSNorm (RMS true: no bias) of each row.
template <bool RMS, class X, class Y>
__global__ void layerNormKernel(X x, const float *gamma, const float *bias,
                                Y y, int64_t cols, float eps) {
  const int64_t row = blockIdx.x;
  const X xr = x + row * cols;
  const Y yr = y + row * cols;
  float mean, rstd;
  rowMeanRstd<RMS>(xr, cols, eps, mean, rstd);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    yr.store(j, math::layerNormOut(xr[j], mean, rstd, gamma[j],
                                   RMS ? 0.0f : bias[j]));
}

/// S = A + B and the layer (or RMS) norm of S, per row (each thread reads
/// back only the sums it wrote).
template <bool RMS, class Y>
__global__ void addLayerNormKernel(const float *a, const float *b,
                                   const float *gamma, const float *bias,
                                   float *s, Y y, int64_t cols, float eps) {
  const int64_t row = blockIdx.x;
  const float *ar = a + row * cols, *br = b + row * cols;
  float *sr = s + row * cols;
  const Y yr = y + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sr[j] = ar[j] + br[j];
  float mean, rstd;
  rowMeanRstd<RMS>(sr, cols, eps, mean, rstd);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    yr.store(j, math::layerNormOut(sr[j], mean, rstd, gamma[j],
                                   RMS ? 0.0f : bias[j]));
}

/// dX per row (plus dR when given), and the row's mean and rstd into
/// stats[row], stats[rows + row] for the parameter gradients. RMSNorm's
/// gradient is LayerNorm's with the mean and mean(dy * gamma) terms 0.
template <bool RMS, class X>
__global__ void layerNormGradXKernel(X x, const float *gamma,
                                     const float *dy, const float *dr,
                                     float *dx, int64_t rows, int64_t cols,
                                     float eps, float *stats) {
  const int64_t row = blockIdx.x;
  const X xr = x + row * cols;
  const float *dyr = dy + row * cols;
  float *dxr = dx + row * cols;
  float mean, rstd;
  rowMeanRstd<RMS>(xr, cols, eps, mean, rstd);
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = dyr[j] * gamma[j];
    sg += g;
    sgx += g * (xr[j] - mean) * rstd;
  }
  const float invN = 1.0f / float(cols);
  const float meanGX = blockSum(sgx) * invN;
  const float meanG = RMS ? 0.0f : blockSum(sg) * invN;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float xhat = (xr[j] - mean) * rstd;
    float d = math::layerNormGradX(xhat, dyr[j], gamma[j], rstd, meanG, meanGX);
    if (dr)
      d += dr[row * cols + j];
    dxr[j] = d;
  }
  if (threadIdx.x == 0) {
    stats[row] = mean;
    stats[rows + row] = rstd;
  }
}

/// dgamma[j] = beta * dgamma[j] + sum_r dy[r, j] xhat[r, j], dbias[j] =
/// beta * dbias[j] + sum_r dy[r, j] (beta == 0: not read; dbias null for
/// RMSNorm).
template <class X>
__global__ void layerNormGradParamsKernel(X x, const float *dy,
                                          const float *stats, float *dgamma,
                                          float *dbias, int64_t rows,
                                          int64_t cols, float beta) {
  __shared__ float pg[kRowLanes][kColumns], pb[kRowLanes][kColumns];
  const int64_t j = int64_t(blockIdx.x) * kColumns + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      float xhat = (x[r * cols + j] - stats[r]) * stats[rows + r];
      ag += dy[r * cols + j] * xhat;
      ab += dy[r * cols + j];
    }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float sg = 0.0f, sb = 0.0f;
    for (int l = 0; l < kRowLanes; ++l) {
      sg += pg[l][threadIdx.x];
      sb += pb[l][threadIdx.x];
    }
    dgamma[j] = beta == 0.0f ? sg : beta * dgamma[j] + sg;
    if (dbias)
      dbias[j] = beta == 0.0f ? sb : beta * dbias[j] + sb;
  }
}

/// In-place softmax of one row; causal rows keep (row % cols) + 1 entries.
__global__ void softmaxRowsKernel(float *p, int64_t cols, bool causal) {
  const int64_t row = blockIdx.x;
  float *pr = p + row * cols;
  const int64_t valid = causal ? row % cols + 1 : cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    mx = MaxOp()(mx, pr[j]);
  mx = blockMax(mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    sum += math::expApprox(pr[j] - mx);
  const float inv = 1.0f / blockSum(sum);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    pr[j] = j < valid ? math::expApprox(pr[j] - mx) * inv : 0.0f;
}

__global__ void softmaxGradRowsKernel(const float *p, float *dp,
                                      int64_t cols) {
  const int64_t row = blockIdx.x;
  const float *pr = p + row * cols;
  float *dr = dp + row * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dot += pr[j] * dr[j];
  dot = blockSum(dot);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dr[j] = pr[j] * (dr[j] - dot);
}

template <class Z>
__global__ void logitsMaxKernel(Z z, float *m, int64_t cols) {
  const int64_t row = blockIdx.x;
  const Z zr = z + row * cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    mx = MaxOp()(mx, zr[j]);
  mx = blockMax(mx);
  if (threadIdx.x == 0)
    m[row] = mx;
}

template <class Z>
__global__ void crossEntropyStatsKernel(Z z, const int32_t *t,
                                        const float *m, float *se, float *pl,
                                        int64_t cols, int64_t vocabOffset,
                                        int64_t numClasses,
                                        int64_t ignoreIndex,
                                        DeviceError *err) {
  const int64_t row = blockIdx.x;
  const int32_t label = t[row];
  if (!math::labelInRange(label, numClasses, ignoreIndex)) {
    if (threadIdx.x == 0) {
      recordError(err, kLabelWithIgnore, label, row, numClasses, ignoreIndex);
      se[row] = 1.0f;
      pl[row] = 0.0f;
    }
    return;
  }
  const Z zr = z + row * cols;
  const float mr = m[row];
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sum += math::expApprox(zr[j] - mr);
  sum = blockSum(sum);
  if (threadIdx.x == 0) {
    se[row] = sum;
    int64_t local = math::shardColumn(label, vocabOffset, cols);
    pl[row] = label != ignoreIndex && local >= 0 ? zr[local] : 0.0f;
  }
}

/// LogitsMax and CrossEntropyStats of unsharded logits in one kernel.
template <class Z>
__global__ void logitsStatsKernel(Z z, const int32_t *t, float *m,
                                  float *se, float *pl, int64_t cols,
                                  int64_t ignoreIndex, DeviceError *err) {
  const int64_t row = blockIdx.x;
  const int32_t label = t[row];
  if (!math::labelInRange(label, cols, ignoreIndex)) {
    if (threadIdx.x == 0) {
      recordError(err, kLabelWithIgnore, label, row, cols, ignoreIndex);
      m[row] = 0.0f;
      se[row] = 1.0f;
      pl[row] = 0.0f;
    }
    return;
  }
  const Z zr = z + row * cols;
  float mx, sum;
  rowMaxAndSumExp(zr, cols, mx, sum);
  if (threadIdx.x == 0) {
    m[row] = mx;
    se[row] = sum;
    pl[row] = label != ignoreIndex ? zr[label] : 0.0f;
  }
}

__global__ void crossEntropyFromStatsKernel(const float *se, const float *pl,
                                            const float *m, const int32_t *t,
                                            float *loss, int64_t rows,
                                            int64_t ignoreIndex) {
  TESSERA_GRID_LOOP(r, rows) {
    loss[r] = t[r] == ignoreIndex
                  ? 0.0f
                  : math::crossEntropyLoss(se[r], m[r], pl[r]);
  }
}

template <class Z, class DZ>
__global__ void crossEntropyStatsGradKernel(
    Z z, const int32_t *t, const float *m, const float *se, const float *dl,
    DZ dz, int64_t n, int64_t cols, int64_t vocabOffset, int64_t numClasses,
    int64_t ignoreIndex, DeviceError *err) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t r = i / cols, j = i % cols;
    const int32_t label = t[r];
    if (!math::labelInRange(label, numClasses, ignoreIndex)) {
      if (j == 0)
        recordError(err, kLabelWithIgnore, label, r, numClasses, ignoreIndex);
      dz.store(i, 0.0f);
    } else if (label == ignoreIndex) {
      dz.store(i, 0.0f);
    } else {
      const int64_t local = math::shardColumn(label, vocabOffset, cols);
      dz.store(i, math::crossEntropyGrad(z[i], m[r], dl[r] / se[r],
                                         j == local, dl[r]));
    }
  }
}

//===----------------------------------------------------------------------===//
// Single-block reductions to a scalar (double sums, as on the CPU).
//===----------------------------------------------------------------------===//

__global__ void meanKernel(const float *x, float *y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sum += double(x[i]);
  sum = blockSumD(sum);
  if (threadIdx.x == 0)
    y[0] = n ? float(sum / double(n)) : 0.0f;
}

// `total` (nullable): the count of the whole sequence under context
// parallelism, else the rows' own.
__global__ void tokenMeanKernel(const float *loss, const int32_t *t, float *y,
                                int64_t rows, int64_t ignoreIndex,
                                const float *total) {
  double sum = 0.0;
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    if (t[r] != ignoreIndex) {
      sum += double(loss[r]);
      ++count;
    }
  sum = blockSumD(sum);
  count = blockCount(count);
  const double n = total ? double(total[0]) : double(count);
  if (threadIdx.x == 0)
    y[0] = n != 0.0 ? float(sum / n) : 0.0f;
}

__global__ void tokenCountKernel(const int32_t *t, float *n, int64_t rows,
                                 int64_t ignoreIndex) {
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    count += t[r] != ignoreIndex;
  count = blockCount(count);
  if (threadIdx.x == 0)
    n[0] = float(count);
}

__global__ void tokenMeanGradKernel(const float *dy, const int32_t *t,
                                    float *dl, int64_t rows,
                                    int64_t ignoreIndex, const float *total) {
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    count += t[r] != ignoreIndex;
  count = blockCount(count);
  const float n = total ? total[0] : float(count);
  const float v = n != 0.0f ? dy[0] / n : 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    dl[r] = t[r] != ignoreIndex ? v : 0.0f;
}

//===----------------------------------------------------------------------===//
// Embeddings and dropout
//===----------------------------------------------------------------------===//

template <class T, class Y>
__global__ void embeddingKernel(const int32_t *ids, T table, Y y, int64_t n,
                                int64_t localVocab, int64_t dim,
                                int64_t vocabOffset, int64_t vocabSize,
                                DeviceError *err) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t r = i / dim, j = i % dim;
    const int64_t id = ids[r];
    if (id < 0 || id >= vocabSize) {
      if (j == 0)
        recordError(err, kVocabularyId, id, r, vocabSize, 0);
      y.store(i, 0.0f);
      continue;
    }
    const int64_t local = math::shardColumn(id, vocabOffset, localVocab);
    y.store(i, local >= 0 ? table[local * dim + j] : 0.0f);
  }
}

/// out = beta * out, zeros for beta == 0 (no NaN carried over).
__global__ void scaleOrZeroKernel(float *out, int64_t n, float beta) {
  TESSERA_GRID_LOOP(i, n) { out[i] = beta == 0.0f ? 0.0f : beta * out[i]; }
}

__global__ void embeddingScatterKernel(const int32_t *ids, const float *dy,
                                       float *dtable, int64_t n,
                                       int64_t localVocab, int64_t dim,
                                       int64_t vocabOffset) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t r = i / dim, j = i % dim;
    const int64_t local = math::shardColumn(ids[r], vocabOffset, localVocab);
    if (local >= 0)
      atomicAdd(dtable + local * dim + j, dy[i]);
  }
}

template <class X, class P, class Y>
__global__ void addPositionEmbeddingKernel(X x, P pos, Y y, int64_t n,
                                           int64_t batch, int64_t dim) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t s = i / (batch * dim), j = i % dim;
    y.store(i, x[i] + pos[s * dim + j]);
  }
}

/// dP[s, j] = beta * dP[s, j] + sum_b dY[s, b, j] (summed in b order, as
/// on the CPU) for s < seq; rows past seq are only scaled.
__global__ void positionEmbeddingGradKernel(const float *dy, float *dpos,
                                            int64_t n, int64_t seq,
                                            int64_t batch, int64_t dim,
                                            float beta) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t s = i / dim, j = i % dim;
    float acc = beta == 0.0f ? 0.0f : beta * dpos[i];
    if (s < seq)
      for (int64_t b = 0; b < batch; ++b)
        acc += dy[(s * batch + b) * dim + j];
    dpos[i] = acc;
  }
}

template <class X, class Y>
__global__ void dropoutKernel(X x, Y y, int64_t n,
                              int64_t batch, int64_t hidden, int64_t seqOffset,
                              int64_t seqTotal, int64_t firstSample,
                              uint64_t seed, uint64_t streamHash,
                              uint64_t threshold, float scale) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t h = i % hidden, b = (i / hidden) % batch,
                  s = i / (hidden * batch);
    const uint64_t counter = math::dropoutCounter(firstSample + b, seqTotal,
                                                  s + seqOffset, hidden, h);
    const bool keep = math::philoxWord(seed, streamHash, counter) >= threshold;
    y.store(i, keep ? x[i] * scale : 0.0f);
  }
}

/// RoPE: one thread per rotated pair (row, batch, head, q or k, i), which
/// reads both features before writing them (so Y may be X); X's other
/// features are copied by the launcher when Y is not X.
template <class X, class Y>
__global__ void rotaryKernel(X x, Y y, int64_t pairs,
                             int64_t batch, int64_t features, int64_t heads,
                             int64_t rotDim, float base, float scalingFactor,
                             int64_t posBegin, float sign) {
  const int64_t half = rotDim / 2, d = features / (3 * heads);
  TESSERA_GRID_LOOP(p, pairs) {
    const int64_t i = p % half, which = (p / half) % 2,
                  h = (p / (2 * half)) % heads,
                  rb = p / (2 * half * heads); // row * batch + b
    const int64_t row = rb / batch;
    const int64_t off = rb * features + h * 3 * d + which * d;
    float s, c;
    sincosf(math::ropeAngle(posBegin + row, i, rotDim, base, scalingFactor),
            &s, &c);
    float y1, y2;
    math::ropeRotate(x[off + i], x[off + i + half], c, sign * s, y1, y2);
    y.store(off + i, y1);
    y.store(off + i + half, y2);
  }
}

/// Threads per row block: enough for the row, a multiple of 32.
unsigned rowThreads(int64_t cols) {
  return cols >= 1024 ? 1024u : cols >= 256 ? 256u : 128u;
}

} // namespace

//===----------------------------------------------------------------------===//
// Launchers
//===----------------------------------------------------------------------===//

#define TESSERA_LAUNCH_1D(kernel, n, stream, ...)                              \
  do {                                                                         \
    if ((n) > 0)                                                               \
      kernel<<<blocksFor(n), kThreads, 0, stream>>>(__VA_ARGS__);              \
    return cudaGetLastError();                                                 \
  } while (false)

cudaError_t launchBiasAdd(cudaStream_t s, DeviceFloats x, const float *bias,
                          DeviceFloats y, int64_t rows, int64_t cols) {
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = biasAddKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, rows * cols, s, X, bias, Y, rows * cols, cols);
    });
  });
}
cudaError_t launchAdd(cudaStream_t s, DeviceFloats a, DeviceFloats b,
                      DeviceFloats c, int64_t n) {
  return withFloats(a.data, a.format, [&](auto A) {
    return withFloats(b.data, b.format, [&](auto B) {
      return withFloats(c.data, c.format, [&](auto C) {
        auto kernel = addKernel<decltype(A), decltype(B), decltype(C)>;
        TESSERA_LAUNCH_1D(kernel, n, s, A, B, C, n);
      });
    });
  });
}
cudaError_t launchGelu(cudaStream_t s, const float *x, float *y, int64_t n,
                       bool tanh) {
  TESSERA_LAUNCH_1D(geluKernel, n, s, x, y, n, tanh);
}
cudaError_t launchGeluGrad(cudaStream_t s, const float *x, const float *dy,
                           float *dx, int64_t n, bool tanh) {
  TESSERA_LAUNCH_1D(geluGradKernel, n, s, x, dy, dx, n, tanh);
}
cudaError_t launchBiasGelu(cudaStream_t s, DeviceFloats x, const float *bias,
                           DeviceFloats y, int64_t rows, int64_t cols,
                           bool tanh) {
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = biasGeluKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, rows * cols, s, X, bias, Y, rows * cols, cols,
                        tanh);
    });
  });
}
cudaError_t launchSwiGLU(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                         int64_t rows, int64_t n) {
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = swigluKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, rows * n, s, X, Y, rows * n, n);
    });
  });
}
cudaError_t launchSwiGLUGrad(cudaStream_t s, DeviceFloats x, const float *dy,
                             DeviceFloats dx, int64_t rows, int64_t n) {
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(dx.data, dx.format, [&](auto DX) {
      auto kernel = swigluGradKernel<decltype(X), decltype(DX)>;
      TESSERA_LAUNCH_1D(kernel, rows * n, s, X, dy, DX, rows * n, n);
    });
  });
}
cudaError_t launchRepeatKV(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                           int64_t rows, int64_t heads, int64_t groups,
                           int64_t headDim) {
  const int64_t total = rows * heads * 3 * headDim;
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = repeatKVKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, total, s, X, Y, total, heads, groups,
                        headDim);
    });
  });
}
cudaError_t launchRepeatKVGrad(cudaStream_t s, DeviceFloats dy, DeviceFloats dx,
                               int64_t rows, int64_t heads, int64_t groups,
                               int64_t headDim) {
  const int64_t total = rows * groups * (heads / groups + 2) * headDim;
  return withFloats(dy.data, dy.format, [&](auto DY) {
    return withFloats(dx.data, dx.format, [&](auto DX) {
      auto kernel = repeatKVGradKernel<decltype(DY), decltype(DX)>;
      TESSERA_LAUNCH_1D(kernel, total, s, DY, DX, total, heads, groups,
                        headDim);
    });
  });
}
cudaError_t launchQKNorm(cudaStream_t s, const float *x, const float *wq,
                         const float *wk, float *y, int64_t rows,
                         int64_t heads, int64_t groups, int64_t headDim,
                         float eps) {
  const int64_t per = heads / groups + 2, vectors = rows * groups * per;
  TESSERA_LAUNCH_1D(qkNormKernel, vectors, s, x, wq, wk, y, vectors, per,
                    headDim, eps);
}
cudaError_t launchQKNormGrad(cudaStream_t s, const float *x, const float *wq,
                             const float *wk, const float *dy, float *dx,
                             float *dwq, float *dwk, int64_t rows,
                             int64_t heads, int64_t groups, int64_t headDim,
                             float eps, float beta) {
  const int64_t per = heads / groups + 2, vectors = rows * groups * per;
  if (vectors > 0)
    qkNormGradXKernel<<<blocksFor(vectors), kThreads, 0, s>>>(
        x, wq, wk, dy, dx, vectors, per, headDim, eps);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return e;
  TESSERA_LAUNCH_1D(qkNormGradWKernel, 2 * headDim, s, x, dy, dwq, dwk,
                    vectors, per, headDim, eps, beta);
}
cudaError_t launchRelu(cudaStream_t s, const float *x, float *y, int64_t n) {
  TESSERA_LAUNCH_1D(reluKernel, n, s, x, y, n);
}
cudaError_t launchReluGrad(cudaStream_t s, const float *x, const float *dy,
                           float *dx, int64_t n) {
  TESSERA_LAUNCH_1D(reluGradKernel, n, s, x, dy, dx, n);
}
cudaError_t launchMeanGrad(cudaStream_t s, const float *dy, float *dx,
                           int64_t n) {
  TESSERA_LAUNCH_1D(meanGradKernel, n, s, dy, dx, n);
}
cudaError_t launchFill(cudaStream_t s, float *y, float value, int64_t n) {
  TESSERA_LAUNCH_1D(fillKernel, n, s, y, value, n);
}
cudaError_t launchScale(cudaStream_t s, const float *x, float *y, float alpha,
                        int64_t n) {
  TESSERA_LAUNCH_1D(scaleKernel, n, s, x, y, alpha, n);
}
cudaError_t launchAxpy(cudaStream_t s, float alpha, const float *x, float *y,
                       int64_t n) {
  TESSERA_LAUNCH_1D(axpyKernel, n, s, alpha, x, y, n);
}
cudaError_t launchMaskColumns(cudaStream_t s, const float *x, float *y,
                              int64_t rows, int64_t cols, int64_t keep,
                              float fill) {
  const int64_t n = rows * cols;
  TESSERA_LAUNCH_1D(maskColumnsKernel, n, s, x, y, cols, keep, fill, n);
}
cudaError_t launchFillHalf(cudaStream_t s, FloatFormat half, uint16_t *y,
                           float value, int64_t n) {
  TESSERA_LAUNCH_1D(fillHalfKernel, n, s, y, floatToHalf(half, value), n);
}
cudaError_t launchScaleHalf(cudaStream_t s, FloatFormat half,
                            const uint16_t *x, uint16_t *y, float alpha,
                            int64_t n) {
  if (half == FloatFormat::F16) {
    TESSERA_LAUNCH_1D(scaleHalfKernel<FloatFormat::F16>, n, s, x, y, alpha, n);
  }
  TESSERA_LAUNCH_1D(scaleHalfKernel<FloatFormat::BF16>, n, s, x, y, alpha, n);
}
cudaError_t launchAxpyHalf(cudaStream_t s, FloatFormat half, float alpha,
                           const uint16_t *x, uint16_t *y, int64_t n) {
  if (half == FloatFormat::F16) {
    TESSERA_LAUNCH_1D(axpyHalfKernel<FloatFormat::F16>, n, s, alpha, x, y, n);
  }
  TESSERA_LAUNCH_1D(axpyHalfKernel<FloatFormat::BF16>, n, s, alpha, x, y, n);
}

cudaError_t launchCast(cudaStream_t s, const void *x, FloatFormat xFormat,
                       void *y, FloatFormat yFormat, int64_t n, float beta) {
  using Kernel = void (*)(const void *, void *, int64_t, float);
  using F = FloatFormat;
#define TESSERA_CAST_ROW(X)                                                    \
  {{castKernel<X, F::F32, false>, castKernel<X, F::F32, true>},                \
   {castKernel<X, F::BF16, false>, castKernel<X, F::BF16, true>},              \
   {castKernel<X, F::F16, false>, castKernel<X, F::F16, true>}}
  static const Kernel table[3][3][2] = {TESSERA_CAST_ROW(F::F32),
                                        TESSERA_CAST_ROW(F::BF16),
                                        TESSERA_CAST_ROW(F::F16)};
#undef TESSERA_CAST_ROW
  Kernel kernel = table[int(xFormat)][int(yFormat)][beta != 0.0f];
  TESSERA_LAUNCH_1D(kernel, n, s, x, y, n, beta);
}

cudaError_t launchAdam(cudaStream_t s, float *p, const float *g, float *m,
                       float *v, int64_t n, const int64_t *iteration,
                       float lr, float beta1, float beta2, float eps,
                       float weightDecay, DeviceError *err) {
  TESSERA_LAUNCH_1D(adamKernel, n, s, p, g, m, v, n, iteration, lr, beta1,
                    beta2, eps, weightDecay, err);
}
cudaError_t launchSgd(cudaStream_t s, float *p, const float *g, int64_t n,
                      float lr, float weightDecay) {
  TESSERA_LAUNCH_1D(sgdKernel, n, s, p, g, n, lr, weightDecay);
}
cudaError_t launchSgdMomentum(cudaStream_t s, float *p, const float *g,
                              float *b, int64_t n, float lr, float weightDecay,
                              float momentum) {
  TESSERA_LAUNCH_1D(sgdMomentumKernel, n, s, p, g, b, n, lr, weightDecay,
                    momentum);
}

int sumSquaresBlocks(int64_t n) {
  return int(std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads * 8 - 1) / (kThreads * 8),
                           kSumSquaresBlocks)));
}
cudaError_t launchSumSquares(cudaStream_t s, const void *x, FloatFormat format,
                             int64_t n, float *y, bool accumulate,
                             double *partial) {
  const int blocks = sumSquaresBlocks(n);
  if (format == FloatFormat::BF16)
    sumSquaresPartialKernel<FloatFormat::BF16>
        <<<blocks, kThreads, 0, s>>>(x, n, partial);
  else if (format == FloatFormat::F16)
    sumSquaresPartialKernel<FloatFormat::F16>
        <<<blocks, kThreads, 0, s>>>(x, n, partial);
  else
    sumSquaresPartialKernel<FloatFormat::F32>
        <<<blocks, kThreads, 0, s>>>(x, n, partial);
  sumSquaresFinalKernel<<<1, kThreads, 0, s>>>(partial, blocks, y, accumulate);
  return cudaGetLastError();
}
cudaError_t launchClipGradNorm(cudaStream_t s, const float *sumsq, float *norm,
                               float *coeff, float maxNorm, float invScale) {
  clipGradNormKernel<<<1, 1, 0, s>>>(sumsq, norm, coeff, maxNorm, invScale);
  return cudaGetLastError();
}
cudaError_t launchScaleBy(cudaStream_t s, const float *x, const float *scale,
                          float *y, int64_t n) {
  TESSERA_LAUNCH_1D(scaleByKernel, n, s, x, scale, y, n);
}

cudaError_t launchReduceRows(cudaStream_t s, const float *x, float *y,
                             int64_t rows, int64_t cols, float alpha,
                             float beta) {
  if (cols > 0)
    reduceRowsKernel<<<unsigned((cols + kColumns - 1) / kColumns),
                       dim3(kColumns, kRowLanes), 0, s>>>(x, y, rows, cols,
                                                          alpha, beta);
  return cudaGetLastError();
}

cudaError_t launchBiasGeluGrad(cudaStream_t s, DeviceFloats x,
                               const float *bias, const float *dy, float *dx,
                               float *dbias, int64_t rows, int64_t cols,
                               bool tanh, float beta) {
  return withFloats(x.data, x.format, [&](auto X) {
    if (cols > 0)
      biasGeluGradKernel<<<unsigned((cols + kColumns - 1) / kColumns),
                           dim3(kColumns, kRowLanes), 0, s>>>(
          X, bias, dy, dx, dbias, rows, cols, tanh, beta);
    return cudaGetLastError();
  });
}

#define TESSERA_LAUNCH_ROWS(kernel, rows, cols, stream, ...)                   \
  do {                                                                         \
    if ((rows) > 0)                                                            \
      kernel<<<unsigned(rows), rowThreads(cols), 0, stream>>>(__VA_ARGS__);    \
    return cudaGetLastError();                                                 \
  } while (false)

cudaError_t launchCrossEntropy(cudaStream_t s, const float *z, const int32_t *t,
                               float *loss, int64_t rows, int64_t cols,
                               DeviceError *err) {
  TESSERA_LAUNCH_ROWS(crossEntropyKernel, rows, cols, s, z, t, loss, cols,
                      err);
}
cudaError_t launchCrossEntropyGrad(cudaStream_t s, const float *z,
                                   const int32_t *t, const float *dl, float *dz,
                                   int64_t rows, int64_t cols,
                                   DeviceError *err) {
  TESSERA_LAUNCH_ROWS(crossEntropyGradKernel, rows, cols, s, z, t, dl, dz,
                      cols, err);
}
cudaError_t launchLayerNorm(cudaStream_t s, DeviceFloats x, const float *gamma,
                            const float *bias, DeviceFloats y, int64_t rows,
                            int64_t cols, float eps) {
  if (cols == 0)
    return cudaSuccess;
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = bias ? layerNormKernel<false, decltype(X), decltype(Y)>
                         : layerNormKernel<true, decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_ROWS(kernel, rows, cols, s, X, gamma, bias, Y, cols, eps);
    });
  });
}
cudaError_t launchAddLayerNorm(cudaStream_t s, const float *a, const float *b,
                               const float *gamma, const float *bias, float *sum,
                               DeviceFloats y, int64_t rows, int64_t cols,
                               float eps) {
  if (cols == 0)
    return cudaSuccess;
  return withFloats(y.data, y.format, [&](auto Y) {
    auto kernel = bias ? addLayerNormKernel<false, decltype(Y)>
                       : addLayerNormKernel<true, decltype(Y)>;
    TESSERA_LAUNCH_ROWS(kernel, rows, cols, s, a, b, gamma, bias, sum, Y, cols,
                        eps);
  });
}
cudaError_t launchLayerNormGrad(cudaStream_t s, DeviceFloats x,
                                const float *gamma, const float *dy,
                                const float *dr, float *dx, float *dgamma,
                                float *dbias, int64_t rows, int64_t cols,
                                float eps, float beta, float *stats) {
  if (cols == 0)
    return cudaSuccess;
  return withFloats(x.data, x.format, [&](auto X) {
    if (rows > 0) {
      if (dbias)
        layerNormGradXKernel<false><<<unsigned(rows), rowThreads(cols), 0, s>>>(
            X, gamma, dy, dr, dx, rows, cols, eps, stats);
      else
        layerNormGradXKernel<true><<<unsigned(rows), rowThreads(cols), 0, s>>>(
            X, gamma, dy, dr, dx, rows, cols, eps, stats);
    }
    layerNormGradParamsKernel<<<unsigned((cols + kColumns - 1) / kColumns),
                                dim3(kColumns, kRowLanes), 0, s>>>(
        X, dy, stats, dgamma, dbias, rows, cols, beta);
    return cudaGetLastError();
  });
}
cudaError_t launchSoftmaxRows(cudaStream_t s, float *p, int64_t rows,
                              int64_t cols, bool causal) {
  TESSERA_LAUNCH_ROWS(softmaxRowsKernel, rows, cols, s, p, cols, causal);
}
cudaError_t launchSoftmaxGradRows(cudaStream_t s, const float *p, float *dp,
                                  int64_t rows, int64_t cols) {
  TESSERA_LAUNCH_ROWS(softmaxGradRowsKernel, rows, cols, s, p, dp, cols);
}
cudaError_t launchLogitsMax(cudaStream_t s, DeviceFloats z, float *m,
                            int64_t rows, int64_t cols) {
  return withFloats(z.data, z.format, [&](auto Z) {
    auto kernel = logitsMaxKernel<decltype(Z)>;
    TESSERA_LAUNCH_ROWS(kernel, rows, cols, s, Z, m, cols);
  });
}
cudaError_t launchCrossEntropyStats(cudaStream_t s, DeviceFloats z,
                                    const int32_t *t, const float *m,
                                    float *se, float *pl, int64_t rows,
                                    int64_t cols, int64_t vocabOffset,
                                    int64_t numClasses, int64_t ignoreIndex,
                                    DeviceError *err) {
  return withFloats(z.data, z.format, [&](auto Z) {
    auto kernel = crossEntropyStatsKernel<decltype(Z)>;
    TESSERA_LAUNCH_ROWS(kernel, rows, cols, s, Z, t, m, se, pl, cols,
                        vocabOffset, numClasses, ignoreIndex, err);
  });
}
cudaError_t launchLogitsStats(cudaStream_t s, DeviceFloats z, const int32_t *t,
                              float *m, float *se, float *pl, int64_t rows,
                              int64_t cols, int64_t ignoreIndex,
                              DeviceError *err) {
  return withFloats(z.data, z.format, [&](auto Z) {
    auto kernel = logitsStatsKernel<decltype(Z)>;
    TESSERA_LAUNCH_ROWS(kernel, rows, cols, s, Z, t, m, se, pl, cols,
                        ignoreIndex, err);
  });
}
cudaError_t launchCrossEntropyFromStats(cudaStream_t s, const float *se,
                                        const float *pl, const float *m,
                                        const int32_t *t, float *loss,
                                        int64_t rows, int64_t ignoreIndex) {
  TESSERA_LAUNCH_1D(crossEntropyFromStatsKernel, rows, s, se, pl, m, t, loss,
                    rows, ignoreIndex);
}
cudaError_t launchCrossEntropyStatsGrad(
    cudaStream_t s, DeviceFloats z, const int32_t *t, const float *m,
    const float *se, const float *dl, DeviceFloats dz, int64_t rows,
    int64_t cols, int64_t vocabOffset, int64_t numClasses, int64_t ignoreIndex,
    DeviceError *err) {
  return withFloats(z.data, z.format, [&](auto Z) {
    return withFloats(dz.data, dz.format, [&](auto DZ) {
      auto kernel = crossEntropyStatsGradKernel<decltype(Z), decltype(DZ)>;
      TESSERA_LAUNCH_1D(kernel, rows * cols, s, Z, t, m, se, dl, DZ,
                        rows * cols, cols, vocabOffset, numClasses, ignoreIndex,
                        err);
    });
  });
}

cudaError_t launchMean(cudaStream_t s, const float *x, float *y, int64_t n) {
  meanKernel<<<1, kReduceThreads, 0, s>>>(x, y, n);
  return cudaGetLastError();
}
cudaError_t launchTokenMean(cudaStream_t s, const float *loss, const int32_t *t,
                            float *y, int64_t rows, int64_t ignoreIndex,
                            const float *count) {
  tokenMeanKernel<<<1, kReduceThreads, 0, s>>>(loss, t, y, rows, ignoreIndex,
                                               count);
  return cudaGetLastError();
}
cudaError_t launchTokenCount(cudaStream_t s, const int32_t *t, float *n,
                             int64_t rows, int64_t ignoreIndex) {
  tokenCountKernel<<<1, kReduceThreads, 0, s>>>(t, n, rows, ignoreIndex);
  return cudaGetLastError();
}
cudaError_t launchTokenMeanGrad(cudaStream_t s, const float *dy,
                                const int32_t *t, float *dl, int64_t rows,
                                int64_t ignoreIndex, const float *count) {
  if (rows > 0)
    tokenMeanGradKernel<<<1, kReduceThreads, 0, s>>>(dy, t, dl, rows,
                                                     ignoreIndex, count);
  return cudaGetLastError();
}

cudaError_t launchEmbedding(cudaStream_t s, const int32_t *ids,
                            DeviceFloats table, DeviceFloats y, int64_t rows,
                            int64_t localVocab, int64_t dim,
                            int64_t vocabOffset, int64_t vocabSize,
                            DeviceError *err) {
  if (dim == 0)
    return cudaSuccess;
  return withFloats(table.data, table.format, [&](auto T) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = embeddingKernel<decltype(T), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, rows * dim, s, ids, T, Y, rows * dim,
                        localVocab, dim, vocabOffset, vocabSize, err);
    });
  });
}
cudaError_t launchEmbeddingGrad(cudaStream_t s, const int32_t *ids,
                                const float *dy, float *dtable, int64_t rows,
                                int64_t localVocab, int64_t dim,
                                int64_t vocabOffset, float beta) {
  if (beta != 1.0f && localVocab * dim > 0)
    scaleOrZeroKernel<<<blocksFor(localVocab * dim), kThreads, 0, s>>>(
        dtable, localVocab * dim, beta);
  if (dim == 0)
    return cudaGetLastError();
  TESSERA_LAUNCH_1D(embeddingScatterKernel, rows * dim, s, ids, dy, dtable,
                    rows * dim, localVocab, dim, vocabOffset);
}
cudaError_t launchAddPositionEmbedding(cudaStream_t s, DeviceFloats x,
                                       DeviceFloats pos, DeviceFloats y,
                                       int64_t seq, int64_t batch,
                                       int64_t dim) {
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(pos.data, pos.format, [&](auto P) {
      return withFloats(y.data, y.format, [&](auto Y) {
        auto kernel =
            addPositionEmbeddingKernel<decltype(X), decltype(P), decltype(Y)>;
        TESSERA_LAUNCH_1D(kernel, seq * batch * dim, s, X, P, Y,
                          seq * batch * dim, batch, dim);
      });
    });
  });
}
cudaError_t launchPositionEmbeddingGrad(cudaStream_t s, const float *dy,
                                        float *dpos, int64_t seq,
                                        int64_t batch, int64_t dim,
                                        int64_t posRows, float beta) {
  TESSERA_LAUNCH_1D(positionEmbeddingGradKernel, posRows * dim, s, dy, dpos,
                    posRows * dim, seq, batch, dim, beta);
}
cudaError_t launchDropout(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                          int64_t seq, int64_t batch, int64_t hidden,
                          int64_t seqOffset, int64_t seqTotal,
                          int64_t firstSample, uint64_t seed,
                          uint64_t streamHash, float rate) {
  const uint64_t threshold = math::dropoutThreshold(rate);
  const float scale = 1.0f / (1.0f - rate);
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = dropoutKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, seq * batch * hidden, s, X, Y,
                        seq * batch * hidden, batch, hidden, seqOffset,
                        seqTotal, firstSample, seed, streamHash, threshold,
                        scale);
    });
  });
}

cudaError_t launchRotaryEmbedding(cudaStream_t s, DeviceFloats x,
                                  DeviceFloats y, int64_t seq, int64_t batch,
                                  int64_t features, int64_t heads,
                                  int64_t rotDim, float base,
                                  float scalingFactor, int64_t posBegin,
                                  bool inverse) {
  // The features that do not rotate: copied (converted between formats).
  if (x.data != y.data) {
    const int64_t n = seq * batch * features;
    cudaError_t e =
        x.format == y.format
            ? cudaMemcpyAsync(y.data, x.data, size_t(n * formatBytes(x.format)),
                              cudaMemcpyDeviceToDevice, s)
            : launchCast(s, x.data, x.format, y.data, y.format, n, 0.0f);
    if (e != cudaSuccess)
      return e;
  }
  const int64_t pairs = seq * batch * heads * rotDim;
  if (pairs == 0)
    return cudaSuccess;
  return withFloats(x.data, x.format, [&](auto X) {
    return withFloats(y.data, y.format, [&](auto Y) {
      auto kernel = rotaryKernel<decltype(X), decltype(Y)>;
      TESSERA_LAUNCH_1D(kernel, pairs, s, X, Y, pairs, batch, features, heads,
                        rotDim, base, scalingFactor, posBegin,
                        inverse ? -1.0f : 1.0f);
    });
  });
}

} // namespace tessera::rt::cuda
