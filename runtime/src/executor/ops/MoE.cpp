//===- MoE.cpp - Mixture-of-experts opcodes -------------------------------===//
//
// Decode and run functions (Ops.h) of the mixture-of-experts kernels:
// Megatron's TopKRouter (softmax top-k, its load-balancing loss over local
// or all ranks' counts), capacity-based token dropping, the permutation of
// tokens into expert order and back (the dispatcher's permute/unpermute,
// weighted by the routing probabilities) and the grouped GEMM of the
// experts (Megatron's GroupedMLP; a stacked [E, 2, F, H] weight for SwiGLU
// experts). Expert parallelism's exchanges are in ExpertParallel.cpp.
// Integer parameters: i = [tokens, experts, k, features].
//
//===----------------------------------------------------------------------===//

#include "Ops.h"

#include <cmath>

namespace tessera::rt::ops {

static void setDims(Thunk &t, int64_t tokens, int64_t experts, int64_t k,
                    int64_t features) {
  t.i[0] = tokens;
  t.i[1] = experts;
  t.i[2] = k;
  t.i[3] = features;
}

/// Operand i holds tokens x width elements, `what` naming the width.
static Status requirePerToken(Decoder &d, const fb::Instr &in, int i,
                              int64_t tokens, int64_t width, const char *what) {
  if (d.numel(in, i) != tokens * width)
    return invalidArgument("operand ", i, " ", d.desc(in, i), " must hold ",
                           tokens, " tokens x ", width, " ", what);
  return Status();
}

/// Operand i holds k >= 1 routing choices per token; k into `k`.
static Status routing(Decoder &d, const fb::Instr &in, int i, int64_t tokens,
                      int64_t &k) {
  k = tokens > 0 ? d.numel(in, i) / tokens : d.lastDim(in, i);
  if (k < 1 || d.numel(in, i) != tokens * k)
    return invalidArgument("routing ", d.desc(in, i),
                           " must hold k >= 1 choices for each of ",
                           tokens, " tokens");
  return Status();
}

static Status requirePositiveExperts(int64_t experts) {
  if (experts < 1)
    return invalidArgument("the number of experts must be positive, got ",
                           experts);
  return Status();
}

//===----------------------------------------------------------------------===//
// Router and load-balancing loss
//===----------------------------------------------------------------------===//

/// MoERouter [logits, probs, indices] and MoERouterGrad [probs, indices,
/// dprobs, dlogits].
static Status decodeRouterOp(Decoder &d, const fb::Instr &in, Thunk &t,
                             bool grad) {
  const int logits = grad ? 3 : 0, probs = grad ? 0 : 1;
  const int64_t k = d.lastDim(in, probs);
  const int64_t tokens = k > 0 ? d.numel(in, probs) / k : 0;
  const int64_t experts = d.lastDim(in, logits);
  TESSERA_RETURN_IF_ERROR(
      requirePerToken(d, in, logits, tokens, experts, "experts' logits"));
  TESSERA_RETURN_IF_ERROR(grad ? d.requireSameNumel(in, {0, 1, 2})
                               : d.requireSameNumel(in, {1, 2}));
  if (k < 1 || k > experts)
    return invalidArgument("router topk ", k, " must be in [1, ", experts, "]");
  setDims(t, tokens, experts, k, 0);
  return Status();
}

Status decodeMoERouter(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRouterOp(d, in, t, false);
}

Status runMoERouter(RunContext &x, const Thunk &t) {
  return x.backend().moeRouter(f32(t, 0), f32(t, 1), i32(t, 2), t.i[0], t.i[1],
                               t.i[2]);
}

Status decodeMoERouterGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeRouterOp(d, in, t, true);
}

Status runMoERouterGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeRouterGrad(f32(t, 0), i32(t, 1), f32(t, 2), f32(t, 3),
                                   t.i[0], t.i[1], t.i[2]);
}

/// MoEAuxLoss [logits, indices, y], MoEAuxLossGrad [logits, indices, dy,
/// dlogits], and over all ranks' counts C: MoEAuxLossOver [logits, indices,
/// C, y], MoEAuxLossOverGrad [logits, indices, dy, C, dlogits].
static Status decodeAuxLossOp(Decoder &d, const fb::Instr &in, Thunk &t,
                              bool over, bool grad) {
  const int y = over && !grad ? 3 : 2, counts = grad ? 3 : 2;
  const int64_t experts = d.lastDim(in, 0);
  const int64_t tokens = experts > 0 ? d.numel(in, 0) / experts : 0;
  int64_t k = 0;
  TESSERA_RETURN_IF_ERROR(routing(d, in, 1, tokens, k));
  if (over && d.numel(in, counts) != experts)
    return invalidArgument("counts ", d.desc(in, counts),
                           " must hold one for each of ", experts, " experts");
  if (d.numel(in, y) != 1)
    return invalidArgument(grad ? "dy " : "y ", d.desc(in, y),
                           " must be a scalar");
  if (grad)
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, over ? 4 : 3}));
  setDims(t, tokens, experts, k, 0);
  return Status();
}

