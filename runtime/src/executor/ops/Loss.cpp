//===- Loss.cpp - Cross entropy and token-mean opcodes --------------------===//
//
// Decode and run functions (Ops.h) of the loss: cross entropy over whole
// logits, Megatron's vocab-parallel cross entropy (_VocabParallelCrossEntropy:
// the row max over the vocabulary shards, the per-shard statistics, the
// loss from the reduced statistics and its gradient), the mean, and the
// token means with Megatron's ignore index (over the cp group: the token
// count travels with the loss).
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

namespace tessera::rt::ops {

//===----------------------------------------------------------------------===//
// Whole-vocabulary cross entropy and the mean
//===----------------------------------------------------------------------===//

/// CrossEntropy [Z, t, L] and CrossEntropyGrad [Z, t, dL, dZ].
static Status decodeCrossEntropyOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                   bool grad) {
  TESSERA_ASSIGN_OR_RETURN(Matrix z, d.rowsCols(in, 0));
  if (d.numel(in, 1) != z.rows || d.numel(in, 2) != z.rows)
    return invalidArgument("targets ", d.desc(in, 1), " and ",
                           grad ? "dL " : "L ", d.desc(in, 2),
                           " must have one element per row of ", d.desc(in, 0));
  if (grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 3}));
  t.m = z.rows;
  t.n = z.cols;
  return Status();
}

Status decodeCrossEntropy(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCrossEntropyOp(d, in, t, false);
}

Status runCrossEntropy(RunContext &x, const Thunk &t) {
  return x.backend().crossEntropy(f32(t, 0), i32(t, 1), f32(t, 2), t.m, t.n);
}

Status decodeCrossEntropyGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCrossEntropyOp(d, in, t, true);
}

Status runCrossEntropyGrad(RunContext &x, const Thunk &t) {
  return x.backend().crossEntropyGrad(f32(t, 0), i32(t, 1), f32(t, 2),
                                      f32(t, 3), t.m, t.n);
}

Status decodeMean(Decoder &d, const fb::Instr &in, Thunk &t) {
  if (d.numel(in, 1) != 1)
    return invalidArgument("result must be a scalar, got ", d.desc(in, 1));
  return Status();
}

Status runMean(RunContext &x, const Thunk &t) {
  return x.backend().mean(f32(t, 0), f32(t, 1), t.n);
}

Status decodeMeanGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  if (d.numel(in, 0) != 1)
    return invalidArgument("dy must be a scalar, got ", d.desc(in, 0));
  t.n = d.numel(in, 1);
  return Status();
}

Status runMeanGrad(RunContext &x, const Thunk &t) {
  return x.backend().meanGrad(f32(t, 0), f32(t, 1), t.n);
}

//===----------------------------------------------------------------------===//
// Vocab-parallel cross entropy
//===----------------------------------------------------------------------===//

// [X, Y]: m rows, n cols; i = [this shard's column offset, valid columns].
Status decodeMaskColumns(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1}));
  int64_t offset = 0, shards = 1;
  TESSERA_RETURN_IF_ERROR(d.vocabShard(in, x.cols, offset, shards));
  t.m = x.rows;
  t.n = x.cols;
  t.i[0] = offset;
  t.i[1] = Decoder::iattr(in, 0);
  if (t.i[1] < 1)
    return invalidArgument("MaskColumns needs valid columns >= 1, got ",
                           t.i[1]);
  return Status();
}

Status runMaskColumns(RunContext &x, const Thunk &t) {
  return x.backend().maskColumns(f32(t, 0), f32(t, 1), t.m, t.n, t.i[0],
                                 t.i[1], t.f[0]);
}

// [Z, m]: m rows, n cols.
Status decodeLogitsMax(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_ASSIGN_OR_RETURN(Matrix z, d.rowsCols(in, 0));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 1, z.rows, "row max"));
  t.m = z.rows;
  t.n = z.cols;
  return Status();
}

Status runLogitsMax(RunContext &x, const Thunk &t) {
  return x.backend().logitsMax(floatIn(t, 0), f32(t, 1), t.m, t.n);
}

/// CrossEntropyStats and LogitsStats [Z, t, M, se, pl], CrossEntropyStatsGrad
/// [Z, t, M, se, dL, dZ]: m rows, n cols, i = [vocabulary offset, classes
/// over all shards, ignore_index].
static Status decodeStatsOp(Decoder &d, const fb::Instr &in, Thunk &t,
                            bool grad) {
  TESSERA_ASSIGN_OR_RETURN(Matrix z, d.rowsCols(in, 0));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 1, z.rows, "labels"));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 2, z.rows, "M"));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 3, z.rows, "se"));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 4, z.rows, grad ? "dL" : "pl"));
  if (grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 5}));
  int64_t offset = 0, shards = 1;
  TESSERA_RETURN_IF_ERROR(d.vocabShard(in, z.cols, offset, shards));
  t.m = z.rows;
  t.n = z.cols;
  t.i[0] = offset;
  t.i[1] = z.cols * shards;
  t.i[2] = d.iattr(in, 0);
  return Status();
}

