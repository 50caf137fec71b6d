//===- NNOps.cpp - nn dialect operations ----------------------------------===//
//
// Type inference, verifiers, backward rules (DifferentiableOpInterface) and
// tensor-parallel split rules (TPSplitOpInterface) of the nn ops.
//
//===----------------------------------------------------------------------===//

#include "dialects/nn/IR/NNOps.h"
#include "tessera/Support/Model.h"
#include "tessera/rt/Runs.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpImplementation.h"

#include <cmath>

using namespace mlir;
using namespace tessera;
using namespace tessera::nn;

#include "dialects/nn/IR/NNEnums.cpp.inc"
#include "dialects/nn/IR/NNOpsDialect.cpp.inc"

void NNDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/nn/IR/NNOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Attributes: nn.param, nn.init, nn.input, nn.batch_dim, nn.layer,
// nn.recompute, nn.recompute_in_backward, nn.stored_activation
//===----------------------------------------------------------------------===//

namespace {
using namespace attr_check;
using attr_site::AnyOp;
using attr_site::Argument;

/// `<kind>` or `<kind>:<scale>`, as tessera-serialize reads it.
std::string initSpec(Attribute attr, Type) {
  auto s = dyn_cast_if_present<StringAttr>(attr);
  if (s) {
    auto [kind, scale] = s.getValue().split(':');
    double value;
    if (symbolizeInitKind(kind) &&
        (!s.getValue().contains(':') || !scale.getAsDouble(value)))
      return "";
  }
  return "an init spec: \"normal:<std>\", \"uniform:<a>\", \"zeros\", "
         "\"ones\" or \"data\"";
}

const AttrContract kNNAttrs[] = {
    {kParamAttr, Argument, nonEmptyString},
    {kInitAttr, Argument, initSpec},
    {kInputAttr, Argument,
     enumString<InputKind, symbolizeInputKind, getMaxEnumValForInputKind>},
    {kBatchDimAttr, Argument, dimensionOf},
    {kLayerAttr, AnyOp, nonNegativeInt},
    {kRecomputeAttr, AnyOp, nonNegativeInt},
    {kRecomputeInBackwardAttr, AnyOp, unit},
    {kStoredActivationAttr, AnyOp, unit},
};
} // namespace

LogicalResult NNDialect::verifyOperationAttribute(Operation *op,
                                                  NamedAttribute attr) {
  return verifyAttr(kNNAttrs, op, attr);
}

LogicalResult NNDialect::verifyRegionArgAttribute(Operation *op, unsigned,
                                                  unsigned argIndex,
                                                  NamedAttribute attr) {
  return verifyAttr(kNNAttrs, op, attr, attr_site::Argument, argIndex);
}

LogicalResult NNDialect::verifyRegionResultAttribute(Operation *op, unsigned,
                                                     unsigned resultIndex,
                                                     NamedAttribute attr) {
  return verifyAttr(kNNAttrs, op, attr, attr_site::Result, resultIndex);
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
  if (x.getRank() < 2 || w.getRank() < 2 || w.getRank() > 3)
    return inferError(loc, "nn.linear expects an input of rank >= 2 and a "
                           "[out, in] or stacked [k, out, in] weight");
  SmallVector<int64_t> shape(x.getShape().drop_back());
  shape.push_back(linearOutFeatures(w));
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

int64_t tessera::nn::linearOutFeatures(RankedTensorType weight) {
  int64_t out = 1;
  for (int64_t d : weight.getShape().drop_back()) {
    if (ShapedType::isDynamic(d))
      return ShapedType::kDynamic;
    out *= d;
  }
  return out;
}

Value tessera::nn::castElements(OpBuilder &b, Location loc, Value v,
                                Type element) {
  auto t = cast<RankedTensorType>(v.getType());
  if (t.getElementType() == element)
    return v;
  return CastOp::create(b, loc, RankedTensorType::get(t.getShape(), element),
                        v);
}

LogicalResult tessera::nn::verifyGemmOperands(Operation *op, Type a, Type b) {
  Type ea = cast<RankedTensorType>(a).getElementType();
  Type eb = cast<RankedTensorType>(b).getElementType();
  if (ea != eb)
    return op->emitOpError() << "operands must be both f32, both bf16 or both f16, got "
                             << a << " and " << b
                             << " (cast one with nn.cast)";
  return success();
}

LogicalResult LinearOp::verify() {
  auto x = getInput().getType();
  auto w = getWeight().getType();
  if (failed(verifyGemmOperands(*this, x, w)))
    return failure();
  if (w.getRank() < 2 || w.getRank() > 3)
    return emitOpError() << "expects a [out, in] or stacked [k, out, in] "
                            "weight, got "
                         << w;
  int64_t in = w.getDimSize(w.getRank() - 1);
  if (!dimsCompatible(x.getDimSize(x.getRank() - 1), in))
    return emitOpError() << "input features (" << x.getDimSize(x.getRank() - 1)
                         << ") do not match the weight's in-features (" << in
                         << ")";
  if (Value b = getBias()) {
    auto bt = cast<RankedTensorType>(b.getType());
    ArrayRef<int64_t> out = w.getShape().drop_back();
    if (bt.getRank() != int64_t(out.size()) ||
        !llvm::all_of(llvm::zip(bt.getShape(), out), [](auto p) {
          return dimsCompatible(std::get<0>(p), std::get<1>(p));
        })) {
      InFlightDiagnostic d = emitOpError() << "bias must be of shape [";
      llvm::interleaveComma(out, d);
      return d << "] (the weight's without its in-features), got " << bt;
    }
  }
  return success();
}

LogicalResult LinearOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                     ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &adj) {
  Value dy = resultAdj[0];
  Location loc = getLoc();
  adj.assign(getNumOperands(), Value());
  // 16-bit GEMMs: the backward's products take dy rounded to the weight's
  // bf16 or f16 too (Megatron's dgrad and wgrad GEMMs on bf16 or fp16
  // tensors; under fp16 the loss scale keeps dy in f16's range), accumulating in f32
  // (the wgrad into fp32 main_grad); the bias gradient sums dy itself.
  Value gemmDy =
      needed[0] || needed[1]
          ? castElements(b, loc, dy, getWeight().getType().getElementType())
          : dy;
  if (needed[0]) // dx = dy @ W
    adj[0] = MatmulOp::create(b, loc, gemmDy, getWeight(), false, false);
  // A stacked weight's and bias's gradients take their shapes (the same
  // elements as the [k * out, in] and [k * out] products).
  if (needed[1]) // dW = dy^T @ x
    adj[1] = MatmulOp::create(b, loc, f32Tensor(getContext(),
                                                getWeight().getType().getShape()),
                              gemmDy, getInput(), true, false);
  if (getBias() && needed[2])
    adj[2] = ReduceRowsOp::create(b, loc, getBias().getType(), dy);
  return success();
}

