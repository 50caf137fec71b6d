//===- Simplify.cpp - Fold an imported ONNX graph -------------------------===//
//
// One walk in graph order (a node's inputs are settled before it): refine
// the node's result types with the type rules, replace it by its value when
// every input is known, or by its input when it computes nothing. Then
// erase what nothing uses and retype the function.
//
//===----------------------------------------------------------------------===//

#include "dialects/onnx/IR/OnnxSemantics.h"
#include "dialects/onnx/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace tessera::onnx;

namespace tessera::onnx {
#define GEN_PASS_DEF_ONNXSIMPLIFYPASS
#include "dialects/onnx/Transforms/Passes.h.inc"
} // namespace tessera::onnx

namespace {

/// `rule` where it tells more than `current` and agrees with it, else null.
Type refine(Type current, Type rule) {
  auto r = dyn_cast_or_null<RankedTensorType>(rule);
  if (!r || cast<TensorType>(current).getElementType() != r.getElementType())
    return nullptr;
  auto c = dyn_cast<RankedTensorType>(current);
  if (!c)
    return r;
  if (c.getRank() != r.getRank() || failed(verifyCompatibleShape(c, r)))
    return nullptr;
  SmallVector<int64_t> shape(c.getShape());
  bool more = false;
  for (int64_t d = 0; d < c.getRank(); ++d)
    if (ShapedType::isDynamic(shape[size_t(d)]) && !r.isDynamicDim(d)) {
      shape[size_t(d)] = r.getDimSize(d);
      more = true;
    }
  return more ? RankedTensorType::get(shape, c.getElementType()) : nullptr;
}

bool isZeroScalar(ElementsAttr v) {
  if (!v || v.getNumElements() != 1)
    return false;
  if (auto d = dyn_cast<DenseElementsAttr>(v)) {
    if (isa<FloatType>(d.getElementType()))
      return (*d.getValues<APFloat>().begin()).isZero();
    return (*d.getValues<APInt>().begin()).isZero();
  }
  return false;
}

/// The input a node passes through unchanged, or null.
Value passThrough(NodeOp node) {
  StringRef op = node.getOpType();
  // Only a node whose other results (Dropout's mask) nothing reads can go.
  if (!node.getDomain().empty() || node.getInputs().empty() || node.getNumResults() == 0 ||
      llvm::any_of(node.getResults().drop_front(), [](Value r) { return !r.use_empty(); }))
    return nullptr;
  Value in = node.getInputs()[0];
  Type out = node.getNumResults() ? node.getResult(0).getType() : Type();
  if (op == "Identity")
    return in;
  if (op == "Dropout") {
    // Inference mode (no training_mode, or false) or ratio 0; the mask
    // output, when present, must be unused.
    if (node.getNumResults() > 1 && !node.getResult(1).use_empty())
      return nullptr;
    Value mode = node.getInputOrNull(2);
    bool inference = !mode || isZeroScalar(getConstantValue(mode));
    Value ratio = node.getInputOrNull(1);
    bool zero = ratio ? isZeroScalar(getConstantValue(ratio))
                      : false; // the default ratio is 0.5
    return inference || zero ? in : nullptr;
  }
  auto inType = dyn_cast<RankedTensorType>(in.getType());
  bool sameStatic = inType && inType.hasStaticShape() && out == in.getType();
  if ((op == "Cast" && out == in.getType()) ||
      ((op == "Reshape" || op == "Expand" || op == "Squeeze" ||
        op == "Unsqueeze" || op == "Flatten") &&
       sameStatic))
    return in;
  if (op == "Transpose") {
    std::optional<ArrayRef<int64_t>> perm = node.getInts("perm");
    if (perm && llvm::equal(*perm, llvm::seq<int64_t>(0, int64_t(perm->size()))))
      return in;
  }
  if (op == "Slice" && sameStatic) {
    // Every step 1 (or omitted): a slice that keeps the shape keeps it all.
    Value steps = node.getInputOrNull(4);
    if (!steps)
      return in;
    if (auto v = dyn_cast_or_null<DenseElementsAttr>(getConstantValue(steps)))
      if (llvm::all_of(v.getValues<APInt>(), [](APInt s) { return s.isOne(); }))
        return in;
  }
  return nullptr;
}

/// Ops that only move elements: applied to a float initializer (a weight),
/// they are kept, so a parameter keeps its name (Transpose(weight) before
/// a MatMul is not folded into an anonymous constant). Their values are
/// computed only when a folded consumer needs them (a causal-mask buffer
/// sliced to the sequence, then compared).
bool isLayoutOp(StringRef op) {
  return llvm::is_contained({"Transpose", "Reshape", "Slice", "Cast", "Identity",
                             "Unsqueeze", "Squeeze", "Gather", "Concat", "Expand",
                             "Flatten", "Split"},
                            op);
}

/// Folding with the layout ops over weights deferred.
class Folder {
public:
  Folder(MLIRContext *ctx, int64_t opset, int64_t maxElements)
      : ctx(ctx), opset(opset), maxElements(maxElements) {}

  /// Whether v's value can be known: a constant, an initializer with data,
  /// or a deferred node's result.
  bool foldable(Value v) {
    if (isa<NoneType>(v.getType()) || getConstantValue(v))
      return true;
    return deferred.count(v.getDefiningOp());
  }
  /// Whether v derives from an initializer through deferred nodes only.
  bool fromInitializer(Value v) {
    return v.getDefiningOp<InitializerOp>() || deferred.count(v.getDefiningOp());
  }
  void defer(NodeOp n) { deferred.insert(n); }

