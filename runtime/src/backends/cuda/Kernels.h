//===- Kernels.h - Launchers of the CUDA backend's kernels ------*- C++ -*-===//
//
// Host functions that enqueue the kernels of Kernels.cu on a stream; the
// CUDA backend (CudaBackend.cpp) calls them. Each returns the launch error
// (cudaGetLastError), never waits, and takes the arguments of the Backend
// method it implements (Backend.h documents the math). Kernels whose input
// can be out of range record it in `err` (DeviceError.h).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_KERNELS_H
#define TESSERA_RT_BACKENDS_CUDA_KERNELS_H

#include "DeviceError.h"
#include "tessera/rt/BF16.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::rt::cuda {

/// A float operand in any FloatFormat (the Backend's FloatIn and FloatOut):
/// the kernels of the activations load and store it as its format says.
struct DeviceFloats {
  void *data;
  FloatFormat format;
};

cudaError_t launchBiasAdd(cudaStream_t s, DeviceFloats x, const float *bias,
                          DeviceFloats y, int64_t rows, int64_t cols);
cudaError_t launchAdd(cudaStream_t s, DeviceFloats a, DeviceFloats b,
                      DeviceFloats c, int64_t n);
cudaError_t launchGelu(cudaStream_t s, const float *x, float *y, int64_t n,
                       bool tanh);
cudaError_t launchGeluGrad(cudaStream_t s, const float *x, const float *dy,
                           float *dx, int64_t n, bool tanh);
cudaError_t launchBiasGelu(cudaStream_t s, DeviceFloats x, const float *bias,
                           DeviceFloats y, int64_t rows, int64_t cols, bool tanh);
cudaError_t launchBiasGeluGrad(cudaStream_t s, DeviceFloats x,
                               const float *bias, const float *dy, float *dx,
                               float *dbias, int64_t rows, int64_t cols,
                               bool tanh, float beta);
/// SwiGLU over rows of [gate | up] (x [rows, 2n], y [rows, n]) and its
/// backward (dx [rows, 2n]).
cudaError_t launchSwiGLU(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                         int64_t rows, int64_t n);
cudaError_t launchSwiGLUGrad(cudaStream_t s, DeviceFloats x, const float *dy,
                             DeviceFloats dx, int64_t rows, int64_t n);
/// Grouped-query attention's K/V repeat (x [rows, G (heads/G + 2) d] ->
/// y [rows, heads 3 d]) and its backward (dK, dV summed per group).
/// Both in any float format.
cudaError_t launchRepeatKV(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                           int64_t rows, int64_t heads, int64_t groups,
                           int64_t headDim);
cudaError_t launchRepeatKVGrad(cudaStream_t s, DeviceFloats dy, DeviceFloats dx,
                               int64_t rows, int64_t heads, int64_t groups,
                               int64_t headDim);
/// QK-norm over a grouped QKV and its backward (the weight gradients summed
/// over the heads in row order, one thread per weight).
cudaError_t launchQKNorm(cudaStream_t s, const float *x, const float *wq,
                         const float *wk, float *y, int64_t rows,
                         int64_t heads, int64_t groups, int64_t headDim,
                         float eps);
cudaError_t launchQKNormGrad(cudaStream_t s, const float *x, const float *wq,
                             const float *wk, const float *dy, float *dx,
                             float *dwq, float *dwk, int64_t rows,
                             int64_t heads, int64_t groups, int64_t headDim,
                             float eps, float beta);
cudaError_t launchRelu(cudaStream_t s, const float *x, float *y, int64_t n);
cudaError_t launchReluGrad(cudaStream_t s, const float *x, const float *dy,
                           float *dx, int64_t n);
cudaError_t launchReduceRows(cudaStream_t s, const float *x, float *y,
                             int64_t rows, int64_t cols, float alpha,
                             float beta);
cudaError_t launchCrossEntropy(cudaStream_t s, const float *z, const int32_t *t,
                               float *loss, int64_t rows, int64_t cols,
                               DeviceError *err);
cudaError_t launchCrossEntropyGrad(cudaStream_t s, const float *z,
                                   const int32_t *t, const float *dl, float *dz,
                                   int64_t rows, int64_t cols,
                                   DeviceError *err);
cudaError_t launchMean(cudaStream_t s, const float *x, float *y, int64_t n);
cudaError_t launchMeanGrad(cudaStream_t s, const float *dy, float *dx,
                           int64_t n);
cudaError_t launchFill(cudaStream_t s, float *y, float value, int64_t n);
cudaError_t launchScale(cudaStream_t s, const float *x, float *y, float alpha,
                        int64_t n);