FailureOr<int64_t> LinearOp::getSplitDims(TPSplitKind kind,
                                          SmallVectorImpl<int64_t> &dims,
                                          bool &partial) {
  dims.clear();
  switch (kind) {
  case TPSplitKind::Column:
    // Y_i = X W_i^T + b_i: weight and bias split along out-features (of
    // each stacked projection: [k, out, in] splits `out`).
    dims.append({-1, getWeight().getType().getRank() - 2});
    if (getBias())
      dims.push_back(getBias().getType().getRank() - 1);
    partial = false;
    return getInput().getType().getRank() - 1;
  case TPSplitKind::Vocab:
    return failure();
  case TPSplitKind::Row:
    // Y = sum_i X_i W_i^T: input split along features, weight along in.
    // A bias stays replicated and must be added after the reduction.
    if (getWeight().getType().getRank() != 2)
      return failure();
    dims.append({getInput().getType().getRank() - 1, 1});
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

/// Rows and columns of `t` viewed as a matrix: leading dims flattened.
static std::pair<int64_t, int64_t> asMatrix(RankedTensorType t) {
  int64_t rows = 1;
  for (int64_t d : t.getShape().drop_back()) {
    if (ShapedType::isDynamic(d))
      return {ShapedType::kDynamic, t.getShape().back()};
    rows *= d;
  }
  return {rows, t.getShape().back()};
}

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto a = cast<RankedTensorType>(adaptor.getLhs().getType());
  auto b = cast<RankedTensorType>(adaptor.getRhs().getType());
  if (a.getRank() < 2 || b.getRank() < 2)
    return inferError(loc, "nn.matmul expects operands of rank >= 2");
  bool ta = adaptor.getTransposeLhs(), tb = adaptor.getTransposeRhs();
  auto [ar, ac] = asMatrix(a);
  auto [br, bc] = asMatrix(b);
  int64_t m = ta ? ac : ar, ka = ta ? ar : ac;
  int64_t kb = tb ? bc : br, n = tb ? br : bc;
  if (!dimsCompatible(ka, kb))
    return inferError(loc, "nn.matmul contraction sizes differ: " +
                               Twine(ka) + " vs " + Twine(kb));
  if (!ta) {
    SmallVector<int64_t> shape(a.getShape().drop_back());
    shape.push_back(n);
    types.push_back(f32Tensor(ctx, shape));
  } else {
    types.push_back(f32Tensor(ctx, {m, n}));
  }
  return success();
}

LogicalResult MatmulOp::verify() {
  return verifyGemmOperands(*this, getLhs().getType(), getRhs().getType());
}

/// The same f32 matrix view: equal rows and columns once the leading
/// dimensions are flattened.
bool MatmulOp::isCompatibleReturnTypes(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != 1 || actual.size() != 1)
    return false;
  if (inferred[0] == actual[0])
    return true;
  auto a = dyn_cast<RankedTensorType>(inferred[0]);
  auto b = dyn_cast<RankedTensorType>(actual[0]);
  return a && b && a.getElementType() == b.getElementType() &&
         a.hasStaticShape() && b.hasStaticShape() && b.getRank() >= 2 &&
         asMatrix(a) == asMatrix(b);
}

//===----------------------------------------------------------------------===//
// Elementwise ops
//===----------------------------------------------------------------------===//

static LogicalResult verifyApproximate(Operation *op, StringRef approximate) {
  if (approximate != "none" && approximate != "tanh")
    return op->emitOpError() << "approximate must be \"none\" or \"tanh\", got \""
                             << approximate << "\"";
  return success();
}
LogicalResult GeluOp::verify() { return verifyApproximate(*this, getApproximate()); }
LogicalResult GeluGradOp::verify() {
  return verifyApproximate(*this, getApproximate());
}

Value tessera::nn::createLossSeed(OpBuilder &b, Location loc, Type type,
                                  float value, Operation *anchor) {
  auto mp = getRootModule(anchor)->getAttrOfType<DictionaryAttr>(
      kMixedPrecisionAttr);
  auto params = mp ? mp.getAs<StringAttr>("params") : StringAttr();
  FloatAttr seed = b.getF32FloatAttr(value);
  if (params && symbolizeFloatDtype(params.getValue()) == FloatDtype::F16)
    return LossSeedOp::create(b, loc, type, seed);
  return FillOp::create(b, loc, type, seed);
}

LogicalResult MaskColumnsOp::verify() {
  if (getInput().getType().getRank() < 1)
    return emitOpError() << "needs a tensor of rank >= 1";
  if (getValid() < 1)
    return emitOpError() << "valid must be >= 1, got " << getValid();
  if (getGroup() && getGroup()->empty())
    return emitOpError() << "group must name a rank-group kind";
  return success();
}

LogicalResult MaskColumnsOp::buildAdjoint(OpBuilder &b,
                                          ArrayRef<Value> resultAdj,
                                          ArrayRef<bool> needed,
                                          SmallVectorImpl<Value> &adj) {
  // The masked columns' adjoints are zero: the same mask with fill 0.
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = MaskColumnsOp::create(b, getLoc(), resultAdj[0].getType(),
                                   resultAdj[0], getValidAttr(),
                                   b.getF32FloatAttr(0.0f), getGroupAttr());
  return success();
}

LogicalResult GeluOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                   ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = GeluGradOp::create(b, getLoc(), getInput(), resultAdj[0],
                                getApproximate());
  return success();
}

//===----------------------------------------------------------------------===//
// SwiGLUOp, SwiGLUGradOp
//===----------------------------------------------------------------------===//