Status decodeCrossEntropyStats(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeStatsOp(d, in, t, false);
}

Status runCrossEntropyStats(RunContext &x, const Thunk &t) {
  return x.backend().crossEntropyStats(floatIn(t, 0), i32(t, 1), f32(t, 2),
                                       f32(t, 3), f32(t, 4), t.m, t.n, t.i[0],
                                       t.i[1], t.i[2]);
}

// The fused max and statistics of an unsharded vocabulary.
Status decodeLogitsStats(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeStatsOp(d, in, t, false);
}

Status runLogitsStats(RunContext &x, const Thunk &t) {
  return x.backend().logitsStats(floatIn(t, 0), i32(t, 1), f32(t, 2), f32(t, 3),
                                 f32(t, 4), t.m, t.n, t.i[2]);
}

Status decodeCrossEntropyStatsGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeStatsOp(d, in, t, true);
}

Status runCrossEntropyStatsGrad(RunContext &x, const Thunk &t) {
  return x.backend().crossEntropyStatsGrad(floatIn(t, 0), i32(t, 1), f32(t, 2),
                                           f32(t, 3), f32(t, 4), floatOut(t, 5),
                                           t.m,
                                           t.n, t.i[0], t.i[1], t.i[2]);
}

// [se, pl, M, t, L]: m rows, i[0] = ignore_index.
Status decodeCrossEntropyFromStats(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1, 2, 3, 4}));
  t.m = d.numel(in, 0);
  t.i[0] = d.iattr(in, 0);
  return Status();
}

Status runCrossEntropyFromStats(RunContext &x, const Thunk &t) {
  return x.backend().crossEntropyFromStats(f32(t, 0), f32(t, 1), f32(t, 2),
                                           i32(t, 3), f32(t, 4), t.m, t.i[0]);
}

//===----------------------------------------------------------------------===//
// Token means
//===----------------------------------------------------------------------===//

/// TokenMean [L, t, y] and TokenMeanGrad [dy, t, dL]: m rows, i[0] =
/// ignore_index.
static Status decodeTokenMeanOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                bool grad) {
  int scalar = grad ? 0 : 2, perRow = grad ? 2 : 0;
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, scalar, 1, grad ? "dy" : "y"));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {perRow, 1}));
  t.m = d.numel(in, 1);
  t.i[0] = d.iattr(in, 0);
  return Status();
}

Status decodeTokenMean(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeTokenMeanOp(d, in, t, false);
}

Status runTokenMean(RunContext &x, const Thunk &t) {
  return x.backend().tokenMean(f32(t, 0), i32(t, 1), f32(t, 2), t.m, t.i[0],
                               nullptr);
}

Status decodeTokenMeanGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeTokenMeanOp(d, in, t, true);
}

Status runTokenMeanGrad(RunContext &x, const Thunk &t) {
  return x.backend().tokenMeanGrad(f32(t, 0), i32(t, 1), f32(t, 2), t.m, t.i[0],
                                   nullptr);
}

// [t, n]: m labels, i[0] = ignore_index.
Status decodeTokenCount(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 1, 1, "n"));
  t.m = d.numel(in, 0);
  t.i[0] = d.iattr(in, 0);
  return Status();
}

Status runTokenCount(RunContext &x, const Thunk &t) {
  return x.backend().tokenCount(i32(t, 0), f32(t, 1), t.m, t.i[0]);
}

/// TokenMeanOver [L, t, n, y] and TokenMeanOverGrad [dy, t, n, dL]: the
/// mean over n tokens (counted over the cp group).
static Status decodeTokenMeanOverOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                    bool grad) {
  int scalar = grad ? 0 : 3, perRow = grad ? 3 : 0;
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, scalar, 1, grad ? "dy" : "y"));
  TESSERA_RETURN_IF_ERROR(d.requireNumel(in, 2, 1, "n"));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {perRow, 1}));
  t.m = d.numel(in, 1);
  t.i[0] = d.iattr(in, 0);
  return Status();
}

Status decodeTokenMeanOver(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeTokenMeanOverOp(d, in, t, false);
}

Status runTokenMeanOver(RunContext &x, const Thunk &t) {
  return x.backend().tokenMean(f32(t, 0), i32(t, 1), f32(t, 3), t.m, t.i[0],
                               f32(t, 2));
}

Status decodeTokenMeanOverGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeTokenMeanOverOp(d, in, t, true);
}

Status runTokenMeanOverGrad(RunContext &x, const Thunk &t) {
  return x.backend().tokenMeanGrad(f32(t, 0), i32(t, 1), f32(t, 3), t.m, t.i[0],
                                   f32(t, 2));
}

} // namespace tessera::rt::ops
