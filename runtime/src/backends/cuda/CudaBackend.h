//===- CudaBackend.h - The "cuda" compute backend ---------------*- C++ -*-===//
//
// The Backend of one GPU: every kernel is enqueued on one compute stream and
// nothing waits for the device except copyToHost and synchronize() (the
// executor calls the latter once per iteration). GEMMs go through cuBLASLt
// (GemmPlan.h, CublasLtGemm.h): fp32 operands and accumulation, no TF32
// unless BackendOptions::allowTf32; attention is strided-batched GEMMs
// around row-softmax kernels. The other opcodes are the kernels of
// Kernels.cu, whose per-element math is the CPU backend's
// (tessera/rt/math/). Data errors recorded by kernels (DeviceError.h)
// surface at the next synchronize().
//
// Memory: the executor's one arena per program is one cudaMalloc; scratch
// (attention probabilities, layer-norm row statistics) grows with the
// stream-ordered allocator (cudaMallocAsync), so growing it does not make
// the host wait either.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_CUDABACKEND_H
#define TESSERA_RT_BACKENDS_CUDA_CUDABACKEND_H

#include "CublasLtGemm.h"
#include "DeviceError.h"
#include "GemmPlan.h"

#include "tessera/rt/Backend.h"
#include "tessera/rt/NcclCommunicator.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace tessera::rt::cuda {

/// "<what>: <cudaErrorName> (<description>)" for a failed call, OK
/// otherwise.
Status cudaStatus(cudaError_t error, const char *what);

/// The GPU this process uses: `localRank` (or, when it is -1, the local
/// rank the MPI launcher exports: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID
/// or SLURM_LOCALID) modulo the devices visible; an Unavailable error naming
/// the CUDA error when there is no driver or no device.
StatusOr<int> selectDevice(int localRank);

/// Creates the backend on the device selectDevice picks.
StatusOr<std::unique_ptr<Backend>> createCudaBackend(const BackendOptions &);

class CudaBackend final : public Backend {
public:
  ~CudaBackend() override;
  static StatusOr<std::unique_ptr<CudaBackend>>
  create(int device, const BackendOptions &options);

  const char *name() const override { return "cuda"; }
  /// The GPU, the driver and the CUDA runtime, cuBLASLt and NCCL this
  /// process runs, each with its version and the file it was loaded from
  /// (a mismatched library on LD_LIBRARY_PATH shows in the banner).
  std::string kernelLibraries() const override;
  bool hostMemory() const override { return false; }
  int device() const { return deviceIndex; }
  /// The compute stream (collectives are ordered against it).
  cudaStream_t stream() const { return computeStream; }