  /// v's value (evaluating deferred nodes on demand, each once: a failure
  /// is remembered too), or null.
  ElementsAttr valueOf(Value v, unsigned depth = 0) {
    if (ElementsAttr c = getConstantValue(v))
      return c;
    auto node = v.getDefiningOp<NodeOp>();
    if (!node || !deferred.count(node) || failed.count(node) || depth > kMaxDepth)
      return nullptr;
    if (ElementsAttr m = memo.lookup(v))
      return m;
    SmallVector<ElementsAttr> values = evaluateNode(node, depth + 1);
    if (values.empty()) {
      failed.insert(node);
      return nullptr;
    }
    for (auto [r, value] : llvm::zip(node.getResults(), values))
      memo[r] = value;
    return memo.lookup(v);
  }

  SmallVector<ElementsAttr> evaluateNode(NodeOp node, unsigned depth = 0) {
    // Results too large to fold are known before any input is computed.
    for (Type t : node.getResultTypes()) {
      auto r = dyn_cast<RankedTensorType>(t);
      if (!r || !r.hasStaticShape() || r.getNumElements() > maxElements)
        return {};
    }
    SmallVector<Type> inputTypes(node.getInputs().getTypes());
    SmallVector<ElementsAttr> inputValues;
    for (Value in : node.getInputs()) {
      if (isa<NoneType>(in.getType())) {
        inputValues.push_back(nullptr);
        continue;
      }
      ElementsAttr v = valueOf(in, depth);
      if (!v)
        return {};
      inputValues.push_back(v);
    }
    SmallVector<Type> resultTypes(node.getResultTypes());
    NodeView view{node.getOpType(), node.getAttrs(), inputTypes, inputValues,
                  node.getNumResults(), opset};
    return evaluate(ctx, view, resultTypes, maxElements);
  }

private:
  MLIRContext *ctx;
  int64_t opset, maxElements;
  /// Deferred chains deeper than this are not evaluated (no stack
  /// exhaustion on a malformed model).
  static constexpr unsigned kMaxDepth = 256;
  DenseSet<Operation *> deferred, failed;
  DenseMap<Value, ElementsAttr> memo;
};

struct OnnxSimplifyPass
    : tessera::onnx::impl::OnnxSimplifyPassBase<OnnxSimplifyPass> {
  using OnnxSimplifyPassBase::OnnxSimplifyPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t opset = getOpset(module);
    bool failedNode = false;
    module.walk([&](func::FuncOp func) {
      if (failedNode || func.isExternal())
        return;
      OpBuilder b(func.getContext());
      Folder folder(&getContext(), opset, maxFoldElements);
      for (Operation &op : llvm::make_early_inc_range(func.getBody().front())) {
        auto node = dyn_cast<NodeOp>(&op);
        if (!node || !node.getDomain().empty())
          continue;
        SmallVector<Type> inputTypes(node.getInputs().getTypes());
        SmallVector<ElementsAttr> inputValues;
        for (Value v : node.getInputs())
          inputValues.push_back(getConstantValue(v));
        NodeView view{node.getOpType(), node.getAttrs(), inputTypes, inputValues,
                      node.getNumResults(), opset};
        std::string error;
        FailureOr<SmallVector<Type>> rule =
            inferResultTypes(&getContext(), view, error);
        if (failed(rule)) {
          node.emitError() << "node '" << node.getNodeName() << "' ("
                           << node.getOpType() << "): " << error;
          failedNode = true;
          return;
        }
        for (auto [result, t] : llvm::zip(node.getResults(), *rule))
          if (Type better = refine(result.getType(), t))
            result.setType(better);
        // A node computing nothing goes first: an Identity of a weight (a
        // TorchScript export's shared initializer) must not hide it.
        if (Value in = passThrough(node)) {
          node.getResult(0).replaceAllUsesWith(in);
          node.erase();
          continue;
        }
        bool allKnown = llvm::all_of(node.getInputs(),
                                     [&](Value v) { return folder.foldable(v); });
        bool weightLayout =
            isLayoutOp(node.getOpType()) &&
            llvm::any_of(node.getInputs(),
                         [&](Value v) { return folder.fromInitializer(v); }) &&
            llvm::any_of(node.getResultTypes(), [](Type t) {
              return isa<FloatType>(cast<TensorType>(t).getElementType());
            });
        if (allKnown && weightLayout) {
          folder.defer(node);
          continue;
        }
        SmallVector<ElementsAttr> values;
        if (allKnown)
          values = folder.evaluateNode(node);
        else if (node.getOpType() == "Shape" || node.getOpType() == "Size")
          values = evaluate(&getContext(), view,
                            SmallVector<Type>(node.getResultTypes()),
                            maxFoldElements); // from the input's static type
        if (!values.empty()) {
          b.setInsertionPoint(node);
          for (auto [result, v] : llvm::zip(node.getResults(), values))
            result.replaceAllUsesWith(ConstantOp::create(b, node.getLoc(), v));
          node.erase();
          continue;
        }
      }
      // Erase what nothing uses, last first.
      Block &body = func.getBody().front();
      for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
        if (isa<NodeOp, ConstantOp, InitializerOp, NoneOp>(op) && op.use_empty())
          op.erase();
      func.setType(FunctionType::get(
          &getContext(), func.getArgumentTypes(),
          body.getTerminator()->getOperandTypes()));
    });
    if (failedNode)
      signalPassFailure();
  }
};

} // namespace
