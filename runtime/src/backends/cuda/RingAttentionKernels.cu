//===- RingAttentionKernels.cu - Row kernels of the ring attention --------===//
//
// The CUDA backend's ring attention step runs, per pair of a query chunk
// and a key chunk, strided-batched GEMMs (GemmPlan.h's RingAttentionPlans)
// around these kernels, the CPU backend's per-row steps:
//   - the forward's online softmax: one block per (head, query row) takes
//     the row's scores to exp(s - m') with the running max m' and rescales
//     the running sum and the unnormalised output row by exp(m - m');
//   - the last step's normalisation (O / l, LSE = m + log l);
//   - the backward's probabilities exp(s - LSE), dS = P (dP - delta) and
//     delta = rowsum(dO O);
//   - packing K/V out of QKV and the K/V gradients back into dQKV.
// exp is math::expApprox, as on the CPU.
//
//===----------------------------------------------------------------------===//

#include "DeviceCommon.cuh"
#include "Kernels.h"

#include "tessera/rt/math/Kernels.h"

namespace tessera::rt::cuda {
namespace {

/// dst[g, 0:width] = src[g, offset:offset + width] for `groups` groups of
/// srcStride and dstStride elements.
__global__ void copyGroupsKernel(const float *src, float *dst, int64_t groups,
                                 int64_t width, int64_t srcStride,
                                 int64_t srcOffset, int64_t dstStride,
                                 int64_t dstOffset) {
  TESSERA_GRID_LOOP(i, groups * width) {
    const int64_t g = i / width, j = i % width;
    dst[g * dstStride + dstOffset + j] = src[g * srcStride + srcOffset + j];
  }
}

__global__ void ringInitKernel(float *m, float *l, int64_t n) {
  TESSERA_GRID_LOOP(i, n) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
}

/// One block per (head z, query row i of the chunk): the online-softmax
/// update of the row's scores `p` (in place), of its running max m and sum
/// l, and of its output row.
__global__ void ringForwardRowsKernel(float *probs, float *m, float *l,
                                      float *o, int64_t chunk, int64_t seq,
                                      int64_t q0, int64_t ldo, int64_t headDim,
                                      bool diagonal) {
  const int64_t z = blockIdx.x / chunk, i = blockIdx.x % chunk;
  float *row = probs + (z * chunk + i) * chunk;
  const int64_t valid = diagonal ? i + 1 : chunk;
  const int64_t r = z * seq + q0 + i;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    mx = math::selectf(row[j] > mx, row[j], mx);
  mx = blockMax(mx);
  const float old = m[r];
  mx = math::selectf(old > mx, old, mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < chunk; j += blockDim.x) {
    const float e = j < valid ? math::expApprox(row[j] - mx) : 0.0f;
    row[j] = e;
    sum += e;
  }
  sum = blockSum(sum);
  const float alpha = old == -INFINITY ? 0.0f : math::expApprox(old - mx);
  float *orow = o + (q0 + i) * ldo + z * headDim;
  for (int64_t j = threadIdx.x; j < headDim; j += blockDim.x)
    orow[j] *= alpha;
  __syncthreads(); // every thread has read m[r]
  if (threadIdx.x == 0) {
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
  }
}

/// O /= l and LSE [S, B * heads] = m + log l, per (head, row).
__global__ void ringNormalizeKernel(float *o, const float *m, const float *l,
                                    float *lse, int64_t seq, int64_t heads,
                                    int64_t headDim, int64_t ldo) {
  TESSERA_GRID_LOOP(i, heads * seq * headDim) {
    const int64_t j = i % headDim, r = (i / headDim) % seq,
                  z = i / (headDim * seq);
    const float inv = 1.0f / l[z * seq + r];
    o[r * ldo + z * headDim + j] *= inv;
    if (j == 0)
      lse[r * heads + z] = m[z * seq + r] + logf(l[z * seq + r]);
  }
}

/// delta[z, r] = dO[r, z] . O[r, z], one warp per (head, row).
__global__ void ringDeltaKernel(const float *o, const float *dout,
                                float *delta, int64_t seq, int64_t heads,
                                int64_t headDim, int64_t ldo) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= heads * seq)
    return;
  const int64_t z = w / seq, r = w % seq;
  const float *orow = o + r * ldo + z * headDim;
  const float *drow = dout + r * ldo + z * headDim;
  float sum = 0.0f;
  for (int64_t j = lane; j < headDim; j += 32)
    sum += orow[j] * drow[j];
  for (int offset = 16; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0)
    delta[z * seq + r] = sum;
}

