//===- MoEKernels.cu - CUDA kernels of the mixture-of-experts opcodes -----===//
//
// The routing math per token (top-k, its gradient, the capacity order) is
// tessera/rt/math/MoE.h, which the CPU backend uses too; here is only the
// parallel decomposition:
//   - the row map (each routing choice's row in expert order): counts by
//     atomics (integer sums, so their order does not matter), and one
//     stable radix sort (cub) of the choices by math::moeChoiceSortKey's
//     expert bits, so every expert's rows keep the token order the CPU's
//     sort gives: a choice's row is its sorted position;
//   - rows (dispatch, combine and their gradients): grid-stride loops over
//     (choice or token, feature), each token's k choices added in order;
//   - routing and the load-balancing loss: one thread per token for top-k,
//     one warp per token for the softmax over the experts, and the loss
//     summed in double in one block, in a fixed order;
//   - expert capacity: the same stable sort over all of
//     math::moeChoiceSortKey's bits puts each expert's choices in
//     math::moeCapacityBefore's order; a choice keeps its expert when its
//     position minus its expert's first position is below the capacity.
//     O(n) passes for n choices (SharedMathTest mirrors the steps after the
//     sort against the definition, math::moeCapacityKeeps).
// Indices outside [-1, experts) go to the DeviceError record (kExpertIndex).
//
//===----------------------------------------------------------------------===//

#include "DeviceCommon.cuh"
#include "Kernels.h"

#include "tessera/rt/math/Kernels.h"
#include "tessera/rt/math/MoE.h"

#include <cub/device/device_radix_sort.cuh>

namespace tessera::rt::cuda {
namespace {

/// counts[e] += the choices routed to e; an index outside [0, experts)
/// (other than -1 when `allowDropped`) is recorded.
__global__ void moeCountKernel(const int32_t *indices, int64_t n,
                               int64_t experts, int32_t *counts,
                               bool allowDropped, DeviceError *err) {
  TESSERA_GRID_LOOP(c, n) {
    const int32_t e = indices[c];
    if (e < 0 || e >= experts) {
      if (e != -1 || !allowDropped)
        recordError(err, kExpertIndex, e, c, experts, 0);
      continue;
    }
    atomicAdd(counts + e, 1);
  }
}

/// keys[c] = choice c's math::moeChoiceSortKey, vals[c] = c; with `err`,
/// an index outside [-1, experts) is recorded.
__global__ void moeSortKeysKernel(const float *probs, const int32_t *indices,
                                  int64_t n, int64_t experts, bool byPosition,
                                  uint64_t *keys, int32_t *vals,
                                  DeviceError *err) {
  TESSERA_GRID_LOOP(c, n) {
    const int32_t e = indices[c];
    if (err && (e < -1 || e >= experts))
      recordError(err, kExpertIndex, e, c, experts, 0);
    keys[c] = math::moeChoiceSortKey(probs ? probs[c] : 0.0f, e, experts,
                                     byPosition);
    vals[c] = int32_t(c);
  }
}

/// rowOf[choice at sorted position i] = i, -1 for one routed nowhere.
__global__ void moeRowsFromSortKernel(const uint64_t *keys,
                                      const int32_t *vals, int64_t n,
                                      int64_t experts, int32_t *rowOf) {
  TESSERA_GRID_LOOP(i, n) {
    rowOf[vals[i]] =
        math::moeSortKeyExpert(keys[i]) < experts ? int32_t(i) : -1;
  }
}

/// start[e] = the first sorted position of expert e's choices.
__global__ void moeExpertStartKernel(const uint64_t *keys, int64_t n,
                                     int32_t *start) {
  TESSERA_GRID_LOOP(i, n) {
    const int64_t e = math::moeSortKeyExpert(keys[i]);
    if (i == 0 || e != math::moeSortKeyExpert(keys[i - 1]))
      start[e] = int32_t(i);
  }
}

/// rows[row of c] = X[token of c].
__global__ void moeDispatchKernel(const float *x, const int32_t *rowOf,
                                  float *rows, int64_t n, int64_t k,
                                  int64_t features) {
  TESSERA_GRID_LOOP(i, n * features) {
    const int64_t c = i / features, f = i % features;
    const int32_t r = rowOf[c];
    if (r >= 0)
      rows[r * features + f] = x[(c / k) * features + f];
  }
}

/// Zeroes the rows of `rows` [n, features] past the routed ones (the sum
/// of counts).
__global__ void moeZeroTailKernel(float *rows, const int32_t *counts,
                                  int64_t experts, int64_t n,
                                  int64_t features) {
  __shared__ int64_t kept;
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int64_t e = 0; e < experts; ++e)
      sum += counts[e];
    kept = sum;
  }
  __syncthreads();
  TESSERA_GRID_LOOP(i, n * features) {
    if (i / features >= kept)
      rows[i] = 0.0f;
  }
}