/// A [..., 2n] input (gate and up stacked): its result shape [..., n].
static FailureOr<SmallVector<int64_t>> swigluResultShape(RankedTensorType x) {
  if (x.getRank() < 1)
    return failure();
  SmallVector<int64_t> shape(x.getShape());
  int64_t &last = shape.back();
  if (!ShapedType::isDynamic(last)) {
    if (last % 2 != 0)
      return failure();
    last /= 2;
  }
  return shape;
}

static LogicalResult verifySwiGLUInput(Operation *op, RankedTensorType x) {
  if (failed(swigluResultShape(x)))
    return op->emitOpError()
           << "expects a [..., 2n] input (the gate and up projections "
              "stacked), got "
           << x;
  return success();
}

LogicalResult SwiGLUOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  FailureOr<SmallVector<int64_t>> shape = swigluResultShape(x);
  if (failed(shape))
    return inferError(loc, "nn.swiglu expects a [..., 2n] input");
  types.push_back(f32Tensor(ctx, *shape));
  return success();
}

LogicalResult SwiGLUOp::verify() {
  return verifySwiGLUInput(*this, getInput().getType());
}

LogicalResult SwiGLUOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                     ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = SwiGLUGradOp::create(b, getLoc(), getInput(), resultAdj[0]);
  return success();
}

// On a column-parallel shard ([gate shard | up shard]) the op runs as it is
// and its result is the rank's contiguous shard of the features.
FailureOr<int64_t> SwiGLUOp::propagateShardedDim(unsigned, int64_t dim) {
  return dim;
}

FailureOr<int64_t> SwiGLUOp::getSplitDims(TPSplitKind,
                                          SmallVectorImpl<int64_t> &, bool &) {
  return failure();
}

LogicalResult SwiGLUOp::checkShard(int64_t dim, int64_t parts) {
  auto y = getType();
  int64_t n = y.getDimSize(y.getRank() - 1);
  if (dim == y.getRank() - 1 && !ShapedType::isDynamic(n) && n % parts != 0)
    return emitOpError() << "cannot split " << n
                         << " SwiGLU features (the FFN hidden size) over tp = "
                         << parts;
  return success();
}

LogicalResult SwiGLUGradOp::verify() {
  auto x = getInput().getType();
  if (failed(verifySwiGLUInput(*this, x)))
    return failure();
  auto dy = getResultGrad().getType();
  if (failed(verifyCompatibleShape(dy.getShape(), *swigluResultShape(x))))
    return emitOpError() << "result_grad " << dy
                         << " must have the forward result's shape (the "
                            "input's with half its last dimension)";
  return success();
}

//===----------------------------------------------------------------------===//
// BiasGeluOp, BiasGeluGradOp
//===----------------------------------------------------------------------===//

/// A [..., n] input and a [n] bias.
static LogicalResult verifyRowBias(Operation *op, RankedTensorType x,
                                   RankedTensorType bias) {
  if (x.getRank() < 1 || bias.getRank() != 1 ||
      !dimsCompatible(x.getDimSize(x.getRank() - 1), bias.getDimSize(0)))
    return op->emitOpError() << "expects a [..., n] input and a [n] bias, got "
                             << x << " and " << bias;
  return success();
}

LogicalResult BiasGeluOp::inferReturnTypes(MLIRContext *,
                                           std::optional<Location>,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult BiasGeluOp::verify() {
  if (failed(verifyRowBias(*this, getInput().getType(), getBias().getType())))
    return failure();
  return verifyApproximate(*this, getApproximate());
}

LogicalResult BiasGeluOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                       ArrayRef<bool> needed,
                                       SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (!needed[0] && !needed[1])
    return success();
  auto grad = BiasGeluGradOp::create(b, getLoc(), getInput(), getBias(),
                                     resultAdj[0], getApproximate());
  if (needed[0])
    adj[0] = grad.getInputGrad();
  if (needed[1])
    adj[1] = grad.getBiasGrad();
  return success();
}

LogicalResult BiasGeluGradOp::inferReturnTypes(MLIRContext *,
                                               std::optional<Location>,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  types.push_back(adaptor.getBias().getType());
  return success();
}

LogicalResult BiasGeluGradOp::verify() {
  if (failed(verifyRowBias(*this, getInput().getType(), getBias().getType())))
    return failure();
  if (getResultGrad().getType() != getInput().getType())
    return emitOpError() << "result_grad " << getResultGrad().getType()
                         << " must have the input's type "
                         << getInput().getType();
  return verifyApproximate(*this, getApproximate());
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

LogicalResult CastOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  if (in.getShape() != out.getShape())
    return emitOpError() << "changes the shape: " << in << " to " << out;
  return success();
}

LogicalResult CastOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                   ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &adj) {
  // Adjoints are f32 whatever the value's dtype: the input's adjoint is
  // the result's, widened if it arrived in bf16 or f16.
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = castElements(b, getLoc(), resultAdj[0], b.getF32Type());
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
  if (x.getRank() < 1 || bias.getRank() != 1 ||
      !dimsCompatible(x.getDimSize(x.getRank() - 1), bias.getDimSize(0)))
    return emitOpError() << "expects a [..., n] input and a [n] bias, got "
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
  if (logits.getRank() < 2)
    return inferError(loc, "nn.softmax_cross_entropy expects logits of rank >= 2");
  types.push_back(f32Tensor(ctx, logits.getShape().drop_back()));
  return success();
}

/// One label per row of `logits` (every dim but the last).
static LogicalResult verifyLabelsPerRow(Operation *op, RankedTensorType logits,
                                        RankedTensorType labels) {
  bool match = labels.getRank() + 1 == logits.getRank();
  for (int64_t i = 0; match && i < labels.getRank(); ++i)
    match = dimsCompatible(labels.getDimSize(i), logits.getDimSize(i));
  if (!match)
    return op->emitOpError() << "labels must hold one label per row of the "
                                "logits, got "
                             << labels << " for " << logits;
  return success();
}

LogicalResult SoftmaxCrossEntropyOp::verify() {
  return verifyLabelsPerRow(*this, getLogits().getType(),
                            getLabels().getType());
}

LogicalResult SoftmaxCrossEntropyOp::buildAdjoint(
    OpBuilder &b, ArrayRef<Value> resultAdj, ArrayRef<bool> needed,
    SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0])
    adj[0] = SoftmaxCrossEntropyGradOp::create(b, getLoc(), getLogits(),
                                               getLabels(), resultAdj[0],
                                               getIgnoreIndexAttr());
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
  if (x.getRank() < 1)
    return inferError(loc, "nn.reduce_rows expects a ranked input");
  types.push_back(f32Tensor(ctx, {x.getDimSize(x.getRank() - 1)}));
  return success();
}