  StatusOr<void *> allocate(int64_t bytes) override;
  void deallocate(void *ptr) override;
  /// Pinned (page-locked) memory: copies from it are truly asynchronous.
  StatusOr<void *> allocateHost(int64_t bytes) override;
  void deallocateHost(void *ptr) override;
  Status copyToDevice(void *dst, const void *src, int64_t bytes) override;
  Status copyToHost(void *dst, const void *src, int64_t bytes) override;
  Status synchronize() override;
  /// NCCL communicators over the artifact's groups (createNcclCommunicators
  /// with the real NCCL and CUDA runtime, NcclApiCuda.h), ordered on the
  /// compute stream.
  StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
  createCommunicators(const artifact::Artifact &artifact,
                      const std::vector<std::string> &kinds) override;
  void abortCommunicators() override;

  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              float alpha, const float *a, const float *b, float beta,
              float *c) override;
  Status gemmHalf(FloatFormat half, bool transA, bool transB, int64_t m,
                  int64_t n, int64_t k, float alpha, const uint16_t *a,
                  const uint16_t *b, float beta, FloatOut c) override;
  Status biasAdd(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                 int64_t cols) override;
  Status add(FloatIn a, FloatIn b, FloatOut c, int64_t n) override;
  Status gelu(const float *x, float *y, int64_t n, bool tanh) override;
  Status geluGrad(const float *x, const float *dy, float *dx, int64_t n,
                  bool tanh) override;
  Status biasGelu(FloatIn x, const float *bias, FloatOut y, int64_t rows,
                  int64_t cols, bool tanh) override;
  Status biasGeluGrad(FloatIn x, const float *bias, const float *dy,
                      float *dx, float *dbias, int64_t rows, int64_t cols,
                      bool tanh, float beta) override;
  Status swiglu(FloatIn x, FloatOut y, int64_t rows, int64_t n) override;
  Status swigluGrad(FloatIn x, const float *dy, FloatOut dx, int64_t rows,
                    int64_t n) override;
  Status repeatKV(FloatIn x, FloatOut y, int64_t rows, int64_t heads,
                  int64_t groups, int64_t headDim) override;
  Status repeatKVGrad(FloatIn dy, FloatOut dx, int64_t rows, int64_t heads,
                      int64_t groups, int64_t headDim) override;
  Status qkNorm(const float *x, const float *wq, const float *wk, float *y,
                int64_t rows, int64_t heads, int64_t groups, int64_t headDim,
                float eps) override;
  Status qkNormGrad(const float *x, const float *wq, const float *wk,
                    const float *dy, float *dx, float *dwq, float *dwk,
                    int64_t rows, int64_t heads, int64_t groups,
                    int64_t headDim, float eps, float beta) override;
  Status relu(const float *x, float *y, int64_t n) override;
  Status reluGrad(const float *x, const float *dy, float *dx,
                  int64_t n) override;
  Status reduceRows(const float *x, float *y, int64_t rows, int64_t cols,
                    float alpha, float beta) override;
  Status crossEntropy(const float *z, const int32_t *t, float *loss,
                      int64_t rows, int64_t cols) override;
  Status crossEntropyGrad(const float *z, const int32_t *t, const float *dl,
                          float *dz, int64_t rows, int64_t cols) override;
  Status mean(const float *x, float *y, int64_t n) override;
  Status meanGrad(const float *dy, float *dx, int64_t n) override;
  Status fill(float *y, float value, int64_t n) override;
  Status scale(const float *x, float *y, float alpha, int64_t n) override;
  Status copy(const void *x, void *y, int64_t bytes) override;
  Status axpy(float alpha, const float *x, float *y, int64_t n) override;
  Status cast(const void *x, FloatFormat xFormat, void *y, FloatFormat yFormat,
              int64_t n, float beta) override;
  Status maskColumns(const float *x, float *y, int64_t rows, int64_t cols,
                     int64_t colOffset, int64_t valid, float fill) override;
  Status fillHalf(FloatFormat half, uint16_t *y, float value,
                  int64_t n) override;
  Status scaleHalf(FloatFormat half, const uint16_t *x, uint16_t *y,
                   float alpha, int64_t n) override;
  Status axpyHalf(FloatFormat half, float alpha, const uint16_t *x,
                  uint16_t *y, int64_t n) override;
  Status adam(float *p, const float *g, float *m, float *v, int64_t n,
              const int64_t *iteration, const AdamParams &params) override;
  Status sgd(float *p, const float *g, int64_t n, float lr,
             float weightDecay) override;
  Status sgdMomentum(float *p, const float *g, float *b, int64_t n, float lr,
                     float weightDecay, float momentum) override;
  Status sumSquares(const void *x, FloatFormat format, int64_t n, float *y,
                    bool accumulate) override;
  Status clipGradNorm(const float *sumsq, float *norm, float *coeff,
                      float maxNorm, float invScale) override;
  Status scaleBy(const float *x, const float *s, float *y, int64_t n) override;
  Status layerNorm(FloatIn x, const float *gamma, const float *bias,
                   FloatOut y, int64_t rows, int64_t cols, float eps) override;
  Status addLayerNorm(const float *a, const float *b, const float *gamma,
                      const float *bias, float *s, FloatOut y, int64_t rows,
                      int64_t cols, float eps) override;
  Status addLayerNormGrad(const float *x, const float *gamma, const float *dy,
                          const float *dr, float *dx, float *dgamma,
                          float *dbias, int64_t rows, int64_t cols, float eps,
                          float beta) override;
  Status rmsNorm(FloatIn x, const float *gamma, FloatOut y, int64_t rows,
                 int64_t cols, float eps) override;
  Status addRmsNorm(const float *a, const float *b, const float *gamma,
                    float *s, FloatOut y, int64_t rows, int64_t cols,
                    float eps) override;
  Status rmsNormGrad(FloatIn x, const float *gamma, const float *dy,
                     const float *dr, float *dx, float *dgamma, int64_t rows,
                     int64_t cols, float eps, float beta) override;