/// dX[t, f] = sum over t's choices (in order) of dRows[row, f].
__global__ void moeDispatchGradKernel(const float *drows,
                                      const int32_t *rowOf, float *dx,
                                      int64_t tokens, int64_t k,
                                      int64_t features) {
  TESSERA_GRID_LOOP(i, tokens * features) {
    const int64_t t = i / features, f = i % features;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = rowOf[t * k + j];
      if (r >= 0)
        acc += drows[r * features + f];
    }
    dx[i] = acc;
  }
}

/// Y[t, f] = sum over t's choices (in order) of p * rows[row, f].
__global__ void moeCombineKernel(const float *rows, const float *probs,
                                 const int32_t *rowOf, float *y,
                                 int64_t tokens, int64_t k, int64_t features) {
  TESSERA_GRID_LOOP(i, tokens * features) {
    const int64_t t = i / features, f = i % features;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = rowOf[t * k + j];
      if (r >= 0)
        acc += probs[t * k + j] * rows[r * features + f];
    }
    y[i] = acc;
  }
}

/// dRows[row of c] = p_c dY[token of c].
__global__ void moeCombineGradRowsKernel(const float *probs,
                                         const int32_t *rowOf, const float *dy,
                                         float *drows, int64_t n, int64_t k,
                                         int64_t features) {
  TESSERA_GRID_LOOP(i, n * features) {
    const int64_t c = i / features, f = i % features;
    const int32_t r = rowOf[c];
    if (r >= 0)
      drows[r * features + f] = probs[c] * dy[(c / k) * features + f];
  }
}

/// dProbs[c] = rows[row of c] . dY[token of c] (0 for a dropped choice):
/// one block per choice.
__global__ void moeCombineGradProbsKernel(const float *rows,
                                          const int32_t *rowOf,
                                          const float *dy, float *dprobs,
                                          int64_t k, int64_t features) {
  const int64_t c = blockIdx.x;
  const int32_t r = rowOf[c];
  float acc = 0.0f;
  if (r >= 0)
    for (int64_t f = threadIdx.x; f < features; f += blockDim.x)
      acc += rows[r * features + f] * dy[(c / k) * features + f];
  acc = blockSum(acc);
  if (threadIdx.x == 0)
    dprobs[c] = r >= 0 ? acc : 0.0f;
}

/// One thread per token: the top-k routing (math::moeTopK).
__global__ void moeRouterKernel(const float *logits, float *probs,
                                int32_t *indices, int64_t tokens,
                                int64_t experts, int64_t k) {
  TESSERA_GRID_LOOP(t, tokens) {
    math::moeTopK(logits + t * experts, experts, k, probs + t * k,
                  indices + t * k);
  }
}

__global__ void moeRouterGradKernel(const float *probs, const int32_t *indices,
                                    const float *dprobs, float *dlogits,
                                    int64_t tokens, int64_t experts, int64_t k,
                                    DeviceError *err) {
  TESSERA_GRID_LOOP(t, tokens) {
    bool valid = true;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = indices[t * k + j];
      if (e < 0 || e >= experts) {
        recordError(err, kExpertIndexOfToken, e, t, experts, 0);
        valid = false;
      }
    }
    if (valid)
      math::moeTopKGrad(probs + t * k, indices + t * k, dprobs + t * k,
                        experts, k, dlogits + t * experts);
    else
      for (int64_t e = 0; e < experts; ++e)
        dlogits[t * experts + e] = 0.0f;
  }
}

