//===- GemmPlan.h - Row-major GEMMs as column-major library calls -*- C++ -*-===//
//
// The artifact's matrices are row-major; cuBLASLt (like every BLAS) is
// column-major. A GemmPlan is the column-major call that computes a
// row-major product, decided on the host before any library is involved:
// the CUDA backend builds its cuBLASLt descriptors from it, and the CPU
// tests run the very same plan through OpenBLAS's column-major sgemm and
// compare it with the CPU backend, which is how the mapping (operand swap,
// transposes, leading dimensions, batch strides) is checked on machines
// without a GPU.
//
// Plain C++ (no CUDA headers).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_BACKENDS_CUDA_GEMMPLAN_H
#define TESSERA_RT_BACKENDS_CUDA_GEMMPLAN_H

#include "tessera/rt/BF16.h"

#include <algorithm>
#include <cstdint>

namespace tessera::rt::cuda {

/// A row-major (batched) product C[z] = alpha * op(A[z]) op(B[z]) +
/// beta * C[z] for z < batch, with op(A) [m, k], op(B) [k, n], C [m, n];
/// A[z] starts strideA elements after A[z - 1] (likewise B, C), and each
/// matrix has its own row stride (leading dimension).
struct RowMajorGemm {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
};

/// The dense row-major product of the Gemm opcode: A stored [m, k] ([k, m]
/// when transposed), B [k, n] ([n, k]), C [m, n], no batch.
inline RowMajorGemm denseRowMajorGemm(bool transA, bool transB, int64_t m,
                                      int64_t n, int64_t k) {
  RowMajorGemm g;
  g.transA = transA;
  g.transB = transB;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = transA ? m : k;
  g.ldb = transB ? k : n;
  g.ldc = n;
  return g;
}

/// A column-major (BLAS convention) batched product C = alpha op(A) op(B) +
/// beta C with op(A) [m, k], op(B) [k, n], C [m, n]. `swapOperands`: the
/// column-major A is the row-major B (always true for plans made by
/// columnMajorPlan; kept explicit so a caller passes the pointers in the
/// order the plan says).
struct GemmPlan {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  bool swapOperands = false;
  /// The format of A and B: F32 (then C too), or BF16 or F16 (mixed
  /// precision's GEMMs) with the products accumulated in f32.
  FloatFormat inputs = FloatFormat::F32;
  /// The format of C (and D): F32, or `inputs`' 16-bit format (the f32
  /// result rounded once; beta 0).
  FloatFormat output = FloatFormat::F32;
  bool halfInputs() const { return inputs != FloatFormat::F32; }