/// [n], or any static shape of n f32 elements (a stacked bias's gradient).
bool ReduceRowsOp::isCompatibleReturnTypes(TypeRange inferred,
                                           TypeRange actual) {
  if (inferred.size() != 1 || actual.size() != 1)
    return false;
  if (inferred[0] == actual[0])
    return true;
  auto a = dyn_cast<RankedTensorType>(inferred[0]);
  auto b = dyn_cast<RankedTensorType>(actual[0]);
  return a && b && a.getElementType() == b.getElementType() &&
         a.hasStaticShape() && b.hasStaticShape() &&
         a.getNumElements() == b.getNumElements();
}

LogicalResult SoftmaxCrossEntropyGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getLogits().getType());
  return success();
}

//===----------------------------------------------------------------------===//
// EmbeddingOp, AddPositionEmbeddingOp
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto ids = cast<RankedTensorType>(adaptor.getIds().getType());
  auto table = cast<RankedTensorType>(adaptor.getTable().getType());
  if (table.getRank() != 2)
    return inferError(loc, "nn.embedding expects a 2-d table");
  SmallVector<int64_t> shape(ids.getShape());
  shape.push_back(table.getDimSize(1));
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult EmbeddingOp::verify() {
  if (getVocabSize() < 1)
    return emitOpError() << "vocab_size must be positive";
  if (!getVocabShardGroup() && !ShapedType::isDynamic(getTable().getType().getDimSize(0)) &&
      getTable().getType().getDimSize(0) < int64_t(getVocabSize()))
    return emitOpError() << "table has " << getTable().getType().getDimSize(0)
                         << " rows, fewer than vocab_size " << getVocabSize();
  return success();
}

LogicalResult EmbeddingOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[1])
    adj[1] = EmbeddingGradOp::create(b, getLoc(), getTable().getType(), getIds(),
                                     resultAdj[0], getVocabShardGroupAttr());
  return success();
}

FailureOr<int64_t> EmbeddingOp::getSplitDims(TPSplitKind kind,
                                             SmallVectorImpl<int64_t> &dims,
                                             bool &partial) {
  if (kind != TPSplitKind::Vocab)
    return failure();
  // Ids replicated, table rows sharded; rows outside the shard are zero,
  // so the result is a partial sum (Megatron's VocabParallelEmbedding).
  dims.assign({-1, 0});
  partial = true;
  return -1;
}

LogicalResult AddPositionEmbeddingOp::inferReturnTypes(
    MLIRContext *, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location>,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult AddPositionEmbeddingOp::verify() {
  auto x = getInput().getType();
  auto t = getTable().getType();
  if (x.getRank() != 3 || t.getRank() != 2 ||
      !dimsCompatible(x.getDimSize(2), t.getDimSize(1)))
    return emitOpError() << "expects a [seq, batch, hidden] input and a "
                            "[max_seq, hidden] table, got "
                         << x << " and " << t;
  if (!ShapedType::isDynamic(x.getDimSize(0)) &&
      !ShapedType::isDynamic(t.getDimSize(0)) &&
      x.getDimSize(0) > t.getDimSize(0))
    return emitOpError() << "sequence length " << x.getDimSize(0)
                         << " exceeds the " << t.getDimSize(0)
                         << " position embeddings";
  return success();
}

LogicalResult AddPositionEmbeddingOp::buildAdjoint(
    OpBuilder &b, ArrayRef<Value> resultAdj, ArrayRef<bool> needed,
    SmallVectorImpl<Value> &adj) {
  adj.assign(2, Value());
  if (needed[0])
    adj[0] = resultAdj[0];
  if (needed[1])
    adj[1] = PositionEmbeddingGradOp::create(b, getLoc(), getTable().getType(),
                                             resultAdj[0],
                                             getSequenceShardGroupAttr());
  return success();
}

//===----------------------------------------------------------------------===//
// LayerNormOp
//===----------------------------------------------------------------------===//

/// Norm weight (and LayerNorm's bias): 1-d of the input's last dimension.
static LogicalResult verifyNormParams(Operation *op, RankedTensorType x,
                                      ValueRange params) {
  int64_t h = x.getDimSize(x.getRank() - 1);
  for (Value v : params) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getRank() != 1 || !dimsCompatible(t.getDimSize(0), h))
      return op->emitOpError()
             << (params.size() > 1 ? "weight and bias" : "weight")
             << " must be 1-d of the input's last dimension " << h << ", got "
             << t;
  }
  return success();
}

LogicalResult LayerNormOp::verify() {
  return verifyNormParams(*this, getInput().getType(), {getWeight(), getBias()});
}

LogicalResult AddLayerNormOp::inferReturnTypes(MLIRContext *,
                                               std::optional<Location>,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  types.assign(2, adaptor.getLhs().getType());
  return success();
}

LogicalResult AddLayerNormOp::verify() {
  return verifyNormParams(*this, getLhs().getType(), {getWeight(), getBias()});
}

LogicalResult AddLayerNormOp::buildAdjoint(OpBuilder &b,
                                           ArrayRef<Value> resultAdj,
                                           ArrayRef<bool> needed,
                                           SmallVectorImpl<Value> &adj) {
  // The sum's gradient: the layer norm's input gradient plus what its other
  // readers give it (resultAdj[0], null when nothing else reads it).
  Value dSum = resultAdj[0], dY = resultAdj[1];
  Value dWeight, dBias;
  if (dY) {
    Operation *grad;
    if (dSum)
      grad = AddLayerNormGradOp::create(
          b, getLoc(), getSum().getType(), getWeight().getType(),
          getBias().getType(), getSum(), getWeight(), dY, dSum, getEpsAttr());
    else
      grad = LayerNormGradOp::create(
          b, getLoc(), getSum().getType(), getWeight().getType(),
          getBias().getType(), getSum(), getWeight(), dY, getEpsAttr());
    dSum = grad->getResult(0);
    dWeight = grad->getResult(1);
    dBias = grad->getResult(2);
  }
  adj.assign({needed[0] ? dSum : Value(), needed[1] ? dSum : Value(),
              needed[2] ? dWeight : Value(), needed[3] ? dBias : Value()});
  return success();
}

