//===- NNOps.cpp - nn dialect operations ----------------------------------===//
//
// Type inference, verifiers, backward rules (DifferentiableOpInterface) and
// tensor-parallel split rules (TPSplitOpInterface) of the nn ops.
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/IR/NNOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

#include "dialects/nn/IR/NNOpsDialect.cpp.inc"

void NNDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/nn/IR/NNOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static RankedTensorType f32Tensor(MLIRContext *ctx, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float32Type::get(ctx));
}

static LogicalResult inferError(std::optional<Location> loc, const Twine &msg) {
  if (loc)
    return emitError(*loc, msg);
  return failure();
}

/// True when two dimension sizes can be equal (either may be dynamic).
static bool dimsCompatible(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) || a == b;
}

//===----------------------------------------------------------------------===//
// LinearOp
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto w = cast<RankedTensorType>(adaptor.getWeight().getType());
  if (x.getRank() != 2 || w.getRank() != 2)
    return inferError(loc, "nn.linear expects a 2-d input and a 2-d weight");
  types.push_back(f32Tensor(ctx, {x.getDimSize(0), w.getDimSize(0)}));
  return success();
}

LogicalResult LinearOp::verify() {
  auto x = getInput().getType();
  auto w = getWeight().getType();
  if (!dimsCompatible(x.getDimSize(1), w.getDimSize(1)))
    return emitOpError() << "input features (" << x.getDimSize(1)
                         << ") do not match the weight's in-features ("
                         << w.getDimSize(1) << ")";
  if (Value b = getBias()) {
    auto bt = cast<RankedTensorType>(b.getType());
    if (bt.getRank() != 1 || !dimsCompatible(bt.getDimSize(0), w.getDimSize(0)))
      return emitOpError() << "bias must be 1-d of size " << w.getDimSize(0);
  }
  return success();
}

LogicalResult LinearOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                     ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &adj) {
  Value dy = resultAdj[0];
  Location loc = getLoc();
  adj.assign(getNumOperands(), Value());
  if (needed[0]) // dx = dy @ W
    adj[0] = MatmulOp::create(b, loc, dy, getWeight(), false, false);
  if (needed[1]) // dW = dy^T @ x
    adj[1] = MatmulOp::create(b, loc, dy, getInput(), true, false);
  if (getBias() && needed[2])
    adj[2] = ReduceRowsOp::create(b, loc, dy);
  return success();
}

FailureOr<int64_t> LinearOp::getSplitDims(TPSplitKind kind,
                                          SmallVectorImpl<int64_t> &dims,
                                          bool &partial) {
  dims.clear();
  switch (kind) {
  case TPSplitKind::Column:
    // Y_i = X W_i^T + b_i: weight and bias split along out-features.
    dims.append({-1, 0});
    if (getBias())
      dims.push_back(0);
    partial = false;
    return 1;
  case TPSplitKind::Row:
    // Y = sum_i X_i W_i^T: input split along features, weight along in.
    // A bias stays replicated and must be added after the reduction.
    dims.append({1, 1});
    if (getBias())
      dims.push_back(-1);
    partial = true;
    return -1;
  }
  return failure();
}

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto a = cast<RankedTensorType>(adaptor.getLhs().getType());
  auto b = cast<RankedTensorType>(adaptor.getRhs().getType());
  if (a.getRank() != 2 || b.getRank() != 2)
    return inferError(loc, "nn.matmul expects 2-d operands");
  bool ta = adaptor.getTransposeLhs(), tb = adaptor.getTransposeRhs();
  int64_t m = a.getDimSize(ta ? 1 : 0), ka = a.getDimSize(ta ? 0 : 1);
  int64_t kb = b.getDimSize(tb ? 1 : 0), n = b.getDimSize(tb ? 0 : 1);
  if (!dimsCompatible(ka, kb))
    return inferError(loc, "nn.matmul contraction sizes differ: " +
                               Twine(ka) + " vs " + Twine(kb));
  types.push_back(f32Tensor(ctx, {m, n}));
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise ops
//===----------------------------------------------------------------------===//

LogicalResult GeluOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                   ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = GeluGradOp::create(b, getLoc(), getInput(), resultAdj[0]);
  return success();
}

