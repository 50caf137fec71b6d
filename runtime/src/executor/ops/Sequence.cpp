//===- Sequence.cpp - Embedding, position and dropout opcodes -------------===//
//
// Decode and run functions (Ops.h) of the kernels that place rows at their
// vocabulary or sequence positions: the (vocab-parallel) embedding and its
// gradient, learned absolute position embeddings, rotary position
// embeddings and dropout. Under sequence and context parallelism a rank
// holds runs of the sequence (math/SequenceLayout.h); the position kernels
// and dropout's masks see every row at its global position.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <cmath>

namespace tessera::rt::ops {

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

/// Embedding [ids, T, Y] and EmbeddingGrad [ids, dY, dT]: m rows, n dim,
/// i = [local vocab, offset, vocab_size (Embedding)].
static Status decodeEmbeddingOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                bool grad) {
  int table = grad ? 2 : 1, rowsRef = grad ? 1 : 2;
  TESSERA_ASSIGN_OR_RETURN(Matrix tm, d.matrix(in, table));
  TESSERA_ASSIGN_OR_RETURN(Matrix y, d.rowsCols(in, rowsRef));
  if (d.rankOf(in, table) != 2)
    return invalidArgument("table ", d.desc(in, table),
                           " must be [local vocab, hidden]");
  if (d.numel(in, 0) != y.rows)
    return invalidArgument("ids ", d.desc(in, 0),
                           " must have one id per row of ", grad ? "dY " : "Y ",
                           d.desc(in, rowsRef));
  if (tm.cols != y.cols)
    return invalidArgument("table ", d.desc(in, table), " and ",
                           grad ? "dY " : "Y ", d.desc(in, rowsRef),
                           " must have the same last dimension");
  int64_t offset = 0, shards = 1;
  TESSERA_RETURN_IF_ERROR(d.vocabShard(in, tm.rows, offset, shards));
  t.m = y.rows;
  t.n = y.cols;
  t.i[0] = tm.rows;
  t.i[1] = offset;
  if (!grad) {
    t.i[2] = d.iattr(in, 0);
    if (tm.rows * shards < t.i[2])
      return invalidArgument("vocab_size ", t.i[2], " exceeds the ", tm.rows,
                             " rows of table ", d.desc(in, table), " times ",
                             shards, " vocabulary shard(s)");
  }
  return Status();
}

Status decodeEmbedding(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeEmbeddingOp(d, in, t, false);
}

Status runEmbedding(RunContext &x, const Thunk &t) {
  return x.backend().embedding(i32(t, 0), floatIn(t, 1), floatOut(t, 2), t.m,
                               t.i[0],
                               t.n, t.i[1], t.i[2]);
}

Status decodeEmbeddingGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeEmbeddingOp(d, in, t, true);
}

Status runEmbeddingGrad(RunContext &x, const Thunk &t) {
  return x.backend().embeddingGrad(i32(t, 0), f32(t, 1), f32(t, 2), t.m, t.i[0],
                                   t.n, t.i[1], t.beta);
}

//===----------------------------------------------------------------------===//
// Learned absolute position embeddings
//===----------------------------------------------------------------------===//

/// AddPositionEmbedding [X, P, Y] and PositionEmbeddingGrad [dY, dP]: i =
/// [S, B, H, rows of P], the sequence pieces in t.seq.
static Status decodePositionOp(Decoder &d, const fb::Instr &in, Thunk &t,
                               bool grad) {
  const int pos = 1; // P (or dP)
  if (d.rankOf(in, 0) < 2)
    return invalidArgument("operand 0 ", d.desc(in, 0),
                           " must be [S, B, H] (rank >= 2)");
  if (d.rankOf(in, pos) != 2)
    return invalidArgument("position table ", d.desc(in, pos),
                           " must be [positions, H]");
  int64_t s = d.dim(in, 0, 0), h = d.dim(in, 0, d.rankOf(in, 0) - 1);
  // s * h overflows only when another dimension is 0 (then b is 0).
  int64_t sh = 0;
  int64_t b =
      !__builtin_mul_overflow(s, h, &sh) && sh != 0 ? d.numel(in, 0) / sh : 0;
  TESSERA_RETURN_IF_ERROR(d.sequenceShard(in, s, t));
  if (d.dim(in, pos, 1) != h || d.dim(in, pos, 0) < t.seqTotal)
    return invalidArgument("position table ", d.desc(in, pos),
                           " must have hidden size ", h, " and at least ",
                           t.seqTotal, " rows for ", d.desc(in, 0));
  if (!grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 2}));
  t.i[0] = s;
  t.i[1] = b;
  t.i[2] = h;
  t.i[3] = d.dim(in, pos, 0);
  return Status();
}

Status decodeAddPositionEmbedding(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodePositionOp(d, in, t, false);
}

Status runAddPositionEmbedding(RunContext &x, const Thunk &t) {
  // Rows [localBegin, +rows) add table rows [globalBegin, +rows).
  const int64_t rowFloats = t.i[1] * t.i[2];
  for (int p = 0; p < t.seq.count; ++p) {
    const math::SequencePiece &piece = t.seq.piece[p];
    TESSERA_RETURN_IF_ERROR(x.backend().addPositionEmbedding(
        floatIn(t, 0).at(piece.localBegin * rowFloats),
        floatIn(t, 1).at(piece.globalBegin * t.i[2]),
        floatOut(t, 2).at(piece.localBegin * rowFloats), piece.rows, t.i[1],
        t.i[2]));
  }
  return Status();
}