LogicalResult LayerNormOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  auto grad = LayerNormGradOp::create(
      b, getLoc(), getInput().getType(), getWeight().getType(),
      getBias().getType(), getInput(), getWeight(), resultAdj[0], getEpsAttr());
  adj.assign({needed[0] ? grad.getInputGrad() : Value(),
              needed[1] ? grad.getWeightGrad() : Value(),
              needed[2] ? grad.getBiasGrad() : Value()});
  return success();
}

//===----------------------------------------------------------------------===//
// RMSNormOp
//===----------------------------------------------------------------------===//

LogicalResult RMSNormOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location>,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult RMSNormOp::verify() {
  return verifyNormParams(*this, getInput().getType(), {getWeight()});
}

LogicalResult RMSNormOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                      ArrayRef<bool> needed,
                                      SmallVectorImpl<Value> &adj) {
  auto grad = RMSNormGradOp::create(b, getLoc(), getInput().getType(),
                                    getWeight().getType(), getInput(),
                                    getWeight(), resultAdj[0], getEpsAttr());
  adj.assign({needed[0] ? grad.getInputGrad() : Value(),
              needed[1] ? grad.getWeightGrad() : Value()});
  return success();
}

LogicalResult AddRMSNormOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location>,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  types.assign(2, adaptor.getLhs().getType());
  return success();
}

LogicalResult AddRMSNormOp::verify() {
  return verifyNormParams(*this, getLhs().getType(), {getWeight()});
}

LogicalResult AddRMSNormOp::buildAdjoint(OpBuilder &b,
                                         ArrayRef<Value> resultAdj,
                                         ArrayRef<bool> needed,
                                         SmallVectorImpl<Value> &adj) {
  // As AddLayerNormOp's: the sum's gradient is the norm's input gradient
  // plus what its other readers give it.
  Value dSum = resultAdj[0], dY = resultAdj[1];
  Value dWeight;
  if (dY) {
    Operation *grad;
    if (dSum)
      grad = AddRMSNormGradOp::create(b, getLoc(), getSum().getType(),
                                      getWeight().getType(), getSum(),
                                      getWeight(), dY, dSum, getEpsAttr());
    else
      grad = RMSNormGradOp::create(b, getLoc(), getSum().getType(),
                                   getWeight().getType(), getSum(),
                                   getWeight(), dY, getEpsAttr());
    dSum = grad->getResult(0);
    dWeight = grad->getResult(1);
  }
  adj.assign({needed[0] ? dSum : Value(), needed[1] ? dSum : Value(),
              needed[2] ? dWeight : Value()});
  return success();
}

//===----------------------------------------------------------------------===//
// AttentionOp
//===----------------------------------------------------------------------===//

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto qkv = cast<RankedTensorType>(adaptor.getQkv().getType());
  if (qkv.getRank() != 3)
    return inferError(loc, "nn.attention expects [seq, batch, 3 * hidden]");
  SmallVector<int64_t> shape(qkv.getShape());
  if (!ShapedType::isDynamic(shape[2]))
    shape[2] /= 3;
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult AttentionOp::verify() {
  int64_t features = getQkv().getType().getDimSize(2);
  if (getNumHeads() < 1)
    return emitOpError() << "num_heads must be positive";
  if (!ShapedType::isDynamic(features) && features % (3 * getNumHeads()) != 0)
    return emitOpError() << "qkv features " << features
                         << " are not 3 x num_heads (" << getNumHeads()
                         << ") x head_dim";
  return success();
}

LogicalResult AttentionOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = AttentionGradOp::create(b, getLoc(), getQkv().getType(), getQkv(),
                                     resultAdj[0], getNumHeadsAttr(),
                                     getCausalAttr());
  return success();
}

FailureOr<int64_t> AttentionOp::getSplitDims(TPSplitKind,
                                             SmallVectorImpl<int64_t> &,
                                             bool &) {
  return failure();
}

/// Ops on a fused, head-major QKV (attention, RoPE) split over tp by whole
/// heads: only the feature dimension, by a divisor of the heads.
static FailureOr<int64_t> propagateHeadsDim(int64_t dim) {
  if (dim != 2)
    return failure();
  return dim;
}

static LogicalResult checkHeadsShard(Operation *op, int64_t heads,
                                     int64_t parts) {
  if (heads % parts != 0)
    return op->emitOpError() << "cannot split " << heads
                             << " attention heads over tp = " << parts;
  return success();
}

FailureOr<int64_t> AttentionOp::propagateShardedDim(unsigned, int64_t dim) {
  return propagateHeadsDim(dim);
}

LogicalResult AttentionOp::checkShard(int64_t, int64_t parts) {
  return checkHeadsShard(*this, getNumHeads(), parts);
}

LogicalResult AttentionOp::adjustForShard(int64_t, int64_t parts) {
  if (failed(checkHeadsShard(*this, getNumHeads(), parts)))
    return failure();
  setNumHeads(getNumHeads() / parts);
  return success();
}

//===----------------------------------------------------------------------===//
// RepeatKVOp, RepeatKVGradOp
//===----------------------------------------------------------------------===//

/// Head dim of a grouped QKV's `features` (G (heads/G + 2) D), or failure.
static FailureOr<int64_t> groupedHeadDim(int64_t features, int64_t heads,
                                         int64_t groups) {
  if (heads < 1 || groups < 1 || heads % groups != 0)
    return failure();
  int64_t per = heads + 2 * groups;
  if (ShapedType::isDynamic(features) || features % per != 0)
    return failure();
  return features / per;
}

/// Verifies the heads and groups and the grouped and head-major feature
/// counts of nn.repeat_kv (grouped -> headMajor) or its gradient.
/// num_heads a positive multiple of num_query_groups (nn.repeat_kv,
/// nn.qk_norm and their gradients).
static LogicalResult verifyHeadsAndGroups(Operation *op, int64_t heads,
                                          int64_t groups) {
  if (heads < 1 || groups < 1 || heads % groups != 0)
    return op->emitOpError() << "num_heads " << heads
                             << " must be a positive multiple of "
                                "num_query_groups "
                             << groups;
  return success();
}

