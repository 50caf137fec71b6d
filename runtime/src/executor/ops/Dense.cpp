//===- Dense.cpp - GEMM, elementwise and activation opcodes ---------------===//
//
// Decode and run functions (Ops.h) of the dense kernels: the GEMM (f32, or
// bf16 or f16 inputs accumulated in f32), bias and residual adds, GELU and ReLU
// with their gradients, Megatron's fused bias + GELU (bias_gelu_impl),
// SwiGLU (Megatron's bias_swiglu_impl without a bias), row reductions,
// fills, scales, copies (whole, or this rank's block of a sequence shard)
// and the f32/bf16/f16 casts of mixed precision.
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

namespace tessera::rt::ops {

//===----------------------------------------------------------------------===//
// Gemm
//===----------------------------------------------------------------------===//

Status decodeGemm(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_ASSIGN_OR_RETURN(Matrix a, d.matrix(in, 0));
  TESSERA_ASSIGN_OR_RETURN(Matrix b, d.matrix(in, 1));
  TESSERA_ASSIGN_OR_RETURN(Matrix c, d.matrix(in, 2));
  int64_t m = t.transA ? a.cols : a.rows, ka = t.transA ? a.rows : a.cols;
  int64_t kb = t.transB ? b.cols : b.rows, n = t.transB ? b.rows : b.cols;
  if (ka != kb || c.rows != m || c.cols != n)
    return invalidArgument("shape mismatch: op(A) is [", m, ", ", ka, "] (A ",
                           d.desc(in, 0), t.transA ? " transposed" : "",
                           "), op(B) is [", kb, ", ", n, "] (B ", d.desc(in, 1),
                           t.transB ? " transposed" : "", "), C is ",
                           d.desc(in, 2));
  t.m = m;
  t.n = n;
  t.k = ka;
  // A and B share a dtype (the validator's SameFloatDType); C is f32, or
  // 16-bit like them (rounded once, beta 0: the validator's `r`).
  t.type = d.floatType(in, 0);
  return Status();
}

Status runGemm(RunContext &x, const Thunk &t) {
  if (isHalf(t))
    return x.backend().gemmHalf(floatFormat(t), t.transA, t.transB, t.m, t.n,
                                t.k, t.alpha, half(t, 0), half(t, 1), t.beta,
                                floatOut(t, 2));
  return x.backend().gemm(t.transA, t.transB, t.m, t.n, t.k, t.alpha, f32(t, 0),
                          f32(t, 1), t.beta, f32(t, 2));
}

//===----------------------------------------------------------------------===//
// Bias, residual and activations
//===----------------------------------------------------------------------===//

Status decodeBiasAdd(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 2}));
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  if (d.numel(in, 1) != x.cols)
    return invalidArgument("bias ", d.desc(in, 1),
                           " does not match the last dimension of ",
                           d.desc(in, 0));
  t.m = x.rows;
  t.n = x.cols;
  return Status();
}

Status runBiasAdd(RunContext &x, const Thunk &t) {
  return x.backend().biasAdd(floatIn(t, 0), f32(t, 1), floatOut(t, 2), t.m,
                             t.n);
}

Status decodeAdd(Decoder &d, const fb::Instr &in, Thunk &t) {
  return d.requireSameNumel(in, {0, 1, 2});
}

Status runAdd(RunContext &x, const Thunk &t) {
  return x.backend().add(floatIn(t, 0), floatIn(t, 1), floatOut(t, 2), t.n);
}

// iattrs [form]: 1 = tanh, 0 = erf.
Status decodeGelu(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.i[0] = d.iattr(in, 0);
  return d.requireSameNumel(in, {0, 1});
}

Status runGelu(RunContext &x, const Thunk &t) {
  return x.backend().gelu(f32(t, 0), f32(t, 1), t.n, t.i[0] != 0);
}

Status decodeGeluGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.i[0] = d.iattr(in, 0);
  return d.requireSameNumel(in, {0, 1, 2});
}

Status runGeluGrad(RunContext &x, const Thunk &t) {
  return x.backend().geluGrad(f32(t, 0), f32(t, 1), f32(t, 2), t.n,
                              t.i[0] != 0);
}

Status decodeRelu(Decoder &d, const fb::Instr &in, Thunk &t) {
  return d.requireSameNumel(in, {0, 1});
}

Status runRelu(RunContext &x, const Thunk &t) {
  return x.backend().relu(f32(t, 0), f32(t, 1), t.n);
}

Status decodeReluGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return d.requireSameNumel(in, {0, 1, 2});
}

Status runReluGrad(RunContext &x, const Thunk &t) {
  return x.backend().reluGrad(f32(t, 0), f32(t, 1), f32(t, 2), t.n);
}

/// BiasGelu [X, b, Y] and BiasGeluGrad [X, b, dY, dX, db].
static Status decodeBiasGeluOp(Decoder &d, const fb::Instr &in, Thunk &t,
                               bool grad) {
  TESSERA_RETURN_IF_ERROR(grad ? d.requireSameNumel(in, {0, 2, 3})
                               : d.requireSameNumel(in, {0, 2}));
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  for (int i = 1; i <= (grad ? 4 : 1); i += 3)
    if (d.numel(in, i) != x.cols)
      return invalidArgument(i == 1 ? "bias " : "bias gradient ", d.desc(in, i),
                             " does not match the last dimension of ",
                             d.desc(in, 0));
  t.m = x.rows;
  t.n = x.cols;
  t.i[0] = d.iattr(in, 0);
  return Status();
}