/// The count of expert e the load-balancing loss uses, and its token
/// count: all ranks' (`all`, T = sum / k) or this rank's.
__device__ float auxCount(const float *all, const int32_t *counts, int64_t e) {
  return all ? all[e] : float(counts[e]);
}
__device__ double auxTokens(const float *all, int64_t tokens, int64_t experts,
                            int64_t k) {
  if (!all)
    return double(tokens);
  double sum = 0.0;
  for (int64_t e = 0; e < experts; ++e)
    sum += double(all[e]);
  return sum / double(k);
}

/// The softmax over the experts of one token, for one warp: the max and
/// 1 / sum of the exponentials; prob(e) recomputes each probability, so
/// nothing per expert is held and any number of experts fits.
struct WarpSoftmax {
  const float *logits;
  float mx, inv;
  __device__ WarpSoftmax(const float *row, int64_t experts, int lane)
      : logits(row) {
    float m = -INFINITY;
    for (int64_t e = lane; e < experts; e += 32)
      m = math::selectf(row[e] > m, row[e], m);
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, m, offset);
      m = math::selectf(o > m, o, m);
    }
    float sum = 0.0f;
    for (int64_t e = lane; e < experts; e += 32)
      sum += math::expApprox(row[e] - m);
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    mx = m;
    inv = 1.0f / sum;
  }
  __device__ float prob(int64_t e) const {
    return math::expApprox(logits[e] - mx) * inv;
  }
};

/// partial[t] = sum_e softmax(logits[t])_e count_e (the loss before its
/// scale), one warp per token.
__global__ void moeAuxPartialKernel(const float *logits, const float *all,
                                    const int32_t *counts, double *partial,
                                    int64_t tokens, int64_t experts) {
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= tokens)
    return;
  const WarpSoftmax p(logits + t * experts, experts, lane);
  double sum = 0.0;
  for (int64_t e = lane; e < experts; e += 32)
    sum += double(p.prob(e)) * double(auxCount(all, counts, e));
  for (int offset = 16; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0)
    partial[t] = sum;
}

/// y[0] = scale * sum_t partial[t], in one block.
__global__ void moeAuxLossKernel(const double *partial, const float *all,
                                 float *y, int64_t tokens, int64_t experts,
                                 int64_t k, float coeff) {
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x)
    sum += partial[t];
  sum = blockSumD(sum);
  if (threadIdx.x == 0) {
    const double total = auxTokens(all, tokens, experts, k);
    y[0] = total > 0 ? float(sum * math::moeAuxScale(coeff, experts, k, total))
                     : 0.0f;
  }
}

/// dLogits of the load-balancing loss times dy[0], one warp per token: the
/// softmax backward p (g - p . g) with g_e = scale count_e.
__global__ void moeAuxLossGradKernel(const float *logits, const float *all,
                                     const int32_t *counts, const float *dy,
                                     float *dlogits, int64_t tokens,
                                     int64_t experts, int64_t k, float coeff) {
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= tokens)
    return;
  const double total = auxTokens(all, tokens, experts, k);
  const float scale =
      total > 0 ? dy[0] * float(math::moeAuxScale(coeff, experts, k, total))
                : 0.0f;
  const WarpSoftmax p(logits + t * experts, experts, lane);
  float dot = 0.0f;
  for (int64_t e = lane; e < experts; e += 32)
    dot += p.prob(e) * auxCount(all, counts, e) * scale;
  for (int offset = 16; offset > 0; offset >>= 1)
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  for (int64_t e = lane; e < experts; e += 32)
    dlogits[t * experts + e] = p.prob(e) * (auxCount(all, counts, e) * scale - dot);
}

/// counts[e] (f32) += choices routed to e; -1 (dropped) counts for none.
__global__ void moeTokenCountsKernel(const int32_t *indices, float *counts,
                                     int64_t n, int64_t experts,
                                     DeviceError *err) {
  TESSERA_GRID_LOOP(c, n) {
    const int32_t e = indices[c];
    if (e == -1)
      continue;
    if (e < 0 || e >= experts) {
      recordError(err, kExpertIndex, e, c, experts, 0);
      continue;
    }
    // Integer sums below 2^24 are exact in f32, in any order.
    atomicAdd(counts + e, 1.0f);
  }
}