private:
  /// The layer-norm (and, with dbias null, RMS-norm) backward, plus dR (when given) in dX; `opcode` names
  /// the instruction in errors.
  Status normGrad(FloatIn x, const float *gamma, const float *dy,
                  const float *dr, float *dx, float *dgamma, float *dbias,
                  int64_t rows, int64_t cols, float eps, float beta,
                  const char *opcode);

public:
  Status layerNormGrad(FloatIn x, const float *gamma, const float *dy,
                       float *dx, float *dgamma, float *dbias, int64_t rows,
                       int64_t cols, float eps, float beta) override;
  Status embedding(const int32_t *ids, FloatIn table, FloatOut y,
                   int64_t rows, int64_t localVocab, int64_t dim,
                   int64_t vocabOffset, int64_t vocabSize) override;
  Status embeddingGrad(const int32_t *ids, const float *dy, float *dtable,
                       int64_t rows, int64_t localVocab, int64_t dim,
                       int64_t vocabOffset, float beta) override;
  Status addPositionEmbedding(FloatIn x, FloatIn pos, FloatOut y,
                              int64_t seq, int64_t batch,
                              int64_t dim) override;
  Status positionEmbeddingGrad(const float *dy, float *dpos, int64_t seq,
                               int64_t batch, int64_t dim, int64_t posRows,
                               float beta) override;
  Status attention(const float *qkv, float *out, int64_t seq, int64_t batch,
                   int64_t heads, int64_t headDim, bool causal) override;
  Status attentionGrad(const float *qkv, const float *dout, float *dqkv,
                       int64_t seq, int64_t batch, int64_t heads,
                       int64_t headDim, bool causal) override;
  Status logitsMax(FloatIn z, float *m, int64_t rows,
                   int64_t cols) override;
  Status crossEntropyStats(FloatIn z, const int32_t *t, const float *m,
                           float *se, float *pl, int64_t rows, int64_t cols,
                           int64_t vocabOffset, int64_t numClasses,
                           int64_t ignoreIndex) override;
  Status logitsStats(FloatIn z, const int32_t *t, float *m, float *se,
                     float *pl, int64_t rows, int64_t cols,
                     int64_t ignoreIndex) override;
  Status crossEntropyFromStats(const float *se, const float *pl, const float *m,
                               const int32_t *t, float *loss, int64_t rows,
                               int64_t ignoreIndex) override;
  Status crossEntropyStatsGrad(FloatIn z, const int32_t *t, const float *m,
                               const float *se, const float *dl, FloatOut dz,
                               int64_t rows, int64_t cols, int64_t vocabOffset,
                               int64_t numClasses,
                               int64_t ignoreIndex) override;
  Status tokenMean(const float *loss, const int32_t *t, float *y, int64_t rows,
                   int64_t ignoreIndex, const float *count) override;
  Status tokenCount(const int32_t *t, float *n, int64_t rows,
                    int64_t ignoreIndex) override;
  Status rotaryEmbedding(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                         int64_t features, int64_t heads, int64_t rotDim,
                         float base, float scalingFactor, int64_t posBegin,
                         bool inverse) override;
  Status dropout(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                 int64_t hidden, int64_t seqOffset, int64_t seqTotal,
                 int64_t firstSample, uint64_t seed, int64_t stream,
                 float rate) override;
  Status tokenMeanGrad(const float *dy, const int32_t *t, float *dl,
                       int64_t rows, int64_t ignoreIndex,
                       const float *count) override;
  Status ringPackKeysValues(const float *qkv, float *kv,
                            const RingAttentionDims &d) override;
  Status ringAttentionStep(const float *qkv, const float *kv, float *o,
                           float *stats, float *lse, const RingAttentionDims &d,
                           int64_t source, bool first) override;
  Status ringAttentionGradStep(const float *qkv, const float *o,
                               const float *lse, const float *dout,
                               const float *kv, float *dkv, float *delta,
                               float *dqkv, const RingAttentionDims &d,
                               int64_t source, bool first) override;
  Status ringUnpackKeyValueGrads(const float *dkv, float *dqkv,
                                 const RingAttentionDims &d) override;
  Status moeRouter(const float *logits, float *probs, int32_t *indices,
                   int64_t tokens, int64_t experts, int64_t k) override;
  Status moeRouterGrad(const float *probs, const int32_t *indices,
                       const float *dprobs, float *dlogits, int64_t tokens,
                       int64_t experts, int64_t k) override;
  Status moeAuxLoss(const float *logits, const int32_t *indices,
                    const float *allCounts, float *y, int64_t tokens,
                    int64_t experts, int64_t k, float coeff) override;
  Status moeAuxLossGrad(const float *logits, const int32_t *indices,
                        const float *allCounts, const float *dy,
                        float *dlogits, int64_t tokens, int64_t experts,
                        int64_t k, float coeff) override;
  Status moeTokenCounts(const int32_t *indices, float *counts,
                        int64_t choices, int64_t experts) override;
  Status moeDispatch(const float *x, const int32_t *indices, float *rows,
                     int32_t *counts, int64_t tokens, int64_t k,
                     int64_t experts, int64_t features) override;
  Status moeDispatchGrad(const float *drows, const int32_t *indices, float *dx,
                         int64_t tokens, int64_t k, int64_t experts,
                         int64_t features) override;
  Status groupedLinear(FloatFormat inputs, const void *x,
                       const int32_t *counts, const void *w, float *y,
                       int64_t rows, int64_t in, int64_t out,
                       int64_t experts) override;
  Status groupedLinearGrad(FloatFormat inputs, const void *x,
                           const int32_t *counts, const void *w,
                           const void *dy, float *dx, float *dw, int64_t rows,
                           int64_t in, int64_t out, int64_t experts,
                           float beta) override;
  Status moeCapacityDrop(const float *probs, const int32_t *indices,
                         float *keptProbs, int32_t *keptIndices, int64_t tokens,
                         int64_t k, int64_t experts, int64_t capacity,
                         bool byPosition) override;
  Status moeCapacityDropGrad(const float *dkept, const int32_t *keptIndices,
                             float *dprobs, int64_t n) override;
  Status moeCombine(const float *rows, const float *probs,
                    const int32_t *indices, float *y, int64_t tokens, int64_t k,
                    int64_t experts, int64_t features) override;
  Status moeCombineGrad(const float *rows, const float *probs,
                        const int32_t *indices, const float *dy, float *drows,
                        float *dprobs, int64_t tokens, int64_t k,
                        int64_t experts, int64_t features) override;

