//===- MoEOps.cpp - nn dialect: mixture-of-experts ops ---------------------===//
//
// Verifiers, type inference, backward rules and costs of the ops of
// Megatron's MoE layer (TopKRouter, the load-balancing loss and its
// MoEAuxLossAutoScaler, token permutation, GroupedMLP, unpermutation).
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"

#include "mlir/IR/Builders.h"

#include <cmath>

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

/// The element count of a static shape (the verifiers checked it is one).
static int64_t numel(ShapedType t) {
  return t.hasStaticShape() ? t.getNumElements() : 0;
}

/// Tokens of a `[tokens..., k]` routing tensor, or -1 when dynamic.
static int64_t tokensOf(RankedTensorType routing) {
  if (!routing.hasStaticShape())
    return -1;
  return numel(routing) / std::max<int64_t>(1, routing.getShape().back());
}

//===----------------------------------------------------------------------===//
// MoERouterOp
//===----------------------------------------------------------------------===//

/// The shape of `t` with its last dimension replaced by `last`.
static RankedTensorType withLast(RankedTensorType t, int64_t last, Type element) {
  SmallVector<int64_t> shape(t.getShape());
  shape.back() = last;
  return RankedTensorType::get(shape, element);
}

LogicalResult MoERouterOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto logits = cast<RankedTensorType>(adaptor.getLogits().getType());
  if (logits.getRank() < 2)
    return emitOptionalError(loc, "nn.moe_router expects logits [tokens..., "
                                  "experts]");
  int64_t k = adaptor.getTopk();
  types.push_back(withLast(logits, k, Float32Type::get(ctx)));
  types.push_back(withLast(logits, k, IntegerType::get(ctx, 32)));
  return success();
}

LogicalResult MoERouterOp::verify() {
  auto logits = getLogits().getType();
  int64_t experts = logits.getShape().empty() ? 0 : logits.getShape().back();
  if (logits.getRank() < 2)
    return emitOpError() << "expects logits [tokens..., experts], got " << logits;
  if (getTopk() < 1 ||
      (!ShapedType::isDynamic(experts) && int64_t(getTopk()) > experts))
    return emitOpError() << "topk must be in [1, " << experts << "], got "
                         << getTopk();
  SmallVector<int64_t> want(logits.getShape());
  want.back() = getTopk();
  if (getProbs().getType().getShape() != ArrayRef<int64_t>(want) ||
      getIndices().getType().getShape() != ArrayRef<int64_t>(want))
    return emitOpError() << "probs and indices must be [tokens..., " << getTopk()
                         << "] for logits " << logits;
  return success();
}

LogicalResult MoERouterOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0] && resultAdj[0])
    adj[0] = MoERouterGradOp::create(b, getLoc(), getLogits().getType(),
                                     getProbs(), getIndices(), resultAdj[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// MoECapacityDropOp
//===----------------------------------------------------------------------===//

LogicalResult MoECapacityDropOp::verify() {
  if (getProbs().getType().getShape() != getIndices().getType().getShape())
    return emitOpError() << "probs " << getProbs().getType()
                         << " must match the indices " << getIndices().getType();
  if (!(getCapacityFactor().convertToFloat() > 0.0f) ||
      !std::isfinite(getCapacityFactor().convertToFloat()))
    return emitOpError() << "capacity_factor must be positive and finite, got "
                         << getCapacityFactor().convertToFloat();
  if (getDropPolicy() != "probs" && getDropPolicy() != "position")
    return emitOpError() << "drop_policy must be \"probs\" or \"position\", got \""
                         << getDropPolicy() << "\"";
  if (getNumExperts() < 1)
    return emitOpError() << "num_experts must be positive";
  return success();
}

LogicalResult MoECapacityDropOp::buildAdjoint(OpBuilder &b,
                                              ArrayRef<Value> resultAdj,
                                              ArrayRef<bool> needed,
                                              SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0] && resultAdj[0])
    adj[0] = MoECapacityDropGradOp::create(b, getLoc(), getProbs().getType(),
                                           resultAdj[0], getKeptIndices());
  return success();
}