/// Expert capacity after the sort: the choice at sorted position i keeps
/// its expert when fewer than `capacity` of that expert's choices sort
/// before it.
__global__ void moeCapacityKeepKernel(const uint64_t *keys,
                                      const int32_t *vals,
                                      const int32_t *start, const float *probs,
                                      const int32_t *indices, int64_t n,
                                      int64_t experts, int64_t capacity,
                                      float *keptProbs, int32_t *keptIndices) {
  TESSERA_GRID_LOOP(i, n) {
    const int32_t c = vals[i];
    const int64_t e = math::moeSortKeyExpert(keys[i]);
    const bool keep = e < experts && i - start[e] < capacity;
    keptIndices[c] = keep ? int32_t(e) : -1;
    // A choice dropped before keeps its probability, as on the CPU.
    keptProbs[c] = keep || indices[c] == -1 ? probs[c] : 0.0f;
  }
}

__global__ void moeCapacityDropGradKernel(const float *dkept,
                                          const int32_t *keptIndices,
                                          float *dprobs, int64_t n) {
  TESSERA_GRID_LOOP(c, n) { dprobs[c] = keptIndices[c] >= 0 ? dkept[c] : 0.0f; }
}

/// Blocks of kThreads holding one warp per token.
unsigned warpBlocksFor(int64_t tokens) {
  return unsigned((tokens * 32 + kThreads - 1) / kThreads);
}

} // namespace

#define TESSERA_MOE_LAUNCH(kernel, n, stream, ...)                              \
  do {                                                                         \
    if ((n) > 0)                                                               \
      kernel<<<blocksFor(n), kThreads, 0, stream>>>(__VA_ARGS__);              \
  } while (false)

namespace {

/// The choices' sort in `scratch` (moeChoiceSortBytes): keys and values
/// in and out, the experts' first positions, then cub's storage.
struct ChoiceSort {
  uint64_t *keysIn = nullptr, *keysOut = nullptr;
  int32_t *valsIn = nullptr, *valsOut = nullptr, *start = nullptr;
  void *temp = nullptr;
  size_t tempBytes = 0;
  size_t totalBytes = 0;
};

size_t alignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The layout of the sort's scratch at `base` (null: sizes only).
cudaError_t choiceSortLayout(char *base, int64_t n, int64_t experts,
                             ChoiceSort &cs) {
  // Sized for both sorts that use it (all key bits, and the expert bits
  // alone), whichever needs more.
  size_t tempBytes = 0;
  for (int begin : {0, 32}) {
    size_t bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<const uint64_t *>(nullptr),
        static_cast<uint64_t *>(nullptr),
        static_cast<const int32_t *>(nullptr), static_cast<int32_t *>(nullptr),
        n, begin, math::moeSortKeyEndBit(experts));
    if (e != cudaSuccess)
      return e;
    tempBytes = bytes > tempBytes ? bytes : tempBytes;
  }
  const size_t keys = alignUp(size_t(n) * 8), vals = alignUp(size_t(n) * 4),
               starts = alignUp(size_t(experts + 1) * 4);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char *p = base ? base + at : nullptr;
    at += bytes;
    return p;
  };
  cs.keysIn = reinterpret_cast<uint64_t *>(take(keys));
  cs.keysOut = reinterpret_cast<uint64_t *>(take(keys));
  cs.valsIn = reinterpret_cast<int32_t *>(take(vals));
  cs.valsOut = reinterpret_cast<int32_t *>(take(vals));
  cs.start = reinterpret_cast<int32_t *>(take(starts));
  cs.temp = take(alignUp(tempBytes));
  cs.tempBytes = tempBytes;
  cs.totalBytes = at;
  return cudaSuccess;
}

/// Sorts the choices by math::moeChoiceSortKey, stably, over key bits
/// [beginBit, end): the sorted keys and choice indices land in keysOut and
/// valsOut.
cudaError_t sortChoices(cudaStream_t s, const float *probs,
                        const int32_t *indices, int64_t n, int64_t experts,
                        bool byPosition, ChoiceSort &cs, DeviceError *err) {
  TESSERA_MOE_LAUNCH(moeSortKeysKernel, n, s, probs, indices, n, experts,
                     byPosition, cs.keysIn, cs.valsIn, err);
  // By position the low 32 bits are 0: only the expert's bits are sorted.
  return cub::DeviceRadixSort::SortPairs(
      cs.temp, cs.tempBytes, cs.keysIn, cs.keysOut, cs.valsIn, cs.valsOut, n,
      byPosition ? 32 : 0, math::moeSortKeyEndBit(experts), s);
}

} // namespace

