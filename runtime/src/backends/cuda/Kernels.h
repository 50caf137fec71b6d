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

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::rt::cuda {

cudaError_t launchBiasAdd(cudaStream_t s, const float *x, const float *bias,
                          float *y, int64_t rows, int64_t cols);
cudaError_t launchAdd(cudaStream_t s, const float *a, const float *b, float *c,
                      int64_t n);
cudaError_t launchGelu(cudaStream_t s, const float *x, float *y, int64_t n,
                       bool tanh);
cudaError_t launchGeluGrad(cudaStream_t s, const float *x, const float *dy,
                           float *dx, int64_t n, bool tanh);
cudaError_t launchBiasGelu(cudaStream_t s, const float *x, const float *bias,
                           float *y, int64_t rows, int64_t cols, bool tanh);
cudaError_t launchBiasGeluGrad(cudaStream_t s, const float *x,
                               const float *bias, const float *dy, float *dx,
                               float *dbias, int64_t rows, int64_t cols,
                               bool tanh, float beta);
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
cudaError_t launchCast(cudaStream_t s, const void *x, bool xBf16, void *y,
                       bool yBf16, int64_t n, float beta);
cudaError_t launchFillBf16(cudaStream_t s, uint16_t *y, float value,
                           int64_t n);
cudaError_t launchScaleBf16(cudaStream_t s, const uint16_t *x, uint16_t *y,
                            float alpha, int64_t n);
cudaError_t launchAxpyBf16(cudaStream_t s, float alpha, const uint16_t *x,
                           uint16_t *y, int64_t n);
/// One fused kernel over a whole bucket; reads the iteration on the device.
cudaError_t launchAdam(cudaStream_t s, float *p, const float *g, float *m,
                       float *v, int64_t n, const int64_t *iteration,
                       float lr, float beta1, float beta2, float eps,
                       float weightDecay, DeviceError *err);
cudaError_t launchSgd(cudaStream_t s, float *p, const float *g, int64_t n,
                      float lr, float weightDecay);
cudaError_t launchLayerNorm(cudaStream_t s, const float *x, const float *gamma,
                            const float *bias, float *y, int64_t rows,
                            int64_t cols, float eps);
/// `stats` is device scratch of 2 * rows floats (row mean and rstd).
cudaError_t launchAddLayerNorm(cudaStream_t s, const float *a, const float *b,
                               const float *gamma, const float *bias, float *sum,
                               float *y, int64_t rows, int64_t cols, float eps);
/// dR (the residual's gradient, added to dX) may be null.
cudaError_t launchLayerNormGrad(cudaStream_t s, const float *x,
                                const float *gamma, const float *dy,
                                const float *dr, float *dx, float *dgamma,
                                float *dbias, int64_t rows, int64_t cols,
                                float eps, float beta, float *stats);
cudaError_t launchEmbedding(cudaStream_t s, const int32_t *ids,
                            const float *table, float *y, int64_t rows,
                            int64_t localVocab, int64_t dim,
                            int64_t vocabOffset, int64_t vocabSize,
                            DeviceError *err);
cudaError_t launchEmbeddingGrad(cudaStream_t s, const int32_t *ids,
                                const float *dy, float *dtable, int64_t rows,
                                int64_t localVocab, int64_t dim,
                                int64_t vocabOffset, float beta);
cudaError_t launchAddPositionEmbedding(cudaStream_t s, const float *x,
                                       const float *pos, float *y, int64_t seq,
                                       int64_t batch, int64_t dim);
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
cudaError_t launchLogitsMax(cudaStream_t s, const float *z, float *m,
                            int64_t rows, int64_t cols);
cudaError_t launchCrossEntropyStats(cudaStream_t s, const float *z,
                                    const int32_t *t, const float *m,
                                    float *se, float *pl, int64_t rows,
                                    int64_t cols, int64_t vocabOffset,
                                    int64_t numClasses, int64_t ignoreIndex,
                                    DeviceError *err);
cudaError_t launchLogitsStats(cudaStream_t s, const float *z, const int32_t *t,
                              float *m, float *se, float *pl, int64_t rows,
                              int64_t cols, int64_t ignoreIndex,
                              DeviceError *err);
cudaError_t launchCrossEntropyFromStats(cudaStream_t s, const float *se,
                                        const float *pl, const float *m,
                                        const int32_t *t, float *loss,
                                        int64_t rows, int64_t ignoreIndex);
cudaError_t launchCrossEntropyStatsGrad(
    cudaStream_t s, const float *z, const int32_t *t, const float *m,
    const float *se, const float *dl, float *dz, int64_t rows, int64_t cols,
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
cudaError_t launchDropout(cudaStream_t s, const float *x, float *y,
                          int64_t seq, int64_t batch, int64_t hidden,
                          int64_t seqOffset, int64_t seqTotal,
                          int64_t firstSample, uint64_t seed,
                          uint64_t streamHash, float rate);

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_KERNELS_H