Status decodeMoEAuxLoss(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAuxLossOp(d, in, t, false, false);
}

Status runMoEAuxLoss(RunContext &x, const Thunk &t) {
  return x.backend().moeAuxLoss(f32(t, 0), i32(t, 1), nullptr, f32(t, 2),
                                t.i[0], t.i[1], t.i[2], t.f[0]);
}

Status decodeMoEAuxLossGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAuxLossOp(d, in, t, false, true);
}

Status runMoEAuxLossGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeAuxLossGrad(f32(t, 0), i32(t, 1), nullptr, f32(t, 2),
                                    f32(t, 3), t.i[0], t.i[1], t.i[2], t.f[0]);
}

Status decodeMoEAuxLossOver(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAuxLossOp(d, in, t, true, false);
}

Status runMoEAuxLossOver(RunContext &x, const Thunk &t) {
  return x.backend().moeAuxLoss(f32(t, 0), i32(t, 1), f32(t, 2), f32(t, 3),
                                t.i[0], t.i[1], t.i[2], t.f[0]);
}

Status decodeMoEAuxLossOverGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeAuxLossOp(d, in, t, true, true);
}

Status runMoEAuxLossOverGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeAuxLossGrad(f32(t, 0), i32(t, 1), f32(t, 3), f32(t, 2),
                                    f32(t, 4), t.i[0], t.i[1], t.i[2], t.f[0]);
}

// [indices, counts]: m = the choices, i[1] = the experts.
Status decodeMoETokenCounts(Decoder &d, const fb::Instr &in, Thunk &t) {
  t.m = d.numel(in, 0);
  t.i[1] = d.numel(in, 1);
  return Status();
}

Status runMoETokenCounts(RunContext &x, const Thunk &t) {
  return x.backend().moeTokenCounts(i32(t, 0), f32(t, 1), t.m, t.i[1]);
}

//===----------------------------------------------------------------------===//
// Token dropping
//===----------------------------------------------------------------------===//

// [probs, indices, P, I], every operand [tokens..., k]; iattrs [experts,
// policy: 0 probs, 1 position], fattrs [capacity factor]: m = the
// capacity, k = the policy.
Status decodeMoECapacityDrop(Decoder &d, const fb::Instr &in, Thunk &t) {
  const int64_t k = d.lastDim(in, 0);
  const int64_t tokens = k > 0 ? d.numel(in, 0) / k : 0;
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1, 2, 3}));
  const int64_t experts = d.iattr(in, 0);
  TESSERA_RETURN_IF_ERROR(requirePositiveExperts(experts));
  const double factor = in.fattrs()->Get(0);
  if (!(factor > 0.0))
    return invalidArgument("the capacity factor must be positive, got ",
                           factor);
  // Megatron's get_capacity: ceil(tokens * k / experts * factor).
  t.m = int64_t(std::ceil(double(tokens * k) / double(experts) * factor));
  t.k = d.iattr(in, 1);
  setDims(t, tokens, experts, k, 0);
  return Status();
}

Status runMoECapacityDrop(RunContext &x, const Thunk &t) {
  return x.backend().moeCapacityDrop(f32(t, 0), i32(t, 1), f32(t, 2), i32(t, 3),
                                     t.i[0], t.i[2], t.i[1], t.m, t.k != 0);
}

// [dKept, I, dP]
Status decodeMoECapacityDropGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 1, 2}));
  t.n = d.numel(in, 0);
  return Status();
}

Status runMoECapacityDropGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeCapacityDropGrad(f32(t, 0), i32(t, 1), f32(t, 2), t.n);
}

//===----------------------------------------------------------------------===//
// Permutation into expert order and back
//===----------------------------------------------------------------------===//

/// MoEDispatch [X, indices, rows, counts] and MoEDispatchGrad [drows,
/// indices, dX] (iattrs [experts]).
static Status decodeDispatchOp(Decoder &d, const fb::Instr &in, Thunk &t,
                               bool grad) {
  const int x = grad ? 2 : 0, rows = grad ? 0 : 2;
  const int64_t features = d.lastDim(in, x);
  const int64_t tokens = features > 0 ? d.numel(in, x) / features : 0;
  int64_t k = 0;
  TESSERA_RETURN_IF_ERROR(routing(d, in, 1, tokens, k));
  TESSERA_RETURN_IF_ERROR(
      requirePerToken(d, in, rows, tokens * k, features, "features"));
  const int64_t experts = grad ? d.iattr(in, 0) : d.numel(in, 3);
  TESSERA_RETURN_IF_ERROR(requirePositiveExperts(experts));
  setDims(t, tokens, experts, k, features);
  return Status();
}

Status decodeMoEDispatch(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeDispatchOp(d, in, t, false);
}