/// Ops on a grouped QKV split over tp by whole query groups.
static LogicalResult checkGroupsShard(Operation *op, int64_t groups,
                                      int64_t parts) {
  if (groups % parts != 0)
    return op->emitOpError() << "num_query_groups " << groups
                             << " is not divisible by tp = " << parts
                             << " (tensor parallelism splits the query groups)";
  return success();
}

/// The rank's share of the heads and groups of such an op.
template <typename GroupedOp>
static LogicalResult adjustGroupsShard(GroupedOp op, int64_t parts) {
  if (failed(checkGroupsShard(op, op.getNumQueryGroups(), parts)))
    return failure();
  op.setNumHeads(op.getNumHeads() / parts);
  op.setNumQueryGroups(op.getNumQueryGroups() / parts);
  return success();
}

static LogicalResult verifyRepeatKV(Operation *op, RankedTensorType grouped,
                                    RankedTensorType headMajor, int64_t heads,
                                    int64_t groups) {
  if (failed(verifyHeadsAndGroups(op, heads, groups)))
    return failure();
  if (grouped.getRank() != 3 || headMajor.getRank() != 3)
    return op->emitOpError() << "expects [seq, batch, features] tensors";
  int64_t in = grouped.getDimSize(2);
  if (!ShapedType::isDynamic(in) &&
      failed(groupedHeadDim(in, heads, groups)))
    return op->emitOpError()
           << "grouped qkv features " << in << " are not num_query_groups ("
           << groups << ") x (num_heads / num_query_groups + 2) x head_dim";
  return success();
}

static RankedTensorType headMajorType(MLIRContext *ctx, RankedTensorType x,
                                      int64_t heads, int64_t groups) {
  SmallVector<int64_t> shape(x.getShape());
  FailureOr<int64_t> d = groupedHeadDim(shape[2], heads, groups);
  shape[2] = succeeded(d) ? heads * 3 * *d : ShapedType::kDynamic;
  return f32Tensor(ctx, shape);
}

LogicalResult RepeatKVOp::inferReturnTypes(MLIRContext *ctx,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &types) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() != 3)
    return inferError(loc, "nn.repeat_kv expects a [seq, batch, features] "
                           "input");
  types.push_back(headMajorType(ctx, x, adaptor.getNumHeads(),
                                adaptor.getNumQueryGroups()));
  return success();
}

LogicalResult RepeatKVOp::verify() {
  return verifyRepeatKV(*this, getInput().getType(), getType(), getNumHeads(),
                        getNumQueryGroups());
}

LogicalResult RepeatKVOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                       ArrayRef<bool> needed,
                                       SmallVectorImpl<Value> &adj) {
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = RepeatKVGradOp::create(b, getLoc(), resultAdj[0],
                                    getNumHeadsAttr(), getNumQueryGroupsAttr());
  return success();
}

FailureOr<int64_t> RepeatKVOp::getSplitDims(TPSplitKind,
                                            SmallVectorImpl<int64_t> &,
                                            bool &) {
  return failure();
}

// Whole query groups per rank: a contiguous block of groups in, the block
// of their heads out.
FailureOr<int64_t> RepeatKVOp::propagateShardedDim(unsigned, int64_t dim) {
  return propagateHeadsDim(dim);
}

LogicalResult RepeatKVOp::checkShard(int64_t, int64_t parts) {
  return checkGroupsShard(*this, getNumQueryGroups(), parts);
}

LogicalResult RepeatKVOp::adjustForShard(int64_t, int64_t parts) {
  return adjustGroupsShard(*this, parts);
}

LogicalResult RepeatKVGradOp::inferReturnTypes(MLIRContext *ctx,
                                               std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  auto dy = cast<RankedTensorType>(adaptor.getInput().getType());
  if (dy.getRank() != 3)
    return inferError(loc, "nn.repeat_kv_grad expects a [seq, batch, "
                           "features] input");
  int64_t heads = adaptor.getNumHeads(), groups = adaptor.getNumQueryGroups();
  SmallVector<int64_t> shape(dy.getShape());
  if (!ShapedType::isDynamic(shape[2]) && heads > 0 && groups > 0 &&
      shape[2] % (3 * heads) == 0)
    shape[2] = shape[2] / (3 * heads) * (heads + 2 * groups);
  else
    shape[2] = ShapedType::kDynamic;
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult RepeatKVGradOp::verify() {
  if (failed(verifyRepeatKV(*this, getType(), getInput().getType(),
                            getNumHeads(), getNumQueryGroups())))
    return failure();
  int64_t features = getInput().getType().getDimSize(2);
  if (!ShapedType::isDynamic(features) && features % (3 * getNumHeads()) != 0)
    return emitOpError() << "qkv gradient features " << features
                         << " are not 3 x num_heads (" << getNumHeads()
                         << ") x head_dim";
  return success();
}

//===----------------------------------------------------------------------===//
// QKNormOp
//===----------------------------------------------------------------------===//

LogicalResult QKNormOp::verify() {
  auto x = getInput().getType();
  int64_t heads = getNumHeads(), groups = getNumQueryGroups();
  if (failed(verifyHeadsAndGroups(*this, heads, groups)))
    return failure();
  if (x.getRank() != 3)
    return emitOpError() << "expects a fused [seq, batch, features] QKV, got "
                         << x;
  auto w = getQWeight().getType();
  FailureOr<int64_t> d = groupedHeadDim(x.getDimSize(2), heads, groups);
  if (!ShapedType::isDynamic(x.getDimSize(2)) && failed(d))
    return emitOpError() << "qkv features " << x.getDimSize(2)
                         << " are not num_query_groups (" << groups
                         << ") x (num_heads / num_query_groups + 2) x head_dim";
  if (w.getRank() != 1 || (succeeded(d) && w.getDimSize(0) != *d))
    return emitOpError() << "q_weight and k_weight must be [head_dim"
                         << (succeeded(d) ? " = " + std::to_string(*d) : "")
                         << "], got " << w;
  float eps = getEps().convertToFloat();
  if (!(eps > 0.0f) || !std::isfinite(eps))
    return emitOpError() << "eps must be finite and > 0, got " << eps;
  return success();
}

LogicalResult QKNormOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                     ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &adj) {
  auto grad = QKNormGradOp::create(
      b, getLoc(), getInput().getType(), getQWeight().getType(),
      getQWeight().getType(), getInput(), getQWeight(), getKWeight(),
      resultAdj[0], getNumHeadsAttr(), getNumQueryGroupsAttr(), getEpsAttr());
  adj.assign({needed[0] ? grad.getInputGrad() : Value(),
              needed[1] ? grad.getQWeightGrad() : Value(),
              needed[2] ? grad.getKWeightGrad() : Value()});
  return success();
}