cudaError_t launchAxpy(cudaStream_t s, float alpha, const float *x, float *y,
                       int64_t n);
cudaError_t launchCast(cudaStream_t s, const void *x, FloatFormat xFormat,
                       void *y, FloatFormat yFormat, int64_t n, float beta);
/// Y = X but the columns from `keep` on of every row, which are `fill`.
cudaError_t launchMaskColumns(cudaStream_t s, const float *x, float *y,
                              int64_t rows, int64_t cols, int64_t keep,
                              float fill);
cudaError_t launchFillHalf(cudaStream_t s, FloatFormat half, uint16_t *y,
                           float value, int64_t n);
cudaError_t launchScaleHalf(cudaStream_t s, FloatFormat half,
                            const uint16_t *x, uint16_t *y, float alpha,
                            int64_t n);
cudaError_t launchAxpyHalf(cudaStream_t s, FloatFormat half, float alpha,
                           const uint16_t *x, uint16_t *y, int64_t n);
/// One fused kernel over a whole bucket; reads the iteration on the device.
cudaError_t launchAdam(cudaStream_t s, float *p, const float *g, float *m,
                       float *v, int64_t n, const int64_t *iteration,
                       float lr, float beta1, float beta2, float eps,
                       float weightDecay, DeviceError *err);
cudaError_t launchSgd(cudaStream_t s, float *p, const float *g, int64_t n,
                      float lr, float weightDecay);
cudaError_t launchSgdMomentum(cudaStream_t s, float *p, const float *g,
                              float *b, int64_t n, float lr, float weightDecay,
                              float momentum);
/// The most partial sums launchSumSquares uses (its scratch: that many
/// doubles).
inline constexpr int kSumSquaresBlocks = 256;
/// y[0] (+)= sum of x^2 in f64, deterministic for a given n: a fixed grid
/// of partial sums into `partial` (kSumSquaresBlocks doubles of device
/// scratch), then one block adding them in order.
cudaError_t launchSumSquares(cudaStream_t s, const void *x, FloatFormat format,
                             int64_t n, float *y, bool accumulate,
                             double *partial);
cudaError_t launchClipGradNorm(cudaStream_t s, const float *sumsq, float *norm,
                               float *coeff, float maxNorm, float invScale);
cudaError_t launchScaleBy(cudaStream_t s, const float *x, const float *scale,
                          float *y, int64_t n);
/// The layer-norm launchers run RMSNorm (Megatron's RMSNorm: no mean, no
/// bias) where `bias` (`dbias` for the gradient) is null.
cudaError_t launchLayerNorm(cudaStream_t s, DeviceFloats x, const float *gamma,
                            const float *bias, DeviceFloats y, int64_t rows,
                            int64_t cols, float eps);
/// `stats` is device scratch of 2 * rows floats (row mean and rstd).
cudaError_t launchAddLayerNorm(cudaStream_t s, const float *a, const float *b,
                               const float *gamma, const float *bias, float *sum,
                               DeviceFloats y, int64_t rows, int64_t cols,
                               float eps);
/// dR (the residual's gradient, added to dX) may be null.
cudaError_t launchLayerNormGrad(cudaStream_t s, DeviceFloats x,
                                const float *gamma, const float *dy,
                                const float *dr, float *dx, float *dgamma,
                                float *dbias, int64_t rows, int64_t cols,
                                float eps, float beta, float *stats);
/// The lookup and the position add: tables and rows in any float format.
cudaError_t launchEmbedding(cudaStream_t s, const int32_t *ids,
                            DeviceFloats table, DeviceFloats y, int64_t rows,
                            int64_t localVocab, int64_t dim,
                            int64_t vocabOffset, int64_t vocabSize,
                            DeviceError *err);
cudaError_t launchEmbeddingGrad(cudaStream_t s, const int32_t *ids,
                                const float *dy, float *dtable, int64_t rows,
                                int64_t localVocab, int64_t dim,
                                int64_t vocabOffset, float beta);
cudaError_t launchAddPositionEmbedding(cudaStream_t s, DeviceFloats x,
                                       DeviceFloats pos, DeviceFloats y,
                                       int64_t seq, int64_t batch, int64_t dim);
cudaError_t launchPositionEmbeddingGrad(cudaStream_t s, const float *dy,
                                        float *dpos, int64_t seq,
                                        int64_t batch, int64_t dim,
                                        int64_t posRows, float beta);