/// P = exp(S - LSE) where unmasked, 0 elsewhere; LSE [S, totalHeads], the
/// pointer at the group's first head.
__global__ void ringGradProbsKernel(float *probs, const float *lse,
                                    int64_t count, int64_t chunk, int64_t q0,
                                    int64_t totalHeads, bool diagonal) {
  TESSERA_GRID_LOOP(x, count * chunk * chunk) {
    const int64_t j = x % chunk, i = (x / chunk) % chunk,
                  z = x / (chunk * chunk);
    const bool visible = !diagonal || j <= i;
    probs[x] = visible
                   ? math::expApprox(probs[x] - lse[(q0 + i) * totalHeads + z])
                   : 0.0f;
  }
}

/// dS = P (dP - delta) in place in dprobs; delta [heads, S] at the group's
/// first head.
__global__ void ringGradScoresKernel(const float *probs, float *dprobs,
                                     const float *delta, int64_t count,
                                     int64_t chunk, int64_t seq, int64_t q0) {
  TESSERA_GRID_LOOP(x, count * chunk * chunk) {
    const int64_t i = (x / chunk) % chunk, z = x / (chunk * chunk);
    dprobs[x] = probs[x] * (dprobs[x] - delta[z * seq + q0 + i]);
  }
}

} // namespace

#define TESSERA_RING_LAUNCH(kernel, n, stream, ...)                            \
  do {                                                                         \
    if ((n) > 0)                                                               \
      kernel<<<blocksFor(n), kThreads, 0, stream>>>(__VA_ARGS__);              \
    return cudaGetLastError();                                                 \
  } while (false)

cudaError_t launchRingPack(cudaStream_t s, const float *qkv, float *kv,
                           int64_t groups, int64_t headDim) {
  TESSERA_RING_LAUNCH(copyGroupsKernel, groups * 2 * headDim, s, qkv, kv,
                      groups, 2 * headDim, 3 * headDim, headDim, 2 * headDim,
                      int64_t(0));
}
cudaError_t launchRingUnpack(cudaStream_t s, const float *dkv, float *dqkv,
                             int64_t groups, int64_t headDim) {
  TESSERA_RING_LAUNCH(copyGroupsKernel, groups * 2 * headDim, s, dkv, dqkv,
                      groups, 2 * headDim, 2 * headDim, int64_t(0),
                      3 * headDim, headDim);
}
cudaError_t launchRingInit(cudaStream_t s, float *m, float *l, int64_t n) {
  TESSERA_RING_LAUNCH(ringInitKernel, n, s, m, l, n);
}
cudaError_t launchRingForwardRows(cudaStream_t s, float *probs, float *m,
                                  float *l, float *o, int64_t count,
                                  int64_t chunk, int64_t seq, int64_t q0,
                                  int64_t ldo, int64_t headDim,
                                  bool diagonal) {
  if (count * chunk > 0)
    ringForwardRowsKernel<<<unsigned(count * chunk),
                            chunk >= 256 ? 256u : 64u, 0, s>>>(
        probs, m, l, o, chunk, seq, q0, ldo, headDim, diagonal);
  return cudaGetLastError();
}
cudaError_t launchRingNormalize(cudaStream_t s, float *o, const float *m,
                                const float *l, float *lse, int64_t seq,
                                int64_t heads, int64_t headDim, int64_t ldo) {
  TESSERA_RING_LAUNCH(ringNormalizeKernel, heads * seq * headDim, s, o, m, l,
                      lse, seq, heads, headDim, ldo);
}
cudaError_t launchRingDelta(cudaStream_t s, const float *o, const float *dout,
                            float *delta, int64_t seq, int64_t heads,
                            int64_t headDim, int64_t ldo) {
  const int64_t threads = heads * seq * 32;
  if (threads > 0)
    ringDeltaKernel<<<unsigned((threads + kThreads - 1) / kThreads), kThreads,
                      0, s>>>(o, dout, delta, seq, heads, headDim, ldo);
  return cudaGetLastError();
}
cudaError_t launchRingGradProbs(cudaStream_t s, float *probs, const float *lse,
                                int64_t count, int64_t chunk, int64_t q0,
                                int64_t totalHeads, bool diagonal) {
  TESSERA_RING_LAUNCH(ringGradProbsKernel, count * chunk * chunk, s, probs, lse,
                      count, chunk, q0, totalHeads, diagonal);
}
cudaError_t launchRingGradScores(cudaStream_t s, const float *probs,
                                 float *dprobs, const float *delta,
                                 int64_t count, int64_t chunk, int64_t seq,
                                 int64_t q0) {
  TESSERA_RING_LAUNCH(ringGradScoresKernel, count * chunk * chunk, s, probs,
                      dprobs, delta, count, chunk, seq, q0);
}

} // namespace tessera::rt::cuda