size_t moeChoiceSortBytes(int64_t n, int64_t experts, cudaError_t &status) {
  ChoiceSort cs;
  status = choiceSortLayout(nullptr, n, experts, cs);
  return status == cudaSuccess ? cs.totalBytes : 0;
}

cudaError_t launchMoeRows(cudaStream_t s, const int32_t *indices, int64_t n,
                          int64_t experts, int32_t *counts, int32_t *rowOf,
                          void *sortScratch, DeviceError *err) {
  cudaError_t e = cudaMemsetAsync(counts, 0, size_t(experts) * 4, s);
  if (e != cudaSuccess || n == 0)
    return e;
  TESSERA_MOE_LAUNCH(moeCountKernel, n, s, indices, n, experts, counts, true,
                     err);
  ChoiceSort cs;
  if ((e = choiceSortLayout(static_cast<char *>(sortScratch), n, experts,
                            cs)) != cudaSuccess ||
      (e = sortChoices(s, nullptr, indices, n, experts, true, cs, nullptr)) !=
          cudaSuccess)
    return e;
  TESSERA_MOE_LAUNCH(moeRowsFromSortKernel, n, s, cs.keysOut, cs.valsOut, n,
                     experts, rowOf);
  return cudaGetLastError();
}

cudaError_t launchMoeDispatch(cudaStream_t s, const float *x,
                              const int32_t *rowOf, const int32_t *counts,
                              float *rows, int64_t tokens, int64_t k,
                              int64_t experts, int64_t features) {
  const int64_t n = tokens * k;
  TESSERA_MOE_LAUNCH(moeDispatchKernel, n * features, s, x, rowOf, rows, n, k,
                    features);
  TESSERA_MOE_LAUNCH(moeZeroTailKernel, n * features, s, rows, counts, experts,
                    n, features);
  return cudaGetLastError();
}

cudaError_t launchMoeDispatchGrad(cudaStream_t s, const float *drows,
                                  const int32_t *rowOf, float *dx,
                                  int64_t tokens, int64_t k,
                                  int64_t features) {
  TESSERA_MOE_LAUNCH(moeDispatchGradKernel, tokens * features, s, drows, rowOf,
                    dx, tokens, k, features);
  return cudaGetLastError();
}

cudaError_t launchMoeCombine(cudaStream_t s, const float *rows,
                             const float *probs, const int32_t *rowOf,
                             float *y, int64_t tokens, int64_t k,
                             int64_t features) {
  TESSERA_MOE_LAUNCH(moeCombineKernel, tokens * features, s, rows, probs, rowOf,
                    y, tokens, k, features);
  return cudaGetLastError();
}

cudaError_t launchMoeCombineGrad(cudaStream_t s, const float *rows,
                                 const float *probs, const int32_t *rowOf,
                                 const int32_t *counts, const float *dy,
                                 float *drows, float *dprobs, int64_t tokens,
                                 int64_t k, int64_t experts,
                                 int64_t features) {
  const int64_t n = tokens * k;
  TESSERA_MOE_LAUNCH(moeCombineGradRowsKernel, n * features, s, probs, rowOf,
                    dy, drows, n, k, features);
  TESSERA_MOE_LAUNCH(moeZeroTailKernel, n * features, s, drows, counts, experts,
                    n, features);
  if (n > 0)
    moeCombineGradProbsKernel<<<unsigned(n), features >= 256 ? 256 : 64, 0,
                                s>>>(rows, rowOf, dy, dprobs, k, features);
  return cudaGetLastError();
}

cudaError_t launchMoeRouter(cudaStream_t s, const float *logits, float *probs,
                            int32_t *indices, int64_t tokens, int64_t experts,
                            int64_t k) {
  TESSERA_MOE_LAUNCH(moeRouterKernel, tokens, s, logits, probs, indices, tokens,
                    experts, k);
  return cudaGetLastError();
}