Status runMoEDispatch(RunContext &x, const Thunk &t) {
  return x.backend().moeDispatch(f32(t, 0), i32(t, 1), f32(t, 2), i32(t, 3),
                                 t.i[0], t.i[2], t.i[1], t.i[3]);
}

Status decodeMoEDispatchGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeDispatchOp(d, in, t, true);
}

Status runMoEDispatchGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeDispatchGrad(f32(t, 0), i32(t, 1), f32(t, 2), t.i[0],
                                     t.i[2], t.i[1], t.i[3]);
}

/// MoECombine [rows, probs, indices, Y] and MoECombineGrad [rows, probs,
/// indices, dY, drows, dprobs] (iattrs [experts]).
static Status decodeCombineOp(Decoder &d, const fb::Instr &in, Thunk &t,
                              bool grad) {
  const int64_t features = d.lastDim(in, 3);
  const int64_t tokens = features > 0 ? d.numel(in, 3) / features : 0;
  int64_t k = 0;
  TESSERA_RETURN_IF_ERROR(routing(d, in, 2, tokens, k));
  TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {1, 2}));
  TESSERA_RETURN_IF_ERROR(
      requirePerToken(d, in, 0, tokens * k, features, "features"));
  if (grad) {
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 4}));
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {1, 5}));
  }
  const int64_t experts = d.iattr(in, 0);
  TESSERA_RETURN_IF_ERROR(requirePositiveExperts(experts));
  setDims(t, tokens, experts, k, features);
  return Status();
}

Status decodeMoECombine(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCombineOp(d, in, t, false);
}

Status runMoECombine(RunContext &x, const Thunk &t) {
  return x.backend().moeCombine(f32(t, 0), f32(t, 1), i32(t, 2), f32(t, 3),
                                t.i[0], t.i[2], t.i[1], t.i[3]);
}

Status decodeMoECombineGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeCombineOp(d, in, t, true);
}

Status runMoECombineGrad(RunContext &x, const Thunk &t) {
  return x.backend().moeCombineGrad(f32(t, 0), f32(t, 1), i32(t, 2), f32(t, 3),
                                    f32(t, 4), f32(t, 5), t.i[0], t.i[2],
                                    t.i[1], t.i[3]);
}

//===----------------------------------------------------------------------===//
// Grouped GEMM
//===----------------------------------------------------------------------===//

/// GroupedLinear [X, counts, W, Y] and GroupedLinearGrad [X, counts, W, dY,
/// dX, dW]: m rows, n out, k in, i[1] experts. A stacked [experts, 2, out,
/// in] weight (SwiGLU experts) has 2 out out-features.
static Status decodeGroupedLinearOp(Decoder &d, const fb::Instr &in, Thunk &t,
                                    bool grad) {
  const auto *w = d.ref(in, 2).shape();
  if (!w || w->size() < 3 || w->size() > 4)
    return invalidArgument("W ", d.desc(in, 2),
                           " must be [experts, out, in] or [experts, k, out, "
                           "in]");
  const int64_t experts = w->Get(0);
  t.k = w->Get(w->size() - 1);
  t.n = w->Get(1) * (w->size() == 4 ? w->Get(2) : 1);
  if (d.numel(in, 1) != experts)
    return invalidArgument("counts ", d.desc(in, 1),
                           " must have one element per expert (", experts, ")");
  t.m = t.k > 0 ? d.numel(in, 0) / t.k : 0;
  TESSERA_RETURN_IF_ERROR(
      requirePerToken(d, in, 0, t.m, t.k, "input features"));
  TESSERA_RETURN_IF_ERROR(
      requirePerToken(d, in, 3, t.m, t.n, "output features"));
  if (grad) {
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {0, 4}));
    TESSERA_RETURN_IF_ERROR(d.requireSameNumel(in, {2, 5}));
  }
  // The float inputs share a dtype (the validator's SameFloatDType).
  t.type = d.floatType(in, 0);
  setDims(t, 0, experts, 0, 0);
  return Status();
}

Status decodeGroupedLinear(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeGroupedLinearOp(d, in, t, false);
}

Status runGroupedLinear(RunContext &x, const Thunk &t) {
  return x.backend().groupedLinear(floatFormat(t), t.ptr[0], i32(t, 1),
                                   t.ptr[2], f32(t, 3), t.m, t.k, t.n, t.i[1]);
}

Status decodeGroupedLinearGrad(Decoder &d, const fb::Instr &in, Thunk &t) {
  return decodeGroupedLinearOp(d, in, t, true);
}

Status runGroupedLinearGrad(RunContext &x, const Thunk &t) {
  return x.backend().groupedLinearGrad(floatFormat(t), t.ptr[0], i32(t, 1),
                                       t.ptr[2], t.ptr[3], f32(t, 4), f32(t, 5),
                                       t.m, t.k, t.n, t.i[1], t.beta);
}

} // namespace tessera::rt::ops