Status decodePositionEmbeddingGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodePositionOp(d, in, t, true);
}

Status runPositionEmbeddingGrad(RunContext &x, const Thunk &t) {
  Backend &be = x.backend();
  const math::SequencePiece &first = t.seq.piece[0];
  if (t.seq.count == 1 && first.globalBegin == 0)
    return be.positionEmbeddingGrad(f32(t, 0), f32(t, 1), t.i[0], t.i[1],
                                    t.i[2], t.i[3], t.beta);
  // The rows of a context-parallel share: beta applies to the whole table
  // once, then each run of positions accumulates into its rows.
  const int64_t tableFloats = t.i[3] * t.i[2], rowFloats = t.i[1] * t.i[2];
  if (t.beta == 0.0f)
    TESSERA_RETURN_IF_ERROR(be.fill(f32(t, 1), 0.0f, tableFloats));
  else if (t.beta != 1.0f)
    TESSERA_RETURN_IF_ERROR(
        be.scale(f32(t, 1), f32(t, 1), t.beta, tableFloats));
  for (int p = 0; p < t.seq.count; ++p) {
    const math::SequencePiece &piece = t.seq.piece[p];
    TESSERA_RETURN_IF_ERROR(
        be.positionEmbeddingGrad(f32(t, 0) + piece.localBegin * rowFloats,
                                 f32(t, 1) + piece.globalBegin * t.i[2],
                                 piece.rows, t.i[1], t.i[2], piece.rows, 1.0f));
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Rotary position embeddings
//===----------------------------------------------------------------------===//

// [X, Y] of [S, B, heads * 3 * head_dim]; iattrs [heads, rotary_dim,
// inverse], fattrs [base, scaling_factor]: m = S, n = B, k = features, i =
// [heads, rotary_dim, inverse].
Status decodeRotaryEmbedding(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1}));
  if (d.rankOf(in, 0) != 3)
    return invalidArgument("RotaryEmbedding expects [seq, batch, heads * 3 "
                           "* head_dim], got ",
                           d.desc(in, 0));
  t.m = d.dim(in, 0, 0);
  t.n = d.dim(in, 0, 1);
  t.k = d.dim(in, 0, 2);
  const int64_t heads = d.iattr(in, 0), rot = d.iattr(in, 1);
  if (heads < 1 || t.k % (3 * heads) != 0)
    return invalidArgument("RotaryEmbedding: ", t.k,
                           " features are not 3 x num_heads (", heads,
                           ") x head_dim");
  if (rot < 2 || rot % 2 != 0 || rot > t.k / (3 * heads))
    return invalidArgument("RotaryEmbedding: rotary_dim ", rot,
                           " must be even and in [2, head_dim ",
                           t.k / (3 * heads), "]");
  if (!(t.f[0] > 1.0f) || !std::isfinite(t.f[0]))
    return invalidArgument("RotaryEmbedding: base must be finite and > 1, "
                           "got ",
                           t.f[0]);
  if (t.f[1] != 0.0f && !(t.f[1] >= 1.0f && std::isfinite(t.f[1])))
    return invalidArgument("RotaryEmbedding: scaling factor must be 0 "
                           "(none) or finite and >= 1, got ",
                           t.f[1]);
  TESSERA_RETURN_IF_ERROR(d.sequenceShard(in, t.m, t));
  t.i[0] = heads;
  t.i[1] = rot;
  t.i[2] = d.iattr(in, 2);
  return Status();
}

Status runRotaryEmbedding(RunContext &x, const Thunk &t) {
  // Each piece of the sequence at its global positions.
  const int64_t rowFloats = t.n * t.k;
  for (int p = 0; p < t.seq.count; ++p) {
    const math::SequencePiece &piece = t.seq.piece[p];
    TESSERA_RETURN_IF_ERROR(x.backend().rotaryEmbedding(
        floatIn(t, 0).at(piece.localBegin * rowFloats),
        floatOut(t, 1).at(piece.localBegin * rowFloats), piece.rows, t.n, t.k,
        t.i[0],
        t.i[1], t.f[0], t.f[1], piece.globalBegin, t.i[2] != 0));
  }
  return Status();
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

// [X, Y] of [S, B, H]; iattrs [stream], fattrs [rate]: m = S, n = B, k = H,
// i[2] = the mask's Philox stream.
Status decodeDropout(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1}));
  if (d.rankOf(in, 0) != 3)
    return invalidArgument("Dropout expects [seq, batch, hidden], got ",
                           d.desc(in, 0));
  t.m = d.dim(in, 0, 0);
  t.n = d.dim(in, 0, 1);
  t.k = d.dim(in, 0, 2);
  TESSERA_RETURN_IF_ERROR(d.sequenceShard(in, t.m, t));
  t.i[2] = d.iattr(in, 0);
  return Status();
}

Status runDropout(RunContext &x, const Thunk &t) {
  // Masks are keyed by the global sample of each batch column (column b
  // holds sample first + b) and the global position of each row.
  const int64_t first = x.firstSample();
  const int64_t rowFloats = t.n * t.k;
  for (int p = 0; p < t.seq.count; ++p) {
    const math::SequencePiece &piece = t.seq.piece[p];
    TESSERA_RETURN_IF_ERROR(x.backend().dropout(
        floatIn(t, 0).at(piece.localBegin * rowFloats),
        floatOut(t, 1).at(piece.localBegin * rowFloats), piece.rows, t.n, t.k,
        piece.globalBegin, t.seqTotal, first, x.seed(), t.i[2], t.f[0]));
  }
  return Status();
}

} // namespace tessera::rt::ops