  /// Rows and columns of the stored (untransposed) A and B, column-major.
  int64_t rowsA() const { return transA ? k : m; }
  int64_t colsA() const { return transA ? m : k; }
  int64_t rowsB() const { return transB ? n : k; }
  int64_t colsB() const { return transB ? k : n; }
};

/// The column-major call computing `g`. A row-major X [r, c] with row
/// stride ld is, read column-major, X^T [c, r] with leading dimension ld;
/// so C = op(A) op(B) is C^T = op(B)^T op(A)^T: the column-major product of
/// the row-major B and A (swapped), with m and n swapped and the same
/// transpose flags and leading dimensions.
inline GemmPlan columnMajorPlan(const RowMajorGemm &g) {
  GemmPlan p;
  p.transA = g.transB;
  p.transB = g.transA;
  p.m = g.n;
  p.n = g.m;
  p.k = g.k;
  p.lda = g.ldb;
  p.ldb = g.lda;
  p.ldc = g.ldc;
  p.batch = g.batch;
  p.strideA = g.strideB;
  p.strideB = g.strideA;
  p.strideC = g.strideC;
  p.swapOperands = true;
  return p;
}

/// The alignment a GEMM kernel may assume for an operand at `address` whose
/// columns are `ldBytes` apart and whose batches are `strideBytes` apart (0:
/// one column, or one batch): the largest power of two up to 256 bytes that
/// divides all three, since a kernel's vector loads start at every column
/// of every batch, not only at the base. cuBLASLt's heuristic assumes 256
/// unless told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), and the executor's
/// operands need not be: a head's q, k, v within QKV, an expert's rows
/// after the rows of the experts before it, a leading dimension of 3 x 37
/// floats.
inline uint32_t operandAlignment(uintptr_t address, int64_t ldBytes = 0,
                                 int64_t strideBytes = 0) {
  uint64_t all = uint64_t(address) | uint64_t(ldBytes) | uint64_t(strideBytes);
  uint32_t align = 256;
  while (align > 1 && all % align != 0)
    align /= 2;
  return align;
}

/// Whether `p` is a well-formed column-major call: positive leading
/// dimensions at least the stored rows, batch >= 1 and non-negative
/// strides. (Empty products, m, n or k == 0, are handled by the caller.)
inline bool isValidPlan(const GemmPlan &p) {
  return p.m > 0 && p.n > 0 && p.k > 0 && p.batch >= 1 &&
         p.lda >= std::max<int64_t>(1, p.rowsA()) &&
         p.ldb >= std::max<int64_t>(1, p.rowsB()) &&
         p.ldc >= std::max<int64_t>(1, p.m) && p.strideA >= 0 &&
         p.strideB >= 0 && p.strideC >= 0;
}

/// A strided-batched row-major product: `batch` products op(A) op(B) of
/// [m, k] x [k, n], each operand `stride*` elements after the last.
inline RowMajorGemm stridedBatchedGemm(bool transA, bool transB, int64_t m,
                                       int64_t n, int64_t k, int64_t lda,
                                       int64_t ldb, int64_t ldc, int64_t batch,
                                       int64_t strideA, int64_t strideB,
                                       int64_t strideC) {
  RowMajorGemm g;
  g.transA = transA;
  g.transB = transB;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.batch = batch;
  g.strideA = strideA;
  g.strideB = strideB;
  g.strideC = strideC;
  return g;
}

//===----------------------------------------------------------------------===//
// Multi-head attention as strided-batched GEMMs (Megatron's
// CoreAttention: baddbmm for the scores, bmm for the context). QKV is
// [seq, batch, heads * 3 * D] (q, k, v of head h at features h*3*D + {0, D,
// 2D}); batch index z = b * heads + h of a chunk of heads starting at z0.
// Every operand of head z starts at a fixed stride from head z - 1: 3 * D
// in QKV, D in the output, seq * seq in the probabilities.
//===----------------------------------------------------------------------===//

/// The six products of attention and its gradient for `count` heads
/// (batch entries), with their element offsets in QKV.
struct AttentionPlans {
  /// S = scale * Q K^T, [seq, seq] per head, into the probabilities.
  RowMajorGemm scores;
  /// O = P V, [seq, D] per head, into the output.
  RowMajorGemm context;
  /// dV = P^T dO, [seq, D] per head, into dQKV's v part.
  RowMajorGemm gradV;
  /// dP = dO V^T, [seq, seq] per head.
  RowMajorGemm gradProbs;
  /// dQ = scale * dS K, into dQKV's q part.
  RowMajorGemm gradQ;
  /// dK = scale * dS^T Q, into dQKV's k part.
  RowMajorGemm gradK;
  /// Offsets of q, k, v of head 0 from the start of (d)QKV (elements).
  int64_t qOffset = 0, kOffset = 0, vOffset = 0;
  /// Element stride between heads in (d)QKV, in the output and in the
  /// [seq, seq] probability blocks.
  int64_t qkvHeadStride = 0, outHeadStride = 0, probsHeadStride = 0;
};

inline AttentionPlans attentionPlans(int64_t seq, int64_t batch, int64_t heads,
                                     int64_t headDim, int64_t count) {
  const int64_t ld = batch * heads * 3 * headDim; // QKV row stride
  const int64_t ldo = batch * heads * headDim;    // output row stride
  AttentionPlans a;
  a.qOffset = 0;
  a.kOffset = headDim;
  a.vOffset = 2 * headDim;
  a.qkvHeadStride = 3 * headDim;
  a.outHeadStride = headDim;
  a.probsHeadStride = seq * seq;
  auto make = [count](bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      int64_t lda, int64_t ldb, int64_t ldc, int64_t sa,
                      int64_t sb, int64_t sc) {
    return stridedBatchedGemm(ta, tb, m, n, k, lda, ldb, ldc, count, sa, sb,
                              sc);
  };
  const int64_t sq = a.qkvHeadStride, so = a.outHeadStride,
                sp = a.probsHeadStride;
  // Q [seq, D] (ld) x K^T -> P [seq, seq] (ld seq).
  a.scores = make(false, true, seq, seq, headDim, ld, ld, seq, sq, sq, sp);
  // P [seq, seq] x V [seq, D] (ld) -> O [seq, D] (ldo).
  a.context = make(false, false, seq, headDim, seq, seq, ld, ldo, sp, sq, so);
  // P^T x dO [seq, D] (ldo) -> dV [seq, D] (ld).
  a.gradV = make(true, false, seq, headDim, seq, seq, ldo, ld, sp, so, sq);
  // dO x V^T -> dP [seq, seq].
  a.gradProbs = make(false, true, seq, seq, headDim, ldo, ld, seq, so, sq, sp);
  // dS [seq, seq] x K [seq, D] -> dQ (ld).
  a.gradQ = make(false, false, seq, headDim, seq, seq, ld, ld, sp, sq, sq);
  // dS^T x Q -> dK (ld).
  a.gradK = make(true, false, seq, headDim, seq, seq, ld, ld, sp, sq, sq);
  return a;
}

//===----------------------------------------------------------------------===//
// Ring attention (the RingAttention opcodes) as strided-batched GEMMs per
// pair of a local query chunk and a key chunk (math::ringChunkPairs), for
// `count` heads z = b * heads + h at a time. A packed K/V block is
// [seq, batch, heads, 2, D]: head z's k at z * 2D, its v at z * 2D + D.
// The caller offsets the pointers to the pair's first rows and the head
// group's first head; the plans give the strides.
//===----------------------------------------------------------------------===//

struct RingAttentionPlans {
  /// S = scale * Q K^T, [chunk, chunk] per head.
  RowMajorGemm scores;
  /// O += P V into the unnormalised output.
  RowMajorGemm context;
  /// dV += P^T dO into the block's gradient.
  RowMajorGemm gradV;
  /// dP = dO V^T.
  RowMajorGemm gradProbs;
  /// dQ += scale * dS K into dQKV's q part.
  RowMajorGemm gradQ;
  /// dK += scale * dS^T Q into the block's gradient.
  RowMajorGemm gradK;
  /// Row strides of (d)QKV, the K/V blocks and the output.
  int64_t ld = 0, ldkv = 0, ldo = 0;
  /// Element strides between heads.
  int64_t qkvHeadStride = 0, kvHeadStride = 0, outHeadStride = 0,
          probsHeadStride = 0;
};

inline RingAttentionPlans ringAttentionPlans(int64_t chunk, int64_t batch,
                                             int64_t heads, int64_t headDim,
                                             int64_t count) {
  RingAttentionPlans r;
  r.ld = batch * heads * 3 * headDim;
  r.ldkv = batch * heads * 2 * headDim;
  r.ldo = batch * heads * headDim;
  r.qkvHeadStride = 3 * headDim;
  r.kvHeadStride = 2 * headDim;
  r.outHeadStride = headDim;
  r.probsHeadStride = chunk * chunk;
  auto make = [count](bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      int64_t lda, int64_t ldb, int64_t ldc, int64_t sa,
                      int64_t sb, int64_t sc) {
    return stridedBatchedGemm(ta, tb, m, n, k, lda, ldb, ldc, count, sa, sb,
                              sc);
  };
  const int64_t c = chunk, D = headDim, sq = r.qkvHeadStride,
                skv = r.kvHeadStride, so = r.outHeadStride,
                sp = r.probsHeadStride;
  r.scores = make(false, true, c, c, D, r.ld, r.ldkv, c, sq, skv, sp);
  r.context = make(false, false, c, D, c, c, r.ldkv, r.ldo, sp, skv, so);
  r.gradV = make(true, false, c, D, c, c, r.ldo, r.ldkv, sp, so, skv);
  r.gradProbs = make(false, true, c, c, D, r.ldo, r.ldkv, c, so, skv, sp);
  r.gradQ = make(false, false, c, D, c, c, r.ldkv, r.ld, sp, skv, sq);
  r.gradK = make(true, false, c, D, c, c, r.ld, r.ldkv, sp, sq, skv);
  return r;
}

/// Heads per attention chunk so that its [seq, seq] probabilities (and,
/// for the gradient, their gradient: `buffers` of them) fit in
/// `workspaceBytes` of f32 (at least one head).
inline int64_t attentionChunk(int64_t seq, int64_t totalHeads, int buffers,
                              int64_t workspaceBytes) {
  int64_t perHead = std::max<int64_t>(1, seq * seq * 4 * buffers);
  return std::max<int64_t>(1,
                           std::min(totalHeads, workspaceBytes / perHead));
}

} // namespace tessera::rt::cuda

#endif // TESSERA_RT_BACKENDS_CUDA_GEMMPLAN_H
