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

#include "tessera/rt/BF16.h"
#include "tessera/rt/Communicator.h"
#include "tessera/rt/Status.h"
#include "tessera/rt/math/SequenceLayout.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::artifact {
struct Artifact;
} // namespace tessera::artifact

namespace tessera::rt {

/// Hyper-parameters of one Adam/AdamW update.
struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.0f;
};

// FloatFormat (f32, bf16 or f16), the storage format of a floating-point
// operand of the mixed-precision kernels, is BF16.h's.

/// A float input of a kernel that loads any FloatFormat (the activation
/// kernels under bf16 activations: they read the stored 16-bit value and
/// compute in f32, so no cast kernel widens it first). An f32 pointer
/// converts to one implicitly.
struct FloatIn {
  const void *data = nullptr;
  FloatFormat format = FloatFormat::F32;
  FloatIn(const float *p) : data(p) {}
  FloatIn(const void *p, FloatFormat f) : data(p), format(f) {}
  bool isF32() const { return format == FloatFormat::F32; }
  const float *f32() const { return static_cast<const float *>(data); }
  /// The operand from element `i` on.
  FloatIn at(int64_t i) const {
    return {static_cast<const char *>(data) + i * formatBytes(format), format};
  }
};
/// A float output of a kernel that stores any FloatFormat (each f32 result
/// rounded once, to nearest even, as a Cast would).
struct FloatOut {
  void *data = nullptr;
  FloatFormat format = FloatFormat::F32;
  FloatOut(float *p) : data(p) {}
  FloatOut(void *p, FloatFormat f) : data(p), format(f) {}
  bool isF32() const { return format == FloatFormat::F32; }
  float *f32() const { return static_cast<float *>(data); }
  /// The operand from element `i` on.
  FloatOut at(int64_t i) const {
    return {static_cast<char *>(data) + i * formatBytes(format), format};
  }
};

/// Options passed to a backend factory.
struct BackendOptions {
  /// Threads for BLAS-like libraries; 0 leaves the library default.
  int numThreads = 0;
  /// This process's rank among the ranks of its node (-1: unknown). A GPU
  /// backend runs on device localRank modulo the node's device count.
  int localRank = -1;
  /// GPU GEMMs on fp32 operands may use TF32 tensor cores (inputs rounded
  /// to a 10-bit mantissa, fp32 accumulation). Off by default, as in
  /// PyTorch (torch.backends.cuda.matmul.allow_tf32): an fp32 run must equal
  /// the CPU's within 1e-5, which TF32 does not.
  bool allowTf32 = false;
};

/// Compute backend. All tensors are dense row-major f32 unless noted; `n` is
/// an element count; matrices are [rows, cols]. bf16 tensors are arrays of
/// uint16_t bit patterns, as are f16 ones, converted as in BF16.h (widening
/// exact, narrowing to nearest even).
///
/// Pointers are device pointers (host memory on the cpu). A backend may run
/// its kernels asynchronously, in call order on one stream: a kernel error
/// that depends on data (a token id out of range) may then be reported by
/// the next synchronize() rather than by the call, which keeps the host from
/// waiting on the device per kernel. copyToHost waits for the kernels
/// before it.
class Backend {
public:
  virtual ~Backend();
  virtual const char *name() const = 0;
  /// Whether its memory is host memory, which the MPI communicators can
  /// read and write directly (false for a GPU backend).
  virtual bool hostMemory() const { return true; }
  /// OK when the backend implements the instruction named `opcode` (the
  /// schema's name); otherwise an error saying so, which the executor
  /// reports when it loads a program, before anything runs.
  virtual Status supports(std::string_view opcode) const { return Status(); }
  /// The libraries its kernels run on, for tessera-run's banner ("OpenBLAS
  /// 0.3.21 (SkylakeX kernels)"); empty when there is nothing to say.
  virtual std::string kernelLibraries() const { return std::string(); }