//===----------------------------------------------------------------------===//
// MoEAuxLossOp, AddAuxLossOp
//===----------------------------------------------------------------------===//

LogicalResult MoEAuxLossOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location>, Adaptor,
                                             SmallVectorImpl<Type> &types) {
  types.push_back(RankedTensorType::get({}, Float32Type::get(ctx)));
  return success();
}

LogicalResult MoEAuxLossOp::verify() {
  const float coeff = getCoeff().convertToFloat();
  if (!(coeff >= 0.0f) || !std::isfinite(coeff))
    return emitOpError() << "coeff must be finite and >= 0, got " << coeff;
  if (!getCounts())
    return success();
  auto logits = cast<RankedTensorType>(getLogits().getType());
  auto counts = cast<RankedTensorType>(getCounts().getType());
  const int64_t experts = logits.getRank() ? logits.getShape().back() : 0;
  if (!ShapedType::isDynamic(experts) &&
      counts.getShape() != ArrayRef<int64_t>{experts})
    return emitOpError() << "expects counts [" << experts
                         << "] (one per expert), got " << counts;
  return success();
}

LogicalResult MoEAuxLossOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                         ArrayRef<bool> needed,
                                         SmallVectorImpl<Value> &adj) {
  adj.assign(getNumOperands(), Value());
  if (needed[0] && resultAdj[0])
    adj[0] = MoEAuxLossGradOp::create(b, getLoc(), getLogits().getType(),
                                      getLogits(), getIndices(), resultAdj[0],
                                      getCounts(), getCoeffAttr());
  return success();
}

LogicalResult MoETokenCountsOp::inferReturnTypes(MLIRContext *ctx,
                                                 std::optional<Location>,
                                                 Adaptor adaptor,
                                                 SmallVectorImpl<Type> &types) {
  types.push_back(RankedTensorType::get({int64_t(adaptor.getNumExperts())},
                                        Float32Type::get(ctx)));
  return success();
}

LogicalResult AddAuxLossOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location>,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult AddAuxLossOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                         ArrayRef<bool> needed,
                                         SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0])
    adj[0] = resultAdj[0];
  // MoEAuxLossAutoScaler: the auxiliary loss gets the loss's own gradient,
  // 1 / the number of microbatches (autodiff's seed), times the loss scale
  // under fp16 (set_loss_scale(loss_scale / num_microbatches)).
  if (needed[1]) {
    int64_t micro = getNumMicrobatches(getRootModule(*this));
    adj[1] = createLossSeed(b, getLoc(), getAux().getType(),
                            1.0f / float(std::max<int64_t>(1, micro)), *this);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// MoEDispatchOp, MoECombineOp
//===----------------------------------------------------------------------===//

/// Checks a token tensor `[tokens..., features]` against routing
/// `[tokens..., k]`: the same leading dimensions.
static LogicalResult checkTokens(Operation *op, RankedTensorType tokens,
                                 RankedTensorType routing, StringRef what) {
  if (tokens.getRank() != routing.getRank() ||
      tokens.getShape().drop_back() != routing.getShape().drop_back())
    return op->emitOpError() << what << " " << tokens
                             << " and the routing " << routing
                             << " must have the same tokens";
  return success();
}

/// Checks permuted rows `[tokens * k, features]` against routing.
static LogicalResult checkRows(Operation *op, RankedTensorType rows,
                               RankedTensorType routing, int64_t features) {
  int64_t tokens = tokensOf(routing);
  if (rows.getRank() != 2 ||
      (tokens >= 0 && rows.getDimSize(0) != tokens * routing.getShape().back()) ||
      rows.getDimSize(1) != features)
    return op->emitOpError() << "expects the permuted rows [tokens * k, "
                             << features << "] of routing " << routing
                             << ", got " << rows;
  return success();
}

LogicalResult MoEDispatchOp::inferReturnTypes(MLIRContext *ctx,
                                              std::optional<Location> loc,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto idx = cast<RankedTensorType>(adaptor.getIndices().getType());
  if (x.getRank() < 2 || idx.getRank() < 2)
    return emitOptionalError(loc, "nn.moe_dispatch expects tokens [tokens..., "
                                  "features] and routing [tokens..., k]");
  int64_t rows = idx.hasStaticShape() ? idx.getNumElements()
                                      : ShapedType::kDynamic;
  types.push_back(RankedTensorType::get({rows, x.getShape().back()},
                                        Float32Type::get(ctx)));
  types.push_back(RankedTensorType::get({int64_t(adaptor.getNumExperts())},
                                        IntegerType::get(ctx, 32)));
  return success();
}

LogicalResult MoEDispatchOp::verify() {
  auto x = getInput().getType(), idx = getIndices().getType();
  if (getNumExperts() < 1)
    return emitOpError() << "num_experts must be positive";
  if (failed(checkTokens(*this, x, idx, "input")) ||
      failed(checkRows(*this, getResult().getType(), idx,
                       x.getShape().back())))
    return failure();
  if (getCounts().getType().getShape() !=
      ArrayRef<int64_t>{int64_t(getNumExperts())})
    return emitOpError() << "counts must be [" << getNumExperts() << "]";
  return success();
}

LogicalResult MoEDispatchOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                          ArrayRef<bool> needed,
                                          SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0] && resultAdj[0])
    adj[0] = MoEDispatchGradOp::create(b, getLoc(), getInput().getType(),
                                       resultAdj[0], getIndices(),
                                       getNumExpertsAttr());
  return success();
}