Status decodeBiasGelu(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeBiasGeluOp(d, in, t, false);
}

Status runBiasGelu(RunContext &x, const Thunk &t) {
  return x.backend().biasGelu(floatIn(t, 0), f32(t, 1), floatOut(t, 2), t.m,
                              t.n, t.i[0] != 0);
}

Status decodeBiasGeluGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeBiasGeluOp(d, in, t, true);
}

Status runBiasGeluGrad(RunContext &x, const Thunk &t) {
  return x.backend().biasGeluGrad(floatIn(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                  f32(t, 4), t.m, t.n, t.i[0] != 0, t.beta);
}

/// X [rows, 2n] (gate | up per row); Y or dY [rows, n]; dX as X.
static Status decodeSwiGLUOp(Decoder &d, const fb::Instr &in, Thunk &t,
                             bool grad) {
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  if (x.cols % 2 != 0 || d.numel(in, 1) * 2 != d.numel(in, 0))
    return invalidArgument(
        "SwiGLU input ", d.desc(in, 0),
        " must be [rows, 2n] (gate and up side by side) and ",
        grad ? "dY " : "Y ", d.desc(in, 1), " [rows, n]");
  if (grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 2}));
  t.m = x.rows;
  t.n = x.cols / 2;
  return Status();
}

Status decodeSwiGLU(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeSwiGLUOp(d, in, t, false);
}

Status runSwiGLU(RunContext &x, const Thunk &t) {
  return x.backend().swiglu(floatIn(t, 0), floatOut(t, 1), t.m, t.n);
}

Status decodeSwiGLUGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeSwiGLUOp(d, in, t, true);
}

Status runSwiGLUGrad(RunContext &x, const Thunk &t) {
  return x.backend().swigluGrad(floatIn(t, 0), f32(t, 1), floatOut(t, 2), t.m,
                                t.n);
}

//===----------------------------------------------------------------------===//
// Reductions, fills, scales, copies and casts
//===----------------------------------------------------------------------===//

Status decodeReduceRows(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  if (d.numel(in, 1) != x.cols)
    return invalidArgument("output ", d.desc(in, 1),
                           " does not match the last dimension of ",
                           d.desc(in, 0));
  t.m = x.rows;
  t.n = x.cols;
  return Status();
}

Status runReduceRows(RunContext &x, const Thunk &t) {
  return x.backend().reduceRows(f32(t, 0), f32(t, 1), t.m, t.n, t.alpha,
                                t.beta);
}

Status decodeFill(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.type = d.floatType(in, 0);
  return Status();
}

Status runFill(RunContext &x, const Thunk &t) {
  if (isHalf(t))
    return x.backend().fillHalf(floatFormat(t), half(t, 0), t.f[0], t.n);
  return x.backend().fill(f32(t, 0), t.f[0], t.n);
}

// Scale and Axpy: f32, or both bf16 or f16 (computed in f32, rounded once).
Status decodeScale(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.type = d.floatType(in, 0);
  return d.requireSameNumel(in, {0, 1});
}

Status runScale(RunContext &x, const Thunk &t) {
  if (isHalf(t))
    return x.backend().scaleHalf(floatFormat(t), half(t, 0), half(t, 1),
                                 t.alpha, t.n);
  return x.backend().scale(f32(t, 0), f32(t, 1), t.alpha, t.n);
}

Status decodeAxpy(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeScale(d, in, t);
}

Status runAxpy(RunContext &x, const Thunk &t) {
  if (isHalf(t))
    return x.backend().axpyHalf(floatFormat(t), t.alpha, half(t, 0),
                                half(t, 1), t.n);
  return x.backend().axpy(t.alpha, f32(t, 0), f32(t, 1), t.n);
}

Status decodeCopy(Decoder &d, const fb::Instr &in, Thunk &t) {
  int64_t size = dtypeSize(d.ref(in, 1).dtype());
  t.bytes = d.numel(in, 1) * size;
  if (in.group() && in.group()->size()) {
    // This rank's block of X: Y holds 1/|group| of X (sequence shards).
    int64_t offset = 0, shards = 1;
    TESSERA_RETURN_IF_ERROR(d.vocabShard(in, d.numel(in, 1), offset, shards));
    if (d.numel(in, 0) != d.numel(in, 1) * shards)
      return invalidArgument("Copy of a shard: ", d.desc(in, 0), " must be ",
                             shards, " times ", d.desc(in, 1));
    if (t.ptr[0]) // null when validating without an arena
      t.ptr[0] = static_cast<uint8_t *>(t.ptr[0]) + offset * size;
    return Status();
  }
  return d.requireSameNumel(in, {0, 1});
}

Status runCopy(RunContext &x, const Thunk &t) {
  return x.backend().copy(t.ptr[0], t.ptr[1], t.bytes);
}

// i[0] and i[1]: the FloatFormats of X and Y.
Status decodeCast(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.i[0] = int64_t(floatFormat(d.floatType(in, 0)));
  t.i[1] = int64_t(floatFormat(d.floatType(in, 1)));
  return d.requireSameNumel(in, {0, 1});
}

Status runCast(RunContext &x, const Thunk &t) {
  return x.backend().cast(t.ptr[0], FloatFormat(t.i[0]), t.ptr[1],
                          FloatFormat(t.i[1]), t.n, t.beta);
}

} // namespace tessera::rt::ops