LogicalResult ReluOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                   ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = ReluGradOp::create(b, getLoc(), getInput(), resultAdj[0]);
  return success();
}

LogicalResult AddOp::buildAdjoint(OpBuilder &, ArrayRef<Value> resultAdj,
                                  ArrayRef<bool> needed,
                                  SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  for (int i = 0; i < 2; ++i)
    if (needed[i])
      adj[i] = resultAdj[0];
  return success();
}

// Elementwise ops run unchanged on a shard: the sharded dim carries over.
FailureOr<int64_t> GeluOp::propagateShardedDim(unsigned, int64_t dim) {
  return dim;
}
FailureOr<int64_t> ReluOp::propagateShardedDim(unsigned, int64_t dim) {
  return dim;
}
FailureOr<int64_t> AddOp::propagateShardedDim(unsigned, int64_t dim) {
  return dim;
}

// Elementwise ops have no split of their own: they follow their operands.
FailureOr<int64_t> GeluOp::getSplitDims(TPSplitKind, SmallVectorImpl<int64_t> &,
                                        bool &) {
  return failure();
}
FailureOr<int64_t> ReluOp::getSplitDims(TPSplitKind, SmallVectorImpl<int64_t> &,
                                        bool &) {
  return failure();
}
FailureOr<int64_t> AddOp::getSplitDims(TPSplitKind, SmallVectorImpl<int64_t> &,
                                       bool &) {
  return failure();
}

//===----------------------------------------------------------------------===//
// BiasAddOp
//===----------------------------------------------------------------------===//

LogicalResult BiasAddOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location>,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult BiasAddOp::verify() {
  auto x = getInput().getType();
  auto bias = getBias().getType();
  if (x.getRank() != 2 || bias.getRank() != 1 ||
      !dimsCompatible(x.getDimSize(1), bias.getDimSize(0)))
    return emitOpError() << "expects a [m, n] input and a [n] bias, got "
                         << x << " and " << bias;
  return success();
}

LogicalResult BiasAddOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                      ArrayRef<bool> needed,
                                      SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0])
    adj[0] = resultAdj[0];
  if (needed[1])
    adj[1] = ReduceRowsOp::create(b, getLoc(), resultAdj[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// SoftmaxCrossEntropyOp
//===----------------------------------------------------------------------===//

LogicalResult SoftmaxCrossEntropyOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto logits = cast<RankedTensorType>(adaptor.getLogits().getType());
  if (logits.getRank() != 2)
    return inferError(loc, "nn.softmax_cross_entropy expects 2-d logits");
  types.push_back(f32Tensor(ctx, {logits.getDimSize(0)}));
  return success();
}

LogicalResult SoftmaxCrossEntropyOp::verify() {
  auto logits = getLogits().getType();
  auto labels = getLabels().getType();
  if (labels.getRank() != 1 ||
      !dimsCompatible(labels.getDimSize(0), logits.getDimSize(0)))
    return emitOpError() << "labels must be 1-d with one label per row of the "
                            "logits, got "
                         << labels << " for " << logits;
  return success();
}

LogicalResult SoftmaxCrossEntropyOp::buildAdjoint(
    OpBuilder &b, ArrayRef<Value> resultAdj, ArrayRef<bool> needed,
    SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0])
    adj[0] = SoftmaxCrossEntropyGradOp::create(b, getLoc(), getLogits(),
                                               getLabels(), resultAdj[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// MeanOp, ReduceRowsOp, SoftmaxCrossEntropyGradOp
//===----------------------------------------------------------------------===//

LogicalResult MeanOp::inferReturnTypes(MLIRContext *ctx,
                                       std::optional<Location>, Adaptor,
                                       SmallVectorImpl<Type> &types) {
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult MeanOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                   ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = MeanGradOp::create(b, getLoc(), getInput().getType(), resultAdj[0]);
  return success();
}

LogicalResult ReduceRowsOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location> loc,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() != 2)
    return inferError(loc, "nn.reduce_rows expects a 2-d input");
  types.push_back(f32Tensor(ctx, {x.getDimSize(1)}));
  return success();
}

LogicalResult SoftmaxCrossEntropyGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getLogits().getType());
  return success();
}

#define GET_OP_CLASSES
#include "dialects/nn/IR/NNOps.cpp.inc"