/// In-place row softmax of `rows` rows of `cols` scores; with `causal`, row
/// r keeps its first (r % cols) + 1 entries and zeroes the rest.
cudaError_t launchSoftmaxRows(cudaStream_t s, float *p, int64_t rows,
                              int64_t cols, bool causal);
/// dS = P * (dP - rowsum(P * dP)), in place in dp.
cudaError_t launchSoftmaxGradRows(cudaStream_t s, const float *p, float *dp,
                                  int64_t rows, int64_t cols);
/// The loss statistics and their gradient: Z (and dZ) in any float format.
cudaError_t launchLogitsMax(cudaStream_t s, DeviceFloats z, float *m,
                            int64_t rows, int64_t cols);
cudaError_t launchCrossEntropyStats(cudaStream_t s, DeviceFloats z,
                                    const int32_t *t, const float *m,
                                    float *se, float *pl, int64_t rows,
                                    int64_t cols, int64_t vocabOffset,
                                    int64_t numClasses, int64_t ignoreIndex,
                                    DeviceError *err);
cudaError_t launchLogitsStats(cudaStream_t s, DeviceFloats z, const int32_t *t,
                              float *m, float *se, float *pl, int64_t rows,
                              int64_t cols, int64_t ignoreIndex,
                              DeviceError *err);
cudaError_t launchCrossEntropyFromStats(cudaStream_t s, const float *se,
                                        const float *pl, const float *m,
                                        const int32_t *t, float *loss,
                                        int64_t rows, int64_t ignoreIndex);
cudaError_t launchCrossEntropyStatsGrad(
    cudaStream_t s, DeviceFloats z, const int32_t *t, const float *m,
    const float *se, const float *dl, DeviceFloats dz, int64_t rows, int64_t cols,
    int64_t vocabOffset, int64_t numClasses, int64_t ignoreIndex,
    DeviceError *err);
cudaError_t launchTokenMean(cudaStream_t s, const float *loss, const int32_t *t,
                            float *y, int64_t rows, int64_t ignoreIndex,
                            const float *count);
cudaError_t launchTokenCount(cudaStream_t s, const int32_t *t, float *n,
                             int64_t rows, int64_t ignoreIndex);
cudaError_t launchTokenMeanGrad(cudaStream_t s, const float *dy,
                                const int32_t *t, float *dl, int64_t rows,
                                int64_t ignoreIndex, const float *count);
/// RoPE of the q and k of a fused QKV (Backend::rotaryEmbedding), in any
/// float formats.
cudaError_t launchRotaryEmbedding(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                                  int64_t seq, int64_t batch, int64_t features,
                                  int64_t heads, int64_t rotDim, float base,
                                  float scalingFactor, int64_t posBegin,
                                  bool inverse);
cudaError_t launchDropout(cudaStream_t s, DeviceFloats x, DeviceFloats y,
                          int64_t seq, int64_t batch, int64_t hidden,
                          int64_t seqOffset, int64_t seqTotal,
                          int64_t firstSample, uint64_t seed,
                          uint64_t streamHash, float rate);

//===----------------------------------------------------------------------===//
// Ring attention's row kernels (RingAttentionKernels.cu); heads z = b *
// heads + h, the per-head statistics [heads, seq], LSE [seq, heads].
//===----------------------------------------------------------------------===//

/// kv [groups, 2, D] = the k and v of qkv [groups, 3, D], and back.
cudaError_t launchRingPack(cudaStream_t s, const float *qkv, float *kv,
                           int64_t groups, int64_t headDim);
cudaError_t launchRingUnpack(cudaStream_t s, const float *dkv, float *dqkv,
                             int64_t groups, int64_t headDim);
/// m = -inf, l = 0 over n rows.
cudaError_t launchRingInit(cudaStream_t s, float *m, float *l, int64_t n);
/// The online-softmax update of `count` heads' [chunk, chunk] scores (in
/// place: their exponentials) for query rows q0.. of the chunk pair; m, l
/// and o point at the group's first head.
cudaError_t launchRingForwardRows(cudaStream_t s, float *probs, float *m,
                                  float *l, float *o, int64_t count,
                                  int64_t chunk, int64_t seq, int64_t q0,
                                  int64_t ldo, int64_t headDim, bool diagonal);
cudaError_t launchRingNormalize(cudaStream_t s, float *o, const float *m,
                                const float *l, float *lse, int64_t seq,
                                int64_t heads, int64_t headDim, int64_t ldo);
cudaError_t launchRingDelta(cudaStream_t s, const float *o, const float *dout,
                            float *delta, int64_t seq, int64_t heads,
                            int64_t headDim, int64_t ldo);