FailureOr<int64_t> QKNormOp::getSplitDims(TPSplitKind,
                                          SmallVectorImpl<int64_t> &, bool &) {
  return failure();
}

// Whole query groups per rank, as nn.repeat_kv; the weights stay whole.
FailureOr<int64_t> QKNormOp::propagateShardedDim(unsigned operand,
                                                 int64_t dim) {
  if (operand != 0)
    return failure();
  return propagateHeadsDim(dim);
}

LogicalResult QKNormOp::checkShard(int64_t, int64_t parts) {
  return checkGroupsShard(*this, getNumQueryGroups(), parts);
}

LogicalResult QKNormOp::adjustForShard(int64_t, int64_t parts) {
  return adjustGroupsShard(*this, parts);
}

//===----------------------------------------------------------------------===//
// RotaryEmbeddingOp
//===----------------------------------------------------------------------===//

LogicalResult RotaryEmbeddingOp::verify() {
  auto x = getInput().getType();
  if (x.getRank() != 3)
    return emitOpError() << "expects a fused [seq, batch, heads * 3 * "
                            "head_dim] input, got "
                         << x;
  int64_t heads = getNumHeads(), rot = getRotaryDim();
  if (heads < 1)
    return emitOpError() << "num_heads must be positive";
  int64_t features = x.getDimSize(2);
  if (!ShapedType::isDynamic(features)) {
    if (features % (3 * heads) != 0)
      return emitOpError() << "qkv features " << features
                           << " are not 3 x num_heads (" << heads
                           << ") x head_dim";
    int64_t headDim = features / (3 * heads);
    if (rot < 2 || rot % 2 != 0 || rot > headDim)
      return emitOpError() << "rotary_dim " << rot
                           << " must be even and in [2, head_dim " << headDim
                           << "]";
  }
  float base = getBase().convertToFloat();
  if (!(base > 1.0f) || !std::isfinite(base))
    return emitOpError() << "base must be finite and > 1, got " << base;
  if (auto f = getScalingFactorAttr()) {
    float factor = f.getValueAsDouble();
    if (!(factor >= 1.0f) || !std::isfinite(factor))
      return emitOpError() << "scaling_factor must be finite and >= 1, got "
                           << factor;
  }
  return success();
}

LogicalResult RotaryEmbeddingOp::buildAdjoint(OpBuilder &b,
                                              ArrayRef<Value> resultAdj,
                                              ArrayRef<bool> needed,
                                              SmallVectorImpl<Value> &adj) {
  // A rotation's adjoint is its inverse: the same op by minus the angle.
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = RotaryEmbeddingOp::create(
        b, getLoc(), resultAdj[0], getNumHeadsAttr(), getRotaryDimAttr(),
        getBaseAttr(), b.getBoolAttr(!getInverse()),
        getSequenceShardGroupAttr(), getScalingFactorAttr());
  return success();
}

FailureOr<int64_t> RotaryEmbeddingOp::getSplitDims(TPSplitKind,
                                                   SmallVectorImpl<int64_t> &,
                                                   bool &) {
  return failure();
}

FailureOr<int64_t> RotaryEmbeddingOp::propagateShardedDim(unsigned,
                                                          int64_t dim) {
  return propagateHeadsDim(dim);
}

LogicalResult RotaryEmbeddingOp::checkShard(int64_t, int64_t parts) {
  return checkHeadsShard(*this, getNumHeads(), parts);
}

LogicalResult RotaryEmbeddingOp::adjustForShard(int64_t, int64_t parts) {
  if (failed(checkHeadsShard(*this, getNumHeads(), parts)))
    return failure();
  setNumHeads(getNumHeads() / parts);
  return success();
}

//===----------------------------------------------------------------------===//
// DropoutOp
//===----------------------------------------------------------------------===//

/// An optimizer's or a sum of squares' `runs` (see nn.adam): well formed,
/// with a shard of at least the operand's elements.
static LogicalResult verifyRuns(Operation *op, DenseI64ArrayAttr runs,
                                Type operand) {
  if (!runs)
    return success();
  ArrayRef<int64_t> a = runs.asArrayRef();
  if (std::string_view why = tessera::rt::runsError(a.data(), a.size());
      !why.empty())
    return op->emitOpError() << "runs " << runs << ": " << why;
  auto type = cast<RankedTensorType>(operand);
  if (!a.empty() && type.hasStaticShape() && type.getNumElements() > a[0])
    return op->emitOpError() << "runs' shard of " << a[0]
                             << " elements is smaller than the operand "
                             << type;
  return success();
}

LogicalResult AdamOp::verify() {
  return verifyRuns(*this, getRunsAttr(), getParam().getType());
}

LogicalResult SgdOp::verify() {
  return verifyRuns(*this, getRunsAttr(), getParam().getType());
}

LogicalResult SgdMomentumOp::verify() {
  float momentum = getMomentum().convertToFloat();
  if (!(momentum > 0.0f && momentum < 1.0f))
    return emitOpError() << "momentum must be in (0, 1) (nn.sgd has none), got "
                         << momentum;
  return verifyRuns(*this, getRunsAttr(), getParam().getType());
}

LogicalResult SumSquaresOp::verify() {
  return verifyRuns(*this, getRunsAttr(), getX().getType());
}

LogicalResult ClipGradNormOp::verify() {
  float maxNorm = getMaxNorm().convertToFloat();
  if (!(maxNorm >= 0.0f) || !std::isfinite(maxNorm))
    return emitOpError() << "max_norm must be finite and >= 0 (0: no "
                            "clipping), got "
                         << maxNorm;
  return success();
}

LogicalResult DropoutOp::verify() {
  float rate = getRate().convertToFloat();
  // Written so that NaN fails.
  if (!(rate >= 0.0f && rate < 1.0f))
    return emitOpError() << "rate must be in [0, 1), got " << rate;
  if (getInput().getType().getRank() != 3)
    return emitOpError() << "expects [seq, batch, hidden] activations";
  return success();
}