  /// Communicators that operate on this backend's memory, ordered on its
  /// stream, for the rank-group kinds `kinds` of `artifact`: one per kind
  /// whose instance holds this rank, members checked against the artifact's
  /// group table like the MPI ones. Collective over MPI_COMM_WORLD (every
  /// rank calls it with the same kinds). A host-memory backend returns an
  /// empty map: the MPI communicators serve it.
  virtual StatusOr<std::map<std::string, std::unique_ptr<Communicator>>>
  createCommunicators(const artifact::Artifact &artifact,
                      const std::vector<std::string> &kinds) {
    return std::map<std::string, std::unique_ptr<Communicator>>();
  }
  /// Aborts the communicators createCommunicators made (the watchdog calls
  /// it from its thread before ending a rank whose collective hangs).
  virtual void abortCommunicators() {}

  /// Allocates `bytes` of zeroed device memory aligned to at least 64 bytes.
  virtual StatusOr<void *> allocate(int64_t bytes) = 0;
  virtual void deallocate(void *ptr) = 0;
  /// Host staging memory the backend copies from without waiting (pinned
  /// memory on a GPU): a copyToDevice from it may still be reading it after
  /// the call returns, until the next synchronize(). Default: ordinary
  /// 64-byte aligned memory.
  virtual StatusOr<void *> allocateHost(int64_t bytes);
  virtual void deallocateHost(void *ptr);
  /// Host <-> device copies (identity memcpy on the cpu). From ordinary
  /// (pageable) memory, copyToDevice has read `src` when it returns.
  virtual Status copyToDevice(void *dst, const void *src, int64_t bytes) = 0;
  virtual Status copyToHost(void *dst, const void *src, int64_t bytes) = 0;
  /// Blocks until all queued work is done, and returns the first error a
  /// kernel recorded since the last call (then clears it).
  virtual Status synchronize() { return Status(); }