cudaError_t launchRingGradProbs(cudaStream_t s, float *probs, const float *lse,
                                int64_t count, int64_t chunk, int64_t q0,
                                int64_t totalHeads, bool diagonal);
cudaError_t launchRingGradScores(cudaStream_t s, const float *probs,
                                 float *dprobs, const float *delta,
                                 int64_t count, int64_t chunk, int64_t seq,
                                 int64_t q0);

//===----------------------------------------------------------------------===//
// Mixture of experts (MoEKernels.cu)
//===----------------------------------------------------------------------===//

/// Bytes of device scratch launchMoeRows and launchMoeCapacityDrop need
/// for `n` routing choices over `experts` (the choices' sort: keys and
/// values in and out, the capacity's expert starts and cub's temporary
/// storage), or 0 with `status` set when cub cannot size it.
size_t moeChoiceSortBytes(int64_t n, int64_t experts, cudaError_t &status);
/// counts [experts] (int32) and rowOf [n]: each routing choice's row in
/// expert order (math/MoE.h's layout), -1 for a dropped choice (index -1).
/// `sortScratch` holds moeChoiceSortBytes(n, experts).
cudaError_t launchMoeRows(cudaStream_t s, const int32_t *indices, int64_t n,
                          int64_t experts, int32_t *counts, int32_t *rowOf,
                          void *sortScratch, DeviceError *err);
/// The MoE kernels over a row map from launchMoeRows.
cudaError_t launchMoeDispatch(cudaStream_t s, const float *x,
                              const int32_t *rowOf, const int32_t *counts,
                              float *rows, int64_t tokens, int64_t k,
                              int64_t experts, int64_t features);
cudaError_t launchMoeDispatchGrad(cudaStream_t s, const float *drows,
                                  const int32_t *rowOf, float *dx,
                                  int64_t tokens, int64_t k, int64_t features);
cudaError_t launchMoeCombine(cudaStream_t s, const float *rows,
                             const float *probs, const int32_t *rowOf,
                             float *y, int64_t tokens, int64_t k,
                             int64_t features);
cudaError_t launchMoeCombineGrad(cudaStream_t s, const float *rows,
                                 const float *probs, const int32_t *rowOf,
                                 const int32_t *counts, const float *dy,
                                 float *drows, float *dprobs, int64_t tokens,
                                 int64_t k, int64_t experts, int64_t features);
cudaError_t launchMoeRouter(cudaStream_t s, const float *logits, float *probs,
                            int32_t *indices, int64_t tokens, int64_t experts,
                            int64_t k);
cudaError_t launchMoeRouterGrad(cudaStream_t s, const float *probs,
                                const int32_t *indices, const float *dprobs,
                                float *dlogits, int64_t tokens,
                                int64_t experts, int64_t k, DeviceError *err);
/// counts [experts] (int32) of the routing choices, every index checked.
cudaError_t launchMoeAuxCounts(cudaStream_t s, const int32_t *indices,
                               int64_t n, int64_t experts, int32_t *counts,
                               DeviceError *err);
/// The load-balancing loss from the counts (or `allCounts`, f32, when not
/// null); `partial` is device scratch of `tokens` doubles.
cudaError_t launchMoeAuxLoss(cudaStream_t s, const float *logits,
                             const float *allCounts, const int32_t *counts,
                             double *partial, float *y, int64_t tokens,
                             int64_t experts, int64_t k, float coeff);
cudaError_t launchMoeAuxLossGrad(cudaStream_t s, const float *logits,
                                 const float *allCounts, const int32_t *counts,
                                 const float *dy, float *dlogits,
                                 int64_t tokens, int64_t experts, int64_t k,
                                 float coeff);
cudaError_t launchMoeTokenCounts(cudaStream_t s, const int32_t *indices,
                                 float *counts, int64_t n, int64_t experts,
                                 DeviceError *err);
/// `sortScratch` holds moeChoiceSortBytes(n, experts).
cudaError_t launchMoeCapacityDrop(cudaStream_t s, const float *probs,
                                  const int32_t *indices, float *keptProbs,
                                  int32_t *keptIndices, int64_t n,
                                  int64_t experts, int64_t capacity,
                                  bool byPosition, void *sortScratch,
                                  DeviceError *err);
cudaError_t launchMoeCapacityDropGrad(cudaStream_t s, const float *dkept,
                                      const int32_t *keptIndices,
                                      float *dprobs, int64_t n);

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_KERNELS_H