LogicalResult DropoutOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                      ArrayRef<bool> needed,
                                      SmallVectorImpl<Value> &adj) {
  // The same mask scales the gradient.
  adj.assign(1, Value());
  if (needed[0])
    adj[0] = DropoutOp::create(b, getLoc(), resultAdj[0], getRateAttr(),
                               getStreamAttr(), getSequenceShardGroupAttr());
  return success();
}

//===----------------------------------------------------------------------===//
// TokenMeanOp and the cross-entropy statistics
//===----------------------------------------------------------------------===//

LogicalResult TokenMeanOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location>, Adaptor,
                                            SmallVectorImpl<Type> &types) {
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult TokenMeanOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultAdj,
                                        ArrayRef<bool> needed,
                                        SmallVectorImpl<Value> &adj) {
  adj.assign(getNumOperands(), Value());
  if (needed[0])
    adj[0] = TokenMeanGradOp::create(b, getLoc(), getInput().getType(),
                                     resultAdj[0], getLabels(), getCount(),
                                     getIgnoreIndexAttr());
  return success();
}

LogicalResult TokenCountOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location>, Adaptor,
                                             SmallVectorImpl<Type> &types) {
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

static LogicalResult inferRowsOf(Value logits, MLIRContext *ctx,
                                 std::optional<Location> loc, unsigned count,
                                 SmallVectorImpl<Type> &types) {
  auto z = cast<RankedTensorType>(logits.getType());
  if (z.getRank() < 2)
    return inferError(loc, "expected logits of rank >= 2");
  for (unsigned i = 0; i < count; ++i)
    types.push_back(f32Tensor(ctx, z.getShape().drop_back()));
  return success();
}

LogicalResult LogitsMaxOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  return inferRowsOf(adaptor.getLogits(), ctx, loc, 1, types);
}

LogicalResult CrossEntropyStatsOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  return inferRowsOf(adaptor.getLogits(), ctx, loc, 2, types);
}

LogicalResult LogitsStatsOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  return inferRowsOf(adaptor.getLogits(), ctx, loc, 3, types);
}

LogicalResult LogitsStatsOp::verify() {
  return verifyLabelsPerRow(*this, getLogits().getType(),
                            getLabels().getType());
}

LogicalResult CrossEntropyFromStatsOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  return inferRowsOf(adaptor.getLogits(), ctx, loc, 1, types);
}

LogicalResult CrossEntropyFromStatsOp::buildAdjoint(
    OpBuilder &b, ArrayRef<Value> resultAdj, ArrayRef<bool> needed,
    SmallVectorImpl<Value> &adj) {
  // The whole derivative w.r.t. the local logits, through the statistics
  // too: softmax minus one-hot. The statistics themselves get no adjoint.
  adj.assign(getNumOperands(), Value());
  if (needed[0])
    adj[0] = CrossEntropyStatsGradOp::create(
        b, getLoc(), getLogits().getType(), getLogits(), getLabels(), getMax(),
        getSumExp(), resultAdj[0], getIgnoreIndexAttr(),
        getVocabShardGroupAttr());
  return success();
}

//===----------------------------------------------------------------------===//
// Costs (CostOpInterface) of the ops whose FLOPs are not one per element
//===----------------------------------------------------------------------===//

static int64_t numel(Type t) {
  auto s = cast<ShapedType>(t);
  return s.hasStaticShape() ? s.getNumElements() : 0;
}

int64_t LinearOp::getFlops() {
  auto w = getWeight().getType();
  int64_t out = std::max<int64_t>(linearOutFeatures(w), 1);
  int64_t rows = numel(getType()) / out;
  return 2 * rows * out * w.getShape().back() +
         (getBias() ? numel(getType()) : 0);
}

/// silu(g) * u: the sigmoid's exp, add and divide, two products.
int64_t SwiGLUOp::getFlops() { return 5 * numel(getType()); }

int64_t MatmulOp::getFlops() {
  auto a = getLhs().getType();
  int64_t k = getTransposeLhs() ? numel(a) / a.getShape().back()
                                : a.getShape().back();
  return 2 * numel(getType()) * k;
}

/// Per (batch, head): QK^T and PV are 2 S^2 D each, the softmax ~5 S^2.
static int64_t attentionFlops(RankedTensorType qkv, int64_t heads,
                              int64_t matmuls) {
  int64_t s = qkv.getDimSize(0), b = qkv.getDimSize(1);
  int64_t d = qkv.getDimSize(2) / (3 * heads);
  return b * heads * (matmuls * 2 * s * s * d + 5 * s * s);
}

// Per rotated feature: the angle's product, its sine and cosine (counted as
// one each) and the rotation's two products and a sum.
int64_t RotaryEmbeddingOp::getFlops() {
  auto x = getInput().getType();
  int64_t heads = getNumHeads();
  return 6 * (numel(x) / (x.getDimSize(2) > 0 ? x.getDimSize(2) : 1)) *
         heads * 2 * getRotaryDim();
}

int64_t AttentionOp::getFlops() {
  return attentionFlops(getQkv().getType(), getNumHeads(), 2);
}

int64_t AttentionGradOp::getFlops() {
  // Recomputed QK^T, then dV, dP, dQ and dK.
  return attentionFlops(getQkv().getType(), getNumHeads(), 5);
}

int64_t LayerNormOp::getFlops() { return 8 * numel(getType()); }
int64_t LayerNormGradOp::getFlops() { return 14 * numel(getInput().getType()); }
int64_t AddLayerNormOp::getFlops() { return 9 * numel(getLhs().getType()); }
int64_t AddLayerNormGradOp::getFlops() {
  return 15 * numel(getInput().getType());
}
// RMS norm: square, sum, scale and weight per element (no mean pass).
int64_t RMSNormOp::getFlops() { return 5 * numel(getType()); }
int64_t RMSNormGradOp::getFlops() { return 10 * numel(getInput().getType()); }
int64_t AddRMSNormOp::getFlops() { return 6 * numel(getLhs().getType()); }
int64_t AddRMSNormGradOp::getFlops() {
  return 11 * numel(getInput().getType());
}
int64_t AdamOp::getFlops() { return 14 * numel(getParam().getType()); }

#define GET_OP_CLASSES
#include "dialects/nn/IR/NNOps.cpp.inc"