LogicalResult MoECombineOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location> loc,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  auto rows = cast<RankedTensorType>(adaptor.getInput().getType());
  auto probs = cast<RankedTensorType>(adaptor.getProbs().getType());
  if (rows.getRank() != 2 || probs.getRank() < 2)
    return emitOptionalError(loc, "nn.moe_combine expects rows [n, features] "
                                  "and routing [tokens..., k]");
  types.push_back(withLast(probs, rows.getDimSize(1), Float32Type::get(ctx)));
  return success();
}

LogicalResult MoECombineOp::verify() {
  auto idx = getIndices().getType(), y = getResult().getType();
  if (getProbs().getType().getShape() != idx.getShape())
    return emitOpError() << "probs " << getProbs().getType()
                         << " must match the indices " << idx;
  if (failed(checkTokens(*this, y, idx, "result")) ||
      failed(checkRows(*this, getInput().getType(), idx, y.getShape().back())))
    return failure();
  return success();
}

LogicalResult MoECombineOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                         ArrayRef<bool> needed,
                                         SmallVectorImpl<Value> &adj) {
  adj.assign(3, Value());
  if (!resultAdj[0])
    return success();
  auto grad = MoECombineGradOp::create(
      b, getLoc(), getInput().getType(), getProbs().getType(), getInput(),
      getProbs(), getIndices(), resultAdj[0], getNumExpertsAttr());
  if (needed[0])
    adj[0] = grad.getInputGrad();
  if (needed[1])
    adj[1] = grad.getProbsGrad();
  return success();
}

//===----------------------------------------------------------------------===//
// GroupedLinearOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedLinearOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto w = cast<RankedTensorType>(adaptor.getWeight().getType());
  if (x.getRank() != 2 || w.getRank() < 3 || w.getRank() > 4)
    return emitOptionalError(loc, "nn.grouped_linear expects rows [n, in] and "
                                  "weights [experts, out, in] or stacked "
                                  "[experts, k, out, in]");
  types.push_back(RankedTensorType::get(
      {x.getDimSize(0), groupedOutFeatures(w)}, Float32Type::get(ctx)));
  return success();
}

int64_t tessera::nn::groupedOutFeatures(RankedTensorType weight) {
  return linearOutFeatures(RankedTensorType::get(
      weight.getShape().drop_front(), weight.getElementType()));
}

