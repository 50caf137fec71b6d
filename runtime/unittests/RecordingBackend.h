//===- RecordingBackend.h - A backend that records its calls ----*- C++ -*-===//
//
// Wraps another backend, forwards every call to it and tells an observer
// the name of each call first (by default: appends it to a list), so tests
// can check what the executor asks of a backend: how often it makes the
// host wait (synchronize, copyToHost), and in which order kernels run
// relative to other events (NcclExecutorTest merges them into the fake
// NCCL's call log). Test-only.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_UNITTESTS_RECORDINGBACKEND_H
#define TESSERA_RT_UNITTESTS_RECORDINGBACKEND_H

#include "tessera/rt/Backend.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::rt::test {

class RecordingBackend final : public Backend {
public:
  /// Called with the method's name before each forwarded call.
  using Observer = std::function<void(const char *call)>;

  /// With `deviceMemory`, claims its memory is not host memory
  /// (hostMemory() false), so the executor takes the paths of a GPU
  /// backend (pinned chunks for whole buffers) over the inner backend's
  /// host memory.
  RecordingBackend(std::unique_ptr<Backend> inner, Observer observer,
                   bool deviceMemory = false)
      : inner(std::move(inner)), observer(std::move(observer)),
        deviceMemory(deviceMemory) {}
  /// Appends every call's name to `calls` (which must outlive the backend:
  /// the executor owns the backend, the test keeps the log).
  RecordingBackend(std::unique_ptr<Backend> inner,
                   std::vector<std::string> &calls, bool deviceMemory = false)
      : RecordingBackend(
            std::move(inner),
            [&calls](const char *call) { calls.push_back(call); },
            deviceMemory) {}

  /// How many recorded calls are named `name`.
  static int64_t count(const std::vector<std::string> &calls,
                       const std::string &name) {
    return int64_t(std::count(calls.begin(), calls.end(), name));
  }

  /// Whether [ptr, ptr + bytes) lies in memory allocate() returned (the
  /// "device" memory of a deviceMemory backend), not freed since.
  bool owns(const void *ptr, int64_t bytes) const {
    auto it = allocations.upper_bound(const_cast<void *>(ptr));
    if (it == allocations.begin())
      return false;
    --it;
    const char *base = static_cast<const char *>(it->first);
    const char *p = static_cast<const char *>(ptr);
    return p >= base && p + bytes <= base + it->second;
  }

