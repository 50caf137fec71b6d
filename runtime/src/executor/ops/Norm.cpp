//===- Norm.cpp - LayerNorm, RMSNorm and QK-norm opcodes ------------------===//
//
// Decode and run functions (Ops.h) of the normalisations: Megatron's
// LayerNorm and RMSNorm over the last dimension (statistics in f32), each
// also fused with the residual add before it (S = A + B, Y = norm(S)), and
// QK-norm (RMSNorm of each query and key head of a grouped QKV, Megatron's
// q_layernorm and k_layernorm). fattrs [eps].
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

namespace tessera::rt::ops {

/// Rows and columns of X (operand 0) into t.m, t.n; the operands in
/// `sameAsX` are X's size and those in `perColumn` (named) one per column.
static Status
decodeNorm(Decoder &d, const fb::Instr &in, Thunk &t,
           std::initializer_list<int> sameAsX,
           std::initializer_list<std::pair<int, const char *>> perColumn) {
  TESSERA_ASSIGN_OR_RETURN(Matrix x, d.rowsCols(in, 0));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, sameAsX));
  for (auto [i, what] : perColumn)
    TESSERA_RETURN_IF_ERROR(d.requireNumel(in, i, x.cols, what));
  t.m = x.rows;
  t.n = x.cols;
  return Status();
}

//===----------------------------------------------------------------------===//
// LayerNorm
//===----------------------------------------------------------------------===//

// [X, gamma, beta, Y]
Status decodeLayerNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 3}, {{1, "gamma"}, {2, "beta"}});
}

Status runLayerNorm(RunContext &x, const Thunk &t) {
  return x.backend().layerNorm(floatIn(t, 0), f32(t, 1), f32(t, 2),
                               floatOut(t, 3), t.m, t.n, t.f[0]);
}

// [X, gamma, dY, dX, dgamma, dbeta]
Status decodeLayerNormGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 2, 3},
                    {{1, "gamma"}, {4, "dgamma"}, {5, "dbeta"}});
}

Status runLayerNormGrad(RunContext &x, const Thunk &t) {
  return x.backend().layerNormGrad(floatIn(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                   f32(t, 4), f32(t, 5), t.m, t.n, t.f[0],
                                   t.beta);
}

// [A, B, gamma, beta, S, Y]
Status decodeAddLayerNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 1, 4, 5}, {{2, "gamma"}, {3, "beta"}});
}

Status runAddLayerNorm(RunContext &x, const Thunk &t) {
  return x.backend().addLayerNorm(f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                  f32(t, 4), floatOut(t, 5), t.m, t.n, t.f[0]);
}

// [X, gamma, dY, dR, dX, dgamma, dbeta]
Status decodeAddLayerNormGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 2, 3, 4},
                    {{1, "gamma"}, {5, "dgamma"}, {6, "dbeta"}});
}

Status runAddLayerNormGrad(RunContext &x, const Thunk &t) {
  return x.backend().addLayerNormGrad(f32(t, 0), f32(t, 1), f32(t, 2),
                                      f32(t, 3), f32(t, 4), f32(t, 5),
                                      f32(t, 6), t.m, t.n, t.f[0], t.beta);
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

// [X, gamma, Y]
Status decodeRMSNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 2}, {{1, "gamma"}});
}

Status runRMSNorm(RunContext &x, const Thunk &t) {
  return x.backend().rmsNorm(floatIn(t, 0), f32(t, 1), floatOut(t, 2), t.m, t.n,
                             t.f[0]);
}

// [X, gamma, dY, dX, dgamma]
Status decodeRMSNormGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 2, 3}, {{1, "gamma"}, {4, "dgamma"}});
}

Status runRMSNormGrad(RunContext &x, const Thunk &t) {
  return x.backend().rmsNormGrad(floatIn(t, 0), f32(t, 1), f32(t, 2), nullptr,
                                 f32(t, 3), f32(t, 4), t.m, t.n, t.f[0],
                                 t.beta);
}

// [A, B, gamma, S, Y]
Status decodeAddRMSNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 1, 3, 4}, {{2, "gamma"}});
}

Status runAddRMSNorm(RunContext &x, const Thunk &t) {
  return x.backend().addRmsNorm(f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                floatOut(t, 4), t.m, t.n, t.f[0]);
}

// [X, gamma, dY, dR, dX, dgamma]: dR, the residual's gradient, adds to dX.
Status decodeAddRMSNormGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeNorm(d, in, t, {0, 2, 3, 4}, {{1, "gamma"}, {5, "dgamma"}});
}

Status runAddRMSNormGrad(RunContext &x, const Thunk &t) {
  return x.backend().rmsNormGrad(f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                 f32(t, 4), f32(t, 5), t.m, t.n, t.f[0],
                                 t.beta);
}

//===----------------------------------------------------------------------===//
// QK-norm
//===----------------------------------------------------------------------===//

/// QKNorm [X, wq, wk, Y] and QKNormGrad [X, wq, wk, dY, dX, dwq, dwk]; the
/// weights are [head_dim].
static Status decodeQKNormOp(Decoder &d, const fb::Instr &in, Thunk &t,
                             bool grad) {
  TESSERA_RETURN_IF_ERROR(decodeGroupedQkv(d, in, 0, t));
  const int64_t headDim = t.n;
  const int weights[] = {1, 2, 5, 6};
  for (int w = 0; w < (grad ? 4 : 2); ++w)
    if (const int i = weights[w]; d.numel(in, i) != headDim)
      return invalidArgument("operand ", i, " ", d.desc(in, i),
                             " must hold head_dim = ", headDim, " weights");
  TESSERA_RETURN_IF_ERROR(grad ? d.requireSameNumel(in, {0, 3, 4})
                               : d.requireSameNumel(in, {0, 3}));
  t.f[0] = in.fattrs()->Get(0);
  return Status();
}

Status decodeQKNorm(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeQKNormOp(d, in, t, false);
}

Status runQKNorm(RunContext &x, const Thunk &t) {
  return x.backend().qkNorm(f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3), t.m,
                            t.i[0], t.i[1], t.n, t.f[0]);
}

Status decodeQKNormGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeQKNormOp(d, in, t, true);
}

Status runQKNormGrad(RunContext &x, const Thunk &t) {
  return x.backend().qkNormGrad(f32(t, 0), f32(t, 1), f32(t, 2), f32(t, 3),
                                f32(t, 4), f32(t, 5), f32(t, 6), t.m, t.i[0],
                                t.i[1], t.n, t.f[0], t.beta);
}

} // namespace tessera::rt::ops