/// `expected_rows`, when given, is at most the input's rows.
static LogicalResult verifyExpectedRows(Operation *op, RankedTensorType x,
                                        std::optional<uint64_t> expected) {
  if (expected &&
      (int64_t(*expected) < 0 || int64_t(*expected) > x.getDimSize(0)))
    return op->emitOpError()
           << "expected_rows " << int64_t(*expected)
           << " must be in [0, " << x.getDimSize(0) << "] (the input's rows)";
  return success();
}

LogicalResult GroupedLinearOp::verify() {
  auto x = getInput().getType(), w = getWeight().getType();
  if (failed(verifyGemmOperands(*this, x, w)))
    return failure();
  if (x.getDimSize(1) != w.getDimSize(w.getRank() - 1))
    return emitOpError() << "rows " << x << " do not match the weights " << w
                         << " (in features)";
  if (getCounts().getType().getShape() != ArrayRef<int64_t>{w.getDimSize(0)})
    return emitOpError() << "counts must be [" << w.getDimSize(0)
                         << "], one per expert";
  return verifyExpectedRows(*this, x, getExpectedRows());
}

LogicalResult GroupedLinearOp::buildAdjoint(OpBuilder &b,
                                            ArrayRef<Value> resultAdj,
                                            ArrayRef<bool> needed,
                                            SmallVectorImpl<Value> &adj) {
  adj.assign(getNumOperands(), Value());
  if (!resultAdj[0])
    return success();
  // 16-bit GEMMs: dy rounded to the weight's dtype for both products, as
  // nn.linear's rule.
  Value dy = castElements(b, getLoc(), resultAdj[0],
                          getWeight().getType().getElementType());
  auto grad = GroupedLinearGradOp::create(b, getLoc(), getInput(), getCounts(),
                                          getWeight(), dy,
                                          getExpectedRowsAttr());
  if (needed[0])
    adj[0] = grad.getInputGrad();
  if (needed[2])
    adj[2] = grad.getWeightGrad();
  return success();
}

LogicalResult GroupedLinearGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  Type f32 = Float32Type::get(ctx);
  for (Value v : {adaptor.getInput(), adaptor.getWeight()})
    types.push_back(RankedTensorType::get(
        cast<RankedTensorType>(v.getType()).getShape(), f32));
  return success();
}

LogicalResult GroupedLinearGradOp::verify() {
  auto x = getInput().getType(), w = getWeight().getType();
  auto dy = getResultGrad().getType();
  if (failed(verifyGemmOperands(*this, x, w)) ||
      failed(verifyGemmOperands(*this, w, dy)))
    return failure();
  if (x.getRank() != 2 || w.getRank() < 3 || w.getRank() > 4 ||
      dy.getRank() != 2 || x.getDimSize(1) != w.getDimSize(w.getRank() - 1) ||
      dy.getShape() !=
          ArrayRef<int64_t>{x.getDimSize(0), groupedOutFeatures(w)})
    return emitOpError() << "expects rows [n, in], weights [experts, out, in] "
                            "(or stacked [experts, k, out, in]) and their "
                            "result's gradient [n, out], got "
                         << x << ", " << w << " and " << dy;
  return verifyExpectedRows(*this, x, getExpectedRows());
}

/// The rows a grouped linear computes on: `expected_rows` where the input
/// has room for more.
static int64_t countedRows(RankedTensorType x, std::optional<uint64_t> expected) {
  return expected ? std::min<int64_t>(int64_t(*expected), x.getDimSize(0))
                  : x.getDimSize(0);
}

int64_t GroupedLinearOp::getFlops() {
  auto x = getInput().getType(), w = getWeight().getType();
  return 2 * countedRows(x, getExpectedRows()) * x.getDimSize(1) *
         groupedOutFeatures(w);
}

int64_t GroupedLinearGradOp::getFlops() {
  auto x = getInput().getType(), w = getWeight().getType();
  return 4 * countedRows(x, getExpectedRows()) * x.getDimSize(1) *
         groupedOutFeatures(w);
}