  const char *name() const override { return inner->name(); }
  bool hostMemory() const override {
    return !deviceMemory && inner->hostMemory();
  }
  StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
  createCommunicators(const artifact::Artifact &artifact,
                      const std::vector<std::string> &kinds) override {
    note("createCommunicators");
    return inner->createCommunicators(artifact, kinds);
  }
  void abortCommunicators() override {
    note("abortCommunicators");
    inner->abortCommunicators();
  }
  StatusOr<void *> allocate(int64_t bytes) override {
    note("allocate");
    StatusOr<void *> ptr = inner->allocate(bytes);
    if (ptr.ok())
      allocations[*ptr] = bytes;
    return ptr;
  }
  void deallocate(void *ptr) override {
    note("deallocate");
    allocations.erase(ptr);
    inner->deallocate(ptr);
  }
  StatusOr<void *> allocateHost(int64_t bytes) override {
    note("allocateHost");
    return inner->allocateHost(bytes);
  }
  void deallocateHost(void *ptr) override {
    note("deallocateHost");
    inner->deallocateHost(ptr);
  }
  Status copyToDevice(void *dst, const void *src, int64_t bytes) override {
    note("copyToDevice");
    return inner->copyToDevice(dst, src, bytes);
  }
  Status copyToHost(void *dst, const void *src, int64_t bytes) override {
    note("copyToHost");
    return inner->copyToHost(dst, src, bytes);
  }
  Status synchronize() override {
    note("synchronize");
    return inner->synchronize();
  }
  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              float alpha, const float *a, const float *b, float beta,
              float *c) override {
    note("gemm");
    return inner->gemm(transA, transB, m, n, k, alpha, a, b, beta, c);
  }
  Status gemmHalf(FloatFormat half, bool transA, bool transB, int64_t m,
                  int64_t n, int64_t k, float alpha, const uint16_t *a,
                  const uint16_t *b, float beta, FloatOut c) override {
    note("gemmHalf");
    return inner->gemmHalf(half, transA, transB, m, n, k, alpha, a, b, beta,
                           c);
  }
  Status biasAdd(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                 int64_t cols) override {
    note("biasAdd");
    return inner->biasAdd(x, bias, y, rows, cols);
  }
  Status add(FloatIn a, FloatIn b, FloatOut c, int64_t n) override {
    note("add");
    return inner->add(a, b, c, n);
  }
  Status gelu(const float *x, float *y, int64_t n, bool tanh) override {
    note("gelu");
    return inner->gelu(x, y, n, tanh);
  }
  Status geluGrad(const float *x, const float *dy, float *dx, int64_t n,
                  bool tanh) override {
    note("geluGrad");
    return inner->geluGrad(x, dy, dx, n, tanh);
  }
  Status biasGelu(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                  int64_t cols, bool tanh) override {
    note("biasGelu");
    return inner->biasGelu(x, bias, y, rows, cols, tanh);
  }
  Status biasGeluGrad(FloatIn x, const float *bias, const float *dy,
                      float *dx, float *dbias, int64_t rows, int64_t cols,
                      bool tanh, float beta) override {
    note("biasGeluGrad");
    return inner->biasGeluGrad(x, bias, dy, dx, dbias, rows, cols, tanh, beta);
  }
  Status swiglu(FloatIn x, FloatOut y, int64_t rows, int64_t n) override {
    note("swiglu");
    return inner->swiglu(x, y, rows, n);
  }
  Status swigluGrad(FloatIn x, const float *dy, FloatOut dx, int64_t rows,
                    int64_t n) override {
    note("swigluGrad");
    return inner->swigluGrad(x, dy, dx, rows, n);
  }
  Status repeatKV(FloatIn x, FloatOut y, int64_t rows, int64_t heads,
                  int64_t groups, int64_t headDim) override {
    note("repeatKV");
    return inner->repeatKV(x, y, rows, heads, groups, headDim);
  }
  Status repeatKVGrad(FloatIn dy, FloatOut dx, int64_t rows, int64_t heads,
                      int64_t groups, int64_t headDim) override {
    note("repeatKVGrad");
    return inner->repeatKVGrad(dy, dx, rows, heads, groups, headDim);
  }
  Status qkNorm(const float *x, const float *wq, const float *wk, float *y,
                int64_t rows, int64_t heads, int64_t groups, int64_t headDim,
                float eps) override {
    note("qkNorm");
    return inner->qkNorm(x, wq, wk, y, rows, heads, groups, headDim, eps);
  }
  Status qkNormGrad(const float *x, const float *wq, const float *wk,
                    const float *dy, float *dx, float *dwq, float *dwk,
                    int64_t rows, int64_t heads, int64_t groups,
                    int64_t headDim, float eps, float beta) override {
    note("qkNormGrad");
    return inner->qkNormGrad(x, wq, wk, dy, dx, dwq, dwk, rows, heads, groups,
                             headDim, eps, beta);
  }
  Status relu(const float *x, float *y, int64_t n) override {
    note("relu");
    return inner->relu(x, y, n);
  }
  Status reluGrad(const float *x, const float *dy, float *dx,
                  int64_t n) override {
    note("reluGrad");
    return inner->reluGrad(x, dy, dx, n);
  }
  Status reduceRows(const float *x, float *y, int64_t rows, int64_t cols,
                    float alpha, float beta) override {
    note("reduceRows");
    return inner->reduceRows(x, y, rows, cols, alpha, beta);
  }
  Status crossEntropy(const float *z, const int32_t *t, float *loss,
                      int64_t rows, int64_t cols) override {
    note("crossEntropy");
    return inner->crossEntropy(z, t, loss, rows, cols);
  }
  Status crossEntropyGrad(const float *z, const int32_t *t, const float *dl,
                          float *dz, int64_t rows, int64_t cols) override {
    note("crossEntropyGrad");
    return inner->crossEntropyGrad(z, t, dl, dz, rows, cols);
  }
  Status mean(const float *x, float *y, int64_t n) override {
    note("mean");
    return inner->mean(x, y, n);
  }
  Status meanGrad(const float *dy, float *dx, int64_t n) override {
    note("meanGrad");
    return inner->meanGrad(dy, dx, n);
  }
  Status fill(float *y, float value, int64_t n) override {
    note("fill");
    return inner->fill(y, value, n);
  }
  Status scale(const float *x, float *y, float alpha, int64_t n) override {
    note("scale");
    return inner->scale(x, y, alpha, n);
  }
  Status copy(const void *x, void *y, int64_t bytes) override {
    note("copy");
    return inner->copy(x, y, bytes);
  }
  Status axpy(float alpha, const float *x, float *y, int64_t n) override {
    note("axpy");
    return inner->axpy(alpha, x, y, n);
  }
  Status cast(const void *x, FloatFormat xFormat, void *y, FloatFormat yFormat,
              int64_t n, float beta) override {
    note("cast");
    return inner->cast(x, xFormat, y, yFormat, n, beta);
  }
  Status maskColumns(const float *x, float *y, int64_t rows, int64_t cols,
                     int64_t colOffset, int64_t valid, float fill) override {
    note("maskColumns");
    return inner->maskColumns(x, y, rows, cols, colOffset, valid, fill);
  }
  Status fillHalf(FloatFormat half, uint16_t *y, float value,
                  int64_t n) override {
    note("fillHalf");
    return inner->fillHalf(half, y, value, n);
  }
  Status scaleHalf(FloatFormat half, const uint16_t *x, uint16_t *y,
                   float alpha, int64_t n) override {
    note("scaleHalf");
    return inner->scaleHalf(half, x, y, alpha, n);
  }
  Status axpyHalf(FloatFormat half, float alpha, const uint16_t *x,
                  uint16_t *y, int64_t n) override {
    note("axpyHalf");
    return inner->axpyHalf(half, alpha, x, y, n);
  }
  Status adam(float *p, const float *g, float *m, float *v, int64_t n,
              const int64_t *iteration, const AdamParams &params) override {
    note("adam");
    return inner->adam(p, g, m, v, n, iteration, params);
  }
  Status sgd(float *p, const float *g, int64_t n, float lr,
             float weightDecay) override {
    note("sgd");
    return inner->sgd(p, g, n, lr, weightDecay);
  }
  Status sgdMomentum(float *p, const float *g, float *b, int64_t n, float lr,
                     float weightDecay, float momentum) override {
    note("sgdMomentum");
    return inner->sgdMomentum(p, g, b, n, lr, weightDecay, momentum);
  }
  Status sumSquares(const void *x, FloatFormat format, int64_t n, float *y,
                    bool accumulate) override {
    note("sumSquares");
    return inner->sumSquares(x, format, n, y, accumulate);
  }
  Status clipGradNorm(const float *sumsq, float *norm, float *coeff,
                      float maxNorm, float invScale) override {
    note("clipGradNorm");
    return inner->clipGradNorm(sumsq, norm, coeff, maxNorm, invScale);
  }
  Status scaleBy(const float *x, const float *s, float *y, int64_t n) override {
    note("scaleBy");
    return inner->scaleBy(x, s, y, n);
  }
  Status layerNorm(FloatIn x, const float *gamma, const float *bias,
                   FloatOut y, int64_t rows, int64_t cols, float eps) override {
    note("layerNorm");
    return inner->layerNorm(x, gamma, bias, y, rows, cols, eps);
  }
  Status addLayerNorm(const float *a, const float *b, const float *gamma,
                      const float *bias, float *s, FloatOut y, int64_t rows,
                      int64_t cols, float eps) override {
    note("addLayerNorm");
    return inner->addLayerNorm(a, b, gamma, bias, s, y, rows, cols, eps);
  }
  Status addLayerNormGrad(const float *x, const float *gamma, const float *dy,
                          const float *dr, float *dx, float *dgamma,
                          float *dbias, int64_t rows, int64_t cols, float eps,
                          float beta) override {
    note("addLayerNormGrad");
    return inner->addLayerNormGrad(x, gamma, dy, dr, dx, dgamma, dbias, rows,
                                   cols, eps, beta);
  }
  Status rmsNorm(FloatIn x, const float *gamma, FloatOut y, int64_t rows,
                 int64_t cols, float eps) override {
    note("rmsNorm");
    return inner->rmsNorm(x, gamma, y, rows, cols, eps);
  }
  Status addRmsNorm(const float *a, const float *b, const float *gamma,
                    float *s, FloatOut y, int64_t rows, int64_t cols,
                    float eps) override {
    note("addRmsNorm");
    return inner->addRmsNorm(a, b, gamma, s, y, rows, cols, eps);
  }
  Status rmsNormGrad(FloatIn x, const float *gamma, const float *dy,
                     const float *dr, float *dx, float *dgamma, int64_t rows,
                     int64_t cols, float eps, float beta) override {
    note("rmsNormGrad");
    return inner->rmsNormGrad(x, gamma, dy, dr, dx, dgamma, rows, cols, eps,
                              beta);
  }
  Status layerNormGrad(FloatIn x, const float *gamma, const float *dy,
                       float *dx, float *dgamma, float *dbias, int64_t rows,
                       int64_t cols, float eps, float beta) override {
    note("layerNormGrad");
    return inner->layerNormGrad(x, gamma, dy, dx, dgamma, dbias, rows, cols,
                                eps, beta);
  }
  Status embedding(const int32_t *ids, FloatIn table, FloatOut y,
                   int64_t rows, int64_t localVocab, int64_t dim,
                   int64_t vocabOffset, int64_t vocabSize) override {
    note("embedding");
    return inner->embedding(ids, table, y, rows, localVocab, dim, vocabOffset,
                            vocabSize);
  }
  Status embeddingGrad(const int32_t *ids, const float *dy, float *dtable,
                       int64_t rows, int64_t localVocab, int64_t dim,
                       int64_t vocabOffset, float beta) override {
    note("embeddingGrad");
    return inner->embeddingGrad(ids, dy, dtable, rows, localVocab, dim,
                                vocabOffset, beta);
  }
  Status addPositionEmbedding(FloatIn x, FloatIn pos, FloatOut y,
                              int64_t seq, int64_t batch,
                              int64_t dim) override {
    note("addPositionEmbedding");
    return inner->addPositionEmbedding(x, pos, y, seq, batch, dim);
  }
  Status positionEmbeddingGrad(const float *dy, float *dpos, int64_t seq,
                               int64_t batch, int64_t dim, int64_t posRows,
                               float beta) override {
    note("positionEmbeddingGrad");
    return inner->positionEmbeddingGrad(dy, dpos, seq, batch, dim, posRows,
                                        beta);
  }
  Status attention(const float *qkv, float *out, int64_t seq, int64_t batch,
                   int64_t heads, int64_t headDim, bool causal) override {
    note("attention");
    return inner->attention(qkv, out, seq, batch, heads, headDim, causal);
  }
  Status attentionGrad(const float *qkv, const float *dout, float *dqkv,
                       int64_t seq, int64_t batch, int64_t heads,
                       int64_t headDim, bool causal) override {
    note("attentionGrad");
    return inner->attentionGrad(qkv, dout, dqkv, seq, batch, heads, headDim,
                                causal);
  }
  Status logitsMax(FloatIn z, float *m, int64_t rows,
                   int64_t cols) override {
    note("logitsMax");
    return inner->logitsMax(z, m, rows, cols);
  }
  Status crossEntropyStats(FloatIn z, const int32_t *t, const float *m,
                           float *se, float *pl, int64_t rows, int64_t cols,
                           int64_t vocabOffset, int64_t numClasses,
                           int64_t ignoreIndex) override {
    note("crossEntropyStats");
    return inner->crossEntropyStats(z, t, m, se, pl, rows, cols, vocabOffset,
                                    numClasses, ignoreIndex);
  }
  Status logitsStats(FloatIn z, const int32_t *t, float *m, float *se,
                     float *pl, int64_t rows, int64_t cols,
                     int64_t ignoreIndex) override {
    note("logitsStats");
    return inner->logitsStats(z, t, m, se, pl, rows, cols, ignoreIndex);
  }
  Status crossEntropyFromStats(const float *se, const float *pl, const float *m,
                               const int32_t *t, float *loss, int64_t rows,
                               int64_t ignoreIndex) override {
    note("crossEntropyFromStats");
    return inner->crossEntropyFromStats(se, pl, m, t, loss, rows, ignoreIndex);
  }
  Status crossEntropyStatsGrad(FloatIn z, const int32_t *t, const float *m,
                               const float *se, const float *dl, FloatOut dz,
                               int64_t rows, int64_t cols, int64_t vocabOffset,
                               int64_t numClasses,
                               int64_t ignoreIndex) override {
    note("crossEntropyStatsGrad");
    return inner->crossEntropyStatsGrad(z, t, m, se, dl, dz, rows, cols,
                                        vocabOffset, numClasses, ignoreIndex);
  }
  Status tokenMean(const float *loss, const int32_t *t, float *y, int64_t rows,
                   int64_t ignoreIndex, const float *count) override {
    note("tokenMean");
    return inner->tokenMean(loss, t, y, rows, ignoreIndex, count);
  }
  Status supports(std::string_view opcode) const override {
    if (opcode == unsupported)
      return unimplemented("the recording backend does not implement ",
                           unsupported);
    return inner->supports(opcode);
  }
  /// An opcode to report unsupported (tests of the executor's check).
  std::string unsupported;
  Status tokenCount(const int32_t *t, float *n, int64_t rows,
                    int64_t ignoreIndex) override {
    note("tokenCount");
    return inner->tokenCount(t, n, rows, ignoreIndex);
  }
  Status ringPackKeysValues(const float *qkv, float *kv,
                            const RingAttentionDims &d) override {
    note("ringPackKeysValues");
    return inner->ringPackKeysValues(qkv, kv, d);
  }
  Status ringAttentionStep(const float *qkv, const float *kv, float *o,
                           float *stats, float *lse, const RingAttentionDims &d,
                           int64_t source, bool first) override {
    note("ringAttentionStep");
    return inner->ringAttentionStep(qkv, kv, o, stats, lse, d, source, first);
  }
  Status ringAttentionGradStep(const float *qkv, const float *o,
                               const float *lse, const float *dout,
                               const float *kv, float *dkv, float *delta,
                               float *dqkv, const RingAttentionDims &d,
                               int64_t source, bool first) override {
    note("ringAttentionGradStep");
    return inner->ringAttentionGradStep(qkv, o, lse, dout, kv, dkv, delta,
                                        dqkv, d, source, first);
  }
  Status ringUnpackKeyValueGrads(const float *dkv, float *dqkv,
                                 const RingAttentionDims &d) override {
    note("ringUnpackKeyValueGrads");
    return inner->ringUnpackKeyValueGrads(dkv, dqkv, d);
  }
  Status moeRouter(const float *logits, float *probs, int32_t *indices,
                   int64_t tokens, int64_t experts, int64_t k) override {
    note("moeRouter");
    return inner->moeRouter(logits, probs, indices, tokens, experts, k);
  }
  Status moeRouterGrad(const float *probs, const int32_t *indices,
                       const float *dprobs, float *dlogits, int64_t tokens,
                       int64_t experts, int64_t k) override {
    note("moeRouterGrad");
    return inner->moeRouterGrad(probs, indices, dprobs, dlogits, tokens,
                                experts, k);
  }
  Status moeAuxLoss(const float *logits, const int32_t *indices,
                    const float *allCounts, float *y, int64_t tokens,
                    int64_t experts, int64_t k, float coeff) override {
    note("moeAuxLoss");
    return inner->moeAuxLoss(logits, indices, allCounts, y, tokens, experts, k,
                             coeff);
  }
  Status moeAuxLossGrad(const float *logits, const int32_t *indices,
                        const float *allCounts, const float *dy,
                        float *dlogits, int64_t tokens, int64_t experts,
                        int64_t k, float coeff) override {
    note("moeAuxLossGrad");
    return inner->moeAuxLossGrad(logits, indices, allCounts, dy, dlogits,
                                 tokens, experts, k, coeff);
  }
  Status moeTokenCounts(const int32_t *indices, float *counts, int64_t choices,
                        int64_t experts) override {
    note("moeTokenCounts");
    return inner->moeTokenCounts(indices, counts, choices, experts);
  }
  Status moeDispatch(const float *x, const int32_t *indices, float *rows,
                     int32_t *counts, int64_t tokens, int64_t k,
                     int64_t experts, int64_t features) override {
    note("moeDispatch");
    return inner->moeDispatch(x, indices, rows, counts, tokens, k, experts,
                              features);
  }
  Status moeDispatchGrad(const float *drows, const int32_t *indices, float *dx,
                         int64_t tokens, int64_t k, int64_t experts,
                         int64_t features) override {
    note("moeDispatchGrad");
    return inner->moeDispatchGrad(drows, indices, dx, tokens, k, experts,
                                  features);
  }
  Status groupedLinear(FloatFormat inputs, const void *x,
                       const int32_t *counts, const void *w, float *y,
                       int64_t rows, int64_t in, int64_t out,
                       int64_t experts) override {
    note("groupedLinear");
    return inner->groupedLinear(inputs, x, counts, w, y, rows, in, out,
                                experts);
  }
  Status groupedLinearGrad(FloatFormat inputs, const void *x,
                           const int32_t *counts, const void *w,
                           const void *dy, float *dx, float *dw, int64_t rows,
                           int64_t in, int64_t out, int64_t experts,
                           float beta) override {
    note("groupedLinearGrad");
    return inner->groupedLinearGrad(inputs, x, counts, w, dy, dx, dw, rows, in,
                                    out, experts, beta);
  }
  Status moeCapacityDrop(const float *probs, const int32_t *indices,
                         float *keptProbs, int32_t *keptIndices, int64_t tokens,
                         int64_t k, int64_t experts, int64_t capacity,
                         bool byPosition) override {
    note("moeCapacityDrop");
    return inner->moeCapacityDrop(probs, indices, keptProbs, keptIndices,
                                  tokens, k, experts, capacity, byPosition);
  }
  Status moeCapacityDropGrad(const float *dkept, const int32_t *keptIndices,
                             float *dprobs, int64_t n) override {
    note("moeCapacityDropGrad");
    return inner->moeCapacityDropGrad(dkept, keptIndices, dprobs, n);
  }
  Status moeCombine(const float *rows, const float *probs,
                    const int32_t *indices, float *y, int64_t tokens, int64_t k,
                    int64_t experts, int64_t features) override {
    note("moeCombine");
    return inner->moeCombine(rows, probs, indices, y, tokens, k, experts,
                             features);
  }
  Status moeCombineGrad(const float *rows, const float *probs,
                        const int32_t *indices, const float *dy, float *drows,
                        float *dprobs, int64_t tokens, int64_t k,
                        int64_t experts, int64_t features) override {
    note("moeCombineGrad");
    return inner->moeCombineGrad(rows, probs, indices, dy, drows, dprobs,
                                 tokens, k, experts, features);
  }
  Status rotaryEmbedding(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                         int64_t features, int64_t heads, int64_t rotDim,
                         float base, float scalingFactor, int64_t posBegin,
                         bool inverse) override {
    note("rotaryEmbedding");
    return inner->rotaryEmbedding(x, y, seq, batch, features, heads, rotDim,
                                  base, scalingFactor, posBegin, inverse);
  }
  Status dropout(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                 int64_t hidden, int64_t seqOffset, int64_t seqTotal,
                 int64_t firstSample, uint64_t seed, int64_t stream,
                 float rate) override {
    note("dropout");
    return inner->dropout(x, y, seq, batch, hidden, seqOffset, seqTotal,
                          firstSample, seed, stream, rate);
  }
  Status tokenMeanGrad(const float *dy, const int32_t *t, float *dl,
                       int64_t rows, int64_t ignoreIndex,
                       const float *count) override {
    note("tokenMeanGrad");
    return inner->tokenMeanGrad(dy, t, dl, rows, ignoreIndex, count);
  }

private:
  void note(const char *call) { observer(call); }

  std::unique_ptr<Backend> inner;
  Observer observer;
  bool deviceMemory;
  /// allocate()'s blocks and their sizes.
  std::map<void *, int64_t> allocations;
};

} // namespace tessera::rt::test

#endif // TESSERA_RT_UNITTESTS_RECORDINGBACKEND_H