private:
  CudaBackend() = default;

  /// A cached GEMM: its descriptors and the algorithm cuBLASLt's heuristic
  /// picked for them (once per shape).
  struct CachedGemm {
    LtGemmDescriptors descriptors;
    cublasLtMatmulAlgo_t algo;
  };
  /// The plan and the alignments of its A, B and C (operandAlignment).
  using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, uint32_t, uint32_t, uint32_t, FloatFormat,
                             FloatFormat>;

  /// gemm and gemmHalf: one dense product, A and B f32, bf16 or f16, C f32
  /// or (beta 0) in A and B's 16-bit format.
  Status denseGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, const void *b, float beta,
                   FloatOut c, FloatFormat inputs);
  /// Runs row-major product `g` on A, B, C (swapped into the column-major
  /// plan's operand order); A and B in `inputs`, C f32 or in `inputs`.
  Status runRowMajor(const RowMajorGemm &g, const void *a, const void *b,
                     FloatOut c, float alpha, float beta,
                     FloatFormat inputs = FloatFormat::F32);
  /// The descriptors and algorithm of `plan` for operands of alignments
  /// `align` (bytes: A, B, C), found once per plan and alignments.
  StatusOr<CachedGemm *> cachedGemm(const GemmPlan &plan,
                                    const uint32_t align[3]);
  /// The softmax(scale * Q K^T) probabilities of `heads` heads whose QKV
  /// starts at `qkv`, into `probs` ([heads, seq, seq]).
  Status attentionProbs(const AttentionPlans &p, const float *qkv,
                        float *probs, int64_t heads, int64_t seq, float scale,
                        bool causal);
  /// At least `bytes` of scratch in `slot` (0: attention probabilities, 1:
  /// their gradient, 2: layer-norm statistics, kMoeCountsScratch and
  /// kMoeRowsScratch: the MoE row map, kMoeSortScratch: the sort of the
  /// routing choices), grown in stream order.
  StatusOr<float *> scratch(int slot, int64_t bytes);
  static constexpr int kMoeCountsScratch = 3, kMoeRowsScratch = 4,
                       kMoeSortScratch = 5, kSumSquaresScratch = 6,
                       kScratchSlots = 7;
  /// The scratch of the routing choices' sort (moeChoiceSortBytes) for
  /// `n` choices over `experts`.
  StatusOr<void *> moeSortScratch(int64_t n, int64_t experts,
                                  const char *opcode);
  /// The row of each routing choice (-1 for none) and the rows per expert.
  struct MoeRowMap {
    const int32_t *rowOf;
    const int32_t *counts;
  };
  /// The row map of `n` routing choices (launchMoeRows), rows in scratch,
  /// counts in `counts` (scratch when null); `opcode` names errors.
  StatusOr<MoeRowMap> moeRowMap(const int32_t *indices, int64_t n,
                                int64_t experts, int32_t *counts,
                                const char *opcode);
  /// The load-balancing loss's counts (checked) in scratch.
  Status moeAuxCounts(const int32_t *indices, int64_t tokens, int64_t experts,
                      int64_t k, const int32_t **counts, const char *opcode);
  StatusOr<std::vector<int64_t>> groupOffsets(const int32_t *counts,
                                              int64_t experts, int64_t rows);
  /// The launch error of the last kernel, named after `what`.
  Status launched(cudaError_t error, const char *what);

  int deviceIndex = 0;
  bool allowTf32 = false;
  cudaStream_t computeStream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *workspace = nullptr;
  int64_t workspaceBytes = 0;
  DeviceError *deviceError = nullptr;
  std::map<PlanKey, std::unique_ptr<CachedGemm>> gemms;
  void *scratchPtr[kScratchSlots] = {};
  /// The world NCCL communicator (the groups' parent) and the groups handed
  /// to the executor, for abortCommunicators (which the watchdog calls
  /// while the executor, and so the groups, are alive).
  std::unique_ptr<NcclCommunicator> ncclWorld;
  std::vector<NcclCommunicator *> ncclGroups;
  int64_t scratchBytes[kScratchSlots] = {};
};

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_CUDABACKEND_H