cudaError_t launchMoeRouterGrad(cudaStream_t s, const float *probs,
                                const int32_t *indices, const float *dprobs,
                                float *dlogits, int64_t tokens,
                                int64_t experts, int64_t k, DeviceError *err) {
  TESSERA_MOE_LAUNCH(moeRouterGradKernel, tokens, s, probs, indices, dprobs,
                    dlogits, tokens, experts, k, err);
  return cudaGetLastError();
}

cudaError_t launchMoeAuxCounts(cudaStream_t s, const int32_t *indices,
                               int64_t n, int64_t experts, int32_t *counts,
                               DeviceError *err) {
  cudaError_t e = cudaMemsetAsync(counts, 0, size_t(experts) * 4, s);
  if (e != cudaSuccess)
    return e;
  TESSERA_MOE_LAUNCH(moeCountKernel, n, s, indices, n, experts, counts, false,
                     err);
  return cudaGetLastError();
}

cudaError_t launchMoeAuxLoss(cudaStream_t s, const float *logits,
                             const float *allCounts, const int32_t *counts,
                             double *partial, float *y, int64_t tokens,
                             int64_t experts, int64_t k, float coeff) {
  if (tokens > 0)
    moeAuxPartialKernel<<<warpBlocksFor(tokens), kThreads, 0, s>>>(
        logits, allCounts, counts, partial, tokens, experts);
  moeAuxLossKernel<<<1, kReduceThreads, 0, s>>>(partial, allCounts, y, tokens,
                                               experts, k, coeff);
  return cudaGetLastError();
}

cudaError_t launchMoeAuxLossGrad(cudaStream_t s, const float *logits,
                                 const float *allCounts, const int32_t *counts,
                                 const float *dy, float *dlogits,
                                 int64_t tokens, int64_t experts, int64_t k,
                                 float coeff) {
  if (tokens > 0)
    moeAuxLossGradKernel<<<warpBlocksFor(tokens), kThreads, 0, s>>>(
        logits, allCounts, counts, dy, dlogits, tokens, experts, k, coeff);
  return cudaGetLastError();
}

cudaError_t launchMoeTokenCounts(cudaStream_t s, const int32_t *indices,
                                 float *counts, int64_t n, int64_t experts,
                                 DeviceError *err) {
  cudaError_t e = cudaMemsetAsync(counts, 0, size_t(experts) * 4, s);
  if (e != cudaSuccess)
    return e;
  TESSERA_MOE_LAUNCH(moeTokenCountsKernel, n, s, indices, counts, n, experts,
                    err);
  return cudaGetLastError();
}

cudaError_t launchMoeCapacityDrop(cudaStream_t s, const float *probs,
                                  const int32_t *indices, float *keptProbs,
                                  int32_t *keptIndices, int64_t n,
                                  int64_t experts, int64_t capacity,
                                  bool byPosition, void *sortScratch,
                                  DeviceError *err) {
  if (n == 0)
    return cudaSuccess;
  ChoiceSort cs;
  cudaError_t e;
  if ((e = choiceSortLayout(static_cast<char *>(sortScratch), n, experts,
                            cs)) != cudaSuccess ||
      (e = sortChoices(s, probs, indices, n, experts, byPosition, cs, err)) !=
          cudaSuccess)
    return e;
  TESSERA_MOE_LAUNCH(moeExpertStartKernel, n, s, cs.keysOut, n, cs.start);
  TESSERA_MOE_LAUNCH(moeCapacityKeepKernel, n, s, cs.keysOut, cs.valsOut,
                     cs.start, probs, indices, n, experts, capacity, keptProbs,
                     keptIndices);
  return cudaGetLastError();
}

cudaError_t launchMoeCapacityDropGrad(cudaStream_t s, const float *dkept,
                                      const int32_t *keptIndices,
                                      float *dprobs, int64_t n) {
  TESSERA_MOE_LAUNCH(moeCapacityDropGradKernel, n, s, dkept, keptIndices,
                    dprobs, n);
  return cudaGetLastError();
}

} // namespace tessera::rt::cuda