  /// C[m, n] = alpha * op(A) @ op(B) + beta * C with op(A) [m, k],
  /// op(B) [k, n]; A is stored [m, k] (or [k, m] if transA), B [k, n] (or
  /// [n, k] if transB).
  virtual Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, const float *b, float beta,
                      float *c) = 0;
  /// The same product with A and B in the 16-bit `half` format (BF16 or
  /// F16: mixed precision's GEMMs): the products of the 16-bit values are
  /// exact in f32 and accumulate in f32, into the f32 C; or into a C in
  /// `half` itself (a GEMM writing its activation in the activations'
  /// format), the f32 result rounded once to nearest even as a Cast would,
  /// with beta 0 (an error otherwise: nothing to accumulate into).
  virtual Status gemmHalf(FloatFormat half, bool transA, bool transB,
                          int64_t m, int64_t n, int64_t k, float alpha,
                          const uint16_t *a, const uint16_t *b, float beta,
                          FloatOut c) = 0;
  /// Y[i, j] = X[i, j] + bias[j]; Y may alias X (same format). X and Y in
  /// any FloatFormat (FloatIn/FloatOut), as A, B and C of add.
  virtual Status biasAdd(FloatIn x, const float *bias, FloatOut y,
                         int64_t rows, int64_t cols) = 0;
  virtual Status add(FloatIn a, FloatIn b, FloatOut c, int64_t n) = 0;
  /// Y = 0.5 x (1 + erf(x / sqrt 2)), or with `tanh` the tanh
  /// approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
  virtual Status gelu(const float *x, float *y, int64_t n, bool tanh) = 0;
  /// dX = dY * gelu'(x) of the same form.
  virtual Status geluGrad(const float *x, const float *dy, float *dx,
                          int64_t n, bool tanh) = 0;
  /// Y[i, j] = gelu(X[i, j] + bias[j]) of the form `tanh` selects (as
  /// gelu), for X, Y [rows, cols] (any FloatFormat).
  virtual Status biasGelu(FloatIn x, const float *bias, FloatOut y,
                          int64_t rows, int64_t cols, bool tanh) = 0;
  /// dX[i, j] = dY[i, j] * gelu'(X[i, j] + bias[j]) and dbias[j] =
  /// beta * dbias[j] + sum_i dX[i, j] (beta == 0 overwrites), summed row by
  /// row as reduceRows does. X in any FloatFormat.
  virtual Status biasGeluGrad(FloatIn x, const float *bias,
                              const float *dy, float *dx, float *dbias,
                              int64_t rows, int64_t cols, bool tanh,
                              float beta) = 0;
  /// SwiGLU: X is [rows, 2n], each row the gate then the up projection;
  /// Y[i, j] = silu(X[i, j]) * X[i, n + j] (math::swiglu); X and Y in any
  /// FloatFormat.
  virtual Status swiglu(FloatIn x, FloatOut y, int64_t rows, int64_t n) = 0;
  /// Its backward (math::swigluGrad): dX[i, j] the gate's gradient,
  /// dX[i, n + j] the up projection's, from X (any FloatFormat) and dY
  /// [rows, n]; dX in any FloatFormat.
  virtual Status swigluGrad(FloatIn x, const float *dy, FloatOut dx,
                            int64_t rows, int64_t n) = 0;
  /// Grouped-query attention (the RepeatKV opcode): X [rows, groups *
  /// (heads/groups + 2) * headDim], each group [q of its heads | k | v], to
  /// the head-major Y [rows, heads * 3 * headDim] with each group's k and v
  /// repeated for its heads.
  /// X and Y in any FloatFormat (a copy: exact between equal formats).
  virtual Status repeatKV(FloatIn x, FloatOut y, int64_t rows,
                          int64_t heads, int64_t groups, int64_t headDim) = 0;
  /// Its backward: dX from the head-major dY, each group's dk and dv the
  /// sum of its heads' in head order (in f32, rounded once into dX).
  virtual Status repeatKVGrad(FloatIn dy, FloatOut dx, int64_t rows,
                              int64_t heads, int64_t groups,
                              int64_t headDim) = 0;
  /// QK-norm (the QKNorm opcode): X [rows, groups * (heads/groups + 2) *
  /// headDim] per group [q of its heads | k | v]; each q head's headDim
  /// features RMS-normalised with wq, each k with wk (as rmsNorm's rows),
  /// v copied.
  virtual Status qkNorm(const float *x, const float *wq, const float *wk,
                        float *y, int64_t rows, int64_t heads, int64_t groups,
                        int64_t headDim, float eps) = 0;
  /// Its backward: dX as rmsNormGrad's per head (dY for v); dwq and dwk =
  /// beta * dw + the sums over the query (key) heads of all rows, in order.
  virtual Status qkNormGrad(const float *x, const float *wq, const float *wk,
                            const float *dy, float *dx, float *dwq, float *dwk,
                            int64_t rows, int64_t heads, int64_t groups,
                            int64_t headDim, float eps, float beta) = 0;
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
  /// Y[r, j] = X[r, j], or `fill` where colOffset + j >= valid (a padded
  /// vocabulary's columns; X [rows, cols] is the shard at colOffset); Y may
  /// alias X.
  virtual Status maskColumns(const float *x, float *y, int64_t rows,
                             int64_t cols, int64_t colOffset, int64_t valid,
                             float fill) = 0;
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
  /// Y = convert(float(X) + beta * float(Y)) for n elements between f32,
  /// bf16 and f16, any pair of formats (the same one included): the sum in
  /// f32, one rounding when Y is 16-bit. beta == 0 overwrites Y without
  /// reading it; beta == 1 accumulates (a gradient into its buffer). X and
  /// Y may be the same buffer when their formats are equal.
  virtual Status cast(const void *x, FloatFormat xFormat, void *y,
                      FloatFormat yFormat, int64_t n, float beta) = 0;
  /// 16-bit Fill: Y[:] = half(value), `half` BF16 or F16.
  virtual Status fillHalf(FloatFormat half, uint16_t *y, float value,
                          int64_t n) = 0;
  /// 16-bit Scale: Y = half(alpha * float(X)); Y may alias X.
  virtual Status scaleHalf(FloatFormat half, const uint16_t *x, uint16_t *y,
                           float alpha, int64_t n) = 0;
  /// 16-bit Axpy: Y = half(float(Y) + alpha * float(X)).
  virtual Status axpyHalf(FloatFormat half, float alpha, const uint16_t *x,
                          uint16_t *y, int64_t n) = 0;
  /// AdamW step t = *iteration (1-based; a device pointer, so the host
  /// never reads it back) with bias correction 1 - beta^t and decoupled
  /// weight decay: p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). An
  /// iteration below 1 is an InvalidArgument error.
  virtual Status adam(float *p, const float *g, float *m, float *v, int64_t n,
                      const int64_t *iteration, const AdamParams &params) = 0;
  /// p -= lr * (g + weightDecay * p).
  virtual Status sgd(float *p, const float *g, int64_t n, float lr,
                     float weightDecay) = 0;
  /// SGD with momentum buffer b (math::sgdMomentumUpdate per element).
  virtual Status sgdMomentum(float *p, const float *g, float *b, int64_t n,
                             float lr, float weightDecay, float momentum) = 0;
  /// y[0] = sum of x[i]^2 over n elements of `format` (f32, bf16, f16), summed
  /// in f64 and rounded once; with `accumulate`, y[0] += that sum instead.
  /// y is one f32 on the device.
  virtual Status sumSquares(const void *x, FloatFormat format, int64_t n,
                            float *y, bool accumulate) = 0;
  /// norm[0] = sqrt(sumsq[0]) (in f64, rounded once) * invScale and
  /// coeff[0] = math::clipCoefficient(norm, maxNorm) * invScale; device
  /// scalars. invScale is 1, or under fp16 the inverse of the loss scale
  /// (a power of two, so that both products are exact): sumsq is then of
  /// the scaled gradients, the norm that of the unscaled ones, and the
  /// coefficient unscales as it clips (Megatron's unscale, then
  /// clip_grad_norm_fp32).
  virtual Status clipGradNorm(const float *sumsq, float *norm, float *coeff,
                              float maxNorm, float invScale) = 0;
  /// y = x * s[0], s a device scalar; y may alias x.
  virtual Status scaleBy(const float *x, const float *s, float *y,
                         int64_t n) = 0;

  //===--------------------------------------------------------------------===//
  // Transformer kernels. Activations are sequence-major [S, B, H]; "rows" is
  // the product of all dims but the last. `beta` arguments follow the
  // Instr's beta: 0 overwrites the output (without reading it), otherwise
  // out = beta * out + result (gradient accumulation over microbatches).
  //===--------------------------------------------------------------------===//

  /// Y[r, :] = (X[r, :] - mean) * rstd * gamma + bias, mean and variance
  /// (biased) over the `cols` of each row, rstd = 1 / sqrt(var + eps). X
  /// and Y in any FloatFormat (the statistics in f32).
  virtual Status layerNorm(FloatIn x, const float *gamma,
                           const float *bias, FloatOut y, int64_t rows,
                           int64_t cols, float eps) = 0;
  /// dX (overwritten) and dgamma/dbeta = beta * old + sums over rows; mean
  /// and rstd are recomputed from X (any FloatFormat).
  virtual Status layerNormGrad(FloatIn x, const float *gamma,
                               const float *dy, float *dx, float *dgamma,
                               float *dbias, int64_t rows, int64_t cols,
                               float eps, float beta) = 0;
  /// S = A + B, then Y = layerNorm(S): the residual add and the layer norm
  /// of the sum in one pass (the same results as add then layerNorm); Y in
  /// any FloatFormat (S stays f32: the residual stream).
  virtual Status addLayerNorm(const float *a, const float *b,
                              const float *gamma, const float *bias, float *s,
                              FloatOut y, int64_t rows, int64_t cols,
                              float eps) = 0;
  /// layerNormGrad with dX = the layer norm's input gradient + dR (the
  /// residual's gradient), as layerNormGrad then add.
  virtual Status addLayerNormGrad(const float *x, const float *gamma,
                                  const float *dy, const float *dr, float *dx,
                                  float *dgamma, float *dbias, int64_t rows,
                                  int64_t cols, float eps, float beta) = 0;
  /// Y[r, :] = X[r, :] * rstd * gamma, rstd = 1 / sqrt(mean(X[r, :]^2) +
  /// eps): Megatron's RMSNorm. X and Y in any FloatFormat.
  virtual Status rmsNorm(FloatIn x, const float *gamma, FloatOut y,
                         int64_t rows, int64_t cols, float eps) = 0;
  /// S = A + B, then Y = rmsNorm(S), in one pass; Y in any FloatFormat.
  virtual Status addRmsNorm(const float *a, const float *b, const float *gamma,
                            float *s, FloatOut y, int64_t rows, int64_t cols,
                            float eps) = 0;
  /// dX (overwritten; plus dR when dR is not null: the residual's gradient
  /// of the fused form) and dgamma = beta * old + sum over rows of dY *
  /// xhat; rstd is recomputed from X (any FloatFormat).
  virtual Status rmsNormGrad(FloatIn x, const float *gamma,
                             const float *dy, const float *dr, float *dx,
                             float *dgamma, int64_t rows, int64_t cols,
                             float eps, float beta) = 0;
  /// Vocabulary-parallel lookup in a shard T [localVocab, dim] holding ids
  /// [vocabOffset, vocabOffset + localVocab): Y[r, :] = T[ids[r] - offset, :]
  /// or 0 for ids of other shards. Ids outside [0, vocabSize) are an
  /// OutOfRange error naming the id, its row and vocabSize. T and Y in any
  /// FloatFormat (a row copied, widened or rounded once).
  virtual Status embedding(const int32_t *ids, FloatIn table, FloatOut y,
                           int64_t rows, int64_t localVocab, int64_t dim,
                           int64_t vocabOffset, int64_t vocabSize) = 0;
  /// dT = beta * dT + scatter-add of dY rows at ids[r] - vocabOffset (rows
  /// whose id is outside the shard are skipped).
  virtual Status embeddingGrad(const int32_t *ids, const float *dy,
                               float *dtable, int64_t rows, int64_t localVocab,
                               int64_t dim, int64_t vocabOffset,
                               float beta) = 0;
  /// Y[s, b, :] = X[s, b, :] + P[s, :] for X, Y [seq, batch, dim]; Y may
  /// alias X (same format). P has at least `seq` rows. X, P and Y in any
  /// FloatFormat (the f32 sum rounded once).
  virtual Status addPositionEmbedding(FloatIn x, FloatIn pos, FloatOut y,
                                      int64_t seq, int64_t batch,
                                      int64_t dim) = 0;
  /// dP [posRows, dim]: dP[s, :] = beta * dP[s, :] + sum_b dY[s, b, :] for
  /// s < seq, beta * dP[s, :] for seq <= s < posRows.
  virtual Status positionEmbeddingGrad(const float *dy, float *dpos,
                                       int64_t seq, int64_t batch, int64_t dim,
                                       int64_t posRows, float beta) = 0;
  /// Multi-head self-attention. QKV [seq, batch, heads * 3 * headDim] with
  /// feature h*3*D + {0 q, 1 k, 2 v}*D + d; out [seq, batch, heads * headDim]
  /// = softmax(q k^T / sqrt(D) (+ causal mask)) v per (batch, head).
  virtual Status attention(const float *qkv, float *out, int64_t seq,
                           int64_t batch, int64_t heads, int64_t headDim,
                           bool causal) = 0;
  /// dQKV (overwritten, layout of QKV) from QKV and dOut; recomputes the
  /// probabilities.
  virtual Status attentionGrad(const float *qkv, const float *dout, float *dqkv,
                               int64_t seq, int64_t batch, int64_t heads,
                               int64_t headDim, bool causal) = 0;
  /// m[r] = max_j Z[r, j]. Z in any FloatFormat here and in the loss
  /// statistics below (the logits a 16-bit GEMM wrote; the statistics are
  /// f32, as Megatron's vocab_parallel_cross_entropy computes them on the
  /// logits widened to f32).
  virtual Status logitsMax(FloatIn z, float *m, int64_t rows,
                           int64_t cols) = 0;
  /// Vocabulary-parallel cross-entropy statistics of a logits shard Z
  /// [rows, cols] holding classes [vocabOffset, vocabOffset + cols), with M
  /// the global row max: se[r] = sum_j exp(Z[r, j] - M[r]); pl[r] =
  /// Z[r, t[r] - vocabOffset] if the label is in this shard and
  /// t[r] != ignoreIndex, else 0. Labels outside [0, numClasses) other than
  /// ignoreIndex are an OutOfRange error.
  virtual Status crossEntropyStats(FloatIn z, const int32_t *t,
                                   const float *m, float *se, float *pl,
                                   int64_t rows, int64_t cols,
                                   int64_t vocabOffset, int64_t numClasses,
                                   int64_t ignoreIndex) = 0;
  /// logitsMax then crossEntropyStats of unsharded logits Z [rows, cols]
  /// (vocabOffset 0, numClasses = cols), each row read once: the same
  /// results.
  virtual Status logitsStats(FloatIn z, const int32_t *t, float *m,
                             float *se, float *pl, int64_t rows, int64_t cols,
                             int64_t ignoreIndex) = 0;
  /// L[r] = log(se[r]) + M[r] - pl[r], 0 where t[r] == ignoreIndex.
  virtual Status crossEntropyFromStats(const float *se, const float *pl,
                                       const float *m, const int32_t *t,
                                       float *loss, int64_t rows,
                                       int64_t ignoreIndex) = 0;
  /// dZ[r, j] = dL[r] * (exp(Z[r, j] - M[r]) / se[r] - [j == t[r] - offset]),
  /// zero rows where t[r] == ignoreIndex. Labels as in crossEntropyStats.
  /// dZ in any FloatFormat (rounded once from the f32 value).
  virtual Status crossEntropyStatsGrad(FloatIn z, const int32_t *t,
                                       const float *m, const float *se,
                                       const float *dl, FloatOut dz, int64_t rows,
                                       int64_t cols, int64_t vocabOffset,
                                       int64_t numClasses,
                                       int64_t ignoreIndex) = 0;
  /// y[0] = sum_r L[r] / count, 0 if count is 0, over the rows with
  /// t[r] != ignoreIndex; count is `count[0]` (a device scalar: the whole
  /// sequence's count under context parallelism) or, when `count` is null,
  /// the number of such rows.
  virtual Status tokenMean(const float *loss, const int32_t *t, float *y,
                           int64_t rows, int64_t ignoreIndex,
                           const float *count) = 0;
  /// n[0] = count(t[r] != ignoreIndex) as a float.
  virtual Status tokenCount(const int32_t *t, float *n, int64_t rows,
                            int64_t ignoreIndex) = 0;
  /// Dropout on [seq, batch, hidden] with masks keyed by global position
  /// (see the Dropout opcode and math/Philox.h): batch column b holds global
  /// sample firstSample + b, `seqOffset` is the first global position of
  /// this shard, `seqTotal` the positions of a whole sample. X and Y in any
  /// FloatFormat (the kept values scaled in f32, rounded once).
  virtual Status dropout(FloatIn x, FloatOut y, int64_t seq, int64_t batch,
                         int64_t hidden, int64_t seqOffset, int64_t seqTotal,
                         int64_t firstSample, uint64_t seed, int64_t stream,
                         float rate) = 0;
  /// RoPE of a fused QKV [seq, batch, heads * 3 * d] (see the
  /// RotaryEmbedding opcode): the first rotDim features of each head's q and
  /// k rotate by math::ropeAngle at position posBegin + row (by minus it when
  /// `inverse`; with Llama 3.1's scaling by `scalingFactor` when it is not
  /// 0), the rest is copied. Y may be X (same format). X and Y in any
  /// FloatFormat (each rotated pair computed in f32, rounded once).
  virtual Status rotaryEmbedding(FloatIn x, FloatOut y, int64_t seq,
                                 int64_t batch, int64_t features,
                                 int64_t heads, int64_t rotDim, float base,
                                 float scalingFactor, int64_t posBegin,
                                 bool inverse) = 0;
  /// dL[r] = dy[0] / count where t[r] != ignoreIndex, else 0; count as in
  /// tokenMean.
  virtual Status tokenMeanGrad(const float *dy, const int32_t *t, float *dl,
                               int64_t rows, int64_t ignoreIndex,
                               const float *count) = 0;

  /// Ring attention (context parallelism, the RingAttention opcodes): the
  /// per-step kernels the executor runs while the K/V blocks travel around
  /// the cp group. Local rows are this cp rank's two chunks of the
  /// sequence (math/SequenceLayout.h); a K/V block is [S, B, heads, 2, D]
  /// (k then v per head), as packed from QKV.
  using RingAttentionDims = math::RingAttentionDims;
  /// The sizes every backend's ring kernels take: an even local sequence
  /// (two chunks) and a head dimension of at least 1.
  static Status checkRingAttentionDims(const RingAttentionDims &d);
  /// kv = the K and V of QKV, packed.
  virtual Status ringPackKeysValues(const float *qkv, float *kv,
                                    const RingAttentionDims &d) = 0;
  /// One forward step: this rank's queries against block `kv` of cp rank
  /// `source`, accumulated into the unnormalised output O and the running
  /// max and sum `stats` ([2, B * heads, S]) with the online softmax. The
  /// first step (`first`) starts them; the last (`lse` not null)
  /// normalises O and writes LSE [S, B, heads].
  virtual Status ringAttentionStep(const float *qkv, const float *kv, float *o,
                                   float *stats, float *lse,
                                   const RingAttentionDims &d, int64_t source,
                                   bool first) = 0;
  /// One backward step against block `kv` of cp rank `source`: adds this
  /// rank's queries' share of dK/dV into `dkv` (same layout) and of dQ into
  /// the q part of dQKV. `delta` is [B * heads, S]; the first step computes
  /// it (rowsum(dO * O)) and zeroes dQKV.
  virtual Status ringAttentionGradStep(const float *qkv, const float *o,
                                       const float *lse, const float *dout,
                                       const float *kv, float *dkv,
                                       float *delta, float *dqkv,
                                       const RingAttentionDims &d,
                                       int64_t source, bool first) = 0;
  /// The k and v parts of dQKV = the packed gradients dkv.
  virtual Status ringUnpackKeyValueGrads(const float *dkv, float *dqkv,
                                         const RingAttentionDims &d) = 0;

  /// Mixture of experts (the MoE opcodes): `tokens` routed tokens, each to
  /// `k` of `experts` experts; rows are the [tokens * k, features] tokens
  /// permuted into expert order (expert 0's rows first, token order within
  /// an expert, as math/MoE.h documents). An index outside [0, experts) is
  /// an OutOfRange error naming it.
  /// probs, indices [tokens, k] from logits [tokens, experts] (moeTopK).
  virtual Status moeRouter(const float *logits, float *probs, int32_t *indices,
                           int64_t tokens, int64_t experts, int64_t k) = 0;
  /// dlogits [tokens, experts] (overwritten) from dprobs (moeTopKGrad).
  virtual Status moeRouterGrad(const float *probs, const int32_t *indices,
                               const float *dprobs, float *dlogits,
                               int64_t tokens, int64_t experts, int64_t k) = 0;
  /// y[0] = the load-balancing loss (Megatron's
  /// switch_load_balancing_loss_func); with `allCounts` (f32 [experts], or
  /// null) this rank's share of the loss over all ranks' tokens, whose
  /// choices per expert they are.
  virtual Status moeAuxLoss(const float *logits, const int32_t *indices,
                            const float *allCounts, float *y, int64_t tokens,
                            int64_t experts, int64_t k, float coeff) = 0;
  /// dlogits (overwritten) of the load-balancing loss times dy[0].
  virtual Status moeAuxLossGrad(const float *logits, const int32_t *indices,
                                const float *allCounts, const float *dy,
                                float *dlogits, int64_t tokens,
                                int64_t experts, int64_t k, float coeff) = 0;
  /// counts[e] (f32) = the entries of indices [choices] equal to e; -1
  /// (dropped) counts for none.
  virtual Status moeTokenCounts(const int32_t *indices, float *counts,
                                int64_t choices, int64_t experts) = 0;
  /// rows from X [tokens, features]; counts [experts].
  virtual Status moeDispatch(const float *x, const int32_t *indices,
                             float *rows, int32_t *counts, int64_t tokens,
                             int64_t k, int64_t experts, int64_t features) = 0;
  /// dX[t] = sum over t's rows of drows.
  virtual Status moeDispatchGrad(const float *drows, const int32_t *indices,
                                 float *dx, int64_t tokens, int64_t k,
                                 int64_t experts, int64_t features) = 0;
  /// The row offset of each expert's group from the experts' row counts
  /// (host memory): experts + 1 offsets, or an OutOfRange error for a
  /// negative count or counts that add up to more than `rows`.
  static StatusOr<std::vector<int64_t>>
  expertGroupOffsets(const int32_t *counts, int64_t experts, int64_t rows);
  /// Y [rows, out]: counts[e] consecutive rows per expert, Y_e = X_e W[e]^T,
  /// W [experts, out, in]; rows past the counts' sum are zero. X and W are
  /// in `inputs` (both f32, or both 16-bit accumulating in f32, as gemmHalf);
  /// Y is f32.
  virtual Status groupedLinear(FloatFormat inputs, const void *x,
                               const int32_t *counts, const void *w, float *y,
                               int64_t rows, int64_t in, int64_t out,
                               int64_t experts) = 0;
  /// dX_e = dY_e W[e] (overwritten); dW[e] = beta dW[e] + dY_e^T X_e. X, W
  /// and dY are in `inputs`; dX and dW are f32.
  virtual Status groupedLinearGrad(FloatFormat inputs, const void *x,
                                   const int32_t *counts, const void *w,
                                   const void *dy, float *dx, float *dw,
                                   int64_t rows, int64_t in, int64_t out,
                                   int64_t experts, float beta) = 0;
  /// Expert capacity: each expert keeps at most `capacity` of the choices
  /// routed to it, the most probable (ties to the earlier token) or, with
  /// `byPosition`, the first; keptProbs/keptIndices are probs/indices with
  /// the dropped choices' index -1 and probability 0. Index -1 (a dropped
  /// choice) is allowed in the indices of every MoE kernel after the
  /// capacity drop (it has no row), not in the router's gradient and the
  /// load-balancing loss, which come before it.
  virtual Status moeCapacityDrop(const float *probs, const int32_t *indices,
                                 float *keptProbs, int32_t *keptIndices,
                                 int64_t tokens, int64_t k, int64_t experts,
                                 int64_t capacity, bool byPosition) = 0;
  /// dProbs[c] = dKept[c] where keptIndices[c] >= 0, else 0 (the backward
  /// of moeCapacityDrop over its `n` choices).
  virtual Status moeCapacityDropGrad(const float *dkept,
                                     const int32_t *keptIndices, float *dprobs,
                                     int64_t n) = 0;
  /// Y[t] = sum_j probs[t, j] rows[row of (t, j)].
  virtual Status moeCombine(const float *rows, const float *probs,
                            const int32_t *indices, float *y, int64_t tokens,
                            int64_t k, int64_t experts, int64_t features) = 0;
  /// drows and dprobs (both overwritten) from dY.
  virtual Status moeCombineGrad(const float *rows, const float *probs,
                                const int32_t *indices, const float *dy,
                                float *drows, float *dprobs, int64_t tokens,
                                int64_t k, int64_t experts,
                                int64_t features) = 0;
};

using BackendFactory =
    std::function<StatusOr<std::unique_ptr<Backend>>(const BackendOptions &)>;
/// A cheap check that a backend could be created here (the cuda backend:
/// a device exists and the driver answers), without what creating it costs
/// (a CUDA context, a cuBLASLt handle, a workspace).
using BackendProbe = std::function<Status()>;

/// Name -> factory map. `global()` always contains "cpu".
class BackendRegistry {
public:
  static BackendRegistry &global();

  /// `probe` (optional) answers probe(name); without one, probe creates
  /// the backend.
  void registerBackend(const std::string &name, BackendFactory factory,
                       BackendProbe probe = {});
  bool contains(const std::string &name) const;
  std::vector<std::string> names() const;

  /// Creates backend `name`. If it is not registered, tries to load the
  /// plugin "libTesseraBackend_<name>.so" (dlopen search path, then the
  /// directory of the running executable and its ../lib) first.
  StatusOr<std::unique_ptr<Backend>> create(const std::string &name,
                                            const BackendOptions &options);

  /// Whether backend `name` can run here, as cheaply as its plugin allows
  /// (tessera-run's check before it starts the ranks): the errors create
  /// would give for a missing plugin, driver or device.
  Status probe(const std::string &name);

  /// dlopens `path` and calls its
  /// `extern "C" void tesseraRegisterBackends(tessera::rt::BackendRegistry *)`.
  Status loadPlugin(const std::string &path);

private:
  mutable std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, BackendProbe> probes;
  /// Loads the plugin of `name` if it is not registered yet.
  Status ensureRegistered(const std::string &name);
};

/// Plugin entry point type.
extern "C" {
typedef void (*TesseraRegisterBackendsFn)(BackendRegistry *registry);
}

/// Registers the built-in "cpu" backend (done by BackendRegistry::global()).
void registerCpuBackend(BackendRegistry &registry);

} // namespace tessera::rt

#endif // TESSERA_RT_BACKEND_H
